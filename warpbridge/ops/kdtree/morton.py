"""The queries' Morton order: each search then walks the nodes, points and feature rows the
previous one walked, still in cache. Queries in a random order measured 1.1-1.3x faster for
kNN and 1.15-1.75x for the radius forward at 10^6 points. The cells split the reference
points' box, trimmed of its extremes (query_box), MORTON_CELLS ways per axis; a query outside
takes the nearest cell. The box stays on the device, so CUDA needs no synchronisation.
"""

from __future__ import annotations

import warp as wp

from .dtypes import DIM, T, V
from .geometry import finite
from .template import func, kernel

# 5 bits per axis measured as fast as 8 or 10 at 10^5-10^6 points, with a 2-pass sort
# instead of 3-4.
MORTON_BITS = 5
MORTON_CELLS = 1 << MORTON_BITS
MORTON_LAST = (1 << (3 * MORTON_BITS)) - 1  # the largest code, for queries that are not finite
MORTON_SAMPLE = 64  # reference points sampled for the box the cells split (query_box)


@func
def spread_bits(x: int) -> int:
    # The low 10 bits of x, each followed by two zero bits: one axis of a Morton code.
    y = (x | (x << 16)) & 0x030000FF
    y = (y | (y << 8)) & 0x0300F00F
    y = (y | (y << 4)) & 0x030C30C3
    return (y | (y << 2)) & 0x09249249


@func
def cell(x: T, lo: T, hi: T) -> int:
    # x's cell of MORTON_CELLS across [lo, hi], clamped; 0 for an empty, flat or infinite box.
    ext = hi - lo
    c = int(0)
    if ext > T(0.0) and ext < T(wp.inf):
        c = int(wp.clamp((x - lo) / ext * T(float(MORTON_CELLS)), T(0.0), T(float(MORTON_CELLS - 1))))
    return c


@kernel
def query_box(
    pts: wp.array(dtype=V),
    lo: wp.array(dtype=V),
    hi: wp.array(dtype=V),
    stride: int,
    offset: int,
    box: wp.array(dtype=V),
):
    # The box the query cells split (one thread): the reference points' box without its
    # extremes, so that one far point does not put every query in one cell. From
    # MORTON_SAMPLE of the tree's points (`pts`, in the tree's order: one from each
    # 1/MORTON_SAMPLE of the tree), per axis the third smallest and third largest; the
    # root box (lo[1], hi[1]) when fewer than MORTON_SAMPLE / 4 of them are finite.
    n = pts.shape[0]
    l1 = V(T(wp.inf))  # the three smallest per axis, l1 <= l2 <= l3
    l2 = l1
    l3 = l1
    h1 = V(T(-wp.inf))  # and the three largest, h1 >= h2 >= h3
    h2 = h1
    h3 = h1
    count = int(0)
    for j in range(MORTON_SAMPLE):
        p = pts[int((wp.int64(2 * j + 1) * wp.int64(n)) // wp.int64(2 * MORTON_SAMPLE))]
        if finite(p):
            count += 1
            l3 = wp.min(l3, wp.max(l2, p))
            l2 = wp.min(l2, wp.max(l1, p))
            l1 = wp.min(l1, p)
            h3 = wp.max(h3, wp.min(h2, p))
            h2 = wp.max(h2, wp.min(h1, p))
            h1 = wp.max(h1, p)
    if count >= MORTON_SAMPLE // 4:
        box[0] = l3
        box[1] = h3
    else:
        box[0] = lo[1]
        box[1] = hi[1]


@kernel
def query_keys(
    query: wp.array(dtype=V),
    box: wp.array(dtype=V),
    stride: int,
    offset: int,
    keys: wp.array(dtype=wp.int32),
    places: wp.array(dtype=wp.int32),
):
    i = wp.tid() * stride + offset
    q = query[i]
    key = int(MORTON_LAST)  # a query that is not finite goes last
    if finite(q):
        a = box[0]
        b = box[1]
        # the first three coordinates (fewer: their bits, the others' left 0)
        key = spread_bits(cell(q[0], a[0], b[0]))
        for axis in range(1, wp.static(min(DIM, 3))):
            key = key | (spread_bits(cell(q[axis], a[axis], b[axis])) << axis)
    keys[i] = key
    places[i] = i
