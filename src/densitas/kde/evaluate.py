"""Evaluating a fitted KDE: log-density at query points, box integrals, sampling (PyTorch, any device).

All work happens in coordinates whitened by the bandwidth matrix (``z = L⁻¹x`` with ``H = L Lᵀ``), tiled over the
data so that memory stays bounded: ``m_tile × n_tile`` at a time.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from densitas.exceptions import UnsupportedQueryError
from densitas.kde._torch import _sqdist, plan_tiles
from densitas.kde.kernels import Kernel

__all__ = ["box_mass", "kernel_cdf_1d", "log_density", "sample_canonical"]

_TILE = 1 << 21  # elements per temporary at most (the memory budget may shrink it)


def log_density(zq: torch.Tensor, zx: torch.Tensor, logw: torch.Tensor, kernel: Kernel,
                log_norm: float) -> torch.Tensor:
    """``log Σ_j exp(logw_j) K(zq_i − zx_j) + log_norm`` for the canonical kernel ``K`` (identity covariance).

    ``log_norm`` carries ``−log Σw − log|L|``; ``logw`` the log weights (−inf for none).
    """
    m, d = zq.shape
    n = zx.shape[0]
    s, log_c = kernel.constants(d)
    qn, xn = (zq * zq).sum(1), (zx * zx).sum(1)
    plan = plan_tiles(m, max(1, min(n, 4096)), 4, zq.device, max_elems=_TILE)  # r², ρ, log K, log K + log w
    cols = plan.cols
    out = torch.empty(m, dtype=torch.float64, device=zq.device)
    for block in plan.rows:
        i0, i1 = block.start, block.stop
        acc = torch.full((i1 - i0,), -math.inf, dtype=torch.float64, device=zq.device)
        for j0 in range(0, n, cols):
            j1 = min(n, j0 + cols)
            r2 = _sqdist(zq[i0:i1], zx[j0:j1], qn[i0:i1], xn[j0:j1])
            rho = torch.sqrt(r2) * s
            if kernel.log_profile is not None:
                lk = kernel.log_profile(rho)
            else:
                lk = torch.log(kernel.profile(rho))
            acc = torch.logaddexp(acc, torch.logsumexp(lk + logw[None, j0:j1], dim=1))
        out[i0:i1] = acc
    return out + (log_c + log_norm)


@functools.cache
def _cdf_table(name: str, kernel: Kernel) -> tuple[np.ndarray, np.ndarray]:
    s, log_c = kernel.constants(1)
    half = kernel.support(1) if kernel.compact else 60.0 / s
    u = np.linspace(-half, half, 400_001)
    dens = np.exp(log_c) * kernel.profile(torch.from_numpy(np.abs(u) * s)).numpy()
    from scipy.integrate import cumulative_trapezoid

    cdf = cumulative_trapezoid(dens, u, initial=0.0)
    return u, cdf / cdf[-1]


def kernel_cdf_1d(kernel: Kernel, t: torch.Tensor) -> torch.Tensor:
    """CDF of the canonical 1-D kernel (unit variance): closed form for the Gaussian, tabulated otherwise."""
    if kernel.name == "gaussian":
        return torch.special.ndtr(t)
    u, cdf = _cdf_table(kernel.name, kernel)
    tn = t.detach().cpu().numpy()
    return torch.from_numpy(np.interp(tn, u, cdf, left=0.0, right=1.0)).to(t)


def box_mass(x: torch.Tensor, w: torch.Tensor | None, H: np.ndarray, kernel: Kernel, lo: torch.Tensor,
             hi: torch.Tensor) -> torch.Tensor:
    """Mass of the KDE in boxes ``[lo_b, hi_b]`` (b = 1…B): ``Σ_i w_i P(lo_b ≤ x_i + ε ≤ hi_b) / Σ w``.

    Gaussian kernel: closed form (products of Φ differences) for a diagonal ``H``; a full ``H`` uses SciPy's
    multivariate normal CDF over the box corners (inclusion–exclusion). Other kernels: 1-D only (tabulated CDF).
    """
    n, d = x.shape
    wt = torch.ones(n, dtype=torch.float64, device=x.device) if w is None else w
    wsum = wt.sum()
    diag = np.allclose(H, np.diag(np.diag(H)), rtol=0, atol=0)
    if kernel.name != "gaussian" and d > 1:
        raise UnsupportedQueryError(f"Box integrals of the {kernel.name!r} kernel are implemented in one dimension; "
                                    f"the data have {d}. Use kernel='gaussian'.")
    if diag or d == 1:
        sd = torch.from_numpy(np.sqrt(np.diag(H))).to(x)
        out = torch.empty(lo.shape[0], dtype=torch.float64, device=x.device)
        # Per box: the standardised lower and upper ends, their two CDFs and the product, n × d each.
        for block in plan_tiles(lo.shape[0], max(n * d, 1), 5, x.device, max_elems=_TILE).rows:
            b0, b1 = block.start, block.stop
            a = (lo[b0:b1, None, :] - x[None]) / sd
            b = (hi[b0:b1, None, :] - x[None]) / sd
            p = (kernel_cdf_1d(kernel, b) - kernel_cdf_1d(kernel, a)).clamp_min_(0.0).prod(-1)
            out[b0:b1] = (p @ wt) / wsum
        return out
    from scipy.stats import multivariate_normal

    mvn = multivariate_normal(mean=np.zeros(d), cov=H)
    xn = x.cpu().numpy()
    wn = wt.cpu().numpy()
    res = np.empty(lo.shape[0])
    lon, hin = lo.cpu().numpy(), hi.cpu().numpy()
    corners = np.array(np.meshgrid(*[[0, 1]] * d, indexing="ij")).reshape(d, -1).T
    for b in range(lo.shape[0]):
        total = np.zeros(n)
        for c in corners:
            pt = np.where(c == 1, hin[b], lon[b])
            sign = (-1) ** int(d - c.sum())
            if np.any(np.isneginf(pt)):
                continue
            total += sign * np.atleast_1d(mvn.cdf(np.minimum(pt, 1e300) - xn))
        res[b] = float(np.clip(total, 0.0, None) @ wn) / float(wn.sum())
    return torch.from_numpy(res).to(x)


@functools.cache
def _radius_table(name: str, kernel: Kernel, d: int) -> tuple[np.ndarray, np.ndarray]:
    s, _ = kernel.constants(d)
    rmax = kernel.radius if kernel.compact else 80.0
    rho = np.linspace(0.0, rmax, 200_001)
    dens = rho ** (d - 1) * kernel.profile(torch.from_numpy(rho)).numpy()
    from scipy.integrate import cumulative_trapezoid

    cdf = cumulative_trapezoid(dens, rho, initial=0.0)
    return cdf / cdf[-1], rho / s


def sample_canonical(kernel: Kernel, n: int, d: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` draws from the canonical ``d``-dimensional kernel (identity covariance)."""
    if kernel.name == "gaussian":
        return rng.standard_normal((n, d))
    direction = rng.standard_normal((n, d))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    cdf, radius = _radius_table(kernel.name, kernel, d)
    r = np.interp(rng.uniform(size=n), cdf, radius)
    return direction * r[:, None]
