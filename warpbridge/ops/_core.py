"""Framework-neutral launches of the point kernels, on Warp arrays the adapter allocated.

Adapters allocate every array (outputs, saved state and scratch) with their framework's
allocator and hand Warp views; this module only launches. Nothing here keeps state between
calls: the grid travels as plain arrays from the forward to the backward.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import warp as wp

from .. import _plan
from . import _kernels
from ._kernels import GRID_SLACK

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
_num_threads: int | None = None
# Below this many queries a second thread costs more than it saves (~20 us per launch).
MIN_QUERIES_PER_THREAD = 512


def set_num_threads(n: int | None) -> None:
    """CPU threads used by the point ops (default: ``os.cpu_count()``; None restores it)."""
    global _num_threads
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        from .._errors import WarpBridgeError

        raise WarpBridgeError(f"set_num_threads(): n must be a positive int or None, got {n!r}")
    _num_threads = n


def get_num_threads() -> int:
    if _num_threads is not None:
        return _num_threads
    env = os.environ.get("WARPBRIDGE_NUM_THREADS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    return os.cpu_count() or 1


def grid_capacity(n: int, cells_per_point: int) -> int:
    """Cells a grid over ``n`` points may use; its ``starts`` array has capacity + 2 entries.

    Radius searches use 8 cells per point, so cells can shrink to the radius (27 cells to
    visit, ~6x more candidates than neighbours); kNN searches use 1 (about a point per cell).
    """
    return cells_per_point * n + GRID_SLACK


def slots(device: Any, m: int) -> int:
    """How many scatter slots (= CPU threads) a launch over ``m`` queries uses."""
    if not device.is_cpu:
        return 1
    return max(1, min(get_num_threads(), m // MIN_QUERIES_PER_THREAD))


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        with _POOL_LOCK:
            if _POOL is None:
                _POOL = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1), thread_name_prefix="warpbridge")
    return _POOL


def launch_queries(
    kernel: Any, m: int, n_slots: int, before: list, after: list, device: Any, stream: Any, scatter: bool = False
) -> None:
    """Launch ``kernel`` over ``m`` queries, with ``before + [stride, offset] + after`` arguments.

    On the CPU with ``n_slots`` > 1 threads: a kernel that scatters (``scatter=True``) gives
    thread ``t`` the queries ``t, t + n_slots, ...`` and scatter slot ``t``, a fixed split, so
    sums are deterministic; any other kernel runs contiguous chunks that the threads (the
    caller included) take in turn, which keeps both cores busy even when one is shared (for
    example with OpenMP threads still spinning after a PyTorch op).
    """
    if m == 0:
        return
    if n_slots == 1:
        wp.launch(kernel, dim=m, inputs=[*before, 1, 0, *after], device=device, stream=stream)
        return
    wp.load_module(kernel.module, device=device)  # compile once, before the threads race to

    if scatter:

        def work(t: int) -> None:
            wp.launch(kernel, dim=len(range(t, m, n_slots)), inputs=[*before, n_slots, t, *after], device=device)

        tasks = range(n_slots)
    else:
        size = max(MIN_QUERIES_PER_THREAD // 4, -(-m // (n_slots * 8)))
        chunks = iter(range(0, m, size))  # next() is atomic under the GIL

        def work(_: int) -> None:
            for start in chunks:
                n = min(size, m - start)
                wp.launch(kernel, dim=n, inputs=[*before, 1, start, *after], device=device)

        tasks = range(n_slots)
    futures = [_pool().submit(work, t) for t in tasks[1:]]
    work(tasks[0])  # the calling thread works too
    for f in futures:
        f.result()


def build_grid(
    k: Any,
    points: wp.array,
    min_cell: float,
    scratch: tuple[wp.array, wp.array, wp.array, wp.array],
    grid: tuple[wp.array, wp.array, wp.array, wp.array, wp.array],
    device: Any,
    stream: Any,
) -> None:
    """Counting-sort ``points`` into a dense grid.

    ``scratch`` = (lohi (2,) vec3 filled with +inf/-inf, cell_of (N,) int32, counts (cap+2,)
    int32 zeroed, cursor (cap+2,) int32); ``grid`` = (order (N,) int32, sorted (N,) vec3,
    starts (cap+2,) int32, geom (4,), dims (3,) int32).
    """
    lohi, cell_of, counts, cursor = scratch
    order, sorted_points, starts, geom, dims = grid
    n = points.shape[0]
    cap = counts.shape[0] - 2
    with wp.ScopedStream(stream) if stream is not None else wp.ScopedDevice(device):
        if n:
            wp.launch(k.grid_bounds, dim=n, inputs=[points, lohi], device=device)
        wp.launch(k.grid_setup, dim=1, inputs=[lohi, cap, min_cell, geom, dims], device=device)
        if n:
            wp.launch(k.grid_assign, dim=n, inputs=[points, geom, dims, cap, cell_of, counts], device=device)
        wp.utils.array_scan(counts, starts, inclusive=False)
        if n:
            wp.copy(cursor, starts)
            wp.launch(k.grid_fill, dim=n, inputs=[points, cell_of, cursor, order, sorted_points], device=device)


_LOADED: set = set()


def kernels_for(dtype_name: str, device: Any) -> Any:
    """The point kernels for a dtype, their module built and loaded on ``device``.

    The first call per (dtype, device) holds warpbridge's load lock: Warp's module build and
    load are not safe to enter from several threads at once (a cold start from a thread pool
    crashed), and the queries themselves launch from several threads."""
    key = (dtype_name, device.alias)
    if key in _LOADED:
        return _kernels.kernels(wp.float32 if dtype_name == "float32" else wp.float64)
    with _plan.LOAD_LOCK:
        k = _kernels.kernels(wp.float32 if dtype_name == "float32" else wp.float64)
        k.grid_init.module.load(device)
        _LOADED.add(key)
    return k
