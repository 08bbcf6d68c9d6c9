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
points, see ``tree_keys``), so the tree's depth is ``log2(N / 22)`` on any data.
Outliers, clusters, surfaces and lines only change the boxes, never the depth or the memory.
Each node keeps the exact bounding box of its points and the smallest original index among
them.

Searches are depth-first with an explicit stack. A node is skipped only when no point in it
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
backwards map that place to a query through ``queries`` (``query_at``): Morton order for many
queries (``query_keys``), which keeps each search's nodes in cache for the next. Passes that
add into gradients (scatter launches: thread ``t`` owns the places ``t, t + threads, ...``
and ``offset`` is ``t``) let thread 0 add into the gradient itself and thread ``t > 0`` into
``*_slots[t - 1]``, zeroed copies summed in thread order afterwards, so results are
deterministic on the CPU without atomics contending.
"""

# No `from __future__ import annotations`: Warp evaluates the kernels' annotations, which
# refer to the closure's types.
import ctypes
import functools
from typing import Any

import warp as wp

# The most points per leaf: the fewest levels that leave at most this many, so 11 to 22 per
# leaf. Against 16 (8 to 16 per leaf), kNN took 1.60 -> 1.54 ms at 10^4 points, 3.28 -> 3.19
# at 2 * 10^4 and 1.88 -> 1.81 s at 10^7, where 16 left 10 points per leaf; the radius op the
# same (10^4: 2.89 ms either way, 10^7: 3.8 s); at 10^5 and 10^6 the two give the same tree.
LEAF_SIZE = 22
STACK = 32  # the search stack: deeper than any tree of int32-indexed points (depth <= 28)
SAMPLE = 15  # keys sampled to choose a quickselect pivot (odd)
# Queries are searched in Morton order of 2**MORTON_BITS cells per axis (see query_keys):
# 5 bits measured as fast as 8 or 10 at 10^5-10^6 points, with a 2-pass sort instead of 3-4.
MORTON_BITS = 5
MORTON_CELLS = 1 << MORTON_BITS
MORTON_LAST = (1 << (3 * MORTON_BITS)) - 1  # the largest code, for queries that are not finite
MORTON_SAMPLE = 64  # reference points sampled for the box the cells split (query_box)


@functools.cache
def kernels(scalar: Any) -> Any:
    """All point kernels for one float type (wp.float32 or wp.float64), in one module."""
    T = scalar
    V = wp.types.vector(3, T)
    V4 = wp.types.vector(4, T)  # feature rows seen as groups of 4 (F % 4 == 0): ~2x faster gathers
    Sample = wp.types.vector(SAMPLE, T)  # pivot candidates of a large quickselect step
    SampleAt = wp.types.vector(SAMPLE, wp.int32)
    Stack = wp.types.vector(STACK, wp.int32)
    module = f"warpbridge_points_{T.__name__}"
    REAL = "wp::float32" if T is wp.float32 else "wp::float64"  # T in the native snippets

    class Item:
        # A point and its original index in one record (16 bytes; 32 in float64): the CPU
        # build partitions subtrees in this layout, in a per-thread scratch (partition_items).
        p: V
        i: wp.int32

    Item.__qualname__ = f"Item_{T.__name__}"
    Item = wp.struct(Item, module=module)
    if ctypes.sizeof(Item.ctype) != 4 * wp.types.type_size_in_bytes(T):
        raise RuntimeError("warpbridge: unexpected layout of the kd-tree build's records")

    def kernel(f):
        return wp.kernel(f, enable_backward=False, module=module)

    def func(f):
        return wp.func(f, module=module)

    # Row helpers over the feature dim F, unrolled by 4 by hand: a loop with a run-time bound
    # is not unrolled by the CPU compiler and measured ~2x slower here.
    @func
    def row_axpy(y: wp.array2d(dtype=T), i: int, a: T, x: wp.array2d(dtype=T), j: int, n: int):
        for f4 in range(n // 4):
            f = f4 * 4
            y[i, f] = y[i, f] + a * x[j, f]
            y[i, f + 1] = y[i, f + 1] + a * x[j, f + 1]
            y[i, f + 2] = y[i, f + 2] + a * x[j, f + 2]
            y[i, f + 3] = y[i, f + 3] + a * x[j, f + 3]
        for f in range(n - n % 4, n):
            y[i, f] = y[i, f] + a * x[j, f]

    @func
    def atomic_axpy(y: wp.array2d(dtype=T), j: int, a: T, x: wp.array2d(dtype=T), i: int):
        # y[j] += a x[i], atomically per element (queries on CUDA share rows of y)
        for f in range(x.shape[1]):
            wp.atomic_add(y, j, f, a * x[i, f])

    @func
    def atomic_axpy4(y: wp.array2d(dtype=V4), j: int, a: T, x: wp.array2d(dtype=V4), i: int):
        # the same over rows seen as groups of 4
        for f in range(x.shape[1]):
            wp.atomic_add(y, j, f, a * x[i, f])

    @func
    def add_feature_row(
        p: T, i: int, j: int, slot: int, atomic: int,
        grad: wp.array2d(dtype=T), grad4: wp.array2d(dtype=V4),
        d_features: wp.array2d(dtype=T), d_features4: wp.array2d(dtype=V4),
        feature_slots: wp.array3d(dtype=T), feature_slots4: wp.array3d(dtype=V4),
    ):  # fmt: skip
        # Row j of the features' gradient += p grad[i]: the gradient itself (slot 0) or thread
        # slot's copy; 4 at a time where the *4 views are not empty; with atomics where other
        # threads may add to the same row (CUDA), else the unrolled row_axpy.
        if grad4.shape[1] > 0:
            if slot == 0:
                atomic_axpy4(d_features4, j, p, grad4, i)
            else:
                atomic_axpy4(feature_slots4[slot - 1], j, p, grad4, i)
        elif atomic != 0:
            if slot == 0:
                atomic_axpy(d_features, j, p, grad, i)
            else:
                atomic_axpy(feature_slots[slot - 1], j, p, grad, i)
        elif slot == 0:
            row_axpy(d_features, j, p, grad, i, grad.shape[1])
        else:
            row_axpy(feature_slots[slot - 1], j, p, grad, i, grad.shape[1])

    @func
    def feature_dot(
        grad: wp.array2d(dtype=T), grad4: wp.array2d(dtype=V4), i: int,
        features: wp.array2d(dtype=T), features4: wp.array2d(dtype=V4), j: int,
    ) -> T:  # fmt: skip
        # grad[i] . features[j], 4 at a time where the *4 views are not empty
        acc = T(0.0)
        if grad4.shape[1] > 0:
            acc = dot4(grad4, i, features4, j)
        else:
            acc = row_dot(grad, i, features, j, grad.shape[1])
        return acc

    @func
    def dot4(x: wp.array2d(dtype=V4), i: int, y: wp.array2d(dtype=V4), j: int) -> T:
        # x[i] . y[j] over rows seen as groups of 4
        acc = T(0.0)
        for f in range(x.shape[1]):
            acc += wp.dot(x[i, f], y[j, f])
        return acc

    @func
    def row_scale(y: wp.array2d(dtype=T), i: int, a: T, n: int):
        for f in range(n):
            y[i, f] = y[i, f] * a

    @func
    def row_dot(x: wp.array2d(dtype=T), i: int, y: wp.array2d(dtype=T), j: int, n: int) -> T:
        a0 = T(0.0)
        a1 = T(0.0)
        a2 = T(0.0)
        a3 = T(0.0)
        for f4 in range(n // 4):
            f = f4 * 4
            a0 += x[i, f] * y[j, f]
            a1 += x[i, f + 1] * y[j, f + 1]
            a2 += x[i, f + 2] * y[j, f + 2]
            a3 += x[i, f + 3] * y[j, f + 3]
        for f in range(n - n % 4, n):
            a0 += x[i, f] * y[j, f]
        return (a0 + a1) + (a2 + a3)

    @func
    def finite(p: V) -> bool:
        # wp.isfinite measured ~8 ns per call on the CPU (a point pass per tree build);
        # a NaN fails the comparison as an infinity does.
        return wp.abs(p[0]) < T(wp.inf) and wp.abs(p[1]) < T(wp.inf) and wp.abs(p[2]) < T(wp.inf)

    # aggregate_row: out_i = sum_n softmax(-dist_i / sigma)_n f_idx[i, n], the exponents shifted
    # by the nearest distance; a row of zeros without neighbours. Native code: the weighted
    # rows add straight into the output row, which the compiler vectorises when the rows are
    # packed. Written in Warp (weights in a local vector, the row in groups of 4), the
    # aggregation took ~1.8 of the tutorial's 19 ms knn_aggregate call (27 000 queries, F = 16,
    # two threads); native, ~1.0 ms.
    _AGGREGATE_SNIPPET = r"""
    typedef REAL Real;
    const int k = idx.shape[1];
    const int nf = features.shape[1];
    const Real nearest = *wp::address(dist, i, 0);
    const size_t fs = (size_t)features.strides[1], os = (size_t)out.strides[1];
    const bool packed = fs == sizeof(Real) && os == sizeof(Real);
    char* __restrict__ o = (char*)wp::address(out, i, 0);  // the output row, only ever through o
    for (int f = 0; f < nf; ++f) *(Real*)(o + f * os) = (Real)0;
    Real total = (Real)0;
    for (int n = 0; n < k; ++n) {
        const wp::int64 j = *wp::address(idx, i, n);
        if (j < 0) continue;
        const Real w = wp::exp((nearest - *wp::address(dist, i, n)) / sigma);
        total += w;
        const char* __restrict__ row = (const char*)features.data + j * features.strides[0];
        if (packed) {
            for (int f = 0; f < nf; ++f) ((Real*)o)[f] += w * ((const Real*)row)[f];
        } else {
            for (int f = 0; f < nf; ++f) *(Real*)(o + f * os) += w * *(const Real*)(row + f * fs);
        }
    }
    if (total > (Real)0) {
        const Real scale = (Real)1 / total;
        for (int f = 0; f < nf; ++f) *(Real*)(o + f * os) *= scale;
    }
    """.replace("REAL", REAL)

    @wp.func_native(_AGGREGATE_SNIPPET)
    def aggregate_row(
        features: wp.array2d(dtype=T),
        dist: wp.array2d(dtype=T),
        idx: wp.array2d(dtype=wp.int64),
        sigma: T,
        i: int,
        out: wp.array2d(dtype=T),
    ): ...

    # knn_query: query i's k nearest points, sorted by distance, then index, into its rows of
    # dist and idx (inf and -1 where there are fewer than k points; no search for a query
    # that is not finite). Depth first from the root: the nearer child first, the other on
    # the stack with its squared gap (box_gap2). Once the list is full, a box or a point
    # whose squared gap exceeds `b` (sq_bound of the k-th distance) is certainly farther and
    # is skipped without a square root; a box at least as far as the k-th with only larger
    # indices is skipped too (ties go to the smaller index). The bound follows the list
    # within a leaf, not only after it. Norms as `norm` (no overflow, no underflow).
    #
    # Native code (compiled for the CPU and by NVRTC for CUDA), on raw pointers into the
    # tree's arrays, which _run._tree always allocates packed. The same steps in Warp, with
    # only the leaf scan native, took 29.5 ms for the tutorial's 27 000 queries on 10^5
    # points (one thread); this takes 25.6 ms, and 2 000 queries on 10^4 duplicated points
    # 1.86 -> 1.51 ms. A C++ copy compiled on its own with Clang took 24.7 ms. (Before, the
    # leaf scan alone became native: 1.86 -> 1.69 ms for 2 000 queries on 10^4 points.)
    _KNN_SNIPPET = r"""
    typedef REAL Real;
    typedef wp::vec_t<3, Real> Vec;
    const Real inf = (Real)INFINITY;
    char* const dr = (char*)dist.data + (size_t)i * (size_t)dist.strides[0];
    char* const ir = (char*)idx.data + (size_t)i * (size_t)idx.strides[0];
    const size_t ds = (size_t)dist.strides[1], is = (size_t)idx.strides[1];
    auto D = [&](int n) -> Real& { return *(Real*)(dr + (size_t)n * ds); };
    auto J = [&](int n) -> wp::int64& { return *(wp::int64*)(ir + (size_t)n * is); };
    for (int n = 0; n < k; ++n) { D(n) = inf; J(n) = -1; }
    if (!(wp::abs(q[0]) < inf && wp::abs(q[1]) < inf && wp::abs(q[2]) < inf)) return;
    const Vec* __restrict__ P = (const Vec*)sorted_points.data;  // the tree's arrays are packed
    const wp::int32* __restrict__ O = (const wp::int32*)order.data;
    const Vec* __restrict__ LO = (const Vec*)lo.data;
    const Vec* __restrict__ HI = (const Vec*)hi.data;
    const wp::int32* __restrict__ MI = (const wp::int32*)min_index.data;
    const int n = sorted_points.shape[0];
    const int leaves = lo.shape[0] / 2;
    int depth = 0;
    while ((1 << depth) < leaves) ++depth;
    auto norm3 = [&](Real x, Real y, Real z) -> Real {
        const Real d2 = x * x + y * y + z * z;
        if (d2 < inf && d2 >= (Real)1e-30) return wp::sqrt(d2);
        const Real a = wp::max(wp::max(wp::abs(x), wp::abs(y)), wp::abs(z));
        if (a == (Real)0 || !(a < inf)) return a;
        const Real u = x / a, v = y / a, w = z / a;
        return a * wp::sqrt(u * u + v * v + w * w);
    };
    auto gap = [&](int node, Real& gx, Real& gy, Real& gz) {
        const Vec l = LO[node], h = HI[node];
        gx = wp::max(wp::max(l[0] - q[0], q[0] - h[0]), (Real)0);
        gy = wp::max(wp::max(l[1] - q[1], q[1] - h[1]), (Real)0);
        gz = wp::max(wp::max(l[2] - q[2], q[2] - h[2]), (Real)0);
    };
    auto gap2 = [&](int node) -> Real {
        Real gx, gy, gz;
        gap(node, gx, gy, gz);
        return gx * gx + gy * gy + gz * gz;
    };
    int stack[STACK];
    Real gaps[STACK];
    int sp = 0, node = 1, c = 0;
    Real g2 = (Real)0, kd = inf, b = inf;
    wp::int64 kj = -1;
    while (node > 0 || sp > 0) {
        if (node == 0) {
            --sp;
            node = stack[sp];
            g2 = gaps[sp];
        }
        if (c == k) {
            bool skip = g2 > b;
            if (!skip) {
                if (b < inf) {
                    // sqrt(g2) is a lower bound of every point's distance in the normal range,
                    // exact enough to settle a tie by index; so is a gap of 0 when the k-th
                    // distance is 0 (copies of a query point: without it, 20,000 queries on
                    // 200,000 copies of one point scanned every copy for each query).
                    const bool tie = g2 >= (Real)1e-30 || (g2 == (Real)0 && kd == (Real)0);
                    skip = tie && (wp::int64)MI[node] > kj && wp::sqrt(g2) >= kd;
                } else {  // a k-th distance whose square overflows: compare with a margin
                    Real gx, gy, gz;
                    gap(node, gx, gy, gz);
                    skip = norm3(gx, gy, gz) > kd * (Real)1.00001;
                }
            }
            if (skip) {
                node = 0;
                continue;
            }
        }
        if (node < leaves) {
            const int a = 2 * node;
            const Real da = gap2(a), db = gap2(a + 1);
            if (db < da || (db == da && MI[a + 1] < MI[a])) {
                stack[sp] = a; gaps[sp] = da; node = a + 1; g2 = db;
            } else {
                stack[sp] = a + 1; gaps[sp] = db; node = a; g2 = da;
            }
            ++sp;
            continue;
        }
        const int s = (int)(((wp::int64)(node - leaves) * n) >> depth);
        const int e = (int)(((wp::int64)(node - leaves + 1) * n) >> depth);
        for (int t = s; t < e; ++t) {
            const Vec p = P[t];
            const Real dx = q[0] - p[0], dy = q[1] - p[1], dz = q[2] - p[2];
            const Real d2 = dx * dx + dy * dy + dz * dz;
            // b and kd are inf until the list is full: every finite point enters until then
            if (d2 <= b) {
                const Real d = d2 < inf && d2 >= (Real)1e-30 ? wp::sqrt(d2) : norm3(dx, dy, dz);
                const wp::int64 j = (wp::int64)O[t];
                if (d < kd || (d == kd && j < kj)) {
                    int pos = c < k - 1 ? c : k - 1;
                    while (pos > 0) {
                        const Real dp = D(pos - 1);
                        const wp::int64 jp = J(pos - 1);
                        if (!(d < dp || (d == dp && j < jp))) break;
                        D(pos) = dp;
                        J(pos) = jp;
                        --pos;
                    }
                    D(pos) = d;
                    J(pos) = j;
#if !defined(__CUDA_ARCH__)
                    // knn_aggregate reads the neighbours' feature rows next (aggregate_row)
                    if (features.shape[0]) __builtin_prefetch((const char*)features.data + j * features.strides[0]);
#endif
                    if (c < k) ++c;
                    if (c == k) {  // the bound of the k-th distance, as sq_bound
                        kd = D(k - 1);
                        kj = J(k - 1);
                        b = kd * kd * (Real)1.0001 + (Real)1e-30;
                    }
                }
            }
        }
        node = 0;
    }
    """.replace("REAL", REAL).replace("STACK", str(STACK))

    @wp.func_native(_KNN_SNIPPET)
    def knn_query(
        q: V,
        order: wp.array(dtype=wp.int32),
        sorted_points: wp.array(dtype=V),
        lo: wp.array(dtype=V),
        hi: wp.array(dtype=V),
        min_index: wp.array(dtype=wp.int32),
        k: int,
        i: int,
        dist: wp.array2d(dtype=T),
        idx: wp.array2d(dtype=wp.int64),
        features: wp.array2d(dtype=T),
    ): ...

    @func
    def norm(v: V) -> T:
        # |v| without overflow or underflow: squares of coordinates beyond ~1e19 overflow
        # float32 and those below ~1e-19 underflow, so such vectors are scaled first. The
        # common path is sqrt(dot(v, v)): for a box gap and a point difference in the normal
        # range it is monotone, which the searches' pruning relies on (see box_gap2).
        d2 = wp.dot(v, v)
        if d2 < T(wp.inf) and d2 >= T(1e-30):
            return wp.sqrt(d2)
        a = wp.max(wp.max(wp.abs(v[0]), wp.abs(v[1])), wp.abs(v[2]))
        if a == T(0.0) or not (a < T(wp.inf)):
            return a
        return a * wp.length(v / a)

    @func
    def box_distance(q: V, lo: V, hi: V) -> T:
        # Per axis, the gap to [lo, hi] is at most |q - p| for any p inside, exactly (rounding
        # is monotone); so is the norm. An empty box (lo = +inf) is infinitely far.
        return norm(wp.max(wp.max(lo - q, q - hi), V(T(0.0))))

    @func
    def box_gap2(q: V, lo: V, hi: V) -> T:
        # The squared distance to a box (inf when it overflows, 0 when it underflows): for
        # ordering, and for certain rejections against sq_bound.
        g = wp.max(wp.max(lo - q, q - hi), V(T(0.0)))
        return wp.dot(g, g)

    @func
    def sq_bound(limit: T) -> T:
        # A squared distance above this is certainly farther than `limit`, rounding of the
        # squares (and their underflow) included: a sqrt is only needed at or below it. It is
        # inf when limit**2 overflows; then only an exact comparison can reject (near_box).
        return limit * limit * T(1.0001) + T(1e-30)

    @func
    def near_box(q: V, lo: V, hi: V, reach: T, radius: T) -> bool:
        # False only if no point of the box can be within `radius` of q (reach = sq_bound).
        g2 = box_gap2(q, lo, hi)
        if g2 > reach:
            return False
        if reach < T(wp.inf):
            return True
        return box_distance(q, lo, hi) <= radius * T(1.00001)  # huge radius: with a margin

    @func
    def levels(leaves: int) -> int:
        # log2 of the leaf count (a power of two)
        d = int(0)
        while (1 << d) < leaves:
            d += 1
        return d

    @func
    def leaf_start(leaf: int, n: int, depth: int) -> int:
        # part(leaf, n, 2**depth) with a shift for a division: it runs once per leaf visited.
        return int((wp.int64(leaf) * wp.int64(n)) >> wp.int64(depth))

    @func
    def part(i: int, n: int, parts: int) -> int:
        # Start of the i-th of `parts` equal shares of n points (in int64: i * n may overflow).
        return int((wp.int64(i) * wp.int64(n)) // wp.int64(parts))

    @func
    def node_box(
        pts: wp.array(dtype=V),
        order: wp.array(dtype=wp.int32),
        s: int,
        e: int,
        node: int,
        lo: wp.array(dtype=V),
        hi: wp.array(dtype=V),
        min_index: wp.array(dtype=wp.int32),
    ):
        # The exact box and smallest original index of points [s, e).
        b0 = V(T(wp.inf))
        b1 = V(T(-wp.inf))
        first = int(2147483647)
        for t in range(s, e):
            b0 = wp.min(b0, pts[t])
            b1 = wp.max(b1, pts[t])
            first = wp.min(first, order[t])
        lo[node] = b0
        hi[node] = b1
        min_index[node] = first

    # The CPU build splits a subtree that fits in a thread's row of scratch (tree_subtrees) in
    # records of point and index (`Item`, `items`: position t at t - base), elsewhere in the
    # tree's own arrays (`pts`, `order`); `packed` says which.

    @func
    def point_at(pts: wp.array(dtype=V), items: wp.array(dtype=Item), base: int, packed: bool, t: int) -> V:
        if packed:
            return items[t - base].p
        return pts[t]

    @func
    def index_at(order: wp.array(dtype=wp.int32), items: wp.array(dtype=Item), base: int, packed: bool, t: int) -> int:
        if packed:
            return items[t - base].i
        return order[t]

    @func
    def split_axis(pts: wp.array(dtype=V), items: wp.array(dtype=Item), base: int, packed: bool, s: int, e: int) -> int:
        # The widest spread of (a sample of) the points [s, e). The exact boxes are merged
        # bottom-up once the points are in place.
        b0 = V(T(wp.inf))
        b1 = V(T(-wp.inf))
        step = wp.max(1, (e - s) // SAMPLE)
        for t in range(s, e, step):
            p = point_at(pts, items, base, packed, t)
            b0 = wp.min(b0, p)
            b1 = wp.max(b1, p)
        ext = b1 - b0
        axis = int(0)
        if ext[1] > ext[axis]:
            axis = 1
        if ext[2] > ext[axis]:
            axis = 2
        return axis

    # partition_points: Lomuto's partition of [left, right] around the point at `pick`, keys
    # compared as (coordinate, original index); returns the pivot's place. Written without
    # branches (every element swapped, the boundary moved by the comparison): ~2x faster here
    # than Hoare's, whose branches mispredict. Native code, like partition_items below, so
    # that each key is loaded from memory at the axis's byte offset: Warp indexes a point by a
    # runtime axis through a copy on the stack, and a load that waits on that store. The CPU
    # builds went 1.15-1.3x faster with both partitions so (10^4 to 10^7 points, one and two
    # threads; 10^5 Gaussian points on one thread 7.7 -> 6.4 ms).
    _PARTITION_POINTS_SNIPPET = r"""
    typedef wp::vec_t<3, REAL> Point;
    char* pd = (char*)pts.data;
    char* od = (char*)order.data;
    const size_t ps = (size_t)pts.strides[0], os = (size_t)order.strides[0];
    auto P = [&](int t) -> Point& { return *(Point*)(pd + (size_t)t * ps); };
    auto O = [&](int t) -> wp::int32& { return *(wp::int32*)(od + (size_t)t * os); };
    const Point pivot = P(pick);
    const wp::int32 pivot_index = O(pick);
    P(pick) = P(right);
    O(pick) = O(right);
    const REAL key = pivot[axis];
    const size_t off = (size_t)axis * sizeof(REAL);
    int store = left;
    for (int j = left; j < right; ++j) {
        const REAL c = *(const REAL*)(pd + (size_t)j * ps + off);
        const wp::int32 oj = O(j);
        const Point pj = P(j);
        const int below = (c < key) | ((c == key) & (oj < pivot_index));
        P(j) = P(store);
        O(j) = O(store);
        P(store) = pj;
        O(store) = oj;
        store += below;
    }
    P(right) = P(store);
    O(right) = O(store);
    P(store) = pivot;
    O(store) = pivot_index;
    return store;
    """.replace("REAL", REAL)

    @wp.func_native(_PARTITION_POINTS_SNIPPET)
    def partition_points(
        pts: wp.array(dtype=V), order: wp.array(dtype=wp.int32), left: int, right: int, pick: int, axis: int
    ) -> int: ...

    # partition_items: partition_points on records, natively. Each of the partition's moves
    # is then one 16-byte copy, where a point and its index take three stores; a CPU build on
    # one thread measured 0.77 -> 0.53 ms at 10^4 points and 11.1 -> 7.8 ms at 10^5 (the
    # same partition written in Warp on the records gained ~1.2x, not ~1.45x). The key is
    # loaded at the axis's offset, not taken from the record's copy (see partition_points).
    _PARTITION_SNIPPET = r"""
    struct Record { REAL p[3]; wp::int32 i; };  // Item's layout (checked in Python)
    char* data = (char*)items.data;
    const size_t step = (size_t)items.strides[0];
    auto at = [&](int t) -> Record& { return *(Record*)(data + (size_t)t * step); };
    const Record pivot = at(pick);
    at(pick) = at(right);
    const REAL key = pivot.p[axis];
    const wp::int32 pivot_index = pivot.i;
    int store = left;
    const size_t off = (size_t)axis * sizeof(REAL);
    for (int j = left; j < right; ++j) {
        const char* pj = data + (size_t)j * step;
        const REAL c = *(const REAL*)(pj + off);
        const wp::int32 ri = ((const Record*)pj)->i;
        const Record r = at(j);
        const int below = (c < key) | ((c == key) & (ri < pivot_index));
        at(j) = at(store);
        at(store) = r;
        store += below;
    }
    at(right) = at(store);
    at(store) = pivot;
    return store;
    """.replace("REAL", REAL)

    @wp.func_native(_PARTITION_SNIPPET)
    def partition_items(items: wp.array(dtype=Item), left: int, right: int, pick: int, axis: int) -> int: ...

    @func
    def split_node(
        pts: wp.array(dtype=V),
        order: wp.array(dtype=wp.int32),
        items: wp.array(dtype=Item),
        base: int,
        packed: bool,
        n: int,
        parts: int,
        i: int,
    ):
        # Node i of a level with `parts` nodes: put its point of rank m along its widest axis
        # at the children's boundary.
        s = part(i, n, parts)
        e = part(i + 1, n, parts)
        m = part(2 * i + 1, n, 2 * parts)
        axis = split_axis(pts, items, base, packed, s, e)
        if m < e:
            # Quickselect of position m along the axis, keys compared as (coordinate, original
            # index): all distinct, so duplicated points cannot unbalance a step.
            left = s
            right = e - 1
            while left < right:
                span = right - left
                pick = left + span // 2
                if span > 4 * SAMPLE:
                    # The pivot is the sample element at the target's relative rank, so the
                    # target's side shrinks fast (Floyd and Rivest's idea, one pivot).
                    keys = Sample()
                    at = SampleAt()
                    for si in range(SAMPLE):
                        # One place drawn (by a hash of the range) from each of SAMPLE equal
                        # strata: evenly spaced places made a point repeated 50 times in a row
                        # (np.repeat) build 25% slower than the same points shuffled.
                        h = int(wp.rand_init(left, si) % wp.uint32(span + 1))
                        t = left + part(si, span + 1, SAMPLE) + h // SAMPLE
                        v = point_at(pts, items, base, packed, t)[axis]
                        vi = index_at(order, items, base, packed, t)
                        sj = si
                        # sorted as the partition compares: (coordinate, original index)
                        while sj > 0 and (
                            keys[sj - 1] > v
                            or (keys[sj - 1] == v and index_at(order, items, base, packed, at[sj - 1]) > vi)
                        ):
                            keys[sj] = keys[sj - 1]
                            at[sj] = at[sj - 1]
                            sj -= 1
                        keys[sj] = v
                        at[sj] = t
                    pick = at[((m - left) * (SAMPLE - 1) + span // 2) // span]
                store = int(0)
                if packed:
                    store = partition_items(items, left - base, right - base, pick - base, axis) + base
                else:
                    store = partition_points(pts, order, left, right, pick, axis)
                if m < store:
                    right = store - 1
                elif m > store:
                    left = store + 1
                else:
                    break

    @func
    def pack(
        pts: wp.array(dtype=V), order: wp.array(dtype=wp.int32), items: wp.array(dtype=Item), base: int, s: int, e: int
    ):
        for t in range(s, e):
            r = Item()
            r.p = pts[t]
            r.i = order[t]
            items[t - base] = r

    @func
    def unpack(
        items: wp.array(dtype=Item), base: int, s: int, e: int, pts: wp.array(dtype=V), order: wp.array(dtype=wp.int32)
    ):
        for t in range(s, e):
            r = items[t - base]
            pts[t] = r.p
            order[t] = r.i

    @func
    def merge_up(node: int, lo: wp.array(dtype=V), hi: wp.array(dtype=V), min_index: wp.array(dtype=wp.int32)):
        a = 2 * node
        lo[node] = wp.min(lo[a], lo[a + 1])
        hi[node] = wp.max(hi[a], hi[a + 1])
        min_index[node] = wp.min(min_index[a], min_index[a + 1])

    @kernel
    def tree_up(
        parts: int,
        stride: int,
        offset: int,
        lo: wp.array(dtype=V),
        hi: wp.array(dtype=V),
        min_index: wp.array(dtype=wp.int32),
    ):
        merge_up(parts + wp.tid() * stride + offset, lo, hi, min_index)

    @kernel
    def tree_init(
        points: wp.array(dtype=V), stride: int, offset: int, pts: wp.array(dtype=V), order: wp.array(dtype=wp.int32)
    ):
        # The points to be permuted; a non-finite one becomes (+inf, +inf, +inf).
        i = wp.tid() * stride + offset
        p = points[i]
        if not finite(p):
            p = V(T(wp.inf))
        pts[i] = p
        order[i] = i

    @kernel
    def tree_split(
        pts: wp.array(dtype=V),
        order: wp.array(dtype=wp.int32),
        items: wp.array(dtype=Item),
        parts: int,
        stride: int,
        offset: int,
    ):
        split_node(pts, order, items, 0, False, pts.shape[0], parts, wp.tid() * stride + offset)

    # A level split by sorting, for CUDA (a quickselect per node leaves the top levels to a
    # few GPU threads): every point's key is its coordinate along its node's split axis; a
    # stable sort by key, then a stable sort by node, puts each node's points in order within
    # its own range, so the median sits at the children's boundary. Ties split in any order:
    # the search needs exact boxes (merged bottom-up), not a particular tie order.

    @func
    def node_of(p: int, n: int, parts: int) -> int:
        # The node i of a level with `parts` nodes whose points [part(i), part(i + 1)) hold
        # position p: i = ceil((p + 1) parts / n) - 1.
        return int((wp.int64(p + 1) * wp.int64(parts) + wp.int64(n - 1)) // wp.int64(n)) - 1

    @kernel
    def tree_axes(pts: wp.array(dtype=V), items: wp.array(dtype=Item), parts: int, axes: wp.array(dtype=wp.int32)):
        i = wp.tid()
        n = pts.shape[0]
        axes[i] = split_axis(pts, items, 0, False, part(i, n, parts), part(i + 1, n, parts))

    @kernel
    def tree_keys(
        pts: wp.array(dtype=V),
        parts: int,
        axes: wp.array(dtype=wp.int32),
        keys: wp.array(dtype=T),
        places: wp.array(dtype=wp.int32),
    ):
        p = wp.tid()
        keys[p] = pts[p][axes[node_of(p, pts.shape[0], parts)]]
        places[p] = p

    @kernel
    def tree_node_keys(
        places: wp.array(dtype=wp.int32),
        n: int,
        parts: int,
        nodes: wp.array(dtype=wp.int32),
        out: wp.array(dtype=wp.int32),
    ):
        j = wp.tid()
        nodes[j] = node_of(places[j], n, parts)
        out[j] = places[j]

    @kernel
    def tree_gather(
        pts: wp.array(dtype=V),
        order: wp.array(dtype=wp.int32),
        places: wp.array(dtype=wp.int32),
        pts_out: wp.array(dtype=V),
        order_out: wp.array(dtype=wp.int32),
    ):
        j = wp.tid()
        pts_out[j] = pts[places[j]]
        order_out[j] = order[places[j]]

    @kernel
    def tree_subtrees(
        pts: wp.array(dtype=V),
        order: wp.array(dtype=wp.int32),
        items: wp.array(dtype=Item),
        parts: int,
        stride: int,
        offset: int,
        lo: wp.array(dtype=V),
        hi: wp.array(dtype=V),
        min_index: wp.array(dtype=wp.int32),
    ):
        # One thread builds the whole subtree under node (parts + r): its splits level by
        # level, its leaves' boxes, then its boxes bottom-up. A scatter launch's share
        # `offset % stride` (of `stride`) owns that row of `items`, room for `room` records: the
        # levels whose nodes do not fit split in place; below, each node is packed into the
        # row, split down to its leaves there, and unpacked (CUDA: no rows, nothing to split).
        r = wp.tid() * stride + offset
        n = pts.shape[0]
        leaves = lo.shape[0] // 2
        room = items.shape[0] // stride
        level = parts
        width = int(1)
        while level < leaves and (wp.int64(n) + wp.int64(level - 1)) // wp.int64(level) > wp.int64(room):
            for j in range(width):
                split_node(pts, order, items, 0, False, n, level, r * width + j)
            level = level * 2
            width = width * 2
        if level < leaves:
            for j in range(width):
                node = r * width + j
                s = part(node, n, level)
                e = part(node + 1, n, level)
                base = s - (offset % stride) * room
                pack(pts, order, items, base, s, e)
                sub = level
                below = int(1)
                while sub < leaves:
                    for jj in range(below):
                        split_node(pts, order, items, base, True, n, sub, node * below + jj)
                    sub = sub * 2
                    below = below * 2
                unpack(items, base, s, e, pts, order)
            width = width * (leaves // level)
            level = leaves
        for j in range(width):
            leaf = r * width + j
            node_box(pts, order, part(leaf, n, leaves), part(leaf + 1, n, leaves), leaves + leaf, lo, hi, min_index)
        while level > parts:
            level = level // 2
            width = width // 2
            for j in range(width):
                merge_up(level + r * width + j, lo, hi, min_index)
        if r == 0:
            # Node 0 is unused but returned (as a saved output): deterministic contents.
            lo[0] = V(T(0.0))
            hi[0] = V(T(0.0))
            min_index[0] = 0

    # The queries in Morton order: each search then walks the nodes, points and feature rows
    # the previous one walked, still in cache. Queries in a random order measured 1.1-1.3x
    # faster for kNN and 1.15-1.75x for the radius forward at 10^6 points. The cells split the
    # reference points' box, trimmed of its extremes (query_box), MORTON_CELLS ways per
    # axis; a query outside takes the nearest cell. The box stays on the device, so CUDA
    # needs no synchronisation.

    @func
    def spread_bits(x: int) -> int:
        # The low 10 bits of x, each followed by two zero bits: one axis of a Morton code.
        y = (x | (x << 16)) & 0x030000FF
        y = (y | (y << 8)) & 0x0300F00F
        y = (y | (y << 4)) & 0x030C30C3
        return (y | (y << 2)) & 0x09249249

    @func
    def cell(x: T, lo: T, hi: T) -> int:
        # x's cell of MORTON_CELLS across [lo, hi], clamped; 0 for an empty, flat or infinite box.
        ext = hi - lo
        c = int(0)
        if ext > T(0.0) and ext < T(wp.inf):
            c = int(wp.clamp((x - lo) / ext * T(float(MORTON_CELLS)), T(0.0), T(float(MORTON_CELLS - 1))))
        return c

    @kernel
    def query_box(
        pts: wp.array(dtype=V),
        lo: wp.array(dtype=V),
        hi: wp.array(dtype=V),
        stride: int,
        offset: int,
        box: wp.array(dtype=V),
    ):
        # The box the query cells split (one thread): the reference points' box without its
        # extremes, so that one far point does not put every query in one cell. From
        # MORTON_SAMPLE of the tree's points (`pts`, in the tree's order: one from each
        # 1/MORTON_SAMPLE of the tree), per axis the third smallest and third largest; the
        # root box (lo[1], hi[1]) when fewer than MORTON_SAMPLE / 4 of them are finite.
        n = pts.shape[0]
        l1 = V(T(wp.inf))  # the three smallest per axis, l1 <= l2 <= l3
        l2 = l1
        l3 = l1
        h1 = V(T(-wp.inf))  # and the three largest, h1 >= h2 >= h3
        h2 = h1
        h3 = h1
        count = int(0)
        for j in range(MORTON_SAMPLE):
            p = pts[int((wp.int64(2 * j + 1) * wp.int64(n)) // wp.int64(2 * MORTON_SAMPLE))]
            if finite(p):
                count += 1
                l3 = wp.min(l3, wp.max(l2, p))
                l2 = wp.min(l2, wp.max(l1, p))
                l1 = wp.min(l1, p)
                h3 = wp.max(h3, wp.min(h2, p))
                h2 = wp.max(h2, wp.min(h1, p))
                h1 = wp.max(h1, p)
        if count >= MORTON_SAMPLE // 4:
            box[0] = l3
            box[1] = h3
        else:
            box[0] = lo[1]
            box[1] = hi[1]

    @kernel
    def query_keys(
        query: wp.array(dtype=V),
        box: wp.array(dtype=V),
        stride: int,
        offset: int,
        keys: wp.array(dtype=wp.int32),
        places: wp.array(dtype=wp.int32),
    ):
        i = wp.tid() * stride + offset
        q = query[i]
        key = int(MORTON_LAST)  # a query that is not finite goes last
        if finite(q):
            a = box[0]
            b = box[1]
            x = spread_bits(cell(q[0], a[0], b[0]))
            y = spread_bits(cell(q[1], a[1], b[1]))
            z = spread_bits(cell(q[2], a[2], b[2]))
            key = x | (y << 1) | (z << 2)
        keys[i] = key
        places[i] = i

    @func
    def query_at(t: int, queries: wp.array(dtype=wp.int32)) -> int:
        # The t-th point (query, or reference) to take: queries[t], or point t itself where
        # that is -1.
        i = queries[t]
        if i < 0:
            i = t
        return i

    @kernel
    def radius_forward(
        query: wp.array(dtype=V),
        features: wp.array2d(dtype=T),
        order: wp.array(dtype=wp.int32),
        sorted_points: wp.array(dtype=V),
        lo: wp.array(dtype=V),
        hi: wp.array(dtype=V),
        min_index: wp.array(dtype=wp.int32),
        radius: T,
        sigma: T,
        queries: wp.array(dtype=wp.int32),
        stride: int,
        offset: int,
        out: wp.array2d(dtype=T),
        stats: wp.array2d(dtype=T),
        neighbours: wp.array2d(dtype=wp.int32),
        features4: wp.array2d(dtype=V4),
        out4: wp.array2d(dtype=V4),
    ):
        # `neighbours` keeps the first neighbours' places in the tree (as many as fit) for the
        # CPU backward, which then needs no search for the queries that have no more. The *4
        # arrays, when not empty, view the feature rows as groups of 4.
        i = query_at(wp.tid() * stride + offset, queries)
        q = query[i]
        nf = features.shape[1]
        n4 = out4.shape[1]
        listed = neighbours.shape[1]
        for f in range(nf):
            out[i, f] = T(0.0)
        total = T(0.0)  # sum of the shifted weights exp((nearest - d) / sigma)
        nearest = T(0.0)
        found = int(0)
        count = int(0)  # neighbours: sizes the backward's pair list
        n = sorted_points.shape[0]
        leaves = lo.shape[0] // 2
        depth = levels(leaves)
        stack = Stack()
        sp = int(0)
        reach = sq_bound(radius)  # boxes and points beyond are certainly outside the ball
        if finite(q) and near_box(q, lo[1], hi[1], reach, radius):
            stack[0] = 1
            sp = 1
        while sp > 0:
            sp -= 1
            node = stack[sp]
            if node < leaves:
                child = 2 * node
                if near_box(q, lo[child + 1], hi[child + 1], reach, radius):
                    stack[sp] = child + 1
                    sp += 1
                if near_box(q, lo[child], hi[child], reach, radius):
                    stack[sp] = child
                    sp += 1
            else:
                for s in range(leaf_start(node - leaves, n, depth), leaf_start(node - leaves + 1, n, depth)):
                    diff = q - sorted_points[s]
                    if wp.dot(diff, diff) > reach:
                        continue
                    d = norm(diff)
                    if d <= radius:
                        j = order[s]
                        if found == 0 or d < nearest:
                            # A new nearest neighbour: rescale what was summed so far so
                            # that every weight stays <= 1 (online softmax).
                            scale = T(0.0)
                            if found != 0:
                                scale = wp.exp((d - nearest) / sigma)
                            total = total * scale
                            if n4 > 0:
                                for f in range(n4):
                                    out4[i, f] = out4[i, f] * scale
                            else:
                                row_scale(out, i, scale, nf)
                            nearest = d
                            found = 1
                        w = wp.exp((nearest - d) / sigma)
                        total += w
                        if count < listed:
                            neighbours[i, count] = s
                        count += 1
                        if n4 > 0:
                            for f in range(n4):
                                out4[i, f] = out4[i, f] + w * features4[j, f]
                        else:
                            row_axpy(out, i, w, features, j, nf)
        if found != 0:
            row_scale(out, i, T(1.0) / total, nf)
        stats[i, 0] = total
        stats[i, 1] = nearest
        stats[i, 2] = T(count)

    # The radius backward starts with one pass over the queries (radius_backward_query). On
    # the CPU that pass also adds the reference side into per-thread copies (the whole
    # backward), or records the pairs for a pass over the references (radius_backward_ref_pairs);
    # on CUDA a pass over the references searches a tree over the queries
    # (radius_backward_ref). No atomics on any path. See _run._radius_backward.
    # With out_i = sum_j p_ij f_j, p_ij = w_ij / W_i and g_i = dL/dout_i:
    #   dL/df_j    = sum_i p_ij g_i
    #   dL/dd_ij   = p_ij (g_i.out_i - g_i.f_j) / sigma      (the exponent's shift cancels)
    #   dd_ij/dq_i = (q_i - r_j) / d_ij = -dd_ij/dr_j         (taken as 0 where they coincide)

    @kernel
    def radius_backward_ref(
        ref: wp.array(dtype=V),
        features: wp.array2d(dtype=T),
        q_order: wp.array(dtype=wp.int32),
        q_sorted: wp.array(dtype=V),
        q_lo: wp.array(dtype=V),
        q_hi: wp.array(dtype=V),
        q_min_index: wp.array(dtype=wp.int32),
        radius: T,
        sigma: T,
        stats: wp.array2d(dtype=T),
        grad: wp.array2d(dtype=T),
        g_out: wp.array(dtype=T),
        need_ref: int,
        need_features: int,
        refs: wp.array(dtype=wp.int32),
        stride: int,
        offset: int,
        d_ref: wp.array(dtype=V),
        d_features: wp.array2d(dtype=T),
    ):
        j = query_at(wp.tid() * stride + offset, refs)
        r = ref[j]
        nf = features.shape[1]
        dr = V(T(0.0))
        if need_features != 0:
            for f in range(nf):
                d_features[j, f] = T(0.0)
        m = q_sorted.shape[0]
        leaves = q_lo.shape[0] // 2
        depth = levels(leaves)
        stack = Stack()
        sp = int(0)
        reach = sq_bound(radius)
        if finite(r) and near_box(r, q_lo[1], q_hi[1], reach, radius):
            stack[0] = 1
            sp = 1
        while sp > 0:
            sp -= 1
            node = stack[sp]
            if node < leaves:
                child = 2 * node
                if near_box(r, q_lo[child + 1], q_hi[child + 1], reach, radius):
                    stack[sp] = child + 1
                    sp += 1
                if near_box(r, q_lo[child], q_hi[child], reach, radius):
                    stack[sp] = child
                    sp += 1
            else:
                for s in range(leaf_start(node - leaves, m, depth), leaf_start(node - leaves + 1, m, depth)):
                    diff = q_sorted[s] - r  # q - r, exactly as the forward computed it
                    if wp.dot(diff, diff) > reach:
                        continue
                    d = norm(diff)
                    if d <= radius:
                        i = q_order[s]
                        p = wp.exp((stats[i, 1] - d) / sigma) / stats[i, 0]
                        if need_features != 0:
                            row_axpy(d_features, j, p, grad, i, nf)
                        if need_ref != 0 and d > T(0.0):
                            g_f = row_dot(grad, i, features, j, nf)
                            dr -= diff * (p * (g_out[i] - g_f) / (sigma * d))
        if need_ref != 0:
            d_ref[j] = dr

    # On the CPU the radius backward keeps the query pass's search and records each pair
    # (query, reference, p, dr coefficient) at a fixed place in a list sized by the forward's
    # neighbour counts; the reference side then gathers over that list, transposed, instead of
    # searching a tree over the queries. Fixed positions: deterministic with any chunking.

    @kernel
    def pair_counts(stats: wp.array2d(dtype=T), counts: wp.array(dtype=wp.int32)):
        i = wp.tid()
        counts[i] = int(stats[i, 2])

    @func
    def backward_pair(
        i: int,
        s: int,
        k: int,
        diff: V,
        d: T,
        nearest: T,
        inv: T,
        go: T,
        sigma: T,
        order: wp.array(dtype=wp.int32),
        features: wp.array2d(dtype=T),
        grad: wp.array2d(dtype=T),
        geometry: int,
        need_ref: int,
        need_features: int,
        scatter: int,
        slot: int,
        pair_query: wp.array(dtype=wp.int32),
        pair_ref: wp.array(dtype=wp.int32),
        pair_p: wp.array(dtype=T),
        pair_c: wp.array(dtype=T),
        d_ref: wp.array(dtype=V),
        d_features: wp.array2d(dtype=T),
        ref_slots: wp.array2d(dtype=V),
        feature_slots: wp.array3d(dtype=T),
        features4: wp.array2d(dtype=V4),
        grad4: wp.array2d(dtype=V4),
        d_features4: wp.array2d(dtype=V4),
        feature_slots4: wp.array3d(dtype=V4),
    ) -> T:
        # One pair (query i, the point at tree place s): returns c with dL/dq_i += c diff and
        # dL/dr_j -= c diff. With `scatter`, adds the reference side's terms into thread
        # `slot`'s copy (slot 0: the gradients themselves); with pair arrays, records the pair
        # at place k. The *4 arrays, when not empty, view the feature rows as groups of 4.
        j = order[s]
        p = wp.exp((nearest - d) / sigma) * inv
        c = T(0.0)
        if geometry != 0 and d > T(0.0):
            c = p * (go - feature_dot(grad, grad4, i, features, features4, j)) / (sigma * d)
        if scatter != 0:
            if need_features != 0:
                # CPU only (scatter): each thread adds into its own copy, no atomics needed
                add_feature_row(p, i, j, slot, 0, grad, grad4, d_features, d_features4, feature_slots, feature_slots4)
            if need_ref != 0:
                if slot == 0:
                    d_ref[j] = d_ref[j] - diff * c
                else:
                    ref_slots[slot - 1, j] = ref_slots[slot - 1, j] - diff * c
        if pair_query.shape[0] > 0:
            pair_query[k] = i
            pair_ref[k] = j
            pair_p[k] = p
            pair_c[k] = c
        return c

    @kernel
    def radius_backward_query(
        query: wp.array(dtype=V),
        features: wp.array2d(dtype=T),
        order: wp.array(dtype=wp.int32),
        sorted_points: wp.array(dtype=V),
        lo: wp.array(dtype=V),
        hi: wp.array(dtype=V),
        min_index: wp.array(dtype=wp.int32),
        radius: T,
        sigma: T,
        out: wp.array2d(dtype=T),
        stats: wp.array2d(dtype=T),
        neighbours: wp.array2d(dtype=wp.int32),
        grad: wp.array2d(dtype=T),
        need_query: int,
        need_ref: int,
        need_features: int,
        scatter: int,
        offsets: wp.array(dtype=wp.int32),
        queries: wp.array(dtype=wp.int32),
        stride: int,
        offset: int,
        g_out: wp.array(dtype=T),
        d_query: wp.array(dtype=V),
        pair_query: wp.array(dtype=wp.int32),
        pair_ref: wp.array(dtype=wp.int32),
        pair_p: wp.array(dtype=T),
        pair_c: wp.array(dtype=T),
        d_ref: wp.array(dtype=V),
        d_features: wp.array2d(dtype=T),
        ref_slots: wp.array2d(dtype=V),
        feature_slots: wp.array3d(dtype=T),
        features4: wp.array2d(dtype=V4),
        grad4: wp.array2d(dtype=V4),
        d_features4: wp.array2d(dtype=V4),
        feature_slots4: wp.array3d(dtype=V4),
    ):
        # The queries' gradient over each query's neighbours: the ones the forward listed, or a
        # search of the tree for a query with more. Besides, by the arrays it is given:
        # - `scatter` (the CPU's one pass; `offset % stride` is the slot): the reference side's
        #   terms, added into the thread's copy of their gradients;
        # - pair arrays (the CPU's pair list): each pair, recorded at offsets[i] onwards;
        # - `g_out` (two searches): g.out per query, for the reference pass.
        i = query_at(wp.tid() * stride + offset, queries)
        nf = features.shape[1]
        total = stats[i, 0]
        count = int(stats[i, 2])
        go = row_dot(grad, i, out, i, nf)
        if g_out.shape[0] > 0:
            g_out[i] = go
        record = pair_query.shape[0] > 0
        k = int(0)
        if record:
            k = offsets[i]
        geometry = int(need_query != 0 or need_ref != 0)
        walk = total > T(0.0) and (need_query != 0 or record or scatter != 0)
        q = query[i]
        nearest = stats[i, 1]
        inv = T(1.0) / wp.max(total, T(1e-30))
        dq = V(T(0.0))
        n = sorted_points.shape[0]
        leaves = lo.shape[0] // 2
        depth = levels(leaves)
        stack = Stack()
        sp = int(0)
        reach = sq_bound(radius)
        if walk and count <= neighbours.shape[1]:
            # every neighbour listed by the forward: the same pairs, in the same order
            for c in range(count):
                s = neighbours[i, c]
                diff = q - sorted_points[s]
                cd = backward_pair(
                    i, s, k, diff, norm(diff), nearest, inv, go, sigma, order, features, grad, geometry,
                    need_ref, need_features, scatter, offset % stride, pair_query, pair_ref, pair_p, pair_c,
                    d_ref, d_features, ref_slots, feature_slots, features4, grad4, d_features4, feature_slots4,
                )  # fmt: skip
                dq += diff * cd
                k += 1
        elif walk:
            stack[0] = 1
            sp = 1
        while sp > 0:
            sp -= 1
            node = stack[sp]
            if node < leaves:
                child = 2 * node
                if near_box(q, lo[child + 1], hi[child + 1], reach, radius):
                    stack[sp] = child + 1
                    sp += 1
                if near_box(q, lo[child], hi[child], reach, radius):
                    stack[sp] = child
                    sp += 1
            else:
                for s in range(leaf_start(node - leaves, n, depth), leaf_start(node - leaves + 1, n, depth)):
                    diff = q - sorted_points[s]
                    if wp.dot(diff, diff) > reach:
                        continue
                    d = norm(diff)
                    if d <= radius:
                        cd = backward_pair(
                            i, s, k, diff, d, nearest, inv, go, sigma, order, features, grad, geometry,
                            need_ref, need_features, scatter, offset % stride, pair_query, pair_ref, pair_p, pair_c,
                            d_ref, d_features, ref_slots, feature_slots, features4, grad4, d_features4,
                            feature_slots4,
                        )  # fmt: skip
                        dq += diff * cd
                        k += 1
        if need_query != 0:
            d_query[i] = dq

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
        ref_starts: wp.array(dtype=wp.int32),
        by_ref: wp.array(dtype=wp.int32),
        pair_query: wp.array(dtype=wp.int32),
        pair_p: wp.array(dtype=T),
        pair_c: wp.array(dtype=T),
        need_ref: int,
        need_features: int,
        stride: int,
        offset: int,
        d_ref: wp.array(dtype=V),
        d_features: wp.array2d(dtype=T),
    ):
        j = wp.tid() * stride + offset
        nf = grad.shape[1]
        if need_features != 0:
            for f in range(nf):
                d_features[j, f] = T(0.0)
        dr = V(T(0.0))
        r = ref[j]
        for s in range(ref_starts[j], ref_starts[j + 1]):
            k = by_ref[s]
            i = pair_query[k]
            if need_features != 0:
                row_axpy(d_features, j, pair_p[k], grad, i, nf)
            if need_ref != 0:
                dr -= (query[i] - r) * pair_c[k]
        if need_ref != 0:
            d_ref[j] = dr

    @kernel
    def knn_search(
        query: wp.array(dtype=V),
        order: wp.array(dtype=wp.int32),
        sorted_points: wp.array(dtype=V),
        lo: wp.array(dtype=V),
        hi: wp.array(dtype=V),
        min_index: wp.array(dtype=wp.int32),
        k: int,
        features: wp.array2d(dtype=T),
        sigma: T,
        queries: wp.array(dtype=wp.int32),
        stride: int,
        offset: int,
        dist: wp.array2d(dtype=T),
        idx: wp.array2d(dtype=wp.int64),
        out: wp.array2d(dtype=T),
    ):
        # With a non-empty `out`, also aggregates (knn_aggregate) while the row is hot in cache.
        i = query_at(wp.tid() * stride + offset, queries)
        knn_query(query[i], order, sorted_points, lo, hi, min_index, k, i, dist, idx, features)
        if out.shape[0] > 0:
            aggregate_row(features, dist, idx, sigma, i, out)

    @kernel
    def knn_backward(
        query: wp.array(dtype=V),
        ref: wp.array(dtype=V),
        idx: wp.array2d(dtype=wp.int64),
        grad: wp.array2d(dtype=T),
        need_query: int,
        need_ref: int,
        queries: wp.array(dtype=wp.int32),
        stride: int,
        offset: int,
        d_query: wp.array(dtype=V),
        d_ref: wp.array(dtype=V),
        ref_slots: wp.array2d(dtype=V),
    ):
        # On the CPU slot `offset % stride` > 0 adds into ref_slots[slot - 1] (slot 0 into d_ref).
        i, slot = query_at(wp.tid() * stride + offset, queries), offset % stride
        q = query[i]
        dq = V(T(0.0))
        for n in range(idx.shape[1]):
            j = idx[i, n]
            if j >= wp.int64(0):
                diff = q - ref[j]
                d = norm(diff)
                if d > T(0.0):
                    v = diff * (grad[i, n] / d)
                    dq += v
                    if need_ref != 0:
                        if slot == 0:
                            wp.atomic_sub(d_ref, int(j), v)
                        else:
                            wp.atomic_sub(ref_slots, slot - 1, int(j), v)
        if need_query != 0:
            d_query[i] = dq

    @kernel
    def knn_aggregate_backward(
        query: wp.array(dtype=V),
        ref: wp.array(dtype=V),
        features: wp.array2d(dtype=T),
        dist: wp.array2d(dtype=T),
        idx: wp.array2d(dtype=wp.int64),
        sigma: T,
        out: wp.array2d(dtype=T),
        grad: wp.array2d(dtype=T),
        need_query: int,
        need_ref: int,
        need_features: int,
        queries: wp.array(dtype=wp.int32),
        stride: int,
        offset: int,
        d_query: wp.array(dtype=V),
        d_ref: wp.array(dtype=V),
        d_features: wp.array2d(dtype=T),
        ref_slots: wp.array2d(dtype=V),
        feature_slots: wp.array3d(dtype=T),
        features4: wp.array2d(dtype=V4),
        grad4: wp.array2d(dtype=V4),
        d_features4: wp.array2d(dtype=V4),
        feature_slots4: wp.array3d(dtype=V4),
    ):
        # Same algebra as the radius backward, with the k nearest in place of the ball. On the
        # CPU slot `offset % stride` > 0 adds into the slots `slot - 1` (slot 0 into d_ref, d_features).
        # The *4 arrays, when not empty, view the same rows as groups of 4 (F % 4 == 0): the
        # feature terms then go 4 at a time.
        i, slot = query_at(wp.tid() * stride + offset, queries), offset % stride
        nf = features.shape[1]
        nearest = dist[i, 0]
        total = T(0.0)
        for n in range(idx.shape[1]):
            if idx[i, n] >= wp.int64(0):
                total += wp.exp((nearest - dist[i, n]) / sigma)
        if total > T(0.0):
            q = query[i]
            inv = T(1.0) / total
            g_out = row_dot(grad, i, out, i, nf)
            dq = V(T(0.0))
            for n in range(idx.shape[1]):
                j64 = idx[i, n]
                if j64 >= wp.int64(0):
                    j = int(j64)
                    p = wp.exp((nearest - dist[i, n]) / sigma) * inv
                    if need_features != 0:
                        add_feature_row(
                            p, i, j, slot, 1, grad, grad4, d_features, d_features4, feature_slots, feature_slots4
                        )
                    if need_query != 0 or need_ref != 0:
                        diff = q - ref[j]
                        d = norm(diff)
                        if d > T(0.0):
                            g_f = feature_dot(grad, grad4, i, features, features4, j)
                            v = diff * (p * (g_out - g_f) / (sigma * d))
                            dq += v
                            if need_ref != 0:
                                if slot == 0:
                                    wp.atomic_sub(d_ref, j, v)
                                else:
                                    wp.atomic_sub(ref_slots, slot - 1, j, v)
            if need_query != 0:
                d_query[i] = dq

    return _Kernels(
        T=T,
        V=V,
        Item=Item,
        tree_init=tree_init,
        tree_split=tree_split,
        tree_axes=tree_axes,
        tree_keys=tree_keys,
        tree_node_keys=tree_node_keys,
        tree_gather=tree_gather,
        tree_subtrees=tree_subtrees,
        tree_up=tree_up,
        query_box=query_box,
        query_keys=query_keys,
        radius_forward=radius_forward,
        radius_backward_query=radius_backward_query,
        radius_backward_ref=radius_backward_ref,
        pair_counts=pair_counts,
        pairs_by_ref=pairs_by_ref,
        radius_backward_ref_pairs=radius_backward_ref_pairs,
        knn_search=knn_search,
        knn_backward=knn_backward,
        knn_aggregate_backward=knn_aggregate_backward,
        module=module,
    )


class _Kernels:
    def __init__(self, **kw: Any):
        self.__dict__.update(kw)


# -- CPU teams -------------------------------------------------------------------------------

TEAM_ARGS_MAX = 8192  # the largest argument struct a team launch copies per thread (bytes)
TEAM_BOUNDS_MAX = 64  # and the largest launch bounds

# The native body of `team_launch`: a GNU OpenMP region (GOMP_parallel, by its address) whose
# threads run another kernel's compiled CPU entry point over the `m` queries from `base` on:
# chunks of `chunk` queries, taken in turn (`next`, atomic), or, with `chunk` 0, the interleaved
# shares of `slots` scatter slots (slot s: queries base + s, base + s + slots, ...; stride
# `slots`, offset base + s, with `base` a multiple of `slots`, so the kernel finds its slot as
# offset % stride), so a slot's sums do not depend on which thread runs it. Each thread patches its own copy of the argument struct
# (stride and offset) and of the launch bounds (the count). Layouts come from ctypes.
_TEAM_SNIPPET = r"""
struct wb_team_job {
    void* gomp_parallel;
    void* forward;
    const char* args;
    const char* bounds;
    long long args_size, bounds_size, stride_at, offset_at, size_at;
    long long base, m, chunk, slots, threads, next;
};
auto body = [](void* p) {
    wb_team_job* job = (wb_team_job*)p;
    alignas(16) char args[TEAM_ARGS_MAX];
    alignas(16) char bounds[TEAM_BOUNDS_MAX];
    for (long long i = 0; i < job->args_size; ++i) args[i] = job->args[i];
    for (long long i = 0; i < job->bounds_size; ++i) bounds[i] = job->bounds[i];
    void (*forward)(void*, void*) = (void (*)(void*, void*))job->forward;
    for (;;) {
        long long s = __atomic_fetch_add(&job->next, 1LL, __ATOMIC_RELAXED);
        long long count, stride, offset;
        if (job->chunk == 0) {
            if (s >= job->slots) break;
            count = s < job->m ? (job->m - s + job->slots - 1) / job->slots : 0;
            stride = job->slots;
            offset = job->base + s;
        } else {
            if (s >= (job->m + job->chunk - 1) / job->chunk) break;
            offset = s * job->chunk;
            count = job->m - offset < job->chunk ? job->m - offset : job->chunk;
            offset += job->base;
            stride = 1;
        }
        if (count == 0) continue;
        *(int*)(args + job->stride_at) = (int)stride;
        *(int*)(args + job->offset_at) = (int)offset;
        *(unsigned int*)bounds = (unsigned int)count;
        *(unsigned long long*)(bounds + job->size_at) = (unsigned long long)count;
        forward(bounds, args);
    }
};
wb_team_job* team_job = (wb_team_job*)job;
((void (*)(void (*)(void*), void*, unsigned, unsigned))team_job->gomp_parallel)(
    body, team_job, (unsigned)team_job->threads, 0u);
""".replace("TEAM_ARGS_MAX", str(TEAM_ARGS_MAX)).replace("TEAM_BOUNDS_MAX", str(TEAM_BOUNDS_MAX))

TEAM_JOB = (
    ("gomp_parallel", "forward", "args", "bounds"),  # pointers
    ("args_size", "bounds_size", "stride_at", "offset_at", "size_at", "base", "m", "chunk", "slots", "threads", "next"),
)


@functools.cache
def team() -> Any:
    """The CPU team launch: a kernel of one thread whose native body runs a job (a pointer to
    a struct of TEAM_JOB's fields, see _TEAM_SNIPPET) on the threads of a GNU OpenMP team.
    Its own module: it is never compiled for CUDA."""

    @wp.func_native(_TEAM_SNIPPET)
    def run_team_job(job: wp.uint64): ...

    def team_launch(job: wp.uint64):
        run_team_job(job)

    return wp.kernel(team_launch, enable_backward=False, module="warpbridge_cpu_team")
