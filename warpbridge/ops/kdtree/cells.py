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
    # periodic (w); xyz, atoms: the atoms in bin order (float64 wrapped positions as three
    # rows x, y, z, their indices); bin_start: each bin's first place, and the end; wrap[a]: the
    # cells atom a was wrapped by (its returned shifts are corrected by them).
    cells: wp.array2d(dtype=wp.vec3d)
    shape: wp.array(dtype=wp.vec4i)
    reach: wp.array(dtype=wp.vec4i)
    xyz: wp.array2d(dtype=wp.float64)
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
const double* __restrict__ X = (const double*)grid.xyz.data;
const int stride_xyz = (int)(grid.xyz.strides[0] / sizeof(double));
const double* __restrict__ Y = X + stride_xyz;
const double* __restrict__ Z = Y + stride_xyz;
const int pi = *wp::address(place, i);
const wp::vec3d xi(X[pi], Y[pi], Z[pi]);
const wp::vec3d c0 = *wp::address(grid.cells, b, 0), c1 = *wp::address(grid.cells, b, 1), c2 = *wp::address(grid.cells, b, 2);
const int periodic = r[3];
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
            INNER
        }
    }
}
return RESULT;
"""

# The pairs with the atoms of one bin: each visited in turn (fill), or counted in one loop
# that vectorises (count: 8.0 -> 4.9 ms at 10^4 atoms, one thread).
_EACH = r"""
for (int t = B[bin]; t < B[bin + 1]; ++t) {
    const wp::vec3d D(X[t] + base[0], Y[t] + base[1], Z[t] + base[2]);
    const double d2 = D[0] * D[0] + D[1] * D[1] + D[2] * D[2];
    if (!(d2 < cut2)) continue;
    const int j = A[t];
    if (j == i && unshifted) continue;
    if (!full && !(i < j || (i == j && first_shift > 0))) continue;
    VISIT
}"""
_COUNT_BIN = r"""
const double bx = base[0], by = base[1], bz = base[2];
const bool own = unshifted, later = first_shift > 0;
int in_bin = 0;
for (int t = B[bin]; t < B[bin + 1]; ++t) {
    const double dx = X[t] + bx, dy = Y[t] + by, dz = Z[t] + bz;
    const int j = A[t];
    const bool kept = (bool)full | (i < j) | ((i == j) & later);
    in_bin += (dx * dx + dy * dy + dz * dz < cut2) & kept & !((j == i) & own);
}
count += in_bin;"""
_COUNT = _WALK.replace("RESULT", "count").replace("INNER", _COUNT_BIN)
_COUNT = "int count = 0;\n" + _COUNT

# fill: the walk gathers a row of up to ROW pairs (its length is known from the count) in local
# arrays, ranks them by distance (each against every other: branch-free compares that
# vectorise; ties keep the walk's order) and writes each once, at its rank. A longer row is
# written in the walk's order and sorted in place by insertion. (Writing every row, reading
# it back and sorting it by insertion took 34 ms at 10^4 atoms; this, about 25.)
_FILL_START = r"""
constexpr int ROW = 256;
typedef wp::vec_t<3, wp::int64> vec3l_;
const wp::int64 s0 = *wp::address(offsets, i);
const int expected = (int)(*wp::address(offsets, i + 1) - s0);
const bool local = expected <= ROW, with_vectors = vectors.shape[0] > 0;
const vec3l_ wi = *wp::address(grid.wrap, i);
double* const out_d = (double*)dist.data + s0;
wp::int64* const out_j = (wp::int64*)js.data + s0;
vec3l_* const out_s = (vec3l_*)shifts.data + s0;
wp::vec3d* const out_v = with_vectors ? (wp::vec3d*)vectors.data + s0 : nullptr;
double row_d[ROW + 8], row_v[ROW][3];
int row_j[ROW], row_s[ROW][3];
int n = 0;
"""
_VISIT_FILL = r"""{
    if (local) {
        row_d[n] = d2; row_j[n] = j; row_s[n][0] = sx; row_s[n][1] = sy; row_s[n][2] = sz;
        if (with_vectors) { row_v[n][0] = D[0]; row_v[n][1] = D[1]; row_v[n][2] = D[2]; }
    } else {
        const vec3l_ wj = *wp::address(grid.wrap, j);
        out_d[n] = d2;
        out_j[n] = j;
        out_s[n] = vec3l_((wp::int64)sx + wi[0] - wj[0], (wp::int64)sy + wi[1] - wj[1], (wp::int64)sz + wi[2] - wj[2]);
        if (with_vectors) out_v[n] = D;
    }
    ++n;
}"""
_FILL_END = r"""
if (local) {
    const int padded = (n + 7) & ~7;  // whole vectors: the padding is inf, never before anything
    for (int t = n; t < padded; ++t) row_d[t] = (double)INFINITY;
    for (int t = 0; t < n; ++t) {
        const double dt = row_d[t];
        int r = 0;
        for (int u = 0; u < padded; ++u) r += (row_d[u] < dt) | ((row_d[u] == dt) & (u < t));  // ties: earlier first
        const int j = row_j[t];
        const vec3l_ wj = *wp::address(grid.wrap, j);
        out_d[r] = wp::sqrt(dt);
        out_j[r] = j;
        out_s[r] = vec3l_((wp::int64)row_s[t][0] + wi[0] - wj[0], (wp::int64)row_s[t][1] + wi[1] - wj[1], (wp::int64)row_s[t][2] + wi[2] - wj[2]);
        if (with_vectors) out_v[r] = wp::vec3d(row_v[t][0], row_v[t][1], row_v[t][2]);
    }
} else {
    for (int t = 1; t < n; ++t) {
        const double d = out_d[t];
        const wp::int64 j = out_j[t];
        const vec3l_ sh = out_s[t];
        const wp::vec3d v = with_vectors ? out_v[t] : wp::vec3d();
        int p = t;
        for (; p > 0 && out_d[p - 1] > d; --p) {
            out_d[p] = out_d[p - 1]; out_j[p] = out_j[p - 1]; out_s[p] = out_s[p - 1];
            if (with_vectors) out_v[p] = out_v[p - 1];
        }
        out_d[p] = d; out_j[p] = j; out_s[p] = sh;
        if (with_vectors) out_v[p] = v;
    }
    for (int t = 0; t < n; ++t) out_d[t] = wp::sqrt(out_d[t]);
}
return n;
"""
_FILL = _FILL_START + (_WALK.rsplit("return RESULT;", 1)[0] + _FILL_END).replace("RESULT", "n").replace(
    "INNER", _EACH.replace("VISIT", _VISIT_FILL)
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
