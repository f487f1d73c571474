"""Engine.build_parquet: a table in Parquet files built one partition per task and merged. The merged synopsis is
checked against a normal DuckDB build of the files' concatenation (same row ids): the same bins, exact histogram,
grid and group counts, sums to 1e-9, the same sample and thresholds, the same fingerprint; on PostgreSQL as the
store too. Its intervals cover at their rate on a table whose dependence the model cannot hold."""

from __future__ import annotations

import json
import os

import duckdb
import numpy as np
import pytest

from densitas.aqp import Engine, StaleSynopsisError, store
from densitas.aqp.workload import generate
from densitas.exceptions import InputError
from tests.aqp.test_coverage import GROUPS, TABLES, Z95, scored
from tests.aqp.test_postgres import U

BASE_SEED = int(os.environ.get("DENSITAS_TEST_SEED", "20261126"))
# a discrete column, a continuous one on a value grid, a skewed one dependent on it (a pair grid), a date, a
# nullable column, a GROUP BY column
TABLE = (f"SELECT (1 + floor(20 * {U.format(k=1)}))::INTEGER AS q, round(1000 * {U.format(k=2)} ** 2, 1) AS x, "
         f"exp(3 * {U.format(k=2)} + 0.3 * {U.format(k=3)}) AS y, DATE '2020-01-01' + floor(700 * {U.format(k=4)})"
         f"::INTEGER AS d, CASE WHEN {U.format(k=5)} < 0.1 THEN NULL ELSE {U.format(k=6)} END AS z, "
         f"pow(1 - {U.format(k=7)}, -1 / 1.3) AS w, "  # Pareto: rows set aside whole
         # a column the group determines in part: 12 of its 36 values a group, discrete only by its (group, value)
         # pairs (build.count_cells)
         f"(i % 3) * 100 + floor(12 * {U.format(k=8)})::INTEGER AS h, "
         "['a', 'b', 'c'][1 + (i % 3)::INTEGER] AS g FROM range({n}) r(i) ORDER BY i")
# unequal partitions, one of them smaller than a group's sample quota
TABLE_NAME = "functional"  # the coverage test's year/month/date table: a dependence no pair grid holds
SPLITS = (0, 7000, 7150, 16000, 24000)


def write_parts(con: duckdb.DuckDBPyConnection, table: str, folder, splits=SPLITS) -> list[str]:
    """Write ``table``'s rows in row-id order into Parquet files at ``splits`` (its row ids are 0, 1, ...)."""
    n = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    bounds = [*splits[1:], n] if splits[-1] < n else list(splits[1:])
    files, lo = [], splits[0]
    for i, hi in enumerate(bounds):
        path = str(folder / f"part{i}.parquet")
        con.execute(f"COPY (SELECT * FROM {table} WHERE rowid >= {lo} AND rowid < {hi} ORDER BY rowid) TO '{path}'")
        files.append(path)
        lo = hi
    return files


def assert_same_synopsis(a: store.StoredSynopsis, b: store.StoredSynopsis) -> None:
    """``a`` (partitioned) holds what ``b`` (a normal build) holds: counts exactly, sums to 1e-9."""
    assert a.meta["rows"] == b.meta["rows"] and a.meta["fingerprint"] == b.meta["fingerprint"]
    assert a.groups.reset_index(drop=True).equals(b.groups.reset_index(drop=True))
    assert [i.to_dict() for i in a.infos] == [i.to_dict() for i in b.infos]
    for ia, ib in zip(a.infos, b.infos, strict=True):
        assert np.array_equal(ia.edges, ib.edges)
        assert np.array_equal(ia.occupied_min, ib.occupied_min, equal_nan=True)
        assert np.array_equal(ia.occupied_max, ib.occupied_max, equal_nan=True)
    for j in a.marg:
        assert np.array_equal(a.marg[j][0], b.marg[j][0])
        np.testing.assert_allclose(a.marg[j][1], b.marg[j][1], rtol=1e-9, atol=1e-9)
    for j in a.sums:
        assert np.array_equal(a.sums[j][0], b.sums[j][0])
        assert a.sums[j][1].keys() == b.sums[j][1].keys()
        for key, tot in a.sums[j][1].items():
            if key[0] == "s":
                np.testing.assert_allclose(tot, b.sums[j][1][key], rtol=1e-9, atol=1e-9)
            else:
                assert np.array_equal(tot, b.sums[j][1][key]), (j, key)
    ga, gb = json.loads(a.meta["grids"]), json.loads(b.meta["grids"])
    assert ga == gb  # the same dependence scores, pairs and resolutions
    assert len(a.pairs) == len(b.pairs)
    for pa, pb in zip(a.pairs, b.pairs, strict=True):
        ka, kb = np.lexsort((pa.c[1], pa.c[0], pa.gid)), np.lexsort((pb.c[1], pb.c[0], pb.gid))
        for x, y in ((pa.gid, pb.gid), (pa.c[0], pb.c[0]), (pa.c[1], pb.c[1]), (pa.n, pb.n)):
            assert np.array_equal(x[ka], y[kb])
    oa, ob = json.loads(a.meta["options"]), json.loads(b.meta["options"])
    assert oa["sample_size"] == ob["sample_size"] and oa["thresholds"] == ob["thresholds"]
    assert np.array_equal(a.sample_gid, b.sample_gid)
    assert np.array_equal(a.sample_vals, b.sample_vals, equal_nan=True)
    assert [b_ is None for b_ in oa["outliers"]] == [b_ is None for b_ in ob["outliers"]]
    for ba, bb in zip(oa["outliers"], ob["outliers"], strict=True):  # the whole table's moments, summed apart
        assert ba is None or ba == pytest.approx(bb, rel=1e-9)
    ka = np.lexsort((*np.nan_to_num(a.outlier_vals, nan=-1e300).T[::-1], a.outlier_gid))
    kb = np.lexsort((*np.nan_to_num(b.outlier_vals, nan=-1e300).T[::-1], b.outlier_gid))
    assert np.array_equal(a.outlier_gid[ka], b.outlier_gid[kb])
    assert np.array_equal(a.outlier_vals[ka], b.outlier_vals[kb], equal_nan=True)
    assert json.loads(a.meta["bandwidths"]) == pytest.approx(json.loads(b.meta["bandwidths"]), rel=1e-12)


def reference(files: list[str], columns, group_by, **opts) -> store.StoredSynopsis:
    """A normal DuckDB build of the files' concatenation, in their order (row ids = the global row ids)."""
    eng = Engine(duckdb.connect())
    try:
        eng.con.execute("CREATE TABLE t AS SELECT * FROM read_parquet(?) LIMIT 0", [files[0]])
        for f in files:
            eng.con.execute("INSERT INTO t SELECT * FROM read_parquet(?)", [f])
        # the partitioned build counts sample and grid rows at their nominal width and stores no independent pairs
        eng.build("t", columns, group_by, **{"compact_sample": False, "compact_grids": False,
                                            "independent_pairs": False, **opts})
        return store.read(eng.con, "t")
    finally:
        eng.close()


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("parquet")
    con = duckdb.connect()
    con.execute(f"CREATE TABLE src AS {TABLE.format(n=30_000)}")
    files = write_parts(con, "src", folder)
    con.close()
    return files


OPTS = {"budget_bytes": 150_000, "max_sample_rows": 3000, "bandwidth": "silverman"}


def test_partitioned_build_equals_a_build_of_the_concatenation(any_engine, parts):
    """Stored in DuckDB or PostgreSQL, built on Dask's local scheduler: the synopsis of the normal build."""
    cols, gb = ["q", "x", "y", "d", "z", "w", "h"], ["g"]
    meta = any_engine.build_parquet("t", parts, cols, gb, seed=3, **OPTS)
    assert meta["partitions"] == 5 and meta["rows"] == 30_000
    got = store.read(any_engine.con, "t")
    assert got.pairs, "the dependent pair (x, y) has a grid"
    assert len(got.outlier_gid) > 0, "w's tail is set aside"
    assert got.infos[cols.index("h")].discrete, "h is discrete by its (group, value) pairs"
    assert_same_synopsis(got, reference(parts, cols, gb, seed=3, **OPTS))
    any_engine.validate("t")  # the merged fingerprint is the files'


def test_a_fixed_sample_size_and_no_groups(parts, tmp_path):
    """sample_size given (quotas not from the budget), no GROUP BY, a glob of the files (sorted by name)."""
    eng = Engine(duckdb.connect())
    meta = eng.build_parquet("events", str(parts[0]).replace("part0", "part*"), ["x", "y", "z"], sample_size=4000,
                             seed=11)
    assert json.loads(meta["options"])["sample_size"] == 4000
    assert_same_synopsis(store.read(eng.con, "events"), reference(parts, ["x", "y", "z"], None, sample_size=4000,
                                                                  seed=11))


def test_answers_staleness_and_errors(parts, tmp_path):
    eng = Engine(duckdb.connect())
    eng.build_parquet("t", parts, ["q", "x"], ["g"], sample_size=30_000, bandwidth="silverman")
    # the whole table sampled: answers exact; checked against DuckDB over the files
    want = duckdb.execute("SELECT g, COUNT(*), SUM(x) FROM read_parquet(?) WHERE q <= 7 AND x > 100 GROUP BY g "
                          "ORDER BY g", [parts]).fetchall()
    got = eng.query("SELECT g, COUNT(*) AS n, SUM(x) AS s FROM t WHERE q <= 7 AND x > 100 GROUP BY g ORDER BY g")
    assert got["g"].tolist() == [w[0] for w in want]
    np.testing.assert_allclose(got["n"], [w[1] for w in want], rtol=1e-9)
    np.testing.assert_allclose(got["s"], [w[2] for w in want], rtol=1e-9)
    with pytest.raises(InputError, match="built from Parquet files"):
        eng.refresh("t")
    # a file rewritten with one value changed: the synopsis is stale
    moved = tmp_path / "copy.parquet"
    duckdb.execute(f"COPY (SELECT * EXCLUDE (file_row_number) REPLACE (x + (file_row_number = 0)::INTEGER AS x) "
                   f"FROM read_parquet('{parts[0]}', file_row_number = true)) TO '{moved}'")
    eng.build_parquet("u", [str(moved), *parts[1:]], ["q", "x"], ["g"])
    eng.validate("u")
    duckdb.execute(f"COPY (SELECT * FROM read_parquet('{parts[0]}')) TO '{moved}'")
    with pytest.raises(StaleSynopsisError, match="stale"):
        eng.validate("u")
    # rewritten with another type in a column: stale too (was an InputError about the schema)
    duckdb.execute(f"COPY (SELECT * REPLACE (x::VARCHAR AS x) FROM read_parquet('{parts[0]}')) TO '{moved}'")
    with pytest.raises(StaleSynopsisError):
        eng.validate("u")
    with pytest.raises(InputError, match="matches no file"):
        eng.build_parquet("v", str(tmp_path / "nothing*.parquet"))
    other = tmp_path / "other.parquet"
    duckdb.execute(f"COPY (SELECT 1 AS a) TO '{other}'")
    with pytest.raises(InputError, match="share its schema"):
        eng.build_parquet("v", [parts[0], str(other)])
    with pytest.raises(InputError, match="append_key"):
        eng.build_parquet("v", parts, append_key="x")


def test_partitioned_intervals_cover_at_their_rate(tmp_path):
    """The coverage test's functional table (year, month and date) in 4 files: honest intervals over fresh seeds."""
    con = duckdb.connect()
    con.execute(f"CREATE TABLE t AS SELECT * EXCLUDE (i) FROM ({TABLES[TABLE_NAME]}) ORDER BY i")
    files = write_parts(con, "t", tmp_path, (0, 9000, 20000, 31000))
    eng = Engine(con)  # the table is also in the database: exact answers to score against
    zs = []
    seeds = [BASE_SEED + 100 * r for r in range(4)]
    for seed in seeds:
        eng.build_parquet("t", files, group_by=GROUPS[TABLE_NAME], budget_bytes=120_000, seed=seed)
        for wq in generate(eng, "t", 60, seed=seed + 1):
            err, sd, truth = scored(eng, wq.sql)
            keep = (sd > 1e-6 * np.abs(truth) + 1e-12) & np.isfinite(sd)
            zs.append(err[keep] / sd[keep])
    z = np.concatenate(zs)
    cover, mean_abs = float(np.mean(np.abs(z) < Z95)), float(np.mean(np.abs(z)))
    msg = f"seeds {seeds}: {len(z)} sampled answers, coverage {cover:.3f}, E|z| {mean_abs:.3f}"
    print(msg)
    assert len(z) >= 60, msg
    assert 0.85 <= cover <= 0.99, msg
    assert 0.5 <= mean_abs <= 1.15, msg


def test_a_group_in_one_file_with_the_rows_set_aside_elsewhere(tmp_path):
    """Group a lives in one file and sets nothing aside, group b in the other with a Pareto tail: b's set-aside
    rows raise a's share of the rest, so a's sample quota exceeds the one planned on the whole groups. The
    partitions must return enough candidates: before, a got 1,501 rows instead of 1,511 and the threshold of b's
    first candidate (another layout raised an IndexError)."""
    con = duckdb.connect()
    con.execute("CREATE TABLE f0 AS SELECT (hash(i) % 1000)::DOUBLE / 1000 AS x, 'a' AS g FROM range(20000) r(i)")
    con.execute("CREATE TABLE f1 AS SELECT pow(1 - (hash(i + 7) % 1000000) / 1e6, -1 / 0.8) AS x, 'b' AS g "
                "FROM range(20000) r(i)")
    files = []
    for t in ("f0", "f1"):
        files.append(str(tmp_path / f"{t}.parquet"))
        con.execute(f"COPY {t} TO '{files[-1]}'")
    con.close()
    opts = {"sample_size": 3000, "bandwidth": "silverman"}
    eng = Engine(duckdb.connect())
    try:
        eng.build_parquet("t", files, ["x"], ["g"], **opts)
        got = store.read(eng.con, "t")
    finally:
        eng.close()
    assert len(got.outlier_gid) > 0
    assert_same_synopsis(got, reference(files, ["x"], ["g"], **opts))
