"""Soak: train with each op for a fixed time and compare resident memory and step time at the
start and at the end. Leaks (a cache that grows, a tape or grid kept alive, a registration per
call) show as RSS that keeps climbing; state that piles up shows as steps that slow down.

Each op trains a small model the realistic way: PyTorch layers before and after, gradients
accumulating into .grad, Adam, PyTorch's default threads. New inputs every step; the
neighbour ops get a new point cloud with a varying number of points every step, as a data
loader would hand them.

Usage: python benchmarks/soak.py [--minutes 10] [--ops wb_op,custom_backward,radius,knn]
       -> table + benchmarks/results/soak-<machine>.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from datetime import date

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import backward_kernels as B  # noqa: E402
from _kernels import mul  # noqa: E402

import warpbridge as wb  # noqa: E402

STEP_WINDOW = 200_000  # step times kept at the start and at the end of a run


def rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def machine() -> str:
    return f"{platform.machine()}-{os.cpu_count()}cpu"


def make_step(name: str, gen: torch.Generator):
    """A closure running one training step with the named op, and its model's parameters."""
    if name in ("radius", "knn"):
        enc = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.GELU(), torch.nn.Linear(16, 16))
        dec = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
        grid = torch.stack(torch.meshgrid(*[torch.linspace(-1, 1, 12)] * 3, indexing="ij"), -1).reshape(-1, 3)
        params = [*enc.parameters(), *dec.parameters()]

        def step():
            n = int(torch.randint(3000, 5000, (1,), generator=gen))
            cloud = torch.randn(n, 3, generator=gen) * 0.5
            feats = enc(cloud)
            if name == "radius":
                agg = wb.ops.radius_aggregate(grid, cloud, feats, 0.2, 0.1)
            else:
                agg = wb.ops.knn_aggregate(grid, cloud, feats, 7, 0.1)
            return (dec(agg) - grid.norm(dim=1, keepdim=True)).pow(2).mean()

        return step, params
    lin = torch.nn.Linear(64, 64, dtype=torch.float64)
    params = list(lin.parameters())
    if name == "wb_op":
        op = wb.op(mul)
        lin = lin.float()
        params = list(lin.parameters())

        def step():
            x = torch.randn(256, 64, generator=gen)
            h = lin(x).reshape(-1)
            return (op(h, h) - 1.0).pow(2).mean()  # a target away from 0: no denormals

        return step, params
    op = wb.op(B.power, backward=B.power_adjoint)

    def step():
        x = torch.randn(256, 64, generator=gen, dtype=torch.float64)
        h = torch.sigmoid(lin(x)).reshape(-1) + 0.5
        return (op(h, 3) - 2.0).pow(2).mean()

    return step, params


def soak(name: str, seconds: float) -> dict:
    gen = torch.Generator().manual_seed(0)
    step, params = make_step(name, gen)
    opt = torch.optim.Adam(params, lr=1e-3)
    # Step times go into buffers allocated (and touched) before the first RSS sample: a list
    # growing by one float per step is itself ~40 B/step of RSS, which an earlier run of this
    # script reported as the op's growth. The head keeps the first steps, a ring the last ones.
    head_buf, tail_buf = np.full(STEP_WINDOW, np.nan), np.full(STEP_WINDOW, np.nan)  # written: resident now
    n, rss, t_end = 0, [], time.monotonic() + seconds
    t0 = time.monotonic()
    while time.monotonic() < t_end:
        s = time.perf_counter()
        opt.zero_grad()
        loss = step()
        loss.backward()
        opt.step()
        dt = time.perf_counter() - s
        if n < STEP_WINDOW:
            head_buf[n] = dt
        tail_buf[n % STEP_WINDOW] = dt
        n += 1
        if not rss or time.monotonic() - t0 - rss[-1][0] >= 10.0:
            rss.append((time.monotonic() - t0, rss_mib()))
    rss.append((time.monotonic() - t0, rss_mib()))
    window = min(max(n // 10, 1), STEP_WINDOW - 10)
    head = head_buf[10 : 10 + window]
    last = np.roll(tail_buf, -(n % STEP_WINDOW)) if n > STEP_WINDOW else tail_buf[:n]
    tail = last[-window:]
    warm_rss = rss[min(1, len(rss) - 1)][1]
    half = next(r for t, r in rss if t >= rss[-1][0] / 2)
    return {
        "op": name,
        "seconds": round(time.monotonic() - t0, 1),
        "steps": n,
        "step_ms_start": round(1e3 * float(np.median(head)), 3),
        "step_ms_end": round(1e3 * float(np.median(tail)), 3),
        "rss_mib_start": round(warm_rss, 1),
        "rss_mib_end": round(rss[-1][1], 1),
        "rss_mib_max": round(max(r for _, r in rss), 1),
        "rss_mib_halfway": round(half, 1),  # a leak keeps growing in the second half; a cache does not
        "rss_series": [(round(t, 1), round(r, 1)) for t, r in rss],
        "max_rss_mib_process": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "loss_end": float(loss.detach()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="per op")
    ap.add_argument("--ops", default="wb_op,custom_backward,radius,knn")
    ap.add_argument("--replace", action="store_true", help="replace only these ops' rows in the committed JSON")
    args = ap.parse_args()
    rows = []
    for name in args.ops.split(","):
        print(f"soaking {name} for {args.minutes} min ...", flush=True)
        rows.append(soak(name, args.minutes * 60))
        print(json.dumps(rows[-1]), flush=True)
    print(f"\n{'op':<16}{'steps':>9}{'step ms start':>15}{'end':>8}{'RSS MiB start':>15}{'halfway':>9}{'end':>8}")
    for r in rows:
        print(
            f"{r['op']:<16}{r['steps']:>9}{r['step_ms_start']:>15.2f}{r['step_ms_end']:>8.2f}"
            f"{r['rss_mib_start']:>15.1f}{r['rss_mib_halfway']:>9.1f}{r['rss_mib_end']:>8.1f}"
        )
    out = os.path.join(HERE, "results", f"soak-{machine()}.json")
    if args.replace and os.path.exists(out):
        # re-run some ops of a committed soak: keep the other rows, each marked with its date
        with open(out) as fh:
            old = json.load(fh)
        mine = {r["op"] for r in rows}
        rows = [r for r in old["rows"] if r["op"] not in mine] + rows
    for r in rows:
        r.setdefault("date", str(date.today()))
    with open(out, "w") as fh:
        json.dump({"date": str(date.today()), "machine": machine(), "torch_threads": torch.get_num_threads(),
                   "minutes_per_op": args.minutes, "rows": rows}, fh, indent=1)  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
