"""Exact k-NN on Dask: references sharded across workers, one reference block per chunk or partition.

For every block of queries and every reference block, a task on the worker that holds the reference block runs
the single-machine :func:`densitas.neighbors.kneighbors` on the pair (on the worker's device: CUDA when it has
one — dask-cuda's ``LocalCUDACluster`` gives each worker one GPU —, else the CPU), and returns the block's
``min(k, block rows)`` nearest with their **global** row numbers. A tree of merge tasks (:data:`FAN_IN
<densitas._dask.FAN_IN>` lists at a time) keeps the first ``k`` by (distance, row): the order of the
single-machine search (ties to the lower row; NaN distances of ``missing="skip"`` last). Every block's answer
equals a float64 brute force over that block, so the merged answer equals the single-machine one: the same
indices, the same float64 distances.

Queries may be a Dask collection too (then the results are Dask arrays with the queries' row chunks, computed
lazily), or in memory (one shared task input; the results are computed at once).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from densitas._dask import RowBlocks, block_array, compute, is_dask, row_blocks, tree_reduce
from densitas.exceptions import InputError

__all__ = ["kneighbors_dask", "merge_topk"]


def merge_topk(parts: list[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``k`` of each row of the concatenated ``(distances, indices)`` parts, ordered by (distance,
    index), NaN distances last.

    Examples
    --------
    >>> d, i = merge_topk([(np.array([[1.0, 2.0]]), np.array([[5, 6]])), (np.array([[1.0]]), np.array([[2]]))], 2)
    >>> d.tolist(), i.tolist()
    ([[1.0, 1.0]], [[2, 5]])
    """
    d = np.concatenate([p[0] for p in parts], axis=1)
    i = np.concatenate([p[1] for p in parts], axis=1)
    by_index = np.argsort(i, axis=1, kind="stable")
    d1, i1 = np.take_along_axis(d, by_index, 1), np.take_along_axis(i, by_index, 1)
    key = np.where(np.isnan(d1), np.inf, d1)
    order = np.argsort(key, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(d1, order, 1), np.take_along_axis(i1, order, 1)


def _local(block: Any) -> Any:
    """A block as kneighbors takes it: pandas as is, a CuPy block as a CUDA tensor, else an ndarray."""
    if hasattr(block, "__cuda_array_interface__") and not isinstance(block, torch.Tensor):
        return torch.as_tensor(block, device="cuda")
    if hasattr(block, "iloc") or isinstance(block, torch.Tensor):
        return block
    return np.asarray(block)


def _block_topk(refs: Any, queries: Any, k: int, offset: int, options: dict[str, Any]
                ) -> tuple[np.ndarray, np.ndarray]:
    """The task: the single-machine search of one reference block, its rows numbered globally."""
    from densitas.neighbors.api import kneighbors

    X, Y = _local(refs), _local(queries)
    m = len(Y)
    kb = min(k, len(X))
    if kb == 0 or m == 0:
        return np.empty((m, 0), dtype=np.float64), np.empty((m, 0), dtype=np.int64)
    if isinstance(X, torch.Tensor) and not isinstance(Y, torch.Tensor):
        Y = torch.as_tensor(block_array(Y), device=X.device, dtype=X.dtype)
    d, i = kneighbors(X, Y, kb, **options)
    if isinstance(d, torch.Tensor):
        d, i = d.cpu().numpy(), i.cpu().numpy()
    return np.asarray(d, dtype=np.float64), np.asarray(i, dtype=np.int64) + offset


def _exclude_self(result: tuple[np.ndarray, np.ndarray], k: int, offset: int) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's ``kneighbors(X=None)``: drop each row itself (its first duplicate when it is not there)."""
    d, i = result
    n = d.shape[0]
    mask = i != (offset + np.arange(n))[:, None]
    dup = np.all(mask, axis=1)
    mask[:, 0][dup] = False
    return d[mask].reshape(n, k), i[mask].reshape(n, k)


@dataclass
class _Queries:
    parts: list[Any]  # delayed blocks (or one delayed in-memory array)
    sizes: list[int]
    lazy: bool  # the queries are a Dask collection: results stay Dask arrays
    n_features: int | None
    names: list[str] | None


def _in_memory(A: Any, name: str) -> tuple[Any, list[str] | None]:
    """A 2-D in-memory input as a CPU tensor, DataFrame or ndarray, and its column names (None without)."""
    if isinstance(A, torch.Tensor):
        A = A.detach().cpu()
    if not hasattr(A, "iloc") and not isinstance(A, torch.Tensor):
        A = np.asarray(A)
    if A.ndim != 2:
        raise InputError(f"'{name}' must be 2-dimensional (rows × columns). Got shape {tuple(A.shape)} instead.")
    return A, ([str(c) for c in A.columns] if hasattr(A, "columns") else None)


def _queries(Y: Any) -> _Queries:
    import dask

    if is_dask(Y):
        qb = row_blocks(Y, "Y")
        return _Queries(qb.parts, qb.sizes, True, qb.n_features, qb.names)
    Y, names = _in_memory(Y, "Y")
    return _Queries([dask.delayed(Y, pure=True)], [len(Y)], False, int(Y.shape[1]), names)


def _references(X: Any) -> RowBlocks:
    import dask

    if is_dask(X):
        return row_blocks(X, "X")
    X, names = _in_memory(X, "X")
    return RowBlocks([dask.delayed(X, pure=True)], np.array([0, len(X)], dtype=np.int64), int(X.shape[1]), names,
                     np.dtype(object), frame=names is not None)


def neighbour_tasks(refs: RowBlocks, queries: _Queries, k: int, options: dict[str, Any]) -> list[Any]:
    """One delayed ``(distances, indices)`` per query block: per-block searches merged by a tree."""
    import dask

    search = dask.delayed(_block_topk, pure=True)
    out = []
    for q in queries.parts:
        per_block = [search(part, q, k, int(off), options)
                     for part, off, size in zip(refs.parts, refs.offsets[:-1], refs.sizes, strict=True) if size > 0]
        out.append(tree_reduce(per_block, merge_topk, k))
    return out


def _check_columns(refs: RowBlocks, queries: _Queries) -> None:
    if queries.n_features is not None and queries.n_features != refs.n_features:
        raise InputError(f"'Y' must have the {refs.n_features} columns of 'X'. Got {queries.n_features} instead.")


def as_arrays(tasks: list[Any], sizes: list[int], k: int, lazy: bool) -> tuple[Any, Any]:
    """Delayed per-block ``(distances, indices)`` as two Dask arrays (``lazy``) or two computed ndarrays."""
    import dask
    import dask.array as da

    if not lazy:
        (got,) = compute(tasks)
        return merge_rows([g[0] for g in got]), merge_rows([g[1] for g in got])
    dist = [da.from_delayed(dask.delayed(lambda r: r[0], pure=True)(t), (m, k), np.float64)
            for t, m in zip(tasks, sizes, strict=True)]
    ind = [da.from_delayed(dask.delayed(lambda r: r[1], pure=True)(t), (m, k), np.int64)
           for t, m in zip(tasks, sizes, strict=True)]
    return da.concatenate(dist, axis=0), da.concatenate(ind, axis=0)


def merge_rows(blocks: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(blocks, axis=0)


def kneighbors_dask(X: Any, Y: Any, k: int, *, metric: str = "euclidean", nominal: Any = None,
                    missing: str = "raise", device: Any = "auto",
                    memory_budget: int | str | None = None) -> tuple[Any, Any]:
    """:func:`densitas.neighbors.kneighbors` where ``X`` or ``Y`` is a Dask array or DataFrame (see the module).

    Returns ``(distances, indices)`` as Dask arrays when ``Y`` is a Dask collection, else computed (ndarrays;
    tensors for tensor ``Y``). ``device`` is resolved on each worker ("auto": its GPU when it has one).

    Examples
    --------
    >>> import dask.array as da, numpy as np
    >>> X = da.from_array(np.array([[0.0], [1.0], [3.0], [1.0]]), chunks=2)
    >>> d, i = kneighbors_dask(X, [[0.9]], 3, device="cpu")
    >>> i.tolist(), np.round(d, 3).tolist()
    ([[1, 3, 0]], [[0.1, 0.1, 0.9]])
    """
    from densitas.neighbors.api import check_budget, check_k, check_missing
    from densitas.neighbors.distances import get_metric

    get_metric(metric)
    check_missing(missing)
    check_budget(memory_budget)
    refs = _references(X)
    queries = _queries(Y)
    _check_columns(refs, queries)
    k = check_k(k, refs.n_rows)
    options = {"metric": metric, "nominal": nominal, "missing": missing, "device": device,
               "memory_budget": memory_budget}
    tasks = neighbour_tasks(refs, queries, k, options)
    d, i = as_arrays(tasks, queries.sizes, k, queries.lazy)
    if isinstance(Y, torch.Tensor):
        return torch.from_numpy(d), torch.from_numpy(i)
    return d, i


# ------------------------------------------------------------------------------------------ estimators


def fit_references(est: Any, X: Any) -> None:
    """``fit`` of a densitas kNN estimator on a Dask collection: the reference blocks stay where they are
    (persisted on the cluster); the estimator keeps their layout, the feature count and names."""
    est._check_params()
    owner = type(est).__name__
    refs = row_blocks(X, "X")
    if refs.n_rows < 1:
        raise InputError(f"{owner} needs at least 1 sample. Got 0 rows instead.")
    if not refs.frame and not (_numeric_kind(refs.dtype)):
        raise InputError(f"'X' of {owner} must hold numbers. Got dtype {refs.dtype} instead.")
    est._dask_refs = refs
    est._table_input = refs.frame and (est.nominal_features is not None or refs.dtype == np.dtype(object))
    est.n_samples_fit_ = refs.n_rows
    est.n_features_in_ = refs.n_features
    if refs.names is not None:
        est.feature_names_in_ = np.asarray(refs.names, dtype=object)
    elif hasattr(est, "feature_names_in_"):
        del est.feature_names_in_
    est.effective_metric_ = est.metric
    if hasattr(est, "_refs"):
        del est._refs


def _numeric_kind(dtype: np.dtype) -> bool:
    return np.dtype(dtype).kind in "biuf"


def _options(est: Any) -> dict[str, Any]:
    return {"metric": est.metric, "nominal": est.nominal_features, "missing": est.missing, "device": est.device,
            "memory_budget": est.memory_budget}


def _local_estimator_search(est: Any, queries: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
    """A task: the estimator fitted in memory (shipped once) searching one block of queries."""
    return est.kneighbors(queries, n_neighbors=k)


def estimator_neighbours(est: Any, X: Any, k: int | None) -> tuple[Any, Any, bool]:
    """``(distances, indices, lazy)`` of the estimator's ``kneighbors`` where the fit or the queries are Dask.

    ``X=None`` (fitted on Dask): every fitted row against the others, itself excluded."""
    import dask

    from densitas.neighbors.api import check_k

    owner = type(est).__name__
    k = est.n_neighbors if k is None else k
    refs = getattr(est, "_dask_refs", None)
    if X is None:
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 1 <= k < est.n_samples_fit_:
            raise InputError(f"The 'n_neighbors' parameter of {owner}.kneighbors must be an int in [1, "
                             f"n_samples_fit - 1] = [1, {est.n_samples_fit_ - 1}] when X is None. Got {k!r} "
                             "instead.")
        k = int(k)
        queries = _Queries(refs.parts, refs.sizes, True, refs.n_features, refs.names)
        tasks = neighbour_tasks(refs, queries, k + 1, _options(est))
        drop = dask.delayed(_exclude_self, pure=True)
        tasks = [drop(t, k, int(off)) for t, off in zip(tasks, refs.offsets[:-1], strict=True)]
        return *as_arrays(tasks, queries.sizes, k, True), True
    k = check_k(k, est.n_samples_fit_, "n_neighbors", owner)
    queries = _queries(X)
    if queries.n_features is not None and queries.n_features != est.n_features_in_:
        raise InputError(f"X has {queries.n_features} features, but {owner} is expecting {est.n_features_in_} "
                         "features as input.")
    if refs is None:  # fitted in memory, Dask queries: each query block searched by the fitted estimator
        search = dask.delayed(_local_estimator_search, pure=True)
        shared = dask.delayed(est, pure=True)
        tasks = [search(shared, q, k) for q in queries.parts]
    else:
        tasks = neighbour_tasks(refs, queries, k, _options(est))
    return *as_arrays(tasks, queries.sizes, k, queries.lazy), queries.lazy


def _vote(est: Any, result: tuple[np.ndarray, np.ndarray], how: str) -> np.ndarray:
    """A task: the estimator's own vote or mean on one block's neighbours."""
    from densitas.neighbors.voting import class_probabilities, get_weights, predict_classes, predict_values

    dist, ind = result
    w = None if est.weights == "uniform" else get_weights(dist, est.weights)
    if how == "regress":
        return predict_values(est._y, ind, w)
    if how == "proba":
        return class_probabilities(est._y, ind, w, len(est.classes_), normalize=est.weights != "rapidminer")
    return est.classes_.take(predict_classes(est._y, ind, w, est.weights, len(est.classes_)))


def estimator_predict(est: Any, X: Any, how: str) -> Any:
    """``predict`` (``how="classes"`` or ``"regress"``) or ``predict_proba`` (``"proba"``) of a kNN estimator
    where the fit or the queries are Dask: the vote runs in the task that merged a query block's neighbours."""
    import dask
    import dask.array as da

    k = est.n_neighbors
    if X is None:
        raise InputError(f"{type(est).__name__}.predict needs X.")
    queries = _queries(X)
    refs = getattr(est, "_dask_refs", None)
    from densitas.neighbors.api import check_k

    k = check_k(k, est.n_samples_fit_, "n_neighbors", type(est).__name__)
    if queries.n_features is not None and queries.n_features != est.n_features_in_:
        raise InputError(f"X has {queries.n_features} features, but {type(est).__name__} is expecting "
                         f"{est.n_features_in_} features as input.")
    if refs is None:
        search = dask.delayed(_local_estimator_search, pure=True)
        shared = dask.delayed(est, pure=True)
        tasks = [search(shared, q, k) for q in queries.parts]
    else:
        tasks = neighbour_tasks(refs, queries, k, _options(est))
    light = _Voter(est)
    vote = dask.delayed(_vote, pure=True)
    shared = dask.delayed(light, pure=True)
    out = [vote(shared, t, how) for t in tasks]
    if how == "proba":
        shapes, dtype = [(m, len(est.classes_)) for m in queries.sizes], np.float64
    else:
        shapes = [(m,) for m in queries.sizes]
        dtype = np.float64 if how == "regress" else est.classes_.dtype
    if not queries.lazy:
        (got,) = compute(out)
        return np.concatenate(got, axis=0)
    return da.concatenate([da.from_delayed(o, s, dtype) for o, s in zip(out, shapes, strict=True)], axis=0)


@dataclass
class _Voter:
    """What a vote needs of the estimator (its labels and weights), without the references."""

    weights: Any
    _y: np.ndarray
    classes_: np.ndarray | None

    def __init__(self, est: Any):
        self.weights = est.weights
        self._y = est._y
        self.classes_ = getattr(est, "classes_", None)
