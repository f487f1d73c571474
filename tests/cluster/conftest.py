"""Shared helpers of the clustering tests: a seeded generator that prints its seed (pytest shows it with a
failure's captured output), document 004's worked example, and direct float64 reference implementations."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def seeded(request):
    """A NumPy generator from the test's seed (printed by the root conftest; ``DENSITAS_SEED`` replays it)."""
    return np.random.default_rng(request.node.densitas_seed)


# Document 004's worked example: N = 8, d = 3, k = 4, M = 2 (1-based clusters in the paper, 0-based here).
EX_X = np.array([[1, 3, 7], [3, 5, 6], [8, 4, 9], [7, 9, 10], [4, 3, 6], [2, 6, 5], [3, 10, 1], [10, 1, 8]],
                dtype=np.float64)
EX_NN = np.array([[1, 2], [1, 3], [1, 4], [3, 1], [3, 4], [2, 3], [2, 4], [4, 2]]) - 1
EX_W = np.array([[0.9, 0.1], [0.9, 0.1], [0.85, 0.15], [0.9, 0.1], [0.75, 0.25], [0.8, 0.2], [0.85, 0.15],
                 [0.9, 0.1]])
EX_COUNTS = [4, 4, 4, 4]
EX_OFFSETS = [0, 4, 8, 12]
EX_ORDER = [[1, 2, 3, 4], [1, 6, 7, 8], [2, 4, 5, 6], [3, 5, 7, 8]]  # 1-based point numbers per cluster
EX_CENTROIDS = np.array([[4.0364, 4.1818, 7.4], [2.8378, 7.4054, 3.4324], [5.1282, 6.1795, 7.7436],
                         [8.0345, 2.5862, 7.0345]])
EX_WSUM = [2.75, 1.85, 1.95, 1.45]


def direct_memberships(D, q):
    """u_ij = 1 / Σ_l (D_ij / D_il)^(1/(q−1)), written out row by row in float64 (zero distances: 1/z each)."""
    D = np.asarray(D, dtype=np.float64)
    u = np.zeros_like(D)
    for i, row in enumerate(D):
        zero = row == 0
        if zero.any():
            u[i] = zero / zero.sum()
            continue
        for j in range(len(row)):
            u[i, j] = 1.0 / sum((row[j] / row[m]) ** (1.0 / (q - 1.0)) for m in range(len(row)))
    return u


def direct_centroids(X, nearest, weights, k):
    """Weighted means by explicit loops over the pairs (float64); NaN for a cluster with no weight."""
    d = X.shape[1]
    s = np.zeros((k, d))
    t = np.zeros(k)
    for i in range(X.shape[0]):
        for j in range(nearest.shape[1]):
            s[nearest[i, j]] += weights[i, j] * X[i]
            t[nearest[i, j]] += weights[i, j]
    with np.errstate(invalid="ignore", divide="ignore"):
        return s / t[:, None]


def direct_gfkm(X, C, M, q, iterations):
    """GFKM (document 004) in plain float64: per point, the M nearest centroids by direct differences (ties to
    the lower index), memberships, u^q-weighted means; a cluster with no weight keeps its centroid. Returns the
    centroids after each iteration."""
    X = np.asarray(X, dtype=np.float64)
    C = np.asarray(C, dtype=np.float64).copy()
    k = C.shape[0]
    out = []
    for _ in range(iterations):
        D = ((X[:, None, :] - C[None, :, :]) ** 2).sum(2)
        nn = np.argsort(D, axis=1, kind="stable")[:, :M]
        Dn = np.take_along_axis(D, nn, 1)
        w = direct_memberships(Dn, q) ** q
        new = direct_centroids(X, nn, w, k)
        C = np.where(np.isnan(new), C, new)
        out.append(C.copy())
    return out
