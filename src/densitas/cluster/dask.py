"""``FuzzyKMeans`` on Dask: the additive sums of every iteration added over the blocks.

Two ways, the same arithmetic. **Blocks in cluster memory** (a persisted collection, the usual form for
iterative work): the updates run inside the workers — one task per worker for the whole fit, holding the blocks
that worker stores, the partial sums of each update all-reduced between the tasks (:mod:`densitas._collective`,
gloo), the same new centroids formed on every worker; no scheduler round trip per update (one costs 10–35 ms,
as long as an update's compute at 10⁸ rows on a GPU). An update that leaves a cluster empty hands back to the
client, which relocates it as below and resumes the loop. **Lazy collections** (blocks computed from their
source by each task) and fits with a per-update ``callback``: one map-reduce per update, as follows.

Every iteration sends the centroids (k × d floats) to one task per chunk or partition; the task, on the worker
holding the block and on the worker's device (CUDA when it has one, else the CPU), runs the single-machine pass
(:meth:`FuzzyKMeans._pass <densitas.cluster.FuzzyKMeans>` with the requested centroid update, or the fused pass
``cluster_fused_pass`` on CUDA with ``centroid_update="auto"`` where it applies) and returns its partial
``[Σ w x, Σ w]`` (k, d + 1) and objective; a tree of tasks adds them, and the client forms the new centroids
exactly as the single-machine update does (relocating an empty cluster to the farthest row, found by one more
map-reduce of per-block candidates). The initialisation draws the same rows as the single-machine fit (the
random numbers depend only on n), gathered from the blocks that hold them, so the same ``random_state`` gives
the same centroids, to rounding (1e-12 relative), as the single-machine fit of the same data.

``labels_`` (and ``predict``, ``transform``, ``predict_membership``, ``membership``) on Dask input are Dask
arrays computed lazily, block by block, from the fitted centroids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from densitas._backend.chunking import memory_budget as default_budget
from densitas._backend.device import resolve_device
from densitas._dask import RowBlocks, block_tensor, compute, compute_reduced, row_blocks
from densitas.cluster._data import ChunkedData, _nonfinite_message, compute_dtype
from densitas.exceptions import InputError

__all__ = ["DaskRows", "fit_dask", "predict_dask"]


class DaskRows(ChunkedData):
    """A Dask collection's rows for the initialisation: its size, and :meth:`take` of a few rows (gathered
    from the blocks that hold them onto the client's ``device``)."""

    def __init__(self, blocks: RowBlocks, device: torch.device):
        self.rows = blocks
        self.n_rows = blocks.n_rows
        self.n_features = blocks.n_features
        self.dtype = compute_dtype(blocks.dtype)
        self.device = device
        self.feature_names = blocks.names

    def take(self, index: np.ndarray) -> torch.Tensor:
        import dask

        index = np.asarray(index, dtype=np.int64)
        pick = dask.delayed(_take_rows, pure=True)
        tasks, where = [], []
        for part, lo, hi in zip(self.rows.parts, self.rows.offsets[:-1], self.rows.offsets[1:], strict=True):
            a, b = np.searchsorted(index, [lo, hi])
            if b > a:
                tasks.append(pick(part, index[a:b] - lo))
                where.append((a, b))
        (got,) = compute(tasks)
        out = torch.empty((len(index), self.n_features), dtype=torch.float64, device=self.device)
        for (a, b), rows in zip(where, got, strict=True):
            out[a:b] = torch.from_numpy(rows).to(self.device)
        return out


def _take_rows(block: Any, local: np.ndarray) -> np.ndarray:
    return block_tensor(block, torch.float64)[torch.from_numpy(local).to(_device_of(block))].cpu().numpy()


def _device_of(block: Any) -> torch.device:
    return torch.device("cuda") if hasattr(block, "__cuda_array_interface__") else torch.device("cpu")


@dataclass(frozen=True)
class PassPlan:
    """What every block's task needs besides its rows (shipped with the centroids each iteration)."""

    n_rows: int  # of the whole data (the centroid method's choice depends on it)
    M: int
    q: float
    method: str  # a centroid method, or "auto"
    device: Any  # the estimator's device request, resolved on the worker
    budget: int | None


@dataclass
class PartialPass:
    """One block's pass: the partial sums (k, d + 1) and objective, the method it ran, its labels."""

    sums: np.ndarray | None
    objective: float
    method: str
    labels: np.ndarray | None = None


def _block_data(block: Any, offset: int, plan: PassPlan) -> tuple[Any, torch.device, int]:
    """The block as the single-machine ``TensorData`` on the worker's device; finiteness checked with the
    block's global row numbers."""
    from densitas.cluster._data import TensorData

    dev = resolve_device(plan.device)
    x = block_tensor(block)
    if x.ndim == 1:
        x = x[:, None]
    x = x.to(compute_dtype(x.dtype))
    budget = plan.budget or default_budget(dev)
    try:  # TensorData checks finiteness (one sum); its message numbers the rows within the block
        return TensorData(x, dev, budget // 2), dev, budget
    except InputError:
        raise InputError(_nonfinite_message(x, offset, "X")) from None


class _BlockPass:
    """One block's pass with given centroids, its data prepared once (the device copy, the finiteness check):
    the single-machine pass with fixed centroids and shift."""

    def __init__(self, block: Any, offset: int, plan: PassPlan):
        self.plan = plan
        self.data, self.dev, self.budget = _block_data(block, offset, plan)
        self._fused: Any = None  # the fused kernel's operations for k centroids, found on the first call
        self._fused_k = -1

    def __call__(self, C: np.ndarray, shift: np.ndarray, sums: bool, labels: bool) -> PartialPass:
        from densitas.cluster.fuzzy import CPU_CHUNK_ELEMENTS, FuzzyKMeans, _fused_ops, _Geometry
        from densitas.cluster.steps import choose_method

        plan, data, dev = self.plan, self.data, self.dev
        Ct = torch.from_numpy(C).to(dev)
        k, d = C.shape
        if data.n_rows == 0:
            return PartialPass(np.zeros((k, d + 1)) if sums else None, 0.0, plan.method,
                               np.empty(0, np.int64) if labels else None)
        if self._fused_k != k:
            self._fused = _fused_ops(data, k, plan.q) if plan.method == "auto" else None
            self._fused_k = k
        fused = self._fused
        if fused is not None:
            s, J, lab = fused[1](data.x, Ct, plan.M, plan.q, sums=sums, labels=labels)
            return PartialPass(None if s is None else s.cpu().numpy(), float(J), "fused",
                               None if lab is None else lab.cpu().numpy())
        method = choose_method(plan.n_rows, d, k, plan.M, dev) if plan.method == "auto" else plan.method
        rows = FuzzyKMeans._rows(d, k, plan.M, method, data.dtype, self.budget)
        if dev.type == "cpu":
            rows = min(rows, max(CPU_CHUNK_ELEMENTS // (max(k, d) + 1), 1024))
        geo = _Geometry(data, torch.from_numpy(shift).to(dev), rows, plan.M == k, cache_norms=False)
        p = FuzzyKMeans()._pass(data, Ct, plan.M, plan.q, method, rows, geo, sums=sums, labels=labels)
        return PartialPass(None if p.sums is None else p.sums.cpu().numpy(), p.objective, method, p.labels)


def _block_pass(block: Any, offset: int, C: np.ndarray, shift: np.ndarray, plan: PassPlan, sums: bool,
                labels: bool) -> PartialPass:
    """The task of one iteration on one block (the map-reduce loop)."""
    return _BlockPass(block, offset, plan)(C, shift, sums, labels)


def _add(parts: list[PartialPass]) -> PartialPass:
    sums = None if parts[0].sums is None else np.sum([p.sums for p in parts], axis=0)
    return PartialPass(sums, float(sum(p.objective for p in parts)), parts[0].method)


def _block_farthest(block: Any, offset: int, C: np.ndarray, shift: np.ndarray, plan: PassPlan, count: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One block's ``count`` rows farthest from their nearest centroid: (distance, global row, row)."""
    from densitas.cluster.steps import nearest_centroids

    data, dev, _budget = _block_data(block, offset, plan)
    D, _ = nearest_centroids(data.x.to(dev), torch.from_numpy(C).to(dev), 1, torch.from_numpy(shift).to(dev))
    dmin = D[:, 0].to(torch.float64)
    v, i = torch.topk(dmin, min(count, dmin.shape[0]), largest=True, sorted=False)
    return v.cpu().numpy(), (i.cpu() + offset).numpy(), data.x.to(dev)[i].to(torch.float64).cpu().numpy()


def _merge_farthest(parts: list[tuple[np.ndarray, ...]], count: int) -> tuple[np.ndarray, ...]:
    from densitas.cluster.fuzzy import _merge_far

    v, i, x = (torch.from_numpy(np.concatenate([p[j] for p in parts])) for j in range(3))
    empty = torch.empty(0, dtype=torch.float64)
    out = _merge_far(empty, empty.to(torch.int64), torch.empty((0, x.shape[1]), dtype=torch.float64), v, i, x,
                     count)
    return tuple(t.numpy() for t in out)


class _Cluster:
    """The iteration's map-reduce over the blocks."""

    def __init__(self, blocks: RowBlocks, plan: PassPlan):
        self.blocks = blocks
        self.plan = plan

    def _each(self, fn: Any, *args: Any) -> list[Any]:
        import dask

        task = dask.delayed(fn, pure=True)
        return [task(part, int(off), *args) for part, off, size in
                zip(self.blocks.parts, self.blocks.offsets[:-1], self.blocks.sizes, strict=True) if size > 0]

    def pass_sums(self, C: torch.Tensor, shift: torch.Tensor, sums: bool) -> PartialPass:
        import dask

        shared = dask.delayed(C.cpu().numpy(), pure=True), dask.delayed(shift.cpu().numpy(), pure=True)
        return compute_reduced(self._each(_block_pass, *shared, self.plan, sums, False), _add)

    def farthest(self, C: torch.Tensor, shift: torch.Tensor, count: int) -> np.ndarray:
        v, _i, x = compute_reduced(self._each(_block_farthest, C.cpu().numpy(), shift.cpu().numpy(), self.plan,
                                              count), _merge_farthest, count)
        return x[v > 0]


def _centroids_from_sums(S: torch.Tensor, C: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """The new centroids ``Σ w x / Σ w`` from the summed ``[Σ w x, Σ w]`` (k, d + 1), the old centroid where a
    cluster has no weight, and the list of those empty clusters."""
    d = C.shape[1]
    tot = S[:, d]
    new = torch.where(tot[:, None] > 0, S[:, :d] / torch.where(tot > 0, tot, 1.0)[:, None], C)
    return new, torch.nonzero(tot <= 0).squeeze(1).tolist()


def _update(cluster: _Cluster, C: torch.Tensor, shift: torch.Tensor) -> tuple[torch.Tensor, float, float, bool,
                                                                               str]:
    """One centroid update, as :meth:`FuzzyKMeans._update` on one machine."""
    p = cluster.pass_sums(C, shift, True)
    new, empty = _centroids_from_sums(torch.from_numpy(p.sums).to(C), C)
    relocated = False
    if empty:
        far = torch.from_numpy(cluster.farthest(C, shift, len(empty))).to(C)
        for j, row in zip(empty, far, strict=False):
            new[j] = row
            relocated = True
    move = float(torch.linalg.vector_norm(new - C, dim=1).max())
    return new, p.objective, move, relocated, p.method


# ------------------------------------------------------------------------- the loop inside the workers


@dataclass
class LoopResult:
    """What the workers' loop reached: the centroids, the objective of every update, the method of the last,
    and whether it stopped at an empty cluster (the client relocates it, then the loop goes on)."""

    C: np.ndarray
    history: list[float]
    method: str
    empty: bool


def _worker_fit(comm: Any, blocks: list[tuple[int, Any]], offsets: np.ndarray, C0: np.ndarray, shift: np.ndarray,
                plan: PassPlan, max_iter: int, tol: float) -> LoopResult:
    """The fit's updates on one worker's blocks: each update's partial sums all-reduced over the workers, the
    same new centroids formed on every worker (so every worker takes the same branch at every step)."""
    C, history, method = C0.copy(), [], plan.method
    k, d = C.shape
    width = k * (d + 1) + 1  # the sums, the objective; then the count of workers that failed this step
    try:
        passes = [_BlockPass(block, int(offsets[i]), plan) for i, block in blocks]
        failure = None
    except Exception as err:  # every worker must hear of it before the error is raised
        passes, failure = [], err
    if _failed(comm, np.zeros(width), failure):
        return LoopResult(C, history, method, False)
    for _ in range(max_iter):
        try:
            parts = [bp(C, shift, True, False) for bp in passes]
            local = _add(parts)
            vec, failure = np.append(local.sums.ravel(), local.objective), None
        except Exception as err:  # as above
            vec, failure = np.zeros(width), err
        total = comm.allreduce(np.append(vec, 1.0 if failure else 0.0))
        if failure is not None:
            raise failure
        if total[-1] > 0:  # another worker failed: the client gets its error
            return LoopResult(C, history, method, False)
        total = total[:-1]  # the sums and the objective
        new, empty = _centroids_from_sums(torch.from_numpy(total[:-1].reshape(k, d + 1)), torch.from_numpy(C))
        if empty:
            return LoopResult(C, history, method, True)
        history.append(float(total[-1]))
        method = parts[0].method
        move = float(torch.linalg.vector_norm(new - torch.from_numpy(C), dim=1).max())
        C = new.numpy()
        if move < tol:
            break
    return LoopResult(C, history, method, False)


def _failed(comm: Any, vec: np.ndarray, failure: BaseException | None) -> bool:
    """One all-reduce of a step in which some worker may have failed: raise this worker's error after it has
    told the others; True when another worker failed (this one stops too)."""
    total = comm.allreduce(np.append(vec, 1.0 if failure else 0.0))
    if failure is not None:
        raise failure
    return bool(total[-1] > 0)


class _WorkerLoop:
    """Runs the updates inside the workers (:mod:`densitas._collective`) for a persisted collection."""

    def __init__(self, where: Any, blocks: RowBlocks, plan: PassPlan, tol: float):
        self.where, self.offsets, self.plan, self.tol = where, blocks.offsets, plan, tol

    def __call__(self, C: torch.Tensor, shift: torch.Tensor, max_iter: int) -> LoopResult | None:
        from densitas._collective import GroupUnavailableError, run_on_workers

        try:
            results = run_on_workers(self.where, _worker_fit, self.offsets, C.cpu().numpy(), shift.cpu().numpy(),
                                     self.plan, max_iter, self.tol)
        except GroupUnavailableError:
            return None  # the caller drives the updates itself
        return results[0]  # every worker formed the same centroids


def _worker_loop(X: Any, blocks: RowBlocks, plan: PassPlan, tol: float, callback: Any) -> _WorkerLoop | None:
    """The workers' loop where it applies: no per-update callback, the blocks in cluster memory."""
    if callback is not None:
        return None
    from densitas._collective import placement

    where = placement(X, blocks.parts)
    return None if where is None else _WorkerLoop(where, blocks, plan, tol)


def _iterate(cluster: _Cluster, loop: _WorkerLoop | None, C: torch.Tensor, shift: torch.Tensor, max_iter: int,
             tol: float, callback: Any) -> tuple[torch.Tensor, list[float], str | None]:
    """The fit's updates from ``C``: in the workers' loop where there is one (the client's map-reduce only to
    relocate an empty cluster), else one map-reduce per update."""
    history: list[float] = []
    method = None
    while len(history) < max_iter:
        got = loop(C, shift, max_iter - len(history)) if loop is not None else None
        if got is None:
            loop = None  # no loop, or its group could not form: one map-reduce per update from here
        else:
            C = torch.from_numpy(got.C).to(C)
            history.extend(got.history)
            method = got.method if got.history else method
            if not got.empty or len(history) >= max_iter:
                break
        C, objective, move, relocated, method = _update(cluster, C, shift)
        history.append(objective)
        if callback is not None:
            callback(len(history), objective, move)
        if not relocated and move < tol:
            break
    return C, history, method


def fit_dask(est: Any, X: Any, callback: Any = None, compute_labels: bool = True) -> Any:
    """``FuzzyKMeans.fit`` on a Dask array or DataFrame (see the module); returns ``est``."""
    from densitas.cluster.fuzzy import _owner
    from densitas.cluster.steps import schwaemmle_jensen

    est._check_params()
    blocks = row_blocks(X, "X")
    if blocks.dtype.kind not in "biuf":
        raise InputError(f"'X' of {_owner()} must hold numbers only. Got dtype {blocks.dtype} instead.")
    n, d = blocks.n_rows, blocks.n_features
    if n < 1 or d < 1:
        raise InputError(f"'X' has shape ({n}, {d}): at least 1 sample and 1 feature are required.")
    est.n_features_in_ = d
    if blocks.names is not None:
        est.feature_names_in_ = np.asarray(blocks.names, dtype=object)
    elif hasattr(est, "feature_names_in_"):
        del est.feature_names_in_
    k = int(est.n_clusters)
    if k > n:
        raise InputError(f"The 'n_clusters' parameter of {_owner()} must be an int in [1, n_samples] "
                         f"(n_samples = {n}). Got {k} instead.")
    M = min(int(est.n_nearest), k)
    q = schwaemmle_jensen(n, d) if est.fuzzifier == "auto" else float(est.fuzzifier)
    dev = est._device()  # the client's device: the initialisation and the centroid arithmetic
    plan = PassPlan(n, M, q, est.centroid_update, est.device, est._budget())
    cluster = _Cluster(blocks, plan)
    loop = _worker_loop(X, blocks, plan, float(est.tol), callback)
    data = DaskRows(blocks, dev)
    init_array = None if isinstance(est.init, str) else est._init_array(d)
    from sklearn.utils import check_random_state

    rs = check_random_state(est.random_state)
    runs = 1 if init_array is not None else int(est.n_init)
    seeds = rs.randint(np.iinfo(np.int32).max, size=runs)
    best = None
    for seed in seeds:
        C = init_array.to(dev) if init_array is not None else est._init_centers(data, k, np.random.RandomState(seed))
        shift = C.mean(0)
        C, history, method = _iterate(cluster, loop, C, shift, int(est.max_iter), float(est.tol), callback)
        method = method or est.centroid_update
        final = cluster.pass_sums(C, shift, False)
        if best is None or final.objective < best[0]:
            best = (final.objective, C, history, len(history), shift, method)
    objective, C, history, n_iter, shift, method = best
    est._set_fitted(C, q, history, n_iter, objective, method, k)
    if compute_labels:
        est.labels_ = _map_rows(est, blocks, "labels", C, shift, plan)
    return est


def _block_labels(block: Any, offset: int, C: np.ndarray, shift: np.ndarray, plan: PassPlan) -> np.ndarray:
    return _block_pass(block, offset, C, shift, plan, False, True).labels


def _block_method(block: Any, offset: int, est: Any, how: str) -> Any:
    """A task: the fitted estimator's own method on one block (returned to the host)."""
    x = block_tensor(block)
    if x.ndim == 1:
        x = x[:, None]
    x = x.to(compute_dtype(x.dtype)).cpu()
    if not bool(torch.isfinite(x).all()):
        raise InputError(_nonfinite_message(x, offset, "X"))
    out = getattr(est, how)(x.numpy())
    return out


def _map_rows(est: Any, blocks: RowBlocks, how: str, C: torch.Tensor | None = None, shift: torch.Tensor | None = None,
              plan: PassPlan | None = None, index: int | None = None) -> Any:
    """A Dask array, one block per row block, of the estimator's ``how`` (``labels`` from the final pass)."""
    import dask
    import dask.array as da

    k = int(est.n_clusters)
    if how == "labels":
        task = dask.delayed(_block_labels, pure=True)
        args = (C.cpu().numpy(), shift.cpu().numpy(), plan)
        shape, dtype = (lambda m: (m,)), np.int64
    else:
        task = dask.delayed(_block_method, pure=True)
        args = (dask.delayed(_light(est), pure=True), how)
        widths = {"predict": None, "transform": k, "predict_membership": k, "membership": min(est.n_nearest, k)}
        w = widths[how]
        shape = (lambda m: (m,)) if w is None else (lambda m, w=w: (m, w))
        dtype = np.int64 if how == "predict" else np.float64
    arrays = []
    for part, off, size in zip(blocks.parts, blocks.offsets[:-1], blocks.sizes, strict=True):
        t = task(part, int(off), *args)
        if index is not None:
            t = dask.delayed(lambda r, j=index: r[j], pure=True)(t)
            dtype = np.int64 if index == 0 else np.float64
        arrays.append(da.from_delayed(t, shape(size), dtype))
    return da.concatenate(arrays, axis=0)


def _light(est: Any) -> Any:
    """A copy of the fitted estimator without its ``labels_`` (what a block task needs)."""
    import copy

    c = copy.copy(est)
    c.__dict__.pop("labels_", None)
    c.device = est.device
    return c


def predict_dask(est: Any, X: Any, how: str) -> Any:
    """``predict``, ``transform``, ``predict_membership`` (Dask arrays), ``membership`` (a pair of them) or
    ``score`` (a float) of a fitted ``FuzzyKMeans`` on a Dask collection, block by block on the workers."""
    from sklearn.utils.validation import check_is_fitted

    from densitas.cluster.fuzzy import _owner

    check_is_fitted(est, "cluster_centers_")
    blocks = row_blocks(X, "X")
    if blocks.n_features != est.n_features_in_:
        raise InputError(f"X has {blocks.n_features} features, but {_owner()} is expecting {est.n_features_in_} "
                         "features as input.")
    if how == "score":
        import dask

        task = dask.delayed(_block_method, pure=True)
        shared = dask.delayed(_light(est), pure=True)
        parts = [task(p, int(o), shared, "score") for p, o, s in
                 zip(blocks.parts, blocks.offsets[:-1], blocks.sizes, strict=True) if s > 0]
        (scores,) = compute(parts)
        return float(sum(scores))
    if how == "membership":
        return _map_rows(est, blocks, how, index=0), _map_rows(est, blocks, how, index=1)
    return _map_rows(est, blocks, how)

