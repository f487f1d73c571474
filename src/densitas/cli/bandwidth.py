"""``densitas bandwidth``: select a KDE bandwidth for columns of a CSV, Parquet or DuckDB file."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table
from sqlglot import exp

from densitas.exceptions import InputError

__all__ = ["check_request", "load_columns", "run"]

DUCKDB_SUFFIXES = (".duckdb", ".db", ".ddb")


def _select(columns: list[str] | None, source: exp.Expression) -> str:
    cols = [exp.column(c, quoted=True) for c in columns] if columns else ["*"]
    return exp.select(*cols).from_(source).sql("duckdb")


def _file_source(function: str, p: Path) -> exp.Table:
    return exp.Table(this=exp.func(function, exp.Literal.string(str(p))))


def load_columns(path: str | Path, columns: list[str], table: str | None = None) -> Any:
    """Read ``columns`` of a CSV/Parquet file or of a table of a DuckDB database into a pandas DataFrame."""
    import duckdb

    p = Path(path)
    if not p.exists():
        raise InputError(f"FILE {str(p)!r} does not exist.")
    suffix = p.suffix.lower()
    if suffix in DUCKDB_SUFFIXES:
        con = duckdb.connect(str(p), read_only=True)
        tables = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()]
        if table is None:
            if len(tables) != 1:
                con.close()
                raise InputError(f"{p.name} holds the tables {tables}; choose one with --table.")
            table = tables[0]
        elif table not in tables:
            con.close()
            raise InputError(f"--table {table!r} is not in {p.name}; it holds {tables}.")
        source = exp.Table(this=exp.to_identifier(table, quoted=True))
    elif suffix in (".csv", ".tsv", ".txt", ".gz"):
        con = duckdb.connect()
        source = _file_source("read_csv_auto", p)
    elif suffix in (".parquet", ".pq"):
        con = duckdb.connect()
        source = _file_source("read_parquet", p)
    else:
        raise InputError(f"FILE {p.name!r}: unknown format {suffix!r}; use .csv, .parquet or a DuckDB file "
                         f"({', '.join(DUCKDB_SUFFIXES)}).")
    try:
        available = [r[0] for r in con.execute("DESCRIBE " + _select(None, source)).fetchall()]
        missing = [c for c in columns if c not in available]
        if missing:
            raise InputError(f"--column {missing[0]!r} is not in {p.name}; its columns are {available}.")
        df = con.execute(_select(columns, source)).df()
    finally:
        con.close()
    for c in columns:
        if df[c].dtype.kind not in "biuf":
            raise InputError(f"--column {c!r} is not numeric (its type is {df[c].dtype}).")
        n_null = int(df[c].isna().sum())
        if n_null:
            raise InputError(f"--column {c!r} holds {n_null} NULL value(s); filter them out first.")
    return df


def check_request(columns: list[str], method: str, engine: str, plot: str | None) -> None:
    """Validate everything that can be checked without the data, before any is read or computed: the method,
    the engine for that method, and that a requested plot can be drawn and written.

    Examples
    --------
    >>> check_request(["price", "qty"], "lscv_H", "auto", None)
    >>> try:
    ...     check_request(["price", "qty"], "lscv_H", "auto", "density.png")
    ... except InputError:
    ...     print("refused before any work")
    refused before any work
    """
    from densitas._backend.arrays import check_choice
    from densitas.kde.selectors import ENGINES, METHODS, SELECTORS

    method = check_choice("method", method, METHODS, "bandwidth")
    SELECTORS[method].validate({}, check_choice("engine", engine, ENGINES, "bandwidth"))
    if len(set(columns)) != len(columns):
        raise InputError(f"--column names a column twice: {columns}.")
    SELECTORS[method].check_dimensions(len(columns), engine, SELECTORS.multivariate)
    if plot is None:
        return
    if len(columns) != 1:
        raise InputError(f"--plot draws the density of one column; {len(columns)} were given ({columns}). Give a "
                         "single --column.")
    if importlib.util.find_spec("matplotlib") is None:
        raise InputError("--plot needs matplotlib: pip install 'densitas[plot]'.")
    folder = Path(plot).resolve().parent
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise InputError(f"--plot {plot!r}: the folder {str(folder)!r} does not exist or is not writable.")


def run(path: str, columns: list[str], method: str, engine: str, device: str, table: str | None,
        plot: str | None, console: Console | None = None) -> dict[str, Any]:
    from densitas._backend.device import resolve_device
    from densitas.kde import bandwidth

    check_request(columns, method, engine, plot)
    dev = resolve_device(device)
    console = console or Console(width=120)
    df = load_columns(path, columns, table)
    data = df[columns[0]] if len(columns) == 1 else df[columns]  # named: errors and warnings name the columns
    x = data.to_numpy(dtype=np.float64)
    t0 = time.perf_counter()
    h = bandwidth(data, method, engine=engine, device=dev)
    if dev.type == "cuda":
        import torch

        torch.cuda.synchronize(dev)
    elapsed = time.perf_counter() - t0
    table_out = Table(title=f"densitas bandwidth — {Path(path).name}")
    for col in ("column(s)", "rows", "method", "engine", "device", "bandwidth", "time"):
        table_out.add_column(col)
    bw_text = f"{h:.6g}" if np.ndim(h) == 0 else np.array2string(np.asarray(h), precision=5)
    table_out.add_row(", ".join(columns), f"{len(x):,}", method, engine, str(dev), bw_text, f"{elapsed * 1e3:.1f} ms")
    console.print(table_out)
    if plot:
        _plot(x, float(h), plot, columns[0], method)
        console.print(f"density plot written to {plot}")
    return {"bandwidth": h, "seconds": elapsed, "device": str(dev), "rows": len(x)}


def _plot(x: np.ndarray, h: float, out: str, column: str, method: str) -> None:
    try:
        import matplotlib
    except ImportError as exc:
        raise InputError("--plot needs matplotlib: pip install 'densitas[plot]'.") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from densitas.kde import KernelDensity

    sample = x if x.size <= 200_000 else np.random.default_rng(0).choice(x, 200_000, replace=False)
    kde = KernelDensity(h, device="cpu").fit(sample[:, None])
    lo, hi = float(x.min()), float(x.max())
    pad = 3 * h
    grid = np.linspace(lo - pad, hi + pad, 1000)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.hist(x, bins=min(200, max(10, int(np.sqrt(x.size)))), density=True, color="0.8", label="histogram")
    ax.plot(grid, kde.pdf(grid[:, None]), color="C0", lw=2, label=f"KDE, {method} h = {h:.4g}")
    ax.set_xlabel(column)
    ax.set_ylabel("density")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
