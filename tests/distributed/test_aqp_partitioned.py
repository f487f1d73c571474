"""Engine.build_parquet on Dask: one task per Parquet file on the two-process LocalCluster (and on the local
scheduler), the merged synopsis that of a normal DuckDB build of the files' concatenation."""

from __future__ import annotations

import duckdb

from densitas.aqp import Engine, store
from tests.aqp.test_partitioned import TABLE, assert_same_synopsis, reference, write_parts


def test_partitioned_build_on_dask(scheduler, tmp_path):
    con = duckdb.connect()
    con.execute(f"CREATE TABLE src AS {TABLE.format(n=12_000)}")
    files = write_parts(con, "src", tmp_path, (0, 3000, 6500, 9000))
    con.close()
    opts = {"budget_bytes": 100_000, "max_sample_rows": 2000, "bandwidth": "silverman", "seed": 5}
    eng = Engine(duckdb.connect())
    meta = eng.build_parquet("t", files, ["q", "x", "y", "d", "z"], ["g"], client=scheduler, **opts)
    assert meta["partitions"] == 4
    assert_same_synopsis(store.read(eng.con, "t"), reference(files, ["q", "x", "y", "d", "z"], ["g"], **opts))
