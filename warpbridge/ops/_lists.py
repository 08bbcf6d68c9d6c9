"""Neighbour lists and graphs: radius lists in CSR form, and PyG's ``edge_index`` graphs.

See ``docs/pyg.md`` for the conventions and what differs from ``torch_cluster``.
"""

from __future__ import annotations

import functools
import numbers
from typing import Any, NamedTuple

from .._core.errors import describe, fail
from . import _knn_launches, _list_launches
from ._checks import adapter_of, batches, check_clouds, k_of, positive
from ._op_table import declared_op, size_on_host, widen

# The most pairs one list may hold: the kernels address its rows with 32-bit places.
MAX_PAIRS = (1 << 31) - 1


class Neighbors(NamedTuple):
    """Radius neighbour lists, CSR over the queries: query ``i``'s neighbours are
    ``index[ptr[i]:ptr[i + 1]]``, at ``distance[ptr[i]:ptr[i + 1]]``, nearest first (ties by
    the smaller index)."""

    index: Any  #: (E,) int64 reference indices
    distance: Any  #: (E,) distances, differentiable w.r.t. both point sets
    ptr: Any  #: (M + 1,) int64 row offsets
    count: Any  #: (M,) int64 neighbours within the radius of each query, before any cap


def radius(
    query: Any,
    ref: Any,
    radius: float,
    *,
    query_batch: Any = None,
    ref_batch: Any = None,
    max_neighbors: int | None = None,
    loop: bool = True,
) -> Neighbors:
    """Every reference point within ``radius`` of each query point, as lists.

    Args:
        query: (M, D) query points, D from 1 to 4096 (3-D is the fastest path; past 16, an
            exact brute force per cloud).
        ref: (N, D) reference points, same D, dtype and device.
        radius: search radius, > 0 (a point at exactly ``radius`` is in).
        query_batch, ref_batch: (M,) and (N,) int64 cloud numbers, sorted (PyG's batch
            vectors): each query's neighbours come from its own cloud only. None (default):
            one cloud. See ``docs/batches.md``.
        max_neighbors: keep only the closest this many per query (ties by the smaller index);
            ``count`` still says how many there were. None (default): keep all.
        loop: False leaves out the pair ``j == i`` (for ``query`` and ``ref`` the same cloud).

    Returns:
        :class:`Neighbors` ``(index, distance, ptr, count)``. ``distance`` is differentiable
        w.r.t. ``query`` and ``ref`` (0 where two points coincide).

    Raises:
        WarpBridgeError: wrong types, shapes, dtypes or devices; radius not > 0;
            max_neighbors not a positive int; the call traced (``jax.jit``), where the
            number of pairs cannot be read.

    Example::

        nb = wb.ops.radius(points, points, 0.05, loop=False)
        mean_dist = torch.segment_reduce(nb.distance, "mean", offsets=nb.ptr)
    """
    batch = {"query_batch": query_batch, "ref_batch": ref_batch}
    counted = _count("radius", query, ref, radius, max_neighbors, loop, batch)
    edges, distance = _fill(counted, _pairs("radius", counted.adapter, counted.ptr))
    return Neighbors(edges[0], distance, counted.ptr, counted.count)


def radius_graph(x: Any, r: float, *, batch: Any = None, loop: bool = False, max_neighbors: int | None = None) -> Any:
    """The radius graph of a point cloud as PyG's ``edge_index``: (2, E) int64, row 0 the
    neighbour ``j`` (source), row 1 the centre ``i`` (target), for every pair within ``r``;
    grouped by centre, nearest first.

    Args:
        x: (N, D) points, D from 1 to 4096 (past 16, an exact brute force per cloud).
        r: radius, > 0.
        batch: (N,) int64 cloud numbers, sorted (PyG's batch vector): edges only within a
            cloud. None (default): one cloud.
        loop: whether each point is its own neighbour (default: no).
        max_neighbors: keep only the closest this many per point; None (default): all.

    Raises:
        WarpBridgeError: as :func:`radius`.

    Example::

        edge_index = wb.ops.radius_graph(pos, r=0.1)
    """
    counted = _count("radius_graph", x, x, r, max_neighbors, loop, {"batch": batch})
    return _fill(counted, _pairs("radius_graph", counted.adapter, counted.ptr))[0]


def knn_graph(x: Any, k: int, *, batch: Any = None, loop: bool = False) -> Any:
    """The k-nearest-neighbour graph of a point cloud as PyG's ``edge_index``: (2, E) int64,
    row 0 the neighbour ``j`` (source), row 1 the centre ``i`` (target); point ``i``'s edges
    contiguous, nearest first (ties by the smaller index). With ``loop=False`` a point is not
    its own neighbour, duplicates of it are. Every point has ``min(k, points of its cloud -
    1)`` edges (``- 0`` with ``loop=True``), as ``torch_cluster.knn_graph``: a short cloud
    gives fewer, a point that is not finite none, and is nobody's neighbour. No index is
    ever -1. The number of edges is read on the host, as for :func:`radius_graph`.

    Args:
        x: (N, D) points, D from 1 to 4096 (past 16, an exact brute force per cloud: DGCNN's
            feature-space graphs).
        k: neighbours per point, ``k >= 1``; more than a cloud has gives what it has.
        batch: (N,) int64 cloud numbers, sorted (PyG's batch vector): neighbours only within
            a cloud. None (default): one cloud.
        loop: whether each point may be its own neighbour (default: no).

    Raises:
        WarpBridgeError: wrong types, shapes or dtypes; k < 1; under ``jax.jit`` (the number
            of edges depends on the data: use :func:`knn` with its ``count`` there).

    Example::

        edge_index = wb.ops.knn_graph(pos, k=16)
    """
    op = "knn_graph"
    a = adapter_of(op, {"x": x}, {"batch": batch})
    dtype = check_clouds(op, a, {"x": x})
    skip_self = _skip_self(op, loop)
    n = a.info(x)[1][0]
    k = min(k_of(op, k, 0), n)  # no point has more neighbours than the cloud has points (0: no (M, k) array)
    if n * _list_launches.graph_width(n, k, skip_self) > MAX_PAIRS:
        raise fail(op, f"N * k = {n * k:,} edges, more than one graph holds ({MAX_PAIRS:,}, 32-bit places)")
    clouds = batches(op, a, {"x": x}, {"batch": batch})
    args, ops, _ = widen(op, a, {"x": x}, dtype)
    instead = " (a fixed-size graph: knn(x, x, k + 1) and its count)"
    if not clouds and _small(a, args * 2, ops, "knn_graph_small"):  # one op, one launch
        ptr, flat = ops.knn_graph_small(*args, k, skip_self)
        n_edges = _pairs(op, a, ptr, instead)
        return flat[: 2 * n_edges].reshape(2, n_edges)
    idx, ptr = declared_op(ops, "knn_graph_search", clouds)(*args, *clouds, k, skip_self)
    n_edges = _pairs(op, a, ptr, instead)
    return declared_op(ops, "knn_graph_fill", clouds)(idx, ptr, skip_self, n_edges)


class _Counted(NamedTuple):
    """A radius list's first op done: what its second op takes, and the row offsets whose
    last entry is the number of pairs."""

    op: str
    adapter: Any
    args: list
    clouds: list
    ops: Any
    half: Any
    radius: float
    cap: int
    skip_self: int
    count: Any
    ptr: Any
    order: Any
    queries: Any
    listed: Any
    small: tuple | None = None  # (distance or None for a graph, edges) of a small cloud's lists, padded (see _small)


def _count(op: str, query: Any, ref: Any, r: Any, max_neighbors: Any, loop: Any, batch: dict) -> _Counted:
    """The checks and the counting op of the radius lists; ``batch``: the batch vectors by name
    (query_batch and ref_batch, or a graph's one batch)."""
    arrays = {"query": query, "ref": ref} if op == "radius" else {"x": query}
    a = adapter_of(op, arrays, batch)
    dtype = check_clouds(op, a, arrays)
    clouds = batches(op, a, arrays, batch)
    clouds = clouds * 2 if len(clouds) == 1 else clouds
    r = positive(op, "radius" if op == "radius" else "r", r, dtype)
    cap = _cap(op, max_neighbors)
    skip_self = _skip_self(op, loop)
    args, ops, half = widen(op, a, arrays, dtype)
    args = args * 2 if len(args) == 1 else args
    if not clouds and _small(a, args, ops):
        if op == "radius_graph":  # its edges alone
            ptr, edges = ops.radius_graph_small(args[0], r, cap, skip_self)
            return _Counted(
                op, a, args, clouds, ops, half, r, cap, skip_self, None, ptr, None, None, None, (None, edges)
            )
        count, ptr, distance, edges = ops.radius_small(*args, r, cap, skip_self)
        return _Counted(
            op, a, args, clouds, ops, half, r, cap, skip_self, count, ptr, None, None, None, (distance, edges)
        )
    count, ptr, order, queries, listed = declared_op(ops, "radius_count", clouds)(*args, *clouds, r, cap, skip_self)
    return _Counted(op, a, args, clouds, ops, half, r, cap, skip_self, count, ptr, order, queries, listed)


def _small(a: Any, args: list, ops: Any, name: str = "radius_small") -> bool:
    """Whether one cloud's lists (or kNN graph) are made by comparing each query with every
    reference, in one op ``name`` and one launch (``kdtree.lists.small_lists``,
    ``knn_graph_small``), on the CPU and outside a compiler: padded to the most there can be
    per query, the pairs read on the host then cut them."""
    if a.compiling():  # one path for every size: a compiler would guard on the sizes, and compile both
        return False
    _, (m, _), device = a.info(args[0])
    n = m if args[1] is args[0] else a.info(args[1])[1][0]
    return device == "cpu" and hasattr(ops, name) and _knn_launches.small(m, n)


def _pairs(op: str, adapter: Any, ptr: Any, instead: str = "") -> int:
    """The number of pairs, the last of the row offsets ``ptr``, read on the host (under
    ``torch.compile``, a symbolic size). Each public function calls this itself: a compiler
    that breaks its graph there resumes in that function, whose constants never change,
    rather than in a helper shared by all. ``instead``: what to call under a tracer."""
    refuse = functools.partial(_too_many, op)
    return size_on_host(op, adapter, ptr, MAX_PAIRS, refuse, "the number of neighbour pairs", instead)


def _fill(c: _Counted, n_pairs: int) -> tuple:
    """(edges (2, E), distance) of the radius lists."""
    if c.small is not None:  # the flat edges' first 2 E entries are the (2, E) graph
        distance, edges = c.small[0], c.small[1][: 2 * n_pairs].reshape(2, n_pairs)
        if distance is None:  # a graph's
            return edges, None
        return edges, (c.adapter.cast(distance[:n_pairs], c.half) if c.half else distance[:n_pairs])
    fill = declared_op(c.ops, "radius_list", c.clouds)
    distance, edges = fill(
        *c.args, *c.clouds, c.ptr, c.order, c.queries, c.listed, c.radius, c.skip_self, c.cap, n_pairs
    )
    return edges, (c.adapter.cast(distance, c.half) if c.half else distance)


def _too_many(op: str, n_pairs: int) -> Exception:
    return fail(
        op,
        f"{n_pairs:,} neighbour pairs found, more than one list holds ({MAX_PAIRS:,}, 32-bit places): "
        "pass max_neighbors, a smaller radius, or fewer queries per call",
    )


def _cap(op: str, max_neighbors: Any) -> int:
    """The cap on a row; one no row can reach (``2**31``, ``sys.maxsize``) is no cap."""
    if max_neighbors is None:
        return _list_launches.NO_CAP
    if isinstance(max_neighbors, bool) or not isinstance(max_neighbors, numbers.Integral) or max_neighbors < 1:
        raise fail(op, f"'max_neighbors' must be None (no cap) or a positive int, got {describe(max_neighbors)}")
    return min(int(max_neighbors), _list_launches.NO_CAP)


def _skip_self(op: str, loop: Any) -> int:
    if not isinstance(loop, bool):
        raise fail(op, f"'loop' must be True or False, got {describe(loop)}")
    return 0 if loop else 1
