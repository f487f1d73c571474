"""Bugs found by trying densitas as a new user: data at the ends of the float64 range, discrete columns under
LSCV in d-D, and the CPU thread policy."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from densitas._backend import policy
from densitas.exceptions import InputError
from densitas.kde import KernelDensity, bandwidth, lscv_objective
from densitas.kde import selectors as sel
from densitas.kde.selectors import SELECTORS, DegenerateBandwidthWarning, TieReport

# ------------------------------------------------------------------------- scale: 1e±300 and beyond


@pytest.mark.parametrize("factor", [1e300, 1e-300, 2.0**-1074 * 2**60])
@pytest.mark.parametrize("method", SELECTORS.names())
def test_1d_extreme_scales_give_the_scaled_bandwidth(rng, method, factor):
    x = np.r_[rng.normal(size=300), rng.normal(3.0, 0.5, size=100)]
    want = bandwidth(x, method, device="cpu")
    got = bandwidth(x * factor, method, device="cpu")
    assert got == pytest.approx(factor * want, rel=1e-10)


@pytest.mark.parametrize("factor", [1e150, 1e-150])
@pytest.mark.parametrize("method", SELECTORS.multivariate)
def test_dd_extreme_scales_give_the_scaled_matrix(rng, method, factor):
    """H(c·x) = c²·H(x). The data are rescaled by powers of two, so c·x reaches the selector as x times a factor
    near 1, rounded: closed forms then agree to rounding, while the LSCV_H optimizer (BFGS, gtol 1e-7) may stop a
    step apart (2e-8 relative seen; seed 2501022221) — hence 1e-6, still a millionth of any error of the scaling."""
    x = rng.normal(size=(120, 2)) @ np.array([[1.0, 0.5], [0.0, 0.4]])
    want = bandwidth(x, method, device="cpu")
    got = bandwidth(x * factor, method, device="cpu")
    rtol = 1e-6 if method == "lscv_H" else 1e-10
    np.testing.assert_allclose(got / factor**2, want, rtol=rtol, atol=rtol * np.abs(want).max())


@pytest.mark.parametrize("factor", [1e300, 1e-300])
def test_dd_matrix_beyond_float64_is_refused(rng, factor):
    """H scales with the square of the data: at 1e±300 it overflows or underflows float64, which is said."""
    x = rng.normal(size=(50, 2)) * factor
    with pytest.raises(InputError):
        bandwidth(x, "scott", device="cpu")
    with pytest.raises(InputError):  # one column as (n, 1): H = [[h²]], for a univariate method too
        bandwidth(x[:, :1], "plugin", device="cpu")
    with pytest.raises(InputError):
        KernelDensity().fit(x[:, :1])


def test_scaling_is_a_power_of_two_and_only_where_needed(rng):
    x = rng.normal(size=(40, 3)) * np.array([1.0, 1e40, 1e-40])
    s = sel.prepare(x, device="cpu")
    f = sel.Scaling.of(s).factors
    assert f[0] == 1.0 and np.all(np.frexp(f)[0] == 0.5)  # powers of two: dividing by them is exact
    assert 0.5 <= np.ptp(x[:, 1]) / f[1] < 1.0 and 0.5 <= np.ptp(x[:, 2]) / f[2] < 1.0


# ------------------------------------------------------------------------------ discrete LSCV in d-D


def _poisson_frame(rng, n):
    return pd.DataFrame({"price": rng.poisson(64, n), "qty": rng.poisson(5, n)})


@pytest.mark.parametrize("method", ["lscv_h", "lscv_H"])
def test_discrete_columns_warn_in_dd_and_name_them(rng, method):
    df = _poisson_frame(rng, 300)
    with pytest.warns(DegenerateBandwidthWarning) as caught:
        bandwidth(df, method, device="cpu", **({"maxiter": 5} if method == "lscv_H" else {}))
    assert len(caught) == 1  # once, with the columns named
    text = str(caught[0].message)
    assert "'price'" in text and "'qty'" in text


@pytest.mark.parametrize("method", ["lscv_h", "lscv_H"])
def test_one_discrete_column_is_named_alone(rng, method):
    """No two rows tie, yet LSCV collapses H along the discrete column (lscv_H drove its variance to ~1e-14)."""
    df = pd.DataFrame({"x": rng.normal(size=300), "qty": rng.poisson(3, 300)})
    with pytest.warns(DegenerateBandwidthWarning) as caught:
        bandwidth(df, method, device="cpu")
    text = str(caught[0].message)
    assert "'qty'" in text and "'x'" not in text


def test_continuous_data_do_not_warn(rng):
    x = rng.normal(size=(300, 2))
    x[1] = x[0]  # one duplicated row is not enough to make LSCV unbounded
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bandwidth(x, "lscv_h", device="cpu")


def _tie_brute(x, w):
    n_rows, d = x.shape
    tied = sum(w[i] * w[j] for i in range(n_rows) for j in range(i + 1, n_rows) if np.array_equal(x[i], x[j]))
    n, sw2 = w.sum(), (w * w).sum()
    return tied, (sw2 + 2 * tied) / n**2 - 2 ** (d / 2 + 1) * (sw2 - n + 2 * tied) / (n * (n - 1))


@pytest.mark.parametrize("d", [1, 2, 3])
def test_tie_report_against_brute_force(rng, d):
    x = rng.integers(0, 3, size=(60, d)).astype(float)
    w = rng.integers(1, 4, size=60).astype(float)
    rep = TieReport.of(torch.from_numpy(x), torch.from_numpy(w), float(w.sum()), float((w * w).sum()))
    tied, coef = _tie_brute(x, w)
    assert rep.tied_pairs == pytest.approx(tied, rel=1e-12) and rep.coefficient == pytest.approx(coef, rel=1e-10)


@pytest.mark.parametrize("values", [2, 40, 10_000])
def test_tie_report_says_what_lscv_does_as_h_goes_to_zero(rng, values):
    """Independent check through the criterion itself: LSCV(tH) for t → 0 falls without bound exactly when the
    report calls the sample degenerate."""
    x = rng.integers(0, values, size=200).astype(float)
    report = TieReport.of(torch.from_numpy(x[:, None]), None, 200.0, 200.0)
    base = np.var(x)
    lscv = [lscv_objective(x, np.sqrt(base * t), device="cpu") for t in (1e-12, 1e-16)]
    if report.degenerate:
        assert lscv[1] < lscv[0] < 0
    else:
        assert lscv[1] > lscv[0] > 0


# ------------------------------------------------------------------------------------- thread policy


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_small_selection_runs_on_one_thread_and_restores(monkeypatch, rng, two_threads):
    monkeypatch.delenv("DENSITAS_THREADS", raising=False)
    seen = []
    real = sel.gauss_sums

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(sel, "gauss_sums", spy)
    monkeypatch.setattr(sel._pairhist, "histogram_pays", lambda *args: False)  # the grid search's pair sums
    bandwidth(rng.normal(size=(200, 2)), "lscv_h", device="cpu")
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == 2
    monkeypatch.setenv("DENSITAS_THREADS", "torch")  # the opt-out keeps PyTorch's setting
    seen.clear()
    bandwidth(rng.normal(size=(200, 2)), "lscv_h", device="cpu")
    assert set(seen) == {2}


def test_thread_count_rules(monkeypatch, two_threads):
    monkeypatch.delenv("DENSITAS_THREADS", raising=False)
    big = policy.PARALLEL_MIN_WORK
    assert policy.cpu_threads(big - 1) == 1
    monkeypatch.setattr(policy, "_free_cores", lambda cores: 2.3)  # idle machine
    assert policy.cpu_threads(big) == 2
    monkeypatch.setattr(policy, "_free_cores", lambda cores: -3.0)  # others keep every core busy
    assert policy.cpu_threads(big) == 1
    monkeypatch.setenv("DENSITAS_THREADS", "3")
    assert policy.cpu_threads(1) == 3
    for bad in ("0", "many"):
        monkeypatch.setenv("DENSITAS_THREADS", bad)
        with pytest.raises(InputError):
            policy.cpu_threads(1)


def test_thread_policy_restores_after_an_error(monkeypatch, two_threads):
    monkeypatch.delenv("DENSITAS_THREADS", raising=False)
    with pytest.raises(InputError), policy.thread_policy("cpu", 10):
        assert torch.get_num_threads() == 1
        raise InputError("boom")
    assert torch.get_num_threads() == 2


def test_overlapping_policy_blocks_restore_once(monkeypatch, two_threads):
    """Blocks that overlap without nesting (two Python threads) share the process-wide count: the last one out
    restores it, and the first one out leaves the other's setting alone."""
    monkeypatch.delenv("DENSITAS_THREADS", raising=False)
    first, second = policy.thread_policy("cpu", 10), policy.thread_policy("cpu", 10)
    assert first.__enter__() == 1 and second.__enter__() == 1
    first.__exit__(None, None, None)
    assert torch.get_num_threads() == 1  # the second block is still running
    second.__exit__(None, None, None)
    assert torch.get_num_threads() == 2


def test_tied_pairs_of_all_columns_at_once_equal_per_column_unique(rng):
    """The batched count (one sort of every column) equals a per-column ``unique`` count, weighted or not."""
    x = torch.from_numpy(rng.integers(0, 6, size=(300, 4)).astype(float))
    x[:, 3] = torch.from_numpy(rng.normal(size=300))  # a column without ties
    for w in (None, torch.from_numpy(rng.uniform(0.5, 2.0, 300))):
        got = sel._tied_pairs_per_column(x, w)
        want = [TieReport.of(x[:, j:j + 1], w, 300.0, 300.0).tied_pairs for j in range(4)]
        np.testing.assert_allclose(got, want, rtol=1e-12)
        assert got[3] == 0.0
