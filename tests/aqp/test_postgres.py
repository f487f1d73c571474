"""The engine on both databases: an in-memory DuckDB and a real PostgreSQL server started in a temporary directory
(``pg_server`` in conftest). Tables are generated in DuckDB SQL and copied, so that both engines hold the same rows;
answers are checked against the database's exact answers and against NumPy on the generated rows."""

from __future__ import annotations

import os

import duckdb
import numpy as np
import pandas as pd
import pytest
from sqlglot import exp

from densitas.aqp import Engine, StaleSynopsisError, store
from densitas.aqp import build as build_mod
from densitas.aqp.connector import table_expr
from densitas.aqp.workload import generate
from densitas.exceptions import DatabaseError, InputError, NoSynopsisError, UnsupportedQueryError

Z95 = 1.959963984540054
BASE_SEED = int(os.environ.get("DENSITAS_TEST_SEED", "20261123"))
U = "((hash(i * 1000003 + {k}) >> 11)::DOUBLE / 9007199254740992.0)"  # uniform(0, 1), stream k (DuckDB SQL)
# a table with a discrete column, a continuous one on a value grid (ties at the bin edges), a skewed value, a
# date, a nullable column and a categorical GROUP BY column
BASIC = (f"SELECT (1 + floor(20 * {U.format(k=1)}))::INTEGER AS q, round(1000 * {U.format(k=2)} ** 2, 1) AS x, "
         f"exp(3 * {U.format(k=3)}) AS y, DATE '2020-01-01' + floor(700 * {U.format(k=4)})::INTEGER AS d, "
         f"CASE WHEN {U.format(k=5)} < 0.1 THEN NULL ELSE {U.format(k=6)} END AS z, "
         f"['a', 'b', 'c'][1 + (i % 3)::INTEGER] AS g FROM range({{n}}) r(i) ORDER BY i")


def load(eng: Engine, name: str, select: str) -> pd.DataFrame:
    """Create ``name`` in ``eng``'s database with the rows (and types) of the DuckDB query ``select``."""
    src = duckdb.connect()
    try:
        src.execute(f"CREATE TABLE t AS {select}")
        types = [(r[0], r[1]) for r in src.execute("DESCRIBE t").fetchall()]
        frame = src.execute("SELECT * FROM t").df()
    finally:
        src.close()
    defs = [exp.ColumnDef(this=exp.to_identifier(c, quoted=True), kind=exp.DataType.build(t, dialect="duckdb"))
            for c, t in types]
    eng.con.execute(exp.Create(this=exp.Schema(this=table_expr(name), expressions=defs), kind="TABLE"))
    eng.con.insert_frame(table_expr(name), frame)
    return frame


def _one(df: pd.DataFrame, col: str = "v") -> float:
    return float(df[col].iloc[0])


def test_full_sample_answers_equal_the_database(any_engine):
    """With every row in the sample the regression estimator is exact: answers equal the database's own."""
    load(any_engine, "t", BASIC.format(n=3000))
    any_engine.build("t", sample_size=3000, max_bins=64, bandwidth="silverman")
    for sql in ["SELECT COUNT(*) AS v FROM t WHERE x BETWEEN 10.5 AND 377.7",
                "SELECT SUM(y) AS v FROM t WHERE x > 3.3 AND q <= 12",
                "SELECT AVG(y) AS v FROM t WHERE d < DATE '2021-02-03' AND q >= 4 AND y > 2.5",
                "SELECT AVG(z) AS v FROM t WHERE x < 500"]:
        assert _one(any_engine.query(sql)) == pytest.approx(_one(any_engine.exact(sql)), rel=1e-9), sql


def test_histograms_hold_the_exact_count_of_every_bin(any_engine):
    """Every fine bin's stored count equals NumPy's count of the generated values in [edge_b, edge_b+1) (ties
    at an edge belong to the upper bin; NULLs to bin 0): the binning (ASOF JOIN in DuckDB, width_bucket in
    PostgreSQL) and the histogram SQL, checked against the rows themselves."""
    frame = load(any_engine, "t", BASIC.format(n=20000))
    any_engine.build("t", columns=["q", "x", "z"], group_by=["g"], max_bins=48, sample_size=500,
                     bandwidth="silverman")
    st = store.read(any_engine.con, "t")
    groups = st.groups["g"].tolist()
    for j, info in enumerate(st.infos):
        v = frame[info.name].to_numpy(dtype=float)
        for gi, g in enumerate(groups):
            vg = v[(frame["g"] == g).to_numpy()]
            ok = ~np.isnan(vg)
            want = np.bincount(np.searchsorted(info.edges, vg[ok], side="right"), minlength=info.bins + 1)
            want[0] = (~ok).sum()
            assert np.array_equal(st.marg[j][0][gi].astype(np.int64), want), (info.name, g)
    assert info.bins > 30 and not info.discrete and st.infos[0].discrete  # both kinds of column were binned


def test_synopses_of_both_engines_agree(pg_url):
    """The same rows in DuckDB and PostgreSQL give the same discrete histograms, groups and row counts, and
    answers within each other's intervals."""
    engines = [Engine(duckdb.connect()), Engine(pg_url)]
    try:
        for eng in engines:
            load(eng, "t", BASIC.format(n=20000))
            eng.build("t", group_by=["g"], sample_size=1000, bandwidth="silverman")
        a, b = (store.read(e.con, "t") for e in engines)
        assert a.meta["rows"] == b.meta["rows"] == 20000
        assert a.groups["n"].tolist() == b.groups["n"].tolist()
        assert np.array_equal(a.infos[0].edges, b.infos[0].edges) and a.infos[0].discrete
        assert np.array_equal(a.marg[0][0], b.marg[0][0])
        sql = "SELECT g, COUNT(*) AS v FROM t WHERE x < 250 AND q BETWEEN 3 AND 9 GROUP BY g"
        ra, rb = (e.query(sql) for e in engines)
        assert np.all(ra["v_ci_low"] <= rb["v_ci_high"]) and np.all(rb["v_ci_low"] <= ra["v_ci_high"])
    finally:
        for e in engines:
            e.close()


def test_appends_and_updates_make_the_synopsis_stale(any_engine):
    any_engine.recheck_seconds = 0.0
    load(any_engine, "t", BASIC.format(n=2000))
    any_engine.build("t", sample_size=300, bandwidth="silverman")
    sql = "SELECT COUNT(*) AS v FROM t WHERE x < 100"
    any_engine.query(sql)
    any_engine.con.execute("INSERT INTO t (q, x, y, d, z, g) VALUES (1, 1.0, 1.0, DATE '2020-01-01', 0.5, 'a')")
    with pytest.raises(StaleSynopsisError):
        any_engine.query(sql)
    assert any_engine.query(sql, fallback="exact").attrs["method"] == "exact"
    any_engine.build("t", sample_size=300, bandwidth="silverman")
    any_engine.query(sql)
    any_engine.con.execute("UPDATE t SET x = x + 1 WHERE q = 3")  # same row count, other content
    with pytest.raises(StaleSynopsisError):
        any_engine.validate("t")


def test_a_failed_rebuild_leaves_the_previous_synopsis(any_engine, monkeypatch):
    load(any_engine, "t", BASIC.format(n=2000))
    first = any_engine.build("t", sample_size=300, bandwidth="silverman")
    sql = "SELECT COUNT(*) AS v FROM t WHERE x < 100"
    before = any_engine.query(sql)

    def boom(meta):
        raise RuntimeError("disk full")

    monkeypatch.setattr(build_mod, "_before_swap", boom)
    with pytest.raises(RuntimeError):
        any_engine.build("t", sample_size=500, seed=9, bandwidth="silverman")
    eng2 = Engine(any_engine.con)  # a fresh engine reads the catalog, not a cache
    after = eng2.query(sql)
    assert after.attrs["synopsis_id"] == first["id"] == before.attrs["synopsis_id"]
    assert _one(after) == _one(before)
    tables = any_engine.con.fetch_rows("SELECT table_name FROM information_schema.tables "
                                       "WHERE table_schema = 'densitas'")
    assert sorted(t for (t,) in tables if t != "synopses") == sorted(f"{k}_{first['id']}" for k in store.KINDS)


def test_postgres_errors_are_densitas_errors(pg_url, pg_server):
    eng = Engine(pg_url)
    try:
        load(eng, "t", BASIC.format(n=500))
        with pytest.raises(InputError):
            eng.build("missing")
        with pytest.raises(InputError):
            eng.build("t", columns=["nope"])
        with pytest.raises(NoSynopsisError):
            eng.query("SELECT COUNT(*) FROM t")
        with pytest.raises(InputError):
            eng.query("SELECT COUNT(*) FROM nothere")
        with pytest.raises(InputError):
            eng.exact("SELECT COUNT(nope) FROM t")
        with pytest.raises(UnsupportedQueryError):
            eng.exact("SELECT COUNT(*) FROM t; DROP TABLE t")
        assert _one(eng.exact("SELECT COUNT(*) AS v FROM t")) == 500  # the table survived
        with pytest.raises(InputError):
            eng.build("t", max_bins=40000)
        eng.con.execute("CREATE VIEW tv AS SELECT * FROM t")
        with pytest.raises(InputError):
            eng.build("tv")
    finally:
        eng.close()
    with pytest.raises(DatabaseError):
        Engine(pg_server.url_for("no_such_database"))
    with pytest.raises(DatabaseError):
        Engine("postgresql://postgres@/postgres?host=/nonexistent/socket/dir")


def test_intervals_cover_from_both_sides_on_postgres(pg_url):
    """The accuracy and coverage goals on PostgreSQL: a table whose three-way dependence no pair grid holds,
    built with fresh sample seeds; standardized errors of the sampled answers cover at about 95% (|z| < 1.96)
    with E|z| near 0.8 (intervals 10x too narrow or too wide fail)."""
    eng = Engine(pg_url)
    try:
        load(eng, "t", f"SELECT a, b, (a + b + 0.05 * {U.format(k=3)}) % 1.0 AS c, 10 * a * b + {U.format(k=4)} AS y "
                       f"FROM (SELECT i, {U.format(k=1)} AS a, {U.format(k=2)} AS b FROM range(30000) r(i)) ORDER BY i")
        seeds = [BASE_SEED + 100 * r for r in range(3)]
        zs, errs = [], []
        for seed in seeds:
            eng.build("t", budget_bytes=120_000, seed=seed, bandwidth="silverman")
            for wq in generate(eng, "t", 40, seed=seed + 1):
                apx, ex = _one(eng.query(wq.sql)), _one(eng.exact(wq.sql))
                df = eng.query(wq.sql)
                sd = float(df["v_ci_high"].iloc[0] - df["v_ci_low"].iloc[0]) / (2 * Z95)
                errs.append(abs(apx - ex) / abs(ex))
                if sd > 1e-6 * abs(ex):
                    zs.append((apx - ex) / sd)
        z = np.asarray(zs)
        cover, mean_abs = float(np.mean(np.abs(z) < Z95)), float(np.mean(np.abs(z)))
        msg = (f"seeds {seeds} (replay: DENSITAS_TEST_SEED={BASE_SEED}): {len(z)} sampled answers, coverage "
               f"{cover:.3f}, E|z| {mean_abs:.3f}, median error {np.median(errs):.4f}")
        print(msg)
        assert len(z) >= 60, msg
        # as the refresh's test: too wide fails E|z|'s lower bound and the coverage's upper (no miss at all). About
        # 120 answers: one miss (0.992) happens at a true 95–97% one time in 7 to 70 (seen at DENSITAS_TEST_SEED=8)
        assert 0.85 <= cover <= 0.995, msg
        assert 0.5 <= mean_abs <= 1.15, msg
        assert np.median(errs) < 0.05, msg
    finally:
        eng.close()
