"""Bandwidth selection side by side with its peers, in one run.

    PYTHONPATH=src python benchmarks/bench_kde.py                 # CUDA if present (H200 figures of issue 3)
    PYTHONPATH=src python benchmarks/bench_kde.py --device cpu    # this machine: NumPy, statsmodels, KDEpy

CUDA rows: densitas (Triton kernels) against the same selectors on the PyTorch path on the same GPU (chunked
float64 tiles: what a careful user would write), and against document 003's GTX 480 times at the papers' largest
sizes. CPU rows: densitas (PyTorch, float64 tiles) against a plain NumPy O(n²) implementation (the papers'
"sequential" baseline, densitas.testing.kde_reference), statsmodels' KDEMultivariate cv_ls and KDEpy's ISJ/FFTKDE.
"ratio" is peer time / densitas time (> 1: densitas faster); "rel. diff" compares the two answers.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])

from densitas._backend.dispatch import use_backend
from densitas.kde import bandwidth, lscv_objective
from densitas.kde.pairsum import hermite_sum

GTX480_MS = {"plugin": 87.9, "lscv_h": 14.7, "lscv_H": 184.2}  # document 003, Table 3 (largest sizes)


def timed(fn, dev: torch.device, reps: int = 3) -> tuple[float, object]:
    """Median seconds over ``reps`` runs after one warm-up run (``reps=0``: one cold run), and the last result."""
    if reps == 0:
        t0 = time.perf_counter()
        out = fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return time.perf_counter() - t0, out
    out = fn()
    ts = []
    for _ in range(reps):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        out = fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), out


def reldiff(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


ROWS: list[dict] = []


def row(name, t_ours, peer="", t_peer=None, diff=None, note=""):
    ROWS.append(dict(name=name, ours_ms=t_ours * 1e3, peer=peer, peer_ms=None if t_peer is None else t_peer * 1e3,
                     ratio=None if t_peer is None else t_peer / t_ours, diff=diff, note=note))
    print(f"  {name}: {t_ours * 1e3:.2f} ms" + (f"  {peer} {t_peer * 1e3:.1f} ms" if t_peer else "") + f"  {note}",
          flush=True)


def cuda_rows(dev: torch.device, quick: bool) -> None:
    g = torch.Generator(device=dev).manual_seed(0)

    def normal(*shape):
        return torch.randn(*shape, generator=g, device=dev, dtype=torch.float64)

    # --- plug-in, exact --------------------------------------------------------------------------------
    x = normal(30_720)
    t, h = timed(lambda: bandwidth(x, "plugin", engine="exact"), dev, 20)  # milliseconds: a stable median
    with use_backend("torch"):
        tp, hp = timed(lambda: bandwidth(x, "plugin", engine="exact"), dev, 1)
    row("plugin exact n=30,720", t, "torch fp64 tiles", tp, reldiff(h, hp),
        f"GTX 480: {GTX480_MS['plugin']} ms -> {GTX480_MS['plugin'] / (t * 1e3):.0f}x")
    x = normal(1_000_000)
    t, h = timed(lambda: bandwidth(x, "plugin", engine="exact"), dev, 3)
    row("plugin exact n=1e6", t, note=f"h={h:.5f} (goal <= 500 ms)")
    # raw pair rate without pruning, to compare with the naive-kernel ceiling (1,613 G pairs/s full square)
    n = 1 << 18 if quick else 1 << 20
    xs = torch.sort(normal(n)).values
    t, _ = timed(lambda: hermite_sum(xs, None, 0.05, 4, prune=False), dev, 3)
    pairs = n * (n - 1) / 2
    row(f"Psi4 sum, all {pairs:.3g} upper pairs (n=2^{int(math.log2(n))})", t,
        note=f"{pairs / t / 1e9:.0f} G pairs/s = {2 * pairs / t / 1e9:.0f} G full-square pairs/s")
    # --- binned plug-in at a billion rows --------------------------------------------------------------
    nb = 10**8 if quick else 10**9
    xb = torch.randn(nb, generator=g, device=dev, dtype=torch.float32)
    t, hb = timed(lambda: bandwidth(xb, "plugin", engine="binned"), dev, 3)
    row(f"plugin binned n={nb:.0e} (float32)", t,
        note=f"{nb * 4 / t / 1e9:.0f} GB/s of input; h={hb:.5f} (goal <= 50 ms)")
    xb = None  # free 4 GB before the LSCV rows
    # --- LSCV --------------------------------------------------------------------------------------------
    def lscv_rows(n: int) -> None:
        X = normal(n, 16)
        t, H = timed(lambda: bandwidth(X, "lscv_h"), dev, 20 if n <= 10_240 else 3)
        peer = diff = None
        if n <= 10_240:
            with use_backend("torch"):
                peer, Hp = timed(lambda: bandwidth(X, "lscv_h"), dev, 1)
            diff = reldiff(H, Hp)
        note = f"GTX 480: {GTX480_MS['lscv_h']} ms -> {GTX480_MS['lscv_h'] / (t * 1e3):.0f}x" if n == 10_240 \
            else "goal <= 300 ms"
        row(f"lscv_h n={n:,} d=16", t, "torch fp64 tiles" if peer else "", peer, diff, note)
        H0 = np.cov(X.cpu().numpy().T) * (4 / (18 * n)) ** (2 / 20)
        t, v = timed(lambda: lscv_objective(X, H0), dev, 5)
        with use_backend("torch"):
            tp, vp = timed(lambda: lscv_objective(X, H0), dev, 1)
        note = f"GTX 480: {GTX480_MS['lscv_H']} ms -> {GTX480_MS['lscv_H'] / (t * 1e3):.0f}x" if n == 10_240 \
            else "goal <= 10 ms"
        row(f"lscv_H objective n={n:,} d=16", t, "torch fp64 tiles", tp, reldiff(v, vp), note)

    lscv_rows(10_240)
    lscv_rows(100_000)
    X = normal(10_240, 16)
    t, _ = timed(lambda: bandwidth(X, "lscv_H"), dev, 1)
    row("lscv_H full optimisation n=10,240 d=16", t, note="BFGS, analytic gradient (Triton kernel), goal <= 100 ms")


def cpu_rows(quick: bool) -> None:
    from densitas.testing import kde_reference as ref

    rng = np.random.default_rng(0)
    dev = torch.device("cpu")
    n = 10_000 if quick else 30_000
    x = rng.normal(size=n)
    t, h = timed(lambda: bandwidth(x, "plugin", engine="exact", device="cpu"), dev, 3)
    tp, hp = timed(lambda: ref.plugin_bruteforce(x), dev, 1)
    row(f"plugin exact n={n:,}", t, "NumPy O(n^2)", tp, reldiff(h, hp))
    nb = 10**6 if quick else 10**7
    xb = rng.lognormal(size=nb)
    t, hb = timed(lambda: bandwidth(xb, "plugin", engine="binned", device="cpu"), dev, 3)
    row(f"plugin binned n={nb:.0e} (log-normal)", t, note=f"h={hb:.5f}")
    try:
        from KDEpy import FFTKDE
        from KDEpy.bw_selection import improved_sheather_jones
    except ImportError:
        print("  (KDEpy not installed: pip install 'densitas[bench]')")
    else:
        xn = rng.normal(size=nb)
        t, ours = timed(lambda: bandwidth(xn, "isj", device="cpu"), dev, 3)
        tp, theirs = timed(lambda: improved_sheather_jones(xn[:, None]), dev, 3)
        row(f"isj n={nb:.0e} (normal)", t, "KDEpy ISJ", tp, reldiff(ours, theirs),
            "KDEpy's h is biased: data range in place of grid range")
        tp, _ = timed(lambda: FFTKDE(bw="silverman").fit(xn).evaluate(2**10), dev, 3)
        t, _ = timed(lambda: bandwidth(xn, "silverman", device="cpu"), dev, 3)
        row(f"silverman rule n={nb:.0e} vs KDEpy FFTKDE (rule + 1,024-point density)", t, "KDEpy FFTKDE", tp)
    nl = 2_000 if quick else 10_000
    X = rng.normal(size=(nl, 16))
    t, H = timed(lambda: bandwidth(X, "lscv_h", device="cpu"), dev, 1)
    cov = np.cov(X.T)
    h0 = (4 / (18 * nl)) ** (1 / 20)

    # The papers' method: 150 grid values of h, each a full O(n^2) pass. Timed on one grid value and scaled by
    # 150 (a full run takes hours at n = 10^4); the same pass is the NumPy lscv_H objective below.
    H0 = cov * h0**2
    t_obj, v = timed(lambda: lscv_objective(X, H0, device="cpu"), dev, 3)
    tp_one, vp = timed(lambda: ref.lscv_bruteforce(X, H0), dev, 0)
    row(f"lscv_h n={nl:,} d=16", t, "NumPy, 150-point grid", 150 * tp_one, None,
        "NumPy time = 150 x one measured O(n^2) pass")
    row(f"lscv_H objective n={nl:,} d=16", t_obj, "NumPy O(n^2 d^2)", tp_one, reldiff(v, vp))
    try:
        from statsmodels.nonparametric.kernel_density import KDEMultivariate
    except ImportError:
        print("  (statsmodels not installed: pip install 'densitas[bench]')")
        return
    X2 = rng.normal(size=(2000, 2)) @ np.array([[1.0, 0.5], [0.0, 0.7]])
    t, H = timed(lambda: bandwidth(X2, "lscv_H", device="cpu"), dev, 1)
    tp, sm = timed(lambda: KDEMultivariate(X2, var_type="cc", bw="cv_ls"), dev, 0)
    Hsm = np.diag(sm.bw**2)
    ours_v, theirs_v = lscv_objective(X2, H, device="cpu"), lscv_objective(X2, Hsm, device="cpu")
    row("lscv_H n=2,000 d=2 vs statsmodels cv_ls", t, "statsmodels cv_ls", tp, None,
        f"LSCV at optimum: densitas {ours_v:.6e} vs statsmodels {theirs_v:.6e} (lower is better)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke test)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                       ("cpu" if args.device == "auto" else args.device))
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(f"bench_kde on {name} (torch {torch.__version__})", flush=True)
    if dev.type == "cuda":
        cuda_rows(dev, args.quick)
    else:
        torch.set_num_threads(max(1, torch.get_num_threads()))
        cpu_rows(args.quick)
    from rich.console import Console
    from rich.table import Table

    tab = Table(title=f"bandwidth selection — {name}")
    for c in ("workload", "densitas ms", "peer", "peer ms", "ratio", "rel. diff", "note"):
        tab.add_column(c)
    for r in ROWS:
        tab.add_row(r["name"], f"{r['ours_ms']:.2f}", r["peer"], "" if r["peer_ms"] is None else f"{r['peer_ms']:.1f}",
                    "" if r["ratio"] is None else f"{r['ratio']:.1f}x",
                    "" if r["diff"] is None else f"{r['diff']:.1e}", r["note"])
    Console(width=200).print(tab)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(ROWS, fh, indent=1)


if __name__ == "__main__":
    main()
