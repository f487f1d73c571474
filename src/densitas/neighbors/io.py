"""Row sources read in chunks: in-memory arrays and DataFrames, ``.npy`` files (memory-mapped), Parquet files
(row batches through pyarrow), CSV files and DuckDB relations or tables (record batches through DuckDB).

A source knows its number of rows and its columns before it is read, and can be read any number of times,
chunk by chunk (``blocks``), so a reference set larger than memory is streamed once per search pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from densitas.exceptions import InputError

__all__ = ["ArraySource", "DuckDBSource", "NpySource", "ParquetSource", "Source", "open_source"]

PARQUET_SUFFIXES = (".parquet", ".pq")
CSV_SUFFIXES = (".csv", ".tsv", ".txt")
NPY_SUFFIXES = (".npy",)


class Source:
    """Base class: ``n_rows``, ``names`` (None for arrays), ``dtypes`` and ``blocks(rows)``."""

    n_rows: int
    names: list[str] | None
    dtypes: list[Any]
    in_memory: bool = False
    description: str = "data"

    @property
    def n_columns(self) -> int:
        return len(self.dtypes)

    def blocks(self, rows: int) -> Iterator[tuple[int, Any]]:  # pragma: no cover - interface
        """Yield ``(offset, chunk)``: consecutive chunks of at most ``rows`` rows (ndarray or DataFrame)."""
        raise NotImplementedError

    def read_all(self) -> Any:
        """The whole source as one chunk (ndarray or DataFrame)."""
        import pandas as pd

        chunks = [c for _, c in self.blocks(max(self.n_rows, 1))]
        if not chunks:
            return self.empty()
        if isinstance(chunks[0], pd.DataFrame):
            return pd.concat(chunks, ignore_index=True)
        return np.concatenate(chunks)

    def empty(self) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError


class ArraySource(Source):
    """An in-memory ndarray, torch tensor or pandas DataFrame (chunks are views)."""

    in_memory = True

    def __init__(self, data: Any, name: str = "X"):
        import pandas as pd
        import torch

        if isinstance(data, torch.Tensor):
            data = data.detach().cpu().numpy()
        if isinstance(data, pd.Series):
            data = data.to_frame()
        if not isinstance(data, pd.DataFrame):
            if hasattr(data, "toarray") or type(data).__module__.startswith("scipy.sparse"):
                raise InputError(f"'{name}' is a sparse matrix; densitas.neighbors needs dense data.")
            data = np.asarray(data)
            if data.ndim != 2:
                raise InputError(f"'{name}' must be 2-dimensional (rows × columns). Got shape {data.shape} "
                                 "instead.")
            self.names = None
            self.dtypes = [data.dtype] * data.shape[1]
        else:
            self.names = [str(c) for c in data.columns]
            if len(set(self.names)) != len(self.names):
                raise InputError(f"'{name}' has duplicate column names {self.names}.")
            data = data.set_axis(self.names, axis=1)
            self.dtypes = list(data.dtypes)
        self.data = data
        self.n_rows = int(data.shape[0])
        self.description = name

    def blocks(self, rows: int) -> Iterator[tuple[int, Any]]:
        for s in range(0, self.n_rows, max(rows, 1)):
            yield s, self.data[s:s + rows]

    def read_all(self) -> Any:
        return self.data

    def empty(self) -> Any:
        return self.data[:0]


class NpySource(Source):
    """A 2-D ``.npy`` file, memory-mapped: chunks are copied in as they are read."""

    def __init__(self, path: Path):
        self.path = path
        arr = np.load(path, mmap_mode="r")
        if arr.ndim != 2:
            raise InputError(f"{path.name} holds an array of shape {arr.shape}; a 2-D array is needed.")
        self.n_rows = int(arr.shape[0])
        self.names = None
        self.dtypes = [arr.dtype] * arr.shape[1]
        self.description = path.name

    def blocks(self, rows: int) -> Iterator[tuple[int, Any]]:
        arr = np.load(self.path, mmap_mode="r")
        for s in range(0, self.n_rows, max(rows, 1)):
            yield s, np.array(arr[s:s + rows])

    def empty(self) -> Any:
        return np.load(self.path, mmap_mode="r")[:0].copy()


def _arrow_to_pandas(batch: Any) -> Any:
    """A pyarrow RecordBatch/Table as a DataFrame with decimals as float64 and strings as objects."""
    import pyarrow as pa

    cols = {}
    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        t = col.type
        if pa.types.is_decimal(t):
            col = col.cast(pa.float64())
        elif pa.types.is_dictionary(t):
            col = col.cast(t.value_type)
        cols[name] = col
    table = pa.table(cols) if cols else pa.table({})
    return table.to_pandas()


def _arrow_dtypes(schema: Any) -> list[Any]:
    import pyarrow as pa

    out: list[Any] = []
    for f in schema:
        t = f.type
        if pa.types.is_dictionary(t):
            t = t.value_type
        if pa.types.is_decimal(t):
            out.append(np.dtype(np.float64))
        elif pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_boolean(t):
            out.append(np.dtype(t.to_pandas_dtype()))
        elif pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
            out.append(np.dtype(object))
        else:
            raise InputError(f"Column {f.name!r} has type {t}, which densitas.neighbors cannot use; cast it to a "
                             "number or a string.")
    return out


class ParquetSource(Source):
    """A Parquet file read in row batches (the row count and schema come from the file's metadata)."""

    def __init__(self, path: Path, columns: list[str] | None = None):
        import pyarrow.parquet as pq

        self.path = path
        pf = pq.ParquetFile(path)
        schema = pf.schema_arrow
        names = list(schema.names)
        if columns is not None:
            bad = [c for c in columns if c not in names]
            if bad:
                raise InputError(f"{path.name} has no column(s) {bad}; its columns are {names}.")
            names = list(columns)
        self.columns = names
        self.names = names
        self.dtypes = _arrow_dtypes(pa_schema_select(schema, names))
        self.n_rows = int(pf.metadata.num_rows)
        self.description = path.name

    def blocks(self, rows: int) -> Iterator[tuple[int, Any]]:
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(self.path)
        offset = 0
        for batch in pf.iter_batches(batch_size=max(rows, 1), columns=self.columns):
            df = _arrow_to_pandas(batch)
            yield offset, df
            offset += len(df)

    def empty(self) -> Any:
        import pandas as pd

        return pd.DataFrame({c: pd.Series(dtype=d) for c, d in zip(self.names, self.dtypes, strict=True)})


def pa_schema_select(schema: Any, names: list[str]) -> Any:
    import pyarrow as pa

    return pa.schema([schema.field(n) for n in names])


class DuckDBSource(Source):
    """A DuckDB relation (or a CSV file, or a table of a database, read through DuckDB) in record batches."""

    def __init__(self, relation: Any, description: str = "relation", columns: list[str] | None = None,
                 keep_alive: Any = None):
        self._keep = keep_alive  # the connection that owns the relation
        names = list(relation.columns)
        if columns is not None:
            bad = [c for c in columns if c not in names]
            if bad:
                raise InputError(f"{description} has no column(s) {bad}; its columns are {names}.")
            relation = relation.select(", ".join(_quote(c) for c in columns))
            names = list(columns)
        self.relation = relation
        self.names = names
        self.description = description
        self.n_rows = int(relation.aggregate("count(*)").fetchall()[0][0])
        reader = relation.limit(0).to_arrow_reader(1)
        self.dtypes = _arrow_dtypes(reader.schema)

    def blocks(self, rows: int) -> Iterator[tuple[int, Any]]:
        reader = self.relation.to_arrow_reader(max(rows, 1))
        offset = 0
        pending = []
        pending_rows = 0
        for batch in reader:
            # DuckDB's batches can be smaller than asked (vector size); gather them up to ``rows``.
            pending.append(batch)
            pending_rows += batch.num_rows
            if pending_rows >= rows:
                df = _batches_to_pandas(pending)
                yield offset, df
                offset += len(df)
                pending, pending_rows = [], 0
        if pending_rows:
            yield offset, _batches_to_pandas(pending)

    def empty(self) -> Any:
        return _arrow_to_pandas(self.relation.limit(0).to_arrow_table())


def _batches_to_pandas(batches: list[Any]) -> Any:
    import pyarrow as pa

    return _arrow_to_pandas(pa.Table.from_batches(batches))


def _quote(name: str) -> str:
    return '"' + str(name).replace('"', '""') + '"'


def _sql_str(p: Path | str) -> str:
    return "'" + str(p).replace("'", "''") + "'"


def open_source(data: Any, name: str = "X", columns: list[str] | None = None) -> Source:
    """Wrap ``data`` as a :class:`Source`.

    Parameters
    ----------
    data : array-like, DataFrame, torch.Tensor, str or Path, or duckdb.DuckDBPyRelation
        A path ending in ``.parquet``/``.pq``, ``.csv``/``.tsv``/``.txt`` or ``.npy`` is read in chunks.
    name : str
        The argument's name, for messages.
    columns : list of str, optional
        Columns to use (files and relations with named columns only).

    Examples
    --------
    >>> import numpy as np
    >>> src = open_source(np.zeros((5, 2)))
    >>> src.n_rows, [len(c) for _, c in src.blocks(2)]
    (5, [2, 2, 1])
    """
    if isinstance(data, str | Path):
        p = Path(data)
        if not p.exists():
            raise InputError(f"'{name}': the file {str(p)!r} does not exist.")
        suffix = p.suffix.lower()
        if suffix in PARQUET_SUFFIXES:
            return ParquetSource(p, columns)
        if suffix in NPY_SUFFIXES:
            if columns is not None:
                raise InputError(f"'{name}': a .npy file has no column names to select {columns} from.")
            return NpySource(p)
        if suffix in CSV_SUFFIXES:
            import duckdb

            con = duckdb.connect()
            rel = con.sql(f"SELECT * FROM read_csv_auto({_sql_str(p)})")
            return DuckDBSource(rel, p.name, columns, keep_alive=con)
        raise InputError(f"'{name}': unknown file format {suffix!r}; use .parquet, .csv or .npy (or pass a DuckDB "
                         "relation).")
    if type(data).__module__.startswith("duckdb") and hasattr(data, "to_arrow_reader"):
        return DuckDBSource(data, "DuckDB relation", columns)
    if columns is not None:
        import pandas as pd

        if isinstance(data, pd.DataFrame):
            data = data[columns]
    return ArraySource(data, name)
