"""Warp's allocations inside warpbridge ops: its own pool vs PyTorch's caching allocator.

``wb.set_memory_pool("torch")`` routes the memory Warp allocates itself inside an op through
PyTorch's caching allocator. Two train steps (forward + backward), each timed under both
settings, side by side in one process, interleaved rounds, medians:

* ``radius_aggregate`` at the tutorial size on CUDA (25 000 points, 30^3 queries, F = 25;
  the CPU size elsewhere). It allocates everything through torch already, so the setting
  should move nothing: the Warp allocation count shows it.
* a launch function with a scratch intermediate (``scaled_softplus``, 27 000 x 25 floats):
  Warp allocates the intermediate in the forward, and again with its gradient in the
  backward's tape. This is where the setting acts.

Per step: median time, Warp allocator calls (counted by a pass-through wrapper around
Warp's own allocator, or by the TorchAllocator), and on CUDA the torch allocations and the
peak memory torch sees. On the CPU the setting must be harmless: the times should match.

Usage: python benchmarks/memory_pool.py [--quick] [--device cpu|cuda]
       -> table + benchmarks/results/memory_pool-<machine>.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from datetime import date

import torch
import warp as wp

sys.path.insert(0, os.path.dirname(__file__))
from _kernels import scaled_softplus  # noqa: E402

import warpbridge as wb  # noqa: E402
from warpbridge._cli.measure import median_ms  # noqa: E402


class Counting:
    """Pass-through wrapper counting the calls to Warp's own allocator."""

    deallocate_requires_context_guard = True

    def __init__(self, inner):
        self.inner, self.allocations = inner, 0

    def allocate(self, size):
        self.allocations += 1
        return self.inner.allocate(size)

    def deallocate(self, ptr, size):
        self.inner.deallocate(ptr, size)


def cases(dev):
    g = torch.Generator().manual_seed(0)
    if dev == "cuda":
        m, n, f = 30, 25_000, 25
    else:
        m, n, f = 20, 8_000, 16
    lin = torch.linspace(-1, 1, m)
    grid = torch.stack(torch.meshgrid(lin, lin, lin, indexing="ij"), -1).reshape(-1, 3).to(dev)
    cloud = torch.randn(n, 3, generator=g).to(dev).requires_grad_()
    feats = torch.randn(n, f, generator=g).to(dev).requires_grad_()
    query = grid.clone().requires_grad_()

    def radius_step():
        out = wb.ops.radius_aggregate(query, cloud, feats, 0.2, 0.1)
        out.square().sum().backward()

    fn = wb.op(scaled_softplus, name="bench_scaled_softplus")
    x = torch.randn(27_000, 25, generator=g).to(dev).requires_grad_()
    w = torch.randn(25, generator=g).to(dev).requires_grad_()

    def function_step():
        fn(x, w).sum().backward()

    params = [cloud, feats, query, x, w]
    return {
        "radius_aggregate train step": radius_step,
        "launch function with scratch, train step": function_step,
    }, params


def measure(step, params, dev, pool, repeat):
    def run():
        for p in params:
            p.grad = None
        step()

    with wb.set_memory_pool(pool):
        counter = None
        if dev == "cuda":
            d = wp.get_device("cuda")
            if pool == "warp":
                counter = Counting(d.get_allocator())
                scope = wp.ScopedAllocator(d, counter)
            else:
                from warpbridge._backends.torch.pool import allocator

                counter = allocator(torch.device("cuda"))
                scope = None
            torch.cuda.synchronize()
            run()  # warm-up outside the counts
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            stats0 = torch.cuda.memory_stats()
            n0 = counter.allocations
            if scope is not None:
                with scope:
                    ms = median_ms(run, dev, repeat, warmup=0)
            else:
                ms = median_ms(run, dev, repeat, warmup=0)
            stats1 = torch.cuda.memory_stats()
            return {
                "ms": ms,
                "warp_allocations_per_step": (counter.allocations - n0) / repeat,
                "torch_allocations_per_step": (stats1["allocation.all.allocated"] - stats0["allocation.all.allocated"])
                / repeat,
                "torch_peak_mib": torch.cuda.max_memory_allocated() / 2**20,
            }
        return {"ms": median_ms(run, dev, repeat)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args()
    dev = args.device
    if dev == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here")
    rounds, repeat = (3, 5) if args.quick else (5, 11)
    steps, params = cases(dev)
    samples = {name: {"warp": [], "torch": []} for name in steps}
    for _ in range(rounds):  # interleaved: both settings see the same machine state
        for name, step in steps.items():
            for pool in ("warp", "torch"):
                samples[name][pool].append(measure(step, params, dev, pool, repeat))
    device_name = torch.cuda.get_device_name() if dev == "cuda" else platform.processor() or platform.machine()
    table = {}
    for name, by_pool in samples.items():
        table[name] = {
            pool: {k: statistics.median(s[k] for s in runs) for k in runs[0]} for pool, runs in by_pool.items()
        }
    print(f"\nTrain step with Warp's own pool vs torch's caching allocator ({device_name}, {dev})")
    cols = ["ms", "warp_allocations_per_step", "torch_allocations_per_step", "torch_peak_mib"]
    head = ["step ms", "Warp allocs", "torch allocs", "peak MiB"]
    print(f"{'case':<44}{'pool':>6}" + "".join(f"{h:>14}" for h in head))
    for name, by_pool in table.items():
        for pool, row in by_pool.items():
            cells = "".join(f"{row[c]:>14.2f}" if c in row else f"{'n/a':>14}" for c in cols)
            print(f"{name:<44}{pool:>6}{cells}")
        print(f"{'':<44}{'ratio':>6}{by_pool['torch']['ms'] / by_pool['warp']['ms']:>14.2f}  (torch / warp)")
    tag = "cuda-" + device_name.replace(" ", "_") if dev == "cuda" else f"{platform.machine()}-{os.cpu_count()}cpu"
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"memory_pool-{tag}.json")
    result = {
        "benchmark": "memory_pool",
        "date": date.today().isoformat(),
        "device": device_name,
        "versions": {"torch": torch.__version__, "warp": wp.config.version, "warpbridge": wb.__version__},
        "rounds": rounds,
        "repeat": repeat,
        "median": table,
        "samples": samples,
    }
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
