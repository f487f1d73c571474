"""``densitas knn`` on Parquet, CSV and DuckDB tables: predictions equal the estimators', streamed in chunks."""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from densitas.cli.knn import run
from densitas.cli.main import app
from densitas.neighbors import KNeighborsClassifier, KNeighborsRegressor


@pytest.fixture
def tables(tmp_path, seeded):
    n, m = 300, 45
    train = pd.DataFrame({"a": seeded.normal(size=n), "b": seeded.normal(size=n)})
    train["y"] = np.where(train["a"] + 0.3 * seeded.normal(size=n) > 0, "pos", "neg")
    test = pd.DataFrame({"a": seeded.normal(size=m), "b": seeded.normal(size=m)})
    test["y"] = np.where(test["a"] > 0, "pos", "neg")
    return tmp_path, train, test


def test_cli_parquet_matches_the_classifier(tables):
    tmp, train, test = tables
    train.to_parquet(tmp / "train.parquet")
    test.to_parquet(tmp / "test.parquet")
    out = tmp / "pred.parquet"
    res = CliRunner().invoke(app, ["knn", "--train", str(tmp / "train.parquet"), "--test", str(tmp / "test.parquet"),
                                   "--label", "y", "-k", "7", "--out", str(out), "--chunk-rows", "10",
                                   "--device", "cpu"])
    assert res.exit_code == 0, res.output
    got = pd.read_parquet(out)
    want = KNeighborsClassifier(7, device="cpu").fit(train[["a", "b"]], train["y"]).predict(test[["a", "b"]])
    assert list(got["y_pred"]) == list(want)
    assert np.allclose(got[["a", "b"]].to_numpy(), test[["a", "b"]].to_numpy())
    assert "accuracy" in res.output


def test_cli_csv_regression_and_duckdb_tables(tables):
    tmp, train, test = tables
    train = train.assign(y=train["a"] * 2.0 + train["b"])
    test = test.drop(columns="y")
    train.to_csv(tmp / "train.csv", index=False)
    test.to_csv(tmp / "test.csv", index=False)
    want = KNeighborsRegressor(5, weights="distance", device="cpu").fit(train[["a", "b"]], train["y"]).predict(
        test[["a", "b"]])
    s = run(str(tmp / "train.csv"), str(tmp / "test.csv"), "y", 5, weights="distance", out=str(tmp / "p.csv"),
            device="cpu", chunk_rows=8, memory_budget="64KB", progress=False)
    assert s["task"] == "regression" and s["rows"] == len(test)
    assert np.allclose(pd.read_csv(tmp / "p.csv")["y"], want, rtol=1e-12)
    db = tmp / "t.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE tr AS SELECT * FROM train")
    con.execute("CREATE TABLE te AS SELECT * FROM test")
    con.close()
    res = CliRunner().invoke(app, ["knn", "--db", str(db), "--train-table", "tr", "--test-table", "te",
                                   "--out-table", "p", "--label", "y", "-k", "5", "--weights", "distance",
                                   "--device", "cpu"])
    assert res.exit_code == 0, res.output
    con = duckdb.connect(str(db))
    got = con.execute("SELECT y FROM p").df()["y"].to_numpy()
    con.close()
    assert np.allclose(got, want, rtol=1e-12)


def test_cli_errors(tables):
    tmp, train, test = tables
    train.to_parquet(tmp / "train.parquet")
    test.to_parquet(tmp / "test.parquet")
    base = ["knn", "--train", str(tmp / "train.parquet"), "--test", str(tmp / "test.parquet"), "--out",
            str(tmp / "o.parquet")]
    for extra in (["--label", "nope"], ["--label", "y", "-k", "301"], ["--label", "y", "--metric", "l7"]):
        res = CliRunner().invoke(app, base + extra)
        assert res.exit_code == 2, res.output
        assert "error:" in res.output
