"""Which allocator Warp uses for the memory it allocates itself inside warpbridge ops.

Kernel ops and the point ops allocate everything through the caller's framework already.
Launch functions (``wb.op`` over a Python function) may allocate scratch arrays with
``wp.zeros``/``wp.empty``, and their backward runs a ``wp.Tape`` that allocates gradients
for those intermediates: by default from Warp's own CUDA pool, invisible to
``torch.cuda.memory_stats`` and not shared with PyTorch's cache. ``set_memory_pool("torch")``
routes those allocations through PyTorch's caching allocator (see ``_torch/_pool.py``). On
the CPU, and for JAX, Paddle and NumPy calls, the setting changes nothing.
"""

from __future__ import annotations

import os
import threading

from .._core.errors import WarpBridgeError

POOLS = ("warp", "torch")
_LOCK = threading.Lock()


def _check(pool: object, where: str) -> str:
    if pool not in POOLS:
        raise WarpBridgeError(f"{where}: the memory pool must be 'warp' or 'torch', got {pool!r}")
    return pool  # type: ignore[return-value]


_current = _check(os.environ.get("WARPBRIDGE_MEMORY_POOL", "warp"), "WARPBRIDGE_MEMORY_POOL")


def get_memory_pool() -> str:
    """The pool Warp allocations inside warpbridge ops come from: ``"warp"`` or ``"torch"``."""
    return _current


class set_memory_pool:  # noqa: N801 - used like a function, as torch.set_grad_enabled is
    """Choose where Warp allocates inside warpbridge ops on CUDA: ``"warp"`` (its own pool,
    the default) or ``"torch"`` (PyTorch's caching allocator, on the op's stream: visible in
    ``torch.cuda.memory_stats``, reused across calls). While ``torch.cuda.graph`` captures,
    PyTorch's allocator serves them whatever the choice: Warp's pool cannot free memory
    inside a capture it did not start.

    Takes effect at once; used as a context manager, it restores the previous choice on
    exit. ``WARPBRIDGE_MEMORY_POOL`` sets the initial choice. Harmless on the CPU.

    Example::

        wb.set_memory_pool("torch")          # from now on
        with wb.set_memory_pool("warp"):     # just here
            ...
    """

    def __init__(self, pool: str):
        global _current
        _check(pool, "set_memory_pool()")
        with _LOCK:
            self.previous, _current = _current, pool

    def __enter__(self) -> set_memory_pool:
        return self

    def __exit__(self, *exc: object) -> None:
        global _current
        with _LOCK:
            _current = self.previous

    def __repr__(self) -> str:
        return f"set_memory_pool({_current!r})"
