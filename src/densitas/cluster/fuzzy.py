"""``FuzzyKMeans``: Generalized Fuzzy k-Means (document 004) with scikit-learn's interface, on the CPU or a GPU,
for data in memory, in files or in DuckDB — streamed in chunks within a memory budget."""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, ClusterMixin, TransformerMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from densitas._backend.chunking import memory_budget as default_budget
from densitas._backend.chunking import parse_bytes
from densitas._backend.device import resolve_device
from densitas._backend.dispatch import select
from densitas._backend.policy import single_threaded
from densitas._dask import is_dask
from densitas.cluster import _jit
from densitas.cluster._cpu import augmented_rows, classic_pass, gfkm_kernel_applies
from densitas.cluster._data import ChunkedData, TensorData, compute_dtype, is_streamed, open_data
from densitas.cluster.steps import (
    _ALL_METHODS,
    argmin_t,
    centroid_sums,
    check_fuzzifier,
    choose_method,
    distances_t,
    hard_labels,
    membership_weights,
    nearest_centroids,
    prepare_centroids,
    schwaemmle_jensen,
    select_nearest_t,
    sort_by_distance,
    sq_norms,
    weights_and_objective,
)
from densitas.exceptions import InputError

__all__ = ["INITS", "FuzzyKMeans"]

#: The named initialisations (an array of initial centroids is accepted too).
INITS = ("k-means++", "random-slices", "random")
#: k-means++ runs on a uniform sample of at most this many rows (fewer for wide data: 256 MiB of float64).
KMEANS_PP_MAX_ROWS = 1 << 18
#: On the CPU a chunk's (rows × k) and (rows × d) temporaries are kept to about this many elements: they stay in
#: cache and reuse freed memory instead of page-faulting on fresh allocations (measured: 2.8× faster per
#: iteration than one big chunk at n = 500,000, d = 10, k = 5).
CPU_CHUNK_ELEMENTS = 1 << 19
#: On CUDA (Triton selected) with the data on the device, k ≤ 64 and d ≤ 128, ``centroid_update="auto"`` runs
#: each update as one fused kernel (``centroid_update_ = "fused"``); False keeps the chunked path everywhere.
FUSED = True
#: Updates of the first batch run on the device between two looks at the stopping test; each batch doubles, up
#: to ``FUSED_MAX_BATCH`` (at most ``FUSED_MAX_BATCH − 1`` updates computed past the stopping point and discarded).
FUSED_FIRST_BATCH = 4
FUSED_MAX_BATCH = 32
#: Classic fuzzy c-means on the CPU with float64 data in memory: columns per chunk of the pass over the cached
#: transposed rows [x, 1, ‖x − s‖²]ᵀ (:func:`densitas.cluster._cpu.classic_pass`, the chunks shared among threads).
#: A chunk and its (k × rows) block stay in the core's L2 cache for the second GEMM: at n = 500,000, d = 10, k = 5,
#: 4,096–8,192 columns take ~30% less time per pass than 32,768 (benchmarks/RESULTS.md, 2026-11-25).
CPU_CLASSIC_ROWS = 8192
#: Classic fuzzy c-means with q = 2 on the CPU, float64 data in memory, at least ``_jit.MIN_ROWS`` rows: each chunk
#: in one compiled loop (Numba; :mod:`densitas.cluster._jit`) instead of the GEMM steps, where Numba is installed
#: and k(d + 1) ≤ ``_jit.MAX_SUMS``. False keeps the GEMM steps (the tests use it to compare the two).
CPU_CLASSIC_JIT = True
#: GFKM (M < k) on the CPU: every distance from one (k × rows) GEMM, then a top-k along it. False takes the CUDA
#: route on the CPU too (the operation ``knn_tile_topk`` and exact distances; the tests use it to cover that path).
CPU_DENSE_SELECT = True


@dataclass
class _Pass:
    """What one pass over the data returns."""

    sums: torch.Tensor | None  # (k, d + 1) float64
    objective: float
    labels: np.ndarray | None


def _owner() -> str:
    return "FuzzyKMeans"


class FuzzyKMeans(ClassNamePrefixFeaturesOutMixin, TransformerMixin, ClusterMixin, BaseEstimator):
    """Generalized fuzzy k-means (GFKM): each point belongs to its ``n_nearest`` nearest clusters.

    Each iteration computes, for every point ``x_i``, its ``M = n_nearest`` nearest centroids ``NN_i`` and the
    memberships ``u_ij = 1 / Σ_{l∈NN_i} (D_ij / D_il)^(1/(q−1))`` (``D``: squared Euclidean distances; a point
    on a centroid belongs to it alone), then moves every centroid to the ``u^q``-weighted mean of the points
    that have it among their nearest (source document 004). ``n_nearest = n_clusters`` is classic fuzzy
    c-means (Bezdek); ``n_nearest = 1`` is k-means.

    Parameters
    ----------
    n_clusters : int, default 8
        k, in [1, n_samples].
    n_nearest : int, default 2
        M, the clusters each point belongs to, in [1, n_clusters] (with ``n_clusters=1`` any value means the one
        cluster).
    fuzzifier : "auto" or float, default "auto"
        q > 1. ``"auto"``: Schwämmle & Jensen's formula for the data's size and dimension
        (:func:`densitas.cluster.schwaemmle_jensen`; large for low-dimensional data: about 14 for 50 points in
        2-D, so pass a float such as 2.0 there).
    init : {"k-means++", "random-slices", "random"} or array of shape (n_clusters, n_features), default "k-means++"
        ``"k-means++"``: greedy k-means++ (as scikit-learn) on a uniform sample of at most 262,144 rows;
        ``"random-slices"``: one random point from each of k equal slices of the rows (document 004's code);
        ``"random"``: k distinct random points; an array: these centroids (then ``n_init`` is 1).
    n_init : int, default 1
        Runs from different initialisations; the one with the lowest final objective is kept.
    max_iter : int, default 300
        Centroid updates at most.
    tol : float, default 1e-6
        Stop when every centroid moved less than ``tol`` (Euclidean) in an update. ``tol=0`` runs exactly
        ``max_iter`` updates. (On the fused CUDA route the test is read back once per batch of updates, and the
        result is the first update that met it: the same ``n_iter_``, ``objective_`` and centroids.)
    centroid_update : {"auto", "atomic", "counting_sort", "sort_by_key", "dense"}, default "auto"
        How the weighted sums are reduced (:func:`densitas.cluster.centroid_update`); all give the same
        centroids to about 1e-12. ``"auto"`` on CUDA takes the fused kernel where it applies (Notes).
    device : "auto", "cpu", "cuda" or "cuda:N", default "auto"
    memory_budget : int or str, optional
        Working memory of a pass, e.g. ``"512MB"`` (default: :func:`densitas._backend.memory_budget`). The data
        are streamed through in chunks that fit; a tiny budget gives the same centroids (to rounding, 1e-12).
    random_state : int, RandomState instance or None, default None

    Attributes
    ----------
    cluster_centers_ : ndarray of shape (n_clusters, n_features), float64
    labels_ : ndarray of shape (n_samples,), int64
        The nearest centroid of each training point (ties to the lower index).
    fuzzifier_ : float
        The fuzzifier used.
    n_iter_ : int
        Centroid updates run (of the kept run).
    objective_ : ndarray of shape (n_iter_,)
        ``J = Σ_i Σ_{j∈NN_i} u_ij^q D_ij`` at the start of each update (memberships optimal for the centroids).
    inertia_ : float
        ``J`` at the final centroids.
    centroid_update_ : str
        The centroid method used (``"auto"`` resolved): one of ``centroid_update``'s methods, or ``"fused"`` for
        the fused CUDA kernel.
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        With DataFrame or file input.

    Notes
    -----
    **Empty clusters.** A cluster that no point has among its nearest (total weight 0) is moved to the point
    farthest from its nearest centroid (the next farthest for a second empty cluster, and so on; points at
    distance 0 are never taken) — found during the same pass, so no extra pass is needed. If no such point
    exists, the centroid stays.

    **CUDA.** With ``centroid_update="auto"``, data held on the GPU (arrays and tensors that fit half the memory
    budget are moved there once), k ≤ 64, d ≤ 128 and float32 data (float64 with q = 2), each update is one
    fused Triton kernel (operation ``cluster_fused_pass``: every distance by differences in registers, the M
    nearest, memberships, ``u^q``, the objective and per-program partial sums added atomically in float64) and a
    one-program finalize; updates run in batches of 4, 8, 16, then 32 with no host synchronisation inside a
    batch (operation ``cluster_fused_iterations``), and the callback of the command-line progress bar is called
    after each batch; an update that leaves a cluster empty is redone on the chunked path (relocation below).
    Elsewhere the chunked path runs.

    **Cost.** Each iteration is one pass over the data: O(N·k·d) for the distances (a GEMM, or the fused
    distance + top-k kernel of :mod:`densitas.neighbors` on CUDA), O(N·M·d) for the memberships and sums.
    Memory is bounded by ``memory_budget`` plus the k × d centroids; ``labels_`` holds N integers. Files and
    DuckDB relations are read once per iteration (plus the initialisation and a final pass).

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[0.0, 0.0], [0.1, 0.0], [5.0, 5.0], [5.1, 5.0]])
    >>> km = FuzzyKMeans(2, fuzzifier=2.0, init=X[[0, 2]], device="cpu").fit(X)
    >>> km.cluster_centers_.round(2).tolist(), km.labels_.tolist()
    ([[0.05, 0.0], [5.05, 5.0]], [0, 0, 1, 1])
    """

    def __init__(self, n_clusters: int = 8, *, n_nearest: int = 2, fuzzifier: float | str = "auto",
                 init: str | Any = "k-means++", n_init: int = 1, max_iter: int = 300, tol: float = 1e-6,
                 centroid_update: str = "auto", device: Any = "auto", memory_budget: int | str | None = None,
                 random_state: Any = None):
        self.n_clusters = n_clusters
        self.n_nearest = n_nearest
        self.fuzzifier = fuzzifier
        self.init = init
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.centroid_update = centroid_update
        self.device = device
        self.memory_budget = memory_budget
        self.random_state = random_state

    # ------------------------------------------------------------------------------------ validation

    def _check_params(self) -> None:
        o = _owner()

        def pos_int(name: str, value: Any) -> int:
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise InputError(f"The '{name}' parameter of {o} must be an int ≥ 1. Got {value!r} instead.")
            return int(value)

        pos_int("n_clusters", self.n_clusters)
        pos_int("n_nearest", self.n_nearest)
        pos_int("n_init", self.n_init)
        pos_int("max_iter", self.max_iter)
        if self.n_nearest > self.n_clusters > 1:
            raise InputError(f"The 'n_nearest' parameter of {o} must be an int in [1, n_clusters] = [1, "
                             f"{self.n_clusters}]. Got {self.n_nearest!r} instead.")
        check_fuzzifier(self.fuzzifier, o)
        tol = self.tol
        if isinstance(tol, bool) or not isinstance(tol, int | float | np.integer | np.floating) \
                or not math.isfinite(float(tol)) or tol < 0:
            raise InputError(f"The 'tol' parameter of {o} must be a float ≥ 0. Got {tol!r} instead.")
        if not isinstance(self.centroid_update, str) or self.centroid_update not in _ALL_METHODS:
            raise InputError(f"The 'centroid_update' parameter of {o} must be one of {list(_ALL_METHODS)}. Got "
                             f"{self.centroid_update!r} instead.")
        if isinstance(self.init, str) and self.init not in INITS:
            raise InputError(f"The 'init' parameter of {o} must be one of {list(INITS)} or an array of shape "
                             f"(n_clusters, n_features). Got {self.init!r} instead.")
        self._budget()

    def _budget(self) -> int | None:
        if self.memory_budget is None:
            return None
        try:
            return parse_bytes(self.memory_budget)
        except InputError as exc:
            raise InputError(f"The 'memory_budget' parameter of {_owner()} must be a positive number of bytes or a "
                             f"size such as '512MB'. Got {self.memory_budget!r} instead.") from exc

    def _device(self, X: Any = None) -> torch.device:
        return resolve_device(self.device, *((X,) if isinstance(X, torch.Tensor) else ()))

    def _validate(self, X: Any, reset: bool) -> Any:
        """scikit-learn's checks (2-D, non-empty, feature names and counts) with densitas' errors; finiteness is
        checked by the caller with the position of the first bad value."""
        if isinstance(X, torch.Tensor):
            if X.ndim != 2:
                raise InputError(f"'X' must be 2-dimensional (rows × columns). Got shape {tuple(X.shape)} instead.")
            if X.dtype == torch.bool or X.is_complex():
                raise InputError(f"'X' must hold real numbers. Got dtype {X.dtype} instead.")
            if X.shape[0] < 1 or X.shape[1] < 1:
                raise InputError(f"'X' has shape {tuple(X.shape)}: at least 1 sample and 1 feature are required.")
            if reset:
                self.n_features_in_ = int(X.shape[1])
                if hasattr(self, "feature_names_in_"):
                    del self.feature_names_in_
            elif X.shape[1] != self.n_features_in_:
                raise InputError(f"X has {X.shape[1]} features, but {_owner()} is expecting {self.n_features_in_} "
                                 "features as input.")
            return X
        try:
            return validate_data(self, X, reset=reset, dtype=[np.float64, np.float32], ensure_all_finite=False,
                                 ensure_min_samples=1)
        except InputError:
            raise
        except ValueError as exc:
            raise InputError(str(exc)) from exc

    def _as_tensor(self, X: Any, dev: torch.device) -> tuple[torch.Tensor, bool]:
        """Validated query rows as a tensor (on ``dev`` for NumPy input) and whether the caller gave a tensor."""
        x = self._validate(X, reset=False)
        if isinstance(x, torch.Tensor):
            t = x.to(compute_dtype(x.dtype)) if x.dtype != compute_dtype(x.dtype) else x
            if not bool(torch.isfinite(t).all()):
                from densitas.cluster._data import _nonfinite_message

                raise InputError(_nonfinite_message(t, 0, "X"))
            return t, True
        t = _from_numpy(x)
        if not bool(torch.isfinite(t).all()):
            from densitas.cluster._data import _nonfinite_message

            raise InputError(_nonfinite_message(t, 0, "X"))
        return t.to(dev), False

    # --------------------------------------------------------------------------------------- fitting

    def fit(self, X: Any, y: Any = None) -> FuzzyKMeans:
        """Cluster ``X``.

        Parameters
        ----------
        X : (n_samples, n_features) array-like, DataFrame, torch.Tensor, path or duckdb.DuckDBPyRelation
            A path to a Parquet, CSV or ``.npy`` file, or a DuckDB relation, is read in chunks on every pass
            (so it may exceed memory); all its columns must be numeric. A Dask array or DataFrame is fitted on its
            cluster, one map-reduce of the partial sums per iteration (:mod:`densitas.cluster.dask`).
        y : ignored

        Returns
        -------
        self

        Examples
        --------
        >>> import numpy as np
        >>> X = np.r_[np.zeros((5, 2)), np.ones((5, 2))]
        >>> FuzzyKMeans(2, random_state=0, device="cpu").fit(X).n_iter_ >= 1
        True
        """
        return self._fit(X)

    def _fit(self, X: Any, callback: Callable[[int, float, float], None] | None = None,
             compute_labels: bool = True) -> FuzzyKMeans:
        if is_dask(X):  # one map-reduce of the partial sums per iteration on the Dask cluster
            from densitas.cluster.dask import fit_dask

            return fit_dask(self, X, callback, compute_labels)
        self._check_params()
        dev = self._device(X)
        budget = self._budget() or default_budget(dev)
        data = self._open(X, dev, budget)
        n, d = data.n_rows, data.n_features
        k = int(self.n_clusters)
        if k > n:
            raise InputError(f"The 'n_clusters' parameter of {_owner()} must be an int in [1, n_samples] "
                             f"(n_samples = {n}). Got {k} instead.")
        M = min(int(self.n_nearest), k)  # k = 1: every point belongs to the one cluster, whatever n_nearest
        q = schwaemmle_jensen(n, d) if self.fuzzifier == "auto" else float(self.fuzzifier)
        method = choose_method(n, d, k, M, dev) if self.centroid_update == "auto" else self.centroid_update
        rows = self._rows(d, k, M, method, data.dtype, budget)
        if dev.type == "cpu":
            rows = min(rows, max(CPU_CHUNK_ELEMENTS // (max(k, d) + 1), 1024))
        init_array = None if isinstance(self.init, str) else self._init_array(d)
        rs = check_random_state(self.random_state)
        runs = 1 if init_array is not None else int(self.n_init)
        seeds = rs.randint(np.iinfo(np.int32).max, size=runs)
        best = None
        fused = _fused_ops(data, k, q) if self.centroid_update == "auto" else None
        if fused is not None:
            method = "fused"
        for seed in seeds:
            run_rs = np.random.RandomState(seed)
            C = init_array.to(dev) if init_array is not None else self._init_centers(data, k, run_rs)
            if fused is not None:
                geo = _Geometry(data, C.mean(0), rows, M == k, cache_norms=False)
                C, history, n_iter = self._iterate_fused(data, C, M, q, rows, geo, callback, fused[0])
                _sums, Jf, lab = fused[1](data.x, C, M, q, sums=False, labels=compute_labels)
                final = _Pass(None, float(Jf), None if lab is None else lab.cpu().numpy())
            else:
                workers = torch.get_num_threads()
                geo_budget = budget if method == "dense" else None
                jit = CPU_CLASSIC_JIT and dev.type == "cpu" and n >= _jit.MIN_ROWS
                # the cached pass (classic_pass) takes M = k, and GFKM (M < k) where the compiled kernel does
                cached_pass = M == k or (jit and method == "dense" and gfkm_kernel_applies(k, d, M, q))
                # the cache, the passes (their own threads) and the steps between them with one PyTorch thread:
                # its OpenMP threads would spin against the pass's
                own_threads = _Geometry.caches_augmented(data, cached_pass, True, geo_budget)
                with single_threaded() if own_threads else contextlib.nullcontext():
                    geo = _Geometry(data, C.mean(0), rows, cached_pass, budget=geo_budget, workers=workers, jit=jit)
                    C, history, n_iter = self._iterate(data, C, M, q, method, rows, geo, callback)
                    final = self._pass(data, C, M, q, method, rows, geo, sums=False, labels=compute_labels)
            if best is None or final.objective < best[0]:
                best = (final.objective, C, history, n_iter, final.labels)
        objective, C, history, n_iter, labels = best
        if labels is not None:
            self.labels_ = labels
        return self._set_fitted(C, q, history, n_iter, objective, method, k)

    def _set_fitted(self, C: torch.Tensor, q: float, history: list[float], n_iter: int, objective: float,
                    method: str, k: int) -> FuzzyKMeans:
        """The fitted attributes of the best run (shared by the single-machine and the Dask fit)."""
        self.cluster_centers_ = C.cpu().numpy()
        self.fuzzifier_ = q
        self.n_iter_ = n_iter
        self.objective_ = np.asarray(history, dtype=np.float64)
        self.inertia_ = float(objective)
        self.centroid_update_ = method
        self._n_features_out = k
        return self

    def _open(self, X: Any, dev: torch.device, budget: int) -> ChunkedData:
        if is_streamed(X):
            data = open_data(X, dev)
            self.n_features_in_ = data.n_features
            if data.feature_names is not None:
                self.feature_names_in_ = np.asarray(data.feature_names, dtype=object)
            elif hasattr(self, "feature_names_in_"):
                del self.feature_names_in_
            return data
        x = self._validate(X, reset=True)
        t = x if isinstance(x, torch.Tensor) else _from_numpy(x)
        return TensorData(t, dev, budget // 2)

    def _init_array(self, d: int) -> torch.Tensor:
        try:
            a = np.asarray(self.init.detach().cpu() if isinstance(self.init, torch.Tensor) else self.init,
                           dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise InputError(f"The 'init' parameter of {_owner()} must be one of {list(INITS)} or an array of "
                             f"shape (n_clusters, n_features). Got {self.init!r} instead.") from exc
        if a.shape != (self.n_clusters, d):
            raise InputError(f"The 'init' array of {_owner()} must have shape (n_clusters, n_features) = "
                             f"({self.n_clusters}, {d}). Got {a.shape} instead.")
        if not np.isfinite(a).all():
            raise InputError(f"The 'init' array of {_owner()} contains NaN or inf.")
        return torch.from_numpy(a.copy())

    @staticmethod
    def _rows(d: int, k: int, M: int, method: str, dtype: torch.dtype, budget: int) -> int:
        """Rows per chunk so that one chunk's working set (about twice its temporaries) fits the budget."""
        s = torch.finfo(dtype).bits // 8
        kp = min(k, M + 2)
        per_row = s * (2 * d + 2 + k) + 8 * (k + kp * (d + 2) + 2 * M * (d + 3) + d) + 64
        if method == "dense":
            per_row += 8 * k
        if method in ("counting_sort", "sort_by_key"):
            per_row += 8 * M * (d + 6)
        return max(budget // (2 * per_row), 1)

    def _init_centers(self, data: ChunkedData, k: int, rs: np.random.RandomState) -> torch.Tensor:
        n = data.n_rows
        if self.init == "random-slices":
            idx = np.array([rs.randint(j * n // k, (j + 1) * n // k) for j in range(k)], dtype=np.int64)
            return data.take(idx)
        if self.init == "random":
            idx = _distinct(rs, n, k)
            order = np.argsort(idx, kind="stable")
            rows = data.take(idx[order])
            out = torch.empty_like(rows)
            out[torch.from_numpy(order).to(rows.device)] = rows
            return out
        cap = min(KMEANS_PP_MAX_ROWS, max(4096, (256 << 20) // (8 * data.n_features)))
        sample = np.arange(n, dtype=np.int64) if n <= cap else np.sort(_distinct(rs, n, cap))
        return _kmeans_plusplus(data.take(sample), k, rs)

    def _update(self, data: ChunkedData, C: torch.Tensor, M: int, q: float, method: str, rows: int,
                geo: _Geometry) -> tuple[torch.Tensor, float, float, bool]:
        """One centroid update on the chunked path: the new centroids (empty clusters relocated), the pass's
        objective, the largest move and whether a cluster was relocated."""
        d = data.n_features
        p = self._pass(data, C, M, q, "dense" if method == "fused" else method, rows, geo, sums=True, labels=False)
        tot = p.sums[:, d]
        new = torch.where(tot[:, None] > 0, p.sums[:, :d] / torch.where(tot > 0, tot, 1.0)[:, None], C)
        empty = torch.nonzero(tot <= 0).squeeze(1).tolist()
        relocated = False
        if empty:
            far = _farthest(data, C, M, geo, rows, len(empty))
            for j, row in zip(empty, far, strict=False):
                new[j] = row
                relocated = True
        move = float(torch.linalg.vector_norm(new - C, dim=1).max())
        return new, p.objective, move, relocated

    def _iterate(self, data: ChunkedData, C: torch.Tensor, M: int, q: float, method: str, rows: int,
                 geo: _Geometry, callback: Callable[[int, float, float], None] | None
                 ) -> tuple[torch.Tensor, list[float], int]:
        history: list[float] = []
        n_iter = 0
        for it in range(int(self.max_iter)):
            C, objective, move, relocated = self._update(data, C, M, q, method, rows, geo)
            history.append(objective)
            n_iter = it + 1
            if callback is not None:
                callback(n_iter, objective, move)
            if not relocated and move < float(self.tol):
                break
        return C, history, n_iter

    def _iterate_fused(self, data: TensorData, C: torch.Tensor, M: int, q: float, rows: int, geo: _Geometry,
                       callback: Callable[[int, float, float], None] | None, op: Callable
                       ) -> tuple[torch.Tensor, list[float], int]:
        """The same updates as :meth:`_iterate`, in batches run on the device with no host synchronisation
        inside a batch (operation ``cluster_fused_iterations``): after each batch one read-back of its
        objectives, moves and empty-cluster counts finds the first update that meets the stopping test; the
        result is that update's centroids, so the stopping rule, ``n_iter_`` and ``objective_`` are those of the
        update-by-update loop (the later updates of the batch are discarded). An update that left a cluster
        empty is redone on the chunked path, which relocates it. Batches grow from
        :data:`FUSED_FIRST_BATCH` to :data:`FUSED_MAX_BATCH` updates; the callback runs after each batch, once
        per update, with the same values."""
        history: list[float] = []
        tol = float(self.tol)
        max_iter = int(self.max_iter)
        it = 0
        batch = FUSED_FIRST_BATCH
        X = data.x
        while it < max_iter:
            steps = min(batch, max_iter - it)
            batch = min(2 * batch, FUSED_MAX_BATCH)
            Cs, J, move, empty = op(X, C, M, q, steps)
            J_, move_, empty_ = J.tolist(), move.tolist(), empty.tolist()  # the batch's one synchronisation
            for s in range(steps):
                if empty_[s]:  # redo this update with the relocation rule, then start a new batch from it
                    new, objective, mv, relocated = self._update(data, Cs[s], M, q, "fused", rows, geo)
                    history.append(objective)
                    it += 1
                    if callback is not None:
                        callback(it, objective, mv)
                    if not relocated and mv < tol:
                        return new, history, it
                    C = new
                    break
                history.append(J_[s])
                it += 1
                if callback is not None:
                    callback(it, J_[s], move_[s])
                if move_[s] < tol:
                    return Cs[s + 1], history, it
            else:
                C = Cs[steps]
        return C, history, it

    def _pass(self, data: ChunkedData, C: torch.Tensor, M: int, q: float, method: str, rows: int, geo: _Geometry,
              *, sums: bool, labels: bool) -> _Pass:
        """One pass: memberships of every chunk, the objective, the weighted sums (and the labels)."""
        if geo.augmented is not None and method == "dense":  # M = k, or GFKM in the compiled kernel
            return self._pass_classic_cpu(C, q, geo, M, sums=sums, labels=labels)
        k, d = C.shape
        dev = data.device
        C = C.to(dev)
        acc = torch.zeros((k, d + 1), dtype=torch.float64, device=dev) if sums else None
        J = torch.zeros((), dtype=torch.float64, device=dev)
        out_labels = np.empty(data.n_rows, dtype=np.int64) if labels else None
        prepared = prepare_centroids(C, geo.shift, data.dtype)
        for off, x in data.blocks(rows):
            if M == k:  # classic fuzzy c-means: every centroid, in the (k, rows) layout
                Dt = distances_t(x, C, geo.shift, geo.norms(off, x), prepared=prepared)
                if out_labels is not None:
                    out_labels[off:off + x.shape[0]] = argmin_t(Dt).cpu().numpy()  # ties: lower index
                _u, wt, Jc = weights_and_objective(Dt, q, dim=0, keep_u=False, overwrite=True)
                J += Jc
                if acc is not None:
                    if method == "dense":
                        acc[:, :d] += wt.to(torch.float64) @ x.to(torch.float64)
                        acc[:, d] += wt.to(torch.float64).sum(1)
                    else:
                        nn = torch.arange(k, device=dev).expand(x.shape[0], k)
                        centroid_sums(x, nn, wt.T.contiguous(), k, method, out=acc, full=True)
                continue
            if geo.dense_select:  # the CPU: the (k, rows) GEMM of every distance, then the M nearest
                Dt = distances_t(x, C, geo.shift, geo.norms(off, x), prepared=prepared)
                Ds, it = select_nearest_t(Dt, M)
                if out_labels is not None:
                    out_labels[off:off + x.shape[0]] = argmin_t(Dt).cpu().numpy()  # ties: lower index
                _u, wt, Jc = weights_and_objective(Ds, q, dim=0, keep_u=False, overwrite=True)
                J += Jc
                if acc is not None:
                    if method == "dense":
                        W = torch.zeros((k, x.shape[0]), dtype=torch.float64, device=dev)
                        W.scatter_(0, it, wt.to(torch.float64))
                        acc[:, :d] += W @ x.to(torch.float64)
                        acc[:, d] += W.sum(1)
                    else:
                        centroid_sums(x, it.T.contiguous(), wt.T.contiguous(), k, method, out=acc, full=False)
                continue
            D, nn = nearest_centroids(x, C, M, geo.shift)
            _u, w, Jc = weights_and_objective(D, q, keep_u=False)
            J += Jc
            if acc is not None:
                centroid_sums(x, nn, w, k, method, out=acc, full=False)
            if out_labels is not None:
                out_labels[off:off + x.shape[0]] = hard_labels(D, nn).cpu().numpy()
        return _Pass(acc, float(J), out_labels)

    def _pass_classic_cpu(self, C: torch.Tensor, q: float, geo: _Geometry, M: int, *, sums: bool,
                          labels: bool) -> _Pass:
        """The pass on the CPU over the cached ``Xa = [x, 1, ‖x − s‖²]ᵀ``: for M = k two GEMMs and four in-place
        passes per chunk of :data:`CPU_CLASSIC_ROWS` columns, or for q = 2 one compiled loop per chunk
        (:data:`CPU_CLASSIC_JIT`; GFKM, M < k, only there), the chunks shared among threads
        (:func:`densitas.cluster._cpu.classic_pass`). Same results as the general path to rounding."""
        acc, J, out_labels = classic_pass(geo.augmented, C, geo.shift, q, rows=CPU_CLASSIC_ROWS, sums=sums,
                                          labels=labels, jit=geo.jit, workers=geo.workers, nearest=M)
        return _Pass(acc, J, out_labels)

    # ------------------------------------------------------------------------------------ prediction

    def _assign(self, X: Any) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """(D, nearest) of the validated rows of ``X`` for the model's ``n_nearest``, and whether X was a tensor."""
        check_is_fitted(self, "cluster_centers_")
        dev = self._device(X)
        x, as_torch = self._as_tensor(X, dev)
        C = _from_numpy(self.cluster_centers_).to(x.device)
        D, nn = _chunked(x, C, min(int(self.n_nearest), C.shape[0]), self._budget())
        return D, nn, as_torch

    def _out(self, t: torch.Tensor, as_torch: bool) -> Any:
        return t if as_torch else t.cpu().numpy()

    def predict(self, X: Any) -> Any:
        """The nearest cluster of each row (its largest membership; ties to the lower index).

        Parameters
        ----------
        X : (n, n_features) array-like, DataFrame or torch.Tensor

        Returns
        -------
        (n,) int64 array (tensor for tensor input)

        Examples
        --------
        >>> import numpy as np
        >>> km = FuzzyKMeans(2, fuzzifier=2.0, init=[[0.0], [10.0]], max_iter=1, device="cpu").fit([[0.0], [10.0]])
        >>> km.predict([[1.0], [8.0]]).tolist()
        [0, 1]
        """
        if is_dask(X):
            return _on_dask(self, X, "predict")
        D, nn, as_torch = self._assign(X)
        return self._out(hard_labels(D, nn), as_torch)

    def fit_predict(self, X: Any, y: Any = None) -> Any:
        """Fit and return ``labels_``.

        Examples
        --------
        >>> import numpy as np
        >>> X = np.array([[0.0], [0.2], [9.0], [9.2]])
        >>> FuzzyKMeans(2, fuzzifier=2.0, init=[[0.0], [9.0]], device="cpu").fit_predict(X).tolist()
        [0, 0, 1, 1]
        """
        return self.fit(X).labels_

    def predict_membership(self, X: Any) -> Any:
        """Memberships of each row in every cluster: dense (n, n_clusters), zero outside its nearest clusters.

        Parameters
        ----------
        X : (n, n_features) array-like, DataFrame or torch.Tensor

        Returns
        -------
        (n, n_clusters) array (tensor for tensor input); rows sum to 1.

        Examples
        --------
        >>> km = FuzzyKMeans(2, fuzzifier=2.0, init=[[0.0], [4.0]], max_iter=1, device="cpu").fit([[0.0], [4.0]])
        >>> km.predict_membership([[1.0]]).round(3).tolist()
        [[0.9, 0.1]]
        """
        if is_dask(X):
            return _on_dask(self, X, "predict_membership")
        D, nn, as_torch = self._assign(X)
        u, _ = membership_weights(D, self.fuzzifier_)
        dense = torch.zeros((D.shape[0], self.cluster_centers_.shape[0]), dtype=u.dtype, device=u.device)
        dense.scatter_(1, nn, u)
        return self._out(dense, as_torch)

    def membership(self, X: Any) -> tuple[Any, Any]:
        """The ``n_nearest`` nearest clusters of each row and its memberships in them (the sparse form).

        Parameters
        ----------
        X : (n, n_features) array-like, DataFrame or torch.Tensor

        Returns
        -------
        indices : (n, n_nearest) int64 array
            Nearest first (ties to the lower index).
        memberships : (n, n_nearest) array
            Aligned with ``indices``; rows sum to 1. ``scipy.sparse.csr_matrix((memberships.ravel(),
            indices.ravel(), np.arange(0, n * M + 1, M)), shape=(n, n_clusters))`` gives the sparse matrix.

        Examples
        --------
        >>> km = FuzzyKMeans(3, fuzzifier=2.0, init=[[0.0], [4.0], [9.0]], max_iter=1, device="cpu")
        >>> i, u = km.fit([[0.0], [4.0], [9.0]]).membership([[3.0]])
        >>> i.tolist(), u.round(3).tolist()
        ([[1, 0]], [[0.9, 0.1]])
        """
        if is_dask(X):
            return _on_dask(self, X, "membership")
        D, nn, as_torch = self._assign(X)
        D, nn = sort_by_distance(D, nn)
        u, _ = membership_weights(D, self.fuzzifier_)
        return self._out(nn, as_torch), self._out(u, as_torch)

    def transform(self, X: Any) -> Any:
        """Euclidean distances of each row to every centroid.

        Parameters
        ----------
        X : (n, n_features) array-like, DataFrame or torch.Tensor

        Returns
        -------
        (n, n_clusters) array (tensor for tensor input)

        Examples
        --------
        >>> km = FuzzyKMeans(2, fuzzifier=2.0, init=[[0.0], [4.0]], max_iter=1, device="cpu").fit([[0.0], [4.0]])
        >>> km.transform([[1.0]]).tolist()
        [[1.0, 3.0]]
        """
        if is_dask(X):
            return _on_dask(self, X, "transform")
        check_is_fitted(self, "cluster_centers_")
        dev = self._device(X)
        x, as_torch = self._as_tensor(X, dev)
        C = _from_numpy(self.cluster_centers_).to(x.device)
        D, _ = _chunked(x, C, C.shape[0], self._budget())
        return self._out(D.sqrt(), as_torch)

    def score(self, X: Any, y: Any = None) -> float:
        """The opposite of the objective ``J`` on ``X`` (higher is better, as scikit-learn's ``KMeans.score``).

        Examples
        --------
        >>> km = FuzzyKMeans(2, fuzzifier=2.0, init=[[0.0], [4.0]], max_iter=1, device="cpu").fit([[0.0], [4.0]])
        >>> km.score([[0.0], [4.0]])
        -0.0
        """
        if is_dask(X):
            return _on_dask(self, X, "score")
        D, _nn, _ = self._assign(X)
        _u, w = membership_weights(D, self.fuzzifier_)
        return -float((w.to(torch.float64) * D.to(torch.float64)).sum())

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False
        return tags


# ------------------------------------------------------------------------------------------- helpers


def _on_dask(est: FuzzyKMeans, X: Any, how: str) -> Any:
    """``how`` of the fitted model on a Dask collection, block by block (Dask arrays; a float for ``score``)."""
    from densitas.cluster.dask import predict_dask

    return predict_dask(est, X, how)


def _fused_ops(data: ChunkedData, k: int, q: float) -> tuple[Callable, Callable] | None:
    """The fused iteration and pass (operations ``cluster_fused_iterations`` and ``cluster_fused_pass``) when
    their Triton implementations are selected for the data's device (CUDA, or forced under the interpreter) and
    apply: rows held on the device in their compute dtype, k and d within the kernel's limits."""
    if not FUSED or not isinstance(data, TensorData) or data.x.device != data.device or data.x.dtype != data.dtype:
        return None
    backend, iterations = select("cluster_fused_iterations", data.device)
    if backend != "triton":
        return None
    from densitas.cluster._triton import fused_applies  # a Triton implementation was selected: Triton is there

    if not fused_applies(data.x, k, q):
        return None
    return iterations, select("cluster_fused_pass", data.device)[1]


def _chunked(x: torch.Tensor, C: torch.Tensor, M: int, budget: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``nearest_centroids`` over the rows of ``x`` in chunks that fit the budget."""
    k, d = C.shape
    cap = budget or default_budget(x.device)
    per_row = 8 * (2 * d + 3 * k + min(k, M + 2) * (d + 2)) + 64
    rows = max(cap // (2 * per_row), 1)
    shift = C.mean(0)
    if x.shape[0] <= rows:
        return nearest_centroids(x, C, M, shift)
    parts = [nearest_centroids(x[s:s + rows], C, M, shift) for s in range(0, x.shape[0], rows)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def _from_numpy(a: np.ndarray) -> torch.Tensor:
    """A tensor sharing ``a``'s memory (C-contiguous copy only if needed). Read-only arrays (memory maps) are
    wrapped without a copy and without PyTorch's warning: densitas never writes to its inputs."""
    a = np.ascontiguousarray(a)
    if a.flags.writeable:
        return torch.from_numpy(a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(a)


class _Geometry:
    """The fixed shift ``s`` of one fit (the initial centroids' mean) and, for data held in memory, the cached
    ``‖x − s‖²`` of every row (one float per row), so the classic path's GEMM needs no centred copy of X
    (``cache_norms=False``: computed chunk by chunk when needed, as for streamed data). Classic fuzzy c-means on
    the CPU with float64 data in memory keeps instead ``augmented``, the transposed rows ``[x, 1, ‖x − s‖²]ᵀ``
    ((d + 2) × n, 1 + 2/d times X's size), when it fits in half the memory budget."""

    def __init__(self, data: ChunkedData, shift: torch.Tensor, rows: int, full: bool, cache_norms: bool = True,
                 budget: int | None = None, workers: int | None = None, jit: bool = False):
        self.shift = shift.to(data.device)
        self._norms = None
        # M < k on the CPU: every distance from the (k, rows) GEMM, then a selection (the GEMM + top-k of
        # densitas.neighbors' PyTorch path in a layout that vectorises); on CUDA the fused top-k kernel
        self.dense_select = data.device.type == "cpu" and CPU_DENSE_SELECT
        self.augmented = None
        self.workers = workers or torch.get_num_threads()  # the classic CPU pass's threads
        self.jit = jit  # the classic CPU pass may take the compiled kernel (CPU_CLASSIC_JIT, _jit.MIN_ROWS rows)
        if self.caches_augmented(data, full, cache_norms, budget):
            # classic fuzzy c-means on the CPU: Xa = [x, 1, ‖x − s‖²]ᵀ, (d + 2) × n (FuzzyKMeans._pass_classic_cpu)
            self.augmented = augmented_rows(data.x, self.shift, rows)
            return
        if cache_norms and (full or self.dense_select) and isinstance(data, TensorData):
            self._norms = torch.cat([sq_norms(x, self.shift) for _, x in data.blocks(rows)])

    @staticmethod
    def caches_augmented(data: ChunkedData, full: bool, cache_norms: bool, budget: int | None) -> bool:
        """Whether the fit keeps ``augmented`` (classic fuzzy c-means on the CPU, float64 held in memory, the
        cache within half the budget): then its passes are :func:`densitas.cluster._cpu.classic_pass`."""
        return bool(cache_norms and full and budget is not None and isinstance(data, TensorData)
                    and data.device.type == "cpu" and data.x.device.type == "cpu" and data.dtype == torch.float64
                    and data.x.dtype == torch.float64 and (data.n_features + 2) * data.n_rows * 8 <= budget // 2)

    def norms(self, off: int, x: torch.Tensor) -> torch.Tensor | None:
        return None if self._norms is None else self._norms[off:off + x.shape[0]]


def _farthest(data: ChunkedData, C: torch.Tensor, M: int, geo: _Geometry, rows: int, count: int) -> torch.Tensor:
    """The rows farthest from their nearest centroid, farthest first (ties to the lower row), at most ``count``,
    excluding rows at distance 0: one extra pass, run only when a cluster came out empty."""
    d = C.shape[1]
    dev = data.device
    far_v = torch.empty(0, dtype=torch.float64, device=dev)
    far_i = torch.empty(0, dtype=torch.int64, device=dev)
    far_x = torch.empty((0, d), dtype=torch.float64, device=dev)
    for off, x in data.blocks(rows):
        D, _ = nearest_centroids(x, C.to(dev), 1, geo.shift)
        dmin = D[:, 0].to(torch.float64)
        v, i = torch.topk(dmin, min(count, dmin.shape[0]), largest=True, sorted=False)
        far_v, far_i, far_x = _merge_far(far_v, far_i, far_x, v, i + off, x[i].to(torch.float64), count)
    return far_x[far_v > 0]


def _merge_far(v0: torch.Tensor, i0: torch.Tensor, x0: torch.Tensor, v1: torch.Tensor, i1: torch.Tensor,
               x1: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``k`` largest values of two candidate lists, by (value descending, row index ascending)."""
    v = torch.cat([v0, v1])
    i = torch.cat([i0, i1])
    x = torch.cat([x0, x1])
    o1 = torch.argsort(i)
    o2 = torch.argsort(v[o1], descending=True, stable=True)
    o = o1[o2][:k]
    return v[o], i[o], x[o]


def _distinct(rs: np.random.RandomState, n: int, k: int) -> np.ndarray:
    """``k`` distinct integers in [0, n) (not sorted), without an O(n) permutation when k ≪ n."""
    if 4 * k >= n:
        return rs.permutation(n)[:k].astype(np.int64)
    chosen: list[int] = []
    seen: set[int] = set()
    while len(chosen) < k:
        for v in rs.randint(0, n, size=2 * (k - len(chosen))).tolist():
            if v not in seen:
                seen.add(v)
                chosen.append(v)
                if len(chosen) == k:
                    break
    return np.asarray(chosen, dtype=np.int64)


def _kmeans_plusplus(X: torch.Tensor, k: int, rs: np.random.RandomState) -> torch.Tensor:
    """Greedy k-means++ (Arthur & Vassilvitskii 2007, with scikit-learn's 2 + ⌊ln k⌋ local trials) on float64
    rows ``X``: each new centre is the best of a few candidates drawn with probability ∝ D², the squared
    distance to the nearest centre chosen so far."""
    n = X.shape[0]
    trials = 2 + int(math.log(k))
    centers = torch.empty((k, X.shape[1]), dtype=torch.float64, device=X.device)
    first = int(rs.randint(n))
    centers[0] = X[first]
    closest = ((X - X[first]) ** 2).sum(1)
    pot = float(closest.sum())
    for c in range(1, k):
        if pot <= 0:
            centers[c] = X[int(rs.randint(n))]
            continue
        cum = torch.cumsum(closest, 0)
        draws = torch.from_numpy(rs.uniform(size=trials) * pot).to(X.device)
        cand = torch.searchsorted(cum, draws).clamp_(max=n - 1)
        xc = X[cand]
        d = (X * X).sum(1)[None, :] - 2.0 * (xc @ X.T) + (xc * xc).sum(1)[:, None]
        d = torch.minimum(d.clamp_(min=0.0), closest[None, :])
        pots = d.sum(1)
        b = int(torch.argmin(pots))
        centers[c] = xc[b]
        closest = d[b]
        pot = float(pots[b])
    return centers
