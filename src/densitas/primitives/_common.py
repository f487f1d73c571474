"""Dtype rules and identities shared by the PyTorch and Triton implementations."""

from __future__ import annotations

import torch

SCAN_OPS = ("sum", "prod", "min", "max")
REDUCE_OPS = ("sum", "prod", "min", "max", "mean")
OP_CODE = {"sum": 0, "prod": 1, "min": 2, "max": 3}

_SMALL_INTS = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32)


def acc_dtype(dtype: torch.dtype, op: str) -> torch.dtype:
    """Accumulation (and output) dtype of ``op`` over ``dtype``, following NumPy where it has a rule.

    * sum/prod of booleans and integers accumulate in int64 (NumPy's platform integer; never float);
    * min/max keep the input dtype;
    * mean of integers is float64;
    * float16/bfloat16 are computed and returned in float32.
    """
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    if op in ("sum", "prod") and (dtype in _SMALL_INTS or dtype == torch.int64):
        return torch.int64
    if op == "mean" and not dtype.is_floating_point:
        return torch.float64
    return dtype


def compute_dtype(dtype: torch.dtype, op: str) -> torch.dtype:
    """Dtype the kernels compute in: like :func:`acc_dtype`, with small ints widened to int32 for min/max."""
    acc = acc_dtype(dtype, op)
    if acc in (torch.bool, torch.uint8, torch.int8, torch.int16):
        return torch.int32
    return acc


def identity(op: str, dtype: torch.dtype) -> float | int | bool:
    """The identity element of ``op`` in ``dtype``."""
    if op == "sum":
        return 0
    if op == "prod":
        return 1
    if dtype == torch.bool:
        return op == "min"
    if dtype.is_floating_point:
        return float("inf") if op == "min" else float("-inf")
    info = torch.iinfo(dtype)
    return info.max if op == "min" else info.min
