"""Partitioned build (Engine.build_parquet) of TPC-H lineitem split into Parquet files against the normal DuckDB
build of the same table, and the synopses compared (histograms, sample, grids) and scored on one workload.

Usage: .venv/bin/python benchmarks/bench_aqp_partitioned.py --scale 1 --files 8 --queries 60
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from densitas.aqp import Engine, store
from densitas.aqp.datasets import tpch_lineitem
from densitas.aqp.workload import generate
from densitas.cli.aqp import LINEITEM_COLUMNS, LINEITEM_GROUPS

Z95 = 1.959963984540054


def score(eng: Engine, queries) -> dict:
    """Mean/p95 relative error and 95% coverage of the approximate answers against DuckDB's exact ones."""
    errs, cov = [], []
    for wq in queries:
        apx, ex = eng.query(wq.sql), eng.exact(wq.sql)
        keys = [c for c in ex.columns if c not in ("v", "v_ci_low", "v_ci_high")]
        m = ex[[*keys, "v"]].merge(apx, on=keys, suffixes=("_exact", "")) if keys else \
            apx.assign(v_exact=ex["v"].to_numpy())
        t = m["v_exact"].to_numpy(dtype=float)
        ok = np.isfinite(t) & (np.abs(t) > 0)
        errs += list(np.abs(m["v"].to_numpy(dtype=float)[ok] - t[ok]) / np.abs(t[ok]))
        cov += list((m["v_ci_low"].to_numpy(dtype=float)[ok] <= t[ok] + 1e-9 * np.abs(t[ok]))
                    & (t[ok] <= m["v_ci_high"].to_numpy(dtype=float)[ok] + 1e-9 * np.abs(t[ok])))
    e = np.asarray(errs)
    return {"answers": len(e), "mean": float(np.mean(e)), "p95": float(np.quantile(e, 0.95)),
            "coverage": float(np.mean(cov))}


def compare(a: store.StoredSynopsis, b: store.StoredSynopsis) -> dict:
    """What the partitioned synopsis ``a`` shares with the normal build ``b``."""
    same_edges = all(np.array_equal(x.edges, y.edges) for x, y in zip(a.infos, b.infos, strict=True))
    marg = same_edges and all(np.array_equal(a.marg[j][0], b.marg[j][0]) for j in a.marg)
    sums = same_edges and all(np.allclose(a.marg[j][1], b.marg[j][1], rtol=1e-9) for j in a.marg)
    ga, gb = json.loads(a.meta["grids"]), json.loads(b.meta["grids"])
    sample = a.sample_vals.shape == b.sample_vals.shape and np.array_equal(a.sample_vals, b.sample_vals,
                                                                            equal_nan=True)
    return {"edges": same_edges, "histogram counts": marg, "histogram sums (1e-9)": sums,
            "pairs": [(g["cols"], g["res"]) for g in ga["pairs"]] == [(g["cols"], g["res"]) for g in gb["pairs"]],
            "sample": sample, "fingerprint": a.meta["fingerprint"] == b.meta["fingerprint"],
            "pairs (partitioned)": [(g["cols"], g["res"]) for g in ga["pairs"]],
            "pairs (normal)": [(g["cols"], g["res"]) for g in gb["pairs"]]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--queries", type=int, default=60)
    ap.add_argument("--dir", default="/tmp/densitas-bench-partitioned")
    args = ap.parse_args()
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    db = d / f"lineitem_sf{args.scale:g}.duckdb"
    eng = Engine(str(db))
    if "lineitem" not in eng.con.tables():
        t0 = time.perf_counter()
        n = tpch_lineitem(eng.con, args.scale)
        print(f"generated lineitem: {n:,} rows in {time.perf_counter() - t0:.1f} s")
        eng.con.execute("CHECKPOINT")
    n = int(eng.con.fetch_rows("SELECT count(*) FROM lineitem")[0][0])
    files = [str(d / f"lineitem_sf{args.scale:g}_part{i}.parquet") for i in range(args.files)]
    if not all(os.path.isfile(f) for f in files):
        bounds = np.linspace(0, n, args.files + 1).astype(np.int64)
        for i, f in enumerate(files):
            eng.con.execute(f"COPY (SELECT * FROM lineitem WHERE rowid >= {bounds[i]} AND rowid < {bounds[i + 1]} "
                            f"ORDER BY rowid) TO '{f}'")
    print(f"lineitem SF{args.scale:g}: {n:,} rows in {args.files} Parquet files, "
          f"{sum(os.path.getsize(f) for f in files) / 1e6:.1f} MB; load {os.getloadavg()}")
    queries = None
    results = {}
    budget = {"budget_bytes": 3_000_000}  # the same budget for both (the default is 1% of each one's storage)
    t0 = time.perf_counter()
    # the partitioned build counts rows at their nominal width and keeps no independent pairs' probe grids: the
    # normal build does the same here, so that the two synopses compare cell by cell
    like = {"compact_sample": False, "compact_grids": False, "independent_pairs": False}
    meta = eng.build("lineitem", LINEITEM_COLUMNS, LINEITEM_GROUPS, **budget, **like)
    results["normal DuckDB build"] = time.perf_counter() - t0
    print(f"normal DuckDB build: {results['normal DuckDB build']:.2f} s ({meta['size_bytes'] / 1e6:.2f} MB)")
    ref = store.read(eng.con, "lineitem")
    queries = generate(eng, "lineitem", args.queries, seed=5)
    acc = {"normal": score(eng, queries)}

    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                      silence_logs=50) as cluster, Client(cluster) as client:
        client.run(lambda: None)  # workers up before the clock starts
        for rep in range(2):
            t0 = time.perf_counter()
            meta = eng.build_parquet("lineitem", files, LINEITEM_COLUMNS, LINEITEM_GROUPS, client=client, **budget)
            key = f"build_parquet, LocalCluster 2 processes (run {rep + 1})"
            results[key] = time.perf_counter() - t0
            print(f"{key}: {results[key]:.2f} s, phases " + ", ".join(f"{k} {v:.2f} s" for k, v in
                                                                        meta["phases"].items()))
    t0 = time.perf_counter()
    meta = eng.build_parquet("lineitem", files, LINEITEM_COLUMNS, LINEITEM_GROUPS, **budget)
    results["build_parquet, Dask local scheduler (threads)"] = time.perf_counter() - t0
    print(f"build_parquet, local scheduler: {results['build_parquet, Dask local scheduler (threads)']:.2f} s, phases "
          + ", ".join(f"{k} {v:.2f} s" for k, v in meta["phases"].items()))
    got = store.read(eng.con, "lineitem")
    print("same as the normal build:", compare(got, ref))
    acc["partitioned"] = score(eng, queries)
    for k, v in acc.items():
        print(f"{k}: {v['answers']} answers, mean error {100 * v['mean']:.2f}%, p95 {100 * v['p95']:.2f}%, "
              f"coverage {100 * v['coverage']:.1f}%")
    print(f"load after: {os.getloadavg()}")
    eng.close()


if __name__ == "__main__":
    main()
