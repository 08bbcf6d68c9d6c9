"""Levels of kd-trees split by sorting, for CUDA: every tree of a forest at once (a single
tree is a forest of one cloud), as ``_tree._split_by_sort`` launches them."""

from __future__ import annotations

import warp as wp

from .dtypes import Item, T, V
from .geometry import part
from .partition import split_axis
from .template import func, kernel

# A level split by sorting, for CUDA (a quickselect per node leaves the top levels to a
# few GPU threads): every point's key is its coordinate along its node's split axis; a
# stable sort by key, then a stable sort by node, puts each node's points in order within
# its own range, so the median sits at the children's boundary. Ties split in any order:
# the search needs exact boxes (merged bottom-up), not a particular tie order.


@func
def node_of(p: int, n: int, parts: int) -> int:
    # The node i of a level with `parts` nodes whose points [part(i), part(i + 1)) hold
    # position p: i = ceil((p + 1) parts / n) - 1.
    return int((wp.int64(p + 1) * wp.int64(parts) + wp.int64(n - 1)) // wp.int64(n)) - 1


@func
def cloud_holding(clouds: wp.array(dtype=wp.vec4i), p: int) -> int:
    # The cloud of a forest whose places hold p: the last one that starts at or before it
    # (an empty cloud starts where the next begins, so it is never the last).
    lo, hi = int(0), clouds.shape[0] - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if clouds[mid][0] <= p:
            lo = mid
        else:
            hi = mid - 1
    return lo


@func
def forest_node(clouds: wp.array(dtype=wp.vec4i), p: int, parts: int) -> int:
    # Position p's node at the level of `parts` nodes per tree, numbered across the forest
    # (cloud c's nodes from c * parts on); a tree already split to its leaves is one node.
    c = cloud_holding(clouds, p)
    cl = clouds[c]
    j = int(0)
    if parts < (1 << cl[3]):
        j = node_of(p - cl[0], cl[1], parts)
    return c * parts + j


@kernel
def forest_axes(
    pts: wp.array(dtype=V),
    items: wp.array(dtype=Item),
    clouds: wp.array(dtype=wp.vec4i),
    parts: int,
    axes: wp.array(dtype=wp.int32),
):
    # Each node's split axis: thread c * parts + j takes node j of cloud c.
    t = wp.tid()
    cl = clouds[t // parts]
    j = t % parts
    axes[t] = 0
    if parts < (1 << cl[3]):
        axes[t] = split_axis(pts, items, 0, False, cl[0] + part(j, cl[1], parts), cl[0] + part(j + 1, cl[1], parts))


@kernel
def forest_keys(
    pts: wp.array(dtype=V),
    clouds: wp.array(dtype=wp.vec4i),
    parts: int,
    axes: wp.array(dtype=wp.int32),
    keys: wp.array(dtype=T),
    places: wp.array(dtype=wp.int32),
):
    # Each point's key: its coordinate along its node's split axis; 0 in a tree already split
    # to its leaves (its points stay in place).
    p = wp.tid()
    c = cloud_holding(clouds, p)
    keys[p] = T(0.0)
    if parts < (1 << clouds[c][3]):
        keys[p] = pts[p][axes[forest_node(clouds, p, parts)]]
    places[p] = p


@kernel
def forest_node_keys(
    places: wp.array(dtype=wp.int32),
    clouds: wp.array(dtype=wp.vec4i),
    parts: int,
    nodes: wp.array(dtype=wp.int32),
    out: wp.array(dtype=wp.int32),
):
    j = wp.tid()
    nodes[j] = forest_node(clouds, places[j], parts)
    out[j] = places[j]


@kernel
def tree_gather(
    pts: wp.array(dtype=V),
    order: wp.array(dtype=wp.int32),
    places: wp.array(dtype=wp.int32),
    pts_out: wp.array(dtype=V),
    order_out: wp.array(dtype=wp.int32),
):
    j = wp.tid()
    pts_out[j] = pts[places[j]]
    order_out[j] = order[places[j]]
