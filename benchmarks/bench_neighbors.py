"""Exact k-NN side by side with its peers, in one run, on the same data.

    PYTHONPATH=src python benchmarks/bench_neighbors.py --device cpu           # 20k × 200k, d = 64, k = 10
    PYTHONPATH=src python benchmarks/bench_neighbors.py --device cpu --small   # 2k × 20k: a quick run
    PYTHONPATH=src python benchmarks/bench_neighbors.py                        # + GPU rows when CUDA is present
    PYTHONPATH=src python benchmarks/bench_neighbors.py --device cuda --stream 1e7,1e8 --gpu-only --no-in-memory
                                               # host-resident references streamed, beside the transfer floor

CPU rows: densitas (float32 GEMM tiles + partial selection, float64 re-rank, certified exact) against
scikit-learn's brute force (float64, ``NearestNeighbors(algorithm="brute")``) and faiss-cpu's exact
``IndexFlatL2`` (float32; ``pip install faiss-cpu`` when absent). GPU rows (issue 11 sizes): densitas against
``torch.cdist``-free GEMM + ``torch.topk`` in tiles on the same GPU (float32, what a careful user writes; not
exact). "ratio" is peer time / densitas time (> 1: densitas faster); "agree" is the share of queries whose
neighbour list equals densitas' (tie-aware sets). Figures are printed, not recorded.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import numpy as np
import torch

from densitas._backend.device import resolve_device
from densitas.neighbors import kneighbors


def timed(fn, dev: torch.device, reps: int) -> tuple[float, object]:
    """Median seconds over ``reps`` runs after one warm-up run (``reps = 0``: one cold run)."""
    def once():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        out = fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return time.perf_counter() - t0, out

    if reps == 0:
        return once()
    once()
    runs = [once() for _ in range(reps)]
    return statistics.median(t for t, _ in runs), runs[-1][1]


def agree(i_a: np.ndarray, i_b: np.ndarray) -> float:
    return float(np.mean([set(a) == set(b) for a, b in zip(i_a, i_b, strict=True)]))


def torch_gemm_topk(X: torch.Tensor, Y: torch.Tensor, k: int, tile: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """The GPU baseline: ‖q‖² − 2q·c + ‖c‖² in query tiles, then torch.topk (float32, not exact)."""
    cn = (X * X).sum(1)
    ds, is_ = [], []
    for s in range(0, len(Y), tile):
        q = Y[s:s + tile]
        d = torch.addmm(cn[None, :], q, X.T, alpha=-2.0)
        v, i = torch.topk(d, k, dim=1, largest=False)
        ds.append(v + (q * q).sum(1, keepdim=True))
        is_.append(i)
    return torch.cat(ds), torch.cat(is_)


def cpu_rows(m: int, n: int, d: int, k: int, reps: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d), dtype=np.float32)
    Y = rng.standard_normal((m, d), dtype=np.float32)
    dev = torch.device("cpu")
    rows = []
    t_ours, (_, i_ours) = timed(lambda: kneighbors(X, Y, k, device="cpu"), dev, reps)
    rows.append({"case": f"CPU {m:,} × {n:,}, d={d}, k={k}", "impl": "densitas (exact)", "s": t_ours,
                 "ratio": 1.0, "agree": 1.0})
    try:
        import faiss

        def run_faiss():
            index = faiss.IndexFlatL2(d)
            index.add(X)
            return index.search(Y, k)

        t, (_, i_f) = timed(run_faiss, dev, reps)
        rows.append({"case": "", "impl": f"faiss-cpu {faiss.__version__} IndexFlatL2", "s": t,
                     "ratio": t / t_ours, "agree": agree(i_ours, i_f)})
    except ImportError:
        rows.append({"case": "", "impl": "faiss-cpu: not installed (pip install faiss-cpu)", "s": float("nan"),
                     "ratio": float("nan"), "agree": float("nan")})
    import sklearn
    from sklearn.neighbors import NearestNeighbors

    X64, Y64 = X.astype(np.float64), Y.astype(np.float64)
    t, (_, i_s) = timed(lambda: NearestNeighbors(n_neighbors=k, algorithm="brute").fit(X64).kneighbors(Y64), dev,
                        max(reps - 1, 0))
    rows.append({"case": "", "impl": f"scikit-learn {sklearn.__version__} brute (float64)", "s": t,
                 "ratio": t / t_ours, "agree": agree(i_ours, i_s)})
    return rows


def exact_share(X: torch.Tensor, Y: torch.Tensor, k: int, idx: torch.Tensor, n_check: int = 256) -> float:
    """Share of n_check random queries whose neighbour list equals the float64 brute force (ties by index)."""
    sel = torch.randperm(len(Y), device=Y.device)[:n_check]
    d = torch.cdist(Y[sel].double(), X.double())
    want = torch.argsort(d, dim=1, stable=True)[:, :k]
    return float((want == torch.as_tensor(idx, device=Y.device)[sel]).all(1).double().mean())


def doc001_rows(reps: int, seed: int, small: bool) -> list[dict]:
    """Document 001's size: 100,000 queries × 100,000 references, 50 attributes (10 nominal), k = 10, with
    mixed Euclidean and with NaN skipping (5% missing), beside its 20.65 s on a GTX 480."""
    dev = resolve_device("cuda")
    n = 10_000 if small else 100_000
    g = torch.Generator(device=dev).manual_seed(seed)
    num = torch.randn(n, 40, device=dev, generator=g)
    nom = torch.randint(0, 5, (n, 10), device=dev, generator=g).to(torch.float32)
    X = torch.cat([num, nom], 1)
    rows = _Rows()
    t, (_, idx) = timed(lambda: kneighbors(X, X, 10, metric="mixed_euclidean", nominal=list(range(40, 50))), dev,
                        reps)
    sel = torch.randperm(n, device=dev, generator=g)[:256]
    ref = ((X[sel, None, :40].double() - X[None, :, :40].double()) ** 2).sum(-1) \
        + (X[sel, None, 40:] != X[None, :, 40:]).sum(-1)
    want = torch.argsort(ref, dim=1, stable=True)[:, :10]
    exact = float((want == torch.as_tensor(idx, device=dev)[sel]).all(1).double().mean())
    rows.append({"case": f"doc 001: {n:,}², 50 attributes, k=10", "impl": "mixed Euclidean (10 nominal)", "s": t,
                 "ratio": 20.65 / t, "agree": exact})
    Xn = num.clone()
    Xn[torch.rand(Xn.shape, device=dev, generator=g) < 0.05] = float("nan")
    Xn = torch.cat([Xn, torch.randn(n, 10, device=dev, generator=g)], 1)
    t, (_, idx) = timed(lambda: kneighbors(Xn, Xn, 10, missing="skip"), dev, reps)
    q = Xn[sel].double()
    both = ~torch.isnan(q)[:, None, :] & ~torch.isnan(Xn)[None, :, :]
    diff = torch.where(both, torch.nan_to_num(q)[:, None, :] - torch.nan_to_num(Xn.double())[None, :, :], 0.0)
    ref = torch.where(both.any(-1), (diff * diff).sum(-1), torch.inf)
    want = torch.argsort(ref, dim=1, stable=True)[:, :10]
    exact = float((want == torch.as_tensor(idx, device=dev)[sel]).all(1).double().mean())
    rows.append({"case": "", "impl": "Euclidean, 5% NaN skipped", "s": t, "ratio": 20.65 / t, "agree": exact})
    return rows


def gpu_rows(reps: int, seed: int, small: bool) -> list[dict]:
    dev = resolve_device("cuda")
    g = torch.Generator(device=dev).manual_seed(seed)
    cases = [(100_000, 1_000_000, 64, 10), (10_000, 1_000_000, 128, 100), (10_000, 1_000_000, 128, 1024),
             (10_000, 1_000_000, 128, 2048)]
    if small:
        cases = [(10_000, 100_000, 64, 10), (2_000, 100_000, 128, 100)]
    rows = _Rows()
    for m, n, d, k in cases:
        X = torch.randn(n, d, device=dev, generator=g)
        Y = torch.randn(m, d, device=dev, generator=g)
        t_ours, (_, i_ours) = timed(lambda X=X, Y=Y, k=k: kneighbors(X, Y, k), dev, reps)
        t_base, (_, i_base) = timed(lambda X=X, Y=Y, k=k: torch_gemm_topk(X, Y, k), dev, reps)
        exact = exact_share(X, Y, k, i_ours)
        rows.append({"case": f"GPU {m:,} × {n:,}, d={d}, k={k}", "impl": "densitas kneighbors (exact)",
                     "s": t_ours, "ratio": 1.0, "agree": exact})
        if k <= 200:  # the fused kernel's own driver (no chunk planner): the kernel's speed
            from densitas.neighbors._triton import fused_kneighbors

            t_f, (_, i_f) = timed(lambda X=X, Y=Y, k=k: fused_kneighbors(Y, X, k, metric="sqeuclidean"), dev, reps)
            rows.append({"case": "", "impl": "densitas fused kernel + float64 re-rank", "s": t_f,
                         "ratio": t_f / t_ours, "agree": exact_share(X, Y, k, i_f)})
        rows.append({"case": "", "impl": "torch GEMM + topk (float32)", "s": t_base, "ratio": t_base / t_ours,
                     "agree": agree(i_ours.cpu().numpy(), i_base.cpu().numpy())})
        del X, Y
        torch.cuda.empty_cache()
    return rows


def variant_rows(reps: int, seed: int) -> list[dict]:
    """The fused driver's variants at the two in-memory cases of the issue: dot precision (TF32 or float16
    operands) × one piece, two (a first 1/16 of the references seeds the rest) or the threshold pass (seeds from
    samples, then every reference below the seed into a buffer: no top-k on chip), and the kernel's launch
    settings for float16 at kp = 128; each beside the current default, all checked exact."""
    from densitas.neighbors import _triton as fused

    dev = resolve_device("cuda")
    g = torch.Generator(device=dev).manual_seed(seed)
    rows = _Rows()
    for m, n, d, k in [(100_000, 1_000_000, 64, 10), (10_000, 1_000_000, 128, 100)]:
        X = torch.randn(n, d, device=dev, generator=g)
        Y = torch.randn(m, d, device=dev, generator=g)
        base = None
        for precision in ("tf32", "fp16"):
            for driver, first, threshold in (("one piece", 0, False), ("two pieces", n // fused.FIRST_PIECE, False),
                                             ("threshold pass", 0, True)):
                t, (_, i_v) = timed(lambda X=X, Y=Y, k=k, p=precision, f=first, th=threshold: fused.fused_kneighbors(
                    Y, X, k, metric="sqeuclidean", precision=p, first_piece=f, threshold=th), dev, reps)
                base = base or t
                rows.append({"case": f"variants {m:,} × {n:,}, d={d}, k={k}",
                             "impl": f"fused {precision}, {driver}", "s": t,
                             "ratio": base / t, "agree": exact_share(X, Y, k, i_v)})
        kp = fused._pow2(k + max(8, k // 4))
        for bm, bn, w, st in ([(16, 128, 4, 2), (32, 128, 4, 2), (16, 128, 2, 2), (16, 128, 2, 3), (16, 128, 4, 4)]
                              if k == 100 else [(64, 64, 4, 3), (64, 128, 4, 3), (64, 64, 4, 4), (128, 64, 4, 3)]):
            for precision in ("tf32", "fp16"):
                try:
                    t, _ = timed(lambda X=X, Y=Y, kp=kp, p=precision, bm=bm, bn=bn, w=w, st=st: fused.candidates(
                        Y, X, kp, precision=p, block_m=bm, block_n=bn, num_warps=w, num_stages=st), dev, reps)
                except Exception as exc:  # a launch that does not fit: reported, not fatal
                    print(f"  {precision} {bm}/{bn}/{w}/{st}: {type(exc).__name__}", file=sys.stderr)
                    continue
                rows.append({"case": f"kernel alone, kp={kp}", "impl": f"{precision} BM={bm} BN={bn} warps={w} "
                             f"stages={st}", "s": t, "ratio": float("nan"), "agree": float("nan")})
        del X, Y
        torch.cuda.empty_cache()
    return rows


def profile_fused(seed: int, m: int = 10_000, n: int = 1_000_000, d: int = 128, k: int = 100) -> None:
    """Where the fused driver's time goes at 10k × 1M × 128, k = 100 (torch.profiler: CUDA time per kernel,
    the ten largest) and its certificate counts."""
    from torch.profiler import ProfilerActivity, profile

    from densitas.neighbors import _triton as fused

    dev = resolve_device("cuda")
    g = torch.Generator(device=dev).manual_seed(seed)
    X = torch.randn(n, d, device=dev, generator=g)
    Y = torch.randn(m, d, device=dev, generator=g)
    fused.fused_kneighbors(Y, X, k, metric="sqeuclidean")
    stats: dict[str, int] = {}
    torch.cuda.synchronize(dev)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fused.fused_kneighbors(Y, X, k, metric="sqeuclidean", stats=stats)
        torch.cuda.synchronize(dev)
    print(f"fused driver {m:,} × {n:,} × {d}, k={k}: {stats}", file=sys.stderr)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60),
          file=sys.stderr, flush=True)


class _Rows(list):
    """A list of result rows that prints each row as it arrives (long GPU runs show progress)."""

    def append(self, row: dict) -> None:
        super().append(row)
        print(f"  {row['case'] or '':40s} {row['impl']:45s} {row['s']:.4f} s  ratio {row['ratio']:.2f}  "
              f"agree {row['agree']:.4f}", file=sys.stderr, flush=True)


def _pinned_references(n: int, d: int, seed: int, dev: torch.device) -> torch.Tensor:
    """n × d float32 normal rows in pinned host memory, generated on the GPU in chunks with a fixed seed."""
    X = torch.empty((n, d), dtype=torch.float32, pin_memory=True)
    g = torch.Generator(device=dev).manual_seed(seed)
    step = 1 << 22
    for s in range(0, n, step):
        e = min(s + step, n)
        X[s:e].copy_(torch.randn(e - s, d, device=dev, generator=g), non_blocking=True)
    torch.cuda.synchronize(dev)
    return X


def _brute_check(X: torch.Tensor, Y: torch.Tensor, k: int, idx: torch.Tensor, n_check: int,
                 dev: torch.device) -> float:
    """Share of n_check random queries whose list equals a float64 brute force (GEMM expansion in float64)
    over the host rows copied in plain chunks (no densitas code)."""
    sel = torch.randperm(len(Y), device=dev)[:n_check]
    q = Y[sel].double()
    qn = (q * q).sum(1, keepdim=True)
    best_d = torch.empty((n_check, 0), dtype=torch.float64, device=dev)
    best_i = torch.empty((n_check, 0), dtype=torch.int64, device=dev)
    step = 1 << 21
    for s in range(0, len(X), step):
        x = X[s:s + step].to(dev, non_blocking=True).double()
        dist = qn + (x * x).sum(1)[None, :] - 2.0 * q @ x.T
        ids = torch.arange(s, s + len(x), device=dev).expand(n_check, -1)
        cd, ci = torch.cat([best_d, dist], 1), torch.cat([best_i, ids], 1)
        o = torch.argsort(cd, dim=1, stable=True)[:, :k]
        best_d, best_i = cd.gather(1, o), ci.gather(1, o)
    return float((best_i == torch.as_tensor(idx, device=dev)[sel]).all(1).double().mean())


LAUNCHES = [(64, 64, 4, 3), (64, 128, 4, 3), (64, 256, 4, 2), (128, 64, 4, 3), (128, 128, 4, 3), (128, 128, 8, 3),
            (128, 256, 8, 2), (256, 64, 8, 3), (256, 128, 8, 2), (32, 128, 4, 3)]


def launch_sweep_rows(X: torch.Tensor, Y: torch.Tensor, k: int, reps: int, dev: torch.device) -> list[dict]:
    """The streamed search over its chunk kernel's launch settings (queries and references per tile, warps,
    stages); sets densitas.neighbors.stream.LAUNCH to the fastest."""
    from densitas.neighbors import stream

    rows = _Rows()
    best = (math.inf, {})
    for bm, bn, w, st in LAUNCHES:
        stream.LAUNCH = {"block_m": bm, "block_n": bn, "num_warps": w, "num_stages": st}
        try:
            t, _ = timed(lambda: stream.stream_kneighbors(Y, stream.HostChunks(X), k, device=dev), dev, reps)
        except Exception as exc:
            print(f"  {stream.LAUNCH}: {type(exc).__name__}", file=sys.stderr)
            continue
        rows.append({"case": f"launch sweep, streamed {len(X):,}", "impl": f"BM={bm} BN={bn} warps={w} stages={st}",
                     "s": t, "ratio": float("nan"), "agree": float("nan")})
        best = min(best, (t, dict(stream.LAUNCH)), key=lambda b: b[0])
    stream.LAUNCH = best[1]
    print(f"  launch settings chosen: {stream.LAUNCH}", file=sys.stderr, flush=True)
    return rows


def stream_rows(reps: int, seed: int, sizes: list[int], m: int = 10_000, d: int = 64, k: int = 10,
                launch_sweep: bool = False, precisions: tuple[str, ...] = ()) -> list[dict]:
    """Host-resident references (pinned memory, generated in chunks with a fixed seed) streamed through the GPU:
    ``kneighbors`` beside the host→device transfer floor — the same bytes copied from pinned memory with the
    same chunking and double buffering and no compute, and plain ``torch`` copy bandwidth (one 1 GiB copy from
    pinned memory) — and the same search with the references already on the device (the compute alone)."""
    from densitas.neighbors import stream
    from densitas.neighbors.stream import HostChunks, StreamStats, stream_kneighbors, transfer_floor

    dev = resolve_device("cuda")
    rows = _Rows()
    g = torch.Generator(device=dev).manual_seed(seed + 1)
    Y = torch.randn(m, d, device=dev, generator=g)
    # plain torch.cuda copy bandwidth from pinned memory: one 1 GiB copy, best of 5
    h = torch.empty((1 << 28,), dtype=torch.float32, pin_memory=True)
    buf = torch.empty_like(h, device=dev)
    best = math.inf
    for _ in range(5):
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        buf.copy_(h, non_blocking=True)
        torch.cuda.synchronize(dev)
        best = min(best, time.perf_counter() - t0)
    bw = h.numel() * 4 / best
    del h, buf
    print(f"  plain pinned → device copy: {bw / 1e9:.1f} GB/s", file=sys.stderr, flush=True)
    for n in sizes:
        t_gen = time.perf_counter()
        X = _pinned_references(n, d, seed + n, dev)
        print(f"  generated {n:,} × {d} pinned in {time.perf_counter() - t_gen:.1f} s", file=sys.stderr, flush=True)
        if launch_sweep:
            rows += launch_sweep_rows(X, Y, k, reps, dev)
            launch_sweep = False
        stats = StreamStats()
        t, (dist, idx) = timed(lambda X=X, st=stats: stream_kneighbors(Y, HostChunks(X), k, device=dev, stats=st),
                               dev, reps)
        floor = transfer_floor(HostChunks(X), stats.chunk_rows, dev, stats.first_rows)
        floor = min(floor, transfer_floor(HostChunks(X), stats.chunk_rows, dev, stats.first_rows))
        plain = n * d * 4 / bw
        ok = _brute_check(X, Y, k, idx, 256 if n <= 10**7 else 32, dev)
        case = f"host {n:,} × {d} ({n * d * 4 / 1e9:.1f} GB) × {m:,} queries, k={k}"
        runs = reps + 1 if reps else 1  # the stats add up over the warm-up and timed runs
        rows.append({"case": case, "impl": f"densitas streamed ({stats.chunks // runs} chunks of "
                     f"{stats.chunk_rows:,}, {stats.fallback_queries // runs} fallback, "
                     f"{stream.STREAM_PRECISION})", "s": t, "ratio": t / floor, "agree": ok})
        default = stream.STREAM_PRECISION
        try:
            for precision in precisions:  # the chunk kernel's other dot precisions, same data
                if precision == default:
                    continue
                stream.STREAM_PRECISION = precision
                t_p, (d_p, i_p) = timed(lambda X=X: stream_kneighbors(Y, HostChunks(X), k, device=dev), dev, reps)
                same = bool(torch.equal(i_p, idx)) and bool(torch.equal(d_p, dist))
                rows.append({"case": "", "impl": f"densitas streamed, {precision} operands — same result: {same}",
                             "s": t_p, "ratio": t_p / floor, "agree": float("nan")})
        finally:
            stream.STREAM_PRECISION = default
        rows.append({"case": "", "impl": "transfer floor: same chunks pinned → device, no compute", "s": floor,
                     "ratio": 1.0, "agree": float("nan")})
        rows.append({"case": "", "impl": f"plain torch copy at {bw / 1e9:.1f} GB/s", "s": plain,
                     "ratio": plain / floor, "agree": float("nan")})
        t_k, (d_k, i_k) = timed(lambda X=X: kneighbors(X, Y, k), dev, 0)  # the routed API (cold: one run)
        same = bool(torch.equal(i_k, idx)) and bool(torch.equal(d_k, dist))
        rows.append({"case": "", "impl": f"kneighbors(pinned host tensor) — same result: {same}", "s": t_k,
                     "ratio": t_k / floor, "agree": float("nan")})
        if n <= 10**7:
            Xd = X.to(dev)
            t_d, (_d_d, i_d) = timed(lambda Xd=Xd: kneighbors(Xd, Y, k), dev, reps)
            rows.append({"case": "", "impl": "kneighbors, references already on the device (compute alone) — "
                         f"same: {bool(torch.equal(i_d, idx))}", "s": t_d, "ratio": t_d / floor,
                         "agree": float("nan")})
            del Xd
            Xp = X.numpy().copy()  # pageable host memory: staged through the pinned buffers
            t_p, (_, i_p) = timed(lambda Xp=Xp: kneighbors(Xp, Y, k), dev, reps)
            rows.append({"case": "", "impl": "kneighbors(pageable NumPy array; pinned staging) — same: "
                         f"{bool(torch.equal(i_p, idx))}", "s": t_p, "ratio": t_p / floor, "agree": float("nan")})
            del Xp
        del X
        torch.cuda.empty_cache()
    return rows


def block_sweep_rows(reps: int, seed: int) -> list[dict]:
    """The fused kernel's candidates over queries and references per tile at the streamed search's chunk
    (10,000 queries × 2,097,152 references, d = 64, kp = 32)."""
    from densitas.neighbors import _triton as fused

    dev = resolve_device("cuda")
    g = torch.Generator(device=dev).manual_seed(seed)
    X = torch.randn(1 << 21, 64, device=dev, generator=g)
    Y = torch.randn(10_000, 64, device=dev, generator=g)
    rows = _Rows()
    for bm, bn, warps, stages in [(64, 64, 4, 3), (64, 128, 4, 3), (64, 128, 8, 3), (128, 64, 8, 3),
                                  (128, 128, 8, 2), (64, 256, 8, 2), (32, 128, 4, 3), (128, 64, 4, 3)]:
        try:
            t, _ = timed(lambda bm=bm, bn=bn, w=warps, st=stages: fused.candidates(
                Y, X, 32, block_m=bm, block_n=bn, num_warps=w, num_stages=st), dev, reps)
        except Exception as exc:
            print(f"  {bm}/{bn}/{warps}/{stages}: {type(exc).__name__}", file=sys.stderr)
            continue
        rows.append({"case": "block sweep 10k × 2M, d=64, kp=32", "impl": f"BM={bm} BN={bn} warps={warps} "
                     f"stages={stages}", "s": t, "ratio": float("nan"), "agree": float("nan")})
    return rows


def profile_masked(seed: int, n: int = 100_000) -> None:
    """Where document 001's NaN-skipping case (n², 50 attributes, 5% NaN, k = 10) spends its GPU time: the
    top kernels of one warm run under torch.profiler, printed."""
    from torch.profiler import ProfilerActivity, profile

    dev = resolve_device("cuda")
    g = torch.Generator(device=dev).manual_seed(seed)
    Xn = torch.randn(n, 40, device=dev, generator=g)
    Xn[torch.rand(Xn.shape, device=dev, generator=g) < 0.05] = float("nan")
    Xn = torch.cat([Xn, torch.randn(n, 10, device=dev, generator=g)], 1)
    kneighbors(Xn, Xn, 10, missing="skip")
    torch.cuda.synchronize(dev)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        kneighbors(Xn, Xn, 10, missing="skip")
        torch.cuda.synchronize(dev)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60),
          file=sys.stderr)


def sweep_rows(reps: int, seed: int) -> list[dict]:
    """The fused kernel's candidate pass alone over its launch settings (queries per block, warps, pipeline
    stages) at the issue's two sizes: how the defaults of densitas.neighbors._triton.candidates were chosen."""
    from densitas.neighbors import _triton as fused

    dev = resolve_device("cuda")
    g = torch.Generator(device=dev).manual_seed(seed)
    rows = _Rows()
    for m, n, d, kp, blocks in [(100_000, 1_000_000, 64, 32, (32, 64)), (10_000, 1_000_000, 128, 128, (16, 32))]:
        X = torch.randn(n, d, device=dev, generator=g)
        Y = torch.randn(m, d, device=dev, generator=g)
        first = True
        for bm in blocks:
            for warps in (4, 8):
                for stages in (2, 3, 4):
                    t, _ = timed(lambda bm=bm, w=warps, st=stages, X=X, Y=Y, kp=kp: fused.candidates(
                        Y, X, kp, block_m=bm, num_warps=w, num_stages=st), dev, reps)
                    rows.append({"case": f"sweep {m:,} × {n:,}, d={d}, kp={kp}" if first else "",
                                 "impl": f"{bm} queries/block, {warps} warps, {stages} stages", "s": t,
                                 "ratio": float("nan"), "agree": float("nan")})
                    first = False
        del X, Y
        torch.cuda.empty_cache()
    return rows


def print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="densitas.neighbors — exact k-NN beside its peers (ratio = peer / densitas)")
    for c in ("case", "implementation", "time", "ratio", "agree"):
        t.add_column(c, justify="left" if c in ("case", "implementation") else "right")
    for r in rows:
        t.add_row(r["case"], r["impl"], f"{r['s']:.3f} s" if r["s"] == r["s"] else "—",
                  f"{r['ratio']:.2f}" if r["ratio"] == r["ratio"] else "—",
                  f"{r['agree']:.4f}" if r["agree"] == r["agree"] else "—")
    Console(width=140).print(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", help="auto (GPU rows when CUDA is present), cpu or cuda")
    ap.add_argument("--small", action="store_true", help="quick sizes (CPU 2,000 × 20,000)")
    ap.add_argument("--reps", type=int, default=None, help="timed repeats after a warm-up (default 3; 1 full size)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gpu-only", action="store_true", help="skip the CPU rows")
    ap.add_argument("--sweep", action="store_true", help="also sweep the fused kernel's launch settings (CUDA)")
    ap.add_argument("--stream", default=None, help="host-resident reference sizes to stream, e.g. 1e7,1e8 (CUDA)")
    ap.add_argument("--no-in-memory", action="store_true", help="skip the device-resident GPU rows")
    ap.add_argument("--block-sweep", action="store_true", help="sweep queries/references per tile (CUDA)")
    ap.add_argument("--launch-sweep", action="store_true", help="with --stream: sweep the chunk kernel's launch "
                    "settings at the first size and use the fastest")
    ap.add_argument("--profile-masked", action="store_true", help="profile document 001's NaN case (CUDA)")
    ap.add_argument("--stream-precision", default="", help="with --stream: also time the chunk kernel with these "
                    "dot precisions, e.g. tf32,fp16")
    ap.add_argument("--variants", action="store_true", help="the fused driver's precision / two-piece variants "
                    "and float16 launch settings at the issue's two in-memory cases (CUDA)")
    ap.add_argument("--no-doc001", action="store_true", help="skip document 001's rows")
    ap.add_argument("--profile-fused", action="store_true", help="profile the fused driver at 10k × 1M × 128, "
                    "k = 100 (CUDA)")
    args = ap.parse_args(argv)
    dev = resolve_device(args.device)
    reps = args.reps if args.reps is not None else (3 if args.small else 1)
    rows: list[dict] = []
    if dev.type == "cuda":
        if args.stream:
            rows += stream_rows(reps, args.seed, [int(float(v)) for v in args.stream.split(",")],
                                launch_sweep=args.launch_sweep,
                                precisions=tuple(p for p in args.stream_precision.split(",") if p))
        if args.variants:
            rows += variant_rows(reps, args.seed)
        if args.profile_fused:
            profile_fused(args.seed)
        if args.block_sweep:
            rows += block_sweep_rows(reps, args.seed)
        if args.profile_masked:
            profile_masked(args.seed)
        if not args.no_in_memory:
            rows += gpu_rows(reps, args.seed, args.small)
            if not args.no_doc001:
                rows += doc001_rows(reps, args.seed, args.small)
        if args.sweep:
            rows += sweep_rows(reps, args.seed)
    if not args.gpu_only:
        m, n = (2_000, 20_000) if args.small else (20_000, 200_000)
        rows += cpu_rows(m, n, 64, 10, reps, args.seed)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads; load average at the end "
          f"{os.getloadavg()[0]:.2f} (1 min)", file=sys.stderr)
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
