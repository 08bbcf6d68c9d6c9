"""Minimise a Warp loss with Paddle's Adam (the Paddle optimisation example of
Warp's interoperability guide): the op
takes Paddle tensors and gives Paddle gradients; no wp.from_paddle, no wp.Tape, no wp.init().

Run: python examples/paddle_adam.py [--steps N]
"""

import argparse

import paddle
import warp as wp

import warpbridge as wb


@wp.kernel
def sum_of_squares(xs: wp.array2d(dtype=float), loss: wp.array(dtype=float)):
    i = wp.tid()
    wp.atomic_add(loss, 0, xs[i, 0] ** 2.0 + xs[i, 1] ** 2.0)


loss_op = wb.op(sum_of_squares, output_dims=(1,))


def main(steps: int = 300) -> float:
    paddle.seed(0)
    xs = paddle.randn([100, 2])
    xs.stop_gradient = False
    opt = paddle.optimizer.Adam(learning_rate=0.1, parameters=[xs])
    for step in range(steps):
        loss = loss_op(xs, launch_dims=(xs.shape[0],))
        loss.backward()
        opt.step()
        opt.clear_grad()
        if step % (steps // 5) == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {loss.item():.6f}")
    return loss.item()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    main(p.parse_args().steps)
