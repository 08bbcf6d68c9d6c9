"""Warp functions and kernels for :mod:`ties`: counting the calls that tie for an
``atomic_max``/``atomic_min`` result, and sharing that result's gradient between them."""

from typing import Any

import warp as wp


@wp.func
def count_tie_1(counts: wp.array(dtype=wp.int32), y: wp.array(dtype=Any), i: int, value: Any):
    if value == y[i]:
        wp.atomic_add(counts, i, 1)
    return y[i]


@wp.func
def count_tie_2(counts: wp.array2d(dtype=wp.int32), y: wp.array2d(dtype=Any), i: int, j: int, value: Any):
    if value == y[i, j]:
        wp.atomic_add(counts, i, j, 1)
    return y[i, j]


@wp.func
def count_tie_3(counts: wp.array3d(dtype=wp.int32), y: wp.array3d(dtype=Any), i: int, j: int, k: int, value: Any):
    if value == y[i, j, k]:
        wp.atomic_add(counts, i, j, k, 1)
    return y[i, j, k]


@wp.func
def count_tie_4(
    counts: wp.array4d(dtype=wp.int32), y: wp.array4d(dtype=Any), i: int, j: int, k: int, m: int, value: Any
):
    if value == y[i, j, k, m]:
        wp.atomic_add(counts, i, j, k, m, 1)
    return y[i, j, k, m]


@wp.kernel
def share_between_ties(grad: wp.array(dtype=Any), counts: wp.array(dtype=wp.int32)):
    i = wp.tid()
    if counts[i] > 1:
        grad[i] = grad[i] / grad.dtype(counts[i])


for _t in (wp.float16, wp.float32, wp.float64):
    wp.overload(share_between_ties, {"grad": wp.array(dtype=_t), "counts": wp.array(dtype=wp.int32)})
