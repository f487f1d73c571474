"""PyTorch implementation of the one operation :mod:`densitas.cluster` adds — the CPU path and the test oracle.

Operation ``"cluster_counting_scatter"`` (the scatter step of document 004's counting sort, method (a))::

    cluster_counting_scatter(keys: (n,) int64 in [0, k), offsets: (k,) int64) -> order: (n,) int64

``offsets`` is the exclusive scan of the histogram of ``keys``; ``order[offsets[j] : offsets[j] + count[j]]``
receives the positions ``i`` with ``keys[i] == j``. Contract: every position appears once, inside its key's
segment; the order *within* a segment is unspecified (the Triton kernel takes slots with atomics, as the paper's
GPU code does). This reference keeps the input order (a stable counting sort).

**Triton hook.** ``densitas/cluster/_triton.py`` registers the atomic scatter through ``_triton_registry.py``.
"""

from __future__ import annotations

import torch

from densitas._backend.dispatch import register

__all__ = ["counting_scatter"]

#: Largest one-hot block (elements) of the rank computation; keys beyond :data:`MAX_ONE_HOT_KEYS` take the
#: ranks from a stable sort instead (same result, O(n log n) instead of O(n·k)).
ONE_HOT_ELEMENTS = 1 << 22
MAX_ONE_HOT_KEYS = 256


@register("cluster_counting_scatter", "torch")
def counting_scatter(keys: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Stable scatter of positions into their key's segment: ``pos = offsets[key] + rank of i among its key``.

    The rank of each element among the earlier elements with the same key comes from a running count per key
    (a one-hot block and its column-wise inclusive scan), so the whole scatter is O(n·k) vectorised work for
    up to :data:`MAX_ONE_HOT_KEYS` keys; more keys take the ranks from a stable sort.
    """
    n = keys.shape[0]
    k = offsets.shape[0]
    dev = keys.device
    order = torch.empty(n, dtype=torch.int64, device=dev)
    if n == 0:
        return order
    if k > MAX_ONE_HOT_KEYS:
        perm = torch.sort(keys, stable=True).indices
        order.copy_(perm)  # the stable sort is the stable counting sort's result
        return order
    cursor = offsets.to(torch.int64).clone()
    cols = torch.arange(k, device=dev)
    step = max(ONE_HOT_ELEMENTS // max(k, 1), 1)
    for s in range(0, n, step):
        kc = keys[s:s + step]
        one_hot = (kc[:, None] == cols[None, :]).to(torch.int64)
        rank = torch.cumsum(one_hot, 0).gather(1, kc[:, None]).squeeze(1) - 1
        order[cursor[kc] + rank] = torch.arange(s, s + kc.shape[0], device=dev)
        cursor += one_hot.sum(0)
    return order
