"""The CPU build's median splits: a quickselect per node, its partitions in native code.

A subtree that fits in a thread's row of scratch (``tree_subtrees``) is split in records of
point and index (``Item``, ``items``: position t at t - base), elsewhere in the tree's own
arrays (``pts``, ``order``); ``packed`` says which.
"""

from __future__ import annotations

import warp as wp

from . import template
from .dtypes import DIM, SAMPLE, Item, Sample, SampleAt, T, V
from .geometry import part
from .template import func, native


@func
def point_at(pts: wp.array(dtype=V), items: wp.array(dtype=Item), base: int, packed: bool, t: int) -> V:
    if packed:
        return items[t - base].p
    return pts[t]


@func
def index_at(order: wp.array(dtype=wp.int32), items: wp.array(dtype=Item), base: int, packed: bool, t: int) -> int:
    if packed:
        return items[t - base].i
    return order[t]


@func
def split_axis(pts: wp.array(dtype=V), items: wp.array(dtype=Item), base: int, packed: bool, s: int, e: int) -> int:
    # The widest spread of (a sample of) the points [s, e). The exact boxes are merged
    # bottom-up once the points are in place.
    b0 = V(T(wp.inf))
    b1 = V(T(-wp.inf))
    step = wp.max(1, (e - s) // SAMPLE)
    for t in range(s, e, step):
        p = point_at(pts, items, base, packed, t)
        b0 = wp.min(b0, p)
        b1 = wp.max(b1, p)
    ext = b1 - b0
    axis = int(0)
    for a in range(1, DIM):
        if ext[a] > ext[axis]:
            axis = a
    return axis


# partition_points: Lomuto's partition of [left, right] around the point at `pick`, keys
# compared as (coordinate, original index); returns the pivot's place. Written without
# branches (every element swapped, the boundary moved by the comparison): ~2x faster here
# than Hoare's, whose branches mispredict. Native code, like partition_items below, so
# that each key is loaded from memory at the axis's byte offset: Warp indexes a point by a
# runtime axis through a copy on the stack, and a load that waits on that store. The CPU
# builds went 1.15-1.3x faster with both partitions so (10^4 to 10^7 points, one and two
# threads; 10^5 Gaussian points on one thread 7.7 -> 6.4 ms).
_PARTITION_POINTS_SNIPPET = native("partition_partition_points.h")


@template.func_native(_PARTITION_POINTS_SNIPPET)
def partition_points(
    pts: wp.array(dtype=V), order: wp.array(dtype=wp.int32), left: int, right: int, pick: int, axis: int
) -> int: ...


# partition_items: partition_points on records, natively. Each of the partition's moves
# is then one 16-byte copy, where a point and its index take three stores; a CPU build on
# one thread measured 0.77 -> 0.53 ms at 10^4 points and 11.1 -> 7.8 ms at 10^5 (the
# same partition written in Warp on the records gained ~1.2x, not ~1.45x). The key is
# loaded at the axis's offset, not taken from the record's copy (see partition_points).
_PARTITION_SNIPPET = native("partition_split.h")


@template.func_native(_PARTITION_SNIPPET)
def partition_items(items: wp.array(dtype=Item), left: int, right: int, pick: int, axis: int) -> int: ...


@func
def split_node(
    pts: wp.array(dtype=V),
    order: wp.array(dtype=wp.int32),
    items: wp.array(dtype=Item),
    base: int,
    packed: bool,
    first: int,
    n: int,
    parts: int,
    i: int,
):
    # Node i of a level with `parts` nodes over the n points from place `first` on: put
    # its point of rank m along its widest axis at the children's boundary.
    s = first + part(i, n, parts)
    e = first + part(i + 1, n, parts)
    m = first + part(2 * i + 1, n, 2 * parts)
    axis = split_axis(pts, items, base, packed, s, e)
    if m < e:
        # Quickselect of position m along the axis, keys compared as (coordinate, original
        # index): all distinct, so duplicated points cannot unbalance a step.
        left = s
        right = e - 1
        while left < right:
            span = right - left
            pick = left + span // 2
            if span > 4 * SAMPLE:
                # The pivot is the sample element at the target's relative rank, so the
                # target's side shrinks fast (Floyd and Rivest's idea, one pivot).
                keys = Sample()
                at = SampleAt()
                for si in range(SAMPLE):
                    # One place drawn (by a hash of the range) from each of SAMPLE equal
                    # strata (by places within the cloud, so a forest's trees are those of
                    # their clouds alone): evenly spaced places made a point repeated 50 times in a row
                    # (np.repeat) build 25% slower than the same points shuffled.
                    h = int(wp.rand_init(left - first, si) % wp.uint32(span + 1))
                    t = left + part(si, span + 1, SAMPLE) + h // SAMPLE
                    v = point_at(pts, items, base, packed, t)[axis]
                    vi = index_at(order, items, base, packed, t)
                    sj = si
                    # sorted as the partition compares: (coordinate, original index)
                    while sj > 0 and (
                        keys[sj - 1] > v
                        or (keys[sj - 1] == v and index_at(order, items, base, packed, at[sj - 1]) > vi)
                    ):
                        keys[sj] = keys[sj - 1]
                        at[sj] = at[sj - 1]
                        sj -= 1
                    keys[sj] = v
                    at[sj] = t
                pick = at[((m - left) * (SAMPLE - 1) + span // 2) // span]
            store = int(0)
            if packed:
                store = partition_items(items, left - base, right - base, pick - base, axis) + base
            else:
                store = partition_points(pts, order, left, right, pick, axis)
            if m < store:
                right = store - 1
            elif m > store:
                left = store + 1
            else:
                break
