"""End-to-end checks of the approximate engine against exact DuckDB answers and independent integrals."""

from __future__ import annotations

import threading

import duckdb
import numpy as np
import pandas as pd
import pytest
from scipy import integrate, stats

from densitas.aqp import Engine, StaleSynopsisError
from densitas.aqp import build as build_mod
from densitas.aqp.workload import generate, run
from densitas.exceptions import InputError, NoSynopsisError, UnsupportedQueryError


def _exact(eng, sql, col):
    return float(eng.exact(sql)[col].iloc[0])


def test_full_sample_makes_the_grid_estimator_exact(mem_engine):
    """With the whole table as the sample, the correction term recovers every row: answers equal DuckDB's."""
    con = mem_engine.con
    con.execute("CREATE TABLE t AS SELECT (hash(i, 1) % 1000)::DOUBLE / 7 AS x, (hash(i, 2) % 97)::INTEGER AS k, "
                "exp((hash(i, 3) % 1000)::DOUBLE / 300) AS y FROM range(3000) r(i)")
    mem_engine.build("t", sample_size=3000, max_bins=64)
    for sql in ["SELECT COUNT(*) AS v FROM t WHERE x BETWEEN 10.5 AND 77.7",
                "SELECT SUM(y) AS v FROM t WHERE x > 3.3 AND k <= 40",
                "SELECT AVG(y) AS v FROM t WHERE x < 100 AND k >= 12 AND y > 2.5"]:
        a = float(mem_engine.query(sql)["v"].iloc[0])
        assert a == pytest.approx(_exact(mem_engine, sql, "v"), rel=1e-9)


def test_workload_accuracy_and_coverage(syn_db):
    qs = generate(syn_db, "synthetic", 40, seed=11)
    res = run(syn_db, qs, reps=1)
    err = res["rel_err"].dropna()
    assert err.median() < 0.1  # 30,000 rows and a 400 kB synopsis: a few per cent
    assert 0.8 <= res["covered"].mean()


def test_discrete_column_between_is_exact(mem_engine):
    con = mem_engine.con
    con.execute("CREATE TABLE t AS SELECT 1 + (hash(i) % 50)::INTEGER AS q, (hash(i, 9) % 10000)::DOUBLE AS p "
                "FROM range(20000) r(i)")
    mem_engine.build("t", sample_size=200)
    for sql in ["SELECT COUNT(*) AS v FROM t WHERE q BETWEEN 10 AND 20",
                "SELECT SUM(p) AS v FROM t WHERE q > 10 AND q < 20",
                "SELECT AVG(p) AS v FROM t WHERE q = 17",
                "SELECT COUNT(*) AS v FROM t WHERE q IN (3, 5, 8)"]:
        df = mem_engine.query(sql)
        e = _exact(mem_engine, sql, "v")
        assert float(df["v"].iloc[0]) == pytest.approx(e, rel=1e-9)
        assert df["v_ci_low"].iloc[0] <= e <= df["v_ci_high"].iloc[0]


def test_bounded_columns_do_not_leak(mem_engine):
    con = mem_engine.con
    con.execute("CREATE TABLE t AS SELECT ((hash(i) % 1000000)::DOUBLE / 1e6) ** 3 AS u FROM range(20000) r(i)")
    mem_engine.build("t", sample_size=2000)
    lo, hi = con.fetch_rows("SELECT min(u), max(u) FROM t")[0]
    for method in ("grid", "kde"):
        all_rows = mem_engine.query(f"SELECT COUNT(*) AS v FROM t WHERE u >= {lo!r}", method=method)["v"].iloc[0]
        assert all_rows == pytest.approx(20000, rel=1e-9)
        below = mem_engine.query(f"SELECT COUNT(*) AS v FROM t WHERE u < {lo!r}", method=method)["v"].iloc[0]
        assert below < 1e-6
        above = mem_engine.query(f"SELECT COUNT(*) AS v FROM t WHERE u > {hi!r}", method=method)["v"].iloc[0]
        assert above < 1e-6  # float rounding of a millionth of a row at most


def test_kde_box_mass_matches_numerical_integration(mem_engine):
    """The KDE estimator's closed form equals quadrature of the truncated Gaussian kernels of the sample."""
    con = mem_engine.con
    con.execute("CREATE TABLE t AS SELECT 5 + (hash(i) % 100000)::DOUBLE / 1e4 AS x FROM range(500) r(i)")
    mem_engine.build("t", sample_size=500, max_bins=16)  # continuous bins, so the KDE smooths this column
    syn = mem_engine._load("t")
    assert not syn.infos[0].discrete and syn.bandwidths[0] > 0
    x = syn.s_vals[:, 0]
    h = syn.bandwidths[0]
    lo_b, hi_b = syn.infos[0].lo, syn.infos[0].top
    a, b = 7.25, 11.0

    def dens(t):
        k = stats.norm.pdf((t - x) / h) / h
        norm = stats.norm.cdf((hi_b - x) / h) - stats.norm.cdf((lo_b - x) / h)
        return float(np.sum(k / norm)) / len(x) * 500

    want = integrate.quad(dens, a, b, limit=200)[0]
    got = mem_engine.query(f"SELECT COUNT(*) AS v FROM t WHERE x BETWEEN {a} AND {b}", method="kde")["v"].iloc[0]
    assert got == pytest.approx(want, rel=1e-6)


def test_nulls_follow_sql(mem_engine):
    con = mem_engine.con
    con.execute("CREATE TABLE t AS SELECT (i % 20)::INTEGER AS k, CASE WHEN i % 7 = 0 THEN NULL ELSE "
                "(i % 13)::DOUBLE END AS y, CASE WHEN i % 5 = 0 THEN NULL ELSE 'ab'[1 + i % 2] END AS g "
                "FROM range(5000) r(i)")
    mem_engine.build("t", group_by=["g"], sample_size=5000)
    sql = ("SELECT g, COUNT(*) AS n, COUNT(y) AS ny, SUM(y) AS s, AVG(y) AS a FROM t WHERE k BETWEEN 3 AND 11 "
           "AND y >= 2 GROUP BY g")
    apx, ex = mem_engine.query(sql), mem_engine.exact(sql)
    assert apx["g"].isna().sum() == 1  # the NULL group is a group
    for c in ("n", "ny", "s", "a"):
        np.testing.assert_allclose(apx[c].to_numpy(), ex[c].to_numpy(), rtol=1e-9)


def test_dates_timestamps_and_groups(syn_db):
    for sql in ["SELECT region, COUNT(*) AS v FROM synthetic WHERE day >= DATE '2022-03-01' AND "
                "day < '2023-01-01' GROUP BY region",
                "SELECT AVG(amount) AS v FROM synthetic WHERE region IN ('north', 'east') AND price > 100"]:
        apx, ex = syn_db.query(sql), syn_db.exact(sql)
        np.testing.assert_allclose(apx["v"].to_numpy(), ex["v"].to_numpy(), rtol=0.1)
        if "region" in apx:
            assert list(apx["region"]) == list(ex["region"])


def test_unsupported_and_unknown_names(syn_db):
    with pytest.raises(UnsupportedQueryError, match="channel"):
        syn_db.query("SELECT COUNT(*) FROM synthetic WHERE channel = 'web'")
    with pytest.raises(InputError, match="nope"):
        syn_db.query("SELECT COUNT(*) FROM nope")
    with pytest.raises(UnsupportedQueryError, match="OR"):
        syn_db.query("SELECT COUNT(*) FROM synthetic WHERE price < 1 OR price > 2")
    with pytest.raises(UnsupportedQueryError, match="SUM of the date"):
        syn_db.query("SELECT SUM(day) FROM synthetic")
    with pytest.raises(InputError, match="confidence"):
        syn_db.query("SELECT COUNT(*) FROM synthetic", confidence=1.5)
    df = syn_db.query("SELECT COUNT(*) AS n FROM synthetic WHERE price < 90 OR channel = 'web'", fallback="exact")
    assert df.attrs["method"] == "exact" and "OR" in df.attrs["reason"]
    assert df["n"].iloc[0] == syn_db.con.fetch_rows(
        "SELECT count(*) FROM synthetic WHERE price < 90 OR channel = 'web'")[0][0]


def test_stale_synopsis_is_detected(tmp_path):
    path = str(tmp_path / "s.duckdb")
    eng = Engine(path)
    eng.con.execute("CREATE TABLE t AS SELECT i::DOUBLE AS x FROM range(1000) r(i)")
    eng.build("t")
    eng.con.execute("UPDATE t SET x = x + 1000 WHERE x = 5")  # same row count, different content
    eng.close()
    fresh = Engine(path)
    with pytest.raises(StaleSynopsisError, match="content changed"):
        fresh.query("SELECT COUNT(*) FROM t WHERE x < 10")
    assert fresh.query("SELECT COUNT(*) AS n FROM t WHERE x < 10", fallback="exact")["n"].iloc[0] == 9
    fresh.con.execute("INSERT INTO t VALUES (1.5)")
    with pytest.raises(StaleSynopsisError, match="1001 rows"):
        fresh.validate("t")
    fresh.close()


def test_failed_build_keeps_previous_synopsis(mem_engine, monkeypatch):
    con = mem_engine.con
    con.execute("CREATE TABLE t AS SELECT (hash(i) % 1000)::DOUBLE AS x FROM range(5000) r(i)")
    mem_engine.build("t")
    sql = "SELECT COUNT(*) AS v FROM t WHERE x < 123.4"
    before = mem_engine.query(sql)
    tables_before = set(con.fetch_rows("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'densitas'"))

    def boom(meta):
        raise RuntimeError("disk full")

    monkeypatch.setattr(build_mod, "_before_swap", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        mem_engine.build("t", seed=7)
    assert set(con.fetch_rows("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'densitas'")) == \
        tables_before
    pd.testing.assert_frame_equal(mem_engine.query(sql), before)
    monkeypatch.undo()
    mem_engine.build("t", seed=7)  # a good rebuild replaces it and removes the old tables
    after = set(con.fetch_rows("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'densitas'"))
    assert len(after) == len(tables_before) and after != tables_before


def test_threads_give_the_same_answers(syn_db):
    """Queries answered from four threads at once equal the same queries answered one by one before (each thread
    writes its designs into memory of its own, and no answer keeps a view of it: the serial answers, made
    first, must be unchanged by the queries after them)."""
    sqls = [f"SELECT region, SUM(amount) AS v FROM synthetic WHERE price > {90 + i} GROUP BY region"
            for i in range(12)] + [q.sql for q in generate(syn_db, "synthetic", 24, seed=31)]
    serial = [syn_db.query(s) for s in sqls]
    out: dict[int, list] = {}

    def work(t):
        out[t] = [syn_db.query(s) for s in sqls]

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for t in range(4):
        for a, b in zip(out[t], serial, strict=True):
            pd.testing.assert_frame_equal(a, b)


def test_bad_build_input(mem_engine):
    con = mem_engine.con
    con.execute("CREATE TABLE t AS SELECT i::DOUBLE AS x, 'a' AS s, NULL::DOUBLE AS z FROM range(100) r(i)")
    with pytest.raises(InputError, match="'nope'"):
        mem_engine.build("t", ["nope"])
    with pytest.raises(InputError, match="VARCHAR"):
        mem_engine.build("t", ["s"])
    with pytest.raises(InputError, match="entirely NULL"):
        mem_engine.build("t", ["x", "z"])
    with pytest.raises(InputError, match="budget_bytes"):
        mem_engine.build("t", ["x"], budget_bytes=-1)
    with pytest.raises(InputError, match="unknown build option"):
        mem_engine.build("t", ["x"], bogus=1)
    with pytest.raises(NoSynopsisError):
        mem_engine.query("SELECT COUNT(*) FROM t")
    assert isinstance(duckdb.__version__, str)


def test_dependent_pairs_get_grids_and_chains_stay_accurate(mem_engine):
    """Dependence is detected on the probe grid: only the dependent pairs get fine grids (the independent ones a
    coarse grid at the probe's resolution, the regression's interaction term). A chain a -> b -> c
    (b = a + noise, c = b + noise) with an independent d is answered through the tree of the two pair grids,
    where the product of marginals would be far off."""
    con = mem_engine.con
    u = "((hash(i * 1000003 + {k}) >> 11)::DOUBLE / 9007199254740992.0)"
    con.execute(f"CREATE TABLE t AS SELECT a, a + 0.05 * {u.format(k=2)} AS b, "
                f"a + 0.05 * {u.format(k=2)} + 0.05 * {u.format(k=3)} AS c, {u.format(k=4)} AS d "
                f"FROM (SELECT i, {u.format(k=1)} AS a FROM range(200000) r(i))")
    meta = mem_engine.build("t", budget_bytes=600_000)
    import json

    grids = json.loads(meta["grids"])
    res = {tuple(p["cols"]): p["res"] for p in grids["pairs"]}
    scores = {tuple(s[:2]): s[2] for s in grids["scores"]}
    assert {(0, 1), (1, 2)} <= set(res)  # a-b and b-c carry the dependence
    assert all(r > build_mod.PROBE_RES for p in ((0, 1), (1, 2)) for r in res[p])  # finer than the probe
    # d is independent of everything: no dependence, and no grid finer than the probe's
    assert all(scores[p] < build_mod.BuildOptions().min_dependence for p in scores if 3 in p)
    assert all(r <= build_mod.PROBE_RES for p in res if 3 in p for r in res[p])
    for sql in ["SELECT COUNT(*) AS v FROM t WHERE a < 0.3 AND c > 0.3",
                "SELECT COUNT(*) AS v FROM t WHERE a BETWEEN 0.2 AND 0.4 AND c BETWEEN 0.35 AND 0.5 AND d < 0.5",
                "SELECT SUM(c) AS v FROM t WHERE a < 0.25 AND b > 0.22"]:
        e = _exact(mem_engine, sql, "v")
        df = mem_engine.query(sql)
        # the tree model carries the dependence, the sample corrects what it misses (d's independence is not
        # assumed): close, and inside an interval that is no wider than it needs to be
        assert float(df["v"].iloc[0]) == pytest.approx(e, rel=0.08)
        assert df["v_ci_low"].iloc[0] <= e <= df["v_ci_high"].iloc[0]
        assert df["v_ci_high"].iloc[0] - df["v_ci_low"].iloc[0] < 0.2 * e
    # the product of the marginals (what an independence model gives) misses the first query by far
    pa = _exact(mem_engine, "SELECT COUNT(*) AS v FROM t WHERE a < 0.3", "v") / 200000
    pc = _exact(mem_engine, "SELECT COUNT(*) AS v FROM t WHERE c > 0.3", "v") / 200000
    e = _exact(mem_engine, "SELECT COUNT(*) AS v FROM t WHERE a < 0.3 AND c > 0.3", "v")
    assert abs(200000 * pa * pc - e) / e > 0.5


def test_date_bins_sit_on_the_day_grid(mem_engine):
    """Continuous bins over a date column (more days than bins) keep whole days: a month's count is accurate
    (bin edges off the value grid once put whole days in the wrong bin: a 7% error)."""
    con = mem_engine.con
    con.execute("CREATE TABLE t AS SELECT (DATE '2020-01-01' + (hash(i) % 1500)::INTEGER) AS d, "
                "(hash(i, 5) % 100)::DOUBLE AS y FROM range(100000) r(i)")
    mem_engine.build("t", max_bins=60, sample_size=5000)
    syn = mem_engine._load("t")
    assert not syn.infos[0].discrete
    assert np.all(syn.infos[0].edges == np.round(syn.infos[0].edges))
    # only the rows of the two cut bins (about 1,700 rows each) are estimated from the sample (20 rows per
    # sample row): a sampling sd of about 5% of a month's count; the answers are held to their intervals
    for sql, tol in [("SELECT COUNT(*) AS v FROM t WHERE d BETWEEN DATE '2021-04-24' AND DATE '2021-05-24'", 0.1),
                     ("SELECT SUM(y) AS v FROM t WHERE d > DATE '2020-07-03' AND d <= DATE '2020-08-14'", 0.1)]:
        df = mem_engine.query(sql)
        e = _exact(mem_engine, sql, "v")
        assert float(df["v"].iloc[0]) == pytest.approx(e, rel=tol)
        assert df["v_ci_low"].iloc[0] <= e <= df["v_ci_high"].iloc[0]


def test_old_synopsis_format_asks_for_a_rebuild(tmp_path):
    path = str(tmp_path / "v.duckdb")
    eng = Engine(path)
    eng.con.execute("CREATE TABLE t AS SELECT i::DOUBLE AS x FROM range(1000) r(i)")
    eng.build("t")
    eng.con.execute("UPDATE densitas.synopses SET version = 1")
    eng.close()
    fresh = Engine(path)
    with pytest.raises(InputError, match=r"format version 1.*rebuild"):
        fresh.query("SELECT COUNT(*) FROM t WHERE x < 10")
    fresh.build("t")
    assert fresh.query("SELECT COUNT(*) AS n FROM t WHERE x < 10")["n"].iloc[0] == pytest.approx(10, abs=1e-6)
    fresh.close()


def test_thin_support_is_reported_in_attrs(mem_engine):
    """An answer whose interval rests on fewer than MIN_SUPPORT sample rows inside the box says so in
    df.attrs["warnings"]; a wide box, or a group sampled whole, does not."""
    from densitas.aqp.synopsis import MIN_SUPPORT

    con = mem_engine.con
    con.execute("CREATE TABLE t AS SELECT i, (hash(i) % 100000)::DOUBLE / 100000 AS x FROM range(100000) r(i) "
                "ORDER BY i")
    mem_engine.build("t", ["x"], sample_size=2000, max_bins=16)
    narrow = mem_engine.query("SELECT COUNT(*) AS v FROM t WHERE x BETWEEN 0.50001 AND 0.50200")  # ~4 sample rows
    wide = mem_engine.query("SELECT COUNT(*) AS v FROM t WHERE x BETWEEN 0.2 AND 0.7")
    syn = mem_engine._load("t")
    from densitas.aqp.sql import parse

    assert syn.support(parse("SELECT COUNT(*) FROM t WHERE x BETWEEN 0.50001 AND 0.50200"))[0] < MIN_SUPPORT
    assert narrow.attrs.get("warnings"), narrow.attrs
    assert "warnings" not in wide.attrs
    mem_engine.build("t", ["x"], sample_size=100000, max_bins=16)  # the whole table: exact, no warning
    assert "warnings" not in mem_engine.query("SELECT COUNT(*) AS v FROM t WHERE x BETWEEN 0.50001 AND 0.50200").attrs


def test_point_mass_at_a_cap_is_cut_exactly(mem_engine):
    """A column capped at a value (many rows exactly at the cap, the rest well below it, the last fine bin
    spanning both) answers a bound just under the cap exactly: the model spreads a bin's rows over its occupied
    range, not its edges. Spreading over the edges put most of the capped rows inside ``x < cap``, with an
    interval that did not hold the truth."""
    con = mem_engine.con
    con.execute("CREATE TABLE t AS SELECT CASE WHEN hash(i, 5) % 1000 < 3 THEN 10000.0 "
                "ELSE (hash(i) % 100000)::DOUBLE / 100 END AS x FROM range(200000) r(i)")
    mem_engine.build("t", ["x"], sample_size=500, max_bins=16)
    for sql in ["SELECT COUNT(*) AS v FROM t WHERE x < 10000", "SELECT COUNT(*) AS v FROM t WHERE x >= 9999.5",
                "SELECT AVG(x) AS v FROM t WHERE x > 999.995"]:
        df = mem_engine.query(sql)
        e = _exact(mem_engine, sql, "v")
        assert float(df["v"].iloc[0]) == pytest.approx(e, rel=1e-6), sql
        assert df["v_ci_low"].iloc[0] - 1e-6 * abs(e) <= e <= df["v_ci_high"].iloc[0] + 1e-6 * abs(e), sql


def test_max_sample_rows_caps_the_sample(mem_engine):
    """The sample stops at ``max_sample_rows`` however large the budget (a query reads every sample row);
    a value that is no count is refused naming the parameter."""
    import json

    con = mem_engine.con
    con.execute("CREATE TABLE t AS SELECT (hash(i) % 100000)::DOUBLE AS x FROM range(50000) r(i)")
    big = mem_engine.build("t", budget_bytes=20_000_000)
    capped = mem_engine.build("t", budget_bytes=20_000_000, max_sample_rows=1000)
    assert json.loads(big["options"])["sample_size"] > 1000
    assert json.loads(capped["options"])["sample_size"] == 1000
    assert con.fetch_rows("SELECT count(*) FROM densitas.sample_" + capped["id"])[0][0] == 1000
    for bad in (5, 2.5, True):
        with pytest.raises(InputError, match="max_sample_rows"):
            mem_engine.build("t", max_sample_rows=bad)


def test_whole_number_doubles_with_one_value_bins_stay_finite(mem_engine):
    """A DOUBLE column of whole numbers (weights, heights) with more values than bins: some fine bins hold one
    value each (cut like a discrete bin) and bounds fall on values. Answers stay close, intervals hold. (The
    round-off term that once blew such answers up to 1e17 is tested in test_estimator.py.)"""
    con = mem_engine.con
    con.execute("CREATE TABLE t AS SELECT round(70 + 12 * sqrt(-2 * ln((hash(i) % 100000 + 1) / 100001.0)) "
                "* cos(2 * pi() * (hash(i, 7) % 100000) / 100000.0)) AS w, (hash(i, 3) % 1000)::DOUBLE AS y "
                "FROM range(100000) r(i)")
    mem_engine.build("t", sample_size=2000, max_bins=40)
    for sql in ["SELECT COUNT(*) AS v FROM t WHERE w >= 56", "SELECT SUM(y) AS v FROM t WHERE w BETWEEN 57 AND 81",
                "SELECT AVG(y) AS v FROM t WHERE w >= 57 AND y < 700", "SELECT COUNT(*) AS v FROM t WHERE w = 70"]:
        df = mem_engine.query(sql)
        e = _exact(mem_engine, sql, "v")
        assert float(df["v"].iloc[0]) == pytest.approx(e, rel=0.05), sql
        assert df["v_ci_low"].iloc[0] <= e * (1 + 1e-9) and e * (1 - 1e-9) <= df["v_ci_high"].iloc[0], sql


def test_a_synopsis_above_its_budget_says_why(mem_engine):
    """Small tables get the minimum budget, many groups the sample's per-group floor: the build says which
    (``meta["size_note"]``); within the budget it says nothing."""
    con = mem_engine.con
    con.execute("CREATE TABLE t AS SELECT (hash(i) % 1000)::DOUBLE AS x, (hash(i, 2) % 1000)::DOUBLE AS y, "
                "(hash(i, 3) % 1000)::DOUBLE AS z, (i % 500)::INTEGER AS g FROM range(150000) r(i)")
    small = mem_engine.build("t", ["x"])
    assert "min_budget_bytes" in small["size_note"]
    many = mem_engine.build("t", ["x", "y", "z"], ["g"])
    assert many["size_bytes"] > many["table_bytes"] * 0.01
    assert "500 groups" in many["size_note"]
    assert "size_note" not in mem_engine.build("t", ["x"], budget_bytes=300_000)


def test_large_tables_take_quantile_edges_from_a_seeded_sample(mem_engine, monkeypatch):
    """Above QUANTILE_SAMPLE_ROWS rows the quantile edges come from a hash sample of the rows: the histograms
    stay exact (discrete columns too), and the same seed builds the same synopsis."""
    monkeypatch.setattr(build_mod, "QUANTILE_SAMPLE_ROWS", 3000)
    con = mem_engine.con
    con.execute("CREATE TABLE t AS SELECT (hash(i) % 100000)::DOUBLE / 10 AS x, (hash(i, 2) % 5)::INTEGER AS k "
                "FROM range(60000) r(i)")
    mem_engine.build("t", seed=3)
    syn = mem_engine._load("t")
    assert syn.infos[1].discrete and syn.infos[0].bins > 16
    assert syn.infos[0].edges[0] == con.fetch_rows("SELECT min(x) FROM t")[0][0]
    first = [mem_engine.query(q) for q in ("SELECT COUNT(*) AS v FROM t WHERE k BETWEEN 1 AND 3",
                                          "SELECT SUM(x) AS v FROM t WHERE x < 2500 AND k = 4")]
    assert float(first[0]["v"].iloc[0]) == _exact(mem_engine, "SELECT COUNT(*) AS v FROM t WHERE k BETWEEN 1 AND 3",
                                                  "v")
    mem_engine.build("t", seed=3)
    again = [mem_engine.query(q) for q in ("SELECT COUNT(*) AS v FROM t WHERE k BETWEEN 1 AND 3",
                                          "SELECT SUM(x) AS v FROM t WHERE x < 2500 AND k = 4")]
    for a, b in zip(first, again, strict=True):
        pd.testing.assert_frame_equal(a, b)


def test_rows_outside_the_box_read_or_not_give_the_same_answers(syn_db):
    """A query reads only the sample rows its targets and auxiliaries can touch (slices of the sample by each
    predicate column's bin); the reference computation reads every row (``read_all_rows``). Same estimator, the
    same products summed in another order: answers and intervals agree to round-off (1e-9 of the answer, or of
    its interval's half-width for answers near 0)."""
    qs = generate(syn_db, "synthetic", 60, seed=23)
    syn = syn_db._load("synthetic")
    assert {q.n_cols for q in qs} == {1, 2, 3}
    fast = [syn_db.query(q.sql) for q in qs]
    syn.read_all_rows = True
    try:
        ref = [syn_db.query(q.sql) for q in qs]
    finally:
        syn.read_all_rows = False
    for q, a, r in zip(qs, fast, ref, strict=True):
        assert list(a.columns) == list(r.columns) and len(a) == len(r), q.sql
        hw = (r["v_ci_high"] - r["v_ci_low"]).to_numpy() / 2
        scale = np.maximum(np.abs(r["v"].to_numpy()), np.where(np.isfinite(hw), hw, 0.0))
        for c in ("v", "v_ci_low", "v_ci_high"):
            np.testing.assert_array_less(np.abs(a[c].to_numpy() - r[c].to_numpy()), 1e-9 * scale + 1e-12,
                                         err_msg=q.sql)


def test_keys_sharing_the_count_keys_messages_give_the_same_answers(syn_db, monkeypatch):
    """A SUM or AVG key reuses the row-count key's tree messages that do not see its changed factor; computed
    afresh for every key instead (the reference), the answers are the same numbers (the same products of the
    same arrays)."""
    from densitas.aqp import synopsis as syn_mod

    qs = [q for q in generate(syn_db, "synthetic", 60, seed=41) if q.n_cols > 1 and q.func != "count"]
    assert len(qs) >= 10
    shared = [syn_db.query(q.sql) for q in qs]
    monkeypatch.setattr(syn_mod, "_shared_messages",
                        lambda memo, tree, phis, factors: memo if all(factors[u] is phis[u] for u in factors) else {})
    fresh = [syn_db.query(q.sql) for q in qs]
    for q, a, b in zip(qs, shared, fresh, strict=True):
        pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-12, obj=q.sql)


def test_an_avg_lies_within_its_box(mem_engine):
    """AVG(x) under a predicate on x lies, with its interval, within the predicate's bounds and the column's
    range, however few sample rows a group has in the box: a group with an estimated count near 0 gave
    AVG(dep_time) = 6,973 with an interval of ±1e19 under ``dep_time BETWEEN 998 AND 1341`` (flights, carrier
    B6)."""
    con = mem_engine.con
    con.execute("CREATE TABLE t AS SELECT (hash(i, 1) % 8)::INTEGER AS g, (hash(i, 2) % 100000)::DOUBLE / 100 AS x, "
                "(hash(i, 3) % 100000)::DOUBLE / 100 + CASE WHEN hash(i, 1) % 8 = 7 THEN 500 ELSE 0 END AS y "
                "FROM range(40000) r(i)")
    mem_engine.build("t", ["x", "y"], group_by=["g"], sample_size=1600, max_bins=16)
    xmin, xmax = con.fetch_rows("SELECT min(x), max(x) FROM t")[0]
    checked = 0
    for lo, hi, ylo in [(300, 340, 480), (10, 15, 0), (700, 900, 990), (-50, 2.5, 400), (998, 1200, 0)]:
        sql = f"SELECT g, AVG(x) AS v FROM t WHERE x BETWEEN {lo} AND {hi} AND y >= {ylo} GROUP BY g"
        df = mem_engine.query(sql)
        box_lo, box_hi = max(lo, xmin), min(hi, xmax)
        for _, r in df.dropna(subset=["v"]).iterrows():
            assert box_lo <= r.v_ci_low <= r.v <= r.v_ci_high <= box_hi, (sql, r.to_dict())
            checked += 1
    assert checked >= 20


def test_avg_of_a_column_far_from_zero_is_accurate(mem_engine):
    """AVG of a column whose values sit far from 0 against their spread (a year, a function of a date column),
    over a box a year or two wide, across 100 small groups: the SUM key sums each value less the column's mean
    (its centre), so the fit's errors scale with the spread, not the level. Uncentred, AVG(year) over
    1975–1976 here was 1976.0 against 1975.50 (outside its interval), and births' over 1983–1984 was 1980.05
    with an interval [1976.6, 1983.5] against 1983.50."""
    con = mem_engine.con
    con.execute("CREATE TABLE t AS SELECT (hash(i, 1) % 100)::INTEGER AS g, "
                "DATE '1969-01-01' + (hash(i, 2) % 7300)::INTEGER AS d, (hash(i, 3) % 1000)::DOUBLE AS x "
                "FROM range(100000) r(i)")
    con.execute("ALTER TABLE t ADD COLUMN year INTEGER")
    con.execute("UPDATE t SET year = year(d)")
    mem_engine.build("t", ["d", "year", "x"], group_by=["g"])
    for sql in ["SELECT AVG(year) AS v FROM t WHERE year BETWEEN 1983 AND 1984",
                "SELECT AVG(year) AS v FROM t WHERE year BETWEEN 1975 AND 1976 AND x < 400"]:
        df, e = mem_engine.query(sql), _exact(mem_engine, sql, "v")
        assert abs(float(df["v"].iloc[0]) - e) < 0.1, (sql, df.to_dict("records"), e)
        assert df["v_ci_low"].iloc[0] <= e <= df["v_ci_high"].iloc[0], (sql, df.to_dict("records"), e)
