"""The integer linear-binning kernel of ``densitas.primitives._cuda`` (CUDA only) run as a NumPy model on the CPU,
through the module's own reconstruction, against the float64 PyTorch reference."""

from __future__ import annotations

import numpy as np
import torch

from densitas._backend.dispatch import use_backend
from densitas.primitives import _cuda, histogram


def test_integer_linear_binning_model_matches_the_reference(rng):
    n, nb = 200_003, 512
    x = rng.uniform(-0.1, 1.1, n)
    x[:100] = np.linspace(0.0, 1.0, 100)  # grid points and the range's ends
    inside = (x >= 0.0) & (x <= 1.0)
    t = x[inside] * (nb - 1)
    k = np.clip(np.floor(t), 0, nb - 2).astype(np.int64)
    q = np.rint(np.clip(t - k, 0.0, 1.0) * 2.0**_cuda.FRACTION_BITS).astype(np.int64)  # __double2int_rn
    count = np.bincount(k, minlength=nb)
    frac = np.bincount(k, weights=q, minlength=nb).astype(np.int64)
    got = _cuda.totals_from_integers(torch.from_numpy(count), torch.from_numpy(frac))
    with use_backend("torch"):
        want, _ = histogram(torch.from_numpy(x), nb, (0.0, 1.0), linear=True)
    near = torch.from_numpy(count + np.r_[0, count[:-1]]).double()
    assert bool(((got - want).abs() <= near * 2.0 ** -(_cuda.FRACTION_BITS + 1) + 1e-9).all())
    assert float(got.sum()) == float(inside.sum())  # the mass is exact
