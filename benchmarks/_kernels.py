"""Kernels for the benchmarks (Warp kernels need a source file)."""

import warp as wp

from warpbridge._cli.tutorial import tutorial_radius_aggregate  # noqa: F401 - re-exported for the scripts


@wp.kernel
def mul(x: wp.array(dtype=float), y: wp.array(dtype=float), z: wp.array(dtype=float)):
    i = wp.tid()
    z[i] = x[i] * y[i]


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
