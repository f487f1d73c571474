"""reduce_by_key, compact and radix_sort against NumPy references, on both backends."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from densitas import InputError
from densitas import primitives as P
from densitas.primitives.api import split_radix_argsort


@pytest.mark.parametrize("n", [1, 2, 65, 1000])
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max", "mean"])
def test_reduce_by_key(backend, rng, n, op):
    k = rng.integers(0, 13, n)
    v = rng.uniform(0.5, 1.5, (n, 3)).astype(np.float32)
    got = P.reduce_by_key(k, v, op, num_keys=15)
    want = np.empty((15, 3))
    ident = {"sum": 0, "prod": 1, "min": np.inf, "max": -np.inf, "mean": np.nan}[op]
    f = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max, "mean": np.mean}[op]
    for key in range(15):
        rows = v[k == key].astype(np.float64)
        want[key] = f(rows, axis=0) if len(rows) else ident
    assert got.shape == (15, 3) and got.dtype == np.float32
    assert np.allclose(got, want, rtol=1e-5, equal_nan=True)
    got1 = P.reduce_by_key(k, v[:, 0], op, num_keys=15)
    assert got1.shape == (15,) and np.allclose(got1, want[:, 0], rtol=1e-5, equal_nan=True)


def test_reduce_by_key_nan_propagates(backend):
    k = np.array([0, 0, 1, 2])
    v = np.array([1.0, np.nan, 2.0, 3.0])
    for op in ("sum", "min", "max", "mean", "prod"):
        got = P.reduce_by_key(k, v, op, num_keys=3)
        assert np.isnan(got[0]) and not np.isnan(got[1:]).any(), op


def test_reduce_by_key_ints_and_errors(backend, rng):
    k = rng.integers(0, 5, 300)
    v = rng.integers(-(2**31), 2**31 - 1, 300).astype(np.int32)
    got = P.reduce_by_key(k, v)
    assert got.dtype == np.int64
    assert np.array_equal(got, np.array([v[k == i].astype(np.int64).sum() for i in range(5)]))
    with pytest.raises(InputError, match=r"'keys' must lie in \[0, num_keys=3\). Found 4"):
        P.reduce_by_key([0, 4], [1.0, 2.0], num_keys=3)
    with pytest.raises(InputError, match="Found -1"):
        P.reduce_by_key([0, -1], [1.0, 2.0])
    with pytest.raises(InputError, match="same length"):
        P.reduce_by_key([0, 1], [1.0])
    with pytest.raises(InputError, match="'keys' must be integers"):
        P.reduce_by_key([0.0, 1.0], [1.0, 2.0])


@pytest.mark.parametrize("n", [1, 2, 33, 1000])
def test_compact(backend, rng, n):
    x = rng.standard_normal(n)
    for density in (0.0, 0.5, 1.0):
        m = rng.random(n) < density
        v, i = P.compact(x, m, return_indices=True)
        assert np.array_equal(v, x[m]) and np.array_equal(i, np.nonzero(m)[0])
        assert np.array_equal(P.compact(x, m), x[m])
    rows = rng.standard_normal((n, 4))
    m = rng.random(n) < 0.3
    assert np.array_equal(P.compact(rows, m), rows[m])
    t = torch.from_numpy(x)
    assert torch.equal(P.compact(t, torch.from_numpy(m[:, None].repeat(1, 1)[:, 0])), t[torch.from_numpy(m)])


def test_compact_errors():
    with pytest.raises(InputError, match="'mask' must be boolean"):
        P.compact([1, 2], [1, 0])
    with pytest.raises(InputError, match="length len"):
        P.compact([1, 2], [True])


def test_document_002_split_passes():
    keys = torch.tensor([4, 7, 2, 6, 3, 5, 1, 0])
    order_after = {1: [4, 2, 6, 0, 7, 3, 5, 1], 2: [4, 0, 5, 1, 2, 6, 7, 3], 3: [0, 1, 2, 3, 4, 5, 6, 7]}
    for passes, want in order_after.items():
        perm = split_radix_argsort(keys, passes)
        assert keys[perm].tolist() == want


@pytest.mark.parametrize("n", [1, 2, 40, 700])
def test_radix_sort_stable(backend, rng, n):
    k = rng.integers(-5, 6, n).astype(np.int32)
    v = np.arange(n)
    sk, sv = P.radix_sort(k, v)
    order = np.argsort(k, kind="stable")
    assert np.array_equal(sk, k[order]) and np.array_equal(sv, order)
    sk, sv = P.radix_sort(k, v, descending=True)
    order_d = np.array(sorted(range(n), key=lambda i: (-int(k[i]), i)))
    assert np.array_equal(sv, order_d)
    big = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, n, dtype=np.int64)
    assert np.array_equal(P.radix_sort(big), np.sort(big))


def test_radix_sort_floats_nan_negzero(backend, rng):
    x = rng.standard_normal(300)
    x[::17] = np.nan
    x[5], x[6], x[7] = -0.0, 0.0, -np.inf
    sk, perm = P.radix_sort(x, np.arange(300))
    order = np.argsort(x, kind="stable")
    assert np.array_equal(perm, order)  # NaN last, -0.0 ties with 0.0
    assert np.array_equal(sk, x[order], equal_nan=True) and np.signbit(sk[perm == 5][0])  # keys kept as given
    _, perm = P.radix_sort(x, np.arange(300), descending=True)
    key = [(0 if np.isnan(x[i]) else 1, -x[i] if not np.isnan(x[i]) else 0, i) for i in range(300)]
    assert np.array_equal(perm, np.array([t[2] for t in sorted(key)]))  # NaN first descending
    b = rng.random(50) < 0.5
    assert np.array_equal(P.radix_sort(b), np.sort(b))
    with pytest.raises(InputError, match="'values' must have len"):
        P.radix_sort([1, 2], [1])
