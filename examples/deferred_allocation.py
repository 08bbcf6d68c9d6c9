"""Deferred gradient allocation (a known Warp/PyTorch performance bug), with warpbridge.

By hand, `wp.from_torch(t)` on a tensor that requires grad allocates `t.grad` during the
forward; on CUDA, PyTorch then meets an externally allocated gradient in the backward and
synchronises the device, every iteration (a published write-up of the bug measured
98 ms against 22 ms once avoided, at N = 300M). warpbridge never touches `.grad` in the forward, so there is nothing
to avoid. This script shows both: whether `.grad` exists right after the forward, and the
time per iteration of each path (meaningful on a GPU; on the CPU there is no sync to lose).

Run: python examples/deferred_allocation.py [--n N] [--device cpu|cuda]
"""

import argparse
import time

import torch
import warp as wp

import warpbridge as wb


@wp.kernel
def sum_squares(a: wp.array(dtype=float), b: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = a[i] * a[i] + b[i] * b[i]


class ByHand(torch.autograd.Function):
    """The pattern of the case study's baseline: from_torch on tensors that require grad."""

    @staticmethod
    def forward(ctx, a, b):
        wa, wb_ = wp.from_torch(a), wp.from_torch(b)  # allocates a.grad and b.grad right here
        out = torch.empty_like(a)
        wout = wp.from_torch(out, requires_grad=True)
        tape = wp.Tape()
        with tape:
            wp.launch(sum_squares, dim=a.shape[0], inputs=[wa, wb_], outputs=[wout], device=wa.device)
        ctx.tape, ctx.arrays = tape, (wa, wb_, wout)
        return out

    @staticmethod
    def backward(ctx, grad):
        wa, wb_, wout = ctx.arrays
        ctx.tape.backward(grads={wout: wp.from_torch(grad.contiguous())})
        ga, gb = wp.to_torch(wa.grad).clone(), wp.to_torch(wb_.grad).clone()
        ctx.tape = ctx.arrays = None
        return ga, gb


op = wb.op(sum_squares)


def iteration_ms(fn, n, device, iters):
    times = []
    for _ in range(iters + 1):
        a = torch.rand(n, device=device, requires_grad=True)  # fresh tensors, as in the case study
        b = torch.rand(n, device=device, requires_grad=True)
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn(a, b).sum().backward()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return sorted(times[1:])[iters // 2]


def main(n: int = 1_000_000, device: str = "cpu", iters: int = 5) -> dict:
    a = torch.rand(n, device=device, requires_grad=True)
    b = torch.rand(n, device=device, requires_grad=True)
    out = op(a, b)
    ours_alloc = a.grad is not None or b.grad is not None
    out.sum().backward()
    torch.testing.assert_close(a.grad, 2 * a.detach())
    a2 = a.detach().clone().requires_grad_()
    ByHand.apply(a2, b.detach().clone().requires_grad_())
    hand_alloc = a2.grad is not None
    print(f".grad allocated by the forward: by hand {hand_alloc}, warpbridge {ours_alloc}")
    result = {
        "grad_allocated_in_forward": {"by_hand": hand_alloc, "warpbridge": ours_alloc},
        "by_hand_ms": iteration_ms(ByHand.apply, n, device, iters),
        "warpbridge_ms": iteration_ms(op, n, device, iters),
    }
    print(
        f"forward + backward, N = {n:,} on {device}: by hand {result['by_hand_ms']:.2f} ms, "
        f"warpbridge {result['warpbridge_ms']:.2f} ms"
    )
    return result


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    main(args.n, args.device)
