"""Validity indices against their formulas written out in float64, and against fuzzy-c-means' and
scikit-fuzzy's own implementations when those are installed."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from densitas.cluster import (
    INDICES,
    FuzzyKMeans,
    fpc,
    fukuyama_sugeno,
    fuzzy_davies_bouldin,
    fuzzy_silhouette,
    modified_partition_coefficient,
    partition_entropy,
    xie_beni,
)
from densitas.exceptions import InputError


@pytest.fixture
def fitted(seeded):
    X = np.concatenate([seeded.normal(size=(40, 3)) + c for c in (0.0, 6.0, 12.0)])
    km = FuzzyKMeans(3, n_nearest=3, fuzzifier=2.0, random_state=0, device="cpu").fit(X)
    return X, km.predict_membership(X), km.cluster_centers_, km


def test_indices_equal_their_formulas(fitted):
    X, U, V, _ = fitted
    n, k = U.shape
    D = cdist(X, V, "sqeuclidean")
    assert fpc(U) == pytest.approx((U ** 2).sum() / n, rel=1e-12)
    assert modified_partition_coefficient(U) == pytest.approx(1 - k / (k - 1) * (1 - (U ** 2).sum() / n), rel=1e-12)
    ent = -np.sum(np.where(U > 0, U * np.log(np.where(U > 0, U, 1)), 0)) / n
    assert partition_entropy(U) == pytest.approx(ent, rel=1e-12)
    assert partition_entropy(U, base=2) == pytest.approx(ent / math.log(2), rel=1e-12)
    gap = min(((V[i] - V[j]) ** 2).sum() for i in range(k) for j in range(k) if i != j)
    for m in (1.5, 2.0):
        assert xie_beni(X, U, V, m) == pytest.approx((U ** m * D).sum() / (n * gap), rel=1e-12)
        fs = (U ** m * (D - ((V - X.mean(0)) ** 2).sum(1)[None, :])).sum()
        assert fukuyama_sugeno(X, U, V, m) == pytest.approx(fs, rel=1e-10)


def test_sparse_memberships_give_the_same_indices(fitted):
    X, U, V, km = fitted
    idx, u = km.membership(X)
    for name, (fn, _higher) in INDICES.items():
        if name in ("xie_beni", "fukuyama_sugeno", "fuzzy_davies_bouldin"):
            assert fn(X, (idx, u), V) == pytest.approx(fn(X, U, V), rel=1e-12), name
        elif name == "fuzzy_silhouette":
            assert fn(X, (idx, u)) == pytest.approx(fn(X, U), rel=1e-12), name
        else:
            assert fn((idx, u)) == pytest.approx(fn(U), rel=1e-12), name


def test_against_fuzzy_c_means_and_scikit_fuzzy(fitted):
    X, U, V, _ = fitted
    try:
        from fcmeans import validation
    except ImportError:
        validation = None
    if validation is not None:
        assert xie_beni(X, U, V, 2.0) == pytest.approx(validation.xie_beni(X, U, V, 2.0), rel=1e-9)
        assert fuzzy_davies_bouldin(X, U, V, 2.0) == pytest.approx(validation.davies_bouldin(X, U, V, 2.0), rel=1e-9)
        assert fuzzy_silhouette(X, U) == pytest.approx(validation.fuzzy_silhouette(X, U, V), rel=1e-9)
    try:
        from skfuzzy.cluster._cmeans import _fp_coeff
    except ImportError:
        _fp_coeff = None
    if _fp_coeff is not None:
        assert fpc(U) == pytest.approx(_fp_coeff(U.T), rel=1e-12)
    if validation is None and _fp_coeff is None:
        pytest.skip("neither fuzzy-c-means nor scikit-fuzzy is installed")


def test_crisp_and_uniform_extremes():
    crisp = np.eye(3)[[0, 1, 2, 0]]
    flat = np.full((4, 3), 1 / 3)
    assert fpc(crisp) == 1.0 and partition_entropy(crisp) == 0.0
    assert fpc(flat) == pytest.approx(1 / 3) and partition_entropy(flat) == pytest.approx(math.log(3))
    assert modified_partition_coefficient(crisp) == 1.0
    assert modified_partition_coefficient(flat) == pytest.approx(0.0, abs=1e-15)


def test_bad_input():
    with pytest.raises(InputError):
        xie_beni([[0.0], [1.0]], [[1.0], [1.0]], [[0.5]])  # one cluster
    with pytest.raises(InputError):
        xie_beni([[0.0], [1.0]], [[1.0, 0.0]], [[0.0], [1.0]])  # wrong shape
    with pytest.raises(InputError):
        fuzzy_silhouette([[0.0], [1.0]], [[1.0, 0.0], [1.0, 0.0]])  # one non-empty cluster
