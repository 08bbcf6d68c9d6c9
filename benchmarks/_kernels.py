"""Kernels for the benchmarks (Warp kernels need a source file)."""

import warp as wp


@wp.kernel
def mul(x: wp.array(dtype=float), y: wp.array(dtype=float), z: wp.array(dtype=float)):
    i = wp.tid()
    z[i] = x[i] * y[i]


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


@wp.kernel
def gather_rows(table: wp.array2d(dtype=float), idx: wp.array(dtype=wp.int32), out: wp.array2d(dtype=float)):
    i, j = wp.tid()
    out[i, j] = table[idx[i], j]


@wp.kernel
def scale_rows(x: wp.array2d(dtype=float), w: wp.array(dtype=float), h: wp.array2d(dtype=float)):
    i, j = wp.tid()
    h[i, j] = x[i, j] * w[j]


@wp.kernel
def softplus(h: wp.array2d(dtype=float), y: wp.array2d(dtype=float)):
    i, j = wp.tid()
    y[i, j] = wp.log(1.0 + wp.exp(h[i, j]))


def scaled_softplus(x: wp.array2d(dtype=float), w: wp.array(dtype=float), y: wp.array2d(dtype=float)):
    """A launch function with a scratch intermediate: Warp allocates it (and, in the
    backward, its gradient) itself."""
    h = wp.empty(x.shape, dtype=float, device=x.device, requires_grad=True)
    wp.launch(scale_rows, dim=x.shape, inputs=[x, w], outputs=[h])
    wp.launch(softplus, dim=x.shape, inputs=[h], outputs=[y])
