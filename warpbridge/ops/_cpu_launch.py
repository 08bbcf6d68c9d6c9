"""CPU launches split over queries: a kernel whose thread index is a query (its arguments
carry a ``stride`` and an ``offset``) runs in chunks on several threads, in segments that
keep a long call interruptible. The neighbour ops launch every kernel this way.

On the CPU a launch calls the compiled entry point directly with a copy of an argument struct
recorded once (``warp_runtime.record``, as ``plan.KernelPlan`` does); its chunks run on a team
of the OpenMP threads a loaded framework brings (``_cpu_team``), else on warpbridge's own
thread pool (``_cpu_pool``). Elsewhere it is one ``wp.launch``.

State kept across calls, all of it listed in docs/architecture.md: the recorded launches (``_RECORDED``, each with until when its launches run on one thread), each
thread's reusable scratch (``kept``) and the shared empty arrays (``nothing``'s cache).
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
import time
from typing import Any

import numpy as np
import warp as wp

from .._core import warp_runtime
from .._core.errors import WarpBridgeError
from . import _cpu_pool as cpu_pool
from . import _cpu_team

_CPUS = os.cpu_count() or 1
# Below this many queries a second thread costs more than it saves: a kNN search over 10^4
# points took 224 -> 112 us for 256 queries on two threads, and the same 89 us for 128.
MIN_QUERIES_PER_THREAD = 128
# A scatter launch's slots each add into a copy of the reference-side gradients, zeroed and
# summed at O(N) each: a slot more from this many queries per slot on.
MIN_QUERIES_PER_SLOT = 512
# Chunks of a launch that is not a scatter: at least CHUNK_MIN queries, about
# CHUNKS_PER_THREAD of them per thread, taken in turn.
CHUNK_MIN = MIN_QUERIES_PER_THREAD // 4
CHUNKS_PER_THREAD = 8
# A CPU launch runs in segments of about SEGMENT_SECONDS each, the first FIRST_SEGMENT
# queries long, the next sized by the time the last took. Python acts on signals between
# segments, so Ctrl-C stops a long call within about that time; a call of fewer queries is
# one segment.
SEGMENT_SECONDS = 0.1
FIRST_SEGMENT = 1 << 16
# A team launch that took longer than its work would on one thread (the pieces of work times
# the least time a thread took per piece) waited for a thread that came late: its core busy
# with another process, which can hold it for a scheduler slice (milliseconds) while the
# caller waits at the region's end. That kernel's launches then run on the calling thread
# alone for SOLO_SECONDS; the next team launch after that measures again. (knn over 2 000
# points with a second core busy: 5.1 ms at the default threads against 3.1 on one, before.)
SOLO_SECONDS = 0.25


def _threads_from_environment() -> int:
    """``WARPBRIDGE_NUM_THREADS`` where it is a positive int, else ``os.cpu_count()``: read once,
    when warpbridge is imported (a lookup in ``os.environ`` costs ~2 us, and a call asks up to
    ten times)."""
    env = os.environ.get("WARPBRIDGE_NUM_THREADS", "")
    return int(env) if env.isdigit() and int(env) > 0 else _CPUS


_DEFAULT_THREADS = _threads_from_environment()
num_threads = _DEFAULT_THREADS  # set_num_threads' setting, or the default


def set_num_threads(n: int | None) -> None:
    """CPU threads used by the neighbour ops' launches (default: ``WARPBRIDGE_NUM_THREADS`` as
    it was when warpbridge was imported, else ``os.cpu_count()``; None restores it)."""
    global num_threads
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise WarpBridgeError(f"set_num_threads(): n must be a positive int or None, got {n!r}")
    num_threads = _DEFAULT_THREADS if n is None else n


def get_num_threads() -> int:
    return num_threads


def all_threads(device: Any) -> int:
    """The most threads a launch on ``device`` uses (one off the CPU)."""
    return num_threads if device.is_cpu else 1


def threads(device: Any, m: int) -> int:
    """How many CPU threads a launch over ``m`` queries that is not a scatter uses."""
    if not device.is_cpu:
        return 1
    return max(1, min(num_threads, m // MIN_QUERIES_PER_THREAD))


def slots(device: Any, m: int) -> int:
    """How many scatter slots (each a thread, and a copy of what it adds into) a launch over
    ``m`` queries uses."""
    if not device.is_cpu:
        return 1
    return max(1, min(num_threads, m // MIN_QUERIES_PER_SLOT))


def thread_copies(a: wp.array, slots: int, needed: bool) -> wp.array:
    """Zeroed copies of the gradient ``a`` for slots 1 .. slots - 1 of a scatter launch that
    adds into per-slot copies (slot 0 adds into ``a`` itself); empty when not ``needed``."""
    shape = (slots - 1, *(a.shape if needed else (0,) * a.ndim))
    return scratch(shape, a.dtype, a.device) if 0 in shape else wp.zeros(shape, dtype=a.dtype, device=a.device)


def add_copies(copies: wp.array, into: wp.array) -> None:
    """Add the slots' copies into ``into`` in slot order (deterministic). They exist only on
    the CPU: NumPy's vectorised adds on views of the same memory measured ~3x faster than a
    Warp kernel looping over the copies."""
    if copies.size == 0:
        return
    total = into.numpy()
    for part in copies.numpy():
        np.add(total, part, out=total)


def launch(kernel: Any, m: int, before: list, after: list, device: Any) -> None:
    """A launch over ``m`` queries (not a scatter), on as many CPU threads as pay."""
    launch_queries(kernel, m, threads(device, m), before, after, device, None)


def launch_queries(
    kernel: Any,
    m: int,
    n_slots: int,
    before: list,
    after: list,
    device: Any,
    stream: Any,
    scatter: bool = False,
    first_segment: int | None = None,
) -> None:
    """Launch ``kernel`` over ``m`` queries, with ``before + [stride, offset] + after`` arguments.

    On the CPU with ``n_slots`` > 1 threads: a kernel that scatters (``scatter=True``) runs
    ``n_slots`` interleaved shares (slot ``t``: the queries ``t, t + n_slots, ...``, stride
    ``n_slots``, an offset ``t`` modulo ``n_slots``), a fixed split whichever thread runs it,
    so sums are deterministic; any other kernel runs contiguous chunks that the threads take
    in turn, which keeps both cores busy even when one is shared. CPU launches go in segments
    (``segments``), so a long one stays interruptible.
    """
    if m == 0:
        return
    run = _launcher(kernel, before, after, m, device, stream)
    if not device.is_cpu:
        run(m, 1, 0)
        return
    first = first_segment or FIRST_SEGMENT
    if m <= first:
        _launch_range(run, 0, m, n_slots, scatter)
        return
    for start, count in segments(m, n_slots if scatter else 1, first):
        _launch_range(run, start, count, n_slots, scatter)


def segments(m: int, align: int, first: int):
    """``(start, count)`` ranges that cover ``m`` queries, each ``start`` a multiple of
    ``align``: ``first`` queries, then each range sized to take about SEGMENT_SECONDS by the
    time the previous one took (at most 4x longer)."""
    start, size = 0, first
    while start < m:
        count = min(m - start, max(align, size - size % align))
        began = time.perf_counter()
        yield start, count
        took = time.perf_counter() - began
        start += count
        size = int(count * min(4.0, SEGMENT_SECONDS / took)) if took > 0 else 4 * count


def _launch_range(run: Any, start: int, count: int, n_slots: int, scatter: bool) -> None:
    """Launch the queries ``start .. start + count`` (``start`` a multiple of ``n_slots`` for
    a scatter), on ``n_slots`` threads."""
    if n_slots == 1:
        run(count, 1, start)
        return
    chunk = 0 if scatter else max(CHUNK_MIN, -(-count // (n_slots * CHUNKS_PER_THREAD)))
    team = getattr(run, "team", None)
    if team is not None and run.solo():
        _in_turn(run, start, count, n_slots, scatter)
    elif team is not None:
        team(start, count, n_slots, chunk)  # on PyTorch's OpenMP workers, no Python between chunks
    else:
        cpu_pool.launch_range(run, start, count, n_slots, scatter, chunk)


def _in_turn(run: Any, start: int, count: int, n_slots: int, scatter: bool) -> None:
    """The queries ``start .. start + count`` on this thread: a scatter's slots one after the
    other (the same sums as on a team)."""
    if not scatter:
        run(count, 1, start)
        return
    for t in range(n_slots):
        run(len(range(t, count, n_slots)), n_slots, start + t)


class _Direct:
    """What direct CPU launches of one kernel with one set of argument types need, derived
    once from its recorded launch: the argument struct, the compiled entry point (and its
    address, for team launches), where the struct keeps ``stride`` and ``offset``."""

    def __init__(self, rec: Any, kernel: Any, n_before: int):
        self.Args, self.Bounds, self.forward = rec.Args, type(rec.bounds), rec.hooks.forward
        self.template = rec.template  # the recorded launch's own arguments
        self.module_exec = rec.module_exec  # keeps the module loaded
        self.stride, self.offset = kernel.adj.args[n_before].label, kernel.adj.args[n_before + 1].label
        self.at = (getattr(self.Args, self.stride).offset, getattr(self.Args, self.offset).offset)
        self.at += (self.Bounds.size.offset,)
        self.entry = ctypes.cast(self.forward, ctypes.c_void_p).value
        self.solo_until = 0.0  # until when its launches run on one thread (SOLO_SECONDS)
        # the layouts the team's native loop copies and writes: the struct within its buffers,
        # 32-bit stride and offset, the count first in the bounds
        fields = getattr(self.Args, self.stride), getattr(self.Args, self.offset)
        self.teams = (
            ctypes.sizeof(self.Args) <= _cpu_team.TEAM_ARGS_MAX
            and ctypes.sizeof(self.Bounds) <= _cpu_team.TEAM_BOUNDS_MAX
            and all(f.size == 4 for f in fields)
            and self.Bounds.shape.offset == 0
        )


class _Run:
    """One call's launches of a kernel: ``run(count, stride, offset)`` over ``count`` queries on
    this thread; ``run.team(start, m, slots, chunk)``, the ``m`` queries from ``start`` on a
    team of OpenMP threads."""

    def __init__(self, direct: _Direct, args: Any, team: Any):
        self.direct, self.args, self.team_launch = direct, args, team
        self.team = self._team if team is not None and direct.teams else None

    def solo(self) -> bool:
        """Whether this kernel's launches run on the calling thread alone for now."""
        until = self.direct.solo_until
        return until > 0.0 and time.perf_counter() < until

    def __call__(self, count: int, stride: int, offset: int) -> None:
        d = self.direct
        args = d.Args.from_buffer_copy(self.args)
        setattr(args, d.stride, stride)
        setattr(args, d.offset, offset)
        d.forward(ctypes.byref(d.Bounds((count,))), ctypes.byref(args))

    def _team(self, start: int, m: int, slots: int, chunk: int) -> None:
        d = self.direct
        team = self.team_launch
        bounds = d.Bounds((m,))
        job = _cpu_team.TeamJob(
            team.parallel, d.entry, ctypes.addressof(self.args), ctypes.addressof(bounds), team.clock,
            ctypes.sizeof(d.Args), ctypes.sizeof(bounds), *d.at, start, m, chunk, slots, slots, 0,
            _CLOCK_ID, _NO_TIME,
        )  # fmt: skip
        began = time.perf_counter_ns()
        team.forward(ctypes.byref(team.bounds), ctypes.byref(team.Args(ctypes.addressof(job))))
        alone = (slots if chunk == 0 else -(-m // chunk)) * job.chunk_ns  # this work on one thread
        if time.perf_counter_ns() - began > alone:
            d.solo_until = time.perf_counter() + SOLO_SECONDS


_CLOCK_ID = time.CLOCK_MONOTONIC if hasattr(time, "CLOCK_MONOTONIC") else 1
_NO_TIME = (1 << 63) - 1

# (kernel, device, each argument's (dtype, ndim) or type) -> _Direct
_RECORDED: dict = {}


def _launcher(kernel: Any, before: list, after: list, m: int, device: Any, stream: Any):
    """``run(count, stride, offset)``: launch ``kernel`` over ``count`` queries; on the CPU also
    ``run.team(start, m, slots, chunk)`` (None where it cannot): ``m`` queries on a team of
    PyTorch's OpenMP threads.

    On the CPU the arguments are packed once per call and each launch copies that struct and
    calls the compiled entry point directly: a few microseconds instead of a ``wp.launch``
    (~25 us, under the GIL) per chunk. The first call per kernel and argument types records
    a launch (``warp_runtime.record``: Warp validates the arguments and loads the module); later
    calls pack the struct from the arrays' descriptors themselves (a tiny kNN call measured
    0.22 -> 0.15 ms).

    A team launch hands the struct to ``_cpu_team.team``'s native loop, one ctypes call that
    releases the GIL: PyTorch's OpenMP workers run the chunks with no Python between them.
    With Python callbacks instead (a ctypes function per thread, each taking the GIL) a
    region cost 25-45 us, 120 us right after a PyTorch op, against ~1 us natively, and the
    kNN search at 10^4 points took 1.18 -> 0.96 ms. Why OpenMP's threads and not a pool of our
    own: after each parallel PyTorch op its workers keep spinning on the cores for
    milliseconds, so our own threads would compete with them (a radius train step measured
    17.5 -> 13.2 ms with the work handed to them).
    """

    def launch(count: int, stride: int, offset: int) -> None:
        wp.launch(kernel, dim=count, inputs=[*before, stride, offset, *after], device=device, stream=stream)

    if not device.is_cpu:
        return launch
    args = [*before, 1, 0, *after]
    key, values = [kernel, device.alias], []
    for a in args:  # one pass: the key (dtype and ndim of arrays, type of the rest), the values
        if isinstance(a, wp.array):
            key.append((a.dtype, a.ndim))
            values.append(a.__ctype__())
        else:
            key.append(type(a))
            values.append(a.__ctype__() if hasattr(a, "__ctype__") else a)  # structs by their ctype
    direct = _RECORDED.get(tuple(key))
    if direct is None:
        rec = warp_runtime.record(kernel, m, args, device)
        if not rec.direct:
            return launch  # CPU tile blocks: Warp's own launch path
        direct = _RECORDED[tuple(key)] = _Direct(rec, kernel, len(before))
        return _Run(direct, direct.template, _team(device))
    return _Run(direct, direct.Args(*values), _team(device))


def _team(device: Any) -> Any:
    """The device's team launch (``_cpu_team.Team``), or None: none loaded, or a forked child."""
    team = _cpu_team.TEAMS.get(device.alias)
    return team if team is not None and team.pid == os.getpid() else None


# A thread keeps its last CPU scratch array of each kind while it is at most this big, and
# the next call of the same size takes it again instead of allocating (~4 us an array, and
# page faults on fresh memory): a tiny kNN call measured 137 -> 97 us.
KEEP_BYTES = 8 << 20
_KEPT = threading.local()


def kept_each(kinds: tuple, shapes: list, dtypes: tuple, device: Any) -> tuple:
    """``kept`` for several kinds at once."""
    return tuple(kept(kind, shape, dtype, device) for kind, shape, dtype in zip(kinds, shapes, dtypes))


def kept(kind: str, shape: tuple, dtype: Any, device: Any) -> wp.array:
    """Uninitialised CPU scratch of ``kind`` (one per kind in use at a time), reused by this
    thread's next call of the same shape; elsewhere, or when big, a fresh array. CPU
    launches are synchronous, so the array is free again when the call returns."""
    if not device.is_cpu:
        return wp.empty(shape, dtype=dtype, device=device)
    arrays = _KEPT.__dict__
    a = arrays.get(kind)
    if a is None or a.shape != shape or a.dtype is not dtype:
        a = wp.empty(shape, dtype=dtype, device=device)
        if a.capacity <= KEEP_BYTES:
            arrays[kind] = a
        else:
            arrays.pop(kind, None)
    return a


def copy(dst: wp.array, src: wp.array) -> None:
    """``wp.copy(dst, src)``: a ``memmove`` where both are contiguous CPU arrays of the same
    size (~1 us against Warp's ~10 on a small call)."""
    same = dst.size == src.size and dst.dtype == src.dtype
    if same and dst.device.is_cpu and src.device.is_cpu and dst.is_contiguous and src.is_contiguous:
        ctypes.memmove(dst.ptr, src.ptr, dst.size * wp.types.type_size_in_bytes(dst.dtype))
    else:
        wp.copy(dst, src)


def minus_ones(a: wp.array) -> None:
    """Every entry of the integer array ``a`` set to -1: a ``memset`` of every bit on contiguous
    CPU memory, ``fill_`` elsewhere."""
    if a.device.is_cpu and a.is_contiguous:
        ctypes.memset(a.ptr, 0xFF, a.size * wp.types.type_size_in_bytes(a.dtype))
    else:
        a.fill_(-1)


def scratch(shape: Any, dtype: Any, device: Any) -> wp.array:
    """Uninitialised scratch; the shared empty array when it would hold nothing."""
    dims = shape if isinstance(shape, tuple) else (shape,)
    if 0 in dims:
        return nothing(dims, dtype, device.alias)
    return wp.empty(dims, dtype=dtype, device=device)


@functools.cache
def nothing(shape: tuple, dtype: Any, alias: str) -> wp.array:
    """A shared empty array on the device named ``alias`` (nothing to read or write, so any
    call may pass the same one): an allocation less per placeholder (~5 us each on a small
    call)."""
    return wp.empty(shape, dtype=dtype, device=alias)
