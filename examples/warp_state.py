"""Warp code as Warp's own examples write it, trained from PyTorch.

Aim 64 projectiles at their targets: find each launch velocity so that, after 60 steps under
gravity and quadratic drag, the projectile lands on its target.

* ``integrate`` updates the state in place, as Warp's examples do (``x[i] = x[i] + ...``).
  ``wb.op(integrate, in_out=("x", "v"))`` runs it on fresh copies and returns the new state,
  so a rollout is a Python loop of ops and PyTorch differentiates through all of it. The
  caller's tensors are never written.
* ``miss`` is a launch function with a scratch array made by plain ``wp.zeros``, no
  ``requires_grad``: warpbridge's tape gives it a gradient anyway.
* ``apex`` writes its output into its *first* parameter, as many Warp kernels do:
  ``wb.op(apex, outputs=("height",))`` says so.

Run: python examples/warp_state.py
"""

from __future__ import annotations

import torch
import warp as wp

import warpbridge as wb

DT = 1.0 / 30.0
STEPS = 60


@wp.kernel
def integrate(x: wp.array(dtype=wp.vec3), v: wp.array(dtype=wp.vec3), dt: float):
    i = wp.tid()
    # each element of x and v is read before it is stored: in_out's gradient is right
    v_new = v[i] + (wp.vec3(0.0, -9.81, 0.0) - 0.05 * v[i] * wp.length(v[i])) * dt
    x[i] = x[i] + v_new * dt
    v[i] = v_new


@wp.kernel
def offset(x: wp.array(dtype=wp.vec3), target: wp.array(dtype=wp.vec3), d: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    d[i] = x[i] - target[i]


@wp.kernel
def squared_norm(d: wp.array(dtype=wp.vec3), out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = wp.dot(d[i], d[i])


@wp.kernel
def apex(height: wp.array(dtype=float), x: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    wp.atomic_max(height, i, x[i][1])


def miss(x: wp.array(dtype=wp.vec3), target: wp.array(dtype=wp.vec3), out: wp.array(dtype=float)):
    d = wp.zeros(x.shape[0], dtype=wp.vec3, device=x.device)  # no requires_grad needed
    wp.launch(offset, dim=x.shape[0], inputs=[x, target, d])
    wp.launch(squared_norm, dim=x.shape[0], inputs=[d, out])


step = wb.op(integrate, in_out=("x", "v"))
distance = wb.op(miss)
highest = wb.op(apex, outputs=("height",))


def main(iters: int = 150, n: int = 64, seed: int = 0) -> float:
    g = torch.Generator().manual_seed(seed)
    start = torch.zeros(n, 3)
    target = torch.stack([5 + 10 * torch.rand(n, generator=g), torch.zeros(n), 4 * torch.rand(n, generator=g) - 2], 1)
    v0 = torch.tensor([5.0, 10.0, 0.0]).repeat(n, 1).requires_grad_()
    opt = torch.optim.Adam([v0], lr=0.2)
    for it in range(iters):
        opt.zero_grad()
        x, v = start, v0
        for _ in range(STEPS):
            x, v = step(x, v, DT)
        loss = distance(x, target).mean()
        loss.backward()
        opt.step()
        if it % 50 == 0 or it == iters - 1:
            print(f"iteration {it:3d}: mean squared miss {loss.item():.4f} m^2")
    assert torch.count_nonzero(start) == 0  # the caller's state was never written
    with torch.no_grad():  # the highest point of each trajectory, through the outputs= op
        x, v, top = start, v0, torch.zeros(n)
        for _ in range(STEPS):
            x, v = step(x, v, DT)
            top = torch.maximum(top, highest(x))
    print(f"apex heights: {top.min():.2f} to {top.max():.2f} m")
    return loss.item()


if __name__ == "__main__":
    main()
