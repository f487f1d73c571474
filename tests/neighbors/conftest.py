"""Shared helpers of the neighbours tests: a seeded generator that prints its seed (shown on failure), the direct
float64 reference implementation, and the tie-aware comparison of neighbour lists."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def seeded(request):
    """A NumPy generator from the test's seed (printed by the root conftest; ``DENSITAS_SEED`` replays it)."""
    return np.random.default_rng(request.node.densitas_seed)


def direct_distances(X, Y, metric, *, nominal=(), skip=False):
    """Float64 brute force written out coordinate by coordinate: (len(Y), len(X)) distances.

    ``nominal`` lists the nominal column positions (compared for equality; NaN or None = missing). With
    ``skip`` a coordinate pair with a missing value on either side is left out; no pair left gives NaN.
    """
    X = np.asarray(X, dtype=object)
    Y = np.asarray(Y, dtype=object)
    n, d = X.shape
    out = np.empty((len(Y), n))

    def is_missing(v):
        return v is None or (isinstance(v, float) and np.isnan(v))

    for a in range(len(Y)):
        for b in range(n):
            s = 0.0
            used = 0
            qa, cb = [], []
            for j in range(d):
                u, v = Y[a, j], X[b, j]
                if is_missing(u) or is_missing(v):
                    if not skip:
                        raise ValueError("missing value")
                    continue
                used += 1
                if j in nominal:
                    s += float(u != v)
                elif metric == "manhattan":
                    s += abs(float(u) - float(v))
                else:
                    s += (float(u) - float(v)) ** 2
                if metric == "cosine":
                    qa.append(float(u))
                    cb.append(float(v))
            if used == 0:
                out[a, b] = np.nan
            elif metric == "cosine":
                qa_, cb_ = np.array(qa), np.array(cb)
                nq, nc = np.sqrt((qa_**2).sum()), np.sqrt((cb_**2).sum())
                out[a, b] = 1.0 if nq == 0 or nc == 0 else 1.0 - float(qa_ @ cb_) / (nq * nc)
            elif metric in ("euclidean", "mixed_euclidean"):
                out[a, b] = np.sqrt(s)
            else:
                out[a, b] = s
    return out


def reference_knn(D, k):
    """Top-k of a full distance matrix, ordered by (distance, index), NaN last."""
    key = np.where(np.isnan(D), np.inf, D)
    cols = np.broadcast_to(np.arange(D.shape[1]), D.shape)
    order = np.lexsort((cols, key), axis=1)[:, :k]
    return np.take_along_axis(D, order, 1), order


def assert_same_neighbours(d, i, d_ref, i_ref, *, rtol=1e-9, atol=1e-12, what=""):
    """Distances equal; neighbour sets equal up to ties (rows may differ only among references tied, within
    tolerance, with the k-th distance)."""
    d, i, d_ref, i_ref = map(np.asarray, (d, i, d_ref, i_ref))
    assert d.shape == d_ref.shape and i.shape == i_ref.shape, what
    both_nan = np.isnan(d) & np.isnan(d_ref)
    assert np.allclose(np.where(both_nan, 0, d), np.where(both_nan, 0, d_ref), rtol=rtol, atol=atol,
                       equal_nan=False), f"{what}: distances differ"
    for row in range(i.shape[0]):
        a, b = set(i[row].tolist()), set(i_ref[row].tolist())
        if a == b:
            continue
        kth = d_ref[row, -1]
        tie = np.isclose(d_ref[row], kth, rtol=rtol, atol=atol)
        strict_ref = set(i_ref[row][~tie].tolist())
        strict = set(i[row][~np.isclose(d[row], kth, rtol=rtol, atol=atol)].tolist())
        assert strict == strict_ref, f"{what}: row {row} neighbours {sorted(a)} vs {sorted(b)}"
