"""Warp kernels for the point-cloud ops: a kd-tree, radius and kNN searches over it, and
hand-written adjoints.

Why hand-written: Warp's generated adjoint does not replay dynamic loops (a neighbour search is
one), so values computed inside them are gone when the adjoint runs; that is why the
tutorial's kernel gets zero feature gradients. These adjoints are derived by hand and proven
against float64 references in ``tests/test_points.py``. No kernel here has a Warp adjoint
(``enable_backward=False``), which also halves compile time.

The search structure is a balanced kd-tree with an implicit layout, so that its size and
shape follow from the point count alone (no host synchronisation on CUDA, and the adapters
can allocate it up front). Node ``1`` is the root, node ``c`` has children ``2c`` and
``2c + 1``, and the ``2**depth`` leaves hold 11 to 22 points each. A node at level ``l``
holds the points ``[floor(i N / 2**l), floor((i + 1) N / 2**l))`` of the permuted point
array: every split is a median split along the widest axis of a sample of the node's points
(on the CPU a quickselect per node, in a per-thread scratch of records once a subtree fits
there, see ``tree_subtrees``; on CUDA every level at once, by two stable radix sorts of all
points, see ``by_sort``), so the tree's depth is ``log2(N / 22)`` on any data.
Outliers, clusters, surfaces and lines only change the boxes, never the depth or the memory.
Each node keeps the exact bounding box of its points and the smallest original index among
them.

Searches are depth-first: the radius passes share one walk whose state is a node
(``geometry.ball_first``/``ball_next``, native), the kNN search keeps the farther child on a stack. A node is skipped only when no point in it
can matter: its squared distance is certainly beyond the bound (a relative margin covers the
rounding of squares, so no square root is needed), or, for kNN, its distance is exactly at
the k-th and all its indices are larger (ties go to the smaller index, which keeps duplicated
points fast); in the normal range sqrt(dot(g, g)) of a box gap never exceeds that of a point
difference inside (rounding is monotone). Distances whose squares over- or underflow are
computed scaled (``norm``).

Points that are not finite are stored as (+inf, +inf, +inf): they sort to the end and are
nobody's neighbour.

Every per-query kernel takes ``stride`` and ``offset`` and handles queries
``tid * stride + offset``: on the CPU, where a Warp kernel runs on one thread, warpbridge
launches one share per thread (ctypes launches release the GIL). The searches and their
backwards map that place to a query through ``queries`` (``geometry.query_at``): Morton order for many
queries (``morton.query_keys``), which keeps each search's nodes in cache for the next. Passes that
add into gradients (scatter launches: thread ``t`` owns the places ``t, t + threads, ...``
and ``offset`` is ``t``) let thread 0 add into the gradient itself and thread ``t > 0`` into
``*_slots[t - 1]``, zeroed copies summed in thread order afterwards, so results are
deterministic on the CPU without atomics contending.

The files split by concern: ``dtypes`` (the float types and structs), ``geometry`` (distances,
boxes, the walk), ``rows`` (feature-row arithmetic), ``partition`` and ``build`` (the tree), ``by_sort`` (CUDA's level splits by sorting),
``morton`` (the queries' Morton order), ``weights`` (the aggregations' weights), ``radius`` and ``knn`` (the searches and their
backwards), ``lists`` (radius neighbour lists, kNN graphs). Each function is written once and compiled per float type (``template``).
"""

import functools
from typing import Any

import warp as wp

from . import (
    brute,
    build,
    by_sort,
    cells,
    dtypes,
    geometry,
    knn,
    lists,
    morton,
    partition,
    radius,
    rows,
    sampling,
    sort,
    weights,
)
from .template import instantiate

# The most points per leaf: the fewest levels that leave at most this many, so 11 to 22 per
# leaf. Against 16 (8 to 16 per leaf), kNN took 1.60 -> 1.54 ms at 10^4 points, 3.28 -> 3.19
# at 2 * 10^4 and 1.88 -> 1.81 s at 10^7, where 16 left 10 points per leaf; the radius op the
# same (10^4: 2.89 ms either way, 10^7: 3.8 s); at 10^5 and 10^6 the two give the same tree.
LEAF_SIZE = 22
MORTON_BITS = morton.MORTON_BITS
QUERY, REF, FEATURES, ONE_PASS = knn.QUERY, knn.REF, knn.FEATURES, radius.ONE_PASS
_MODULES = (geometry, rows, partition, build, by_sort, morton, weights, knn, radius, sort, lists, sampling)


@functools.cache
def kernels(scalar: Any, dim: int = 3) -> Any:
    """Every kd-tree function and kernel for one float type (wp.float32 or wp.float64) and
    points of ``dim`` coordinates, in one Warp module, with the types they take, as
    attributes."""
    real = "wp::float32" if scalar is wp.float32 else "wp::float64"
    names = dtypes.names(scalar, dim)
    module = dtypes.module_name(scalar, dim)
    scope = instantiate(_MODULES, names, module, {"REAL": real, "NDIM": str(dim)})
    return _Kernels(module=module, **{name: scope[name] for name in _EXPORTED}, **names)


_EXPORTED = (
    "tree_init", "tree_regather", "tree_leaf_boxes", "tree_split", "tree_gather", "forest_axes", "forest_keys", "forest_node_keys", "tree_subtrees",
    "forest_trees", "forest_boxes",
    "tree_up", "tree_top", "query_box", "query_keys", "radius_forward", "radius_backward_query", "radius_backward_ref",
    "pair_counts", "pairs_by_ref", "radius_backward_ref_pairs", "knn_search", "knn_small", "knn_backward",
    "knn_aggregate_backward", "radius_small", "radius_count", "list_offsets", "capped_counts", "radius_fill", "list_backward", "knn_edge_counts",
    "knn_edges", "knn_graph_small", "fps_clouds", "fps_clouds_tiled",
)  # fmt: skip


ROW_MODULES = (weights, brute)  # the brute force's code, by module
ROW_KERNELS = (
    "rows_knn", "rows_radius_count", "rows_radius_fill", "rows_transpose", "rows_aggregate",
    "rows_knn_backward", "rows_list_backward", "rows_aggregate_backward",
)  # fmt: skip


@functools.cache
def row_kernels(scalar: Any) -> Any:
    """The brute-force kNN and radius kernels over plain (M, D) rows (``brute``), for any D, in a module
    of their own per float type."""
    real = "wp::float32" if scalar is wp.float32 else "wp::float64"
    module = f"warpbridge_rows_{scalar.__name__}"
    scope = instantiate(ROW_MODULES, {"T": scalar}, module, {"REAL": real})
    return _Kernels(module=module, T=scalar, **{n: scope[n] for n in ROW_KERNELS})


@functools.cache
def cell_kernels() -> Any:
    """The cell list's kernels (``cells``), float64, in a module of their own."""
    module = "warpbridge_cells"
    scope = instantiate((cells,), {"T": wp.float64}, module, {})
    return _Kernels(
        module=module,
        Grid=cells.Grid,
        vec3l=cells.vec3l,
        **{n: scope[n] for n in ("frac_extent", "atoms_to_bins", "pair_count", "pair_fill", "pair_run")},
    )


class _Kernels:
    def __init__(self, **kw: Any):
        self.__dict__.update(kw)
