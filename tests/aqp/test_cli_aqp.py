from __future__ import annotations

from typer.testing import CliRunner

from densitas.aqp import Engine
from densitas.aqp.datasets import synthetic
from densitas.cli.main import app


def test_build_query_exact_bench(tmp_path):
    db = str(tmp_path / "shop.duckdb")
    eng = Engine(db)
    synthetic(eng.con, 20_000, seed=1)
    eng.close()
    r = CliRunner().invoke(app, ["build", "--db", db, "--table", "synthetic", "--columns", "amount,price,day",
                                 "--group-by", "region"])
    assert r.exit_code == 0, r.output
    assert "synopsis of synthetic: 20,000 rows" in r.output
    sql = "SELECT region, COUNT(*) AS n FROM synthetic WHERE price BETWEEN 90 AND 120 GROUP BY region"
    r = CliRunner().invoke(app, ["query", "--db", db, sql])
    assert r.exit_code == 0, r.output
    assert "n_ci_low" in r.output and "north" in r.output
    r = CliRunner().invoke(app, ["query", "--db", db, "--exact", sql])
    assert r.exit_code == 0 and "exact" in r.output
    exact_n = Engine(db).exact(sql)
    assert f"{int(exact_n['n'].iloc[0]):,}" in r.output
    r = CliRunner().invoke(app, ["query", "--db", db, "SELECT MAX(price) FROM synthetic"])
    assert r.exit_code == 2 and "MAX" in r.output
    r = CliRunner().invoke(app, ["bench", "aqp", "--db", db, "--table", "synthetic", "--queries", "12"])
    assert r.exit_code == 0, r.output
    assert "coverage" in r.output


def test_build_says_which_rows_it_stores_whole(tmp_path):
    """The synthetic table's Zipf `visits` puts rows beyond the bounds: the build says how many and where, and the
    number is the outliers table's."""
    db = str(tmp_path / "shop.duckdb")
    eng = Engine(db)
    synthetic(eng.con, 50_000, seed=1)
    eng.close()
    r = CliRunner().invoke(app, ["build", "--db", db, "--table", "synthetic", "--columns", "amount,visits"])
    assert r.exit_code == 0, r.output
    with Engine(db, read_only=True) as eng:
        n = len(eng._load("synthetic").o_gid)
    assert n > 0 and f"{n:,} rows stored whole (a heavy tail: " in r.output and "visits outside [" in r.output


def test_demo_small_scale(tmp_path):
    db = str(tmp_path / "demo.duckdb")
    r = CliRunner().invoke(app, ["demo", "--db", db, "--scale", "0.01", "--queries", "10"])
    assert r.exit_code == 0, r.output
    assert "generated lineitem: 60,175 rows" in r.output
    assert "speedup" in r.output
    df = Engine(db).exact("SELECT COUNT(*) AS n FROM lineitem")
    assert df["n"].iloc[0] == 60175


def test_build_and_query_on_postgres(pg_url):
    """``--db postgresql://...``: the CLI builds in and answers from a PostgreSQL server."""
    from tests.aqp.test_postgres import BASIC, load

    eng = Engine(pg_url)
    load(eng, "t", BASIC.format(n=3000))
    eng.close()
    r = CliRunner().invoke(app, ["build", "--db", pg_url, "--table", "t", "--columns", "q,x", "--group-by", "g"])
    assert r.exit_code == 0, r.output
    assert "synopsis of t: 3,000 rows" in r.output
    r = CliRunner().invoke(app, ["query", "--db", pg_url, "SELECT g, COUNT(*) AS n FROM t WHERE q <= 5 GROUP BY g"])
    assert r.exit_code == 0 and "n_ci_low" in r.output, r.output


def test_refresh_prints_what_it_did(tmp_path):
    """``densitas refresh``: current, merged (rows appended), rebuilt with its reason; errors are one line."""
    db = str(tmp_path / "r.duckdb")
    with Engine(db) as eng:
        eng.con.execute("CREATE TABLE t AS SELECT (i % 100)::DOUBLE AS x, (i % 7)::INTEGER AS k FROM range(5000) r(i)")
        eng.build("t", ["x", "k"])
    r = CliRunner().invoke(app, ["refresh", "--db", db, "t"])
    assert r.exit_code == 0, r.output
    assert "is current: no rows appended (5,000 rows)" in r.output
    with Engine(db) as eng:
        eng.con.execute("INSERT INTO t SELECT (i % 100)::DOUBLE, (i % 7)::INTEGER FROM range(300) r(i)")
    r = CliRunner().invoke(app, ["refresh", "--db", db, "t"])
    assert r.exit_code == 0, r.output
    assert "merged: 300 rows appended, 5,300 rows now" in r.output
    with Engine(db) as eng:
        assert int(eng.synopses()["rows"].iloc[0]) == 5300
        eng.con.execute("INSERT INTO t SELECT (i % 100)::DOUBLE, 99 FROM range(10) r(i)")  # a new discrete value
    r = CliRunner().invoke(app, ["refresh", "--db", db, "t", "--verify"])
    assert r.exit_code == 0, r.output
    assert "rebuilt (10 rows appended)" in " ".join(r.output.split())
    assert "values the discrete column did not hold" in " ".join(r.output.split())
    r = CliRunner().invoke(app, ["refresh", "--db", db, "nope"])
    assert r.exit_code == 2 and r.output.startswith("error: ") and len(r.output.strip().splitlines()) == 1
    r = CliRunner().invoke(app, ["refresh", "--db", str(tmp_path / "missing.duckdb"), "t"])
    assert r.exit_code == 2 and "does not exist" in r.output
    assert not (tmp_path / "missing.duckdb").exists()
