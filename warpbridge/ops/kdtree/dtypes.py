"""The kd-tree code's types for one float type, and the float32 ones as module globals.

No ``from __future__ import annotations`` here: ``wp.struct`` evaluates the fields'
annotations, which name the float type's vectors, made inside ``names``.
"""

import ctypes
import functools
from typing import Any

import warp as wp

STACK = 32  # the kNN search's stack: deeper than any tree of int32-indexed points (depth <= 28)
SAMPLE = 15  # keys sampled to choose a quickselect pivot (odd)


@functools.cache
def names(scalar: Any, dim: int = 3) -> dict:
    """``T`` (the float), ``DIM`` (the points' dimension), ``V`` (a point), ``V4`` (feature
    rows seen as groups of 4), the quickselect sample's vectors, and the structs the kernels
    take."""
    T = scalar
    V = wp.types.vector(dim, T)
    V4 = wp.types.vector(4, T)
    module = module_name(scalar, dim)

    def struct(cls: type) -> Any:
        cls.__qualname__ = f"{cls.__name__}_{T.__name__}"
        return wp.struct(cls, module=module)

    class Item:
        # A point and its original index in one record (16 bytes; 32 in float64): the CPU
        # build partitions subtrees in this layout, in a per-thread scratch (partition_items).
        p: V
        i: wp.int32

    class Tree:
        # The kd-tree (see the package's docstring): the points in the tree's order, their
        # original indices, and per node its box and the smallest original index in it.
        # Over a batch of clouds, a forest: per cloud (first place, points, first node,
        # depth) in `clouds`, and the cloud of each point searched for in `batch`; both
        # empty for one cloud (see geometry.cloud_of).
        points: wp.array(dtype=V)
        order: wp.array(dtype=wp.int32)
        lo: wp.array(dtype=V)
        hi: wp.array(dtype=V)
        min_index: wp.array(dtype=wp.int32)
        clouds: wp.array(dtype=wp.vec4i)
        batch: wp.array(dtype=wp.int64)

    class Rows:
        # (M, F) rows, and the same rows seen as (M, F / 4) groups of 4 (empty unless
        # F % 4 == 0 and the rows are packed: then ~2x faster gathers).
        v: wp.array2d(dtype=T)
        v4: wp.array2d(dtype=V4)

    item = struct(Item)
    size = wp.types.type_size_in_bytes(T)
    if ctypes.sizeof(item.ctype) != (dim * size + 4 + size - 1) // size * size:  # as C lays out p[dim], i
        raise RuntimeError("warpbridge: unexpected layout of the kd-tree build's records")
    return {
        "T": T,
        "DIM": dim,
        "V": V,
        "V4": V4,
        "Sample": wp.types.vector(SAMPLE, T),
        "SampleAt": wp.types.vector(SAMPLE, wp.int32),
        "Item": item,
        "Tree": struct(Tree),
        "Rows": struct(Rows),
        **gradient_structs(T, V, V4, struct),
    }


def module_name(scalar: Any, dim: int) -> str:
    """The Warp module of one float type's and dimension's kd-tree code."""
    return f"warpbridge_points_{scalar.__name__}" + ("" if dim == 3 else f"_{dim}d")


def gradient_structs(T: Any, V: Any, V4: Any, struct: Any) -> dict:
    """The structs of the backward passes' inputs and outputs."""

    class Ball:
        # What the radius forward computed and its backward reads: per query the weight sum,
        # nearest distance and neighbour count (stats), the first neighbours' places in the
        # tree (neighbours), and the output.
        radius: T
        sigma: T
        out: wp.array2d(dtype=T)
        stats: wp.array2d(dtype=T)
        neighbours: wp.array2d(dtype=wp.int32)

    class Nearest:
        # What the kNN forward computed and its backward reads; the weights as Aggregation's.
        sigma: T
        inverse_square: wp.int32
        out: wp.array2d(dtype=T)
        dist: wp.array2d(dtype=T)
        idx: wp.array2d(dtype=wp.int64)

    class Aggregation:
        # What a kNN search aggregates as it goes (knn_aggregate, knn_interpolate): the rows of
        # `features` of the found points into `out`, weighted by softmax(-d / sigma), or with
        # inverse_square by PyG's knn_interpolate weights 1 / max(d^2, 1e-16); `features`
        # empty: a plain search.
        features: wp.array2d(dtype=T)
        out: wp.array2d(dtype=T)
        sigma: T
        inverse_square: wp.int32

    class Pairs:
        # The CPU radius backward's pair list: pair k is (query, ref), with its weight p and
        # its geometry coefficient c; query i's pairs start at offsets[i].
        offsets: wp.array(dtype=wp.int32)
        query: wp.array(dtype=wp.int32)
        ref: wp.array(dtype=wp.int32)
        p: wp.array(dtype=T)
        c: wp.array(dtype=T)

    class Edges:
        # A radius list being filled: edge e is (sources[e], targets[e]) at distance[e] (PyG's
        # rows 0 and 1 of the edge array, as two 1-D arrays: the 2-D array's row stride
        # passes Warp's 32-bit strides from 2^28 edges on).
        sources: wp.array(dtype=wp.int64)
        targets: wp.array(dtype=wp.int64)
        distance: wp.array(dtype=T)
        # The same memory as (E, cap) rows that start at every edge (strides of one element):
        # row s is the cap entries from edge s on, where a capped query's kNN walk writes.
        rows_d: wp.array2d(dtype=T)
        rows_j: wp.array2d(dtype=wp.int64)
        none: wp.array2d(dtype=T)  # empty: a kNN walk's feature rows to prefetch

    class Grads:
        # The gradients a backward pass writes, the per-thread copies of the reference side
        # (ref_slots, feature_slots: thread t > 0 adds into copy t - 1), and g.out per query.
        d_query: wp.array(dtype=V)
        d_ref: wp.array(dtype=V)
        d_features: wp.array2d(dtype=T)
        d_features4: wp.array2d(dtype=V4)
        ref_slots: wp.array2d(dtype=V)
        feature_slots: wp.array3d(dtype=T)
        feature_slots4: wp.array3d(dtype=V4)
        g_out: wp.array(dtype=T)

    return {
        "Ball": struct(Ball), "Nearest": struct(Nearest), "Aggregation": struct(Aggregation), "Pairs": struct(Pairs),
        "Edges": struct(Edges),
        "Grads": struct(Grads),
    }  # fmt: skip


# The float32, 3-D names, for the modules' own annotations (the template rebinds them per
# float type and dimension).
_FLOAT32 = names(wp.float32)
T, DIM, V, V4, Sample, SampleAt, Item, Tree = (
    _FLOAT32[k] for k in ("T", "DIM", "V", "V4", "Sample", "SampleAt", "Item", "Tree")
)
Rows, Ball, Nearest, Aggregation, Pairs, Edges, Grads = (
    _FLOAT32[k] for k in ("Rows", "Ball", "Nearest", "Aggregation", "Pairs", "Edges", "Grads")
)
