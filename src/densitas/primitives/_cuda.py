"""Privatised shared-memory histograms: CUDA C compiled at run time through NVRTC (CuPy's ``RawKernel``).

Triton has no shared-memory scatter, and global atomics cap the Triton histogram at a few hundred GB/s. Here
each block bins its grid-stride share of the input into its own histogram in shared memory (float32 atomics
for counts, which stay exact below 2²³ per block; float64 for weights and linear binning) and adds it to the
float64 output once. Used by :func:`densitas.primitives._triton.histogram` for 1-D input on CUDA when CuPy
is installed (an optional GPU dependency); the Triton kernel remains the path everywhere else and the test
oracle is the PyTorch reference. The bin rules are the Triton kernel's (``_bin_index``): NumPy's edges for
plain bins, clamped linear weights.
"""

from __future__ import annotations

import numpy as np
import torch

from densitas._backend.device import sm_count
from densitas._backend.nvrtc import available, launch

__all__ = ["MAX_BINS", "MAX_KEYS", "available", "histogram1d", "reduce_by_key"]

MAX_BINS = 6_144  # 48 KiB of float64 shared memory: no opt-in needed
MAX_KEYS = 4_096  # reduce_by_key: a float64 sum and a 32-bit count per key, 48 KiB
THREADS = 512
BLOCKS_PER_SM = 4
MAX_PER_BLOCK = 1 << 23  # float32 counts stay exact

_SOURCE = r"""
template <typename T, typename A>
__device__ void bin_all(const T* __restrict__ x, const T* __restrict__ w, double* __restrict__ out,
                        long long n, double lo, double hi, int nb, int linear, int has_w) {
    extern __shared__ __align__(8) unsigned char raw[];
    A* sh = reinterpret_cast<A*>(raw);
    for (int i = threadIdx.x; i < nb; i += blockDim.x) sh[i] = (A)0;
    __syncthreads();
    const double step = (hi - lo) / nb;
    const double inv = linear ? (nb - 1) / (hi - lo) : nb / (hi - lo);
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const double xv = (double)x[i];
        if (!(xv >= lo && xv <= hi)) continue;
        const A wv = has_w ? (A)w[i] : (A)1;
        if (linear) {
            const double t = (xv - lo) * inv;
            const int k = (int)fmin(fmax(floor(t), 0.0), (double)(nb - 2));
            const A f = (A)fmin(fmax(t - k, 0.0), 1.0);
            atomicAdd(&sh[k], wv * ((A)1 - f));
            atomicAdd(&sh[k + 1], wv * f);
        } else {
            int k = (int)floor((xv - lo) * inv);
            k = min(max(k, 0), nb - 1);
            if (xv < lo + k * step) k -= 1;
            const double right = (k + 1 == nb) ? hi : lo + (k + 1) * step;
            if (xv >= right && k != nb - 1) k += 1;
            k = max(k, 0);
            atomicAdd(&sh[k], wv);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nb; i += blockDim.x) {
        const A v = sh[i];
        if (v != (A)0) atomicAdd(&out[i], (double)v);
    }
}

#define HIST(NAME, T, A) \
extern "C" __global__ void NAME(const T* x, const T* w, double* out, long long n, double lo, double hi, int nb, \
                                int linear, int has_w) { bin_all<T, A>(x, w, out, n, lo, hi, nb, linear, has_w); }
HIST(hist_f32_f32, float, float)
HIST(hist_f32_f64, float, double)
HIST(hist_f64_f32, double, float)
HIST(hist_f64_f64, double, double)

template <typename K, typename T>
__device__ void rbk_all(const K* __restrict__ keys, const T* __restrict__ v, double* __restrict__ out,
                        unsigned long long* __restrict__ cnt, long long n, int nk, int count) {
    extern __shared__ __align__(8) unsigned char raw[];
    double* sh = reinterpret_cast<double*>(raw);
    unsigned int* sc = reinterpret_cast<unsigned int*>(sh + nk);
    for (int i = threadIdx.x; i < nk; i += blockDim.x) { sh[i] = 0.0; sc[i] = 0u; }
    __syncthreads();
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const int k = (int)keys[i];
        atomicAdd(&sh[k], (double)v[i]);
        if (count) atomicAdd(&sc[k], 1u);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nk; i += blockDim.x) {
        if (sh[i] != 0.0) atomicAdd(&out[i], sh[i]);
        if (count && sc[i] != 0u) atomicAdd(&cnt[i], (unsigned long long)sc[i]);
    }
}

#define RBK(NAME, K, T) \
extern "C" __global__ void NAME(const K* keys, const T* v, double* out, unsigned long long* cnt, long long n, \
                                int nk, int count) { rbk_all<K, T>(keys, v, out, cnt, n, nk, count); }
RBK(rbk_i32_f32, int, float)
RBK(rbk_i32_f64, int, double)
RBK(rbk_i64_f32, long long, float)
RBK(rbk_i64_f64, long long, double)
"""


def histogram1d(x: torch.Tensor, nb: int, lo: float, hi: float, weights: torch.Tensor | None,
                linear: bool, shared: str | None = None) -> torch.Tensor:
    """(nb,) float64 bin totals of the 1-D CUDA tensor ``x`` (float32 or float64), same rules as the Triton
    kernel: values outside ``[lo, hi]`` (and NaN) are ignored. The shared-memory accumulator is float32 for
    counts (exact) and float64 for weights and linear binning (float64 results), unless ``shared`` says."""
    import cupy

    dt = torch.float32 if x.dtype == torch.float32 else torch.float64
    xc = x.to(dt).contiguous()
    wc = xc if weights is None else weights.to(dt).contiguous()
    out = torch.zeros(nb, dtype=torch.float64, device=x.device)
    n = xc.shape[0]
    if n == 0:
        return out
    blocks = _blocks(x.device, n)
    acc = shared or ("f32" if (weights is None and not linear) else "f64")
    name = f"hist_{'f32' if dt == torch.float32 else 'f64'}_{acc}"
    launch(_SOURCE, name, x.device, (blocks,), (THREADS,),
           (xc, wc, out, cupy.int64(n), cupy.float64(lo), cupy.float64(hi), cupy.int32(nb),
            cupy.int32(int(linear)), cupy.int32(int(weights is not None))), shared_mem=(4 if acc == "f32" else 8) * nb)
    return out


def reduce_by_key(keys: torch.Tensor, values: torch.Tensor, num_keys: int, count: bool
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-key float64 sums of the 1-D CUDA tensor ``values`` (float32 or float64) and, with ``count``, the
    number of rows per key (int64): each block sums its grid-stride share in shared memory (float64 atomics:
    2.1 TB/s of keys and values on an H200, against 0.6 TB/s for global atomics) and adds it once. ``keys``
    (int32 or int64) must already lie in ``[0, num_keys)``, ``num_keys ≤ MAX_KEYS``.

    Examples
    --------
    >>> callable(reduce_by_key)
    True
    """
    kd = "i32" if keys.dtype == torch.int32 else "i64"
    kc = keys.contiguous() if keys.dtype == torch.int32 else keys.to(torch.int64).contiguous()
    vd = "f32" if values.dtype == torch.float32 else "f64"
    vc = values.contiguous() if values.dtype == torch.float32 else values.to(torch.float64).contiguous()
    out = torch.zeros(num_keys, dtype=torch.float64, device=values.device)
    cnt = torch.zeros(num_keys, dtype=torch.int64, device=values.device) if count else None
    n = vc.shape[0]
    if n == 0:
        return out, cnt
    blocks = _blocks(values.device, n)
    launch(_SOURCE, f"rbk_{kd}_{vd}", values.device, (blocks,), (THREADS,),
           (kc, vc, out, cnt, np.int64(n), np.int32(num_keys), np.int32(int(count))), shared_mem=12 * num_keys)
    return out, cnt


def _blocks(device: torch.device, n: int) -> int:
    """Grid size for ``n`` elements: a few blocks per SM, more when a block would exceed ``MAX_PER_BLOCK``."""
    return max(min(sm_count(device) * BLOCKS_PER_SM, -(-n // THREADS)), -(-n // MAX_PER_BLOCK))
