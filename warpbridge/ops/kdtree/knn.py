"""The kNN search and its backwards.

The search itself is native code (``knn_query``), and so is the aggregation of the found
rows (``aggregate_row``); the backwards are Warp.
"""

from __future__ import annotations

import warp as wp

from . import template
from .dtypes import STACK, Aggregation, Grads, Nearest, Rows, T, Tree, V
from .geometry import NORM_OF, cloud_of, norm, query_at, unit_of
from .rows import add_feature_row, feature_dot, pull_on_distance, row_dot, sub_from_ref
from .template import kernel, native
from .weights import aggregate_row, times_slope, weight

# Which gradients a backward computes (its `needs`, a sum of these).
QUERY = 1
REF = 2
FEATURES = 4


# knn_query: query i's k nearest points of its cloud (see geometry.cloud_of), sorted by
# distance, then index, into its rows of dist and idx (inf and -1 where there are fewer
# than k points; no search for a query that is not finite); only those within `limit`
# (inf: no limit) and not the point `skip` (-1: none). Depth first from the root: the nearer child first, the other on
# the stack with its squared gap. Once the list is full, a box or a point
# whose squared gap exceeds `b` (sq_bound of the k-th distance) is certainly farther and
# is skipped without a square root; a box at least as far as the k-th with only larger
# indices is skipped too (ties go to the smaller index). The bound follows the list
# within a leaf, not only after it. Norms as `norm` (no overflow, no underflow).
#
# Native code (compiled for the CPU and by NVRTC for CUDA), on raw pointers into the
# tree's arrays, which _run._tree always allocates packed. The same steps in Warp, with
# only the leaf scan native, took 29.5 ms for the tutorial's 27 000 queries on 10^5
# points (one thread); this takes 25.6 ms, and 2 000 queries on 10^4 duplicated points
# 1.86 -> 1.51 ms. A C++ copy compiled on its own with Clang took 24.7 ms. (Before, the
# leaf scan alone became native: 1.86 -> 1.69 ms for 2 000 queries on 10^4 points.)
_INSERT, _ROW = native("knn_insert.h"), native("knn_row.h")
_KNN_SNIPPET = (
    native("knn_query.h")
    .replace("STACK", str(STACK))
    .replace("NORM_OF", NORM_OF)
    .replace("KNN_ROW", _ROW)
    .replace("KNN_INSERT", _INSERT)
)

# knn_brute: knn_query's result for a cloud small enough to compare each query with every
# reference (no tree to build or walk): the same distances, the same order.
BRUTE_REFS = 256  # the most references a cloud searched by knn_brute has
_BRUTE_SNIPPET = (
    native("knn_brute.h")
    .replace("NORM_OF", NORM_OF)
    .replace("KNN_ROW", _ROW)
    .replace("KNN_INSERT", _INSERT)
    .replace("BRUTE_REFS", str(BRUTE_REFS))
)


@template.func_native(_KNN_SNIPPET)
def knn_query(
    q: V,
    tree: Tree,
    cloud: wp.vec4i,
    k: int,
    i: int,
    dist: wp.array2d(dtype=T),
    idx: wp.array2d(dtype=wp.int64),
    features: wp.array2d(dtype=T),
    limit: T,
    skip: wp.int64,
): ...


@template.func_native(_BRUTE_SNIPPET)
def knn_brute(
    q: V, ref: wp.array(dtype=V), k: int, i: int, dist: wp.array2d(dtype=T), idx: wp.array2d(dtype=wp.int64)
) -> int: ...


@kernel
def knn_small(
    query: wp.array(dtype=V),
    ref: wp.array(dtype=V),
    stride: int,
    offset: int,
    dist: wp.array2d(dtype=T),
    idx: wp.array2d(dtype=wp.int64),
    count: wp.array(dtype=wp.int64),
):
    # knn_search over one small cloud, without a tree (knn_brute).
    i = wp.tid() * stride + offset
    found = knn_brute(query[i], ref, dist.shape[1], i, dist, idx)
    if count.shape[0] > 0:
        count[i] = wp.int64(found)


@kernel
def knn_search(
    query: wp.array(dtype=V),
    tree: Tree,
    k: int,
    queries: wp.array(dtype=wp.int32),
    stride: int,
    offset: int,
    dist: wp.array2d(dtype=T),
    idx: wp.array2d(dtype=wp.int64),
    count: wp.array(dtype=wp.int64),
    aggregation: Aggregation,
):
    # With a non-empty `aggregation.out`, also aggregates while the row is hot in cache.
    i = query_at(wp.tid() * stride + offset, queries)
    c = cloud_of(tree, i)
    features = aggregation.features
    knn_query(
        query[i],
        tree,
        c,
        k,
        i,
        dist,
        idx,
        features,
        T(wp.inf),
        wp.int64(-1),
    )
    if aggregation.out.shape[0] > 0:
        aggregate_row(features, dist, idx, aggregation.sigma, aggregation.inverse_square, i, aggregation.out)
    if count.shape[0] > 0:
        found = int(0)
        for n in range(idx.shape[1]):
            if idx[i, n] >= wp.int64(0):
                found += 1
        count[i] = wp.int64(found)


@kernel
def knn_backward(
    query: wp.array(dtype=V),
    ref: wp.array(dtype=V),
    idx: wp.array2d(dtype=wp.int64),
    grad: wp.array2d(dtype=T),
    needs: int,
    queries: wp.array(dtype=wp.int32),
    stride: int,
    offset: int,
    grads: Grads,
):
    # dist's gradient. On the CPU slot `offset % stride` > 0 adds into ref_slots[slot - 1]
    # (slot 0 into d_ref).
    i, slot = query_at(wp.tid() * stride + offset, queries), offset % stride
    q = query[i]
    dq = V(T(0.0))
    for n in range(idx.shape[1]):
        j = idx[i, n]
        if j >= wp.int64(0):
            dq += pull_on_distance(grads, (needs & REF) != 0, slot, q, ref[j], int(j), grad[i, n])
    if (needs & QUERY) != 0:
        grads.d_query[i] = dq


@kernel
def knn_aggregate_backward(
    query: wp.array(dtype=V),
    ref: wp.array(dtype=V),
    features: Rows,
    nearest: Nearest,
    grad: Rows,
    needs: int,
    queries: wp.array(dtype=wp.int32),
    stride: int,
    offset: int,
    grads: Grads,
):
    # The same algebra as the radius backward (see radius.py), with the k nearest in place of
    # the ball. On the CPU slot `offset % stride` > 0 adds into the copies `slot - 1` (slot 0
    # into d_ref, d_features).
    i, slot = query_at(wp.tid() * stride + offset, queries), offset % stride
    dist, idx, sigma, inverse_square = nearest.dist, nearest.idx, nearest.sigma, nearest.inverse_square
    closest = dist[i, 0]
    total = T(0.0)
    for n in range(idx.shape[1]):
        if idx[i, n] >= wp.int64(0):
            total += weight(dist[i, n], closest, sigma, inverse_square)
    if total > T(0.0):
        q = query[i]
        inv = T(1.0) / total
        g_out = row_dot(grad.v, i, nearest.out, i, features.v.shape[1])
        dq = V(T(0.0))
        for n in range(idx.shape[1]):
            j64 = idx[i, n]
            if j64 >= wp.int64(0):
                j = int(j64)
                p = weight(dist[i, n], closest, sigma, inverse_square) * inv
                if (needs & FEATURES) != 0:
                    add_feature_row(p, i, j, slot, 1, grad, grads)
                if (needs & (QUERY | REF)) != 0:
                    diff = q - ref[j]
                    d = norm(diff)
                    if d > T(0.0):
                        pull = p * (g_out - feature_dot(grad, i, features, j))
                        v = unit_of(diff, d) * times_slope(pull, d, sigma, inverse_square)
                        dq += v
                        if (needs & REF) != 0:
                            sub_from_ref(grads, slot, j, v)
        if (needs & QUERY) != 0:
            grads.d_query[i] = dq
