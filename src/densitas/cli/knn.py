"""``densitas knn``: k-NN predictions for a test table from a training table (CSV, Parquet or DuckDB), streamed.

The test table is read in chunks and every chunk's predictions are written before the next is read; the
training table is kept in memory when it fits the memory budget and otherwise streamed once per test chunk,
so both may be larger than memory.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from densitas.exceptions import InputError

__all__ = ["run"]

TASKS = ("auto", "classification", "regression")


def _quote(name: str) -> str:
    return '"' + str(name).replace('"', '""') + '"'


class _Writer:
    """Appends DataFrame chunks to a Parquet or CSV file, or to a DuckDB table."""

    def __init__(self, out: str | None, con: Any = None, table: str | None = None):
        self.out = out
        self.con = con
        self.table = table
        self._pq = None
        self._schema = None
        self._csv_header = True
        if out is not None:
            suffix = Path(out).suffix.lower()
            if suffix not in (".parquet", ".pq", ".csv"):
                raise InputError(f"--out {out!r}: use a .parquet or .csv file (or --out-table with --db).")
            self.kind = "csv" if suffix == ".csv" else "parquet"
        else:
            self.kind = "duckdb"

    def write(self, df: Any) -> None:
        if self.kind == "duckdb":
            if self._schema is None:
                self.con.execute(f"CREATE OR REPLACE TABLE {_quote(self.table)} AS SELECT * FROM df")
                self._schema = True
            else:
                self.con.execute(f"INSERT INTO {_quote(self.table)} SELECT * FROM df")
            return
        if self.kind == "csv":
            df.to_csv(self.out, mode="w" if self._csv_header else "a", header=self._csv_header, index=False)
            self._csv_header = False
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self._pq is None:
            table = pa.Table.from_pandas(df, preserve_index=False)
            self._schema = table.schema
            self._pq = pq.ParquetWriter(self.out, self._schema)
        else:
            table = pa.Table.from_pandas(df, schema=self._schema, preserve_index=False)
        self._pq.write_table(table)

    def close(self) -> None:
        if self._pq is not None:
            self._pq.close()


def run(train: str | None, test: str | None, label: str, k: int = 10, *, metric: str = "euclidean",
        weights: str = "uniform", missing: str = "raise", out: str | None = None, db: str | None = None,
        train_table: str | None = None, test_table: str | None = None, out_table: str | None = None,
        nominal: list[str] | None = None, task: str = "auto", device: str = "auto",
        memory_budget: str | None = None, chunk_rows: int = 100_000, console: Console | None = None,
        progress: bool = True) -> dict[str, Any]:
    """Predict ``label`` for every row of the test table from its k nearest training rows.

    Returns a summary: rows, task, seconds, and the accuracy (classification) or RMSE (regression) when the
    test table has the label column too.
    """
    import duckdb

    from densitas._backend.chunking import memory_budget as default_budget
    from densitas._backend.chunking import parse_bytes
    from densitas._backend.device import resolve_device
    from densitas.neighbors.api import build_references, check_k, check_missing, encode_queries
    from densitas.neighbors.distances import get_metric
    from densitas.neighbors.io import DuckDBSource, open_source
    from densitas.neighbors.search import search
    from densitas.neighbors.voting import check_weights, class_probabilities, get_weights, predict_values

    console = console or Console(width=120, stderr=True)
    m_obj = get_metric(metric, "densitas knn")
    check_missing(missing, "densitas knn")
    check_weights(weights, "densitas knn")
    if task not in TASKS:
        raise InputError(f"--task must be one of {list(TASKS)}. Got {task!r} instead.")
    if chunk_rows < 1:
        raise InputError(f"--chunk-rows must be ≥ 1. Got {chunk_rows!r} instead.")
    dev = resolve_device(device)
    budget = parse_bytes(memory_budget) if memory_budget is not None else default_budget(dev)

    con = None
    if db is not None:
        if not (train_table and test_table and out_table):
            raise InputError("--db needs --train-table, --test-table and --out-table.")
        if not Path(db).exists():
            raise InputError(f"--db {db!r} does not exist.")
        con = duckdb.connect(db)
        tables = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()]
        for opt, t in (("--train-table", train_table), ("--test-table", test_table)):
            if t not in tables:
                con.close()
                raise InputError(f"{opt} {t!r} is not in {Path(db).name}; it holds {tables}.")
        train_src = DuckDBSource(con.table(_quote(train_table)), train_table)
        test_src = DuckDBSource(con.table(_quote(test_table)), test_table)
    else:
        if train is None or test is None or out is None:
            raise InputError("Give --train, --test and --out (or --db with --train-table, --test-table, --out-table).")
        train_src = open_source(train, "--train")
        test_src = open_source(test, "--test")
    try:
        if train_src.names is None or label not in train_src.names:
            raise InputError(f"--label {label!r} is not a column of the training table; its columns are "
                             f"{train_src.names}.")
        features = [c for c in train_src.names if c != label]
        missing_cols = [c for c in features if c not in (test_src.names or [])]
        if missing_cols:
            raise InputError(f"The test table lacks the feature column(s) {missing_cols}.")
        # the labels (one column) are held in memory; the features are streamed when they do not fit
        y_frame = _select(train_src, [label], train, con, train_table).read_all()
        y_raw = y_frame[label].to_numpy()
        if task == "auto":
            task = "regression" if y_frame[label].dtype.kind == "f" else "classification"
        if task == "regression":
            y = np.asarray(y_raw, dtype=np.float64)
            if np.isnan(y).any():
                raise InputError(f"--label {label!r} holds missing values in the training table.")
        else:
            if y_frame[label].isna().any():
                raise InputError(f"--label {label!r} holds missing values in the training table.")
            classes, y_codes = np.unique(y_raw.astype(str) if y_raw.dtype == object else y_raw,
                                         return_inverse=True)
        feat_src = _select(train_src, features, train, con, train_table)
        row_bytes = 16 * len(features) + 16
        data = feat_src.read_all() if feat_src.n_rows * row_bytes <= budget // 4 else feat_src
        refs = build_references(data, m_obj, nominal, missing, name="--train", owner="densitas knn")
        k = check_k(k, refs.n_rows, "k", "densitas knn")

        writer = _Writer(out, con, out_table)
        t0 = time.perf_counter()
        done = 0
        correct = 0
        sq_err = 0.0
        n_scored = 0
        pred_name = f"{label}_pred" if label in (test_src.names or []) else label
        with Progress(TextColumn("[bold]knn[/bold] {task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeRemainingColumn(), console=console, disable=not progress, transient=False) as bar:
            job = bar.add_task(f"k={k} {metric} on {refs.n_rows:,} training rows", total=test_src.n_rows)
            for _off, chunk in test_src.blocks(chunk_rows):
                q = encode_queries(chunk[features], refs, missing, dev, name="--test")
                fast = None
                if q.num is not None:
                    import torch

                    fast = torch.float32 if (q.num.dtype == torch.float32 and refs.float_dtype == np.float32) \
                        else torch.float64
                dist, ind = search(refs, q, k, m_obj, skip=missing == "skip", device=dev, budget=budget,
                                   fast_dtype=fast)
                dist, ind = dist.cpu().numpy(), ind.cpu().numpy()
                w = get_weights(dist if weights != "uniform" else None, weights)
                res = chunk.copy()
                if task == "regression":
                    pred = predict_values(y, ind, w)
                    res[pred_name] = pred
                    if label in chunk.columns:
                        truth = chunk[label].to_numpy(dtype=np.float64)
                        sq_err += float(np.nansum((truth - pred) ** 2))
                        n_scored += int((~np.isnan(truth)).sum())
                else:
                    proba = class_probabilities(y_codes, ind, w, len(classes), normalize=weights != "rapidminer")
                    pred = classes[np.argmax(proba, axis=1)]
                    res[pred_name] = pred
                    if label in chunk.columns:
                        truth = chunk[label].to_numpy()
                        truth = truth.astype(str) if truth.dtype == object else truth
                        correct += int((truth == pred).sum())
                        n_scored += len(truth)
                writer.write(res)
                done += len(chunk)
                bar.update(job, advance=len(chunk))
        writer.close()
        seconds = time.perf_counter() - t0
    finally:
        if con is not None:
            con.close()
    summary: dict[str, Any] = {"rows": done, "task": task, "seconds": seconds, "k": k, "metric": metric}
    where = out if out is not None else f"{db}:{out_table}"
    line = f"{done:,} predictions ({task}, k={k}, {metric}) written to {where} in {seconds:.2f} s"
    if n_scored:
        if task == "classification":
            summary["accuracy"] = correct / n_scored
            line += f"; accuracy {summary['accuracy']:.4f}"
        else:
            summary["rmse"] = float(np.sqrt(sq_err / n_scored))
            line += f"; RMSE {summary['rmse']:.6g}"
    Console(width=160).print(line)
    return summary


def _select(src: Any, columns: list[str], path: str | None, con: Any, table: str | None) -> Any:
    """The same table restricted to ``columns`` (read lazily)."""
    from densitas.neighbors.io import DuckDBSource, open_source

    if isinstance(src, DuckDBSource):
        return DuckDBSource(src.relation, src.description, columns)
    return open_source(path, "--train", columns)
