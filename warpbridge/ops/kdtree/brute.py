"""Exact kNN by brute force, for points of many coordinates (feature vectors: DGCNN's graphs
in 64 or 128 dimensions), where a kd-tree prunes nothing.

The search runs in register blocks: 8 queries of one cloud against a vector's worth of its
references at a time (32 float32 on AVX-512), the squared differences summed coordinate by
coordinate (direct differences, not the ``|q|² + |r|² - 2 q·r`` identity, whose cancellation
reorders near neighbours), the references read from a transposed, padded copy so that each
coordinate's values load as whole vectors. Each query keeps its k nearest sorted by insertion
(ties to the smaller index: references are scanned in index order and a tie never moves
ahead). A distance that is not finite (a point with a NaN or infinite coordinate, or whose
squared distance overflows) is nobody's neighbour.

Not per dimension: the rows are plain 2-D arrays, one module per float type.
"""

from __future__ import annotations

import warp as wp

from . import template
from .dtypes import T
from .template import kernel, native

QUERIES_PER_BLOCK = 8
REF_PADDING = 32  # columns past the last reference in the transposed copy: a block reads whole vectors

# block_knn: the queries of block `b` (blocks[b] = (first query, queries, cloud)) against the
# references ref_ptr[cloud] .. ref_ptr[cloud + 1] (their transposed copy rt, (D, N + padding));
# sorted squared distances into dist, indices into idx, -1 and inf past what the cloud has.
# On the CPU the block is written in the compiler's vector types, sized to the machine's
# widest registers (16 accumulators: 8 queries x NV vectors), so that it vectorises whatever
# -march finds; the candidates of a block are the set bits of one compare, and each query's k
# nearest (k <= KMAX) sort by insertion in a local array, else in its output row. On CUDA a
# thread walks the same steps on scalars.
_BLOCK_SNIPPET = native("brute_block_knn.h")


@template.func_native(_BLOCK_SNIPPET)
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
def rows_transpose(ref: wp.array2d(dtype=T), stride: int, offset: int, rt: wp.array2d(dtype=T)):
    # Reference j's coordinates into column j of rt.
    j = wp.tid() * stride + offset
    for c in range(ref.shape[1]):
        rt[c, j] = ref[j, c]


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
        d = dist[i, n]
        if j >= 0 and d > T(0.0):
            g = adj_dist[i, n]
            for c in range(query.shape[1]):
                pull = (query[i, c] - ref[j, c]) / d * g
                if (needs & 1) != 0:
                    adj_query[i, c] += pull
                if (needs & 2) != 0:
                    adj_ref[j, c] -= pull
