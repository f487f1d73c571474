"""``densitas bandwidth`` on CSV, Parquet and DuckDB files."""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from densitas.cli.bandwidth import run
from densitas.cli.main import app
from densitas.exceptions import InputError
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


def test_cli_errors_and_warnings_name_the_users_columns(tmp_path, rng):
    from densitas.kde.selectors import DegenerateBandwidthWarning

    csv = tmp_path / "shop.csv"
    pd.DataFrame({"price": rng.poisson(64, 300), "qty": rng.poisson(5, 300), "flag": np.ones(300)}).to_csv(
        csv, index=False)
    res = CliRunner().invoke(app, ["bandwidth", str(csv), "-c", "qty", "-c", "flag", "-m", "scott"])
    assert res.exit_code == 2 and "'flag'" in res.output and "column 1" not in res.output
    with pytest.warns(DegenerateBandwidthWarning) as caught:
        run(str(csv), ["price", "qty"], "lscv_h", "auto", "cpu", None, None)
    assert "'price'" in str(caught[0].message) and "'qty'" in str(caught[0].message)


@pytest.mark.parametrize("columns,plot,method,engine", [
    (["price", "qty"], "density.png", "lscv_H", "auto"),  # a plot of two columns
    (["price"], "no/such/dir/d.png", "lscv_H", "auto"),  # nowhere to write it
    (["price", "qty"], None, "plugin", "auto"),  # a univariate method on two columns
    (["price", "qty"], None, "lscv_h", "binned"),  # an engine that takes one column only
    (["price"], None, "isj", "exact"),  # an engine the method does not take
])
def test_cli_validates_everything_before_reading_or_computing(files, monkeypatch, tmp_path, columns, plot, method,
                                                              engine):
    import densitas.cli.bandwidth as cli_bw
    import densitas.kde

    _, csv, _, _ = files

    def no_work(*args, **kwargs):
        raise AssertionError("work started before the request was validated")

    monkeypatch.setattr(cli_bw, "load_columns", no_work)
    monkeypatch.setattr(densitas.kde, "bandwidth", no_work)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError):
        run(str(csv), columns, method, engine, "cpu", None, plot)
