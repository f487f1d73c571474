"""Backend layer: device resolution, conversion and validation, dispatch, chunk planning."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

import densitas
import densitas.primitives  # (registers "scan", used below)
from densitas import DensitasError, DeviceError, InputError
from densitas._backend import as_tensor, memory_budget, parse_bytes, plan_chunks, resolve_device, to_output
from densitas._backend.dispatch import UnknownOperationError, backend_setting, register, select, use_backend


def test_exception_hierarchy():
    assert issubclass(InputError, ValueError) and issubclass(InputError, DensitasError)
    assert issubclass(DeviceError, RuntimeError) and issubclass(densitas.NotFittedError, AttributeError)
    assert issubclass(densitas.UnsupportedQueryError, NotImplementedError)


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(InputError, match=r"'device' parameter .* Got 'tpu'"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="no CUDA device"):
            resolve_device("cuda:0")


def test_as_tensor_kinds_and_dtypes():
    t, kind = as_tensor(np.arange(4, dtype=np.float32), "x", device="cpu")
    assert t.dtype == torch.float32 and kind.kind == "numpy"
    assert isinstance(to_output(t, kind), np.ndarray)
    t, kind = as_tensor(torch.ones(3), "x")
    assert kind.kind == "torch" and isinstance(to_output(t, kind), torch.Tensor)
    t, _ = as_tensor(np.array([1, 2], dtype=np.uint32), "x", device="cpu")
    assert t.dtype == torch.int64
    t, _ = as_tensor(pd.DataFrame({"a": [1, 2], "b": [0.5, 1.5]}), "frame", device="cpu")
    assert t.shape == (2, 2) and t.dtype == torch.float64
    with pytest.raises(InputError, match=r"'frame' must hold numeric columns; column\(s\) \['s'\]"):
        as_tensor(pd.DataFrame({"a": [1], "s": ["x"]}), "frame")
    with pytest.raises(InputError, match="'col' holds missing values"):
        as_tensor(pd.Series([1, None], dtype="Int64"), "col")
    with pytest.raises(InputError, match="uint64 with values above"):
        as_tensor(np.array([2**63 + 5], dtype=np.uint64), "x")
    with pytest.raises(InputError, match="'x' must have 1 dimension"):
        as_tensor(np.ones((2, 2)), "x", ndim=(1,))
    with pytest.raises(InputError, match="complex"):
        as_tensor(np.ones(2, dtype=complex), "x")


def test_dispatch_rules(monkeypatch):
    cpu = torch.device("cpu")
    assert backend_setting() == "auto"
    assert select("scan", cpu)[0] == "torch"
    with use_backend("triton"):
        assert select("scan", cpu)[0] == "triton"
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(DeviceError, match="TRITON_INTERPRET=1"):
            select("scan", cpu)
    monkeypatch.setenv("DENSITAS_BACKEND", "torch")
    assert select("scan", cpu)[0] == "torch"
    monkeypatch.setenv("DENSITAS_BACKEND", "cuda-magic")
    with pytest.raises(InputError, match="DENSITAS_BACKEND must be one of"):
        select("scan", cpu)
    monkeypatch.delenv("DENSITAS_BACKEND")
    with pytest.raises(InputError, match="use_backend must be one of"), use_backend("fast"):
        pass
    with pytest.raises(UnknownOperationError):
        select("teleport", cpu)
    register("_test_triton_only", "triton")(lambda: None)  # a Triton kernel without its PyTorch reference
    with pytest.raises(UnknownOperationError):
        select("_test_triton_only", cpu)


CAPABILITIES = ("densitas.kde", "densitas.aqp", "densitas.neighbors", "densitas.cluster", "densitas.primitives")


def _modules_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_dispatch_imports_no_capability():
    """The backend layer sits below the capabilities: importing it, or asking it for an operation no package
    has registered yet, loads none of them (each package registers its own operations when imported)."""
    loaded = _modules_after(
        "import densitas._backend, torch; from densitas._backend.dispatch import select, UnknownOperationError\n"
        "try:\n    select('scan', torch.device('cpu'))\nexcept UnknownOperationError:\n    pass")
    assert "densitas._backend.dispatch" in loaded
    assert not [m for m in loaded if m.startswith(CAPABILITIES)]


# Two fresh interpreters cover all four packages: kde pulls in primitives, cluster pulls in neighbors and
# primitives (each import costs seconds: torch).
@pytest.mark.parametrize("package,ops", [
    ("densitas.kde", {"kde_hermite_pairsum", "kde_gauss_pairsum", "kde_gauss_pairsum_grad", "histogram"}),
    ("densitas.cluster", {"cluster_counting_scatter", "cluster_fused_pass", "knn_tile_topk", "scan",
                          "reduce_by_key", "argsort"}),
])
def test_each_package_registers_what_it_uses(package, ops):
    """Importing a package registers its operations and those it calls from other packages, with both the
    PyTorch reference and (lazily) the Triton kernel, and imports no Triton kernel module."""
    code = (f"import {package}; from densitas._backend.dispatch import _REGISTRY; "
            f"print(' '.join(op for op, e in _REGISTRY.items() if 'torch' in e.impls))")
    out = subprocess.run([sys.executable, "-c", code + "; import sys; print(*sys.modules)"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert ops <= set(out[0].split())
    assert not [m for m in out[1].split() if m.endswith("._triton") or m == "triton"]


def test_parse_bytes_and_budget(monkeypatch):
    assert parse_bytes("2GiB") == 2**31 and parse_bytes("1.5kb") == 1500 and parse_bytes(4096) == 4096
    for bad in ("lots", "-3MB", 0):
        with pytest.raises(InputError):
            parse_bytes(bad)
    monkeypatch.setenv("DENSITAS_MEMORY_BUDGET", "64MB")
    assert memory_budget("cpu") == 64 * 10**6
    monkeypatch.delenv("DENSITAS_MEMORY_BUDGET")
    assert memory_budget("cpu") >= 1 << 20


@pytest.mark.parametrize("n,per,budget,align", [(0, 8, 100, 1), (10, 100, 400, 1), (1000, 8, 1000, 32),
                                                (7, 10**6, 10, 1)])
def test_plan_chunks_cover_and_bound(n, per, budget, align):
    chunks = plan_chunks(n, per, budget=budget, align=align)
    covered = [i for s in chunks for i in range(s.start, s.stop)]
    assert covered == list(range(n))
    for s in chunks[:-1]:
        length = s.stop - s.start
        assert length % align == 0 and (length * per <= budget or length == align)
    with pytest.raises(InputError, match="'bytes_per_item'"):
        plan_chunks(5, 0)


def test_device_policy_quantile_both_routes(monkeypatch, rng):
    from densitas._backend import policy

    x = rng.standard_normal(1001)
    for q in (0.0, 0.25, 0.5, 0.9, 1.0):
        assert policy.quantile(torch.from_numpy(x), q) == pytest.approx(np.quantile(x, q), rel=1e-14, abs=1e-15)
    cpu = policy.DevicePolicy("cpu", exact_max_rows=20_000, numpy_quantile_above=10**9)  # torch.quantile route
    monkeypatch.setitem(policy._POLICIES, "cpu", cpu)
    assert policy.quantile(torch.from_numpy(x), 0.3) == pytest.approx(np.quantile(x, 0.3), rel=1e-14)
    assert policy.device_policy("cpu") is cpu and policy.device_policy(torch.device("cuda", 0)).kind == "cuda"


def test_kde_auto_engine_follows_the_device_policy(monkeypatch, rng):
    """engine="auto" reads its exact/binned cutoff from the policy, not from a constant of its own."""
    from densitas._backend import policy
    from densitas.kde import plugin_functional

    x = rng.standard_normal(300)
    exact = plugin_functional(x, 4, 0.3, engine="exact", device="cpu")
    binned = plugin_functional(x, 4, 0.3, engine="binned", device="cpu")
    assert exact != binned
    assert plugin_functional(x, 4, 0.3, engine="auto", device="cpu") == exact
    monkeypatch.setitem(policy._POLICIES, "cpu", policy.DevicePolicy("cpu", exact_max_rows=299,
                                                                     numpy_quantile_above=0))
    assert plugin_functional(x, 4, 0.3, engine="auto", device="cpu") == binned
