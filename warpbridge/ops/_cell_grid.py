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
    parts = [_structure(pos[s:e], cells[b], periodic[b], cutoff) for b, (s, e) in enumerate(zip(starts, starts[1:]))]
    home, bins, grid = _layout(k, parts, n)
    grid.cut2, grid.full = float(cutoff) ** 2, int(full)
    home_w, place = _over(home, wp.vec4i), _over(bins, wp.int32)
    before = [home_w, place, grid]
    counts = wp.empty(n, dtype=wp.int64, device=device)
    _launches.launch(k.pair_count, n, before, [counts], device)
    count = counts.numpy()
    offsets = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
    e = int(offsets[-1])
    if e > MAX_PAIRS:
        raise fail(
            "neighbor_list",
            f"{e:,} pairs found, more than one call returns ({MAX_PAIRS:,}); use a smaller cutoff or fewer structures per call",
        )
    js, dist = wp.empty(e, dtype=wp.int64, device=device), wp.empty(e, dtype=wp.float64, device=device)
    shifts = wp.empty(e, dtype=k.vec3l, device=device)
    vec = wp.empty(e if vectors else 0, dtype=wp.vec3d, device=device)
    offsets_w = _over(offsets, wp.int64)
    _launches.launch(k.pair_fill, n, [*before, offsets_w], [js, shifts, dist, vec], device)
    i = np.repeat(np.arange(n, dtype=np.int64), count)
    return i, js.numpy(), shifts.numpy().reshape(e, 3), dist.numpy(), vec.numpy().reshape(e, 3) if vectors else None


def _structure(x: np.ndarray, cell: np.ndarray, periodic: np.ndarray, cutoff: float) -> dict:
    """One structure's grid: its lattice (the cell, or the identity without periodic axes),
    wrapped points and wraps, each atom's bin (-1 rows where not finite), bins and reach."""
    lattice = cell if periodic.any() else np.eye(3)
    inverse = np.linalg.inv(lattice)
    finite = np.isfinite(x).all(1)
    frac = np.where(finite[:, None], x, 0.0) @ inverse
    wrap = np.where(periodic, np.floor(frac), 0.0).astype(np.int64)
    frac -= wrap
    heights = 1.0 / np.linalg.norm(inverse, axis=0)  # between the lattice planes of each axis
    lo, span = _extent(frac, finite, periodic)
    thickness = span * heights
    shape = np.maximum(1, np.floor(thickness / (cutoff * _MARGIN))).astype(np.int64)
    while shape.prod() > 2 * len(x) + 8:  # sparse clusters: no more bins than atoms to fill them
        shape[np.argmax(shape)] //= 2
    width = thickness / shape
    reach = np.where(width > 0, np.ceil(cutoff * _MARGIN / np.where(width > 0, width, 1.0)), 0).astype(np.int64)
    reach = np.where(periodic, reach, np.minimum(reach, shape - 1))
    _check_visits(len(x), reach, heights, cutoff)
    scaled = np.where(span > 0, (frac - lo) / np.where(span > 0, span, 1.0), 0.0) * shape
    coords = np.clip(np.floor(scaled), 0, shape - 1).astype(np.int64)
    coords[~finite] = -1
    return dict(
        lattice=lattice,
        points=x - wrap @ lattice,
        wrap=wrap,
        coords=coords,
        shape=shape,
        reach=reach,
        periodic=periodic,
    )


def _extent(frac: np.ndarray, finite: np.ndarray, periodic: np.ndarray) -> tuple:
    """Where the bins start and how far they reach along each axis, in fractional coordinates:
    the cell's [0, 1) along a periodic axis, the finite atoms' range along the others."""
    if periodic.all():
        return np.zeros(3), np.ones(3)
    inner = frac if finite.all() else frac[finite] if finite.any() else np.zeros((1, 3))
    lo = np.where(periodic, 0.0, inner.min(0))
    return lo, np.where(periodic, 1.0, inner.max(0) - lo)


def _check_visits(atoms: int, reach: np.ndarray, heights: np.ndarray, cutoff: float) -> None:
    visits = int(np.prod(2 * reach + 1)) * atoms
    if visits > MAX_VISITS:
        raise fail(
            "neighbor_list",
            f"a cutoff of {cutoff} spans {reach.tolist()} cells along the axes of a cell with lattice-plane spacings "
            f"{np.round(heights, 6).tolist()}: {visits:,} images to consider, more than {MAX_VISITS:,}; "
            "use a larger cell (a supercell) or a smaller cutoff",
        )


def _layout(k, parts: list, n: int) -> tuple:
    """(each atom's (bin x, y, z, structure), -1 first where not finite; each atom's place in
    bin order; the Grid of all structures)."""
    firsts = np.concatenate([[0], np.cumsum([p["shape"].prod() for p in parts])]).astype(np.int64)
    coords = np.concatenate([p["coords"] for p in parts]) if parts else np.zeros((0, 3), np.int64)
    structure = np.repeat(np.arange(len(parts)), [len(p["coords"]) for p in parts])
    shape = np.array([p["shape"] for p in parts]).reshape(-1, 3)
    finite = coords[:, 0] >= 0
    bin_id = np.where(finite, firsts[structure] + (coords[:, 0] * shape[structure, 1] + coords[:, 1]) * shape[structure, 2] + coords[:, 2], firsts[-1])  # fmt: skip
    atoms, place, bin_start = _sorted_by_bin(k, bin_id.astype(np.int32), int(firsts[-1]))
    order = atoms.numpy()
    home = np.concatenate([coords, structure[:, None]], 1).astype(np.int32)
    points = np.concatenate([p["points"] for p in parts]) if parts else np.zeros((0, 3))
    wrap = np.concatenate([p["wrap"] for p in parts]) if parts else np.zeros((0, 3), np.int64)
    bits = np.array([int(p["periodic"] @ [1, 2, 4]) for p in parts], dtype=np.int64).reshape(-1, 1)
    grid = _launches.struct(
        k.Grid,
        cells=_over(np.array([p["lattice"] for p in parts]).reshape(-1, 3, 3), wp.vec3d),
        shape=_over(np.concatenate([shape, firsts[:-1, None]], 1).astype(np.int32), wp.vec4i),
        reach=_over(
            np.concatenate([np.array([p["reach"] for p in parts]).reshape(-1, 3), bits], 1).astype(np.int32), wp.vec4i
        ),
        xyz=_over(_padded_rows(points[order]), wp.float64),
        atoms=atoms,
        bin_start=bin_start,
        wrap=_over(np.ascontiguousarray(wrap[order]) if wrap.any() else np.zeros((0, 3), np.int64), k.vec3l),
    )
    return home, place, grid


def _sorted_by_bin(k, bin_id: np.ndarray, bins: int) -> tuple:
    """(the atoms in bin order, as a Warp array; each atom's place in that order; each bin's
    first place, then the end of the last, as a Warp array), ``bin_id`` each atom's bin
    (``bins`` for the atoms that are not finite): a stable counting sort, O(N) where NumPy's
    stable argsort of the ids is a comparison sort."""
    device = wp.get_device("cpu")
    starts = np.zeros(bins + 2, dtype=np.int32)
    np.cumsum(np.bincount(bin_id, minlength=bins + 1), out=starts[1:])
    order, place = (
        wp.empty(len(bin_id), dtype=wp.int32, device=device),
        wp.empty(len(bin_id), dtype=wp.int32, device=device),
    )
    next_place = wp.array(starts[:-1], dtype=wp.int32, device=device)  # advanced by the sort
    cpu_launch.launch_queries(k.atoms_by_bin, 1, 1, [_over(bin_id, wp.int32)], [next_place, order, place], device, None)
    return order, place.numpy(), _over(starts[:-1], wp.int32)


def _over(values: np.ndarray, dtype) -> wp.array:
    """A CPU Warp array over the contiguous NumPy array ``values`` that nothing writes (no copy:
    ~10 us less an array; Warp keeps ``values`` alive)."""
    return wp.array(values, dtype=dtype, device="cpu", copy=False)


def _padded_rows(points: np.ndarray) -> np.ndarray:
    """(3, N + 16): the points' x, y and z as rows, then 16 columns of inf that no pair takes (a
    walk reads its bins 16 atoms at a time)."""
    rows = np.full((3, len(points) + 16), np.inf)
    rows[:, : len(points)] = points.T
    return rows
