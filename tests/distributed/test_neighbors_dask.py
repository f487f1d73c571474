"""kneighbors and the kNN estimators on Dask arrays and DataFrames: the same answer as the single-machine path
and as a float64 brute force (ties to the lower row), on a two-process LocalCluster and on the local scheduler."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.neighbors import KNeighborsClassifier as SkClassifier
from sklearn.neighbors import KNeighborsRegressor as SkRegressor
from sklearn.neighbors import NearestNeighbors as SkNearest

from densitas.exceptions import InputError
from densitas.neighbors import KNeighborsClassifier, KNeighborsRegressor, NearestNeighbors, kneighbors

da = pytest.importorskip("dask.array")
dd = pytest.importorskip("dask.dataframe")


def brute(X: np.ndarray, Y: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Float64 Euclidean brute force, ordered by (distance, row)."""
    D = np.sqrt(((Y[:, None, :] - X[None, :, :]) ** 2).sum(-1))
    idx = np.array([np.lexsort((np.arange(len(X)), row))[:k] for row in D])
    return np.take_along_axis(D, idx, 1), idx


def tied_data(rng, n=300, m=40, d=3):
    """Rows with many exact duplicates (ties across blocks) and queries sitting on some of them."""
    X = rng.integers(0, 4, size=(n, d)).astype(np.float64)
    X[::7] = rng.normal(size=(len(X[::7]), d))
    Y = np.r_[X[rng.integers(0, n, size=m // 2)], rng.normal(size=(m - m // 2, d)) * 2]
    return X, Y


def test_kneighbors_dask_references_equal_brute_force(rng, scheduler):
    X, Y = tied_data(rng)
    k = 9
    d_ref, i_ref = brute(X, Y, k)
    d0, i0 = kneighbors(X, Y, k, device="cpu")
    d1, i1 = kneighbors(da.from_array(X, chunks=((50, 1, 99, 150), 3)), Y, k, device="cpu")
    assert isinstance(d1, np.ndarray)
    np.testing.assert_array_equal(i1, i_ref)  # ties across blocks go to the lower global row
    np.testing.assert_array_equal(i1, i0)
    np.testing.assert_allclose(d1, d_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(d1, d0, rtol=1e-14, atol=0)


def test_kneighbors_dask_queries_give_dask_results(rng, scheduler):
    X, Y = tied_data(rng, n=200, m=31)
    k = 5
    _, i_ref = brute(X, Y, k)
    Xd = da.from_array(X, chunks=(64, 2))  # chunked along the columns too: rechunked to whole rows
    d, i = kneighbors(Xd, da.from_array(Y, chunks=8), k, device="cpu")
    assert isinstance(i, da.Array) and i.chunks[0] == (8, 8, 8, 7)
    np.testing.assert_array_equal(i.compute(), i_ref)
    assert d.compute().shape == (31, k)


def test_kneighbors_dask_frames_nominal_and_missing(rng, scheduler):
    n, m = 120, 15
    frame = pd.DataFrame({"a": rng.normal(size=n), "b": rng.normal(size=n),
                          "c": pd.Categorical(rng.choice(["x", "y", "z"], size=n))})
    frame.loc[rng.choice(n, 10, replace=False), "a"] = np.nan
    queries = frame.sample(m, random_state=int(rng.integers(1 << 30))).reset_index(drop=True)
    kw = {"metric": "mixed_euclidean", "missing": "skip", "device": "cpu"}
    d0, i0 = kneighbors(frame, queries, 6, **kw)
    d1, i1 = kneighbors(dd.from_pandas(frame, npartitions=4), dd.from_pandas(queries, npartitions=2), 6, **kw)
    np.testing.assert_array_equal(i1.compute(), i0)
    np.testing.assert_allclose(d1.compute(), d0, rtol=1e-14, equal_nan=True)


def test_kneighbors_dask_errors(rng):
    X = da.from_array(rng.normal(size=(20, 3)), chunks=7)
    with pytest.raises(InputError):
        kneighbors(X, rng.normal(size=(2, 3)), 21, device="cpu")  # k > n
    with pytest.raises(InputError):
        kneighbors(X, rng.normal(size=(2, 4)), 3, device="cpu")  # columns differ
    with pytest.raises(InputError):
        kneighbors(X, rng.normal(size=(2, 3)), 3, metric="chebyshev", device="cpu")


def test_estimators_fitted_on_dask_equal_scikit_learn(rng, client):
    X, Y = tied_data(rng, n=240, m=30, d=2)
    X = X + rng.normal(size=X.shape) * 1e-3  # no ties: scikit-learn's order among equal distances differs
    labels = rng.integers(0, 3, size=len(X))
    target = X.sum(1) + rng.normal(size=len(X))
    Xd, Yd = da.from_array(X, chunks=70), da.from_array(Y, chunks=11)
    clf = KNeighborsClassifier(7, weights="distance", device="cpu").fit(Xd, da.from_array(labels, chunks=70))
    ref = SkClassifier(7, weights="distance").fit(X, labels)
    np.testing.assert_array_equal(clf.predict(Y), ref.predict(Y))
    np.testing.assert_allclose(clf.predict_proba(Yd).compute(), ref.predict_proba(Y), rtol=1e-12)
    reg = KNeighborsRegressor(4, device="cpu").fit(Xd, target)
    np.testing.assert_allclose(reg.predict(Yd).compute(), SkRegressor(4).fit(X, target).predict(Y), rtol=1e-12,
                               atol=1e-12 * np.abs(target).max())  # a mean near 0 carries rounding of |target|
    nn = NearestNeighbors(n_neighbors=3, device="cpu").fit(Xd)
    d_self, i_self = nn.kneighbors()  # every fitted row, itself excluded
    d_sk, i_sk = SkNearest(n_neighbors=3).fit(X).kneighbors()
    np.testing.assert_array_equal(i_self.compute(), i_sk)
    np.testing.assert_allclose(d_self.compute(), d_sk, rtol=1e-10)


def test_estimator_fitted_in_memory_predicts_dask_queries(rng, client):
    X = rng.normal(size=(150, 3))
    labels = (X[:, 0] > 0).astype(int)
    Y = rng.normal(size=(23, 3))
    clf = KNeighborsClassifier(5, device="cpu").fit(X, labels)
    out = clf.predict(da.from_array(Y, chunks=10))
    assert isinstance(out, da.Array)
    np.testing.assert_array_equal(out.compute(), SkClassifier(5).fit(X, labels).predict(Y))
    with pytest.raises(InputError):
        clf.predict(da.from_array(rng.normal(size=(4, 2)), chunks=2))
