"""Public primitives: validation at the boundary, then one dispatch to the PyTorch or Triton implementation.

Conventions for every function here:

* Input: NumPy arrays, pandas Series/DataFrames, Python sequences or torch tensors. Output: the same kind
  (NumPy for pandas and sequences); tensors stay on their device with ``device="auto"``.
* Dtypes: booleans, integers (int8…int64, uint8; wider unsigned are widened to int64) and floats. Sums and
  products of integers accumulate in int64 — never float; min/max keep the dtype; float16/bfloat16 compute
  and return float32.
* NaN propagates as in NumPy (a NaN makes the sum, min, max and every later scan value NaN).
* Errors name the argument and the offending value (:class:`densitas.InputError`, a ``ValueError``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from densitas._backend.arrays import ArrayKind, as_tensor, check_choice, check_int, to_output
from densitas._backend.device import DeviceLike
from densitas._backend.dispatch import select
from densitas.exceptions import InputError
from densitas.primitives import _torch
from densitas.primitives._common import REDUCE_OPS, SCAN_OPS, acc_dtype

__all__ = [
    "box_sum",
    "compact",
    "histogram",
    "radix_sort",
    "reduce",
    "reduce_by_key",
    "scan",
    "segmented_scan",
    "summed_area_table",
]


def _norm_axis(axis: Any, ndim: int, name: str = "axis") -> int:
    if isinstance(axis, bool) or not isinstance(axis, int | np.integer):
        raise InputError(f"The '{name}' parameter must be an int. Got {axis!r} instead.")
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise InputError(f"The '{name}' parameter is out of range for an array of {ndim} dimension(s). "
                         f"Got {axis!r} instead.")
    return int(axis) % max(ndim, 1)


def _scalar_out(t: torch.Tensor, kind: ArrayKind) -> Any:
    out = to_output(t, kind)
    return out[()] if isinstance(out, np.ndarray) and out.ndim == 0 else out


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise InputError(f"The '{name}' parameter must be a bool. Got {value!r} instead.")
    return bool(value)


def reduce(x: Any, op: str = "sum", *, axis: int | None = None, device: DeviceLike = "auto") -> Any:
    """Reduce ``x`` with an associative operator (document 002: one tree, another operator and identity).

    Parameters
    ----------
    x : array-like or torch.Tensor
    op : {"sum", "prod", "min", "max", "mean"}
    axis : int, optional
        Reduce along one axis; None (default) reduces everything.
    device : "auto", "cpu", "cuda" or "cuda:N"

    Returns
    -------
    A scalar (NumPy input, ``axis=None``), an array, or a tensor.

    Notes
    -----
    Floating-point sums are accurate to about 1e-6 relative even for 10⁸ float32 elements: the CPU path
    uses PyTorch's cascade summation, the Triton kernel sums each tile as a tree and accumulates the tiles
    in float64. ``min``/``max`` of an empty input raise (no identity); ``sum`` is 0, ``prod`` 1, ``mean``
    NaN. Complexity O(n) work, O(log n) depth.

    Examples
    --------
    >>> reduce([3, 1, 7, 0, 4, 1, 6, 3])
    np.int64(25)
    >>> reduce([[1.0, 2.0], [3.0, 4.0]], "max", axis=0).tolist()
    [3.0, 4.0]
    """
    check_choice("op", op, REDUCE_OPS, "reduce")
    t, kind = as_tensor(x, "x", device=device)
    if axis is not None:
        axis = _norm_axis(axis, t.ndim)
        if t.ndim == 0:
            axis = None
    n_reduced = t.numel() if axis is None else t.shape[axis]
    if op in ("min", "max") and n_reduced == 0:
        raise InputError(f"Cannot take the {op} of an empty input 'x' (shape {tuple(t.shape)}): it has no identity.")
    _, fn = select("reduce", t.device)
    return _scalar_out(fn(t, op, axis), kind)


def scan(x: Any, op: str = "sum", *, inclusive: bool = True, reverse: bool = False, axis: int = -1,
         device: DeviceLike = "auto") -> Any:
    """All-prefix scan of ``x`` along ``axis`` (document 002).

    Parameters
    ----------
    x : array-like or torch.Tensor
    op : {"sum", "prod", "min", "max"}
    inclusive : bool
        Inclusive (``y[i] = x[0] ⊕ … ⊕ x[i]``) or exclusive (``y[i] = I ⊕ x[0] ⊕ … ⊕ x[i−1]``, with the
        identity I: 0, 1, +inf/max int, −inf/min int).
    reverse : bool
        Scan from the end (suffix scan).
    axis : int
    device : "auto", "cpu", "cuda" or "cuda:N"

    Notes
    -----
    On CUDA, float32/int32 scans along a whole array use a single-pass decoupled look-back kernel (Merrill &
    Garland 2016): each element is read once and written once. Other cases use reduce-then-scan. Float sums
    accumulate in the input precision, like ``numpy.cumsum``.

    Examples
    --------
    >>> scan([3, 1, 7, 0, 4, 1, 6, 3]).tolist()
    [3, 4, 11, 11, 15, 16, 22, 25]
    >>> scan([3, 1, 7, 0, 4, 1, 6, 3], inclusive=False).tolist()
    [0, 3, 4, 11, 11, 15, 16, 22]
    """
    check_choice("op", op, SCAN_OPS, "scan")
    inclusive = _check_bool("inclusive", inclusive)
    reverse = _check_bool("reverse", reverse)
    t, kind = as_tensor(x, "x", device=device)
    if t.ndim == 0:
        t = t.reshape(1)
    axis = _norm_axis(axis, t.ndim)
    _, fn = select("scan", t.device)
    return to_output(fn(t, op, inclusive, reverse, axis), kind)


def _check_segments(seg: torch.Tensor, n: int) -> torch.Tensor:
    if seg.ndim != 1 or seg.shape[0] != n:
        raise InputError(f"'segment_ids' must be 1-D with the length of 'x' ({n}). Got shape {tuple(seg.shape)}.")
    if seg.dtype.is_floating_point or seg.dtype == torch.bool:
        raise InputError(f"'segment_ids' must be integers. Got dtype {seg.dtype} instead.")
    seg = seg.to(torch.int64)
    if n > 1:
        bad = torch.nonzero(seg[1:] < seg[:-1])
        if bad.numel():
            i = int(bad[0, 0]) + 1
            raise InputError(f"'segment_ids' must be non-decreasing; position {i} holds {int(seg[i])} after "
                             f"{int(seg[i - 1])}.")
    return seg


def segmented_scan(x: Any, segment_ids: Any, op: str = "sum", *, inclusive: bool = True,
                   device: DeviceLike = "auto") -> Any:
    """Scan restarting at every segment boundary of a 1-D ``x``.

    Parameters
    ----------
    x : 1-D array-like or torch.Tensor
    segment_ids : 1-D integer array, non-decreasing, same length as ``x``
    op : {"sum", "prod", "min", "max"}
    inclusive : bool

    Examples
    --------
    >>> segmented_scan([1, 2, 3, 4, 5], [0, 0, 1, 1, 1]).tolist()
    [1, 3, 3, 7, 12]
    """
    check_choice("op", op, SCAN_OPS, "segmented_scan")
    inclusive = _check_bool("inclusive", inclusive)
    t, kind = as_tensor(x, "x", device=device, ndim=(1,))
    seg, _ = as_tensor(segment_ids, "segment_ids", like=t)
    seg = _check_segments(seg, t.shape[0])
    _, fn = select("segmented_scan", t.device)
    return to_output(fn(t, seg, op, inclusive), kind)


def reduce_by_key(keys: Any, values: Any, op: str = "sum", *, num_keys: int | None = None,
                  device: DeviceLike = "auto") -> Any:
    """Reduce ``values`` into one row per key (a scatter-reduce / histogram with values).

    Parameters
    ----------
    keys : 1-D integer array in ``[0, num_keys)``
    values : 1-D or 2-D array with ``len(values) == len(keys)``; 2-D gives one reduction per column
    op : {"sum", "prod", "min", "max", "mean"}
    num_keys : int, optional
        Number of output rows; default ``max(keys) + 1``. Absent keys get the identity (0, 1, +inf, −inf;
        NaN for mean).

    Returns
    -------
    Array of shape ``(num_keys,)`` or ``(num_keys, values.shape[1])``.

    Examples
    --------
    >>> reduce_by_key([0, 2, 0, 2], [1.0, 2.0, 3.0, 4.0], num_keys=3).tolist()
    [4.0, 0.0, 6.0]
    """
    check_choice("op", op, REDUCE_OPS, "reduce_by_key")
    v, kind = as_tensor(values, "values", device=device, ndim=(1, 2))
    k, _ = as_tensor(keys, "keys", like=v, ndim=(1,))
    if k.dtype.is_floating_point or k.dtype == torch.bool:
        raise InputError(f"'keys' must be integers. Got dtype {k.dtype} instead.")
    if k.shape[0] != v.shape[0]:
        raise InputError(f"'keys' and 'values' must have the same length. Got {k.shape[0]} and {v.shape[0]}.")
    if num_keys is None:
        num_keys = int(k.max()) + 1 if k.numel() else 0
    num_keys = check_int("num_keys", num_keys, 0, "reduce_by_key")
    if k.numel():
        kmin, kmax = (int(t) for t in torch.aminmax(k))
        if kmin < 0 or kmax >= num_keys:
            bad = kmin if kmin < 0 else kmax
            raise InputError(f"'keys' must lie in [0, num_keys={num_keys}). Found {bad}.")
    v2 = v if v.ndim == 2 else v[:, None]
    _, fn = select("reduce_by_key", v.device)
    out = fn(k, v2, op, num_keys)
    return to_output(out if v.ndim == 2 else out[:, 0], kind)


def compact(x: Any, mask: Any, *, return_indices: bool = False, device: DeviceLike = "auto") -> Any:
    """Stream compaction: the elements (rows) of ``x`` where ``mask`` is true, in their original order.

    Document 002: flags → exclusive scan of the flags = output positions → scatter.

    Parameters
    ----------
    x : array-like, 1-D or more (rows are selected along the first axis)
    mask : 1-D boolean array of length ``len(x)``
    return_indices : bool
        Also return the selected positions (int64).

    Examples
    --------
    >>> compact([5, 6, 7, 8], [True, False, True, True]).tolist()
    [5, 7, 8]
    """
    return_indices = _check_bool("return_indices", return_indices)
    t, kind = as_tensor(x, "x", device=device)
    if t.ndim == 0:
        raise InputError("'x' must have at least one dimension. Got a scalar.")
    m, _ = as_tensor(mask, "mask", like=t)
    if m.dtype != torch.bool:
        raise InputError(f"'mask' must be boolean. Got dtype {m.dtype} instead.")
    if m.ndim != 1 or m.shape[0] != t.shape[0]:
        raise InputError(f"'mask' must be 1-D with length len(x) = {t.shape[0]}. Got shape {tuple(m.shape)}.")
    _, fn = select("compact", t.device)
    vals, idx = fn(t, m, return_indices)
    if return_indices:
        return to_output(vals, kind), to_output(idx, kind)
    return to_output(vals, kind)


def radix_sort(keys: Any, values: Any = None, *, descending: bool = False, device: DeviceLike = "auto") -> Any:
    """Stable sort of ``keys`` (optionally carrying ``values``).

    Parameters
    ----------
    keys : 1-D integer, boolean or float array
    values : array with ``len(values) == len(keys)``, optional; permuted with the keys
    descending : bool
        Stable in both directions (equal keys keep their input order). NaN sorts last ascending and first
        descending (as ``torch.sort``); −0.0 ties with 0.0.

    Returns
    -------
    Sorted keys, or ``(sorted_keys, permuted_values)``.

    Notes
    -----
    The algorithm of document 002 — one stable split per bit, ``destination = b ? i − f + totalFalses : f``
    with ``f`` the exclusive scan of the negated bit — is implemented on the Triton path with densitas'
    scan. On CUDA ``auto`` uses the library sort (CUB's onesweep radix sort) because the benchmark measured it
    faster; see ``benchmarks/RESULTS.md``.

    Examples
    --------
    >>> radix_sort([3, 1, 2, 1], [0, 1, 2, 3])
    (array([1, 1, 2, 3]), array([1, 3, 2, 0]))
    """
    descending = _check_bool("descending", descending)
    k, kind = as_tensor(keys, "keys", device=device, ndim=(1,))
    v = None
    if values is not None:
        v, _ = as_tensor(values, "values", like=k)
        if v.ndim == 0 or v.shape[0] != k.shape[0]:
            raise InputError(f"'values' must have len(keys) = {k.shape[0]} rows. Got shape {tuple(v.shape)}.")
    _, fn = select("argsort", k.device)
    sk, perm = fn(k, descending)
    if v is None:
        return to_output(sk, kind)
    return to_output(sk, kind), to_output(v.index_select(0, perm), kind)


def _hist_args(t: torch.Tensor, bins: Any, range: Any, linear: bool) -> tuple[tuple[int, ...], tuple, tuple]:
    d = t.shape[1]
    if isinstance(bins, int | np.integer) and not isinstance(bins, bool):
        bins_t = (int(bins),) * d
    elif isinstance(bins, Sequence) and len(bins) == d:
        bins_t = tuple(check_int("bins", b, 1, "histogram") for b in bins)
    else:
        raise InputError(f"The 'bins' parameter must be an int or one int per dimension ({d}). Got {bins!r}.")
    need = 2 if linear else 1
    for b in bins_t:
        if b < need:
            raise InputError(f"The 'bins' parameter must be ≥ {need}{' with linear=True' if linear else ''}. "
                             f"Got {bins!r} instead.")
    if range is None:
        raise InputError("The 'range' parameter is required: (lo, hi), or one (lo, hi) pair per dimension.")
    pairs = [range] if d == 1 and len(range) == 2 and np.isscalar(range[0]) else list(range)
    if len(pairs) != d or any(len(p) != 2 for p in pairs):
        raise InputError(f"The 'range' parameter must be (lo, hi) or {d} pairs. Got {range!r} instead.")
    lo = tuple(float(p[0]) for p in pairs)
    hi = tuple(float(p[1]) for p in pairs)
    for a, b in zip(lo, hi, strict=True):
        if not (np.isfinite(a) and np.isfinite(b) and a < b):
            raise InputError(f"The 'range' parameter needs finite lo < hi. Got {range!r} instead.")
    return bins_t, lo, hi


def histogram(x: Any, bins: int | Sequence[int], range: Any, *, weights: Any = None, linear: bool = False,
              device: DeviceLike = "auto") -> tuple[Any, Any]:
    """Histogram (``numpy.histogram`` semantics) or linear binning onto a grid, in 1 to 4 dimensions.

    Parameters
    ----------
    x : (n,) or (n, d) array
    bins : int or one int per dimension
        Plain: number of bins. Linear: number of grid points, spread evenly over ``range`` with both ends
        included.
    range : (lo, hi) or one (lo, hi) pair per dimension
        Points outside it are ignored, as NumPy does; NaN is ignored too.
    weights : (n,) array, optional
    linear : bool
        Linear binning (KernSmooth): each point splits its weight between the neighbouring grid points in
        proportion to the distance (2^d corners in d dimensions).

    Returns
    -------
    hist, edges
        Plain: counts (int64) or weighted sums (the dtype of ``weights``) of shape ``bins``; edges as
        ``numpy.histogram`` (1-D) or a list of edge arrays (d-D). Linear: float64 grid weights and the grid
        points.

    Examples
    --------
    >>> h, e = histogram([0.0, 0.25, 1.0], 2, (0.0, 1.0))
    >>> h.tolist()
    [2, 1]
    >>> g, pts = histogram([0.25], 3, (0.0, 1.0), linear=True)
    >>> g.tolist()
    [0.5, 0.5, 0.0]
    """
    linear = _check_bool("linear", linear)
    t, kind = as_tensor(x, "x", device=device, ndim=(1, 2))
    one_d = t.ndim == 1
    t2 = t[:, None] if one_d else t
    if t2.shape[1] > 4 or t2.shape[1] < 1:
        raise InputError(f"'x' must have 1 to 4 columns. Got shape {tuple(t.shape)}.")
    if t2.dtype == torch.bool:
        t2 = t2.to(torch.uint8)
    bins_t, lo, hi = _hist_args(t2, bins, range, linear)
    w = None
    if weights is not None:
        w, _ = as_tensor(weights, "weights", like=t, ndim=(1,))
        if w.shape[0] != t2.shape[0]:
            raise InputError(f"'weights' must have len(x) = {t2.shape[0]} elements. Got {w.shape[0]}.")
    _, fn = select("histogram", t.device)
    h = fn(t2, bins_t, lo, hi, w, linear)
    if not linear and w is not None:
        h = h.to(acc_dtype(w.dtype, "sum") if not w.dtype.is_floating_point else w.dtype)
    edges = []
    for b, a, c in zip(bins_t, lo, hi, strict=True):
        if linear:
            e = torch.linspace(a, c, b, dtype=torch.float64)
        else:
            e = torch.from_numpy(np.linspace(a, c, b + 1))
        edges.append(to_output(e.to(t.device), kind))
    return to_output(h, kind), (edges[0] if one_d else edges)


def summed_area_table(a: Any, *, dtype: Any = None, device: DeviceLike = "auto") -> Any:
    """Summed-area table: the inclusive scan along every axis of a 1-D, 2-D or 3-D array.

    ``sat[i, j] = Σ_{p ≤ i, q ≤ j} a[p, q]``; any box sum then costs 2^ndim lookups (:func:`box_sum`).

    Parameters
    ----------
    a : array with 1 to 3 dimensions
    dtype : optional
        Accumulation and output dtype (e.g. ``torch.float64`` or ``"float64"`` for exact large counts); default:
        int64 for integers, the input float dtype otherwise.

    Examples
    --------
    >>> summed_area_table([[1, 2], [3, 4]]).tolist()
    [[1, 3], [4, 10]]
    """
    t, kind = as_tensor(a, "a", device=device, ndim=(1, 2, 3))
    out_dtype = acc_dtype(t.dtype, "sum")
    if dtype is not None:
        try:
            out_dtype = dtype if isinstance(dtype, torch.dtype) else getattr(torch, np.dtype(dtype).name)
        except (TypeError, AttributeError) as exc:
            raise InputError(f"The 'dtype' parameter must be a numeric dtype. Got {dtype!r} instead.") from exc
        if out_dtype not in (torch.float32, torch.float64, torch.int64, torch.int32):
            raise InputError(f"The 'dtype' parameter must be float32, float64, int32 or int64. Got {dtype!r}.")
    _, fn = select("summed_area_table", t.device)
    return to_output(fn(t, out_dtype), kind)


def box_sum(sat: Any, lo: Any, hi: Any, *, device: DeviceLike = "auto") -> Any:
    """Sums of ``a`` over many boxes from its summed-area table, with inclusive integer bounds.

    Parameters
    ----------
    sat : the output of :func:`summed_area_table` (1 to 3 dimensions)
    lo, hi : integer arrays of shape (m, ndim) (or (ndim,) for one box), ``0 ≤ lo ≤ hi < shape``

    Returns
    -------
    (m,) array (or a scalar for one box): ``Σ a[lo[0]:hi[0]+1, lo[1]:hi[1]+1, ...]``.

    Examples
    --------
    >>> s = summed_area_table([[1, 2], [3, 4]])
    >>> box_sum(s, [[0, 1], [1, 0]], [[1, 1], [1, 1]]).tolist()
    [6, 7]
    """
    s, kind = as_tensor(sat, "sat", device=device, ndim=(1, 2, 3))
    lo_t, _ = as_tensor(lo, "lo", like=s)
    hi_t, _ = as_tensor(hi, "hi", like=s)
    single = lo_t.ndim == 1
    if single:
        lo_t, hi_t = lo_t[None], hi_t[None]
    k = s.ndim
    for name, b in (("lo", lo_t), ("hi", hi_t)):
        if b.ndim != 2 or b.shape[1] != k:
            raise InputError(f"'{name}' must have shape (m, {k}). Got {tuple(b.shape)}.")
        if b.dtype.is_floating_point or b.dtype == torch.bool:
            raise InputError(f"'{name}' must be integers. Got dtype {b.dtype}.")
    if lo_t.shape != hi_t.shape:
        raise InputError(f"'lo' and 'hi' must have the same shape. Got {tuple(lo_t.shape)} and {tuple(hi_t.shape)}.")
    lo_t, hi_t = lo_t.to(torch.int64), hi_t.to(torch.int64)
    shape = torch.tensor(s.shape, device=s.device)
    if lo_t.numel():
        if bool((lo_t < 0).any()):
            raise InputError(f"'lo' must be ≥ 0. Found {int(lo_t.min())}.")
        if bool((hi_t >= shape).any()):
            raise InputError(f"'hi' must be < the table's shape {tuple(s.shape)}. Found {hi_t.max(0).values.tolist()}.")
        if bool((lo_t > hi_t).any()):
            row = int(torch.nonzero((lo_t > hi_t).any(1))[0, 0])
            raise InputError(f"'lo' must be ≤ 'hi'; box {row} has lo={lo_t[row].tolist()} hi={hi_t[row].tolist()}.")
    flat = s.reshape(-1)
    strides = torch.tensor(s.stride(), device=s.device)
    total = torch.zeros(lo_t.shape[0], dtype=s.dtype, device=s.device)
    for corner in range(1 << k):
        idx = torch.empty_like(lo_t)
        sign = 1
        for d in range(k):
            if (corner >> d) & 1:
                idx[:, d] = lo_t[:, d] - 1
                sign = -sign
            else:
                idx[:, d] = hi_t[:, d]
        valid = (idx >= 0).all(1)
        vals = flat[(idx.clamp_min(0) * strides).sum(1)]
        total += sign * torch.where(valid, vals, torch.zeros_like(vals))
    out = to_output(total, kind)
    return out[0] if single else out


# keep a reference for tests and benchmarks (the doc-002 algorithm in plain PyTorch)
split_radix_argsort = _torch.split_radix_argsort
