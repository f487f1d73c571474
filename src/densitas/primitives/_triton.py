"""Triton kernels of the primitives (CUDA; CPU tensors under ``TRITON_INTERPRET=1``).

Each launcher has the contract of its PyTorch twin in :mod:`densitas.primitives._torch`; tests compare the two.

* ``scan``: single-pass decoupled look-back (Merrill & Garland 2016) for 32-bit values — each tile publishes
  its aggregate in one 64-bit word (flag << 32 | value bits), so no memory fence is needed between value and
  flag; tiles take their index from an atomic counter, so every predecessor has started and the spin-wait
  always ends. Other dtypes, rows and segments use reduce-then-scan (tile aggregates → recursive scan →
  tile scans with a carry), with the segmented operator on (value, segment id) pairs.
* ``compact``: the same look-back on the 0/1 flags, fused with the scatter.
* ``reduce``: per-tile tree sums accumulated in float64 (int64 for integers), then a tiny final reduction.
* ``histogram`` / ``reduce_by_key``: atomics into R replicas of the output (spreads contention), summed at the
  end; float64 accumulation.
* ``summed_area_table``: two passes — tile row/column sums (small carry arrays scanned by PyTorch), then every
  tile independently: local 2-D scan + column carry + row carry.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from densitas._backend.dispatch import interpret_mode
from densitas.primitives import _cuda
from densitas.primitives import _torch as ref
from densitas.primitives._common import OP_CODE, acc_dtype, compute_dtype, identity

_INTERP = interpret_mode()


def _cfg(gpu: int, interp: int) -> int:
    return interp if _INTERP else gpu


# Launch settings, tuned on an H200 with benchmarks/tune_primitives.py (benchmarks/RESULTS.md); tiny blocks
# under the interpreter so that small test inputs still span many tiles.
SCAN_BLOCK = _cfg(8192, 32)
SCAN_WARPS = 2  # more warps lengthen the look-back critical path (8 warps: half the bandwidth)
LOOKBACK_WINDOW = _cfg(32, 4)
COMPACT_BLOCK = _cfg(4096, 32)
COMPACT_WARPS = 2
RTS_BLOCK = _cfg(2048, 32)
REDUCE_BLOCK = _cfg(8192, 64)
REDUCE_WARPS = 8
REDUCE_PROGS_PER_SM = 8
HIST_BLOCK = _cfg(256, 64)
HIST_WARPS = 8
RBK_BLOCK = _cfg(4096, 64)
RBK_WARPS = 4
SAT_TILE = _cfg(64, 8)

# ------------------------------------------------------------------------------------ combinators


@triton.jit
def _min_nan(a, b):
    return tl.where(a != a, a, tl.where(b != b, b, tl.minimum(a, b)))


@triton.jit
def _max_nan(a, b):
    return tl.where(a != a, a, tl.where(b != b, b, tl.maximum(a, b)))


@triton.jit
def _mul(a, b):
    return a * b


@triton.jit
def _combine(a, b, OP: tl.constexpr):
    if OP == 0:
        r = a + b
    elif OP == 1:
        r = a * b
    elif OP == 2:
        r = _min_nan(a, b)
    else:
        r = _max_nan(a, b)
    return r


@triton.jit
def _reduce_block(v, OP: tl.constexpr):
    if OP == 0:
        r = tl.sum(v, 0)
    elif OP == 1:
        r = tl.reduce(v, 0, _mul)
    elif OP == 2:
        r = tl.reduce(v, 0, _min_nan)
    else:
        r = tl.reduce(v, 0, _max_nan)
    return r


@triton.jit
def _scan_block(v, OP: tl.constexpr):
    if OP == 0:
        r = tl.cumsum(v, 0)
    elif OP == 1:
        r = tl.associative_scan(v, 0, _mul)
    elif OP == 2:
        r = tl.associative_scan(v, 0, _min_nan)
    else:
        r = tl.associative_scan(v, 0, _max_nan)
    return r


@triton.jit
def _seg_add(a, sa, b, sb):
    return tl.where(sa == sb, a + b, b), sb


@triton.jit
def _seg_mul(a, sa, b, sb):
    return tl.where(sa == sb, a * b, b), sb


@triton.jit
def _seg_min(a, sa, b, sb):
    return tl.where(sa == sb, _min_nan(a, b), b), sb


@triton.jit
def _seg_max(a, sa, b, sb):
    return tl.where(sa == sb, _max_nan(a, b), b), sb


@triton.jit
def _seg_scan_block(v, s, OP: tl.constexpr):
    if OP == 0:
        r, _ = tl.associative_scan((v, s), 0, _seg_add)
    elif OP == 1:
        r, _ = tl.associative_scan((v, s), 0, _seg_mul)
    elif OP == 2:
        r, _ = tl.associative_scan((v, s), 0, _seg_min)
    else:
        r, _ = tl.associative_scan((v, s), 0, _seg_max)
    return r


# ------------------------------------------------------------------------------- decoupled look-back


@triton.jit
def _pack(v, flag: tl.constexpr):
    return (v.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF) | (flag << 32)


@triton.jit
def _unpack(w, DT: tl.constexpr):
    return (w & 0xFFFFFFFF).to(tl.int32).to(DT, bitcast=True)


@triton.jit
def _lookback(state_ptr, tile, agg, ident, OP: tl.constexpr, WINDOW: tl.constexpr):
    """Publish this tile's aggregate, walk back over predecessors, publish the inclusive prefix; return the
    exclusive prefix. Flags: 0 = nothing yet, 1 = aggregate, 2 = inclusive prefix."""
    tl.atomic_xchg(state_ptr + tile, tl.where(tile == 0, _pack(agg, 2), _pack(agg, 1)))
    prefix = ident
    end = tile
    go = tile > 0
    lane = tl.arange(0, WINDOW)
    done_word = _pack(ident, 2)
    while go:
        pos = end - WINDOW + lane
        w = tl.load(state_ptr + pos, mask=pos >= 0, other=done_word, volatile=True)
        flag = w >> 32
        vals = _unpack(w, agg.dtype)
        lastp = tl.max(tl.where(flag == 2, lane, -1), 0)
        lastz = tl.max(tl.where(flag == 0, lane, -1), 0)
        ok = lastz < tl.maximum(lastp, 0)
        part = _reduce_block(tl.where(lane >= lastp, vals, ident), OP)
        prefix = tl.where(ok, _combine(part, prefix, OP), prefix)
        end = tl.where(ok, end - WINDOW, end)
        go = (not ok) | (lastp < 0)
    tl.atomic_xchg(state_ptr + tile, _pack(_combine(prefix, agg, OP), 2))
    return prefix


@triton.jit
def _scan_lookback_kernel(x_ptr, out_ptr, ident_ptr, state_ptr, counter_ptr, n,
                          OP: tl.constexpr, INCLUSIVE: tl.constexpr, REVERSE: tl.constexpr,
                          BLOCK: tl.constexpr, WINDOW: tl.constexpr):
    tile = tl.atomic_add(counter_ptr, 1, sem="relaxed")
    DT: tl.constexpr = out_ptr.dtype.element_ty
    ident = tl.load(ident_ptr)
    start = tile.to(tl.int64) * BLOCK
    idx = start + tl.arange(0, BLOCK)
    m = idx < n
    if REVERSE:
        phys = n - 1 - idx
    else:
        phys = idx
    x = tl.where(m, tl.load(x_ptr + phys, mask=m).to(DT), ident)
    agg = _reduce_block(x, OP)
    if INCLUSIVE:
        local = _scan_block(x, OP)
    else:
        pm = m & (idx > start)
        if REVERSE:
            pphys = phys + 1
        else:
            pphys = phys - 1
        xs = tl.where(pm, tl.load(x_ptr + pphys, mask=pm).to(DT), ident)
        local = _scan_block(xs, OP)
    prefix = _lookback(state_ptr, tile, agg, ident, OP, WINDOW)
    tl.store(out_ptr + phys, _combine(prefix, local, OP), mask=m)


def _ident_tensor(op: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor([identity(op, dtype)], dtype=dtype, device=device)


def _scan_lookback(x: torch.Tensor, op: str, inclusive: bool, reverse: bool, dtype: torch.dtype,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    n = x.shape[0]
    out = torch.empty(n, dtype=dtype, device=x.device) if out is None else out
    tiles = triton.cdiv(n, SCAN_BLOCK)
    state = torch.zeros(tiles, dtype=torch.int64, device=x.device)
    counter = torch.zeros(1, dtype=torch.int32, device=x.device)
    _scan_lookback_kernel[(tiles,)](
        x, out, _ident_tensor(op, dtype, x.device), state, counter, n,
        OP=OP_CODE[op], INCLUSIVE=inclusive, REVERSE=reverse, BLOCK=SCAN_BLOCK, WINDOW=LOOKBACK_WINDOW,
        num_warps=SCAN_WARPS,
    )
    return out


# ---------------------------------------------------------------------------------- reduce-then-scan


@triton.jit
def _tile_agg_kernel(x_ptr, seg_ptr, agg_ptr, aggseg_ptr, ident_ptr, n, T,
                     OP: tl.constexpr, HAS_SEG: tl.constexpr, REVERSE: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    row = pid // T
    tile = pid % T
    DT: tl.constexpr = agg_ptr.dtype.element_ty
    ident = tl.load(ident_ptr)
    start = tile.to(tl.int64) * BLOCK
    idx = start + tl.arange(0, BLOCK)
    m = idx < n
    if REVERSE:
        phys = n - 1 - idx
    else:
        phys = idx
    base = row.to(tl.int64) * n
    x = tl.where(m, tl.load(x_ptr + base + phys, mask=m).to(DT), ident)
    if HAS_SEG:
        last = tl.minimum(start + BLOCK, n) - 1
        if REVERSE:
            lphys = n - 1 - last
        else:
            lphys = last
        slast = tl.load(seg_ptr + lphys)
        s = tl.load(seg_ptr + phys, mask=m, other=0)
        x = tl.where(m & (s == slast), x, ident)
        tl.store(aggseg_ptr + tile, slast)
    tl.store(agg_ptr + row.to(tl.int64) * T + tile, _reduce_block(x, OP))


@triton.jit
def _tile_scan_kernel(x_ptr, seg_ptr, incl_ptr, aggseg_ptr, out_ptr, ident_ptr, n, T,
                      OP: tl.constexpr, HAS_SEG: tl.constexpr, INCLUSIVE: tl.constexpr,
                      REVERSE: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    row = pid // T
    tile = pid % T
    DT: tl.constexpr = out_ptr.dtype.element_ty
    ident = tl.load(ident_ptr)
    start = tile.to(tl.int64) * BLOCK
    idx = start + tl.arange(0, BLOCK)
    m = idx < n
    if REVERSE:
        phys = n - 1 - idx
    else:
        phys = idx
    base = row.to(tl.int64) * n
    x = tl.where(m, tl.load(x_ptr + base + phys, mask=m).to(DT), ident)
    if HAS_SEG:
        s = tl.load(seg_ptr + phys, mask=m, other=0)
    if INCLUSIVE:
        v = x
    else:
        pm = m & (idx > start)
        if REVERSE:
            pphys = phys + 1
        else:
            pphys = phys - 1
        v = tl.where(pm, tl.load(x_ptr + base + pphys, mask=pm).to(DT), ident)
        if HAS_SEG:
            sp = tl.load(seg_ptr + pphys, mask=pm, other=0)
            v = tl.where(pm & (sp == s), v, ident)
    if HAS_SEG:
        local = _seg_scan_block(v, s, OP)
    else:
        local = _scan_block(v, OP)
    prev = tl.maximum(tile - 1, 0)
    carry = tl.where(tile > 0, tl.load(incl_ptr + row.to(tl.int64) * T + prev), ident)
    if HAS_SEG:
        cseg = tl.load(aggseg_ptr + prev)
        res = tl.where((tile > 0) & (s == cseg), _combine(carry, local, OP), local)
    else:
        res = _combine(carry, local, OP)
    tl.store(out_ptr + base + phys, res, mask=m)


def _rts(x2: torch.Tensor, seg: torch.Tensor | None, op: str, inclusive: bool, reverse: bool,
         dtype: torch.dtype) -> torch.Tensor:
    """Reduce-then-scan of every row of a contiguous (R, n) tensor (R = 1 when segmented)."""
    rows, n = x2.shape
    dev = x2.device
    out = torch.empty((rows, n), dtype=dtype, device=dev)
    ident = _ident_tensor(op, dtype, dev)
    T = triton.cdiv(n, RTS_BLOCK)
    has_seg = seg is not None
    segp = seg if has_seg else ident
    if T > 1:
        agg = torch.empty((rows, T), dtype=dtype, device=dev)
        aggseg = torch.empty(T, dtype=torch.int64, device=dev) if has_seg else ident
        _tile_agg_kernel[(rows * T,)](x2, segp, agg, aggseg, ident, n, T, OP=OP_CODE[op], HAS_SEG=has_seg,
                                      REVERSE=reverse, BLOCK=RTS_BLOCK, num_warps=8)
        incl = _rts(agg, aggseg if has_seg else None, op, True, False, dtype)
    else:
        incl, aggseg = ident, ident
    _tile_scan_kernel[(rows * T,)](x2, segp, incl, aggseg, out, ident, n, T, OP=OP_CODE[op], HAS_SEG=has_seg,
                                   INCLUSIVE=inclusive, REVERSE=reverse, BLOCK=RTS_BLOCK, num_warps=8)
    return out


_LOOKBACK_DTYPES = (torch.float32, torch.int32)


def scan(x: torch.Tensor, op: str, inclusive: bool, reverse: bool, axis: int) -> torch.Tensor:
    out_dtype = acc_dtype(x.dtype, op)
    cdt = compute_dtype(x.dtype, op)
    xm = x.movedim(axis, -1).contiguous()
    shape = xm.shape
    n = shape[-1]
    if xm.numel() == 0:
        return torch.empty(x.shape, dtype=out_dtype, device=x.device)
    x2 = xm.reshape(-1, n)
    if x2.shape[0] == 1 and cdt in _LOOKBACK_DTYPES and n < 2**31:
        r = _scan_lookback(x2[0], op, inclusive, reverse, cdt)
    else:
        r = _rts(x2, None, op, inclusive, reverse, cdt)
    return r.reshape(shape).movedim(-1, axis).to(out_dtype).contiguous()


def segmented_scan(x: torch.Tensor, seg: torch.Tensor, op: str, inclusive: bool) -> torch.Tensor:
    out_dtype = acc_dtype(x.dtype, op)
    if x.shape[0] == 0:
        return torch.empty(0, dtype=out_dtype, device=x.device)
    cdt = compute_dtype(x.dtype, op)
    r = _rts(x.contiguous()[None], seg.contiguous(), op, inclusive, False, cdt)[0]
    return r.to(out_dtype)


# -------------------------------------------------------------------------------------------- reduce


@triton.jit
def _reduce_kernel(x_ptr, part_ptr, ident_ptr, n, TILES_PER_PROG, OP: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    ACC: tl.constexpr = part_ptr.dtype.element_ty
    CDT: tl.constexpr = ident_ptr.dtype.element_ty
    ident = tl.load(ident_ptr)
    acc = tl.full([BLOCK], 0, ACC) + ident.to(ACC)  # one accumulator per lane: no barrier inside the loop
    # while, not range(): Triton 3.6's interpreter cannot iterate a runtime bound under NumPy >= 2.4
    i = 0
    while i < TILES_PER_PROG:
        start = (pid.to(tl.int64) * TILES_PER_PROG + i) * BLOCK
        idx = start + tl.arange(0, BLOCK)
        m = idx < n
        x = tl.where(m, tl.load(x_ptr + idx, mask=m).to(CDT), ident)
        acc = _combine(acc, x.to(ACC), OP)
        i += 1
    tl.store(part_ptr + pid, _reduce_block(acc, OP))


def _num_programs(device: torch.device, per_sm: int = 8) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count * per_sm
    return 4


def reduce(x: torch.Tensor, op: str, axis: int | None) -> torch.Tensor:
    if axis is not None or x.numel() == 0:
        return ref.reduce(x, op, axis)
    out_dtype = acc_dtype(x.dtype, op)
    kop = "sum" if op == "mean" else op
    cdt = compute_dtype(x.dtype, kop)
    if cdt.is_floating_point and kop in ("sum", "prod"):
        part_dtype = torch.float64
    else:
        part_dtype = cdt
    flat = x.reshape(-1).contiguous()
    n = flat.numel()
    tiles = triton.cdiv(n, REDUCE_BLOCK)
    progs = min(tiles, _num_programs(x.device, REDUCE_PROGS_PER_SM))
    per = triton.cdiv(tiles, progs)
    progs = triton.cdiv(tiles, per)
    part = torch.empty(progs, dtype=part_dtype, device=x.device)
    _reduce_kernel[(progs,)](flat, part, _ident_tensor(kop, cdt, x.device), n, per, OP=OP_CODE[kop],
                             BLOCK=REDUCE_BLOCK, num_warps=REDUCE_WARPS)
    r = ref.reduce(part, kop, None)
    if op == "mean":  # divide in float64: int64 / int would give float32 in PyTorch
        r = r.to(torch.float64) / n
    return r.to(out_dtype)


# ------------------------------------------------------------------------------------------- compact


@triton.jit
def _compact_kernel(x_ptr, mask_ptr, out_ptr, idx_ptr, state_ptr, counter_ptr, total_ptr, n,
                    WRITE_VALUES: tl.constexpr, WRITE_IDX: tl.constexpr, BLOCK: tl.constexpr,
                    WINDOW: tl.constexpr):
    tile = tl.atomic_add(counter_ptr, 1, sem="relaxed")
    start = tile.to(tl.int64) * BLOCK
    idx = start + tl.arange(0, BLOCK)
    m = idx < n
    f = tl.load(mask_ptr + idx, mask=m, other=0).to(tl.int32)
    local = tl.cumsum(f, 0)
    agg = tl.sum(f, 0)
    zero = tl.zeros([], tl.int32)
    prefix = _lookback(state_ptr, tile, agg, zero, 0, WINDOW)
    dest = (prefix + local - 1).to(tl.int64)
    sel = m & (f != 0)
    if WRITE_VALUES:
        v = tl.load(x_ptr + idx, mask=sel)
        tl.store(out_ptr + dest, v, mask=sel)
    if WRITE_IDX:
        tl.store(idx_ptr + dest, idx, mask=sel)
    tl.store(total_ptr, prefix + agg, mask=tile == tl.num_programs(0) - 1)


def compact(x: torch.Tensor, mask: torch.Tensor, want_indices: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    n = x.shape[0]
    if n == 0 or n >= 2**31:
        return ref.compact(x, mask, want_indices)
    one_d = x.ndim == 1
    xc = x.contiguous()
    mc = mask.contiguous()
    tiles = triton.cdiv(n, COMPACT_BLOCK)
    state = torch.zeros(tiles, dtype=torch.int64, device=x.device)
    counter = torch.zeros(1, dtype=torch.int32, device=x.device)
    total = torch.zeros(1, dtype=torch.int32, device=x.device)
    out = torch.empty(n if one_d else 1, dtype=x.dtype, device=x.device)
    write_idx = want_indices or not one_d
    idx = torch.empty(n if write_idx else 1, dtype=torch.int64, device=x.device)
    _compact_kernel[(tiles,)](xc, mc, out, idx, state, counter, total, n, WRITE_VALUES=one_d, WRITE_IDX=write_idx,
                              BLOCK=COMPACT_BLOCK, WINDOW=LOOKBACK_WINDOW, num_warps=COMPACT_WARPS)
    k = int(total.item())
    idx_out = idx[:k] if write_idx else None
    vals = out[:k] if one_d else x.index_select(0, idx[:k])
    return vals, (idx_out if want_indices else None)


# ---------------------------------------------------------------------------------------------- sort


def _exclusive_scan_int(e: torch.Tensor) -> torch.Tensor:
    return _scan_lookback(e.to(torch.int32), "sum", False, False, torch.int32).to(torch.int64)


def argsort(keys: torch.Tensor, descending: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Document 002's split radix sort, one bit per pass, the exclusive scans on the look-back kernel."""
    if keys.dtype == torch.bool:
        keys = keys.to(torch.uint8)
    if keys.numel() == 0:
        return keys, torch.arange(0, device=keys.device)
    bits, nbits = ref.ordered_bits(keys, descending)
    perm = ref.split_radix_argsort(bits, nbits, exclusive_scan=_exclusive_scan_int)
    return keys.index_select(0, perm), perm


# ----------------------------------------------------------------------------------------- histogram


@triton.jit
def _bin_index(xv, lo, hi, nb, LINEAR: tl.constexpr):
    x = xv.to(tl.float64)
    inside = (x >= lo) & (x <= hi)
    xs = tl.where(inside, x, lo)
    if LINEAR:
        delta = (hi - lo) / (nb - 1)
        t = (xs - lo) / delta
        fi = tl.minimum(tl.maximum(tl.floor(t), 0.0), (nb - 2).to(tl.float64))
        frac = tl.minimum(tl.maximum(t - fi, 0.0), 1.0)
        ii = fi.to(tl.int64)
    else:
        step = (hi - lo) / nb
        ii = tl.floor((xs - lo) * (nb / (hi - lo))).to(tl.int64)
        ii = tl.minimum(tl.maximum(ii, 0), nb - 1)
        ii = tl.where(xs < lo + ii * step, ii - 1, ii)
        right = tl.where(ii + 1 == nb, hi, lo + (ii + 1) * step)
        ii = tl.where((xs >= right) & (ii != nb - 1), ii + 1, ii)
        ii = tl.maximum(ii, 0)
        frac = xs * 0.0
    return ii, frac, inside


@triton.jit
def _hist_kernel(x_ptr, w_ptr, out_ptr, rng_ptr, n, total, R, ITERS, nb0, nb1,
                 D: tl.constexpr, LINEAR: tl.constexpr, HAS_W: tl.constexpr, BLOCK: tl.constexpr):
    # lo/hi arrive in a float64 tensor: Triton would type Python float arguments as float32
    lo0 = tl.load(rng_ptr)
    hi0 = tl.load(rng_ptr + 1)
    lo1 = tl.load(rng_ptr + 2)
    hi1 = tl.load(rng_ptr + 3)
    pid = tl.program_id(0)
    base = out_ptr + (pid % R).to(tl.int64) * total
    OUT: tl.constexpr = out_ptr.dtype.element_ty
    it = 0
    while it < ITERS:
        idx = (pid.to(tl.int64) * ITERS + it) * BLOCK + tl.arange(0, BLOCK)
        m = idx < n
        it += 1
        if HAS_W:
            w = tl.load(w_ptr + idx, mask=m, other=0).to(tl.float64)
        else:
            w = tl.full([BLOCK], 1.0, tl.float64)
        x0 = tl.load(x_ptr + idx * D, mask=m, other=0)
        i0, f0, in0 = _bin_index(x0, lo0, hi0, nb0, LINEAR)
        if D == 1:
            ok = m & in0
            if LINEAR:
                tl.atomic_add(base + i0, (w * (1.0 - f0)).to(OUT), mask=ok, sem="relaxed")
                tl.atomic_add(base + i0 + 1, (w * f0).to(OUT), mask=ok, sem="relaxed")
            else:
                tl.atomic_add(base + i0, w.to(OUT), mask=ok, sem="relaxed")
        else:
            x1 = tl.load(x_ptr + idx * D + 1, mask=m, other=0)
            i1, f1, in1 = _bin_index(x1, lo1, hi1, nb1, LINEAR)
            ok = m & in0 & in1
            flat = i0 * nb1 + i1
            if LINEAR:
                tl.atomic_add(base + flat, (w * (1.0 - f0) * (1.0 - f1)).to(OUT), mask=ok, sem="relaxed")
                tl.atomic_add(base + flat + 1, (w * (1.0 - f0) * f1).to(OUT), mask=ok, sem="relaxed")
                tl.atomic_add(base + flat + nb1, (w * f0 * (1.0 - f1)).to(OUT), mask=ok, sem="relaxed")
                tl.atomic_add(base + flat + nb1 + 1, (w * f0 * f1).to(OUT), mask=ok, sem="relaxed")
            else:
                tl.atomic_add(base + flat, w.to(OUT), mask=ok, sem="relaxed")


def _replicas(total: int, programs: int) -> int:
    return max(1, min(64, programs, (4 << 20) // (8 * total)))


def histogram(x: torch.Tensor, bins: tuple[int, ...], lo: tuple[float, ...], hi: tuple[float, ...],
              weights: torch.Tensor | None, linear: bool) -> torch.Tensor:
    d = x.shape[1]
    n = x.shape[0]
    if d > 2 or n == 0:
        return ref.histogram(x, bins, lo, hi, weights, linear)
    if d == 1 and x.device.type == "cuda" and bins[0] <= _cuda.MAX_BINS and _cuda.available():
        out = _cuda.histogram1d(x[:, 0], bins[0], lo[0], hi[0], weights, linear)
        return out.round().to(torch.int64) if (weights is None and not linear) else out
    total = 1
    for b in bins:
        total *= b
    out_dtype = torch.int64 if (weights is None and not linear) else torch.float64
    tiles = triton.cdiv(n, HIST_BLOCK)
    progs = min(tiles, _num_programs(x.device) * 2)
    iters = triton.cdiv(tiles, progs)
    progs = triton.cdiv(tiles, iters)
    reps = _replicas(total, progs)
    out = torch.zeros((reps, total), dtype=out_dtype, device=x.device)
    xc = x.contiguous()
    w = weights.contiguous() if weights is not None else xc
    p1 = (lo[1], hi[1], bins[1]) if d == 2 else (0.0, 1.0, 1)
    rng = torch.tensor([lo[0], hi[0], p1[0], p1[1]], dtype=torch.float64, device=x.device)
    _hist_kernel[(progs,)](xc, w, out, rng, n, total, reps, iters, bins[0], p1[2], D=d, LINEAR=linear,
                           HAS_W=weights is not None, BLOCK=HIST_BLOCK, num_warps=HIST_WARPS)
    return out.sum(0).reshape(bins)


# ------------------------------------------------------------------------------------- reduce_by_key


@triton.jit
def _rbk_kernel(k_ptr, v_ptr, out_ptr, cnt_ptr, n, C, num_keys, R, ITERS,
                COUNT: tl.constexpr, BLOCK: tl.constexpr, BC: tl.constexpr):
    pid = tl.program_id(0)
    rep = (pid % R).to(tl.int64)
    base = out_ptr + rep * num_keys * C
    ACC: tl.constexpr = out_ptr.dtype.element_ty
    cols = tl.arange(0, BC)
    it = 0
    while it < ITERS:
        idx = (pid.to(tl.int64) * ITERS + it) * BLOCK + tl.arange(0, BLOCK)
        m = idx < n
        it += 1
        k = tl.load(k_ptr + idx, mask=m, other=0).to(tl.int64)
        mm = m[:, None] & (cols < C)[None, :]
        v = tl.load(v_ptr + idx[:, None] * C + cols[None, :], mask=mm, other=0).to(ACC)
        tl.atomic_add(base + k[:, None] * C + cols[None, :], v, mask=mm, sem="relaxed")
        if COUNT:
            tl.atomic_add(cnt_ptr + rep * num_keys + k, 1, mask=m, sem="relaxed")


def reduce_by_key(keys: torch.Tensor, values: torch.Tensor, op: str, num_keys: int) -> torch.Tensor:
    n, c = values.shape
    if op not in ("sum", "mean") or n == 0 or num_keys == 0 or c > 64:
        return ref.reduce_by_key(keys, values, op, num_keys)
    out_dtype = acc_dtype(values.dtype, op)
    if (c == 1 and values.device.type == "cuda" and values.dtype in (torch.float32, torch.float64)
            and num_keys <= _cuda.MAX_KEYS and _cuda.available()):  # shared-memory sums: 3.5x the global atomics
        total, cnt = _cuda.reduce_by_key(keys, values[:, 0], num_keys, op == "mean")
        r = total if cnt is None else total / cnt.to(torch.float64)
        return r[:, None].to(out_dtype)
    acc = torch.float64 if (values.dtype.is_floating_point or op == "mean") else torch.int64
    tiles = triton.cdiv(n, RBK_BLOCK)
    progs = min(tiles, _num_programs(values.device) * 2)
    iters = triton.cdiv(tiles, progs)
    progs = triton.cdiv(tiles, iters)
    reps = _replicas(num_keys * c, progs)
    out = torch.zeros((reps, num_keys, c), dtype=acc, device=values.device)
    count = op == "mean"
    cnt = torch.zeros((reps, num_keys), dtype=torch.int64, device=values.device) if count else out
    bc = triton.next_power_of_2(max(c, 1))
    _rbk_kernel[(progs,)](keys.contiguous(), values.contiguous(), out, cnt, n, c, num_keys, reps, iters,
                          COUNT=count, BLOCK=RBK_BLOCK, BC=bc, num_warps=RBK_WARPS)
    r = out.sum(0)
    if count:
        r = r / cnt.sum(0)[:, None].to(torch.float64)
    return r.to(out_dtype)


# -------------------------------------------------------------------------------- summed-area table


@triton.jit
def _sat_partials_kernel(a_ptr, colsum_ptr, rowsum_ptr, H, W, NRB, NCS, DT: tl.constexpr,
                         BR: tl.constexpr, BC: tl.constexpr):
    pid = tl.program_id(0)
    b = pid // (NRB * NCS)
    rem = pid % (NRB * NCS)
    rb = rem // NCS
    cs = rem % NCS
    rows = rb * BR + tl.arange(0, BR)
    cols = cs * BC + tl.arange(0, BC)
    mr = rows < H
    mc = cols < W
    m = mr[:, None] & mc[None, :]
    base = b.to(tl.int64) * H * W
    t = tl.load(a_ptr + base + rows[:, None].to(tl.int64) * W + cols[None, :], mask=m, other=0).to(DT)
    tl.store(colsum_ptr + (b.to(tl.int64) * NRB + rb) * W + cols, tl.sum(t, 0), mask=mc)
    tl.store(rowsum_ptr + (b.to(tl.int64) * H + rows) * NCS + cs, tl.sum(t, 1), mask=mr)


@triton.jit
def _sat_tiles_kernel(a_ptr, out_ptr, colcarry_ptr, rowcarry_ptr, H, W, NRB, NCS, DT: tl.constexpr,
                      BR: tl.constexpr, BC: tl.constexpr):
    pid = tl.program_id(0)
    b = pid // (NRB * NCS)
    rem = pid % (NRB * NCS)
    rb = rem // NCS
    cs = rem % NCS
    rows = rb * BR + tl.arange(0, BR)
    cols = cs * BC + tl.arange(0, BC)
    mr = rows < H
    mc = cols < W
    m = mr[:, None] & mc[None, :]
    base = b.to(tl.int64) * H * W
    offs = base + rows[:, None].to(tl.int64) * W + cols[None, :]
    t = tl.load(a_ptr + offs, mask=m, other=0).to(DT)
    local = tl.cumsum(tl.cumsum(t, 1), 0)
    cc = tl.load(colcarry_ptr + (b.to(tl.int64) * NRB + rb) * W + cols, mask=mc, other=0)
    rc = tl.load(rowcarry_ptr + (b.to(tl.int64) * H + rows) * NCS + cs, mask=mr, other=0)
    rc = tl.cumsum(rc, 0)
    tl.store(out_ptr + offs, local + cc[None, :] + rc[:, None], mask=m)


_TL = {torch.float32: tl.float32, torch.float64: tl.float64, torch.int64: tl.int64, torch.int32: tl.int32}


def _sat2d(a3: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    B, H, W = a3.shape
    br = bc = SAT_TILE
    nrb, ncs = triton.cdiv(H, br), triton.cdiv(W, bc)
    dev = a3.device
    colsum = torch.empty((B, nrb, W), dtype=out_dtype, device=dev)
    rowsum = torch.empty((B, H, ncs), dtype=out_dtype, device=dev)
    grid = (B * nrb * ncs,)
    _sat_partials_kernel[grid](a3, colsum, rowsum, H, W, nrb, ncs, DT=_TL[out_dtype], BR=br, BC=bc, num_warps=4)
    # column carry: Σ over earlier row blocks of the column-prefix of their column sums
    cprefix = torch.cumsum(colsum, dim=2)
    colcarry = torch.zeros_like(cprefix)
    colcarry[:, 1:] = torch.cumsum(cprefix, dim=1)[:, :-1]
    # row carry: Σ over earlier column strips of each row's strip sums
    rowcarry = torch.zeros_like(rowsum)
    rowcarry[:, :, 1:] = torch.cumsum(rowsum, dim=2)[:, :, :-1]
    out = torch.empty((B, H, W), dtype=out_dtype, device=dev)
    _sat_tiles_kernel[grid](a3, out, colcarry.contiguous(), rowcarry.contiguous(), H, W, nrb, ncs,
                            DT=_TL[out_dtype], BR=br, BC=bc, num_warps=4)
    return out


def summed_area_table(a: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    if a.numel() == 0:
        return torch.empty(a.shape, dtype=out_dtype, device=a.device)
    if a.dtype == torch.bool:
        a = a.to(torch.uint8)
    ac = a.contiguous()
    if a.ndim == 1:
        cdt = out_dtype
        if cdt in _LOOKBACK_DTYPES:
            return _scan_lookback(ac, "sum", True, False, cdt)
        return _rts(ac[None], None, "sum", True, False, cdt)[0]
    if a.ndim == 2:
        return _sat2d(ac[None], out_dtype)[0]
    return torch.cumsum(_sat2d(ac, out_dtype), dim=0)
