"""AQP at scale: build the lineitem synopsis of a large TPC-H table and time queries beside exact DuckDB.

Issue 10's scale item (TPC-H SF10, 60 M rows, on a 2-core machine). Generates lineitem at ``--scale`` into
``--db`` if the table is absent, builds the synopsis over the evaluation columns and groups (the SF1
configuration) with DuckDB's ``memory_limit`` set (bounded memory: DuckDB spills), prints each build step's
time, then answers the seeded workload of :mod:`densitas.aqp.workload` (best of 3 per query) and the same
queries exactly, and prints median latency and speedup per number of predicate columns. Each query's
approximate answer is timed right before its exact one, and again in passes of the approximate queries alone
(:func:`densitas.aqp.workload.session_times`): an exact scan leaves the caches cold for the next few. Run it
under ``/usr/bin/time -v`` for the peak memory.

Usage::

    PYTHONPATH=src python benchmarks/aqp_scale.py --db /tmp/sf10.duckdb --scale 10 --memory-limit 4GB
"""

from __future__ import annotations

import argparse
import time

from _timing import StepClock

from densitas.aqp import Engine
from densitas.aqp import build as build_mod
from densitas.aqp.datasets import tpch_lineitem
from densitas.aqp.workload import generate, run, session_times
from densitas.cli.aqp import LINEITEM_COLUMNS, LINEITEM_GROUPS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--scale", type=float, default=10.0)
    ap.add_argument("--memory-limit", default="4GB", help="DuckDB memory_limit during the build ('' to keep)")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--max-sample-rows", type=int, default=None, help="the build's sample cap (default BuildOptions')")
    a = ap.parse_args()

    eng = Engine(a.db)
    if "lineitem" not in eng.con.tables():
        t = time.perf_counter()
        rows = tpch_lineitem(eng.con, a.scale)
        print(f"generated lineitem at scale {a.scale}: {rows:,} rows in {time.perf_counter() - t:.0f} s")
    if not a.no_build:
        if a.memory_limit:
            eng.con.execute(f"SET memory_limit = '{a.memory_limit}'")
        say = StepClock()
        t0 = say.start
        opts = build_mod.BuildOptions(**({"max_sample_rows": a.max_sample_rows} if a.max_sample_rows else {}))
        meta = build_mod.build(eng.con, "lineitem", LINEITEM_COLUMNS, LINEITEM_GROUPS, options=opts, progress=say)
        print(f"build {time.perf_counter() - t0:.1f} s; synopsis {meta['size_bytes'] / 1e6:.2f} MB")
    eng.close()

    eng = Engine(a.db, read_only=True)
    syn = eng._load("lineitem")
    print(f"{int(syn.N.sum()):,} rows; synopsis {syn.size_bytes() / 1e6:.2f} MB, {len(syn.s_gid):,} sample rows")
    queries = generate(eng, "lineitem", a.queries, seed=a.seed)
    res = run(eng, queries, reps=3)
    per_q = res.groupby("query").agg(n_cols=("n_cols", "first"), ms=("ms", "first"), exact_ms=("exact_ms", "first"))
    per_q["speedup"] = per_q.exact_ms / per_q.ms
    # the same queries again as a session of approximate queries only (no exact scan between them)
    per_q["session_ms"] = session_times(eng, queries, reps=3)[per_q.index.to_numpy()]
    for k, g in per_q.groupby("n_cols"):
        print(f"{k} predicate columns: {len(g)} queries, median {g.ms.median():.2f} ms, exact DuckDB "
              f"{g.exact_ms.median():.1f} ms, median speedup {g.speedup.median():.1f}x; as a session of "
              f"approximate queries only: median {g.session_ms.median():.2f} ms")
    print(f"all: median {per_q.ms.median():.2f} ms, exact {per_q.exact_ms.median():.1f} ms, speedup "
          f"{per_q.speedup.median():.1f}x; mean error {100 * res.rel_err.mean():.3f}%, p95 "
          f"{100 * res.rel_err.quantile(0.95):.3f}%, coverage {100 * res.covered.mean():.1f}%")


if __name__ == "__main__":
    main()
