"""Distances, boxes, the tree's implicit layout and its depth-first walk."""

from __future__ import annotations

import warp as wp

from . import template
from .dtypes import DIM, T, Tree, V
from .template import func, native


@func
def finite(p: V) -> bool:
    # wp.isfinite measured ~8 ns per call on the CPU (a point pass per tree build); a NaN
    # fails the comparison as an infinity does.
    if wp.static(DIM == 3):
        return wp.abs(p[0]) < T(wp.inf) and wp.abs(p[1]) < T(wp.inf) and wp.abs(p[2]) < T(wp.inf)
    ok = True
    for a in range(DIM):
        if not (wp.abs(p[a]) < T(wp.inf)):
            ok = False
    return ok


@func
def norm(v: V) -> T:
    # |v| without overflow or underflow: squares of coordinates beyond ~1e19 overflow float32
    # and those below ~1e-19 underflow, so such vectors are scaled first. The common path is
    # sqrt(dot(v, v)): for a box gap and a point difference in the normal range it is
    # monotone, which the searches' pruning relies on (a box's gap is never farther than a point
    # inside it).
    d2 = wp.dot(v, v)
    if d2 < T(wp.inf) and d2 >= T(1e-30):
        return wp.sqrt(d2)
    a = wp.abs(v[0])
    for axis in range(1, DIM):
        a = wp.max(a, wp.abs(v[axis]))
    if a == T(0.0) or not (a < T(wp.inf)):
        return a
    return a * wp.length(v / a)


@func
def unit_of(diff: V, d: T) -> V:
    # diff / d for d = norm(diff): the direction, of length 1 at any scale d has (subnormal
    # included), 0 where d is 0.
    u = V(T(0.0))
    if d > T(0.0):
        u = diff / d
    return u


@func
def sq_bound(limit: T) -> T:
    # A squared distance above this is certainly farther than `limit`, rounding of the squares
    # (and their underflow) included: a sqrt is only needed at or below it. It is inf when
    # limit**2 overflows; then only an exact comparison can reject.
    return limit * limit * T(1.0001) + T(1e-30)


@func
def levels(leaves: int) -> int:
    # log2 of the leaf count (a power of two)
    d = int(0)
    while (1 << d) < leaves:
        d += 1
    return d


@func
def part(i: int, n: int, parts: int) -> int:
    # Start of the i-th of `parts` equal shares of n points (in int64: i * n may overflow).
    return int((wp.int64(i) * wp.int64(n)) // wp.int64(parts))


@func
def cloud_of(tree: Tree, i: int) -> wp.vec4i:
    # The cloud of the tree that point i searches: (first place, points, first node, depth).
    # One cloud: the whole tree. In a forest, cloud c's tree has the implicit layout of a
    # tree over its points alone, node c' at clouds[c][2] + c', place t at clouds[c][0] + t.
    if tree.batch.shape[0] == 0:
        return wp.vec4i(0, tree.points.shape[0], 0, levels(tree.lo.shape[0] // 2))
    return tree.clouds[int(tree.batch[i])]


@func
def query_at(t: int, queries: wp.array(dtype=wp.int32)) -> int:
    # The t-th point (query, or reference) to take: queries[t], or point t itself where that
    # is -1.
    i = queries[t]
    if i < 0:
        i = t
    return i


# The start of a native snippet that measures distances: the typedefs Real (REAL) and Vec (a
# point), the constant `inf`, and `square` and `norm_of` (as norm).
NORM_OF = native("geometry_norm_of.h")

# The radius searches' steps over the leaves of cloud `cloud` of `tree`, for native code
# (Real, Vec, inf, square and norm_of as NORM_OF defines them, the query q, reach and
# radius): near(node) whether a node's box may hold a point within the radius, after(node) the
# node that follows node's subtree in depth-first order, next_leaf(node) the first leaf from
# node on that may hold one (0: none), first_leaf() a walk's first (0 for an empty cloud or a
# query that is not finite), start_of(leaf) a leaf's first place and start_of(leaf + 1) its end. The implicit layout (node c's children are 2c and 2c + 1) makes a walk's state
# one node.
# within(diff): whether a difference is within the radius, the rule every radius pass shares
WITHIN = native("geometry_within.h")
LEAF_STEPS = native("geometry_leaf_steps.h").replace("WITHIN", WITHIN)

# The radius searches' whole walk, ball_first/ball_next's step for step, for native code
# (LEAF_STEPS' names, and i and skip_self): walk(leaf, t, e, visit) calls visit(t, leaf, e)
# for each place t within `radius` of q (j == i left out with skip_self), where `leaf` is
# the leaf holding t, its places ending at e; from the root with leaf 0, else from place t
# of `leaf` on (a walk that stopped there).
BALL_WALK = LEAF_STEPS + native("geometry_ball_walk.h")

# ball_next: the radius passes' walk in cloud `cloud`, one point within `radius` of q at a
# time. `at` is (leaf, s, e): the walk stands at place s of the leaf whose places end at e;
# the result is the same for the next point within reach from there on (at[1] its place),
# leaf 0 once none is left. Leaves come in next_leaf's depth-first order. Start with
# ball_first. Native code: in Warp, the radius backward's query pass took 364 against
# 270 ms on a LiDAR sweep of 10^5 points (about 240 neighbours a query, F = 16).
_BALL_SCAN = native("geometry_ball_scan.h")
_BALL_NEXT_SNIPPET = native("geometry_ball_next.h").replace("BALL_SCAN", _BALL_SCAN)
# ball_first: where the walk of ball_next starts, the first point of the cloud within
# `radius` of q (leaf 0 for none: an empty cloud, a query that is not finite).
_BALL_FIRST_SNIPPET = native("geometry_ball_first.h").replace("BALL_SCAN", _BALL_SCAN)


@template.func_native(_BALL_NEXT_SNIPPET.replace("LEAF_STEPS", LEAF_STEPS).replace("NORM_OF", NORM_OF))
def ball_next(tree: Tree, cloud: wp.vec4i, q: V, reach: T, radius: T, at: wp.vec3i) -> wp.vec3i: ...


@template.func_native(_BALL_FIRST_SNIPPET.replace("LEAF_STEPS", LEAF_STEPS).replace("NORM_OF", NORM_OF))
def ball_first(tree: Tree, cloud: wp.vec4i, q: V, reach: T, radius: T) -> wp.vec3i: ...


# A row of listed places this wide or wider keeps, where its query has more neighbours than
# entries, the first (width - 3) places and the walk's state after them (leaf, place, the
# leaf's end as -1 - end): three entries for the state, and at least one place (radius_count
# in lists.py writes them). A later pass takes the places and walks on from there (resumed)
# instead of walking the row again.
RESUMED = 4


@func
def resumed(listed: wp.array2d(dtype=wp.int32), i: int) -> wp.vec3i:
    # Where the walk for query i goes on after the places row i of `listed` keeps, or leaf 0
    # when the row holds every neighbour (or is too narrow to hold the state).
    room = listed.shape[1]
    if room < RESUMED or listed[i, room - 1] >= 0:
        return wp.vec3i(0, 0, 0)
    return wp.vec3i(listed[i, room - 3], listed[i, room - 2], -1 - listed[i, room - 1])
