"""The estimators: scikit-learn's checks, scikit-learn's predictions and probabilities for "uniform" and
"distance" (zero-distance rule included), RapidMiner's vote on a hand-computed example, mixed DataFrames."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn import neighbors as skn
from sklearn.datasets import load_digits, load_iris, load_wine
from sklearn.utils.estimator_checks import check_estimator

from densitas.exceptions import InputError
from densitas.neighbors import KNeighborsClassifier, KNeighborsRegressor, NearestNeighbors, rapidminer_weights

from .conftest import assert_same_neighbours


@pytest.mark.parametrize("est", [
    NearestNeighbors(device="cpu"),
    KNeighborsClassifier(device="cpu"),
    KNeighborsRegressor(device="cpu"),
    KNeighborsClassifier(weights="rapidminer", missing="skip", metric="manhattan", device="cpu"),
    KNeighborsRegressor(weights="distance", metric="cosine", memory_budget=200_000, device="cpu"),
], ids=["nn", "classifier", "regressor", "classifier-rapidminer-skip", "regressor-distance-cosine-tiny"])
def test_check_estimator(est):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SkipTestWarning for the array-API check (not applicable)
        results = check_estimator(est, on_fail=None)
    failed = [(r["check_name"], str(r["exception"])[:200]) for r in results if r["status"] == "failed"]
    assert not failed
    assert sum(r["status"] == "passed" for r in results) >= 40


def _data(seeded, n=200, m=60, d=5, classes=3):
    X = seeded.normal(size=(n, d))
    y = seeded.integers(0, classes, n)
    Q = np.concatenate([X[:15], seeded.normal(size=(m - 15, d))])  # 15 queries at distance 0 from a row
    return X, y, Q


@pytest.mark.parametrize("weights", ["uniform", "distance"])
@pytest.mark.parametrize("k", [1, 4, 9])
def test_classifier_equals_sklearn(seeded, weights, k):
    X, y, Q = _data(seeded)
    ours = KNeighborsClassifier(k, weights=weights, device="cpu").fit(X, y)
    sk = skn.KNeighborsClassifier(k, weights=weights, algorithm="brute").fit(X, y)
    assert np.array_equal(ours.predict(Q), sk.predict(Q))
    # equal up to the last bits of the distances (ours: direct differences; scikit-learn: a GEMM expansion) where no
    # distance is 0; scikit-learn's expansion gives a query on a row a distance of ~1e-8, not 0 (1.9 rounds it
    # so), so there its "distance" weights are not the zero-distance rule: ours are checked against the rule
    assert np.allclose(ours.predict_proba(Q[15:]), sk.predict_proba(Q[15:]), rtol=1e-12, atol=1e-15)
    if weights == "uniform":
        assert np.array_equal(ours.predict_proba(Q), sk.predict_proba(Q))
    else:  # each of Q[:15] is on exactly one row (continuous data): all its weight goes to that row's class
        assert np.array_equal(ours.predict_proba(Q[:15]), np.eye(3)[y[:15]])
    assert ours.score(Q[:15], y[:15]) == sk.score(Q[:15], y[:15])
    d, i = ours.kneighbors(None, 3)
    d_sk, i_sk = sk.kneighbors(None, 3)
    assert np.array_equal(i, i_sk) and np.allclose(d, d_sk, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("weights", ["uniform", "distance"])
def test_regressor_equals_sklearn(seeded, weights):
    X, _, Q = _data(seeded)
    y = seeded.normal(size=len(X)) * 10
    ours = KNeighborsRegressor(6, weights=weights, device="cpu").fit(X, y)
    sk = skn.KNeighborsRegressor(6, weights=weights, algorithm="brute").fit(X, y)
    if weights == "uniform":
        assert np.array_equal(ours.predict(Q), sk.predict(Q))
    else:  # the zero-distance rule on Q[:15] (see test_classifier_equals_sklearn)
        assert np.array_equal(ours.predict(Q[:15]), y[:15])
    assert np.allclose(ours.predict(Q[15:]), sk.predict(Q[15:]), rtol=1e-12, atol=1e-12)
    assert np.isclose(ours.score(Q, y[:1].repeat(len(Q))), sk.score(Q, y[:1].repeat(len(Q))))


def test_distance_weights_zero_distance_rule():
    """A query at distance 0 from some neighbours votes for exactly those (scikit-learn's rule)."""
    X = np.array([[0.0], [0.0], [1.0], [1.5], [2.0]])
    y = np.array([0, 1, 2, 2, 2])
    ours = KNeighborsClassifier(5, weights="distance", device="cpu").fit(X, y)
    sk = skn.KNeighborsClassifier(5, weights="distance", algorithm="brute").fit(X, y)
    assert ours.predict_proba([[0.0]]).tolist() == [[0.5, 0.5, 0.0]] == sk.predict_proba([[0.0]]).tolist()
    assert ours.predict([[0.0]]).tolist() == sk.predict([[0.0]]).tolist() == [0]
    reg = KNeighborsRegressor(5, weights="distance", device="cpu").fit(X, [1.0, 3.0, 10, 10, 10])
    assert reg.predict([[0.0]]).tolist() == [2.0]


@pytest.mark.parametrize("loader", [load_iris, load_wine, load_digits], ids=["iris", "wine", "digits"])
@pytest.mark.parametrize("weights", ["uniform", "distance"])
def test_bundled_data_predictions_equal_sklearn(loader, weights):
    data = loader()
    X, y = data.data, data.target
    rng = np.random.default_rng(0)
    test = rng.permutation(len(X))[: len(X) // 4]
    train = np.setdiff1d(np.arange(len(X)), test)
    for k in (1, 5, 10):
        ours = KNeighborsClassifier(k, weights=weights, device="cpu").fit(X[train], y[train])
        sk = skn.KNeighborsClassifier(k, weights=weights, algorithm="brute").fit(X[train], y[train])
        d, i = ours.kneighbors(X[test])
        d_sk, i_sk = sk.kneighbors(X[test])
        # decimal data: "ties" are ties only up to rounding, which scikit-learn's GEMM and our direct float64
        # differences break differently; neighbour sets agree up to those near-ties
        assert_same_neighbours(d, i, d_sk, i_sk, rtol=1e-9, atol=1e-9)
        same = np.array([set(a) == set(b) for a, b in zip(i, i_sk, strict=True)])
        assert same.mean() > 0.8
        assert np.array_equal(ours.predict(X[test])[same], sk.predict(X[test])[same])
        assert np.allclose(ours.predict_proba(X[test])[same], sk.predict_proba(X[test])[same], rtol=1e-12)


def test_rapidminer_vote_hand_computed():
    # neighbours of the query 0 at distances 1, 2, 3 (labels a, b, b): D = 6,
    # w = (1 − d/D)/(k − 1) = (5/6)/2, (4/6)/2, (3/6)/2 = 0.41667, 0.33333, 0.25
    X = np.array([[1.0], [-2.0], [3.0], [10.0]])
    clf = KNeighborsClassifier(3, weights="rapidminer", device="cpu").fit(X, ["a", "b", "b", "a"])
    proba = clf.predict_proba([[0.0]])
    assert np.allclose(proba, [[5 / 12, 7 / 12]], rtol=1e-15)
    assert clf.predict([[0.0]]).tolist() == ["b"]
    # 1/d weights would vote "a" (1 > 1/2 + 1/3): the RapidMiner rule really is different
    assert KNeighborsClassifier(3, weights="distance", device="cpu").fit(X, ["a", "b", "b", "a"]).predict(
        [[0.0]]).tolist() == ["a"]
    reg = KNeighborsRegressor(3, weights="rapidminer", device="cpu").fit(X, [6.0, 12.0, 24.0, 0.0])
    assert np.isclose(reg.predict([[0.0]])[0], 6 * 5 / 12 + 12 * 4 / 12 + 24 * 3 / 12)
    # all neighbours at distance 0: 1/k each
    assert rapidminer_weights([[0.0, 0.0, 0.0, 0.0]]).tolist() == [[0.25] * 4]
    # k = 1: weight 1 (RapidMiner's own formula gives 0 and breaks regression)
    reg1 = KNeighborsRegressor(1, weights="rapidminer", device="cpu").fit(X, [6.0, 12.0, 24.0, 0.0])
    assert reg1.predict([[0.1], [9.0]]).tolist() == [6.0, 0.0]


def test_mixed_dataframe_with_missing_values(seeded):
    n = 120
    df = pd.DataFrame({"x": seeded.normal(size=n), "kind": seeded.choice(["p", "q", "r"], n),
                       "z": seeded.normal(size=n)})
    df.loc[seeded.random(n) < 0.1, "z"] = np.nan
    y = (df["kind"] == "p").to_numpy().astype(int)
    clf = KNeighborsClassifier(5, metric="mixed_euclidean", missing="skip", device="cpu").fit(df, y)
    assert list(clf.feature_names_in_) == ["x", "kind", "z"]
    assert clf.score(df, y) > 0.9  # the nominal column decides the label and weighs 1 per mismatch
    with pytest.raises(InputError):
        KNeighborsClassifier(5, device="cpu").fit(df, y)  # nominal column with the euclidean metric


def test_parameter_and_query_errors(seeded):
    X = seeded.normal(size=(8, 2))
    with pytest.raises(InputError):
        NearestNeighbors(n_neighbors=0).fit(X)
    with pytest.raises(InputError):
        KNeighborsClassifier(weights="cubic").fit(X, [0, 1] * 4)
    with pytest.raises(InputError):
        NearestNeighbors(metric="hamming").fit(X)
    nn = NearestNeighbors(n_neighbors=3, device="cpu").fit(X)
    with pytest.raises(InputError):
        nn.kneighbors(X, n_neighbors=9)
    with pytest.raises(InputError):
        nn.kneighbors(None, n_neighbors=8)
    bad = X.copy()
    bad[0, 0] = np.nan
    with pytest.raises(InputError):
        nn.kneighbors(bad)
