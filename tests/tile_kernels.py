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
