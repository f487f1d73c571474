"""The regression estimator's first-order bias, estimated from the sample (``estimator._regression_bias``), against
the bias a Monte Carlo over simple random samples of one fixed population shows, and its place in an answer over
many groups (``GroupVariances.per_answer``)."""

from __future__ import annotations

import numpy as np

from densitas.aqp.estimator import Auxiliaries, regression_totals
from densitas.aqp.synopsis import GroupVariances

N, n, DRAWS = 2_000, 40, 4_000


def _population(rng) -> tuple[np.ndarray, np.ndarray]:
    """A skewed auxiliary and a target curved in it: the fit's residuals are largest where the rows lie far from
    the mean of ``x``, the case the bias comes from."""
    x = rng.lognormal(0.0, 0.6, N)
    return x, x**2 + rng.normal(0.0, 0.3, N)


def test_the_estimated_bias_matches_the_monte_carlo_bias(rng):
    x, y = _population(rng)
    total = y.sum()
    err, est = np.empty(DRAWS), np.empty(DRAWS)
    for d in range(DRAWS):
        s = rng.choice(N, n, replace=False)
        aux = [Auxiliaries(rows=x[s, None], totals=np.array([[x.sum()]]))]
        t = regression_totals(y[s, None], aux, np.zeros(n, dtype=int), np.array([float(N)]), np.array([float(n)]))
        err[d], est[d] = t.value[0, 0] - total, t.bias[0, 0]
    mc, se = err.mean(), err.std() / np.sqrt(DRAWS)
    # the bias is several of its Monte Carlo standard errors away from 0 (else the test could not tell)
    assert abs(mc) > 4 * se, (mc, se)
    # the sample's estimate, averaged over the draws, is the Monte Carlo's within its noise and the formula's
    # second-order remainder (0.96-1.08 of it, six populations): the same sign and within a third (a sign, a factor
    # of N/n, n or (1 - f) off, or the fit's own residuals in place of the left-out ones, 0.5 of it, fail)
    assert np.sign(est.mean()) == np.sign(mc), (est.mean(), mc, se)
    assert 0.75 <= est.mean() / mc <= 1.33, (est.mean(), mc, se)


def test_a_group_fitted_with_the_model_alone_or_sampled_whole_has_no_bias(rng):
    x, y = _population(rng)
    s = rng.choice(N, 12, replace=False)  # 12 rows: too few for a fitted term, the difference estimator
    aux = [Auxiliaries(rows=x[s, None], totals=np.array([[x.sum()]]))]
    t = regression_totals(y[s, None], aux, np.zeros(12, dtype=int), np.array([float(N)]), np.array([12.0]))
    assert t.bias[0, 0] == 0.0
    aux = [Auxiliaries(rows=x[:, None], totals=np.array([[x.sum()]]))]
    t = regression_totals(y[:, None], aux, np.zeros(N, dtype=int), np.array([float(N)]), np.array([float(N)]))
    assert t.bias[0, 0] == 0.0


def test_an_answer_over_many_groups_adds_their_biases_before_squaring():
    # 300 groups, each with a standard error of 10 and a bias of 1: one group's variance gains 1%, their sum's
    # gains 300² against 300·100, the interval of an answer over all of them triples
    v = GroupVariances(np.full(300, 100.0), bias=np.ones(300))
    one = v.per_answer(np.arange(300), 300)
    np.testing.assert_allclose(one, 101.0)
    total = v.per_answer(np.zeros(300, dtype=int), 1)
    np.testing.assert_allclose(total, 300 * 100.0 + 300.0**2)
