"""``densitas demo``, ``build``, ``query`` and ``bench aqp``: the approximate query engine from the shell."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from densitas.aqp import Engine
from densitas.aqp.workload import generate, run, summarize

__all__ = ["bench", "build", "demo", "query"]

console = Console(width=max(Console().width, 130))
LINEITEM_COLUMNS = ["l_quantity", "l_extendedprice", "l_discount", "l_tax", "l_shipdate", "l_commitdate",
                    "l_receiptdate"]
LINEITEM_GROUPS = ["l_returnflag", "l_linestatus"]


def _fmt(v: float) -> str:
    if not np.isfinite(v):
        return "NULL"
    return f"{v:,.6g}" if abs(v) < 1e6 else f"{v:,.0f}"


def print_frame(df: pd.DataFrame, title: str | None = None) -> None:
    t = Table(title=title)
    for c in df.columns:
        t.add_column(str(c), justify="right")
    for _, r in df.iterrows():
        t.add_row(*[_fmt(v) if isinstance(v, (float, np.floating)) else str(v) for v in r])
    console.print(t)


def print_summary(summary: pd.DataFrame, title: str) -> None:
    t = Table(title=title)
    t.add_column("queries")
    for c in summary.columns:
        t.add_column(c, justify="right")
    for name, r in summary.iterrows():
        t.add_row(str(name), *[f"{v:.3g}" if c != "answers" else f"{int(v)}" for c, v in r.items()])
    console.print(t)


def build(db: str, table: str, columns: str | None, group_by: str | None, **options) -> dict:
    eng = Engine(db)
    try:
        meta = eng.build(table, columns, group_by, progress=True, **options)
    finally:
        eng.close()
    console.print(f"synopsis of [bold]{table}[/]: {meta['rows']:,} rows, {meta['size_bytes'] / 1e6:.2f} MB "
                  f"({100 * meta['size_bytes'] / max(meta['table_bytes'], 1):.2f}% of the table's "
                  f"{meta['table_bytes'] / 1e6:.1f} MB), built in {meta['build_seconds']:.1f} s")
    return meta


def query(db: str, sql: str, exact: bool, confidence: float, fallback: str, method: str) -> None:
    eng = Engine(db)
    try:
        t0 = time.perf_counter()
        df = eng.exact(sql) if exact else eng.query(sql, confidence=confidence, fallback=fallback, method=method)
        ms = (time.perf_counter() - t0) * 1e3
    finally:
        eng.close()
    if exact:
        df = df[[c for c in df.columns if not c.endswith(("_ci_low", "_ci_high"))]]
    how = df.attrs.get("method", "")
    note = f" (fell back: {df.attrs['reason']})" if "reason" in df.attrs else ""
    print_frame(df, title=f"{how}{note}, {ms:.2f} ms" + ("" if exact else f", {100 * confidence:g}% intervals"))


def bench(db: str, table: str, queries: int, seed: int, method: str = "grid", show: int = 0) -> pd.DataFrame:
    eng = Engine(db)
    try:
        syn = eng._load(table)
        qs = generate(eng, table, queries, seed=seed)
        res = run(eng, qs, method=method)
    finally:
        eng.close()
    summary = summarize(res)
    if show:
        sample = res.drop_duplicates("query").head(show)
        t = Table(title="queries (first answer of each)")
        for c in ("sql", "exact", "approx", "rel. error", "in 95% CI", "ms", "exact ms"):
            t.add_column(c, justify="left" if c == "sql" else "right")
        for _, r in sample.iterrows():
            t.add_row(qs[int(r["query"])].sql.replace(f'FROM "{table}" ', "FROM … "), _fmt(r["exact"]),
                      _fmt(r["estimate"]), f"{100 * r['rel_err']:.2f}%", "yes" if r["covered"] else "no",
                      f"{r['ms']:.2f}", f"{r['exact_ms']:.1f}")
        console.print(t)
    size = float(syn.meta["size_bytes"])
    print_summary(summary, f"{table}: {queries} queries (seed {seed}), {method} estimator; synopsis "
                           f"{size / 1e6:.2f} MB = {100 * size / float(syn.meta['table_bytes']):.2f}% of the table, "
                           f"built in {float(syn.meta['build_seconds']):.1f} s")
    return summary


def demo(db: str, scale: float, queries: int, seed: int, rebuild: bool) -> pd.DataFrame:
    from densitas.aqp.datasets import tpch_lineitem

    path = Path(db)
    eng = Engine(str(path))
    try:
        have = "lineitem" in eng.con.tables()
        if not have or rebuild:
            t0 = time.perf_counter()
            with console.status(f"generating TPC-H lineitem (scale {scale:g}) with tpchgen-cli into {path}"):
                n = tpch_lineitem(eng.con, scale)
            console.print(f"generated lineitem: {n:,} rows in {time.perf_counter() - t0:.1f} s → {path}")
        if rebuild or not have or eng.synopses().query("table_name == 'lineitem'").empty:
            build_needed = True
        else:
            try:
                eng.validate("lineitem")
                build_needed = False
            except Exception:
                build_needed = True
    finally:
        eng.close()
    if build_needed:
        build(str(path), "lineitem", ",".join(LINEITEM_COLUMNS), ",".join(LINEITEM_GROUPS))
    example = ("SELECT l_returnflag, COUNT(*) AS n, AVG(l_extendedprice) AS avg_price FROM lineitem "
               "WHERE l_quantity BETWEEN 10 AND 20 AND l_discount < 0.05 GROUP BY l_returnflag")
    console.print(f"\n[bold]{example}[/]")
    query(str(path), example, exact=False, confidence=0.95, fallback="error", method="grid")
    query(str(path), example, exact=True, confidence=0.95, fallback="error", method="grid")
    return bench(str(path), "lineitem", queries, seed, show=8)
