"""warpbridge's own CPU thread pool: where no framework brings GNU OpenMP (``_cpu_team``), a
CPU launch's chunks or scatter slots run on these threads, the caller's among them.

State kept across calls (listed in docs/architecture.md): the pool, made on first use and
again in a forked child, which has none of its parent's threads.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
_POOL_PID = 0
_CPUS = os.cpu_count() or 1


def _pool() -> ThreadPoolExecutor:
    global _POOL, _POOL_PID
    if _POOL is None or os.getpid() != _POOL_PID:  # a forked child has none of the parent's threads
        with _POOL_LOCK:
            if _POOL is None or os.getpid() != _POOL_PID:
                _POOL = ThreadPoolExecutor(max_workers=max(2, _CPUS), thread_name_prefix="warpbridge")
                _POOL_PID = os.getpid()
    return _POOL


def launch_range(run: Any, start: int, count: int, n_slots: int, scatter: bool, chunk: int) -> None:
    """The queries ``start .. start + count`` on warpbridge's pool (``parallel``): a scatter's
    slots, or chunks of ``chunk`` queries, taken in turn."""
    if scatter:
        shares = iter(range(n_slots))  # slot t's queries: start + t, + n_slots, ...; any thread may run it

        def work(thread: int, team: int) -> None:
            for t in shares:
                if stopped[0]:
                    return
                run(len(range(t, count, n_slots)), n_slots, start + t)

    else:
        chunks = iter(range(start, start + count, chunk))  # next() is atomic under the GIL

        def work(thread: int, team: int) -> None:
            for first in chunks:
                if stopped[0]:
                    return
                run(min(chunk, start + count - first), 1, first)

    stopped = [False]  # the caller was interrupted: the threads take no further chunk
    parallel(work, n_slots, stopped)


def parallel(work: Any, n: int, stopped: list | None = None) -> None:
    """Run ``work(thread, team)`` on up to ``n`` threads of warpbridge's pool, the caller
    included, where ``work`` takes its shares from a common supply until none is left: once
    the caller's own ``work`` returns, a helper that has not started yet is cancelled, not
    waited for (a helper on a core that is busy or was idle can start milliseconds late; the
    caller has done its shares by then). Re-raise the first error, once every started thread
    has stopped (so an interrupt never leaves a thread writing into arrays the caller frees).
    On an error or interrupt in the caller, ``stopped[0]`` turns True, for work that checks it
    between chunks."""
    futures, inline = [], []
    for t in range(1, n):
        try:
            futures.append(_pool().submit(work, t, n))
        except RuntimeError:  # the interpreter is exiting (JAX finishing a computation at exit)
            inline.append(t)
    stopped = stopped if stopped is not None else [False]
    try:
        work(0, n)
        for t in inline:
            work(t, n)
    except BaseException:
        stopped[0] = True
        raise
    finally:
        futures = [f for f in futures if not f.cancel()]  # those that started: wait for them
        _wait_all(futures, stopped)
    for f in futures:
        f.result()


def _wait_all(futures: list, stopped: list) -> None:
    """Wait until every future is done, even through KeyboardInterrupt (which sets
    ``stopped[0]`` and is re-raised after)."""
    interrupted = None
    while True:
        try:
            concurrent.futures.wait(futures)
            break
        except KeyboardInterrupt as e:
            stopped[0] = True
            interrupted = e
    if interrupted is not None:
        raise interrupted
