"""``densitas`` command line: demo (the AQP main job), build, refresh, query, bench aqp, bandwidth, knn, cluster,
info, demo-primitives."""

from __future__ import annotations

import typer

from densitas.cli import demo as demo_mod

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="densitas: fast big-table exploration on GPUs and multicore CPUs.")


def _aqp(action: str, *args: object, **kwargs: object) -> None:
    """Run ``densitas.cli.aqp.<action>``; densitas and value errors become one line and exit code 2."""
    from densitas.cli import aqp
    from densitas.exceptions import DensitasError

    try:
        getattr(aqp, action)(*args, **kwargs)
    except (DensitasError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None


@app.command()
def demo(
    db: str = typer.Option("densitas-demo.duckdb", "--db", help="DuckDB file to create (or reuse)."),
    scale: float = typer.Option(1.0, "--scale", help="TPC-H scale factor (1 = 6 million lineitem rows)."),
    queries: int = typer.Option(100, "--queries", min=1, help="Queries of the seeded workload."),
    seed: int = typer.Option(0, "--seed", help="Seed of the workload."),
    rebuild: bool = typer.Option(False, "--rebuild", help="Regenerate the data and rebuild the synopsis."),
) -> None:
    """The main job: TPC-H lineitem into an embedded DuckDB file, synopses, a workload answered approximately
    and exactly, with errors, interval coverage and speedups."""
    _aqp("demo", db, scale, queries, seed, rebuild)


@app.command("demo-primitives")
def demo_primitives(
    size: int = typer.Option(10_000_000, "--size", min=1, help="Elements of generated data."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N."),
    seed: int = typer.Option(0, "--seed", help="Seed of the generated data."),
) -> None:
    """Run every parallel primitive on generated data, check it against NumPy and time both."""
    ok = demo_mod.run(size=size, device=device, seed=seed)
    raise typer.Exit(code=0 if ok else 1)


@app.command()
def build(
    db: str = typer.Option(..., "--db", help="DuckDB database file."),
    table: str = typer.Option(..., "--table", help="Table to summarise."),
    columns: str = typer.Option(None, "--columns", help="Comma-separated numeric/date columns (default: all)."),
    group_by: str = typer.Option(None, "--group-by", help="Comma-separated categorical GROUP BY columns."),
    budget: float = typer.Option(0.01, "--budget", help="Synopsis size as a fraction of the table's storage."),
    seed: int = typer.Option(0, "--seed", help="Seed of the synopsis sample: 0 to 1,164,714,236,248,866 (the "
                             "sample's hash salt, seed * 7919 + 1, must fit a signed 64-bit integer)."),
) -> None:
    """Build (or atomically replace) the synopsis of a table, stored in the database's densitas schema."""
    _aqp("build", db, table, columns, group_by, budget_fraction=budget, seed=seed)


@app.command()
def query(
    sql: str = typer.Argument(..., help="SELECT COUNT/SUM/AVG ... FROM table WHERE ... [GROUP BY ...]"),
    db: str = typer.Option(..., "--db", help="DuckDB database file."),
    exact: bool = typer.Option(False, "--exact", help="Run the query exactly in the database."),
    confidence: float = typer.Option(0.95, "--confidence", help="Confidence of the intervals."),
    fallback: str = typer.Option("error", "--fallback", help="error, or exact: run unsupported queries exactly."),
    method: str = typer.Option("grid", "--method", help="grid (default) or kde."),
) -> None:
    """Answer a query from the table's synopsis, with confidence intervals."""
    _aqp("query", db, sql, exact, confidence, fallback, method)


@app.command()
def refresh(
    table: str = typer.Argument(..., help="Table whose synopsis to bring up to date."),
    db: str = typer.Option(..., "--db", help="DuckDB database file or PostgreSQL URL."),
    verify: bool = typer.Option(False, "--verify", help="Also check the whole table's fingerprint (one scan): rows "
                                "updated or deleted since the build then make it a rebuild."),
) -> None:
    """Merge the rows appended to a table into its synopsis (time proportional to the new rows), or rebuild it
    where a merge cannot be exact; prints merged / current / rebuilt, the rows appended and why it rebuilt."""
    _aqp("refresh", db, table, verify)


bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks against exact answers.")
app.add_typer(bench_app, name="bench")


@bench_app.command("aqp")
def bench_aqp(
    tables: str = typer.Option(None, "--tables",
                               help="Evaluation tables, comma-separated (default: every installed report table): "
                                    "lineitem, synthetic, fertility (tuning); births, military, nafld2, olympics, "
                                    "population, flights (report)."),
    queries: int = typer.Option(300, "--queries", min=1, help="Queries per table."),
    seed: int = typer.Option(None, "--seed", help="Seed (default: a fresh one, printed)."),
    db: str = typer.Option(None, "--db", help="DuckDB file to load the tables into (default: a temporary one)."),
    budget: float = typer.Option(None, "--budget", help="Synopsis budget, a fraction of the table (default 0.01)."),
    sample_size: int = typer.Option(None, "--sample-size", min=10,
                                    help="Sample rows of each synopsis instead of what the budget leaves "
                                         "(groups keep 200 rows at least)."),
    scale: float = typer.Option(1.0, "--scale", help="TPC-H scale of lineitem."),
    rows: int = typer.Option(1_000_000, "--rows", help="Rows of the synthetic table."),
    out: str = typer.Option(None, "--out", help="Write every answer to this .csv (or .json with the summaries)."),
    reload: bool = typer.Option(False, "--reload", help="Reload tables already in --db."),
    rebuild: bool = typer.Option(False, "--rebuild",
                                 help="Replace the synopses of tables of --db that have one (without it such a "
                                      "table is refused: the run builds its own synopsis with its own settings)."),
    table: str = typer.Option(None, "--table",
                              help="Instead: run densitas' seeded workload on this table of --db (its synopsis)."),
    method: str = typer.Option("grid", "--method", help="With --table: grid (default) or kde."),
) -> None:
    """Evaluate approximate answers on real tables: densitas and a 1% row sample against exact DuckDB answers.

    Loads each table into a DuckDB file, builds its synopsis, runs a random 1-3-column range workload (COUNT,
    SUM, AVG; a third grouped) and prints per table the mean/p95 error, 95% coverage from both sides and the
    interval width for densitas and the peer, per aggregate and per number of predicate columns, the worst
    answers, and the goals (mean <= 1%, p95 <= 5%, coverage 90-98%, mean <= half the peer's). A table of --db
    that already has a synopsis is refused unless --rebuild: the run would replace it with its own.
    """
    if table is not None:
        if db is None:
            typer.echo("error: --table needs --db (the database holding the table and its synopsis).", err=True)
            raise typer.Exit(code=2)
        given = [f"{name} {value}" for name, value in (("--sample-size", sample_size), ("--budget", budget))
                 if value is not None]
        if given:
            typer.echo(f"error: {' and '.join(given)}: these apply to the evaluation tables, not to --table (its "
                       "stored synopsis is used).", err=True)
            raise typer.Exit(code=2)
        _aqp("bench", db, table, queries, 0 if seed is None else seed, method)
        return
    _aqp("bench_eval", tables, queries, seed, db, budget, scale=scale, rows=rows, out=out, reload=reload,
         sample_size=sample_size, rebuild=rebuild)


@app.command("bandwidth")
def bandwidth_cmd(
    file: str = typer.Argument(..., help="A CSV or Parquet file, or a DuckDB database (.duckdb/.db)."),
    column: list[str] = typer.Option(..., "--column", "-c",  # noqa: B008
                                     help="Column(s); several give a bandwidth matrix."),
    method: str = typer.Option("plugin", "--method", "-m",
                               help="plugin, scott, silverman, lscv_h, lscv_H or isj."),
    engine: str = typer.Option("auto", "--engine", help="auto, exact or binned."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N."),
    table: str = typer.Option(None, "--table", help="Table of a DuckDB file (needed when it holds several)."),
    plot: str = typer.Option(None, "--plot", help="Write the density over a histogram to this PNG."),
) -> None:
    """Select a KDE bandwidth for column(s) of a file and print it with the time and device."""
    from densitas.cli import bandwidth as bw_mod
    from densitas.exceptions import DensitasError

    try:
        bw_mod.run(file, column, method, engine, device, table, plot)
    except (DensitasError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None


@app.command("knn")
def knn_cmd(
    train: str = typer.Option(None, "--train", help="Training table: a .parquet or .csv file."),
    test: str = typer.Option(None, "--test", help="Test table: a .parquet or .csv file (streamed in chunks)."),
    label: str = typer.Option(..., "--label", help="Label column of the training table."),
    k: int = typer.Option(10, "-k", "--k", help="Number of neighbours."),
    metric: str = typer.Option("euclidean", "--metric",
                               help="euclidean, sqeuclidean, manhattan, cosine or mixed_euclidean."),
    weights: str = typer.Option("uniform", "--weights", help="uniform, distance or rapidminer."),
    missing: str = typer.Option("raise", "--missing", help="raise, or skip: leave out coordinates with NaN."),
    out: str = typer.Option(None, "--out", help="Predictions: a .parquet or .csv file."),
    db: str = typer.Option(None, "--db", help="DuckDB file holding the tables (instead of files)."),
    train_table: str = typer.Option(None, "--train-table", help="With --db: the training table."),
    test_table: str = typer.Option(None, "--test-table", help="With --db: the test table."),
    out_table: str = typer.Option(None, "--out-table", help="With --db: the table to write (replaced)."),
    nominal: list[str] = typer.Option(None, "--nominal", help="Nominal column(s) (strings are nominal anyway)."),  # noqa: B008
    task: str = typer.Option("auto", "--task", help="auto (float label: regression), classification or regression."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N."),
    memory_budget: str = typer.Option(None, "--memory-budget", help="Working-memory bound, e.g. 2GB."),
    chunk_rows: int = typer.Option(100_000, "--chunk-rows", help="Test rows per chunk."),
) -> None:
    """k-NN predictions for a test table from a training table (exact neighbours, streamed, with progress)."""
    from densitas.cli import knn as knn_mod
    from densitas.exceptions import DensitasError

    try:
        knn_mod.run(train, test, label, k, metric=metric, weights=weights, missing=missing, out=out, db=db,
                    train_table=train_table, test_table=test_table, out_table=out_table, nominal=nominal or None,
                    task=task, device=device, memory_budget=memory_budget, chunk_rows=chunk_rows)
    except (DensitasError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None


@app.command("cluster")
def cluster_cmd(
    data: str = typer.Argument(None, help="A .parquet, .csv or .npy file (or use --db with --table)."),
    k: int = typer.Option(8, "-k", "--k", help="Number of clusters."),
    columns: str = typer.Option(None, "--columns", help="Comma-separated columns (default: every numeric one)."),
    nearest: int = typer.Option(2, "--nearest", help="Clusters each row belongs to (M; k = classic fuzzy c-means)."),
    fuzzifier: str = typer.Option("auto", "--fuzzifier", help="auto (Schwämmle-Jensen) or a number > 1."),
    init: str = typer.Option("k-means++", "--init", help="k-means++, random-slices or random."),
    max_iter: int = typer.Option(300, "--max-iter", help="Iterations at most."),
    tol: float = typer.Option(1e-6, "--tol", help="Stop when every centroid moves less than this (0: max-iter)."),
    method: str = typer.Option("auto", "--method",
                               help="Centroid update: auto, atomic, counting_sort, sort_by_key or dense."),
    seed: int = typer.Option(0, "--seed", help="Random seed of the initialisation."),
    out: str = typer.Option(None, "--out", help="Labels: a .parquet or .csv file (row, cluster, membership)."),
    db: str = typer.Option(None, "--db", help="DuckDB file holding the table (instead of a file)."),
    table: str = typer.Option(None, "--table", help="With --db: the table to cluster."),
    out_table: str = typer.Option(None, "--out-table", help="With --db: the labels table to write (replaced)."),
    plot: str = typer.Option(None, "--plot", help="Write a 2-D projection coloured by cluster to this PNG."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N."),
    memory_budget: str = typer.Option(None, "--memory-budget", help="Working-memory bound, e.g. 2GB."),
    chunk_rows: int = typer.Option(100_000, "--chunk-rows", help="Rows per chunk of the output pass."),
) -> None:
    """Fuzzy k-means (GFKM) of a table: a progress bar per iteration with J, then every row's cluster."""
    from densitas.cli import cluster as cluster_mod
    from densitas.exceptions import DensitasError

    try:
        cluster_mod.run(data, k, columns=[c.strip() for c in columns.split(",")] if columns else None,
                        nearest=nearest, fuzzifier=fuzzifier, init=init, max_iter=max_iter, tol=tol, method=method,
                        seed=seed, device=device, memory_budget=memory_budget, out=out, db=db, table=table,
                        out_table=out_table, plot=plot, chunk_rows=chunk_rows)
    except (DensitasError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None


@app.command()
def info() -> None:
    """Show the version, devices and which backend each operation uses."""
    demo_mod.info()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
