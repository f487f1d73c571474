"""Device policy in one place: the choices that depend on where the data live (which engine, which routine),
so that capabilities never branch on ``device.type`` themselves.

Each figure here comes from a measurement recorded in ``benchmarks/RESULTS.md``; change it there and here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["DevicePolicy", "device_policy", "quantile"]


@dataclass(frozen=True)
class DevicePolicy:
    """What a capability should do on one kind of device.

    Attributes
    ----------
    kind : str
        ``"cpu"`` or ``"cuda"``.
    exact_max_rows : int
        ``engine="auto"`` of the KDE selectors runs the exact O(n²) pair sums up to this many (weighted) rows
        and the binned engine beyond (the exact engine's time reaches the binned one's near these sizes:
        benchmarks/RESULTS.md, ``bench_kde.py``).
    numpy_quantile_above : int
        Quantiles of a tensor with more elements than this go through NumPy (introselect, O(n), after one copy
        to the host) instead of :func:`torch.quantile` (a full sort on the device). On the CPU NumPy always
        wins (0: always); on CUDA the device sort wins until the sort's memory and time exceed one transfer.

    Examples
    --------
    >>> device_policy(torch.device("cpu")).exact_max_rows
    20000
    """

    kind: str
    exact_max_rows: int
    numpy_quantile_above: int


_POLICIES = {
    "cpu": DevicePolicy("cpu", exact_max_rows=20_000, numpy_quantile_above=0),
    "cuda": DevicePolicy("cuda", exact_max_rows=1_000_000, numpy_quantile_above=16_000_000),
}


def device_policy(device: torch.device | str) -> DevicePolicy:
    """The :class:`DevicePolicy` of ``device`` (devices other than CUDA follow the CPU's).

    Examples
    --------
    >>> device_policy("cuda:0").kind
    'cuda'
    """
    kind = torch.device(device).type
    return _POLICIES["cuda" if kind == "cuda" else "cpu"]


def quantile(x: torch.Tensor, q: float) -> float:
    """The ``q`` quantile of the 1-D tensor ``x`` with NumPy's default (linear) rule, computed where it is
    cheapest for ``x``'s device (:attr:`DevicePolicy.numpy_quantile_above`).

    Examples
    --------
    >>> quantile(torch.tensor([4.0, 1.0, 3.0, 2.0]), 0.5)
    2.5
    """
    if x.numel() > device_policy(x.device).numpy_quantile_above:
        return float(np.quantile(x.detach().cpu().numpy(), q))
    return float(torch.quantile(x, q))
