"""``kneighbors``: exact k nearest neighbours, bounded in memory, from arrays, files or DuckDB relations."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from densitas._backend.chunking import memory_budget as default_budget
from densitas._backend.chunking import parse_bytes
from densitas._backend.device import DeviceLike, resolve_device
from densitas._backend.dispatch import select
from densitas._dask import is_dask
from densitas.exceptions import InputError
from densitas.neighbors.distances import (
    MISSING,
    Encoded,
    Metric,
    NominalCoder,
    _float_dtype_of,
    encode,
    get_metric,
    make_schema,
)
from densitas.neighbors.io import open_source
from densitas.neighbors.search import References, SearchStats, empty_result, search

__all__ = ["build_references", "check_k", "encode_queries", "kneighbors"]


def check_missing(missing: Any, owner: str = "kneighbors") -> str:
    if not isinstance(missing, str) or missing not in MISSING:
        raise InputError(f"The 'missing' parameter of {owner} must be one of {list(MISSING)}. Got {missing!r} "
                         "instead.")
    return missing


def check_k(k: Any, n: int, name: str = "k", owner: str = "kneighbors") -> int:
    """``k`` must be an int in [1, n]."""
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 1 <= k <= n:
        raise InputError(f"The '{name}' parameter of {owner} must be an int in [1, n_references] = [1, {n}]. Got "
                         f"{k!r} instead.")
    return int(k)


def check_budget(budget: Any, owner: str = "kneighbors") -> int | None:
    if budget is None:
        return None
    try:
        return parse_bytes(budget)
    except InputError as exc:
        raise InputError(f"The 'memory_budget' parameter of {owner} must be a positive number of bytes or a size "
                         f"such as '512MB'. Got {budget!r} instead.") from exc


def build_references(X: Any, metric: Metric, nominal: Any, missing: str, *, columns: list[str] | None = None,
                     name: str = "X", owner: str = "kneighbors") -> References:
    """Open ``X`` (array, DataFrame, tensor, file path or DuckDB relation) as a :class:`References` set.

    In-memory data are encoded once; files and relations are encoded block by block during the search.
    """
    source = open_source(X, name, columns)
    schema = make_schema(source.names, source.dtypes, source.n_columns, nominal, owner)
    if schema.n_columns == 0:
        raise InputError(f"'{name}' has no columns.")
    if schema.nominal and not metric.nominal:
        cols = [schema.column_name(j) for j in schema.nominal]
        raise InputError(f"'{name}' has nominal column(s) {', '.join(cols)}; metric {metric.name!r} needs numbers "
                         "only: use metric='mixed_euclidean' (or drop or encode those columns).")
    coder = NominalCoder()
    if source.in_memory:
        enc = encode(source.read_all(), schema, coder, missing=missing, name=name)
        refs = References(encoded=enc, schema=schema, coder=coder, missing=missing, name=name)
    else:
        refs = References(source=source, schema=schema, coder=coder, missing=missing, name=name)
    numeric_dtypes = [source.dtypes[j] for j in schema.numeric]
    refs.float_dtype = _float_dtype_of(numeric_dtypes) if numeric_dtypes else None
    return refs


def encode_queries(Y: Any, refs: References, missing: str, device: torch.device, name: str = "Y") -> Encoded:
    """Encode queries with the references' schema and nominal codes."""
    if isinstance(Y, str) or hasattr(Y, "to_arrow_reader") or type(Y).__module__.startswith("pathlib"):
        Y = open_source(Y, name).read_all()
    if isinstance(Y, torch.Tensor):
        Y = Y.detach().cpu()
        if Y.ndim != 2:
            raise InputError(f"'{name}' must be 2-dimensional (rows × columns). Got shape {tuple(Y.shape)} instead.")
        Y = Y.numpy()
    return encode(Y, refs.schema, refs.coder, missing=missing, name=name).to(device)


def _device_inputs(X: Any, Y: Any, metric: Metric, nominal: Any, missing: str,
                   dev: torch.device) -> tuple[References, Encoded] | None:
    """References and queries already on the (CUDA) device as float tensors, encoded where they are: no round
    trip through host memory; with ``missing="skip"`` they may hold NaN. None when the inputs are anything else,
    or hold an infinity, or NaN with ``missing="raise"`` (the general encoding then raises, naming the row and
    column)."""
    tensors = isinstance(X, torch.Tensor) and isinstance(Y, torch.Tensor)
    if not tensors or dev.type != "cuda" or nominal is not None or X.ndim != 2 or Y.ndim != 2:
        return None
    if X.dtype not in (torch.float32, torch.float64) or Y.dtype != X.dtype or X.shape[1] != Y.shape[1]:
        return None
    X, Y = X.detach().to(dev), Y.detach().to(dev)
    if missing == "skip":  # NaN is skipped where the tensors are (no round trip through host memory)
        if bool(torch.isinf(X).any()) or bool(torch.isinf(Y).any()):
            return None
    elif not (bool(torch.isfinite(X).all()) and bool(torch.isfinite(Y).all())):
        return None
    head = build_references(X[:1].cpu(), metric, None, missing)  # the schema and coder of these columns
    refs = References(encoded=Encoded(X, None, X.shape[0]), schema=head.schema, coder=head.coder, missing=missing)
    refs.float_dtype = head.float_dtype
    return refs, Encoded(Y, None, Y.shape[0])


def _fused(X: torch.Tensor, Y: torch.Tensor, k: int, metric: str, dev: torch.device,
           budget: int | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The fused kernel's own driver (:func:`densitas.neighbors._triton.fused_kneighbors`: one launch per
    65,536 queries over all references, float64 re-rank, certificate, exact fallback) where it applies: CUDA with
    the Triton backend, float32 references and queries on the device, (squared) Euclidean, finite values, ``d``
    and ``k`` within the kernel's limits, and its centred float32 copy of the references within the memory budget
    (by default half the device's free memory).
    Else None: the general search."""
    if dev.type != "cuda" or metric not in ("euclidean", "sqeuclidean"):
        return None
    if X.dtype != torch.float32 or Y.dtype != torch.float32 or X.ndim != 2 or Y.ndim != 2 or X.shape[1] != Y.shape[1]:
        return None
    backend, _ = select("knn_tile_topk", dev)
    if backend != "triton":
        return None
    from densitas.neighbors import _triton as fused

    n, d = X.shape
    kp = fused._pow2(k + max(8, k // 4))
    if d > fused.MAX_D or kp > fused.MAX_KP or n > fused.MAX_ROWS or len(Y) == 0:
        return None
    chunk = min(len(Y), 1 << 16)  # queries per launch of fused_kneighbors
    need = n * d * 4 + chunk * kp * (d + 4) * 8  # the centred float32 copy, re-rank gathers
    if fused.threshold_applies(n, kp):  # its buffer, sample copies and first GEMM block
        need += fused.threshold_bytes(n, d, k, chunk)
    if need > (budget if budget is not None else default_budget(dev)):
        return None
    X, Y = X.to(dev), Y.to(dev)
    if not (bool(torch.isfinite(X).all()) and bool(torch.isfinite(Y).all())):
        return None  # the general path raises or skips, naming the row and column
    return fused.fused_kneighbors(Y, X, k, metric=metric)


def _fused_masked(X: torch.Tensor, Y: torch.Tensor, k: int, metric: str, dev: torch.device,
                  budget: int | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``missing="skip"`` on CUDA tensors through the fused kernel's width-3d product
    (:func:`densitas.neighbors._triton.masked_kneighbors`), where it applies. Else None.

    Not routed to by :func:`kneighbors`: on the H200 at document 001's size (100,000², 50 columns, 5% NaN) it
    is exact but takes 3.4 s against 0.28 s for the general search — the TF32 bound on the width-3d product
    (whose norms carry the squared values) is too loose to certify most queries, which then take the float64
    brute force."""
    if dev.type != "cuda" or metric not in ("euclidean", "sqeuclidean") or Y.ndim != 2 or X.shape[1] != Y.shape[1]:
        return None
    if not X.is_floating_point() or not Y.is_floating_point():
        return None
    backend, _ = select("knn_tile_topk", dev)
    if backend != "triton":
        return None
    from densitas.neighbors import _triton as fused

    kp = fused._pow2(k + max(8, k // 4))
    need = X.shape[0] * X.shape[1] * 8 * 6 + min(len(Y), 1 << 15) * kp * (X.shape[1] + 4) * 16
    if 3 * X.shape[1] > fused.MAX_D or kp > fused.MAX_KP or (budget is not None and need > budget):
        return None
    X, Y = X.to(dev), Y.to(dev)
    if bool(torch.isinf(X).any()) or bool(torch.isinf(Y).any()):
        return None  # the general path names the infinite value
    return fused.masked_kneighbors(Y, X, k, metric=metric)


def _fused_mixed(X: torch.Tensor, Y: torch.Tensor, k: int, metric: str, nominal: Any, dev: torch.device,
                 budget: int | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Mixed Euclidean of CUDA tensors with nominal columns given by position, through the fused kernel on
    one-hot/√2 coded rows (:func:`densitas.neighbors._triton.mixed_kneighbors`), where it applies. Else None."""
    if dev.type != "cuda" or metric != "mixed_euclidean" or Y.ndim != 2 or X.shape[1] != Y.shape[1]:
        return None
    if not isinstance(nominal, list | tuple) or not all(isinstance(j, int | np.integer) for j in nominal):
        return None
    cols = sorted({int(j) for j in nominal})
    if not cols or cols[0] < 0 or cols[-1] >= X.shape[1] or not X.is_floating_point() or not Y.is_floating_point():
        return None
    backend, _ = select("knn_tile_topk", dev)
    if backend != "triton":
        return None
    from densitas.neighbors import _triton as fused

    X, Y = X.to(dev), Y.to(dev)
    if not (bool(torch.isfinite(X).all()) and bool(torch.isfinite(Y).all())):
        return None
    width = X.shape[1] - len(cols) + sum(int(torch.unique(torch.cat([X[:, j], Y[:, j]])).numel()) for j in cols)
    kp = fused._pow2(k + max(8, k // 4))
    need = X.shape[0] * (width + X.shape[1]) * 12 + min(len(Y), 1 << 15) * kp * (X.shape[1] + 4) * 8
    if width > fused.MAX_D or kp > fused.MAX_KP or (budget is not None and need > budget):
        return None
    return fused.mixed_kneighbors(Y, X, cols, k)


def _host_rows(X: Any) -> torch.Tensor | None:
    """``X`` as a float32 CPU tensor (a view, no copy) when it is a 2-D float32 ndarray or CPU tensor: a
    host-resident reference set that the CUDA path streams. Else None."""
    if isinstance(X, torch.Tensor):
        t = X.detach()
        return t if t.device.type == "cpu" and t.dtype == torch.float32 and t.ndim == 2 else None
    if isinstance(X, np.ndarray) and X.dtype == np.float32 and X.ndim == 2:
        return torch.from_numpy(X)
    return None


def host_source(X: Any, Y: Any, missing: str, device: torch.device) -> tuple[Any, torch.Tensor] | None:
    """``(HostChunks, queries)`` when ``X`` is a host-resident float32 reference set that the CUDA path can
    stream — a 2-D float32 ndarray or CPU tensor (chunks are views), or a file or DuckDB relation whose columns
    are all numeric and encode to float32 (read and encoded block by block) — with the queries as a float
    tensor on ``device`` (for a file, encoded with its schema, so DataFrame columns match by name). Else None.
    """
    from densitas.neighbors.stream import HostChunks

    rows = _host_rows(X)
    if rows is not None:
        if isinstance(Y, torch.Tensor):
            Yt = Y.detach()
        else:
            try:
                Yt = torch.as_tensor(np.asarray(Y))
            except (TypeError, ValueError):
                return None
        if Yt.ndim != 2 or Yt.shape[1] != rows.shape[1] or not Yt.is_floating_point():
            return None
        return HostChunks(rows), Yt.to(device)
    is_file = isinstance(X, str) or type(X).__module__.startswith("pathlib")
    if not (is_file or hasattr(X, "to_arrow_reader") or hasattr(X, "fetch_arrow_reader")):
        return None
    refs = build_references(X, get_metric("euclidean"), None, missing)
    if refs.source is None or refs.schema.nominal or refs.float_dtype != np.float32:
        return None
    q = encode_queries(Y, refs, missing, device)
    if q.nom is not None or q.num is None:
        return None

    def blocks(n_rows: int, refs=refs):
        for off, enc in refs.blocks(n_rows, torch.device("cpu")):
            yield off, enc.num

    return HostChunks(blocks=blocks, n_rows=refs.n_rows, width=refs.schema.n_columns), q.num


def _streamed(X: Any, Y: Any, k: int, metric: str, missing: str, dev: torch.device,
              budget: int | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A host-resident or file-backed float32 reference set on CUDA (:func:`host_source`): streamed through
    the device in chunks (pinned staging, copy of chunk i + 1 overlapping the fused kernel on chunk i, top-k
    merged on the device; :func:`densitas.neighbors.stream.stream_kneighbors`), where it applies: (squared)
    Euclidean, numeric columns, ``d`` and ``k`` within the kernel's limits, finite values. Else None: the
    general path (which names a NaN's row and column, or skips it)."""
    if dev.type != "cuda" or metric not in ("euclidean", "sqeuclidean"):
        return None
    backend, _ = select("knn_tile_topk", dev)
    if backend != "triton":
        return None
    from densitas.neighbors import _triton as fused
    from densitas.neighbors.stream import NonFiniteError, stream_kneighbors

    got = host_source(X, Y, missing, dev)
    if got is None:
        return None
    src, Yt = got
    kk = check_k(k, src.n_rows)
    if fused._pow2(kk + max(8, kk // 4)) > fused.MAX_KP or src.width > fused.MAX_D or src.width == 0:
        return None
    try:
        return stream_kneighbors(Yt, src, kk, metric=metric, device=dev, memory_budget=budget)
    except NonFiniteError:
        return None


def kneighbors(X: Any, Y: Any, k: int, *, metric: str = "euclidean", nominal: Any = None, missing: str = "raise",
               device: DeviceLike = "auto", memory_budget: int | str | None = None) -> tuple[Any, Any]:
    """The ``k`` nearest rows of ``X`` to every row of ``Y``, exactly, in bounded memory.

    Parameters
    ----------
    X : array-like, DataFrame, torch.Tensor, path or duckdb.DuckDBPyRelation
        References, (n, d). A path to a Parquet, CSV or ``.npy`` file, or a DuckDB relation, is read in chunks
        (once per search pass), so ``X`` may exceed memory. A Dask array or DataFrame is searched on its
        cluster, block by block, and merged exactly (:func:`densitas.neighbors.dask.kneighbors_dask`).
    Y : array-like, DataFrame, torch.Tensor or Dask collection
        Queries, (m, d), with the columns of ``X`` (matched by name when both have names); Dask queries give
        Dask results.
    k : int
        Neighbours per query, 1 ≤ k ≤ n.
    metric : {"euclidean", "sqeuclidean", "manhattan", "cosine", "mixed_euclidean"}
        ``mixed_euclidean`` = √(Σ numeric (a − b)² + Σ nominal [a ≠ b]) (document 001). ``cosine`` is
        1 − a·b/(‖a‖‖b‖), and 1 when a row is all zeros (as in scikit-learn).
    nominal : list of column names or positions, or a boolean mask, optional
        Nominal (categorical) columns, compared for equality; string and categorical DataFrame columns are
        nominal anyway. Only ``mixed_euclidean`` accepts nominal columns.
    missing : {"raise", "skip"}
        ``"raise"``: NaN is an error naming its row and column. ``"skip"``: a coordinate pair with NaN on
        either side is left out of the sum (no rescaling); a pair of rows with no coordinate left has distance
        NaN and ranks after every number.
    device : "auto", "cpu", "cuda" or "cuda:N"
    memory_budget : int or str, optional
        Working-memory bound, e.g. ``"512MB"`` (default: :func:`densitas._backend.memory_budget`). A tiny budget
        gives the same answer, in more passes.

    Returns
    -------
    distances : (m, k) ndarray (tensor for tensor ``Y``), float64
        Ascending.
    indices : (m, k) ndarray (tensor for tensor ``Y``), int64
        Row positions in ``X``; among equal distances the lower position comes first.

    Raises
    ------
    InputError
        ``k`` outside [1, n], an unknown metric, NaN with ``missing="raise"``, infinity, mismatched columns.

    Notes
    -----
    A float32 reference set in host memory (ndarray or CPU tensor) or in a file, searched on CUDA, is streamed
    through the device in chunks: pinned staging buffers and a second CUDA stream overlap the copy of chunk
    ``i + 1`` with the fused kernel on chunk ``i``, and the per-chunk candidates are merged on the device
    (:func:`densitas.neighbors.stream.stream_kneighbors`).

    The result equals a float64 brute force (direct differences): the fast pass (a tiled GEMM and a
    partial selection, float32 for float32 data) keeps ``k + max(8, k/4)`` candidates per query and block,
    which are re-ranked in float64; a worst-case rounding bound certifies that nothing dropped could beat or tie
    with them, and the rare uncertified queries get an exact float64 pass (:mod:`densitas.neighbors.search`).
    Work O(n·m·d), memory O(budget).

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [1.0, 0.0]])
    >>> d, i = kneighbors(X, [[0.9, 0.0]], 3, device="cpu")
    >>> i.tolist(), np.round(d, 3).tolist()
    ([[1, 3, 0]], [[0.1, 0.1, 0.9]])
    """
    if is_dask(X) or is_dask(Y):  # sharded across a Dask cluster: per-block searches merged exactly
        from densitas.neighbors.dask import kneighbors_dask

        return kneighbors_dask(X, Y, k, metric=metric, nominal=nominal, missing=missing, device=device,
                               memory_budget=memory_budget)
    m_obj = get_metric(metric)
    check_missing(missing)
    budget = check_budget(memory_budget)
    dev = resolve_device(device, *(t for t in (X, Y) if isinstance(t, torch.Tensor)))
    if isinstance(X, torch.Tensor) and isinstance(Y, torch.Tensor) and X.is_cuda and X.ndim == 2:
        # device tensors: no round trip through host memory when the fused kernel applies
        kk = check_k(k, X.shape[0])
        if nominal is not None:
            got = _fused_mixed(X.detach(), Y.detach(), kk, m_obj.name, nominal, dev, budget)
        elif missing == "skip" and (bool(torch.isnan(X).any()) or bool(torch.isnan(Y).any())):
            got = None  # the general search: faster here than the masked fused form (see _fused_masked)
        else:
            got = _fused(X.detach(), Y.detach(), kk, m_obj.name, dev, budget)
        if got is not None:
            return got
    if nominal is None:
        got = _streamed(X, Y, k, m_obj.name, missing, dev, budget)
        if got is not None:
            return got if isinstance(Y, torch.Tensor) else (got[0].cpu().numpy(), got[1].cpu().numpy())
    on_device = _device_inputs(X, Y, m_obj, nominal, missing, dev)
    if on_device is not None:
        refs, q = on_device
    else:
        refs = build_references(X, m_obj, nominal, missing)
        q = None
    k = check_k(k, refs.n_rows)
    if q is None:
        q = encode_queries(Y, refs, missing, dev)
    as_torch = isinstance(Y, torch.Tensor)
    if q.n == 0:
        d, i = empty_result(0, k, dev)
    else:
        fast = None
        if q.num is not None:
            f32 = (torch.float32, torch.float16)
            fast = torch.float32 if (q.num.dtype in f32 and refs.float_dtype == np.float32) else torch.float64
        got = None
        if fast == torch.float32 and refs.encoded is not None and q.nom is None and refs.encoded.nom is None:
            got = _fused(refs.encoded.num, q.num, k, m_obj.name, dev, budget)
        if got is not None:
            d, i = got
        else:
            d, i = search(refs, q, k, m_obj, skip=missing == "skip", device=dev, budget=budget, fast_dtype=fast,
                          stats=SearchStats())
    if as_torch:
        return d, i
    return d.cpu().numpy(), i.cpu().numpy()
