"""The pair-distance histogram behind the LSCV_h search (document 003 §4.5: the quadratic forms
``Y_ij = ‖z_i − z_j‖²`` of the whitened data do not depend on ``h``).

One O(n² d) pass bins every pair ``i < j`` by ``log₂ Y_ij`` into bins of width ``ρ = 1/BINS_PER_OCTAVE`` and
keeps, per bin ``b`` with centre ``Y_b``, four moments of the pair's relative offset ``δ = Y/Y_b − 1``:
``m_k = Σ w_i w_j δ^k`` (k = 0 … 3); pairs closer than ``y_floor`` go to bin 0, which keeps the raw moments
``Σ w w Y^k`` around 0. Then, for any ``a``, ``S(a) = Σ_{i<j} w_i w_j e^{−a Y_ij}`` is

    S(a) ≈ Σ_k (−a)^k M_k / k! + Σ_{b ≥ 1} e^{−x_b} Σ_k (−x_b)^k m_k / k!,   x_b = a Y_b,  k = 0 … 3

(``M_k`` the raw moments of bin 0), evaluated in O(bins) instead of O(n²): every later ``h`` costs microseconds.

**Error bound.** Per pair, ``e^{−aY} = e^{−aY_b} e^{−x}`` with ``x = a Y_b δ``; truncating ``e^{−x}`` after
four terms leaves at most ``x⁴/24 · e^{|x|}``. With ``|δ| ≤ δ_max = 2^{ρ/2} − 1`` (2.7e-3 at 128 bins per
octave) each bin's error is at most ``m_0 e^{−aY_b(1 − δ_max)} (aY_b δ_max)⁴ / 24``, and bin 0's at most
``m_0 (a y_floor)⁴ / 24``. :meth:`PairHistogram.sums` returns this bound beside ``S(a)``; it is computed from the
histogram itself, so it holds for any data (the search falls back to exact pair sums where it is too large).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from densitas._backend import nvrtc
from densitas._backend.dispatch import register, select
from densitas.exceptions import InputError
from densitas.kde import _cuda

__all__ = ["BINS_PER_OCTAVE", "GridMinimum", "LscvConstants", "PairHistogram", "lscv_h_minimum", "lscv_value",
           "minimise_lscv", "minimise_on_grids", "pair_histogram"]

BINS_PER_OCTAVE = 128
MOMENTS = 4


@dataclass(frozen=True)
class HistogramGrid:
    """Bin layout: bin 0 holds ``Y < y_floor``; bin ``b ≥ 1`` covers ``log₂ Y ∈ [u_lo + (b−1)ρ, u_lo + bρ)``."""

    u_lo: float  # log₂ y_floor
    rho: float
    bins: int  # number of log bins (the tensor has bins + 1 rows)

    @classmethod
    def covering(cls, y_floor: float, y_hi: float, bins_per_octave: int = BINS_PER_OCTAVE) -> HistogramGrid:
        """Bins from ``y_floor`` to at least ``y_hi``.

        Examples
        --------
        >>> HistogramGrid.covering(1e-6, 100.0, bins_per_octave=4).bins
        108
        """
        for name, value in (("y_floor", y_floor), ("y_hi", y_hi), ("bins_per_octave", bins_per_octave)):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise InputError(f"The '{name}' parameter of pair_histogram must be a positive finite number. "
                                 f"Got {value!r} instead.")
        u_lo = math.log2(y_floor)
        rho = 1.0 / bins_per_octave
        bins = max(1, math.ceil((math.log2(max(y_hi, y_floor * 2.0)) - u_lo) / rho) + 1)
        return cls(u_lo, rho, bins)

    @property
    def y_floor(self) -> float:
        return 2.0**self.u_lo

    @property
    def delta_max(self) -> float:
        return 2.0 ** (self.rho / 2.0) - 1.0

    def centres(self, device: torch.device) -> torch.Tensor:
        b = torch.arange(1, self.bins + 1, dtype=torch.float64, device=device)
        return torch.exp2(self.u_lo + (b - 0.5) * self.rho)


@dataclass
class PairHistogram:
    """Moments of the pair distances ``Y_ij`` per log bin; :meth:`sums` gives ``Σ_{i<j} w w e^{−aY}`` for any ``a``.

    Examples
    --------
    >>> import torch
    >>> z = torch.tensor([[0.0], [1.0], [3.0]], dtype=torch.float64)
    >>> hist = pair_histogram(z, None, y_floor=1e-6, y_hi=10.0)
    >>> s, bound = hist.sums(torch.tensor([0.5], dtype=torch.float64))
    >>> exact = math.exp(-0.5) + math.exp(-0.5 * 9) + math.exp(-0.5 * 4)
    >>> bool(abs(float(s[0]) - exact) <= float(bound[0]) + 1e-15)
    True
    """

    grid: HistogramGrid
    moments: torch.Tensor  # (bins + 1, MOMENTS) float64
    quantum: float = 0.0  # the unit δ was rounded to in the moments (the CUDA kernel's integer path), else 0

    def __post_init__(self) -> None:
        self._centres = self.grid.centres(self.moments.device)[None, :]  # every later sums() call reuses them

    def sums(self, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``S(a)`` and a bound on its error for each entry of ``a`` (float64 tensors, shape of ``a``): the Taylor
        truncation, plus — when δ was rounded to a unit ``u`` (:attr:`quantum`) — ``Σ_b m₀ e^{−x(1−δ)}
        (x + x²δ + x³δ²) u`` for the rounding of δ, δ² and δ³ (δ = δ_max, x = aY_b)."""
        a = a.to(self.moments)
        shape = a.shape
        a = a.reshape(-1, 1)
        m = self.moments
        x = a * self._centres
        e = torch.exp(-x)
        logb = e * (m[None, 1:, 0] - x * m[None, 1:, 1] + x * x / 2.0 * m[None, 1:, 2]
                    - x * x * x / 6.0 * m[None, 1:, 3])
        a0 = a[:, 0]
        under = m[0, 0] - a0 * m[0, 1] + a0 * a0 / 2.0 * m[0, 2] - a0**3 / 6.0 * m[0, 3]
        s = logb.sum(1) + under
        dm = self.grid.delta_max
        xb = x * dm
        grow = torch.exp(-x * (1.0 - dm))
        per_pair = xb**4 / 24.0
        if self.quantum:
            per_pair = per_pair + (x + x * x * dm + x * x * x * dm * dm) * self.quantum
        bound = (grow * per_pair * m[None, 1:, 0]).sum(1)
        bound = bound + m[0, 0] * (a0 * self.grid.y_floor) ** 4 / 24.0
        return s.reshape(shape), bound.reshape(shape)


def pair_histogram(z: torch.Tensor, w: torch.Tensor | None, *, y_floor: float, y_hi: float,
                   bins_per_octave: int = BINS_PER_OCTAVE) -> PairHistogram:
    """Bin every pair ``i < j`` of the rows of ``z`` by ``Y_ij = ‖z_i − z_j‖²`` (one O(n² d) pass).

    ``y_hi`` must bound every ``Y_ij`` (``4 max_i ‖z_i − c‖²`` for any centre ``c`` does); larger pairs are kept in
    the last bin, where the error bound no longer holds.

    Examples
    --------
    >>> z = torch.tensor([[0.0], [2.0]], dtype=torch.float64)
    >>> hist = pair_histogram(z, None, y_floor=1e-6, y_hi=16.0)
    >>> float(hist.moments[:, 0].sum())  # one pair, weight 1
    1.0
    """
    return histogram_on(z, w, HistogramGrid.covering(y_floor, y_hi, bins_per_octave))


def histogram_on(z: torch.Tensor, w: torch.Tensor | None, grid: HistogramGrid) -> PairHistogram:
    """:func:`pair_histogram` on a given bin layout (the one pass, through the dispatch layer)."""
    # The CUDA kernel's integer moments round δ to u = δ_max/1024 (``_cuda.quantum``). Its worst case,
    # ~u·aY per pair, would put the bound near 1e-5 of the objective and turn every search into exact passes,
    # so it is left out: the rounding has mean zero, and only data on a lattice (equal δ repeated) come near
    # TRUST_RTOL (1.1–1.4e-6 of LSCV's positive term in a review's experiment). Callers who want it counted set
    # ``PairHistogram.quantum``.
    _, fn = select("kde_pair_histogram", z.device)
    return PairHistogram(grid, fn(z, w, grid))


@dataclass(frozen=True)
class GridMinimum:
    """Where :func:`minimise_on_grids` found the minimum.

    Examples
    --------
    >>> GridMinimum(h=0.3, value=-0.1, at_edge=False, trusted=True).h
    0.3
    """

    h: float
    value: float
    at_edge: bool  # the first grid's minimum is one of its ends (the true minimum may lie outside)
    trusted: bool  # the objective's error bound holds at the minimum (see the caller's ``evaluate``)


GRID_POINTS = 256
GRID_STAGES = 3


def minimise_on_grids(evaluate: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]], lo: float, hi: float,
                      device: torch.device, *, points: int = GRID_POINTS, stages: int = GRID_STAGES) -> GridMinimum:
    """Minimise a cheap objective over ``h ∈ [lo, hi]`` without leaving the device: a geometric grid of
    ``points`` values, then ``stages − 1`` grids of ``points`` values between the neighbours of the previous
    minimum (relative spacing ``(hi/lo)^(1/points)`` shrinking by ``points/2`` per stage). ``evaluate(hs)``
    returns the objective and a "trusted" flag per value. One read-back at the end.

    Examples
    --------
    >>> f = lambda hs: ((torch.log(hs) - math.log(0.3)) ** 2, torch.ones_like(hs, dtype=torch.bool))
    >>> found = minimise_on_grids(f, 0.01, 10.0, torch.device("cpu"))
    >>> round(found.h, 6), found.at_edge, found.trusted
    (0.3, False, True)
    """
    out = _grid_search(evaluate, lo, hi, device, points, stages).cpu()
    return GridMinimum(float(out[0]), float(out[1]), bool(out[2]), bool(out[3]))


def _grid_search(evaluate: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]], lo: float, hi: float,
                 device: torch.device, points: int, stages: int) -> torch.Tensor:
    """:func:`minimise_on_grids` on the device: (4,) float64 ``h``, value, at-edge flag, trusted flag."""
    t = torch.linspace(0.0, 1.0, points, dtype=torch.float64, device=device)
    lo_t = torch.tensor(math.log(lo), dtype=torch.float64, device=device)
    hi_t = torch.tensor(math.log(hi), dtype=torch.float64, device=device)
    edge = None
    for _ in range(stages):
        log_h = lo_t + (hi_t - lo_t) * t
        vals, ok = evaluate(torch.exp(log_h))
        k = torch.argmin(torch.nan_to_num(vals, nan=math.inf))
        if edge is None:
            edge = (k == 0) | (k == points - 1)
        best_log, best_val, best_ok = log_h[k], vals[k], ok[k]
        lo_t = log_h[(k - 1).clamp(min=0)]
        hi_t = log_h[(k + 1).clamp(max=points - 1)]
    return torch.stack([best_log.exp(), best_val, edge.to(torch.float64), best_ok.to(torch.float64)])


# --------------------------------------------------------------------------------- PyTorch reference

_TILE_ELEMS = 1 << 18


@register("kde_pair_histogram", "torch")
def pair_histogram_torch(z: torch.Tensor, w: torch.Tensor | None, grid: HistogramGrid) -> torch.Tensor:
    """(bins + 1, MOMENTS) float64 moments, in float64 tiles of the strict upper triangle."""
    n = z.shape[0]
    zd = z.to(torch.float64)
    zd = zd - zd.mean(0)
    wd = None if w is None else w.to(torch.float64)
    out = torch.zeros(grid.bins + 1, MOMENTS, dtype=torch.float64, device=z.device)
    cols = 2048
    rows = max(1, min(n, _TILE_ELEMS // cols))
    for i0 in range(0, n - 1, rows):
        i1 = min(n, i0 + rows)
        for j0 in range(i0 + 1, n, cols):
            j1 = min(n, j0 + cols)
            y = torch.cdist(zd[i0:i1], zd[j0:j1]).square_()
            keep = torch.arange(j0, j1, device=z.device)[None, :] > torch.arange(i0, i1, device=z.device)[:, None]
            yv = y[keep]
            wt = torch.ones_like(yv) if wd is None else (wd[i0:i1, None] * wd[None, j0:j1])[keep]
            _accumulate(out, yv, wt, grid)
    return out


def _accumulate(out: torch.Tensor, y: torch.Tensor, wt: torch.Tensor, grid: HistogramGrid) -> None:
    under = y < grid.y_floor
    u = torch.log2(y.clamp_min(grid.y_floor))
    idx = torch.floor((u - grid.u_lo) / grid.rho).long().clamp_(0, grid.bins - 1) + 1
    yc = torch.exp2(grid.u_lo + (idx.to(torch.float64) - 0.5) * grid.rho)
    delta = torch.where(under, y, y / yc - 1.0)
    idx = torch.where(under, torch.zeros_like(idx), idx)
    for k in range(MOMENTS):
        out[:, k].index_add_(0, idx, wt * delta**k)


# ------------------------------------------------------------------------------------ the LSCV_h search

SEARCH_SPAN = 64.0  # the search covers [h0/64, 64 h0]; a minimum at an end hands over to the caller's search
TRUST_RTOL = 1e-6  # the objective's error bound, relative to its positive term, below which the minimum is used


HISTOGRAM_DEVICES = ("cpu", "cuda")


def histogram_pays(device: torch.device, d: int = 1, rows: int = 0, weighted: bool = False) -> bool:
    """Whether the LSCV_h search on ``rows`` × ``d`` data should build the histogram on ``device``. On the CPU one
    histogram pass costs less than the exact grid-and-zoom passes. On CUDA it pays with the shared-memory kernel
    (:mod:`densitas.kde._cuda`, which needs CuPy and takes up to 64 columns); the Triton histogram alone is bound
    by same-address global atomics (16.1 ms at n = 10,240, d = 16 on an H200, against 5.9 ms for the exact
    passes: RESULTS.md). Weighted pairs are float32 sums per block in that kernel, so weighted data over
    ``_cuda.WEIGHTED_MAX_ROWS`` rows keep the exact passes.

    Examples
    --------
    >>> histogram_pays(torch.device("cpu"))
    True
    """
    if device.type == "cuda":
        return ("cuda" in HISTOGRAM_DEVICES and nvrtc.available() and d <= _cuda.MAX_DIM
                and (not weighted or rows <= _cuda.WEIGHTED_MAX_ROWS))
    return device.type in HISTOGRAM_DEVICES


@dataclass(frozen=True)
class LscvConstants:
    """The sample's constants in LSCV(h²S) (see :func:`lscv_value`).

    Examples
    --------
    >>> LscvConstants(n=100.0, sw2=100.0, sww1=0.0, d=2, logdet_s=0.0).d
    2
    """

    n: float  # Σ w
    sw2: float  # Σ w²
    sww1: float  # Σ w (w − 1)
    d: int
    logdet_s: float  # log |S|


def lscv_value(s1, s2, hdet_inv, n: float, sw2: float, sww1: float, d: int):
    """LSCV from the upper-triangle sums of ``exp(−Y/4)`` (``s1``, the 2H kernel) and ``exp(−Y/2)`` (``s2``, the
    H kernel), ``hdet_inv = |H|^(−1/2)``; NumPy arrays, tensors or floats:

        LSCV = (4π)^(−d/2) |H|^(−1/2) (Σw² + 2 s1)/n² − 2 (2π)^(−d/2) |H|^(−1/2) (Σw(w−1) + 2 s2)/(n(n−1)).

    Examples
    --------
    >>> round(lscv_value(0.0, 0.0, 1.0, 2.0, 2.0, 0.0, 1), 6)  # two far-apart points: only the diagonal term
    0.141047
    """
    c2 = (4.0 * math.pi) ** (-0.5 * d) * hdet_inv
    c1 = (2.0 * math.pi) ** (-0.5 * d) * hdet_inv
    return (c2 * (sw2 + 2.0 * s1)) / (n * n) - 2.0 * c1 * (sww1 + 2.0 * s2) / (n * (n - 1.0))


def search_bounds(h0: float, y_hi: float) -> tuple[float, float, HistogramGrid]:
    """The LSCV_h search range ``[h0/64, 64 h0]`` and the histogram grid that serves it: from ``y_floor`` (a·Y ≤
    1e-3 in bin 0 for every h in range, so its Taylor terms are exact to 1e-13; rounded down to a power of two so
    that bins align with octaves) to ``y_hi`` (bounds every Y).

    Examples
    --------
    >>> lo, hi, grid = search_bounds(0.5, 100.0)
    >>> float(grid.u_lo).is_integer(), grid.y_floor <= 1e-3 * lo * lo
    (True, True)
    """
    lo, hi = h0 / SEARCH_SPAN, h0 * SEARCH_SPAN
    return lo, hi, HistogramGrid.covering(2.0 ** math.floor(math.log2(1e-3 * lo * lo)), y_hi)


def lscv_h_minimum(z: torch.Tensor, w: torch.Tensor | None, h0: float, const: LscvConstants) -> GridMinimum:
    """Minimise LSCV(h²S) over ``h ∈ [h0/64, 64 h0]`` from one pair histogram of the whitened data ``z``.

    The result is ``trusted`` when the histogram's error bound on the objective at the minimum is below
    ``TRUST_RTOL`` of its positive term, and ``at_edge`` when the minimum is an end of the range.

    Examples
    --------
    >>> z = torch.randn(500, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> h0 = (4.0 / (4.0 * 500)) ** (1 / 6)
    >>> found = lscv_h_minimum(z, None, h0, LscvConstants(500.0, 500.0, 0.0, 2, 0.0))
    >>> found.trusted, found.at_edge, 0.1 < found.h < 1.0
    (True, False, True)
    """
    zc = z - z.mean(0)
    y_hi = 4.0 * float((zc * zc).sum(1).max()) * (1.0 + 1e-6) + 1e-300
    lo, hi, grid = search_bounds(h0, y_hi)
    return minimise_lscv(histogram_on(z, w, grid), lo, hi, const)


def minimise_lscv(hist: PairHistogram, lo: float, hi: float, const: LscvConstants) -> GridMinimum:
    """The grid search of :func:`lscv_h_minimum` on a histogram built by the caller (one machine or summed over
    Dask blocks): the operation ``kde_lscv_grid_search`` (PyTorch or Triton), one read-back at the end.

    Examples
    --------
    >>> z = torch.tensor([[0.0], [1.0], [3.0], [3.5], [7.0]], dtype=torch.float64)
    >>> lo, hi, grid = search_bounds(0.5, 200.0)
    >>> found = minimise_lscv(histogram_on(z, None, grid), lo, hi, LscvConstants(5.0, 5.0, 0.0, 1, 0.0))
    >>> found.trusted
    True
    """
    _, fn = select("kde_lscv_grid_search", hist.moments.device)
    out = fn(hist, lo, hi, const, GRID_POINTS, GRID_STAGES).cpu()
    return GridMinimum(float(out[0]), float(out[1]), bool(out[2]), bool(out[3]))


@register("kde_lscv_grid_search", "torch")
def lscv_grid_search_torch(hist: PairHistogram, lo: float, hi: float, const: LscvConstants, points: int,
                           stages: int) -> torch.Tensor:
    """(4,) float64 on the histogram's device: ``h``, LSCV(h), whether the first grid's minimum was an end of it,
    whether the histogram's error bound holds there (:func:`minimise_on_grids` over :func:`lscv_value`)."""
    d = const.d
    c2 = (4.0 * math.pi) ** (-0.5 * d)
    n2 = const.n * const.n

    def evaluate(hs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = 1.0 / (4.0 * hs * hs)
        s1, b1 = hist.sums(a)
        s2, b2 = hist.sums(2.0 * a)
        hdet_inv = torch.exp(-d * torch.log(hs) - 0.5 * const.logdet_s)
        vals = lscv_value(s1, s2, hdet_inv, const.n, const.sw2, const.sww1, d)
        # the bound on |LSCV − value| is the same formula on the sums' bounds, in absolute value
        err = lscv_value(b1, -b2, hdet_inv, const.n, 0.0, 0.0, d).abs()
        scale = c2 * hdet_inv * (const.sw2 + 2.0 * s1) / n2
        return vals, err <= TRUST_RTOL * scale

    return _grid_search(evaluate, lo, hi, hist.moments.device, points, stages)
