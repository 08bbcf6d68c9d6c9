"""Exact kNN and radius searches by brute force, for points of many coordinates (feature
vectors: DGCNN's graphs in 64 or 128 dimensions), where a kd-tree prunes nothing.

The search runs in register blocks: 8 queries of one cloud against a vector's worth of its
references at a time (32 float32 on AVX-512), the squared differences summed coordinate by
coordinate (direct differences, not the ``|q|² + |r|² - 2 q·r`` identity, whose cancellation
reorders near neighbours), the references read from a transposed, padded copy so that each
coordinate's values load as whole vectors. Each query keeps its k nearest sorted by insertion
(ties to the smaller index: references are scanned in index order and a tie never moves
ahead). A radius search keeps the references with ``sqrt(d2) <= radius`` in a list's rows, sorted
by distance the same way. A distance that is not finite (a point with a NaN or infinite coordinate, or whose
squared distance overflows) is nobody's neighbour.

Not per dimension: the rows are plain 2-D arrays, one module per float type.
"""

from __future__ import annotations

import warp as wp

from . import template
from .dtypes import T
from .template import func, kernel, native
from .weights import aggregate_row, times_slope, weight

QUERIES_PER_BLOCK = 8
REF_PADDING = 32  # columns past the last reference in the transposed copy: a block reads whole vectors

# The block: the queries of block `b` (blocks[b] = (first query, queries, cloud)) against the
# references ref_ptr[cloud] .. ref_ptr[cloud + 1] (their transposed copy rt, (D, N + padding)),
# their squared distances computed a block of references at a time; each candidate (a
# reference closer than the query's bound) visited in index order. On the CPU the block is
# written in the compiler's vector types, sized to the machine's widest registers (16
# accumulators: 8 queries x NV vectors), so that it vectorises whatever -march finds; the
# candidates of a block are the set bits of one compare. On CUDA a thread walks the same steps
# on scalars. What a search keeps comes from its own snippet (brute_<search>.h), in three parts:
# its state (@start), what it does with a candidate `d`, `j` of query `a` (@visit) and what it
# writes (@end).
_BLOCK = native("brute_block.h")


def _search(name: str, compare: str) -> str:
    """The block with the search ``name``'s parts, candidates those ``d compare bound[a]``."""
    text = native(f"brute_{name}.h")
    start, rest = text.split("// @start", 1)[1].split("// @visit", 1)
    visit, end = rest.split("// @end", 1)
    parts = {"BLOCK_START": start, "BLOCK_VISIT": visit, "BLOCK_END": end, "BOUND_CMP": compare}
    block = _BLOCK
    for word, part in parts.items():
        block = block.replace(word, part)
    return block


@template.func_native(_search("knn", "<"))
def block_knn(
    query: wp.array2d(dtype=T),
    rt: wp.array2d(dtype=T),
    ref_ptr: wp.array(dtype=wp.int64),
    blocks: wp.array(dtype=wp.vec3i),
    b: int,
    dist: wp.array2d(dtype=T),
    idx: wp.array2d(dtype=wp.int64),
    count: wp.array(dtype=wp.int64),
): ...


@template.func_native(_search("radius_count", "<="))
def block_radius_count(
    query: wp.array2d(dtype=T),
    rt: wp.array2d(dtype=T),
    ref_ptr: wp.array(dtype=wp.int64),
    blocks: wp.array(dtype=wp.vec3i),
    b: int,
    radius: T,
    skip: int,
    count: wp.array(dtype=wp.int64),
): ...


@template.func_native(_search("radius_fill", "<="))
def block_radius_fill(
    query: wp.array2d(dtype=T),
    rt: wp.array2d(dtype=T),
    ref_ptr: wp.array(dtype=wp.int64),
    blocks: wp.array(dtype=wp.vec3i),
    b: int,
    radius: T,
    limits: wp.vec2i,
    ptr: wp.array(dtype=wp.int64),
    distance: wp.array(dtype=T),
    index: wp.array(dtype=wp.int64),
    centre: wp.array(dtype=wp.int64),
): ...


@kernel
def rows_knn(
    query: wp.array2d(dtype=T),
    rt: wp.array2d(dtype=T),
    ref_ptr: wp.array(dtype=wp.int64),
    blocks: wp.array(dtype=wp.vec3i),
    stride: int,
    offset: int,
    dist: wp.array2d(dtype=T),
    idx: wp.array2d(dtype=wp.int64),
    count: wp.array(dtype=wp.int64),
):
    block_knn(query, rt, ref_ptr, blocks, wp.tid() * stride + offset, dist, idx, count)


@kernel
def rows_radius_count(
    query: wp.array2d(dtype=T),
    rt: wp.array2d(dtype=T),
    ref_ptr: wp.array(dtype=wp.int64),
    blocks: wp.array(dtype=wp.vec3i),
    stride: int,
    offset: int,
    radius: T,
    skip: int,
    count: wp.array(dtype=wp.int64),
):
    block_radius_count(query, rt, ref_ptr, blocks, wp.tid() * stride + offset, radius, skip, count)


@kernel
def rows_radius_fill(
    query: wp.array2d(dtype=T),
    rt: wp.array2d(dtype=T),
    ref_ptr: wp.array(dtype=wp.int64),
    blocks: wp.array(dtype=wp.vec3i),
    stride: int,
    offset: int,
    radius: T,
    limits: wp.vec2i,
    ptr: wp.array(dtype=wp.int64),
    distance: wp.array(dtype=T),
    index: wp.array(dtype=wp.int64),
    centre: wp.array(dtype=wp.int64),
):
    # limits: (the cap on a row, whether a query leaves out the reference of its own index)
    b = wp.tid() * stride + offset
    block_radius_fill(query, rt, ref_ptr, blocks, b, radius, limits, ptr, distance, index, centre)


@kernel
def rows_aggregate(
    features: wp.array2d(dtype=T),
    dist: wp.array2d(dtype=T),
    idx: wp.array2d(dtype=wp.int64),
    sigma: T,
    inverse_square: wp.int32,
    stride: int,
    offset: int,
    out: wp.array2d(dtype=T),
):
    aggregate_row(features, dist, idx, sigma, inverse_square, wp.tid() * stride + offset, out)


@kernel
def rows_transpose(ref: wp.array2d(dtype=T), stride: int, offset: int, rt: wp.array2d(dtype=T)):
    # Reference j's coordinates into column j of rt.
    j = wp.tid() * stride + offset
    for c in range(ref.shape[1]):
        rt[c, j] = ref[j, c]


@func
def pull_rows(
    query: wp.array2d(dtype=T),
    ref: wp.array2d(dtype=T),
    i: int,
    j: int,
    d: T,
    g: T,
    needs: int,
    adj_query: wp.array2d(dtype=T),
    adj_ref: wp.array2d(dtype=T),
):
    # The gradient g of the distance d between query i and reference j into their rows (needs:
    # 1 the query's, 2 the reference's): (q - r) / d * g, 0 where they coincide.
    if d > T(0.0):
        for c in range(query.shape[1]):
            pull = (query[i, c] - ref[j, c]) / d * g
            if (needs & 1) != 0:
                adj_query[i, c] += pull
            if (needs & 2) != 0:
                adj_ref[j, c] -= pull


@kernel
def rows_knn_backward(
    query: wp.array2d(dtype=T),
    ref: wp.array2d(dtype=T),
    idx: wp.array2d(dtype=wp.int64),
    dist: wp.array2d(dtype=T),
    adj_dist: wp.array2d(dtype=T),
    needs: int,
    stride: int,
    offset: int,
    adj_query: wp.array2d(dtype=T),
    adj_ref: wp.array2d(dtype=T),
):
    # d dist[i, n] / d query[i] = (q - r) / d: the unit vector first, then scaled (as the
    # 3-D backward, finite at any scale); 0 where the points coincide. Queries in order on
    # one thread when the reference gradient is wanted (a scatter), so sums are deterministic.
    i = wp.tid() * stride + offset
    for n in range(idx.shape[1]):
        j = int(idx[i, n])
        if j >= 0:
            pull_rows(query, ref, i, j, dist[i, n], adj_dist[i, n], needs, adj_query, adj_ref)


@kernel
def rows_list_backward(
    query: wp.array2d(dtype=T),
    ref: wp.array2d(dtype=T),
    ptr: wp.array(dtype=wp.int64),
    index: wp.array(dtype=wp.int64),
    distance: wp.array(dtype=T),
    adj_distance: wp.array(dtype=T),
    needs: int,
    stride: int,
    offset: int,
    adj_query: wp.array2d(dtype=T),
    adj_ref: wp.array2d(dtype=T),
):
    # As rows_knn_backward, over the rows of a radius list.
    i = wp.tid() * stride + offset
    for p in range(int(ptr[i]), int(ptr[i + 1])):
        pull_rows(query, ref, i, int(index[p]), distance[p], adj_distance[p], needs, adj_query, adj_ref)


@kernel
def rows_aggregate_backward(
    features: wp.array2d(dtype=T),
    dist: wp.array2d(dtype=T),
    idx: wp.array2d(dtype=wp.int64),
    out: wp.array2d(dtype=T),
    adj_out: wp.array2d(dtype=T),
    sigma: T,
    inverse_square: wp.int32,
    needs: int,
    stride: int,
    offset: int,
    adj_dist: wp.array2d(dtype=T),
    adj_features: wp.array2d(dtype=T),
):
    # The aggregation's gradient (the algebra of knn.knn_aggregate_backward): each neighbour's
    # weight times the output's gradient into its feature row (needs & 4: a scatter, queries
    # in order on one thread), and into adj_dist the gradient of each neighbour's distance
    # (needs & 3), which rows_knn_backward carries to the points.
    i = wp.tid() * stride + offset
    closest = dist[i, 0]
    total = T(0.0)
    for n in range(idx.shape[1]):
        if idx[i, n] >= wp.int64(0):
            total += weight(dist[i, n], closest, sigma, inverse_square)
    if total > T(0.0):
        inv = T(1.0) / total
        g_out = T(0.0)
        for f in range(out.shape[1]):
            g_out += adj_out[i, f] * out[i, f]
        for n in range(idx.shape[1]):
            j = int(idx[i, n])
            if j >= 0:
                p = weight(dist[i, n], closest, sigma, inverse_square) * inv
                g_f = T(0.0)
                for f in range(features.shape[1]):
                    g_f += adj_out[i, f] * features[j, f]
                    if (needs & 4) != 0:
                        adj_features[j, f] += p * adj_out[i, f]
                if (needs & 3) != 0:
                    adj_dist[i, n] = times_slope(p * (g_out - g_f), dist[i, n], sigma, inverse_square)
