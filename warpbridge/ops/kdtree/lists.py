"""Radius neighbour lists (CSR over the queries) and the gradient of their distances.

A list is built in two passes over the same walk (``geometry.ball_first``/``ball_next``,
repeated in native code: ``geometry.BALL_WALK``): ``radius_count`` counts each query's
neighbours; the caller turns the counts, capped at ``cap``, into row offsets
(``list_offsets``); ``radius_fill`` then fills each query's row with its closest ``cap``
neighbours, in ascending distance, ties by index: all of them, walked again (or read back from
the places the count kept) and sorted (``sort.sort_row``); or, where there are more than
``cap``, by a kNN walk bounded by the radius (``knn.knn_query``), which skips what is farther
than the closest found so far (the full walk with a heap took 28.7 ms against 9.1 on
PointNet++'s first ball query: 16 x 512 queries, about 233 neighbours a row, cap 32).
"""

from __future__ import annotations

import warp as wp

from . import template
from .dtypes import Edges, Grads, T, Tree, V
from .geometry import BALL_WALK, NORM_OF, RESUMED, WITHIN, cloud_of, query_at, resumed, sq_bound
from .knn import BRUTE_REFS, QUERY, REF, knn_brute, knn_query
from .rows import pull_on_distance
from .sort import sort_row
from .template import func, kernel, native

# count_row: query i's neighbours within the radius in cloud c (j == i left out with
# skip_self), and their places in the tree in row i of `listed` (see geometry.RESUMED). Native
# code: in Warp (ball_first/ball_next), radius_count took 1.21 of a 2.9 ms radius call (2 000
# queries, 10^4 duplicated points; 0.53 ms native) and 32.7 ms on a LiDAR sweep of 10^5 points
# (12.0 ms native).
_COUNT_SNIPPET = native("lists_count_row.h")


def _walking(snippet: str) -> str:
    """A native snippet with NORM_OF, BALL_WALK and RESUMED filled in."""
    return snippet.replace("BALL_WALK", BALL_WALK).replace("NORM_OF", NORM_OF).replace("RESUMED", str(RESUMED))


@template.func_native(_walking(_COUNT_SNIPPET))
def count_row(
    q: V,
    tree: Tree,
    cloud: wp.vec4i,
    reach: T,
    radius: T,
    skip_self: int,
    i: int,
    listed: wp.array2d(dtype=wp.int32),
) -> int: ...


# small_lists: the radius lists of one cloud small enough to compare each query with every
# reference (at most BRUTE_REFS of them; one thread, rows in turn), as radius_count and
# radius_fill list it through the tree: the same neighbours, distances and order; a row of
# more than `cap` (limits[0]) keeps its cap nearest; limits[1]: j == i left out. `edges`
# flat: the E neighbours, then the E centres.
_SMALL_SNIPPET = (
    native("lists_small.h").replace("NORM_OF", NORM_OF).replace("WITHIN", WITHIN).replace("BRUTE_REFS", str(BRUTE_REFS))
)


@template.func_native(_SMALL_SNIPPET)
def small_lists(
    query: wp.array(dtype=V),
    ref: wp.array(dtype=V),
    radius: T,
    limits: wp.vec2i,
    counts: wp.array(dtype=wp.int64),
    ptr: wp.array(dtype=wp.int64),
    distance: wp.array(dtype=T),
    edges: wp.array(dtype=wp.int64),
): ...


@kernel
def radius_small(
    query: wp.array(dtype=V),
    ref: wp.array(dtype=V),
    radius: T,
    limits: wp.vec2i,
    stride: int,
    offset: int,
    counts: wp.array(dtype=wp.int64),
    ptr: wp.array(dtype=wp.int64),
    distance: wp.array(dtype=T),
    edges: wp.array(dtype=wp.int64),
):
    # One thread (the rows' offsets are a running sum).
    small_lists(query, ref, radius, limits, counts, ptr, distance, edges)


@kernel
def radius_count(
    query: wp.array(dtype=V),
    tree: Tree,
    radius: T,
    skip_self: int,
    queries: wp.array(dtype=wp.int32),
    stride: int,
    offset: int,
    counts: wp.array(dtype=wp.int64),
    listed: wp.array2d(dtype=wp.int32),
):
    # Query i's neighbours within the radius (j == i left out with skip_self); their places in
    # the tree where they all fit in the row of `listed` (L entries), so that radius_fill need
    # not walk again. A row with more neighbours keeps the first L - 3 places and where the walk
    # goes on after them (see geometry.resumed), radius_fill walks only the rest.
    i = query_at(wp.tid() * stride + offset, queries)
    c = cloud_of(tree, i)
    reach = sq_bound(radius)
    counts[i] = wp.int64(count_row(query[i], tree, c, reach, radius, skip_self, i, listed))


@kernel
def list_offsets(counts: wp.array(dtype=wp.int64), cap: int, stride: int, offset: int, ptr: wp.array(dtype=wp.int64)):
    # One thread: ptr[i] = sum of min(counts, cap) before query i (ptr has M + 1 entries).
    # (stride and offset: launched as a launch over queries, of one.)
    total = wp.int64(0)
    for i in range(counts.shape[0]):
        ptr[i] = total
        total += wp.min(counts[i], wp.int64(cap))
    ptr[counts.shape[0]] = total


@kernel
def capped_counts(
    counts: wp.array(dtype=wp.int64), cap: int, stride: int, offset: int, capped: wp.array(dtype=wp.int64)
):
    # capped[i] = min(counts[i], cap), 0 past the last query: list_offsets as a scan (CUDA).
    i = wp.tid() * stride + offset
    capped[i] = wp.int64(0)
    if i < counts.shape[0]:
        capped[i] = wp.min(counts[i], wp.int64(cap))


# listed_row: the neighbours at the `kept` places that row i of `listed` holds, as entries
# (distance, original index) of the row at s, in native code as count_row.
_LISTED_ROW_SNIPPET = native("lists_listed_row.h")


@template.func_native(_LISTED_ROW_SNIPPET.replace("NORM_OF", NORM_OF))
def listed_row(
    q: V,
    tree: Tree,
    listed: wp.array2d(dtype=wp.int32),
    i: int,
    kept: int,
    s: int,
    dist: wp.array(dtype=T),
    idx: wp.array(dtype=wp.int64),
): ...


# walk_row: query i's row at s, holding `size` entries, from the walk standing at place
# at[1] of leaf at[0] (its places ending at at[2]; leaf 0: from the start): every neighbour
# in turn (the row has room for all). Returns how many entries the row holds. Native code,
# as count_row.
_WALK_ROW_SNIPPET = native("lists_walk_row.h")


@template.func_native(_walking(_WALK_ROW_SNIPPET))
def walk_row(
    q: V,
    tree: Tree,
    cloud: wp.vec4i,
    reach: T,
    radius: T,
    skip_self: int,
    i: int,
    s: int,
    size: int,
    at: wp.vec3i,
    dist: wp.array(dtype=T),
    idx: wp.array(dtype=wp.int64),
) -> int: ...


@kernel
def radius_fill(
    query: wp.array(dtype=V),
    tree: Tree,
    radius: T,
    skip_self: int,
    cap: int,
    ptr: wp.array(dtype=wp.int64),
    listed: wp.array2d(dtype=wp.int32),
    queries: wp.array(dtype=wp.int32),
    stride: int,
    offset: int,
    edges: Edges,
):
    # Query i's row [ptr[i], ptr[i + 1]): its closest neighbours j, ascending (distance, j),
    # as edges (j, i): sources the neighbours, targets the query.
    i = query_at(wp.tid() * stride + offset, queries)
    q = query[i]
    s, room = int(ptr[i]), int(ptr[i + 1] - ptr[i])
    reach = sq_bound(radius)
    index = edges.sources
    distance = edges.distance
    size = room
    kept = room
    go_on = wp.vec3i(0, 0, 0)
    if room < cap and room > listed.shape[1]:  # radius_count kept the first places, and where it went on
        go_on = resumed(listed, i)
        kept = listed.shape[1] - 3
    c = cloud_of(tree, i)
    if room < cap and (room <= listed.shape[1] or go_on[0] > 0):
        listed_row(q, tree, listed, i, kept, s, distance, index)
        if go_on[0] > 0:
            walk_row(q, tree, c, reach, radius, skip_self, i, s, kept, go_on, distance, index)
    elif room == cap and cap > 0:  # the closest cap of more: a kNN walk bounded by the radius, sorted
        skip = wp.int64(-1)
        if skip_self != 0:
            skip = wp.int64(i)
        knn_query(
            q,
            tree,
            c,
            cap,
            s,
            edges.rows_d,
            edges.rows_j,
            edges.none,
            radius,
            skip,
        )
        size = 0
    elif room > 0:
        start = wp.vec3i(0, 0, 0)
        size = walk_row(q, tree, c, reach, radius, skip_self, i, s, 0, start, distance, index)
    sort_row(distance, index, s, size)
    for e in range(s, s + room):
        edges.targets[e] = wp.int64(i)


@kernel
def list_backward(
    query: wp.array(dtype=V),
    ref: wp.array(dtype=V),
    sources: wp.array(dtype=wp.int64),
    ptr: wp.array(dtype=wp.int64),
    grad: wp.array(dtype=T),
    needs: int,
    queries: wp.array(dtype=wp.int32),
    stride: int,
    offset: int,
    grads: Grads,
):
    # The distances' gradient, row by row (see knn_backward).
    i, slot = query_at(wp.tid() * stride + offset, queries), offset % stride
    q = query[i]
    dq = V(T(0.0))
    for e in range(int(ptr[i]), int(ptr[i + 1])):
        j = int(sources[e])
        dq += pull_on_distance(grads, (needs & REF) != 0, slot, q, ref[j], j, grad[e])
    if (needs & QUERY) != 0:
        grads.d_query[i] = dq


@func
def knn_edge(idx: wp.array2d(dtype=wp.int64), i: int, c: int, skip_self: int) -> bool:
    # Whether query i's c-th nearest is an edge: found (not -1), and not i itself with skip_self.
    j = idx[i, c]
    return j >= wp.int64(0) and (skip_self == 0 or j != wp.int64(i))


@kernel
def knn_edge_counts(
    idx: wp.array2d(dtype=wp.int64),
    k: int,
    skip_self: int,
    stride: int,
    offset: int,
    counts: wp.array(dtype=wp.int64),
):
    # Point i's number of edges: its nearest found, i itself left out with skip_self (the
    # search found k + 1 then), at most k. Fewer where its cloud is short or it is not finite.
    i = wp.tid() * stride + offset
    n = int(0)
    for c in range(idx.shape[1]):
        if n < k and knn_edge(idx, i, c, skip_self):
            n += 1
    counts[i] = wp.int64(n)


@kernel
def knn_edges(
    idx: wp.array2d(dtype=wp.int64),
    ptr: wp.array(dtype=wp.int64),
    skip_self: int,
    stride: int,
    offset: int,
    sources: wp.array(dtype=wp.int64),
    targets: wp.array(dtype=wp.int64),
):
    # Point i's edges (j, i) at ptr[i] onwards, nearest first (knn_edge_counts counted them).
    i = wp.tid() * stride + offset
    e = ptr[i]
    for c in range(idx.shape[1]):
        if e < ptr[i + 1] and knn_edge(idx, i, c, skip_self):
            sources[e] = idx[i, c]
            targets[e] = wp.int64(i)
            e += wp.int64(1)


@kernel
def knn_graph_small(
    x: wp.array(dtype=V),
    k: int,
    skip_self: int,
    stride: int,
    offset: int,
    dist: wp.array2d(dtype=T),
    idx: wp.array2d(dtype=wp.int64),
    ptr: wp.array(dtype=wp.int64),
    edges: wp.array(dtype=wp.int64),
):
    # The kNN graph of one small cloud on one thread: each point's nearest as knn_small finds
    # them (rows of dist and idx, scratch), its edges as knn_edge_counts and knn_edges take
    # them; `edges` flat, the E neighbours, then the E centres.
    n = x.shape[0]
    e = wp.int64(0)
    for i in range(n):
        knn_brute(x[i], x, dist.shape[1], i, dist, idx)
        ptr[i] = e
        for c in range(idx.shape[1]):
            if e - ptr[i] < wp.int64(k) and knn_edge(idx, i, c, skip_self):
                edges[e] = idx[i, c]
                e += wp.int64(1)
    ptr[n] = e
    for i in range(n):
        for t in range(int(ptr[i]), int(ptr[i + 1])):
            edges[e + wp.int64(t)] = wp.int64(i)
