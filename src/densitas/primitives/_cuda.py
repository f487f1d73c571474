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

import torch

from densitas._backend.nvrtc import available, launch

__all__ = ["MAX_BINS", "available", "histogram1d"]

MAX_BINS = 6_144  # 48 KiB of float64 shared memory: no opt-in needed
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
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    blocks = max(min(sms * BLOCKS_PER_SM, -(-n // THREADS)), -(-n // MAX_PER_BLOCK))
    acc = shared or ("f32" if (weights is None and not linear) else "f64")
    name = f"hist_{'f32' if dt == torch.float32 else 'f64'}_{acc}"
    launch(_SOURCE, name, x.device, (blocks,), (THREADS,),
           (xc, wc, out, cupy.int64(n), cupy.float64(lo), cupy.float64(hi), cupy.int32(nb),
            cupy.int32(int(linear)), cupy.int32(int(weights is not None))), shared_mem=(4 if acc == "f32" else 8) * nb)
    return out
