"""The GREG estimator on its own, against direct computation and repeated sampling from a fixed population."""

from __future__ import annotations

import json
import os

import duckdb
import numpy as np
import pandas as pd
import pytest

from densitas.aqp import Engine
from densitas.aqp.estimator import MIN_ROWS_PER_TERM, Auxiliaries, regression_totals

SEED = int(os.environ.get("DENSITAS_TEST_SEED", "7"))


def _population(rng, N=20_000):
    x = rng.uniform(size=N)
    y = np.where(x > 0.3, 1.0, 0.0) * (1 + np.sin(6 * x)) + 0.3 * rng.normal(size=N)  # not linear in x
    z = np.stack([x, x * x], axis=1)  # the auxiliaries: a poor model of y
    return x, y, z


def _one_group(y, z, rows, N):
    aux = [Auxiliaries(rows=z[rows], totals=z.sum(axis=0)[None, :])]
    return regression_totals(y[rows, None], aux, np.zeros(len(rows), dtype=np.int64), np.array([float(N)]),
                             np.array([float(len(rows))]))


def test_linear_target_is_exact_and_has_no_variance():
    rng = np.random.default_rng(SEED)
    x, _, z = _population(rng)
    y = 3 * z[:, 0] - 2 * z[:, 1] + 5
    t = _one_group(y, z, rng.choice(len(x), 400, replace=False), len(x))
    assert t.value[0, 0] == pytest.approx(y.sum(), rel=1e-9), f"seed {SEED}"
    assert t.sampling_variance(np.array([0]), [0], [1.0])[0] == pytest.approx(0.0, abs=1e-6 * y.sum() ** 2)


def test_whole_population_as_sample_is_exact():
    rng = np.random.default_rng(SEED)
    x, y, z = _population(rng, 3000)
    t = _one_group(y, z, np.arange(len(x)), len(x))
    assert t.value[0, 0] == pytest.approx(y.sum(), rel=1e-9)
    assert t.sampling_variance(np.array([0]), [0], [1.0])[0] == 0.0


def test_repeated_sampling_unbiased_with_honest_variance():
    """Over 400 simple random samples of 500 rows from a fixed population the estimator is unbiased, its
    estimated variance matches the variance of the estimates, and 95% intervals cover 91-99% of the time."""
    rng = np.random.default_rng(SEED)
    x, y, z = _population(rng)
    est, var = [], []
    for _ in range(400):
        t = _one_group(y, z, rng.choice(len(x), 500, replace=False), len(x))
        est.append(t.value[0, 0])
        var.append(t.sampling_variance(np.array([0]), [0], [1.0])[0])
    est, var = np.array(est), np.array(var)
    T, sd = y.sum(), est.std()
    assert abs(est.mean() - T) < 4 * sd / np.sqrt(len(est)), f"seed {SEED}"
    assert var.mean() == pytest.approx(sd**2, rel=0.2), f"seed {SEED}"
    cover = np.mean(np.abs(est - T) < 1.96 * np.sqrt(var))
    assert 0.91 <= cover <= 0.99, f"seed {SEED}: coverage {cover}"
    # the model helps: the variance is below that of the plain expansion estimator N·ȳ
    plain = len(x) ** 2 * y.var() / 500 * (1 - 500 / len(x))
    assert sd**2 < plain


def test_small_groups_use_the_difference_estimator():
    """A group with fewer than MIN_ROWS_PER_TERM rows per term keeps the model's prediction with weight 1:
    its answer is Z₀ + N/n·Σ(y − z₀), computed here directly."""
    rng = np.random.default_rng(SEED)
    N, n = np.array([500.0, 5000.0]), np.array([12.0, 600.0])  # group 0 is too small for 3 terms
    gid = np.repeat([0, 1], n.astype(int))
    z = rng.uniform(size=(len(gid), 2))
    y = 2 * z[:, 0] + rng.normal(size=len(gid))
    totals = np.array([[250.0, 240.0], [2500.0, 2510.0]])
    t = regression_totals(y[:, None], [Auxiliaries(z, totals)], gid, N, n)
    assert n[0] < MIN_ROWS_PER_TERM * 3
    direct = totals[0, 0] + N[0] / n[0] * (y[gid == 0] - z[gid == 0, 0]).sum()
    assert t.value[0, 0] == pytest.approx(direct, rel=1e-12)
    assert t.df[0, 0] == n[0] - 1


def test_collinear_auxiliaries_keep_the_model_weights():
    """Two copies of the model's prediction (collinear among the sample rows) give the same answer as one."""
    rng = np.random.default_rng(SEED)
    x, y, z = _population(rng)
    rows = rng.choice(len(x), 300, replace=False)
    one = _one_group(y, z[:, :1], rows, len(x))
    two = _one_group(y, np.concatenate([z[:, :1], z[:, :1]], axis=1), rows, len(x))
    assert np.isfinite(two.value).all()
    assert two.value[0, 0] == pytest.approx(one.value[0, 0], rel=1e-6)


def test_mid_sized_groups_fit_the_model_prediction_and_an_intercept():
    """A group with enough rows for two terms but not for all fits y − m on (1, m) only (the simple regression
    estimator), computed here directly."""
    rng = np.random.default_rng(SEED)
    N, n = np.array([900.0]), np.array([30.0])  # 30 < 10 × 4 terms, >= 10 × 2
    gid = np.zeros(30, dtype=np.int64)
    z = rng.uniform(size=(30, 3))
    y = 3 * z[:, 0] + rng.normal(size=30)
    totals = np.array([[450.0, 460.0, 440.0]])
    t = regression_totals(y[:, None], [Auxiliaries(z, totals)], gid, N, n)
    X = np.stack([np.ones(30), z[:, 0]], axis=1)
    b = np.linalg.lstsq(X, y - z[:, 0], rcond=None)[0]
    b[1] += 1.0
    direct = N[0] * b[0] + totals[0, 0] * b[1] + N[0] / n[0] * (y - X @ b).sum()
    assert t.value[0, 0] == pytest.approx(direct, rel=1e-9), f"seed {SEED}"


def test_round_off_term_gets_no_weight():
    """A term whose sample values are round-off (every sampled row at the middle of a bin's position term,
    say: ±1e-17) while its population total is not must get no weight: rescaled to unit size it once took a
    weight of 1e14 and put the answer at 1e16. Elsewhere (another group) the same term is real and is used."""
    rng = np.random.default_rng(SEED)
    n, N = 300, 30_000
    gid = np.repeat([0, 1], n)
    m = np.ones(2 * n)  # the model's prediction: one per row (a count)
    pos = np.where(gid == 0, rng.choice([-1.6e-17, 1.1e-17], 2 * n), rng.uniform(-0.5, 0.5, 2 * n))
    y = 1.0 + 0.8 * np.where(gid == 1, pos, 0.0) + 0.1 * rng.normal(size=2 * n)
    totals = np.array([[N, 250.0], [N, 40.0]])  # the term's population totals are not round-off in either
    t = regression_totals(y[:, None], [Auxiliaries(np.stack([m, pos], axis=1), totals)], gid,
                          np.array([N, N], dtype=float), np.array([n, n], dtype=float))
    # group 0: the plain expansion N·ȳ, to the last digits (a weight of 1e-3 on the term would move it 0.25)
    assert t.value[0, 0] == pytest.approx(y[gid == 0].mean() * N, rel=1e-9), f"seed {SEED}"
    # group 1: the term is used: the regression estimator N·ȳ + b·(Z − N·x̄), b the least-squares slope
    y1, x1 = y[gid == 1], pos[gid == 1]
    b = np.polyfit(x1, y1, 1)[0]
    assert t.value[1, 0] == pytest.approx(N * y1.mean() + b * (40.0 - N * x1.mean()), rel=1e-9), f"seed {SEED}"


@pytest.mark.parametrize("path", ["stacked", "sparse", "many groups"])
@pytest.mark.parametrize("rows_on", [1, MIN_ROWS_PER_TERM - 1])
def test_term_on_too_few_rows_is_not_fitted(rows_on, path, monkeypatch):
    """A term non-zero on fewer than MIN_ROWS_PER_TERM of a group's sample rows, whose model total is far from
    what those rows suggest (a cut bin's term seen on one row of flights' AA/JFK: total −317 against −1.3 from
    the sample), is left out of that group's fit: the answer is the fit without it. Fitted, it took
    negative calibration weights down to −58 and put a SUM 800× off. Another group, where the same term is
    on many rows, fits it. On every path of the fit: all terms dense and stacked, the term kept sparse (its
    rows counted from its positions), and the per-row gathers of many groups."""
    import densitas.aqp.estimator as est

    if path == "sparse":
        monkeypatch.setattr(est, "SPARSE_FROM_ROWS", 0)
    if path == "many groups":
        monkeypatch.setattr(est, "FEW_GROUPS", 0)
        monkeypatch.setattr(est, "PRODUCT_GROUPS", 0)
    rng = np.random.default_rng(SEED)
    n, N = 400, 4_000
    gid = np.repeat([0, 1], n)
    pred = rng.uniform(0.5, 1.5, 2 * n)  # the model's prediction
    z = rng.uniform(size=2 * n)
    lone = np.where(gid == 1, rng.uniform(-0.5, 0.5, 2 * n), 0.0)
    lone[rng.choice(n, rows_on, replace=False)] = 0.01
    y = pred + 0.5 * z + 0.8 * lone + 0.2 * rng.normal(size=2 * n)
    w = N / n
    tot = np.array([[w * pred[gid == g].sum(), w * z[gid == g].sum() * 1.02] for g in (0, 1)])
    lone_tot = np.array([[-300.0], [w * lone[gid == 1].sum() + 50.0]])  # group 1: the term moves the answer 40
    Nn, nn = np.array([N, N], dtype=float), np.array([n, n], dtype=float)
    if path == "sparse":
        pos = np.flatnonzero(lone)
        aux = Auxiliaries.from_terms(np.stack([pred, z]), np.hstack([tot, lone_tot]), [(pos, lone[pos])])
    else:
        aux = Auxiliaries(np.stack([pred, z, lone], axis=1), np.hstack([tot, lone_tot]))
    got = regression_totals(y[:, None], [aux], gid, Nn, nn)
    ref = regression_totals(y[:, None], [Auxiliaries(np.stack([pred, z], axis=1), tot)], gid, Nn, nn)
    assert got.value[0, 0] == pytest.approx(ref.value[0, 0], rel=1e-9), f"seed {SEED}"
    assert abs(got.value[0, 0] - y[gid == 0].sum() * w) < 0.05 * y[gid == 0].sum() * w, f"seed {SEED}"
    assert got.value[1, 0] - ref.value[1, 0] == pytest.approx(0.8 * 50.0, rel=0.3), f"seed {SEED}"  # used there


@pytest.mark.parametrize("spread", [3e-5, 1e-3])
def test_nearly_collinear_terms_do_not_extrapolate(spread):
    """Two terms equal among the sampled rows up to 3e-5 (or 1e-3) but apart elsewhere (rows the sample
    missed): the direction between them carries less than one row's worth of the sample and must be dropped
    (the √ε cut, or MIN_INFORMATION); kept, it took a weight in the hundreds and moved the answer by far more
    than its interval."""
    rng = np.random.default_rng(SEED)
    N, n = 20_000, 300
    m = rng.uniform(0.5, 1.5, N)
    z1 = m + spread * rng.normal(size=N)
    z1[:1000] += 1.0  # apart where the sample did not look
    y = m + 0.3 * rng.normal(size=N)
    rows = rng.choice(np.arange(1000, N), n, replace=False)
    z = np.stack([m, z1], axis=1)
    t = _one_group(y, z, rows, N)
    g, W = np.array([0]), np.ones((1, 1))
    hw = 1.96 * np.sqrt(t.variance_of(g, W, [0])[0] - t.extrapolation_variance(g, W)[0])  # the residuals' only
    assert abs(t.value[0, 0] - y.sum()) < 3 * hw, f"seed {SEED}"


def test_what_a_dropped_direction_would_add_is_in_the_interval(monkeypatch):
    """A term equal to the model's prediction among the sampled rows up to noise of 1e-3 (a direction under one
    row's worth: left out of the estimate), and the target itself; 40 rows the sample missed carry it 50 apart.
    The estimate misses them by far more than its residuals show (as population's SUM missed 31.7 M inside ±2.8 M);
    the interval counts what the fit with that direction would add, at its full size, and holds the truth."""
    import densitas.aqp.estimator as est

    rng = np.random.default_rng(SEED)
    N, n = 20_000, 300
    m = rng.uniform(0.5, 1.5, N)
    z1 = m + 1e-3 * rng.normal(size=N)
    z1[:40] += 50.0
    y = z1.copy()
    rows = rng.choice(np.arange(1000, N), n, replace=False)
    z = np.stack([m, z1], axis=1)
    t = _one_group(y, z, rows, N)
    g, W = np.array([0]), np.ones((1, 1))
    var, extra = t.variance_of(g, W, [0])[0], t.extrapolation_variance(g, W)[0] + t.extrapolation_noise(g, W)[0]
    err = t.value[0, 0] - y.sum()
    assert abs(err) > 10 * np.sqrt(var - extra), f"seed {SEED}: the residuals alone do not see the 40 rows"
    assert abs(err) < 1.96 * np.sqrt(var), f"seed {SEED}: {err} outside ±{1.96 * np.sqrt(var)}"
    monkeypatch.setattr(est, "MIN_INFORMATION", 0.0)  # the fit with the direction
    full = _one_group(y, z, rows, N)
    assert full.extrapolation is None, f"seed {SEED}"
    assert t.extrapolation[0, 0] == pytest.approx(full.value[0, 0] - t.value[0, 0], rel=1e-6), f"seed {SEED}"


def test_the_extrapolation_is_the_answer_of_the_fit_with_every_direction_in_every_kind_of_group(monkeypatch):
    """Two keys over six groups of every kind the estimator treats apart (a full fit, one with too few rows per
    term: the prediction and an intercept, one too small even for that: the difference estimator, one with no
    sample), each with a term equal to the prediction up to 1e-3 among its sampled rows and 40 unsampled rows
    50 apart: per group and key, the extrapolation is what the fit with every direction answers less the estimate.
    Catches a two-term fit's, a tiny group's or the expansion weight's mistake in it."""
    import densitas.aqp.estimator as est

    rng = np.random.default_rng(SEED)
    sizes, Ns = [300, 25, 12, 8, 0, 150], [20_000, 3000, 2000, 1000, 500, 8000]
    K, G = 2, len(sizes)
    Z, rows, ys = np.zeros((K, G, 3)), [[] for _ in range(K)], [[] for _ in range(K)]
    for g, (Ng, ng) in enumerate(zip(Ns, sizes, strict=True)):
        s = rng.choice(np.arange(min(1000, Ng // 2), Ng), ng, replace=False) if ng else np.zeros(0, dtype=np.int64)
        for k in range(K):
            m = rng.uniform(0.5, 1.5, Ng)
            z1 = m + 1e-3 * rng.normal(size=Ng)
            z1[:40] += 50.0 * (k + 1)
            z2 = rng.uniform(size=Ng)
            y = z1 + 0.3 * z2 + 0.1 * rng.normal(size=Ng)
            Z[k, g] = [m.sum(), z1.sum(), z2.sum()]
            rows[k].append(np.stack([m[s], z1[s], z2[s]], axis=1))
            ys[k].append(y[s])
    gid = np.repeat(np.arange(G), sizes)
    y = np.stack([np.concatenate(ys[k]) for k in range(K)], axis=1)
    aux = [Auxiliaries(rows=np.concatenate(rows[k]), totals=Z[k]) for k in range(K)]
    N, n = np.array(Ns, dtype=float), np.array(sizes, dtype=float)
    t = regression_totals(y, aux, gid, N, n)
    monkeypatch.setattr(est, "MIN_INFORMATION", 0.0)
    full = regression_totals(y, aux, gid, N, n)
    assert t.extrapolation is not None and full.extrapolation is None, f"seed {SEED}"
    np.testing.assert_allclose(t.extrapolation, full.value - t.value, rtol=1e-6, atol=1e-9 * np.abs(t.value).max(),
                               err_msg=f"seed {SEED}")
    assert np.abs(t.extrapolation[0]).max() > 1000, f"seed {SEED}: the full fit's group extrapolates"


def test_a_fit_that_drops_no_direction_adds_nothing_to_the_variance():
    rng = np.random.default_rng(SEED)
    x, y, z = _population(rng)
    t = _one_group(y, z, rng.choice(len(x), 400, replace=False), len(x))
    assert t.extrapolation is None, f"seed {SEED}"
    assert t.extrapolation_variance(np.array([0]), np.ones((1, 1)))[0] == 0.0


def test_many_and_few_group_paths_agree(monkeypatch):
    """The per-group matrix products and slice sums (few groups) and the segmented reductions, gathers and
    bincounts (very many) give the same fit."""
    import densitas.aqp.estimator as est

    rng = np.random.default_rng(SEED)
    G, n = 40, 4000
    gid = np.sort(rng.integers(0, G, n))
    z = rng.uniform(size=(n, 3)) * (rng.uniform(size=(n, 1)) < 0.6)
    y = (z @ np.array([1.0, -2.0, 0.5]) + 0.2 * rng.normal(size=n)) * (z[:, 0] > 0)
    totals = rng.uniform(50, 80, size=(G, 3))
    N, nn = np.full(G, 1000.0), np.bincount(gid, minlength=G).astype(float)
    args = (y[:, None], [Auxiliaries(z, totals)], gid, N, nn)
    monkeypatch.setattr(est, "FEW_GROUPS", 0)
    monkeypatch.setattr(est, "PRODUCT_GROUPS", 0)
    many = regression_totals(*args)
    monkeypatch.setattr(est, "FEW_GROUPS", 10_000)
    monkeypatch.setattr(est, "PRODUCT_GROUPS", 10_000)
    few = regression_totals(*args)
    np.testing.assert_allclose(few.value, many.value, rtol=1e-10, err_msg=f"seed {SEED}")
    np.testing.assert_allclose(few.residuals, many.residuals, rtol=1e-8, atol=1e-12, err_msg=f"seed {SEED}")


def test_g_weights_calibrate_and_reproduce_the_estimate():
    """The g-weights are the GREG as a weighting: Σ (N/n)·g_i·x_i equals the known totals (calibration) and
    Σ (N/n)·g_i·y_i equals the estimate, group by group."""
    from densitas.aqp.estimator import _Design, _fit, _g_coefficients, _RowGroups

    rng = np.random.default_rng(SEED)
    G, n = 3, 900
    gid = np.sort(rng.integers(0, G, n))
    X = np.concatenate([np.ones((n, 1)), rng.uniform(size=(n, 2))], axis=1)
    y = X @ np.array([0.5, 2.0, -1.0]) + rng.normal(size=n)
    nn = np.bincount(gid, minlength=G).astype(float)
    N = nn * 20
    Xt = np.stack([np.bincount(gid, X[:, a], minlength=G) for a in range(3)], axis=1) * 20 * \
        (1 + 0.05 * rng.normal(size=(G, 3)))
    Xt[:, 0] = N
    fit = _fit(_Design(None, _RowGroups(gid, G), dense=np.ascontiguousarray(X.T)), y, nn)
    beta = fit.beta
    g = 1.0 + (X * _g_coefficients(Xt, fit.ginv, fit.xsum, N, nn)[gid]).sum(axis=1)
    w = (N / nn)[gid] * g
    for c in range(3):
        np.testing.assert_allclose(np.bincount(gid, w * X[:, c], minlength=G), Xt[:, c], rtol=1e-9,
                                   err_msg=f"seed {SEED}")
    greg = (Xt * beta).sum(axis=1) + (N / nn) * np.bincount(gid, y - (X * beta[gid]).sum(axis=1), minlength=G)
    np.testing.assert_allclose(np.bincount(gid, w * y, minlength=G), greg, rtol=1e-9, err_msg=f"seed {SEED}")


def test_directions_under_one_rows_worth_are_not_fitted():
    """Two terms that differ among 300 sampled rows only by noise of 1e-3 (an eigenvalue of about 1e-6 of the
    terms' unit-diagonal matrix, under 1/300): the fit takes no side between them (equal weights) instead of
    large opposite ones — the extrapolation that put a births SUM 21% off inside a ±1.3% interval."""
    from densitas.aqp.estimator import _Design, _fit, _RowGroups

    rng = np.random.default_rng(SEED)
    n = 300
    m = rng.uniform(0.5, 1.5, n)
    X = np.stack([np.ones(n), m, m + 1e-3 * rng.normal(size=n)], axis=1)
    y = 0.3 * rng.normal(size=n)
    design = _Design(None, _RowGroups(np.zeros(n, dtype=np.int64), 1), dense=np.ascontiguousarray(X.T))
    beta = _fit(design, y, np.array([float(n)])).beta
    assert abs(beta[0, 1] - beta[0, 2]) < 0.05, f"seed {SEED}: {beta}"


def _greg_group(y, Z, rows, Ng, ng, totals_g):
    """One group's GREG straight from its formulas, every sample row given and every term dense: the value and
    the variance residuals r (groups large and terms well conditioned, so none of the small-group, dead-term or
    collinearity branches applies)."""
    from densitas.aqp.estimator import MAX_LEVERAGE, MIN_INFORMATION, RCOND

    X = np.concatenate([np.ones((rows.sum(), 1)), Z[rows]], axis=1)
    Xt = np.concatenate([[Ng], totals_g])
    A = X.T @ X
    sc = np.sqrt(np.diag(A))
    inv = np.linalg.pinv(A / np.outer(sc, sc), rcond=max(RCOND, MIN_INFORMATION / ng), hermitian=True)
    inv = inv / np.outer(sc, sc)
    beta = inv @ X.T @ (y[rows] - Z[rows, 0])
    beta[1] += 1.0
    e = y[rows] - X @ beta
    h = np.einsum("ij,jk,ik->i", X, inv, X)
    w = Ng / ng
    c = inv @ (Xt - w * X.sum(axis=0)) / w
    r = e / (1 - np.minimum(h, MAX_LEVERAGE)) * (1 + X @ c)
    return Xt @ beta + w * e.sum(), r


def _greg_reference(y, Z, gid, N, n, totals):
    """The GREG of the module docstring group by group (:func:`_greg_group`): value and variance per group."""
    value, var = np.zeros(len(N)), np.zeros(len(N))
    for g in range(len(N)):
        value[g], r = _greg_group(y, Z, gid == g, N[g], n[g], totals[g])
        var[g] = N[g] ** 2 * (1 - n[g] / N[g]) / n[g] * r.var(ddof=1)
    return value, var


@pytest.mark.parametrize("sparse_from_rows", [0, 10**9])
def test_rows_and_terms_left_out_where_they_vanish_give_the_reference_answer(rng, monkeypatch, sparse_from_rows):
    """The fast layout — only the sample rows where y or a term is non-zero given, the others (same group
    count) taken in closed form, and terms that are non-zero on few rows passed sparse — gives the GREG computed
    straight from its formulas on every row with every term dense. Both are sums of the same products in
    another order on well-conditioned groups (p = 6, 400+ rows, condition number of the scaled Gram matrix
    far below 1e4): they agree to a few hundred ulps; 1e-9 leaves a wide margin. The sparse terms are taken on
    their rows only (``SPARSE_FROM_ROWS`` 0) or as dense rows (as on few rows given)."""
    import densitas.aqp.estimator as est

    monkeypatch.setattr(est, "SPARSE_FROM_ROWS", sparse_from_rows)
    G, n_rows = 3, 1500
    gid = np.sort(rng.integers(0, G, n_rows))
    inside = rng.uniform(size=n_rows) < 0.5  # the other rows: y and every term 0
    dense = rng.uniform(0.2, 1.0, size=(n_rows, 3)) * inside[:, None]
    # ~37 rows a group each (below the MIN_ROWS_PER_TERM a sparse term needs to be fitted about once in 10^6; the
    # reference fits every term): at 8%, ~20, a group fell below 10 in about one run in 25
    sparse_at = [inside & (rng.uniform(size=n_rows) < 0.15) for _ in range(2)]
    sparse = np.stack([np.where(a, rng.uniform(-0.5, 0.5, n_rows), 0.0) for a in sparse_at], axis=1)
    Z = np.concatenate([dense, sparse], axis=1)
    y = np.where(inside & (rng.uniform(size=n_rows) < 0.7), 1.0 + dense[:, 0] + rng.normal(size=n_rows), 0.0)
    n = np.bincount(gid, minlength=G).astype(float)
    N = n * 25.0
    totals = np.stack([np.bincount(gid, Z[:, a], minlength=G) for a in range(Z.shape[1])], axis=1) * 25.0 * \
        (1 + 0.05 * rng.normal(size=(G, Z.shape[1])))
    ref_value, ref_var = _greg_reference(y, Z, gid, N, n, totals)

    given = np.flatnonzero((Z != 0).any(axis=1) | (y != 0))
    assert len(given) < 0.7 * n_rows  # rows really are left out
    terms = np.ascontiguousarray(dense[given].T)
    sp = [(np.flatnonzero(a[given]), sparse[given, t][a[given]]) for t, a in enumerate(sparse_at)]
    fast = regression_totals(y[given, None], [Auxiliaries.from_terms(terms, totals, sp)], gid[given], N, n)
    np.testing.assert_allclose(fast.value[:, 0], ref_value, rtol=1e-9)
    np.testing.assert_allclose(fast.sampling_variance(np.arange(G), [0], [1.0]), ref_var, rtol=1e-9)
    whole = regression_totals(y[:, None], [Auxiliaries(Z, totals)], gid, N, n)  # every row, dense: the same
    np.testing.assert_allclose(whole.value[:, 0], ref_value, rtol=1e-9)
    np.testing.assert_allclose(whole.sampling_variance(np.arange(G), [0], [1.0]), ref_var, rtol=1e-9)


def test_rows_in_any_order_give_the_same_answer(rng):
    """The rows given need not be sorted by group: shuffled, the estimate, its variance and the residuals (in the
    caller's order) are those of the sorted rows (the same sums in another order: 1e-9 is far above their
    round-off)."""
    G, m = 3, 3000
    gid = np.sort(rng.integers(0, G, m))
    z = rng.uniform(size=(m, 2))
    y = (z[:, 0] + rng.normal(size=m))[:, None]
    totals = rng.uniform(50, 80, (G, 2))
    N, n = np.full(G, 10_000.0), np.bincount(gid, minlength=G).astype(float)
    ref = regression_totals(y, [Auxiliaries(z, totals)], gid, N, n)
    p = rng.permutation(m)
    got = regression_totals(y[p], [Auxiliaries(z[p], totals)], gid[p], N, n)
    np.testing.assert_allclose(got.value, ref.value, rtol=1e-9)
    np.testing.assert_allclose(got.sampling_variance(np.arange(G), [0], [1.0]),
                               ref.sampling_variance(np.arange(G), [0], [1.0]), rtol=1e-9)
    np.testing.assert_allclose(got.residuals, ref.residuals[p], rtol=1e-9, atol=1e-12)


def _greg_residuals(y, Z, gid, N, n, totals):
    """Per group the variance residuals r of the reference GREG (:func:`_greg_group`)."""
    return [_greg_group(y, Z, gid == g, N[g], n[g], totals[g])[1] for g in range(len(N))]


@pytest.mark.parametrize("sparse_from_rows", [0, 10**9])
def test_keys_with_different_terms_fitted_together_give_each_keys_reference(rng, monkeypatch, sparse_from_rows):
    """Two keys (a COUNT with 3 terms and a SUM with 5, one of them sparse) fitted in one call — stacked and
    padded to 5 terms where every term is dense (``SPARSE_FROM_ROWS`` above the rows), key by key otherwise —
    give each key's GREG from its formulas, and the variance of a combination of the keys (an AVG's
    ``SUM − a·COUNT``) is the reference's from the combined residuals. Well-conditioned groups, as in the test
    above: round-off of a few hundred ulps against 1e-9."""
    import densitas.aqp.estimator as est

    monkeypatch.setattr(est, "SPARSE_FROM_ROWS", sparse_from_rows)
    G, m = 3, 1500
    gid = np.sort(rng.integers(0, G, m))
    inside = rng.uniform(size=m) < 0.5
    v = rng.uniform(1.0, 3.0, m)
    z_count = rng.uniform(0.2, 1.0, size=(m, 3)) * inside[:, None]
    z_sum = np.concatenate([z_count * v[:, None], np.where(inside & (rng.uniform(size=m) < 0.1),
                                                           rng.uniform(-0.5, 0.5, m), 0.0)[:, None],
                            (v * inside)[:, None]], axis=1)
    y_count = np.where(inside & (rng.uniform(size=m) < 0.7), 1.0, 0.0)
    y_sum = y_count * v
    n = np.bincount(gid, minlength=G).astype(float)
    N = n * 30.0

    def totals_of(Z):
        return np.stack([np.bincount(gid, Z[:, a], minlength=G) for a in range(Z.shape[1])], axis=1) * 30.0 * \
            (1 + 0.05 * rng.normal(size=(G, Z.shape[1])))

    t_count, t_sum = totals_of(z_count), totals_of(z_sum)
    sp = [(np.flatnonzero(z_sum[:, 3]), z_sum[z_sum[:, 3] != 0, 3])]
    aux = [Auxiliaries(z_count, t_count),
           Auxiliaries.from_terms(np.ascontiguousarray(z_sum[:, [0, 1, 2, 4]].T), t_sum[:, [0, 1, 2, 4, 3]], sp)]
    est._WORK.get("stack", (2, 8, m))[:] = np.nan  # the memory the stacked designs reuse: padding must be zeroed
    got = regression_totals(np.stack([y_count, y_sum], axis=1), aux, gid, N, n)
    z_sum_order = z_sum[:, [0, 1, 2, 4, 3]]  # the dense terms first, then the sparse one (as its totals)
    for k, (y, Z, tot) in enumerate([(y_count, z_count, t_count), (y_sum, z_sum_order, t_sum[:, [0, 1, 2, 4, 3]])]):
        ref_value, ref_var = _greg_reference(y, Z, gid, N, n, tot)
        np.testing.assert_allclose(got.value[:, k], ref_value, rtol=1e-9)
        np.testing.assert_allclose(got.sampling_variance(np.arange(G), [k], [1.0]), ref_var, rtol=1e-9)
    a = got.value[:, 1] / got.value[:, 0]
    r_count = _greg_residuals(y_count, z_count, gid, N, n, t_count)
    r_sum = _greg_residuals(y_sum, z_sum_order, gid, N, n, t_sum[:, [0, 1, 2, 4, 3]])
    ref = np.array([N[g] ** 2 * (1 - n[g] / N[g]) / n[g] * (r_sum[g] - a[g] * r_count[g]).var(ddof=1)
                    for g in range(G)])
    np.testing.assert_allclose(got.sampling_variance(np.arange(G), [1, 0], [1.0, -a]), ref, rtol=1e-9)


def _rare_rows_engine(r: np.random.Generator) -> tuple[duckdb.DuckDBPyConnection, Engine]:
    """A table of 40,000 rows in two groups: d uniform on [0, 100), v discrete 2..50 with 20 rows of each group at
    v = 1 (rare: a sample of a twentieth mostly misses them); its synopsis, no rows stored whole."""
    con = duckdb.connect()
    n = 40_000
    v = r.integers(2, 51, n)
    g = np.arange(n) % 2
    for k in (0, 1):
        v[r.choice(np.flatnonzero(g == k), 20, replace=False)] = 1
    con.register("df", pd.DataFrame({"d": r.uniform(0, 100, n), "v": v, "g": g}))
    con.execute("CREATE TABLE t AS SELECT d, v::INTEGER AS v, g FROM df")
    eng = Engine(con)
    eng.build("t", columns=["d", "v"], group_by=["g"], sample_size=2_000, outliers=False)
    return con, eng


def test_rare_rows_a_bound_drops_exactly_stay_dropped_under_a_second_bound(rng):
    """``v >= 2`` drops the 20 rows of each group at v = 1 exactly (a discrete column: a bin each), which a sample of
    a twentieth of the rows mostly misses; ``d < max(d)`` cuts d's last bin at its end. The fit's base was the first
    column's prediction (d's), so the sample's unseen rare rows came back through the collinear terms' correction:
    nafld2's ``COUNT(*) WHERE value >= 56 AND days < 7187`` answered 169,801 ± 1.4 against 169,780, above the count
    of ``value >= 56`` alone. The base is now the prediction of the column the box cuts least (v: no bin cut).
    (Seeds 0-14: the old order missed in 12, this one in none.)"""
    con, eng = _rare_rows_engine(rng)
    dmax = con.execute("SELECT max(d) FROM t").fetchone()[0]
    sql = f"SELECT g, COUNT(*) AS v FROM t WHERE v >= 2 AND d < {dmax!r} GROUP BY g ORDER BY g"
    got, want = eng.query(sql), con.execute(sql).df()
    covered = (got["v_ci_low"] <= want["v"]) & (want["v"] <= got["v_ci_high"])
    assert covered.all(), (got.to_dict("records"), want["v"].tolist())
    con.close()


def test_a_cut_bins_position_term_seen_on_one_sample_row_is_not_fitted(rng):
    """A box that cuts one fine bin of d holds the bin's position term (linear in a row's place, its total from the
    bin's exact sum); in a group whose sample has one row in that bin, the fit gave the term a coefficient that
    carried the total-against-one-row difference to the answer: ``COUNT(*) WHERE d < 70.3`` answered 13,848 ± 7
    against 14,079 (z = −63, seed 9 of this table). Terms seen on fewer than 10 of a group's sample rows are now
    left out of its fit. Over that table and 7 random ones: no answer beyond 8 standard errors, and E|z| near the
    normal's 0.8 (the old fit, tables 0-11: 65 and 3.9)."""
    zs = []
    for seed in [9, *rng.integers(0, 2**31, 7)]:
        con, eng = _rare_rows_engine(np.random.default_rng(seed))
        for sql in ("SELECT g, COUNT(*) AS v FROM t WHERE d < 70.3 GROUP BY g ORDER BY g",
                    "SELECT g, COUNT(*) AS v FROM t WHERE v >= 2 AND d < 70.3 GROUP BY g ORDER BY g"):
            got, want = eng.query(sql), con.execute(sql).df()
            zs += list((got["v"] - want["v"]) / ((got["v_ci_high"] - got["v_ci_low"]) / (2 * 1.959964)))
        con.close()
    zs = np.abs(np.array(zs))
    assert zs.max() < 8 and zs.mean() < 1.6, (zs.round(2).tolist(), zs.mean())


def _two_discrete_columns(rng) -> duckdb.DuckDBPyConnection:
    """a (15 values) and w (about 50 values, mostly 0: a weekly hours-like count) dependent on each other and on the
    group, and an independent continuous z: fertility's shape."""
    n = 120_000
    g = rng.integers(0, 12, n)
    a = rng.integers(21, 36, n)
    works = rng.uniform(size=n) < 0.3 + 0.02 * (a - 21) + 0.02 * g
    w = np.where(works, np.minimum(rng.poisson(10 + (a - 21) + g, n) * (rng.uniform(size=n) < 0.8) + 40
                                   * (rng.uniform(size=n) < 0.2), 52), 0)
    con = duckdb.connect()
    con.register("df", pd.DataFrame({"g": g, "a": a, "w": w, "z": rng.normal(0.0, 1.0, n)}))
    con.execute("CREATE TABLE t AS SELECT g, a::INTEGER AS a, w::INTEGER AS w, z FROM df")
    return con


def test_discrete_columns_with_their_full_grids_answer_exactly(rng, monkeypatch):
    con = _two_discrete_columns(rng)
    eng = Engine(con)
    meta = eng.build("t", columns=["a", "w", "z"], group_by=["g"], budget_bytes=400_000)
    syn = eng._load("t")
    assert [i.discrete for i in syn.infos[:2]] == [True, True]
    full = [syn.infos[0].bins, syn.infos[1].bins]  # the full grid: a cell per pair of values
    assert [p["res"] for p in json.loads(meta["grids"])["pairs"] if p["cols"] == [0, 1]] == [full]
    where = "WHERE w < 52 AND a >= 25"
    for agg in ("COUNT(*)", "SUM(w)", "AVG(w)", "SUM(a)", "AVG(a)"):
        sql = f"SELECT g, {agg} AS v FROM t {where} GROUP BY g ORDER BY g"
        got = eng.query(sql)
        exact = con.execute(sql).df()["v"].to_numpy(dtype=float)
        np.testing.assert_allclose(got["v"].to_numpy(), exact, rtol=1e-9, err_msg=agg)
        assert np.all(got["v_ci_high"] - got["v_ci_low"] <= 1e-6 * np.abs(exact)), agg
    # a value neither predicate column holds rests on the sample: an interval, not a claim of exactness
    got = eng.query(f"SELECT SUM(z) AS v FROM t {where}")
    assert float(got["v_ci_high"].iloc[0] - got["v_ci_low"].iloc[0]) > 0
    # one discrete predicate column: its full sum grid holds every other column's sums per value
    assert json.loads(meta["grids"])["sum_res"][1] == syn.infos[1].bins
    one = {agg: f"SELECT g, {agg} AS v FROM t WHERE w >= 40 GROUP BY g ORDER BY g"
           for agg in ("SUM(z)", "AVG(z)", "SUM(a)", "COUNT(*)")}
    for agg, sql in one.items():
        got = eng.query(sql)
        exact = con.execute(sql).df()["v"].to_numpy(dtype=float)
        np.testing.assert_allclose(got["v"].to_numpy(), exact, rtol=1e-9, err_msg=agg)
        assert np.all(got["v_ci_high"] - got["v_ci_low"] <= 1e-6 * np.abs(exact).max()), agg
    # the grids answer, not the fit: on fertility the fit missed such answers where its terms were nearly
    # collinear among a group's rows (SUM(age) WHERE work >= 40, ±900 around the grid's exact total)
    import densitas.aqp.synopsis as syn_mod

    def no_fit(*args, **kwargs):
        raise AssertionError("the fit ran on an answer the grids hold")

    monkeypatch.setattr(syn_mod, "regression_totals", no_fit)
    for sql in one.values():
        eng.query(sql)
    for agg in ("COUNT(*)", "SUM(w)", "AVG(a)"):
        eng.query(f"SELECT g, {agg} AS v FROM t {where} GROUP BY g")
    with pytest.raises(AssertionError, match="the fit ran"):  # (the sample does decide this one)
        eng.query(f"SELECT SUM(z) AS v FROM t {where}")
    con.close()


def test_the_shifts_own_noise_is_its_variance_over_repeated_samples():
    """The fit with every direction takes its coefficient along a dropped direction from the few rows that carry
    it, so the shift (:attr:`GroupTotals.extrapolation`) moves with their noise. Over repeated noise on fixed
    rows, the shift's variance must match :meth:`GroupTotals.extrapolation_noise` (the sandwich Σ (a e)²): the
    rows that carry the direction apart from the prediction are 40 of 400, 0.3 apart, while in the table 200
    unsampled rows are 5 apart. Two keys on the same terms, the second's target the first's plus noise of half
    its size: the difference of their totals (an AVG's combination mixes keys so) must match too, which a
    per-key sum of squares (no cross term) misses by a factor of about 9. A term doubled or halved fails by 2."""
    rng = np.random.default_rng(SEED)
    N, n, sigma, reps = 20_000, 400, 0.5, 1500
    m = rng.uniform(0.5, 1.5, N)
    z1 = m.copy()
    z1[:200] += 5.0  # unsampled rows far apart
    rows = rng.choice(np.arange(1000, N), n, replace=False)
    z1[rows[:40]] += 0.3 * rng.normal(size=40)  # the few sampled rows that carry the direction, barely
    z2 = rng.uniform(size=N)
    z = np.stack([m, z1, z2], axis=1)
    totals = z.sum(axis=0)[None, :]
    aux = [Auxiliaries(rows=z[rows], totals=totals)] * 2
    gid, Nv, nv = np.zeros(n, dtype=np.int64), np.array([float(N)]), np.array([float(n)])
    g = np.array([0])
    one, diff = np.array([[1.0, 0.0]]), np.array([[1.0, -1.0]])
    shifts, noise_one, noise_diff = [], [], []
    for _ in range(reps):
        y1 = m[rows] + 0.7 * z2[rows] + sigma * rng.normal(size=n)
        y = np.stack([y1, y1 + 0.5 * sigma * rng.normal(size=n)], axis=1)
        t = regression_totals(y, aux, gid, Nv, nv)
        assert t.extrapolation is not None, f"seed {SEED}: the direction must be dropped"
        shifts.append(t.extrapolation[0])
        noise_one.append(t.extrapolation_noise(g, one)[0])
        noise_diff.append(t.extrapolation_noise(g, diff)[0])
    shifts = np.array(shifts)
    ratio_one = np.var(shifts[:, 0]) / np.mean(noise_one)
    ratio_diff = np.var(shifts[:, 0] - shifts[:, 1]) / np.mean(noise_diff)
    assert 0.8 < ratio_one < 1.25, f"seed {SEED}: the shift's variance over its stated noise is {ratio_one:.3f}"
    assert 0.8 < ratio_diff < 1.25, f"seed {SEED}: for the keys' difference, {ratio_diff:.3f}"


def test_a_direction_only_the_two_term_fit_drops_is_counted(monkeypatch):
    """A group too small for every term fits the prediction and an intercept only; where that fit drops a direction
    (the prediction nearly constant among its rows) while the full fit drops none above √ε (its third term an exact
    linear function of the prediction), the shift is still the two-term fit with that direction less the estimate,
    and its noise is counted."""
    import densitas.aqp.estimator as est

    rng = np.random.default_rng(SEED)
    N, n = 3000, 25  # 25 rows for 3 terms: fewer than MIN_ROWS_PER_TERM a term
    m = 1.0 + 0.003 * rng.normal(size=N)
    z1 = (m - m.mean()) / m.std()  # exactly collinear with the intercept and m
    m[:40] += 0.5  # unsampled rows where the prediction differs
    y = m + 0.3 * rng.normal(size=N)
    rows = rng.choice(np.arange(100, N), n, replace=False)
    z = np.stack([m, z1], axis=1)
    t = _one_group(y, z, rows, N)
    assert t.extrapolation is not None and t.shift_scatter is not None, f"seed {SEED}"
    monkeypatch.setattr(est, "MIN_INFORMATION", 0.0)
    full = _one_group(y, z, rows, N)
    assert t.extrapolation[0, 0] == pytest.approx(full.value[0, 0] - t.value[0, 0], rel=1e-6), f"seed {SEED}"
    assert t.extrapolation_noise(np.array([0]), np.ones((1, 1)))[0] > 0, f"seed {SEED}"


def test_the_shifts_own_noise_reaches_the_engines_variance():
    """The noise of the dropped directions' shift is part of :meth:`GroupTotals.variance_of` (and of the engine's
    interval, through the grid estimator's variance function)."""
    rng = np.random.default_rng(SEED)
    N, n = 20_000, 400
    m = rng.uniform(0.5, 1.5, N)
    z1 = m.copy()
    z1[:200] += 5.0
    rows = rng.choice(np.arange(1000, N), n, replace=False)
    z1[rows[:40]] += 0.3 * rng.normal(size=40)
    y = m + 0.5 * rng.normal(size=N)
    t = _one_group(y, np.stack([m, z1], axis=1), rows, N)
    g, W = np.array([0]), np.ones((1, 1))
    ss = np.einsum("gk,gkl,gl->g", W, t.residual_scatter[g], W)
    noise = t.extrapolation_noise(g, W)[0]
    assert noise > 0, f"seed {SEED}"
    assert t.variance_of(g, W, [0])[0] == pytest.approx(
        t.residual_variance(g, ss, [0])[0] + noise + t.extrapolation_variance(g, W)[0], rel=1e-12), f"seed {SEED}"
