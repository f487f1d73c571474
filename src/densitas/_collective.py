"""One long-running task per Dask worker, the tasks joined by a ``torch.distributed`` (gloo) process group.

An iterative fit whose every step adds a small vector over all the data (fuzzy k-means' partial sums) costs one
Dask computation per step when the client drives it: ~10–35 ms of scheduler round trip per step on one host,
as long as a step's compute on a GPU at 10⁸ rows. Once the blocks are in cluster memory (a persisted
collection), the loop can instead run inside the workers: each worker gets one task holding the blocks it
already stores, and the tasks add their vectors with an all-reduce (gloo over TCP: well under a millisecond for
a few hundred numbers), so the scheduler sees one task per worker for the whole fit.

:func:`placement` says where a persisted collection's blocks live (or None: no distributed client, blocks not
in cluster memory, workers not on TCP); :func:`run_on_workers` starts the tasks and returns their results.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch

from densitas.exceptions import DensitasError

__all__ = ["Comm", "GroupUnavailableError", "Placement", "placement", "run_on_workers"]

#: Seconds a task waits inside an all-reduce for the others before it fails.
GROUP_TIMEOUT_S = 600.0
#: Seconds a task waits for the others to join the group. Every task must run at the same time, which Dask does
#: not promise (two such runs at once on one-thread workers can each hold one worker): past this the run fails
#: with :class:`GroupUnavailableError` and the caller takes its scheduler-driven path.
JOIN_TIMEOUT_S = 60.0


class GroupUnavailableError(DensitasError, RuntimeError):
    """The tasks could not form their group (not all started in time, or the port was taken)."""


@dataclass(frozen=True)
class Placement:
    """The blocks of a collection that are in cluster memory, grouped by the worker holding each.

    Attributes
    ----------
    client : distributed.Client
    workers : list of str
        The workers holding blocks (TCP addresses), in rank order (by their first block).
    blocks : list of list of int
        Per worker, the indices of the blocks it holds, ascending.
    futures : list of distributed.Future
        Per block, in block order.
    """

    client: Any
    workers: list[str]
    blocks: list[list[int]]
    futures: list[Any]


def placement(collection: Any, parts: list[Any]) -> Placement | None:
    """Where the blocks ``parts`` (``collection.to_delayed()``, in order) of a persisted ``collection`` live.

    None when there is no current ``distributed.Client``, when some block is not in cluster memory (a lazy
    collection: its blocks are computed per task, so a loop over them belongs to the scheduler), or when a
    holding worker is not reachable over TCP.

    Examples
    --------
    >>> import dask.array as da
    >>> x = da.zeros((10, 2), chunks=5)
    >>> placement(x, list(x.to_delayed().ravel())) is None  # no distributed client here
    True
    """
    try:
        from distributed import futures_of, get_client, wait
    except ImportError:
        return None
    try:
        client = get_client()
    except ValueError:
        return None
    held = {f.key: f for f in futures_of(collection)}
    if not parts or any(getattr(p, "key", None) not in held for p in parts):
        return None
    ordered = [held[p.key] for p in parts]
    wait(ordered)
    if any(f.status != "finished" for f in ordered):
        return None
    who = client.who_has(ordered)
    groups: dict[str, list[int]] = {}
    for i, f in enumerate(ordered):
        holders = who.get(f.key)
        if not holders:
            return None
        groups.setdefault(holders[0], []).append(i)
    if not all(str(w).startswith("tcp://") for w in groups):
        return None
    workers = sorted(groups, key=lambda w: groups[w][0])
    return Placement(client, workers, [groups[w] for w in workers], ordered)


@dataclass(frozen=True)
class _Group:
    """How the tasks find each other: rank 0's host and a free port there."""

    host: str
    port: int
    world: int
    timeout_s: float
    join_timeout_s: float


class Comm:
    """The process group as one task sees it: its ``rank`` of ``world``, and :meth:`allreduce`."""

    def __init__(self, group: _Group, rank: int):
        import torch.distributed as tdist

        self.rank, self.world = rank, group.world
        try:
            self._store = tdist.TCPStore(group.host, group.port, group.world, is_master=rank == 0,
                                         timeout=timedelta(seconds=group.join_timeout_s))
            self._pg = tdist.ProcessGroupGloo(self._store, rank, group.world, timedelta(seconds=group.timeout_s))
        except RuntimeError as err:  # torch's DistStoreError / DistNetworkError
            raise GroupUnavailableError(f"Task {rank} of {group.world} could not join the group at "
                                        f"{group.host}:{group.port}: {err}") from None

    def close(self) -> None:
        """Release the group and its store (the rank-0 task's store closes the port)."""
        self._pg = self._store = None

    def allreduce(self, values: np.ndarray) -> np.ndarray:
        """The element-wise sum of ``values`` (float64) over all tasks, on every task (the same on each)."""
        t = torch.tensor(np.asarray(values, dtype=np.float64).ravel())
        self._pg.allreduce([t]).wait()
        return t.numpy().reshape(np.shape(values))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _member(fn: Any, group: _Group, rank: int, indices: list[int], args: tuple, *blocks: Any) -> Any:
    """The task on one worker: join the group, then ``fn(comm, [(index, block), ...], *args)``."""
    comm = Comm(group, rank)
    try:
        return fn(comm, list(zip(indices, blocks, strict=True)), *args)
    finally:
        comm.close()


def run_on_workers(where: Placement, fn: Any, *args: Any, timeout_s: float = GROUP_TIMEOUT_S,
                   join_timeout_s: float = JOIN_TIMEOUT_S) -> list[Any]:
    """Run ``fn(comm, blocks, *args)`` once on every worker of ``where`` at the same time, ``blocks`` being the
    ``(index, block)`` pairs that worker holds; returns the results in rank order.

    ``fn`` must call :meth:`Comm.allreduce` the same number of times on every worker (an all-reduce waits for
    all of them, up to ``timeout_s``), and must be importable by the workers (a module-level function). A task
    that raises must first take part in the all-reduce of that step (see ``_worker_fit`` in
    :mod:`densitas.cluster.dask`: a failure flag in every vector), so that the others stop too.

    Raises
    ------
    GroupUnavailableError
        The tasks did not all join within ``join_timeout_s`` (e.g. another such run holds a worker's threads).
    """
    host = where.workers[0].split("://", 1)[1].rsplit(":", 1)[0].strip("[]")
    port = where.client.run(_free_port, workers=[where.workers[0]])[where.workers[0]]
    group = _Group(host, int(port), len(where.workers), timeout_s, join_timeout_s)
    tasks = [where.client.submit(_member, fn, group, rank, idx, args, *[where.futures[i] for i in idx],
                                 workers=[w], allow_other_workers=False, pure=False)
             for rank, (w, idx) in enumerate(zip(where.workers, where.blocks, strict=True))]
    return where.client.gather(tasks)
