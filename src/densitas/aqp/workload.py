"""The seeded AQP workload and its scoring against exact DuckDB answers (``densitas bench aqp``).

Each query draws, with the generator seeded by ``seed``:

* 1, 2 or 3 predicate columns (uniformly) among the synopsis' numeric/date columns;
* a target selectivity ``s`` log-uniform in [1%, 50%], shared evenly (``s^(1/k)`` each) between the columns;
  each column's range is placed uniformly among the ranges of that marginal mass (taken from the synopsis'
  histogram), its literals rounded to the column's precision, written as ``BETWEEN``, ``>=``/``<``,
  ``>``/``<=`` or one-sided at the ends;
* COUNT(*), SUM(y) or AVG(y) (uniformly) with ``y`` a random numeric column;
* with probability 1/3, GROUP BY a random GROUP BY column of the synopsis.

A query is kept when its exact selectivity (a DuckDB ``count(*)``) lies in [1%, 50%]. Every answer row (one
per group) is compared with the exact answer: relative error, and whether the interval covers it.
"""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from densitas.aqp.connector import quote, table_ref
from densitas.aqp.engine import Engine

__all__ = ["WorkloadQuery", "generate", "run", "session_times", "summarize"]


@dataclass
class WorkloadQuery:
    sql: str
    n_cols: int
    func: str
    grouped: bool
    selectivity: float


def _literal(info, v: float) -> str:
    if info.kind == "date":
        return f"DATE '{(_dt.date(1970, 1, 1) + _dt.timedelta(days=round(v))).isoformat()}'"
    if info.kind == "timestamp":
        ts = _dt.datetime(1970, 1, 1) + _dt.timedelta(microseconds=round(v))
        return f"TIMESTAMP '{ts.isoformat(sep=' ')}'"
    if info.step > 0:
        digits = max(0, round(-np.log10(info.step)))
        return f"{round(v / info.step) * info.step:.{digits}f}"
    return f"{v:.6g}"


def generate(engine: Engine, table: str, n_queries: int, *, seed: int = 0, max_cols: int = 3,
             selectivity: tuple[float, float] = (0.01, 0.5), max_tries: int = 40) -> list[WorkloadQuery]:
    syn = engine._load(table)
    rng = np.random.default_rng(seed)
    infos = syn.infos
    numeric = [i for i, info in enumerate(infos) if info.numeric]
    n_rows = float(syn.N.sum())
    cdfs = []
    for j in range(len(infos)):
        c = syn.fine[j].sum(axis=0)[1:]
        cdfs.append(np.concatenate([[0.0], np.cumsum(c) / max(c.sum(), 1)]))
    out: list[WorkloadQuery] = []
    lo_s, hi_s = selectivity
    while len(out) < n_queries:
        k = int(rng.integers(1, min(max_cols, len(infos)) + 1))
        cols = sorted(rng.choice(len(infos), size=k, replace=False).tolist())
        for _ in range(max_tries):
            s = float(np.exp(rng.uniform(np.log(lo_s), np.log(hi_s))))
            m = s ** (1.0 / k)
            preds = []
            for j in cols:
                info, cdf = infos[j], cdfs[j]
                a = float(rng.uniform(0.0, 1.0 - m))
                a = 0.0 if a < 0.1 * (1 - m) and rng.random() < 0.5 else a
                b = a + m
                uppers = info.uppers()

                def q(p: float, info=info, cdf=cdf, uppers=uppers) -> float:
                    t = int(np.clip(np.searchsorted(cdf, p, side="left"), 1, len(info.edges)))
                    lo_e, hi_e = info.edges[t - 1], uppers[t - 1]
                    if info.discrete:
                        return lo_e
                    frac = (p - cdf[t - 1]) / max(cdf[t] - cdf[t - 1], 1e-300)
                    return lo_e + frac * (hi_e - lo_e)

                col = quote(info.name)
                va, vb = _literal(info, q(a)), _literal(info, q(b))
                form = int(rng.integers(3))
                if a == 0.0:
                    preds.append(f"{col} {'<' if form else '<='} {vb}")
                elif b >= 0.999:
                    preds.append(f"{col} {'>=' if form else '>'} {va}")
                elif form == 0:
                    preds.append(f"{col} BETWEEN {va} AND {vb}")
                elif form == 1:
                    preds.append(f"{col} >= {va} AND {col} < {vb}")
                else:
                    preds.append(f"{col} > {va} AND {col} <= {vb}")
            where = " AND ".join(preds)
            cnt = engine.con.fetch_rows(f"SELECT count(*) FROM {table_ref(table)} WHERE {where}")[0][0]
            sel = cnt / n_rows
            if lo_s <= sel <= hi_s:
                break
        else:
            continue
        func = ["count", "sum", "avg"][int(rng.integers(3))]
        if func == "count" or not numeric:
            agg, func = "COUNT(*) AS v", "count"
        else:
            y = infos[int(rng.choice(numeric))].name
            agg = f"{func.upper()}({quote(y)}) AS v"
        grouped = bool(syn.group_by) and rng.random() < 1 / 3
        if grouped:
            g = quote(syn.group_by[int(rng.integers(len(syn.group_by)))])
            sql = f"SELECT {g}, {agg} FROM {table_ref(table)} WHERE {where} GROUP BY {g}"
        else:
            sql = f"SELECT {agg} FROM {table_ref(table)} WHERE {where}"
        out.append(WorkloadQuery(sql, k, func, grouped, sel))
    return out


def _best_time(fn, reps: int) -> tuple[float, object]:
    best, res = float("inf"), None
    for _ in range(reps):
        t0 = time.perf_counter()
        res = fn()
        best = min(best, time.perf_counter() - t0)
    return best, res


def run(engine: Engine, queries: list[WorkloadQuery], *, method: str = "grid", confidence: float = 0.95,
        reps: int = 3, exact_reps: int = 1) -> pd.DataFrame:
    """One row per answer (query × group): estimate, exact, relative error, coverage, latencies."""
    rows = []
    for qi, wq in enumerate(queries):
        t_apx, apx = _best_time(lambda wq=wq: engine.query(wq.sql, confidence=confidence, method=method), reps)
        t_ex, ex = _best_time(lambda wq=wq: engine.exact(wq.sql), exact_reps)
        keys = [c for c in ex.columns if c not in ("v", "v_ci_low", "v_ci_high")]
        merged = ex[[*keys, "v"]].merge(apx, on=keys, how="left", suffixes=("_exact", "")) if keys else \
            pd.concat([ex[["v"]].rename(columns={"v": "v_exact"}), apx], axis=1)
        for _, r in merged.iterrows():
            e, a = float(r["v_exact"]), float(r["v"])
            rel = abs(a - e) / abs(e) if e not in (0.0,) and np.isfinite(e) else np.nan
            rows.append({"query": qi, "n_cols": wq.n_cols, "func": wq.func, "grouped": wq.grouped,
                         "selectivity": wq.selectivity, "exact": e, "estimate": a, "rel_err": rel,
                         "covered": bool(r["v_ci_low"] <= e <= r["v_ci_high"]) if np.isfinite(e) else np.nan,
                         "ms": t_apx * 1e3, "exact_ms": t_ex * 1e3})
    return pd.DataFrame(rows)


def session_times(engine: Engine, queries: list[WorkloadQuery], *, method: str = "grid", confidence: float = 0.95,
                  reps: int = 3) -> np.ndarray:
    """(len(queries),): each query's latency in ms, the approximate queries answered one after another with
    nothing else in between (an interactive session of them): the whole list ``reps`` times, each query's best
    pass kept, so that every query follows a different one, never itself.

    :func:`run` answers each query's exact SQL right after its approximate one, and a scan of a large table
    leaves the caches cold for the next few approximate queries (on TPC-H SF10, the first one after a scan takes
    about twice as long; benchmarks/RESULTS.md): benchmarks report both.

    Examples
    --------
    >>> import duckdb
    >>> from densitas.aqp import Engine
    >>> eng = Engine(duckdb.connect())
    >>> eng.con.execute("CREATE TABLE t AS SELECT i::DOUBLE AS x FROM range(5000) r(i)")
    >>> _ = eng.build("t", sample_size=500)
    >>> ms = session_times(eng, generate(eng, "t", 3, seed=1), reps=1)
    >>> ms.shape, bool((ms > 0).all())
    ((3,), True)
    """
    best = np.full(len(queries), np.inf)
    for _ in range(reps):
        for i, wq in enumerate(queries):
            t0 = time.perf_counter()
            engine.query(wq.sql, confidence=confidence, method=method)
            best[i] = min(best[i], (time.perf_counter() - t0) * 1e3)
    return best


def summarize(res: pd.DataFrame) -> pd.DataFrame:
    """Accuracy and latency per number of predicate columns and overall."""
    def one(d: pd.DataFrame) -> dict:
        per_q = d.groupby("query")[["ms", "exact_ms"]].first()
        err = d["rel_err"].dropna()
        return {"answers": len(d), "mean_err_%": 100 * err.mean(), "median_err_%": 100 * err.median(),
                "p95_err_%": 100 * err.quantile(0.95), "coverage_%": 100 * d["covered"].dropna().mean(),
                "median_ms": per_q["ms"].median(), "exact_ms": per_q["exact_ms"].median(),
                "speedup": float((per_q["exact_ms"] / per_q["ms"]).median())}
    parts = {f"{k} col": one(d) for k, d in res.groupby("n_cols")}
    for f, d in res.groupby("func"):
        parts[f] = one(d)
    parts["grouped"] = one(res[res["grouped"]]) if res["grouped"].any() else None
    parts["all"] = one(res)
    return pd.DataFrame({k: v for k, v in parts.items() if v is not None}).T
