"""PyTorch's CUDA caching allocator behind Warp's ``Allocator`` protocol."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import warp as wp

from ..._core.errors import WarpBridgeError
from .. import memory_pool as _pool


class TorchAllocator:
    """Warp allocations served by PyTorch's caching allocator on one CUDA device.

    Memory is taken on PyTorch's current stream (warpbridge launches on it), so it is
    stream-ordered like any tensor, shows in ``torch.cuda.memory_stats``, returns to the
    cache when the Warp array dies, and comes from the graph's private pool during
    ``torch.cuda.graph`` capture. Usable outside warpbridge too::

        with wp.ScopedAllocator("cuda:0", wb.TorchAllocator("cuda:0")):
            scratch = wp.zeros(n, dtype=float, device="cuda:0")

    ``allocations`` and ``allocated_bytes`` count what went through it.
    """

    deallocate_requires_context_guard = False  # torch sets the device itself

    def __init__(self, device: Any = "cuda"):
        d = torch.device(device)
        if d.type != "cuda":
            raise WarpBridgeError(f"TorchAllocator(): device must be a CUDA device, got {d}")
        self.index = d.index if d.index is not None else torch.cuda.current_device()
        self.allocations = 0
        self.allocated_bytes = 0

    def allocate(self, size_in_bytes: int) -> int:
        self.allocations += 1
        self.allocated_bytes += size_in_bytes
        stream = torch.cuda.current_stream(self.index)
        return torch.cuda.caching_allocator_alloc(size_in_bytes, self.index, stream)

    def deallocate(self, ptr: int, size_in_bytes: int) -> None:
        torch.cuda.caching_allocator_delete(ptr)

    def __repr__(self) -> str:
        return f"TorchAllocator(cuda:{self.index}, allocations={self.allocations})"


_ALLOCATORS: dict[int, TorchAllocator] = {}


def allocator(device: torch.device) -> TorchAllocator:
    index = device.index if device.index is not None else torch.cuda.current_device()
    a = _ALLOCATORS.get(index)
    if a is None:
        a = _ALLOCATORS[index] = TorchAllocator(torch.device("cuda", index))
    return a


def scope(device: torch.device, warp_device: Any) -> Any:
    """Where Warp allocates during one call of an op on ``device`` (see ``memory_pool``):
    PyTorch's caching allocator when the pool is ``"torch"`` or while the current stream
    captures a CUDA graph (Warp's own pool frees memory outside the graph, which invalidates
    a capture Warp did not start), else Warp's own pool."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    if _pool.get_memory_pool() != "torch" and not torch.cuda.is_current_stream_capturing():
        return contextlib.nullcontext()
    return wp.ScopedAllocator(warp_device, allocator(device))
