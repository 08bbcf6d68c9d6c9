"""The kNN ops (``knn``, ``knn_aggregate``, ``knn_interpolate``), declared with ``wb.op`` as
``_launches`` declares the radius op: the search runs over a kd-tree built in the call (scratch:
only the neighbour indices are kept for the backward).

No ``from __future__ import annotations`` here: the launch functions' Warp annotations are
built per float type and must be objects, not strings.
"""

import functools
from typing import Any

import warp as wp

from . import _cpu_launch as cpu_launch
from . import _launches, _tree, kdtree


def knn_forward(k, query, ref, kk, dist, idx, queries, batch=None, count=None, aggregation=None):
    """The kNN search (with ``batch``, as ``_tree.searched_tree`` takes it, per cloud), each
    row's number found into ``count`` (where given), and with ``aggregation`` (``features``,
    ``out``, ``sigma``, ``inverse_square``, see the Aggregation struct of ``kdtree.dtypes``) its aggregation."""
    device = query.device
    count = cpu_launch.nothing((0,), wp.int64, device.alias) if count is None else count
    if aggregation is None and batch is None and small(query.shape[0], ref.shape[0]):
        cpu_launch.minus_ones(queries)  # each query in its place
        cpu_launch.launch(k.knn_small, query.shape[0], [query, ref], [dist, idx, count], device)
        return
    if aggregation is None:
        weights = _plain_search(k, device.alias)
    else:
        nothing = cpu_launch.nothing((0, 0), k.T, device.alias)
        weights = _launches.struct(k.Aggregation, **(dict(features=nothing, out=nothing, sigma=1.0) | aggregation))
    before = [query, _tree.searched_tree(k, query, ref, queries, batch=batch), kk, queries]
    cpu_launch.launch(k.knn_search, query.shape[0], before, [dist, idx, count, weights], device)


# A search of one cloud compares each query with every reference (``kdtree.knn.knn_brute``,
# the tree's results) while it makes at most this many comparisons and the cloud has at most
# SMALL_REFS points: building and walking a tree costs more there.
SMALL_PAIRS = 1 << 14
SMALL_REFS = kdtree.knn.BRUTE_REFS


def small(m: int, n: int) -> bool:
    return n <= SMALL_REFS and m * n <= SMALL_PAIRS


@functools.cache
def _plain_search(k: Any, alias: str) -> Any:
    """The Aggregation of a plain search (nothing to aggregate), made once per kernels and
    device (its ``alias``): a struct costs ~7 us to fill, a tenth of a 100-point kNN call."""
    nothing = cpu_launch.nothing((0, 0), k.T, alias)
    return _launches.struct(k.Aggregation, features=nothing, out=nothing, sigma=1.0, inverse_square=0)


def _knn_aggregate_backward(
    k, query, ref, features, sigma, inverse_square, out, dist, idx, queries, grad, dq, dr, df, needs
):
    m, device = query.shape[0], query.device
    if not any(needs):
        return
    slots = cpu_launch.slots(device, m)
    r_slots, f_slots = cpu_launch.thread_copies(dr, slots, needs[1]), cpu_launch.thread_copies(df, slots, needs[2])
    fours = _launches.in_fours(features, grad, df if needs[2] else None, f_slots if needs[2] and slots > 1 else None)
    nearest = _launches.struct(k.Nearest, sigma=sigma, inverse_square=inverse_square, out=out, dist=dist, idx=idx)
    grads = _launches.struct(
        k.Grads, d_query=dq, d_ref=dr, d_features=df, d_features4=fours[2], ref_slots=r_slots,
        feature_slots=f_slots, feature_slots4=fours[3],
    )  # fmt: skip
    before = [query, ref, _launches.struct(k.Rows, v=features, v4=fours[0]), nearest]
    before += [_launches.struct(k.Rows, v=grad, v4=fours[1]), _launches.needs_bits(needs), queries]
    cpu_launch.launch_queries(k.knn_aggregate_backward, m, slots, before, [grads], device, None, scatter=True)
    cpu_launch.add_copies(r_slots, dr)
    cpu_launch.add_copies(f_slots, df)


def _knn_dims(query, ref, query_batch, ref_batch, k):
    return {"dist": (query[0], k), "idx": (query[0], k), "count": (query[0],), "queries": (query[0],)}


def _knn_aggregate_dims(query, ref, features, query_batch, ref_batch, k, *sigma):
    return {"out": (query[0], features[1]), "dist": (query[0], k), "idx": (query[0], k), "queries": (query[0],)}


_KNN = dict(num_outputs=4, aux=("queries",), output_dims=_knn_dims)
_KNN_AGGREGATE = dict(num_outputs=4, aux=("dist", "idx", "queries"), output_dims=_knn_aggregate_dims)


@functools.cache
def declared(dtype: str, dim: int = 3) -> dict:
    """The kNN ops' launch functions and ``wb.op`` options for one float type and points of
    ``dim`` coordinates, by name (see ``_launches.declared``)."""
    T, Points, Rows, Index, Neighbours, Batch = _launches.types_of(dtype, dim)
    Counts = Batch

    kernels = functools.partial(_tree.kernels_for, dtype, dim=dim)  # kernels(device)

    def knn(
        query: Points, ref: Points, query_batch: Batch, ref_batch: Batch, k: int, dist: Rows, idx: Neighbours,
        count: Counts, queries: Index,
    ):  # fmt: skip
        batch = _tree.forest_of("knn", query_batch, ref_batch)
        knn_forward(kernels(query.device), query, ref, k, dist, idx, queries, batch, count)

    def knn_backward(
        query: Points, ref: Points, query_batch: Batch, ref_batch: Batch, k: int, dist: Rows, idx: Neighbours,
        count: Counts, queries: Index,
        adj_dist: Rows, adj_query: Points, adj_ref: Points, *, needs_input_grad,
    ):  # fmt: skip
        k_, rows = kernels(query.device), [query, ref, idx, adj_dist]
        _launches.distance_backward(k_, k_.knn_backward, rows, queries, adj_query, adj_ref, needs_input_grad)

    def knn_aggregate(
        query: Points, ref: Points, features: Rows, query_batch: Batch, ref_batch: Batch, k: int, sigma: T,
        out: Rows, dist: Rows, idx: Neighbours, queries: Index,
    ):  # fmt: skip
        batch = _tree.forest_of("knn_aggregate", query_batch, ref_batch)
        weights = dict(features=features, out=out, sigma=sigma, inverse_square=0)
        knn_forward(kernels(query.device), query, ref, k, dist, idx, queries, batch, aggregation=weights)

    def knn_aggregate_backward(
        query: Points, ref: Points, features: Rows, query_batch: Batch, ref_batch: Batch, k: int, sigma: T,
        out: Rows, dist: Rows, idx: Neighbours, queries: Index,
        adj_out: Rows, adj_query: Points, adj_ref: Points, adj_features: Rows, *, needs_input_grad,
    ):  # fmt: skip
        _knn_aggregate_backward(
            kernels(query.device), query, ref, features, sigma, 0, out, dist, idx, queries, adj_out,
            adj_query, adj_ref, adj_features, needs_input_grad,
        )  # fmt: skip

    # knn_interpolate: knn_aggregate with PyG's inverse-square weights (pos_y the queries,
    # pos_x the references, x their features)
    def knn_interpolate(
        query: Points, ref: Points, features: Rows, query_batch: Batch, ref_batch: Batch, k: int,
        out: Rows, dist: Rows, idx: Neighbours, queries: Index,
    ):  # fmt: skip
        batch = _tree.forest_of("knn_interpolate", query_batch, ref_batch, ("batch_y", "batch_x"))
        weights = dict(features=features, out=out, inverse_square=1)
        knn_forward(kernels(query.device), query, ref, k, dist, idx, queries, batch, aggregation=weights)

    def knn_interpolate_backward(
        query: Points, ref: Points, features: Rows, query_batch: Batch, ref_batch: Batch, k: int,
        out: Rows, dist: Rows, idx: Neighbours, queries: Index,
        adj_out: Rows, adj_query: Points, adj_ref: Points, adj_features: Rows, *, needs_input_grad,
    ):  # fmt: skip
        _knn_aggregate_backward(
            kernels(query.device), query, ref, features, 1.0, 1, out, dist, idx, queries, adj_out,
            adj_query, adj_ref, adj_features, needs_input_grad,
        )  # fmt: skip

    return dict(
        knn=dict(_KNN, fn=knn, backward=knn_backward),
        knn_aggregate=dict(_KNN_AGGREGATE, fn=knn_aggregate, backward=knn_aggregate_backward),
        knn_interpolate=dict(_KNN_AGGREGATE, fn=knn_interpolate, backward=knn_interpolate_backward),
    )
