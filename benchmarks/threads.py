"""Default threads against one thread, in the three conditions a shared machine puts a call
in: (a) another process keeps a second core busy, (b) the call comes after 10 ms idle (the
threads of the last parallel region asleep), (c) a quiet machine, calls back to back.

Per op and size: the median time of a call at one thread (``wb.ops.set_num_threads(1)``) and
at the default threads, in each condition, and their ratio. The rule measured: default
threads at most 1.1x one thread in (a) and (b), and the fastest in (c). A PyTorch op runs
before each call (as in a training step), so PyTorch's OpenMP threads are in whatever state
that leaves them.

Usage: python benchmarks/threads.py [--quick]
       -> table + benchmarks/results/threads-<machine>.json
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import distributions as D  # noqa: E402

import warpbridge as wb  # noqa: E402


def _spin(stop) -> None:
    while not stop.is_set():
        pass


def cases() -> dict:
    """name: a call, on real-shaped clouds."""
    out = {}
    for n in (100, 2_000, 20_000):
        ref = torch.from_numpy(D.make("object scan, closed surface", n, seed=1)[0]).float()
        r = float(wb.ops.knn(ref, ref, 17).dist[:, -1].median())  # about 16 neighbours each
        out[f"knn k=16, {n} points"] = lambda ref=ref: wb.ops.knn(ref, ref, 16)
        out[f"radius_graph ~16 nb, {n} points"] = lambda ref=ref, r=r: wb.ops.radius_graph(ref, r)
        out[f"knn_graph k=16, {n} points"] = lambda ref=ref: wb.ops.knn_graph(ref, 16)
    for n in (100, 1_000, 10_000):  # liquid-like periodic boxes: density 0.1, cutoff 5
        g, side = torch.Generator().manual_seed(n), (n / 0.1) ** (1 / 3)
        pos, cell = torch.rand(n, 3, generator=g, dtype=torch.float64) * side, torch.eye(3, dtype=torch.float64) * side
        out[f"neighbor_list, periodic, {n} atoms"] = lambda p=pos, c=cell: wb.ops.neighbor_list(p, 5.0, cell=c)
    return out


def measure(call, repeat: int, condition: str, default_threads: int) -> dict:
    """Medians at one thread and at the default threads, interleaved call by call (so a drift
    of the machine's state hits both alike), each call after a PyTorch op and, for "idle
    10 ms", after 10 ms asleep."""
    idle = 0.01 if condition == "idle 10 ms" else 0.0
    a = torch.randn(256, 256)
    times = {"one thread": [], "default": []}
    for i in range(2 * (repeat + 2)):
        label, threads = (("one thread", 1), ("default", default_threads))[i % 2]
        wb.ops.set_num_threads(threads)
        if idle:
            time.sleep(idle)
        a @ a  # a PyTorch op before the call, as in a training step
        t = time.perf_counter()
        call()
        times[label].append(time.perf_counter() - t)
    wb.ops.set_num_threads(None)
    row = {label: statistics.median(values[2:]) * 1e3 for label, values in times.items()}
    row["ratio"] = row["default"] / row["one thread"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args()
    t0, repeat, default_threads = time.perf_counter(), 9 if args.quick else 31, wb.ops.get_num_threads()
    rows = []
    for name, call in cases().items():
        call()
        for condition in ("quiet", "idle 10 ms", "busy core"):
            stop = multiprocessing.Event()
            busy = multiprocessing.Process(target=_spin, args=(stop,)) if condition == "busy core" else None
            if busy:
                busy.start()
                time.sleep(0.2)
            try:
                row = measure(call, repeat, condition, default_threads)
            finally:
                if busy:
                    stop.set()
                    busy.join()
            rows.append({"case": name, "condition": condition, **row})
            print(
                f"{name:<34} {condition:<11} one thread {row['one thread']:8.3f} ms  default {row['default']:8.3f} ms"
                f"  ratio {row['ratio']:5.2f}",
                flush=True,
            )
    print("->", D.save(args.out, "threads", rows, t0))


if __name__ == "__main__":
    main()
