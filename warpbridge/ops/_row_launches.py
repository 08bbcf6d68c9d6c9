"""``knn``, ``knn_graph`` and the radius lists for points of more coordinates than a kd-tree serves (feature
vectors), declared with ``wb.op`` under the names the kd-tree ops have, over plain (M, D)
rows: an exact blocked brute force per cloud (``kdtree.brute``).

No ``from __future__ import annotations`` here: the launch functions' Warp annotations are
read as Warp types (as in ``_launches``).
"""

import functools

import numpy as np
import warp as wp

from . import _batches, _launches, _tree, kdtree
from . import _cpu_launch as cpu_launch
from ._list_launches import edge_rows, graph_offsets, graph_width

BLOCK = kdtree.brute.QUERIES_PER_BLOCK


def _clouds(op: str, query: wp.array, ref: wp.array, query_batch: wp.array, ref_batch: wp.array) -> tuple:
    """(each cloud's first reference, as offsets with an end; the query blocks (first query,
    queries, cloud) as a vec3i array): blocks of BLOCK queries on the CPU, one on CUDA (a
    thread each), never spanning two clouds."""
    m, n, device = query.shape[0], ref.shape[0], query.device
    if query_batch.shape[0] + ref_batch.shape[0] == 0:
        q_cloud, ref_counts = np.zeros(m, dtype=np.int64), np.array([n], dtype=np.int64)
    else:
        q_cloud = _batches.batch_values(op, "query_batch", query_batch)
        r_cloud = _batches.batch_values(op, "ref_batch", ref_batch)
        ref_counts = np.bincount(r_cloud, minlength=_batches.cloud_count(q_cloud, r_cloud))
    ref_ptr = np.concatenate([[0], np.cumsum(ref_counts)]).astype(np.int64)
    starts = np.flatnonzero(np.r_[True, q_cloud[1:] != q_cloud[:-1]]) if m else np.zeros(0, dtype=np.int64)
    ends, size = np.r_[starts[1:], m], 1 if device.is_cuda else BLOCK
    firsts = [np.arange(s, e, size) for s, e in zip(starts, ends)]
    first = np.concatenate(firsts) if firsts else np.zeros(0, dtype=np.int64)
    end_of = np.concatenate([np.full(len(f), e) for f, e in zip(firsts, ends)]) if firsts else first
    blocks = np.stack([first, np.minimum(end_of - first, size), q_cloud[first]], 1).astype(np.int32)
    return wp.array(ref_ptr, dtype=wp.int64, device=device), wp.array(
        blocks.reshape(-1, 3), dtype=wp.vec3i, device=device
    )


def _transposed(k, ref: wp.array) -> wp.array:
    """The references' coordinates as rows, (D, N + padding): a block reads whole vectors."""
    rt = wp.zeros((ref.shape[1], ref.shape[0] + kdtree.brute.REF_PADDING), dtype=k.T, device=ref.device)
    cpu_launch.launch(k.rows_transpose, ref.shape[0], [ref], [rt], ref.device)
    return rt


def _whole(a: wp.array) -> wp.array:
    return a if a.is_contiguous else a.contiguous()  # the block reads rows whole


def radius_count_rows(op, query, ref, query_batch, ref_batch, radius, cap, skip_self, count, ptr):
    """Each query's references within ``radius`` (itself left out with ``skip_self``) into
    ``count``, and the offsets of the rows capped at ``cap`` into ``ptr``."""
    k, device = kdtree.row_kernels(query.dtype), query.device
    ref_ptr, blocks = _clouds(op, query, ref, query_batch, ref_batch)
    before = [_whole(query), _transposed(k, ref), ref_ptr, blocks]
    cpu_launch.launch(k.rows_radius_count, blocks.shape[0], before, [radius, skip_self, count], device)
    tree_kernels = _tree.kernels_for("float32" if k.T is wp.float32 else "float64", device)  # reads counts only
    _launches.row_offsets(tree_kernels, count, cap, ptr, device)


def radius_fill_rows(op, query, ref, query_batch, ref_batch, radius, cap, skip_self, ptr, distance, edges):
    """The rows of the radius list whose offsets are ``ptr``: (index, query) pairs into
    ``edges``, distances into ``distance``, each row sorted by distance (ties by index)."""
    k, device = kdtree.row_kernels(query.dtype), query.device
    ref_ptr, blocks = _clouds(op, query, ref, query_batch, ref_batch)
    before = [_whole(query), _transposed(k, ref), ref_ptr, blocks]
    limits = wp.vec2i(min(cap, (1 << 31) - 1), skip_self)
    outputs = [radius, limits, ptr, distance, *edge_rows(edges)]
    cpu_launch.launch(k.rows_radius_fill, blocks.shape[0], before, outputs, device)


def knn_rows(op, query, ref, query_batch, ref_batch, dist, idx, count):
    """The kNN search over rows: each query's k nearest of its cloud, sorted (ties by index)."""
    k, device = kdtree.row_kernels(dist.dtype), query.device
    with_count = count if count is not None else cpu_launch.nothing((0,), wp.int64, device.alias)
    ref_ptr, blocks = _clouds(op, query, ref, query_batch, ref_batch)
    rt = _transposed(k, ref)
    rows = [_whole(a) for a in (query, dist, idx)]
    cpu_launch.launch(k.rows_knn, blocks.shape[0], [rows[0], rt, ref_ptr, blocks], [*rows[1:], with_count], device)
    for out, row in zip((dist, idx), rows[1:]):
        if row.ptr != out.ptr:
            wp.copy(out, row)


def _rows_backward(kernel, rows: list, adj_query, adj_ref, needs_input_grad) -> None:
    """The distances' gradients into the points' (``kernel``: a row backward over the
    queries). With the references' wanted, a scatter: one thread, queries in order, so sums
    are deterministic."""
    needs = needs_input_grad[0] + 2 * needs_input_grad[1]
    if needs:
        query, device = rows[0], rows[0].device
        m = query.shape[0]
        threads = 1 if needs & 2 else cpu_launch.threads(device, m)
        cpu_launch.launch_queries(kernel, m, threads, [*rows, needs], [adj_query, adj_ref], device, None)


def _aggregate(op, query, ref, features, query_batch, ref_batch, sigma, inverse_square, out, dist, idx):
    """The kNN search, then each query's weighted mean of its neighbours' features into ``out``."""
    knn_rows(op, query, ref, query_batch, ref_batch, dist, idx, None)
    k = kdtree.row_kernels(dist.dtype)
    cpu_launch.launch(
        k.rows_aggregate, query.shape[0], [features, dist, idx, sigma, inverse_square], [out], query.device
    )


def _aggregate_backward(rows: list, sigma, inverse_square, adj_out, adj_points: list, adj_features, needs_input_grad):
    """``rows``: (query, ref, features, dist, idx, out). The features' gradient and each
    neighbour's distance's (a scatter into the features: one thread, queries in order), then
    the points' through the distances."""
    query, ref, features, dist, idx, out = rows
    needs = needs_input_grad[0] + 2 * needs_input_grad[1] + 4 * needs_input_grad[2]
    if not needs:
        return
    k, device, m = kdtree.row_kernels(dist.dtype), query.device, query.shape[0]
    adj_dist = wp.zeros(dist.shape if needs & 3 else (0, 0), dtype=dist.dtype, device=device)
    threads = 1 if needs & 4 else cpu_launch.threads(device, m)
    before = [features, dist, idx, out, adj_out, sigma, inverse_square, needs]
    cpu_launch.launch_queries(k.rows_aggregate_backward, m, threads, before, [adj_dist, adj_features], device, None)
    if needs & 3:
        _rows_backward(k.rows_knn_backward, [query, ref, idx, dist, adj_dist], *adj_points, needs_input_grad[:2])


@functools.cache
def declared(dtype: str) -> dict:
    """``knn`` (and what ``knn_graph`` needs), the radius lists and the kNN aggregations over
    (M, D) rows, for one float type."""
    return _searches(dtype) | _aggregations(dtype)


def _types(dtype: str) -> tuple:
    """The launch functions' annotations: the float type, rows of points, rows of indices,
    batch vectors; the kd-tree's orders and listed places (empty here)."""
    T = wp.float32 if dtype == "float32" else wp.float64
    Rows, Index, Batch = wp.array2d(dtype=T), wp.array2d(dtype=wp.int64), wp.array(dtype=wp.int64)
    return T, Rows, Index, Batch, wp.array(dtype=wp.int32), wp.array2d(dtype=wp.int32)


def _searches(dtype: str) -> dict:
    T, Rows, Index, Batch, Order, Listed = _types(dtype)

    def knn(query: Rows, ref: Rows, query_batch: Batch, ref_batch: Batch, k: int, dist: Rows, idx: Index, count: Batch):
        knn_rows("knn", query, ref, query_batch, ref_batch, dist, idx, count)

    def knn_backward(
        query: Rows, ref: Rows, query_batch: Batch, ref_batch: Batch, k: int, dist: Rows, idx: Index, count: Batch,
        adj_dist: Rows, adj_query: Rows, adj_ref: Rows, *, needs_input_grad,
    ):  # fmt: skip
        rows = [query, ref, idx, dist, adj_dist]
        _rows_backward(kdtree.row_kernels(T).rows_knn_backward, rows, adj_query, adj_ref, needs_input_grad)

    def knn_graph_search(x: Rows, batch: Batch, k: int, skip_self: int, idx: Index, ptr: Batch):
        device = x.device
        dist = wp.empty(idx.shape, dtype=T, device=device)
        knn_rows("knn_graph", x, x, batch, batch, dist, idx, None)
        graph_offsets(_tree.kernels_for(dtype, device), idx, k, skip_self, ptr)  # the 3-D module's

    def radius_count(
        query: Rows, ref: Rows, query_batch: Batch, ref_batch: Batch, radius: T, cap: int, skip_self: int,
        count: Batch, ptr: Batch, order: Order, queries: Order, listed: Listed,
    ):  # fmt: skip
        radius_count_rows("radius", query, ref, query_batch, ref_batch, radius, cap, skip_self, count, ptr)

    def radius_list(
        query: Rows, ref: Rows, query_batch: Batch, ref_batch: Batch, ptr: Batch, order: Order,
        queries: Order, listed: Listed, radius: T, skip_self: int, cap: int, n_pairs: int,
        distance: wp.array(dtype=T), edges: Index,
    ):  # fmt: skip
        radius_fill_rows("radius", query, ref, query_batch, ref_batch, radius, cap, skip_self, ptr, distance, edges)

    def radius_list_backward(
        query: Rows, ref: Rows, query_batch: Batch, ref_batch: Batch, ptr: Batch, order: Order,
        queries: Order, listed: Listed,
        radius: T, skip_self: int, cap: int, n_pairs: int, distance: wp.array(dtype=T), edges: Index,
        adj_distance: wp.array(dtype=T), adj_query: Rows, adj_ref: Rows, *, needs_input_grad,
    ):  # fmt: skip
        rows = [query, ref, ptr, edge_rows(edges)[0], distance, adj_distance]
        _rows_backward(kdtree.row_kernels(T).rows_list_backward, rows, adj_query, adj_ref, needs_input_grad)

    def knn_dims(query, ref, query_batch, ref_batch, k):
        return {"dist": (query[0], k), "idx": (query[0], k), "count": (query[0],)}

    def count_dims(query, ref, *_):
        return {"count": (query[0],), "ptr": (query[0] + 1,), "order": (0,), "queries": (0,), "listed": (0, 0)}

    def list_dims(query, ref, query_batch, ref_batch, ptr, order, queries, listed, radius, skip_self, cap, n_pairs):
        return {"distance": (n_pairs,), "edges": (2, n_pairs)}

    def graph_dims(x, batch, k, skip_self):
        return {"idx": (x[0], graph_width(x[0], k, skip_self)), "ptr": (x[0] + 1,)}

    return dict(
        knn=dict(fn=knn, backward=knn_backward, num_outputs=3, output_dims=knn_dims),
        knn_graph_search=dict(fn=knn_graph_search, num_outputs=2, output_dims=graph_dims),
        radius_count=dict(fn=radius_count, num_outputs=5, output_dims=count_dims),
        radius_list=dict(fn=radius_list, num_outputs=2, output_dims=list_dims, backward=radius_list_backward),
    )


def _aggregations(dtype: str) -> dict:
    T, Rows, Index, Batch, Order, _ = _types(dtype)

    def knn_aggregate(
        query: Rows, ref: Rows, features: Rows, query_batch: Batch, ref_batch: Batch, k: int, sigma: T,
        out: Rows, dist: Rows, idx: Index, queries: Order,
    ):  # fmt: skip
        _aggregate("knn_aggregate", query, ref, features, query_batch, ref_batch, sigma, 0, out, dist, idx)

    def knn_aggregate_backward(
        query: Rows, ref: Rows, features: Rows, query_batch: Batch, ref_batch: Batch, k: int, sigma: T,
        out: Rows, dist: Rows, idx: Index, queries: Order,
        adj_out: Rows, adj_query: Rows, adj_ref: Rows, adj_features: Rows, *, needs_input_grad,
    ):  # fmt: skip
        rows = [query, ref, features, dist, idx, out]
        _aggregate_backward(rows, sigma, 0, adj_out, [adj_query, adj_ref], adj_features, needs_input_grad)

    def knn_interpolate(
        query: Rows, ref: Rows, features: Rows, query_batch: Batch, ref_batch: Batch, k: int,
        out: Rows, dist: Rows, idx: Index, queries: Order,
    ):  # fmt: skip
        _aggregate("knn_interpolate", query, ref, features, query_batch, ref_batch, 1.0, 1, out, dist, idx)

    def knn_interpolate_backward(
        query: Rows, ref: Rows, features: Rows, query_batch: Batch, ref_batch: Batch, k: int,
        out: Rows, dist: Rows, idx: Index, queries: Order,
        adj_out: Rows, adj_query: Rows, adj_ref: Rows, adj_features: Rows, *, needs_input_grad,
    ):  # fmt: skip
        rows = [query, ref, features, dist, idx, out]
        _aggregate_backward(rows, 1.0, 1, adj_out, [adj_query, adj_ref], adj_features, needs_input_grad)

    def aggregate_dims(query, ref, features, query_batch, ref_batch, k, *sigma):
        return {"out": (query[0], features[1]), "dist": (query[0], k), "idx": (query[0], k), "queries": (0,)}

    aggregation = dict(num_outputs=4, aux=("dist", "idx", "queries"), output_dims=aggregate_dims)
    return dict(
        knn_aggregate=dict(aggregation, fn=knn_aggregate, backward=knn_aggregate_backward),
        knn_interpolate=dict(aggregation, fn=knn_interpolate, backward=knn_interpolate_backward),
    )
