"""reduce / scan / segmented_scan against NumPy float64 references, on both backends."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from densitas import InputError
from densitas import primitives as P

SIZES = [1, 2, 31, 33, 97, 1000]
NP_SCAN = {"sum": np.cumsum, "prod": np.cumprod, "min": np.minimum.accumulate, "max": np.maximum.accumulate}
NP_RED = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max, "mean": np.mean}
IDENT = {"sum": 0.0, "prod": 1.0, "min": np.inf, "max": -np.inf}


def np_scan(x, op, inclusive=True, reverse=False, axis=-1):
    x = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
    if reverse:
        x = x[..., ::-1]
    if not inclusive:
        x = np.concatenate([np.full((*x.shape[:-1], 1), IDENT[op]), x[..., :-1]], axis=-1)
    r = NP_SCAN[op](x, axis=-1)
    if reverse:
        r = r[..., ::-1]
    return np.moveaxis(r, -1, axis)


def test_document_002_examples(backend):
    x = [3, 1, 7, 0, 4, 1, 6, 3]
    assert P.scan(x, inclusive=False).tolist() == [0, 3, 4, 11, 11, 15, 16, 22]
    assert P.scan(x).tolist() == [3, 4, 11, 11, 15, 16, 22, 25]
    assert P.reduce(x) == 25 and P.reduce(x, "max") == 7


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
def test_scan_float_matches_numpy(backend, rng, n, op):
    x = rng.uniform(0.5, 1.5, n) if op == "prod" else rng.standard_normal(n)
    x = x.astype(np.float32)
    for inclusive in (True, False):
        for reverse in (False, True):
            got = P.scan(x, op, inclusive=inclusive, reverse=reverse)
            want = np_scan(x, op, inclusive, reverse)
            assert got.dtype == np.float32 and got.shape == x.shape
            if op == "sum":
                scale = np_scan(np.abs(x), "sum", inclusive, reverse) + 1
                assert np.all(np.abs(got - want) <= 1e-5 * scale), (inclusive, reverse)
            else:  # the exclusive identity of min/max is ±inf and must match exactly
                np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"{inclusive=} {reverse=}")


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.bool_])
def test_scan_integers_exact_no_float(backend, rng, dtype):
    x = rng.integers(0, 2 if dtype == np.bool_ else 100, 555).astype(dtype)
    for op in ("sum", "min", "max"):
        got = P.scan(x, op, inclusive=False)
        want = np_scan(x, op, inclusive=False)
        if op == "sum":
            assert got.dtype == np.int64
        else:
            assert got.dtype == x.dtype
            want[0] = got[0]  # identity of an integer min/max is the dtype's extreme, checked below
        assert np.array_equal(got.astype(np.float64), want)
    big = np.full(300, 2**31 - 1, dtype=np.int32)  # sums overflow int32 but not int64
    assert P.scan(big)[-1] == 300 * (2**31 - 1)
    assert P.scan(np.array([5, 3], dtype=np.int32), "min", inclusive=False)[0] == np.iinfo(np.int32).max


def test_scan_axis_noncontiguous_torch_and_pandas(backend, rng):
    a = rng.standard_normal((7, 45))
    for axis in (0, 1, -1):
        assert np.allclose(P.scan(a, "sum", axis=axis), np.cumsum(a, axis=axis))
    t = torch.from_numpy(a).t()  # non-contiguous
    out = P.scan(t, "max", axis=0)
    assert isinstance(out, torch.Tensor) and torch.allclose(out, torch.cummax(t, 0).values)
    s = pd.Series(a[0])
    assert np.allclose(P.scan(s), np.cumsum(a[0]))
    assert np.allclose(P.scan(a[::-1, ::3]), np.cumsum(a[::-1, ::3], axis=-1))


def test_scan_nan_and_empty(backend):
    x = np.array([1.0, np.nan, 2.0, 3.0], dtype=np.float32)
    for op in ("sum", "max", "min"):
        got = P.scan(x, op)
        assert got[0] == 1 and np.isnan(got[1:]).all()
    assert P.scan(np.zeros(0)).shape == (0,)
    assert P.scan(np.zeros((3, 0))).shape == (3, 0)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max", "mean"])
def test_reduce_matches_numpy(backend, rng, n, op):
    x = (rng.uniform(0.9, 1.1, n) if op == "prod" else rng.standard_normal(n)).astype(np.float32)
    got = P.reduce(x, op)
    want = NP_RED[op](x.astype(np.float64))
    assert np.isscalar(got) and abs(got - want) <= 1e-6 * max(1.0, NP_RED["sum"](np.abs(x.astype(np.float64))))


def test_reduce_axis_ints_nan_empty(backend, rng):
    a = rng.integers(-50, 50, (6, 9)).astype(np.int16)
    for op in ("sum", "min", "max", "mean"):
        for axis in (None, 0, 1):
            got = P.reduce(a, op, axis=axis)
            assert np.array_equal(np.asarray(got, dtype=np.float64), NP_RED[op](a.astype(np.float64), axis=axis))
    assert P.reduce(a).dtype == np.int64
    assert P.reduce(np.full(5000, 2**31 - 1, dtype=np.int32)) == 5000 * (2**31 - 1)
    assert np.isnan(P.reduce(np.array([1.0, np.nan]), "max")) and np.isnan(P.reduce(np.array([np.nan, 1.0])))
    assert P.reduce(np.zeros(0)) == 0 and P.reduce(np.zeros(0), "prod") == 1
    with pytest.raises(InputError, match="empty input 'x'"):
        P.reduce(np.zeros(0), "min")


def test_reduce_float32_1e8_accuracy():
    x = torch.rand(10**8, generator=torch.Generator().manual_seed(1))
    ref = float(x.double().sum())
    assert abs(float(P.reduce(x)) - ref) / ref <= 1e-6


def _seg_ref(x, seg, op, inclusive):
    out = np.empty(len(x))
    for s in np.unique(seg):
        idx = np.nonzero(seg == s)[0]
        out[idx] = np_scan(x[idx], op, inclusive)
    return out


@pytest.mark.parametrize("n", [1, 2, 33, 250])
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
def test_segmented_scan(backend, rng, n, op):
    x = rng.uniform(0.5, 1.5, n).astype(np.float32)
    seg = np.sort(rng.integers(-3, max(n // 7, 1), n))
    for inclusive in (True, False):
        got = P.segmented_scan(x, seg, op, inclusive=inclusive)
        want = _seg_ref(x.astype(np.float64), seg, op, inclusive)
        assert np.allclose(got, want, rtol=1e-5), (inclusive, got[:10], want[:10])
    xi = rng.integers(0, 9, n)
    assert np.array_equal(P.segmented_scan(xi, seg), _seg_ref(xi, seg, "sum", True))


def test_segmented_scan_skewed_lengths(backend, rng):
    # one long segment and many length-1 ones: padding every segment to the longest would be quadratic
    n = 3000
    seg = np.concatenate([np.zeros(1500, dtype=np.int64), np.arange(1, 1501)])
    x = rng.standard_normal(n)
    for op in ("sum", "max"):
        np.testing.assert_allclose(P.segmented_scan(x, seg, op), _seg_ref(x, seg, op, True), rtol=1e-9, atol=1e-9)


def test_bad_inputs():
    with pytest.raises(InputError, match="'op' parameter of scan"):
        P.scan([1, 2], "avg")
    with pytest.raises(InputError, match="'axis'"):
        P.scan([1, 2], axis=3)
    with pytest.raises(InputError, match="'inclusive'"):
        P.scan([1, 2], inclusive="yes")
    with pytest.raises(InputError, match="non-decreasing; position 2 holds 0"):
        P.segmented_scan([1, 2, 3], [0, 1, 0])
    with pytest.raises(InputError, match="'segment_ids' must be 1-D"):
        P.segmented_scan([1, 2, 3], [0, 1])
    with pytest.raises(InputError, match="'x' must be a numeric"):
        P.reduce(np.array(["a", "b"]))
    with pytest.raises(InputError, match="'device'"):
        P.reduce([1.0], device="tpu")
