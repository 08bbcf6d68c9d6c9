"""Minimise the Rosenbrock function over 1500 points with Adam, the function written as a
Warp kernel and made a PyTorch op by warpbridge (the autograd example of Warp's
PyTorch interoperability guide, without its hand-written autograd.Function). Compares the Warp gradient with PyTorch's own on the way.

Run: python examples/rosenbrock.py [--steps N]
"""

import argparse

import torch
import warp as wp

import warpbridge as wb


@wp.func
def rosenbrock(x: float, y: float):
    return (1.0 - x) ** 2.0 + 100.0 * (y - x**2.0) ** 2.0


@wb.op
@wp.kernel
def eval_rosenbrock(xy: wp.array(dtype=wp.vec2), z: wp.array(dtype=float)):
    i = wp.tid()
    v = xy[i]
    z[i] = rosenbrock(v[0], v[1])


def main(steps: int = 3000) -> torch.Tensor:
    gen = torch.Generator().manual_seed(42)
    xy = torch.randn(1500, 2, generator=gen).requires_grad_()
    opt = torch.optim.Adam([xy], lr=5e-2)

    # One check first: Warp's generated adjoint against PyTorch's autograd of the same formula.
    eval_rosenbrock(xy).sum().backward()
    warp_grad = xy.grad.clone()
    xy.grad = None
    x, y = xy[:, 0], xy[:, 1]
    ((1 - x) ** 2 + 100 * (y - x * x) ** 2).sum().backward()
    err = ((warp_grad - xy.grad).abs().max() / xy.grad.abs().max()).item()
    print(f"max relative gradient error vs PyTorch autograd: {err:.2e}")

    for step in range(steps):
        opt.zero_grad()
        loss = eval_rosenbrock(xy).mean()
        loss.backward()
        opt.step()
        if step % (steps // 6) == 0 or step == steps - 1:
            print(f"step {step:5d}  mean f = {loss.item():.6f}")
    mean = xy.detach().mean(0)
    print(f"mean point {mean.tolist()} (the minimum is at (1, 1))")
    return mean


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=3000)
    main(ap.parse_args().steps)
