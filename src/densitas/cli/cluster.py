"""``densitas cluster``: generalized fuzzy k-means of a Parquet/CSV/``.npy`` file or a DuckDB table, streamed.

The data are read in chunks on every iteration (so they may exceed memory); a progress bar shows the iteration,
the objective J and the largest centroid move. Then one more pass writes, for every row, its cluster and its
membership in it (and the validity indices FPC and partition entropy are accumulated on the way) to a Parquet or
CSV file or a DuckDB table; ``--plot`` draws a 2-D projection of a sample coloured by cluster.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from densitas.exceptions import InputError

__all__ = ["run"]

#: Rows of the sample drawn by ``--plot``.
PLOT_ROWS = 20_000


def _quote(name: str) -> str:
    return '"' + str(name).replace('"', '""') + '"'


def _open(data: str | None, db: str | None, table: str | None, columns: list[str] | None) -> tuple[Any, Any]:
    """The input as a :class:`densitas.neighbors.io.Source` restricted to numeric columns, and the DuckDB
    connection that owns it (or None)."""
    import duckdb

    from densitas.neighbors.io import DuckDBSource, open_source

    con = None
    if db is not None:
        if table is None:
            raise InputError("--db needs --table (the table to cluster).")
        if data is not None:
            raise InputError("Give either a data file or --db with --table, not both.")
        if not Path(db).exists():
            raise InputError(f"--db {db!r} does not exist.")
        con = duckdb.connect(db)
        tables = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()]
        if table not in tables:
            con.close()
            raise InputError(f"--table {table!r} is not in {Path(db).name}; it holds {tables}.")
        src = DuckDBSource(con.table(_quote(table)), table, columns)
    else:
        if data is None:
            raise InputError("Give a data file (.parquet, .csv or .npy), or --db with --table.")
        src = open_source(data, "data", columns)
    if columns is None and src.names is not None:
        numeric = [c for c, dt in zip(src.names, src.dtypes, strict=True) if np.dtype(dt).kind in "biuf"]
        if not numeric:
            raise InputError(f"{src.description} has no numeric column; its columns are {src.names}.")
        if len(numeric) < len(src.names):
            src = DuckDBSource(src.relation, src.description, numeric) if isinstance(src, DuckDBSource) \
                else open_source(data, "data", numeric)
    return src, con


def run(data: str | None, k: int = 8, *, columns: list[str] | None = None, nearest: int = 2,
        fuzzifier: str | float = "auto", init: str = "k-means++", max_iter: int = 300, tol: float = 1e-6,
        method: str = "auto", seed: int | None = 0, device: str = "auto", memory_budget: str | None = None,
        out: str | None = None, db: str | None = None, table: str | None = None, out_table: str | None = None,
        plot: str | None = None, chunk_rows: int = 100_000, console: Console | None = None,
        progress: bool = True) -> dict[str, Any]:
    """Cluster a table and write every row's cluster and membership.

    Returns a summary: rows, iterations, objective, fuzzifier, method, seconds, fpc, partition entropy, the
    cluster sizes and the centres.

    Examples
    --------
    >>> import tempfile, numpy as np, pandas as pd
    >>> tmp = tempfile.mkdtemp()
    >>> pd.DataFrame({"x": np.r_[np.zeros(5), np.ones(5) * 9]}).to_parquet(f"{tmp}/d.parquet")
    >>> s = run(f"{tmp}/d.parquet", 2, fuzzifier=2.0, out=f"{tmp}/labels.csv", device="cpu", progress=False)
    ... # doctest: +ELLIPSIS
    10 rows in 2 clusters ...
    >>> sorted(s["sizes"])
    [5, 5]
    """
    import pandas as pd

    from densitas.cli.knn import _Writer
    from densitas.cluster import FuzzyKMeans

    console = console or Console(width=120, stderr=True)
    if chunk_rows < 1:
        raise InputError(f"--chunk-rows must be ≥ 1. Got {chunk_rows!r} instead.")
    if out is None and out_table is None:
        raise InputError("Give --out (a .parquet or .csv file) or, with --db, --out-table.")
    if out_table is not None and db is None:
        raise InputError("--out-table needs --db.")
    if plot is not None and Path(plot).suffix.lower() not in (".png", ".pdf", ".svg"):
        raise InputError(f"--plot {plot!r}: use a .png, .pdf or .svg file.")
    q: str | float = fuzzifier
    if isinstance(fuzzifier, str) and fuzzifier != "auto":
        try:
            q = float(fuzzifier)
        except ValueError as exc:
            raise InputError(f"--fuzzifier must be 'auto' or a number > 1. Got {fuzzifier!r} instead.") from exc
    src, con = _open(data, db, table, columns)
    try:
        est = FuzzyKMeans(k, n_nearest=nearest, fuzzifier=q, init=init, max_iter=max_iter, tol=tol,
                          centroid_update=method, device=device, memory_budget=memory_budget, random_state=seed)
        t0 = time.perf_counter()
        with Progress(TextColumn("[bold]cluster[/bold] {task.description}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.fields[status]}"), TimeElapsedColumn(), console=console,
                      disable=not progress, transient=False) as bar:
            job = bar.add_task(f"k={k} M={min(nearest, k)} on {src.n_rows:,} rows × {src.n_columns}",
                               total=max_iter, status="initialising")

            def step(it: int, objective: float, move: float) -> None:
                bar.update(job, completed=it, status=f"J={objective:.6g}  max move={move:.3g}")

            est._fit(src, callback=step, compute_labels=False)
            bar.update(job, total=est.n_iter_, completed=est.n_iter_)
        fit_seconds = time.perf_counter() - t0
        writer = _Writer(out, con, out_table)
        k_eff = est.cluster_centers_.shape[0]
        sizes = np.zeros(k_eff, dtype=np.int64)
        sum_u2 = 0.0
        sum_ent = 0.0
        keep = min(1.0, PLOT_ROWS / max(src.n_rows, 1))
        rng = np.random.default_rng(0)
        sample_x: list[np.ndarray] = []
        sample_y: list[np.ndarray] = []
        done = 0
        for off, chunk in src.blocks(chunk_rows):
            idx, u = est.membership(chunk)
            labels = idx[:, 0]
            sizes += np.bincount(labels, minlength=k_eff)
            sum_u2 += float((u * u).sum())
            sum_ent += float(-(u * np.log(np.where(u > 0, u, 1.0))).sum())
            writer.write(pd.DataFrame({"row": np.arange(off, off + len(labels), dtype=np.int64),
                                       "cluster": labels.astype(np.int64), "membership": u[:, 0]}))
            if plot is not None:
                pick = rng.random(len(labels)) < keep
                x = chunk.to_numpy(dtype=np.float64) if hasattr(chunk, "to_numpy") else np.asarray(chunk, float)
                sample_x.append(x[pick])
                sample_y.append(labels[pick])
            done += len(labels)
        writer.close()
        seconds = time.perf_counter() - t0
    finally:
        if con is not None:
            con.close()
    summary: dict[str, Any] = {
        "rows": done, "iterations": est.n_iter_, "objective": est.inertia_, "fuzzifier": est.fuzzifier_,
        "method": est.centroid_update_, "seconds": seconds, "fit_seconds": fit_seconds,
        "fpc": sum_u2 / max(done, 1), "partition_entropy": sum_ent / max(done, 1), "sizes": sizes.tolist(),
        "centers": est.cluster_centers_,
    }
    where = out if out is not None else f"{db}:{out_table}"
    Console(width=160).print(
        f"{done:,} rows in {k_eff} clusters (M={min(nearest, k_eff)}, q={est.fuzzifier_:.4g}, "
        f"{est.centroid_update_}) after {est.n_iter_} iterations, J={est.inertia_:.6g}, "
        f"FPC={summary['fpc']:.4f} (over each row's nearest clusters), {seconds:.2f} s; labels written to {where}")
    if plot is not None:
        X = np.concatenate(sample_x) if sample_x else np.zeros((0, est.n_features_in_))
        y = np.concatenate(sample_y) if sample_y else np.zeros(0, dtype=np.int64)
        _plot(X, y, est.cluster_centers_, plot, src.names)
        summary["plot"] = plot
    return summary


def _plot(X: np.ndarray, y: np.ndarray, centers: np.ndarray, path: str, names: list[str] | None) -> None:
    """Scatter of a 2-D projection (the data's own two columns, or the first two principal components of the
    sample) coloured by cluster, with the centroids marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = centers.shape[1]
    if d <= 2:
        P = X if d == 2 else np.c_[X, np.zeros(len(X))]
        Pc = centers if d == 2 else np.c_[centers, np.zeros(len(centers))]
        labels = list(names[:2]) if names and d == 2 else ([names[0], ""] if names else ["x0", ""])
    else:
        mean = X.mean(0) if len(X) else centers.mean(0)
        basis = X - mean if len(X) > 1 else centers - mean
        _, s, vt = np.linalg.svd(basis, full_matrices=False)
        comps = vt[:2]
        var = s[:2] ** 2 / max((s ** 2).sum(), 1e-300)
        P, Pc = (X - mean) @ comps.T, (centers - mean) @ comps.T
        labels = [f"PC1 ({var[0]:.0%})", f"PC2 ({var[1]:.0%})" if len(var) > 1 else "PC2"]
    k = len(centers)
    cmap = plt.get_cmap("tab10" if k <= 10 else "tab20")
    fig, ax = plt.subplots(figsize=(7, 6), dpi=110)
    ax.scatter(P[:, 0], P[:, 1], c=[cmap(int(c) % cmap.N) for c in y], s=4, alpha=0.5, linewidths=0)
    ax.scatter(Pc[:, 0], Pc[:, 1], c=[cmap(j % cmap.N) for j in range(k)], s=160, marker="X", edgecolors="black",
               linewidths=1.2)
    for j in range(k):
        ax.annotate(str(j), (Pc[j, 0], Pc[j, 1]), xytext=(6, 6), textcoords="offset points", fontsize=9)
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
    ax.set_title(f"densitas cluster: {k} clusters, {len(P):,} sampled rows" + ("" if d <= 2 else " (PCA)"))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
