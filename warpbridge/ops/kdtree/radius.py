"""The radius aggregation and its backward, over the walk of ``geometry.ball_first`` and
``ball_next`` (the one every radius pass takes).

With out_i = sum_j p_ij f_j, p_ij = w_ij / W_i (w_ij = exp((nearest_i - d_ij) / sigma), the
online softmax's shifted weights) and g_i = dL/dout_i:

    dL/df_j    = sum_i p_ij g_i
    dL/dd_ij   = p_ij (g_i.out_i - g_i.f_j) / sigma      (the exponent's shift cancels)
    dd_ij/dq_i = (q_i - r_j) / d_ij = -dd_ij/dr_j         (taken as 0 where they coincide)

The unit vector (q_i - r_j) / d_ij is formed first and then scaled by dL/dd_ij: the product
1 / (sigma d_ij) overflows at scales the gradient itself fits (float32 points at 1e-20 with
sigma in proportion).

The backward starts with one pass over the queries (``radius_backward_query``). On the CPU
that pass also adds the reference side into per-thread copies (the whole backward), or
records the pairs for a pass over the references (``radius_backward_ref_pairs``); on CUDA a
pass over the references searches a tree over the queries (``radius_backward_ref``). No
atomics on any path.
"""

from __future__ import annotations

import warp as wp

from .dtypes import V4, Ball, Grads, Pairs, Rows, T, Tree, V
from .geometry import (
    ball_first,
    ball_next,
    cloud_of,
    norm,
    query_at,
    sq_bound,
    unit_of,
)
from .knn import FEATURES, QUERY, REF
from .rows import add_feature_row, feature_dot, row_axpy, row_dot, row_scale, sub_from_ref
from .template import func, kernel

ONE_PASS = 8  # a `needs` bit: the CPU's one-pass backward (a scatter launch; its slot is offset % stride)


@kernel
def radius_forward(
    query: wp.array(dtype=V),
    features: Rows,
    tree: Tree,
    radius: T,
    sigma: T,
    queries: wp.array(dtype=wp.int32),
    stride: int,
    offset: int,
    out: Rows,
    stats: wp.array2d(dtype=T),
    neighbours: wp.array2d(dtype=wp.int32),
):
    # Per query: the weighted mean of the features within the radius, and its stats (weight
    # sum, nearest distance, neighbour count). `neighbours` keeps the first neighbours'
    # places in the tree (as many as fit) for the CPU backward, which then needs no search
    # for the queries that have no more.
    i = query_at(wp.tid() * stride + offset, queries)
    q = query[i]
    pts, order, x, x4, y, y4 = tree.points, tree.order, features.v, features.v4, out.v, out.v4
    nf, n4, listed = y.shape[1], y4.shape[1], neighbours.shape[1]
    for f in range(nf):
        y[i, f] = T(0.0)
    total = T(0.0)  # sum of the shifted weights exp((nearest - d) / sigma)
    nearest = T(0.0)
    found = int(0)
    count = int(0)  # neighbours: sizes the backward's pair list
    c = cloud_of(tree, i)
    reach = sq_bound(radius)  # boxes and points beyond are certainly outside the ball
    at = ball_first(tree, c, q, reach, radius)  # every radius pass's walk (leaf 0: none left)
    while at[0] > 0:
        s = at[1]
        d = norm(q - pts[s])
        j = order[s]
        if found == 0 or d < nearest:
            # A new nearest neighbour: rescale what was summed so far so that every weight
            # stays <= 1 (online softmax).
            scale = T(0.0)
            if found != 0:
                scale = wp.exp((d - nearest) / sigma)
            total = total * scale
            if n4 > 0:
                for f in range(n4):
                    y4[i, f] = y4[i, f] * scale
            else:
                row_scale(y, i, scale, nf)
            nearest = d
            found = 1
        w = wp.exp((nearest - d) / sigma)
        total += w
        if count < listed:
            neighbours[i, count] = s
        count += 1
        if n4 > 0:
            for f in range(n4):
                y4[i, f] = y4[i, f] + w * x4[j, f]
        else:
            row_axpy(y, i, w, x, j, nf)
        at = ball_next(tree, c, q, reach, radius, wp.vec3i(at[0], s + 1, at[2]))
    if found != 0:
        row_scale(y, i, T(1.0) / total, nf)
    stats[i, 0] = total
    stats[i, 1] = nearest
    stats[i, 2] = T(count)


@func
def backward_pair(
    i: int, j: int, k: int, unit: V, d: T, weights: V4,
    features: Rows, grad: Rows, needs: int, slot: int, pairs: Pairs, grads: Grads,
) -> T:  # fmt: skip
    # One pair (query i, reference j at distance d, unit = (q_i - r_j) / d; the query's
    # weights = (nearest distance, 1 / the weights' total, g . out, sigma)): returns
    # c = dL/dd with dL/dq_i += c unit and dL/dr_j -= c unit. In the one pass, adds the
    # reference side's terms into thread `slot`'s copy (slot 0: the gradients themselves);
    # with a pair list, records the pair at place k.
    nearest, inv, go, sigma = weights[0], weights[1], weights[2], weights[3]
    p = wp.exp((nearest - d) / sigma) * inv
    c = T(0.0)
    if (needs & (QUERY | REF)) != 0 and d > T(0.0):
        c = p * (go - feature_dot(grad, i, features, j)) / sigma
    if (needs & ONE_PASS) != 0:
        if (needs & FEATURES) != 0:
            add_feature_row(p, i, j, slot, 0, grad, grads)  # each thread its own copy: no atomics
        if (needs & REF) != 0:
            sub_from_ref(grads, slot, j, unit * c)
    if pairs.query.shape[0] > 0:
        pairs.query[k] = i
        pairs.ref[k] = j
        pairs.p[k] = p
        pairs.c[k] = c
    return c


@kernel
def radius_backward_query(
    query: wp.array(dtype=V),
    features: Rows,
    tree: Tree,
    ball: Ball,
    grad: Rows,
    needs: int,
    queries: wp.array(dtype=wp.int32),
    stride: int,
    offset: int,
    pairs: Pairs,
    grads: Grads,
):
    # The queries' gradient over each query's neighbours: the ones the forward listed, or a
    # search of the tree for a query with more. Besides, by what it is given: the one pass
    # adds the reference side's terms into the thread's copy of their gradients; a pair list
    # gets each pair, from pairs.offsets[i] on; a non-empty grads.g_out gets g.out per query,
    # for the reference pass.
    i = query_at(wp.tid() * stride + offset, queries)
    total, nearest, count = ball.stats[i, 0], ball.stats[i, 1], int(ball.stats[i, 2])
    go = row_dot(grad.v, i, ball.out, i, features.v.shape[1])
    if grads.g_out.shape[0] > 0:
        grads.g_out[i] = go
    k = int(0)
    if pairs.query.shape[0] > 0:
        k = pairs.offsets[i]
    walk = total > T(0.0) and ((needs & (QUERY | ONE_PASS)) != 0 or pairs.query.shape[0] > 0)
    q, inv, slot = query[i], T(1.0) / wp.max(total, T(1e-30)), offset % stride
    pts, order, radius, sigma = tree.points, tree.order, ball.radius, ball.sigma
    weights = V4(nearest, inv, go, sigma)
    dq = V(T(0.0))
    reach = sq_bound(radius)
    cloud = cloud_of(tree, i)
    # the neighbours the forward listed, when it listed all, in the same order; else a walk
    listed = walk and count <= ball.neighbours.shape[1]
    at = wp.vec3i(0, 0, 0)
    if walk and not listed:
        at = ball_first(tree, cloud, q, reach, radius)
    c = int(0)
    while (listed and c < count) or at[0] > 0:
        s = at[1]
        if listed:
            s = ball.neighbours[i, c]
            c += 1
        diff = q - pts[s]
        d = norm(diff)
        unit = unit_of(diff, d)
        cd = backward_pair(i, order[s], k, unit, d, weights, features, grad, needs, slot, pairs, grads)
        dq += unit * cd
        k += 1
        if not listed:
            at = ball_next(tree, cloud, q, reach, radius, wp.vec3i(at[0], s + 1, at[2]))
    if (needs & QUERY) != 0:
        grads.d_query[i] = dq


@kernel
def radius_backward_ref(
    ref: wp.array(dtype=V),
    features: wp.array2d(dtype=T),
    tree: Tree,
    ball: Ball,
    grad: wp.array2d(dtype=T),
    needs: int,
    refs: wp.array(dtype=wp.int32),
    stride: int,
    offset: int,
    grads: Grads,
):
    # The reference side by a search of a tree over the queries (`tree`); grads.g_out holds
    # g.out per query (from the query pass).
    j = query_at(wp.tid() * stride + offset, refs)
    r = ref[j]
    nf = features.shape[1]
    dr = V(T(0.0))
    if (needs & FEATURES) != 0:
        for f in range(nf):
            grads.d_features[j, f] = T(0.0)
    pts, order, radius, sigma = tree.points, tree.order, ball.radius, ball.sigma
    reach = sq_bound(radius)
    c = cloud_of(tree, j)
    at = ball_first(tree, c, r, reach, radius)
    while at[0] > 0:
        s = at[1]
        diff = pts[s] - r  # q - r, exactly as the forward computed it
        d = norm(diff)
        i = order[s]
        p = wp.exp((ball.stats[i, 1] - d) / sigma) / ball.stats[i, 0]
        if (needs & FEATURES) != 0:
            row_axpy(grads.d_features, j, p, grad, i, nf)
        if (needs & REF) != 0 and d > T(0.0):
            g_f = row_dot(grad, i, features, j, nf)
            dr -= unit_of(diff, d) * (p * (grads.g_out[i] - g_f) / sigma)
        at = ball_next(tree, c, r, reach, radius, wp.vec3i(at[0], s + 1, at[2]))
    if (needs & REF) != 0:
        grads.d_ref[j] = dr


@kernel
def pair_counts(stats: wp.array2d(dtype=T), counts: wp.array(dtype=wp.int32)):
    i = wp.tid()
    counts[i] = int(stats[i, 2])


# On the CPU the radius backward can keep the query pass's search and record each pair
# (query, reference, p, c) at a fixed place in a list sized by the forward's neighbour counts;
# the reference side then gathers over that list, transposed, instead of searching a tree
# over the queries. Fixed places: deterministic with any chunking.


@kernel
def pairs_by_ref(
    pair_ref: wp.array(dtype=wp.int32),
    n_ref: int,
    ref_starts: wp.array(dtype=wp.int32),
    cursor: wp.array(dtype=wp.int32),
    by_ref: wp.array(dtype=wp.int32),
):
    # One thread: a counting sort of the pairs by reference, stable (ascending pair index).
    n_pairs = pair_ref.shape[0]
    for j in range(n_ref + 1):
        ref_starts[j] = 0
    for k in range(n_pairs):
        ref_starts[pair_ref[k] + 1] += 1
    for j in range(n_ref):
        ref_starts[j + 1] += ref_starts[j]
    for j in range(n_ref):
        cursor[j] = ref_starts[j]
    for k in range(n_pairs):
        j = pair_ref[k]
        by_ref[cursor[j]] = k
        cursor[j] += 1


@kernel
def radius_backward_ref_pairs(
    query: wp.array(dtype=V),
    ref: wp.array(dtype=V),
    grad: wp.array2d(dtype=T),
    pairs: Pairs,
    ref_starts: wp.array(dtype=wp.int32),
    by_ref: wp.array(dtype=wp.int32),
    needs: int,
    stride: int,
    offset: int,
    grads: Grads,
):
    j = wp.tid() * stride + offset
    nf = grad.shape[1]
    if (needs & FEATURES) != 0:
        for f in range(nf):
            grads.d_features[j, f] = T(0.0)
    dr = V(T(0.0))
    r = ref[j]
    for s in range(ref_starts[j], ref_starts[j + 1]):
        k = by_ref[s]
        i = pairs.query[k]
        if (needs & FEATURES) != 0:
            row_axpy(grads.d_features, j, pairs.p[k], grad, i, nf)
        if (needs & REF) != 0:
            diff = query[i] - r
            dr -= unit_of(diff, norm(diff)) * pairs.c[k]
    if (needs & REF) != 0:
        grads.d_ref[j] = dr
