"""A Warp kernel inside a `torch.compile(fullgraph=True)` training step (the custom-op
example of Warp's PyTorch interoperability guide): warpbridge registers `torch.ops.warpbridge.<name>` with its fake and autograd
formulas, so there is nothing to write by hand and no graph break.

Run: python examples/compile_custom_op.py [--steps N]
"""

import argparse

import torch
import warp as wp

import warpbridge as wb


@wb.op
@wp.kernel
def rosenbrock(xy: wp.array(dtype=wp.vec2), z: wp.array(dtype=float)):
    i = wp.tid()
    x = xy[i][0]
    y = xy[i][1]
    z[i] = (1.0 - x) ** 2.0 + 100.0 * (y - x * x) ** 2.0


def main(steps: int = 300) -> tuple[float, float]:
    """Train the same points eagerly and compiled; return both final mean values."""
    finals = []
    for compiled in (False, True):
        xy = torch.randn(1500, 2, generator=torch.Generator().manual_seed(42)).requires_grad_()
        opt = torch.optim.Adam([xy], lr=5e-2)

        def objective(xy):
            return rosenbrock(xy).mean()

        # fullgraph=True: any graph break would be an error, not a silent fallback. The
        # compiled graph holds the forward and (through AOTAutograd) the backward.
        f = torch.compile(objective, fullgraph=True) if compiled else objective
        for _ in range(steps):
            opt.zero_grad()
            loss = f(xy)
            loss.backward()
            opt.step()
        finals.append(loss.item())
        print(f"{'torch.compile' if compiled else 'eager':>13}: mean f after {steps} steps = {loss.item():.6f}")
    # The registered op passes PyTorch's own consistency checks (schema, fake, autograd).
    torch.library.opcheck(rosenbrock.torch_op, (torch.randn(8, 2, dtype=torch.float32, requires_grad=True),))
    print("torch.library.opcheck: ok")
    return finals[0], finals[1]


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    main(p.parse_args().steps)
