"""One warm launch of each KDE pair-sum kernel, for Nsight Compute (the limiter statements in RESULTS.md).

    ncu --kernel-name regex:_hermite_kernel --launch-skip 1 --launch-count 1 --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --section InstructionStats --section WarpStateStats \
        python benchmarks/profile_kde.py
"""

from __future__ import annotations

import torch

from densitas.kde.pairsum import gauss_sums, hermite_sum

if __name__ == "__main__":
    g = torch.Generator(device="cuda").manual_seed(0)
    xs = torch.sort(torch.randn(1 << 17, generator=g, device="cuda", dtype=torch.float64)).values
    for _ in range(2):
        hermite_sum(xs, None, 0.05, 6, prune=False)
    z = torch.randn(10_240, 16, generator=g, device="cuda", dtype=torch.float64)
    for _ in range(2):
        gauss_sums(z, None, [0.25])
    torch.cuda.synchronize()
