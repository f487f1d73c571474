"""``densitas cluster`` on Parquet, CSV and DuckDB tables: labels equal the estimator's, a progress bar with J,
a plot, errors as exit code 2."""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from densitas.cli.cluster import run
from densitas.cli.main import app
from densitas.cluster import FuzzyKMeans


@pytest.fixture
def table(seeded):
    X = np.concatenate([seeded.normal(size=(60, 3)) + c for c in (0.0, 7.0, 14.0)])
    df = pd.DataFrame(X, columns=["a", "b", "c"])
    df["tag"] = "t"  # a text column: skipped unless named
    return df


def test_cli_parquet_labels_equal_the_estimator(table, tmp_path):
    table.to_parquet(tmp_path / "d.parquet")
    out = tmp_path / "labels.parquet"
    res = CliRunner().invoke(app, ["cluster", str(tmp_path / "d.parquet"), "-k", "3", "--nearest", "2",
                                   "--fuzzifier", "2", "--out", str(out), "--device", "cpu", "--chunk-rows", "25",
                                   "--memory-budget", "20KB", "--plot", str(tmp_path / "p.png")])
    assert res.exit_code == 0, res.output
    got = pd.read_parquet(out)
    km = FuzzyKMeans(3, n_nearest=2, fuzzifier=2.0, random_state=0, device="cpu").fit(table[["a", "b", "c"]])
    assert got["row"].tolist() == list(range(len(table)))
    assert got["cluster"].tolist() == km.labels_.tolist()
    np.testing.assert_allclose(got["membership"], km.predict_membership(table[["a", "b", "c"]]).max(1), rtol=1e-9)
    assert (tmp_path / "p.png").stat().st_size > 1000
    assert "J=" in res.output and "3 clusters" in res.output


def test_cli_csv_columns_and_duckdb_tables(table, tmp_path):
    table.to_csv(tmp_path / "d.csv", index=False)
    s = run(str(tmp_path / "d.csv"), 2, columns=["a", "b"], fuzzifier=1.5, out=str(tmp_path / "l.csv"),
            device="cpu", progress=False, plot=str(tmp_path / "p2.png"))
    assert s["rows"] == len(table) and s["centers"].shape == (2, 2) and sum(s["sizes"]) == len(table)
    assert 0.5 <= s["fpc"] <= 1.0
    assert len(pd.read_csv(tmp_path / "l.csv")) == len(table)
    db = tmp_path / "t.duckdb"
    con = duckdb.connect(str(db))
    con.register("frame", table)
    con.execute("CREATE TABLE pts AS SELECT * FROM frame")
    con.close()
    res = CliRunner().invoke(app, ["cluster", "--db", str(db), "--table", "pts", "--out-table", "lab", "-k", "3",
                                   "--nearest", "3", "--fuzzifier", "2", "--device", "cpu", "--max-iter", "4",
                                   "--tol", "0"])
    assert res.exit_code == 0, res.output
    con = duckdb.connect(str(db))
    lab = con.execute("SELECT cluster FROM lab ORDER BY row").fetchnumpy()["cluster"]
    con.close()
    km = FuzzyKMeans(3, n_nearest=3, fuzzifier=2.0, max_iter=4, tol=0, random_state=0,
                     device="cpu").fit(table[["a", "b", "c"]])
    assert lab.tolist() == km.labels_.tolist()


@pytest.mark.parametrize("args", [
    ["-k", "0"], ["-k", "999"], ["--nearest", "5", "-k", "3"], ["--fuzzifier", "1"], ["--fuzzifier", "soft"],
    ["--columns", "nope"], ["--method", "magic"],
])
def test_cli_errors_exit_2(table, tmp_path, args):
    table.to_parquet(tmp_path / "d.parquet")
    res = CliRunner().invoke(app, ["cluster", str(tmp_path / "d.parquet"), "--out", str(tmp_path / "o.parquet"),
                                   "--device", "cpu", *args])
    assert res.exit_code == 2, res.output
    assert "error:" in res.output


def test_cli_needs_an_output(table, tmp_path):
    table.to_parquet(tmp_path / "d.parquet")
    res = CliRunner().invoke(app, ["cluster", str(tmp_path / "d.parquet")])
    assert res.exit_code == 2 and "--out" in res.output
