"""The PyTorch KDE pair sums size their tiles with the chunk planner inside the memory budget."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from densitas._backend.dispatch import use_backend
from densitas.kde import _torch as kt
from densitas.kde import bandwidth, lscv_objective, plugin_functional
from densitas.kde.estimator import KernelDensity


@pytest.fixture
def planned(monkeypatch):
    """Record every tile plan the pair sums and the evaluator make."""
    plans: list[kt.TilePlan] = []
    real = kt.plan_tiles

    def spy(*args, **kwargs):
        plan = real(*args, **kwargs)
        plans.append(plan)
        return plan

    monkeypatch.setattr(kt, "plan_tiles", spy)
    monkeypatch.setattr("densitas.kde.evaluate.plan_tiles", spy)
    return plans


def _run_all(x1, x2, q2):
    with use_backend("torch"):
        return (plugin_functional(x1, 4, 0.2, engine="exact", device="cpu"),
                lscv_objective(x2, np.diag([0.3, 0.2]), device="cpu"),
                bandwidth(x2, "lscv_H", device="cpu", maxiter=3),
                KernelDensity(bandwidth=0.4).fit(x2).score_samples(q2))


def test_small_budget_same_answer_smaller_tiles(monkeypatch, planned, rng):
    x1 = rng.standard_normal(700)
    x2 = rng.standard_normal((300, 2))
    q2 = rng.standard_normal((50, 2))
    monkeypatch.delenv("DENSITAS_MEMORY_BUDGET", raising=False)
    default = _run_all(x1, x2, q2)
    big = list(planned)
    planned.clear()
    budget = 16 * 1024
    monkeypatch.setenv("DENSITAS_MEMORY_BUDGET", str(budget))
    small = _run_all(x1, x2, q2)
    assert big and planned
    for p in planned:
        assert p.tile_bytes <= budget and p.budget == budget
    assert sum(len(p.rows) for p in planned) > sum(len(p.rows) for p in big)
    assert max(p.cols for p in planned) < max(p.cols for p in big)
    assert small[0] == pytest.approx(default[0], rel=1e-12)
    assert small[1] == pytest.approx(default[1], rel=1e-12)
    np.testing.assert_allclose(small[2], default[2], rtol=1e-9)
    np.testing.assert_allclose(small[3], default[3], rtol=1e-12)


@pytest.mark.parametrize("rows,cols,temps,budget", [(0, 4, 3, 4096), (1, 1, 5, 8), (999, 2048, 5, 10_000),
                                                    (5000, 4096, 3, 1 << 30)])
def test_plan_tiles_covers_rows_within_budget(monkeypatch, rows, cols, temps, budget):
    monkeypatch.setenv("DENSITAS_MEMORY_BUDGET", str(budget))
    plan = kt.plan_tiles(rows, cols, temps, torch.device("cpu"))
    assert [i for r in plan.rows for i in range(r.start, r.stop)] == list(range(rows))
    assert 1 <= plan.cols <= cols
    assert plan.tile_bytes <= max(budget, temps * 8)  # one element of each temporary at least
    assert plan.tile_bytes <= kt.TILE_ELEMS * temps * 8


@pytest.mark.parametrize("chain", [False, True])
def test_gauss_sums_with_exponent_floor_match_brute_force(rng, chain):
    """Far pairs (exp(−aY) below the floor) add at most 1e-152 each; pairs outside the upper triangle nothing."""
    from densitas.kde.pairsum import gauss_sums

    z = rng.normal(size=(300, 2)) * 3.0
    a = np.linspace(1e-3, 50.0, 6) if chain else np.array([1e-3, 0.7, 50.0, 1e6])
    iu = np.triu_indices(300, 1)
    y = ((z[:, None, :] - z[None, :, :]) ** 2).sum(-1)[iu]
    # Y comes from ‖z_i‖² + ‖z_j‖² − 2 z_i·z_j, which rounds to within a few ε(‖z_i‖² + ‖z_j‖²) of the exact
    # difference form: exp(−aY) then moves by a factor up to exp(a·δY), which matters for a = 1e6.
    norms = (z * z).sum(1)
    dy = 8 * np.finfo(float).eps * (norms[:, None] + norms[None, :])[iu]
    want = np.array([[np.exp(-ak * y).sum(), np.exp(-2 * ak * y).sum()] for ak in a])
    slack = np.array([[(np.exp(-ak * y) * np.expm1(ak * dy)).sum(),
                       (np.exp(-2 * ak * y) * np.expm1(2 * ak * dy)).sum()] for ak in a])
    with use_backend("torch"):
        got = gauss_sums(torch.from_numpy(z), None, a, chain=chain).numpy()
    assert np.all(np.abs(got - want) <= 1e-10 * want + slack + 300**2 * 1e-152), (got, want, slack)
