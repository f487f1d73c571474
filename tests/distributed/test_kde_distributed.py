"""bandwidth_dask: every selector on Dask data gives the single-machine bandwidth (1e-6 relative or better), and its
distributed pieces (pair sums from blocks and pairs of blocks, summed binning, exact weighted quantiles) equal
independent float64 references."""

from __future__ import annotations

import numpy as np
import pytest

from densitas.exceptions import DensitasError
from densitas.kde import bandwidth
from densitas.kde.distributed import DaskSample, bandwidth_dask
from densitas.kde.selectors import METHODS, DegenerateBandwidthWarning

da = pytest.importorskip("dask.array")
dd = pytest.importorskip("dask.dataframe")


def bimodal(rng, n):
    return np.r_[rng.normal(size=n - n // 3), rng.normal(size=n // 3) * 0.4 + 3.0]


def assert_same(a, b, rtol=1e-6):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=rtol, atol=0)


@pytest.mark.parametrize(("method", "engine", "weighted"), [
    ("plugin", "exact", False),  # Hermite sums over blocks and unions of blocks
    ("plugin", "binned", True),  # linear binning summed over blocks
    ("isj", "auto", False),
    ("silverman", "auto", True),  # exact weighted quantiles (IQR) by bisection
    ("lscv_h", "exact", False),  # the pair-distance histogram over blocks (CPU)
])
def test_univariate_selectors_equal_single_machine(rng, scheduler, method, engine, weighted):
    x = bimodal(rng, 700)
    w = rng.uniform(0.5, 2.0, size=len(x)) if weighted else None
    one = bandwidth(x, method, engine=engine, weights=w, device="cpu")
    xd = da.from_array(x, chunks=((250, 1, 249, 200),))
    wd = None if w is None else da.from_array(w, chunks=300)  # other chunks than x: rechunked to x's
    assert_same(one, bandwidth_dask(xd, method, engine=engine, weights=wd, device="cpu"))


@pytest.mark.parametrize("method", METHODS)  # every registered selector: a new one is covered (or fails) here
def test_every_registered_selector(rng, method):
    x = bimodal(rng, 300)
    assert_same(bandwidth(x, method, device="cpu"), bandwidth_dask(da.from_array(x, chunks=110), method,
                                                                     device="cpu"))


def test_multivariate_and_dataframe_selectors(rng, client):
    X = rng.normal(size=(400, 2)) @ np.array([[1.0, 0.6], [0.0, 0.8]])
    frame = dd.from_pandas(__import__("pandas").DataFrame(X, columns=["a", "b"]), npartitions=3)
    assert_same(bandwidth(X, "lscv_h", engine="exact", device="cpu"),
                bandwidth_dask(frame, "lscv_h", engine="exact", device="cpu"))
    assert_same(bandwidth(X, "scott", device="cpu"), bandwidth_dask(frame, "scott", device="cpu"), rtol=1e-12)
    one_col = X[:, :1]
    assert_same(bandwidth(one_col, "plugin", device="cpu"),
                bandwidth_dask(da.from_array(one_col, chunks=150), "plugin", device="cpu"))


def test_lscv_full_matrix_equals_single_machine(rng):
    X = rng.normal(size=(150, 2)) @ np.array([[1.0, -0.4], [0.0, 0.7]])
    one = bandwidth(X, "lscv_H", device="cpu")
    many = bandwidth_dask(da.from_array(X, chunks=60), "lscv_H", device="cpu")
    assert_same(one, many)


def test_pair_sums_over_blocks_equal_brute_force(rng):
    z = rng.normal(size=(90, 2))
    w = rng.uniform(0.1, 3.0, size=90)
    s = DaskSample.prepare(da.from_array(z, chunks=((20, 31, 39), 2)), da.from_array(w, chunks=45), device="cpu")
    a = np.array([0.3, 1.7])
    got = s.x.pair_sum("gauss", (a, False)).reshape(-1, 2)
    Y = ((z[:, None, :] - z[None, :, :]) ** 2).sum(-1)
    iu = np.triu_indices(90, 1)
    ww = (w[:, None] * w[None, :])[iu]
    want = np.array([[np.sum(ww * np.exp(-ak * Y[iu])), np.sum(ww * np.exp(-2 * ak * Y[iu]))] for ak in a])
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_weighted_order_statistics_equal_repeated_rows(rng):
    x = np.round(rng.normal(size=57), 1)  # ties
    reps = rng.integers(1, 4, size=57)
    s = DaskSample.prepare(da.from_array(x, chunks=20), da.from_array(reps.astype(float), chunks=20), device="cpu")
    from densitas.kde.distributed import _weighted_quantile

    for q in (0.1, 0.25, 0.5, 0.75, 0.93):
        assert _weighted_quantile(s.x, s.w, q) == pytest.approx(np.quantile(np.repeat(x, reps), q), abs=1e-12)


def test_extreme_scale_and_tied_columns_as_single_machine(rng):
    x = bimodal(rng, 600) * 1e300  # moments would overflow unscaled: the selectors' powers-of-two scaling
    for method in ("plugin", "scott"):
        assert_same(bandwidth(x, method, device="cpu"), bandwidth_dask(da.from_array(x, chunks=200), method,
                                                                         device="cpu"), rtol=1e-12)
    X = np.c_[np.round(rng.normal(size=400)), rng.normal(size=400)]  # column 0 tied: LSCV degenerate along it
    with pytest.warns(DegenerateBandwidthWarning):
        one = bandwidth(X, "lscv_h", device="cpu")
    with pytest.warns(DegenerateBandwidthWarning):
        many = bandwidth_dask(da.from_array(X, chunks=150), "lscv_h", device="cpu")
    assert_same(one, many)


def test_bad_input_raises(rng):
    x = rng.normal(size=50)
    x[33] = np.inf
    with pytest.raises(DensitasError):
        bandwidth_dask(da.from_array(x, chunks=10), "scott", device="cpu")
    good = da.from_array(rng.normal(size=50), chunks=10)
    with pytest.raises(DensitasError):
        bandwidth_dask(good, "scott", weights=-np.ones(50), device="cpu")
    with pytest.raises(DensitasError):
        bandwidth_dask(good, "isj", engine="exact", device="cpu")
    with pytest.raises(DensitasError):
        bandwidth_dask(da.from_array(rng.normal(size=(50, 2)), chunks=10), "plugin", device="cpu")
