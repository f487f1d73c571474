"""Fuzzy clustering benchmark: densitas beside scikit-fuzzy and fuzzy-c-means, and the four centroid updates.

One run, side by side, on the same data, the same initial centroids and the same number of iterations:

1. **Classic fuzzy c-means** (``n_nearest = n_clusters``, q = 2, float64): scikit-fuzzy ``cmeans`` and
   fuzzy-c-means ``FCM`` (when importable) beside ``FuzzyKMeans`` with every centroid method, float32 too, and
   on CUDA (when present) densitas and a dense PyTorch FCM on the same GPU. Time per iteration (the whole fit
   divided by the iterations: initial checks and the final labelling pass included), the peers' time over
   densitas' ("speedup"), and the largest centroid difference from scikit-fuzzy (relative to the data's scale).
2. **GFKM** (``n_nearest = 2``) with every centroid method (no peer implements it).
3. **The centroid step alone** (``centroid_update``) on document 004's grid: N = 491,520 (``--small``: 49,152),
   k = 8, M = 2, d ∈ {8, 16, 64, 100}.
4. ``--crossover``: whole iterations per centroid method over k and M — the measurement behind
   ``densitas.cluster.steps.DENSE_MAX_CLUSTERS`` (the rule ``"auto"`` uses).
5. ``--iteration`` (CUDA): issue 12's GPU row — N = 1,025,010 (the poker data's size in document 004), d = 10,
   k = 10, GFKM (M = 2) and classic FCM (M = k), q = 2, float32: the fused pass alone (CUDA events, median),
   100 updates of ``cluster_fused_iterations``, whole ``FuzzyKMeans`` fits of 1 and 100 iterations (tol = 0)
   and a dense PyTorch FCM; the pass's bytes (X read once) over its time against the copy ceiling measured in
   the same run.

Usage::

    python benchmarks/bench_cluster.py            # n = 500,000, d = 10, c = 5 (issue 12's CPU row), 20 iterations
    python benchmarks/bench_cluster.py --small    # n = 50,000
    python benchmarks/bench_cluster.py --crossover [--small]
    python benchmarks/bench_cluster.py --iteration           # CUDA only
    python benchmarks/bench_cluster.py --classic [--quick] [--repeats 5]  # section 1 only (--quick: auto + peers)
    python benchmarks/bench_cluster.py --gfkm                              # section 2 only

Timings are medians of ``--repeats`` runs (CUDA: synchronised wall time of the whole fit).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

from densitas.cluster import CENTROID_METHODS, FuzzyKMeans, centroid_update
from densitas.cluster.steps import choose_method, memberships


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


#: Untimed runs before each timing. On the shared VM the first large allocations of a fresh process can take
#: 5-10x longer (page provisioning: 70-130 ms instead of 13 ms for a 48 MB buffer, RESULTS.md 2026-11-23), and
#: densitas is timed first: three warm-up runs of every implementation keep that out of all of them alike.
WARMUP = 3


def timed(fn, repeats: int, device: str = "cpu") -> tuple[float, object]:
    """Median seconds of ``fn()`` over ``repeats`` runs (after :data:`WARMUP` untimed runs) and its last result."""
    for _ in range(WARMUP):
        fn()
    out = None
    ts = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), out


def _load() -> str:
    """The 1-, 5- and 15-minute load averages (the machine is shared: they qualify every timing)."""
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"


def make_data(n: int, d: int, c: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian blobs (c centres, spread 3 per axis, unit noise) and c initial centroids drawn from the data."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(c, d)) * 3.0
    X = centres[rng.integers(0, c, size=n)] + rng.normal(size=(n, d))
    C0 = X[rng.choice(n, c, replace=False)]
    return X, C0


def torch_dense_fcm(X: torch.Tensor, C0: torch.Tensor, m: float, iters: int) -> torch.Tensor:
    """Textbook dense fuzzy c-means in PyTorch (the n × c matrices materialised): the GPU baseline."""
    C = C0.clone()
    for _ in range(iters):
        D = torch.cdist(X, C).pow_(2).clamp_(min=1e-300)
        a = D.pow(-1.0 / (m - 1.0))
        U = a / a.sum(1, keepdim=True)
        W = U.pow(m)
        C = (W.T @ X) / W.sum(0)[:, None]
    return C


def row(name: str, sec_per_iter: float, ref: float | None, diff: float | None, note: str = "",
        steady: float | None = None, steady_ref: float | None = None) -> None:
    ratio = f"{sec_per_iter / ref:9.2f}x" if ref else " " * 10
    dtxt = f"{diff:10.1e}" if diff is not None else " " * 10
    st = f"{steady * 1e3:10.2f} {steady / steady_ref:8.2f}x" if steady is not None and steady_ref else ""
    print(f"  {name:44s} {sec_per_iter * 1e3:11.2f} {ratio} {dtxt}  {st}  {note}", flush=True)


def two_lengths(make, iters: int, repeats: int, device: str = "cpu") -> tuple[float, float, object]:
    """Whole-fit seconds per iteration at ``iters`` iterations, the steady cost of one more iteration
    ((t(iters) − t(1)) / (iters − 1): set-up and final passes cancel), and the result at ``iters``."""
    t_p, out = timed(lambda: make(iters), repeats, device)
    t_1, _ = timed(lambda: make(1), repeats, device)
    return t_p / iters, max(t_p - t_1, 0.0) / max(iters - 1, 1), out


def classic(X: np.ndarray, C0: np.ndarray, iters: int, repeats: int, device: str, quick: bool = False) -> None:
    n, d = X.shape
    c = C0.shape[0]
    scale = float(np.abs(X).max())
    print(f"\n1. Classic fuzzy c-means: n = {n:,}, d = {d}, c = {c}, q = 2, {iters} iterations, same initial "
          "centroids")
    print(f"  {'implementation':44s} {'ms / iter':>11s} {'vs densitas':>10s} {'max |ΔC|':>10s}  "
          f"{'steady ms':>10s} {'vs dens.':>9s}")

    def ours(method: str, dtype=np.float64, dev: str = "cpu"):
        Xd = X.astype(dtype) if dev == "cpu" else torch.as_tensor(X.astype(dtype), device=dev)

        def make(p):
            return FuzzyKMeans(c, n_nearest=c, fuzzifier=2.0, init=C0, max_iter=p, tol=0, centroid_update=method,
                               device=dev).fit(Xd)

        t, st, fitted = two_lengths(make, iters, repeats, dev)
        return t, st, fitted.cluster_centers_, fitted.centroid_update_

    base, sbase, C_ours, picked = ours("auto")
    reference = None
    try:
        import skfuzzy

        u0 = memberships(((X[:, None, :] - C0[None]) ** 2).sum(2), 2.0).T
        t, st, res = two_lengths(lambda p: skfuzzy.cluster.cmeans(X.T, c, 2.0, error=0.0, maxiter=p, init=u0),
                                 iters, repeats)
        reference = res[0]
        row(f"scikit-fuzzy {skfuzzy.__version__} cmeans", t, base, 0.0, "reference", st, sbase)
    except ImportError:
        print("  scikit-fuzzy: not installed (pip install scikit-fuzzy)")
    try:
        import fcmeans
        from fcmeans import FCM

        class FixedInit(FCM):
            def _init_u(self, X_):
                self.rng = np.random.default_rng(0)
                self.u = FCM._memberships(FCM._dist(X_, C0), self.m)

        def run_fcm(p):
            f = FixedInit(n_clusters=c, m=2.0, max_iter=p, error=1e-9)
            f.fit(X)
            return f

        t, st, f = two_lengths(run_fcm, iters, repeats)
        diff = None if reference is None else float(np.abs(f.centers - reference).max()) / scale
        row(f"fuzzy-c-means {getattr(fcmeans, '__version__', '')} FCM".replace("  ", " "), t, base, diff, "", st,
            sbase)
    except ImportError:
        print("  fuzzy-c-means: not installed (pip install fuzzy-c-means)")
    ref = reference if reference is not None else C_ours
    row(f"densitas FuzzyKMeans auto ({picked}), cpu", base, base, float(np.abs(C_ours - ref).max()) / scale, "",
        sbase, sbase)
    if quick:  # densitas auto beside the peers only (a short run for a shared machine's quiet moments)
        return
    for method in CENTROID_METHODS:
        t, st, C, _ = ours(method)
        row(f"densitas {method}, cpu", t, base, float(np.abs(C - ref).max()) / scale, "", st, sbase)
    t, st, C, _ = ours("auto", np.float32)
    row("densitas auto, float32, cpu", t, base, float(np.abs(C - ref).max()) / scale, "", st, sbase)
    if torch.cuda.is_available() and device != "cpu":
        for dtype in (np.float32, np.float64):
            for method in ("auto", *CENTROID_METHODS):
                t, st, C, m = ours(method, dtype, device)
                row(f"densitas {method if method != 'auto' else 'auto (' + m + ')'}, {np.dtype(dtype).name}, "
                    f"{device}", t, base, float(np.abs(C - ref).max()) / scale, "", st, sbase)
            Xt = torch.as_tensor(X.astype(dtype), device=device)
            Ct = torch.as_tensor(C0.astype(dtype), device=device)
            t, st, C = two_lengths(lambda p, Xt=Xt, Ct=Ct: torch_dense_fcm(Xt, Ct, 2.0, p), iters, repeats, device)
            row(f"dense PyTorch FCM, {np.dtype(dtype).name}, {device}", t, base,
                float(np.abs(C.cpu().numpy() - ref).max()) / scale, "", st, sbase)
    print("  (ms / iter: whole fit over the iterations, set-up and final labelling included; vs densitas: over "
          "densitas auto on the CPU; max |ΔC|: largest centroid difference from the reference over max |X|; "
          "steady: (t(p) − t(1)) / (p − 1))")


def gfkm(X: np.ndarray, C0: np.ndarray, iters: int, repeats: int, device: str, M: int = 2) -> None:
    n, d = X.shape
    c = C0.shape[0]
    print(f"\n2. GFKM: n = {n:,}, d = {d}, k = {c}, M = {M}, q = 2, {iters} iterations")
    print(f"  {'centroid update':44s} {'ms / iter':>11s} {'vs auto':>10s} {'max |ΔC|':>10s}")
    devices = ["cpu"] + ([device] if torch.cuda.is_available() and device != "cpu" else [])
    for dev in devices:
        Xd = X if dev == "cpu" else torch.as_tensor(X.astype(np.float32), device=dev)
        base = None
        ref = None
        for method in ("auto", *CENTROID_METHODS):
            km = FuzzyKMeans(c, n_nearest=M, fuzzifier=2.0, init=C0, max_iter=iters, tol=0, centroid_update=method,
                             device=dev)
            t, f = timed(lambda km=km, Xd=Xd: km.fit(Xd), repeats, dev)
            if base is None:
                base, ref = t / iters, f.cluster_centers_
            name = f"auto ({f.centroid_update_})" if method == "auto" else method
            row(f"densitas {name}, {dev}", t / iters, base, float(np.abs(f.cluster_centers_ - ref).max()))


def step_grid(small: bool, repeats: int, device: str, seed: int) -> None:
    N = 49_152 if small else 491_520
    k, M = 8, 2
    rng = np.random.default_rng(seed)
    devices = ["cpu"] + ([device] if torch.cuda.is_available() and device != "cpu" else [])
    print(f"\n3. The centroid step alone (document 004's grid): N = {N:,}, k = {k}, M = {M}")
    print("   paper (GTX 760 over one Core i5 core, centroid step): counting sort 2.3× at d = 8 falling to 1.6–1.8×, "
          "stable sort 1.5× rising to 2.5× at d ≥ 64")
    print(f"  {'d':>5s} {'device':8s} " + " ".join(f"{m:>14s}" for m in CENTROID_METHODS) + "   (ms; auto → pick)")
    for d in (8, 16, 64, 100):
        X = rng.normal(size=(N, d))
        nn = np.argsort(rng.random((N, k)), axis=1)[:, :M]
        w = rng.random((N, M))
        for dev in devices:
            Xt = torch.as_tensor(X, device=dev)
            nnt = torch.as_tensor(nn, device=dev)
            wt = torch.as_tensor(w, device=dev)
            cells = []
            for method in CENTROID_METHODS:
                t, _ = timed(lambda m=method, a=Xt, b=nnt, c=wt: centroid_update(a, b, c, k, method=m), repeats, dev)
                cells.append(f"{t * 1e3:14.2f}")
            print(f"  {d:5d} {dev:8s} " + " ".join(cells) + f"   auto → {choose_method(N, d, k, M, dev)}",
                  flush=True)


def crossover(small: bool, repeats: int, device: str, seed: int) -> None:
    n = 50_000 if small else 200_000
    d = 10
    dev = device if torch.cuda.is_available() and device != "cpu" else "cpu"
    print(f"\n4. Crossover of the centroid methods (whole iterations, n = {n:,}, d = {d}, {dev}): ms per iteration")
    print(f"  {'k':>5s} {'M':>4s} {'k/M':>6s} " + " ".join(f"{m:>14s}" for m in CENTROID_METHODS) + "   fastest  auto")
    for k, M in ((5, 5), (10, 10), (10, 2), (20, 2), (40, 4), (40, 2), (64, 2), (128, 4), (128, 2), (256, 2)):
        X, C0 = make_data(n, d, k, seed)
        Xd = X if dev == "cpu" else torch.as_tensor(X, device=dev)
        times = []
        for method in CENTROID_METHODS:
            km = FuzzyKMeans(k, n_nearest=M, fuzzifier=2.0, init=C0, max_iter=3, tol=0, centroid_update=method,
                             device=dev)
            t, _ = timed(lambda km=km, Xd=Xd: km.fit(Xd), repeats, dev)
            times.append(t / 3)
        best = CENTROID_METHODS[int(np.argmin(times))]
        print(f"  {k:5d} {M:4d} {k / M:6.1f} " + " ".join(f"{t * 1e3:14.2f}" for t in times)
              + f"   {best:8s} {choose_method(n, d, k, M, dev)}", flush=True)


def _cuda_ms(fn, repeats: int = 20) -> float:
    """Median milliseconds of ``fn()`` on the GPU (CUDA events, after two warm-up calls)."""
    fn()
    fn()
    ts = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def _ceilings(repeats: int) -> tuple[float, float]:
    """GB/s of a device-to-device copy (read + written) and of torch.sum (read) on 4 GiB of float32."""
    big = torch.empty(1 << 30, dtype=torch.float32, device="cuda")
    copy_ms = _cuda_ms(lambda: big.clone(), repeats)
    sum_ms = _cuda_ms(lambda: big.sum(), repeats)
    return 2 * big.numel() * 4 / copy_ms / 1e6, big.numel() * 4 / sum_ms / 1e6


def iteration_gpu(n: int, repeats: int, seed: int, check: bool = True) -> None:
    from densitas.cluster import _torch as ref
    from densitas.cluster import _triton as fused

    d, k = 10, 10
    dev = "cuda"
    X0, C0 = make_data(n, d, k, seed)
    X = torch.as_tensor(X0, dtype=torch.float32, device=dev)
    C = torch.as_tensor(C0, dtype=torch.float64, device=dev)
    copy_bw, read_bw = _ceilings(repeats)
    print(f"\n5. One iteration on {torch.cuda.get_device_name()}: N = {n:,}, d = {d}, k = {k}, q = 2, float32 "
          f"(ceilings measured now: copy {copy_bw:,.0f} GB/s read + written, torch.sum {read_bw:,.0f} GB/s read)")
    x_bytes = n * d * 4
    for M in (2, k):
        name = "GFKM M = 2" if M == 2 else f"classic FCM M = {k}"
        pass_ms = _cuda_ms(lambda M=M: fused.fused_pass(X, C, M, 2.0), repeats)
        it_ms = _cuda_ms(lambda M=M: fused.fused_iterations(X, C, M, 2.0, 100), max(3, repeats // 4)) / 100

        def fit(p, M=M):
            return FuzzyKMeans(k, n_nearest=M, fuzzifier=2.0, init=C0, max_iter=p, tol=0, device=dev).fit(X)

        t1, _ = timed(lambda: fit(1), repeats, dev)
        t100, f = timed(lambda: fit(100), max(3, repeats // 4), dev)
        print(f"  {name}: fused pass {pass_ms * 1e3:7.1f} µs ({x_bytes / pass_ms / 1e6:,.0f} GB/s over the "
              f"{x_bytes / 1e6:.0f} MB of X: {x_bytes / pass_ms / 1e6 / read_bw:.0%} of the read ceiling); "
              f"update in a batch of 100 {it_ms * 1e3:7.1f} µs; FuzzyKMeans fit: 1 iteration {t1 * 1e3:7.2f} ms, "
              f"100 iterations {t100 * 1e3:7.2f} ms ({f.centroid_update_}, n_iter_ = {f.n_iter_})", flush=True)
        if check:
            Cs_r, J_r, _, _ = ref.fused_iterations(X.double(), C, M, 2.0, 5)
            Cs_f, J_f, _, _ = fused.fused_iterations(X, C, M, 2.0, 5)
            err = float((Cs_f - Cs_r).abs().max() / Cs_r.abs().max())
            jerr = float((J_f - J_r).abs().max() / J_r.abs().max())
            print(f"    5 updates vs the float64 reference: max centroid difference {err:.1e} (relative to "
                  f"max |C|), J {jerr:.1e}", flush=True)
    Xd = X.double()
    Cd = C.clone()
    for dtype, Xt in (("float32", X), ("float64", Xd)):
        t = _cuda_ms(lambda Xt=Xt: torch_dense_fcm(Xt, Cd.to(Xt.dtype), 2.0, 100), max(3, repeats // 4)) / 100
        print(f"  dense PyTorch FCM (M = k), {dtype}: {t * 1e3:7.1f} µs per iteration (100 iterations)", flush=True)
    Xf64_ms = _cuda_ms(lambda: fused.fused_pass(Xd, C, 2, 2.0), repeats)
    print(f"  fused pass on float64 data, M = 2: {Xf64_ms * 1e3:7.1f} µs", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="n = 50,000 instead of 500,000 (and a smaller grid)")
    ap.add_argument("--crossover", action="store_true", help="only the centroid-method crossover sweep")
    ap.add_argument("--iteration", action="store_true", help="only the fused GPU iteration at N = 1,025,010")
    ap.add_argument("--classic", action="store_true", help="only section 1 (classic FCM beside the peers)")
    ap.add_argument("--quick", action="store_true", help="with --classic: densitas auto beside the peers only")
    ap.add_argument("--gfkm", action="store_true", help="only section 2 (GFKM, M = 2, every centroid update)")
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--d", type=int, default=10)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"densitas bench_cluster · torch {torch.__version__} · {torch.get_num_threads()} CPU threads"
          + (f" · {torch.cuda.get_device_name()}" if torch.cuda.is_available() else " · no CUDA device"))
    if args.crossover:
        crossover(args.small, args.repeats, args.device, args.seed)
        return
    if args.iteration:
        iteration_gpu(args.n or 1_025_010, max(args.repeats, 20), args.seed)
        return
    n = args.n or (50_000 if args.small else 500_000)
    X, C0 = make_data(n, args.d, args.k, args.seed)
    print(f"  load average before: {_load()}")
    if args.gfkm:
        gfkm(X, C0, args.iters, args.repeats, args.device)
        print(f"  load average after: {_load()}")
        return
    classic(X, C0, args.iters, args.repeats, args.device, quick=args.quick)
    print(f"  load average after: {_load()}")
    if args.classic:
        return
    gfkm(X, C0, args.iters, args.repeats, args.device)
    step_grid(args.small, args.repeats, args.device, args.seed)


if __name__ == "__main__":
    main()
