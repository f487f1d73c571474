"""Bandwidth selection on a loaded CPU: densitas' thread policy against PyTorch's default thread count.

    PYTHONPATH=src python benchmarks/bench_kde_load.py                  # busy processes on the other core(s)
    PYTHONPATH=src python benchmarks/bench_kde_load.py --busy 0         # an idle machine, for comparison

Starts ``--busy`` processes that spin (default: one per core but one, "the other cores"), waits ``--settle``
seconds, then times ``bandwidth`` (the median of ``--reps`` runs after a warm-up) on the same data twice: with
``DENSITAS_THREADS=auto`` (the policy: one thread for small problems, capped by the free cores) and with
``DENSITAS_THREADS=torch`` (PyTorch's own count, ``torch.get_num_threads()`` = the cores). The answers must be
equal to 1e-12; the script prints one JSON line per case and a Markdown table for RESULTS.md. Timings vary with
whatever else the machine runs: the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time

import numpy as np
import torch

from densitas.kde import bandwidth

CASES = (  # (method, rows, columns): the new user's report (plug-in, 5,000 rows) and a d-D LSCV beside it
    ("plugin", 5000, 1),
    ("lscv_h", 2000, 2),
    ("scott", 100_000, 1),
)


def _spin(stop) -> None:  # pragma: no cover - runs in the busy processes
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def _time(fn, reps: int) -> tuple[float, object]:
    out = fn()  # warm-up (the Triton-free CPU path still imports and caches on first use)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def measure(method: str, rows: int, cols: int, reps: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=rows) if cols == 1 else rng.normal(size=(rows, cols))
    out = {"method": method, "rows": rows, "columns": cols, "torch_threads": torch.get_num_threads()}
    answers = {}
    for setting in ("auto", "torch"):
        os.environ["DENSITAS_THREADS"] = setting
        secs, answers[setting] = _time(lambda: bandwidth(x, method, device="cpu"), reps)
        out[f"{setting}_s"] = secs
    os.environ.pop("DENSITAS_THREADS", None)
    np.testing.assert_allclose(answers["auto"], answers["torch"], rtol=1e-12)
    out["speedup"] = out["torch_s"] / out["auto_s"]
    out["load1"] = os.getloadavg()[0]
    return out


def main() -> None:
    cores = os.cpu_count() or 1
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--busy", type=int, default=max(cores - 1, 1), help="spinning processes (default: cores − 1)")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds between starting them and timing")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    busy = [ctx.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.busy)]
    for p in busy:
        p.start()
    try:
        time.sleep(args.settle)
        rows = [measure(m, n, d, args.reps, args.seed) for m, n, d in CASES]
    finally:
        stop.set()
        for p in busy:
            p.join(timeout=5)
    for r in rows:
        print(json.dumps(r))
    print(f"\n{cores} cores, {args.busy} busy process(es), torch threads {torch.get_num_threads()}\n")
    print("| method | rows × cols | policy (s) | torch default (s) | default / policy | load avg |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['method']} | {r['rows']:,} × {r['columns']} | {r['auto_s']:.3f} | {r['torch_s']:.3f} | "
              f"{r['speedup']:.1f}× | {r['load1']:.1f} |")


if __name__ == "__main__":
    main()
