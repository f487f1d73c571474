"""Exact O(n²) pair sums behind the bandwidth selectors (one heavy operation, two implementations).

* ``kde_hermite_pairsum`` — 1-D: ``Σ_{i<j} w_i w_j He_r(u_ij) φ(u_ij)·√(2π)`` for the plug-in functionals Ψ̂_r.
* ``kde_gauss_pairsum`` — d-D: ``Σ_{i<j} w_i w_j exp(−a_k ‖z_i − z_j‖²)`` for many ``a_k`` in one pass (LSCV).
* ``kde_gauss_pairsum_grad`` — the same sums with second moments, for the gradient of LSCV(H).

Each has a PyTorch implementation (:mod:`._torch`, the CPU path and test oracle) and a Triton kernel
(:mod:`._triton`), registered when :mod:`densitas.kde` is imported; :func:`densitas._backend.dispatch.select`
picks one. Memory stays O(n + tile).

The 1-D sums run on sorted data and skip pairs farther apart than ``u_cut·g``, where ``u_cut`` is chosen so
that all skipped terms together are below 10⁻¹⁵ of the diagonal term ``Σ w_i² |K⁽ʳ⁾(0)|`` — far below float64
rounding of the result, so the sum stays exact while most pairs of a large sample are never visited.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from densitas._backend.dispatch import select
from densitas.kde.kernels import SQRT_2PI, gaussian_derivative_at_zero, hermite_even_coefficients

__all__ = ["gauss_grad_sums", "gauss_sums", "hermite_cutoff", "hermite_sum"]

PRUNE_TOLERANCE = 1e-15


@functools.cache
def _tail_envelope(r: int) -> tuple[np.ndarray, np.ndarray]:
    coefs = hermite_even_coefficients(r)
    u = np.linspace(0.0, 60.0, 60001)
    he = np.polynomial.polynomial.polyval(u * u, coefs)
    env = np.abs(he) * np.exp(-0.5 * u * u) / SQRT_2PI
    return u, np.maximum.accumulate(env[::-1])[::-1]  # max over v ≥ u (non-increasing)


def hermite_cutoff(r: int, n_eff2: float, diag: float) -> float:
    """Smallest ``u`` beyond which ``n_eff2 · max_{|v|≥u} |He_r(v)| φ(v) ≤ PRUNE_TOLERANCE · diag``."""
    u, tail = _tail_envelope(r)
    k = int(np.searchsorted(-tail, -PRUNE_TOLERANCE * diag / n_eff2, side="left"))
    return float(u[k]) if k < u.size else math.inf


def hermite_sum(xs: torch.Tensor, w: torch.Tensor | None, g: float, r: int, *, prune: bool = True) -> float:
    """``Σ_i Σ_j w_i w_j K⁽ʳ⁾((x_i − x_j)/g)`` over all ordered pairs (diagonal included), ``K = φ``, even ``r``.

    ``xs`` must be sorted ascending (and should be centred: the Triton path works in float32).
    """
    n = xs.shape[0]
    sw2 = float(n) if w is None else float((w.to(torch.float64) ** 2).sum())
    sw = float(n) if w is None else float(w.to(torch.float64).sum())
    k0 = gaussian_derivative_at_zero(r)
    diag = sw2 * k0
    jmax = None
    if prune:
        cut = hermite_cutoff(r, sw * sw, sw2 * abs(k0))
        if math.isfinite(cut):
            jmax = torch.searchsorted(xs, xs + cut * g, right=True) - 1
            jmax = torch.maximum(jmax, torch.arange(n, device=xs.device))
    _, fn = select("kde_hermite_pairsum", xs.device)
    upper = fn(xs, w, 1.0 / g, hermite_even_coefficients(r), jmax)
    return diag + 2.0 * upper / SQRT_2PI


def gauss_sums(z: torch.Tensor, w: torch.Tensor | None, a: torch.Tensor | list[float], *,
               chain: bool = False) -> torch.Tensor:
    """(K, 2) float64: ``Σ_{i<j} w_i w_j exp(−a_k Y_ij)`` and ``Σ_{i<j} w_i w_j exp(−2 a_k Y_ij)``."""
    a_t = torch.as_tensor(a, dtype=torch.float64).reshape(-1)
    _, fn = select("kde_gauss_pairsum", z.device)
    return fn(z, w, a_t, chain)


def gauss_grad_sums(z: torch.Tensor, w: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(S, A)``: see :func:`densitas.kde._torch.gauss_pairsum_grad`."""
    _, fn = select("kde_gauss_pairsum_grad", z.device)
    return fn(z, w)
