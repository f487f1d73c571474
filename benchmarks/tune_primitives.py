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
    ap.add_argument("--only", default=None, help="comma-separated subset: reduce,scan,compact,linbin,rbk,sat")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None

    def want(name):
        return only is None or name in only

    n = 1 << args.log2n
    x = torch.rand(n, device="cuda")
    ref_sum = float(x.double().sum())
    res = {}
    res["reduce"] = None if not want("reduce") else sweep("reduce", 4 * n, lambda: P.reduce(x),
                          lambda: abs(float(P.reduce(x)) - ref_sum) / ref_sum < 1e-6,
                          [dict(REDUCE_BLOCK=b, REDUCE_WARPS=w, REDUCE_PROGS_PER_SM=p)
                           for b, w, p in itertools.product([2048, 4096, 8192], [4, 8], [2, 4, 8])])
    cs = torch.cumsum(x[: 1 << 20].double(), 0)
    scan_grid = [dict(SCAN_BLOCK=b, SCAN_WARPS=w, LOOKBACK_WINDOW=lw)
                 for b, w, lw in itertools.product([4096, 8192], [2, 4], [4, 8, 16, 32])]
    compact_grid = [dict(COMPACT_BLOCK=c["SCAN_BLOCK"], COMPACT_WARPS=c["SCAN_WARPS"],
                         LOOKBACK_WINDOW=c["LOOKBACK_WINDOW"]) for c in scan_grid]
    res["scan"] = None if not want("scan") else sweep("scan", 8 * n, lambda: P.scan(x),
                        lambda: float((P.scan(x)[: 1 << 20].double() - cs).abs().max()) < 1e-6 * float(cs[-1]),
                        scan_grid)
    m = x < 0.5
    res["compact"] = None if not want("compact") else sweep("compact", 7 * n, lambda: P.compact(x, m),
                           lambda: torch.equal(P.compact(x[: 1 << 22], m[: 1 << 22]), x[: 1 << 22][m[: 1 << 22]]),
                           compact_grid)
    ref_lb = P.histogram(x[: 1 << 22].double(), 4096, (0.0, 1.0), linear=True)[0]
    hist_grid = [dict(HIST_BLOCK=b, HIST_WARPS=w) for b, w in itertools.product([256, 1024, 4096], [4, 8])]
    res["linbin"] = None if not want("linbin") else sweep(
        "linbin", 4 * n, lambda: P.histogram(x, 4096, (0.0, 1.0), linear=True),
                          lambda: float((P.histogram(x[: 1 << 22], 4096, (0.0, 1.0), linear=True)[0] - ref_lb)
                                        .abs().max()) < 1e-3, hist_grid)
    keys = torch.randint(0, 1000, (n,), device="cuda", dtype=torch.int32)
    ref_k = torch.zeros(1000, dtype=torch.float64, device="cuda").index_add_(0, keys[: 1 << 22], x[: 1 << 22].double())
    rbk_grid = [dict(RBK_BLOCK=c["HIST_BLOCK"], RBK_WARPS=c["HIST_WARPS"]) for c in hist_grid]
    res["rbk"] = None if not want("rbk") else sweep("rbk", 8 * n, lambda: P.reduce_by_key(keys, x, num_keys=1000),
                       lambda: float((P.reduce_by_key(keys[: 1 << 22], x[: 1 << 22], num_keys=1000) - ref_k)
                                     .abs().max() / ref_k.abs().max()) < 1e-6, rbk_grid)
    a = torch.rand(16384, 16384, device="cuda")
    res["sat"] = None if not want("sat") else sweep("sat", 8 * a.numel(), lambda: P.summed_area_table(a), lambda: True,
                       [dict(SAT_TILE=s) for s in (32, 64, 128)])
    print("\nSUMMARY")
    for k, v in res.items():
        print(f"{k:8s} {v[0] if v else float('nan'):7.0f} GB/s  {v[1] if v else ''}")


if __name__ == "__main__":
    main()
