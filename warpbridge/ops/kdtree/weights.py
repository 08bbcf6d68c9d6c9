"""The weights of the kNN aggregations (``knn_aggregate``'s softmax, ``knn_interpolate``'s
inverse squares), over plain rows of features: the same code for the kd-tree's searches and
the brute force's (``brute``), whatever the points' dimension.
"""

from __future__ import annotations

import warp as wp

from . import template
from .dtypes import T
from .template import func, native

# aggregate_row: out_i = sum_n p_n f_idx[i, n] over the found rows, p the normalised
# weights: softmax(-dist_i / sigma), the exponents shifted by the nearest distance, or with
# inverse_square PyG's knn_interpolate weights 1 / max(d^2, 1e-16), as ratios to the
# nearest's (at most 1: no overflow); a row of zeros without neighbours. Native code: the
# weighted rows add straight into the output row, which the compiler vectorises when the rows
# are packed. Written in Warp (weights in a local vector, the row in groups of 4), the
# aggregation took ~1.8 of the tutorial's 19 ms knn_aggregate call (27 000 queries, F = 16,
# two threads); native, ~1.0 ms.
_AGGREGATE_SNIPPET = native("knn_aggregate.h")


@template.func_native(_AGGREGATE_SNIPPET)
def aggregate_row(
    features: wp.array2d(dtype=T),
    dist: wp.array2d(dtype=T),
    idx: wp.array2d(dtype=wp.int64),
    sigma: T,
    inverse_square: wp.int32,
    i: int,
    out: wp.array2d(dtype=T),
): ...


@func
def weight(d: T, nearest: T, sigma: T, inverse_square: wp.int32) -> T:
    # A found point's weight before normalisation, as aggregate_row computes it.
    w = T(0.0)
    if inverse_square != 0:
        ratio = wp.max(nearest, T(1.0e-8)) / wp.max(d, T(1.0e-8))
        w = ratio * ratio
    else:
        w = wp.exp((nearest - d) / sigma)
    return w


@func
def times_slope(x: T, d: T, sigma: T, inverse_square: wp.int32) -> T:
    # x times -d(log weight)/dd: x / sigma for the softmax (a division: 1 / sigma overflows
    # for subnormal sigmas); 2 x / d for the inverse square, 0 where the 1e-16 floor holds
    # the weight constant.
    s = x / sigma
    if inverse_square != 0:
        s = T(0.0)
        if d > T(1.0e-8):
            s = T(2.0) * x / d
    return s
