"""``knn`` and ``knn_graph`` for points of more coordinates than a kd-tree serves (feature
vectors), declared with ``wb.op`` under the names the kd-tree ops have, over plain (M, D)
rows: an exact blocked brute force per cloud (``kdtree.brute``).

No ``from __future__ import annotations`` here: the launch functions' Warp annotations are
read as Warp types (as in ``_declared``).
"""

import functools

import numpy as np
import warp as wp

from . import _batches, _declared, _tree, kdtree
from . import _cpu_launch as cpu_launch
from ._declared_lists import graph_offsets, graph_width

BLOCK = kdtree.brute.QUERIES_PER_BLOCK


def _clouds(op: str, query: wp.array, ref: wp.array, query_batch: wp.array, ref_batch: wp.array) -> tuple:
    """(each cloud's first reference, as offsets with an end; the query blocks (first query,
    queries, cloud) as a vec3i array): blocks of BLOCK queries never span two clouds."""
    m, n, device = query.shape[0], ref.shape[0], query.device
    if query_batch.shape[0] + ref_batch.shape[0] == 0:
        q_cloud, ref_counts = np.zeros(m, dtype=np.int64), np.array([n], dtype=np.int64)
    else:
        q_cloud = _batches.batch_values(op, "query_batch", query_batch)
        r_cloud = _batches.batch_values(op, "ref_batch", ref_batch)
        ref_counts = np.bincount(r_cloud, minlength=_batches.cloud_count(q_cloud, r_cloud))
    ref_ptr = np.concatenate([[0], np.cumsum(ref_counts)]).astype(np.int64)
    starts = np.flatnonzero(np.r_[True, q_cloud[1:] != q_cloud[:-1]]) if m else np.zeros(0, dtype=np.int64)
    ends = np.r_[starts[1:], m]
    firsts = [np.arange(s, e, BLOCK) for s, e in zip(starts, ends)]
    first = np.concatenate(firsts) if firsts else np.zeros(0, dtype=np.int64)
    end_of = np.concatenate([np.full(len(f), e) for f, e in zip(firsts, ends)]) if firsts else first
    blocks = np.stack([first, np.minimum(end_of - first, BLOCK), q_cloud[first]], 1).astype(np.int32)
    return wp.array(ref_ptr, dtype=wp.int64, device=device), wp.array(
        blocks.reshape(-1, 3), dtype=wp.vec3i, device=device
    )


def knn_rows(op, query, ref, query_batch, ref_batch, dist, idx, count):
    """The kNN search over rows: each query's k nearest of its cloud, sorted (ties by index)."""
    k, device = kdtree.row_kernels(dist.dtype), query.device
    with_count = count if count is not None else cpu_launch.nothing((0,), wp.int64, device)
    ref_ptr, blocks = _clouds(op, query, ref, query_batch, ref_batch)
    rt = wp.zeros((ref.shape[1], ref.shape[0] + kdtree.brute.REF_PADDING), dtype=k.T, device=device)
    _declared.launch(k.rows_transpose, ref.shape[0], [ref], [rt], device)
    rows = [a if a.is_contiguous else a.contiguous() for a in (query, dist, idx)]  # the block reads rows whole
    _declared.launch(k.rows_knn, blocks.shape[0], [rows[0], rt, ref_ptr, blocks], [*rows[1:], with_count], device)
    for out, row in zip((dist, idx), rows[1:]):
        if row.ptr != out.ptr:
            wp.copy(out, row)


@functools.cache
def declared(dtype: str) -> dict:
    """``knn`` (and what ``knn_graph`` needs) over (M, D) rows, for one float type."""
    T = wp.float32 if dtype == "float32" else wp.float64
    Rows, Index, Batch = wp.array2d(dtype=T), wp.array2d(dtype=wp.int64), wp.array(dtype=wp.int64)

    def knn(query: Rows, ref: Rows, query_batch: Batch, ref_batch: Batch, k: int, dist: Rows, idx: Index, count: Batch):
        knn_rows("knn", query, ref, query_batch, ref_batch, dist, idx, count)

    def knn_backward(
        query: Rows, ref: Rows, query_batch: Batch, ref_batch: Batch, k: int, dist: Rows, idx: Index, count: Batch,
        adj_dist: Rows, adj_query: Rows, adj_ref: Rows, *, needs_input_grad,
    ):  # fmt: skip
        needs = needs_input_grad[0] + 2 * needs_input_grad[1]
        if needs:
            kernels, m = kdtree.row_kernels(T), query.shape[0]
            threads = 1 if needs & 2 else cpu_launch.threads(query.device, m)  # a scatter: one thread, in order
            before = [query, ref, idx, dist, adj_dist, needs]
            cpu_launch.launch_queries(
                kernels.rows_knn_backward, m, threads, before, [adj_query, adj_ref], query.device, None
            )

    def knn_graph_search(x: Rows, batch: Batch, k: int, skip_self: int, idx: Index, ptr: Batch):
        device = x.device
        dist = wp.empty(idx.shape, dtype=T, device=device)
        knn_rows("knn_graph", x, x, batch, batch, dist, idx, None)
        graph_offsets(_tree.kernels_for(dtype, device), idx, k, skip_self, ptr)  # the 3-D module's

    def knn_dims(query, ref, query_batch, ref_batch, k):
        return {"dist": (query[0], k), "idx": (query[0], k), "count": (query[0],)}

    def graph_dims(x, batch, k, skip_self):
        return {"idx": (x[0], graph_width(x[0], k, skip_self)), "ptr": (x[0] + 1,)}

    return dict(
        knn=dict(fn=knn, backward=knn_backward, num_outputs=3, output_dims=knn_dims),
        knn_graph_search=dict(fn=knn_graph_search, num_outputs=2, output_dims=graph_dims),
    )
