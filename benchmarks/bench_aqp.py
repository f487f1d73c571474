"""AQP accuracy and speed: densitas synopses vs exact DuckDB on TPC-H lineitem and a synthetic table.

    PYTHONPATH=src python benchmarks/bench_aqp.py [--scale 1] [--rows 5000000] [--queries 500] [--budget 0.01]

Builds each table's synopsis (timed), runs the seeded workload of densitas.aqp.workload with the grid
estimator and the KDE-over-sample estimator of documents 000/003 on the same synopsis, and prints one table per
(table, estimator): mean / median / p95 relative error, 95% interval coverage, median latency, exact DuckDB
latency and the speedup.
"""

from __future__ import annotations

import argparse
import os
import tempfile

from densitas.aqp import Engine
from densitas.aqp.datasets import synthetic, tpch_lineitem
from densitas.aqp.workload import generate, run, summarize
from densitas.cli.aqp import LINEITEM_COLUMNS, LINEITEM_GROUPS, print_summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--budget", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--db", default=None, help="DuckDB file to use (default: a temporary one)")
    args = ap.parse_args()
    db = args.db or os.path.join(tempfile.mkdtemp(prefix="densitas-bench-"), "bench.duckdb")
    eng = Engine(db)
    if "lineitem" not in eng.con.tables():
        tpch_lineitem(eng.con, args.scale)
    if "synthetic" not in eng.con.tables():
        synthetic(eng.con, args.rows, seed=args.seed)
    eng.con.execute("CHECKPOINT")
    specs = [("lineitem", LINEITEM_COLUMNS, LINEITEM_GROUPS),
             ("synthetic", ["amount", "visits", "score", "price", "cost", "day"], ["region", "channel"])]
    for table, cols, groups in specs:
        meta = eng.build(table, cols, groups, budget_fraction=args.budget, seed=args.seed)
        print(f"{table}: {meta['rows']:,} rows; synopsis {meta['size_bytes'] / 1e6:.2f} MB = "
              f"{100 * meta['size_bytes'] / meta['table_bytes']:.2f}% of {meta['table_bytes'] / 1e6:.1f} MB; "
              f"build {meta['build_seconds']:.1f} s", flush=True)
        qs = generate(eng, table, args.queries, seed=args.seed)
        for method in ("grid", "kde"):
            res = run(eng, qs, method=method)
            print_summary(summarize(res), f"{table}, {method} estimator, budget {args.budget:g}")


if __name__ == "__main__":
    main()
