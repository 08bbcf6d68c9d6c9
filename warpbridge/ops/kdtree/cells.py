"""A cell list for periodic neighbour lists (atomistic models): every pair of atoms closer than
a cutoff through periodic boundaries, in cells of any shape.

Each structure's atoms are binned in fractional coordinates (``ops._cell_grid`` sizes the
bins, at least a cutoff thick between their lattice planes; ``atoms_to_bins`` sorts the atoms
into them, one thread for all). One thread per atom walks the bins within ``reach`` of its
own, across periodic boundaries (a bin past the edge is the same bin one cell over: its shift
``s``), and compares with every atom there: ``D = x_j + s @ cell - x_i``, a pair where
``|D|^2 < cutoff^2``. A cell thinner than the cutoff has one bin along that axis and a reach
of several cells, so every image within the cutoff is met once. Each row is sorted by distance (ties in the walk's order:
bins in turn, atoms by index within a bin). ``pair_count`` counts each atom's pairs and
``pair_fill`` writes them at the atom's row offset; or ``pair_run``, on one thread, writes
the rows one after the other in atom order, with no count.
The coordinates are float64 whatever the positions' type; the caller builds ``D`` and ``d``
from the integers with its own operations.
"""

from __future__ import annotations

import warp as wp

from . import template
from .template import func, kernel, native

vec3l = wp.types.vector(length=3, dtype=wp.int64)


@wp.struct
class Grid:
    # cells[b]: structure b's lattice vectors (rows); shape[b]: its bins per axis and its
    # first bin; reach[b]: how many bins either side a walk visits, and whether each axis is
    # periodic (w); xyz, atoms: the atoms in bin order (float64 wrapped positions as three
    # rows x, y, z, padded with inf, their indices); bin_start: each bin's first place, and the
    # end; wrap[t]: the cells the atom at place t was wrapped by (its returned shifts are
    # corrected by them), in bin order; empty where no atom was wrapped. cut2: the cutoff
    # squared; full: 1 for a full list, 0 for a half list.
    cells: wp.array2d(dtype=wp.vec3d)
    shape: wp.array(dtype=wp.vec4i)
    reach: wp.array(dtype=wp.vec4i)
    xyz: wp.array2d(dtype=wp.float64)
    atoms: wp.array(dtype=wp.int32)
    bin_start: wp.array(dtype=wp.int32)
    wrap: wp.array(dtype=vec3l)
    cut2: wp.float64
    full: wp.int32


# The walk over atom i's neighbour bins: INNER runs for each bin within reach, with its shift
# (sx, sy, sz) and `base` = the shift in the cell minus x_i; RESULT is what it returns.
_WALK = native("cells_walk.h")

# The pairs with the atoms of one bin, G atoms at a time (`cells_group.h`, which both passes
# share): each visited in turn (fill: VISIT runs for each (t, j, s, D, d2) with d2 < cut2, not
# i itself unshifted, and with `full` == 0 only the half the half-list rule keeps: i < j, or
# for an atom's own image the shift whose first non-zero component is positive), or counted
# (a full list's by the bits set).
_GROUP = native("cells_group.h")
_EACH = native("cells_each.h").replace("GROUP_BITS", _GROUP)
_COUNT_BIN = native("cells_count_bin.h").replace("GROUP_BITS", _GROUP)
_COUNT = "int count = 0;\n" + _WALK.replace("RESULT", "count").replace("INNER", _COUNT_BIN)

# fill: the walk gathers a row of up to ROW pairs in local arrays, G candidates of a bin at a
# time (their distances vectorise), buckets them by squared distance (stable), sorts the
# buckets by insertion (ties keep the walk's order) and writes the row at s0 on; a longer row
# goes straight to its place and is sorted there by insertion. `room`: how many pairs fit at
# s0 on (a row that does not fit is not written, and -1 returned).
_FILL_START = native("cells_fill_start.h")
_VISIT_FILL = native("cells_visit_fill.h")
_FILL_END = native("cells_fill_end.h")
_FILL = _FILL_START + (_WALK.rsplit("return RESULT;", 1)[0] + _FILL_END).replace("RESULT", "n").replace(
    "INNER", _EACH.replace("VISIT", _VISIT_FILL)
)


@template.func_native(_COUNT)
def count_pairs(i: int, home: wp.array(dtype=wp.vec4i), place: wp.array(dtype=wp.int32), grid: Grid) -> int: ...


@template.func_native(_FILL)
def fill_pairs(
    i: int,
    home: wp.array(dtype=wp.vec4i),
    place: wp.array(dtype=wp.int32),
    grid: Grid,
    s0: wp.int64,
    room: wp.int64,
    pair_i: wp.array(dtype=wp.int64),
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
    stride: int,
    offset: int,
    counts: wp.array(dtype=wp.int64),
):
    # Atom i's pairs (home[i]: its bin and structure; place[i]: where its point is in bin order).
    i = int(grid.atoms[wp.tid() * stride + offset])  # in bin order: neighbouring atoms walk the same bins
    counts[i] = wp.int64(count_pairs(i, home, place, grid))


@func
def fractional(x: wp.vec3d, inverse: wp.array2d(dtype=wp.vec3d), b: int) -> wp.vec3d:
    # x in structure b's lattice coordinates (inverse[b]: the rows of its lattice's inverse)
    return x[0] * inverse[b, 0] + x[1] * inverse[b, 1] + x[2] * inverse[b, 2]


@func
def wraps(f: wp.vec3d, periodic: int) -> vec3l:
    # the whole cells in the fractional coordinates f along the periodic axes (bits of periodic)
    w = vec3l()
    for axis in range(3):
        if periodic & (1 << axis):
            w[axis] = wp.int64(wp.floor(f[axis]))
    return w


@func
def home_of(
    x: wp.vec3d, inverse: wp.array2d(dtype=wp.vec3d), b: int, g: wp.vec4i, periodic: int, lo: wp.vec3d, span: wp.vec3d
) -> wp.vec4i:
    # The bin (x, y, z) of an atom at x in structure b (g: its bins per axis; lo, span: where
    # they start and how far they reach, in fractional coordinates), and b; -1 three times
    # where x is not finite.
    h = wp.vec4i(-1, -1, -1, b)
    if wp.isfinite(x):
        f = fractional(x, inverse, b)
        w = wraps(f, periodic)
        for axis in range(3):
            c = 0
            if span[axis] > wp.float64(0.0):
                at = (f[axis] - wp.float64(w[axis]) - lo[axis]) / span[axis] * wp.float64(g[axis])
                c = wp.clamp(int(wp.floor(at)), 0, g[axis] - 1)
            h[axis] = c
    return h


@func
def spanned(
    x: wp.vec3d, inverse: wp.array2d(dtype=wp.vec3d), b: int, periodic: int, lo: wp.vec3d, span: wp.vec3d
) -> int:
    # 1 where the finite x lies within structure b's bins along every axis that is not
    # periodic (lo, span: where they start and how far they reach, fractional), else 0.
    f = fractional(x, inverse, b)
    inside = 1
    for axis in range(3):
        if not (periodic & (1 << axis)) and (f[axis] < lo[axis] or f[axis] > lo[axis] + span[axis]):
            inside = 0
    return inside


@kernel
def frac_extent(
    x: wp.array(dtype=wp.vec3d),
    starts: wp.array(dtype=wp.int64),
    inverse: wp.array2d(dtype=wp.vec3d),
    stride: int,
    offset: int,
    extent: wp.array2d(dtype=wp.vec3d),
):
    # One thread: each structure's lowest and highest fractional coordinates over its finite
    # atoms (extent[b, 0], extent[b, 1]); zeros where it has none.
    for b in range(starts.shape[0] - 1):
        lo = wp.vec3d(wp.float64(wp.inf))
        hi = -lo
        for a in range(int(starts[b]), int(starts[b + 1])):
            if wp.isfinite(x[a]):
                f = fractional(x[a], inverse, b)
                lo = wp.min(lo, f)
                hi = wp.max(hi, f)
        if lo[0] > hi[0]:
            lo = wp.vec3d()
            hi = wp.vec3d()
        extent[b, 0] = lo
        extent[b, 1] = hi


@kernel
def atoms_to_bins(
    x: wp.array(dtype=wp.vec3d),
    starts: wp.array(dtype=wp.int64),
    inverse: wp.array2d(dtype=wp.vec3d),
    extent: wp.array2d(dtype=wp.vec3d),
    grid: Grid,
    stride: int,
    offset: int,
    home: wp.array(dtype=wp.vec4i),
    place: wp.array(dtype=wp.int32),
    flags: wp.array(dtype=wp.int32),
):
    # One thread: each atom's bin (home[a]: its bin x, y, z and structure; -1 three times
    # where not finite), then a stable counting sort by bin (the atoms that are not finite
    # last): grid.atoms, grid.bin_start and each atom's place; the points wrapped into their
    # cell (grid.xyz, padded with inf) and their wraps (grid.wrap) in that order.
    # extent[b]: where structure b's bins start and how far they reach, in fractional
    # coordinates. flags[0]: 1 where an atom was wrapped, else 0; flags[1]: 1 where an atom
    # lies outside its structure's bins along an axis that is not periodic (clamped into the
    # nearest: the pairs are right, the walk slower), else 0.
    n = x.shape[0]
    bins = grid.bin_start.shape[0] - 3  # the bins of every structure; one more for the atoms not finite
    for t in range(bins + 3):
        grid.bin_start[t] = 0
    outside = int(0)
    for b in range(starts.shape[0] - 1):
        g = grid.shape[b]
        for a in range(int(starts[b]), int(starts[b + 1])):
            h = home_of(x[a], inverse, b, g, grid.reach[b][3], extent[b, 0], extent[b, 1])
            bin = bins
            if h[0] >= 0:
                bin = g[3] + (h[0] * g[1] + h[1]) * g[2] + h[2]
                if spanned(x[a], inverse, b, grid.reach[b][3], extent[b, 0], extent[b, 1]) == 0:
                    outside = 1
            home[a] = h
            place[a] = bin  # the bin, until the sort below replaces it with the place
            grid.bin_start[bin + 2] += 1
    for t in range(bins + 2):
        grid.bin_start[t + 1] += grid.bin_start[t]
    any_wrap = int(0)
    for a in range(n):
        p = grid.bin_start[place[a] + 1]
        grid.bin_start[place[a] + 1] = p + 1
        place[a] = p
        grid.atoms[p] = a
        y = x[a]
        w = vec3l()
        if home[a][0] >= 0:
            b = home[a][3]
            w = wraps(fractional(y, inverse, b), grid.reach[b][3])
            if w[0] != wp.int64(0) or w[1] != wp.int64(0) or w[2] != wp.int64(0):
                any_wrap = 1
                shift = wp.float64(w[0]) * grid.cells[b, 0] + wp.float64(w[1]) * grid.cells[b, 1]
                y = y - (shift + wp.float64(w[2]) * grid.cells[b, 2])
        if p < grid.wrap.shape[0]:  # (the caller passes every atom's room; never past an array's end)
            grid.wrap[p] = w
        for axis in range(3):
            grid.xyz[axis, p] = y[axis]
    for p in range(n, n + 16):
        for axis in range(3):
            grid.xyz[axis, p] = wp.float64(wp.inf)
    flags[0] = any_wrap
    flags[1] = outside


@kernel
def pair_fill(
    home: wp.array(dtype=wp.vec4i),
    place: wp.array(dtype=wp.int32),
    grid: Grid,
    offsets: wp.array(dtype=wp.int64),
    stride: int,
    offset: int,
    pair_i: wp.array(dtype=wp.int64),
    js: wp.array(dtype=wp.int64),
    shifts: wp.array(dtype=vec3l),
    dist: wp.array(dtype=wp.float64),
    vectors: wp.array(dtype=wp.vec3d),
):
    # Atom i's pairs at offsets[i] on: i, neighbours, returned shifts (the bin's, corrected by
    # the wraps), distances and, where `vectors` is not empty, the vectors D; sorted by distance.
    i = int(grid.atoms[wp.tid() * stride + offset])  # in bin order: neighbouring atoms walk the same bins
    fill_pairs(i, home, place, grid, offsets[i], offsets[i + 1] - offsets[i], pair_i, js, shifts, dist, vectors)


@kernel
def pair_run(
    home: wp.array(dtype=wp.vec4i),
    place: wp.array(dtype=wp.int32),
    grid: Grid,
    progress: wp.array(dtype=wp.int64),
    stride: int,
    offset: int,
    pair_i: wp.array(dtype=wp.int64),
    js: wp.array(dtype=wp.int64),
    shifts: wp.array(dtype=vec3l),
    dist: wp.array(dtype=wp.float64),
    vectors: wp.array(dtype=wp.vec3d),
):
    # One thread, one pass: the rows of the atoms from progress[0] on, in index order, one
    # after the other from place progress[1] on (as pair_fill writes them), until the arrays
    # have no room for the next; progress then holds where to go on from.
    a = progress[0]
    cursor = progress[1]
    while a < wp.int64(home.shape[0]):
        room = wp.int64(js.shape[0]) - cursor
        written = fill_pairs(int(a), home, place, grid, cursor, room, pair_i, js, shifts, dist, vectors)
        if written < 0:
            break
        cursor += wp.int64(written)
        a += wp.int64(1)
    progress[0] = a
    progress[1] = cursor
