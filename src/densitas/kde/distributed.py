"""Bandwidth selection on Dask: :func:`bandwidth_dask`, the selectors of :func:`densitas.kde.bandwidth` on a
Dask array, DataFrame or Series whose chunks or partitions stay on the workers.

The selectors see the data only through a few reductions, each computed by tasks on the blocks (on the worker's
device: CUDA when it has one, else the CPU) and added on the client:

* **moments** — ``Σw``, ``Σw²``, ``Σw x``, then ``Σ w (x − x̄)(x − x̄)ᵀ`` (a second pass, as the single-machine
  covariance centres first), the range of the rows of positive weight, the checks of the input (finite values,
  weights ≥ 0, naming the global row);
* **linear binning** (binned engine) — every block binned onto the same grid by the single-machine
  ``linear_bin``, the grid weights summed;
* **pair sums** (exact engine) — a sum over pairs ``Σ_{i<j}`` (Gaussian sums of LSCV, their gradient moments,
  the LSCV_h pair-distance histogram) or over all ordered pairs (the plug-in's Hermite sums) of the whole data
  from the single-machine sums of every block ``A`` and of every pair of blocks ``A ∪ B``:
  ``T(all) = Σ_{a<b} T(A ∪ B) − (p − 2) Σ_a T(A)`` for ``p ≥ 2`` blocks (each cross pair is counted once in
  ``T(A ∪ B)``; the within-block pairs ``p − 1`` times), so every pair is visited by the existing kernels and
  nothing of size n² is formed; work ≈ 2× the single-machine triangle, spread over ``p(p + 1)/2`` tasks;
* **quantiles** (the 1-D rules' IQR) — exact weighted order statistics by a bisection over the ordered float64
  bit patterns, 1023 pivots per round (≤ 7 rounds), one weighted count per block and round.

The selectors themselves are **not** rewritten: the functions and classes of :mod:`densitas.kde.selectors` are
re-bound to a namespace in which the sample (:class:`DaskSample`), its rows (:class:`DaskRows`) and the heavy
operations above (``gauss_sums``, ``gauss_grad_sums``, ``hermite_sum``, ``linear_bin``, the pair histogram,
``_whiten``, ``_weighted_quantile``) are the distributed ones, so the search steps, grids, stopping rules and
error messages are those of the single-machine path and the bandwidths agree with it to rounding (1e-6 relative
or better). Two methods are written here because they touch the rows directly: the exact plug-in functional's
set-up (a sort on one machine) and the LSCV(H) value and gradient (a triangular solve of the rows).
"""

from __future__ import annotations

import dataclasses
import math
import types
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from densitas._backend.arrays import check_choice
from densitas._backend.device import DeviceLike, resolve_device
from densitas._dask import RowBlocks, block_tensor, compute, is_dask, row_blocks
from densitas.exceptions import InputError

__all__ = ["DaskRows", "DaskSample", "bandwidth_dask"]

#: Pivots per round of the quantile bisection (each round narrows the bracket 1024-fold).
QUANTILE_PIVOTS = 1023


# --------------------------------------------------------------------------------------------- blocks


@dataclass(frozen=True)
class _Ops:
    """Per-block transforms applied in the task, in order, to the (rows × d) block: divide by the powers of two
    ``scale`` (the selectors' :class:`~densitas.kde.selectors.Scaling`), subtract ``shift``, solve ``L z = x`` for
    each lower-triangular ``L`` of ``solve``, then keep column ``column`` (all when None)."""

    scale: np.ndarray | None = None
    column: int | None = None
    shift: np.ndarray | None = None
    solve: tuple[np.ndarray, ...] = ()


def _rows_of(xb: Any, wb: Any, one_d: bool, ops: _Ops, device: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A block's float64 rows (rows of weight 0 dropped, as :func:`densitas.kde.selectors.prepare` does), its
    weights, on the worker's device, transformed by ``ops``."""
    dev = resolve_device(device)
    x = block_tensor(xb, torch.float64, dev)
    x = x.reshape(-1, 1) if x.ndim == 1 else x
    w = None if wb is None else block_tensor(wb, torch.float64, dev).reshape(-1)
    if w is not None:
        keep = w > 0
        if not bool(keep.all()):
            x, w = x[keep], w[keep]
    if ops.scale is not None:
        x = x / torch.from_numpy(ops.scale).to(x)
    if ops.shift is not None:
        x = x - torch.from_numpy(ops.shift).to(x)
    for L in ops.solve:
        x = torch.linalg.solve_triangular(torch.from_numpy(L).to(x), x.T, upper=False).T
    if ops.column is not None:
        x = x[:, ops.column:ops.column + 1]
    if one_d:
        x = x[:, 0]
    return x.contiguous(), w


def _check_block(xb: Any, wb: Any, offset: int, one_d: bool) -> dict[str, Any]:
    """Pass 1 on one block: the input checks (first bad row), ``Σw``, ``Σw²``, the range of the rows of positive
    weight, the first row."""
    x = block_tensor(xb, torch.float64)
    x = x.reshape(-1, 1) if x.ndim == 1 else x
    n = x.shape[0]
    out: dict[str, Any] = {"rows": n, "bad": None, "bad_w": None}
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        row = int(bad.any(1).nonzero()[0, 0])
        col = int(bad[row].nonzero()[0, 0])
        out["bad"] = (offset + row, col, float(x[row, col]))
        return out
    w = None if wb is None else block_tensor(wb, torch.float64).reshape(-1)
    if w is not None:
        if w.shape[0] != n:
            out["bad_w"] = ("length", offset, w.shape[0], n)
            return out
        badw = ~torch.isfinite(w) | (w < 0)
        if bool(badw.any()):
            i = int(badw.nonzero()[0, 0])
            out["bad_w"] = ("value", offset + i, float(w[i]))
            return out
        keep = w > 0
        x, w = x[keep], w[keep]
    out["sw"] = float(x.shape[0]) if w is None else float(w.sum())
    out["sw2"] = float(x.shape[0]) if w is None else float((w * w).sum())
    out["min"] = x.amin(0).numpy() if x.shape[0] else None
    out["max"] = x.amax(0).numpy() if x.shape[0] else None
    out["first"] = x[0].numpy() if x.shape[0] else None
    return out


def _sum_block(xb: Any, wb: Any, one_d: bool, ops: _Ops, device: Any) -> np.ndarray:
    """Pass 2 on one block: ``Σ w x`` (of the scaled rows)."""
    x, w = _rows_of(xb, wb, one_d, ops, device)
    x = x[:, None] if x.ndim == 1 else x
    return (x.sum(0) if w is None else (w[:, None] * x).sum(0)).cpu().numpy()


def _scatter_block(xb: Any, wb: Any, one_d: bool, ops: _Ops, device: Any, mean: np.ndarray) -> np.ndarray:
    """Pass 3 on one block: ``Σ w (x − x̄)(x − x̄)ᵀ`` (of the scaled rows)."""
    x, w = _rows_of(xb, wb, one_d, ops, device)
    xc = (x[:, None] if x.ndim == 1 else x) - torch.from_numpy(mean).to(x)
    wx = xc if w is None else xc * w[:, None]
    return (wx.T @ xc).cpu().numpy()


def _bin_block(xb: Any, wb: Any, one_d: bool, ops: _Ops, device: Any, m: int, lo: float, hi: float) -> np.ndarray:
    from densitas.kde import binned

    x, w = _rows_of(xb, wb, one_d, ops, device)
    if x.shape[0] == 0:
        return np.zeros(m)
    return binned.linear_bin(x, w, m, lo, hi).cpu().numpy()


def _count_block(xb: Any, wb: Any, one_d: bool, ops: _Ops, pivots: np.ndarray) -> np.ndarray:
    """Weighted counts ``Σ w [x ≤ p]`` of one block for every pivot (on the CPU: a sort and a search)."""
    x, w = _rows_of(xb, wb, one_d, ops, "cpu")
    order = torch.argsort(x)
    cw = torch.cumsum(torch.ones_like(x) if w is None else w[order], 0)
    pos = torch.searchsorted(x[order], torch.from_numpy(pivots), right=True)
    return torch.where(pos > 0, cw[(pos - 1).clamp(min=0)], 0.0).numpy() if x.shape[0] else np.zeros(len(pivots))


# ------------------------------------------------------------------------------ pair sums over blocks


def _pair_value(kind: str, x: torch.Tensor, w: torch.Tensor | None, args: tuple) -> Any:
    """The single-machine pair sum ``kind`` of the rows ``x`` (one block or the union of two)."""
    from densitas.kde import pairhist, pairsum

    if kind == "gauss":
        a, chain = args
        return pairsum.gauss_sums(x, w, torch.from_numpy(a), chain=chain).cpu().numpy()
    if kind == "grad":
        S, A = pairsum.gauss_grad_sums(x, w)
        return np.concatenate([S.cpu().numpy().reshape(-1), A.cpu().numpy().reshape(-1)])
    if kind == "hermite":
        g, r = args
        order = torch.argsort(x)
        return np.array([pairsum.hermite_sum(x[order].contiguous(), None if w is None else w[order].contiguous(),
                                             g, r)])
    if kind == "histogram":
        (grid,) = args
        return pairhist.histogram_on(x, w, grid).moments.cpu().numpy()
    if kind == "ties":  # Σ_{i<j, equal rows} w_i w_j over each subset of the columns
        (subsets,) = args
        x2 = x.reshape(x.shape[0], -1)
        wt = torch.ones(x2.shape[0], dtype=torch.float64, device=x.device) if w is None else w
        out = []
        for cols in subsets:
            _, inverse = torch.unique(x2[:, cols], dim=0, return_inverse=True)
            total = torch.zeros(int(inverse.max()) + 1, dtype=torch.float64, device=x.device)
            squares = torch.zeros_like(total).index_add_(0, inverse, wt * wt)
            total.index_add_(0, inverse, wt)
            out.append(float(((total * total - squares) / 2.0).sum()))
        return np.array(out)
    raise ValueError(kind)  # pragma: no cover - internal


def _pair_block(kind: str, args: tuple, ops: _Ops, one_d: bool, device: Any, xa: Any, wa: Any, xb: Any = None,
                wb: Any = None) -> np.ndarray:
    """One task of the pair sums: block ``A`` alone, or the union ``A ∪ B``."""
    x, w = _rows_of(xa, wa, one_d, ops, device)
    if xb is not None:
        x2, w2 = _rows_of(xb, wb, one_d, ops, device)
        x = torch.cat([x, x2])
        w = None if w is None else torch.cat([w, w2])
    if x.shape[0] == 0:
        return None
    return np.asarray(_pair_value(kind, x, w, args), dtype=np.float64)


def _combine_pairs(diagonal: list[Any], unions: list[Any], p: int) -> np.ndarray:
    """``Σ_{a<b} T(A ∪ B) − (p − 2) Σ_a T(A)`` (``T(A)`` alone when ``p = 1``); empty blocks give None."""
    diag = [d for d in diagonal if d is not None]
    if p == 1:
        return diag[0]
    total = np.sum([u for u in unions if u is not None], axis=0) - (p - 2) * np.sum(diag, axis=0)
    return total


# ----------------------------------------------------------------------------------------- the rows


class DaskRows:
    """The rows of a Dask sample, transformed lazily (a column, a shift, triangular solves), as the selectors'
    code sees ``s.x`` or the whitened ``z``: ``[:, j]``, ``- shift``, ``.min()``, ``.max()``, ``.device`` and the
    distributed heavy operations below.

    Examples
    --------
    >>> import dask.array as da, numpy as np
    >>> s = DaskSample.prepare(da.from_array(np.array([3.0, 1.0, 2.0, 5.0]), chunks=2), device="cpu")
    >>> float(s.x.min()), float((s.x - 1.0).max())
    (1.0, 4.0)
    """

    def __init__(self, sample: DaskSample, ops: _Ops, one_d: bool, lo: np.ndarray, hi: np.ndarray):
        self.sample = sample
        self.ops = ops
        self.one_d = one_d
        self._lo, self._hi = lo, hi  # per-column range, known for monotone transforms (else None)

    @property
    def device(self) -> torch.device:
        return self.sample.device

    @property
    def shape(self) -> tuple[int, ...]:
        n = int(self.sample.n_rows)
        return (n,) if self.one_d else (n, self.sample.d)

    def __getitem__(self, key: Any) -> DaskRows:
        if not (isinstance(key, tuple) and len(key) == 2 and key[0] == slice(None) and isinstance(key[1], int)):
            raise TypeError("DaskRows supports [:, j] only")  # pragma: no cover - internal
        j = key[1]
        ops = dataclasses.replace(self.ops, column=j)
        lo = None if self._lo is None else self._lo[j:j + 1]
        hi = None if self._hi is None else self._hi[j:j + 1]
        return DaskRows(self.sample, ops, True, lo, hi)

    def __sub__(self, shift: Any) -> DaskRows:
        s = np.atleast_1d(np.asarray(shift.cpu() if isinstance(shift, torch.Tensor) else shift, dtype=np.float64))
        if self.ops.solve or (self.ops.column is not None and self.sample.d != 1):
            raise TypeError("a shift after a solve, or of one column")  # pragma: no cover - internal
        new = s if self.ops.shift is None else self.ops.shift + s
        lo = None if self._lo is None else self._lo - s
        hi = None if self._hi is None else self._hi - s
        return DaskRows(self.sample, dataclasses.replace(self.ops, shift=new), self.one_d, lo, hi)

    def solved(self, L: np.ndarray) -> DaskRows:
        """The (rows × d) matrix with ``L z = x`` solved for every row (lower-triangular ``L``), 2-D as the
        single-machine whitened ``z``; its range is known for d = 1 (L > 0: a monotone map)."""
        lo = hi = None
        if L.shape == (1, 1) and self._lo is not None:
            lo, hi = self._lo / L[0, 0], self._hi / L[0, 0]
        return DaskRows(self.sample, dataclasses.replace(self.ops, solve=(*self.ops.solve, L)), False, lo, hi)

    def min(self) -> torch.Tensor:
        return torch.tensor(float(np.min(self._lo)), dtype=torch.float64)

    def max(self) -> torch.Tensor:
        return torch.tensor(float(np.max(self._hi)), dtype=torch.float64)

    # ---- the distributed operations

    def _tasks(self, fn: Any, *args: Any) -> list[Any]:
        import dask

        task = dask.delayed(fn, pure=True)
        s = self.sample
        return [task(xb, wb, self.one_d, self.ops, *args) for xb, wb in zip(s.blocks.parts, s.wparts, strict=True)]

    def linear_bin(self, m: int, lo: float, hi: float) -> torch.Tensor:
        (parts,) = compute(self._tasks(_bin_block, self.sample.request, m, lo, hi))
        return torch.from_numpy(np.sum(parts, axis=0)).to(self.device)

    def counts(self, pivots: np.ndarray) -> np.ndarray:
        (parts,) = compute(self._tasks(_count_block, pivots))
        return np.sum(parts, axis=0)

    def pair_sum(self, kind: str, args: tuple) -> np.ndarray:
        import dask

        s = self.sample
        task = dask.delayed(_pair_block, pure=True)
        head = (kind, args, self.ops, self.one_d, s.request)
        blocks = list(zip(s.blocks.parts, s.wparts, strict=True))
        diagonal = [task(*head, xa, wa) for xa, wa in blocks]
        unions = [task(*head, xa, wa, xb, wb) for a, (xa, wa) in enumerate(blocks) for xb, wb in blocks[a + 1:]]
        (diag, uni) = compute(diagonal, unions)
        return _combine_pairs(list(diag), list(uni), len(blocks))


# --------------------------------------------------------------------------------------- the sample


class DaskSample:
    """The validated Dask data, duck-typing :class:`densitas.kde.selectors.Sample` for the selectors: ``n``,
    ``sum_w2``, ``d``, ``one_d``, ``names``, ``device`` (the client's), ``mean()``, ``cov()`` (computed by the
    moment passes), ``x`` (:class:`DaskRows`) and ``w`` (a marker: the weights travel with the blocks).

    Examples
    --------
    >>> import dask.array as da, numpy as np
    >>> s = DaskSample.prepare(da.from_array(np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 8.0]]), chunks=2), device="cpu")
    >>> s.n, s.mean().tolist(), s.cov()[0].tolist()
    (3.0, [2.0, 4.0], [4.0, 7.0])
    """

    def __init__(self, blocks: RowBlocks, wparts: list[Any], weighted: bool, names: list[str], device: torch.device,
                 request: DeviceLike):
        self.blocks = blocks
        self.wparts = wparts
        self.weighted = weighted
        self.names = names
        self.one_d = blocks.one_d
        self.device = device
        self.request = request  # the device request, resolved on each worker

    @property
    def d(self) -> int:
        return self.blocks.n_features

    @property
    def n(self) -> float:
        return self._n

    @property
    def sum_w2(self) -> float:
        return self._sw2

    @property
    def w(self) -> Any:
        return "weights" if self.weighted else None  # the selectors only test it for None

    @property
    def x2(self) -> torch.Tensor:
        """The first row (the constant-column message quotes it)."""
        return torch.from_numpy(self._first)[None, :]

    def mean(self) -> torch.Tensor:
        return torch.from_numpy(self._mean.copy()).to(self.device)

    def cov(self) -> torch.Tensor:
        return torch.from_numpy(self._cov.copy()).to(self.device)

    @classmethod
    def prepare(cls, x: Any, weights: Any = None, *, device: DeviceLike = "auto", name: str = "x",
                min_samples: int = 2) -> DaskSample:
        """Check the data (finite values, weights ≥ 0 summing to more than 1, at least ``min_samples`` rows) and
        compute the moments, as :func:`densitas.kde.selectors.prepare` does on one machine."""
        import dask

        blocks = row_blocks(x, name, ndim=(1, 2))
        if blocks.dtype.kind not in "biuf":
            raise InputError(f"'{name}' must hold numbers. Got dtype {blocks.dtype} instead.")
        if not blocks.one_d and blocks.n_features == 0:
            raise InputError(f"'{name}' has no columns (shape ({blocks.n_rows}, 0)).")
        if blocks.names is not None:
            names = list(blocks.names)
        elif blocks.frame and blocks.one_d and x.name is not None:  # a Series (a Dask array's .name is its key)
            names = [str(x.name)]
        else:
            names = [f"column {j}" for j in range(blocks.n_features)]
        wparts = _weight_parts(weights, blocks)
        s = cls(blocks, wparts, weights is not None, names, resolve_device(device), device)
        check = dask.delayed(_check_block, pure=True)
        (parts,) = compute([check(xb, wb, int(off), blocks.one_d) for xb, wb, off in
                            zip(blocks.parts, wparts, blocks.offsets[:-1], strict=True)])
        s._moments(parts, name, min_samples)
        # the selectors' Scaling (powers of two per column, for data near 1e±300) from the range, before any sum
        from densitas.kde.selectors import Sample, Scaling

        span = Sample(torch.from_numpy(np.stack([s._lo, s._hi])), None, names, False)
        s.factors = Scaling.of(span).factors
        f = s.factors
        ops = _Ops(scale=None if np.all(f == 1.0) else f)
        s._lo, s._hi, s._first = s._lo / f, s._hi / f, s._first / f
        pieces = list(zip(blocks.parts, wparts, strict=True))
        total = dask.delayed(_sum_block, pure=True)
        (sums,) = compute([total(xb, wb, blocks.one_d, ops, device) for xb, wb in pieces])
        s._mean = np.sum(sums, axis=0) / s._n
        scatter = dask.delayed(_scatter_block, pure=True)
        (cps,) = compute([scatter(xb, wb, blocks.one_d, ops, device, s._mean) for xb, wb in pieces])
        s._cov = np.sum(cps, axis=0) / (s._n - 1.0)
        s.x = DaskRows(s, ops, blocks.one_d, s._lo, s._hi)
        return s

    def _moments(self, parts: list[dict[str, Any]], name: str, min_samples: int) -> None:
        n = self.blocks.n_rows
        if n < min_samples:
            raise InputError(f"'{name}' must hold at least {min_samples} samples; got n_samples = {n}.")
        for p in parts:
            if p["bad"] is not None:
                row, col, val = p["bad"]
                raise InputError(f"'{name}' holds NaN or infinity: {self.names[col]!r}, row {row} is {val}. Drop or "
                                 "impute such rows first.")
        for p in parts:
            if p["bad_w"] is not None:
                if p["bad_w"][0] == "length":
                    raise InputError(f"'weights' must have one entry per row of '{name}' ({n}).")
                _, i, v = p["bad_w"]
                raise InputError(f"'weights' must be finite and ≥ 0. Got {v} at position {i}.")
        total = sum(p["sw"] for p in parts)
        if self.weighted and total == 0.0:
            raise InputError("All 'weights' are zero; at least two rows need positive weight.")
        if self.weighted and total <= 1.0:
            raise InputError("'weights' are frequency weights (their sum is the sample size) and must sum to more "
                             f"than 1. Got sum {total:g}.")
        kept = [p for p in parts if p["min"] is not None]
        self._n = float(total)
        self._sw2 = float(sum(p["sw2"] for p in parts))
        self._lo = np.min([p["min"] for p in kept], axis=0)
        self._hi = np.max([p["max"] for p in kept], axis=0)
        self._first = kept[0]["first"]
        self.n_rows = n

    def as_1d(self) -> DaskSample:
        """The first column as a 1-D sample (univariate selectors on (n, 1) data)."""
        s = object.__new__(DaskSample)
        s.__dict__.update(self.__dict__)
        s.one_d = True
        s.x = self.x[:, 0]
        s._mean, s._cov, s._first = self._mean[:1], self._cov[:1, :1], self._first[:1]
        s.factors = self.factors[:1]
        return s


def _weight_parts(weights: Any, blocks: RowBlocks) -> list[Any]:
    """The weights cut into the blocks of the rows (a Dask array rechunked to them, or slices of an array)."""
    import dask

    if weights is None:
        return [None] * len(blocks.parts)
    if is_dask(weights):
        import dask.array as da

        w = weights.to_dask_array(lengths=True) if hasattr(weights, "to_dask_array") else weights
        if not isinstance(w, da.Array) or w.ndim != 1:
            raise InputError("'weights' must be 1-dimensional.")
        if w.shape[0] != blocks.n_rows:
            raise InputError(f"'weights' must have one entry per row of 'x' ({blocks.n_rows}). Got {w.shape[0]}.")
        w = w.rechunk((tuple(blocks.sizes),))
        return list(w.to_delayed().ravel())
    w = np.asarray(weights.detach().cpu() if isinstance(weights, torch.Tensor) else weights, dtype=np.float64)
    if w.ndim != 1 or w.shape[0] != blocks.n_rows:
        raise InputError(f"'weights' must have one entry per row of 'x' ({blocks.n_rows}). Got shape {w.shape}.")
    return [dask.delayed(w[lo:hi], pure=True) for lo, hi in zip(blocks.offsets[:-1], blocks.offsets[1:], strict=True)]


# ------------------------------------------------------------------------- the distributed operations


def _gauss_sums(z: DaskRows, w: Any, a: Any, *, chain: bool = False) -> torch.Tensor:
    a_np = np.asarray(torch.as_tensor(a, dtype=torch.float64).reshape(-1).cpu())
    return torch.from_numpy(z.pair_sum("gauss", (a_np, bool(chain))).reshape(-1, 2)).to(z.device)


def _gauss_grad_sums(z: DaskRows, w: Any) -> tuple[torch.Tensor, torch.Tensor]:
    flat = torch.from_numpy(z.pair_sum("grad", ())).to(z.device)
    d = z.sample.d
    return flat[:2], flat[2:].reshape(2, d, d)


def _hermite_sum(xs: DaskRows, w: Any, g: float, r: int, *, prune: bool = True) -> float:
    return float(xs.pair_sum("hermite", (float(g), int(r)))[0])


def _linear_bin(x: DaskRows, w: Any, m: int, lo: float, hi: float) -> torch.Tensor:
    return x.linear_bin(int(m), float(lo), float(hi))


def _whiten(s: DaskSample, chol: torch.Tensor) -> DaskRows:
    return (s.x - s.mean()).solved(chol.cpu().numpy())


def _ordered(v: float) -> int:
    """The float64 ``v`` as an integer of the same order (−0.0 and 0.0 both 0)."""
    u = int(np.array([v], dtype=np.float64).view(np.int64)[0])
    return u if u >= 0 else -(1 << 63) - u


def _from_ordered(key: int) -> float:
    u = key if key >= 0 else -(1 << 63) - key
    return float(np.array([u], dtype=np.int64).view(np.float64)[0])


def _order_statistics(x: DaskRows, ranks: list[float]) -> dict[float, float]:
    """The values at 0-based ``ranks`` of the data with each row repeated by its weight: for each rank ``r`` the
    smallest value ``v`` with ``Σ w [x ≤ v] > r`` (as ``selectors._weighted_quantile`` reads it)."""
    lo0, hi0 = _ordered(float(x.min())) - 1, _ordered(float(x.max()))
    brackets = {r: [lo0, hi0] for r in ranks}  # Σw[x ≤ lo] ≤ r < Σw[x ≤ hi]
    while any(hi - lo > 1 for lo, hi in brackets.values()):
        keys: set[int] = set()
        for lo, hi in brackets.values():
            if hi - lo > 1:
                step = max((hi - lo) // (QUANTILE_PIVOTS + 1), 1)
                keys.update(range(lo + step, hi, step))
        pivots = sorted(keys)
        counts = x.counts(np.array([_from_ordered(k) for k in pivots], dtype=np.float64))
        for r, br in brackets.items():
            for key, c in zip(pivots, counts, strict=True):
                if br[0] < key < br[1]:
                    if c > r:
                        br[1] = key
                        break
                    br[0] = key
    return {r: _from_ordered(hi) for r, (_lo, hi) in brackets.items()}


def _weighted_quantile(x: DaskRows, w: Any, q: float) -> float:
    n = x.sample.n
    pos = q * (n - 1.0)
    lo = math.floor(pos)
    got = _order_statistics(x, [lo, lo + 1] if pos > lo else [lo])
    a = got[lo]
    return a + (pos - lo) * (got[lo + 1] - a) if pos > lo else a


def _tied_columns(s: DaskSample) -> list[str]:
    """``selectors._tied_columns`` with the tied pairs (per column, and of whole rows when d > 1) summed over
    blocks and pairs of blocks; the coefficient is :class:`~densitas.kde.selectors.TieReport`'s."""
    from densitas.kde.selectors import TieReport

    d = s.d
    subsets = [[j] for j in range(d)] + ([list(range(d))] if d > 1 else [])
    tied = s.x.pair_sum("ties", (subsets,))

    def degenerate(t: float, dims: int) -> bool:
        n, sw2 = s.n, s.sum_w2
        coef = (sw2 + 2.0 * t) / (n * n) - 2.0 ** (dims / 2 + 1) * (sw2 - n + 2.0 * t) / (n * (n - 1.0))
        return TieReport(t, coef).degenerate

    cols = [s.names[j] for j in range(d) if degenerate(float(tied[j]), 1)]
    if not cols and d > 1 and degenerate(float(tied[d]), d):
        cols = list(s.names)
    return cols


def _lscv_h_minimum(z: DaskRows, w: Any, h0: float, const: Any) -> Any:
    """:func:`densitas.kde.pairhist.lscv_h_minimum` with the pair histogram summed over blocks."""
    from densitas.kde import pairhist

    zmean = np.zeros(z.sample.d)  # the whitened rows have mean 0 up to rounding; their spread bounds every Y_ij
    y_hi = 4.0 * _max_sq_norm(z, zmean) * (1.0 + 1e-6) + 1e-300
    lo, hi, grid = pairhist.search_bounds(h0, y_hi)
    moments = torch.from_numpy(z.pair_sum("histogram", (grid,)).reshape(grid.bins + 1, -1)).to(z.device)
    return pairhist.minimise_lscv(pairhist.PairHistogram(grid, moments), lo, hi, const)


def _max_block_norm(xb: Any, wb: Any, one_d: bool, ops: _Ops, device: Any, centre: np.ndarray) -> float:
    x, _w = _rows_of(xb, wb, one_d, ops, device)
    if x.shape[0] == 0:
        return 0.0
    xc = (x[:, None] if x.ndim == 1 else x) - torch.from_numpy(centre).to(x)
    return float((xc * xc).sum(1).max())


def _max_sq_norm(z: DaskRows, centre: np.ndarray) -> float:
    (parts,) = compute(z._tasks(_max_block_norm, z.sample.request, centre))
    return float(max(parts))


# ------------------------------------------------------------------- the selectors, re-bound to Dask


def _namespace() -> dict[str, Any]:
    """The globals of :mod:`densitas.kde.selectors` with the distributed sample operations in place, and the
    selectors' functions and classes re-bound to them."""
    from densitas.kde import binned, pairhist, selectors

    g = dict(vars(selectors))
    g["_binned"] = types.SimpleNamespace(**{**vars(binned), "linear_bin": _linear_bin})
    g["_pairhist"] = types.SimpleNamespace(**{**vars(pairhist), "lscv_h_minimum": _lscv_h_minimum})

    def rebind(fn: Any) -> Any:
        return types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)

    for name, obj in vars(selectors).items():
        if isinstance(obj, types.FunctionType) and obj.__module__ == selectors.__name__:
            g[name] = rebind(obj)
    g.update(gauss_sums=_gauss_sums, gauss_grad_sums=_gauss_grad_sums, hermite_sum=_hermite_sum, _whiten=_whiten,
             _weighted_quantile=_weighted_quantile, _tied_columns=_tied_columns)

    def rebind_class(cls: type, own: dict[str, Any]) -> type:
        body = {k: rebind(v) for k, v in vars(cls).items() if isinstance(v, types.FunctionType)}
        body.update(own)
        return type(f"Dask{cls.__name__.lstrip('_')}", (cls,), body)

    def functional_init(self: Any, s: DaskSample, engine: str, g_min_hint: float) -> None:
        self.s = s
        self.engine = engine
        if engine == "exact":  # centred (the Triton path works in float32); each task sorts its rows
            self.xs = s.x - s.mean()[0]
            self.w = s.w
        else:
            self.lo = float(s.x.min())
            self.hi = float(s.x.max())
            self.xc = s.x
            self._bin(g_min_hint)

    g["_Functional"] = rebind_class(selectors._Functional, {"__init__": functional_init})
    g["_LscvScalar"] = rebind_class(selectors._LscvScalar, {})
    g["_LscvMatrix"] = rebind_class(selectors._LscvMatrix, {"_solve": _matrix_solve})
    return g


def _matrix_solve(self: Any, m: np.ndarray) -> Any:
    """``_LscvMatrix._solve`` with ``u = M⁻¹ z`` solved in the tasks (rows stay where they are)."""
    return self.sc.z.solved(m)


def bandwidth_dask(x: Any, method: str = "plugin", *, engine: str = "auto", weights: Any = None,
                   device: DeviceLike = "auto", **options: Any) -> float | np.ndarray:
    """:func:`densitas.kde.bandwidth` of a Dask array (1-D or 2-D), DataFrame or Series (weights: a Dask or
    in-memory 1-D array), computed on the cluster (see the module). Same methods, engines, options, results
    (to rounding) and errors as the single-machine call; ``device`` is resolved on each worker.

    Examples
    --------
    >>> import dask.array as da, numpy as np
    >>> from densitas.kde import bandwidth
    >>> x = np.random.default_rng(0).normal(size=2000)
    >>> h = bandwidth_dask(da.from_array(x, chunks=500), "plugin", device="cpu")
    >>> bool(abs(h - bandwidth(x, "plugin", device="cpu")) < 1e-9 * h)
    True
    """
    from densitas.kde.selectors import ENGINES, METHODS, SELECTORS, Scaling

    method = check_choice("method", method, METHODS, "bandwidth")
    engine = check_choice("engine", engine, ENGINES, "bandwidth")
    selector = SELECTORS[method]
    opts = selector.validate(options, engine)
    s = DaskSample.prepare(x, weights, device=device)
    selector.check_dimensions(s.d, engine, SELECTORS.multivariate)
    fn = _namespace()[selector.fn.__name__]

    def scaled(smp: DaskSample) -> float | np.ndarray:
        """As ``selectors._scaled``: the tasks divide the rows by the factors; the bandwidth is scaled back."""
        return Scaling(smp.factors).undo(smp, fn(smp, engine, opts))

    if selector.univariate and not s.one_d:
        return np.array([[scaled(s.as_1d()) ** 2]])
    return scaled(s)
