"""Triton pair-sum kernels of the bandwidth selectors (CUDA; CPU tensors under ``TRITON_INTERPRET=1``).

Same contracts as :mod:`densitas.kde._torch`. Documents 000/003: the O(n²) double sums run over B×B tiles of
the upper triangle only, never storing a pair value; each tile sum is a float32 tree reduction, added to a
float64 accumulator per program.

Scheduling generalises document 003's one-dimensional numbering of the triangle's tiles: row block ``I`` has
live column blocks ``I … band[I]`` (the whole row for the d-dimensional sums; for the sorted 1-D sums the band
stops where every pair is below the caller's cutoff). The live tiles are numbered row by row; program ``p``
takes the ``G`` consecutive tiles from ``p·G``, starting at a (row, column) the host computes exactly with
integer arithmetic (no floating-point square root to guard), so the work is balanced whatever the band shape.

Exponentials are ``exp2`` (the special-function unit's native operation): ``exp(−u²/2) = 2^(−u²·log₂e/2)``
with the 1-D data arriving as ``x/g``, so that the Hermite coefficients stay exact integers (pre-scaling them
by powers of 2 ln 2 left a systematic 1e-7 error that the cancelling Ψ̂₆ sum amplified ~200×); the Gaussian
coefficients ``a`` arrive multiplied by ``log₂e``. With ``CHAIN`` (``a`` an arithmetic progression) the K
exponentials per pair become two exponentials and K products: ``exp(−a_k Y) = exp(−a_0 Y) · exp(−Δ Y)^k``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import triton
import triton.language as tl

from densitas._backend.dispatch import interpret_mode
from densitas.kde import _cuda

_INTERP = interpret_mode()

HERMITE_BLOCK = 16 if _INTERP else 128
HERMITE_WARPS = 2  # tune_kde.py on an H200: 893 G pairs/s (4 warps: 805, 8 warps: 540)
GAUSS_BLOCK = 16 if _INTERP else 64  # tl.dot needs at least 16
GAUSS_BLOCK_K1 = 16 if _INTERP else 128  # one exponential per pair: larger tiles pay (tune_kde.py)
GAUSS_WARPS = 4
GAUSS_PRECISION = "ieee" if _INTERP else "tf32x3"
FAST_EXP2 = not _INTERP
PROGS_PER_SM = 8
LOG2E = 1.0 / math.log(2.0)


def _num_programs(device: torch.device, per_sm: int = PROGS_PER_SM) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count * per_sm
    return 4


def _schedule(band: np.ndarray, device: torch.device, progs_per_sm: int = PROGS_PER_SM
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int, int]:
    """Split the live tiles (row ``I``: columns ``I … band[I]``) into equal runs, one per program."""
    T = band.shape[0]
    widths = band.astype(np.int64) - np.arange(T) + 1
    ends = np.cumsum(widths)
    total = int(ends[-1]) if T else 0
    progs = max(1, min(total, _num_programs(device, progs_per_sm)))
    per = -(-total // progs) if total else 1
    progs = max(1, -(-total // per)) if total else 1
    starts = np.arange(progs, dtype=np.int64) * per
    rows = np.searchsorted(ends, starts, side="right")
    rows = np.minimum(rows, T - 1)
    cols = rows + (starts - (ends[rows] - widths[rows]))
    to = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).to(device)
    return to(band), to(rows), to(cols), total, per, progs


@triton.jit
def _next_tile(I, J, band_end, band_ptr, T):
    """The next live tile in row-major order of the band: (row, column, last column of the row)."""
    J += 1
    if J > band_end:
        I += 1
        J = I
        band_end = tl.load(band_ptr + I, mask=I < T, other=0)
    return I, J, band_end


@triton.jit
def _exp2(x, FAST: tl.constexpr):
    if FAST:  # the special-function unit's instruction, flushing denormals (not available in the interpreter)
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.exp2(x)


@triton.jit
def _hermite_tile(xi, xj, coef_ptr, NC: tl.constexpr, B: tl.constexpr, FAST: tl.constexpr):
    u = xj[None, :] - xi[:, None]
    s = u * u
    # He_r's coefficients are integers, exact in float32; only log₂e/2 rounds (once, in the exponent)
    p = tl.zeros([B, B], tl.float32) + tl.load(coef_ptr + NC - 1)
    for m in tl.static_range(NC - 1):
        p = p * s + tl.load(coef_ptr + NC - 2 - m)
    return p * _exp2(s * -0.7213475204444817, FAST)


@triton.jit
def _hermite_kernel(x_ptr, w_ptr, coef_ptr, band_ptr, si_ptr, sj_ptr, jmax_ptr, out_ptr, n, T, L, G,
                    NC: tl.constexpr, WEIGHTED: tl.constexpr, SKIP: tl.constexpr, B: tl.constexpr,
                    FAST: tl.constexpr):
    pid = tl.program_id(0)
    I = tl.load(si_ptr + pid)
    J = tl.load(sj_ptr + pid)
    band_end = tl.load(band_ptr + I)
    acc = tl.zeros([1], tl.float64)
    lanes = tl.arange(0, B)
    first = pid * G
    t = 0
    # while, not range(): Triton 3.6's interpreter cannot iterate a runtime bound under NumPy >= 2.4
    while (t < G) & (first + t < L):
        ri = I * B + lanes
        cj = J * B + lanes
        if SKIP:  # the schedule covers the whole triangle; tiles beyond the last row's cutoff hold no live pair
            live = J * B <= tl.load(jmax_ptr + tl.minimum(I * B + B - 1, n - 1))
        else:
            live = J >= 0
        if live:
            if (J > I) & ((J + 1) * B <= n):  # interior tile: every pair is live, no masks
                xi = tl.load(x_ptr + ri)
                xj = tl.load(x_ptr + cj)
                val = _hermite_tile(xi, xj, coef_ptr, NC, B, FAST)
                if WEIGHTED:
                    val = val * tl.load(w_ptr + ri)[:, None] * tl.load(w_ptr + cj)[None, :]
                acc += tl.sum(tl.sum(val, axis=1).to(tl.float64), axis=0)
            else:
                mi = ri < n
                mj = cj < n
                xi = tl.load(x_ptr + ri, mask=mi, other=0.0)
                xj = tl.load(x_ptr + cj, mask=mj, other=0.0)
                val = _hermite_tile(xi, xj, coef_ptr, NC, B, FAST)
                if WEIGHTED:
                    wi = tl.load(w_ptr + ri, mask=mi, other=0.0)
                    wj = tl.load(w_ptr + cj, mask=mj, other=0.0)
                    val = val * wi[:, None] * wj[None, :]
                valid = (cj[None, :] > ri[:, None]) & mj[None, :]
                val = tl.where(valid, val, 0.0)
                acc += tl.sum(tl.sum(val, axis=1).to(tl.float64), axis=0)
        I, J, band_end = _next_tile(I, J, band_end, band_ptr, T)
        t += 1
    tl.store(out_ptr + pid + tl.arange(0, 1), acc)


def hermite_pairsum(x: torch.Tensor, w: torch.Tensor | None, scale: float, coefs: list[float],
                    jmax: torch.Tensor | None) -> float:
    n = x.shape[0]
    if n < 2:
        return 0.0
    B = HERMITE_BLOCK
    xs = (x.to(torch.float64) * scale).to(torch.float32).contiguous()  # u = x_j − x_i directly
    cf = torch.tensor(coefs, dtype=torch.float32, device=x.device)
    T = triton.cdiv(n, B)
    skip = jmax is not None and n <= DEVICE_CUTOFF_MAX_N
    if jmax is None or skip:  # the whole triangle's schedule, cached: no read-back of the cutoffs
        band_t, si, sj, total, per, progs = _full_schedule(T, x.device)
    else:  # a band schedule balances the live tiles when pruning removes many of a large sample's pairs
        last_rows = np.minimum((np.arange(T) + 1) * B, n) - 1
        band = jmax.cpu().numpy()[last_rows] // B
        band = np.maximum(band, np.arange(T))
        band_t, si, sj, total, per, progs = _schedule(band, x.device)
    out = torch.empty(progs, dtype=torch.float64, device=x.device)
    wf = xs if w is None else w.to(torch.float32).contiguous()
    jm = jmax.to(torch.int32).contiguous() if skip else si
    _hermite_kernel[(progs,)](xs, wf, cf, band_t, si, sj, jm, out, n, T, total, per, NC=len(coefs),
                              WEIGHTED=w is not None, SKIP=skip, B=B, FAST=FAST_EXP2, num_warps=HERMITE_WARPS)
    return float(out.sum())


DEVICE_CUTOFF_MAX_N = 1 << 17  # up to here the cutoffs stay on the device (tiles beyond them are skipped)
_FULL_SCHEDULES: dict[tuple[int, str], tuple] = {}


def _full_schedule(T: int, device: torch.device) -> tuple:
    key = (T, str(device))
    if key not in _FULL_SCHEDULES:
        if len(_FULL_SCHEDULES) >= 8:
            _FULL_SCHEDULES.pop(next(iter(_FULL_SCHEDULES)))
        _FULL_SCHEDULES[key] = _schedule(np.full(T, T - 1, dtype=np.int64), device)
    return _FULL_SCHEDULES[key]


@triton.jit
def _tile_sqdist(z_ptr, nrm_ptr, I, J, n, B: tl.constexpr, DP: tl.constexpr, PREC: tl.constexpr):
    """Rows, columns, their masks, the two blocks of points and ``Y_ij = ‖z_i − z_j‖²`` of tile (I, J):
    ``‖z_i‖² + ‖z_j‖² − 2 z_i·z_j`` on the tensor cores (3xTF32: float32 accuracy; the data are centred)."""
    lanes = tl.arange(0, B)
    dims = tl.arange(0, DP)
    ri = I * B + lanes
    cj = J * B + lanes
    mi = ri < n
    mj = cj < n
    zi = tl.load(z_ptr + ri[:, None] * DP + dims[None, :], mask=mi[:, None], other=0.0)
    zj = tl.load(z_ptr + cj[:, None] * DP + dims[None, :], mask=mj[:, None], other=0.0)
    ni = tl.load(nrm_ptr + ri, mask=mi, other=0.0)
    nj = tl.load(nrm_ptr + cj, mask=mj, other=0.0)
    y = ni[:, None] + nj[None, :] - 2.0 * tl.dot(zi, tl.trans(zj), input_precision=PREC)
    return ri, cj, mi, mj, zi, zj, tl.maximum(y, 0.0)


@triton.jit
def _gauss_kernel(z_ptr, nrm_ptr, w_ptr, a_ptr, band_ptr, si_ptr, sj_ptr, out_ptr, n, T, L, G,
                  K: tl.constexpr, KP: tl.constexpr, DP: tl.constexpr, CHAIN: tl.constexpr,
                  WEIGHTED: tl.constexpr, PREC: tl.constexpr, B: tl.constexpr, FAST: tl.constexpr):
    pid = tl.program_id(0)
    I = tl.load(si_ptr + pid)
    J = tl.load(sj_ptr + pid)
    band_end = tl.load(band_ptr + I)
    kk = tl.arange(0, KP)
    acc1 = tl.zeros([KP], tl.float64)
    acc2 = tl.zeros([KP], tl.float64)
    tl.arange(0, B)
    tl.arange(0, DP)
    first = pid * G
    t = 0
    while (t < G) & (first + t < L):
        ri, cj, mi, mj, _zi, _zj, y = _tile_sqdist(z_ptr, nrm_ptr, I, J, n, B, DP, PREC)
        interior = (J > I) & ((J + 1) * B <= n)
        if WEIGHTED:
            wi = tl.load(w_ptr + ri, mask=mi, other=0.0)
            wj = tl.load(w_ptr + cj, mask=mj, other=0.0)
            wt = wi[:, None] * wj[None, :]
        if not interior:  # an infinite distance makes every exp vanish: masks the lower triangle and padding
            y = tl.where((cj[None, :] > ri[:, None]) & mj[None, :], y, float("inf"))
        if CHAIN:
            a0 = tl.load(a_ptr)
            e = _exp2(-a0 * y, FAST)
            r = _exp2(-(tl.load(a_ptr + 1) - a0) * y, FAST)
        for k in tl.static_range(K):
            if CHAIN:
                if k > 0:
                    e = e * r
            else:
                e = _exp2(-tl.load(a_ptr + k) * y, FAST)
            if WEIGHTED:
                we = wt * e
                s1 = tl.sum(tl.sum(we, axis=1).to(tl.float64), axis=0)
                s2 = tl.sum(tl.sum(we * e, axis=1).to(tl.float64), axis=0)
            else:
                s1 = tl.sum(tl.sum(e, axis=1).to(tl.float64), axis=0)
                s2 = tl.sum(tl.sum(e * e, axis=1).to(tl.float64), axis=0)
            acc1 = tl.where(kk == k, acc1 + s1, acc1)
            acc2 = tl.where(kk == k, acc2 + s2, acc2)
        I, J, band_end = _next_tile(I, J, band_end, band_ptr, T)
        t += 1
    tl.store(out_ptr + pid * 2 * KP + kk, acc1)
    tl.store(out_ptr + pid * 2 * KP + KP + kk, acc2)


_PREPARED: dict[tuple, tuple] = {}


def _prepared(z: torch.Tensor, w: torch.Tensor | None, B: int) -> tuple:
    """Padded float32 points, norms, weights and schedule; the selectors call repeatedly with the same ``z``, so
    the last few preparations are kept (keyed on storage and version: an in-place change invalidates them)."""
    key = (z.data_ptr(), z._version, tuple(z.shape), str(z.device), z.dtype,
           None if w is None else (w.data_ptr(), w._version), B)
    hit = _PREPARED.get(key)
    if hit is not None:
        return hit[:4]
    n, d = z.shape
    dp = max(16, triton.next_power_of_2(d))
    zc = z.to(torch.float64)
    zc = zc - zc.mean(0)  # centred: smaller norms, less cancellation in the expansion
    zp = torch.zeros(n, dp, dtype=torch.float32, device=z.device)
    zp[:, :d] = zc.to(torch.float32)
    nrm = (zp.to(torch.float64) ** 2).sum(1).to(torch.float32)  # norms of the rounded points: y(i, i) = 0
    wf = zp if w is None else w.to(torch.float32).contiguous()
    T = triton.cdiv(n, B)
    sched = _schedule(np.full(T, T - 1, dtype=np.int64), z.device)
    if len(_PREPARED) >= 4:
        _PREPARED.pop(next(iter(_PREPARED)))
    _PREPARED[key] = hit = (zp, nrm, wf, sched, z)  # holding z keeps its storage (and data_ptr) alive
    return hit[:4]


def gauss_pairsum(z: torch.Tensor, w: torch.Tensor | None, a: torch.Tensor, chain: bool) -> torch.Tensor:
    n = z.shape[0]
    K = a.shape[0]
    if n < 2 or K == 0:
        return torch.zeros(K, 2, dtype=torch.float64, device=z.device)
    B = GAUSS_BLOCK_K1 if K == 1 else GAUSS_BLOCK
    zp, nrm, wf, (band_t, si, sj, total, per, progs) = _prepared(z, w, B)
    af = (a.to(torch.float64) * LOG2E).to(device=z.device, dtype=torch.float32)
    T = triton.cdiv(n, B)
    KP = triton.next_power_of_2(K)
    out = torch.empty(progs, 2, KP, dtype=torch.float64, device=z.device)
    _gauss_kernel[(progs,)](zp, nrm, wf, af, band_t, si, sj, out, n, T, total, per, K=K, KP=KP, DP=zp.shape[1],
                            CHAIN=bool(chain) and K > 1, WEIGHTED=w is not None, PREC=GAUSS_PRECISION, B=B,
                            FAST=FAST_EXP2, num_warps=GAUSS_WARPS)
    return out.sum(0)[:, :K].T.contiguous()


@triton.jit
def _grad_moments(e, zi, zj, PREC: tl.constexpr):
    """Σ_{i<j} e_ij and Σ_{i<j} e_ij (z_i − z_j)(z_i − z_j)ᵀ of one tile, on the tensor cores:
    ``Z_Iᵀ diag(rowsum) Z_I + Z_Jᵀ diag(colsum) Z_J − C − Cᵀ`` with ``C = Z_Iᵀ E Z_J``."""
    rs = tl.sum(e, axis=1)
    cs = tl.sum(e, axis=0)
    a = tl.dot(tl.trans(zi * rs[:, None]), zi, input_precision=PREC)
    a = tl.dot(tl.trans(zj * cs[:, None]), zj, a, input_precision=PREC)
    c = tl.dot(tl.trans(zi), tl.dot(e, zj, input_precision=PREC), input_precision=PREC)
    return tl.sum(rs.to(tl.float64), axis=0), (a - c - tl.trans(c)).to(tl.float64)


@triton.jit
def _gauss_grad_kernel(z_ptr, nrm_ptr, w_ptr, band_ptr, si_ptr, sj_ptr, outs_ptr, outm_ptr, n, T, L, G,
                       DP: tl.constexpr, WEIGHTED: tl.constexpr, PREC: tl.constexpr, B: tl.constexpr,
                       FAST: tl.constexpr):
    pid = tl.program_id(0)
    I = tl.load(si_ptr + pid)
    J = tl.load(sj_ptr + pid)
    band_end = tl.load(band_ptr + I)
    tl.arange(0, B)
    dims = tl.arange(0, DP)
    s1 = tl.zeros([1], tl.float64)
    s2 = tl.zeros([1], tl.float64)
    m1 = tl.zeros([DP, DP], tl.float64)
    m2 = tl.zeros([DP, DP], tl.float64)
    first = pid * G
    t = 0
    while (t < G) & (first + t < L):
        ri, cj, mi, mj, zi, zj, y = _tile_sqdist(z_ptr, nrm_ptr, I, J, n, B, DP, PREC)
        y = tl.where((cj[None, :] > ri[:, None]) & mj[None, :], y, float("inf"))  # upper triangle only
        q = _exp2(y * -0.36067376022224085, FAST)  # exp(−Y/4): 0.25·log₂e
        if WEIGHTED:
            wi = tl.load(w_ptr + ri, mask=mi, other=0.0)
            wj = tl.load(w_ptr + cj, mask=mj, other=0.0)
            e1 = q * wi[:, None] * wj[None, :]
        else:
            e1 = q
        e2 = e1 * q
        a1, b1 = _grad_moments(e1, zi, zj, PREC)
        a2, b2 = _grad_moments(e2, zi, zj, PREC)
        s1 += a1
        s2 += a2
        m1 += b1
        m2 += b2
        I, J, band_end = _next_tile(I, J, band_end, band_ptr, T)
        t += 1
    tl.store(outs_ptr + pid * 2 + tl.arange(0, 1), s1)
    tl.store(outs_ptr + pid * 2 + 1 + tl.arange(0, 1), s2)
    offs = dims[:, None] * DP + dims[None, :]
    tl.store(outm_ptr + pid * 2 * DP * DP + offs, m1)
    tl.store(outm_ptr + pid * 2 * DP * DP + DP * DP + offs, m2)


GRAD_BLOCK = 16 if _INTERP else 64


def gauss_pairsum_grad(z: torch.Tensor, w: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`densitas.kde._torch.gauss_pairsum_grad` (same contract): the sums and the
    second moments of every tile come from four small matrix products, so a BFGS step of LSCV(H) costs one
    launch and one (2 + 2d²)-number read-back."""
    n, d = z.shape
    if n < 2:
        return (torch.zeros(2, dtype=torch.float64, device=z.device),
                torch.zeros(2, d, d, dtype=torch.float64, device=z.device))
    B = GRAD_BLOCK
    zp, nrm, wf, (band_t, si, sj, total, per, progs) = _prepared(z, w, B)
    dp = zp.shape[1]
    T = triton.cdiv(n, B)
    outs = torch.empty(progs, 2, dtype=torch.float64, device=z.device)
    outm = torch.empty(progs, 2, dp, dp, dtype=torch.float64, device=z.device)
    _gauss_grad_kernel[(progs,)](zp, nrm, wf, band_t, si, sj, outs, outm, n, T, total, per, DP=dp,
                                 WEIGHTED=w is not None, PREC=GAUSS_PRECISION, B=B, FAST=FAST_EXP2,
                                 num_warps=GAUSS_WARPS)
    # _prepared centres z; the moments of differences do not depend on the centre
    return outs.sum(0), outm.sum(0)[:, :d, :d].contiguous()


@triton.jit
def _pairhist_kernel(z_ptr, nrm_ptr, w_ptr, band_ptr, si_ptr, sj_ptr, hist_ptr, n, T, L, G, u_lo, inv_rho, rho,
                     y_floor, NB, DP: tl.constexpr, WEIGHTED: tl.constexpr, PREC: tl.constexpr, B: tl.constexpr):
    """Each program scatters its tiles' pairs into its own copy of the histogram (no contention between
    programs; the copies are summed afterwards)."""
    pid = tl.program_id(0)
    I = tl.load(si_ptr + pid)
    J = tl.load(sj_ptr + pid)
    band_end = tl.load(band_ptr + I)
    tl.arange(0, B)
    tl.arange(0, DP)
    base = hist_ptr + pid.to(tl.int64) * (NB + 1) * 4
    first = pid * G
    t = 0
    while (t < G) & (first + t < L):
        ri, cj, mi, mj, _zi, _zj, y = _tile_sqdist(z_ptr, nrm_ptr, I, J, n, B, DP, PREC)
        valid = (cj[None, :] > ri[:, None]) & mj[None, :]
        under = y < y_floor
        u = tl.log2(tl.maximum(y, y_floor))
        b = tl.minimum(tl.maximum(tl.floor((u - u_lo) * inv_rho), 0.0), NB - 1.0)
        yc = tl.exp2(u_lo + (b + 0.5) * rho)
        delta = tl.where(under, y, y / yc - 1.0)
        idx = tl.where(under, 0, b.to(tl.int32) + 1)
        if WEIGHTED:
            wi = tl.load(w_ptr + ri, mask=mi, other=0.0)
            wj = tl.load(w_ptr + cj, mask=mj, other=0.0)
            wt = wi[:, None] * wj[None, :]
        else:
            wt = tl.full([B, B], 1.0, tl.float32)
        ptr = base + idx * 4
        tl.atomic_add(ptr, wt, mask=valid, sem="relaxed")
        tl.atomic_add(ptr + 1, wt * delta, mask=valid, sem="relaxed")
        tl.atomic_add(ptr + 2, wt * delta * delta, mask=valid, sem="relaxed")
        tl.atomic_add(ptr + 3, wt * delta * delta * delta, mask=valid, sem="relaxed")
        I, J, band_end = _next_tile(I, J, band_end, band_ptr, T)
        t += 1


PAIRHIST_BLOCK = 16 if _INTERP else 64
PAIRHIST_PROGS_PER_SM = 2  # private histogram copies: few enough to stay in L2


def pair_histogram(z: torch.Tensor, w: torch.Tensor | None, grid) -> torch.Tensor:
    """Triton version of :func:`densitas.kde.pairhist.pair_histogram_torch` (same contract; float32 pair
    distances as in :func:`gauss_pairsum`, moments summed over the programs' copies in float64). On CUDA with
    CuPy installed the shared-memory kernel of :mod:`densitas.kde._cuda` runs instead where it takes the grid."""
    if _cuda.takes(z, w, grid):
        return _cuda.pair_histogram(z, w, grid)
    n = z.shape[0]
    out = torch.zeros(grid.bins + 1, 4, dtype=torch.float64, device=z.device)
    if n < 2:
        return out
    B = PAIRHIST_BLOCK
    zp, nrm, wf, _ = _prepared(z, w, B)
    T = triton.cdiv(n, B)
    band_t, si, sj, total, per, progs = _schedule(np.full(T, T - 1, dtype=np.int64), z.device,
                                                  PAIRHIST_PROGS_PER_SM)
    hist = torch.zeros(progs, grid.bins + 1, 4, dtype=torch.float32, device=z.device)
    _pairhist_kernel[(progs,)](zp, nrm, wf, band_t, si, sj, hist, n, T, total, per, grid.u_lo,
                               1.0 / grid.rho, grid.rho, grid.y_floor, grid.bins, DP=zp.shape[1],
                               WEIGHTED=w is not None, PREC=GAUSS_PRECISION, B=B, num_warps=GAUSS_WARPS)
    return hist.sum(0, dtype=torch.float64)


# ------------------------------------------------------------------- LSCV_h search on the pair histogram


@triton.jit
def _bin_sums(m_ptr, c_ptr, a, NB, dm, y_floor, qu, PB: tl.constexpr, BB: tl.constexpr):
    """``S(a)`` and its error bound (:meth:`densitas.kde.pairhist.PairHistogram.sums`, with the rounding unit
    ``qu`` of the moments) for the ``PB`` values of ``a``; blocks of bins without a pair are skipped."""
    s = tl.zeros([PB], tl.float64)
    bound = tl.zeros([PB], tl.float64)
    b0 = 0
    while b0 < NB:  # (a while loop: the interpreter cannot range over a runtime bound)
        bins = b0 + tl.arange(0, BB)
        live = bins < NB
        m0 = tl.load(m_ptr + (bins + 1) * 4, mask=live, other=0.0)
        if tl.max(m0, axis=0) > 0.0:
            m1 = tl.load(m_ptr + (bins + 1) * 4 + 1, mask=live, other=0.0)
            m2 = tl.load(m_ptr + (bins + 1) * 4 + 2, mask=live, other=0.0)
            m3 = tl.load(m_ptr + (bins + 1) * 4 + 3, mask=live, other=0.0)
            yc = tl.load(c_ptr + bins, mask=live, other=0.0)
            x = a[:, None] * yc[None, :]
            poly = m0[None, :] - x * m1[None, :] + x * x * 0.5 * m2[None, :] - x * x * x * (1.0 / 6.0) * m3[None, :]
            e = tl.exp(-x)
            s += tl.sum(e * poly, axis=1)
            xb = x * dm  # e^{−x(1 − δ)} = e^{−x} e^{xδ} in float32 (a bound needs no more); where xδ > 80, e^{−x}
            grow = tl.exp(tl.minimum(xb, 80.0).to(tl.float32)).to(tl.float64)  # is 0 in float64 anyway
            per_pair = (xb * xb) * (xb * xb) * (1.0 / 24.0) + (x + x * xb + x * xb * xb) * qu
            bound += tl.sum(e * grow * per_pair * m0[None, :], axis=1)
        b0 += BB
    u0 = tl.load(m_ptr)
    u1 = tl.load(m_ptr + 1)
    u2 = tl.load(m_ptr + 2)
    u3 = tl.load(m_ptr + 3)
    s += u0 - a * u1 + a * a * 0.5 * u2 - a * a * a * (1.0 / 6.0) * u3
    af = a * y_floor
    bound += u0 * (af * af) * (af * af) * (1.0 / 24.0)
    return s, bound


@triton.jit
def _lscv_stage_kernel(m_ptr, c_ptr, prev_ptr, out_ptr, par_ptr, NB, P: tl.constexpr, PB: tl.constexpr,
                       BB: tl.constexpr, FIRST: tl.constexpr):
    """One grid of the search: ``P`` values of log h, ``PB`` per program. The grid spans the neighbours of the
    previous grid's minimum (read from ``prev_ptr``: its log h and values), or the search range for the first.
    Writes log h, LSCV and the trusted flag of its values to ``out_ptr`` (3, P). The constants arrive as a float64
    tensor (``par_ptr``, see :func:`lscv_grid_search`): Python floats would reach the kernel as float32."""
    pid = tl.program_id(0)
    dm = tl.load(par_ptr + 2)
    y_floor = tl.load(par_ptr + 3)
    d = tl.load(par_ptr + 4)
    half_logdet = tl.load(par_ptr + 5)
    k2 = tl.load(par_ptr + 6)
    k1 = tl.load(par_ptr + 7)
    n = tl.load(par_ptr + 8)
    sw2 = tl.load(par_ptr + 9)
    sww1 = tl.load(par_ptr + 10)
    trust = tl.load(par_ptr + 11)
    qu = tl.load(par_ptr + 12)
    if FIRST:
        lo = tl.load(par_ptr)
        hi = tl.load(par_ptr + 1)
    else:
        pts = tl.arange(0, P)
        plog = tl.load(prev_ptr + pts)
        pval = tl.load(prev_ptr + P + pts)
        pval = tl.where(pval == pval, pval, float("inf"))
        k = tl.argmin(pval, axis=0)
        lo = tl.sum(tl.where(pts == tl.maximum(k - 1, 0), plog, 0.0), axis=0)
        hi = tl.sum(tl.where(pts == tl.minimum(k + 1, P - 1), plog, 0.0), axis=0)
    p = pid * PB + tl.arange(0, PB)
    log_h = lo + (hi - lo) * (p.to(tl.float64) / (P - 1))
    h = tl.exp(log_h)
    a = 1.0 / (4.0 * h * h)
    s1, b1 = _bin_sums(m_ptr, c_ptr, a, NB, dm, y_floor, qu, PB, BB)
    s2, b2 = _bin_sums(m_ptr, c_ptr, 2.0 * a, NB, dm, y_floor, qu, PB, BB)
    hdet_inv = tl.exp(-d * log_h - half_logdet)
    c2 = k2 * hdet_inv  # (4π)^(−d/2) |H|^(−1/2)
    c1 = k1 * hdet_inv  # (2π)^(−d/2) |H|^(−1/2)
    pos = c2 * (sw2 + 2.0 * s1) / (n * n)
    vals = pos - 2.0 * c1 * (sww1 + 2.0 * s2) / (n * (n - 1.0))
    err = tl.abs(2.0 * c2 * b1 / (n * n) + 4.0 * c1 * b2 / (n * (n - 1.0)))
    tl.store(out_ptr + p, log_h)
    tl.store(out_ptr + P + p, vals)
    tl.store(out_ptr + 2 * P + p, tl.where(err <= trust * pos, 1.0, 0.0))


@triton.jit
def _lscv_pick_kernel(first_ptr, last_ptr, out_ptr, P: tl.constexpr):
    """``h``, LSCV, at-edge (the first grid's minimum is one of its ends) and trusted, at the last grid's
    minimum."""
    pts = tl.arange(0, P)
    v0 = tl.load(first_ptr + P + pts)
    k0 = tl.argmin(tl.where(v0 == v0, v0, float("inf")), axis=0)
    v = tl.load(last_ptr + P + pts)
    k = tl.argmin(tl.where(v == v, v, float("inf")), axis=0)
    at = pts == k
    tl.store(out_ptr, tl.exp(tl.sum(tl.where(at, tl.load(last_ptr + pts), 0.0), axis=0)))
    tl.store(out_ptr + 1, tl.sum(tl.where(at, v, 0.0), axis=0))
    tl.store(out_ptr + 2, tl.where((k0 == 0) | (k0 == P - 1), 1.0, 0.0))
    tl.store(out_ptr + 3, tl.sum(tl.where(at, tl.load(last_ptr + 2 * P + pts), 0.0), axis=0))


SEARCH_PER_PROGRAM = 64 if _INTERP else 1  # the interpreter pays per operation, not per element
SEARCH_BIN_BLOCK = 1024 if _INTERP else 256  # on an H200: 0.17 ms for three grids (PB 4, BB 128: 0.28)


def lscv_grid_search(hist, lo: float, hi: float, const, points: int, stages: int) -> torch.Tensor:
    """Triton version of :func:`densitas.kde.pairhist.lscv_grid_search_torch`: one launch per grid (each finds
    the previous grid's minimum itself) and one to pick the result; nothing is read back in between."""
    m = hist.moments.contiguous()
    centres = hist.grid.centres(m.device)
    P = triton.next_power_of_2(points)
    if P != points:
        raise ValueError(f"The 'points' parameter of lscv_grid_search must be a power of two. Got {points} instead.")
    grids = torch.empty(stages, 3, P, dtype=torch.float64, device=m.device)
    PB = min(SEARCH_PER_PROGRAM, P)
    params = torch.tensor([math.log(lo), math.log(hi), hist.grid.delta_max, hist.grid.y_floor, float(const.d),
                           0.5 * const.logdet_s, (4.0 * math.pi) ** (-0.5 * const.d),
                           (2.0 * math.pi) ** (-0.5 * const.d), const.n, const.sw2, const.sww1, _trust_rtol(),
                           hist.quantum], dtype=torch.float64).to(m.device, non_blocking=True)
    for stage in range(stages):
        _lscv_stage_kernel[(P // PB,)](m, centres, grids[max(stage - 1, 0)], grids[stage], params, hist.grid.bins,
                                       P=P, PB=PB, BB=SEARCH_BIN_BLOCK, FIRST=stage == 0, num_warps=4)
    out = torch.empty(4, dtype=torch.float64, device=m.device)
    _lscv_pick_kernel[(1,)](grids[0], grids[stages - 1], out, P=P, num_warps=4)
    return out


def _trust_rtol() -> float:
    from densitas.kde.pairhist import TRUST_RTOL

    return TRUST_RTOL
