"""How soon Ctrl-C stops a long neighbour-op call: the time from SIGINT to KeyboardInterrupt.

Each case is a fresh process on 3 000 000 points that sends itself SIGINT during the tree
build (0.2 s in), the kNN search (1 s; NumPy at 2 s, past the first writes into NumPy's fresh
output, which can stall in the kernel's huge-page compaction), or the scatter backward of
knn_aggregate (1.5 s); then checks that the process still answers a small call. The target
is 0.5 s (CPU launches run in segments of about 0.1 s, and Python acts on the signal between
two). ``tests/test_interrupt.py`` checks, independently of the machine's speed, that no
segment starts once the signal has arrived.

Usage: python benchmarks/interrupt.py [--repeat 3]   -> table + benchmarks/results/interrupt-<machine>.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import textwrap
from datetime import date

TARGET_S = 0.5
CASES = [("torch", 0.2, "forward"), ("torch", 1.0, "forward"), ("numpy", 2.0, "forward"), ("torch", 1.5, "backward")]

SCRIPT = """
    import os, signal, sys, threading, time
    import numpy as np
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also under a shell's background job
    if sys.argv[1] == "torch":
        import torch
    import warpbridge as wb
    rng = np.random.default_rng(0)
    x = rng.random((3_000_000, 3), dtype=np.float32)
    f = rng.random((3_000_000, 4), dtype=np.float32)
    if sys.argv[1] == "torch":
        x, f = torch.from_numpy(x), torch.from_numpy(f).requires_grad_(True)
    sent = []

    def interrupt():
        time.sleep(float(sys.argv[2]))
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    try:
        if sys.argv[3] == "backward":
            wb.ops.knn_aggregate(x, x, f, 8, 0.1).sum().backward()
        else:
            wb.ops.knn(x, x, 16)
        print("finished")
    except KeyboardInterrupt:
        print("interrupted", time.perf_counter() - sent[0])
    small = x[:500]
    d, i, _ = wb.ops.knn(small, small, 3)
    print("usable", bool((np.asarray(i)[:, 0] == np.arange(500)).all()))
"""


def latency(framework: str, when: float, part: str) -> float | None:
    """Seconds from SIGINT to KeyboardInterrupt in one fresh process (None: it finished first)."""
    env = dict(os.environ, WARPBRIDGE_NUM_THREADS="2")
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), framework, str(when), part],
        capture_output=True, text=True, timeout=300, env=env, check=True,
    )  # fmt: skip
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    if lines.get("usable") != "True":
        raise RuntimeError(f"the process did not answer after the interrupt:\n{out.stdout}")
    return float(lines["interrupted"]) if "interrupted" in lines else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args()
    rows = []
    print(f"{'case':32s} {'median s':>9s} {'max s':>7s} {'target':>7s}")
    for framework, when, part in CASES:
        times = [latency(framework, when, part) for _ in range(args.repeat)]
        seen = [t for t in times if t is not None]
        name = f"{framework} {part}, SIGINT at {when} s"
        row = {"case": name, "seconds": times, "median_s": statistics.median(seen) if seen else None}
        row["within_target"] = bool(seen) and max(seen) < TARGET_S
        rows.append(row)
        print(
            f"{name:32s} {row['median_s'] or float('nan'):9.3f} {max(seen, default=float('nan')):7.3f} {TARGET_S:7.1f}"
        )
    meta = {"date": date.today().isoformat(), "machine": platform.machine(), "cpu_count": os.cpu_count()}
    path = os.path.join(args.out, f"interrupt-{platform.machine()}-{os.cpu_count()}cpu.json")
    os.makedirs(args.out, exist_ok=True)
    with open(path, "w") as f:
        json.dump({"meta": meta, "target_s": TARGET_S, "rows": rows}, f, indent=1)
    print(f"-> {path}")


if __name__ == "__main__":
    main()
