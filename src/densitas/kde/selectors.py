"""Bandwidth selectors (documents 000 and 003, plus ISJ): :func:`bandwidth`, :func:`lscv_objective`,
:func:`plugin_functional`.

Conventions: for 1-D input (shape ``(n,)``) a bandwidth is a float ``h``, the standard deviation of the Gaussian
kernel in data units; for d-D input (shape ``(n, d)``) it is a ``(d, d)`` ndarray ``H``, the kernel covariance.
Weights are frequency weights: integer weights are exactly equivalent to repeated rows, and their sum is the
sample size ``n`` in every formula.
"""

from __future__ import annotations

import logging
import math
import textwrap
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from densitas._backend.arrays import as_tensor, check_choice
from densitas._backend.device import DeviceLike
from densitas._backend.policy import device_policy, quantile, thread_policy
from densitas._dask import is_dask
from densitas.exceptions import DensitasError, InputError
from densitas.kde import binned as _binned
from densitas.kde import pairhist as _pairhist
from densitas.kde.kernels import SQRT_2PI, gaussian_derivative_at_zero, hermite_even_coefficients
from densitas.kde.pairsum import gauss_grad_sums, gauss_sums, hermite_cutoff, hermite_sum
from densitas.kde.registry import Option, Selector, SelectorRegistry, choice, int_at_least

__all__ = ["ENGINES", "METHODS", "SELECTORS", "DegenerateBandwidthWarning", "bandwidth", "lscv_objective",
           "plugin_functional"]

log = logging.getLogger("densitas")

ENGINES = ("auto", "exact", "binned")
LSCV_GRID = 32  # coarse grid over [h0/4, 4 h0] (the papers used 100-200 points; the zoom below refines)
LSCV_ZOOM = 16  # points per refinement pass
LSCV_RTOL = 1e-4
# Bounds of LSCV(H)'s search in whitened units: every eigenvalue of H̃ within [1e-16, 1e16], every bandwidth
# within 1e-8 to 1e8 times the data's spread along it. Only tied data reach the floor (LSCV then falls without
# bound; a DegenerateBandwidthWarning says so; below it M⁻¹ would overflow), and only a line search's trial step
# the ceiling (where exp(Θ) would overflow)
LOG_EIG_MIN, LOG_EIG_MAX = 2.0 * math.log(1e-8), 2.0 * math.log(1e8)
# ... and no two of its eigenvalues more than 1e12 apart (each within this of their mean in log): LSCV(H) of few
# rows in many dimensions runs off to such H (16-D, 1,000 rows: the unbounded search took H̃ past 1e17, which float64
# cannot keep positive definite; H in the data's units also carries S's own condition number)
LOG_SPREAD = 0.5 * math.log(1e12)


@dataclass
class _Spectrum:
    """Θ's eigenvalues ``lam`` and eigenvectors ``u``; the eigenvalues H̃ = exp(Θ) is made of (``used``: within
    the bounds), which are free (within them), and which are held at a bound that follows the eigenvalues' mean."""

    lam: np.ndarray
    used: np.ndarray
    u: np.ndarray
    free: np.ndarray
    with_mean: np.ndarray


# ------------------------------------------------------------------------------------------ input


@dataclass
class Sample:
    """Validated data: float64 ``x`` ((n,) or (n, d)) with optional frequency weights on one device."""

    x: torch.Tensor
    w: torch.Tensor | None
    names: list[str]
    one_d: bool

    @property
    def device(self) -> torch.device:
        return self.x.device

    @property
    def d(self) -> int:
        return 1 if self.one_d else self.x.shape[1]

    @property
    def x2(self) -> torch.Tensor:
        return self.x[:, None] if self.one_d else self.x

    @property
    def n(self) -> float:
        return float(self.x.shape[0]) if self.w is None else float(self.w.sum())

    @property
    def sum_w2(self) -> float:
        return float(self.x.shape[0]) if self.w is None else float((self.w * self.w).sum())

    def mean(self) -> torch.Tensor:
        x2 = self.x2
        if self.w is None:
            return x2.mean(0)
        return (self.w[:, None] * x2).sum(0) / self.w.sum()

    def cov(self) -> torch.Tensor:
        """Sample covariance with ddof = 1 (frequency weights: divide by Σw − 1)."""
        if self.w is None and self.one_d:  # one streaming pass, no centred copy of a long column
            return torch.var(self.x, correction=1).reshape(1, 1)
        xc = self.x2 - self.mean()
        wx = xc if self.w is None else xc * self.w[:, None]
        return (wx.T @ xc) / (self.n - 1.0)


def _column_names(x: Any, d: int) -> list[str]:
    cols = getattr(x, "columns", None)
    if cols is not None and len(cols) == d:
        return [str(c) for c in cols]
    name = getattr(x, "name", None)
    if d == 1 and name is not None:
        return [str(name)]
    return [f"column {j}" for j in range(d)]


def prepare(x: Any, weights: Any = None, *, device: DeviceLike = "auto", name: str = "x",
            min_samples: int = 2) -> Sample:
    """Validate and convert ``x`` (and ``weights``) for the selectors and the estimator."""
    t, _ = as_tensor(x, name, device=device, ndim=(1, 2))
    if t.ndim == 2 and t.shape[1] == 0:
        raise InputError(f"'{name}' has no columns (shape {tuple(t.shape)}).")
    names = _column_names(x, 1 if t.ndim == 1 else t.shape[1])
    t = t.to(torch.float64)
    n = t.shape[0]
    if n < min_samples:
        raise InputError(f"'{name}' must hold at least {min_samples} samples; got n_samples = {n}.")
    bad = ~torch.isfinite(t)
    if bool(bad.any()):
        row = int(bad.reshape(n, -1).any(1).nonzero()[0, 0])
        col = 0 if t.ndim == 1 else int(bad[row].nonzero()[0, 0])
        val = float(t.reshape(n, -1)[row, col])
        raise InputError(f"'{name}' holds NaN or infinity: {names[col]!r}, row {row} is {val}. Drop or impute such "
                         "rows first.")
    w = None
    if weights is not None:
        w, _ = as_tensor(weights, "weights", like=t, ndim=(1,))
        w = w.to(torch.float64)
        if w.shape[0] != n:
            raise InputError(f"'weights' must have one entry per row of '{name}' ({n}). Got {w.shape[0]}.")
        badw = ~torch.isfinite(w) | (w < 0)
        if bool(badw.any()):
            i = int(badw.nonzero()[0, 0])
            raise InputError(f"'weights' must be finite and ≥ 0. Got {float(w[i])} at position {i}.")
        total = float(w.sum())
        if total == 0.0:
            raise InputError("All 'weights' are zero; at least two rows need positive weight.")
        if total <= 1.0:
            raise InputError("'weights' are frequency weights (their sum is the sample size) and must sum to more "
                             f"than 1. Got sum {total:g}.")
        keep = w > 0
        if not bool(keep.all()):  # rows of weight 0 have no influence; dropping them keeps grid ranges exact
            t, w = t[keep], w[keep]
    return Sample(t, w, names, t.ndim == 1)


class SingularCovarianceError(InputError):
    """The sample covariance is singular (collinear columns, or fewer rows than columns)."""


class DegenerateBandwidthWarning(RuntimeWarning):
    """The selected bandwidth is an end of the search range, not a minimum of the criterion: LSCV is unbounded
    below as H → 0 when the data hold enough tied values (discrete columns, duplicated rows). The message names
    the columns and what to use instead.

    Examples
    --------
    >>> import warnings
    >>> x = np.repeat(np.arange(5.0), 20)  # five distinct values, each twenty times
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _ = bandwidth(x, "lscv_h", device="cpu")
    >>> any(issubclass(w.category, DegenerateBandwidthWarning) for w in caught)
    True
    """


# ------------------------------------------------------------------------------------------ scaling

SAFE_EXPONENT = 32  # data whose spread lies within 2^±32 are used as they are (sd⁹ of the plug-in stays normal)


@dataclass(frozen=True)
class Scaling:
    """Per-column powers of two the data are divided by before selection (exact in binary floating point), so
    that data near the ends of the float64 range (1e±300) select the same bandwidth, scaled, as data near 1.

    Examples
    --------
    >>> s = prepare(np.array([0.0, 1e300, 3e300]), device="cpu")
    >>> float(Scaling.of(s).factors[0]) == 2.0 ** 999  # the span 3e300 = 0.56 · 2^999
    True
    """

    factors: np.ndarray  # (d,), powers of two; all ones when no column needs scaling

    @property
    def identity(self) -> bool:
        return bool(np.all(self.factors == 1.0))

    @classmethod
    def of(cls, s: Sample) -> Scaling:
        """Factors from each column's span (its maximum − minimum; the largest magnitude if that overflows)."""
        lo, hi = torch.aminmax(s.x2, dim=0)
        lo_n, hi_n = lo.cpu().numpy(), hi.cpu().numpy()
        with np.errstate(over="ignore"):
            span = hi_n - lo_n
        span = np.where(np.isfinite(span), span, np.maximum(np.abs(lo_n), np.abs(hi_n)))
        _, exponent = np.frexp(np.where(span > 0, span, 1.0))  # span = m · 2^e, m in [0.5, 1)
        outside = np.abs(exponent) > SAFE_EXPONENT
        return cls(np.where(outside, np.ldexp(1.0, exponent), 1.0))

    def apply(self, s: Sample) -> Sample:
        if self.identity:
            return s
        f = torch.from_numpy(self.factors).to(s.x)
        return Sample(s.x / (f[0] if s.one_d else f), s.w, s.names, s.one_d)

    def undo(self, s: Sample, h: float | np.ndarray) -> float | np.ndarray:
        """The bandwidth in the data's units: ``h·f`` (1-D) or ``D H D``, ``D = diag(f)``; refuses a matrix that
        float64 cannot hold."""
        if self.identity:
            return h
        if np.ndim(h) == 0:
            return float(h) * float(self.factors[0])
        with np.errstate(over="ignore", under="ignore"):
            out = np.asarray(h) * self.factors[:, None] * self.factors[None, :]
        diag = np.diagonal(out)
        bad = [s.names[j] for j in range(len(diag)) if not (np.isfinite(diag[j]) and diag[j] > 0)]
        if bad:
            raise InputError(f"The bandwidth matrix of column(s) {bad} is not representable in float64: its "
                             f"entries scale with the square of the data (factors {list(self.factors)}). Rescale "
                             "those columns (e.g. divide by a power of ten) and scale H back.")
        return out


# ------------------------------------------------------------------------------------------ ties


@dataclass(frozen=True)
class TieReport:
    """Whether LSCV is unbounded below as H → 0 for a sample, from its exactly tied pairs.

    As H → 0 only pairs at distance 0 keep contributing, and LSCV(H) → |H|^(−1/2) (4π)^(−d/2) · c with
    ``c = (Σw² + 2T)/n² − 2^(d/2+1) (Σw(w−1) + 2T)/(n(n−1))``, ``T = Σ_{i<j, xᵢ=xⱼ} wᵢwⱼ``. When ``c < 0`` the
    criterion has no minimum: it decreases without bound towards H = 0.

    Examples
    --------
    >>> x = torch.tensor([[0.0], [0.0], [1.0], [1.0], [2.0]])  # two tied pairs among five rows
    >>> report = TieReport.of(x, None, 5.0, 5.0)
    >>> report.tied_pairs, report.degenerate
    (2.0, True)
    """

    tied_pairs: float
    coefficient: float

    @property
    def degenerate(self) -> bool:
        return self.coefficient < 0.0

    @classmethod
    def of(cls, x: torch.Tensor, w: torch.Tensor | None, n: float, sum_w2: float) -> TieReport:
        """``x``: (n, d) rows (a column is (n, 1))."""
        d = x.shape[1]
        _, inverse = torch.unique(x, dim=0, return_inverse=True)
        wt = torch.ones(x.shape[0], dtype=torch.float64, device=x.device) if w is None else w
        groups = int(inverse.max()) + 1
        total = torch.zeros(groups, dtype=torch.float64, device=x.device).index_add_(0, inverse, wt)
        squares = torch.zeros(groups, dtype=torch.float64, device=x.device).index_add_(0, inverse, wt * wt)
        return cls.from_pairs(float(((total * total - squares) / 2.0).sum()), d, n, sum_w2)

    @classmethod
    def from_pairs(cls, tied: float, d: int, n: float, sum_w2: float) -> TieReport:
        """The report of ``tied`` (Σ w_i w_j over exactly tied pairs) in ``d`` dimensions."""
        coef = (sum_w2 + 2.0 * tied) / (n * n) - 2.0 ** (d / 2 + 1) * (sum_w2 - n + 2.0 * tied) / (n * (n - 1.0))
        return cls(tied, coef)


def _tied_pairs_per_column(x: torch.Tensor, w: torch.Tensor | None) -> list[float]:
    """``Σ_{i<j, x_ij = x_jj} w_i w_j`` for every column of ``x`` (n, d) at once, with one read-back: sort each
    column (as a row of ``xᵀ``, so that the sort and the scans run along contiguous memory), find where each
    element's run of equal values starts (a running maximum), and sum ``w_i`` times the weight of the earlier
    elements of its run (for unit weights: its position in the run)."""
    n, d = x.shape
    vals, order = torch.sort(x.T.contiguous(), dim=1)  # (d, n)
    pos = torch.arange(n, device=x.device).expand(d, n)
    new_run = torch.ones_like(vals, dtype=torch.bool)
    new_run[:, 1:] = vals[:, 1:] != vals[:, :-1]
    start = torch.cummax(torch.where(new_run, pos, 0), dim=1).values
    if w is None:
        return (pos - start).sum(1, dtype=torch.float64).cpu().tolist()
    wt = w[order]
    before = torch.cumsum(wt, 1) - wt  # Σ of the weights before each element
    return (wt * (before - before.gather(1, start))).sum(1).cpu().tolist()


def _tied_columns(s: Sample) -> list[str]:
    """Columns along which LSCV is unbounded below as the bandwidth goes to 0 (named in a warning), or []."""
    tied = _tied_pairs_per_column(s.x2, s.w)
    cols = [s.names[j] for j in range(s.d) if TieReport.from_pairs(tied[j], 1, s.n, s.sum_w2).degenerate]
    # Tied rows are tied in every column, so their Σ w w is at most min(tied); the coefficient falls as that sum
    # grows, so the row check (a unique over whole rows) runs only when the bound itself is degenerate.
    if not cols and s.d > 1 and TieReport.from_pairs(min(tied), s.d, s.n, s.sum_w2).degenerate \
            and TieReport.of(s.x2, s.w, s.n, s.sum_w2).degenerate:
        cols = list(s.names)  # duplicated rows, though no column alone is degenerate
    return cols


def _degenerate_lscv_message(s: Sample, cols: list[str]) -> str:
    rules = "'scott', 'silverman', 'plugin' or 'isj'" if s.one_d else "'scott' or 'silverman'"
    return (f"LSCV has no interior minimum for these data: column(s) {cols} hold many tied values (discrete or "
            "rounded data, or duplicated rows), and LSCV decreases without bound as the bandwidth along them goes "
            "to 0, so the selected bandwidth collapses there instead of smoothing. Use "
            f"method={rules}, or add jitter of the rounding unit first (integer counts: x + uniform(−0.5, 0.5)).")


def _check_scale(s: Sample, full: bool = True) -> torch.Tensor:
    """Sample covariance as a float64 CPU tensor (d × d: one read-back, and the checks and factorisations of so
    small a matrix cost less on the host than launches and synchronising reads on a GPU), after checking for
    constant columns and (``full``) collinearity, named in the error."""
    cov = s.cov().cpu()
    var = torch.diagonal(cov)
    flat = ~(var > 0.0)
    if bool(flat.any()):
        j = int(flat.nonzero()[0, 0])
        val = float(s.x2[0, j])
        raise InputError(f"Column {s.names[j]!r} of the data is constant (every value is {val:g}); a bandwidth "
                         "for it would be 0.")
    if s.d > 1 and full:
        c = cov.numpy()
        sd = np.sqrt(np.diagonal(c))
        evals, evecs = np.linalg.eigh(c / sd[:, None] / sd[None, :])  # NumPy: ~5x less overhead than torch here
        if float(evals[0]) <= 1e-10 * float(evals[-1]):
            v = np.abs(evecs[:, 0])
            cols = [s.names[j] for j in range(s.d) if float(v[j]) > 1e-6]
            raise SingularCovarianceError(f"The columns {cols} are collinear (their sample covariance is singular), "
                                          "so no full-rank bandwidth matrix exists. Drop one of them, project the "
                                          "data first, or use a rule with covariance='diagonal'.")
    return cov


def _weighted_quantile(x: torch.Tensor, w: torch.Tensor | None, q: float) -> float:
    """Quantile with NumPy's default (linear) rule, exactly as on the data with each row repeated w times."""
    if w is None:
        return quantile(x, q)
    order = torch.argsort(x)
    xs, ws = x[order], w[order]
    cw = torch.cumsum(ws, 0)
    pos = q * (float(cw[-1]) - 1.0)
    lo = math.floor(pos)

    def at(rank: float) -> float:  # value of the row with 0-based rank `rank` in the repeated data
        i = int(torch.searchsorted(cw, torch.tensor(rank, dtype=cw.dtype, device=cw.device), right=True))
        return float(xs[min(i, xs.shape[0] - 1)])

    a = at(lo)
    return a + (pos - lo) * (at(lo + 1) - a) if pos > lo else a


# ------------------------------------------------------------------------------------ rules of thumb


def _rule(s: Sample, method: str, covariance: str = "full") -> float | np.ndarray:
    n, d = s.n, s.d
    cov = _check_scale(s, full=covariance == "full")
    if covariance == "diagonal":
        cov = torch.diag(torch.diagonal(cov))
    if s.one_d:
        sd = math.sqrt(float(cov[0, 0]))
        iqr = _weighted_quantile(s.x, s.w, 0.75) - _weighted_quantile(s.x, s.w, 0.25)
        scale = min(sd, iqr / 1.349) if iqr > 0 else sd
        const = 1.059 if method == "scott" else 0.9
        return const * scale * n ** (-0.2)
    factor = n ** (-1.0 / (d + 4)) if method == "scott" else (n * (d + 2) / 4.0) ** (-1.0 / (d + 4))
    return (factor**2 * cov).cpu().numpy()


# ----------------------------------------------------------------------------------------- plug-in


def _engine_for(s: Sample, engine: str) -> str:
    if engine != "auto":
        return engine
    return "exact" if s.n <= device_policy(s.device).exact_max_rows else "binned"


class _Functional:
    """Ψ̂_r(g) evaluator on one prepared 1-D sample (centred, and sorted or binned once)."""

    def __init__(self, s: Sample, engine: str, g_min_hint: float):
        self.s = s
        self.engine = engine
        if engine == "exact":
            xc = s.x - s.mean()[0]  # centred: the Triton path works in float32
            order = torch.argsort(xc)
            self.xs = xc[order].contiguous()
            self.w = None if s.w is None else s.w[order].contiguous()
        else:  # binning is shift-invariant: no centring pass over a possibly huge column
            self.lo = float(s.x.min())
            self.hi = float(s.x.max())
            self.xc = s.x
            self._bin(g_min_hint)

    def _bin(self, g: float) -> None:
        self.m = _binned.grid_size(self.hi - self.lo, g)
        self.delta = (self.hi - self.lo) / (self.m - 1)
        self.c = _binned.linear_bin(self.xc, self.s.w, self.m, self.lo, self.hi)
        self.g_binned = g

    def __call__(self, r: int, g: float) -> float:
        s = self.s
        if self.engine == "exact":
            total = hermite_sum(self.xs, self.w, g, r)
        else:
            if g < self.g_binned * 0.999:  # a smaller g than planned for: rebin finer
                self._bin(g)
            coefs = hermite_even_coefficients(r)
            cut = hermite_cutoff(r, s.n * s.n, s.sum_w2 * abs(gaussian_derivative_at_zero(r)))

            def f(u: torch.Tensor) -> torch.Tensor:
                v = u / g
                v2 = v * v
                return torch.from_numpy(np.polynomial.polynomial.polyval(v2.cpu().numpy(), coefs)).to(v) * \
                    torch.exp(-0.5 * v2) / SQRT_2PI

            total = _binned.binned_pairsum(self.c, self.delta, f, cut * g)
        return total / (s.n * s.n * g ** (r + 1))


def _plugin(s: Sample, engine: str) -> float:
    n = s.n
    cov = _check_scale(s)
    sd = math.sqrt(float(cov[0, 0]))
    # Digest steps 1-7 (Wand & Jones 1995, §3.6; KernSmooth dpik with level 2).
    psi8 = 105.0 / (32.0 * math.sqrt(math.pi) * sd**9)
    g1 = (-2.0 * gaussian_derivative_at_zero(6) / (psi8 * n)) ** (1.0 / 9.0)
    psi6_ns = -15.0 / (16.0 * math.sqrt(math.pi) * sd**7)
    g2_ns = (-2.0 * gaussian_derivative_at_zero(4) / (psi6_ns * n)) ** (1.0 / 7.0)
    functional = _Functional(s, engine, min(g1, 0.5 * g2_ns))
    psi6 = functional(6, g1)
    if not psi6 < 0:
        raise DensitasError(f"The plug-in functional Ψ̂₆ is {psi6:g} (it must be negative); the data are too "
                            "degenerate for the plug-in selector. Try method='isj' or 'lscv_h'.")
    g2 = (-2.0 * gaussian_derivative_at_zero(4) / (psi6 * n)) ** (1.0 / 7.0)
    psi4 = functional(4, g2)
    if not psi4 > 0:
        raise DensitasError(f"The plug-in functional Ψ̂₄ is {psi4:g} (it must be positive); the data are too "
                            "degenerate for the plug-in selector.")
    return (1.0 / (2.0 * math.sqrt(math.pi)) / (psi4 * n)) ** 0.2


# -------------------------------------------------------------------------------------------- ISJ


def _isj(s: Sample, grid_size: int) -> float:
    """Improved Sheather–Jones (Botev, Grotowski & Kroese 2010, the authors' kde.m), scale-equivariant.

    The fixed point ``t*`` is in units of the grid's range, so ``h = √t* · (grid range)`` (KDEpy multiplies by
    the data range instead, issues #199/#201).
    """
    _check_scale(s)
    xmin, xmax = float(s.x.min()), float(s.x.max())
    span = xmax - xmin
    lo, hi = xmin - span / 10.0, xmax + span / 10.0
    counts = _binned.linear_bin(s.x, s.w, grid_size, lo, hi).cpu().numpy()
    return isj_on_grid(counts, s.n, hi - lo)


def isj_on_grid(counts: np.ndarray, n: float, grid_range: float) -> float:
    """ISJ's bandwidth from the linear-binning weights ``counts`` of ``n`` points on an even grid spanning
    ``grid_range`` (both ends included): Botev's fixed point ``t*`` of the binned DCT, ``h = √t* · grid_range``.

    :func:`_isj` chooses the grid (the data's range plus a tenth on each side); this step is apart so that a
    test can run it on another implementation's grid.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=2000)
    >>> counts = np.histogram(x, bins=1024, range=(-6, 6))[0].astype(float)
    >>> 0.1 < isj_on_grid(counts, 2000, 12.0) < 0.5
    True
    """
    from scipy import fft, optimize

    grid_size = len(counts)
    c = np.asarray(counts, dtype=np.float64) / float(np.sum(counts))
    a = fft.dct(c, type=2)  # 2 Σ c_j cos(πk(2j+1)/(2M)), Botev's dct1d for k ≥ 1
    k2 = np.arange(1, grid_size, dtype=np.float64) ** 2
    a2 = a[1:] ** 2

    def fixed_point(t: float) -> float:
        ell = 7
        f = 0.5 * math.pi ** (2 * ell) * np.sum(k2**ell * a2 * np.exp(-k2 * math.pi**2 * t))
        if f <= 0:
            return -1.0
        for j in range(ell - 1, 1, -1):
            k0 = float(np.prod(np.arange(1, 2 * j, 2, dtype=np.float64))) / SQRT_2PI
            const = (1.0 + 0.5 ** (j + 0.5)) / 3.0
            time = (2.0 * const * k0 / (n * f)) ** (2.0 / (3.0 + 2.0 * j))
            f = 0.5 * math.pi ** (2 * j) * np.sum(k2**j * a2 * np.exp(-k2 * math.pi**2 * time))
        return t - (2.0 * n * math.sqrt(math.pi) * f) ** (-0.4)

    nn = min(max(n, 50.0), 1050.0)
    tol = 1e-12 + 0.01 * (nn - 50.0) / 1000.0
    while True:
        try:
            if fixed_point(0.0) * fixed_point(tol) < 0:
                t_star = optimize.brentq(fixed_point, 0.0, tol, xtol=1e-14, rtol=1e-12)
                break
        except (ValueError, FloatingPointError):
            pass
        if tol >= 0.1:
            t_star = optimize.minimize_scalar(lambda t: abs(fixed_point(t)), bounds=(0.0, 0.1),
                                              method="bounded").x
            warnings.warn("ISJ: the fixed-point equation has no root in (0, 0.1]; using the point nearest to one. "
                          "The data may be too few or too discrete for ISJ.", RuntimeWarning, stacklevel=6)
            break
        tol = min(tol * 2.0, 0.1)
    return math.sqrt(t_star) * grid_range


# ------------------------------------------------------------------------------------------- LSCV


_lscv_value = _pairhist.lscv_value  # the LSCV formula lives beside the search that evaluates it on the device


def _whiten(s: Sample, chol: torch.Tensor) -> torch.Tensor:
    """``(x − x̄) L⁻ᵀ`` for the lower Cholesky factor ``L`` (d × d, on any device): a triangular solve on the data's
    device (a product by L⁻¹ instead took 4.7 ms at n = 10⁵, d = 16 on an H200: cuBLAS's float64 GEMM for this
    shape is slow)."""
    xc = s.x2 - s.mean()
    return torch.linalg.solve_triangular(chol.to(xc), xc.T, upper=False).T.contiguous()


class _LscvScalar:
    """LSCV(h²·S) on data whitened by S, evaluated for many h per pass."""

    def __init__(self, s: Sample, engine: str):
        self.s = s
        self.d = s.d
        self.cov = _check_scale(s)  # on the host
        chol = torch.linalg.cholesky(self.cov)
        self.logdet_s = 2.0 * float(torch.log(torch.diagonal(chol)).sum())  # log|S|
        self.chol = chol  # on the host
        self.z = _whiten(s, self.chol)
        self.sw2 = s.sum_w2
        self.sww1 = self.sw2 - s.n  # Σ w(w − 1): pairs of copies of one row, excluded from i ≠ j
        self.engine = engine
        if engine == "binned":
            if self.d != 1:
                raise InputError("engine='binned' supports LSCV on 1-D data only; use engine='exact' for "
                                 f"{self.d} columns.")
            z1 = self.z[:, 0]
            self.lo, self.hi = float(z1.min()), float(z1.max())
            self.z1 = z1
            self.c = None
        self.evals = 0

    def sums(self, hs: np.ndarray, chain: bool) -> tuple[np.ndarray, np.ndarray]:
        a = 1.0 / (4.0 * hs**2)  # exp(−Y/(4h²)) is the 2H kernel; its square exp(−Y/(2h²)) the H kernel
        self.evals += len(hs)
        if self.engine == "exact":
            out = gauss_sums(self.z, self.s.w, torch.from_numpy(a), chain=chain).cpu().numpy()
            return out[:, 0], out[:, 1]
        g = float(hs.min())
        if self.c is None or g < self.g_binned * 0.999:
            self.m = _binned.grid_size(self.hi - self.lo, g)
            self.delta = (self.hi - self.lo) / (self.m - 1)
            self.c = _binned.linear_bin(self.z1, self.s.w, self.m, self.lo, self.hi)
            self.g_binned = g
        s1, s2 = [], []
        for ak in a:
            for coef, acc in ((ak, s1), (2.0 * ak, s2)):
                full = _binned.binned_pairsum(self.c, self.delta, lambda u, c=coef: torch.exp(-c * u * u),
                                              math.sqrt(40.0 / coef))
                acc.append(0.5 * (full - self.sw2))
        return np.array(s1), np.array(s2)

    def objective(self, hs: np.ndarray, chain: bool = False) -> np.ndarray:
        s1, s2 = self.sums(hs, chain)
        hdet_inv = np.exp(-self.d * np.log(hs) - 0.5 * self.logdet_s)
        return _lscv_value(s1, s2, hdet_inv, self.s.n, self.sw2, self.sww1, self.d)

    def minimise(self) -> tuple[float, float]:
        """Exact engine on the CPU: from one pair-distance histogram (:mod:`densitas.kde.pairhist`) when its
        error bound holds and the minimum is interior; otherwise (and on CUDA) a coarse geometric grid over
        [h0/4, 4 h0], then zoom passes uniform in 1/h² to LSCV_RTOL in h."""
        n, d = self.s.n, self.d
        h0 = (4.0 / ((d + 2.0) * n)) ** (1.0 / (d + 4.0))
        if self.engine == "exact" and _pairhist.histogram_pays(self.z.device, d, self.z.shape[0],
                                                                 self.s.w is not None):
            const = _pairhist.LscvConstants(n, self.sw2, self.sww1, d, self.logdet_s)
            found = _pairhist.lscv_h_minimum(self.z, self.s.w, h0, const)
            if found.trusted and not found.at_edge:
                return found.h, found.value
        hs = h0 * np.geomspace(0.25, 4.0, LSCV_GRID)
        vals = self.objective(hs)
        for _ in range(4):  # the minimum sits on an end of the grid: extend the search that way
            k = int(np.nanargmin(vals))
            if 0 < k < len(hs) - 1:
                break
            ext = hs[0] * np.geomspace(1 / 16, 1, 17)[:-1] if k == 0 else hs[-1] * np.geomspace(1, 16, 17)[1:]
            ev = self.objective(ext)
            hs, vals = (np.concatenate([ext, hs]), np.concatenate([ev, vals])) if k == 0 else \
                (np.concatenate([hs, ext]), np.concatenate([vals, ev]))
        k = int(np.nanargmin(vals))
        if k in (0, len(hs) - 1):
            warnings.warn(f"LSCV has no interior minimum in [{hs[0]:.3g}, {hs[-1]:.3g}]·√S (duplicated rows or "
                          "discrete data drive it to h → 0); returning the end of the search range. Columns: "
                          f"{self.s.names}.", DegenerateBandwidthWarning, stacklevel=6)
            return float(hs[k]), float(vals[k])
        best_h, best_v = float(hs[k]), float(vals[k])
        lo, hi = float(hs[k - 1]), float(hs[k + 1])
        while (hi - lo) / best_h > LSCV_RTOL:
            t = np.linspace(1.0 / hi**2, 1.0 / lo**2, LSCV_ZOOM)  # uniform in 1/h²: an arithmetic chain
            zh = 1.0 / np.sqrt(t)  # decreasing h
            zv = self.objective(zh, chain=True)
            j = int(np.nanargmin(zv))
            if zv[j] < best_v:
                best_h, best_v = float(zh[j]), float(zv[j])
            j = int(np.argmin(np.abs(zh - best_h)))
            new_hi = float(zh[j - 1]) if j > 0 else hi
            new_lo = float(zh[j + 1]) if j < len(zh) - 1 else lo
            if (new_hi - new_lo) >= (hi - lo) * 0.999:  # no progress (flat in float precision)
                break
            lo, hi = new_lo, new_hi
        return best_h, best_v


class _LscvMatrix:
    """LSCV(H) and its gradient over H = L_S H̃ L_Sᵀ, H̃ = exp(Θ) with Θ symmetric (the matrix exponential: H̃
    cannot leave the cone), Θ held in the coordinates ``θ = (Θ_ii, √2 Θ_ij for i < j)``, orthonormal for the
    Frobenius inner product.

    Why these coordinates: whitening by the Cholesky factor ``L_S`` fixes the data only up to a rotation (data
    ``x Aᵀ`` whiten to ``Q z`` for an orthogonal ``Q``), and LSCV(H̃; Qz) = LSCV(Qᵀ H̃ Q; z). A rotation acts on
    ``θ`` as an orthogonal map, so BFGS started at ``h²I`` (its first inverse Hessian the identity) takes the
    rotated steps on rotated data and stops at the transformed minimum: the selector is affine-equivariant, also
    where LSCV(H) has two minima of nearly equal depth. Over the Cholesky factor ``M`` (the parameterisation
    before) it is not, and it stopped in either (150 rows: minima 0.9% apart in depth, H 40% apart)."""

    def __init__(self, scalar: _LscvScalar):
        self.sc = scalar
        self.d = scalar.d
        self.iu = np.triu_indices(self.d, 1)
        self.evals = 0

    def symmetric(self, theta: np.ndarray) -> np.ndarray:
        """Θ from its coordinates ``θ``."""
        d = self.d
        t = np.zeros((d, d))
        t[np.diag_indices(d)] = theta[:d]
        t[self.iu] = t[self.iu[::-1]] = theta[d:] / math.sqrt(2.0)
        return t

    def coordinates(self, t: np.ndarray) -> np.ndarray:
        """``θ`` of a symmetric Θ (the inverse of :meth:`symmetric`)."""
        return np.concatenate([np.diag(t), math.sqrt(2.0) * t[self.iu]])

    def spectrum(self, theta: np.ndarray) -> _Spectrum:
        """Θ's eigenvalues and eigenvectors, and the eigenvalues H̃ = exp(Θ) is made of: within
        :data:`LOG_SPREAD` of their mean (H̃'s condition number at most 1e12, so that H in the data's units stays
        positive definite in float64) and within [:data:`LOG_EIG_MIN`, :data:`LOG_EIG_MAX`]. Both bounds are
        functions of the eigenvalues: a rotation of Θ keeps them."""
        lam, u = np.linalg.eigh(self.symmetric(theta))
        mean = float(lam.mean())
        lo, hi = max(mean - LOG_SPREAD, LOG_EIG_MIN), min(mean + LOG_SPREAD, LOG_EIG_MAX)
        if lo > hi:  # the mean itself beyond an absolute bound: every eigenvalue at it
            lo = hi = min(max(mean, LOG_EIG_MIN), LOG_EIG_MAX)
        used = np.clip(lam, lo, hi)
        # which eigenvalues sit at a bound that moves with the mean (d mean / dΘ = I / d)
        with_mean = ((lam < lo) & (lo == mean - LOG_SPREAD)) | ((lam > hi) & (hi == mean + LOG_SPREAD))
        return _Spectrum(lam, used, u, (lam >= lo) & (lam <= hi), with_mean)

    def unpack(self, theta: np.ndarray, sp: _Spectrum | None = None) -> np.ndarray:
        """The lower-triangular ``M`` with ``M Mᵀ = H̃ = exp(Θ)`` (from a QR of ``(U e^{Λ/2})ᵀ``: no product
        squares H̃'s condition number); ``sp``: Θ's :meth:`spectrum`, when known."""
        sp = self.spectrum(theta) if sp is None else sp
        r = np.linalg.qr((sp.u * np.exp(0.5 * sp.used)).T, mode="r")
        m = r.T
        return m * np.sign(np.diag(m))[None, :]  # a positive diagonal

    def pack(self, h_tilde: np.ndarray) -> np.ndarray:
        """``θ`` of ``log(H̃)``."""
        lam, u = np.linalg.eigh(0.5 * (h_tilde + h_tilde.T))
        return self.coordinates((u * np.log(lam)) @ u.T)

    def _solve(self, m: np.ndarray) -> torch.Tensor:
        """The rows ``u = M⁻¹ z`` (the distributed selectors solve them in the tasks instead)."""
        mt = torch.from_numpy(m).to(self.sc.z)
        return torch.linalg.solve_triangular(mt, self.sc.z.T, upper=False).T.contiguous()

    def value_grad(self, theta: np.ndarray, want_grad: bool = True) -> tuple[float, np.ndarray | None]:
        sc, d = self.sc, self.d
        sp = self.spectrum(theta)
        m = self.unpack(theta, sp)
        u = self._solve(m)
        hdet_inv = math.exp(-0.5 * float(sp.used.sum()) - 0.5 * sc.logdet_s)  # |H̃|^(-1/2) |S|^(-1/2)
        n, sw2, sww1 = sc.s.n, sc.sw2, sc.sww1
        self.evals += 1
        if not want_grad:
            out = gauss_sums(u, sc.s.w, [0.25]).cpu().numpy()
            return float(_lscv_value(out[0, 0], out[0, 1], hdet_inv, n, sw2, sww1, d)), None
        sums, mom = gauss_grad_sums(u, sc.s.w)
        s1, s2 = float(sums[0]), float(sums[1])
        a1, a2 = mom[0].cpu().numpy(), mom[1].cpu().numpy()
        val = float(_lscv_value(s1, s2, hdet_inv, n, sw2, sww1, d))
        c2 = (4.0 * math.pi) ** (-0.5 * d) * hdet_inv
        c1 = (2.0 * math.pi) ** (-0.5 * d) * hdet_inv
        eye = np.eye(d)
        # dLSCV/dH̃ = M⁻ᵀ B M⁻¹ (derivation in the module docs of the issue note; checked by finite differences)
        b = (c2 * (-0.5 * sw2 * eye + 2.0 * (0.25 * a1 - 0.5 * s1 * eye))) / (n * n) \
            - 2.0 * c1 * (-0.5 * sww1 * eye + (a2 - s2 * eye)) / (n * (n - 1.0))
        minv = np.linalg.inv(m)
        g_h = minv.T @ b @ minv  # dF/dH̃ = M⁻ᵀ B M⁻¹
        return val, self.coordinates(self._through_exp(sp, 0.5 * (g_h + g_h.T)))

    def _through_exp(self, sp: _Spectrum, g_h: np.ndarray) -> np.ndarray:
        """dF/dΘ from dF/dH̃ for H̃ = f(Θ), f = exp of the bounded eigenvalues (:meth:`spectrum`): the
        Daleckii–Krein formula, in Θ's eigenbasis dF/dH̃ times the divided differences of f at Θ's eigenvalues (f'
        is 0 for an eigenvalue at a bound), plus, for the eigenvalues held at a bound that follows the mean, their
        share of the mean's gradient I/d. In the coordinates θ an off-diagonal entry counts √2 times
        (:meth:`coordinates`), as Θ_ij and Θ_ji both move with it. ``sp``: Θ's :meth:`spectrum`."""
        f = np.exp(sp.used)
        slope = np.where(sp.free, f, 0.0)
        diff = sp.lam[:, None] - sp.lam[None, :]
        close = np.abs(diff) < 1e-9
        rise = f[None, :] * np.expm1(sp.used[:, None] - sp.used[None, :])  # f_i − f_j without cancellation
        with np.errstate(invalid="ignore", divide="ignore"):
            phi = np.where(close, 0.5 * (slope[:, None] + slope[None, :]), rise / np.where(close, 1.0, diff))
        g_tilde = sp.u.T @ g_h @ sp.u
        out = sp.u @ (g_tilde * phi) @ sp.u.T
        out[np.diag_indices(self.d)] += float((np.diag(g_tilde) * f * sp.with_mean).sum()) / self.d
        return out

    def minimise(self, start: np.ndarray, optimizer: str, maxiter: int) -> tuple[np.ndarray, float]:
        from scipy import optimize

        theta0 = self.pack(start)
        f0, _ = self.value_grad(theta0, want_grad=False)
        scale = abs(f0) if f0 != 0 else 1.0
        if optimizer == "bfgs":  # stopping on the gradient's 2-norm, which rotations keep (the max-norm not)
            res = optimize.minimize(lambda th: tuple(v / scale if v is not None else v
                                                     for v in self.value_grad(th)),
                                    theta0, jac=True, method="BFGS",
                                    options={"maxiter": maxiter, "gtol": 1e-7, "norm": 2})
        else:
            res = optimize.minimize(lambda th: self.value_grad(th, want_grad=False)[0] / scale, theta0,
                                    method="Nelder-Mead",
                                    options={"maxiter": maxiter, "maxfev": maxiter * 2, "xatol": 1e-6,
                                             "fatol": 1e-10, "adaptive": theta0.size > 4})
        theta = res.x
        val = float(res.fun) * scale
        if val > f0:  # never return worse than the start (a line search cannot, Nelder–Mead in theory can)
            theta, val = theta0, f0
        m = self.unpack(theta)
        return m @ m.T, val


def _to_data_units(s: Sample, h_tilde: np.ndarray, chol: torch.Tensor) -> np.ndarray:
    lc = chol.cpu().numpy()
    return lc @ h_tilde @ lc.T


def _lscv(s: Sample, engine: str, full: bool, options: dict[str, Any]) -> float | np.ndarray:
    eng = "exact" if engine == "auto" else engine
    scalar = _LscvScalar(s, eng)
    # One tied column suffices: along it LSCV(H) behaves as the column's own 1-D LSCV (times a positive factor
    # when the other directions are smoothed widely), which falls without bound as its bandwidth goes to 0.
    tied = _tied_columns(s)
    if tied:
        warnings.warn(_degenerate_lscv_message(s, tied), DegenerateBandwidthWarning, stacklevel=5)
    with warnings.catch_warnings():
        if tied:  # said once, above, with the columns named
            warnings.simplefilter("ignore", DegenerateBandwidthWarning)
        h, _ = scalar.minimise()
    if not full:
        return _finish(s, _to_data_units(s, np.eye(s.d) * h * h, scalar.chol))
    optimizer = options["optimizer"]
    d, n = s.d, s.n
    h0sq = (4.0 / ((d + 2.0) * n)) ** (2.0 / (d + 4.0))
    if options["start"] == "normal":
        start_m = np.eye(d) * h0sq
    else:  # "auto": the better of H0 and the LSCV_h minimiser: the latter, which minimises over h²S ∋ H0
        start_m = np.eye(d) * h * h
    maxiter = options["maxiter"] or (200 if optimizer == "bfgs" else 4000)
    if eng == "binned":  # 1-D: H is a scalar, the LSCV_h minimiser is the answer
        return _finish(s, _to_data_units(s, start_m, scalar.chol))
    mat = _LscvMatrix(scalar)
    h_tilde, _ = mat.minimise(start_m, optimizer, maxiter)
    return _finish(s, _to_data_units(s, h_tilde, scalar.chol))


def _finish(s: Sample, hmat: np.ndarray) -> float | np.ndarray:
    hmat = 0.5 * (hmat + hmat.T)
    return math.sqrt(float(hmat[0, 0])) if s.one_d else hmat


# ------------------------------------------------------------------------------------------ registry


def _scott(s: Sample, engine: str, options: dict[str, Any]) -> float | np.ndarray:
    return _rule(s, "scott", options["covariance"])


def _silverman(s: Sample, engine: str, options: dict[str, Any]) -> float | np.ndarray:
    return _rule(s, "silverman", options["covariance"])


def _plugin_selector(s: Sample, engine: str, options: dict[str, Any]) -> float:
    return _plugin(s, _engine_for(s, engine))


def _isj_selector(s: Sample, engine: str, options: dict[str, Any]) -> float:
    return _isj(s, options["grid_size"])


def _lscv_h_selector(s: Sample, engine: str, options: dict[str, Any]) -> float | np.ndarray:
    return _lscv(s, engine, False, options)


def _lscv_H_selector(s: Sample, engine: str, options: dict[str, Any]) -> float | np.ndarray:
    return _lscv(s, engine, True, options)


_COVARIANCE = Option("covariance", "full", choice("full", "diagonal"),
                     "``'diagonal'`` uses only the diagonal of S (a product kernel; works when S is singular).")

#: The bandwidth selectors, in the order the documentation lists them.
SELECTORS = SelectorRegistry()
SELECTORS.register(Selector(
    "scott", _scott,
    "1-D: ``h = 1.059 · min(sd, IQR/1.349) · n^(−1/5)`` (1.059 = (4/3)^(1/5), the normal AMISE optimum); d-D: "
    "``H = n^(−2/(d+4)) · S`` (Scott's factor squared times the sample covariance).",
    options=(_COVARIANCE,), complexity="O(n)"))
SELECTORS.register(Selector(
    "silverman", _silverman,
    "1-D: ``h = 0.9 · min(sd, IQR/1.349) · n^(−1/5)`` (Silverman 1986, eq. 3.31); d-D: "
    "``H = (n(d+2)/4)^(−2/(d+4)) · S``.",
    options=(_COVARIANCE,), complexity="O(n)"))
SELECTORS.register(Selector(
    "plugin", _plugin_selector,
    "1-D two-stage direct plug-in (Sheather & Jones 1991 / Wand & Jones 1995 §3.6; digest steps 1–7; "
    "KernSmooth ``dpik``): two functionals Ψ̂₆(g₁), Ψ̂₄(g₂).",
    univariate=True, pairwise=True, complexity="exact O(n²) (pruned), binned O(n + M log M)"))
SELECTORS.register(Selector(
    "lscv_h", _lscv_h_selector,
    "``H = h²S``, h minimising LSCV(h²S) (documents 000/003), ``h₀ = (4/((d+2)n))^(1/(d+4))``: from one "
    "pair-distance histogram (one O(n² d) pass; then three 256-point grids over ``[h₀/64, 64h₀]``, each "
    "between the neighbours of the previous minimum) where its error bound allows — on the CPU, and on CUDA "
    "with CuPy; otherwise a 32-point geometric grid over ``[h₀/4, 4h₀]``, then zoom passes of 16 values each "
    "(uniform in 1/h²) to 1e-4 relative in h, all values of a pass sharing one O(n²) sweep. The pair "
    "distances are never stored. Warns when the minimum runs to h → 0 (tied or discrete data).",
    binned_univariate=True, pairwise=True, auto_exact=True, complexity="O(n² d) per pass"))
SELECTORS.register(Selector(
    "lscv_H", _lscv_H_selector,
    "a full symmetric positive-definite H minimising LSCV(H) (document 003), parameterised as "
    "``H = L_S exp(Θ) L_Sᵀ`` with Θ symmetric (it cannot leave the cone; a rotation of the whitened data "
    "rotates Θ, so BFGS stops at the transformed minimum: affine-equivariant), analytic gradients, BFGS; "
    "started from the LSCV_h minimiser (``start='auto'``, so never worse than ``lscv_h``) or "
    "document 003's ``H₀ = (4/((d+2)n))^(2/(d+4)) S`` (``start='normal'``).",
    options=(Option("optimizer", "bfgs", choice("bfgs", "nelder-mead", aliases={"quasi-newton": "bfgs"}),
                    "the minimiser of LSCV(H)."),
             Option("start", "auto", choice("auto", "normal"), "the starting H."),
             Option("maxiter", None, int_at_least(1, none_ok=True),
                    "iteration limit (200 for BFGS, 4000 for Nelder–Mead).")),
    binned_univariate=True, pairwise=True, auto_exact=True, complexity="O(n² d²) per iteration"))
SELECTORS.register(Selector(
    "isj", _isj_selector,
    "improved Sheather–Jones (Botev et al. 2010), on a grid of ``grid_size`` points, scale-equivariant.",
    options=(Option("grid_size", 1 << 14, int_at_least(64), "grid points of the discrete cosine transform."),),
    univariate=True, engines=("auto", "binned"),
    reason="method='isj' is a grid method (a discrete cosine transform of binned data)",
    complexity="O(n + M log M)"))

METHODS = SELECTORS.names()


# ------------------------------------------------------------------------------------------ public


def bandwidth(x: Any, method: str = "plugin", *, engine: str = "auto", weights: Any = None,
              device: DeviceLike = "auto", **options: Any) -> float | np.ndarray:
    """Select a Gaussian-kernel bandwidth for ``x``.

    Parameters
    ----------
    x : (n,) or (n, d) array-like (NumPy, pandas, torch)
    method : {METHOD_CHOICES}
{METHOD_BULLETS}
    engine : {"auto", "exact", "binned"}
        ``"exact"``: O(n²) tiled pair sums (CPU: PyTorch in float64; CUDA: Triton, float32 with float64 tile
        accumulation). ``"binned"``: linear binning + FFT, within 1e-3 of exact (1-D only). ``"auto"``: exact
        up to ``DevicePolicy.exact_max_rows`` rows for the device (20,000 on the CPU, 10⁶ on CUDA:
        :func:`densitas._backend.policy.device_policy`), binned beyond.
    weights : (n,) array-like, optional
        Frequency weights (integer weights ≡ repeated rows; the sum is the sample size).
    device : "auto", "cpu", "cuda", …
    **options
        The method's options (``SELECTORS[method].options``):

{OPTION_BULLETS}

    Returns
    -------
    float for 1-D input (the kernel's standard deviation), (d, d) ndarray for 2-D input (the kernel covariance).

    Raises
    ------
    OptionError
        An option the method does not take, or a bad value of one (``.option`` names it).
    InputError
        Bad data, an engine or a number of columns the method does not take.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=2000)
    >>> round(bandwidth(x, "plugin", device="cpu"), 2)
    0.24
    """
    if is_dask(x) or is_dask(weights):  # partitions on a Dask cluster: never pulled to the client
        from densitas.kde.distributed import bandwidth_dask

        return bandwidth_dask(x, method, engine=engine, weights=weights, device=device, **options)
    method = check_choice("method", method, METHODS, "bandwidth")
    engine = check_choice("engine", engine, ENGINES, "bandwidth")
    selector = SELECTORS[method]
    opts = selector.validate(options, engine)
    s = prepare(x, weights, device=device)
    selector.check_dimensions(s.d, engine, SELECTORS.multivariate)
    exact = engine == "exact" or (engine == "auto" and (selector.auto_exact or _engine_for(s, engine) == "exact"))
    with thread_policy(s.device, selector.work(s.x.shape[0], s.d, exact)):
        if selector.univariate and not s.one_d:  # one column given as (n, 1): H = [[h²]]
            return _as_matrix(s, _scaled(selector, _as_1d(s), engine, opts))
        return _scaled(selector, s, engine, opts)


def _as_matrix(s: Sample, h: float) -> np.ndarray:
    """``[[h²]]``, refused (as :meth:`Scaling.undo` refuses) where float64 cannot hold it."""
    with np.errstate(over="ignore", under="ignore"):
        H = np.array([[h]], dtype=np.float64) ** 2
    if not (np.isfinite(H[0, 0]) and H[0, 0] > 0):
        raise InputError(f"The bandwidth matrix of column {s.names[0]!r} is not representable in float64: "
                         f"h = {h:.4g}, so H = h² is beyond its range. Pass the column as 1-D data (shape (n,)) "
                         "to get h, or rescale it.")
    return H


def _scaled(selector: Selector, s: Sample, engine: str, opts: dict[str, Any]) -> float | np.ndarray:
    """Run ``selector`` on the data divided by per-column powers of two (:class:`Scaling`), and scale back."""
    scaling = Scaling.of(s)
    return scaling.undo(s, selector.fn(scaling.apply(s), engine, opts))


def _docstring_bullets(items: list[tuple[str, str]], indent: int) -> str:
    lines = []
    for head, text in items:
        lines.append(textwrap.fill(f"* {head} — {text}", width=114, initial_indent=" " * indent,
                                   subsequent_indent=" " * (indent + 2)))
    return "\n".join(lines)


bandwidth.__doc__ = bandwidth.__doc__.replace("{METHOD_CHOICES}", "{" + ", ".join(repr(m) for m in METHODS)
                                              .replace("'", '"') + "}").replace(
    "{METHOD_BULLETS}", _docstring_bullets([(f'``"{s.name}"``', s.summary) for s in SELECTORS], 8)).replace(
    "{OPTION_BULLETS}", _docstring_bullets([(f'``{s.name}``', o.describe()) for s in SELECTORS
                                            for o in s.options], 8))


def _as_1d(s: Sample) -> Sample:
    return s if s.one_d else Sample(s.x[:, 0].contiguous(), s.w, s.names, True)


def _check_positive(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(f"'{name}' must be a positive number. Got {value!r} instead.") from None
    if not (v > 0 and math.isfinite(v)):
        raise InputError(f"'{name}' must be a positive finite number. Got {value!r} instead.")
    return v


def check_bandwidth_matrix(H: Any, d: int, name: str = "H") -> np.ndarray:
    """A (d, d) symmetric positive-definite float64 matrix from ``H`` (a float h means H = h² for d = 1)."""
    if np.ndim(H) == 0:
        if d != 1:
            raise InputError(f"'{name}' must be a ({d}, {d}) matrix for {d}-column data. Got the scalar {H!r}.")
        return np.array([[_check_positive(name, H) ** 2]])
    m = np.asarray(H.cpu() if isinstance(H, torch.Tensor) else H, dtype=np.float64)
    if m.shape != (d, d):
        raise InputError(f"'{name}' must have shape ({d}, {d}). Got {m.shape}.")
    if not np.all(np.isfinite(m)):
        raise InputError(f"'{name}' holds NaN or infinity.")
    if not np.allclose(m, m.T, rtol=1e-10, atol=0):
        raise InputError(f"'{name}' must be symmetric.")
    try:
        np.linalg.cholesky(m)
    except np.linalg.LinAlgError:
        raise InputError(f"'{name}' must be positive definite; its eigenvalues are {np.linalg.eigvalsh(m)}.") from None
    return 0.5 * (m + m.T)


def lscv_objective(x: Any, H: Any, *, weights: Any = None, device: DeviceLike = "auto") -> float:
    """The unbiased LSCV criterion of R's ks (Duong 2004) at bandwidth ``H``:

    ``LSCV(H) = n⁻² Σᵢ Σⱼ φ_{2H}(xᵢ − xⱼ) − 2/(n(n−1)) Σ_{i≠j} φ_H(xᵢ − xⱼ)``, ``φ_H`` the N(0, H) density.

    ``H`` is a float ``h`` (the kernel standard deviation, as :func:`bandwidth` returns; H = h²) for 1-D ``x``
    and a (d, d) matrix otherwise. One exact O(n² d) sweep over the upper triangle.

    Examples
    --------
    >>> import numpy as np
    >>> lscv_objective(np.array([0.0, 1.0]), 1.0) < 0
    True
    """
    s = prepare(x, weights, device=device)
    hm = check_bandwidth_matrix(H, s.d)
    chol = torch.from_numpy(np.linalg.cholesky(hm))
    z = _whiten(s, chol)
    with thread_policy(s.device, z.shape[0] ** 2 * s.d / 2.0):
        out = gauss_sums(z, s.w, [0.25]).cpu().numpy()
    hdet_inv = math.exp(-float(torch.log(torch.diagonal(chol)).sum()))
    return float(_lscv_value(out[0, 0], out[0, 1], hdet_inv, s.n, s.sum_w2, s.sum_w2 - s.n, s.d))


def plugin_functional(x: Any, r: int, g: float, *, engine: str = "exact", weights: Any = None,
                      device: DeviceLike = "auto") -> float:
    """``Ψ̂_r(g) = n⁻² g^(−r−1) Σᵢ Σⱼ K⁽ʳ⁾((xᵢ − xⱼ)/g)``, Gaussian ``K``, even ``r`` (all ordered pairs).

    Examples
    --------
    >>> import numpy as np
    >>> x = np.random.default_rng(1).normal(size=500)
    >>> u = (x[:, None] - x[None, :]) / 0.5
    >>> brute = ((u**4 - 6 * u**2 + 3) * np.exp(-u**2 / 2)).sum() / np.sqrt(2 * np.pi) / (500**2 * 0.5**5)
    >>> bool(np.isclose(plugin_functional(x, 4, 0.5, device="cpu"), brute, rtol=1e-10))
    True
    """
    if isinstance(r, bool) or not isinstance(r, int | np.integer) or r < 0 or r % 2:
        raise InputError(f"'r' must be an even int ≥ 0. Got {r!r} instead.")
    g = _check_positive("g", g)
    engine = check_choice("engine", engine, ENGINES, "bandwidth")
    s = _as_1d(prepare(x, weights, device=device))
    engine = _engine_for(s, engine)
    rows = s.x.shape[0]
    with thread_policy(s.device, rows * rows / 2.0 if engine == "exact" else rows):
        return _Functional(s, engine, g)(int(r), g)

