"""AQP inside PostgreSQL: TPC-H lineitem in a temporary PostgreSQL server, synopsis build time, query latency and
accuracy beside exact PostgreSQL, and ``Engine.refresh`` after appending 1% of the rows against a full rebuild.

Steps, each timed:

1. ``tpchgen-cli`` writes lineitem at ``--scale`` as Parquet (as ``densitas demo`` does); DuckDB reads it and
   writes CSV, which is streamed into a fresh temporary PostgreSQL server (:class:`densitas.aqp.pgtemp.TempPostgres`)
   with ``COPY ... FROM STDIN``: the rows of the first ``1 - --append`` of the orders (by ``l_orderkey``) first;
2. the synopsis over the evaluation columns and groups (``densitas demo``'s), built in the server with
   ``append_key="l_orderkey"``;
3. the seeded workload of :mod:`densitas.aqp.workload` (``--queries`` queries, best of 3 per approximate answer)
   and the same queries exactly in PostgreSQL: error, interval coverage, median latency, speedup;
4. the remaining orders appended (``--append``, 1% by default) and ``Engine.refresh`` timed, the workload re-run
   on the refreshed synopsis; then a full rebuild of the grown table timed beside it.

Usage::

    .venv/bin/python benchmarks/bench_aqp_postgres.py --scale 1 --queries 100
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import duckdb
import psycopg
from _timing import StepClock
from sqlglot import exp

from densitas.aqp import Engine
from densitas.aqp import build as build_mod
from densitas.aqp.datasets import _tpchgen
from densitas.aqp.pgtemp import TempPostgres
from densitas.aqp.workload import generate, run, summarize
from densitas.cli.aqp import LINEITEM_COLUMNS, LINEITEM_GROUPS

SETTINGS = {"shared_buffers": "2GB", "work_mem": "256MB", "maintenance_work_mem": "1GB",
            "max_parallel_workers_per_gather": "2", "temp_buffers": "1GB"}


def copy_rows(duck: duckdb.DuckDBPyConnection, select: str, url: str, table: str, tmp: Path) -> int:
    """Stream the rows of the DuckDB query ``select`` into the PostgreSQL table ``table`` as CSV."""
    csv = tmp / f"{table}.csv"
    duck.execute(f"COPY ({select}) TO '{csv}' (FORMAT csv, HEADER false)")
    with psycopg.connect(url) as con, con.cursor() as cur:
        with cur.copy(f'COPY "{table}" FROM STDIN (FORMAT csv)') as copy, open(csv, "rb") as f:
            while block := f.read(1 << 20):
                copy.write(block)
        n = cur.rowcount
    csv.unlink()
    return n


def create_like(duck: duckdb.DuckDBPyConnection, source: str, url: str, table: str) -> None:
    """Create ``table`` in PostgreSQL with the columns and types of the DuckDB table ``source``."""
    defs = [exp.ColumnDef(this=exp.to_identifier(c, quoted=True), kind=exp.DataType.build(t, dialect="duckdb"))
            for c, t, *_ in duck.execute(f"DESCRIBE {source}").fetchall()]
    ddl = exp.Create(this=exp.Schema(this=exp.table_(table, quoted=True), expressions=defs), kind="TABLE")
    with psycopg.connect(url, autocommit=True) as con:
        con.execute(ddl.sql("postgres"))


def fmt_summary(title: str, s) -> str:
    cols = ["answers", "mean_err_%", "median_err_%", "p95_err_%", "coverage_%", "median_ms", "exact_ms", "speedup"]
    lines = [f"\n{title}", "| | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, r in s.iterrows():
        lines.append(f"| {name} | " + " | ".join(f"{r[c]:.3g}" if c != "answers" else f"{int(r[c])}"
                                              for c in cols) + " |")
    return "\n".join(lines)


def worst(res, queries, k: int = 3) -> str:
    """The ``k`` answers with the largest relative error, with their SQL."""
    top = res.sort_values("rel_err", ascending=False).head(k)
    return "\n".join(f"  {100 * r.rel_err:.2f}% (exact {r.exact:.6g}, estimate {r.estimate:.6g}, covered {r.covered}): "
                     f"{queries[int(r.query)].sql}" for r in top.itertuples())


def timed_build(eng: Engine) -> tuple[float, dict]:
    """Build the lineitem synopsis, printing each step's time; returns the seconds and the metadata."""
    say = StepClock("  ")
    t0 = say.start

    meta = build_mod.build(eng.con, "lineitem", LINEITEM_COLUMNS, LINEITEM_GROUPS,
                           build_mod.BuildOptions(append_key="l_orderkey"), progress=say)
    eng._cache.pop("lineitem", None)
    return time.perf_counter() - t0, meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--append", type=float, default=0.01, help="fraction of the orders appended before refresh")
    ap.add_argument("--seed", type=int, default=5)
    a = ap.parse_args()
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="densitas-bench-pg-") as tmp_s, TempPostgres(settings=SETTINGS) as pg:
        tmp = Path(tmp_s)
        t = time.perf_counter()
        subprocess.run([_tpchgen(), "parquet", "-s", repr(float(a.scale)), "--tables=lineitem",
                        f"--output-dir={tmp}"], check=True, capture_output=True)
        duck = duckdb.connect()
        duck.execute(f"CREATE VIEW li AS SELECT * FROM read_parquet('{tmp / 'lineitem.parquet'}')")
        max_key = duck.execute("SELECT max(l_orderkey) FROM li").fetchone()[0]
        cut = int(max_key * (1 - a.append))
        print(f"tpchgen-cli scale {a.scale:g}: {time.perf_counter() - t:.1f} s", flush=True)
        t = time.perf_counter()
        create_like(duck, "li", pg.url, "lineitem")
        n0 = copy_rows(duck, f"SELECT * FROM li WHERE l_orderkey <= {cut} ORDER BY l_orderkey", pg.url, "lineitem",
                       tmp)
        with psycopg.connect(pg.url, autocommit=True) as con:
            con.execute("VACUUM ANALYZE lineitem")
        print(f"loaded {n0:,} rows into PostgreSQL with COPY in {time.perf_counter() - t:.1f} s", flush=True)

        eng = Engine(pg.url)
        t_build, meta = timed_build(eng)
        print(f"build: {t_build:.1f} s; synopsis {meta['size_bytes'] / 1e6:.2f} MB = "
              f"{100 * meta['size_bytes'] / meta['table_bytes']:.2f}% of the table's "
              f"{meta['table_bytes'] / 1e6:.0f} MB (pg_table_size)", flush=True)
        queries = generate(eng, "lineitem", a.queries, seed=a.seed)
        res = run(eng, queries, reps=3)
        print(fmt_summary(f"fresh build, {n0:,} rows: approximate (best of 3) beside exact PostgreSQL",
                          summarize(res)), flush=True)
        print("worst answers:\n" + worst(res, queries), flush=True)

        t = time.perf_counter()
        n1 = copy_rows(duck, f"SELECT * FROM li WHERE l_orderkey > {cut} ORDER BY l_orderkey", pg.url, "lineitem", tmp)
        print(f"\nappended {n1:,} rows ({100 * n1 / n0:.2f}%) in {time.perf_counter() - t:.1f} s", flush=True)
        t = time.perf_counter()
        ref = eng.refresh("lineitem")
        t_refresh = time.perf_counter() - t
        sizes = [json.loads(m["options"])["sample_size"] for m in (meta, ref)]
        print(f"refresh: {ref['refresh']} {ref['appended']:,} rows in {t_refresh:.1f} s (sample {sizes[0]:,} -> "
              f"{sizes[1]:,} rows)", flush=True)
        queries2 = generate(eng, "lineitem", a.queries, seed=a.seed + 1)
        res2 = run(eng, queries2, reps=3)
        print(fmt_summary(f"after refresh, {n0 + n1:,} rows", summarize(res2)), flush=True)
        print("worst answers:\n" + worst(res2, queries2), flush=True)
        print("\nfull rebuild:")
        t_rebuild, _ = timed_build(eng)
        res3 = run(eng, queries2, reps=3)  # the same queries as after the refresh
        print(fmt_summary(f"full rebuild, {n0 + n1:,} rows, the same queries", summarize(res3)), flush=True)
        print("worst answers:\n" + worst(res3, queries2), flush=True)
        print(f"\n| step | seconds |\n|---|---|\n| build ({n0:,} rows) | {t_build:.1f} |\n"
              f"| refresh after appending {n1:,} rows | {t_refresh:.1f} |\n"
              f"| full rebuild ({n0 + n1:,} rows) | {t_rebuild:.1f} |\n"
              f"| refresh speedup | {t_rebuild / t_refresh:.1f}x |")
        eng.close()
        duck.close()
    print(f"total {time.perf_counter() - t_all:.0f} s")


if __name__ == "__main__":
    main()
