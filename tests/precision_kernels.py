"""Kernels in 16-bit and 32-bit floats (mixed-precision tests)."""

import warp as wp


@wp.kernel
def scaled_square_bf16(x: wp.array(dtype=wp.bfloat16), s: wp.bfloat16, y: wp.array(dtype=wp.bfloat16)):
    i = wp.tid()
    y[i] = s * x[i] * x[i]


@wp.kernel
def scaled_square_f16(x: wp.array(dtype=wp.float16), s: wp.float16, y: wp.array(dtype=wp.float16)):
    i = wp.tid()
    y[i] = s * x[i] * x[i]


@wp.kernel
def affine32(x: wp.array2d(dtype=float), idx: wp.array(dtype=wp.int32), y: wp.array2d(dtype=float)):
    i, j = wp.tid()
    y[i, j] = 2.0 * x[i, j] + float(idx[i])
