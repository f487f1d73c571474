"""``densitas bandwidth`` on CSV, Parquet and DuckDB files."""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from densitas.cli.bandwidth import run
from densitas.cli.main import app
from densitas.kde import bandwidth


@pytest.fixture
def files(tmp_path, rng):
    df = pd.DataFrame({"price": rng.lognormal(size=3000), "qty": rng.normal(size=3000),
                       "name": ["a"] * 3000})
    csv = tmp_path / "sales.csv"
    df.to_csv(csv, index=False)
    db = tmp_path / "shop.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE sales AS SELECT * FROM df")
    con.execute("CREATE TABLE other AS SELECT 1 AS x")
    pq = tmp_path / "sales.parquet"
    con.execute(f"COPY sales TO '{pq}' (FORMAT PARQUET)")
    con.close()
    return df, csv, pq, db


def test_bandwidth_from_csv_parquet_and_duckdb(files):
    df, csv, pq, db = files
    want = bandwidth(df["price"].to_numpy(), "plugin", device="cpu")
    for path, table in ((csv, None), (pq, None), (db, "sales")):
        got = run(str(path), ["price"], "plugin", "auto", "cpu", table, None)
        assert got["bandwidth"] == pytest.approx(want, rel=1e-12)
        assert got["rows"] == 3000


def test_cli_prints_bandwidth_time_device_and_plots(files, tmp_path):
    df, csv, _, _ = files
    png = tmp_path / "density.png"
    res = CliRunner().invoke(app, ["bandwidth", str(csv), "--column", "qty", "--method", "isj", "--device", "cpu",
                                   "--plot", str(png)])
    assert res.exit_code == 0, res.output
    h = bandwidth(df["qty"].to_numpy(), "isj", device="cpu")
    assert f"{h:.6g}" in res.output and "cpu" in res.output and "ms" in res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_matrix_for_two_columns(files):
    df, _, _, db = files
    got = run(str(db), ["price", "qty"], "scott", "auto", "cpu", "sales", None)
    assert np.allclose(got["bandwidth"], bandwidth(df[["price", "qty"]].to_numpy(), "scott"))


@pytest.mark.parametrize("args,match", [
    (["--column", "nope"], "'nope' is not in"),
    (["--column", "name"], "not numeric"),
    (["--column", "price", "--method", "magic"], "'method'"),
])
def test_cli_errors_name_the_problem(files, args, match):
    _, csv, _, _ = files
    res = CliRunner().invoke(app, ["bandwidth", str(csv), *args])
    assert res.exit_code == 2
    assert match in res.output


def test_cli_duckdb_needs_a_table_when_there_are_several(files):
    _, _, _, db = files
    res = CliRunner().invoke(app, ["bandwidth", str(db), "--column", "price"])
    assert res.exit_code == 2 and "--table" in res.output
    res = CliRunner().invoke(app, ["bandwidth", str(db) + ".missing", "--column", "price"])
    assert res.exit_code == 2 and "does not exist" in res.output
