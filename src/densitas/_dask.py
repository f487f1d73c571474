"""Dask inputs, shared by :mod:`densitas.neighbors.dask`, :mod:`densitas.cluster.dask` and
:mod:`densitas.kde.distributed`: a ``dask.array.Array`` or ``dask.dataframe.DataFrame``/``Series`` seen as
consecutive **row blocks** (one per chunk or partition) with their global row offsets, and the conversion of one
block, inside a task on a worker, to a tensor on the worker's device.

Dask is imported lazily: nothing here imports it unless a Dask collection was passed. Tasks run on whatever
scheduler is active (a ``distributed.Client``'s cluster — ``LocalCluster``, dask-cuda's ``LocalCUDACluster`` with
one worker per GPU, a multi-node cluster — or Dask's default local scheduler).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from densitas._backend.device import DeviceLike, resolve_device
from densitas.exceptions import InputError

__all__ = ["RowBlocks", "block_array", "block_tensor", "compute", "compute_reduced", "is_dask", "register_torch_sizeof",
           "row_blocks", "tree_reduce"]

#: Partial results combined per task of a tree reduction (kNN merges, summed partial sums).
FAN_IN = 8


def is_dask(x: Any) -> bool:
    """Whether ``x`` is a Dask collection (array, DataFrame, Series), without importing Dask.

    Examples
    --------
    >>> import numpy as np
    >>> is_dask(np.zeros(3))
    False
    """
    return type(x).__module__.split(".")[0] == "dask" and hasattr(x, "__dask_graph__")


@dataclass
class RowBlocks:
    """A Dask collection as consecutive row blocks.

    Attributes
    ----------
    parts : list of dask.delayed.Delayed
        One per chunk (array) or partition (DataFrame), in row order; each computes to an ndarray (or a CuPy
        array on a GPU worker), a pandas DataFrame or a Series.
    offsets : (n_blocks + 1,) int64 ndarray
        Global row of each block's first row; ``offsets[-1]`` is the number of rows.
    n_features : int
        Columns (1 for a 1-D array or a Series).
    names : list of str or None
        Column names of a DataFrame.
    dtype : numpy.dtype
        The common numeric dtype of the columns (object when a DataFrame has non-numeric columns).
    one_d : bool
        A 1-D array or a Series.
    frame : bool
        The blocks are pandas objects.

    Examples
    --------
    >>> import dask.array as da
    >>> rb = row_blocks(da.zeros((10, 3), chunks=(4, 3)))
    >>> rb.offsets.tolist(), rb.n_features, rb.n_rows
    ([0, 4, 8, 10], 3, 10)
    """

    parts: list[Any]
    offsets: np.ndarray
    n_features: int
    names: list[str] | None
    dtype: np.dtype
    one_d: bool = False
    frame: bool = False

    @property
    def n_rows(self) -> int:
        return int(self.offsets[-1])

    @property
    def sizes(self) -> list[int]:
        return np.diff(self.offsets).tolist()


def _numeric(dtype: Any) -> bool:
    try:
        return np.dtype(dtype).kind in "biuf"
    except TypeError:
        return False


def _persisted(x: Any) -> bool:
    """Whether ``x`` holds blocks in cluster memory (a persisted collection). Its blocks' delayed objects must
    then keep the futures (an unoptimised graph): else lazy results built on them (``labels_``, ``predict``)
    outlive the collection, the cluster releases the blocks, and computing them fails with lost dependencies."""
    try:
        from distributed import futures_of
    except ImportError:
        return False
    return bool(futures_of(x))


def row_blocks(x: Any, name: str = "X", *, ndim: tuple[int, ...] = (2,)) -> RowBlocks:
    """``x`` (a Dask array, DataFrame or Series) as :class:`RowBlocks`.

    A 2-D array chunked along its columns is rechunked to whole rows; unknown chunk or partition lengths are
    computed once (one cheap pass).

    Raises
    ------
    InputError
        The wrong number of dimensions, or a collection that is neither an array, a DataFrame nor a Series.
    """
    import dask
    import dask.array as da
    import dask.dataframe as dd

    if isinstance(x, da.Array):
        if x.ndim not in ndim:
            raise InputError(f"'{name}' must be {' or '.join(f'{d}-dimensional' for d in ndim)}. Got a Dask array "
                             f"of shape {x.shape} instead.")
        if x.ndim == 2 and x.numblocks[1] > 1:
            x = x.rechunk({1: -1})
        if any(c != c for c in x.chunks[0]):  # NaN: lengths unknown (e.g. after boolean indexing)
            x = x.compute_chunk_sizes()
        parts = list(x.to_delayed(optimize_graph=not _persisted(x)).ravel())
        offsets = np.concatenate([[0], np.cumsum(x.chunks[0])]).astype(np.int64)
        width = 1 if x.ndim == 1 else int(x.shape[1])
        return RowBlocks(parts, offsets, width, None, np.dtype(x.dtype), one_d=x.ndim == 1)
    if isinstance(x, dd.DataFrame | dd.Series):
        one_d = isinstance(x, dd.Series)
        if one_d and 1 not in ndim:
            raise InputError(f"'{name}' must be 2-dimensional (a DataFrame). Got a Dask Series instead.")
        if not one_d and 2 not in ndim:
            raise InputError(f"'{name}' must be 1-dimensional (a Series). Got a Dask DataFrame instead.")
        lengths = dask.compute(x.map_partitions(len))[0]
        offsets = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))]).astype(np.int64)
        dtypes = [x.dtype] if one_d else list(x.dtypes)
        names = None if one_d else [str(c) for c in x.columns]
        dtype = np.result_type(*dtypes) if dtypes and all(_numeric(d) for d in dtypes) else np.dtype(object)
        parts = list(x.to_delayed(optimize_graph=not _persisted(x)))
        return RowBlocks(parts, offsets, 1 if one_d else len(dtypes), names, dtype, one_d=one_d,
                         frame=True)
    raise InputError(f"'{name}' must be a Dask array, DataFrame or Series. Got {type(x).__name__} instead.")


def block_array(block: Any, dtype: Any = None) -> Any:
    """A block as an ndarray (pandas → NumPy; a CuPy array stays where it is), optionally cast to ``dtype``.

    Examples
    --------
    >>> import pandas as pd
    >>> block_array(pd.DataFrame({"a": [1, 2]}), np.float64).tolist()
    [[1.0], [2.0]]
    """
    if hasattr(block, "to_numpy"):
        return block.to_numpy(dtype=dtype)
    if hasattr(block, "__cuda_array_interface__"):
        return block if dtype is None else block.astype(dtype)
    return np.asarray(block, dtype=dtype)


def block_tensor(block: Any, dtype: torch.dtype | None = None, device: DeviceLike = None) -> torch.Tensor:
    """A block as a tensor: NumPy and pandas blocks share memory when they can, a CuPy block becomes a CUDA
    tensor without a copy; moved to ``device`` and cast to ``dtype`` when given.

    Examples
    --------
    >>> block_tensor(np.ones((2, 1), np.float32), torch.float64).dtype
    torch.float64
    """
    if isinstance(block, torch.Tensor):
        t = block
    elif hasattr(block, "__cuda_array_interface__"):
        t = torch.as_tensor(block, device="cuda")
    else:
        a = np.ascontiguousarray(block_array(block))
        t = torch.from_numpy(a) if a.flags.writeable else torch.from_numpy(a.copy())
    if device is not None:
        t = t.to(resolve_device(device))
    return t if dtype is None else t.to(dtype)


def tree_reduce(parts: list[Any], combine: Any, *args: Any) -> Any:
    """Combine delayed partial results ``FAN_IN`` at a time, ``combine(list_of_parts, *args)``, into one."""
    import dask

    level = list(parts)
    fn = dask.delayed(combine, pure=True)
    while len(level) > 1:
        level = [fn(level[i:i + FAN_IN], *args) for i in range(0, len(level), FAN_IN)]
    return level[0] if len(level) == 1 else fn(level, *args)


def compute_reduced(parts: list[Any], combine: Any, *args: Any) -> Any:
    """``combine(list_of_parts, *args)`` of delayed partial results, computed: up to ``FAN_IN`` parts come back
    to the client and are combined there (one hop fewer than a combine task: an iteration's round trip on a
    cluster is about half as long), more through :func:`tree_reduce` on the workers. Both combine the same
    parts in the same order.

    Examples
    --------
    >>> import dask
    >>> parts = [dask.delayed(abs)(v) for v in (-1, 2, -3)]
    >>> compute_reduced(parts, sum)
    6
    """
    if len(parts) <= FAN_IN:
        return combine(list(compute(*parts)), *args)
    (total,) = compute(tree_reduce(parts, combine, *args))
    return total


def register_torch_sizeof() -> None:
    """Tell Dask the size of a ``torch.Tensor`` (its bytes, on the host or a GPU): without it a tensor block looks
    like a few dozen bytes, so the scheduler may move a task (and a GB-sized block) to another worker to balance
    load. Run it in every worker process (``client.run(register_torch_sizeof)``) when blocks are tensors.

    Examples
    --------
    >>> from dask.sizeof import sizeof
    >>> register_torch_sizeof()
    >>> sizeof(torch.zeros(1000, dtype=torch.float64))
    8000
    """
    from dask.sizeof import sizeof

    @sizeof.register(torch.Tensor)
    def _tensor_bytes(t: torch.Tensor) -> int:
        return int(t.element_size() * t.nelement())


def compute(*objs: Any) -> tuple[Any, ...]:
    """``dask.compute`` on the active scheduler (a ``distributed.Client`` when one is current)."""
    import dask

    return dask.compute(*objs)
