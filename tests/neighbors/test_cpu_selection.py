"""The CPU fast pass of ``knn_tile_topk`` (:func:`densitas.neighbors._torch._pruned_topk`): tiles pruned by the
running k-th value, candidates merged in batches.

Two kinds of check: the operation's contract on small-integer data (every fast value is then an exact float
sum, so the tiled GEMM and one whole GEMM agree bit for bit and the reference is the sorted full matrix), and
``kneighbors`` end to end against scikit-learn's brute force and the direct float64 implementation. The pruning
only starts on tiles at least ``PRUNE_GROUPS · PRUNE_MIN_WIDTH`` wide; the tests lower those limits so that
small inputs run through every branch: the seed tile, pruned tiles, narrow tail tiles, many or no merges, and
a first tile narrower than ``k``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.neighbors import NearestNeighbors as SkNN

from densitas.neighbors import _torch, kneighbors, search
from densitas.neighbors._torch import prepare, tile_topk
from densitas.neighbors.distances import bound_coefficient, get_metric

from .conftest import assert_same_neighbours, direct_distances, reference_knn

# (tile columns, groups, waiting candidates per query before a merge): pruned tiles with a pruned tail; a
# narrow tail (1,003 columns); merges after every tile; one merge at the end; a first tile narrower than k
LAYOUTS = [(64, 4, 2), (96, 8, 2), (64, 4, 0), (128, 16, 10**9), (8, 2, 2), (1024, 16, 2)]


def _integer_rows(rng, n, p, missing=0.0):
    """Small integers with many duplicate rows and tied distances; NaN at the rate ``missing``."""
    x = rng.integers(-4, 5, size=(n, p)).astype(np.float64)
    x[rng.integers(0, n, n // 5)] = x[rng.integers(0, n, n // 5)]
    if missing:
        x[rng.random((n, p)) < missing] = np.nan
        x[rng.integers(0, n, 3)] = np.nan  # rows with no coordinate at all
    return torch.from_numpy(x)


def _full_values(q, c):
    """The fast values of every pair from one untiled evaluation (the contract's reference)."""
    d = _torch._tile_values(q, c)
    if q.add is not None:
        d = d + q.add[:, None]
    if q.mode == "cos" and not q.masked:
        d = d + 1.0
    return d


def _check_contract(q, c, k, tile_cols):
    n = len(c)
    v, i = tile_topk(q, c, k, tile_cols)
    kk = min(k, n)
    assert v.shape == i.shape == (len(q), kk)
    full = _full_values(q, c)
    for row in range(len(q)):
        pos = i[row]
        assert len(set(pos.tolist())) == kk, f"row {row}: repeated positions {pos.tolist()}"
        assert int(pos.min()) >= 0 and int(pos.max()) < n
        # the values returned are the fast values of the positions returned ...
        assert torch.equal(v[row], full[row, pos]), f"row {row}"
        # ... and they are the kk smallest: nothing left out is below the largest returned
        rest = torch.ones(n, dtype=torch.bool)
        rest[pos] = False
        if rest.any():
            assert float(full[row, rest].min()) >= float(v[row].max()), f"row {row}"
        assert torch.equal(torch.sort(v[row]).values, torch.sort(full[row]).values[:kk]), f"row {row}"


@pytest.mark.parametrize("tile_cols,groups,pending", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dense_squared_values_meet_the_contract(rng, monkeypatch, tile_cols, groups, pending, dtype):
    monkeypatch.setattr(_torch, "PRUNE_GROUPS", groups)
    monkeypatch.setattr(_torch, "PRUNE_MIN_WIDTH", 1)
    monkeypatch.setattr(_torch, "PRUNE_PENDING", pending)
    X = _integer_rows(rng, 1003, 5)
    Y = torch.cat([X[:30], _integer_rows(rng, 20, 5)])
    q = prepare(Y, None, "sq", False, "query", dtype)
    c = prepare(X, None, "sq", False, "reference", dtype)
    for k in (1, 12, 40):
        _check_contract(q, c, k, tile_cols)


@pytest.mark.parametrize("tile_cols,groups,pending", LAYOUTS)
def test_manhattan_missing_and_nominal_values_meet_the_contract(rng, monkeypatch, tile_cols, groups, pending):
    """The forms whose tile is not one GEMM: L1, skipped coordinates (+inf where a pair shares none, which
    the pruning must not confuse with its NaN padding), nominal mismatches."""
    monkeypatch.setattr(_torch, "PRUNE_GROUPS", groups)
    monkeypatch.setattr(_torch, "PRUNE_MIN_WIDTH", 1)
    monkeypatch.setattr(_torch, "PRUNE_PENDING", pending)
    n = 403
    X = _integer_rows(rng, n, 4, missing=0.4)
    Y = torch.cat([X[:12], _integer_rows(rng, 10, 4, missing=0.4)])
    Y[0] = math.nan  # a query sharing nothing with any reference: every value +inf
    nom_x = torch.from_numpy(rng.integers(-1, 3, size=(n, 2)))
    nom_y = torch.cat([nom_x[:12], torch.from_numpy(rng.integers(-1, 3, size=(10, 2)))])
    cases = [("l1", False, False), ("l1", True, False), ("sq", True, False), ("sq", True, True),
             ("sq", False, True)]
    for mode, masked, nominal in cases:
        xs, ys = (X, Y) if masked else (torch.nan_to_num(X), torch.nan_to_num(Y))
        nx, ny = (nom_x, nom_y) if nominal else (None, None)
        if nominal and not masked:
            nx, ny = nx.clamp(min=0), ny.clamp(min=0)
        q = prepare(ys, ny, mode, masked, "query", torch.float64)
        c = prepare(xs, nx, mode, masked, "reference", torch.float64)
        for k in (3, 25):
            _check_contract(q, c, k, tile_cols)


def test_the_pruned_path_runs_and_prunes(rng, monkeypatch):
    """With the default layout on a reference block several tiles wide, the tiles after the first read only
    a small share of their entries again (what makes the CPU path fast), and the answer is still the whole
    matrix's top-k."""
    seen = []
    real = _torch._below

    def spy(d, thr, s, groups):
        got = real(d, thr, s, groups)
        seen.append((d.numel(), 0 if got is None else got[0].numel()))
        return got

    monkeypatch.setattr(_torch, "_below", spy)
    X = torch.from_numpy(rng.normal(size=(8192, 8)).astype(np.float32))
    Y = torch.from_numpy(rng.normal(size=(64, 8)).astype(np.float32))
    q = prepare(Y.double(), None, "sq", False, "query", torch.float32)
    c = prepare(X.double(), None, "sq", False, "reference", torch.float32)
    v, _ = tile_topk(q, c, 18, 1024)
    assert len(seen) == 7  # 8 tiles: the first seeds the top-k
    # about 18·(1/1 + … + 1/7) ≈ 30 entries per query pass (0.4%) with fresh thresholds
    assert sum(s for _, s in seen) < 0.05 * sum(t for t, _ in seen)
    want = torch.topk(_full_values(q, c), 18, dim=1, largest=False).values
    got = torch.sort(v, 1).values
    # tiles and one whole GEMM may round differently, each within the fast pass's bound of the exact value
    a = float(Y.norm(dim=1).max() + X.norm(dim=1).max())
    tol = 2.0 * bound_coefficient(get_metric("sqeuclidean"), 8, False, torch.float32) * (a * a + 1.0)
    assert float((got - want).abs().max()) <= tol


@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean", "manhattan", "cosine"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kneighbors_through_pruned_tiles_equals_sklearn(rng, monkeypatch, metric, dtype):
    """Small tiles so that a 1,200-row reference set crosses many pruned tiles and several merges: the same
    neighbours as scikit-learn's brute force, and exactly the direct float64 answer (ties by lower index)."""
    monkeypatch.setattr(search, "TILE_REFERENCES", 128)
    monkeypatch.setattr(search, "TILE_QUERIES", 16)
    monkeypatch.setattr(_torch, "PRUNE_MIN_WIDTH", 4)
    X = rng.normal(size=(1200, 4))
    X[600:615] = X[5]  # 16 identical rows: more than k' for k = 7
    X[rng.integers(0, 1200, 30)] = X[rng.integers(0, 1200, 30)]
    X = X.astype(dtype)
    Y = np.concatenate([X[:30], X[600:602], rng.normal(size=(15, 4)).astype(dtype)])
    k = 7
    d, i = kneighbors(X, Y, k, metric=metric, device="cpu")
    X64, Y64 = X.astype(np.float64), Y.astype(np.float64)
    d_sk, i_sk = SkNN(n_neighbors=k, algorithm="brute", metric=metric).fit(X64).kneighbors(Y64)
    assert_same_neighbours(d, i, d_sk, i_sk, rtol=1e-7, atol=1e-7, what=metric)
    d_ref, i_ref = reference_knn(direct_distances(X64, Y64, metric), k)
    assert np.array_equal(i, i_ref), metric
    assert np.allclose(d, d_ref, rtol=1e-12, atol=1e-15), metric


def test_kneighbors_missing_and_mixed_through_pruned_tiles(rng, monkeypatch):
    monkeypatch.setattr(search, "TILE_REFERENCES", 96)
    monkeypatch.setattr(search, "TILE_QUERIES", 16)
    monkeypatch.setattr(_torch, "PRUNE_MIN_WIDTH", 2)
    X = rng.normal(size=(500, 4))
    X[rng.random((500, 4)) < 0.3] = np.nan
    X[7] = np.nan
    Y = rng.normal(size=(20, 4))
    Y[rng.random((20, 4)) < 0.3] = np.nan
    for metric in ("euclidean", "manhattan", "cosine"):
        d, i = kneighbors(X, Y, 9, metric=metric, missing="skip", device="cpu")
        d_ref, i_ref = reference_knn(direct_distances(X, Y, metric, skip=True), 9)
        assert np.array_equal(i, i_ref), metric
        assert np.allclose(d, d_ref, rtol=1e-12, atol=1e-14, equal_nan=True), metric
    Xm = np.column_stack([rng.normal(size=500), rng.integers(0, 3, 500), rng.normal(size=500)])
    Ym = Xm[:15].copy()
    Ym[:, 0] += 0.05
    d, i = kneighbors(Xm, Ym, 6, metric="mixed_euclidean", nominal=[1], device="cpu")
    d_ref, i_ref = reference_knn(direct_distances(Xm, Ym, "mixed_euclidean", nominal=(1,)), 6)
    assert np.array_equal(i, i_ref)
    assert np.allclose(d, d_ref, rtol=1e-12)
