"""The host side of the cell list (``kdtree.cells``): each structure's bins, its atoms sorted
into them, and the count and fill passes over all structures at once.

Bins are cut in fractional coordinates: along a periodic axis the cell's [0, 1), along one
that is not the atoms' own range. Each bin is at least a cutoff thick between its lattice
planes (with a relative margin of 1e-9, so that rounding never puts a pair two bins apart),
so a walk visits the 27 bins around an atom's own; a cell thinner than the cutoff along an
axis has one bin there and a walk reaches across as many cells as the cutoff spans.
"""

from __future__ import annotations

import numpy as np
import warp as wp

from .._core.errors import fail
from . import _cpu_launch as cpu_launch
from . import _launches, kdtree

MAX_VISITS = 1 << 27  # the most (atom, cell image) pairs a structure's walks may visit
MAX_PAIRS = (1 << 31) - 1  # the most pairs one call returns (Warp's array sizes are 32-bit)
_MARGIN = 1.0 + 1e-9


def pairs(
    pos: np.ndarray,
    starts: np.ndarray,
    cells: np.ndarray,
    periodic: np.ndarray,
    cutoff: float,
    full: bool,
    vectors: bool,
):
    """(i, j, S, d, D) of every pair closer than ``cutoff``, rows by i, each sorted by distance
    (ties in the walk's order); d and D float64 values (D None unless ``vectors``). ``pos``:
    (N, 3) float64, the structures' atoms at ``starts``."""
    n, k, device = len(pos), kdtree.cell_kernels(), wp.get_device("cpu")
    home, place, grid = _binned(k, pos, starts, cells, periodic, cutoff)
    grid.cut2, grid.full = float(cutoff) ** 2, int(full)
    before = [home, place, grid]
    counts = cpu_launch.kept("cell_counts", (n,), wp.int64, device)
    _launches.launch(k.pair_count, n, before, [counts], device)
    count = counts.numpy()
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(count, out=offsets[1:])
    e = int(offsets[-1])
    if e > MAX_PAIRS:
        raise fail(
            "neighbor_list",
            f"{e:,} pairs found, more than one call returns ({MAX_PAIRS:,}); use a smaller cutoff or fewer structures per call",
        )
    # NumPy's memory: it asks for huge pages, so the fill's writes fault ~500x less often
    js, dist, shifts = np.empty(e, dtype=np.int64), np.empty(e), np.empty((e, 3), dtype=np.int64)
    vec = np.empty((e if vectors else 0, 3))
    outputs = [_over(js, wp.int64), _over(shifts, k.vec3l), _over(dist, wp.float64), _over(vec, wp.vec3d)]
    _launches.launch(k.pair_fill, n, [*before, _over(offsets, wp.int64)], outputs, device)
    i = np.repeat(np.arange(n, dtype=np.int64), count)
    return i, js, shifts, dist, vec if vectors else None


def _binned(k, pos: np.ndarray, starts: np.ndarray, cells: np.ndarray, periodic: np.ndarray, cutoff: float) -> tuple:
    """(each atom's (bin x, y, z, structure), -1 three times where not finite; each atom's
    place in bin order; the Grid of all structures, its atoms sorted into their bins)."""
    n, device = len(pos), wp.get_device("cpu")
    x, first = _over(pos, wp.vec3d), _over(starts, wp.int64)
    lattice = np.where(periodic.any(1)[:, None, None], cells, np.eye(3))  # the identity where no axis is periodic
    inverse = np.linalg.inv(lattice)
    rows = _over(inverse, wp.vec3d)  # rows of each inverse: f = x @ inverse
    lo, span = _extent(k, x, first, rows, periodic)
    shape, reach = _bins(inverse, lo, span, periodic, np.diff(starts), cutoff)
    firsts = np.zeros(len(shape) + 1, dtype=np.int64)
    np.cumsum(shape.prod(1), out=firsts[1:])
    bits = periodic @ np.array([1, 2, 4])
    grid = _launches.struct(
        k.Grid,
        cells=_over(lattice, wp.vec3d),
        shape=_over(np.concatenate([shape, firsts[:-1, None]], 1).astype(np.int32), wp.vec4i),
        reach=_over(np.concatenate([reach, bits[:, None]], 1).astype(np.int32), wp.vec4i),
        xyz=cpu_launch.kept("cell_xyz", (3, n + 16), wp.float64, device),
        atoms=cpu_launch.kept("cell_atoms", (n,), wp.int32, device),
        bin_start=cpu_launch.kept("cell_bin_start", (int(firsts[-1]) + 3,), wp.int32, device),
        wrap=cpu_launch.kept("cell_wrap", (n,), k.vec3l, device),
    )
    home = cpu_launch.kept("cell_home", (n,), wp.vec4i, device)
    place = cpu_launch.kept("cell_place", (n,), wp.int32, device)
    wrapped = cpu_launch.kept("cell_wrapped", (1,), wp.int32, device)
    extent = _over(np.stack([lo, span], 1), wp.vec3d)
    cpu_launch.launch_queries(
        k.atoms_to_bins, 1, 1, [x, first, rows, extent, grid], [home, place, wrapped], device, None
    )
    if not wrapped.numpy()[0]:
        grid.wrap = cpu_launch.nothing((0,), k.vec3l, device)
    return home, place, grid


def _extent(k, x: wp.array, first: wp.array, rows: wp.array, periodic: np.ndarray) -> tuple:
    """Where each structure's bins start and how far they reach along each axis, in fractional
    coordinates: the cell's [0, 1) along a periodic axis, the finite atoms' range along the
    others (zero where it has none)."""
    structures = len(periodic)
    if periodic.all():
        return np.zeros((structures, 3)), np.ones((structures, 3))
    device = wp.get_device("cpu")
    extent = wp.empty((structures, 2), dtype=wp.vec3d, device=device)
    cpu_launch.launch_queries(k.frac_extent, 1, 1, [x, first, rows], [extent], device, None)
    low, high = extent.numpy().transpose(1, 0, 2)
    lo = np.where(periodic, 0.0, low)
    return lo, np.where(periodic, 1.0, high - lo)


def _bins(inverse: np.ndarray, lo, span, periodic: np.ndarray, atoms: np.ndarray, cutoff: float) -> tuple:
    """Each structure's bins per axis, each at least a cutoff thick between its lattice planes
    (no more bins than atoms to fill them), and how many bins either side a walk reaches."""
    heights = 1.0 / np.linalg.norm(inverse, axis=1)  # between the lattice planes of each axis
    thickness = span * heights
    shape = np.maximum(1, np.floor(thickness / (cutoff * _MARGIN))).astype(np.int64)
    while (sparse := np.flatnonzero(shape.prod(1) > 2 * atoms + 8)).size:  # sparse clusters
        shape[sparse, shape[sparse].argmax(1)] //= 2
    width = thickness / shape
    reach = np.where(width > 0, np.ceil(cutoff * _MARGIN / np.where(width > 0, width, 1.0)), 0).astype(np.int64)
    reach = np.where(periodic, reach, np.minimum(reach, shape - 1))
    _check_visits(atoms, reach, heights, cutoff)
    return shape, reach


def _check_visits(atoms: np.ndarray, reach: np.ndarray, heights: np.ndarray, cutoff: float) -> None:
    visits = np.prod(2 * reach + 1, axis=1) * atoms
    for b in np.flatnonzero(visits > MAX_VISITS)[:1]:
        raise fail(
            "neighbor_list",
            f"a cutoff of {cutoff} spans {reach[b].tolist()} cells along the axes of a cell with lattice-plane spacings "
            f"{np.round(heights[b], 6).tolist()}: {int(visits[b]):,} images to consider, more than {MAX_VISITS:,}; "
            "use a larger cell (a supercell) or a smaller cutoff",
        )


def _over(values: np.ndarray, dtype) -> wp.array:
    """A CPU Warp array over the contiguous NumPy array ``values`` that nothing writes (no copy:
    ~10 us less an array; Warp keeps ``values`` alive)."""
    return wp.array(values, dtype=dtype, device="cpu", copy=False)
