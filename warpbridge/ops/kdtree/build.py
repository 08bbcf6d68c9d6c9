"""The kd-tree's build kernels: the points' copy, the splits level by level, one subtree per
thread, the boxes bottom-up; and, for CUDA, a level split by sorting."""

from __future__ import annotations

import warp as wp

from .dtypes import Item, T, V
from .geometry import finite, part
from .partition import split_node
from .template import func, kernel


@func
def node_box(
    pts: wp.array(dtype=V),
    order: wp.array(dtype=wp.int32),
    s: int,
    e: int,
    node: int,
    lo: wp.array(dtype=V),
    hi: wp.array(dtype=V),
    min_index: wp.array(dtype=wp.int32),
):
    # The exact box and smallest original index of points [s, e).
    b0 = V(T(wp.inf))
    b1 = V(T(-wp.inf))
    first = int(2147483647)
    for t in range(s, e):
        b0 = wp.min(b0, pts[t])
        b1 = wp.max(b1, pts[t])
        first = wp.min(first, order[t])
    lo[node] = b0
    hi[node] = b1
    min_index[node] = first


# The CPU build splits a subtree that fits in a thread's row of scratch (tree_subtrees) in


@func
def pack(
    pts: wp.array(dtype=V), order: wp.array(dtype=wp.int32), items: wp.array(dtype=Item), base: int, s: int, e: int
):
    for t in range(s, e):
        r = Item()
        r.p = pts[t]
        r.i = order[t]
        items[t - base] = r


@func
def unpack(
    items: wp.array(dtype=Item), base: int, s: int, e: int, pts: wp.array(dtype=V), order: wp.array(dtype=wp.int32)
):
    for t in range(s, e):
        r = items[t - base]
        pts[t] = r.p
        order[t] = r.i


@func
def merge_up(base: int, node: int, lo: wp.array(dtype=V), hi: wp.array(dtype=V), min_index: wp.array(dtype=wp.int32)):
    # Node `node` of the tree whose nodes start at `base`, from its children.
    a = base + 2 * node
    lo[base + node] = wp.min(lo[a], lo[a + 1])
    hi[base + node] = wp.max(hi[a], hi[a + 1])
    min_index[base + node] = wp.min(min_index[a], min_index[a + 1])


@kernel
def tree_up(
    parts: int,
    stride: int,
    offset: int,
    lo: wp.array(dtype=V),
    hi: wp.array(dtype=V),
    min_index: wp.array(dtype=wp.int32),
):
    merge_up(0, parts + wp.tid() * stride + offset, lo, hi, min_index)


@kernel
def tree_top(
    nodes: int,
    stride: int,
    offset: int,
    lo: wp.array(dtype=V),
    hi: wp.array(dtype=V),
    min_index: wp.array(dtype=wp.int32),
):
    # One thread: nodes 1 .. nodes - 1 from their children, the deepest first (the nodes
    # below, from `nodes` on, done): the top levels in one launch instead of one a level.
    for t in range(1, nodes):
        merge_up(0, nodes - t, lo, hi, min_index)


@kernel
def tree_init(
    points: wp.array(dtype=V), stride: int, offset: int, pts: wp.array(dtype=V), order: wp.array(dtype=wp.int32)
):
    init_point(points, wp.tid() * stride + offset, pts, order)


@func
def init_point(points: wp.array(dtype=V), i: int, pts: wp.array(dtype=V), order: wp.array(dtype=wp.int32)):
    # The points to be permuted; a non-finite one becomes (+inf, +inf, +inf).
    p = points[i]
    if not finite(p):
        p = V(T(wp.inf))
    pts[i] = p
    order[i] = i


@kernel
def tree_regather(
    points: wp.array(dtype=V), order: wp.array(dtype=wp.int32), stride: int, offset: int, pts: wp.array(dtype=V)
):
    # The tree's points again, in the order a build left (tree_init's mapping of non-finite ones).
    t = wp.tid() * stride + offset
    p = points[order[t]]
    if not finite(p):
        p = V(T(wp.inf))
    pts[t] = p


@kernel
def tree_leaf_boxes(
    pts: wp.array(dtype=V),
    order: wp.array(dtype=wp.int32),
    stride: int,
    offset: int,
    lo: wp.array(dtype=V),
    hi: wp.array(dtype=V),
    min_index: wp.array(dtype=wp.int32),
):
    # Each leaf's box and smallest index, as tree_subtrees takes them.
    leaf = wp.tid() * stride + offset
    n, leaves = pts.shape[0], lo.shape[0] // 2
    node_box(pts, order, part(leaf, n, leaves), part(leaf + 1, n, leaves), leaves + leaf, lo, hi, min_index)


@kernel
def tree_split(
    pts: wp.array(dtype=V),
    order: wp.array(dtype=wp.int32),
    items: wp.array(dtype=Item),
    parts: int,
    stride: int,
    offset: int,
):
    split_node(pts, order, items, 0, False, 0, pts.shape[0], parts, wp.tid() * stride + offset)


@func
def cloud_boxes(
    pts: wp.array(dtype=V),
    order: wp.array(dtype=wp.int32),
    c: wp.vec4i,
    lo: wp.array(dtype=V),
    hi: wp.array(dtype=V),
    min_index: wp.array(dtype=wp.int32),
):
    # The boxes of cloud c's tree (c as in cloud_tree), its points in place: the leaves',
    # then bottom-up; node 0, unused, zeroed.
    first, n, base = c[0], c[1], c[2]
    leaves = 1 << c[3]
    for leaf in range(leaves):
        s = first + part(leaf, n, leaves)
        node_box(pts, order, s, first + part(leaf + 1, n, leaves), base + leaves + leaf, lo, hi, min_index)
    level = leaves // 2
    while level > 0:
        for j in range(level):
            merge_up(base, level + j, lo, hi, min_index)
        level = level // 2
    lo[base] = V(T(0.0))
    hi[base] = V(T(0.0))
    min_index[base] = 0


@func
def cloud_tree(
    pts: wp.array(dtype=V), order: wp.array(dtype=wp.int32), items: wp.array(dtype=Item), c: wp.vec4i,
    slot: int, room: int, lo: wp.array(dtype=V), hi: wp.array(dtype=V), min_index: wp.array(dtype=wp.int32),
):  # fmt: skip
    # The whole tree of cloud c = (first place, points, first node, depth) of a forest, as
    # tree_subtrees builds a subtree: the levels whose nodes do not fit in row `slot` of
    # `items` (room for `room` records) split in place, the rest packed into the row, then
    # the leaves' boxes and the boxes bottom-up.
    first, n = c[0], c[1]
    leaves = 1 << c[3]
    level = int(1)
    while level < leaves and (wp.int64(n) + wp.int64(level - 1)) // wp.int64(level) > wp.int64(room):
        for j in range(level):
            split_node(pts, order, items, 0, False, first, n, level, j)
        level = level * 2
    for node in range(level if level < leaves else 0):
        s = first + part(node, n, level)
        e = first + part(node + 1, n, level)
        at = s - slot * room
        pack(pts, order, items, at, s, e)
        sub = level
        while sub < leaves:
            for jj in range(sub // level):
                split_node(pts, order, items, at, True, first, n, sub, node * (sub // level) + jj)
            sub = sub * 2
        unpack(items, at, s, e, pts, order)
    cloud_boxes(pts, order, c, lo, hi, min_index)


@kernel
def tree_subtrees(
    points: wp.array(dtype=V),
    pts: wp.array(dtype=V),
    order: wp.array(dtype=wp.int32),
    items: wp.array(dtype=Item),
    parts: int,
    stride: int,
    offset: int,
    lo: wp.array(dtype=V),
    hi: wp.array(dtype=V),
    min_index: wp.array(dtype=wp.int32),
):
    # One thread builds the whole subtree under node (parts + r): its splits level by
    # level, its leaves' boxes, then its boxes bottom-up. A scatter launch's share
    # `offset % stride` (of `stride`) owns that row of `items`, room for `room` records: the
    # levels whose nodes do not fit split in place; below, each node is packed into the
    # row, split down to its leaves there, and unpacked (CUDA: no rows, nothing to split).
    # With `points` not empty (a tree of one subtree), the thread first copies them in as
    # tree_init does: one launch less for a small cloud.
    r = wp.tid() * stride + offset
    n = pts.shape[0]
    for i in range(points.shape[0]):
        init_point(points, i, pts, order)
    leaves = lo.shape[0] // 2
    room = items.shape[0] // stride
    level = parts
    width = int(1)
    while level < leaves and (wp.int64(n) + wp.int64(level - 1)) // wp.int64(level) > wp.int64(room):
        for j in range(width):
            split_node(pts, order, items, 0, False, 0, n, level, r * width + j)
        level = level * 2
        width = width * 2
    if level < leaves:
        for j in range(width):
            node = r * width + j
            s = part(node, n, level)
            e = part(node + 1, n, level)
            base = s - (offset % stride) * room
            pack(pts, order, items, base, s, e)
            sub = level
            below = int(1)
            while sub < leaves:
                for jj in range(below):
                    split_node(pts, order, items, base, True, 0, n, sub, node * below + jj)
                sub = sub * 2
                below = below * 2
            unpack(items, base, s, e, pts, order)
        width = width * (leaves // level)
        level = leaves
    for j in range(width):
        leaf = r * width + j
        node_box(pts, order, part(leaf, n, leaves), part(leaf + 1, n, leaves), leaves + leaf, lo, hi, min_index)
    while level > parts:
        level = level // 2
        width = width // 2
        for j in range(width):
            merge_up(0, level + r * width + j, lo, hi, min_index)
    if r == 0:
        # Node 0 is unused but returned (as a saved output): deterministic contents.
        lo[0] = V(T(0.0))
        hi[0] = V(T(0.0))
        min_index[0] = 0


@kernel
def forest_trees(
    pts: wp.array(dtype=V),
    order: wp.array(dtype=wp.int32),
    items: wp.array(dtype=Item),
    clouds: wp.array(dtype=wp.vec4i),
    stride: int,
    offset: int,
    lo: wp.array(dtype=V),
    hi: wp.array(dtype=V),
    min_index: wp.array(dtype=wp.int32),
):
    # A forest, one thread per cloud's whole tree (cloud_tree), rows of `items` as in
    # tree_subtrees. (tree_subtrees keeps its body inline: called as a function, the same
    # build measured 7% slower, 7.8 -> 8.3 ms for 10^5 points on one thread.)
    c = clouds[wp.tid() * stride + offset]
    cloud_tree(pts, order, items, c, offset % stride, items.shape[0] // stride, lo, hi, min_index)


@kernel
def forest_boxes(
    pts: wp.array(dtype=V),
    order: wp.array(dtype=wp.int32),
    clouds: wp.array(dtype=wp.vec4i),
    stride: int,
    offset: int,
    lo: wp.array(dtype=V),
    hi: wp.array(dtype=V),
    min_index: wp.array(dtype=wp.int32),
):
    # A forest's boxes from its points in the order a build left, one thread per cloud.
    cloud_boxes(pts, order, clouds[wp.tid() * stride + offset], lo, hi, min_index)
