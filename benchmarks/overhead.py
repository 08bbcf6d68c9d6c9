"""Per-call overhead of a warpbridge op against the ways people call Warp from PyTorch.

A 16-element float32 elementwise kernel (z = x * y), so that the numbers are overhead, not
arithmetic. Side by side in one process, interleaved rounds, medians of per-call times:

* raw ``wp.launch`` with arrays converted once beforehand (Warp's floor for a launch);
* the hand-written ``torch.library.custom_op`` with ``wp.from_torch`` inside, and the
  same with ``register_autograd`` and a backward custom op (forward + backward);
* ``warpbridge.op``: forward under no_grad, and forward + backward.

Usage: python benchmarks/overhead.py [--quick]   -> table + benchmarks/results/overhead-<machine>.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import date

import torch
import warp as wp

sys.path.insert(0, os.path.dirname(__file__))
from _kernels import mul  # noqa: E402

import warpbridge as wb  # noqa: E402

N = 16


# -- a hand-written custom op, as Warp's PyTorch interop guide writes one, for this kernel ----------


@torch.library.custom_op("bench::mul_fwd", mutates_args=())
def handwritten(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    z = torch.empty_like(x)
    wp.launch(mul, dim=x.shape[0], inputs=[wp.from_torch(x), wp.from_torch(y)], outputs=[wp.from_torch(z)])
    return z


@handwritten.register_fake
def _(x, y):
    return torch.empty_like(x)


@torch.library.custom_op("bench::mul_bwd", mutates_args=())
def handwritten_bwd(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor, adj_z: torch.Tensor) -> list[torch.Tensor]:
    wx, wy = wp.from_torch(x, requires_grad=False), wp.from_torch(y, requires_grad=False)
    gx, gy = torch.zeros_like(x), torch.zeros_like(y)
    wp.launch(
        mul,
        dim=x.shape[0],
        inputs=[wx, wy],
        outputs=[wp.from_torch(z, requires_grad=False)],
        adj_inputs=[wp.from_torch(gx), wp.from_torch(gy)],
        adj_outputs=[wp.from_torch(adj_z.contiguous(), requires_grad=False)],
        adjoint=True,
    )
    return [gx, gy]


@handwritten_bwd.register_fake
def _(x, y, z, adj_z):
    return [torch.empty_like(x), torch.empty_like(y)]


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs, output)


def _backward(ctx, adj_z):
    x, y, z = ctx.saved_tensors
    gx, gy = handwritten_bwd(x, y, z, adj_z)
    return gx, gy


handwritten.register_autograd(_backward, setup_context=_setup)


def per_call_us(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def machine() -> str:
    return f"{platform.machine()}-{os.cpu_count()}cpu"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer rounds (about 5 s)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args()
    rounds, calls = (5, 300) if args.quick else (21, 1000)

    op = wb.op(mul)
    x, y = torch.randn(N), torch.randn(N)
    xg, yg = x.clone().requires_grad_(), y.clone().requires_grad_()
    g = torch.ones(N)
    wx, wy, wz = wp.from_torch(x), wp.from_torch(y), wp.from_torch(torch.zeros(N))

    def raw():
        wp.launch(mul, dim=N, inputs=[wx, wy], outputs=[wz])

    # "no grad": inputs that do not require grad, so neither path records autograd state
    def ours_fwd():
        op(x, y)

    def hand_fwd():
        handwritten(x, y)

    def ours_fb():
        torch.autograd.backward(op(xg, yg), g)

    def hand_fb():
        torch.autograd.backward(handwritten(xg, yg), g)

    cases = {
        "raw wp.launch (pre-converted arrays)": raw,
        "hand-written custom_op forward": hand_fwd,
        "warpbridge forward (no grad)": ours_fwd,
        "hand-written custom_op + register_autograd fwd+bwd": hand_fb,
        "warpbridge fwd+bwd": ours_fb,
    }
    for fn in cases.values():  # warm up: compile the module, fill the plan caches
        for _ in range(50):
            fn()
    # check the paths agree before timing them
    torch.testing.assert_close(op(x, y), handwritten(x, y))
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):  # interleaved, so drift on a noisy machine hits every case alike
        for name, fn in cases.items():
            samples[name].append(per_call_us(fn, calls))
    med = {k: statistics.median(v) for k, v in samples.items()}
    ratios = {
        "forward / hand-written custom_op forward": med["warpbridge forward (no grad)"]
        / med["hand-written custom_op forward"],
        "forward / raw wp.launch": med["warpbridge forward (no grad)"] / med["raw wp.launch (pre-converted arrays)"],
        "fwd+bwd / hand-written custom_op fwd+bwd": med["warpbridge fwd+bwd"]
        / med["hand-written custom_op + register_autograd fwd+bwd"],
    }
    targets = {
        "forward / hand-written custom_op forward": 0.35,
        "forward / raw wp.launch": 1.0,
        "fwd+bwd / hand-written custom_op fwd+bwd": 0.5,
    }
    print(f"\nPer-call time, {N}-element float32 kernel, median of {rounds} rounds x {calls} calls ({machine()})")
    print(f"{'case':<55}{'median us':>12}")
    for k, v in med.items():
        print(f"{k:<55}{v:>12.2f}")
    print(f"\n{'ratio':<55}{'value':>8}{'target':>9}  ok")
    for k, v in ratios.items():
        print(f"{k:<55}{v:>8.2f}{'<= ' + str(targets[k]):>9}  {'yes' if v <= targets[k] else 'NO'}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"overhead-{machine()}.json")
    result = {
        "benchmark": "overhead",
        "date": date.today().isoformat(),
        "machine": machine(),
        "cpu": platform.processor() or platform.machine(),
        "versions": {"torch": torch.__version__, "warp": wp.config.version, "warpbridge": wb.__version__},
        "n": N,
        "rounds": rounds,
        "calls_per_round": calls,
        "median_us": med,
        "samples_us": samples,
        "ratios": ratios,
        "targets": targets,
    }
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
