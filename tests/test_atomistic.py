"""wb.ops.neighbor_list against ASE's and vesin's neighbour lists (the same pairs and shifts on
cubic, triclinic and skewed cells, per-axis pbc, cutoffs past the cell, atoms outside it, a
single atom, an empty structure, and batches of them), the strict cutoff, half lists, and the
gradients a force field trains on (forces, stress, force matching with create_graph) against
float64 finite differences and plain torch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import vesin
from ase import Atoms
from ase.neighborlist import neighbor_list as ase_neighbor_list

import warpbridge as wb

rng = np.random.default_rng(0)
TRICLINIC = np.array([[8.0, 0, 0], [3, 7, 0], [1, 2, 6]])
SKEWED = np.array([[2.0, 0, 0], [1.9, 0.5, 0], [0.3, 0.2, 2.0]])

STRUCTURES = {
    "cubic box": (rng.random((150, 3)) * 9, np.eye(3) * 9, True, 3.0),
    "triclinic, pbc TFT": (rng.random((90, 3)) @ TRICLINIC, TRICLINIC, [True, False, True], 4.0),
    "skewed, cutoff past the cell, atoms outside": (rng.random((6, 3)) * 4 - 3, SKEWED, True, 3.1),
    "pbc FFT": (rng.random((60, 3)) * 6, np.eye(3) * 6, [False, False, True], 2.5),
    "single atom, its own images": (np.zeros((1, 3)), np.eye(3) * 1.5, True, 4.0),
    "no periodicity": (rng.random((80, 3)) * 5, np.eye(3) * 5, False, 1.5),
    "dense: rows of ~700 pairs": (rng.random((300, 3)) * 6, np.eye(3) * 6, True, 5.0),
}


def triples(i, j, S):
    return sorted(zip(np.asarray(i).tolist(), np.asarray(j).tolist(), map(tuple, np.asarray(S).tolist())))


def ase_pairs(pos, cell, pbc, cutoff):
    return triples(*ase_neighbor_list("ijS", Atoms(f"H{len(pos)}", positions=pos, cell=cell, pbc=pbc), cutoff))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(STRUCTURES))
def test_the_same_pairs_and_shifts_as_ase(name, dtype):
    pos, cell, pbc, cutoff = STRUCTURES[name]
    pos = torch.tensor(pos, dtype=dtype).double().numpy()  # the values float32 holds, for both
    i, j, S, d = wb.ops.neighbor_list(
        torch.tensor(pos, dtype=dtype), cutoff, cell=torch.tensor(cell, dtype=dtype), pbc=pbc
    )
    assert triples(i, j, S) == ase_pairs(pos, cell, pbc, cutoff)
    assert (torch.diff(i) >= 0).all() and d.dtype == dtype and (d < cutoff).all()
    want = np.linalg.norm(pos[j] - pos[i] + S.numpy() @ cell, axis=1)
    np.testing.assert_allclose(d.double().numpy(), want, rtol=1e-6 if dtype == torch.float32 else 1e-12, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["triclinic, pbc TFT", "dense: rows of ~700 pairs"])
def test_values_without_gradients_are_the_built_ones_and_rows_are_sorted(name, dtype):
    """Without a gradient to carry, D and d are the search's float64 values (cast); with one,
    the caller's operations build them from the integers: the same pairs, values within
    rounding, each row by distance (short rows sort by rank, long ones in place)."""
    pos, cell, pbc, cutoff = STRUCTURES[name]
    p, c = torch.tensor(pos, dtype=dtype), torch.tensor(cell, dtype=dtype)
    plain = wb.ops.neighbor_list(p, cutoff, cell=c, pbc=pbc, quantities="ijSdD")
    built = wb.ops.neighbor_list(p.clone().requires_grad_(), cutoff, cell=c, pbc=pbc, quantities="ijSdD")
    assert built[3].requires_grad and not plain[3].requires_grad
    for a, b in zip(plain[:3], built[:3]):
        assert torch.equal(a, b)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    for a, b in zip(plain[3:], built[3:]):
        torch.testing.assert_close(a, b.detach(), **tol)
    i, d = plain[0], plain[3]
    same_row = i[1:] == i[:-1]
    assert (d[1:][same_row] >= d[:-1][same_row]).all()
    assert int(torch.bincount(i).max()) > (256 if name.startswith("dense") else 0)


# vesin 0.6 takes one periodic flag for all three axes: per-axis pbc is checked against ASE above
@pytest.mark.parametrize("name", ["cubic box", "skewed, cutoff past the cell, atoms outside", "no periodicity"])
def test_full_and_half_lists_match_vesin(name):
    pos, cell, pbc, cutoff = STRUCTURES[name]
    periodic = pbc
    calc = vesin.NeighborList(cutoff=cutoff, full_list=True)
    i, j, S = calc.compute(points=pos, box=cell, periodic=periodic, quantities="ijS")
    ours = wb.ops.neighbor_list(torch.tensor(pos), cutoff, cell=torch.tensor(cell), pbc=pbc, quantities="ijS")
    assert triples(*ours) == triples(i, j, S)
    half = wb.ops.neighbor_list(
        torch.tensor(pos), cutoff, cell=torch.tensor(cell), pbc=pbc, full_list=False, quantities="ijS"
    )
    assert 2 * len(half[0]) == len(ours[0])
    unordered = {
        (a, b, s) if (a, b) < (b, a) or (a == b and s > tuple(-x for x in s)) else (b, a, tuple(-x for x in s))
        for a, b, s in triples(*ours)
    }
    assert set(triples(*half)) == unordered  # each pair once: i < j, an atom's own image with S > 0
    vi, vj, vS = vesin.NeighborList(cutoff=cutoff, full_list=False).compute(
        points=pos, box=cell, periodic=periodic, quantities="ijS"
    )
    assert {(min(a, b), max(a, b)) for a, b in zip(vi.tolist(), vj.tolist())} == {(a, b) for a, b, _ in unordered}


@pytest.mark.parametrize("full_list", [True, False])
@pytest.mark.parametrize("name", ["triclinic, pbc TFT", "dense: rows of ~700 pairs"])
def test_every_way_of_writing_the_rows_gives_the_same_pairs(monkeypatch, name, full_list):
    """One thread writes the rows in one pass, growing its arrays when the estimate falls
    short (into a fresh block, or one a dropped result left with its old rows); several
    threads count first. All give the same i, j, S, d and D, bit for bit."""
    from warpbridge.ops import _cell_grid

    pos, cell, pbc, cutoff = STRUCTURES[name]
    args = (torch.tensor(pos), cutoff)
    kwargs = dict(cell=torch.tensor(cell), pbc=pbc, full_list=full_list, quantities="ijSdD")
    one_pass = wb.ops.neighbor_list(*args, **kwargs)
    with monkeypatch.context() as m:
        m.setattr(_cell_grid, "_pairs_estimate", lambda *a: 1)  # the arrays grow, row after row
        grown = wb.ops.neighbor_list(*args, **kwargs)
        wb.ops.neighbor_list(*args, **kwargs)  # dropped: its blocks go back on the shelf
        again = wb.ops.neighbor_list(*args, **kwargs)
    with monkeypatch.context() as m:
        m.setattr(_cell_grid, "_in_one_pass", lambda *a: None)
        counted = wb.ops.neighbor_list(*args, **kwargs)
    for other in (grown, again, counted):
        for a, b in zip(one_pass, other):
            assert torch.equal(a, b)


@pytest.mark.parametrize("framework", ["torch", "numpy"])
def test_a_loop_that_drops_its_results_writes_into_their_memory_and_kept_results_stay(monkeypatch, framework):
    """A step's pairs go into the memory of the step before, once the caller has dropped them
    (no fresh pages); results the caller keeps, or a view of, are never written again, and
    ``release_memory`` hands back only what was dropped."""
    from warpbridge.ops import _lent_memory

    monkeypatch.setattr(_lent_memory, "_SHELF", type(_lent_memory._SHELF)())
    as_array = torch.tensor if framework == "torch" else np.asarray
    pos, cell, pbc, cutoff = STRUCTURES["dense: rows of ~700 pairs"]
    kept = wb.ops.neighbor_list(as_array(pos), cutoff, cell=as_array(cell), pbc=pbc, quantities="ijSd")
    kept_view = wb.ops.neighbor_list(as_array(pos), cutoff, cell=as_array(cell), pbc=pbc, quantities="ijSd")[3][5:]
    before = [np.array(a) for a in (*kept, kept_view)]
    places = []
    for _ in range(4):
        moved = pos + 0.3 * rng.standard_normal(pos.shape)
        i, j, S = wb.ops.neighbor_list(as_array(moved), cutoff, cell=as_array(cell), pbc=pbc, quantities="ijS")
        assert triples(i, j, S) == ase_pairs(moved, cell, pbc, cutoff)
        places.append(np.asarray(i).ctypes.data)
        del i, j, S
    assert len(set(places)) == 1 and len(_lent_memory._SHELF) <= _lent_memory.SHELF_BLOCKS
    for a, b in zip((*kept, kept_view), before):
        np.testing.assert_array_equal(np.asarray(a), b)
    assert len(_lent_memory._SHELF) == 1
    wb.ops.release_memory()  # the dropped results' memory is handed back; kept ones stay
    assert len(_lent_memory._SHELF) == 0
    i, j, S = wb.ops.neighbor_list(as_array(pos), cutoff, cell=as_array(cell), pbc=pbc, quantities="ijS")
    assert triples(i, j, S) == ase_pairs(pos, cell, pbc, cutoff)
    for a, b in zip((*kept, kept_view), before):
        np.testing.assert_array_equal(np.asarray(a), b)


def test_steps_of_a_simulation_in_the_same_cell_each_get_their_own_pairs():
    """Calls with the same cell, pbc, cutoff and atom count take the bins' layout of the call
    before: every step still matches ASE, also when the atoms of one step lie inside the cell
    and those of the next outside it (wrapped), and after the cutoff changes."""
    cell = TRICLINIC
    steps = [rng.random((70, 3)) @ cell, rng.random((70, 3)) @ cell * 1.6 - 2.0, rng.random((70, 3)) @ cell]
    for cutoff in (3.5, 3.5, 4.5):
        for pos in steps:
            i, j, S = wb.ops.neighbor_list(torch.tensor(pos), cutoff, cell=torch.tensor(cell), quantities="ijS")
            assert triples(i, j, S) == ase_pairs(pos, cell, True, cutoff)


def test_steps_of_a_cluster_each_get_their_own_pairs():
    """Without a cell the bins also depend on the atoms' range: a step whose atoms leave the
    last call's bins (the cluster spreads; a flat molecule bends out of its plane) gets bins of
    its own, and every step matches ASE."""
    from warpbridge.ops import _cell_grid

    flat = np.concatenate([rng.random((40, 2)) * 6, np.zeros((40, 1))], 1)
    bent = flat + np.array([0, 0, 1.0]) * (np.arange(40) % 3 == 0)[:, None]
    cluster = rng.random((60, 3)) * 5
    steps = [(cluster, True), (cluster * 1.004, False), (cluster * 2.5 - 3, True), (flat, True), (flat, False)]
    for pos, anew in [*steps, (bent, True)]:
        before = getattr(_cell_grid._LAST, "layout", None)
        i, j, S = wb.ops.neighbor_list(torch.tensor(pos), 1.6, quantities="ijS")
        assert triples(i, j, S) == ase_pairs(pos, np.eye(3), False, 1.6)
        assert (_cell_grid._LAST.layout is not before) == anew


def test_the_cutoff_is_strict_on_a_lattice():
    a, n = 1.0, 5
    grid = np.stack(np.meshgrid(*[np.arange(n)] * 3, indexing="ij"), -1).reshape(-1, 3) * a
    i, j, S, d = wb.ops.neighbor_list(torch.tensor(grid), 2 * a, cell=torch.eye(3, dtype=torch.float64) * n * a)
    assert (torch.bincount(i) == 26).all()  # |v|^2 in {1, 2, 3}: 6 + 12 + 8; |v| = 2 is not < 2
    assert triples(i, j, S) == ase_pairs(grid, np.eye(3) * n * a, True, 2 * a)


def test_a_batch_of_mixed_structures_equals_each_alone():
    names = list(STRUCTURES)
    parts = [STRUCTURES[n] for n in names]
    pos = torch.tensor(np.concatenate([p[0] for p in parts]))
    sizes = [len(p[0]) for p in parts]
    ptr = torch.tensor([0, *np.cumsum(sizes)])
    cells = torch.tensor(np.stack([p[1] for p in parts]))
    pbc = torch.tensor([np.broadcast_to(p[2], 3) for p in parts])
    cutoff = 3.0
    for kind, given in (
        ("batch", torch.repeat_interleave(torch.arange(len(parts)), torch.tensor(sizes)).int()),
        ("batch_ptr", ptr),
    ):
        i, j, S, D = wb.ops.neighbor_list(pos, cutoff, cell=cells, pbc=pbc, quantities="ijSD", **{kind: given})
        want = []
        for b, (p, cell, periodic, _) in enumerate(parts):
            want += [(x + int(ptr[b]), y + int(ptr[b]), s) for x, y, s in ase_pairs(p, cell, periodic, cutoff)]
        assert triples(i, j, S) == sorted(want)
        structure = torch.repeat_interleave(torch.arange(len(parts)), torch.tensor(sizes))[i]
        torch.testing.assert_close(D, pos[j] - pos[i] + torch.einsum("ek,ekl->el", S.double(), cells[structure]))
    empty = wb.ops.neighbor_list(torch.zeros(0, 3, dtype=torch.float64), 2.0, cell=torch.eye(3, dtype=torch.float64))
    assert all(len(q) == 0 for q in empty)


def _energy(d):
    """A smooth pair potential (zero with its derivative at the cutoff 3.0)."""
    return ((3.0 - d) ** 3 * (1.0 / d)).sum() / 2


def test_forces_and_stress_match_finite_differences():
    pos0, cell0, pbc, _ = STRUCTURES["triclinic, pbc TFT"]
    pos = torch.tensor(pos0[:40], requires_grad=True)
    cell = torch.tensor(cell0, requires_grad=True)
    (d,) = wb.ops.neighbor_list(pos, 3.0, cell=cell, pbc=pbc, quantities="d")
    forces, dcell = torch.autograd.grad(_energy(d), (pos, cell))

    def energy_at(p, c):
        i, j, S = wb.ops.neighbor_list(torch.tensor(p), 3.0, cell=torch.tensor(c), pbc=pbc, quantities="ijS")
        D = torch.tensor(p)[j] - torch.tensor(p)[i] + S.double() @ torch.tensor(c)
        return float(_energy(D.norm(dim=1)))

    eps = 1e-6
    for a, b in [(0, 0), (7, 2), (31, 1)]:
        p1, p2 = pos0[:40].copy(), pos0[:40].copy()
        p1[a, b] += eps
        p2[a, b] -= eps
        assert math.isclose(
            float(forces[a, b]), (energy_at(p1, cell0) - energy_at(p2, cell0)) / (2 * eps), rel_tol=1e-6, abs_tol=1e-8
        )
    for a, b in [(0, 0), (1, 0), (2, 1)]:
        c1, c2 = cell0.copy(), cell0.copy()
        c1[a, b] += eps
        c2[a, b] -= eps
        assert math.isclose(
            float(dcell[a, b]),
            (energy_at(pos0[:40], c1) - energy_at(pos0[:40], c2)) / (2 * eps),
            rel_tol=1e-6,
            abs_tol=1e-8,
        )


def test_force_matching_with_create_graph_equals_plain_torch():
    pos0, cell0, pbc, _ = STRUCTURES["cubic box"]
    cell = torch.tensor(cell0)
    target = torch.randn(len(pos0), 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    i, j, S = (
        torch.tensor(q)
        for q in ase_neighbor_list("ijS", Atoms(f"H{len(pos0)}", positions=pos0, cell=cell0, pbc=pbc), 3.0)
    )

    def step(distances):
        scale = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
        pos = torch.tensor(pos0, requires_grad=True)
        energy = scale * _energy(distances(pos))
        forces = -torch.autograd.grad(energy, pos, create_graph=True)[0]
        loss = ((forces - target) ** 2).mean()
        return torch.autograd.grad(loss, scale)[0]

    ours = step(lambda pos: wb.ops.neighbor_list(pos, 3.0, cell=cell, pbc=pbc, quantities="d")[0])
    plain = step(lambda pos: (pos[j] - pos[i] + S.double() @ cell).norm(dim=1))
    torch.testing.assert_close(ours, plain, rtol=1e-12, atol=1e-14)


def test_jax_and_paddle_give_the_pairs_and_their_second_derivatives():
    import jax
    import jax.numpy as jnp
    import paddle

    jax.config.update("jax_enable_x64", True)
    pos0, cell0, pbc, _ = STRUCTURES["cubic box"]
    want = wb.ops.neighbor_list(torch.tensor(pos0), 3.0, cell=torch.tensor(cell0), pbc=pbc, quantities="ijS")
    i, j, S = wb.ops.neighbor_list(jnp.asarray(pos0), 3.0, cell=jnp.asarray(cell0), pbc=pbc, quantities="ijS")
    assert triples(i, j, S) == triples(*want)
    # under jax.grad the pairs come first, outside the trace; D from them inside

    def energy(p):
        return _energy(jnp.linalg.norm(p[j] - p[i] + S.astype(p.dtype) @ jnp.asarray(cell0), axis=1))

    hvp = jax.grad(lambda p: jnp.vdot(jax.grad(energy)(p), jnp.ones_like(p)))(jnp.asarray(pos0))
    pt = torch.tensor(pos0, requires_grad=True)
    (d,) = wb.ops.neighbor_list(pt, 3.0, cell=torch.tensor(cell0), pbc=pbc, quantities="d")
    g = torch.autograd.grad(_energy(d), pt, create_graph=True)[0]
    np.testing.assert_allclose(np.asarray(hvp), torch.autograd.grad(g.sum(), pt)[0].numpy(), rtol=1e-10, atol=1e-10)
    pp = paddle.to_tensor(pos0, stop_gradient=False)
    (dp,) = wb.ops.neighbor_list(pp, 3.0, cell=paddle.to_tensor(cell0), pbc=pbc, quantities="d")
    (gp,) = paddle.grad(_energy(dp), pp, create_graph=True)
    (hp,) = paddle.grad(gp.sum(), pp)
    np.testing.assert_allclose(hp.numpy(), np.asarray(hvp), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(cutoff=-1.0), r"'cutoff' must be"),
        (dict(cutoff=math.nan), r"'cutoff' must be"),
        (dict(cell=torch.zeros(3, 3, dtype=torch.float64)), r"the cell of structure 0 is singular"),
        (dict(cell=None, pbc=True), r"'pbc' needs a 'cell'"),
        (dict(batch=torch.tensor([0, 0, 1])), r"'batch' must have one structure number per atom \(4\), got 3"),
        (
            dict(batch=torch.tensor([0, 0, 0, 0]), batch_ptr=torch.tensor([0, 4])),
            r"pass 'batch' or 'batch_ptr', not both",
        ),
        (dict(batch_ptr=torch.tensor([0, 5])), r"'batch_ptr' must rise from 0 to the number of atoms \(4\)"),
        (dict(quantities="ijx"), r"'quantities' must be a string of i, j, S, d, D"),
        (dict(cell=torch.eye(3)), r"'cell' must be float64 \(3, 3\)"),
    ],
)
def test_bad_input_is_refused_by_name(kwargs, message):
    args = dict(cutoff=2.0, cell=torch.eye(3, dtype=torch.float64) * 5) | kwargs
    cutoff = args.pop("cutoff")
    with pytest.raises(wb.WarpBridgeError, match=r"^neighbor_list\(\): " + message):
        wb.ops.neighbor_list(torch.rand(4, 3, dtype=torch.float64), cutoff, **args)


def test_second_order_through_a_warp_adjoint_names_the_integer_pairs_recipe():
    pos = torch.rand(30, 3, dtype=torch.float64, requires_grad=True)
    nb = wb.ops.radius(pos, pos, 0.5)
    with pytest.raises(
        wb.WarpBridgeError, match=r"second-order gradients are not supported.*neighbor_list\(\.\.\., quantities='ijS'\)"
    ):
        torch.autograd.grad((nb.distance**2).sum(), pos, create_graph=True)


def test_atoms_that_are_not_finite_have_no_pairs_and_a_runaway_cutoff_is_refused():
    pos0, cell0, pbc, cutoff = STRUCTURES["cubic box"]
    pos = torch.tensor(pos0)
    pos[5, 1] = math.nan
    pos[9] = math.inf
    i, j, S = wb.ops.neighbor_list(pos, cutoff, cell=torch.tensor(cell0), quantities="ijS")
    assert not ((i == 5) | (j == 5) | (i == 9) | (j == 9)).any()
    keep = [a for a in range(len(pos0)) if a not in (5, 9)]
    rest = wb.ops.neighbor_list(torch.tensor(pos0[keep]), cutoff, cell=torch.tensor(cell0), quantities="ijS")
    index = torch.tensor(keep)
    assert triples(i, j, S) == triples(index[rest[0]], index[rest[1]], rest[2])
    with pytest.raises(wb.WarpBridgeError, match=r"^neighbor_list\(\): a cutoff of 400.0 spans .* images to consider"):
        wb.ops.neighbor_list(torch.rand(64, 3, dtype=torch.float64), 400.0, cell=torch.eye(3, dtype=torch.float64))


@pytest.mark.compile
def test_forces_and_stress_under_torch_compile_equal_eager():
    """torch.compile around the whole energy: the search runs outside the graph (its host
    read breaks it), D and d and the energy inside; forces and stress as in eager."""
    pos0, cell0, pbc, _ = STRUCTURES["triclinic, pbc TFT"]

    def forces_and_stress(pos, cell):
        d = wb.ops.neighbor_list(pos, 3.0, cell=cell, pbc=pbc, quantities="d")[0]
        return torch.autograd.grad(_energy(d), (pos, cell))

    def fresh():
        return torch.tensor(pos0).requires_grad_(), torch.tensor(TRICLINIC).requires_grad_()

    want = forces_and_stress(*fresh())
    got = torch.compile(forces_and_stress)(*fresh())
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_more_pairs_than_one_call_returns_are_refused_before_the_fill(monkeypatch):
    from warpbridge.ops import _cell_grid

    monkeypatch.setattr(_cell_grid, "MAX_PAIRS", 10)
    pos, cell, pbc, cutoff = STRUCTURES["cubic box"]
    with pytest.raises(
        wb.WarpBridgeError, match=r"^neighbor_list\(\): [\d,]+ pairs found, more than one call returns \(10\)"
    ):
        wb.ops.neighbor_list(torch.tensor(pos), cutoff, cell=torch.tensor(cell), pbc=pbc)


def test_threads_calling_at_once_each_get_their_own_pairs():
    """Threads that search at once, each dropping its results as it goes, share the shelf of
    lent memory and the kept layouts without taking each other's: every call matches its
    structure's list made alone."""
    import threading

    names = ["cubic box", "triclinic, pbc TFT", "dense: rows of ~700 pairs"]

    def search(name):
        pos, cell, pbc, cutoff = STRUCTURES[name]
        return wb.ops.neighbor_list(torch.tensor(pos), cutoff, cell=torch.tensor(cell), pbc=pbc, quantities="ijSd")

    alone = {name: [a.clone() for a in search(name)] for name in names}
    wrong = []

    def loop(name):
        for _ in range(15):
            found = search(name)
            if not all(torch.equal(a, b) for a, b in zip(found, alone[name])):
                wrong.append(name)

    threads = [threading.Thread(target=loop, args=(name,)) for name in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong
