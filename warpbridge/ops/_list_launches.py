"""The neighbour-list ops, declared with ``wb.op`` like the aggregations (see ``_launches``).

A radius list takes two ops, because its length is known only once the neighbours are
counted: ``radius_count`` (each query's neighbour count, the row offsets of the capped lists,
and the kd-tree's and the queries' orders), then, with the total read on the host,
``radius_list`` (the edges and their distances, differentiable w.r.t. both point sets), which
rebuilds the tree from its order without splitting (``_tree.tree_of_order``). ``knn_graph`` is
one op: its size is k per point.

No ``from __future__ import annotations`` here: the launch functions' Warp annotations are
built per float type and must be objects, not strings.
"""

import functools

import warp as wp

from . import _cpu_launch as cpu_launch
from . import _knn_launches, _launches, _tree

# The cap on a row when there is none: more than any row can hold.
NO_CAP = (1 << 31) - 1
# radius_count lists each query's first LISTED neighbours (their places in the tree), fewer
# when the list would pass LISTED_BYTES: radius_fill walks the tree again only for the
# queries that have more.
LISTED = 64
LISTED_BYTES = 64 << 20


def listed_neighbours(m: int) -> int:
    return max(1, min(LISTED, LISTED_BYTES // (4 * max(m, 1))))


def _count(k, query, ref, batch, radius, cap, skip_self, count, ptr, order, queries, listed):
    """Each query's neighbour count, the capped rows' offsets; the tree's order and the
    queries' order, which ``_fill`` takes up again. ``batch`` as ``_tree.searched_tree``
    takes it."""
    m, device = query.shape[0], query.device
    tree = _tree.searched_tree(k, query, ref, queries, order=order, batch=batch)
    before = [query, tree, radius, skip_self, queries]
    cpu_launch.launch(k.radius_count, m, before, [count, listed], device)
    _launches.row_offsets(k, count, cap, ptr, device)


def edge_rows(edges: wp.array) -> list:
    """Rows 0 and 1 of a (2, E) edge array as two 1-D arrays. Warp's array descriptor holds
    32-bit strides: the 2-D array's row stride (8 E bytes) wraps negative from E = 2^28 on,
    and a kernel writing row 1 through it writes elsewhere (a crash)."""
    return [
        wp.array(
            ptr=edges.ptr + row * edges.strides[0],
            dtype=edges.dtype,
            shape=(edges.shape[1],),
            strides=(edges.strides[1],),
            device=edges.device,
        )  # fmt: skip
        for row in (0, 1)
    ]


def _fill(k, query, ref, batch, ptr, order, queries, listed, radius, skip_self, cap, edges, distance):
    forest = None if batch is None else batch[0]
    tree = _tree.tree_struct(k, _tree.tree_of_order(k, ref, order, forest), batch)
    before = [query, tree, radius, skip_self, cap, ptr, listed, queries]
    sources, targets = edge_rows(edges)
    rows_d, rows_j = (_rows_from_each(a, cap) for a in (distance, sources))
    none = cpu_launch.nothing((0, 0), distance.dtype, query.device.alias)
    filled = _launches.struct(
        k.Edges, sources=sources, targets=targets, distance=distance, rows_d=rows_d, rows_j=rows_j, none=none
    )
    cpu_launch.launch(k.radius_fill, query.shape[0], before, [filled], query.device)


def _rows_from_each(a: wp.array, cap: int) -> wp.array:
    """The 1-D ``a`` as (len, cap) rows, row s the cap entries from s on (strides of one
    entry): where a capped row's kNN walk writes. Empty without a cap."""
    rows = (a.shape[0], cap) if cap < NO_CAP else (0, 0)
    return wp.array(ptr=a.ptr, dtype=a.dtype, shape=rows, strides=(a.strides[0],) * 2, device=a.device)


def _knn_graph_search(k, x, batch, kk, skip_self, idx, ptr):
    """Each point's nearest (kk + skip_self of them: the point itself is found too where it is
    left out; fewer where there are fewer points) into ``idx``, and the offsets of its edges
    (at most kk, see ``knn_edge_counts``) into ``ptr``."""
    m, device = x.shape[0], x.device
    dist = wp.empty(idx.shape, dtype=k.T, device=device)
    _knn_launches.knn_forward(k, x, x, idx.shape[1], dist, idx, wp.empty(m, dtype=wp.int32, device=device), batch)
    graph_offsets(k, idx, kk, skip_self, ptr)


def graph_offsets(k, idx, kk, skip_self, ptr):
    """The offsets of each point's edges (at most kk of its nearest ``idx``, itself left out
    with ``skip_self``, see ``knn_edge_counts``) into ``ptr``. ``k``: any kernels of the float
    type (these read indices only)."""
    m, device = idx.shape[0], idx.device
    counts = wp.empty(m, dtype=wp.int64, device=device)
    cpu_launch.launch(k.knn_edge_counts, m, [idx, kk, skip_self], [counts], device)
    _launches.row_offsets(k, counts, kk, ptr, device)


def graph_width(n: int, k: int, skip_self: int) -> int:
    """The nearest a kNN graph's search finds per point: k, and the point itself where it is
    left out, but no more than there are points."""
    return min(k + skip_self, n)


@functools.cache
def declared(dtype: str, dim: int = 3) -> dict:
    """The list ops' launch functions and ``wb.op`` options for one float type ("float32" or
    "float64") and points of ``dim`` coordinates, by name (see ``_launches.declared``)."""
    return _tree_lists(dtype, dim) | _small_lists(dtype, dim)


def _small_lists(dtype: str, dim: int) -> dict:
    """``radius_small``: the radius lists of one small cloud on the CPU in one op (see
    ``_lists._small``), each row padded to the cap (or the cloud's size); ``radius_graph_small``
    the same search's graph alone; ``knn_graph_small`` a small cloud's kNN graph in one launch. The edges come flat,
    sized for the most there can be: row 0 (the neighbours) in the first E entries, row 1 (the
    centres) in the next E, so that the first 2 E, once E is read, are the (2, E) graph,
    contiguous."""
    T = wp.float32 if dtype == "float32" else wp.float64
    Points, Counts, Index = wp.array(dtype=wp.types.vector(dim, T)), wp.array(dtype=wp.int64), wp.array(dtype=wp.int32)
    kernels = functools.partial(_tree.kernels_for, dtype, dim=dim)  # kernels(device)

    def radius_small(
        query: Points, ref: Points, radius: T, cap: int, skip_self: int,
        count: Counts, ptr: Counts, queries: Index, distance: wp.array(dtype=T), edges: Counts,
    ):  # fmt: skip
        cpu_launch.minus_ones(queries)  # each query in its place, for the backward
        limits, outputs = wp.vec2i(min(cap, NO_CAP), skip_self), [count, ptr, distance, edges]
        cpu_launch.launch(kernels(query.device).radius_small, 1, [query, ref, radius, limits], outputs, query.device)

    def radius_small_backward(
        query: Points, ref: Points, radius: T, cap: int, skip_self: int,
        count: Counts, ptr: Counts, queries: Index, distance: wp.array(dtype=T), edges: Counts,
        adj_distance: wp.array(dtype=T), adj_query: Points, adj_ref: Points, *, needs_input_grad,
    ):  # fmt: skip
        k = kernels(query.device)
        rows = [query, ref, edges, ptr, adj_distance]  # the neighbours: the first E entries
        _launches.distance_backward(k, k.list_backward, rows, queries, adj_query, adj_ref, needs_input_grad)

    def radius_graph_small(x: Points, radius: T, cap: int, skip_self: int, ptr: Counts, edges: Counts):
        # radius_small's edges and offsets alone (a graph has no distances to differentiate):
        # the counts and distances go to this thread's kept scratch, not to outputs
        m, device = x.shape[0], x.device
        shapes, types = [(m,), (edges.shape[0] // 2,)], (wp.int64, T)
        count, distance = cpu_launch.kept_each(("small_count", "small_distance"), shapes, types, device)
        limits, outputs = wp.vec2i(min(cap, NO_CAP), skip_self), [count, ptr, distance, edges]
        cpu_launch.launch(kernels(device).radius_small, 1, [x, x, radius, limits], outputs, device)

    def knn_graph_small(x: Points, k: int, skip_self: int, ptr: Counts, edges: Counts):
        # knn_graph's two ops in one launch; the rows of nearest go to this thread's kept scratch
        n, device = x.shape[0], x.device
        shape = (n, graph_width(n, k, skip_self))
        dist, idx = cpu_launch.kept_each(("small_dist", "small_idx"), [shape, shape], (T, wp.int64), device)
        cpu_launch.launch(kernels(device).knn_graph_small, 1, [x, k, skip_self], [dist, idx, ptr, edges], device)

    def small_dims(query, ref, radius, cap, skip_self):
        m, e = query[0], query[0] * min(ref[0], cap)
        return {"count": (m,), "ptr": (m + 1,), "queries": (m,), "distance": (e,), "edges": (2 * e,)}

    def graph_small_dims(x, radius, cap, skip_self):
        e = x[0] * min(x[0], cap)
        return {"ptr": (x[0] + 1,), "edges": (2 * e,)}

    def knn_graph_small_dims(x, k, skip_self):
        return {"ptr": (x[0] + 1,), "edges": (2 * x[0] * min(x[0], k),)}

    return dict(
        radius_small=dict(
            fn=radius_small, num_outputs=5, aux=("queries",), output_dims=small_dims, backward=radius_small_backward
        ),
        radius_graph_small=dict(fn=radius_graph_small, num_outputs=2, output_dims=graph_small_dims),
        knn_graph_small=dict(fn=knn_graph_small, num_outputs=2, output_dims=knn_graph_small_dims),
    )


def _tree_lists(dtype: str, dim: int) -> dict:
    T = wp.float32 if dtype == "float32" else wp.float64
    Points, Counts, Edges = (
        wp.array(dtype=wp.types.vector(dim, T)),
        wp.array(dtype=wp.int64),
        wp.array2d(dtype=wp.int64),
    )
    Index, Listed, Batch = wp.array(dtype=wp.int32), wp.array2d(dtype=wp.int32), wp.array(dtype=wp.int64)
    Nearest = wp.array2d(dtype=wp.int64)

    kernels = functools.partial(_tree.kernels_for, dtype, dim=dim)  # kernels(device)

    def radius_count(
        query: Points, ref: Points, query_batch: Batch, ref_batch: Batch, radius: T, cap: int, skip_self: int,
        count: Counts, ptr: Counts, order: Index, queries: Index, listed: Listed,
    ):  # fmt: skip
        k, batch = kernels(query.device), _tree.forest_of("radius", query_batch, ref_batch)
        _count(k, query, ref, batch, radius, cap, skip_self, count, ptr, order, queries, listed)

    def radius_list(
        query: Points, ref: Points, query_batch: Batch, ref_batch: Batch, ptr: Counts, order: Index,
        queries: Index, listed: Listed, radius: T, skip_self: int, cap: int, n_pairs: int,
        distance: wp.array(dtype=T), edges: Edges,
    ):  # fmt: skip
        k, batch = kernels(query.device), _tree.forest_of("radius", query_batch, ref_batch)
        _fill(k, query, ref, batch, ptr, order, queries, listed, radius, skip_self, cap, edges, distance)

    def radius_list_backward(
        query: Points, ref: Points, query_batch: Batch, ref_batch: Batch, ptr: Counts, order: Index,
        queries: Index, listed: Listed,
        radius: T, skip_self: int, cap: int, n_pairs: int, distance: wp.array(dtype=T), edges: Edges,
        adj_distance: wp.array(dtype=T), adj_query: Points, adj_ref: Points, *, needs_input_grad,
    ):  # fmt: skip
        k = kernels(query.device)
        rows = [query, ref, edge_rows(edges)[0], ptr, adj_distance]
        _launches.distance_backward(k, k.list_backward, rows, queries, adj_query, adj_ref, needs_input_grad)

    def knn_graph_search(x: Points, batch: Batch, k: int, skip_self: int, idx: Nearest, ptr: Counts):
        forest = _tree.forest_of("knn_graph", batch, batch, ("batch", "batch"))
        _knn_graph_search(kernels(x.device), x, forest, k, skip_self, idx, ptr)

    def knn_graph_fill(idx: Nearest, ptr: Counts, skip_self: int, n_edges: int, edges: Edges):
        cpu_launch.launch(
            kernels(idx.device).knn_edges, idx.shape[0], [idx, ptr, skip_self], edge_rows(edges), idx.device
        )

    def count_dims(query, ref, *_):
        m = query[0]
        return {
            "count": (m,),
            "ptr": (m + 1,),
            "order": (ref[0],),
            "queries": (m,),
            "listed": (m, listed_neighbours(m)),
        }

    def list_dims(query, ref, query_batch, ref_batch, ptr, order, queries, listed, radius, skip_self, cap, n_pairs):
        return {"distance": (n_pairs,), "edges": (2, n_pairs)}

    def graph_search_dims(x, batch, k, skip_self):
        return {"idx": (x[0], graph_width(x[0], k, skip_self)), "ptr": (x[0] + 1,)}

    def graph_fill_dims(idx, ptr, skip_self, n_edges):
        return (2, n_edges)

    return dict(
        radius_count=dict(fn=radius_count, num_outputs=5, output_dims=count_dims),
        radius_list=dict(fn=radius_list, num_outputs=2, output_dims=list_dims, backward=radius_list_backward),
        knn_graph_search=dict(fn=knn_graph_search, num_outputs=2, output_dims=graph_search_dims),
        knn_graph_fill=dict(fn=knn_graph_fill, num_outputs=1, output_dims=graph_fill_dims),
    )
