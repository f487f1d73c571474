"""Brute-force NumPy references for the bandwidth selectors (float64, all ordered pairs, row blocks)."""

from __future__ import annotations

import math

import numpy as np
from numpy.polynomial import hermite_e

__all__ = ["lscv_bruteforce", "plugin_bruteforce", "psi_bruteforce"]

_BLOCK = 512


def psi_bruteforce(x: np.ndarray, r: int, g: float, w: np.ndarray | None = None) -> float:
    """Ψ̂_r(g) = n⁻² g^(−r−1) Σᵢ Σⱼ wᵢ wⱼ φ⁽ʳ⁾((xᵢ − xⱼ)/g), with φ⁽ʳ⁾(u) = He_r(u) φ(u) for even r."""
    x = np.asarray(x, dtype=np.float64)
    w = np.ones_like(x) if w is None else np.asarray(w, dtype=np.float64)
    coef = [0.0] * r + [1.0]
    total = 0.0
    for i0 in range(0, x.size, _BLOCK):
        u = (x[i0:i0 + _BLOCK, None] - x[None, :]) / g
        k = hermite_e.hermeval(u, coef) * np.exp(-0.5 * u * u) / math.sqrt(2 * math.pi)
        total += float(w[i0:i0 + _BLOCK] @ k @ w)
    n = w.sum()
    return total / (n * n * g ** (r + 1))


def plugin_bruteforce(x: np.ndarray, w: np.ndarray | None = None) -> float:
    """The two-stage direct plug-in bandwidth (digest steps 1-7) with brute-force functionals."""
    x = np.asarray(x, dtype=np.float64)
    w = np.ones_like(x) if w is None else np.asarray(w, dtype=np.float64)
    n = w.sum()
    m = (w * x).sum() / n
    sd = math.sqrt((w * (x - m) ** 2).sum() / (n - 1))
    psi8 = 105 / (32 * math.sqrt(math.pi) * sd**9)
    g1 = (2 * 15 / math.sqrt(2 * math.pi) / (psi8 * n)) ** (1 / 9)
    psi6 = psi_bruteforce(x, 6, g1, w)
    g2 = (-2 * 3 / math.sqrt(2 * math.pi) / (psi6 * n)) ** (1 / 7)
    psi4 = psi_bruteforce(x, 4, g2, w)
    return (1 / (2 * math.sqrt(math.pi)) / (psi4 * n)) ** 0.2


def _gauss_density(diff: np.ndarray, H: np.ndarray) -> np.ndarray:
    d = H.shape[0]
    hinv = np.linalg.inv(H)
    q = np.einsum("...a,ab,...b->...", diff, hinv, diff)
    return np.exp(-0.5 * q) / math.sqrt((2 * math.pi) ** d * np.linalg.det(H))


def lscv_bruteforce(x: np.ndarray, H: np.ndarray | float, w: np.ndarray | None = None, *,
                    terms: bool = False) -> float | tuple[float, float]:
    """LSCV(H) = n⁻² ΣᵢΣⱼ φ_{2H}(xᵢ−xⱼ) − 2/(n(n−1)) Σ_{i≠j} φ_H(xᵢ−xⱼ), frequency weights (copies of a row are
    distinct samples at distance 0). ``terms=True`` returns the two terms (their sizes bound the rounding error of
    the difference, which crosses zero as H grows)."""
    x = np.asarray(x, dtype=np.float64)
    x2 = x[:, None] if x.ndim == 1 else x
    H = np.array([[float(H) ** 2]]) if np.ndim(H) == 0 else np.asarray(H, dtype=np.float64)
    w = np.ones(x2.shape[0]) if w is None else np.asarray(w, dtype=np.float64)
    n = w.sum()
    t1 = t2 = 0.0
    for i0 in range(0, x2.shape[0], _BLOCK):
        diff = x2[i0:i0 + _BLOCK, None, :] - x2[None, :, :]
        wi = w[i0:i0 + _BLOCK]
        t1 += float(wi @ _gauss_density(diff, 2 * H) @ w)
        t2 += float(wi @ _gauss_density(diff, H) @ w)
    t2 -= float(w.sum()) * float(_gauss_density(np.zeros((1, H.shape[0])), H)[0])
    if terms:
        return t1 / (n * n), 2 * t2 / (n * (n - 1))
    return t1 / (n * n) - 2 * t2 / (n * (n - 1))
