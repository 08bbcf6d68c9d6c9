"""Warp kernels for the point-cloud ops: a dense uniform grid, radius and kNN searches, and
hand-written adjoints.

Why hand-written: Warp's generated adjoint does not replay dynamic loops (a neighbour search is
one), so values computed inside them are gone when the adjoint runs; that is why the
tutorial's kernel gets zero feature gradients. These adjoints are derived by hand and proven
against float64 references in ``tests/test_points.py``. No kernel here has a Warp adjoint
(``enable_backward=False``), which also halves compile time.

The grid is dense over the reference points' bounding box; its cell width lives on the device
(``geom``), so building it needs no host synchronisation on CUDA. Cells are at least
``min_cell`` wide (the radius, for radius searches: at most 3 cells per axis to visit) and
there are at most ``capacity`` of them (allocated from the point count alone). Points that are
not finite go to a dead bucket at index ``capacity`` that no search visits: they are nobody's
neighbour.

Every per-query kernel takes ``stride`` and ``offset`` and handles queries
``tid * stride + offset``: on the CPU, where a Warp kernel runs on one thread, warpbridge
launches one interleaved share per thread (ctypes launches release the GIL). Scatter targets
have a leading *slot* dimension, one per CPU thread, summed in a fixed order afterwards, so
results are deterministic on the CPU without atomics contending.
"""

# No `from __future__ import annotations`: Warp evaluates the kernels' annotations, which
# refer to the closure's types.
import functools
from typing import Any

import warp as wp

# Cells over capacity = cells_per_point * N + GRID_SLACK; the dead bucket and the scan's end take two more.
GRID_SLACK = 64
KNN_LOCAL = 16  # the largest k whose weights the aggregation keeps in a local vector


@functools.cache
def kernels(scalar: Any) -> Any:
    """All point kernels for one float type (wp.float32 or wp.float64), in one module."""
    T = scalar
    V = wp.types.vector(3, T)
    V4 = wp.types.vector(4, T)  # feature rows seen as groups of 4 (F % 4 == 0): ~2x faster gathers
    VK = wp.types.vector(KNN_LOCAL, T)  # per-query kNN weights, in registers or on the stack
    module = f"warpbridge_points_{T.__name__}"

    def kernel(f):
        return wp.kernel(f, enable_backward=False, module=module)

    def func(f):
        return wp.func(f, module=module)

    @func
    def cells_for(ext: V, h: T) -> T:
        # In T, not int: ext / h may exceed any integer while h grows.
        return (wp.floor(ext[0] / h) + T(1.0)) * (wp.floor(ext[1] / h) + T(1.0)) * (wp.floor(ext[2] / h) + T(1.0))

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
        # wp.isfinite measured ~8 ns per call on the CPU, half the cost of a grid-build pass;
        # a NaN fails the comparison as an infinity does.
        return wp.abs(p[0]) < T(wp.inf) and wp.abs(p[1]) < T(wp.inf) and wp.abs(p[2]) < T(wp.inf)

    @func
    def axis_gap(x: T, o: T, h: T, c: int) -> T:
        # Distance along one axis from x to cell c's slab [o + c h, o + (c + 1) h].
        lo = o + T(c) * h
        return wp.max(wp.max(lo - x, x - (lo + h)), T(0.0))

    @func
    def aggregate_row(
        features: wp.array2d(dtype=T),
        features4: wp.array2d(dtype=V4),
        dist: wp.array2d(dtype=T),
        idx: wp.array2d(dtype=wp.int64),
        sigma: T,
        i: int,
        out: wp.array2d(dtype=T),
        out4: wp.array2d(dtype=V4),
    ):
        # out_i = sum_n softmax(-dist_i / sigma)_n f_idx[i, n], shifted by the nearest distance.
        # `features4`/`out4`, when not empty, view the same rows as groups of 4; with k <= 16
        # the weights then sit in a local vector and each group of 4 is summed in a register
        # and stored once (~1.4x faster than accumulating into `out`).
        nf = features.shape[1]
        n4 = features4.shape[1]
        k = idx.shape[1]
        nearest = dist[i, 0]
        if n4 > 0 and k <= KNN_LOCAL:
            weights = VK()
            total = T(0.0)
            for n in range(k):
                wn = T(0.0)
                if idx[i, n] >= wp.int64(0):
                    wn = wp.exp((nearest - dist[i, n]) / sigma)
                weights[n] = wn
                total += wn
            scale = T(0.0)
            if total > T(0.0):
                scale = T(1.0) / total
            for f in range(n4):
                acc = V4(T(0.0))
                for n in range(k):
                    j = idx[i, n]
                    if j >= wp.int64(0):
                        acc = acc + weights[n] * features4[int(j), f]
                out4[i, f] = acc * scale
        else:
            for f in range(nf):
                out[i, f] = T(0.0)
            total = T(0.0)
            for n in range(k):
                j = idx[i, n]
                if j >= wp.int64(0):
                    w = wp.exp((nearest - dist[i, n]) / sigma)
                    total += w
                    row_axpy(out, i, w, features, int(j), nf)
            if total > T(0.0):
                row_scale(out, i, T(1.0) / total, nf)

    @func
    def knn_consider(
        q: V,
        sorted_points: wp.array(dtype=V),
        order: wp.array(dtype=wp.int32),
        s: int,
        i: int,
        k: int,
        count: int,
        dist: wp.array2d(dtype=T),
        idx: wp.array2d(dtype=wp.int64),
    ) -> int:
        # Insert candidate s into query i's sorted top-k (distance, then index); returns the
        # new count. Most candidates are rejected on the squared distance, with a margin so
        # that rounding never rejects a tie.
        diff = q - sorted_points[s]
        d2 = wp.dot(diff, diff)
        new_count = count
        last = dist[i, k - 1]
        if count < k or d2 <= last * last * T(1.000001) + T(1e-30):
            d = wp.sqrt(d2)
            j = wp.int64(order[s])
            if count < k or d < last or (d == last and j < idx[i, k - 1]):
                pos = wp.min(count, k - 1)
                while pos > 0 and (d < dist[i, pos - 1] or (d == dist[i, pos - 1] and j < idx[i, pos - 1])):
                    dist[i, pos] = dist[i, pos - 1]
                    idx[i, pos] = idx[i, pos - 1]
                    pos -= 1
                dist[i, pos] = d
                idx[i, pos] = j
                if count < k:
                    new_count = count + 1
        return new_count

    @func
    def search_reach(radius: T) -> T:
        # Cells are chosen a hair wider than the ball, so that a pair whose rounded distance
        # is <= radius is found from either side's grid.
        return radius * T(1.0001) + T(1e-30)

    @func
    def coord(x: T, o: T, h: T, d: int) -> int:
        c = wp.floor((x - o) / h)
        return int(wp.clamp(c, T(0.0), T(d - 1)))

    @func
    def ball_cells(p: V, radius: T, geom: wp.array(dtype=T), dims: wp.array(dtype=wp.int32)):
        """The first and last cell, per axis, that a ball around p can touch."""
        h = geom[3]
        reach = search_reach(radius)
        lo = wp.vec3i(
            coord(p[0] - reach, geom[0], h, dims[0]),
            coord(p[1] - reach, geom[1], h, dims[1]),
            coord(p[2] - reach, geom[2], h, dims[2]),
        )
        hi = wp.vec3i(
            coord(p[0] + reach, geom[0], h, dims[0]),
            coord(p[1] + reach, geom[1], h, dims[1]),
            coord(p[2] + reach, geom[2], h, dims[2]),
        )
        return lo, hi

    @kernel
    def grid_init(lohi: wp.array(dtype=V)):
        lohi[0] = V(T(wp.inf))
        lohi[1] = V(T(-wp.inf))

    @kernel
    def grid_bounds(points: wp.array(dtype=V), lohi: wp.array(dtype=V)):
        i = wp.tid()
        p = points[i]
        if finite(p):
            wp.atomic_min(lohi, 0, p)
            wp.atomic_max(lohi, 1, p)

    @kernel
    def grid_setup(
        lohi: wp.array(dtype=V),
        capacity: int,
        min_cell: T,
        geom: wp.array(dtype=T),
        dims: wp.array(dtype=wp.int32),
    ):
        lo = lohi[0]
        hi = lohi[1]
        if not (lo[0] <= hi[0]):  # no finite point at all
            lo = V(T(0.0))
            hi = V(T(0.0))
        ext = hi - lo
        emax = wp.max(wp.max(ext[0], ext[1]), ext[2])
        cap = T(capacity)
        h = wp.max(min_cell, emax / wp.pow(cap, T(1.0) / T(3.0)))
        if not (h > T(0.0)):
            h = T(1.0)
        while cells_for(ext, h) > cap:
            h = h * T(1.25)
        # Shrink while the grid still fits: flat and elongated clouds get finer cells.
        it = int(0)
        while it < 64:
            h2 = h * T(0.8)
            if h2 < min_cell or cells_for(ext, h2) > cap:
                break
            h = h2
            it += 1
        geom[0] = lo[0]
        geom[1] = lo[1]
        geom[2] = lo[2]
        geom[3] = h
        dims[0] = int(wp.floor(ext[0] / h)) + 1
        dims[1] = int(wp.floor(ext[1] / h)) + 1
        dims[2] = int(wp.floor(ext[2] / h)) + 1

    @kernel
    def grid_assign(
        points: wp.array(dtype=V),
        geom: wp.array(dtype=T),
        dims: wp.array(dtype=wp.int32),
        capacity: int,
        cell_of: wp.array(dtype=wp.int32),
        counts: wp.array(dtype=wp.int32),
    ):
        i = wp.tid()
        p = points[i]
        c = capacity
        if finite(p):
            h = geom[3]
            cx = coord(p[0], geom[0], h, dims[0])
            cy = coord(p[1], geom[1], h, dims[1])
            cz = coord(p[2], geom[2], h, dims[2])
            c = (cx * dims[1] + cy) * dims[2] + cz
        cell_of[i] = c
        wp.atomic_add(counts, c, 1)

    @kernel
    def grid_fill(
        points: wp.array(dtype=V),
        cell_of: wp.array(dtype=wp.int32),
        cursor: wp.array(dtype=wp.int32),
        order: wp.array(dtype=wp.int32),
        sorted_points: wp.array(dtype=V),
    ):
        i = wp.tid()
        s = wp.atomic_add(cursor, cell_of[i], 1)  # on the CPU: ascending i within a cell
        order[s] = i
        sorted_points[s] = points[i]

    @kernel
    def radius_forward(
        query: wp.array(dtype=V),
        features: wp.array2d(dtype=T),
        order: wp.array(dtype=wp.int32),
        sorted_points: wp.array(dtype=V),
        starts: wp.array(dtype=wp.int32),
        geom: wp.array(dtype=T),
        dims: wp.array(dtype=wp.int32),
        radius: T,
        sigma: T,
        stride: int,
        offset: int,
        out: wp.array2d(dtype=T),
        stats: wp.array2d(dtype=T),
    ):
        i = wp.tid() * stride + offset
        q = query[i]
        nf = features.shape[1]
        for f in range(nf):
            out[i, f] = T(0.0)
        total = T(0.0)  # sum of the shifted weights exp((nearest - d) / sigma)
        nearest = T(0.0)
        found = int(0)
        count = int(0)  # neighbours: sizes the backward's pair list
        if finite(q):
            lo, hi = ball_cells(q, radius, geom, dims)
            for cx in range(lo[0], hi[0] + 1):
                for cy in range(lo[1], hi[1] + 1):
                    base = (cx * dims[1] + cy) * dims[2]
                    for s in range(starts[base + lo[2]], starts[base + hi[2] + 1]):
                        d = wp.length(q - sorted_points[s])
                        if d <= radius:
                            j = order[s]
                            if found == 0 or d < nearest:
                                # A new nearest neighbour: rescale what was summed so far so
                                # that every weight stays <= 1 (online softmax).
                                scale = T(0.0)
                                if found != 0:
                                    scale = wp.exp((d - nearest) / sigma)
                                total = total * scale
                                row_scale(out, i, scale, nf)
                                nearest = d
                                found = 1
                            w = wp.exp((nearest - d) / sigma)
                            total += w
                            count += 1
                            row_axpy(out, i, w, features, j, nf)
        if found != 0:
            row_scale(out, i, T(1.0) / total, nf)
        stats[i, 0] = total
        stats[i, 1] = nearest
        stats[i, 2] = T(count)

    # The radius backward runs as two gathers, no scatter: one pass over the queries (their
    # gradient) and one over the references (theirs and the features'), each searching the
    # other side's grid. No atomics, so it is deterministic on any device and any chunking.
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
        q_starts: wp.array(dtype=wp.int32),
        q_geom: wp.array(dtype=T),
        q_dims: wp.array(dtype=wp.int32),
        radius: T,
        sigma: T,
        stats: wp.array2d(dtype=T),
        grad: wp.array2d(dtype=T),
        g_out: wp.array(dtype=T),
        need_ref: int,
        need_features: int,
        stride: int,
        offset: int,
        d_ref: wp.array(dtype=V),
        d_features: wp.array2d(dtype=T),
    ):
        j = wp.tid() * stride + offset
        r = ref[j]
        nf = features.shape[1]
        dr = V(T(0.0))
        if need_features != 0:
            for f in range(nf):
                d_features[j, f] = T(0.0)
        if finite(r):
            lo, hi = ball_cells(r, radius, q_geom, q_dims)
            for cx in range(lo[0], hi[0] + 1):
                for cy in range(lo[1], hi[1] + 1):
                    base = (cx * q_dims[1] + cy) * q_dims[2]
                    for s in range(q_starts[base + lo[2]], q_starts[base + hi[2] + 1]):
                        diff = q_sorted[s] - r  # q - r, exactly as the forward computed it
                        d = wp.length(diff)
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
    # searching a grid over the queries. Fixed positions: deterministic with any chunking.

    @kernel
    def pair_counts(stats: wp.array2d(dtype=T), counts: wp.array(dtype=wp.int32)):
        i = wp.tid()
        counts[i] = int(stats[i, 2])

    @kernel
    def radius_backward_query(
        query: wp.array(dtype=V),
        features: wp.array2d(dtype=T),
        order: wp.array(dtype=wp.int32),
        sorted_points: wp.array(dtype=V),
        starts: wp.array(dtype=wp.int32),
        geom: wp.array(dtype=T),
        dims: wp.array(dtype=wp.int32),
        radius: T,
        sigma: T,
        out: wp.array2d(dtype=T),
        stats: wp.array2d(dtype=T),
        grad: wp.array2d(dtype=T),
        need_query: int,
        need_ref: int,
        offsets: wp.array(dtype=wp.int32),
        stride: int,
        offset: int,
        g_out: wp.array(dtype=T),
        d_query: wp.array(dtype=V),
        pair_query: wp.array(dtype=wp.int32),
        pair_ref: wp.array(dtype=wp.int32),
        pair_p: wp.array(dtype=T),
        pair_c: wp.array(dtype=T),
    ):
        # The queries' gradient, and g.out for the reference side. With non-empty pair arrays
        # (the CPU path) it also records each pair at offsets[i] onwards.
        i = wp.tid() * stride + offset
        nf = features.shape[1]
        go = row_dot(grad, i, out, i, nf)
        g_out[i] = go
        total = stats[i, 0]
        dq = V(T(0.0))
        record = pair_query.shape[0] > 0
        k = int(0)
        if record:
            k = offsets[i]
        if total > T(0.0) and (need_query != 0 or record):
            q = query[i]
            nearest = stats[i, 1]
            inv = T(1.0) / total
            lo, hi = ball_cells(q, radius, geom, dims)
            for cx in range(lo[0], hi[0] + 1):
                for cy in range(lo[1], hi[1] + 1):
                    base = (cx * dims[1] + cy) * dims[2]
                    for s in range(starts[base + lo[2]], starts[base + hi[2] + 1]):
                        diff = q - sorted_points[s]
                        d = wp.length(diff)
                        if d <= radius:
                            j = order[s]
                            p = wp.exp((nearest - d) / sigma) * inv
                            c = T(0.0)
                            if (need_query != 0 or need_ref != 0) and d > T(0.0):
                                g_f = row_dot(grad, i, features, j, nf)
                                c = p * (go - g_f) / (sigma * d)  # dL/dq_i += c diff, dL/dr_j -= c diff
                                dq += diff * c
                            if record:
                                pair_query[k] = i
                                pair_ref[k] = j
                                pair_p[k] = p
                                pair_c[k] = c
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
        starts: wp.array(dtype=wp.int32),
        geom: wp.array(dtype=T),
        dims: wp.array(dtype=wp.int32),
        k: int,
        features: wp.array2d(dtype=T),
        features4: wp.array2d(dtype=V4),
        sigma: T,
        stride: int,
        offset: int,
        dist: wp.array2d(dtype=T),
        idx: wp.array2d(dtype=wp.int64),
        out: wp.array2d(dtype=T),
        out4: wp.array2d(dtype=V4),
    ):
        # With a non-empty `out`, also aggregates (knn_aggregate) while the row is hot in cache.
        i = wp.tid() * stride + offset
        inf = T(wp.inf)
        for n in range(k):
            dist[i, n] = inf
            idx[i, n] = wp.int64(-1)
        q = query[i]
        if finite(q):
            h = geom[3]
            dx = dims[0]
            dy = dims[1]
            dz = dims[2]
            c0x = coord(q[0], geom[0], h, dx)
            c0y = coord(q[1], geom[1], h, dy)
            c0z = coord(q[2], geom[2], h, dz)
            count = int(0)
            ring = int(0)
            while True:
                # Visit the cells at Chebyshev distance `ring` from the query's cell: whole
                # z-columns where x or y is on the shell (one contiguous run of points,
                # trimmed to the current k-th distance), the two z faces elsewhere.
                for cx in range(wp.max(c0x - ring, 0), wp.min(c0x + ring, dx - 1) + 1):
                    bx = axis_gap(q[0], geom[0], h, cx)
                    for cy in range(wp.max(c0y - ring, 0), wp.min(c0y + ring, dy - 1) + 1):
                        by = axis_gap(q[1], geom[1], h, cy)
                        base = (cx * dy + cy) * dz
                        gxy2 = bx * bx + by * by
                        if wp.abs(cx - c0x) == ring or wp.abs(cy - c0y) == ring:
                            z0 = wp.max(c0z - ring, 0)
                            z1 = wp.min(c0z + ring, dz - 1)
                            visit = True
                            if count == k:
                                # margin for rounding: never skip a possible tie
                                lim = dist[i, k - 1] * T(1.00001) + T(1e-6) * h
                                if gxy2 > lim * lim:
                                    visit = False
                                else:
                                    zr = wp.sqrt(lim * lim - gxy2)
                                    z0 = wp.max(z0, coord(q[2] - zr, geom[2], h, dz))
                                    z1 = wp.min(z1, coord(q[2] + zr, geom[2], h, dz))
                            if visit and z0 <= z1:
                                for s in range(starts[base + z0], starts[base + z1 + 1]):
                                    count = knn_consider(q, sorted_points, order, s, i, k, count, dist, idx)
                        else:
                            for cz in range(c0z - ring, c0z + ring + 1, wp.max(2 * ring, 1)):
                                if cz >= 0 and cz < dz:
                                    bz = axis_gap(q[2], geom[2], h, cz)
                                    far = False
                                    if count == k:
                                        lim = dist[i, k - 1] * T(1.00001) + T(1e-6) * h
                                        far = gxy2 + bz * bz > lim * lim
                                    if not far:
                                        for s in range(starts[base + cz], starts[base + cz + 1]):
                                            count = knn_consider(q, sorted_points, order, s, i, k, count, dist, idx)
                # Stop once the k-th distance is below the distance to any unvisited cell.
                bound = inf
                if c0x - ring > 0:
                    bound = wp.min(bound, q[0] - (geom[0] + T(c0x - ring) * h))
                if c0x + ring < dx - 1:
                    bound = wp.min(bound, geom[0] + T(c0x + ring + 1) * h - q[0])
                if c0y - ring > 0:
                    bound = wp.min(bound, q[1] - (geom[1] + T(c0y - ring) * h))
                if c0y + ring < dy - 1:
                    bound = wp.min(bound, geom[1] + T(c0y + ring + 1) * h - q[1])
                if c0z - ring > 0:
                    bound = wp.min(bound, q[2] - (geom[2] + T(c0z - ring) * h))
                if c0z + ring < dz - 1:
                    bound = wp.min(bound, geom[2] + T(c0z + ring + 1) * h - q[2])
                if bound == inf:
                    break  # the whole grid has been visited
                # The margin absorbs rounding in the cell assignment: never stop early on a tie.
                if count == k and dist[i, k - 1] < bound - T(1e-5) * (wp.abs(bound) + h):
                    break
                ring += 1
        if out.shape[0] > 0:
            aggregate_row(features, features4, dist, idx, sigma, i, out, out4)

    @kernel
    def knn_backward(
        query: wp.array(dtype=V),
        ref: wp.array(dtype=V),
        idx: wp.array2d(dtype=wp.int64),
        grad: wp.array2d(dtype=T),
        need_query: int,
        need_ref: int,
        stride: int,
        offset: int,
        d_query: wp.array(dtype=V),
        d_ref: wp.array2d(dtype=V),
    ):
        i = wp.tid() * stride + offset
        q = query[i]
        dq = V(T(0.0))
        for n in range(idx.shape[1]):
            j = idx[i, n]
            if j >= wp.int64(0):
                diff = q - ref[j]
                d = wp.length(diff)
                if d > T(0.0):
                    v = diff * (grad[i, n] / d)
                    dq += v
                    if need_ref != 0:
                        wp.atomic_sub(d_ref, offset, int(j), v)
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
        stride: int,
        offset: int,
        d_query: wp.array(dtype=V),
        d_ref: wp.array2d(dtype=V),
        d_features: wp.array3d(dtype=T),
    ):
        # Same algebra as radius_backward, with the k nearest in place of the ball.
        i = wp.tid() * stride + offset
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
                        for f in range(nf):
                            wp.atomic_add(d_features, offset, j, f, p * grad[i, f])
                    if need_query != 0 or need_ref != 0:
                        diff = q - ref[j]
                        d = wp.length(diff)
                        if d > T(0.0):
                            g_f = row_dot(grad, i, features, j, nf)
                            v = diff * (p * (g_out - g_f) / (sigma * d))
                            dq += v
                            if need_ref != 0:
                                wp.atomic_sub(d_ref, offset, j, v)
            if need_query != 0:
                d_query[i] = dq

    return _Kernels(
        V=V,
        grid_init=grid_init,
        grid_bounds=grid_bounds,
        grid_setup=grid_setup,
        grid_assign=grid_assign,
        grid_fill=grid_fill,
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
