"""Timing and peak-memory helpers shared by the demo and the benchmark scripts."""

from __future__ import annotations

import ctypes
import statistics
import time
from collections.abc import Callable
from typing import Any


def sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def median_ms(fn: Callable[[], Any], device: str, repeat: int, warmup: int = 1) -> float:
    """Median wall time of ``fn`` in milliseconds, the device synchronised around each call."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def interleaved_ms(fns: dict[str, Callable[[], Any]], device: str, rounds: int, warmup: int = 1) -> dict[str, float]:
    """Median wall time of each of ``fns`` in milliseconds, measured in ``rounds`` rounds that
    call each once in turn (the device synchronised around each call): every function meets
    the caches and the memory the others leave, as a call in a training loop meets the
    model's, and a drift of the machine's load reaches all of them alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list] = {who: [] for who in fns}
    for _ in range(rounds):
        for who, fn in fns.items():
            sync(device)
            t = time.perf_counter()
            fn()
            sync(device)
            times[who].append((time.perf_counter() - t) * 1e3)
    return {who: statistics.median(ts) for who, ts in times.items()}


def per_call_ms(fn: Callable[[], Any], rounds: int, calls: int = 100, warmup: int = 20) -> float:
    """Milliseconds per call of a CPU ``fn`` too short to time alone: the median over
    ``rounds`` of the mean of ``calls`` calls, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    means = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        means.append((time.perf_counter() - t) * 1e3 / calls)
    return statistics.median(means)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def peak_mib(fn: Callable[[], Any], device: str) -> float:
    """Peak memory that one call of ``fn`` adds on top of what is already in use, in MiB.

    CUDA: ``torch.cuda`` peak-allocation stats. CPU: the process's peak resident set above its
    level before the call (Linux: writing 5 to /proc/self/clear_refs resets the high-water
    mark); NaN where that is not available.
    """
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed heap back, so the baseline is honest
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        base = _status_kib("VmRSS:")
    except OSError:
        return float("nan")
    fn()
    return max(0, _status_kib("VmHWM:") - base) / 1024
