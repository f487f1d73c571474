"""Sweep the launch settings of the KDE pair-sum kernels on a GPU (results in RESULTS.md).

    PYTHONPATH=src python benchmarks/tune_kde.py
"""

from __future__ import annotations

import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _timing import bench

from densitas.kde import _triton as K
from densitas.kde.pairsum import gauss_sums, hermite_sum


def main() -> None:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    n = 1 << 18
    xs = torch.sort(torch.randn(n, generator=g, device=dev, dtype=torch.float64)).values
    pairs = n * (n - 1) / 2
    for fast in (False, True):
        K.FAST_EXP2 = fast
        for b, w in ((64, 2), (128, 2), (128, 4), (256, 4), (256, 8)):
            K.HERMITE_BLOCK, K.HERMITE_WARPS = b, w
            t = bench(lambda: hermite_sum(xs, None, 0.05, 6, prune=False), dev)
            print(f"hermite r=6 B={b} warps={w} ex2.approx={fast}: {t * 1e3:.2f} ms  {pairs / t / 1e9:.0f} G pairs/s",
                  flush=True)
    z = torch.randn(100_000, 16, generator=g, device=dev, dtype=torch.float64)
    pairs = 100_000 * 99_999 / 2
    a16 = torch.linspace(0.05, 0.5, 16, dtype=torch.float64)
    for b, w in ((64, 4), (64, 2), (128, 4)):
        K.GAUSS_BLOCK, K.GAUSS_BLOCK_K1, K.GAUSS_WARPS = b, b, w
        t1 = bench(lambda: gauss_sums(z, None, [0.25]), dev)
        t16 = bench(lambda: gauss_sums(z, None, a16, chain=True), dev)
        print(f"gauss d=16 B={b} warps={w}: K=1 {t1 * 1e3:.2f} ms ({pairs / t1 / 1e9:.0f} G pairs/s), "
              f"K=16 chain {t16 * 1e3:.2f} ms", flush=True)


if __name__ == "__main__":
    main()
