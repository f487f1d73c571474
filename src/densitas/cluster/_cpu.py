"""Classic fuzzy c-means (``n_nearest = n_clusters``) on the CPU, for float64 data held in memory.

One pass reads the cached transposed rows ``Xa = [x, 1, ‖x − s‖²]ᵀ`` ((d + 2) × n, float64; ``s`` a fixed
shift near the data) in chunks of columns. Per chunk, two GEMMs on the same columns (the second finds them in
cache, so the data comes from memory once per pass) and in-place passes over the (k × rows) block, in three
steps:

1. :func:`chunk_distances`: ``D = [−2(c − s), 2 s·(c − s) + ‖c − s‖², 1] · Xa`` — every squared distance, the
   row norms included — clamped from below (for q = 2 at a tiny positive floor: a zero distance then gives its
   row's weight to that centroid up to ~1e-300, and adds ~2k·1e-308 to the objective instead of 0);
2. :func:`chunk_weights`: ``a = 1/D`` (``D^(−1/(q−1))``), ``A = Σ_j a``, ``w = (a/A)^q`` and the chunk's
   objective ``Σ A^(1−q)``; for q = 2 one reciprocal per distance and no power;
3. ``[Σ w x, Σ w] = w · Xa[:d + 1]ᵀ``.

A chunk where step 2 overflows or underflows (or, for q ≠ 2, meets a zero distance) is redone after the pass
with the general rule (:func:`chunk_general`: zero distances exactly, the log domain).

The chunks are shared among threads that each run PyTorch on one thread (:func:`classic_pass`): a chunk is a
few hundred microseconds of work, too little for PyTorch's own parallel regions to pay for their
synchronisation — and on a loaded machine every such region waits for a descheduled thread, where threads
taking whole chunks just take fewer of them. Each chunk's sums are kept apart and added in chunk order, so the
result does not depend on which thread took which chunk.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import torch

from densitas.cluster.steps import argmin_t, prepare_centroids, sq_norms, weights_and_objective

__all__ = ["augmented_rows", "classic_pass"]


def augmented_rows(X: torch.Tensor, shift: torch.Tensor, rows: int) -> torch.Tensor:
    """``Xa = [x, 1, ‖x − s‖²]ᵀ`` ((d + 2) × n, float64) of the float64 rows ``X``, built ``rows`` at a time."""
    n, d = X.shape
    Xa = torch.empty((d + 2, n), dtype=torch.float64)
    Xa[d] = 1.0
    for s in range(0, n, rows):
        x = X[s:s + rows]
        Xa[:d, s:s + x.shape[0]] = x.T
        Xa[d + 1, s:s + x.shape[0]] = sq_norms(x, shift)
    return Xa


def augmented_centroids(C: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``[−2(c − s), 2 s·(c − s) + ‖c − s‖², 1]`` (k, d + 2), float64: times ``[x, 1, ‖x − s‖²]ᵀ`` it gives
    ``‖x − c‖²``."""
    m2cs, bias = prepare_centroids(C, shift, torch.float64)
    return torch.cat([m2cs, bias[:, None], torch.ones((C.shape[0], 1), dtype=torch.float64)], 1)


def distance_floor(k: int) -> float:
    """The smallest distance of the q = 2 fast path: ``2k`` times the smallest normal float64, so that the sum of
    k reciprocals is at most half the largest float64."""
    return 2.0 * k * torch.finfo(torch.float64).tiny


class ChunkBuffers:
    """One thread's work buffers, reused by every chunk it takes (no fresh pages to fault in): the (k × rows)
    distances/weights, their row sums and a row of ones for those."""

    def __init__(self, k: int, rows: int):
        self.k, self.rows = k, rows
        self._block = torch.empty(k * rows, dtype=torch.float64)
        self._row = torch.empty(rows, dtype=torch.float64)
        self.ones = torch.ones((1, k), dtype=torch.float64)
        self._full = self._views(rows)

    def _views(self, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._block[:self.k * m].view(self.k, m), self._row[:m].view(1, m)

    def take(self, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A (k, m) block and a (1, m) row."""
        return self._full if m == self.rows else self._views(m)


def chunk_distances(Ca: torch.Tensor, xc: torch.Tensor, floor: float, D: torch.Tensor) -> torch.Tensor:
    """Squared distances (k, m) of the chunk ``xc`` of ``Xa`` to the centroids (``Ca``:
    :func:`augmented_centroids`), written to ``D`` and clamped at ``floor``: 0 (rounding can make a tiny
    distance negative), or for q = 2 :func:`distance_floor`, so that ``1/D`` and its row sum stay finite and a
    zero distance needs no special case (its point gets membership 1 to within ``floor / D`` of its next
    distance, as the exact rule gives)."""
    return torch.mm(Ca, xc, out=D).clamp_(min=floor)


def chunk_weights(D: torch.Tensor, A: torch.Tensor, ones: torch.Tensor, q: float, objective: torch.Tensor,
                  smallest: torch.Tensor) -> torch.Tensor:
    """Weights ``w = u^q`` (in place of ``D``, (k, m)) of a chunk, with ``a = D^(−1/(q−1))``, ``A_i = Σ_j a_ji``
    (into ``A``, (1, m)) and ``u = a/A``; the chunk's objective ``Σ_i A_i^(1−q)`` (as ``Σ_j u_ji^q D_ji =
    A_i^(1−q)``) goes to the 0-d tensor ``objective``, and for q ≠ 2 the smallest ``1/A_i`` to ``smallest``.

    The rule fails where ``A`` overflows or underflows: then the objective is not finite, or (q ≠ 2) the smallest
    ``1/A`` is 0, and the caller redoes the chunk (:func:`chunk_general`). For q = 2, ``a = 1/D`` (a reciprocal,
    no power) and ``A`` cannot overflow (``D`` ≥ :func:`distance_floor`); an infinite or NaN distance makes the
    objective infinite or NaN."""
    a = D.reciprocal_() if q == 2.0 else D.pow_(-1.0 / (q - 1.0))
    inv = torch.mm(ones, a, out=A).reciprocal_()  # 1/A; a row sum over a few rows is fastest as a GEMV
    if q == 2.0:
        torch.sum(inv.view(-1), 0, out=objective)
        return a.mul_(inv).square_()
    torch.sum(inv.pow(q - 1.0).view(-1), 0, out=objective)
    torch.amin(inv.view(-1), 0, out=smallest)
    return a.mul_(inv).pow_(q)


def chunk_general(Ca: torch.Tensor, xc: torch.Tensor, q: float) -> tuple[torch.Tensor, float]:
    """Weights and objective of a chunk by :func:`~densitas.cluster.steps.weights_and_objective`'s rule (zero
    distances exactly, log domain on overflow): for the chunks where :func:`chunk_weights` fails."""
    D = torch.mm(Ca, xc).clamp_(min=0.0)
    _u, w, J = weights_and_objective(D, q, dim=0, keep_u=False, overwrite=True)
    return w, float(J)


class _Pass:
    """The state one :func:`classic_pass` shares among its threads: the next chunk to take and each chunk's
    results, kept apart until they are added in chunk order."""

    def __init__(self, Xa: torch.Tensor, Ca: torch.Tensor, q: float, rows: int, sums: bool, labels: bool):
        self.Xa, self.Ca, self.q, self.rows = Xa, Ca, q, rows
        self.k, self.d = Ca.shape[0], Xa.shape[0] - 2
        n = Xa.shape[1]
        self.floor = distance_floor(self.k) if q == 2.0 else 0.0
        self.n_chunks = -(-n // rows)
        self.parts = torch.empty((self.n_chunks, self.k, self.d + 1), dtype=torch.float64) if sums else None
        self.objective = torch.empty(self.n_chunks, dtype=torch.float64)
        self.smallest = torch.ones(self.n_chunks, dtype=torch.float64)  # smallest 1/A of each chunk (q ≠ 2)
        self.labels = np.empty(n, dtype=np.int64) if labels else None
        self._next = 0
        self._lock = threading.Lock()

    def take(self) -> int | None:
        """The next chunk nobody has taken, or None."""
        with self._lock:
            c = self._next
            self._next += 1
        return c if c < self.n_chunks else None

    def run(self) -> None:
        """Take chunks until none is left (one thread's share of the pass)."""
        buf = ChunkBuffers(self.k, self.rows)
        while (c := self.take()) is not None:
            s = c * self.rows
            xc = self.Xa[:, s:s + self.rows]
            D, A = buf.take(xc.shape[1])
            chunk_distances(self.Ca, xc, self.floor, D)
            if self.labels is not None:
                self.labels[s:s + xc.shape[1]] = argmin_t(D).numpy()  # ties: lower index
            w = chunk_weights(D, A, buf.ones, self.q, self.objective[c], self.smallest[c])
            if self.parts is not None:
                torch.mm(w, xc[:self.d + 1].T, out=self.parts[c])

    def repair(self) -> None:
        """Redo the chunks where the fast rule failed (a zero distance for q ≠ 2, an overflow or an underflow)
        with the general one."""
        failed = ~torch.isfinite(self.objective) | (self.smallest <= 0)
        for c in torch.nonzero(failed).view(-1).tolist():
            xc = self.Xa[:, c * self.rows:(c + 1) * self.rows]
            w, self.objective[c] = chunk_general(self.Ca, xc, self.q)
            if self.parts is not None:
                torch.mm(w, xc[:self.d + 1].T, out=self.parts[c])


def classic_pass(Xa: torch.Tensor, C: torch.Tensor, shift: torch.Tensor, q: float, *, rows: int, sums: bool,
                 labels: bool) -> tuple[torch.Tensor | None, float, np.ndarray | None]:
    """One classic fuzzy c-means pass over ``Xa`` (:func:`augmented_rows`) with centroids ``C`` (k, d), in chunks
    of ``rows`` columns shared among ``torch.get_num_threads()`` threads.

    Returns
    -------
    sums : (k, d + 1) float64 tensor or None
        ``[Σ_i w_ji x_i, Σ_i w_ji]`` (``sums=True``).
    objective : float
        ``Σ_i Σ_j w_ij D_ij``.
    labels : (n,) int64 array or None
        The nearest centroid of each row, ties to the lower index (``labels=True``).
    """
    p = _Pass(Xa, augmented_centroids(C, shift), q, max(int(rows), 1), sums, labels)
    workers = min(torch.get_num_threads(), p.n_chunks)
    if workers <= 1:
        p.run()
    else:
        _run_threads(p.run, workers)
    p.repair()
    total = p.parts.sum(0) if p.parts is not None else None
    return total, math.fsum(p.objective.tolist()), p.labels


# ------------------------------------------------------------------------------------------- threads

_RUN_LOCK = threading.Lock()  # one threaded pass at a time: PyTorch's thread setting is partly process-wide


def _run_threads(fn, workers: int) -> None:
    """Run ``fn`` in ``workers`` new threads, each running PyTorch single-threaded; wait for them.

    ``torch.set_num_threads(1)`` in a thread sets that thread's OpenMP count and also the default that threads
    started later inherit: the caller's setting is put back once every thread has set its own (a barrier), before
    any of them runs ``fn`` — so no thread's late start can leave the process at one thread. The first error of a
    thread is raised here after all have finished.
    """
    saved = torch.get_num_threads()
    ready = threading.Barrier(workers + 1)
    errors: list[BaseException] = []

    def body() -> None:
        torch.set_num_threads(1)
        ready.wait()
        try:
            fn()
        except BaseException as err:  # re-raised in the caller
            errors.append(err)

    with _RUN_LOCK:
        threads = [threading.Thread(target=body, name="densitas-fcm", daemon=True) for _ in range(workers)]
        for t in threads:
            t.start()
        try:
            ready.wait()
        finally:
            torch.set_num_threads(saved)
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
