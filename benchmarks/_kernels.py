"""Kernels for the benchmarks (Warp kernels need a source file)."""

import warp as wp


@wp.kernel
def mul(x: wp.array(dtype=float), y: wp.array(dtype=float), z: wp.array(dtype=float)):
    i = wp.tid()
    z[i] = x[i] * y[i]
