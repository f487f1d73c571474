"""Column kinds: how each SQL type maps to the numeric line the synopses live on, and back."""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
from sqlglot import exp

from densitas.aqp.connector import line_expr
from densitas.exceptions import InputError

__all__ = ["ColumnInfo", "classify", "to_number"]

_INT = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT",
        "UHUGEINT", "INT", "INT2", "INT4", "INT8"}
_FLOAT = {"FLOAT", "DOUBLE", "REAL", "FLOAT4", "FLOAT8"}
_CATEGORICAL = {"VARCHAR", "BOOLEAN", "ENUM", "TEXT", "STRING", "UUID"}
_EPOCH = _dt.date(1970, 1, 1)


def classify(sql_type: str) -> tuple[str, float] | None:
    """``(kind, step)`` of a numeric/date SQL type, None for other types. ``step`` is the spacing of the values
    (1 for integers and dates, 10^-scale for decimals, 1 µs for timestamps, 0 for floats)."""
    t = sql_type.upper()
    if t in _INT:
        return "int", 1.0
    if t in _FLOAT:
        return "float", 0.0
    m = re.fullmatch(r"DECIMAL\((\d+),\s*(\d+)\)", t)
    if m:
        return "decimal", 10.0 ** -int(m.group(2))
    if t == "DATE":
        return "date", 1.0
    if t in ("TIMESTAMP", "DATETIME", "TIMESTAMP_US"):
        return "timestamp", 1.0
    return None


def is_categorical(sql_type: str) -> bool:
    t = sql_type.upper()
    return t in _CATEGORICAL or t.startswith("ENUM") or t in _INT


@dataclass
class ColumnInfo:
    """A synopsis column: its kind, the numeric line it lives on and its bins (each bin's occupied range and the
    table's rows at its ends; with groups, how those rows are split among them: ``end_dispersion``).

    Examples
    --------
    >>> info = ColumnInfo("x", "INTEGER", "int", 1.0, lo=0.0, hi=9.0, edges=np.array([0.0, 5.0]))
    >>> info.bins, info.uppers().tolist(), info.end_dispersion
    (2, [5.0, 10.0], {})
    """

    name: str
    sql_type: str
    kind: str
    step: float
    nullable: bool = False
    lo: float = math.nan  # smallest value
    hi: float = math.nan  # largest value
    distinct: int = 0
    discrete: bool = False  # bins are the distinct values themselves
    edges: np.ndarray = field(default_factory=lambda: np.zeros(0))  # lower edge of each bin (bins 1..B)
    # smallest and largest value each bin holds in the table (NaN where empty): rows are spread over these
    occupied_min: np.ndarray = field(default_factory=lambda: np.zeros(0))
    occupied_max: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # rows of the table at each bin's smallest and largest value (empty where unknown): the model keeps them
    # there as point masses, so that a bound at a bin's end (``x < max(x)``) cuts them exactly
    count_at_min: np.ndarray = field(default_factory=lambda: np.zeros(0))
    count_at_max: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # the (group, value) pairs present in the table (build.count_cells; 0: not counted, taken as groups x
    # distinct values): the rows of the column's histogram at one bin a value
    cells: int = 0
    # how the rows at the bins' ends are split among the synopsis' groups against the model's proportional split,
    # per set of group columns (build.end_dispersion: 1 at random, 0 exact); empty where not measured
    end_dispersion: dict = field(default_factory=dict)
    # how far the rows strictly inside the bins lie from the even spread the model places them by beyond rows
    # placed at random and the density's slope, per set of group columns (build.placement_error); empty where
    # not measured
    placement_error: dict = field(default_factory=dict)

    @property
    def column(self) -> exp.Column:
        """The column, quoted, as a sqlglot expression."""
        return exp.column(self.name, quoted=True)

    @property
    def expr(self) -> str:
        """DuckDB SQL mapping the column to DOUBLE on its numeric line (a connector's ``to_line`` gives it for
        its own database)."""
        return line_expr(self.column, self.kind).sql("duckdb")

    @property
    def numeric(self) -> bool:
        """SUM and AVG apply (not to dates and timestamps)."""
        return self.kind in ("int", "float", "decimal")

    @property
    def top(self) -> float:
        """Upper end of the last bin: a value v occupies [v, v + step) on the line."""
        return self.hi + self.step if self.step > 0 else float(np.nextafter(self.hi, np.inf))

    @property
    def bins(self) -> int:
        return len(self.edges)

    def uppers(self) -> np.ndarray:
        """Upper end of each bin."""
        return np.append(self.edges[1:], self.top)

    def spread(self) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper) per bin of the extent its rows are modelled as spread evenly over: from the bin's
        smallest to just past its largest value (a value v occupies [v, v + step)), so that a bound beyond the
        last occupied value keeps the whole bin and a point mass (one value) is cut exactly; the bin's edges
        where its occupied range is unknown or empty.

        Examples
        --------
        >>> import numpy as np
        >>> info = ColumnInfo("x", "INTEGER", "int", 1.0, lo=0.0, hi=99.0, edges=np.array([0.0, 50.0]),
        ...                   occupied_min=np.array([3.0, 50.0]), occupied_max=np.array([20.0, 50.0]))
        >>> [a.tolist() for a in info.spread()]   # bin 2 holds only the value 50: it occupies [50, 51)
        [[3.0, 50.0], [21.0, 51.0]]
        """
        lo, up = self.edges.astype(np.float64), self.uppers()
        if len(self.occupied_min) != len(lo):
            return lo, up
        vmin, vmax = self.occupied_min, self.occupied_max
        past = vmax + self.step if self.step > 0 else np.nextafter(vmax, np.inf)
        ok = np.isfinite(vmin) & np.isfinite(vmax)
        return np.where(ok, np.maximum(vmin, lo), lo), np.where(ok, np.minimum(past, up), up)

    def to_dict(self) -> dict:
        return {"name": self.name, "sql_type": self.sql_type, "kind": self.kind, "step": self.step,
                "nullable": self.nullable, "lo": self.lo, "hi": self.hi, "distinct": self.distinct,
                "discrete": self.discrete, "end_dispersion": self.end_dispersion,
                "placement_error": self.placement_error}

    @classmethod
    def from_dict(cls, d: dict, edges: np.ndarray, occupied_min: np.ndarray | None = None,
                  occupied_max: np.ndarray | None = None, count_at_min: np.ndarray | None = None,
                  count_at_max: np.ndarray | None = None) -> ColumnInfo:
        def given(a: np.ndarray | None) -> np.ndarray:
            return np.zeros(0) if a is None else a

        return cls(edges=edges, occupied_min=given(occupied_min), occupied_max=given(occupied_max),
                   count_at_min=given(count_at_min), count_at_max=given(count_at_max), **d)


def subset_key(columns: Iterable[str]) -> str:
    """The key :attr:`ColumnInfo.end_dispersion` files a set of group columns under.

    Examples
    --------
    >>> subset_key(["wday", "state"])
    '["state", "wday"]'
    """
    return json.dumps(sorted(columns))


def stored_dispersion(info: ColumnInfo, columns: Iterable[str]) -> np.ndarray | None:
    """(2, bins): ``info``'s measured dispersion of its bin ends' split for the set of group ``columns`` (NaN
    where not measured); the largest measured for any set where that one is not stored; None where the column
    has no measurements (:func:`densitas.aqp.build.end_dispersion`).

    Examples
    --------
    >>> info = ColumnInfo("x", "INTEGER", "int", 1.0, end_dispersion={'["a"]': [[0.5], [None]],
    ...                                                                '["b"]': [[2.0], [1.0]]})
    >>> stored_dispersion(info, ["a"]).tolist(), stored_dispersion(info, ["a", "b"]).tolist()
    ([[0.5], [nan]], [[2.0], [1.0]])
    """
    chosen = _stored_for(info.end_dispersion, columns)
    if chosen is None:
        return None
    return np.fmax.reduce(np.array([np.array(v, dtype=np.float64) for v in chosen]), axis=0)  # NaN: none


def stored_placement(info: ColumnInfo, columns: Iterable[str] | None) -> float | None:
    """``info``'s measured placement error (:attr:`ColumnInfo.placement_error`) for answers split by the set of
    group ``columns``; the largest measured where that set is not stored or not given; None where the column
    has no measurements (a synopsis built before they were taken).

    Examples
    --------
    >>> info = ColumnInfo("x", "DOUBLE", "float", 0.0, placement_error={"[]": 0.09, '["a"]': 0.04})
    >>> stored_placement(info, []), stored_placement(info, ["a"]), stored_placement(info, ["b"])
    (0.09, 0.04, 0.09)
    """
    chosen = _stored_for(info.placement_error, columns)
    return None if chosen is None else float(max(chosen))


def _stored_for(stored: dict, columns: Iterable[str] | None) -> list | None:
    """The build's measurements filed under the set of group ``columns`` (:func:`subset_key`), or all of them
    where that set is not stored or not given (the caller takes the largest); None where nothing is stored."""
    if not stored:
        return None
    key = None if columns is None else subset_key(columns)
    return [stored[key]] if key in stored else list(stored.values())


def slope_error(w: np.ndarray, lower: np.ndarray, upper: np.ndarray, i: np.ndarray, x: np.ndarray) -> np.ndarray:
    """(G, m): per group, the signed error of the even spread of fine bin ``i`` (1-based, (m,)) at ``x`` (the
    rows below ``x``) against a linear density through its neighbours' densities (kept non-negative within the
    bin): the systematic part of the placement error where the density is steep. ``w`` (G, B + 1): the groups'
    rows per fine bin (0: NULL); ``lower``, ``upper`` (B,): the extent each bin's rows are spread over.

    Examples
    --------
    >>> import numpy as np
    >>> w = np.array([[0.0, 10.0, 20.0, 30.0]])          # density rising by 10 a unit
    >>> lo, up = np.array([0.0, 1.0, 2.0]), np.array([1.0, 2.0, 3.0])
    >>> slope_error(w, lo, up, np.array([2]), np.array([1.5])).round(3).tolist()  # 10/2·(0 − 0.25): 1.25 fewer
    [[-1.25]]
    """
    i, x = np.asarray(i, dtype=np.int64), np.asarray(x, dtype=np.float64)
    B = len(lower)
    a, b = lower[i - 1], upper[i - 1]
    h, mid = b - a, (a + b) / 2
    lo_i, hi_i = np.maximum(i - 1, 1), np.minimum(i + 1, B)
    ok = (hi_i != lo_i) & (h > 0)
    with np.errstate(all="ignore"):  # a bin of one value is a step (or less) wide: its density may overflow
        dens_lo = w[:, lo_i] / (upper[lo_i - 1] - lower[lo_i - 1])
        dens_hi = w[:, hi_i] / (upper[hi_i - 1] - lower[hi_i - 1])
        span = (lower[hi_i - 1] + upper[hi_i - 1]) / 2 - (lower[lo_i - 1] + upper[lo_i - 1]) / 2
        slope = (dens_hi - dens_lo) / span
        d_i = w[:, i] / h
        slope = np.clip(slope, -2 * d_i / h, 2 * d_i / h)  # the density stays >= 0 within the bin
        out = slope / 2 * ((x - mid) ** 2 - (a - mid) ** 2)
    return np.where(ok, out, 0.0)


def to_number(info: ColumnInfo, value: object, where: str) -> float:
    """A literal compared with ``info``'s column, on the column's numeric line."""
    if info.kind == "date":
        if isinstance(value, _dt.datetime):
            value = value.date() if value.time() == _dt.time() else value
        if isinstance(value, str):
            try:
                value = _dt.date.fromisoformat(value)
            except ValueError:
                raise InputError(f"{where}: {value!r} is not a date for the DATE column {info.name!r}.") from None
        if isinstance(value, _dt.datetime):  # a timestamp inside a day: compare on the continuous day line
            return (value - _dt.datetime(1970, 1, 1)).total_seconds() / 86400.0
        if isinstance(value, _dt.date):
            return float((value - _EPOCH).days)
        raise InputError(f"{where}: {value!r} cannot be compared with the DATE column {info.name!r}.")
    if info.kind == "timestamp":
        if isinstance(value, str):
            try:
                value = _dt.datetime.fromisoformat(value)
            except ValueError:
                raise InputError(f"{where}: {value!r} is not a timestamp for the column {info.name!r}.") from None
        if isinstance(value, _dt.date) and not isinstance(value, _dt.datetime):
            value = _dt.datetime(value.year, value.month, value.day)
        if isinstance(value, _dt.datetime):
            delta = value.replace(tzinfo=None) - _dt.datetime(1970, 1, 1)
            return float(delta.days * 86_400_000_000 + delta.seconds * 1_000_000 + delta.microseconds)
        raise InputError(f"{where}: {value!r} cannot be compared with the TIMESTAMP column {info.name!r}.")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{where}: {value!r} cannot be compared with the numeric column {info.name!r} "
                         f"({info.sql_type}).")
    return float(value)
