"""One dispatch layer: each heavy operation has a PyTorch implementation (the CPU path and the test oracle)
and, where it pays, a Triton implementation (CUDA). :func:`select` picks one.

Selection, highest priority first:

1. :func:`use_backend` (a context manager, used by tests and benchmarks);
2. the environment variable ``DENSITAS_BACKEND`` = ``auto`` (default) | ``torch`` | ``triton``;
3. ``auto``: Triton on CUDA tensors when Triton is importable and the operation's Triton implementation is
   the preferred one, PyTorch otherwise (the fallback is logged at debug level).

Forcing ``triton`` uses the Triton implementation of every operation that has one; operations that delegate to
PyTorch by design (the library is already at the hardware limit) keep their PyTorch implementation. It needs
a CUDA device, or ``TRITON_INTERPRET=1`` to run the kernels on CPU tensors (how the test suite covers every
kernel without a GPU); otherwise it raises :class:`DeviceError`.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import importlib.util
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from densitas.exceptions import DeviceError, InputError

log = logging.getLogger("densitas")

__all__ = ["BACKENDS", "Operation", "UnknownOperationError", "backend_setting", "lazy", "register",
           "registered_operations", "select", "triton_available", "use_backend"]

BACKENDS = ("auto", "torch", "triton")


@dataclass
class Operation:
    name: str
    impls: dict[str, Callable] = field(default_factory=dict)
    auto_cuda: str = "triton"  # which implementation "auto" picks on CUDA when both exist


_REGISTRY: dict[str, Operation] = {}
_OVERRIDE: contextvars.ContextVar[str | None] = contextvars.ContextVar("densitas_backend", default=None)


def register(op: str, backend: str, *, auto: bool = True) -> Callable[[Callable], Callable]:
    """Register ``fn`` as the ``backend`` ("torch" or "triton") implementation of operation ``op``.

    ``auto=False`` on a Triton implementation keeps "auto" on PyTorch for CUDA tensors (the benchmark found the
    library faster); the Triton version then runs only when forced.
    """
    if backend not in ("torch", "triton"):
        raise InputError(f"backend must be 'torch' or 'triton'. Got {backend!r} instead.")

    def deco(fn: Callable) -> Callable:
        entry = _REGISTRY.setdefault(op, Operation(op))
        entry.impls[backend] = fn
        if backend == "triton" and not auto:
            entry.auto_cuda = "torch"
        return fn

    return deco


def lazy(module: str, name: str) -> Callable:
    """A stand-in for ``module.name`` that imports ``module`` on first call (Triton reads ``TRITON_INTERPRET``
    when kernels are defined, so kernel modules must not be imported at registration)."""

    def call(*args, **kwargs):
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = name
    return call


@functools.cache
def triton_available() -> bool:
    """Whether the ``triton`` package can be imported."""
    return importlib.util.find_spec("triton") is not None


def interpret_mode() -> bool:
    """Whether Triton kernels run in the interpreter (``TRITON_INTERPRET=1``), i.e. on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def backend_setting() -> str:
    """The backend in force: the :func:`use_backend` override, else ``DENSITAS_BACKEND``, else ``"auto"``."""
    value = _OVERRIDE.get() or os.environ.get("DENSITAS_BACKEND", "auto").strip().lower() or "auto"
    if value not in BACKENDS:
        raise InputError(f"DENSITAS_BACKEND must be one of {list(BACKENDS)}. Got {value!r} instead.")
    return value


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Force a backend inside a ``with`` block (thread- and task-local).

    Examples
    --------
    >>> from densitas.primitives import scan
    >>> with use_backend("torch"):
    ...     scan([3, 1, 7, 0]).tolist()
    [3, 4, 11, 11]
    """
    if name not in BACKENDS:
        raise InputError(f"The 'name' parameter of use_backend must be one of {list(BACKENDS)}. Got {name!r}.")
    token = _OVERRIDE.set(name)
    try:
        yield
    finally:
        _OVERRIDE.reset(token)


class UnknownOperationError(InputError):
    """An operation name that no imported package has registered (or registered without its PyTorch
    reference). The dispatch layer imports no capability: the package that provides an operation registers it
    when it is imported, and a capability that calls another package's operation imports that package.

    Examples
    --------
    >>> try:
    ...     select("teleport", torch.device("cpu"))
    ... except UnknownOperationError:
    ...     print("not registered")
    not registered
    """


def registered_operations() -> tuple[str, ...]:
    """Names of the operations registered so far (those of the packages imported so far), sorted.

    Examples
    --------
    >>> import densitas.primitives
    >>> "scan" in registered_operations()
    True
    """
    return tuple(sorted(_REGISTRY))


def select(op: str, device: torch.device) -> tuple[str, Callable]:
    """Return ``(backend_name, implementation)`` of ``op`` for tensors on ``device``.

    Raises :class:`UnknownOperationError` for a name that no imported package registered.

    Examples
    --------
    >>> import densitas.primitives
    >>> with use_backend("torch"):
    ...     select("scan", torch.device("cpu"))[0]
    'torch'
    """
    entry = _REGISTRY.get(op)
    if entry is None or "torch" not in entry.impls:
        raise UnknownOperationError(
            f"The 'op' parameter of select must name a registered operation. Got {op!r} instead; registered: "
            f"{list(registered_operations())}. Operations register when their package is imported "
            "(densitas.primitives, densitas.kde, densitas.neighbors, densitas.cluster).")
    setting = backend_setting()
    has_triton = "triton" in entry.impls
    if setting == "torch":
        return "torch", entry.impls["torch"]
    if setting == "triton":
        if not has_triton:
            return "torch", entry.impls["torch"]
        if not triton_available():
            raise DeviceError(f"Backend 'triton' was requested for {op!r} but the triton package is not installed "
                              "(pip install 'densitas[gpu]').")
        if device.type != "cuda" and not interpret_mode():
            raise DeviceError(f"Backend 'triton' was requested for {op!r} on a {device.type} tensor; Triton needs a "
                              "CUDA device, or TRITON_INTERPRET=1 to run its kernels on the CPU.")
        return "triton", entry.impls["triton"]
    # auto
    if device.type == "cuda" and has_triton and entry.auto_cuda == "triton" and triton_available():
        return "triton", entry.impls["triton"]
    if device.type == "cuda":
        log.debug("%s: auto backend falls back to PyTorch on %s", op, device)
    return "torch", entry.impls["torch"]
