"""Errors of the approximate engine: every failure a user can cause is a DensitasError of the right type."""

from __future__ import annotations

import json

import duckdb
import pytest
import sqlglot

from densitas.aqp import Engine
from densitas.aqp import build as build_mod
from densitas.exceptions import (
    DatabaseError,
    DensitasError,
    InputError,
    NoSynopsisError,
    ResultTooLargeError,
    StaleSynopsisError,
    UnsupportedQueryError,
)


@pytest.mark.parametrize("value", [32768, 40000, 65536, 1, True, 2.5])
def test_max_bins_outside_the_stored_range_is_refused(mem_engine, value):
    """Bin numbers are stored as SMALLINT: a larger max_bins is refused before any work, not overflowed."""
    mem_engine.con.execute("CREATE TABLE t AS SELECT i::DOUBLE AS x FROM range(50000) r(i)")
    with pytest.raises(InputError):
        mem_engine.build("t", max_bins=value, budget_bytes=20_000_000)


def test_max_bins_at_the_limit_builds(mem_engine):
    mem_engine.con.execute("CREATE TABLE t AS SELECT i::DOUBLE AS x FROM range(40000) r(i)")
    meta = mem_engine.build("t", max_bins=build_mod.INDEX_MAX, budget_bytes=20_000_000)
    assert meta["rows"] == 40000


@pytest.mark.parametrize("value", [32768, 50000, 0])
def test_max_groups_outside_the_stored_range_is_refused(mem_engine, value):
    """Group ids are stored as SMALLINT too."""
    mem_engine.con.execute("CREATE TABLE g AS SELECT i::DOUBLE AS x, (i % 40000)::VARCHAR AS k "
                           "FROM range(80000) r(i)")
    with pytest.raises(InputError):
        mem_engine.build("g", group_by=["k"], max_groups=value, budget_bytes=2_000_000)


def test_build_option_errors_are_densitas_errors():
    with pytest.raises(DensitasError):
        build_mod.BuildOptions(max_bins=10**6).check()


@pytest.mark.parametrize("name", ["independent_pairs", "compact_sample", "compact_grids"])
def test_switches_must_be_booleans(name):
    build_mod.BuildOptions(**{name: False}).check()
    with pytest.raises(InputError) as err:
        build_mod.BuildOptions(**{name: "no"}).check()
    assert name in str(err.value) and "'no'" in str(err.value)



def test_numpy_numbers_are_taken_as_the_python_numbers_they_equal(mem_engine):
    """A seed drawn from a NumPy Generator (np.int64) was refused as 'not an integer'; it builds the same synopsis
    as the Python int, and the catalog stores plain numbers."""
    import numpy as np

    mem_engine.con.execute("CREATE TABLE t AS SELECT (i % 100)::DOUBLE AS x FROM range(5000) r(i)")
    meta = mem_engine.build("t", seed=np.int64(7), sample_size=np.int32(300), budget_fraction=np.float64(0.5))
    stored = json.loads(meta["options"])["build"]
    assert (stored["seed"], stored["sample_size"], stored["budget_fraction"]) == (7, 300, 0.5)
    assert type(stored["seed"]) is int
    again = mem_engine.query("SELECT SUM(x) FROM t WHERE x < 40.5")
    mem_engine.build("t", seed=7, sample_size=300, budget_fraction=0.5)
    assert mem_engine.query("SELECT SUM(x) FROM t WHERE x < 40.5").equals(again)


@pytest.mark.parametrize(("name", "value"), [
    ("seed", -5), ("seed", 99999999999999999999), ("seed", build_mod.SEED_MAX + 1), ("seed", "x"), ("seed", 1.5),
    ("seed", True), ("bandwidth", "nope"), ("bandwidth", None), ("min_budget_bytes", -1),
    ("min_budget_bytes", 0), ("budget_bytes", True), ("budget_fraction", "x"), ("min_dependence", None),
    ("max_pair_res", 2.5), ("shares", None), ("shares", (0.5, "x", 0.25, 0.25))])
def test_bad_build_parameters_are_input_errors_naming_them(mem_engine, name, value):
    """A bad build option is refused before the database sees it, naming the option and the value: a seed out of
    range reached DuckDB as a conversion error naming no parameter, "x" leaked int()'s ValueError, 1.5 and an
    unknown bandwidth method were accepted (the latter silently replaced by Silverman's rule)."""
    mem_engine.con.execute("CREATE TABLE t AS SELECT (i % 100)::DOUBLE AS x FROM range(1000) r(i)")
    with pytest.raises(InputError) as err:
        mem_engine.build("t", **{name: value})
    assert str(err.value).startswith(f"The '{name}' parameter of BuildOptions must be ")
    assert str(err.value).endswith(f"Got {value!r} instead.")
    assert not mem_engine._has_catalog()  # nothing was built


@pytest.mark.parametrize("table", [None, "", 3])
def test_a_table_that_is_no_name_is_an_input_error(mem_engine, table):
    with pytest.raises(InputError, match=f"The 'table' parameter .* Got {table!r} instead"):
        mem_engine.build(table)
    with pytest.raises(InputError, match=f"The 'table' parameter .* Got {table!r} instead"):
        mem_engine.build_parquet(table, "nothing-*.parquet")


def test_the_seed_range_ends_build(any_engine):
    """0 and SEED_MAX build on DuckDB and PostgreSQL (the sample's salt fits the hashes' parameter); with the whole
    table sampled, the answers are the database's. A bandwidth method of densitas.kde other than the default is
    taken."""
    any_engine.con.execute("CREATE TABLE t AS SELECT (i % 97)::DOUBLE PRECISION AS x, (i % 13)::DOUBLE PRECISION AS y "
                           "FROM generate_series(0, 1999) r(i)")
    sql = "SELECT COUNT(*) AS n, SUM(y) AS s FROM t WHERE x < 40"
    exact = any_engine.exact(sql)
    for seed in (0, build_mod.SEED_MAX):
        meta = any_engine.build("t", seed=seed, sample_size=2000, bandwidth="scott")
        assert json.loads(meta["options"])["seed"] == seed
        got = any_engine.query(sql)
        for c in ("n", "s"):
            assert float(got[c].iloc[0]) == pytest.approx(float(exact[c].iloc[0]), rel=1e-9)


@pytest.mark.parametrize("seed", [2**31 - 104729, build_mod.SEED_MAX])
def test_large_seeds_build_from_parquet(mem_engine, tmp_path, monkeypatch, seed):
    """The Parquet build's dependence probe casts seed + 104729 to an INTEGER: a seed above 2**31 - 104729 failed
    (a DuckDB conversion error) where the table's probe hashes every row; it is a BIGINT there now."""
    from densitas.aqp import partitioned

    monkeypatch.setattr(partitioned, "PROBE_SAMPLE_ROWS", 500)  # the probe takes its hash sample
    path = tmp_path / "p.parquet"
    duckdb.execute(f"COPY (SELECT (i % 97)::DOUBLE AS x, (i % 13)::DOUBLE AS y FROM range(3000) r(i)) TO '{path}'")
    mem_engine.build_parquet("p", str(path), seed=seed, sample_size=3000)
    sql = "SELECT COUNT(*) AS n FROM p WHERE x < 40"
    got = mem_engine.query(sql)
    exact = duckdb.execute(f"SELECT COUNT(*) FROM '{path}' WHERE x < 40").fetchone()[0]
    assert float(got["n"].iloc[0]) == exact

# ---- NoSynopsisError ------------------------------------------------------------------------------------------
def _small(con, name="t"):
    con.execute(f"CREATE TABLE {name} AS SELECT (i % 100)::DOUBLE AS x, (i % 7)::INTEGER AS k, "
                "CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END AS g FROM range(5000) r(i)")


def test_a_table_without_synopsis_raises_no_synopsis_error(mem_engine):
    _small(mem_engine.con)
    with pytest.raises(NoSynopsisError):  # no catalog at all yet
        mem_engine.query("SELECT COUNT(*) FROM t")
    _small(mem_engine.con, "u")
    mem_engine.build("u", ["x"])
    with pytest.raises(LookupError):  # a catalog, but not this table
        mem_engine.query("SELECT COUNT(*) FROM t")
    df = mem_engine.query("SELECT COUNT(*) AS n FROM t WHERE x < 10", fallback="exact")
    assert df.attrs["method"] == "exact" and df["n"].iloc[0] == 500


# ---- database errors are DensitasErrors -----------------------------------------------------------------------
def test_missing_tables_and_columns_are_input_errors(mem_engine):
    _small(mem_engine.con)
    mem_engine.build("t", ["x", "k"])
    for sql in ["SELECT COUNT(*) FROM nope", "SELECT SUM(nope) FROM t", "SELECT MAX(nope) FROM t"]:
        with pytest.raises(InputError):
            mem_engine.exact(sql)
    with pytest.raises(InputError):
        mem_engine.query("SELECT COUNT(*) FROM nope", fallback="exact")


def test_database_failures_are_database_errors(tmp_path):
    path = tmp_path / "ro.duckdb"
    con = duckdb.connect(str(path))
    _small(con)
    con.close()
    with Engine(str(path), read_only=True) as eng:
        with pytest.raises(DatabaseError):  # writing to a read-only database
            eng.build("t", ["x"])
    eng = Engine(duckdb.connect())
    eng.con.execute("SELECT 1")
    eng.close()
    with pytest.raises(DatabaseError):  # was swallowed into an empty frame
        eng.synopses()


def test_synopses_is_empty_without_a_catalog(mem_engine):
    assert mem_engine.synopses().empty
    _small(mem_engine.con)
    mem_engine.build("t", ["x"])
    assert list(mem_engine.synopses()["table_name"]) == ["t"]


def test_a_dropped_column_makes_the_synopsis_stale(mem_engine):
    _small(mem_engine.con)
    mem_engine.build("t", ["x", "k"])
    mem_engine.con.execute("ALTER TABLE t DROP COLUMN k")
    with pytest.raises(StaleSynopsisError):
        mem_engine.query("SELECT COUNT(*) FROM t WHERE x < 3")



def _cased(con) -> None:
    """A table whose whole sample is the table (answers are the database's): ``distance``, ``carrier``."""
    con.execute("CREATE TABLE flights AS SELECT (i * 37 % 2500)::INTEGER AS distance, "
                "['AA', 'B6', 'UA'][1 + i % 3] AS carrier FROM range(3000) r(i)")


def _raw(eng, sql):
    """``sql`` run as it is in DuckDB: its rows and column names."""
    df = eng.con.fetch_df(sql)
    return [tuple(r) for r in df.itertuples(index=False)], list(df.columns)


def _assert_answers(got, sql, eng):
    """``got`` has DuckDB's answer to ``sql``: its column names, its group labels, its numbers (to rounding)."""
    rows, names = _raw(eng, sql)
    assert [c for c in got.columns if not c.endswith(("_ci_low", "_ci_high"))] == names
    assert len(got) == len(rows)
    for r, want in zip(got[names].itertuples(index=False), rows, strict=True):
        assert [v for v in r if isinstance(v, str)] == [v for v in want if isinstance(v, str)]
        assert [float(v) for v in r if not isinstance(v, str)] == pytest.approx(
            [float(v) for v in want if not isinstance(v, str)], rel=1e-9)


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) AS n FROM flights WHERE Distance < 500",
    'SELECT COUNT(*) AS n FROM flights WHERE "DISTANCE" < 500',
    "SELECT Carrier, COUNT(*) AS n, SUM(DISTANCE) AS s FROM flights WHERE distance >= 100 AND CARRIER IN ('AA', 'UA') "
    "GROUP BY Carrier ORDER BY CARRIER DESC",
    'SELECT carrier, AVG("Distance") AS a FROM flights GROUP BY "CARRIER" ORDER BY Carrier',
])
def test_column_names_match_as_duckdb_matches_them(mem_engine, sql):
    """DuckDB resolves column names, quoted or not, case-insensitively: a synopsis answers them (it raised "not in
    the synopsis"), with DuckDB's answer and output names (a group column is named as the table names it)."""
    _cased(mem_engine.con)
    mem_engine.build("flights", ["distance"], ["carrier"], sample_size=3000)
    _assert_answers(mem_engine.query(sql), sql, mem_engine)
    _assert_answers(mem_engine.exact(sql), sql, mem_engine)


def test_columns_differing_only_by_case_are_matched_exactly(pg_url):
    """PostgreSQL holds columns "ab" and "AB": each is answered under its exact name, and a name matching both up
    to case is refused naming them."""
    eng = Engine(pg_url)
    try:
        eng.con.execute('CREATE TABLE t AS SELECT (i % 10)::DOUBLE PRECISION AS ab, (i % 7)::DOUBLE PRECISION AS "AB" '
                        "FROM generate_series(0, 1999) r(i)")
        eng.build("t", sample_size=2000)
        for sql in ('SELECT SUM("AB") AS s FROM t WHERE ab < 5', 'SELECT SUM(ab) AS s FROM t WHERE "AB" < 5'):
            want = eng.con.fetch_rows(sql.replace("ab", '"ab"'))[0][0]
            assert float(eng.query(sql)["s"].iloc[0]) == pytest.approx(float(want), rel=1e-9)
        with pytest.raises(InputError, match=r"'Ab' matches the columns \['AB', 'ab'\] up to case"):
            eng.query('SELECT COUNT(*) FROM t WHERE "Ab" < 5')
    finally:
        eng.close()


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) AS n FROM main.flights WHERE distance < 500",
    "SELECT COUNT(*) AS n FROM MAIN.flights WHERE flights.distance < 500",
    "SELECT COUNT(*) AS n FROM flights WHERE main.flights.distance < 500 AND FLIGHTS.carrier = 'AA'",
    "SELECT f.carrier, SUM(F.distance) AS s FROM flights AS f WHERE f.distance < 900 GROUP BY f.carrier "
    "ORDER BY f.carrier",
])
def test_qualified_names_of_the_table_are_answered(mem_engine, sql):
    """The default schema (``main.flights`` is ``flights``: it raised NoSynopsisError) and qualifiers naming the
    table or its alias are DuckDB's; the answers are DuckDB's, and so is the exact path's."""
    _cased(mem_engine.con)
    mem_engine.build("flights", ["distance"], ["carrier"], sample_size=3000)
    _assert_answers(mem_engine.query(sql), sql, mem_engine)
    _assert_answers(mem_engine.exact(sql), sql, mem_engine)


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM flights WHERE other.distance < 500",
    "SELECT COUNT(*) FROM flights f WHERE flights.distance < 500",
    "SELECT COUNT(*) FROM flights WHERE other.flights.distance < 500",
    "SELECT other.carrier, COUNT(*) FROM flights GROUP BY other.carrier",
    "SELECT SUM(other.distance) FROM flights",
])
def test_columns_of_a_table_not_read_are_input_errors(mem_engine, sql):
    """A column qualified by a table the query does not read: DuckDB refuses it (it got an approximate answer)."""
    _cased(mem_engine.con)
    mem_engine.build("flights", ["distance"], ["carrier"], sample_size=3000)
    with pytest.raises(InputError):  # DuckDB's binder error, through the connector
        mem_engine.con.fetch_rows(sql)
    for run in (mem_engine.query, mem_engine.exact, lambda s: mem_engine.query(s, fallback="exact")):
        with pytest.raises(InputError, match="does not read"):
            run(sql)


def test_a_table_qualified_by_its_database_runs_exactly(mem_engine):
    """``memory.main.flights``: the synopsis cannot tell the database, so it is unsupported; the exact path runs it."""
    _cased(mem_engine.con)
    mem_engine.build("flights", ["distance"], ["carrier"], sample_size=3000)
    sql = "SELECT COUNT(*) AS n FROM memory.main.flights WHERE distance < 500"
    with pytest.raises(UnsupportedQueryError, match="qualified by its database"):
        mem_engine.query(sql)
    got = mem_engine.query(sql, fallback="exact")
    assert got.attrs["method"] == "exact" and float(got["n"].iloc[0]) == _raw(mem_engine, sql)[0][0][0]

# ---- the exact path runs one read-only SELECT -------------------------------------------------------------
WRITES = [
    "SELECT COUNT(*) FROM t; DROP TABLE t",
    "SELECT COUNT(*) AS n FROM t WHERE x < 3; DELETE FROM t",
    "DROP TABLE t",
    "DELETE FROM t",
    "SELECT * INTO t2 FROM t",
    "CREATE TABLE t2 AS SELECT * FROM t",
    "SELECT 1 UNION SELECT 2",
    "SELECT nextval('s')",
    "COPY t TO 'x.csv'",
]


@pytest.mark.parametrize("sql", WRITES)
def test_exact_refuses_anything_but_one_read_only_select(mem_engine, sql):
    _small(mem_engine.con)
    mem_engine.con.execute("CREATE SEQUENCE s")
    with pytest.raises((UnsupportedQueryError, InputError)):
        mem_engine.exact(sql)
    with pytest.raises((UnsupportedQueryError, InputError)):
        mem_engine.exact_sql(sql)
    with pytest.raises((UnsupportedQueryError, InputError)):
        mem_engine.query(sql, fallback="exact")
    assert mem_engine.con.fetch_rows("SELECT count(*) FROM t")[0][0] == 5000
    assert mem_engine.con.fetch_rows("SELECT nextval('s')")[0][0] == 1


def test_exact_runs_the_rebuilt_statement(mem_engine):
    _small(mem_engine.con)
    for sql in ["SELECT COUNT(*) AS n FROM t WHERE x BETWEEN 10 AND 19", "SELECT MAX(x) AS m FROM t;",
                "SELECT COUNT(*) AS n FROM t WHERE x IN (SELECT x FROM t WHERE k = 0) AND x < 10"]:
        assert len(sqlglot.parse(mem_engine.exact_sql(sql), dialect="duckdb")) == 1
    assert mem_engine.exact("SELECT COUNT(*) AS n FROM t WHERE x BETWEEN 10 AND 19")["n"].iloc[0] == 500
    assert mem_engine.exact("SELECT MAX(x) AS m FROM t;")["m"].iloc[0] == 99


def test_exact_answers_are_bounded(mem_engine):
    _small(mem_engine.con)
    sql = "SELECT x, COUNT(*) AS n FROM t GROUP BY x"  # 100 groups
    with pytest.raises(ResultTooLargeError):
        mem_engine.exact(sql, max_rows=99)
    assert len(mem_engine.exact(sql, max_rows=100)) == 100
    assert len(mem_engine.exact(sql, max_rows=None)) == 100
    with pytest.raises(ResultTooLargeError):
        mem_engine.exact("SELECT x FROM t", max_rows=4999)
    with pytest.raises(ResultTooLargeError):  # a LIMIT of its own above the bound
        mem_engine.exact("SELECT x FROM t ORDER BY x LIMIT 200", max_rows=150)
    assert len(mem_engine.exact("SELECT x FROM t ORDER BY x LIMIT 200", max_rows=300)) == 200
    with pytest.raises(ResultTooLargeError):  # the fallback is bounded too
        mem_engine.query(sql, fallback="exact", max_rows=50)
    limit = sqlglot.parse_one(mem_engine.exact_sql(sql, max_rows=10), dialect="duckdb").args["limit"]
    assert int(limit.expression.this) == 11  # the database returns at most max_rows + 1 rows
    for bad in (0, -1, 2.5, True):
        with pytest.raises(InputError):
            mem_engine.exact(sql, max_rows=bad)


# ---- table names are matched as the database matches them ---------------------------------------------------
def test_table_names_are_case_insensitive(mem_engine):
    _small(mem_engine.con)
    mem_engine.build("t", ["x", "k"])
    expected = mem_engine.query("SELECT COUNT(*) AS n FROM t WHERE x < 10")["n"].iloc[0]
    fresh = Engine(mem_engine.con)  # nothing cached: found through the catalog
    for sql in ["SELECT COUNT(*) AS n FROM T WHERE x < 10", 'SELECT COUNT(*) AS n FROM "T" WHERE x < 10']:
        for eng in (fresh, mem_engine):
            df = eng.query(sql)
            assert df.attrs["method"] == "grid"
            assert df["n"].iloc[0] == expected
    fresh.validate("T")


# ---- GROUP BY on a synopsis column that is not a group column ----------------------------------------------
def test_group_by_a_non_group_column_is_unsupported(mem_engine):
    _small(mem_engine.con)
    mem_engine.build("t", ["x", "k"], group_by=["g"])
    sql = "SELECT k, COUNT(*) AS n FROM t GROUP BY k"
    with pytest.raises(UnsupportedQueryError):
        mem_engine.query(sql)
    df = mem_engine.query(sql, fallback="exact")
    assert df.attrs["method"] == "exact" and len(df) == 7
    assert mem_engine.query("SELECT g, COUNT(*) AS n FROM t GROUP BY g").attrs["method"] == "grid"
