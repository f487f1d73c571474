"""The standing evaluation of approximate answers (``densitas bench aqp``, ``benchmarks/bench_aqp.py``).

For each table of :data:`densitas.aqp.datasets.EVAL_TABLES` (or any table with given columns) it builds the
densitas synopsis, draws a random workload and answers every query three ways in the same run: from the
synopsis (:meth:`Engine.query`), exactly (DuckDB), and from the *peer* — a 1% Bernoulli row sample of the table
with CLT intervals, what a user would try first. The workload and the scoring follow the independent checker
``../shared/tools/aqp-check.py``:

* each query has 1–3 range predicates on distinct predicate columns; a predicate's bounds are the column's
  quantiles at ``a ~ U(0, 0.8)`` and ``min(1, a + U(0.15, 0.9))``, written as ``BETWEEN``, ``>=`` or ``<``
  (uniformly); a query keeping under 1% of the rows is dropped and another drawn (the checker only drops it);
* the aggregate is ``COUNT(*)``, ``SUM(y)``, ``AVG(y)`` in turn, ``y`` a random numeric predicate column; about
  a third (probability 0.35) of the queries are grouped by a random group column;
* every group holding at least 1% of the table is one *answer*, scored by its relative error
  ``|estimate - truth| / scale`` with ``scale = |truth|``, except that a SUM or AVG whose truth is near zero is
  scored against ``0.1 * sd(y)`` (times the rows of the group's box for SUM) when that is larger; smaller
  groups are not scored. A group the method does not return counts as the estimate 0 (interval [0, 0]); a
  query the engine raises on scores error 1 and no coverage for each of its answers.

The quantiles are read from one 2,001-point ``quantile_cont`` grid per column (linear in between) instead of
one scan per predicate. Everything random derives from ``seed`` and the table's name: a table's workload,
synopsis sample and peer sample are the same whichever other tables run beside it.

Per answer the interval is scored from both sides (``miss_low``: the truth lies below the interval, the
estimate is too high; ``miss_high``: above it) and by its half-width relative to ``scale``. An *exact* answer
(an interval holding the truth and no wider than the engine's allowance for float rounding: the synopsis'
grids hold it) is counted apart (:attr:`Metrics.exact`):
it is no 95% interval, and its certain coverage would read as intervals too wide; the coverage is that of the
other answers (a zero-width interval that misses the truth is one of them, and a miss). :class:`Metrics`
summarise a set of answers; :class:`TableResult` holds the answers and the metrics overall, per aggregate and
per number of predicate columns, for densitas and for the peer, and the goals of issue 10: mean error <= 1%,
p95 <= 5%, 95% coverage within 90–98% (met by a table whose every answer is exact; on fewer than 20 answers that
are not, a binomial test of their misses: :func:`coverage_met`), mean error at most half the peer's.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import binom

from densitas.aqp.connector import Connector, quote, table_ref
from densitas.aqp.engine import ROUNDING, Engine
from densitas.aqp.sql import named_as, table_key
from densitas.exceptions import DensitasError, InputError

__all__ = ["FUNCS", "GOALS", "MIN_SCORED", "Answer", "EvalQuery", "Metrics", "TableResult", "coverage_met",
           "evaluate", "evaluate_table", "fresh_seed", "make_workload", "metrics", "write_answers"]

PEER_RATE = 0.01  # the peer's Bernoulli sampling rate
MIN_SHARE = 0.01  # queries and groups holding less of the table are not scored
Z95 = 1.959963984540054
FUNCS = ("COUNT", "SUM", "AVG")
GOALS = {"mean": 0.01, "p95": 0.05, "coverage_low": 0.90, "coverage_high": 0.98, "peer_ratio": 0.5}
#: the coverage goal's rate is judged on at least this many answers that rest on the sample (coverage_met)
MIN_SCORED = 20
_GRID = np.linspace(0.0, 1.0, 2001)


def fresh_seed() -> int:
    """A fresh random seed (printed by the callers so that a run can be replayed)."""
    return int.from_bytes(os.urandom(4), "little")


@dataclass(frozen=True)
class EvalQuery:
    """One workload query: its SQL and what it asks."""

    sql: str
    func: str  # COUNT, SUM or AVG
    column: str | None  # the aggregated column (None for COUNT)
    n_cols: int  # predicate columns
    group: str | None  # the GROUP BY column
    where: str


@dataclass
class Answer:
    """One scored answer: a query's group (or the query, ungrouped), with densitas' and the peer's estimate."""

    table: str
    query: int  # index of the query in the table's workload
    sql: str
    func: str
    n_cols: int
    group: str | None
    key: Any  # the group's value (None for an ungrouped query)
    n_box: int  # rows of the table in the query's box (and group)
    truth: float
    scale: float  # what the error is relative to
    est: float
    lo: float
    hi: float
    peer_est: float
    peer_lo: float
    peer_hi: float
    ms: float = math.nan  # densitas' latency for the query
    failed: str | None = None  # the engine's error, when it raised

    @property
    def err(self) -> float:
        return 1.0 if self.failed else abs(self.est - self.truth) / self.scale

    @property
    def covered(self) -> bool:
        return self.failed is None and self.lo <= self.truth <= self.hi

    @property
    def exact(self) -> bool:
        """An interval that holds the truth and is at most ``4 · ROUNDING · max(|est|, scale)`` wide, twice the
        engine's float-rounding widening (:data:`~densitas.aqp.engine.ROUNDING` of the estimate each side): an
        answer the grids hold exactly.

        Examples
        --------
        >>> a = Answer("t", 0, "q", "SUM", 1, None, None, 10, 50.0, 50.0, 50.0, 50.0 - 5e-8, 50.0 + 5e-8,
        ...            49.0, 40.0, 58.0)
        >>> a.exact, dataclasses.replace(a, lo=49.0, hi=51.0).exact
        (True, False)
        """
        return self.covered and self.hi - self.lo <= 4 * ROUNDING * max(abs(self.est), self.scale)

    @property
    def miss_low(self) -> bool:
        """The truth lies below the interval (the estimate is too high)."""
        return self.failed is None and self.truth < self.lo

    @property
    def miss_high(self) -> bool:
        """The truth lies above the interval (the estimate is too low)."""
        return self.failed is None and self.truth > self.hi

    @property
    def half_width(self) -> float:
        return math.nan if self.failed else (self.hi - self.lo) / 2 / self.scale

    @property
    def peer_err(self) -> float:
        return abs(self.peer_est - self.truth) / self.scale

    @property
    def peer_covered(self) -> bool:
        return self.peer_lo <= self.truth <= self.peer_hi

    @property
    def peer_miss_low(self) -> bool:
        return self.truth < self.peer_lo

    @property
    def peer_miss_high(self) -> bool:
        return self.truth > self.peer_hi

    @property
    def peer_half_width(self) -> float:
        return (self.peer_hi - self.peer_lo) / 2 / self.scale

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["key"] = None if self.key is None else str(self.key)
        for name in ("err", "covered", "exact", "miss_low", "miss_high", "half_width", "peer_err", "peer_covered",
                     "peer_miss_low", "peer_miss_high", "peer_half_width"):
            d[name] = getattr(self, name)
        return d


@dataclass(frozen=True)
class Metrics:
    """Accuracy of a set of answers (fractions, not percent)."""

    answers: int
    mean: float  # mean relative error
    p95: float  # its 95th percentile
    coverage: float  # share of 95% intervals holding the truth
    miss_low: float  # share with the truth below the interval
    miss_high: float  # share with the truth above the interval
    half_width: float  # mean interval half-width relative to the truth (its scale), exact answers' (0) included
    exact: int = 0  # answers exact (Answer.exact): not in coverage, miss_low, miss_high (NaN when all are)


def metrics(answers: Sequence[Answer], *, peer: bool = False) -> Metrics:
    """:class:`Metrics` of densitas' answers, or of the peer's (``peer=True``; the peer has no exact answers).

    Examples
    --------
    >>> a = Answer("t", 0, "SELECT ...", "COUNT", 1, None, None, 10, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 9.0, 11.0)
    >>> b = dataclasses.replace(a, est=9.0, lo=8.0, hi=8.5)                # a miss: the truth above it
    >>> m = metrics([a, b])
    >>> m.exact, m.coverage, m.miss_high, m.mean                          # a is exact: b alone is scored
    (1, 0.0, 1.0, 0.05)
    """
    if not answers:
        return Metrics(0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
    p = "peer_" if peer else ""
    get = lambda name, among=answers: np.array([getattr(a, p + name) for a in among], dtype=np.float64)
    err, hw = get("err"), get("half_width")
    scored = [a for a in answers if not a.exact] if not peer else list(answers)
    rate = (lambda name: float(get(name, scored).mean())) if scored else (lambda name: math.nan)
    return Metrics(len(answers), float(err.mean()), float(np.quantile(err, 0.95)), rate("covered"),
                   rate("miss_low"), rate("miss_high"), float(np.nanmean(hw)) if np.isfinite(hw).any() else math.nan,
                   len(answers) - len(scored))


def coverage_met(coverage: float, scored: int) -> bool:
    """Whether ``scored`` 95% intervals (the answers that are not exact) covering ``coverage`` of their truths meet
    the coverage goal: within 90–98%, judged on at least :data:`MIN_SCORED` of them. Fewer cannot tell a rate
    to that width (one covered answer reads 100%, one miss 0%): they meet it unless they miss more often than 95%
    intervals would, a one-sided binomial test at 5% (no answers to score: met; one answer alone that misses:
    not, as P = 5% exactly).

    Examples
    --------
    >>> coverage_met(0.95, 300), coverage_met(0.99, 300), coverage_met(1.0, 1), coverage_met(0.0, 1)
    (True, False, True, False)
    >>> coverage_met(0.9, 10), coverage_met(0.7, 10)                  # 1 miss of 10 is usual, 3 are not
    (True, False)
    """
    if scored <= 0:
        return True
    if scored >= MIN_SCORED:
        return GOALS["coverage_low"] <= coverage <= GOALS["coverage_high"]
    misses = round((1 - coverage) * scored)
    return misses == 0 or float(binom.sf(misses - 1, scored, 0.05)) > 0.05


@dataclass
class TableResult:
    """The evaluation of one table: its answers and their metrics, for densitas and the peer."""

    table: str
    role: str
    rows: int
    seed: int
    columns: list[str]
    group_by: list[str]
    queries: int  # queries run (each keeps >= 1% of the rows)
    answers: list[Answer]
    unscored: int  # groups under 1% of the table, or with a NULL truth
    failed: int  # queries the engine raised on
    build_seconds: float = math.nan
    synopsis_bytes: int = 0
    table_bytes: int = 0
    peer_rows: int = 0
    median_ms: float = math.nan
    overall: Metrics = field(init=False)
    peer: Metrics = field(init=False)
    by_func: dict[str, tuple[Metrics, Metrics]] = field(init=False)
    by_cols: dict[int, tuple[Metrics, Metrics]] = field(init=False)

    def __post_init__(self) -> None:
        self.overall = metrics(self.answers)
        self.peer = metrics(self.answers, peer=True)
        self.by_func = {f: (metrics(a), metrics(a, peer=True))
                        for f in FUNCS if (a := [x for x in self.answers if x.func == f])}
        self.by_cols = {k: (metrics(a), metrics(a, peer=True))
                        for k in (1, 2, 3) if (a := [x for x in self.answers if x.n_cols == k])}

    @property
    def goals(self) -> dict[str, bool]:
        """Issue 10's goals, each met or not."""
        m, p = self.overall, self.peer
        return {"mean <= 1%": m.mean <= GOALS["mean"], "p95 <= 5%": m.p95 <= GOALS["p95"],
                "coverage 90-98%": m.answers > 0 and coverage_met(m.coverage, m.answers - m.exact),
                "mean <= peer/2": m.mean <= GOALS["peer_ratio"] * p.mean}

    @property
    def meets_goals(self) -> bool:
        return bool(self.answers) and all(self.goals.values())

    def worst(self, k: int = 5, *, per_query: bool = True) -> list[Answer]:
        """The ``k`` answers with the largest error; ``per_query``: at most one (its worst) per query, so that
        the groups of one grouped query do not fill the list."""
        out: list[Answer] = []
        seen: set[int] = set()
        for a in sorted(self.answers, key=lambda a: -a.err):
            if per_query and a.query in seen:
                continue
            seen.add(a.query)
            out.append(a)
            if len(out) == k:
                break
        return out

    def summary(self) -> dict[str, Any]:
        """A JSON-able summary (no answers)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "answers"}
        d["overall"], d["peer"] = dataclasses.asdict(self.overall), dataclasses.asdict(self.peer)
        d["by_func"] = {k: {"densitas": dataclasses.asdict(a), "peer": dataclasses.asdict(b)}
                        for k, (a, b) in self.by_func.items()}
        d["by_cols"] = {str(k): {"densitas": dataclasses.asdict(a), "peer": dataclasses.asdict(b)}
                        for k, (a, b) in self.by_cols.items()}
        d["goals"], d["meets_goals"] = self.goals, self.meets_goals
        return d


# ---- workload -------------------------------------------------------------------------------------------------


def _types(con: Connector, table: str) -> dict[str, str]:
    return {c: t.upper() for c, t in con.columns(table)}


def _is_time(sql_type: str) -> bool:
    return sql_type.startswith(("DATE", "TIMESTAMP"))


def _expr(col: str, sql_type: str) -> str:
    return f"epoch({quote(col)})" if _is_time(sql_type) else quote(col)


def _literal(sql_type: str, v: float) -> str:
    if _is_time(sql_type):
        ts = np.datetime64(math.floor(v), "s")
        return f"DATE '{ts.astype('datetime64[D]')}'" if sql_type == "DATE" else f"TIMESTAMP '{ts}'"
    return repr(float(v))


def make_workload(con: Connector, table: str, columns: Sequence[str], group_by: Sequence[str], n_queries: int,
                  rng: np.random.Generator, *, max_tries: int = 50) -> list[EvalQuery]:
    """``n_queries`` random range queries over ``columns`` of ``table`` (module docstring), each keeping at least
    1% of the rows. Fewer come back when ``max_tries * n_queries`` draws do not find them."""
    num, cat = list(columns), list(group_by)
    if not num:
        raise InputError("the workload needs at least one numeric/date predicate column.")
    types = _types(con, table)
    missing = [c for c in num + cat if c not in types]
    if missing:
        raise InputError(f"table {table!r} has no column {missing[0]!r}; its columns are {list(types)}.")
    ref = table_ref(table)
    n_all = int(con.fetch_rows(f"SELECT count(*) FROM {ref}")[0][0])
    grid = {}
    for c in num:
        qs = con.fetch_rows(f"SELECT quantile_cont({_expr(c, types[c])}, {[float(p) for p in _GRID]}) FROM {ref}")
        grid[c] = np.array(qs[0][0], dtype=np.float64)
    aggs = [c for c in num if not _is_time(types[c])] or num
    out: list[EvalQuery] = []
    tries = 0
    while len(out) < n_queries and tries < max_tries * n_queries:
        tries += 1
        cols = [str(c) for c in rng.choice(num, int(rng.integers(1, min(3, len(num)) + 1)), replace=False)]
        preds = []
        for c in cols:
            lo_q = rng.uniform(0, 0.8)
            hi_q = min(1.0, lo_q + rng.uniform(0.15, 0.9))
            lo, hi = (_literal(types[c], float(np.interp(q, _GRID, grid[c]))) for q in (lo_q, hi_q))
            op = int(rng.integers(0, 3))
            preds.append([f"{quote(c)} BETWEEN {lo} AND {hi}", f"{quote(c)} >= {lo}", f"{quote(c)} < {hi}"][op])
        func = FUNCS[len(out) % 3]
        col = None if func == "COUNT" else str(rng.choice(aggs))
        group = str(rng.choice(cat)) if cat and rng.random() < 0.35 else None
        where = " AND ".join(preds)
        if con.fetch_rows(f"SELECT count(*) FROM {ref} WHERE {where}")[0][0] < MIN_SHARE * n_all:
            continue
        agg = "COUNT(*)" if col is None else f"{func}({quote(col)})"
        g = quote(group) if group else ""
        sql = (f"SELECT {g + ', ' if group else ''}{agg} AS v FROM {ref} WHERE {where}"
               + (f" GROUP BY {g}" if group else ""))
        out.append(EvalQuery(sql, func, col, len(cols), group, where))
    return out


# ---- answering and scoring ------------------------------------------------------------------------------------


def _peer(con: Connector, sample: str, q: EvalQuery) -> dict[Any, tuple[float, float, float]]:
    """The peer's (estimate, low, high) per group key from the 1% sample, CLT intervals."""
    c = quote(q.column) if q.column else "1"
    g = f"{quote(q.group)}, " if q.group else ""
    out: dict[Any, tuple[float, float, float]] = {}
    for r in con.fetch_rows(f"SELECT {g}COUNT(*), SUM({c}), SUM({c} * {c}), COUNT({c}) FROM {sample} "
                            f"WHERE {q.where}" + (f" GROUP BY {quote(q.group)}" if q.group else "")):
        key = r[0] if q.group else None
        cnt, s, ss, cn = r[-4:]
        s, ss = float(s or 0), float(ss or 0)
        if q.func == "COUNT":
            est, var = cnt / PEER_RATE, cnt * (1 - PEER_RATE) / PEER_RATE**2
        elif q.func == "SUM":
            est, var = s / PEER_RATE, ss * (1 - PEER_RATE) / PEER_RATE**2
        else:
            if cn < 2:
                continue
            est = s / cn
            var = max(ss / cn - est * est, 0.0) / cn
        half = Z95 * math.sqrt(var)
        out[key] = (est, est - half, est + half)
    return out


def _same(v: Any, key: Any) -> bool:
    """Whether a group value of densitas' answer is the exact answer's group ``key`` (None: NULL)."""
    if key is None:
        return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))
    return bool(v == key)


def _pick(df: pd.DataFrame, group: str | None, key: Any) -> tuple[float, float, float]:
    """densitas' (estimate, low, high) of one group; a missing group or a non-finite estimate is 0, [0, 0]."""
    if group is None:
        rows = df
    else:
        rows = df[[_same(v, key) for v in df[group]]]
    if len(rows) == 0:
        return 0.0, 0.0, 0.0
    est, lo, hi = (float(rows.iloc[0][k]) for k in ("v", "v_ci_low", "v_ci_high"))
    if not math.isfinite(est):
        return 0.0, 0.0, 0.0
    return est, lo, hi


def evaluate_table(engine: Engine, table: str, columns: Sequence[str], group_by: Sequence[str] = (), *,
                   queries: int = 300, seed: int = 0, role: str = "", build: bool = True,
                   budget: float | None = None, sample_size: int | None = None,
                   answer: Callable[[str], pd.DataFrame] | None = None,
                   progress: Callable[[str], None] | None = None) -> TableResult:
    """Evaluate ``table`` of ``engine``'s database (module docstring).

    ``build``: build the synopsis first (``budget`` a fraction of the table's storage, None: the engine's
    default; ``sample_size`` sample rows instead of what the budget and the sample cap leave: what a larger
    sample buys; each group still keeps its floor of ``min(rows, 200)``), else use the stored one (then
    ``budget`` and ``sample_size`` must be None).
    ``answer``: answers a query's SQL with a DataFrame holding ``v``, ``v_ci_low``, ``v_ci_high`` (and the group
    column); default :meth:`Engine.query`.
    """
    say = progress or (lambda _msg: None)
    for name, value in (("budget", budget), ("sample_size", sample_size)):
        if not build and value is not None:
            raise InputError(f"The '{name}' parameter of evaluate_table must be None with build=False (the stored "
                             f"synopsis is used). Got {value!r} instead.")
    con = engine.con
    cols, groups = list(columns), list(group_by)
    rng = np.random.default_rng([int(seed), zlib.crc32(table.encode())])
    sub_seed = int(rng.integers(2**31 - 1))
    meta: dict[str, Any] = {}
    if build:
        say(f"{table}: building the synopsis")
        options: dict[str, Any] = {"seed": sub_seed}
        if budget is not None:
            options["budget_fraction"] = budget
        if sample_size is not None:
            options["sample_size"] = sample_size  # the build checks it, and takes it over the cap (max_sample_rows)
        meta = engine.build(table, columns=cols, group_by=groups or None, **options)
    ref = table_ref(table)
    types = _types(con, table)
    n_all = int(con.fetch_rows(f"SELECT count(*) FROM {ref}")[0][0])
    sd = {c: float(con.fetch_rows(f"SELECT stddev_samp({quote(c)}) FROM {ref}")[0][0] or 0.0)
          for c in cols if not _is_time(types[c])}
    sample = quote(f"_densitas_peer_{zlib.crc32(table.encode()):08x}")
    keep = ", ".join(quote(c) for c in dict.fromkeys(cols + groups))
    con.execute(f"CREATE OR REPLACE TEMP TABLE {sample} AS SELECT {keep} FROM {ref} "
                f"USING SAMPLE {100 * PEER_RATE}% (bernoulli, {sub_seed % 100_000})")
    peer_rows = int(con.fetch_rows(f"SELECT count(*) FROM {sample}")[0][0])
    say(f"{table}: drawing {queries} queries")
    workload = make_workload(con, table, cols, groups, queries, rng)
    ask = answer or (lambda sql: engine.query(sql))
    answers: list[Answer] = []
    unscored = failed = 0
    lat: list[float] = []
    for qi, q in enumerate(workload):
        if qi % 10 == 0:
            say(f"{table}: query {qi + 1}/{len(workload)}")
        agg = "COUNT(*)" if q.column is None else f"{q.func}({quote(q.column)})"
        g = f"{quote(q.group)}, " if q.group else ""
        exact = con.fetch_rows(f"SELECT {g}COUNT(*), {agg} FROM {ref} WHERE {q.where}"
                               + (f" GROUP BY {quote(q.group)}" if q.group else ""))
        err: str | None = None
        df = None
        t0 = time.perf_counter()
        try:
            df = ask(q.sql)
        except Exception as exc:  # any failure of the method scores as a miss, the run goes on
            err = f"{type(exc).__name__}: {exc}"
            failed += 1
        else:
            lat.append((time.perf_counter() - t0) * 1e3)
        pe = _peer(con, sample, q)
        for r in exact:
            key = r[0] if q.group else None
            n_box, truth = int(r[-2]), r[-1]
            if truth is None or n_box < MIN_SHARE * n_all:
                unscored += 1
                continue
            truth = float(truth)
            scale = max(abs(truth), 1e-12)
            if q.func != "COUNT":
                scale = max(scale, 0.1 * sd.get(q.column or "", 0.0) * (1 if q.func == "AVG" else n_box))
            est, lo, hi = (math.nan,) * 3 if df is None else _pick(df, q.group, key)
            p_est, p_lo, p_hi = pe.get(key, (0.0, 0.0, 0.0))
            answers.append(Answer(table, qi, q.sql, q.func, q.n_cols, q.group, key, n_box, truth, scale, est, lo,
                                  hi, p_est, p_lo, p_hi, lat[-1] if err is None else math.nan, err))
    con.execute(f"DROP TABLE IF EXISTS {sample}")
    return TableResult(table, role, n_all, int(seed), cols, groups, len(workload), answers, unscored, failed,
                       build_seconds=float(meta.get("build_seconds", math.nan)),
                       synopsis_bytes=int(meta.get("size_bytes", 0)), table_bytes=int(meta.get("table_bytes", 0)),
                       peer_rows=peer_rows, median_ms=float(np.median(lat)) if lat else math.nan)


def evaluate(names: Sequence[str], *, queries: int = 300, seed: int | None = None, db: str | None = None,
             budget: float | None = None, sample_size: int | None = None, scale: float = 1.0,
             rows: int = 1_000_000, reload: bool = False, rebuild: bool = False,
             progress: Callable[[str], None] | None = None,
             on_result: Callable[[TableResult], None] | None = None,
             on_error: Callable[[str, Exception], None] | None = None) -> tuple[int, list[TableResult]]:
    """Evaluate the named tables of the evaluation set in the DuckDB file ``db`` (default: a temporary file);
    returns the seed (fresh when None) and the results. A table already in ``db`` is used as it is unless
    ``reload``; ``scale`` is lineitem's TPC-H scale, ``rows`` the synthetic table's size. ``on_result`` sees
    each result as it comes; ``on_error`` each table that failed to load or build (default: raise).

    Each table's synopsis is built with the run's settings and replaces the one stored: a table of ``db`` that
    already has a synopsis is refused (an :class:`~densitas.InputError`, before anything is loaded or built)
    unless ``rebuild``."""
    from densitas.aqp.datasets import EVAL_TABLES, load_real

    unknown = [n for n in names if n not in EVAL_TABLES]
    if unknown:
        raise InputError(f"unknown table {unknown[0]!r}; the evaluation tables are {sorted(EVAL_TABLES)}.")
    if db is not None and not rebuild and Path(db).is_file():
        with Engine(db, read_only=True) as existing:
            stored = [str(t) for t in existing.synopses()["table_name"]]
        kept = [t for n in names for t in named_as(n, stored, key=table_key)]
        if kept:
            raise InputError(f"{db} already holds a synopsis of {', '.join(repr(t) for t in kept)}; the evaluation "
                             "builds its own (its seed, budget and sample size) and would replace it: pass --rebuild "
                             "(rebuild=True) to allow that, or give another --db (default: a temporary file).")
    seed = fresh_seed() if seed is None else int(seed)
    say = progress or (lambda _msg: None)
    tmp = None
    if db is None:
        tmp = tempfile.TemporaryDirectory(prefix="densitas-eval-")
        db = str(Path(tmp.name) / "eval.duckdb")
    results: list[TableResult] = []
    eng = Engine(db)
    try:
        for name in names:
            spec = EVAL_TABLES[name]
            try:
                if reload or name not in eng.con.tables():
                    say(f"{name}: loading")
                    load_real(eng.con, name, scale=scale, rows=rows, seed=0)
                    eng.con.execute("CHECKPOINT")
                res = evaluate_table(eng, name, spec.columns, spec.group_by, queries=queries, seed=seed,
                                     role=spec.role, budget=budget, sample_size=sample_size, progress=progress)
            except DensitasError as exc:
                if on_error is None:
                    raise
                on_error(name, exc)
                continue
            results.append(res)
            if on_result is not None:
                on_result(res)
    finally:
        eng.close()
        if tmp is not None:
            tmp.cleanup()
    return seed, results


def write_answers(results: Sequence[TableResult], path: str | Path) -> Path:
    """Write every answer: CSV (one row per answer) for ``*.csv``, else JSON ({"tables": summaries,
    "answers": rows})."""
    path = Path(path)
    rows = [a.to_dict() for r in results for a in r.answers]
    if path.suffix.lower() == ".csv":
        pd.DataFrame(rows).to_csv(path, index=False)
    else:
        def clean(v: Any) -> Any:
            if isinstance(v, float) and not math.isfinite(v):
                return None
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            return v

        payload = {"tables": [clean(r.summary()) for r in results], "answers": [clean(a) for a in rows]}
        path.write_text(json.dumps(payload, indent=1, default=str))
    return path
