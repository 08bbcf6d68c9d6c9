"""Neighbour lists for atomistic models (vesin's and ASE's conventions): periodic cells of any
shape, shift vectors, half lists, batches of structures.

The search yields integers only (``i``, ``j``, the cell shifts ``S``), found on the host
through the kd-tree radius search over each structure's atoms and the periodic images of its
wrapped atoms. The distance vectors ``D = x[j] - x[i] + S @ cell`` and distances ``d`` are then
built from them with the caller's own array operations, so they are differentiable in the
positions and the cell to any order (force matching with ``create_graph=True``, stress,
Hessian-vector products) on every framework.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from .._core.errors import describe, fail
from ._lists import radius
from ._search import adapter_of, positive

QUANTITIES = "ijSdD"
MAX_IMAGES = 1 << 27  # the most periodic images of a structure a call considers (a few GiB of host memory)


def neighbor_list(
    positions: Any,
    cutoff: float,
    *,
    cell: Any = None,
    pbc: Any = None,
    batch: Any = None,
    batch_ptr: Any = None,
    full_list: bool = True,
    quantities: str = "ijSd",
    max_neighbors: int | None = None,
) -> tuple:
    """Every pair of atoms closer than ``cutoff`` (strictly, ``d < cutoff``), through periodic
    boundaries: vesin's and ASE's ``neighbor_list``.

    Args:
        positions: (N, 3) float32 or float64 atom positions, inside the cell or not.
        cutoff: the cutoff radius, > 0; may exceed the cell (every image within it counts,
            an atom's own images included).
        cell: (3, 3) lattice vectors as rows (ASE's convention), or (B, 3, 3), one per
            structure of a batch; same dtype as ``positions``. None: no periodicity.
        pbc: periodic axes: a bool, 3 bools, or (B, 3) bools per structure. None: all three
            where a cell is given.
        batch: (N,) int32 or int64 structure numbers, sorted; or ``batch_ptr``: (B + 1,) the
            first atom of each structure and N. None of both: one structure.
        full_list: True (default): each pair twice, (i, j) and (j, i); False: once, with
            i < j, or for an atom and its own image the shift whose first non-zero component
            is positive.
        quantities: the outputs, in this order, from ``i``, ``j`` (int64 atom indices), ``S``
            (int64 (E, 3) cell shifts), ``d`` (distances), ``D`` ((E, 3) vectors
            ``x[j] - x[i] + S @ cell``).
        max_neighbors: keep each atom's closest this many (ties by the search's order).

    Returns:
        A tuple of the ``quantities``, pairs sorted by ``i``, then by distance. ``d`` and
        ``D`` are built with the caller's framework, differentiable in ``positions`` and
        ``cell`` to any order.

    Raises:
        WarpBridgeError: wrong shapes or dtypes; cutoff not > 0; a singular cell on a
            periodic axis; pbc without a cell; batch and batch_ptr together or not matching
            the atoms; under a tracer that cannot read values (``jax.jit``).

    Example::

        i, j, S, D = wb.ops.neighbor_list(pos, 5.0, cell=cell, quantities="ijSD")
        energy = pair_energy(D.norm(dim=1)); forces = -torch.autograd.grad(energy, pos, create_graph=True)[0]
    """
    op = "neighbor_list"
    a = adapter_of(op, {"positions": positions})
    dtype, shape, _ = a.info(positions)
    if len(shape) != 2 or shape[1] != 3 or dtype not in ("float32", "float64"):
        raise fail(op, f"'positions' must be (N, 3) float32 or float64, got {dtype} {shape}")
    r = positive(op, "cutoff", cutoff, dtype)
    wanted = _quantities(op, quantities)
    if not isinstance(full_list, bool):
        raise fail(op, f"'full_list' must be True or False, got {describe(full_list)}")
    cap = _cap(op, max_neighbors)
    host = _host(op, a, positions).astype(np.float64)
    starts = _starts(op, a, shape[0], batch, batch_ptr)
    cells, pbc_rows = _cells(op, a, cell, pbc, len(starts) - 1, dtype)
    i, j, shifts = _pairs(host, starts, cells, pbc_rows, r, full_list, cap)
    return _outputs(a, positions, cell, wanted, i, j, shifts, starts, dtype)


def _quantities(op: str, quantities: Any) -> str:
    if not isinstance(quantities, str) or not quantities or any(q not in QUANTITIES for q in quantities):
        raise fail(op, f"'quantities' must be a string of {', '.join(QUANTITIES)}, got {describe(quantities)}")
    if len(set(quantities)) != len(quantities):
        raise fail(op, f"'quantities' names each quantity once, got {quantities!r}")
    return quantities


def _cap(op: str, max_neighbors: Any) -> int:
    if max_neighbors is None:
        return 0
    if isinstance(max_neighbors, bool) or not isinstance(max_neighbors, numbers.Integral) or max_neighbors < 1:
        raise fail(op, f"'max_neighbors' must be None or an int >= 1, got {describe(max_neighbors)}")
    return int(max_neighbors)


def _host(op: str, a: Any, x: Any) -> np.ndarray:
    """``x``'s values on the host; a tracer cannot give them."""
    try:
        return np.asarray(a.to_host(x))
    except Exception as e:
        raise fail(op, f"the pairs depend on the values, which cannot be read while tracing: {e}") from e


def _starts(op: str, a: Any, n: int, batch: Any, batch_ptr: Any) -> np.ndarray:
    """Each structure's first atom, and n at the end."""
    if batch is not None and batch_ptr is not None:
        raise fail(op, "pass 'batch' or 'batch_ptr', not both")
    if batch is None and batch_ptr is None:
        return np.array([0, n], dtype=np.int64)
    name, given = ("batch", batch) if batch is not None else ("batch_ptr", batch_ptr)
    values = _host(op, a, given)
    if values.dtype not in (np.int32, np.int64) or values.ndim != 1:
        raise fail(op, f"'{name}' must be a 1-D int32 or int64 array, got {values.dtype} {values.shape}")
    values = values.astype(np.int64)
    if name == "batch":
        if len(values) != n:
            raise fail(op, f"'batch' must have one structure number per atom ({n}), got {len(values)}")
        if n and (values[0] < 0 or (np.diff(values) < 0).any()):
            raise fail(op, "'batch' must be sorted non-negative structure numbers (each structure's atoms together)")
        return np.searchsorted(values, np.arange(int(values[-1]) + 2 if n else 1)).astype(np.int64)
    if len(values) < 2 or values[0] != 0 or values[-1] != n or (np.diff(values) < 0).any():
        raise fail(op, f"'batch_ptr' must rise from 0 to the number of atoms ({n}), got {values.tolist()[:8]}")
    return values


def _cells(op: str, a: Any, cell: Any, pbc: Any, structures: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(B, 3, 3) float64 cells and (B, 3) periodic axes, checked."""
    if cell is None:
        if pbc is not None and np.asarray(pbc).any():
            raise fail(op, "'pbc' needs a 'cell'")
        return np.zeros((structures, 3, 3)), np.zeros((structures, 3), dtype=bool)
    cell_dtype, shape, _ = a.info(cell)
    if shape not in ((3, 3), (structures, 3, 3)) or cell_dtype != dtype:
        raise fail(op, f"'cell' must be {dtype} (3, 3) or ({structures}, 3, 3), got {cell_dtype} {shape}")
    cells = np.broadcast_to(_host(op, a, cell).astype(np.float64), (structures, 3, 3))
    plain = pbc is None or isinstance(pbc, (bool, np.bool_, list, tuple, np.ndarray))
    periodic = np.asarray(True if pbc is None else pbc if plain else _host(op, a, pbc))
    if periodic.dtype != bool or periodic.shape not in ((), (3,), (structures, 3)):
        raise fail(op, f"'pbc' must be a bool, 3 bools or ({structures}, 3) bools, got {describe(pbc)}")
    periodic = np.broadcast_to(periodic, (structures, 3))
    for b in range(structures):
        if periodic[b].any() and abs(np.linalg.det(cells[b])) <= 1e-12 * np.prod(np.linalg.norm(cells[b], axis=1)):
            raise fail(op, f"the cell of structure {b} is singular, but it has periodic axes: {cells[b].tolist()}")
    return cells, periodic


def _images(x: np.ndarray, cell: np.ndarray, periodic: np.ndarray, cutoff: float) -> tuple:
    """(wrapped atoms, the cell shift that wrapped each, and the images a search needs: their
    positions, atoms and shifts). The wrapped atoms lie in the cell along the periodic axes;
    an image is kept where it lies within ``cutoff`` of the cell (in lattice-plane distances),
    so every image within ``cutoff`` of a wrapped atom is kept."""
    atoms = np.arange(len(x))
    if not periodic.any():
        return x, np.zeros((len(x), 3), dtype=np.int64), (x, atoms, np.zeros((len(x), 3), dtype=np.int64))
    inverse = np.linalg.inv(cell)
    finite = np.isfinite(x).all(1, keepdims=True)
    frac = np.where(finite, x, 0.0) @ inverse
    wrap = np.where(periodic, np.floor(frac), 0.0).astype(np.int64)
    heights = 1.0 / np.linalg.norm(inverse, axis=0)  # between the lattice planes of each axis
    reach = np.where(periodic, np.ceil(cutoff / heights), 0).astype(np.int64)
    candidates = int(np.prod(2 * reach + 1)) * len(x)
    if candidates > MAX_IMAGES:
        raise fail(
            "neighbor_list",
            f"a cutoff of {cutoff} spans {reach.tolist()} cells along the axes of a cell with lattice-plane spacings "
            f"{np.round(heights, 6).tolist()}: {candidates:,} images to consider, more than {MAX_IMAGES:,}; "
            "use a larger cell (a supercell) or a smaller cutoff",
        )
    grid = np.meshgrid(*[np.arange(-k, k + 1) for k in reach], indexing="ij")
    shifts = np.stack([g.ravel() for g in grid], 1)
    image_frac = (frac - wrap)[None] + shifts[:, None]  # (shifts, atoms, 3)
    margin = np.where(periodic, cutoff / heights, np.inf)
    near = ((image_frac >= -margin) & (image_frac <= 1 + margin)).all(-1) | ~finite[None, :, 0]
    s_index, a_index = np.nonzero(near)
    wrapped = x - wrap @ cell
    return wrapped, wrap, (wrapped[a_index] + shifts[s_index] @ cell, a_index, shifts[s_index])


def _pairs(pos, starts, cells, periodic, cutoff, full_list, cap) -> tuple:
    """(i, j, S) on the host, sorted by i, then distance: one radius search over every
    structure's wrapped atoms (queries) and their images (references)."""
    queries, wraps, refs, ref_batch, ref_atoms, ref_shifts = [], [], [], [], [], []
    for b in range(len(starts) - 1):
        wrapped, wrap, (images, atoms, shifts) = _images(pos[starts[b] : starts[b + 1]], cells[b], periodic[b], cutoff)
        queries.append(wrapped)
        wraps.append(wrap)
        refs.append(images)
        ref_batch.append(np.full(len(images), b, dtype=np.int64))
        ref_atoms.append(atoms + starts[b])
        ref_shifts.append(shifts)
    query_batch = np.repeat(np.arange(len(starts) - 1), np.diff(starts))
    q, r = np.concatenate(queries), np.concatenate(refs)
    margin = cutoff * (1 + 1e-9) + 1e-300  # every pair within the cutoff; the strict test below decides
    nb = radius(q, r, margin, query_batch=query_batch, ref_batch=np.concatenate(ref_batch))
    i = np.repeat(np.arange(len(q)), nb.count)
    j = np.concatenate(ref_atoms)[nb.index]
    wrap = np.concatenate(wraps)
    S = np.concatenate(ref_shifts)[nb.index] - wrap[j] + wrap[i]
    keep = (nb.distance < cutoff) & ((i != j) | S.any(1))  # strict; not an atom with itself
    if not full_list:
        first = np.take_along_axis(S, np.argmax(S != 0, axis=1)[:, None], 1)[:, 0]
        keep &= (i < j) | ((i == j) & (first > 0))
    i, j, S = i[keep], j[keep], S[keep]  # rows stay by i, then distance, as the search gave them
    if cap:
        rank = np.arange(len(i)) - np.searchsorted(i, i)
        i, j, S = i[rank < cap], j[rank < cap], S[rank < cap]
    return i.astype(np.int64), j.astype(np.int64), S.astype(np.int64)


def _outputs(a, positions, cell, wanted, i, j, shifts, starts, dtype) -> tuple:
    """The quantities as the caller's arrays; D and d from its own operations."""
    host = {"i": i, "j": j, "S": shifts}
    arrays = {name: a.from_host(np.ascontiguousarray(values), positions) for name, values in host.items()}
    if "D" in wanted or "d" in wanted:
        vectors = positions[arrays["j"]] - positions[arrays["i"]]
        if cell is not None:
            shifts_f = a.cast(arrays["S"], dtype)
            if len(a.info(cell)[1]) == 2:
                vectors = vectors + shifts_f @ cell
            else:  # each pair's own structure's cell
                structure = np.repeat(np.arange(len(starts) - 1), np.diff(starts))[i]
                vectors = vectors + (shifts_f[:, None, :] @ cell[a.from_host(structure, positions)])[:, 0, :]
        arrays["D"] = vectors
        arrays["d"] = (vectors * vectors).sum(-1) ** 0.5
    return tuple(arrays[name] for name in wanted)
