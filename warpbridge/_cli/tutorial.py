"""The PhysicsNeMo tutorial's radius-aggregation kernel, as its users call it from PyTorch:
a ``wp.HashGrid`` built per call and an ``autograd.Function`` whose backward replays Warp's
generated adjoint with a ``wp.Tape``. ``warpbridge demo`` trains it next to the other
backends to show what that recipe gets wrong; the benchmarks time its forward.
(Warp kernels need a source file.)"""

import torch
import warp as wp

from .._core.warp_runtime import ensure_init


@wp.kernel
def tutorial_radius_aggregate(
    query: wp.array(dtype=wp.vec3),
    ref: wp.array(dtype=wp.vec3),
    feats: wp.array2d(dtype=float),
    grid: wp.uint64,
    radius: float,
    sigma: float,
    out: wp.array2d(dtype=float),
):
    """The PhysicsNeMo tutorial's aggregation, re-typed: a HashGrid query loop that
    accumulates exp(-d / sigma)-weighted features into the output row, then normalises.

    Its Warp adjoint is wrong: the neighbour loop is dynamic, so the adjoint never replays
    it (tests/test_points.py shows the zero feature gradient)."""
    i = wp.tid()
    q = query[i]
    row = out[i]  # a view of the output row, accumulated in place as the tutorial does
    total = float(0.0)
    for j in wp.hash_grid_query(grid, q, radius):
        d = wp.length(q - ref[j])
        if d <= radius:
            w = wp.exp(-d / sigma)
            total += w
            for c in range(feats.shape[1]):
                row[c] += w * feats[j, c]
    if total > 0.0:
        for c in range(feats.shape[1]):
            row[c] /= total + 1e-8


def _grid(r: wp.array, radius: float, device: str) -> wp.HashGrid:
    n = int(2.0 / radius) + 1  # the tutorial sizes the grid from the [-1, 1] query box
    grid = wp.HashGrid(n, n, n, device=device)
    grid.build(r, radius)
    return grid


def forward(q: torch.Tensor, r: torch.Tensor, f: torch.Tensor, radius: float, sigma: float) -> torch.Tensor:
    """The tutorial kernel's forward alone (no autograd)."""
    ensure_init()
    dev = str(q.device)
    wr = wp.from_torch(r.detach().contiguous(), dtype=wp.vec3, requires_grad=False)
    grid = _grid(wr, radius, dev)
    out = torch.zeros(q.shape[0], f.shape[1], device=q.device, dtype=q.dtype)
    wq = wp.from_torch(q.detach().contiguous(), dtype=wp.vec3, requires_grad=False)
    wf = wp.from_torch(f.detach().contiguous(), requires_grad=False)
    wp.launch(
        tutorial_radius_aggregate,
        dim=q.shape[0],
        inputs=[wq, wr, wf, grid.id, radius, sigma],
        outputs=[wp.from_torch(out, requires_grad=False)],
        device=dev,
    )
    return out


class TapeFunction(torch.autograd.Function):
    """The recipe as written by hand: forward under a ``wp.Tape``, backward by the tape."""

    @staticmethod
    def forward(ctx, q, r, f, radius, sigma):
        ensure_init()
        dev = str(q.device)
        # private copies: the tape's adjoint writes gradients into .grad of what it is given
        wq, wr = (wp.from_torch(t.detach().clone(), dtype=wp.vec3, requires_grad=True) for t in (q, r))
        wf = wp.from_torch(f.detach().clone(), requires_grad=True)
        ctx.arrays = (wq, wr, wf)
        ctx.grid = _grid(wr, radius, dev)
        ctx.out = wp.zeros((q.shape[0], f.shape[1]), dtype=float, device=dev, requires_grad=True)
        ctx.tape = wp.Tape()
        with ctx.tape:
            wp.launch(
                tutorial_radius_aggregate,
                dim=q.shape[0],
                inputs=[wq, wr, wf, ctx.grid.id, radius, sigma],
                outputs=[ctx.out],
                device=dev,
            )
        return wp.to_torch(ctx.out).clone()

    @staticmethod
    def backward(ctx, g):
        ctx.out.grad = wp.from_torch(g.contiguous())
        ctx.tape.backward()
        dq, dr, df = (wp.to_torch(a.grad).clone() for a in ctx.arrays)
        ctx.tape.zero()
        return dq.reshape(-1, 3), dr.reshape(-1, 3), df, None, None
