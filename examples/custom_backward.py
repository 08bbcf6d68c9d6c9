"""The PhysicsNeMo tutorial's radius aggregation on a wp.HashGrid, made right with a
hand-written backward.

Each query point q gets the features f_j of the reference points p_j within `radius`,
weighted by w_j = exp(-|q - p_j| / sigma) and normalised:

    out(q) = sum_j w_j f_j / (sum_j w_j + 1e-8)

The forward walks the hash grid's neighbours in a dynamic loop, carrying the two sums. Warp's
generated adjoint does not replay such loops, so its gradient is silently wrong (the tutorial's
feature gradient comes back all zero). warpbridge refuses it; this example:

1. shows the refusal,
2. attaches a backward written by hand (gradients for the features and both point sets),
3. checks it with ``warpbridge.testing.check_op`` and against the dense float64 formula,
4. trains the reference features to reproduce a target field.

Run: python examples/custom_backward.py [--steps N]
"""

import argparse

import numpy as np
import torch
import warp as wp

import warpbridge as wb

f64 = wp.float64
EPS = 1e-8


def build_grid(ref: wp.array, radius: float) -> wp.HashGrid:
    """A hash grid over the reference points (float32 positions, as wp.HashGrid takes)."""
    pts = wp.empty(ref.shape[0], dtype=wp.vec3, device=ref.device)
    wp.launch(to_vec3f, dim=ref.shape[0], inputs=[ref], outputs=[pts], device=ref.device)
    grid = wp.HashGrid(32, 32, 32, device=ref.device)
    grid.build(pts, radius)
    return grid


@wp.kernel
def to_vec3f(src: wp.array(dtype=wp.vec3d), dst: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    dst[i] = wp.vec3(wp.float32(src[i][0]), wp.float32(src[i][1]), wp.float32(src[i][2]))


@wp.func
def as_vec3f(p: wp.vec3d):
    return wp.vec3(wp.float32(p[0]), wp.float32(p[1]), wp.float32(p[2]))


@wp.kernel
def aggregate(
    query: wp.array(dtype=wp.vec3d),
    ref: wp.array(dtype=wp.vec3d),
    feats: wp.array2d(dtype=f64),
    grid: wp.uint64,
    radius: f64,
    sigma: f64,
    out: wp.array2d(dtype=f64),
):
    i = wp.tid()
    q = query[i]
    total = f64(0.0)
    for j in wp.hash_grid_query(grid, as_vec3f(q), wp.float32(radius) * wp.float32(1.0001)):
        d = wp.length(q - ref[j])
        if d <= radius:
            w = wp.exp(-d / sigma)
            total += w
            for k in range(feats.shape[1]):
                out[i, k] += w * feats[j, k]
    for k in range(feats.shape[1]):
        out[i, k] = out[i, k] / (total + f64(1.0e-8))


@wp.kernel
def aggregate_adjoint(
    query: wp.array(dtype=wp.vec3d),
    ref: wp.array(dtype=wp.vec3d),
    feats: wp.array2d(dtype=f64),
    grid: wp.uint64,
    radius: f64,
    sigma: f64,
    out: wp.array2d(dtype=f64),
    adj_out: wp.array2d(dtype=f64),
    adj_query: wp.array(dtype=wp.vec3d),
    adj_ref: wp.array(dtype=wp.vec3d),
    adj_feats: wp.array2d(dtype=f64),
):
    i = wp.tid()
    q = query[i]
    reach = wp.float32(radius) * wp.float32(1.0001)
    # pass 1: the normaliser, as the forward computed it
    total = f64(0.0)
    for j in wp.hash_grid_query(grid, as_vec3f(q), reach):
        d = wp.length(q - ref[j])
        if d <= radius:
            total += wp.exp(-d / sigma)
    inv = f64(1.0) / (total + f64(1.0e-8))
    # pass 2: out = sum_j w_j f_j * inv, so d out / d f_j = w_j inv and
    # d out_k / d w_j = (f_jk - out_k) inv; then w_j = exp(-d_j / sigma)
    g_q = wp.vec3d()
    for j in wp.hash_grid_query(grid, as_vec3f(q), reach):
        delta = q - ref[j]
        d = wp.length(delta)
        if d <= radius:
            w = wp.exp(-d / sigma)
            adj_w = f64(0.0)
            for k in range(feats.shape[1]):
                wp.atomic_add(adj_feats, j, k, w * inv * adj_out[i, k])
                adj_w += (feats[j, k] - out[i, k]) * inv * adj_out[i, k]
            if d > f64(0.0):
                g = adj_w * (-w / sigma) / d * delta  # d d_j / d q = delta / d_j
                g_q += g
                wp.atomic_sub(adj_ref, j, g)
    adj_query[i] = g_q


def radius_aggregate(
    query: wp.array(dtype=wp.vec3d),
    ref: wp.array(dtype=wp.vec3d),
    feats: wp.array2d(dtype=wp.float64),
    radius: float,
    sigma: float,
    out: wp.array2d(dtype=wp.float64),
):
    grid = build_grid(ref, radius)
    wp.launch(aggregate, dim=query.shape[0], inputs=[query, ref, feats, grid.id, radius, sigma], outputs=[out])


def radius_aggregate_adjoint(
    query: wp.array(dtype=wp.vec3d),
    ref: wp.array(dtype=wp.vec3d),
    feats: wp.array2d(dtype=wp.float64),
    radius: float,
    sigma: float,
    out: wp.array2d(dtype=wp.float64),
    adj_out: wp.array2d(dtype=wp.float64),
    adj_query: wp.array(dtype=wp.vec3d),
    adj_ref: wp.array(dtype=wp.vec3d),
    adj_feats: wp.array2d(dtype=wp.float64),
):
    grid = build_grid(ref, radius)
    wp.launch(
        aggregate_adjoint,
        dim=query.shape[0],
        inputs=[query, ref, feats, grid.id, radius, sigma, out, adj_out],
        outputs=[adj_query, adj_ref, adj_feats],
    )


def dense(query, ref, feats, radius, sigma):
    """The same aggregation in plain PyTorch, (M, N) at a time: the float64 reference."""
    d = torch.cdist(query, ref)
    w = torch.where(d <= radius, torch.exp(-d / sigma), torch.zeros_like(d))
    return (w @ feats) / (w.sum(1, keepdim=True) + EPS)


def main(steps: int = 200, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    query = torch.rand(400, 3, generator=gen, dtype=torch.float64)
    ref = torch.rand(1000, 3, generator=gen, dtype=torch.float64)
    feats = torch.randn(1000, 4, generator=gen, dtype=torch.float64)
    radius, sigma = 0.15, 0.1

    # 1. Warp's own adjoint: refused, with the loop, the variable and the fixes
    naive = wb.op(radius_aggregate)
    dims = (query.shape[0], feats.shape[1])  # the output's shape: (queries, features)
    refusal = None
    try:
        naive(query, ref, feats.requires_grad_(), radius, sigma, output_dims=dims).sum().backward()
    except wb.WarpBridgeError as e:
        refusal = str(e)
        print("without a backward:", refusal.splitlines()[0])
        print("  ", refusal.splitlines()[1].strip())

    # 2. the same forward with the hand-written backward
    op = wb.op(radius_aggregate, backward=radius_aggregate_adjoint)

    # 3. checked: finite differences, reentrancy, nothing written, opcheck (on a small cloud)
    small = [t[:n].detach() for t, n in ((query, 12), (ref, 40), (feats, 40))]
    small[0] = small[0] * 0.5 + 0.25
    small[1] = small[1] * 0.5 + 0.25
    wb.testing.check_op(op, *small, 0.3, 0.1, output_dims=(12, 4))
    q, r, f = (t.detach().clone().requires_grad_() for t in (query, ref, feats))
    out = op(q, r, f, radius, sigma, output_dims=dims)
    v = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad(out, (q, r, f), v)
    q2, r2, f2 = (t.detach().clone().requires_grad_() for t in (query, ref, feats))
    expected = dense(q2, r2, f2, radius, sigma)
    ref_grads = torch.autograd.grad(expected, (q2, r2, f2), v)
    value_err = float((out - expected).detach().abs().max())
    grad_err = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(grads, ref_grads))
    print(f"check_op: ok; vs dense float64: value {value_err:.2e}, gradients (relative) {grad_err:.2e}")

    # 4. train the reference features so the aggregated field matches a target field
    target = torch.sin(3 * query).sum(1, keepdim=True).repeat(1, 4)
    learned = torch.zeros_like(feats, requires_grad=True)
    opt = torch.optim.Adam([learned], lr=0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = ((op(query, ref, learned, radius, sigma, output_dims=dims) - target) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print(f"training: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {steps} steps")
    return {"refusal": refusal, "value_err": value_err, "grad_err": grad_err, "losses": np.array(losses)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    main(parser.parse_args().steps)
