"""Backend layer: device resolution, array conversion and validation, dispatch, chunk planning.

Capabilities never branch on the device themselves: they convert inputs with :func:`as_tensor`, pick an
implementation with :func:`dispatch.select`, read device-dependent choices (engine cutoffs, which quantile
routine) from :func:`device_policy`, and bound memory with :func:`plan_chunks`.
"""

from __future__ import annotations

from densitas._backend.arrays import ArrayKind, as_tensor, check_choice, check_int, to_output
from densitas._backend.chunking import memory_budget, parse_bytes, plan_chunks
from densitas._backend.device import cuda_available, resolve_device
from densitas._backend.dispatch import register, select, use_backend
from densitas._backend.policy import DevicePolicy, device_policy

__all__ = [
    "ArrayKind",
    "DevicePolicy",
    "as_tensor",
    "check_choice",
    "check_int",
    "cuda_available",
    "device_policy",
    "memory_budget",
    "parse_bytes",
    "plan_chunks",
    "register",
    "resolve_device",
    "select",
    "to_output",
    "use_backend",
]
