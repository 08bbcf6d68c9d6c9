"""The point ops, declared with ``wb.op`` like any user's op: one launch function per
forward, one per backward (``@op.backward``), per float type.

Each forward builds the kd-tree over the reference points and searches it (``_tree``,
``kdtree``). The radius op keeps its tree and per-query statistics for the backward as
auxiliary outputs (``aux=``): plain arrays the framework allocates and saves, never returned
to the caller; the kNN ops keep only the neighbour indices, and their trees are scratch.
Every op also keeps the order it took the queries in (``queries``, see
``_tree.query_order``), so its backward takes them in the same order.
Output shapes come from the inputs (a callable ``output_dims``), so a call passes nothing
but its arguments, under ``torch.compile`` too. Everything framework-specific (autograd,
saving, ``torch.compile``, ``torch.func``, JAX, Paddle, NumPy) is ``wb.op``'s.

No ``from __future__ import annotations`` here: the launch functions' Warp annotations are
built per float type and must be objects, not strings.
"""

import functools
import inspect
from typing import Any

import warp as wp

from . import _cpu_launch as cpu_launch
from . import _tree, kdtree

STATS = 3  # per query: weight sum, nearest distance, neighbour count
# The CPU radius backward runs in one pass while the threads' extra copies of the
# reference-side gradients fit in this many bytes (or in as many as the gradients take).
SLOT_BYTES = 64 << 20
# Otherwise it records its neighbour pairs while they fit in this many per point (beyond,
# e.g. a radius spanning the whole cloud, it searches from both sides instead, as on CUDA).
PAIRS_PER_POINT = 64
# The radius forward lists each query's first LISTED neighbours (their places in the tree),
# fewer when the list would pass LISTED_BYTES: the CPU backward searches again only for the
# queries that have more. 32 measured a little faster than 64 at the benchmark's CPU size
# (about 10 neighbours per query): train step 9.1-9.2 against 9.4 ms.
LISTED = 32
LISTED_BYTES = 16 << 20


def struct(cls: Any, **fields: Any) -> Any:
    """A Warp struct with ``fields`` set (array fields left out stay empty)."""
    s = cls()
    for name, value in fields.items():
        setattr(s, name, value)
    return s


def needs_bits(needs: tuple, one_pass: bool = False) -> int:
    """A backward kernel's ``needs``: which gradients it computes (query, ref, features), as
    the sum of their bits, and whether it is the CPU's one-pass radius backward."""
    bits = (kdtree.QUERY, kdtree.REF, kdtree.FEATURES)
    return sum(bit for bit, need in zip(bits, needs) if need) + (kdtree.ONE_PASS if one_pass else 0)


def row_offsets(k: Any, counts: wp.array, cap: int, ptr: wp.array, device: Any, by_scan: bool | None = None) -> None:
    """``ptr[i]``: the sum of ``min(counts, cap)`` before row ``i`` (M + 1 entries). One thread
    on the CPU; with ``by_scan`` (default: on CUDA) Warp's parallel scan (one GPU thread took
    ~0.5 ms for 8 192 rows)."""
    if not (device.is_cuda if by_scan is None else by_scan):
        cpu_launch.launch(k.list_offsets, 1, [counts, cap], [ptr], device)
        return
    capped = wp.empty(ptr.shape[0], dtype=wp.int64, device=device)
    cpu_launch.launch(k.capped_counts, ptr.shape[0], [counts, cap], [capped], device)
    wp.utils.array_scan(capped, ptr, inclusive=False)


_VEC4 = {wp.float32: wp.vec4f, wp.float64: wp.vec4d}


def _groups_of_4(a: wp.array) -> wp.array:
    """An (..., F) array with packed rows seen as (..., F / 4) vectors of 4; empty unless
    F % 4 == 0 and the rows are packed (the kernels then take the scalar path)."""
    v4 = _VEC4[a.dtype]
    *outer, f = a.shape
    if f == 0 or f % 4 or 0 in outer or a.strides[-1] != wp.types.type_size_in_bytes(a.dtype):
        return cpu_launch.nothing((0,) * a.ndim, v4, a.device.alias)
    return wp.array(
        ptr=a.ptr, dtype=v4, shape=(*outer, f // 4), strides=(*a.strides[:-1], 4 * a.strides[-1]), device=a.device
    )


def in_fours(features: wp.array, grad: wp.array, d_features: Any, feature_slots: Any) -> list:
    """Groups-of-4 views of the feature rows a kernel reads and adds into: ``features``,
    ``grad`` (or the forward's ``out``), ``d_features`` and ``feature_slots`` (None where it
    adds nothing there), for its *4 arguments. All of them where every one it uses has them
    (F % 4 == 0, packed rows), else all empty: the kernel then takes the scalar path."""
    V4, alias = _VEC4[features.dtype], features.device.alias
    fours = [_groups_of_4(features), _groups_of_4(grad)]
    fours += [cpu_launch.nothing((0, 0), V4, alias) if d_features is None else _groups_of_4(d_features)]
    fours += [cpu_launch.nothing((0, 0, 0), V4, alias) if feature_slots is None else _groups_of_4(feature_slots)]
    used = fours[:2] + [f for f, a in zip(fours[2:], (d_features, feature_slots)) if a is not None]
    if any(f.size == 0 for f in used):
        return [cpu_launch.nothing((0,) * f.ndim, V4, alias) for f in fours]
    return fours


def _pair_count(k: Any, stats: wp.array, m: int) -> tuple[int, wp.array]:
    """(number of neighbour pairs, exclusive offsets (M + 1,)) from the forward's counts.
    CPU only: reading the total is free there (on CUDA it would synchronise)."""
    device = stats.device
    counts = wp.zeros(m + 1, dtype=wp.int32, device=device)
    offsets = cpu_launch.scratch(m + 1, wp.int32, device)
    if m:
        wp.launch(k.pair_counts, dim=m, inputs=[stats, counts], device=device)
    wp.utils.array_scan(counts, offsets, inclusive=False)
    return int(offsets.numpy()[m]), offsets


# -- the launch functions, by float type ---------------------------------------------------------


def _radius_forward(k, query, ref, batches, features, radius, sigma, out, stats, neighbours, tree, queries):
    batch = _tree.forest_of("radius_aggregate", *batches)
    if batch is None:
        searched = _tree.searched_tree(k, query, ref, queries, into=tree)
    else:  # a forest's size depends on the data: scratch, all but its order (see _radius_dims)
        searched = _tree.searched_tree(k, query, ref, queries, order=tree[0], batch=batch)
    features4, out4 = in_fours(features, out, None, None)[:2]
    before = [query, struct(k.Rows, v=features, v4=features4), searched, radius, sigma, queries]
    after = [struct(k.Rows, v=out, v4=out4), stats, neighbours]
    cpu_launch.launch(k.radius_forward, query.shape[0], before, after, query.device)


def _radius_backward(
    k, T, query, ref, batches, features, radius, sigma, out, stats, neighbours, tree, queries, grad, dq, dr, df, needs
):
    """Three ways, all through one query pass (``radius_backward_query``), which walks the
    neighbours the forward listed and searches the tree again only for a query with more:

    - CPU, while the threads' copies of the reference-side gradients fit (``one_pass_fits``):
      that pass is the whole backward. Each thread adds into its own copy of ``dr`` and
      ``df`` (thread 0 into them directly), summed in thread order afterwards. Against the
      pair list it measured 6.4 -> 5.3 ms per backward (step minus forward) at the
      benchmark's CPU size; the list took it to 3.0 ms.
    - CPU otherwise: the pass records every pair; a pass over the references gathers over
      them, sorted by reference.
    - CUDA (reading the pair count would synchronise), or more pairs than PAIRS_PER_POINT:
      a pass over the references searches a tree over the queries.
    """
    m, n, device = query.shape[0], ref.shape[0], query.device
    if not any(needs):
        return
    slots = cpu_launch.slots(device, m)
    one_pass = device.is_cpu and one_pass_fits(slots, n, (features.shape[1] + 3) * wp.types.type_size_in_bytes(T))
    pairs = None
    if not one_pass and device.is_cpu and (needs[1] or needs[2]):
        pairs = _pair_count(k, stats, m)
        if pairs[0] > PAIRS_PER_POINT * (m + n) + (1 << 16):
            pairs = None  # too many to record: search from the reference side instead
    searches = not one_pass and pairs is None and (needs[1] or needs[2])
    n_pairs, offsets = pairs if pairs is not None else (0, cpu_launch.scratch(0, wp.int32, device))
    g_out = cpu_launch.scratch(m if searches else 0, T, device)
    pq, pr = cpu_launch.scratch(n_pairs, wp.int32, device), cpu_launch.scratch(n_pairs, wp.int32, device)
    pp, pc = cpu_launch.scratch(n_pairs, T, device), cpu_launch.scratch(n_pairs, T, device)
    copies = slots if one_pass else 1
    r_slots, f_slots = cpu_launch.thread_copies(dr, copies, needs[1]), cpu_launch.thread_copies(df, copies, needs[2])
    scatters = one_pass and needs[2]
    fours = in_fours(features, grad, df if scatters else None, f_slots if scatters and copies > 1 else None)
    ball = struct(k.Ball, radius=radius, sigma=sigma, out=out, stats=stats, neighbours=neighbours)
    grads = struct(
        k.Grads, d_query=dq, d_ref=dr, d_features=df, d_features4=fours[2], ref_slots=r_slots,
        feature_slots=f_slots, feature_slots4=fours[3], g_out=g_out,
    )  # fmt: skip
    pair_list = struct(k.Pairs, offsets=offsets, query=pq, ref=pr, p=pp, c=pc)
    before = [query, struct(k.Rows, v=features, v4=fours[0]), _saved_tree(k, ref, batches, tree), ball]
    before += [struct(k.Rows, v=grad, v4=fours[1]), needs_bits(needs, one_pass), queries]
    # one pass: threads own fixed queries (scatter launch), so the copies' sums are deterministic
    query_pass = k.radius_backward_query
    cpu_launch.launch_queries(query_pass, m, slots, before, [pair_list, grads], device, None, scatter=one_pass)
    cpu_launch.add_copies(r_slots, dr)
    cpu_launch.add_copies(f_slots, df)
    if pairs is not None:
        ref_starts, cursor = (
            cpu_launch.scratch(n + 1, wp.int32, device),
            cpu_launch.scratch(max(n, 1), wp.int32, device),
        )
        by_ref = cpu_launch.scratch(n_pairs, wp.int32, device)
        wp.launch(k.pairs_by_ref, dim=1, inputs=[pr, n, ref_starts, cursor, by_ref], device=device)
        before = [query, ref, grad, pair_list, ref_starts, by_ref, needs_bits(needs)]
        cpu_launch.launch(k.radius_backward_ref_pairs, n, before, [struct(k.Grads, d_ref=dr, d_features=df)], device)
    elif searches:
        # The reference side gathers over the queries within the radius: a tree over them.
        # The references go in Morton order over that tree's box, as the queries do.
        refs = cpu_launch.scratch(n, wp.int32, device)
        qtree = _tree.searched_tree(k, ref, query, refs, batch=_tree.forest_of("radius_aggregate", *batches[::-1]))
        before = [ref, features, qtree, ball, grad, needs_bits(needs), refs]
        grads = struct(k.Grads, d_ref=dr, d_features=df, g_out=g_out)
        cpu_launch.launch(k.radius_backward_ref, n, before, [grads], device)


def _saved_tree(k, ref, batches, tree):
    """The radius forward's tree struct, from what it saved: its arrays, or over a batch the
    order of its forest, whose boxes come back without splitting."""
    batch = _tree.forest_of("radius_aggregate", *batches)
    if batch is None:
        return _tree.tree_struct(k, tree)
    return _tree.tree_struct(k, _tree.tree_of_order(k, ref, tree[0], batch[0]), batch)


def one_pass_fits(slots: int, n: int, row_bytes: int) -> bool:
    """Whether the CPU radius backward runs in one pass: ``slots - 1`` extra copies of the
    reference-side gradients (``row_bytes`` per point) fit in SLOT_BYTES, or in no more than
    the gradients themselves take."""
    return (slots - 1) * n * row_bytes <= max(SLOT_BYTES, n * row_bytes)


def distance_backward(k, kernel, rows, queries, dq, dr, needs):
    """The gradient of a search's distances (``kernel``: ``knn_backward`` or ``list_backward``;
    ``rows``: its arguments from the queries to the incoming gradient), per-thread ``dr`` copies."""
    m, device = rows[0].shape[0], rows[0].device
    if not any(needs):
        return
    slots = cpu_launch.slots(device, m)
    r_slots = cpu_launch.thread_copies(dr, slots, needs[1])
    grads = struct(k.Grads, d_query=dq, d_ref=dr, ref_slots=r_slots)
    cpu_launch.launch_queries(kernel, m, slots, [*rows, needs_bits(needs), queries], [grads], device, None, True)
    cpu_launch.add_copies(r_slots, dr)


def listed_neighbours(m: int) -> int:
    """Neighbours per query the radius forward lists for the backward (see LISTED)."""
    return max(1, min(LISTED, LISTED_BYTES // (4 * max(m, 1))))


def _radius_dims(query, ref, features, query_batch, ref_batch, radius, sigma):
    m = query[0]
    dims = {"out": (m, features[1]), "stats": (m, STATS), "neighbours": (m, listed_neighbours(m))}
    tree = _tree.tree_dims(ref[0])
    if query_batch[0] + ref_batch[0]:  # a forest: its order only (see _saved_tree)
        tree = {name: (0,) for name in _tree.TREE} | {"order": (ref[0],)}
    return {**dims, **tree, "queries": (m,)}


BATCH_NAMES = ("query_batch", "ref_batch", "batch")  # the batch vectors, as parameters


def no_batch(first: wp.array) -> wp.array:
    return cpu_launch.nothing((0,), wp.int64, first.device.alias)


def one_cloud(fn: Any, empty: Any) -> Any:
    """``fn`` without its batch vector parameters, which it gets as ``empty(first argument)``."""
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())
    places = [i for i, p in enumerate(params) if p.name in BATCH_NAMES]

    def one_cloud(*args: Any, **kwargs: Any) -> Any:
        args_, nothing = list(args), empty(args[0])
        for i in places:
            args_.insert(i, nothing)
        return fn(*args_, **kwargs)

    one_cloud.__signature__ = signature.replace(parameters=[p for p in params if p.name not in BATCH_NAMES])
    one_cloud.__name__ = fn.__name__
    return one_cloud


# the ops' options for wb.op, besides their launch functions and backwards
_RADIUS = dict(num_outputs=9, aux=("stats", "neighbours", *_tree.TREE, "queries"), output_dims=_radius_dims)


@functools.cache
def declared(dtype: str, dim: int = 3) -> dict:
    """The radius op's launch functions and ``wb.op`` options (``fn``, ``backward``, ...) for
    one float type ("float32" or "float64") and points of ``dim`` coordinates, by name;
    ``_op_table.declare_both`` makes the ops (the kNN ops: ``_knn_launches``)."""
    return _radius_ops(dtype, dim)


def types_of(dtype: str, dim: int) -> tuple:
    """(scalar, points, rows, int32 index, int64 neighbours, int64 batch) Warp types."""
    T = wp.float32 if dtype == "float32" else wp.float64
    V = wp.types.vector(dim, T)
    return (
        T,
        wp.array(dtype=V),
        wp.array2d(dtype=T),
        wp.array(dtype=wp.int32),
        wp.array2d(dtype=wp.int64),
        wp.array(dtype=wp.int64),
    )


def _radius_ops(dtype: str, dim: int) -> dict:
    T, Points, Rows, Index, _, Batch = types_of(dtype, dim)
    Listed = wp.array2d(dtype=wp.int32)

    kernels = functools.partial(_tree.kernels_for, dtype, dim=dim)  # kernels(device)

    def radius_aggregate(
        query: Points, ref: Points, features: Rows, query_batch: Batch, ref_batch: Batch, radius: T, sigma: T,
        out: Rows, stats: Rows, neighbours: Listed,
        order: Index, sorted_points: Points, lo: Points, hi: Points, min_index: Index, queries: Index,
    ):  # fmt: skip
        tree = (order, sorted_points, lo, hi, min_index)
        k, batches = kernels(query.device), (query_batch, ref_batch)
        _radius_forward(k, query, ref, batches, features, radius, sigma, out, stats, neighbours, tree, queries)

    def radius_aggregate_backward(
        query: Points, ref: Points, features: Rows, query_batch: Batch, ref_batch: Batch, radius: T, sigma: T,
        out: Rows, stats: Rows, neighbours: Listed,
        order: Index, sorted_points: Points, lo: Points, hi: Points, min_index: Index, queries: Index,
        adj_out: Rows, adj_query: Points, adj_ref: Points, adj_features: Rows, *, needs_input_grad,
    ):  # fmt: skip
        tree = (order, sorted_points, lo, hi, min_index)
        k = kernels(query.device)
        _radius_backward(
            k, T, query, ref, (query_batch, ref_batch), features, radius, sigma, out, stats, neighbours, tree, queries, adj_out,
            adj_query, adj_ref, adj_features, needs_input_grad,
        )  # fmt: skip

    return dict(radius_aggregate=dict(_RADIUS, fn=radius_aggregate, backward=radius_aggregate_backward))
