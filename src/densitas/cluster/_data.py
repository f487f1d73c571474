"""Training data read in chunks: tensors and arrays (resident, or moved to the device chunk by chunk) and
Parquet/CSV/``.npy`` files or DuckDB relations (streamed through :mod:`densitas.neighbors.io` every pass)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from densitas.exceptions import InputError

__all__ = ["ChunkedData", "SourceData", "TensorData", "is_streamed", "open_data"]


def _nonfinite_message(t: torch.Tensor, row_offset: int, name: str) -> str:
    bad = torch.nonzero(~torch.isfinite(t))[0]
    r, c = int(bad[0]), int(bad[1])
    v = float(t[r, c])
    what = "NaN" if v != v else "inf"
    return (f"'{name}' contains {what} at row {row_offset + r}, column {c}; FuzzyKMeans needs finite values "
            "(drop or impute missing values first).")


def _all_finite(t: torch.Tensor) -> bool:
    """Whether every value is finite: one sum (a NaN or inf makes it non-finite), and the exact element-wise
    test only when the sum is not finite (which an overflow of huge values can cause too)."""
    if t.numel() == 0:
        return True
    total = float(t.sum(dtype=torch.float64)) if t.dtype.is_floating_point else 0.0
    return math.isfinite(total) or bool(torch.isfinite(t).all())


def compute_dtype(dtype: Any) -> torch.dtype:
    """float32 stays float32 (and float16/bfloat16 become float32); everything else is computed in float64."""
    if dtype in (torch.float32, torch.float16, torch.bfloat16, np.float32, np.float16) or str(dtype) in (
            "float32", "float16"):
        return torch.float32
    return torch.float64


class ChunkedData:
    """Rows of the training data, chunk by chunk, on ``device`` in the compute dtype."""

    n_rows: int
    n_features: int
    dtype: torch.dtype
    device: torch.device
    feature_names: list[str] | None = None

    def blocks(self, rows: int) -> Iterator[tuple[int, torch.Tensor]]:  # pragma: no cover - interface
        raise NotImplementedError

    def take(self, index: np.ndarray) -> torch.Tensor:
        """Rows ``index`` (sorted, distinct) as a float64 tensor on the device, read in one pass."""
        index = np.asarray(index, dtype=np.int64)
        out = torch.empty((len(index), self.n_features), dtype=torch.float64, device=self.device)
        rows = max(min(self.n_rows, 1 << 16), 1)
        for off, x in self.blocks(rows):
            lo, hi = np.searchsorted(index, [off, off + x.shape[0]])
            if hi > lo:
                sel = torch.from_numpy(index[lo:hi] - off).to(self.device)
                out[lo:hi] = x.index_select(0, sel).to(torch.float64)
        return out


class TensorData(ChunkedData):
    """An in-memory tensor (a NumPy array is wrapped without a copy)."""

    def __init__(self, x: torch.Tensor, device: torch.device, resident_bytes: int, name: str = "X"):
        self.dtype = compute_dtype(x.dtype)
        if x.dtype != self.dtype and x.device == device:
            x = x.to(self.dtype)
        if not _all_finite(x):
            raise InputError(_nonfinite_message(x, 0, name))
        if x.device != device and x.numel() * x.element_size() <= resident_bytes:
            x = x.to(device=device, dtype=self.dtype)  # fits: moved once, not every pass
        self.x = x
        self.device = device
        self.n_rows, self.n_features = int(x.shape[0]), int(x.shape[1])

    def blocks(self, rows: int) -> Iterator[tuple[int, torch.Tensor]]:
        rows = max(int(rows), 1)
        for s in range(0, self.n_rows, rows):
            yield s, self.x[s:s + rows].to(device=self.device, dtype=self.dtype)

    def take(self, index: np.ndarray) -> torch.Tensor:
        sel = torch.from_numpy(np.asarray(index, dtype=np.int64)).to(self.x.device)
        return self.x.index_select(0, sel).to(device=self.device, dtype=torch.float64)


class SourceData(ChunkedData):
    """A :class:`densitas.neighbors.io.Source` (file or DuckDB relation) read anew on every pass."""

    def __init__(self, source: Any, device: torch.device, name: str = "X"):
        bad = [source.names[j] if source.names else j for j, dt in enumerate(source.dtypes)
               if np.dtype(dt).kind not in "biuf"]
        if bad:
            raise InputError(f"'{name}' ({source.description}) has non-numeric column(s) {bad}; select numeric "
                             "columns (e.g. --columns).")
        if source.n_columns == 0:
            raise InputError(f"'{name}' ({source.description}) has no columns.")
        self.source = source
        self.device = device
        self.name = name
        self.dtype = torch.float32 if all(np.dtype(dt) == np.float32 for dt in source.dtypes) else torch.float64
        self.n_rows = int(source.n_rows)
        self.n_features = int(source.n_columns)
        self.feature_names = list(source.names) if source.names is not None else None

    def blocks(self, rows: int) -> Iterator[tuple[int, torch.Tensor]]:
        np_dtype = np.float32 if self.dtype == torch.float32 else np.float64
        for off, chunk in self.source.blocks(max(int(rows), 1)):
            a = chunk.to_numpy(dtype=np_dtype, na_value=np.nan) if hasattr(chunk, "to_numpy") else \
                np.asarray(chunk, dtype=np_dtype)
            t = torch.from_numpy(np.require(a, dtype=np_dtype, requirements=["C", "W"]))
            if not _all_finite(t):
                raise InputError(_nonfinite_message(t, off, self.name))
            yield off, t.to(self.device)


def is_streamed(X: Any) -> bool:
    """Whether ``X`` is a file path, a DuckDB relation or a :class:`~densitas.neighbors.io.Source`."""
    from densitas.neighbors.io import Source

    return (isinstance(X, str | Path | Source)
            or (type(X).__module__.startswith("duckdb") and hasattr(X, "to_arrow_reader")))


def open_data(X: Any, device: torch.device, name: str = "X", columns: list[str] | None = None) -> SourceData:
    """A file path, DuckDB relation or Source as :class:`SourceData`."""
    from densitas.neighbors.io import Source, open_source

    src = X if isinstance(X, Source) else open_source(X, name, columns)
    return SourceData(src, device, name)
