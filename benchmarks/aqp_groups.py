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
import json

import numpy as np

import densitas.aqp.estimator as est
from densitas.aqp import Engine
from densitas.aqp.connector import quote, table_ref
from densitas.aqp.workload import generate, session_times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="DuckDB file whose table has a synopsis")
    ap.add_argument("--table", required=True)
    ap.add_argument("--queries", type=int, default=60)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    eng = Engine(a.db, read_only=True)
    syn = eng.synopses().set_index("table_name").loc[a.table]
    keys = ", ".join(quote(c) for c in json.loads(syn["group_by"]))
    groups = eng.con.fetch_rows(f"SELECT count(*) FROM (SELECT DISTINCT {keys or 1} FROM {table_ref(a.table)})")[0][0]
    queries = generate(eng, a.table, a.queries, seed=a.seed)
    default = est.PRODUCT_GROUPS
    rows, answers = [], {}
    for name, limit in [("row-wise gathers", 0), ("per-group products", default)]:
        est.PRODUCT_GROUPS = limit
        best = session_times(eng, queries, reps=a.reps)
        answers[name] = [eng.query(q.sql).select_dtypes("number").to_numpy() for q in queries]
        rows.append((name, np.median(best), best.mean()))
    est.PRODUCT_GROUPS = default
    diff = max(float(np.nanmax(np.abs(x - y) / np.maximum(np.abs(x), 1e-9), initial=0.0))
               for x, y in zip(answers["row-wise gathers"], answers["per-group products"], strict=True))
    print(f"{a.table}: {groups} groups, {len(queries)} queries, best of {a.reps}")
    print(f"{'fit':<20} {'median ms':>10} {'mean ms':>10}")
    for name, med, mean in rows:
        print(f"{name:<20} {med:>10.2f} {mean:>10.2f}")
    print(f"speedup {rows[0][1] / rows[1][1]:.2f}x (median); largest relative difference between answers {diff:.1e}")


if __name__ == "__main__":
    main()
