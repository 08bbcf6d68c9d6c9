"""The kd-tree on the host: its arrays' shapes, its build, its ``Tree`` struct, the order in
which a search takes its queries, and the forest of one tree per cloud a batched search takes
(``forest_of``). The kernels are ``kdtree``'s; the launches ``_cpu_launch``'s.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import warp as wp

from .._core import warp_runtime
from .._core.errors import fail
from . import _batches, kdtree
from . import _cpu_launch as cpu_launch
from . import _cpu_team as cpu_team

TREE = ("order", "sorted_points", "lo", "hi", "min_index")  # the tree's arrays, as the ops save them
# From this many queries on, the searches take them in Morton order (query_order). Below,
# the keys and the sort (~15 ns a query) cost more than the order saves: on the tutorial's
# 8,000 grid queries, already in order, the radius forward took 4.75 -> 4.9 ms.
QUERY_ORDER_MIN = 16384
# The most records (point and index) a CPU thread packs a subtree into (see tree_subtrees):
# 2**16 (1 MiB in float32) stays in its core's cache.
ITEMS_ROOM = 1 << 16
# The most points one CPU thread builds a subtree of in one go: 2**20 take about 0.1 s.
SUBTREE_MAX = 1 << 20
# Levels of fewer nodes than this merge their boxes in one single-thread launch (tree_top),
# not a launch a level: a merge takes ~5 ns; a launch ~8 us, and two threads on a level's
# interleaved nodes share cache lines. 10^4 points (512 leaves): 9 launches, 64 us -> one,
# 8 us; 10^6 points (65 536 leaves): the levels of 32 768 and 16 384 nodes took ~1 ms, all
# levels in one launch 0.33 ms.
TOP_NODES = 1 << 16


def tree_dims(n: int) -> dict:
    """Warp shapes of the kd-tree's arrays over ``n`` points (see ``kdtree``): the node
    arrays hold ``2 << depth`` entries (index 0 unused), ``depth`` the fewest levels below the
    root that leave at most LEAF_SIZE points per leaf."""
    nodes = 2 << max(0, (-(-n // kdtree.LEAF_SIZE) - 1).bit_length())
    return {"order": (n,), "sorted_points": (n,), "lo": (nodes,), "hi": (nodes,), "min_index": (nodes,)}


class Forest(NamedTuple):
    """A kd-tree per cloud of a ragged batch (see ``_batches.clouds``): per cloud (first
    place, points, first node, depth), the node count, the most points in one cloud, the
    deepest tree's depth."""

    clouds: wp.array
    nodes: int
    biggest: int
    deepest: int


def forest_of(op: str, searched: wp.array, tree_of: wp.array, names: tuple = ("query_batch", "ref_batch")) -> Any:
    """For a search of points with cloud numbers ``searched`` through a tree over points with
    cloud numbers ``tree_of`` (their arguments' ``names``): (the forest over ``tree_of``'s
    clouds, ``searched``), as ``searched_tree`` takes it; None for one cloud (both empty)."""
    if searched.shape[0] == 0 and tree_of.shape[0] == 0:
        return None
    searched_values = _batches.batch_values(op, names[0], searched)
    tree_values = _batches.batch_values(op, names[1], tree_of)
    count = _batches.cloud_count(searched_values, tree_values)
    points = searched_values.size + tree_values.size
    if count > points:  # every cloud costs a row and a root: bounded by the points
        raise fail(
            op,
            f"cloud numbers go up to {count - 1} for {points} points: number the clouds 0, 1, 2, ... as PyG's "
            "batch vectors do (at most one cloud per point)",
        )
    return Forest(*_batches.clouds(tree_values, count, tree_of.device)), searched


def forest_dims(n: int, forest: Forest) -> dict:
    """Warp shapes of a forest's arrays over ``n`` points (``tree_dims``' names)."""
    nodes = (forest.nodes,)
    return {"order": (n,), "sorted_points": (n,), "lo": nodes, "hi": nodes, "min_index": nodes}


def tree(
    k: Any, points: wp.array, into: tuple | None = None, order: wp.array | None = None, forest: Forest | None = None
) -> tuple:
    """The kd-tree over ``points``, or the ``forest`` over their clouds (``into``: its five
    arrays; default: scratch, with the order in ``order`` where given)."""
    if forest is None:
        return build_tree(k, points, into, points.device, None, order=order)
    return build_forest(k, points, into, forest, order=order)


def scratch_tree(k: Any, n: int, device: Any, order: wp.array | None, forest: Forest | None = None) -> tuple:
    """This thread's kept scratch (``cpu_launch.kept``) for the five arrays of a kd-tree, or of
    ``forest``, over ``n`` points; the order in ``order`` where given."""
    dims = tree_dims(n) if forest is None else forest_dims(n, forest)
    types_ = (wp.int32, k.V, k.V, k.V, wp.int32)
    arrays = cpu_launch.kept_each(TREE, [dims[name] for name in TREE], types_, device)
    return arrays if order is None else (order, *arrays[1:])


def searched_tree(
    k: Any,
    points: wp.array,
    ref: wp.array,
    queries: wp.array,
    into: tuple | None = None,
    order: wp.array | None = None,
    batch: tuple[Forest, wp.array] | None = None,
) -> Any:
    """What a search of ``points`` through a kd-tree over ``ref`` takes: the tree (built as
    ``tree`` builds it, ``into`` and ``order`` as there; with ``batch`` = (the forest over
    ``ref``'s clouds, ``points``' cloud numbers), a forest), the order it takes the points in
    (written into ``queries``, see ``query_order``), and the tree's struct."""
    forest = None if batch is None else batch[0]
    arrays = tree(k, ref, into, order, forest)
    struct = tree_struct(k, arrays, batch)
    if forest is not None and not _same(points, ref):
        cpu_launch.minus_ones(queries)  # in the given order, which keeps each cloud's points together
    else:
        query_order(k, points, arrays, queries, points.device, None, ref)
    return struct


def tree_of_order(k: Any, points: wp.array, order: wp.array, forest: Forest | None = None) -> tuple:
    """The kd-tree (or ``forest``) over ``points`` whose order a build already found
    (``order``, as ``tree`` leaves it): the points gathered again and the boxes merged
    bottom-up, without splitting (scratch). The same arrays as the build's, bit for bit, at a
    fraction of its cost."""
    n, device = points.shape[0], points.device
    dims = tree_dims(n) if forest is None else forest_dims(n, forest)
    pts, lo, hi = (cpu_launch.kept(f"{name}_again", dims[name], k.V, device) for name in TREE[1:4])
    min_index = cpu_launch.kept("min_index_again", dims["min_index"], wp.int32, device)
    cpu_launch.launch_queries(
        k.tree_regather, n, cpu_launch.threads(device, n // 32), [points, order], [pts], device, None
    )
    boxes = [lo, hi, min_index]
    if forest is not None:
        count = forest.clouds.shape[0]
        before = [pts, order, forest.clouds]
        cpu_launch.launch_queries(
            k.forest_boxes, count, min(count, cpu_launch.all_threads(device)), before, boxes, device, None, True
        )
        return order, pts, lo, hi, min_index
    leaves = lo.shape[0] // 2
    cpu_launch.launch_queries(
        k.tree_leaf_boxes, leaves, cpu_launch.threads(device, leaves), [pts, order], boxes, device, None
    )
    merge_boxes_up(k, boxes, leaves, device, None)
    return order, pts, lo, hi, min_index


def merge_boxes_up(k: Any, boxes: list, width: int, device: Any, stream: Any) -> None:
    """The boxes (``[lo, hi, min_index]``) of the nodes above the ``width`` nodes from node
    ``width`` on, from theirs: a launch a level while a level has at least TOP_NODES nodes,
    then the rest in one (on CUDA: a launch a level)."""
    while width > 1:
        width //= 2
        if width < TOP_NODES and device.is_cpu:
            cpu_launch.launch_queries(k.tree_top, 1, 1, [2 * width], boxes, device, stream)
            return
        cpu_launch.launch_queries(
            k.tree_up, width, min(width, cpu_launch.all_threads(device)), [width], boxes, device, stream, scatter=True
        )


_STRUCTS = threading.local()  # this thread's last (tree arrays, batch, Tree struct) per module


def tree_struct(k: Any, arrays: tuple, batch: tuple[Forest, wp.array] | None = None) -> Any:
    """The ``Tree`` struct over a tree's five arrays (with ``batch`` as ``searched_tree``
    takes it, over a forest). A struct takes ~7 us to fill, so this thread's last one is
    taken again while its arrays are the same (a kNN call's tree is kept scratch, see
    ``cpu_launch.kept``)."""
    last = getattr(_STRUCTS, k.module, None)
    if last is not None and batch is None and last[1] is None and all(a is b for a, b in zip(last[0], arrays)):
        return last[2]
    order, points, lo, hi, min_index = arrays
    tree = k.Tree()
    tree.points, tree.order, tree.lo, tree.hi, tree.min_index = points, order, lo, hi, min_index
    if batch is not None:
        tree.clouds, tree.batch = batch[0].clouds, batch[1]
    setattr(_STRUCTS, k.module, (arrays, batch, tree))
    return tree


def build_tree(
    k: Any,
    points: wp.array,
    tree: tuple[wp.array, wp.array, wp.array, wp.array, wp.array] | None,
    device: Any,
    stream: Any,
    by_sort: bool | None = None,
    order: wp.array | None = None,
) -> tuple:
    """Build the kd-tree over ``points`` (see ``kdtree``) into ``tree`` = (order (N,) int32,
    sorted points (N,) vec3, box lo (nodes,) vec3, box hi (nodes,) vec3, min index (nodes,)
    int32), with ``nodes`` as ``tree_dims`` gives; None: into ``scratch_tree`` (the order in
    ``order`` where given). Returns the five arrays.

    On the CPU the top levels are split one level per launch (the threads share a level's
    nodes); below, one thread builds each subtree down to its leaves and back up, from nodes
    of at most ITEMS_ROOM points on in its own scratch of (point, index) records (1.35-1.45x
    faster builds, for 2 MiB of scratch); the top levels' boxes are merged last. On CUDA
    (``by_sort``, default: not the CPU) every level is split by sorting all points at once
    (``_split_by_sort``), and one thread per leaf takes its box.
    """
    n = points.shape[0]
    tree = scratch_tree(k, n, device, order) if tree is None else tree
    order, sorted_points, lo, hi, min_index = tree
    depth = lo.shape[0].bit_length() - 2
    if by_sort is None:
        by_sort = not device.is_cpu
    if by_sort:
        top = depth
    else:
        # enough subtrees for every thread (the top splits run one node per thread), each of
        # at most SUBTREE_MAX points (a segment of the launch is one subtree per thread)
        top = max((cpu_launch.num_threads - 1).bit_length(), (-(-n // SUBTREE_MAX) - 1).bit_length())
        top = min(depth, top) if n >= 4 * cpu_launch.MIN_QUERIES_PER_THREAD else 0
    # The copy takes ~2.5 ns a point; a second thread measured 27 -> 20 us at 10^4 points,
    # 0.23 -> 0.12 ms at 10^5. A tree of one subtree copies them in its own launch.
    parts = 1 << top
    copy_in = parts == 1 and not by_sort
    if not copy_in:
        cpu_launch.launch_queries(
            k.tree_init, n, cpu_launch.threads(device, n // 32), [points], [sorted_points, order], device, stream
        )
    cpus = cpu_launch.all_threads(device)
    slots = min(parts, cpus)
    # each subtree thread's row of records (see tree_subtrees): room for a subtree, at most ITEMS_ROOM
    room = 0 if by_sort or n == 0 else min(ITEMS_ROOM, -(-n // parts))
    items = (
        cpu_launch.kept("tree_items", (slots * room,), k.Item, device)
        if room
        else cpu_launch.nothing((0,), k.Item, device.alias)
    )
    before = [sorted_points, order, items]
    if by_sort:
        _split_by_sort(k, sorted_points, order, depth, device, stream)
    else:
        for level in range(top):
            width = 1 << level
            cpu_launch.launch_queries(
                k.tree_split, width, min(width, cpus), [*before, width], [], device, stream, scatter=True
            )
    boxes = [lo, hi, min_index]
    given = points if copy_in else cpu_launch.nothing((0,), points.dtype, device.alias)
    cpu_launch.launch_queries(
        k.tree_subtrees, parts, slots, [given, *before, parts], boxes, device, stream, True, slots
    )
    merge_boxes_up(k, boxes, parts, device, stream)
    return tree


def build_forest(
    k: Any,
    points: wp.array,
    tree: tuple | None,
    forest: Forest,
    by_sort: bool | None = None,
    order: wp.array | None = None,
) -> tuple:
    """Build ``forest`` over ``points`` into ``tree`` (as ``build_tree``'s; None and ``order``
    as there; returns the five arrays). On the CPU one thread per cloud builds its whole tree
    (``kdtree.build.tree_subtrees``), in its own row of records, as ``build_tree``'s
    subtrees. On CUDA (``by_sort``, default: not the CPU) every
    level of every tree is split at once by sorting all points (``_split_by_sort``;
    a thread per tree took 5-7 ms for 16 clouds of 1 024 points on an H200), then one thread
    per cloud takes its boxes."""
    n, device, count = points.shape[0], points.device, forest.clouds.shape[0]
    tree = scratch_tree(k, n, device, order, forest) if tree is None else tree
    order, sorted_points, lo, hi, min_index = tree
    cpu_launch.launch_queries(
        k.tree_init, n, cpu_launch.threads(device, n // 32), [points], [sorted_points, order], device, None
    )
    if by_sort if by_sort is not None else not device.is_cpu:
        _split_by_sort(k, sorted_points, order, forest.deepest, device, None, forest.clouds)
        before = [sorted_points, order, forest.clouds]
        cpu_launch.launch_queries(k.forest_boxes, count, 1, before, [lo, hi, min_index], device, None, True)
        return tree
    slots = min(count, cpu_launch.all_threads(device))
    room = min(ITEMS_ROOM, forest.biggest) if device.is_cpu else 0
    items = (
        cpu_launch.kept("tree_items", (slots * room,), k.Item, device)
        if room
        else cpu_launch.nothing((0,), k.Item, device.alias)
    )
    before = [sorted_points, order, items, forest.clouds]
    cpu_launch.launch_queries(
        k.forest_trees, count, max(slots, 1), before, [lo, hi, min_index], device, None, True, slots
    )
    return tree


def _same(points: wp.array, other: wp.array) -> bool:
    """Whether two arrays are the same points: the same memory, shape and strides."""
    return points.ptr == other.ptr and points.shape == other.shape and points.strides == other.strides


def query_order(
    k: Any, points: wp.array, tree: tuple, order: wp.array, device: Any, stream: Any, tree_of: wp.array
) -> None:
    """Write into ``order`` (M,) int32 the order in which a search takes ``points`` (the
    queries; in the radius backward's second search, the references) through ``tree``, built
    over ``tree_of``. Every point's result is the same in any order.

    - ``points`` are ``tree_of`` itself (a self-join: the same memory, shape and strides):
      the tree's own order. Consecutive searches then start in the same or the next leaf, and
      the order costs a copy: self-kNN measured 1.05-1.11x faster than in the given or Morton
      order (2 048 to 10^5 points).
    - From QUERY_ORDER_MIN points on: Morton order of MORTON_CELLS per axis over the tree's
      points' box trimmed of its extremes (``query_box``, ``query_keys``), by a stable radix
      sort.
    - Otherwise, or over an empty tree: -1 everywhere (each point in its place, see
      ``query_at``)."""
    m = points.shape[0]
    _, sorted_points, lo, hi, _ = tree
    if m and _same(points, tree_of):
        with warp_runtime.on_stream(stream):
            cpu_launch.copy(order, tree[0])
        return
    if m < QUERY_ORDER_MIN or sorted_points.shape[0] == 0:
        cpu_launch.minus_ones(order)
        return
    box = wp.empty(2, dtype=k.V, device=device)
    keys, places = (wp.empty(2 * m, dtype=wp.int32, device=device) for _ in range(2))  # the sort needs 2M
    cpu_launch.launch_queries(k.query_box, 1, 1, [sorted_points, lo, hi], [box], device, stream)
    # ~10 ns a point: a second thread pays only past ~10^4 of them
    cpu_launch.launch_queries(
        k.query_keys, m, cpu_launch.threads(device, m // 16), [points, box], [keys, places], device, stream
    )
    with warp_runtime.on_stream(stream):
        wp.utils.radix_sort_pairs(keys, places, m, 0, 3 * kdtree.MORTON_BITS)
        wp.copy(order, places, count=m)


def _split_by_sort(
    k: Any, pts: wp.array, order: wp.array, levels: int, device: Any, stream: Any, clouds: wp.array | None = None
) -> None:
    """Split ``levels`` levels of the tree, each by two stable radix sorts of all N points:
    by the coordinate along their node's axis, then by node (see ``kdtree.by_sort``). A
    quickselect per node would leave the top levels to a few GPU threads, each walking up to
    N points; the sorts keep the whole device busy at every level, for O(N) scratch. With
    ``clouds`` (a forest's table, ``levels`` its deepest tree's depth) every tree of a forest
    at once: each level's nodes are numbered across the forest (cloud c's from c * 2**level
    on; a tree split to its leaves is one node whose points keep their places); without,
    the tree is a forest of one cloud."""
    n = pts.shape[0]
    if levels == 0 or n == 0:
        return
    if clouds is None:
        clouds = wp.full(1, wp.vec4i(0, n, 0, levels), dtype=wp.vec4i, device=device)  # no host copy: capturable
    count = clouds.shape[0]
    keys = wp.empty(2 * n, dtype=k.T, device=device)  # the sorts need room for 2N
    places, nodes, by_node = (wp.empty(2 * n, dtype=wp.int32, device=device) for _ in range(3))
    axes = wp.empty(count << (levels - 1), dtype=wp.int32, device=device)
    items = cpu_launch.nothing((0,), k.Item, device.alias)  # split_axis reads the points in place
    pts_out, order_out = wp.empty_like(pts), wp.empty_like(order)
    with warp_runtime.on_stream(stream):
        for level in range(levels):
            parts = 1 << level
            wp.launch(k.forest_axes, dim=count * parts, inputs=[pts, items, clouds, parts, axes], device=device)
            wp.launch(k.forest_keys, dim=n, inputs=[pts, clouds, parts, axes, keys, places], device=device)
            wp.utils.radix_sort_pairs(keys, places, n)
            wp.launch(k.forest_node_keys, dim=n, inputs=[places, clouds, parts, nodes, by_node], device=device)
            wp.utils.radix_sort_pairs(nodes, by_node, n, 0, (count * parts - 1).bit_length())
            wp.launch(k.tree_gather, dim=n, inputs=[pts, order, by_node, pts_out, order_out], device=device)
            wp.copy(pts, pts_out)
            wp.copy(order, order_out)


_LOADED: set = set()


def kernels_for(dtype_name: str, device: Any, dim: int = 3) -> Any:
    """The point kernels for a dtype and points of ``dim`` coordinates, their module built and
    loaded on ``device``.

    The first call per (dtype, dim, device) holds warpbridge's load lock: Warp's module build
    and load are not safe to enter from several threads at once (a cold start from a thread
    pool crashed), and the queries themselves launch from several threads."""
    key = (dtype_name, dim, device.alias)
    scalar = wp.float32 if dtype_name == "float32" else wp.float64
    if key in _LOADED:
        return kdtree.kernels(scalar, dim)
    with warp_runtime.LOAD_LOCK:
        k = kdtree.kernels(scalar, dim)
        # as a launch loads it (block_dim 1 on the CPU): Module.load's default block_dim is
        # another variant, compiled a second time for nothing
        wp.load_module(k.tree_init.module, device=device)
        if device.is_cpu:  # where no framework brings GNU OpenMP, the pool runs the launches
            cpu_team.load(device)
        _LOADED.add(key)
    return k
