"""histogram (plain and linear binning), summed-area tables and box sums, on both backends."""

from __future__ import annotations

import numpy as np
import pytest

from densitas import InputError
from densitas import primitives as P


@pytest.mark.parametrize("n", [1, 2, 65, 1000])
def test_histogram_matches_numpy(backend, rng, n):
    x = rng.uniform(-0.2, 1.2, n)
    x[: n // 5] = np.round(x[: n // 5] * 10) / 10  # values on bin edges
    if n > 3:
        x[3] = np.nan
    for bins in (1, 7, 10):
        h, e = P.histogram(x, bins, (0.0, 1.0))
        hn, en = np.histogram(x[~np.isnan(x)], bins, (0.0, 1.0))
        assert np.array_equal(h, hn) and np.allclose(e, en)
    w = rng.random(n).astype(np.float32)
    h, _ = P.histogram(x, 10, (0.0, 1.0), weights=w)
    ok = ~np.isnan(x)
    assert h.dtype == np.float32 and np.allclose(h, np.histogram(x[ok], 10, (0.0, 1.0), weights=w[ok])[0], rtol=1e-5)
    ints = rng.integers(0, 11, n)
    assert np.array_equal(P.histogram(ints, 10, (0, 10))[0], np.histogram(ints, 10, (0, 10))[0])


def test_histogram_2d_matches_histogramdd(backend, rng):
    x = rng.standard_normal((500, 2))
    h, edges = P.histogram(x, (6, 9), [(-2, 2), (-1, 3)])
    hn, en = np.histogramdd(x, (6, 9), [(-2, 2), (-1, 3)])
    assert np.array_equal(h, hn) and all(np.allclose(a, b) for a, b in zip(edges, en, strict=True))


def linear_binning_reference(x, bins, lo, hi, w=None):
    """Per-point loop: each point splits its weight between its two neighbouring grid points."""
    x = np.atleast_2d(np.asarray(x, dtype=np.float64).T).T
    d = x.shape[1]
    out = np.zeros(bins)
    w = np.ones(len(x)) if w is None else w
    for p, wp in zip(x, w, strict=True):
        if not all(lo[k] <= p[k] <= hi[k] for k in range(d)):
            continue
        parts = []
        for k in range(d):
            delta = (hi[k] - lo[k]) / (bins[k] - 1)
            i = min(int(np.floor((p[k] - lo[k]) / delta)), bins[k] - 2)
            f = (p[k] - lo[k]) / delta - i
            parts.append([(i, 1 - f), (i + 1, f)])
        for corner in range(1 << d):
            idx, wt = [], wp
            for k in range(d):
                j, f = parts[k][(corner >> k) & 1]
                idx.append(j)
                wt *= f
            out[tuple(idx)] += wt
    return out


@pytest.mark.parametrize("n", [1, 2, 65, 400])
def test_linear_binning(backend, rng, n):
    x = rng.uniform(-0.1, 1.1, n)
    x[0] = 1.0  # the upper end belongs to the last grid point
    g, pts = P.histogram(x, 11, (0.0, 1.0), linear=True)
    assert g.dtype == np.float64 and np.allclose(pts, np.linspace(0, 1, 11))
    assert np.allclose(g, linear_binning_reference(x, (11,), (0.0,), (1.0,)), atol=1e-12)
    inside = (x >= 0) & (x <= 1)
    assert abs(g.sum() - inside.sum()) < 1e-9  # mass is conserved
    assert abs((g * pts).sum() - x[inside].sum()) < 1e-9  # and so is the first moment
    w = rng.random(n)
    gw, _ = P.histogram(x, 11, (0.0, 1.0), linear=True, weights=w)
    assert np.allclose(gw, linear_binning_reference(x, (11,), (0.0,), (1.0,), w), atol=1e-12)
    x2 = rng.uniform(-0.1, 1.1, (n, 2))
    g2, _ = P.histogram(x2, (5, 7), [(0, 1), (0, 1)], linear=True)
    assert np.allclose(g2, linear_binning_reference(x2, (5, 7), (0, 0), (1, 1)), atol=1e-12)
    x3 = rng.uniform(0, 1, (n, 3))
    g3, _ = P.histogram(x3, 4, [(0, 1)] * 3, linear=True)
    assert np.allclose(g3, linear_binning_reference(x3, (4, 4, 4), (0,) * 3, (1,) * 3), atol=1e-12)


def test_histogram_errors():
    with pytest.raises(InputError, match="'range' parameter is required"):
        P.histogram([1.0], 4, None)
    with pytest.raises(InputError, match="finite lo < hi"):
        P.histogram([1.0], 4, (2.0, 1.0))
    with pytest.raises(InputError, match="'bins' parameter must be ≥ 2 with linear=True"):
        P.histogram([1.0], 1, (0.0, 2.0), linear=True)
    with pytest.raises(InputError, match="'weights' must have len"):
        P.histogram([1.0, 2.0], 4, (0.0, 2.0), weights=[1.0])


def test_document_002_summed_area_table(backend):
    a = np.array([[2, 1, 0, 0], [0, 1, 2, 0], [1, 2, 3, 1], [1, 1, 0, 2]])
    sat = P.summed_area_table(a)
    assert np.array_equal(sat, a.cumsum(0).cumsum(1))
    assert sat[-1].tolist() == [4, 9, 14, 17] and sat.dtype == np.int64


@pytest.mark.parametrize("shape", [(1,), (50,), (1, 1), (9, 17), (33, 40), (2, 9, 11)])
def test_sat_and_box_sum(backend, rng, shape):
    a = rng.standard_normal(shape).astype(np.float32)
    sat = P.summed_area_table(a)
    want = a.astype(np.float64)
    for ax in range(a.ndim):
        want = np.cumsum(want, axis=ax)
    assert sat.dtype == np.float32 and np.allclose(sat, want, atol=1e-4)
    sat64 = P.summed_area_table(a, dtype="float64")
    assert sat64.dtype == np.float64 and np.allclose(sat64, want, atol=1e-9)
    m = 25
    lo = np.stack([rng.integers(0, s, m) for s in shape], 1)
    hi = np.stack([rng.integers(lo[:, k], s) for k, s in enumerate(shape)], 1)
    got = P.box_sum(sat64, lo, hi)
    direct = [a.astype(np.float64)[tuple(slice(a0, b0 + 1) for a0, b0 in zip(lo[i], hi[i], strict=True))].sum()
              for i in range(m)]
    assert np.allclose(got, direct, atol=1e-9)
    assert np.isclose(P.box_sum(sat64, lo[0], hi[0]), direct[0])


def test_sat_errors():
    sat = P.summed_area_table(np.ones((3, 3)))
    with pytest.raises(InputError, match="'lo' must be ≥ 0"):
        P.box_sum(sat, [[-1, 0]], [[1, 1]])
    with pytest.raises(InputError, match="'hi' must be < the table's shape"):
        P.box_sum(sat, [[0, 0]], [[3, 1]])
    with pytest.raises(InputError, match="'lo' must be ≤ 'hi'; box 0"):
        P.box_sum(sat, [[2, 0]], [[1, 1]])
    with pytest.raises(InputError, match="must have 1 or 2 or 3 dimension"):
        P.summed_area_table(np.ones((2, 2, 2, 2)))
