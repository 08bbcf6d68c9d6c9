"""Exact kNN by brute force, for points of many coordinates (feature vectors: DGCNN's graphs
in 64 or 128 dimensions), where a kd-tree prunes nothing.

The search runs in register blocks: 8 queries of one cloud against 32 of its references at a
time, the squared differences summed coordinate by coordinate (direct differences, not the
``|q|² + |r|² - 2 q·r`` identity, whose cancellation reorders near neighbours), the
references read from a transposed copy so that each coordinate's 32 values are contiguous
and the compiler vectorises the block. Each query keeps its k nearest sorted by insertion
(ties to the smaller index: references are scanned in index order and a tie never moves
ahead). A distance that is not finite (a point with a NaN or infinite coordinate, or whose
squared distance overflows) is nobody's neighbour.

Not per dimension: the rows are plain 2-D arrays, one module per float type.
"""

from __future__ import annotations

import warp as wp

from . import template
from .dtypes import T
from .template import kernel

QUERIES_PER_BLOCK = 8

# block_knn: the queries of block `b` (blocks[b] = (first query, queries, cloud)) against the
# references ref_ptr[cloud] .. ref_ptr[cloud + 1] (their transposed copy rt, (D, N)); sorted
# squared distances into dist, indices into idx, -1 and inf past what the cloud has.
_BLOCK_SNIPPET = r"""
typedef REAL Real;
const wp::vec3i blk = *wp::address(blocks, b);
const int i0 = blk[0], qb = blk[1], cloud = blk[2];
const int D = query.shape[1], N = rt.shape[1], k = dist.shape[1];
const int j0 = (int)*wp::address(ref_ptr, cloud), j1 = (int)*wp::address(ref_ptr, cloud + 1);
Real kth[8];
int found[8];
for (int a = 0; a < qb; ++a) {
    kth[a] = (Real)INFINITY;
    found[a] = 0;
    for (int t = 0; t < k; ++t) { *wp::address(dist, i0 + a, t) = (Real)INFINITY; *wp::address(idx, i0 + a, t) = -1; }
}
for (int jb = j0; jb < j1; jb += 32) {
    const int nb = (j1 - jb) < 32 ? (j1 - jb) : 32;
    Real acc[8][32];
    for (int a = 0; a < 8; ++a) for (int c = 0; c < 32; ++c) acc[a][c] = (Real)0;
    for (int c = 0; c < D; ++c) {
        const Real* __restrict__ rc = (const Real*)((const char*)rt.data + (size_t)c * rt.strides[0]) + jb;
        Real r[32];
        for (int t = 0; t < 32; ++t) r[t] = t < nb ? rc[t] : (Real)0;
        for (int a = 0; a < 8; ++a) {
            const Real qa = a < qb ? *wp::address(query, i0 + a, c) : (Real)0;
            for (int t = 0; t < 32; ++t) { const Real d = qa - r[t]; acc[a][t] += d * d; }
        }
    }
    for (int a = 0; a < qb; ++a) {
        for (int t = 0; t < nb; ++t) {
            const Real d = acc[a][t];
            if (!(d < kth[a])) continue;  // NaN and inf too
            int pos = found[a] < k ? found[a] : k - 1;
            while (pos > 0 && *wp::address(dist, i0 + a, pos - 1) > d) {
                *wp::address(dist, i0 + a, pos) = *wp::address(dist, i0 + a, pos - 1);
                *wp::address(idx, i0 + a, pos) = *wp::address(idx, i0 + a, pos - 1);
                --pos;
            }
            *wp::address(dist, i0 + a, pos) = d;
            *wp::address(idx, i0 + a, pos) = (wp::int64)(jb + t);
            if (found[a] < k) ++found[a];
            if (found[a] == k) kth[a] = *wp::address(dist, i0 + a, k - 1);
        }
    }
}
for (int a = 0; a < qb; ++a) {
    for (int t = 0; t < found[a]; ++t) *wp::address(dist, i0 + a, t) = wp::sqrt(*wp::address(dist, i0 + a, t));
    if (count.shape[0] > 0) *wp::address(count, i0 + a) = found[a];
}
"""


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
