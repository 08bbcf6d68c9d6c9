"""The host side of the cell list (``kdtree.cells``): each structure's bins, and the passes
that sort the atoms into them and write the pairs, over all structures at once.

Bins are cut in fractional coordinates: along a periodic axis the cell's [0, 1), along one
that is not the atoms' own range. Each bin is at least a cutoff thick between its lattice
planes (with a relative margin of 1e-9, so that rounding never puts a pair two bins apart),
so a walk visits the 27 bins around an atom's own; a cell thinner than the cutoff along an
axis has one bin there and a walk reaches across as many cells as the cutoff spans.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import numpy as np
import warp as wp

from .._core.errors import fail
from . import _cpu_launch as cpu_launch
from . import _launches, _lent_memory, kdtree

MAX_VISITS = 1 << 27  # the most (atom, cell image) pairs a structure's walks may visit
MAX_PAIRS = (1 << 31) - 1  # the most pairs one call returns (Warp's array sizes are 32-bit)
_MARGIN = 1.0 + 1e-9
# Up to about this many pairs one thread writing the rows in one pass beats two counting, then
# filling: 10^3 atoms (52 000 pairs) 1.87 against 2.51 ms; a 2 000-atom cluster (87 000) 2.81
# against 2.80; 10^4 atoms (525 000) 15.2 against 10.7.
ONE_THREAD_PAIRS = 1 << 17
# Up to this many atoms one pass in atom order beats counting first on one thread; past it a
# walk in atom order (not bin order) misses the cache: 2.5 x 10^5 atoms 450-480 against 595 ms,
# 5 x 10^5 1 700-2 040 against 1 240, 10^6 5 770 against 2 650.
ONE_PASS_ATOMS = 1 << 18


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
    (N, 3) float64, the structures' atoms at ``starts``.

    Up to ONE_PASS_ATOMS atoms, and where the estimate is at most ONE_THREAD_PAIRS pairs or one
    thread is all there is, one thread writes the rows in one pass, in atom order, into arrays
    sized by the estimate that grow when it falls short; else each atom's pairs are counted
    first and the threads write the rows at their places."""
    n, k = len(pos), kdtree.cell_kernels()
    home, place, grid, estimate = _binned(k, pos, starts, cells, periodic, cutoff)
    estimate = estimate if full else estimate // 2 + 512
    grid.cut2, grid.full = float(cutoff) ** 2, int(full)
    before = [home, place, grid]
    few = estimate <= ONE_THREAD_PAIRS or cpu_launch.threads(wp.get_device("cpu"), n) == 1
    one_thread = few and n <= ONE_PASS_ATOMS and estimate <= MAX_PAIRS
    found = _in_one_pass(k, before, n, estimate, vectors) if one_thread else None
    if found is None:
        found = _counted(k, before, n, vectors)
    return (*found[:4], found[4] if vectors else None)


def _pair_arrays(room: int, vectors: bool) -> list:
    """Uninitialised (i, j, S, d, D) arrays for ``room`` pairs (D empty unless ``vectors``),
    views of one block of lent memory (``_lent_memory``): a loop's next call takes the block
    again once the caller has dropped these."""
    widths = (1, 1, 3, 1, 3 if vectors else 0)
    block = _lent_memory.lend(room * sum(widths) * 8)
    found, at = [], 0
    for width, dtype in zip(widths, (np.int64, np.int64, np.int64, np.float64, np.float64)):
        rows = room if width else 0
        found.append(block[at : at + rows * width].view(dtype).reshape((rows, 3) if width != 1 else rows))
        at += rows * width
    return found


def _launch_fill(k, kernel, m: int, before: list, found: list) -> None:
    """``kernel`` (pair_fill or pair_run) over ``m`` atoms, into the ``found`` arrays."""
    types = (wp.int64, wp.int64, k.vec3l, wp.float64, wp.vec3d)
    after = [_over(a, t) for a, t in zip(found, types)]
    cpu_launch.launch(kernel, m, before, after, wp.get_device("cpu"))


def _counted(k, before: list, n: int, vectors: bool) -> list:
    """The pairs, each atom's counted first (a pass of the walk), then written at their places."""
    device = wp.get_device("cpu")
    counts = cpu_launch.kept("cell_counts", (n,), wp.int64, device)
    cpu_launch.launch(k.pair_count, n, before, [counts], device)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts.numpy(), out=offsets[1:])
    e = int(offsets[-1])
    if e > MAX_PAIRS:
        raise fail(
            "neighbor_list",
            f"{e:,} pairs found, more than one call returns ({MAX_PAIRS:,}); use a smaller cutoff or fewer structures per call",
        )
    found = _pair_arrays(e, vectors)
    _launch_fill(k, k.pair_fill, n, [*before, _over(offsets, wp.int64)], found)
    return found


def _in_one_pass(k, before: list, n: int, estimate: int, vectors: bool) -> list | None:
    """The pairs in one pass on one thread, into arrays of about ``estimate`` pairs that grow by
    half whenever the next row does not fit; None past MAX_PAIRS (the count then tells how many)."""
    room = estimate
    progress = np.zeros(2, dtype=np.int64)  # the next atom, the next place
    found = _pair_arrays(room, vectors)
    while True:
        _launch_fill(k, k.pair_run, 1, [*before, _over(progress, wp.int64)], found)
        if progress[0] == n:
            break
        room = room + room // 2 + 1024
        if room > MAX_PAIRS:
            return None
        found = _grown(found, room, vectors, int(progress[1]))
    return [a[: int(progress[1]) if len(a) else 0] for a in found]


def _grown(found: list, room: int, vectors: bool, kept: int) -> list:
    """Arrays of ``room`` pairs holding the first ``kept`` of ``found``."""
    grown = _pair_arrays(room, vectors)
    for old, new in zip(found, grown):
        new[:kept] = old[:kept]
    return grown


class _Layout(NamedTuple):
    """What the bins of a call's structures are, before any atom is put in them: the Grid (its
    arrays this thread's kept scratch, ``wrap`` among them until a call finds no atom wrapped),
    the structures' first atoms, the rows of their lattices' inverses and where their bins
    start and reach (fractional), the first bin of each, and per structure the pairs of an
    atom where each bin holds one (``_per_atom``)."""

    grid: Any
    wrap: wp.array
    first: wp.array
    rows: wp.array
    extent: wp.array
    firsts: np.ndarray
    per_atom: np.ndarray


_LAST = threading.local()  # this thread's last layout of the bins, with the key it was made for


def _binned(k, pos: np.ndarray, starts: np.ndarray, cells: np.ndarray, periodic: np.ndarray, cutoff: float) -> tuple:
    """(each atom's (bin x, y, z, structure), -1 three times where not finite; each atom's
    place in bin order; the Grid of all structures, its atoms sorted into their bins; about
    how many pairs a full list holds, rather more than fewer).

    The bins are shaped by the cells, the cutoff, the atoms per structure and, along the axes
    that are not periodic, the atoms' range: this thread's last layout is taken again while the
    first three are the same, and made anew when the binning finds an atom outside its bins
    (the steps of a training loop or a simulation; its bins span 1% more than the atoms that
    made it)."""
    n, device = len(pos), wp.get_device("cpu")
    x = _over(pos, wp.vec3d)
    key = (cells.tobytes(), periodic.tobytes(), float(cutoff), starts.tobytes())
    last = getattr(_LAST, "layout", None)
    layout = last[1] if last is not None and last[0] == key else None
    home = cpu_launch.kept("cell_home", (n,), wp.vec4i, device)
    place = cpu_launch.kept("cell_place", (n,), wp.int32, device)
    flags = cpu_launch.kept("cell_flags", (2,), wp.int32, device)
    for fresh in (layout is None, True):
        if fresh:
            layout = _layout(k, x, starts, cells, periodic, cutoff)
            _LAST.layout = (key, layout)
        grid = layout.grid
        grid.wrap = layout.wrap  # the kernel writes every atom's wraps
        before = [x, layout.first, layout.rows, layout.extent, grid]
        cpu_launch.launch_queries(k.atoms_to_bins, 1, 1, before, [home, place, flags], device, None)
        wrapped, outside = flags.numpy()
        if fresh or not outside:
            break
    if not wrapped:
        grid.wrap = cpu_launch.nothing((0,), k.vec3l, device.alias)
    return home, place, grid, _pairs_estimate(grid, layout)


def _pairs_estimate(grid: Any, layout: _Layout) -> int:
    """About how many pairs a full list over the binned atoms holds, rather more than fewer:
    the squares of the bins' atoms times their structure's pairs per atom (``_per_atom``)."""
    occupancy = np.diff(grid.bin_start.numpy()[: layout.firsts[-1] + 1]).astype(np.int64)
    if not len(occupancy):
        return 0
    return int(1.1 * float(np.add.reduceat(occupancy**2, layout.firsts[:-1]) @ layout.per_atom)) + 1024


def _layout(k, x: wp.array, starts: np.ndarray, cells: np.ndarray, periodic: np.ndarray, cutoff: float) -> _Layout:
    """The bins of the structures at ``starts`` of the atoms ``x`` (see ``_Layout``)."""
    n, device = x.shape[0], wp.get_device("cpu")
    first = _over(starts, wp.int64)
    lattice = np.where(periodic.any(1)[:, None, None], cells, np.eye(3))  # the identity where no axis is periodic
    inverse = np.linalg.inv(lattice)
    rows = _over(inverse, wp.vec3d)  # rows of each inverse: f = x @ inverse
    lo, span = _extent(k, x, first, rows, periodic)
    margin = np.where(periodic, 0.0, 0.005 * span)
    lo, span = lo - margin, span + 2 * margin
    shape, reach = _bins(inverse, lo, span, periodic, np.diff(starts), cutoff)
    firsts = np.zeros(len(shape) + 1, dtype=np.int64)
    np.cumsum(shape.prod(1), out=firsts[1:])
    bits = periodic @ np.array([1, 2, 4])
    wrap = cpu_launch.kept("cell_wrap", (n,), k.vec3l, device)
    grid = _launches.struct(
        k.Grid,
        cells=_over(lattice, wp.vec3d),
        shape=_over(np.concatenate([shape, firsts[:-1, None]], 1).astype(np.int32), wp.vec4i),
        reach=_over(np.concatenate([reach, bits[:, None]], 1).astype(np.int32), wp.vec4i),
        xyz=cpu_launch.kept("cell_xyz", (3, n + 16), wp.float64, device),
        atoms=cpu_launch.kept("cell_atoms", (n,), wp.int32, device),
        bin_start=cpu_launch.kept("cell_bin_start", (int(firsts[-1]) + 3,), wp.int32, device),
        wrap=wrap,
    )
    extent = _over(np.stack([lo, span], 1), wp.vec3d)
    per_atom = _per_atom(lattice, span / shape, reach, cutoff)
    return _Layout(grid, wrap, first, rows, extent, firsts, per_atom)


def _per_atom(lattice: np.ndarray, sides: np.ndarray, reach: np.ndarray, cutoff: float) -> np.ndarray:
    """Per structure, the pairs of an atom where each bin holds one atom: the atoms a sphere of
    the cutoff holds at that density, at most the bins a walk visits. Times the squares of the
    bins' atoms, about how many pairs a full list holds. ``sides``: the bins' edges in
    fractional coordinates."""
    volume = np.abs(np.linalg.det(lattice)) * sides.prod(1)  # of one bin
    sphere = 4 / 3 * np.pi * cutoff**3
    return np.minimum(sphere / np.where(volume > 0, volume, 1e-300), np.prod(2 * reach + 1, axis=1))


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
    """A CPU Warp array over the contiguous NumPy array ``values``, sharing its memory (no copy:
    ~10 us less an array; Warp keeps ``values`` alive)."""
    return wp.array(values, dtype=dtype, device="cpu", copy=False)
