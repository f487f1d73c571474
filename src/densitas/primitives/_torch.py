"""PyTorch implementations of the primitives: the CPU path, the fallback on CUDA, and the test oracle.

Every function takes validated tensors (see :mod:`densitas.primitives.api`) and returns tensors.
"""

from __future__ import annotations

import torch

from densitas._backend.dispatch import register
from densitas.primitives._common import acc_dtype, compute_dtype, identity

# ----------------------------------------------------------------------------------------- reduce


@register("reduce", "torch")
def reduce(x: torch.Tensor, op: str, axis: int | None) -> torch.Tensor:
    out_dtype = acc_dtype(x.dtype, op)
    if axis is None:
        x = x.reshape(-1)
        axis = 0
    if op == "sum":
        return torch.sum(x, dim=axis, dtype=out_dtype)
    if op == "prod":
        return torch.prod(x, dim=axis, dtype=out_dtype)
    if op == "mean":
        return torch.mean(x.to(out_dtype), dim=axis)
    xc = x.to(compute_dtype(x.dtype, op))
    r = torch.amin(xc, dim=axis) if op == "min" else torch.amax(xc, dim=axis)
    return r.to(out_dtype)


# ------------------------------------------------------------------------------------------- scan


def _inclusive_scan_last(x: torch.Tensor, op: str) -> torch.Tensor:
    if op == "sum":
        return torch.cumsum(x, dim=-1)
    if op == "prod":
        return torch.cumprod(x, dim=-1)
    if op == "min":
        return torch.cummin(x, dim=-1).values
    return torch.cummax(x, dim=-1).values


def _exclusive_from(x: torch.Tensor, op: str, incl_fn) -> torch.Tensor:
    ident = identity(op, x.dtype)
    shifted = torch.empty_like(x)
    shifted[..., 0] = ident
    shifted[..., 1:] = x[..., :-1]
    return incl_fn(shifted)


@register("scan", "torch")
def scan(x: torch.Tensor, op: str, inclusive: bool, reverse: bool, axis: int) -> torch.Tensor:
    out_dtype = acc_dtype(x.dtype, op)
    xc = x.to(compute_dtype(x.dtype, op)).movedim(axis, -1)
    if xc.shape[-1] == 0:
        return torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if reverse:
        xc = xc.flip(-1)
    if inclusive:
        r = _inclusive_scan_last(xc, op)
    else:
        r = _exclusive_from(xc, op, lambda t: _inclusive_scan_last(t, op))
    if reverse:
        r = r.flip(-1)
    return r.movedim(-1, axis).to(out_dtype).contiguous()


@register("segmented_scan", "torch")
def segmented_scan(x: torch.Tensor, seg: torch.Tensor, op: str, inclusive: bool) -> torch.Tensor:
    """Segmented scan of a 1-D tensor with non-decreasing segment ids (vectorised over segments)."""
    out_dtype = acc_dtype(x.dtype, op)
    xc = x.to(compute_dtype(x.dtype, op))
    n = xc.shape[0]
    if n == 0:
        return torch.empty(0, dtype=out_dtype, device=x.device)
    ident = identity(op, xc.dtype)
    starts = torch.ones(n, dtype=torch.bool, device=x.device)
    starts[1:] = seg[1:] != seg[:-1]
    if not inclusive:
        shifted = torch.full_like(xc, ident)
        shifted[1:] = xc[:-1]
        shifted[starts] = ident
        xc = shifted
    if op == "sum" and not xc.dtype.is_floating_point:
        c = torch.cumsum(xc, 0)
        start_idx = torch.cummax(torch.where(starts, torch.arange(n, device=x.device), 0), 0).values
        before = torch.where(start_idx > 0, c[(start_idx - 1).clamp_min(0)], torch.zeros_like(c))
        return (c - before).to(out_dtype)
    # General (and floating-point) path: segments padded into rows and scanned row-wise, exact per segment.
    # Segments are bucketed by power-of-two length so the padding stays below 2n whatever the length mix.
    seg_index = torch.cumsum(starts.to(torch.int64), 0) - 1
    start_pos = torch.nonzero(starts).squeeze(1)
    lengths = torch.diff(torch.cat([start_pos, torch.tensor([n], device=x.device)]))
    col = torch.arange(n, device=x.device) - start_pos[seg_index]
    bucket = torch.ceil(torch.log2(lengths.to(torch.float64))).to(torch.int64)
    out = torch.empty_like(xc)
    for b in torch.unique(bucket).tolist():
        segs = torch.nonzero(bucket == b).squeeze(1)
        row_of = torch.full((lengths.shape[0],), -1, dtype=torch.int64, device=x.device)
        row_of[segs] = torch.arange(segs.shape[0], device=x.device)
        elems = torch.nonzero(row_of[seg_index] >= 0).squeeze(1)
        rows, cols = row_of[seg_index[elems]], col[elems]
        pad = torch.full((segs.shape[0], 1 << b), ident, dtype=xc.dtype, device=x.device)
        pad[rows, cols] = xc[elems]
        out[elems] = _inclusive_scan_last(pad, op)[rows, cols]
    return out.to(out_dtype)


# --------------------------------------------------------------------------------- reduce_by_key


@register("reduce_by_key", "torch")
def reduce_by_key(keys: torch.Tensor, values: torch.Tensor, op: str, num_keys: int) -> torch.Tensor:
    """``values`` is (n, c); returns (num_keys, c)."""
    out_dtype = acc_dtype(values.dtype, op)
    cdt = compute_dtype(values.dtype, op)
    v = values.to(cdt)
    c = v.shape[1]
    idx = keys.to(torch.int64)
    if op in ("sum", "mean"):
        if cdt.is_floating_point:
            out = torch.zeros((num_keys, c), dtype=cdt, device=v.device)
            out.index_add_(0, idx, v)
        else:
            out = torch.zeros((num_keys, c), dtype=torch.int64, device=v.device)
            out.index_add_(0, idx, v.to(torch.int64))
        if op == "mean":
            counts = torch.bincount(idx, minlength=num_keys).to(out_dtype)
            out = out.to(out_dtype) / counts[:, None]
        return out.to(out_dtype)
    reduce_name = {"prod": "prod", "min": "amin", "max": "amax"}[op]
    out = torch.full((num_keys, c), identity(op, cdt), dtype=cdt, device=v.device)
    out.scatter_reduce_(0, idx[:, None].expand(-1, c), v, reduce=reduce_name, include_self=True)  # NaN propagates
    return out.to(out_dtype)


# ---------------------------------------------------------------------------------------- compact


@register("compact", "torch")
def compact(x: torch.Tensor, mask: torch.Tensor, want_indices: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    if x.ndim == 1 and not want_indices:
        return x[mask], None
    idx = torch.nonzero(mask).squeeze(1)
    return x.index_select(0, idx), idx


# ------------------------------------------------------------------------------------------- sort


def ordered_bits(keys: torch.Tensor, descending: bool) -> tuple[torch.Tensor, int]:
    """Map keys to non-negative int64 whose unsigned order is the sort order; return ``(bits, nbits)``.

    Floats use the sign-flip transform (NaN canonicalised so it sorts last ascending, first descending, like
    ``torch.sort``); integers are offset by their minimum; descending inverts the bits.
    """
    b = float_order_bits(keys.to(torch.float64)) if keys.dtype.is_floating_point else keys.to(torch.int64)
    lo = b.min() if b.numel() else torch.tensor(0, device=b.device)
    hi = b.max() if b.numel() else torch.tensor(0, device=b.device)
    span = int(hi) - int(lo)
    if span.bit_length() <= 62:
        u = b - lo  # in [0, span]
        if descending:
            u = span - u
        return u, max(span.bit_length(), 1)
    # Full 64-bit range: flip the sign bit so that the unsigned order of the bits is the signed order.
    u = b ^ torch.tensor(-(2**63), dtype=torch.int64, device=b.device)
    if descending:
        u = ~u
    return u, 64


def split_radix_argsort(bits: torch.Tensor, nbits: int, exclusive_scan=None) -> torch.Tensor:
    """Stable LSB-first radix sort by one-bit splits, as in source document 002.

    For each bit b: e = ¬b, f = exclusive_scan(e), totalFalses = e[n−1] + f[n−1], t = i − f + totalFalses,
    destination = b ? t : f. Returns the permutation that sorts ``bits``.
    """
    n = bits.shape[0]
    perm = torch.arange(n, device=bits.device)
    if n == 0:
        return perm
    cur = bits.clone()
    i = torch.arange(n, device=bits.device)
    for bit in range(nbits):
        b = ((cur >> bit) & 1).to(torch.int64)
        e = 1 - b
        f = exclusive_scan(e) if exclusive_scan is not None else torch.cumsum(e, 0) - e
        total_falses = e[-1] + f[-1]
        t = i - f + total_falses
        dest = torch.where(b.bool(), t, f)
        new_cur = torch.empty_like(cur)
        new_cur[dest] = cur
        new_perm = torch.empty_like(perm)
        new_perm[dest] = perm
        cur, perm = new_cur, new_perm
    return perm


def float_order_bits(keys: torch.Tensor) -> torch.Tensor:
    """Signed integers of the same width whose order is the float order (−0.0 = 0.0, NaN above +inf)."""
    itype = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
             torch.float64: torch.int64}[keys.dtype]
    k = torch.where(keys == 0, torch.zeros_like(keys), keys)
    k = torch.where(torch.isnan(k), torch.full_like(k, float("nan")).abs(), k)
    b = k.view(itype)
    width = torch.iinfo(itype).bits
    return b ^ ((b >> (width - 1)) & torch.iinfo(itype).max)


@register("argsort", "torch")
def argsort(keys: torch.Tensor, descending: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Stable sort returning ``(sorted_keys, permutation)``.

    The library sort is the fast path (CUB onesweep radix sort on CUDA, a radix sort for integers on the CPU);
    floats are sorted through their order-preserving integer bit patterns, which is also what lets NaN sort
    last (first when descending) and −0.0 tie with 0.0.
    """
    k = keys.to(torch.uint8) if keys.dtype == torch.bool else keys
    if k.dtype.is_floating_point:
        k = float_order_bits(k)
    res = torch.sort(k, stable=True, descending=descending)
    if k is keys:
        return res.values, res.indices
    return keys.index_select(0, res.indices), res.indices


# ------------------------------------------------------------------------------------ histograms


_CHUNK = 1 << 18  # elements per chunk on the CPU path: temporaries stay in cache and off the page-fault path


def grid_indices(x: torch.Tensor, lo: float, hi: float, bins: int, linear: bool):
    """Bin index (int64), fraction (float64 or None) and inside-mask of one column, all in float64.

    Plain bins follow NumPy's uniform-bin rule (numpy.lib._histograms_impl): the index from the scaled value,
    corrected against the edges ``lo + k·step`` so that values on an edge land where NumPy puts them.
    """
    xd = x.to(torch.float64)
    inside = (xd >= lo) & (xd <= hi)
    if linear:
        xd = torch.where(inside, xd, lo)
        t = (xd - lo).mul_((bins - 1) / (hi - lo))
        fi = torch.floor(t).clamp_(0, bins - 2)
        frac = t.sub_(fi).clamp_(0, 1)
        return fi.long(), frac, inside
    step = (hi - lo) / bins
    fi = torch.floor((xd - lo).mul_(bins / (hi - lo))).clamp_(0, bins - 1)
    fi -= (xd < fi * step + lo).to(torch.float64)
    right = (fi + 1).mul_(step).add_(lo)
    right.masked_fill_(fi == bins - 1, hi)
    fi += ((xd >= right) & (fi != bins - 1)).to(torch.float64)
    return fi.clamp_(min=0).long(), None, inside


@register("histogram", "torch")
def histogram(x: torch.Tensor, bins: tuple[int, ...], lo: tuple[float, ...], hi: tuple[float, ...],
              weights: torch.Tensor | None, linear: bool) -> torch.Tensor:
    """``x`` is (n, d); returns a float64 (linear or weighted) or int64 (counts) array of shape ``bins``."""
    dev = x.device
    d = len(bins)
    total = 1
    for b in bins:
        total *= b
    strides = [1] * d
    for k in range(d - 2, -1, -1):
        strides[k] = strides[k + 1] * bins[k + 1]
    counts = weights is None and not linear
    out = torch.zeros(total, dtype=torch.int64 if counts else torch.float64, device=dev)
    chunk = _CHUNK if dev.type == "cpu" else max(x.shape[0], 1)
    for s0 in range(0, x.shape[0], chunk):
        xc = x[s0:s0 + chunk]
        wc = weights[s0:s0 + chunk].to(torch.float64) if weights is not None else None
        cols = [grid_indices(xc[:, k], lo[k], hi[k], bins[k], linear) for k in range(d)]
        inside = cols[0][2]
        for k in range(1, d):
            inside &= cols[k][2]
        if not linear:
            flat = cols[0][0] * strides[0] if d > 1 else cols[0][0]
            for k in range(1, d):
                flat += cols[k][0] * strides[k]
            flat.masked_fill_(~inside, total)  # outside points (and NaN) land in an overflow bin, dropped below
            if counts:
                out += torch.bincount(flat, minlength=total + 1)[:total]
            else:
                out += torch.bincount(flat, weights=wc, minlength=total + 1)[:total]
            continue
        base_w = inside.to(torch.float64)
        if wc is not None:
            base_w *= wc
        for corner in range(1 << d):
            cw = base_w.clone()
            flat = torch.zeros(xc.shape[0], dtype=torch.int64, device=dev)
            for k in range(d):
                up = (corner >> k) & 1
                cw *= cols[k][1] if up else (1 - cols[k][1])
                flat += (cols[k][0] + up) * strides[k]
            out += torch.bincount(flat, weights=cw, minlength=total)
    return out.reshape(bins)


# ------------------------------------------------------------------------------ summed-area table


@register("summed_area_table", "torch")
def summed_area_table(a: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    r = a.to(out_dtype)
    for ax in range(a.ndim):
        r = torch.cumsum(r, dim=ax)
    return r
