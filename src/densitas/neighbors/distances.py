"""Metrics of :mod:`densitas.neighbors`: the registry, table encoding (numeric and nominal columns, missing
values), the exact float64 distance used to rank candidates, and the error bounds of the fast pass.

Every metric is computed in two ways:

* a **fast** value ``f̃`` for whole tiles (a GEMM ``‖q‖² − 2q·c + ‖c‖²`` on centred data, a normalised dot
  product, or a direct L1 sum) in the data's precision, and
* an **exact** float64 value ``f`` (direct differences) for the candidates the fast pass keeps.

The reported distance is ``finish(f)`` (``√f`` for the Euclidean metrics). :func:`fast_error_bound` gives
``ε`` with ``|f̃ − f| ≤ ε`` (a worst-case rounding bound, valid whatever the summation order), which lets the
search certify that no row dropped by the fast pass can beat, or tie with, the exact k-th neighbour.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from densitas.exceptions import InputError

__all__ = ["METRICS", "MISSING", "Encoded", "Metric", "NominalCoder", "Schema", "encode", "exact_values",
           "get_metric"]

MISSING = ("raise", "skip")


@dataclass(frozen=True)
class Metric:
    """How one metric is computed.

    Attributes
    ----------
    name : str
    fast : {"sq", "l1", "cos"}
        Kind of the fast tile computation (see :mod:`densitas.neighbors._torch`).
    finish : callable
        Maps the exact fast-space value ``f`` (float64 tensor) to the reported distance.
    nominal : bool
        Whether nominal columns take part (only ``mixed_euclidean``).
    center : bool
        Whether the data are shifted by a common vector before the fast pass (translation-invariant metrics).
    doc : str
    """

    name: str
    fast: str
    finish: Callable[[torch.Tensor], torch.Tensor]
    nominal: bool
    center: bool
    doc: str


def _identity(f: torch.Tensor) -> torch.Tensor:
    return f


METRICS: dict[str, Metric] = {
    "euclidean": Metric("euclidean", "sq", torch.sqrt, False, True, "√Σ (a − b)²"),
    "sqeuclidean": Metric("sqeuclidean", "sq", _identity, False, True, "Σ (a − b)²"),
    "manhattan": Metric("manhattan", "l1", _identity, False, True, "Σ |a − b|"),
    "cosine": Metric("cosine", "cos", _identity, False, False,
                     "1 − a·b / (‖a‖‖b‖); 1 when either row is all zeros (scikit-learn's convention)"),
    "mixed_euclidean": Metric("mixed_euclidean", "sq", torch.sqrt, True, True,
                              "√(Σ numeric (a − b)² + Σ nominal [a ≠ b]) (document 001)"),
}


def get_metric(metric: Any, owner: str = "kneighbors") -> Metric:
    """Look up a metric by name; raise :class:`InputError` naming the choices otherwise.

    Examples
    --------
    >>> get_metric("cosine").fast
    'cos'
    """
    if not isinstance(metric, str) or metric not in METRICS:
        raise InputError(f"The 'metric' parameter of {owner} must be one of {list(METRICS)}. Got {metric!r} "
                         "instead.")
    return METRICS[metric]


# ------------------------------------------------------------------------------------------ schema


@dataclass
class Schema:
    """Which input columns are numeric and which nominal.

    ``names`` is None for arrays without column names; ``numeric`` and ``nominal`` are positions in the
    input's columns.
    """

    names: list[str] | None
    numeric: list[int]
    nominal: list[int]

    @property
    def n_columns(self) -> int:
        return len(self.numeric) + len(self.nominal)

    def column_name(self, j: int) -> str:
        return repr(self.names[j]) if self.names is not None else str(j)


def _is_nominal_dtype(dtype: Any) -> bool:
    import pandas as pd

    return bool(isinstance(dtype, pd.CategoricalDtype) or pd.api.types.is_object_dtype(dtype)
                or pd.api.types.is_string_dtype(dtype))


def make_schema(names: list[str] | None, dtypes: Sequence[Any] | None, n_columns: int, nominal: Any,
                owner: str = "kneighbors") -> Schema:
    """Build a :class:`Schema`: ``nominal`` (names or positions) plus string/categorical columns by dtype."""
    chosen: set[int] = set()
    if nominal is not None:
        items = [nominal] if isinstance(nominal, str | int | np.integer) else list(nominal)
        if items and all(isinstance(v, bool | np.bool_) for v in items):
            if len(items) != n_columns:
                raise InputError(f"The 'nominal' parameter of {owner} is a boolean mask of length {len(items)}; "
                                 f"the data have {n_columns} columns.")
            chosen = {j for j, v in enumerate(items) if v}
        else:
            for v in items:
                if isinstance(v, str):
                    if names is None or v not in names:
                        raise InputError(f"The 'nominal' parameter of {owner} names column {v!r}, which is not "
                                         f"among the columns {names}.")
                    chosen.add(names.index(v))
                elif isinstance(v, int | np.integer) and not isinstance(v, bool) and -n_columns <= v < n_columns:
                    chosen.add(int(v) % n_columns)
                else:
                    raise InputError(f"The 'nominal' parameter of {owner} must hold column names or positions in "
                                     f"[0, {n_columns}). Got {v!r} instead.")
    if dtypes is not None:
        chosen |= {j for j, d in enumerate(dtypes) if _is_nominal_dtype(d)}
    nom = sorted(chosen)
    return Schema(names, [j for j in range(n_columns) if j not in chosen], nom)


# ------------------------------------------------------------------------------------------ coding


@dataclass
class NominalCoder:
    """Maps the values of each nominal column to integer codes (−1 = missing), consistently across chunks
    and between references and queries: codes are only ever appended."""

    categories: dict[int, list[Any]] = field(default_factory=dict)
    _index: dict[int, dict[Any, int]] = field(default_factory=dict)

    def encode(self, j: int, values: Any) -> np.ndarray:
        import pandas as pd

        s = pd.Series(np.asarray(values, dtype=object) if not isinstance(values, pd.Series) else values)
        missing = s.isna().to_numpy()
        cats = self.categories.setdefault(j, [])
        index = self._index.setdefault(j, {})
        uniques, inverse = np.unique(_keys(s[~missing]), return_inverse=True)
        local = np.empty(len(uniques), dtype=np.int64)
        for u_pos, u in enumerate(uniques.tolist()):
            code = index.get(u)
            if code is None:
                code = len(cats)
                index[u] = code
                cats.append(u)
            local[u_pos] = code
        out = np.full(len(s), -1, dtype=np.int64)
        out[~missing] = local[inverse]
        return out


def _keys(s: Any) -> np.ndarray:
    """Hashable, sortable keys: numbers stay numbers (1 == 1.0), everything else is compared as text with
    its type name (so the string "1" and the number 1 differ)."""
    vals = s.to_numpy(dtype=object)
    if all(isinstance(v, int | float | np.integer | np.floating) and not isinstance(v, bool) for v in vals):
        return np.asarray(vals, dtype=np.float64)
    return np.asarray([f"{type(v).__name__}:{v}" if not isinstance(v, str) else f"str:{v}" for v in vals],
                      dtype=object)


# ---------------------------------------------------------------------------------------- encoding


@dataclass
class Encoded:
    """Rows as tensors: ``num`` (n, p) float (NaN where missing) or None; ``nom`` (n, r) int64 codes (−1 where
    missing) or None."""

    num: torch.Tensor | None
    nom: torch.Tensor | None
    n: int

    def slice(self, s: slice) -> Encoded:
        return Encoded(None if self.num is None else self.num[s], None if self.nom is None else self.nom[s],
                       len(range(*s.indices(self.n))))

    def take(self, idx: torch.Tensor) -> Encoded:
        return Encoded(None if self.num is None else self.num[idx], None if self.nom is None else self.nom[idx],
                       int(idx.shape[0]))

    def to(self, device: torch.device) -> Encoded:
        return Encoded(None if self.num is None else self.num.to(device),
                       None if self.nom is None else self.nom.to(device), self.n)


def _float_dtype_of(dtypes: Sequence[Any]) -> np.dtype:
    """float32 when every numeric column is float32 or narrower (float16, small ints, bool), else float64."""
    ok32 = all(np.dtype(d).kind in "b" or (np.dtype(d).kind == "f" and np.dtype(d).itemsize <= 4)
               or (np.dtype(d).kind in "iu" and np.dtype(d).itemsize <= 2) for d in dtypes)
    return np.dtype(np.float32) if (dtypes and ok32) else np.dtype(np.float64)


def _numeric_column(col: Any, name: str) -> np.ndarray:
    import pandas as pd

    if isinstance(col, pd.Series):
        if not (pd.api.types.is_numeric_dtype(col.dtype) or pd.api.types.is_bool_dtype(col.dtype)):
            raise InputError(f"Column {name} is not numeric (dtype {col.dtype}); declare it nominal.")
        if isinstance(col.dtype, np.dtype):
            return col.to_numpy()
        return col.to_numpy(dtype=np.float64, na_value=np.nan)
    return np.asarray(col)


def encode(data: Any, schema: Schema, coder: NominalCoder, *, missing: str, name: str, row_offset: int = 0,
           device: torch.device | None = None, float_dtype: np.dtype | None = None) -> Encoded:
    """Encode a block of rows (ndarray, tensor or DataFrame) as :class:`Encoded`.

    Raises :class:`InputError` for infinite values, and for NaN when ``missing="raise"``, naming the row
    (counted from the start of the whole input, ``row_offset`` included) and the column.
    """
    import pandas as pd

    whole = None  # the numeric block as one array, when the input is one (fast conversion)
    if isinstance(data, torch.Tensor):
        data = data.detach().cpu().numpy()
    if isinstance(data, pd.DataFrame):
        cols = list(data.columns)
        if schema.names is not None:
            missing_cols = [c for c in schema.names if c not in cols]
            if missing_cols:
                raise InputError(f"'{name}' lacks the column(s) {missing_cols} of the references.")
            frame = data[schema.names]
        else:
            if len(cols) != schema.n_columns:
                raise InputError(f"'{name}' has {len(cols)} columns; the references have {schema.n_columns}.")
            frame = data
        n = len(frame)
        num_cols = [_numeric_column(frame.iloc[:, j], schema.column_name(j)) for j in schema.numeric]
        nom_cols = [frame.iloc[:, j] for j in schema.nominal]
    else:
        arr = np.asarray(data)
        if arr.ndim != 2:
            raise InputError(f"'{name}' must be 2-dimensional (rows × columns). Got shape {arr.shape} instead.")
        if arr.shape[1] != schema.n_columns:
            raise InputError(f"'{name}' has {arr.shape[1]} columns; the references have {schema.n_columns}.")
        n = arr.shape[0]
        if arr.dtype.kind not in "biuf" and schema.numeric:
            try:
                num_block = arr[:, schema.numeric].astype(np.float64)
            except (TypeError, ValueError) as exc:
                raise InputError(f"'{name}' holds non-numeric values in numeric columns; declare them nominal "
                                 "(the 'nominal' parameter).") from exc
            num_cols = [num_block[:, i] for i in range(num_block.shape[1])]
        else:
            num_cols = [arr[:, j] for j in schema.numeric]
            if not schema.nominal and arr.dtype.kind in "biuf":
                whole = arr
        nom_cols = [arr[:, j] for j in schema.nominal]
    num = None
    if num_cols:
        for c in num_cols:
            if c.dtype.kind not in "biuf":
                raise InputError(f"'{name}' holds a non-numeric column of dtype {c.dtype}.")
        fdt = float_dtype or _float_dtype_of([c.dtype for c in num_cols])
        if whole is not None:
            block = np.array(whole, dtype=fdt, order="C", copy=True)
        else:
            block = np.empty((n, len(num_cols)), dtype=fdt)
            for i, c in enumerate(num_cols):
                block[:, i] = c
        bad = ~np.isfinite(block)
        if bad.any():
            inf = np.isinf(block)
            if inf.any() or missing == "raise":
                which = inf if inf.any() else bad
                r, i = np.argwhere(which)[0]
                what = "infinity" if inf.any() else "NaN"
                hint = "" if inf.any() else " (missing='skip' skips missing coordinates)"
                raise InputError(f"'{name}' holds {what} at row {row_offset + int(r)}, column "
                                 f"{schema.column_name(schema.numeric[int(i)])}{hint}.")
        num = torch.from_numpy(block)
    nom = None
    if nom_cols:
        codes = np.empty((n, len(nom_cols)), dtype=np.int64)
        for i, (j, c) in enumerate(zip(schema.nominal, nom_cols, strict=True)):
            codes[:, i] = coder.encode(j, c)
        if missing == "raise" and (codes < 0).any():
            r, i = np.argwhere(codes < 0)[0]
            raise InputError(f"'{name}' holds a missing value (NaN) at row {row_offset + int(r)}, column "
                             f"{schema.column_name(schema.nominal[int(i)])} (missing='skip' skips missing "
                             "coordinates).")
        nom = torch.from_numpy(codes)
    enc = Encoded(num, nom, n)
    return enc.to(device) if device is not None else enc


# --------------------------------------------------------------------------------------- exact values


def exact_values(metric: Metric, q: Encoded, c_num: torch.Tensor | None, c_nom: torch.Tensor | None,
                 skip: bool) -> torch.Tensor:
    """Exact float64 fast-space values ``f`` of query rows against candidate rows.

    ``c_num`` is (m, K, p) or (1, K, p) (broadcast), ``c_nom`` likewise (m, K, r). Returns (m, K) float64; NaN
    for a pair with no coordinate present on both sides (``skip`` only).
    """
    qn = None if q.num is None else q.num.to(torch.float64)[:, None, :]
    cn = None if c_num is None else c_num.to(torch.float64)
    present = None
    if metric.fast == "cos":
        if skip:
            mask = ~(torch.isnan(qn) | torch.isnan(cn))
            qs = torch.where(mask, qn, 0.0)
            cs = torch.where(mask, cn, 0.0)
            present = mask.sum(-1)
        else:
            qs, cs = qn, cn
        nq = torch.linalg.vector_norm(qs, dim=-1, keepdim=True)
        nc = torch.linalg.vector_norm(cs, dim=-1, keepdim=True)
        zero = (nq == 0) | (nc == 0)
        diff = qs / torch.where(nq == 0, 1.0, nq) - cs / torch.where(nc == 0, 1.0, nc)
        f = 0.5 * (diff * diff).sum(-1)
        f = torch.where(zero.squeeze(-1), 1.0, f)
        if present is not None:
            f = torch.where(present > 0, f, math.nan)
        return f
    f = None
    if qn is not None:
        diff = qn - cn
        if metric.fast == "l1":
            terms = diff.abs()
        else:
            terms = diff * diff
        if skip:
            nan = torch.isnan(terms)
            present = (~nan).sum(-1)
            f = torch.where(nan, 0.0, terms).sum(-1)
        else:
            f = terms.sum(-1)
    if metric.nominal and q.nom is not None:
        a = q.nom[:, None, :]
        b = c_nom
        if skip:
            both = (a >= 0) & (b >= 0)
            mism = ((a != b) & both).sum(-1).to(torch.float64)
            pn = both.sum(-1)
            present = pn if present is None else present + pn
        else:
            mism = (a != b).sum(-1).to(torch.float64)
        f = mism if f is None else f + mism
    if f is None:  # pragma: no cover - guarded by validation (no usable columns)
        raise InputError("The data have no column the metric can use.")
    if present is not None:
        f = torch.where(present > 0, f, math.nan)
    return f


# ---------------------------------------------------------------------------------------- error bounds


def unit_roundoff(dtype: torch.dtype) -> float:
    """Unit roundoff u of a floating dtype (2⁻²⁴ for float32, 2⁻⁵³ for float64)."""
    return float(torch.finfo(dtype).eps) / 2.0


def bound_coefficient(metric: Metric, p: int, skip: bool, dtype: torch.dtype, unit: float | None = None) -> float:
    """κ in ``ε = κ·scale``: twice the worst-case accumulated roundoff ``(w + 10)·u`` of a length-``w`` dot
    product plus the centring, norm and final additions, in ``dtype``, plus the same for the float64 exact
    values. ``w`` is the GEMM width (3p for the masked forms).

    ``unit``: the relative rounding of the fast pass's *inputs* when its products are rounder than ``dtype``
    (TF32 on the matrix units keeps 10 mantissa bits: at most 2⁻¹⁰ per input, even truncated). Each product
    ``q_i·c_i`` is then off by at most ``2.001·unit·|q_i c_i|``, the dot product by ``2.001·unit·‖q‖‖c‖`` and the
    value ``‖q‖² + ‖c‖² − 2q·c`` by ``4.002·unit·‖q‖‖c‖ ≤ 1.0005·unit·(a_q + a_c)²``; κ adds ``2·unit`` to the
    accumulation term (a factor 2 of margin). The accumulation itself stays in ``dtype``."""
    w = (3 * p if skip else p) + 10
    kappa = 2.0 * w * (unit_roundoff(dtype) + unit_roundoff(torch.float64))
    return kappa if unit is None else kappa + 2.0 * float(unit)


def row_scales(metric: Metric, x: torch.Tensor | None, r: int) -> torch.Tensor | None:
    """Per-row magnitude ``a`` of the fast-pass inputs (centred, NaN as 0): the L2 norm for "sq", the L1 norm
    for "l1", 1 for "cos" (rows are normalised). The bound is ``κ·(a_q + a_c)²`` ("sq", plus ``r`` nominal
    columns), ``κ·(a_q + a_c)`` ("l1") or ``4κ`` ("cos")."""
    if x is None:
        return None
    x64 = torch.nan_to_num(x.to(torch.float64), nan=0.0)
    if metric.fast == "sq":
        return torch.linalg.vector_norm(x64, dim=1)
    if metric.fast == "l1":
        return x64.abs().sum(1)
    return torch.ones(x.shape[0], dtype=torch.float64, device=x.device)


def fast_error_bound(metric: Metric, kappa: float, a_q: torch.Tensor | None, a_c_max: float, r: int,
                     m: int, device: torch.device) -> torch.Tensor:
    """ε per query (float64, shape (m,)) bounding ``|f̃ − f|`` for every pair with this block."""
    if a_q is None:
        a_q = torch.zeros(m, dtype=torch.float64, device=device)
    if metric.fast == "sq":
        return kappa * ((a_q + a_c_max) ** 2 + r + 1.0)
    if metric.fast == "l1":
        return kappa * (a_q + a_c_max + 1.0)
    return torch.full((m,), 4.0 * kappa, dtype=torch.float64, device=device)


#: The relative rounding of one input of the fused kernel's dot products, by precision: TF32 keeps 10 mantissa
#: bits (2⁻¹⁰ covers truncation as well as rounding), float16 11 (2⁻¹¹, and 2⁻¹⁰ as TF32), float32 ("ieee") 24.
DOT_ROUNDOFF = {"tf32": 2.0**-10, "fp16": 2.0**-10, "ieee": 2.0**-23}


def rounding_bound(precision: str, qn: torch.Tensor, cmax: torch.Tensor | float, d: int) -> torch.Tensor:
    """The largest error of the kernel's squared distance ``‖q‖² + ‖c‖² − 2q·c`` for a query of centred norm ``qn``
    against any reference of centred norm ≤ ``cmax`` (float64):

    ``ε = 4·(u + d·2⁻²³)·‖q‖·max‖c‖ + (d + 4)·2⁻²²·(‖q‖² + max‖c‖²)`` with ``u`` the relative rounding of the dot's
    inputs (TF32 and float16 2⁻¹⁰, float32 2⁻²³), plus for float16 the absolute rounding ``a`` of scaled values
    below its normal range: each input moves by at most ``a = 2⁻²⁵/s ≤ 2⁻³⁸·max|x|`` with
    ``max|x| ≤ max(max‖q‖, max‖c‖)`` over the launch, so the dot moves by at most ``2a·√d·(‖q‖ + max‖c‖) + d·a²``.

    Examples
    --------
    >>> qn = torch.tensor([1.0, 2.0], dtype=torch.float64)
    >>> bool((rounding_bound("fp16", qn, 3.0, 8) > rounding_bound("tf32", qn, 3.0, 8)).all())
    True
    >>> float(rounding_bound("ieee", qn, 0.0, 8)[0]) == 12 * 2.0**-22
    True
    """
    u = DOT_ROUNDOFF[precision]
    cmax = torch.as_tensor(cmax, dtype=torch.float64, device=qn.device)
    eps = 4 * (u + d * 2.0**-23) * qn * cmax + (d + 4) * 2.0**-22 * (qn**2 + cmax**2)
    if precision == "fp16":
        a = 2.0**-38 * torch.maximum(qn.amax() if qn.numel() else cmax, cmax)
        eps = eps + 4 * a * math.sqrt(d) * (qn + cmax) + 2 * d * a * a
    return eps


def seed_above(kth: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """The fused kernel's per-query seed from a known exact k-th value: ``kth + 2ε`` rounded up to float32. A
    reference whose exact value is ≤ ``kth`` has a kernel value ≤ ``kth + ε``, below the seed, so it is never
    left out (``ε``: :func:`rounding_bound`).

    Examples
    --------
    >>> s = seed_above(torch.tensor([1.0], dtype=torch.float64), torch.tensor([0.25], dtype=torch.float64))
    >>> s.dtype, bool(s[0] > 1.5)
    (torch.float32, True)
    """
    up = torch.tensor(math.inf, dtype=torch.float32, device=kth.device)
    return torch.nextafter((kth + 2.0 * eps * (1.0 + 1e-6)).to(torch.float32), up)
