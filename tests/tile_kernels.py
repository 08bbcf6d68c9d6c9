"""Kernels for tile launches and block sizes (the tile kernels themselves come from Warp's own
tests and examples, imported where they are used)."""

from typing import Any

import warp as wp


@wp.kernel
def times_block_dim(x: wp.array(dtype=float), y: wp.array(dtype=float)):
    i = wp.tid()
    y[i] = x[i] * float(wp.block_dim())


@wp.kernel
def twice_any(x: wp.array(dtype=Any), y: wp.array(dtype=Any)):
    # a float32 literal: compiles for float32 arrays only
    i = wp.tid()
    y[i] = x[i] * 2.0


@wp.kernel
def plus_one(x: wp.array(dtype=float), y: wp.array(dtype=float)):
    i = wp.tid()
    y[i] = x[i] + 1.0


def grouped_gemm(a: wp.array3d(dtype=float), b: wp.array3d(dtype=float), c: wp.array3d(dtype=float)):
    """A launch function that launches Warp's own tile GEMM by blocks itself."""
    from warp.tests.tile.test_tile_matmul import tile_grouped_gemm

    wp.launch_tiled(tile_grouped_gemm, dim=a.shape[0], inputs=[a, b], outputs=[c], block_dim=16)
