"""The point ops' forward and backward, once, for every framework.

Each function takes a framework description ``fw`` (see :class:`Framework`) and that
framework's arrays, allocates what it needs through ``fw`` and returns framework arrays.
The PyTorch custom ops, the Paddle PyLayers and the JAX callables are thin wrappers around
these functions.
"""

from __future__ import annotations

from typing import Any, Protocol

import warp as wp

from . import _core, _kernels

STATS = 3  # per query: weight sum, nearest distance, neighbour count
# The CPU radius backward records its neighbour pairs while they fit in this many per point
# (beyond, e.g. a radius spanning the whole cloud, it searches from both sides instead).
PAIRS_PER_POINT = 64


class Framework(Protocol):
    """What a framework provides to the runners (one instance per call)."""

    kernels: Any  # _kernels.kernels(T) for the points' dtype
    device: Any  # wp.Device
    stream: Any  # wp.Stream or None
    dtype: str  # "float32" or "float64"

    def empty(self, shape: tuple, dtype: str) -> Any: ...
    def zeros(self, shape: tuple, dtype: str) -> Any: ...
    def warp(self, a: Any, vec3: bool = False) -> wp.array: ...
    def fold(self, slots: Any) -> Any: ...  # sum over the leading (slot) dim, in a fixed order


def tree_shapes(n: int, dtype: str) -> list[tuple[tuple, str]]:
    """Shapes and dtypes of the kd-tree's arrays over ``n`` points (see ``_kernels``)."""
    nodes = _kernels.tree_nodes(n)
    return [((n,), "int32"), ((n, 3), dtype), ((nodes, 3), dtype), ((nodes, 3), dtype), ((nodes,), "int32")]


def tree(fw: Framework, points: Any, n: int) -> tuple:
    """The kd-tree over ``points``, in arrays from ``fw`` (saved for the backward)."""
    order, sorted_points, lo, hi, min_index = (fw.empty(s, d) for s, d in tree_shapes(n, fw.dtype))
    w = fw.warp
    _core.build_tree(
        fw.kernels,
        w(points, True),
        (w(order), w(sorted_points, True), w(lo, True), w(hi, True), w(min_index)),
        fw.device,
        fw.stream,
    )
    return order, sorted_points, lo, hi, min_index


def _tree_args(w: Any, g: tuple) -> list:
    order, sorted_points, lo, hi, min_index = g
    return [w(order), w(sorted_points, True), w(lo, True), w(hi, True), w(min_index)]


def _slots(fw: Framework, m: int) -> int:
    # A framework may cap the scatter slots (1: no fold needed)
    return min(_core.slots(fw.device, m), getattr(fw, "max_slots", 1 << 30))


# -- radius_aggregate ----------------------------------------------------------------------------


def radius_forward(
    fw: Framework, query: Any, ref: Any, features: Any, m: int, n: int, f: int, radius: float, sigma: float
):
    """(out (M, F), stats (M, 3): weight sum, nearest distance, neighbour count; *tree)"""
    g = tree(fw, ref, n)
    out = fw.empty((m, f), fw.dtype)
    stats = fw.empty((m, STATS), fw.dtype)
    w = fw.warp
    before = [w(query, True), w(features), *_tree_args(w, g), radius, sigma]
    _core.launch_queries(fw.kernels.radius_forward, m, _slots(fw, m), before, [w(out), w(stats)], fw.device, fw.stream)
    return (out, stats, *g)


def radius_backward(fw, grad, query, ref, features, out, stats, g, m, n, f, radius, sigma, needs):
    """(d_query (M, 3) or (0, 3), d_ref (N, 3) or (0, 3), d_features (N, F) or (0, F))"""
    dq = fw.empty((m, 3) if needs[0] else (0, 3), fw.dtype)
    dr = fw.empty((n, 3) if needs[1] else (0, 3), fw.dtype)
    df = fw.empty((n, f) if needs[2] else (0, f), fw.dtype)
    if not any(needs):
        return dq, dr, df
    w = fw.warp
    g_out = fw.empty((m,), fw.dtype)
    k = fw.kernels
    pairs = _pair_count(fw, stats, m) if fw.device.is_cpu and (needs[1] or needs[2]) else None
    if pairs is not None and pairs[0] > PAIRS_PER_POINT * (m + n) + (1 << 16):
        pairs = None  # too many to record: search from the reference side instead
    n_pairs, offsets = pairs if pairs is not None else (0, fw.empty((0,), "int32"))
    pq, pr = fw.empty((n_pairs,), "int32"), fw.empty((n_pairs,), "int32")
    pp, pc = fw.empty((n_pairs,), fw.dtype), fw.empty((n_pairs,), fw.dtype)
    before = [w(query, True), w(features), *_tree_args(w, g)]
    before += [radius, sigma, w(out), w(stats), w(grad), int(needs[0]), int(needs[1]), w(offsets)]
    after = [w(g_out), w(dq, True), w(pq), w(pr), w(pp), w(pc)]
    _core.launch_queries(k.radius_backward_query, m, _slots(fw, m), before, after, fw.device, fw.stream)
    if pairs is not None:
        ref_starts, cursor = fw.empty((n + 1,), "int32"), fw.empty((max(n, 1),), "int32")
        by_ref = fw.empty((n_pairs,), "int32")
        wp.launch(k.pairs_by_ref, dim=1, inputs=[w(pr), n, w(ref_starts), w(cursor), w(by_ref)], device=fw.device)
        before = [w(query, True), w(ref, True), w(grad), w(ref_starts), w(by_ref), w(pq), w(pp), w(pc)]
        before += [int(needs[1]), int(needs[2])]
        after = [w(dr, True), w(df)]
        _core.launch_queries(k.radius_backward_ref_pairs, n, _slots(fw, n), before, after, fw.device, fw.stream)
    elif needs[1] or needs[2]:
        # The reference side gathers over the queries within the radius: a tree over them.
        qg = tree(fw, query, m)
        before = [w(ref, True), w(features), *_tree_args(w, qg)]
        before += [radius, sigma, w(stats), w(grad), w(g_out), int(needs[1]), int(needs[2])]
        _core.launch_queries(
            k.radius_backward_ref, n, _slots(fw, n), before, [w(dr, True), w(df)], fw.device, fw.stream
        )
    return dq, dr, df


def _pair_count(fw: Framework, stats: Any, m: int) -> tuple[int, Any]:
    """(number of neighbour pairs, exclusive offsets (M + 1,)) from the forward's counts.
    CPU only: reading the total is free there (on CUDA it would synchronise)."""
    counts = fw.zeros((m + 1,), "int32")
    offsets = fw.empty((m + 1,), "int32")
    w = fw.warp
    if m:
        wp.launch(fw.kernels.pair_counts, dim=m, inputs=[w(stats), w(counts)], device=fw.device)
    wp.utils.array_scan(w(counts), w(offsets), inclusive=False)
    return int(w(offsets).numpy()[m]), offsets


# -- knn ------------------------------------------------------------------------------------------


def knn_forward(fw, query, ref, m, n, k, features=None, f=0, sigma=1.0):
    """(dist (M, k), idx (M, k) int64, out (M, F) or (0, 0)): the search, and the aggregation
    fused into it when ``features`` is given."""
    g = tree(fw, ref, n)
    dist = fw.empty((m, k), fw.dtype)
    idx = fw.empty((m, k), "int64")
    if features is None:
        features, out = fw.empty((0, 0), fw.dtype), fw.empty((0, 0), fw.dtype)
    else:
        out = fw.empty((m, f), fw.dtype)
    w = fw.warp
    wf, wo = w(features), w(out)
    before = [w(query, True), *_tree_args(w, g), k, wf, _groups_of_4(wf), sigma]
    after = [w(dist), w(idx), wo, _groups_of_4(wo)]
    _core.launch_queries(fw.kernels.knn_search, m, _slots(fw, m), before, after, fw.device, fw.stream)
    return dist, idx, out


_VEC4 = {wp.float32: wp.vec4f, wp.float64: wp.vec4d}


def _groups_of_4(a: wp.array) -> wp.array:
    """A contiguous (R, F) array seen as (R, F / 4) vectors of 4; empty unless F % 4 == 0."""
    v4 = _VEC4[a.dtype]
    rows, f = a.shape
    if f == 0 or f % 4 or rows == 0 or a.strides[1] != wp.types.type_size_in_bytes(a.dtype):
        return wp.empty((0, 0), dtype=v4, device=a.device)
    return wp.array(
        ptr=a.ptr, dtype=v4, shape=(rows, f // 4), strides=(a.strides[0], 4 * a.strides[1]), device=a.device
    )


def knn_backward(fw, grad, query, ref, idx, m, n, needs):
    s = _slots(fw, m)
    dq = fw.zeros((m, 3) if needs[0] else (0, 3), fw.dtype)
    dr = fw.zeros((s, n, 3) if needs[1] else (1, 0, 3), fw.dtype)
    if any(needs):
        w = fw.warp
        before = [w(query, True), w(ref, True), w(idx), w(grad), int(needs[0]), int(needs[1])]
        _core.launch_queries(
            fw.kernels.knn_backward, m, s, before, [w(dq, True), w(dr, True)], fw.device, fw.stream, scatter=True
        )
    return dq, fw.fold(dr)


def knn_aggregate_backward(fw, grad, query, ref, features, dist, idx, out, m, n, f, sigma, needs):
    s = _slots(fw, m)
    dq = fw.zeros((m, 3) if needs[0] else (0, 3), fw.dtype)
    dr = fw.zeros((s, n, 3) if needs[1] else (1, 0, 3), fw.dtype)
    df = fw.zeros((s, n, f) if needs[2] else (1, 0, f), fw.dtype)
    if any(needs):
        w = fw.warp
        before = [w(query, True), w(ref, True), w(features), w(dist), w(idx), sigma, w(out), w(grad)]
        before += [int(needs[0]), int(needs[1]), int(needs[2])]
        after = [w(dq, True), w(dr, True), w(df)]
        _core.launch_queries(fw.kernels.knn_aggregate_backward, m, s, before, after, fw.device, fw.stream, scatter=True)
    return dq, fw.fold(dr), fw.fold(df)
