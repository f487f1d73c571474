"""PyTorch implementations of the operations :mod:`densitas.cluster` adds — the CPU path and the test oracles.

Operation ``"cluster_counting_scatter"`` (the scatter step of document 004's counting sort, method (a))::

    cluster_counting_scatter(keys: (n,) int64 in [0, k), offsets: (k,) int64) -> order: (n,) int64

``offsets`` is the exclusive scan of the histogram of ``keys``; ``order[offsets[j] : offsets[j] + count[j]]``
receives the positions ``i`` with ``keys[i] == j``. Contract: every position appears once, inside its key's
segment; the order *within* a segment is unspecified (the Triton kernel takes slots with atomics, as the paper's
GPU code does). This reference keeps the input order (a stable counting sort).

Operations ``"cluster_fused_pass"`` and ``"cluster_fused_iterations"`` (one whole GFKM pass, and several
centroid updates with no host synchronisation): :func:`fused_pass` and :func:`fused_iterations` below are their
float64 references; the CUDA implementation is one fused Triton kernel per pass.

**Triton hook.** ``densitas/cluster/_triton.py`` registers the atomic scatter and the fused pass through
``_triton_registry.py``.
"""

from __future__ import annotations

import torch

from densitas._backend.dispatch import register

__all__ = ["counting_scatter", "finalize", "fused_iterations", "fused_pass"]

#: Largest one-hot block (elements) of the rank computation; keys beyond :data:`MAX_ONE_HOT_KEYS` take the
#: ranks from a stable sort instead (same result, O(n log n) instead of O(n·k)).
ONE_HOT_ELEMENTS = 1 << 22
MAX_ONE_HOT_KEYS = 256


@register("cluster_counting_scatter", "torch")
def counting_scatter(keys: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Stable scatter of positions into their key's segment: ``pos = offsets[key] + rank of i among its key``.

    The rank of each element among the earlier elements with the same key comes from a running count per key
    (a one-hot block and its column-wise inclusive scan), so the whole scatter is O(n·k) vectorised work for
    up to :data:`MAX_ONE_HOT_KEYS` keys; more keys take the ranks from a stable sort.
    """
    n = keys.shape[0]
    k = offsets.shape[0]
    dev = keys.device
    order = torch.empty(n, dtype=torch.int64, device=dev)
    if n == 0:
        return order
    if k > MAX_ONE_HOT_KEYS:
        perm = torch.sort(keys, stable=True).indices
        order.copy_(perm)  # the stable sort is the stable counting sort's result
        return order
    cursor = offsets.to(torch.int64).clone()
    cols = torch.arange(k, device=dev)
    step = max(ONE_HOT_ELEMENTS // max(k, 1), 1)
    for s in range(0, n, step):
        kc = keys[s:s + step]
        one_hot = (kc[:, None] == cols[None, :]).to(torch.int64)
        rank = torch.cumsum(one_hot, 0).gather(1, kc[:, None]).squeeze(1) - 1
        order[cursor[kc] + rank] = torch.arange(s, s + kc.shape[0], device=dev)
        cursor += one_hot.sum(0)
    return order


# ------------------------------------------------------------------------------------ one whole iteration

#: Rows per block of the reference pass (bounds its (rows, k, d) temporary).
REFERENCE_ROWS = 1 << 14


@register("cluster_fused_pass", "torch")
def fused_pass(X: torch.Tensor, C: torch.Tensor, n_nearest: int, q: float, *, sums: bool = True,
               labels: bool = False) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """One pass of Generalized Fuzzy k-Means over ``X`` (n, d) with centroids ``C`` (k, d), in float64.

    The reference of the fused Triton kernel (operation ``"cluster_fused_pass"``), written the direct way:
    squared distances by differences, the ``M = n_nearest`` nearest by a stable sort (ties to the lower index),
    memberships ``u_ij = (D_i,min / D_ij)^(1/(q−1)) / Σ_l (D_i,min / D_il)^(1/(q−1))`` over them (a row with
    ``z`` zero distances gives each of them ``1/z``), weights ``w = u^q``.

    Returns
    -------
    sums : (k, d + 1) float64 tensor or None
        ``Σ_i w_ij x_i`` and ``Σ_i w_ij`` per cluster (``sums=True``).
    objective : 0-d float64 tensor
        ``J = Σ_i Σ_{j∈NN_i} w_ij D_ij``.
    labels : (n,) int64 tensor or None
        The nearest centroid of each row, ties to the lower index (``labels=True``).
    """
    n, d = X.shape
    k = C.shape[0]
    M = min(int(n_nearest), k)
    dev = X.device
    C64 = C.to(device=dev, dtype=torch.float64)
    acc = torch.zeros((k, d + 1), dtype=torch.float64, device=dev) if sums else None
    J = torch.zeros((), dtype=torch.float64, device=dev)
    lab = torch.empty(n, dtype=torch.int64, device=dev) if labels else None
    for s in range(0, n, REFERENCE_ROWS):
        x = X[s:s + REFERENCE_ROWS].to(torch.float64)
        D = ((x[:, None, :] - C64[None, :, :]) ** 2).sum(2)
        nn = torch.argsort(D, dim=1, stable=True)[:, :M]
        Dn = D.gather(1, nn)
        dmin = Dn[:, :1]
        zero = dmin[:, 0] <= 0
        with torch.no_grad():
            ratio = torch.where(zero[:, None], torch.zeros_like(Dn), dmin / torch.where(Dn > 0, Dn, 1.0))
        a = ratio if q == 2.0 else ratio.pow(1.0 / (q - 1.0))
        a = torch.where(zero[:, None], (Dn <= 0).to(torch.float64), a)
        u = a / a.sum(1, keepdim=True)
        w = u * u if q == 2.0 else u.pow(q)
        J += (w * Dn).sum()
        if acc is not None:
            W = torch.zeros((x.shape[0], k), dtype=torch.float64, device=dev).scatter_(1, nn, w)
            acc[:, :d] += W.T @ x
            acc[:, d] += W.sum(0)
        if lab is not None:
            lab[s:s + x.shape[0]] = nn[:, 0]
    return acc, J, lab


def finalize(sums: torch.Tensor, C: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The new centroids (a cluster of zero total weight keeps its centroid), the largest move and the number of
    such empty clusters, from the sums (k, d + 1) of a pass with centroids ``C`` (all float64)."""
    d = C.shape[1]
    tot = sums[:, d]
    new = torch.where(tot[:, None] > 0, sums[:, :d] / torch.where(tot > 0, tot, 1.0)[:, None], C)
    move = torch.linalg.vector_norm(new - C, dim=1).max()
    return new, move, (tot <= 0).sum()


@register("cluster_fused_iterations", "torch")
def fused_iterations(X: torch.Tensor, C0: torch.Tensor, n_nearest: int, q: float, steps: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``steps`` consecutive centroid updates from ``C0`` with no look at the stopping test in between.

    Operation ``"cluster_fused_iterations"`` (the Triton version runs them on the device without a host
    synchronisation). An update with an empty cluster leaves that centroid where it was and counts it; the caller
    decides what to do (:class:`~densitas.cluster.FuzzyKMeans` redoes that update with its relocation rule).

    Returns
    -------
    centroids : (steps + 1, k, d) float64 tensor
        ``C0`` and the centroids after each update.
    objective : (steps,) float64 tensor
        ``J`` of each pass (at the centroids it started from).
    move : (steps,) float64 tensor
        The largest centroid move of each update.
    empty : (steps,) int32 tensor
        Clusters of zero total weight in each update.
    """
    k, d = C0.shape
    dev = X.device
    Cs = torch.empty((steps + 1, k, d), dtype=torch.float64, device=dev)
    Cs[0] = C0.to(device=dev, dtype=torch.float64)
    J = torch.empty(steps, dtype=torch.float64, device=dev)
    move = torch.empty(steps, dtype=torch.float64, device=dev)
    empty = torch.empty(steps, dtype=torch.int32, device=dev)
    for s in range(steps):
        sums, J[s], _ = fused_pass(X, Cs[s], n_nearest, q)
        Cs[s + 1], move[s], empty[s] = finalize(sums, Cs[s])
    return Cs, J, move, empty
