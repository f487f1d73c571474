"""AQP query latency over many synopsis groups: the fit's per-group matrix products against row-wise gathers.

The estimator (:mod:`densitas.aqp.estimator`) forms each group's cross products and each row's leverage either
with one matrix product per group or, beyond ``PRODUCT_GROUPS`` groups, with a gather of each row's group
matrix. This runs the seeded workload of :mod:`densitas.aqp.workload` on a table's stored synopsis both ways
(best of ``--reps`` passes per query) and prints the median and mean latency and the largest difference
between the answers.

Usage::

    PYTHONPATH=src python benchmarks/aqp_groups.py --db eval.duckdb --table flights
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import densitas.aqp.estimator as est
from densitas.aqp import Engine
from densitas.aqp.workload import generate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="DuckDB file whose table has a synopsis")
    ap.add_argument("--table", required=True)
    ap.add_argument("--queries", type=int, default=60)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    eng = Engine(a.db, read_only=True)
    groups = len(eng._load(a.table).N)
    sqls = [q.sql for q in generate(eng, a.table, a.queries, seed=a.seed)]
    default = est.PRODUCT_GROUPS
    rows, answers = [], {}
    for name, limit in [("row-wise gathers", 0), ("per-group products", default)]:
        est.PRODUCT_GROUPS = limit
        best = np.full(len(sqls), np.inf)
        for _ in range(a.reps):
            for i, sql in enumerate(sqls):
                t = time.perf_counter()
                df = eng.query(sql)
                best[i] = min(best[i], time.perf_counter() - t)
                answers.setdefault(name, {})[i] = df.select_dtypes("number").to_numpy()
        rows.append((name, np.median(best) * 1e3, best.mean() * 1e3))
    est.PRODUCT_GROUPS = default
    diff = max(float(np.nanmax(np.abs(x - answers["per-group products"][i]) / np.maximum(np.abs(x), 1e-9),
                               initial=0.0)) for i, x in answers["row-wise gathers"].items())
    print(f"{a.table}: {groups} groups, {len(sqls)} queries, best of {a.reps}")
    print(f"{'fit':<20} {'median ms':>10} {'mean ms':>10}")
    for name, med, mean in rows:
        print(f"{name:<20} {med:>10.2f} {mean:>10.2f}")
    print(f"speedup {rows[0][1] / rows[1][1]:.2f}x (median); largest relative difference between answers {diff:.1e}")


if __name__ == "__main__":
    main()
