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
from .template import kernel, native

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

# fill: the walk gathers a row of up to ROW pairs (its length is known from the count) in local
# arrays, G candidates of a bin at a time (their distances vectorise), buckets them by squared
# distance (stable), sorts the buckets by insertion (ties keep the walk's order) and writes the
# row in order. A longer row is written in the walk's order and sorted in place by insertion.
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
    stride: int,
    offset: int,
    counts: wp.array(dtype=wp.int64),
):
    # Atom i's pairs (home[i]: its bin and structure; place[i]: where its point is in bin order).
    i = int(grid.atoms[wp.tid() * stride + offset])  # in bin order: neighbouring atoms walk the same bins
    counts[i] = wp.int64(count_pairs(i, home, place, grid))


@kernel
def atoms_by_bin(
    bins: wp.array(dtype=wp.int32),
    stride: int,
    offset: int,
    next_place: wp.array(dtype=wp.int32),
    order: wp.array(dtype=wp.int32),
    place: wp.array(dtype=wp.int32),
):
    # One thread: each atom, in index order, to the next free place of its bin (a stable
    # counting sort; next_place starts at each bin's first place): the atoms in bin order,
    # and each atom's place in it.
    for a in range(bins.shape[0]):
        p = next_place[bins[a]]
        next_place[bins[a]] = p + 1
        order[p] = a
        place[a] = p


@kernel
def pair_fill(
    home: wp.array(dtype=wp.vec4i),
    place: wp.array(dtype=wp.int32),
    grid: Grid,
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
    i = int(grid.atoms[wp.tid() * stride + offset])  # in bin order: neighbouring atoms walk the same bins
    fill_pairs(i, home, place, grid, offsets, js, shifts, dist, vectors)
