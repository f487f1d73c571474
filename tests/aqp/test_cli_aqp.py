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
