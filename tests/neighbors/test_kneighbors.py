"""``densitas.neighbors.kneighbors``: exact against scikit-learn's brute force and a direct float64
implementation, tie order, certificate and fallback, tiny budgets, metrics, mixed data, missing values, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits, load_iris, load_wine
from sklearn.neighbors import NearestNeighbors as SkNN

from densitas.exceptions import InputError
from densitas.neighbors import kneighbors
from densitas.neighbors.api import build_references, encode_queries
from densitas.neighbors.distances import get_metric
from densitas.neighbors.search import SearchStats, search

from .conftest import assert_same_neighbours, direct_distances, reference_knn

SK_METRICS = ["euclidean", "sqeuclidean", "manhattan", "cosine"]


def _with_duplicates(rng, n, d, dtype=np.float64):
    X = rng.normal(size=(n, d))
    X[n // 2: n // 2 + 12] = X[3]  # a block of 13 identical rows (more than k' for k = 4)
    X[rng.integers(0, n, 10)] = X[rng.integers(0, n, 10)]
    return X.astype(dtype)


@pytest.mark.parametrize("metric", SK_METRICS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_random_data_with_duplicates_matches_sklearn_brute(seeded, metric, dtype):
    X = _with_duplicates(seeded, 300, 6, dtype)
    Y = np.concatenate([X[:40], seeded.normal(size=(25, 6)).astype(dtype)])
    k = 7
    d, i = kneighbors(X, Y, k, metric=metric, device="cpu")
    sk = SkNN(n_neighbors=k, algorithm="brute", metric=metric).fit(X.astype(np.float64))
    d_sk, i_sk = sk.kneighbors(Y.astype(np.float64))
    assert_same_neighbours(d, i, d_sk, i_sk, rtol=1e-7, atol=1e-7, what=metric)
    # and strictly equal (order and ties by lower index) to the direct float64 brute force
    d_ref, i_ref = reference_knn(direct_distances(X.astype(np.float64), Y.astype(np.float64), metric), k)
    assert np.array_equal(i, i_ref)
    assert np.allclose(d, d_ref, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("loader", [load_iris, load_wine, load_digits], ids=["iris", "wine", "digits"])
def test_bundled_data_match_sklearn_and_find_themselves(loader):
    X = loader().data
    k = 10
    d, i = kneighbors(X, X, k, device="cpu")
    d_sk, i_sk = SkNN(n_neighbors=k, algorithm="brute").fit(X).kneighbors(X)
    assert_same_neighbours(d, i, d_sk, i_sk, rtol=1e-7, atol=1e-6)
    # every query is in X: its first neighbour is at distance exactly 0, and is itself or an earlier duplicate
    assert np.all(d[:, 0] == 0.0)
    assert np.all(i[:, 0] <= np.arange(len(X)))
    assert np.array_equal(X[i[:, 0]], X)
    assert np.all(np.diff(d, axis=1) >= 0)
    # ties inside equal distances go to the lower index
    same = np.diff(d, axis=1) == 0
    assert np.all(np.diff(i, axis=1)[same] > 0)


def test_float32_with_large_offset_is_still_exact(seeded):
    """The float32 GEMM expansion loses almost everything at an offset of 1e4; re-ranking and the certificate
    must still give the float64 answer."""
    X = (1e4 + seeded.normal(size=(400, 5))).astype(np.float32)
    Y = (1e4 + seeded.normal(size=(30, 5))).astype(np.float32)
    d, i = kneighbors(X, Y, 5, device="cpu")
    d_ref, i_ref = reference_knn(direct_distances(X.astype(np.float64), Y.astype(np.float64), "euclidean"), 5)
    assert np.array_equal(i, i_ref)
    assert np.allclose(d, d_ref, rtol=1e-12)


def test_duplicates_beyond_the_candidate_margin_use_the_exact_fallback(seeded):
    X = np.repeat(seeded.normal(size=(4, 3)), 30, axis=0)[seeded.permutation(120)]
    refs = build_references(X, get_metric("euclidean"), None, "raise")
    q = encode_queries(X[:9], refs, "raise", torch.device("cpu"))
    stats = SearchStats()
    d, i = search(refs, q, 5, get_metric("euclidean"), skip=False, device=torch.device("cpu"), stats=stats)
    assert stats.fallback_queries > 0
    d_ref, i_ref = reference_knn(direct_distances(X, X[:9], "euclidean"), 5)
    assert np.array_equal(i.numpy(), i_ref)
    assert np.array_equal(d.numpy(), d_ref)


@pytest.mark.parametrize("metric", ["euclidean", "manhattan", "cosine", "mixed_euclidean"])
def test_tiny_memory_budget_gives_identical_results(seeded, metric):
    X = seeded.normal(size=(90, 4))
    X[:, 3] = seeded.integers(0, 3, 90)
    X[seeded.random((90, 4)) < 0.1] = np.nan
    Y = np.concatenate([X[:6], seeded.normal(size=(5, 4))])
    kw = {"metric": metric, "missing": "skip", "device": "cpu"}
    if metric == "mixed_euclidean":
        kw["nominal"] = [3]
    d0, i0 = kneighbors(X, Y, 6, **kw)
    d1, i1 = kneighbors(X, Y, 6, memory_budget=2048, **kw)
    assert np.array_equal(i0, i1)
    assert np.array_equal(d0, d1, equal_nan=True)


def test_k_equal_n_returns_every_reference_in_order(seeded):
    X = seeded.normal(size=(40, 3))
    d, i = kneighbors(X, X[:5], 40, device="cpu")
    d_ref, i_ref = reference_knn(direct_distances(X, X[:5], "euclidean"), 40)
    assert np.array_equal(i, i_ref)
    assert np.allclose(d, d_ref, rtol=1e-12)


def test_errors_are_input_errors(seeded):
    X = seeded.normal(size=(10, 2))
    with pytest.raises(InputError):
        kneighbors(X, X, 11)
    with pytest.raises(InputError):
        kneighbors(X, X, 0)
    with pytest.raises(InputError):
        kneighbors(X, X, 3, metric="chebyshev")
    with pytest.raises(InputError):
        kneighbors(X, X, 3, missing="ignore")
    bad = X.copy()
    bad[4, 1] = np.nan
    with pytest.raises(InputError, match="row 4") as exc:
        kneighbors(bad, X, 3)
    assert "column 1" in str(exc.value)
    with pytest.raises(InputError):
        kneighbors(X, bad, 3)
    inf = X.copy()
    inf[2, 0] = np.inf
    with pytest.raises(InputError):
        kneighbors(inf, X, 3, missing="skip")
    with pytest.raises(InputError):
        kneighbors(X, X[:, :1], 3)


def test_missing_skip_semantics_match_direct_implementation(seeded):
    X = seeded.normal(size=(60, 4))
    X[seeded.random((60, 4)) < 0.3] = np.nan
    X[7] = np.nan  # a reference with nothing at all
    Y = seeded.normal(size=(12, 4))
    Y[seeded.random((12, 4)) < 0.3] = np.nan
    Y[2] = [np.nan, np.nan, 1.0, np.nan]
    Y[3] = np.nan  # a query with nothing: every distance NaN, references by index
    for metric in ("euclidean", "manhattan", "cosine"):
        d, i = kneighbors(X, Y, 60, metric=metric, missing="skip", device="cpu")
        d_ref, i_ref = reference_knn(direct_distances(X, Y, metric, skip=True), 60)
        assert np.array_equal(i, i_ref), metric
        assert np.allclose(d, d_ref, rtol=1e-12, atol=1e-14, equal_nan=True), metric
        assert np.isnan(d[3]).all() and np.array_equal(i[3], np.arange(60))
        assert np.isnan(d[:, -1]).all()  # reference 7 is always at NaN and ranks last


def test_missing_skip_with_every_pair_sharing_a_coordinate(seeded, monkeypatch):
    """Few NaN (every row keeps more than half its columns): the fast pass skips the count of shared
    coordinates (pigeonhole) and the answer still equals the direct implementation."""
    from densitas.neighbors import _torch

    X = seeded.normal(size=(70, 6)).astype(np.float32)
    X[:, :3][seeded.random((70, 3)) < 0.3] = np.nan  # at most 3 of 6 missing: 3 + 4 present > 6
    Y = seeded.normal(size=(9, 6)).astype(np.float32)
    Y[:, 4][seeded.random(9) < 0.5] = np.nan  # at least 5 present
    counted = []
    real = _torch._tile_values

    def spy(q, c):
        counted.append(q.min_present + c.min_present)
        return real(q, c)

    monkeypatch.setattr(_torch, "_tile_values", spy)
    d, i = kneighbors(X, Y, 10, missing="skip", device="cpu")
    d_ref, i_ref = reference_knn(direct_distances(X.astype(np.float64), Y.astype(np.float64), "euclidean",
                                                  skip=True), 10)
    assert counted and min(counted) > 6  # the count was skipped
    assert np.array_equal(i, i_ref)
    assert np.allclose(d, d_ref, rtol=1e-12, atol=1e-14)


def test_mixed_euclidean_with_strings_and_missing_values(seeded):
    import pandas as pd

    n = 80
    X = pd.DataFrame({"x": seeded.normal(size=n), "colour": seeded.choice(["red", "green", "blue"], n),
                      "y": seeded.normal(size=n), "size": pd.Categorical(seeded.choice(["S", "M"], n))})
    X.loc[seeded.random(n) < 0.1, "x"] = np.nan
    X.loc[seeded.random(n) < 0.1, "colour"] = None
    Y = X.sample(15, random_state=int(seeded.integers(1000))).reset_index(drop=True)
    Y.loc[0, "colour"] = "purple"  # a value the references never had
    d, i = kneighbors(X, Y, 8, metric="mixed_euclidean", missing="skip", device="cpu")
    cols = ["x", "colour", "y", "size"]
    Xo = X[cols].astype(object).to_numpy()
    Yo = Y[cols].astype(object).to_numpy()
    d_ref, i_ref = reference_knn(direct_distances(Xo, Yo, "mixed_euclidean", nominal=(1, 3), skip=True), 8)
    assert np.array_equal(i, i_ref)
    assert np.allclose(d, d_ref, rtol=1e-12)
    with pytest.raises(InputError):
        kneighbors(X, Y, 3, metric="euclidean", missing="skip")  # nominal columns need mixed_euclidean
    with pytest.raises(InputError):
        kneighbors(X, Y, 3, metric="mixed_euclidean")  # missing="raise" and there are missing values


def test_mixed_euclidean_nominal_codes_in_an_array(seeded):
    X = np.column_stack([seeded.normal(size=50), seeded.integers(0, 4, 50), seeded.integers(0, 2, 50)])
    Y = X[:10].copy()
    Y[:, 0] += 0.1
    d, i = kneighbors(X, Y, 5, metric="mixed_euclidean", nominal=[1, 2], device="cpu")
    d_ref, i_ref = reference_knn(direct_distances(X, Y, "mixed_euclidean", nominal=(1, 2)), 5)
    assert np.array_equal(i, i_ref)
    assert np.allclose(d, d_ref, rtol=1e-12)


def test_tensor_in_tensor_out(seeded):
    X = torch.from_numpy(seeded.normal(size=(30, 3)).astype(np.float32))
    d, i = kneighbors(X, X[:4], 3, device="cpu")
    assert isinstance(d, torch.Tensor) and isinstance(i, torch.Tensor)
    assert i[:, 0].tolist() == [0, 1, 2, 3]


def test_file_and_duckdb_inputs_equal_in_memory(seeded, tmp_path):
    import duckdb
    import pandas as pd

    df = pd.DataFrame(seeded.normal(size=(70, 3)), columns=["a", "b", "c"])
    Y = df.sample(9, random_state=1)
    want_d, want_i = kneighbors(df, Y, 4, device="cpu")
    pq_path = tmp_path / "ref.parquet"
    csv_path = tmp_path / "ref.csv"
    npy_path = tmp_path / "ref.npy"
    df.to_parquet(pq_path, row_group_size=16)
    df.to_csv(csv_path, index=False)
    np.save(npy_path, df.to_numpy())
    con = duckdb.connect()
    con.execute("CREATE TABLE ref AS SELECT * FROM df")
    for src in (pq_path, str(csv_path), con.table("ref")):
        for budget in (None, 3000):
            d, i = kneighbors(src, Y, 4, device="cpu", memory_budget=budget)
            assert np.array_equal(i, want_i), src
            assert np.allclose(d, want_d, rtol=1e-12)
    d, i = kneighbors(npy_path, Y.to_numpy(), 4, device="cpu", memory_budget=3000)
    assert np.array_equal(i, want_i)
    with pytest.raises(InputError):
        kneighbors(pq_path, Y, 71)
    with pytest.raises(InputError):
        kneighbors(tmp_path / "absent.parquet", Y, 3)
