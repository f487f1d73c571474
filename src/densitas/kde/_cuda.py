"""The LSCV pair-distance histogram as a privatised shared-memory CUDA kernel (NVRTC through CuPy).

The Triton kernel of :func:`densitas.kde._triton.pair_histogram` scatters into global memory and is bound by
same-address atomics (3.9 ms at n = 10,240, d = 16 on an H200). Here every block keeps its histogram in shared
memory, moment-major so that neighbouring bins fall in different banks, walks its share of the upper triangle in
tiles of 256 rows × 64 columns (one row per thread, the columns' points in shared memory), and writes its copy
once; the copies are summed in float64 afterwards (no global atomics, so the result does not depend on the order
blocks finish).

Bins are aligned to octaves (``u_lo`` an integer, 128 bins per octave), so a pair's bin comes from the exponent
of ``Y`` and the sub-bin from its mantissa, and the relative offset ``δ = Y/Y_b − 1`` is
``((m − c_hi) − c_lo) / c_hi`` with the sub-bin centre ``2^((k + ½)/128)`` split into two floats: ``m − c_hi`` is
exact (Sterbenz), so ``δ`` is accurate to float32 rounding relative to ``δ`` itself. Pair distances are float32
differences of the centred points; moments are float32 within a block (counts exact below 2²⁴ per block, which
the block count guarantees).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from densitas._backend.device import sm_count
from densitas._backend.nvrtc import available, launch, max_shared_bytes

__all__ = ["MAX_DIM", "available", "fits", "moments_from_integers", "pair_histogram", "quantum", "takes"]

ROWS = 256  # threads per block, one row each
COLS = 64  # columns per tile, staged in shared memory
SUB_BINS = 128  # bins per octave this kernel supports
DIMS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # compiled widths; data are zero-padded to the next one
MAX_DIM = DIMS[-1]
MAX_SHARED = 200 * 1024
BLOCKS_PER_SM = 3
MAX_TILES_PER_BLOCK = (1 << 24) // (ROWS * COLS)  # unweighted float path: counts exact
WEIGHTED_TILES_PER_BLOCK = 64  # weighted: at most 2^20 pairs summed in float32 per block, whatever the SM count
WEIGHTED_MAX_ROWS = 1 << 15  # beyond, the per-block copies would grow past ~30 MB
QBITS = 10  # unweighted: δ in units of δ_max / 2^QBITS
FLUSH_TILES = (1 << 30) // ((ROWS * COLS) << QBITS)  # int32 shared sums flushed to int64 well before 2^31

_SOURCE = r"""
#define ROWS 256
#define COLS 64
#define SUB 128

template <int D>
__device__ __forceinline__ float sqdist(const float* zi, const float* zj) {
    float y = 0.f;
    if (D % 4 == 0) {  // a compile-time branch: 16-byte loads of the column's point from shared memory
        const float4* z4 = reinterpret_cast<const float4*>(zj);
#pragma unroll
        for (int q = 0; q < D / 4; ++q) {
            const float4 v = z4[q];
            float df = zi[4 * q] - v.x; y = fmaf(df, df, y);
            df = zi[4 * q + 1] - v.y; y = fmaf(df, df, y);
            df = zi[4 * q + 2] - v.z; y = fmaf(df, df, y);
            df = zi[4 * q + 3] - v.w; y = fmaf(df, df, y);
        }
    } else {
#pragma unroll
        for (int k = 0; k < D; ++k) {
            const float df = zi[k] - zj[k];
            y = fmaf(df, df, y);
        }
    }
    return y;
}

template <int D, bool W>
__device__ void pairhist(const float* __restrict__ z, const float* __restrict__ w, const int* __restrict__ tile_i,
                         const int* __restrict__ tile_j, int tiles, const float* __restrict__ cent,
                         float* __restrict__ copies, long long* __restrict__ qsum, double* __restrict__ raw0, int n,
                         int e_lo, float y_floor, int nb, float qscale, int qbits, int flush_tiles, int scatter) {
    // W (weighted): float32 moments, one copy per block in `copies`. Unweighted: counts and the δ moments as
    // integers (δ in units of δ_max/2^qbits): native integer shared atomics (float ones are compare-and-swap
    // loops), exact and order-independent sums, flushed into the int64 `qsum` every `flush_tiles` tiles before
    // they can overflow; bin 0's raw moments (rare) as floats into `raw0`.
    extern __shared__ __align__(16) float sh[];
    const int nm = nb + 1;
    const int nm4 = ((nm + 3) / 4) * 4;
    float* hf = sh;                        // W: 4 × nm floats, moment-major (neighbouring bins, other banks)
    int* hq = reinterpret_cast<int*>(sh);  // unweighted: 4 × nm ints
    float* zs = sh + 4 * nm4;              // COLS * D, 16-byte aligned
    float* ws = zs + COLS * D;             // COLS
    float* chi = ws + COLS;                // SUB: centres 2^((k + 1/2)/SUB), rounded
    float* clo = chi + SUB;                // SUB: what the rounding left out
    float* rci = clo + SUB;                // SUB: 1 / chi
    float* u0 = rci + SUB;                 // 4: bin 0's raw moments (unweighted path)
    for (int t = threadIdx.x; t < 4 * nm4; t += blockDim.x) sh[t] = 0.f;
    for (int t = threadIdx.x; t < SUB; t += blockDim.x) {
        chi[t] = cent[t]; clo[t] = cent[SUB + t]; rci[t] = cent[2 * SUB + t];
    }
    if (threadIdx.x < 4) u0[threadIdx.x] = 0.f;
    __syncthreads();
    const int half = 1 << (qbits - 1);
    const int qmax = 1 << qbits;
    float sink = 0.f;  // scatter == 0 (a measurement): the same arithmetic without the shared atomics
    int done = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int i = tile_i[t] * ROWS + threadIdx.x;
        const int j0 = tile_j[t] * COLS;
        const bool row_ok = i < n;
        float zi[D];
#pragma unroll
        for (int k = 0; k < D; ++k) zi[k] = row_ok ? z[(long long)i * D + k] : 0.f;
        const float wi = (W && row_ok) ? w[i] : 1.f;
        for (int q = threadIdx.x; q < COLS * D; q += blockDim.x)
            zs[q] = (j0 + q / D < n) ? z[(long long)j0 * D + q] : 0.f;
        if (W)
            for (int q = threadIdx.x; q < COLS; q += blockDim.x) ws[q] = (j0 + q < n) ? w[j0 + q] : 0.f;
        __syncthreads();
        if (row_ok) {
            const int jstart = max(0, i + 1 - j0);
            const int jend = min(COLS, n - j0);
            for (int jj = jstart; jj < jend; ++jj) {
                const float y = sqdist<D>(zi, zs + jj * D);
                const float wt = W ? wi * ws[jj] : 1.f;
                if (y < y_floor) {  // bin 0 keeps raw moments
                    if (!scatter) { sink += y; continue; }
                    if (W) {
                        atomicAdd(&hf[0], wt); atomicAdd(&hf[nm], wt * y);
                        atomicAdd(&hf[2 * nm], wt * y * y); atomicAdd(&hf[3 * nm], wt * y * y * y);
                    } else {
                        atomicAdd(&u0[0], 1.f); atomicAdd(&u0[1], y);
                        atomicAdd(&u0[2], y * y); atomicAdd(&u0[3], y * y * y);
                    }
                    continue;
                }
                // y = m 2^e with m in [1, 2), from the bits (y >= y_floor is a normal float)
                const unsigned bits = __float_as_uint(y);
                const int e = (int)(bits >> 23) - 127;
                float m = __uint_as_float((bits & 0x007fffffu) | 0x3f800000u);
                int k = min(max((int)(__log2f(m) * SUB), 0), SUB - 1);
                int b = (e - e_lo) * SUB + k + 1;
                if (b > nb) {  // beyond y_hi (the caller's bound): kept in the last bin
                    b = nb;
                    k = (nb - 1) % SUB;
                    m = ldexpf(y, -(e_lo + (nb - 1) / SUB));
                }
                const float delta = ((m - chi[k]) - clo[k]) * rci[k];
                if (W) {
                    const float wd = wt * delta;
                    const float wd2 = wd * delta;
                    if (scatter) {
                        atomicAdd(&hf[b], wt); atomicAdd(&hf[nm + b], wd);
                        atomicAdd(&hf[2 * nm + b], wd2); atomicAdd(&hf[3 * nm + b], wd2 * delta);
                    } else {
                        sink += wt + wd + wd2 * delta + (float)b;
                    }
                } else {
                    const int q1 = min(max(__float2int_rn(delta * qscale), -qmax), qmax);
                    const int q2 = (q1 * q1 + half) >> qbits;
                    const int q3 = (q2 * q1 + half) >> qbits;
                    if (scatter) {
                        atomicAdd(&hq[b], 1); atomicAdd(&hq[nm + b], q1);
                        atomicAdd(&hq[2 * nm + b], q2); atomicAdd(&hq[3 * nm + b], q3);
                    } else {
                        sink += (float)(q1 + q2 + q3 + b);
                    }
                }
            }
        }
        __syncthreads();
        if (!W && ++done == flush_tiles) {  // uniform across the block: every thread walks the same tiles
            done = 0;
            for (int q = threadIdx.x; q < 4 * nm; q += blockDim.x) {
                const int v = hq[q];
                if (v != 0) {
                    atomicAdd(reinterpret_cast<unsigned long long*>(&qsum[(q % nm) * 4 + q / nm]),
                              (unsigned long long)(long long)v);
                    hq[q] = 0;
                }
            }
            __syncthreads();
        }
    }
    if (!scatter && threadIdx.x == 0) u0[0] += sink * 1e-30f;
    __syncthreads();
    if (W) {
        float* o = copies + (long long)blockIdx.x * nm * 4;
        for (int t = threadIdx.x; t < nm; t += blockDim.x) {
            o[4 * t] = hf[t]; o[4 * t + 1] = hf[nm + t]; o[4 * t + 2] = hf[2 * nm + t]; o[4 * t + 3] = hf[3 * nm + t];
        }
    } else {
        for (int q = threadIdx.x; q < 4 * nm; q += blockDim.x) {
            const int v = hq[q];
            if (v != 0)
                atomicAdd(reinterpret_cast<unsigned long long*>(&qsum[(q % nm) * 4 + q / nm]),
                          (unsigned long long)(long long)v);
        }
        if (threadIdx.x < 4 && u0[threadIdx.x] != 0.f) atomicAdd(&raw0[threadIdx.x], (double)u0[threadIdx.x]);
    }
}

#define PAIRHIST(D) \
extern "C" __global__ void pairhist_##D(const float* z, const float* w, const int* ti, const int* tj, int tiles, \
                                        const float* cent, float* copies, long long* qsum, double* raw0, int n, \
                                        int e_lo, float y_floor, int nb, float qscale, int qbits, int flush_tiles, \
                                        int scatter) { \
    if (w) pairhist<D, true>(z, w, ti, tj, tiles, cent, copies, qsum, raw0, n, e_lo, y_floor, nb, qscale, qbits, \
                             flush_tiles, scatter); \
    else pairhist<D, false>(z, w, ti, tj, tiles, cent, copies, qsum, raw0, n, e_lo, y_floor, nb, qscale, qbits, \
                            flush_tiles, scatter); \
}
PAIRHIST(1) PAIRHIST(2) PAIRHIST(3) PAIRHIST(4) PAIRHIST(6) PAIRHIST(8) PAIRHIST(12) PAIRHIST(16) PAIRHIST(24)
PAIRHIST(32) PAIRHIST(48) PAIRHIST(64)
"""


def _width(d: int) -> int:
    return next(w for w in DIMS if w >= d)


def _shared_bytes(nb: int, width: int) -> int:
    return 4 * (4 * (-(-(nb + 1) // 4) * 4) + COLS * width + COLS + 3 * SUB_BINS + 4)


def fits(d: int, grid, shared_limit: int = MAX_SHARED) -> bool:
    """Whether this kernel takes ``d`` columns on ``grid`` (octave-aligned with a float32-normal floor, 128 bins per
    octave, the histogram within ``shared_limit`` bytes of shared memory).

    Examples
    --------
    >>> from densitas.kde.pairhist import HistogramGrid
    >>> fits(16, HistogramGrid(-20.0, 1 / 128, 3000)), fits(16, HistogramGrid(-20.5, 1 / 128, 3000))
    (True, False)
    """
    return (d <= MAX_DIM and float(grid.u_lo).is_integer() and -126 <= grid.u_lo <= 100
            and grid.rho == 1.0 / SUB_BINS and _shared_bytes(grid.bins, _width(d)) <= shared_limit)


def takes(z: torch.Tensor, w: torch.Tensor | None, grid) -> bool:
    """Whether :func:`densitas.kde._triton.pair_histogram` hands ``z`` to this kernel: a CUDA tensor, CuPy present,
    the grid within the device's shared memory, and weighted data only up to ``WEIGHTED_MAX_ROWS`` rows (their
    moments are float32 sums per block).

    Examples
    --------
    >>> from densitas.kde.pairhist import HistogramGrid
    >>> takes(torch.zeros(10, 2), None, HistogramGrid(-20.0, 1 / 128, 3000))  # a CPU tensor
    False
    """
    if z.device.type != "cuda" or not available() or (w is not None and z.shape[0] > WEIGHTED_MAX_ROWS):
        return False
    return fits(z.shape[1], grid, min(MAX_SHARED, max_shared_bytes(z.device)))


@functools.cache
def _centres(device: torch.device) -> torch.Tensor:
    """The sub-bin centres ``c = 2^((k + ½)/128)`` as float32 ``(hi, lo)`` pairs and ``1/hi``, one row each."""
    exact = np.exp2((np.arange(SUB_BINS) + 0.5) / SUB_BINS)
    hi = exact.astype(np.float32)
    lo = (exact - hi.astype(np.float64)).astype(np.float32)
    return torch.from_numpy(np.concatenate([hi, lo, (1.0 / hi.astype(np.float64)).astype(np.float32)])).to(device)


_SCHEDULES: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}


def _schedule(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-tile and column-tile index of every tile that holds a pair ``i < j`` (cached per size)."""
    key = (n, str(device))
    if key not in _SCHEDULES:
        row_tiles, col_tiles = -(-n // ROWS), -(-n // COLS)
        ti, tj = [], []
        for r in range(row_tiles):
            first = (r * ROWS) // COLS  # the first column tile reaching past the tile's first row
            ti.extend([r] * (col_tiles - first))
            tj.extend(range(first, col_tiles))
        if len(_SCHEDULES) >= 8:
            _SCHEDULES.pop(next(iter(_SCHEDULES)))
        _SCHEDULES[key] = (torch.tensor(ti, dtype=torch.int32, device=device),
                           torch.tensor(tj, dtype=torch.int32, device=device))
    return _SCHEDULES[key]


def pair_histogram(z: torch.Tensor, w: torch.Tensor | None, grid, *, scatter: bool = True) -> torch.Tensor:
    """(bins + 1, 4) float64 moments of the pairs of the CUDA tensor ``z`` (n, d) on ``grid`` (see :func:`fits`);
    the contract of :func:`densitas.kde.pairhist.pair_histogram_torch`. Unweighted moments are sums of integers
    (``δ`` rounded to ``δ_max / 2^QBITS``: 2.6e-6 at 128 bins per octave, an error far below the truncation
    bound, whose mean is zero); weighted ones float32 per block. ``scatter=False`` (a measurement for the
    benchmarks) does all the arithmetic but not the shared-memory atomics, and returns no histogram.

    Examples
    --------
    >>> callable(pair_histogram)
    True
    """
    n, d = z.shape
    nb = grid.bins
    if n < 2:
        return torch.zeros(nb + 1, 4, dtype=torch.float64, device=z.device)
    width = _width(d)
    zc = torch.zeros(n, width, dtype=torch.float32, device=z.device)
    zd = z.to(torch.float64)
    zc[:, :d] = zd - zd.mean(0)
    ti, tj = _schedule(n, z.device)
    tiles = int(ti.shape[0])
    per_block = MAX_TILES_PER_BLOCK if w is None else WEIGHTED_TILES_PER_BLOCK
    blocks = max(1, min(tiles, sm_count(z.device) * BLOCKS_PER_SM), math.ceil(tiles / per_block))
    unit = quantum(grid)
    if w is None:
        copies = None
        qsum = torch.zeros(nb + 1, 4, dtype=torch.int64, device=z.device)
        raw0 = torch.zeros(4, dtype=torch.float64, device=z.device)
    else:
        copies = torch.empty(blocks, nb + 1, 4, dtype=torch.float32, device=z.device)
        qsum = raw0 = None
        w = w.to(torch.float32).contiguous()
    launch(_SOURCE, f"pairhist_{width}", z.device, (blocks,), (ROWS,),
           (zc, w, ti, tj, np.int32(tiles), _centres(z.device), copies, qsum, raw0, np.int32(n),
            np.int32(int(grid.u_lo)), np.float32(grid.y_floor), np.int32(nb), np.float32(1.0 / unit),
            np.int32(QBITS), np.int32(FLUSH_TILES), np.int32(int(scatter))),
           shared_mem=_shared_bytes(nb, width))
    if w is not None:
        return copies.sum(0, dtype=torch.float64)
    return moments_from_integers(qsum, raw0, grid)


def quantum(grid) -> float:
    """The unit of the integer δ moments: ``δ_max / 2^QBITS`` with a little room for pairs that rounding puts
    just past a bin edge.

    Examples
    --------
    >>> from densitas.kde.pairhist import HistogramGrid
    >>> grid = HistogramGrid(-20.0, 1 / 128, 3000)
    >>> round(quantum(grid) * (1 << QBITS) / grid.delta_max, 6)
    1.001
    """
    return grid.delta_max * (1.0 + 1e-3) / (1 << QBITS)


def moments_from_integers(qsum: torch.Tensor, raw0: torch.Tensor, grid) -> torch.Tensor:
    """The (bins + 1, 4) float64 moments from the kernel's integer sums: per pair the kernel adds 1,
    ``q₁ = round(δ/u)``, ``q₂ = round(q₁²/2^Q)``, ``q₃ = round(q₂q₁/2^Q)`` (``u`` = :func:`quantum`, ``Q`` =
    ``QBITS``), so δ ≈ q₁u, δ² ≈ q₂u²2^Q, δ³ ≈ q₃u³2^{2Q}; bin 0's raw moments arrive as floats.

    Examples
    --------
    >>> from densitas.kde.pairhist import HistogramGrid
    >>> grid = HistogramGrid(-20.0, 1 / 128, 4)
    >>> q = torch.zeros(5, 4, dtype=torch.int64); q[2] = torch.tensor([3, 1024, 1024, 1024])
    >>> m = moments_from_integers(q, torch.zeros(4, dtype=torch.float64), grid)
    >>> round(float(m[2, 1] / quantum(grid)), 6), float(m[2, 0])
    (1024.0, 3.0)
    """
    u = quantum(grid)
    scale = torch.tensor([1.0, u, u * u * (1 << QBITS), u**3 * (1 << (2 * QBITS))], dtype=torch.float64,
                         device=qsum.device)
    out = qsum.to(torch.float64) * scale
    out[0] = raw0
    return out
