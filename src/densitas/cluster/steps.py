"""The steps of one Generalized Fuzzy k-Means iteration (source document 004), each usable on its own.

An iteration over the data (in chunks, each chunk independently — the sums are additive):

1. **nearest centroids** — the ``M`` nearest of the ``k`` centroids of every point and their squared distances
   ``D``: a k-NN query with ``k = M`` against the centroids through the operation ``knn_tile_topk`` of
   :mod:`densitas.neighbors` (a GEMM + top-k on the PyTorch path, the fused distance + running top-k Triton
   kernel on CUDA), then the ``M`` distances recomputed exactly by direct differences. With ``M = k`` (classic
   fuzzy c-means) there is nothing to select: one GEMM gives every distance.
2. **memberships** — ``u_ij = 1 / Σ_{l∈NN_i} (D_ij / D_il)^(1/(q−1))`` (:func:`memberships`), computed as a
   softmax of ``−log(D)/(q−1)`` (no overflow for any ``q``); a point at distance 0 from ``z`` of its centroids
   gives each of them ``1/z`` and the others 0. The centroid weights are ``w = u^q``.
3. **centroid update** — the ``w``-weighted means of the points (:func:`centroid_update`): ``N·M`` (point,
   cluster) pairs reduced by key into ``k·(d + 1)`` sums, by one of four methods (:data:`CENTROID_METHODS`).

Every heavy operation goes through :func:`densitas._backend.dispatch.select`: ``knn_tile_topk``,
``histogram``, ``scan``, ``argsort``, ``reduce_by_key`` (the primitives) and ``cluster_counting_scatter``
(:mod:`densitas.cluster._triton`). On CUDA, :class:`~densitas.cluster.FuzzyKMeans` runs a whole pass as one
kernel instead (operations ``cluster_fused_pass`` and ``cluster_fused_iterations``). Sums are accumulated in
float64 whatever the data's precision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from densitas._backend.arrays import as_tensor, check_choice, check_int, to_output
from densitas._backend.device import DeviceLike
from densitas._backend.dispatch import select
from densitas.cluster import (
    _torch,  # noqa: F401  (registers the PyTorch counting scatter)
    _triton_registry,  # noqa: F401  (registers the Triton counting scatter, lazily)
)
from densitas.exceptions import InputError
from densitas.neighbors._torch import prepare

__all__ = [
    "CENTROID_METHODS",
    "Grouping",
    "centroid_update",
    "choose_method",
    "group_by_cluster",
    "memberships",
    "schwaemmle_jensen",
]

#: The centroid-update methods; ``"auto"`` picks one of them with :func:`choose_method`.
CENTROID_METHODS = ("atomic", "counting_sort", "sort_by_key", "dense")
_ALL_METHODS = (*CENTROID_METHODS, "auto")


# ------------------------------------------------------------------------------------------ fuzzifier


def schwaemmle_jensen(n_samples: int, n_features: int) -> float:
    """The fuzzifier of Schwämmle & Jensen (2010) for ``n_samples`` points in ``n_features`` dimensions.

    ``m = 1 + (1418/N + 22.05) D⁻² + (12.33/N + 0.243) D^(−0.0406 ln N − 0.1134)``: the smallest fuzzifier for
    which fuzzy c-means finds no structure in random data of the same size, fitted over simulated data sets
    (as in R's Mfuzz ``mestimate``). It grows quickly as ``D`` falls: about 14 for 50 points in 2-D, 1.34 for
    1,000 points in 10-D, 1.05 for 10,000 points in 50-D.

    Parameters
    ----------
    n_samples : int
        N ≥ 1.
    n_features : int
        D ≥ 1.

    Returns
    -------
    float
        A fuzzifier > 1.

    References
    ----------
    V. Schwämmle and O. N. Jensen, "A simple and fast method to determine the parameters for fuzzy c-means
    cluster analysis", Bioinformatics 26(22), 2841–2848, 2010.

    Examples
    --------
    >>> round(schwaemmle_jensen(1000, 10), 4)
    1.3378
    """
    n = check_int("n_samples", n_samples, 1, "schwaemmle_jensen")
    d = check_int("n_features", n_features, 1, "schwaemmle_jensen")
    return float(1.0 + (1418.0 / n + 22.05) * d ** -2.0
                 + (12.33 / n + 0.243) * d ** (-0.0406 * math.log(n) - 0.1134))


def check_fuzzifier(value: Any, owner: str = "FuzzyKMeans") -> float | str:
    """``"auto"`` or a finite float > 1 (else :class:`InputError`)."""
    if isinstance(value, str) and value == "auto":
        return value
    ok = isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)
    if not ok or not math.isfinite(float(value)) or float(value) <= 1.0:
        raise InputError(f"The 'fuzzifier' parameter of {owner} must be 'auto' or a finite float > 1. Got {value!r} "
                         "instead.")
    return float(value)


# ---------------------------------------------------------------------------------------- memberships


def membership_weights(D: torch.Tensor, q: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Memberships ``u`` and centroid weights ``w = u^q`` from squared distances ``D`` (n, M), in D's dtype."""
    zero = D <= 0
    if q == 2.0:
        inv = 1.0 / D
        u = inv / inv.sum(1, keepdim=True)
    else:
        u = torch.softmax(torch.log(D) * (-1.0 / (q - 1.0)), dim=1)
    has_zero = zero.any(1)
    if bool(has_zero.any()):
        z = zero[has_zero].to(D.dtype)
        u[has_zero] = z / z.sum(1, keepdim=True)
    w = u * u if q == 2.0 else u.pow(q)
    return u, w


def memberships(distances: Any, fuzzifier: float = 2.0, *, squared: bool = True, device: DeviceLike = "auto") -> Any:
    """Fuzzy memberships of each point in the clusters whose distances are given.

    ``u_ij = 1 / Σ_l (D_ij / D_il)^(1/(q−1))`` over the columns ``l`` of row ``i`` (document 004 with the
    columns = the M nearest centroids; fuzzy c-means with all k). A row with distance 0 to ``z`` columns gives
    each of them ``1/z`` and the rest 0.

    Parameters
    ----------
    distances : (n, M) array-like or torch.Tensor
        Distances of each point to its M nearest centroids (any order), non-negative.
    fuzzifier : float
        q > 1.
    squared : bool
        Whether ``distances`` are squared Euclidean distances (the formula's D); False squares them first.
    device : "auto", "cpu", "cuda" or "cuda:N"

    Returns
    -------
    (n, M) array (tensor for tensor input); rows sum to 1.

    Examples
    --------
    >>> memberships([[1.0, 4.0], [0.0, 2.0]], 2.0).round(3).tolist()
    [[0.8, 0.2], [1.0, 0.0]]
    """
    q = check_fuzzifier(fuzzifier, "memberships")
    if q == "auto":
        raise InputError("The 'fuzzifier' parameter of memberships must be a finite float > 1. Got 'auto' instead.")
    D, kind = as_tensor(distances, "distances", device=device, ndim=(2,))
    if not D.dtype.is_floating_point:
        D = D.to(torch.float64)
    if bool(torch.isnan(D).any()) or bool((D < 0).any()):
        raise InputError("'distances' must be non-negative numbers (no NaN).")
    if not squared:
        D = D * D
    return to_output(membership_weights(D, float(q))[0], kind)


# ------------------------------------------------------------------------------------ nearest centroids


def sq_norms(X: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``‖x − shift‖²`` of every row, in X's dtype."""
    xs = X - shift.to(X.dtype)
    return torch.einsum("ij,ij->i", xs, xs)


def nearest_centroids(X: torch.Tensor, centers: torch.Tensor, n_nearest: int, shift: torch.Tensor,
                      norms: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Squared distances (n, M) and indices (n, M) of the ``n_nearest`` centroids of every row of ``X``.

    ``X`` is in its compute dtype; ``centers`` (float64) and ``shift`` (float64, a fixed point near the data)
    are cast to it. With ``M = k`` the indices are ``0..k−1`` in order and the distances come from one GEMM on
    the raw rows, ``D = ‖x − s‖² − 2 (x·(c − s) − s·(c − s)) + ‖c − s‖²`` (clamped at 0): its rounding error is
    about ε‖x‖‖c − s‖, not ε‖x‖² as in the plain expansion, and ``norms`` (``‖x − s‖²``, see :func:`sq_norms`)
    can be computed once per fit. With ``M < k`` the candidates come from the operation ``knn_tile_topk`` (with
    two spare candidates when its values are approximate: the Triton kernel's TF32 products) and their distances
    are recomputed by direct differences, so ``D`` is exact to the data's precision; the rows are not sorted.
    """
    dt = X.dtype
    k = centers.shape[0]
    cs64 = centers - shift
    if n_nearest >= k:
        cs = cs64.to(dt)
        bias = (2.0 * (cs64 @ shift) + (cs64 * cs64).sum(1)).to(dt)
        nx = norms if norms is not None else sq_norms(X, shift)
        D = (X @ cs.T).mul_(-2.0).add_(bias[None, :]).add_(nx[:, None]).clamp_(min=0.0)
        idx = torch.arange(k, device=X.device).expand(X.shape[0], k)
        return D, idx
    xs = X - shift.to(dt)
    cs = cs64.to(dt)
    backend, op = select("knn_tile_topk", X.device)
    exact_fast = backend == "torch" and dt == torch.float64
    kp = n_nearest if exact_fast else min(k, n_nearest + 2)
    q = prepare(xs, None, "sq", False, "query", dt)
    c = prepare(cs, None, "sq", False, "reference", dt)
    _vals, pos = op(q, c, kp, k)
    diff = xs[:, None, :] - cs[pos]
    D = (diff * diff).sum(2)
    if kp > n_nearest:
        D, j = torch.topk(D, n_nearest, dim=1, largest=False, sorted=False)
        pos = pos.gather(1, j)
    return D, pos


def distances_t(X: torch.Tensor, centers: torch.Tensor, shift: torch.Tensor, norms: torch.Tensor | None = None,
                *, prepared: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Squared distances to every centroid, transposed: (k, n), the same values as :func:`nearest_centroids` with
    ``M = k``. The long axis innermost makes the broadcasts and reductions of the memberships vectorise (a
    (n, k) layout with k of a few is several times slower on the CPU). ``prepared`` is
    :func:`prepare_centroids` of the same centroids (computed once per pass instead of once per chunk)."""
    m2cs, bias = prepared if prepared is not None else prepare_centroids(centers, shift, X.dtype)
    nx = norms if norms is not None else sq_norms(X, shift)
    D = torch.addmm(bias[:, None], m2cs, X.T)
    return D.add_(nx[None, :]).clamp_(min=0.0)


def prepare_centroids(centers: torch.Tensor, shift: torch.Tensor, dtype: torch.dtype
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """``−2 (c − s)`` and ``2 s·(c − s) + ‖c − s‖²`` of the centroids, in ``dtype``: the GEMM operand and the
    per-centroid constant of :func:`distances_t`."""
    cs64 = centers - shift
    return (-2.0 * cs64).to(dtype), (2.0 * (cs64 @ shift) + (cs64 * cs64).sum(1)).to(dtype)


def weights_and_objective(D: torch.Tensor, q: float, dim: int = 1, *, keep_u: bool = True,
                          overwrite: bool = False) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """Memberships ``u``, weights ``w = u^q`` and the objective ``Σ_i Σ_j u_ij^q D_ij`` (a 0-d float64 tensor) of
    squared distances ``D``: (n, M) with ``dim=1``, or transposed (M, n) with ``dim=0``.

    With ``a_ij = D_ij^(−1/(q−1))`` and ``A_i = Σ_j a_ij``: ``u = a / A`` and ``Σ_j u_ij^q D_ij = A_i^(1−q)``
    (since ``a^q D = a``), so the objective costs one power per row. A chunk with a zero distance, an overflow or
    an underflow takes the log-domain path of :func:`membership_weights` instead. ``keep_u=False`` computes
    ``w`` in place of ``u`` (one array less) and returns None for ``u``; ``overwrite=True`` lets the fast path
    reuse ``D``'s memory (the caller no longer needs it).
    """
    M = D.shape[dim]
    overwrite = overwrite and not keep_u and q == 2.0  # for q = 2, D = 1/a is recovered exactly if needed
    if overwrite:
        a = D.reciprocal_()
    else:
        a = D.reciprocal() if q == 2.0 else D.pow(-1.0 / (q - 1.0))
    if dim == 1:
        A = a @ torch.ones(M, dtype=D.dtype, device=D.device)  # a row sum over a few columns: a GEMV is fastest
    else:
        A = a.sum(0)
    # one check per chunk: A finite (no zero distance, no overflow) and J finite (no A underflowing to 0)
    J = A.reciprocal().to(torch.float64).sum() if q == 2.0 else A.to(torch.float64).pow(1.0 - q).sum()
    if M and math.isfinite(float(J + A.sum())):
        inv = A.reciprocal_()
        u = a.mul_(inv.unsqueeze(dim))
        if keep_u:
            w = u * u if q == 2.0 else u.pow(q)
            return u, w, J
        w = u.mul_(u) if q == 2.0 else u.pow_(q)
        return None, w, J
    if overwrite:
        D = a.reciprocal()
    Dn = D if dim == 1 else D.T
    u, w = membership_weights(Dn, q)
    J = (w.to(torch.float64) * Dn.to(torch.float64)).sum()
    if dim == 0:
        u, w = u.T, w.T
    return u, w, J


def argmin_t(Dt: torch.Tensor) -> torch.Tensor:
    """The row index of the smallest value of every column of ``Dt`` (k, n), ties to the lower index.

    For a few rows, k vectorised passes over the long axis are much faster on the CPU than ``argmin`` along
    the outer axis."""
    k = Dt.shape[0]
    if k > 32 or Dt.device.type != "cpu":
        return torch.argmin(Dt, 0)
    best = Dt[0].clone()
    lab = torch.zeros(Dt.shape[1], dtype=torch.int64, device=Dt.device)
    for j in range(1, k):
        better = Dt[j] < best
        best = torch.where(better, Dt[j], best)
        lab.masked_fill_(better, j)
    return lab


def select_nearest_t(Dt: torch.Tensor, M: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``M`` smallest values of every column of ``Dt`` (k, n) and their rows: two (M, n) tensors, nearest
    first. ``M = 1`` takes ties to the lower row (``torch.min``); larger M leaves the order of exactly tied
    distances to ``torch.topk`` (their memberships are equal)."""
    if M == 1:
        v, i = torch.min(Dt, 0)
        return v[None, :], i[None, :]
    o = torch.topk(Dt, M, dim=0, largest=False, sorted=True)
    return o.values, o.indices


def sort_by_distance(D: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ordered by (distance, cluster index): the nearest first, ties to the lower index."""
    o1 = torch.argsort(idx, dim=1)
    d1, i1 = D.gather(1, o1), idx.gather(1, o1)
    o2 = torch.argsort(d1, dim=1, stable=True)
    return d1.gather(1, o2), i1.gather(1, o2)


def hard_labels(D: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """The nearest cluster of each row (ties to the lower index)."""
    if D.shape[1] == 0:
        return torch.empty(D.shape[0], dtype=torch.int64, device=D.device)
    best = D.amin(1, keepdim=True)
    big = torch.iinfo(torch.int64).max
    return torch.where(D == best, idx, torch.full_like(idx, big)).amin(1)


# ------------------------------------------------------------------------------------- centroid update


@dataclass
class Grouping:
    """The (point, cluster) pairs grouped by cluster (document 004, step 2).

    Pair ``p`` is point ``p // M`` with its ``(p % M)``-th neighbour cluster.

    Attributes
    ----------
    counts : (k,) int64 tensor
        Pairs per cluster (the histogram).
    offsets : (k,) int64 tensor
        Where each cluster's pairs start in ``order`` (the exclusive scan of ``counts``).
    order : (N·M,) int64 tensor
        Pair indices grouped by cluster: ``order[offsets[j] : offsets[j] + counts[j]]`` are cluster ``j``'s.
    keys : (N·M,) int64 tensor
        The cluster of each pair of ``order`` (non-decreasing).

    Examples
    --------
    >>> g = group_by_cluster([[1, 0], [1, 2]], 3, device="cpu")
    >>> isinstance(g, Grouping), g.keys.tolist()
    (True, [0, 1, 1, 2])
    """

    counts: torch.Tensor
    offsets: torch.Tensor
    order: torch.Tensor
    keys: torch.Tensor


def _group(keys: torch.Tensor, k: int, method: str) -> Grouping:
    dev = keys.device
    if method == "counting_sort":
        _, hist = select("histogram", dev)
        counts = hist(keys[:, None], (k,), (0.0,), (float(k),), None, False).to(torch.int64)
        _, scan = select("scan", dev)
        offsets = scan(counts, "sum", False, False, 0)
        _, scatter = select("cluster_counting_scatter", dev)
        order = scatter(keys, offsets)
        sorted_keys = torch.repeat_interleave(torch.arange(k, device=dev), counts, output_size=keys.shape[0])
        return Grouping(counts, offsets, order, sorted_keys)
    _, argsort = select("argsort", dev)
    sorted_keys, order = argsort(keys, False)
    counts = torch.bincount(sorted_keys, minlength=k)
    offsets = torch.cumsum(counts, 0) - counts
    return Grouping(counts, offsets, order, sorted_keys)


def group_by_cluster(nearest: Any, n_clusters: int, *, method: str = "sort_by_key", device: DeviceLike = "auto"
                     ) -> Grouping:
    """Group the ``N·M`` (point, neighbour cluster) pairs by cluster — document 004's step 2.

    Parameters
    ----------
    nearest : (N, M) integer array
        The M nearest clusters of each point, in ``[0, n_clusters)``.
    n_clusters : int
    method : {"counting_sort", "sort_by_key"}
        ``"counting_sort"``: histogram → exclusive scan → scatter (method (a); the Triton scatter takes slots
        with atomics, so the order inside a cluster is unspecified on a GPU). ``"sort_by_key"``: a stable sort
        of the pairs by cluster (method (b); keeps the point order inside a cluster).
    device : "auto", "cpu", "cuda" or "cuda:N"

    Returns
    -------
    Grouping

    Examples
    --------
    >>> g = group_by_cluster([[0, 1], [0, 2], [2, 1]], 3, device="cpu")
    >>> g.counts.tolist(), g.offsets.tolist(), (g.order // 2).tolist()
    ([2, 2, 2], [0, 2, 4], [0, 1, 0, 2, 1, 2])
    """
    check_choice("method", method, ("counting_sort", "sort_by_key"), "group_by_cluster")
    nn, _ = as_tensor(nearest, "nearest", device=device, ndim=(2,))
    k = check_int("n_clusters", n_clusters, 1, "group_by_cluster")
    _check_nearest(nn, k)
    return _group(nn.reshape(-1).to(torch.int64), k, method)


def _check_nearest(nn: torch.Tensor, k: int) -> None:
    if nn.dtype.is_floating_point or nn.dtype == torch.bool:
        raise InputError(f"'nearest' must hold integer cluster indices. Got dtype {nn.dtype} instead.")
    if nn.numel():
        lo, hi = (int(t) for t in torch.aminmax(nn))
        if lo < 0 or hi >= k:
            raise InputError(f"'nearest' must hold cluster indices in [0, n_clusters) = [0, {k}). Found "
                             f"{lo if lo < 0 else hi}.")


def centroid_sums(X: torch.Tensor, nearest: torch.Tensor, w: torch.Tensor, k: int, method: str,
                  out: torch.Tensor | None = None, full: bool | None = None) -> torch.Tensor:
    """``out[j, :d] += Σ_{pairs (i, j)} w_ij x_i`` and ``out[j, d] += Σ w_ij`` (float64, shape (k, d + 1)).

    ``nearest`` is (n, M) int64, ``w`` (n, M); ``method`` one of :data:`CENTROID_METHODS`. Accumulating chunk
    after chunk into the same ``out`` gives the sums of the whole data. ``full=True`` says that every row of
    ``nearest`` is ``0..k−1`` (classic fuzzy c-means), so the dense method uses ``w`` as W directly; None
    checks.
    """
    n, d = X.shape
    M = nearest.shape[1]
    dev = X.device
    if out is None:
        out = torch.zeros((k, d + 1), dtype=torch.float64, device=dev)
    if n == 0:
        return out
    x64 = X.to(torch.float64)
    w64 = w.to(torch.float64)
    if method == "dense":
        # one (sparse, M nonzeros per row) × dense product, done as a dense GEMM: Wᵀ [X, 1]
        if full is None:
            full = M == k and _is_identity(nearest, k)
        if full:
            W = w64
        else:
            W = torch.zeros((n, k), dtype=torch.float64, device=dev)
            W.scatter_add_(1, nearest, w64)
        out[:, :d] += W.T @ x64
        out[:, d] += torch.ones(n, dtype=torch.float64, device=dev) @ W
        return out
    _, rbk = select("reduce_by_key", dev)
    if method == "atomic":
        # one scatter-add per neighbour rank: keys = the rank's clusters, values = [w·x, w]
        for j in range(M):
            vals = torch.cat([x64 * w64[:, j, None], w64[:, j, None]], 1)
            out += rbk(nearest[:, j].contiguous(), vals, "sum", k)
        return out
    g = _group(nearest.reshape(-1), k, method)
    pts = torch.div(g.order, M, rounding_mode="floor")
    ws = w64.reshape(-1)[g.order]
    vals = torch.cat([x64[pts] * ws[:, None], ws[:, None]], 1)
    # the pairs are now contiguous per cluster: the reduction reads them in sequence (document 004, step 3)
    out += rbk(g.keys, vals, "sum", k)
    return out


def _is_identity(nearest: torch.Tensor, k: int) -> bool:
    """Whether every row of ``nearest`` is ``0..k−1`` (the classic fuzzy c-means layout)."""
    return bool((nearest == torch.arange(k, device=nearest.device)[None, :]).all())


#: The crossover "auto" uses, measured on this project's 2-core CPU with ``benchmarks/bench_cluster.py
#: --crossover`` (whole iterations, n = 200,000, d = 10): the dense product was fastest up to k = 128 for every M
#: tried (k/M up to 64; at k = 128 the two were within 5%), the scatter-add beyond (k = 256, M = 2: 201 against
#: 253 ms); the sort-based methods (document 004's) never won on the CPU.
DENSE_MAX_CLUSTERS = 128
#: Beyond ``DENSE_MAX_CLUSTERS`` the dense product is still used while k/M is at most this (many neighbours).
DENSE_MAX_RATIO = 16.0


def choose_method(n_samples: int, n_features: int, n_clusters: int, n_nearest: int,
                  device: torch.device | str = "cpu") -> str:
    """The centroid-update method ``"auto"`` picks: ``"dense"`` or ``"atomic"``.

    The dense product costs ``N·k·(d+1)`` multiply-adds on the matrix units (and an N × k weight matrix), the
    scatter-add ``N·M·(d+1)`` indexed (on CUDA atomic) adds, several times dearer each. The measured CPU
    crossover (:data:`DENSE_MAX_CLUSTERS`, :data:`DENSE_MAX_RATIO`) is used on CUDA as well, where it is not
    measured yet.

    Examples
    --------
    >>> choose_method(100_000, 10, 10, 10), choose_method(100_000, 10, 1000, 2)
    ('dense', 'atomic')
    """
    if n_clusters <= DENSE_MAX_CLUSTERS or n_clusters / max(n_nearest, 1) <= DENSE_MAX_RATIO:
        return "dense"
    return "atomic"


def centroid_update(X: Any, nearest: Any, weights: Any, n_clusters: int, *, method: str = "auto",
                    device: DeviceLike = "auto") -> Any:
    """Centroids from given neighbour indices and weights — document 004's centroid step on its own.

    ``c_j = Σ_{(i,j)} w_ij x_i / Σ_{(i,j)} w_ij`` over the pairs (point i, cluster j) with ``j`` among the
    neighbours of ``i``.

    Parameters
    ----------
    X : (N, d) array-like or torch.Tensor
        The points.
    nearest : (N, M) integer array
        The M nearest clusters of each point, in ``[0, n_clusters)``.
    weights : (N, M) array
        The weight of each pair, already ``u^q``; non-negative.
    n_clusters : int
        k.
    method : {"atomic", "counting_sort", "sort_by_key", "dense", "auto"}
        ``"atomic"``: scatter-add of the pairs (``reduce_by_key``; atomics on CUDA). ``"counting_sort"``:
        histogram → exclusive scan → scatter, then a reduction over the grouped pairs (document 004's method
        (a)). ``"sort_by_key"``: stable radix sort of the pairs by cluster, then the same reduction (method (b)).
        ``"dense"``: one product ``Wᵀ [X, 1]`` with the (N, k) weight matrix W. ``"auto"``: by the measured
        crossover (:func:`choose_method`). All accumulate in float64 and agree to about 1e-12 relative.
    device : "auto", "cpu", "cuda" or "cuda:N"

    Returns
    -------
    (k, d) float64 array (tensor for tensor input)
        A cluster that no pair reaches (zero total weight) gets a row of NaN.

    Notes
    -----
    Work O(N·M·d) (dense: O(N·k·d)), memory O(N·M·d).

    Examples
    --------
    >>> X = [[0.0, 0.0], [2.0, 0.0], [0.0, 4.0]]
    >>> centroid_update(X, [[0, 1], [0, 1], [1, 0]], [[1.0, 0.0], [1.0, 0.5], [0.5, 0.0]], 2).tolist()
    [[1.0, 0.0], [1.0, 2.0]]
    """
    check_choice("method", method, _ALL_METHODS, "centroid_update")
    x, kind = as_tensor(X, "X", device=device, ndim=(2,))
    if not x.dtype.is_floating_point:
        x = x.to(torch.float64)
    nn, _ = as_tensor(nearest, "nearest", like=x, ndim=(2,))
    w, _ = as_tensor(weights, "weights", like=x, ndim=(2,))
    k = check_int("n_clusters", n_clusters, 1, "centroid_update")
    if nn.shape[0] != x.shape[0] or w.shape != nn.shape:
        raise InputError(f"'nearest' and 'weights' must both have shape (len(X), M) = ({x.shape[0]}, M). Got "
                         f"{tuple(nn.shape)} and {tuple(w.shape)}.")
    _check_nearest(nn, k)
    w = w.to(torch.float64)
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise InputError("'weights' must be finite and non-negative.")
    if not bool(torch.isfinite(x).all()):
        raise InputError("'X' contains NaN or inf; centroid_update needs finite values.")
    if method == "auto":
        method = choose_method(x.shape[0], x.shape[1], k, nn.shape[1], x.device)
    sums = centroid_sums(x, nn.to(torch.int64), w, k, method)
    return to_output(finish_centroids(sums), kind)


def finish_centroids(sums: torch.Tensor) -> torch.Tensor:
    """Divide the weighted sums (k, d + 1) by the weight totals; NaN rows where the total is 0."""
    d = sums.shape[1] - 1
    tot = sums[:, d:]
    return torch.where(tot > 0, sums[:, :d] / torch.where(tot > 0, tot, 1.0), math.nan)
