"""Sweep launch settings of the primitive kernels on a CUDA device (one run, prints the best of each).

    PYTHONPATH=src python benchmarks/tune_primitives.py [--log2n 30]

The chosen defaults live at the top of ``src/densitas/primitives/_triton.py``.
"""

from __future__ import annotations

import argparse
import itertools

import torch
from triton.testing import do_bench

from densitas import primitives as P
from densitas.primitives import _triton as K


def t(fn):
    return do_bench(fn, warmup=25, rep=150, return_mode="median") / 1e3


def sweep(name, nbytes, fn, check, grid):
    best = None
    for cfg in grid:
        for k, v in cfg.items():
            setattr(K, k, v)
        try:
            sec = t(fn)
            ok = check()
        except Exception as exc:  # a config that does not compile is reported, not fatal
            print(f"{name:10s} {cfg} failed: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        gbs = nbytes / sec / 1e9
        print(f"{name:10s} {cfg} {sec * 1e3:8.3f} ms {gbs:7.0f} GB/s ok={ok}")
        if ok and (best is None or gbs > best[0]):
            best = (gbs, cfg)
    if best:
        for k, v in best[1].items():
            setattr(K, k, v)
    print(f"BEST {name}: {best}")
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log2n", type=int, default=30)
    args = ap.parse_args()
    n = 1 << args.log2n
    x = torch.rand(n, device="cuda")
    ref_sum = float(x.double().sum())
    res = {}
    res["reduce"] = sweep("reduce", 4 * n, lambda: P.reduce(x),
                          lambda: abs(float(P.reduce(x)) - ref_sum) / ref_sum < 1e-6,
                          [dict(REDUCE_BLOCK=b, REDUCE_WARPS=w, REDUCE_PROGS_PER_SM=p)
                           for b, w, p in itertools.product([2048, 4096, 8192], [4, 8], [2, 4, 8])])
    cs = torch.cumsum(x[: 1 << 20].double(), 0)
    scan_grid = [dict(SCAN_BLOCK=b, SCAN_WARPS=w, LOOKBACK_WINDOW=lw)
                 for b, w, lw in itertools.product([2048, 4096, 8192, 16384], [4, 8, 16], [32])
                 if not (b >= 16384 and w == 4)]
    res["scan"] = sweep("scan", 8 * n, lambda: P.scan(x),
                        lambda: float((P.scan(x)[: 1 << 20].double() - cs).abs().max()) < 1e-6 * float(cs[-1]),
                        scan_grid)
    m = x < 0.5
    res["compact"] = sweep("compact", 7 * n, lambda: P.compact(x, m),
                           lambda: torch.equal(P.compact(x[: 1 << 22], m[: 1 << 22]), x[: 1 << 22][m[: 1 << 22]]),
                           scan_grid)
    ref_lb = P.histogram(x[: 1 << 22].double(), 4096, (0.0, 1.0), linear=True)[0]
    hist_grid = [dict(HIST_BLOCK=b, HIST_WARPS=w) for b, w in itertools.product([256, 1024, 4096], [4, 8])]
    res["linbin"] = sweep("linbin", 4 * n, lambda: P.histogram(x, 4096, (0.0, 1.0), linear=True),
                          lambda: float((P.histogram(x[: 1 << 22], 4096, (0.0, 1.0), linear=True)[0] - ref_lb)
                                        .abs().max()) < 1e-3, hist_grid)
    keys = torch.randint(0, 1000, (n,), device="cuda", dtype=torch.int32)
    ref_k = torch.zeros(1000, dtype=torch.float64, device="cuda").index_add_(0, keys[: 1 << 22], x[: 1 << 22].double())
    res["rbk"] = sweep("rbk", 8 * n, lambda: P.reduce_by_key(keys, x, num_keys=1000),
                       lambda: float((P.reduce_by_key(keys[: 1 << 22], x[: 1 << 22], num_keys=1000) - ref_k)
                                     .abs().max() / ref_k.abs().max()) < 1e-6, hist_grid)
    a = torch.rand(16384, 16384, device="cuda")
    res["sat"] = sweep("sat", 8 * a.numel(), lambda: P.summed_area_table(a), lambda: True,
                       [dict(SAT_TILE=s) for s in (32, 64, 128)])
    print("\nSUMMARY")
    for k, v in res.items():
        print(f"{k:8s} {v[0] if v else float('nan'):7.0f} GB/s  {v[1] if v else ''}")


if __name__ == "__main__":
    main()
