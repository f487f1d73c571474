"""Triton kernel of :mod:`densitas.cluster`: the atomic scatter of document 004's counting sort (method (a)).

Each program takes a block of keys; every element claims the next free slot of its key's segment with one
``atomic_add`` on a per-key cursor (initialised to the exclusive scan of the histogram) and writes its position
there. Coalesced reads, one atomic per element; the order inside a segment depends on the scheduling — exactly
the property the paper names ("fast, but loses point order inside a cluster"). Contract as in
:mod:`densitas.cluster._torch`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from densitas._backend.dispatch import interpret_mode

__all__ = ["counting_scatter"]

BLOCK = 16 if interpret_mode() else 1024  # tiny blocks under the interpreter: small tests span many programs


@triton.jit
def _scatter_kernel(keys_ptr, cursor_ptr, order_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    key = tl.load(keys_ptr + i, mask=m, other=0)
    slot = tl.atomic_add(cursor_ptr + key, 1, mask=m, sem="relaxed")
    tl.store(order_ptr + slot, i, mask=m)


def counting_scatter(keys: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The Triton implementation of ``cluster_counting_scatter`` (positions grouped by key, unstable)."""
    n = keys.shape[0]
    order = torch.empty(n, dtype=torch.int64, device=keys.device)
    if n == 0:
        return order
    cursor = offsets.to(torch.int64).contiguous().clone()
    _scatter_kernel[(triton.cdiv(n, BLOCK),)](keys.to(torch.int64).contiguous(), cursor, order, n, BLOCK=BLOCK)
    return order
