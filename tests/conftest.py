"""Test configuration.

Triton kernels are exercised on the CPU through the interpreter: ``TRITON_INTERPRET=1`` is set here, before any
kernel module is imported. The GPU suite (``-m gpu`` with ``DENSITAS_GPU_TESTS=1``, run on the device
machine) compiles the real kernels instead.
"""

from __future__ import annotations

import os

if os.environ.get("DENSITAS_GPU_TESTS") != "1":
    os.environ["TRITON_INTERPRET"] = "1"
os.environ.pop("DENSITAS_BACKEND", None)
# compiled kernels (densitas.cluster._jit) are cached in a directory of this run, not the user's ~/.cache
if "DENSITAS_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["DENSITAS_CACHE_DIR"] = tempfile.mkdtemp(prefix="densitas-test-cache-")

import numpy as np
import pytest
import torch

from densitas._backend.dispatch import use_backend
from tests.seeds import fresh_seed


@pytest.fixture(autouse=True)
def _seed(request):
    """One fresh seed per test (``tests.seeds``), printed so a failure shows it: it seeds torch and the ``rng`` and
    ``seeded`` generators, so ``DENSITAS_SEED=<seed>`` replays the whole test."""
    seed = fresh_seed()
    torch.manual_seed(seed)
    request.node.user_properties.append(("seed", seed))
    request.node.densitas_seed = seed
    print(f"seed={seed}")
    yield


@pytest.fixture
def rng(request):
    """A NumPy generator from the test's seed."""
    return np.random.default_rng(request.node.densitas_seed)


@pytest.fixture(params=["torch", "triton"])
def backend(request):
    """Run a test once with the PyTorch implementations and once with the Triton kernels (interpreted on CPU)."""
    with use_backend(request.param):
        yield request.param
