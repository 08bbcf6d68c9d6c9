"""The CPU team launch: one native call that runs a kernel's chunks on the threads of a GNU
OpenMP team (see ``cpu_launch._Run``)."""

import ctypes
import functools
import os
from typing import Any, NamedTuple

import warp as wp

from .._core import op as _op
from .._core import warp_runtime
from .kdtree.template import native

TEAM_ARGS_MAX = 8192  # the largest argument struct a team launch copies per thread (bytes)
TEAM_BOUNDS_MAX = 64  # and the largest launch bounds

# The native body of `team_launch`: a GNU OpenMP region (GOMP_parallel, by its address) whose
# threads run another kernel's compiled CPU entry point over the `m` queries from `base` on:
# chunks of `chunk` queries, taken in turn (`next`, atomic), or, with `chunk` 0, the interleaved
# shares of `slots` scatter slots (slot s: queries base + s, base + s + slots, ...; stride
# `slots`, offset base + s, with `base` a multiple of `slots`, so the kernel finds its slot as
# offset % stride), so a slot's sums do not depend on which thread runs it. Each thread patches its own copy of the argument struct
# (stride and offset) and of the launch bounds (the count), and leaves in `chunk_ns` the least
# time per piece of work any thread took (clock_gettime, by its address). Layouts come from ctypes.
_TEAM_SNIPPET = (
    native("cpu_team_loop.h")
    .replace("TEAM_ARGS_MAX", str(TEAM_ARGS_MAX))
    .replace("TEAM_BOUNDS_MAX", str(TEAM_BOUNDS_MAX))
)

TEAM_JOB = (
    ("gomp_parallel", "forward", "args", "bounds", "clock_gettime"),  # pointers
    ("args_size", "bounds_size", "stride_at", "offset_at", "size_at", "base", "m", "chunk", "slots", "threads", "next")
    + ("clock_id", "chunk_ns"),
)


@functools.cache
def team() -> Any:
    """The CPU team launch: a kernel of one thread whose native body runs a job (a pointer to
    a struct of TEAM_JOB's fields, see _TEAM_SNIPPET) on the threads of a GNU OpenMP team.
    Its own module: it is never compiled for CUDA."""

    @wp.func_native(_TEAM_SNIPPET)
    def run_team_job(job: wp.uint64): ...

    def team_launch(job: wp.uint64):
        run_team_job(job)

    return wp.kernel(team_launch, enable_backward=False, module="warpbridge_cpu_team")


_GOMP: list = []  # [library or None, pid], resolved once per process


def gomp() -> Any:
    """The GNU OpenMP runtime of a loaded framework (``Backend.openmp_library``), or None: no
    such framework, a forked child, or ``WARPBRIDGE_OPENMP=0``."""
    if _GOMP and _GOMP[1] != os.getpid():
        return None  # a forked child: libgomp's thread pool did not survive the fork (it would hang)
    if not _GOMP:
        lib = None
        if os.environ.get("WARPBRIDGE_OPENMP", "1") != "0":
            paths = [path for b in _op.loaded_backends() if (path := b.openmp_library())]
            try:
                if paths:
                    lib = ctypes.CDLL(paths[0])
                    lib.wb_parallel = ctypes.cast(lib.GOMP_parallel, ctypes.c_void_p).value
                    lib.wb_clock = ctypes.cast(ctypes.CDLL(None).clock_gettime, ctypes.c_void_p).value
            except (OSError, AttributeError):
                lib = None
        _GOMP[:] = [lib, os.getpid()]
    return _GOMP[0]


class TeamJob(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in TEAM_JOB[0]] + [(name, ctypes.c_longlong) for name in TEAM_JOB[1]]


class Team(NamedTuple):
    """A device's recorded team launch: its compiled entry point, argument struct type and
    bounds, the module executable that keeps it loaded; ``GOMP_parallel``'s and
    ``clock_gettime``'s addresses, and the process it belongs to (a forked child has no OpenMP
    threads: it must not use it)."""

    forward: Any
    Args: Any
    bounds: Any
    module_exec: Any
    parallel: int
    clock: int
    pid: int


TEAMS: dict = {}  # device alias -> Team


def load(device: Any) -> None:
    """Compile (first use) and record the CPU team launch (``team``) where a loaded framework
    brings GNU OpenMP (``gomp``); under LOAD_LOCK."""
    lib = gomp()
    if lib is not None and device.alias not in TEAMS:
        rec = warp_runtime.record(team(), 1, [0], device)
        if rec.direct:
            TEAMS[device.alias] = Team(
                rec.hooks.forward, rec.Args, rec.bounds, rec.module_exec, lib.wb_parallel, lib.wb_clock, os.getpid()
            )
