"""Array conversion and validation at the API boundary.

NumPy arrays, pandas Series/DataFrames, Python sequences and torch tensors come in; the same kind goes out
(NumPy for pandas and sequence input). Validation helpers raise :class:`InputError` naming the argument.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from densitas._backend.device import DeviceLike, resolve_device
from densitas.exceptions import InputError

__all__ = ["ArrayKind", "as_tensor", "check_choice", "check_int", "to_output"]

_SUPPORTED = (
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
)


@dataclass(frozen=True)
class ArrayKind:
    """How an input arrived, so that outputs can be returned the same way."""

    kind: str  # "numpy" or "torch"

    def out(self, t: torch.Tensor) -> Any:
        return to_output(t, self)


def _to_numpy(x: Any, name: str) -> np.ndarray:
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is a dependency
        pd = None
    if pd is not None and isinstance(x, pd.DataFrame | pd.Series):
        if isinstance(x, pd.DataFrame):
            bad = [c for c in x.columns if not _numeric_or_bool(x[c].dtype)]
        else:
            bad = [] if _numeric_or_bool(x.dtype) else [x.name]
        if bad:
            raise InputError(f"'{name}' must hold numeric columns; column(s) {bad!r} are not numeric.")
        if bool(x.isna().to_numpy().any()) and not _all_float(x):
            raise InputError(f"'{name}' holds missing values (NA) in a non-float column; fill or drop them.")
        return x.to_numpy(dtype=_common_numpy_dtype(x))
    return np.asarray(x)


def _numeric_or_bool(dtype: Any) -> bool:
    import pandas as pd

    return bool(pd.api.types.is_numeric_dtype(dtype) or pd.api.types.is_bool_dtype(dtype))


def _all_float(x: Any) -> bool:
    import pandas as pd

    dtypes = x.dtypes if hasattr(x, "columns") else [x.dtype]
    return all(pd.api.types.is_float_dtype(d) for d in dtypes)


def _common_numpy_dtype(x: Any) -> Any:
    import pandas as pd

    dtypes = list(x.dtypes) if hasattr(x, "columns") else [x.dtype]
    np_dtypes = []
    for d in dtypes:
        if isinstance(d, np.dtype):
            np_dtypes.append(d)
        elif pd.api.types.is_float_dtype(d):
            np_dtypes.append(np.dtype("float64"))
        elif pd.api.types.is_bool_dtype(d):
            np_dtypes.append(np.dtype("bool"))
        else:
            np_dtypes.append(np.dtype("int64"))
    return np.result_type(*np_dtypes)


def _numpy_to_torch(a: np.ndarray, name: str) -> torch.Tensor:
    if a.dtype.kind == "u" and a.dtype.itemsize > 1:
        if a.dtype.itemsize == 8 and a.size and int(a.max()) > np.iinfo(np.int64).max:
            raise InputError(f"'{name}' is uint64 with values above the int64 range; densitas cannot hold them.")
        a = a.astype(np.int64)
    if a.dtype.kind not in "biuf":
        raise InputError(f"'{name}' must be a numeric or boolean array. Got dtype {a.dtype} instead.")
    if a.dtype.kind == "f" and a.dtype.itemsize > 8:
        raise InputError(f"'{name}' has dtype {a.dtype}; use float32 or float64.")
    if any(s < 0 for s in a.strides) or not a.flags.writeable:
        a = np.array(a, copy=True)
    return torch.from_numpy(a)


def as_tensor(
    x: Any,
    name: str,
    *,
    device: DeviceLike = "auto",
    ndim: Iterable[int] | None = None,
    like: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ArrayKind]:
    """Convert ``x`` to a tensor on the resolved device and remember how it came in.

    Parameters
    ----------
    x : array-like, pandas object or torch.Tensor
    name : str
        The argument's name, used in error messages.
    device : "auto", "cpu", "cuda", "cuda:N" or torch.device
        ``"auto"`` keeps a tensor on its device (or follows ``like``); NumPy input goes to CUDA when available.
    ndim : iterable of int, optional
        Allowed numbers of dimensions.
    like : torch.Tensor, optional
        A tensor already converted; ``x`` goes to its device.

    Examples
    --------
    >>> t, kind = as_tensor([1.0, 2.0], "x", device="cpu")
    >>> t.dtype, kind.kind
    (torch.float64, 'numpy')
    """
    if isinstance(x, torch.Tensor):
        kind = ArrayKind("torch")
        t = x
        if t.dtype not in _SUPPORTED:
            raise InputError(f"'{name}' has unsupported dtype {t.dtype}.")
    else:
        kind = ArrayKind("numpy")
        t = _numpy_to_torch(_to_numpy(x, name), name)
    if like is not None and (device is None or device == "auto"):
        dev = like.device
    else:
        dev = resolve_device(device, t)
    if t.device != dev:
        t = t.to(dev)
    if ndim is not None:
        allowed = tuple(ndim)
        if t.ndim not in allowed:
            raise InputError(f"'{name}' must have {' or '.join(map(str, allowed))} dimension(s). Got shape "
                             f"{tuple(t.shape)} instead.")
    return t, kind


def to_output(t: torch.Tensor, kind: ArrayKind) -> Any:
    """Return ``t`` as the caller's kind: a tensor for tensor input, a NumPy array otherwise."""
    if kind.kind == "torch":
        return t
    return t.detach().cpu().numpy()


def check_choice(name: str, value: Any, choices: Iterable[Any], owner: str = "") -> Any:
    """Raise :class:`InputError` unless ``value`` is one of ``choices``."""
    choices = tuple(choices)
    if not isinstance(value, str | int | bool | type(None)) or value not in choices:
        where = f" of {owner}" if owner else ""
        raise InputError(f"The '{name}' parameter{where} must be one of {list(choices)}. Got {value!r} instead.")
    return value


def check_int(name: str, value: Any, minimum: int | None = None, owner: str = "") -> int:
    """Raise :class:`InputError` unless ``value`` is an integer ≥ ``minimum``."""
    where = f" of {owner}" if owner else ""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InputError(f"The '{name}' parameter{where} must be an int. Got {value!r} instead.")
    if minimum is not None and value < minimum:
        raise InputError(f"The '{name}' parameter{where} must be an int ≥ {minimum}. Got {value!r} instead.")
    return int(value)
