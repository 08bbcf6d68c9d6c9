"""A cell list for periodic neighbour lists (atomistic models): every pair of atoms closer than
a cutoff through periodic boundaries, in cells of any shape.

Each structure's atoms are binned in fractional coordinates (``ops._cell_grid`` builds the
grid on the host: bins at least a cutoff thick between their lattice planes, atoms sorted by
bin). One thread per atom walks the bins within ``reach`` of its own, across periodic
boundaries (a bin past the edge is the same bin one cell over: its shift ``s``), and compares
with every atom there: ``D = x_j + s @ cell - x_i``, a pair where ``|D|^2 < cutoff^2``. A cell
thinner than the cutoff has one bin along that axis and a reach of several cells, so every
image within the cutoff is met once. ``pair_count`` counts each atom's pairs; ``pair_fill``
writes them at the atom's row offset, sorted by distance (ties in the walk's order: bins in
turn, atoms by index within a bin).
The coordinates are float64 whatever the positions' type; the caller builds ``D`` and ``d``
from the integers with its own operations.
"""

from __future__ import annotations

import warp as wp

from . import template
from .template import kernel

vec3l = wp.types.vector(length=3, dtype=wp.int64)


@wp.struct
class Grid:
    # cells[b]: structure b's lattice vectors (rows); shape[b]: its bins per axis and its
    # first bin; reach[b]: how many bins either side a walk visits, and whether each axis is
    # periodic (w); points, atoms: the atoms in bin order (float64 wrapped positions, their
    # indices); bin_start: each bin's first place, and the end; wrap[a]: the cells atom a was
    # wrapped by (its returned shifts are corrected by them).
    cells: wp.array2d(dtype=wp.vec3d)
    shape: wp.array(dtype=wp.vec4i)
    reach: wp.array(dtype=wp.vec4i)
    points: wp.array(dtype=wp.vec3d)
    atoms: wp.array(dtype=wp.int32)
    bin_start: wp.array(dtype=wp.int32)
    wrap: wp.array(dtype=vec3l)


# The walk over atom i's neighbours: VISIT runs for each (j, s, d2) with d2 < cut2, not i
# itself unshifted, and with `full` == 0 only the half the half-list rule keeps (i < j, or
# for an atom's own image the shift whose first non-zero component is positive).
_WALK = r"""
typedef wp::vec_t<3, wp::int64> vec3l;
const wp::vec4i h = *wp::address(home, i);
if (h[0] < 0) return RESULT;  // not finite: nobody's neighbour
const int b = h[3];
const wp::vec4i g = *wp::address(grid.shape, b), r = *wp::address(grid.reach, b);
const wp::vec3d xi = *wp::address(grid.points, *wp::address(place, i));
const wp::vec3d c0 = *wp::address(grid.cells, b, 0), c1 = *wp::address(grid.cells, b, 1), c2 = *wp::address(grid.cells, b, 2);
const int periodic = r[3];
const wp::vec3d* __restrict__ P = (const wp::vec3d*)grid.points.data;
const wp::int32* __restrict__ A = (const wp::int32*)grid.atoms.data;
const wp::int32* __restrict__ B = (const wp::int32*)grid.bin_start.data;
auto cell_of = [&](int axis, int c, int n, int& s) -> int {  // the bin c along an axis, wrapped; -1 past a wall
    s = 0;
    if (periodic & (1 << axis)) {
        s = c >= 0 ? c / n : -((-c + n - 1) / n);
        return c - s * n;
    }
    return c >= 0 && c < n ? c : -1;
};
for (int ox = -r[0]; ox <= r[0]; ++ox) {
    int sx, sy, sz;
    const int cx = cell_of(0, h[0] + ox, g[0], sx);
    if (cx < 0) continue;
    for (int oy = -r[1]; oy <= r[1]; ++oy) {
        const int cy = cell_of(1, h[1] + oy, g[1], sy);
        if (cy < 0) continue;
        for (int oz = -r[2]; oz <= r[2]; ++oz) {
            const int cz = cell_of(2, h[2] + oz, g[2], sz);
            if (cz < 0) continue;
            const wp::vec3d base = (double)sx * c0 + (double)sy * c1 + (double)sz * c2 - xi;
            const bool unshifted = sx == 0 && sy == 0 && sz == 0;
            const int first_shift = sx != 0 ? sx : sy != 0 ? sy : sz;
            const int bin = g[3] + (cx * g[1] + cy) * g[2] + cz;
            for (int t = B[bin]; t < B[bin + 1]; ++t) {
                const wp::vec3d D = P[t] + base;
                const double d2 = D[0] * D[0] + D[1] * D[1] + D[2] * D[2];
                if (!(d2 < cut2)) continue;
                const int j = A[t];
                if (j == i && unshifted) continue;
                if (!full && !(i < j || (i == j && first_shift > 0))) continue;
                VISIT
            }
        }
    }
}
return RESULT;
"""

_COUNT = _WALK.replace("RESULT", "count").replace("VISIT", "++count;")
_COUNT = "int count = 0;\n" + _COUNT

_FILL = (
    (_WALK.rsplit("return RESULT;", 1)[0] + "SORT\nreturn n;\n")
    .replace("RESULT", "n")
    .replace(
        "VISIT",
        r"""{
    const vec3l wj = *wp::address(grid.wrap, j);
    *wp::address(dist, s0 + n) = d2;
    *wp::address(js, s0 + n) = (wp::int64)j;
    *wp::address(shifts, s0 + n) = vec3l((wp::int64)sx + wi[0] - wj[0], (wp::int64)sy + wi[1] - wj[1], (wp::int64)sz + wi[2] - wj[2]);
    if (with_vectors) *wp::address(vectors, s0 + n) = D;
    ++n;
}""",
    )
)
# The row, written in the walk's order, sorted by distance (stably: ties keep the walk's
# order), the squares then rooted. Rows of up to ROW entries: each entry's rank is counted
# against every other (branch-free, n^2 compares that vectorise), then the row is written
# back by rank from local copies. Longer rows sort in place by insertion. (An insertion sort
# on local keys took 18 of a 35 ms fill at 10^4 atoms: a mispredicted branch per entry.)
_SORT = r"""
constexpr int ROW = 256;
auto entry = [&](int t, double& d, wp::int64& j, vec3l& s, wp::vec3d& v) {
    d = *wp::address(dist, s0 + t); j = *wp::address(js, s0 + t); s = *wp::address(shifts, s0 + t);
    if (with_vectors) v = *wp::address(vectors, s0 + t);
};
auto put = [&](int t, double d, wp::int64 j, const vec3l& s, const wp::vec3d& v) {
    *wp::address(dist, s0 + t) = d; *wp::address(js, s0 + t) = j; *wp::address(shifts, s0 + t) = s;
    if (with_vectors) *wp::address(vectors, s0 + t) = v;
};
if (n <= ROW) {
    double d[ROW];
    int rank[ROW];
    for (int t = 0; t < n; ++t) d[t] = *wp::address(dist, s0 + t);
    for (int t = 0; t < n; ++t) {
        const double dt = d[t];
        int r = 0;
        for (int u = 0; u < t; ++u) r += d[u] <= dt;  // earlier entries: ties before
        for (int u = t + 1; u < n; ++u) r += d[u] < dt;
        rank[t] = r;
    }
    for (int t = 0; t < n; ++t) *wp::address(dist, s0 + rank[t]) = wp::sqrt(d[t]);
    {
        wp::int64 c[ROW];
        for (int t = 0; t < n; ++t) c[t] = *wp::address(js, s0 + t);
        for (int t = 0; t < n; ++t) *wp::address(js, s0 + rank[t]) = c[t];
    }
    {  // plain arrays, not Warp vectors: their constructors would zero all ROW of them each call
        wp::int64 c[ROW][3];
        for (int t = 0; t < n; ++t) {
            const vec3l v = *wp::address(shifts, s0 + t);
            c[t][0] = v[0]; c[t][1] = v[1]; c[t][2] = v[2];
        }
        for (int t = 0; t < n; ++t) *wp::address(shifts, s0 + rank[t]) = vec3l(c[t][0], c[t][1], c[t][2]);
    }
    if (with_vectors) {
        double c[ROW][3];
        for (int t = 0; t < n; ++t) {
            const wp::vec3d v = *wp::address(vectors, s0 + t);
            c[t][0] = v[0]; c[t][1] = v[1]; c[t][2] = v[2];
        }
        for (int t = 0; t < n; ++t) *wp::address(vectors, s0 + rank[t]) = wp::vec3d(c[t][0], c[t][1], c[t][2]);
    }
} else {
    for (int t = 1; t < n; ++t) {
        double d;
        wp::int64 j;
        vec3l sh;
        wp::vec3d v;
        entry(t, d, j, sh, v);
        int p = t;
        for (; p > 0 && *wp::address(dist, s0 + p - 1) > d; --p) {
            double dp;
            wp::int64 jp;
            vec3l sp;
            wp::vec3d vp;
            entry(p - 1, dp, jp, sp, vp);
            put(p, dp, jp, sp, vp);
        }
        put(p, d, j, sh, v);
    }
    for (int t = 0; t < n; ++t) *wp::address(dist, s0 + t) = wp::sqrt(*wp::address(dist, s0 + t));
}
"""
_FILL = (
    "int n = 0;\nconst wp::int64 s0 = *wp::address(offsets, i);\nconst bool with_vectors = vectors.shape[0] > 0;\n"
    "const wp::vec_t<3, wp::int64> wi = *wp::address(grid.wrap, i);\n" + _FILL.replace("SORT", _SORT)
)


@template.func_native(_COUNT)
def count_pairs(
    i: int, home: wp.array(dtype=wp.vec4i), place: wp.array(dtype=wp.int32), grid: Grid, cut2: wp.float64, full: int
) -> int: ...


@template.func_native(_FILL)
def fill_pairs(
    i: int,
    home: wp.array(dtype=wp.vec4i),
    place: wp.array(dtype=wp.int32),
    grid: Grid,
    cut2: wp.float64,
    full: int,
    offsets: wp.array(dtype=wp.int64),
    js: wp.array(dtype=wp.int64),
    shifts: wp.array(dtype=vec3l),
    dist: wp.array(dtype=wp.float64),
    vectors: wp.array(dtype=wp.vec3d),
) -> int: ...


@kernel
def pair_count(
    home: wp.array(dtype=wp.vec4i),
    place: wp.array(dtype=wp.int32),
    grid: Grid,
    cut2: wp.float64,
    full: int,
    stride: int,
    offset: int,
    counts: wp.array(dtype=wp.int64),
):
    # Atom i's pairs (home[i]: its bin and structure; place[i]: where its point is in bin order).
    i = wp.tid() * stride + offset
    counts[i] = wp.int64(count_pairs(i, home, place, grid, cut2, full))


@kernel
def pair_fill(
    home: wp.array(dtype=wp.vec4i),
    place: wp.array(dtype=wp.int32),
    grid: Grid,
    cut2: wp.float64,
    full: int,
    offsets: wp.array(dtype=wp.int64),
    stride: int,
    offset: int,
    js: wp.array(dtype=wp.int64),
    shifts: wp.array(dtype=vec3l),
    dist: wp.array(dtype=wp.float64),
    vectors: wp.array(dtype=wp.vec3d),
):
    # Atom i's pairs at offsets[i] on: neighbours, returned shifts (the bin's, corrected by the
    # wraps), distances and, where `vectors` is not empty, the vectors D; sorted by distance.
    i = wp.tid() * stride + offset
    fill_pairs(i, home, place, grid, cut2, full, offsets, js, shifts, dist, vectors)
