"""``KernelDensity``: a scikit-learn estimator with proper bandwidth selection, weights, full bandwidth matrices,
bounded domains and closed-form box integrals."""

from __future__ import annotations

import itertools
import math
from numbers import Real
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from densitas._backend.device import resolve_device
from densitas._backend.policy import thread_policy
from densitas.exceptions import InputError
from densitas.kde.evaluate import box_mass, log_density, sample_canonical
from densitas.kde.kernels import get_kernel
from densitas.kde.selectors import (
    ENGINES,
    METHODS,
    SingularCovarianceError,
    bandwidth,
    check_bandwidth_matrix,
    prepare,
)

__all__ = ["KernelDensity"]


class KernelDensity(BaseEstimator):
    """Kernel density estimate with a selected bandwidth, on the CPU or a GPU.

    Parameters
    ----------
    bandwidth : str, float or (d, d) array, default "plugin"
        A selector of :func:`densitas.kde.bandwidth` (``"plugin"``, ``"scott"``, ``"silverman"``, ``"lscv_h"``,
        ``"lscv_H"``, ``"isj"``), a float ``h`` (the kernel's standard deviation; ``H = h² I``) or a bandwidth
        matrix ``H`` (the kernel covariance). ``"plugin"`` and ``"isj"`` are univariate: on data with several
        columns they fall back to the normal-reference rule (``"scott"``); when the sample covariance is singular
        (collinear columns, fewer rows than columns) the rules use its diagonal. ``bandwidth_method_`` says which
        rule ran.
    kernel : str, default "gaussian"
        One of ``gaussian, epanechnikov, biweight, triweight, tophat, linear, cosine, exponential``. Every kernel
        is scaled to covariance ``H`` (so a bandwidth chosen for the Gaussian transfers unchanged).
    engine : {"auto", "exact", "binned"}
        Passed to the selector.
    boundary : None or "reflect"
        ``"reflect"``: the reflection estimator inside ``bounds`` — the density at ``x`` adds the density at the
        mirror images of ``x`` in each finite bound, and is 0 outside.
    bounds : None, (lo, hi) or (d, 2) array
        Limits for ``boundary="reflect"`` (±inf for an open side); None uses the observed minimum and maximum.
    device : "auto", "cpu", "cuda", …
    bandwidth_options : dict, optional
        Extra options of the selector (e.g. ``{"optimizer": "nelder-mead"}`` for ``"lscv_H"``).

    Attributes
    ----------
    bandwidth_ : (d, d) ndarray
        The kernel covariance ``H`` (always a matrix, also for one column).
    bandwidth_method_ : str
        The rule that produced ``bandwidth_`` ("given" for a numeric ``bandwidth``).
    bounds_ : (d, 2) ndarray or None
    n_features_in_ : int

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(2000, 1))
    >>> kde = KernelDensity(device="cpu").fit(X)
    >>> round(float(kde.bandwidth_[0, 0]) ** 0.5, 2)
    0.24
    >>> round(float(kde.integrate_box([-1.0], [1.0])), 2)  # N(0, 1): 0.683; the estimate is a little wider
    0.67
    """

    def __init__(self, bandwidth: Any = "plugin", *, kernel: str = "gaussian", engine: str = "auto",
                 boundary: str | None = None, bounds: Any = None, device: Any = "auto",
                 bandwidth_options: dict | None = None):
        self.bandwidth = bandwidth
        self.kernel = kernel
        self.engine = engine
        self.boundary = boundary
        self.bounds = bounds
        self.device = device
        self.bandwidth_options = bandwidth_options

    # ------------------------------------------------------------------------------------ fitting

    def _check_params(self) -> None:
        get_kernel(self.kernel)
        if self.engine not in ENGINES:
            raise InputError(f"The 'engine' parameter of KernelDensity must be one of {list(ENGINES)}. Got "
                             f"{self.engine!r} instead.")
        if self.boundary not in (None, "reflect"):
            raise InputError(f"The 'boundary' parameter of KernelDensity must be None or 'reflect'. Got "
                             f"{self.boundary!r} instead.")
        bw = self.bandwidth
        if isinstance(bw, str):
            if bw not in METHODS:
                raise InputError(f"The 'bandwidth' parameter of KernelDensity must be one of {list(METHODS)}, a "
                                 f"float > 0 or a (d, d) positive-definite matrix. Got {bw!r} instead.")
        elif isinstance(bw, Real) and not isinstance(bw, bool):
            if not (bw > 0 and math.isfinite(bw)):
                raise InputError(f"The 'bandwidth' parameter of KernelDensity must be a float > 0. Got {bw!r} "
                                 "instead.")
        elif np.ndim(bw) != 2:
            raise InputError(f"The 'bandwidth' parameter of KernelDensity must be a selector name, a float > 0 or "
                             f"a (d, d) matrix. Got {bw!r} instead.")
        if self.bandwidth_options is not None and not isinstance(self.bandwidth_options, dict):
            raise InputError("The 'bandwidth_options' parameter of KernelDensity must be a dict or None. Got "
                             f"{self.bandwidth_options!r} instead.")

    def fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> KernelDensity:
        """Select the bandwidth and keep the (weighted) sample.

        Parameters
        ----------
        X : (n, d) array-like
        y : ignored
        sample_weight : (n,) array-like, optional
            Frequency weights: integer weights are equivalent to repeated rows.
        """
        self._check_params()
        X = validate_data(self, X, dtype=np.float64, ensure_min_samples=2)
        device = resolve_device(self.device)
        s = prepare(X, sample_weight, device=device, name="X")
        d = X.shape[1]
        bw = self.bandwidth
        opts = dict(self.bandwidth_options or {})
        if isinstance(bw, str):
            method = bw if (d == 1 or bw not in ("plugin", "isj")) else "scott"
            try:
                h = bandwidth(s.x, method, engine=self.engine, weights=s.w, device=device, **opts)
            except SingularCovarianceError:
                if method not in ("scott", "silverman"):
                    raise
                # Fewer rows than columns, or collinear columns: no full normal-reference H exists; the diagonal
                # rule (a product kernel) still does. bandwidth_method_ records it.
                h = bandwidth(s.x, method, weights=s.w, device=device, covariance="diagonal")
                method += " (diagonal: the covariance is singular)"
            H = np.atleast_2d(np.asarray(h, dtype=np.float64))
            if np.ndim(h) == 0:
                with np.errstate(over="ignore", under="ignore"):
                    H = H**2
            if not (np.all(np.isfinite(H)) and np.all(np.diag(H) > 0)):
                raise InputError("The 'X' of KernelDensity gives a bandwidth matrix that float64 cannot hold (H "
                                 f"scales with the square of the data; its diagonal is {np.diag(H)}). Rescale X "
                                 "(e.g. divide by a power of ten) first.")
        else:
            method = "given"
            H = check_bandwidth_matrix(bw, d, name="bandwidth") if np.ndim(bw) else np.eye(d) * float(bw) ** 2
        self.bandwidth_ = np.array(H, dtype=np.float64).reshape(d, d)
        self.bandwidth_method_ = method
        self.bounds_ = self._resolve_bounds(s.x, d) if self.boundary == "reflect" else None
        chol = np.linalg.cholesky(self.bandwidth_)
        self._chol = torch.from_numpy(chol).to(s.x)
        self._x = s.x
        self._w = s.w
        self._z = torch.linalg.solve_triangular(self._chol, s.x.T, upper=False).T.contiguous()
        wsum = s.n
        self._logw = torch.zeros(s.x.shape[0], dtype=torch.float64, device=s.x.device) if s.w is None \
            else torch.log(s.w)
        self._log_norm = -math.log(wsum) - float(np.log(np.diag(chol)).sum())
        return self

    def _resolve_bounds(self, x: torch.Tensor, d: int) -> np.ndarray:
        lo_obs = x.min(0).values.cpu().numpy()
        hi_obs = x.max(0).values.cpu().numpy()
        if self.bounds is None:
            return np.stack([lo_obs, hi_obs], axis=1)
        b = np.asarray(self.bounds, dtype=np.float64)
        if b.shape == (2,) and d == 1:
            b = b[None, :]
        if b.shape != (d, 2):
            raise InputError(f"The 'bounds' parameter of KernelDensity must be (lo, hi) or a ({d}, 2) array. Got "
                             f"shape {b.shape}.")
        if np.any(np.isnan(b)) or np.any(b[:, 0] >= b[:, 1]):
            raise InputError(f"The 'bounds' parameter of KernelDensity must have lo < hi in every row. Got {b}.")
        outside = (lo_obs < b[:, 0]) | (hi_obs > b[:, 1])
        if outside.any():
            j = int(np.nonzero(outside)[0][0])
            raise InputError(f"Column {j} has data outside bounds {tuple(b[j])} (observed range "
                             f"[{lo_obs[j]:g}, {hi_obs[j]:g}]).")
        return b

    # ------------------------------------------------------------------------------------ queries

    def _queries(self, X: Any) -> tuple[torch.Tensor, bool]:
        check_is_fitted(self, "bandwidth_")
        as_torch = isinstance(X, torch.Tensor)
        if as_torch:
            if X.ndim != 2 or X.shape[1] != self.n_features_in_:
                raise InputError(f"X has shape {tuple(X.shape)}, but KernelDensity is expecting "
                                 f"{self.n_features_in_} features as input.")
            q = X.to(device=self._x.device, dtype=torch.float64)
            if not bool(torch.isfinite(q).all()):
                raise InputError("X holds NaN or infinity.")
        else:
            q = torch.from_numpy(validate_data(self, X, dtype=np.float64, reset=False)).to(self._x.device)
        return q, as_torch

    def _mirrors(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Affine maps x ↦ a ⊙ x + b of the reflection estimator (identity first)."""
        d = self.n_features_in_
        if self.bounds_ is None:
            return [(np.ones(d), np.zeros(d))]
        options = []
        for j in range(d):
            lo, hi = self.bounds_[j]
            opts = [(1.0, 0.0)]
            if math.isfinite(lo):
                opts.append((-1.0, 2.0 * lo))
            if math.isfinite(hi):
                opts.append((-1.0, 2.0 * hi))
            options.append(opts)
        return [(np.array([o[0] for o in combo]), np.array([o[1] for o in combo]))
                for combo in itertools.product(*options)]

    def score_samples(self, X: Any) -> Any:
        """Log-density at each row of ``X`` (−inf where the density is 0)."""
        q, as_torch = self._queries(X)
        kernel = get_kernel(self.kernel)
        total = None
        mirrors = list(self._mirrors())
        with thread_policy(q.device, q.shape[0] * self._z.shape[0] * self._z.shape[1] * len(mirrors)):
            for a, b in mirrors:
                qm = q * torch.from_numpy(a).to(q) + torch.from_numpy(b).to(q)
                zq = torch.linalg.solve_triangular(self._chol, qm.T, upper=False).T.contiguous()
                ld = log_density(zq, self._z, self._logw, kernel, self._log_norm)
                total = ld if total is None else torch.logaddexp(total, ld)
        if self.bounds_ is not None:
            bt = torch.from_numpy(self.bounds_).to(q)
            inside = ((q >= bt[:, 0]) & (q <= bt[:, 1])).all(1)
            total = torch.where(inside, total, -math.inf)
        return total if as_torch else total.cpu().numpy()

    def pdf(self, X: Any) -> Any:
        """Density at each row of ``X``."""
        s = self.score_samples(X)
        return torch.exp(s) if isinstance(s, torch.Tensor) else np.exp(s)

    def score(self, X: Any, y: Any = None) -> float:
        """Total log-likelihood of ``X``."""
        return float(_to_numpy(self.score_samples(X)).sum())

    def integrate_box(self, lo: Any, hi: Any) -> Any:
        """Probability mass of the estimate in the box ``lo ≤ x ≤ hi`` (one box: (d,) bounds → float; many:
        (m, d) → (m,)). Closed form for the Gaussian kernel (Φ differences; full H via SciPy's normal CDF)."""
        check_is_fitted(self, "bandwidth_")
        d = self.n_features_in_
        lo_a = np.asarray(lo.cpu() if isinstance(lo, torch.Tensor) else lo, dtype=np.float64)
        hi_a = np.asarray(hi.cpu() if isinstance(hi, torch.Tensor) else hi, dtype=np.float64)
        single = lo_a.ndim <= 1 and hi_a.ndim <= 1
        lo2 = np.broadcast_to(np.atleast_1d(lo_a), (1, d) if single else lo_a.shape).reshape(-1, d)
        hi2 = np.broadcast_to(np.atleast_1d(hi_a), (1, d) if single else hi_a.shape).reshape(-1, d)
        if lo2.shape != hi2.shape:
            raise InputError(f"'lo' and 'hi' must have the same shape. Got {lo_a.shape} and {hi_a.shape}.")
        if np.isnan(lo2).any() or np.isnan(hi2).any():
            raise InputError("'lo' and 'hi' must not hold NaN.")
        kernel = get_kernel(self.kernel)
        total = np.zeros(lo2.shape[0])
        if self.bounds_ is not None:
            lo2 = np.maximum(lo2, self.bounds_[:, 0])
            hi2 = np.minimum(hi2, self.bounds_[:, 1])
        empty = (hi2 <= lo2).any(1)
        for a, b in self._mirrors():
            mlo = np.where(a > 0, lo2, a * hi2 + b)
            mhi = np.where(a > 0, hi2, a * lo2 + b)
            t = box_mass(self._x, self._w, self.bandwidth_, kernel, torch.from_numpy(mlo).to(self._x),
                         torch.from_numpy(mhi).to(self._x))
            total += t.cpu().numpy()
        total = np.where(empty, 0.0, np.clip(total, 0.0, 1.0))
        return float(total[0]) if single else total

    def sample(self, n_samples: int = 1, random_state: Any = None) -> np.ndarray:
        """Draw ``n_samples`` rows from the estimate (reflected into ``bounds_`` when reflecting)."""
        check_is_fitted(self, "bandwidth_")
        if isinstance(n_samples, bool) or not isinstance(n_samples, int | np.integer) or n_samples < 1:
            raise InputError(f"'n_samples' must be an int ≥ 1. Got {n_samples!r} instead.")
        rng = check_random_state(random_state)
        gen = np.random.default_rng(rng.randint(0, 2**31 - 1))
        x = self._x.cpu().numpy()
        p = None if self._w is None else (self._w / self._w.sum()).cpu().numpy()
        idx = gen.choice(x.shape[0], size=int(n_samples), p=p)
        noise = sample_canonical(get_kernel(self.kernel), int(n_samples), x.shape[1], gen)
        out = x[idx] + noise @ np.linalg.cholesky(self.bandwidth_).T
        if self.bounds_ is not None:
            lo, hi = self.bounds_[:, 0], self.bounds_[:, 1]
            out = np.where(out < lo, 2 * lo - out, out)
            out = np.where(out > hi, 2 * hi - out, out)
        return out

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False
        return tags


def _to_numpy(a: Any) -> np.ndarray:
    return a.cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)

