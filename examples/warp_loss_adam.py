"""Minimise a loss written as a Warp kernel with PyTorch's Adam (the first optimisation
example of Warp's PyTorch interoperability guide): no wp.Tape, no wp.from_torch, no gradient bookkeeping.

Run: python examples/warp_loss_adam.py [--steps N]
"""

import argparse

import torch
import warp as wp

import warpbridge as wb


@wp.kernel
def sum_of_squares(xs: wp.array2d(dtype=float), loss: wp.array(dtype=float)):
    i = wp.tid()
    wp.atomic_add(loss, 0, xs[i, 0] ** 2.0 + xs[i, 1] ** 2.0)


# One output value; the launch runs one thread per point (launch_dims below: the default would
# be the Warp shape of `xs`, which is 2-D).
loss_op = wb.op(sum_of_squares, output_dims=(1,))


def main(steps: int = 200) -> float:
    gen = torch.Generator().manual_seed(0)
    xs = torch.randn(100, 2, generator=gen, requires_grad=True)
    opt = torch.optim.Adam([xs], lr=0.1)
    for step in range(steps):
        opt.zero_grad()
        loss = loss_op(xs, launch_dims=(xs.shape[0],))[0]
        loss.backward()
        opt.step()
        if step % (steps // 5) == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {loss.item():.6f}")
    return loss.item()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    main(p.parse_args().steps)
