"""Classic fuzzy c-means (``n_nearest = n_clusters``) on the CPU, for float64 data held in memory.

One pass reads the cached transposed rows ``Xa = [x, 1, ‖x − s‖²]ᵀ`` ((d + 2) × n, float64; ``s`` a fixed
shift near the data) in chunks of columns small enough that a chunk and its (k × rows) block stay in the core's
L2 cache: the data comes from memory once per pass, for the distance GEMM, and the second GEMM finds it in cache.
Per chunk, three steps:

1. :func:`chunk_distances`: ``D = [−2(c − s), 2 s·(c − s) + ‖c − s‖², 1] · Xa`` — every squared distance, the
   row norms included — and its smallest value: a chunk whose smallest distance is not above the fast rule's
   floor (a zero distance, or a tiny one that rounding made negative) takes the general rule instead;
2. :func:`chunk_weights`: ``a = 1/D`` (``D^(−1/(q−1))``), ``A = Σ_j a``, ``w = (a/A)^q`` and the chunk's
   objective ``Σ A^(1−q)``; for q = 2 one reciprocal per distance and no power;
3. ``[Σ w x, Σ w] = w · Xa[:d + 1]ᵀ``.

A chunk where step 1's check fails or step 2 overflows or underflows is redone after the pass with the general
rule (:func:`chunk_general`: zero distances exactly, the log domain).

For q = 2 (``jit=True``, where Numba is installed and k(d + 1) is small) the three steps of a chunk are one
compiled loop over its rows instead (:mod:`densitas.cluster._jit`): the GEMMs above are far from the BLAS's speed
at k = 5, and the loop keeps each row's distances, memberships and the sums in registers. The floor check and the
redo of failed chunks are the same.

The GEMM of step 1 is PyTorch's (MKL); the elementwise steps and the sums GEMM are NumPy's, on the same memory:
NumPy's calls cost about a third of PyTorch's per-call overhead (which matters at a few thousand columns per
chunk), and its BLAS (OpenBLAS in the wheels) runs the (k × m)·(m × (d + 1)) sums about twice as fast as MKL at
this shape. The chunks are shared among threads that each run PyTorch and the BLAS on one thread
(:func:`classic_pass`): a chunk is some tens of microseconds of work, too little for a library's own parallel
regions to pay for their synchronisation — and on a loaded machine every such region waits for a descheduled
thread, where threads taking whole chunks just take fewer of them. Each chunk's sums are kept apart and added in
chunk order, so the result does not depend on which thread took which chunk.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import numpy as np
import torch

from densitas._blas import blas_threads
from densitas.cluster._jit import classic_kernel
from densitas.cluster.steps import argmin_t, prepare_centroids, sq_norms, weights_and_objective

__all__ = ["augmented_rows", "classic_pass", "gfkm_kernel_applies"]


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
    """The q = 2 fast path takes a chunk only if all its distances are above this floor, ``2k`` times the smallest
    normal float64: the sum of k reciprocals is then at most half the largest float64."""
    return 2.0 * k * torch.finfo(torch.float64).tiny


class ChunkBuffers:
    """One thread's work buffers, reused by every chunk it takes (no fresh pages to fault in): the (k × rows)
    distances/weights as a NumPy array and a tensor on the same memory (the GEMM's output), their row sums and a
    row of ones for those."""

    def __init__(self, k: int, rows: int):
        self.k, self.rows = k, rows
        self._block = np.empty(k * rows)
        self._row = np.empty(rows)
        self.ones = np.ones((1, k))
        self._full = self._views(rows)

    def _views(self, m: int) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        D = self._block[:self.k * m].reshape(self.k, m)
        return torch.from_numpy(D), D, self._row[:m].reshape(1, m)

    def take(self, m: int) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        """A (k, m) block as a tensor and as an array, and a (1, m) row."""
        return self._full if m == self.rows else self._views(m)


def chunk_distances(Ca: torch.Tensor, xc: torch.Tensor, Dt: torch.Tensor, D: np.ndarray) -> float:
    """Squared distances (k, m) of the chunk ``xc`` of ``Xa`` to the centroids (``Ca``:
    :func:`augmented_centroids`), written to ``Dt`` (``D`` is the same memory); returns the smallest (NaN if
    any is NaN). Rounding can make a tiny distance negative: the caller takes the chunk's weights from
    :func:`chunk_weights` only if the smallest distance is above the fast rule's floor (a check that reads the
    block, cheaper than clamping it), else from :func:`chunk_general`."""
    torch.mm(Ca, xc, out=Dt)
    return float(np.minimum.reduce(D, axis=None))


def chunk_weights(D: np.ndarray, A: np.ndarray, ones: np.ndarray, q: float) -> tuple[float, float]:
    """Weights ``w = u^q`` (in place of ``D``, (k, m), every distance above :func:`distance_floor` for q = 2,
    above 0 otherwise) of a chunk, with ``a = D^(−1/(q−1))``, ``A_i = Σ_j a_ji`` (into ``A``, (1, m)) and
    ``u = a/A``. Returns the chunk's objective ``Σ_i A_i^(1−q)`` (as ``Σ_j u_ji^q D_ji = A_i^(1−q)``) and the
    smallest ``1/A_i`` (for q = 2: 1, not computed).

    The rule fails where ``A`` overflows or underflows: then the objective is not finite, or (q ≠ 2) the smallest
    ``1/A`` is 0, and the caller redoes the chunk (:func:`chunk_general`). For q = 2, ``a = 1/D`` (a reciprocal,
    no power) and ``A`` cannot overflow (``D`` > :func:`distance_floor`); an infinite or NaN distance makes the
    objective infinite or NaN."""
    a = np.reciprocal(D, out=D) if q == 2.0 else np.power(D, -1.0 / (q - 1.0), out=D)
    inv = np.reciprocal(np.matmul(ones, a, out=A), out=A)  # 1/A; a row sum over a few rows is fastest as a GEMV
    np.multiply(a, inv, out=a)
    if q == 2.0:
        np.square(a, out=a)
        return float(np.add.reduce(inv, axis=None)), 1.0
    np.power(a, q, out=a)
    return float(np.add.reduce(np.power(inv, q - 1.0), axis=None)), float(np.minimum.reduce(inv, axis=None))


def chunk_general(Ca: torch.Tensor, xc: torch.Tensor, q: float, m: int | None = None) -> tuple[torch.Tensor, float]:
    """Weights and objective of a chunk by :func:`~densitas.cluster.steps.weights_and_objective`'s rule (zero
    distances exactly, log domain on overflow): for the chunks where :func:`chunk_weights` or the compiled kernel
    fails or does not apply. With ``m`` < k, over each row's ``m`` nearest centroids (a stable sort: ties to the
    lower index), the others' weights 0."""
    D = torch.mm(Ca, xc).clamp_(min=0.0)
    if m is None or m >= D.shape[0]:
        _u, w, J = weights_and_objective(D, q, dim=0, keep_u=False, overwrite=True)
        return w, float(J)
    nearest = torch.argsort(D, dim=0, stable=True)[:m]
    _u, wn, J = weights_and_objective(D.gather(0, nearest), q, dim=0, keep_u=False)
    return torch.zeros_like(D).scatter_(0, nearest, wn), float(J)


class _Pass:
    """The state one :func:`classic_pass` shares among its threads: the next chunk to take and each chunk's
    results, kept apart until they are added in chunk order."""

    def __init__(self, Xa: torch.Tensor, Ca: torch.Tensor, q: float, rows: int, sums: bool, labels: bool,
                 kernel: Callable | None = None, C: np.ndarray | None = None, nearest: int | None = None):
        self.Xa, self.Ca, self.q, self.rows = Xa, Ca, q, rows
        self.nearest = nearest  # GFKM's M (None: every centroid)
        self.kernel, self.C = kernel, C  # the compiled q = 2 kernel (densitas.cluster._jit) and C, (k, d)
        self.k, self.d = Ca.shape[0], Xa.shape[0] - 2
        n = Xa.shape[1]
        self.floor = distance_floor(self.k) if q == 2.0 else 0.0
        self.n_chunks = -(-n // rows)
        self.parts = torch.empty((self.n_chunks, self.k, self.d + 1), dtype=torch.float64) if sums else None
        self.objective = np.empty(self.n_chunks)
        self.failed = np.zeros(self.n_chunks, dtype=bool)  # chunks for chunk_general
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
        if self.kernel is not None:
            self._run_kernel()
            return
        buf = ChunkBuffers(self.k, self.rows)
        xs = self.Xa[:self.d + 1].numpy()  # [x, 1]: the sums' operand
        parts = self.parts.numpy() if self.parts is not None else None
        with np.errstate(all="ignore"):  # overflows and NaN are found by the checks below
            while (c := self.take()) is not None:
                s = c * self.rows
                xc = self.Xa[:, s:s + self.rows]
                Dt, D, A = buf.take(xc.shape[1])
                smallest = chunk_distances(self.Ca, xc, Dt, D)
                if self.labels is not None:
                    # clamped as the general path's distances, for the same ties
                    self.labels[s:s + xc.shape[1]] = argmin_t(Dt.clamp_(min=0.0)).numpy()  # ties: lower index
                if not smallest > self.floor:  # a zero, negative or NaN distance: chunk_general
                    self.failed[c] = True
                    continue
                J, inv_min = chunk_weights(D, A, buf.ones, self.q)
                self.objective[c] = J
                self.failed[c] = not (math.isfinite(J) and inv_min > 0.0)
                if parts is not None and not self.failed[c]:
                    np.matmul(D, xs[:, s:s + xc.shape[1]].T, out=parts[c])

    def _run_kernel(self) -> None:
        """:meth:`run` with the compiled kernel: each chunk in one call that writes its sums (or a scratch block)
        and returns its objective; a chunk with a distance not above the floor, or a non-finite objective, is
        left to :meth:`repair` as on the GEMM path."""
        xt = self.Xa.numpy()
        n = xt.shape[1]
        scratch, no_labels = np.empty((self.k, self.d + 1)), np.empty(self.rows, dtype=np.int64)
        parts = self.parts.numpy() if self.parts is not None else None
        while (c := self.take()) is not None:
            s = c * self.rows
            e = min(s + self.rows, n)
            J, ok = self.kernel(xt, s, e, self.C, self.floor, parts[c] if parts is not None else scratch,
                                self.labels[s:e] if self.labels is not None else no_labels)
            self.objective[c] = J
            self.failed[c] = not (ok and math.isfinite(J))

    def repair(self) -> None:
        """Redo the chunks where the fast rule failed or did not apply (a zero, negative or NaN distance, an
        overflow or an underflow) with the general one."""
        for c in np.flatnonzero(self.failed).tolist():
            xc = self.Xa[:, c * self.rows:(c + 1) * self.rows]
            w, self.objective[c] = chunk_general(self.Ca, xc, self.q, self.nearest)
            if self.parts is not None:
                torch.mm(w, xc[:self.d + 1].T, out=self.parts[c])


def classic_pass(Xa: torch.Tensor, C: torch.Tensor, shift: torch.Tensor, q: float, *, rows: int, sums: bool,
                 labels: bool, jit: bool = False, workers: int | None = None, nearest: int | None = None
                 ) -> tuple[torch.Tensor | None, float, np.ndarray | None]:
    """One classic fuzzy c-means pass over ``Xa`` (:func:`augmented_rows`) with centroids ``C`` (k, d), in chunks
    of ``rows`` columns shared among ``torch.get_num_threads()`` threads.

    With ``jit`` and q = 2, each chunk runs the compiled kernel of :mod:`densitas.cluster._jit`
    (distances, weights and sums in one loop over the rows) where it is available for (k, d); the GEMM steps
    otherwise. Chunks the kernel cannot take are redone by the general rule either way. ``workers``: threads of
    the pass (default ``torch.get_num_threads()``). ``nearest`` < k: Generalized Fuzzy k-Means over each row's
    ``nearest`` centroids, with q = 2 and the compiled kernel only (:func:`gfkm_kernel_applies`).

    Returns
    -------
    sums : (k, d + 1) float64 tensor or None
        ``[Σ_i w_ji x_i, Σ_i w_ji]`` (``sums=True``).
    objective : float
        ``Σ_i Σ_j w_ij D_ij``.
    labels : (n,) int64 array or None
        The nearest centroid of each row, ties to the lower index (``labels=True``).
    """
    k, d = C.shape
    nearest = None if nearest is None or nearest >= k else int(nearest)
    kernel = classic_kernel(k, d, nearest) if jit and q == 2.0 else None
    if nearest is not None and kernel is None:
        raise ValueError("classic_pass with nearest < k needs the compiled q = 2 kernel (gfkm_kernel_applies).")
    C64 = np.ascontiguousarray(C.detach().cpu().numpy(), dtype=np.float64) if kernel is not None else None
    p = _Pass(Xa, augmented_centroids(C, shift), q, max(int(rows), 1), sums, labels, kernel, C64, nearest)
    workers = min(workers or torch.get_num_threads(), p.n_chunks)
    with _RUN_LOCK, blas_threads(1):  # the sums GEMMs run in the pass's own threads
        if workers <= 1:
            p.run()
        else:
            _run_threads(p.run, workers)
    p.repair()
    total = p.parts.sum(0) if p.parts is not None else None
    return total, math.fsum(p.objective.tolist()), p.labels


def gfkm_kernel_applies(k: int, d: int, m: int, q: float) -> bool:
    """Whether :func:`classic_pass` can run Generalized Fuzzy k-Means (``m`` < k nearest) for these shapes: q = 2
    and a compiled kernel for (k, d, m) (Numba installed, k(d + 1) within its limit).

    Examples
    --------
    >>> gfkm_kernel_applies(5, 10, 2, 1.7)
    False
    """
    return q == 2.0 and m < k and classic_kernel(k, d, m) is not None


# ------------------------------------------------------------------------------------------- threads

_RUN_LOCK = threading.Lock()  # one pass at a time: the PyTorch and BLAS thread settings are partly process-wide


def _run_threads(fn, workers: int) -> None:
    """Run ``fn`` in the calling thread and in ``workers − 1`` new threads, each running PyTorch single-threaded;
    wait for them. The caller holds ``_RUN_LOCK``.

    The calling thread works too, from the start: a new thread can take milliseconds to be scheduled on a loaded
    machine, and the chunks it does not take the others do. ``torch.set_num_threads(1)`` in the calling thread
    also sets the default that threads started later inherit (the new ones here): the caller's setting is put
    back once all have finished. The first error of a thread is raised here after all have finished.
    """
    saved = torch.get_num_threads()
    errors: list[BaseException] = []

    def body() -> None:
        torch.set_num_threads(1)
        try:
            fn()
        except BaseException as err:  # re-raised in the caller
            errors.append(err)

    torch.set_num_threads(1)
    try:
        threads = [threading.Thread(target=body, name="densitas-fcm", daemon=True) for _ in range(workers - 1)]
        for t in threads:
            t.start()
        body()
        for t in threads:
            t.join()
    finally:
        torch.set_num_threads(saved)
    if errors:
        raise errors[0]
