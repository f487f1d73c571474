"""Kernels: the Gaussian and its derivatives (bandwidth selection), and a registry of evaluation kernels.

Every evaluation kernel is radially symmetric and scaled to the *canonical* form with identity covariance, so
that a bandwidth matrix ``H`` is the kernel's covariance whatever the kernel (KDEpy's convention; a bandwidth
chosen for the Gaussian transfers unchanged). In ``d`` dimensions, with ``r² = uᵀH⁻¹u``:

    K_H(u) = |H|^(−1/2) · c_d · k(r · s_d)

where ``k`` is the kernel's radial profile on ``[0, R]``, ``s_d`` the scale that makes the per-coordinate
variance 1 and ``c_d`` the normalising constant. Both come from one-dimensional integrals (closed form for the
Gaussian, :func:`scipy.integrate.quad` for the others, cached per dimension).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from densitas.exceptions import InputError

__all__ = ["KERNELS", "Kernel", "gaussian_derivative_at_zero", "get_kernel", "hermite_even_coefficients"]

SQRT_2PI = math.sqrt(2.0 * math.pi)


def hermite_even_coefficients(r: int) -> list[float]:
    """Coefficients ``c_m`` of the probabilists' Hermite polynomial ``He_r(u) = Σ_m c_m u^(2m)``, even ``r``.

    The Gaussian's r-th derivative is ``φ⁽ʳ⁾(u) = (−1)^r He_r(u) φ(u)``.

    Examples
    --------
    >>> hermite_even_coefficients(4)
    [3.0, -6.0, 1.0]
    >>> hermite_even_coefficients(6)
    [-15.0, 45.0, -15.0, 1.0]
    """
    if r < 0 or r % 2:
        raise InputError(f"The derivative order 'r' must be an even int ≥ 0. Got {r!r} instead.")
    # He_r(u) = r! Σ_{m=0}^{r/2} (−1)^m u^(r−2m) / (m! (r−2m)! 2^m); collect by power u^(2p), p = r/2 − m.
    half = r // 2
    coefs = [0.0] * (half + 1)
    for m in range(half + 1):
        p = half - m
        coefs[p] = float((-1) ** m * math.factorial(r) // (math.factorial(m) * math.factorial(r - 2 * m) * 2**m))
    return coefs


def gaussian_derivative_at_zero(r: int) -> float:
    """``φ⁽ʳ⁾(0)`` for even ``r``: ``(−1)^(r/2) (r − 1)!! / √(2π)``. (K⁽⁴⁾(0) = 3/√(2π), K⁽⁶⁾(0) = −15/√(2π).)"""
    return hermite_even_coefficients(r)[0] / SQRT_2PI


# --------------------------------------------------------------------------------- evaluation kernels


@dataclass(frozen=True)
class Kernel:
    """A radially symmetric kernel given by its profile ``k(ρ)`` on ``0 ≤ ρ ≤ radius``."""

    name: str
    profile: Callable[[torch.Tensor], torch.Tensor]  # k(ρ), ρ ≥ 0
    radius: float  # support radius of the profile (math.inf for the Gaussian and exponential)
    log_profile: Callable[[torch.Tensor], torch.Tensor] | None = None  # log k(ρ) where it is smooth

    @property
    def compact(self) -> bool:
        return math.isfinite(self.radius)

    def constants(self, d: int) -> tuple[float, float]:
        """``(scale s_d, log c_d)`` of the canonical (identity-covariance) kernel in ``d`` dimensions."""
        return _constants(self.name, d)

    def support(self, d: int) -> float:
        """Support radius in Mahalanobis units (``r`` such that the kernel vanishes beyond it)."""
        s, _ = self.constants(d)
        return self.radius / s


def _np_profile(name: str) -> Callable[[float], float]:
    import numpy as np

    return {
        "gaussian": lambda p: np.exp(-0.5 * p * p),
        "epanechnikov": lambda p: 1.0 - p * p,
        "biweight": lambda p: (1.0 - p * p) ** 2,
        "triweight": lambda p: (1.0 - p * p) ** 3,
        "tophat": lambda p: 1.0,
        "linear": lambda p: 1.0 - p,
        "cosine": lambda p: np.cos(0.5 * np.pi * p),
        "exponential": lambda p: np.exp(-p),
    }[name]


@functools.cache
def _constants(name: str, d: int) -> tuple[float, float]:
    log_sphere = math.log(2.0) + 0.5 * d * math.log(math.pi) - math.lgamma(0.5 * d)  # surface of S^(d−1)
    if name == "gaussian":
        return 1.0, -0.5 * d * math.log(2.0 * math.pi)
    from scipy import integrate

    k = _np_profile(name)
    radius = KERNELS[name].radius
    upper = radius if math.isfinite(radius) else math.inf
    m0 = integrate.quad(lambda p: p ** (d - 1) * k(p), 0.0, upper, epsabs=0, epsrel=1e-13, limit=200)[0]
    m2 = integrate.quad(lambda p: p ** (d + 1) * k(p), 0.0, upper, epsabs=0, epsrel=1e-13, limit=200)[0]
    var = m2 / (d * m0)  # per-coordinate variance of the density ∝ k(‖u‖)
    s = math.sqrt(var)
    # Density of u' = u / s: s^d k(s‖u'‖) / (S_{d−1} m0).
    log_c = d * math.log(s) - log_sphere - math.log(m0)
    return s, log_c


def _poly(p: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def f(rho: torch.Tensor) -> torch.Tensor:
        v = (1.0 - rho * rho).clamp_min(0.0)
        return v**p if p != 1 else v

    return f


KERNELS: dict[str, Kernel] = {
    "gaussian": Kernel("gaussian", lambda p: torch.exp(-0.5 * p * p), math.inf, lambda p: -0.5 * p * p),
    "epanechnikov": Kernel("epanechnikov", _poly(1), 1.0),
    "biweight": Kernel("biweight", _poly(2), 1.0),
    "triweight": Kernel("triweight", _poly(3), 1.0),
    "tophat": Kernel("tophat", lambda p: (p <= 1.0).to(p.dtype), 1.0),
    "linear": Kernel("linear", lambda p: (1.0 - p).clamp_min(0.0), 1.0),
    "cosine": Kernel("cosine", lambda p: torch.where(p <= 1.0, torch.cos(0.5 * math.pi * p), 0.0), 1.0),
    "exponential": Kernel("exponential", lambda p: torch.exp(-p), math.inf, lambda p: -p),
}


def get_kernel(name: str, owner: str = "KernelDensity") -> Kernel:
    """Look ``name`` up in :data:`KERNELS`, with an error that lists the choices."""
    if not isinstance(name, str) or name not in KERNELS:
        raise InputError(f"The 'kernel' parameter of {owner} must be one of {sorted(KERNELS)}. Got {name!r} instead.")
    return KERNELS[name]
