"""Periodic neighbour lists as atomistic models use them: ``wb.ops.neighbor_list`` against
vesin (the fastest CPU peer), matscipy, nvalchemiops (Warp's CPU kernels) and ASE, side by side
in one process, on liquid-like periodic boxes (density 0.1 per cubic angstrom, cutoff 5
angstrom) of 10^3 to 10^6 atoms, a batch of 64 small periodic structures (one call where the
library takes a batch, else a loop) and a non-periodic cluster; the pairs are checked equal to
vesin's first. Plus one force-matching train step (create_graph) on warpbridge's and
vesin-torch's differentiable distances.

Medians of per-call wall times (i, j, S and d) of 15 calls in a row per library (3 at 10^6
atoms), or with ``--interleaved`` of 15 rounds that call each library once in turn (each then
meets the caches and the memory the others leave), one thread and default threads; matscipy,
nvalchemiops and vesin-torch where installed (the ``peers`` dependency group).

Usage: python benchmarks/atomistic.py [--quick] [--interleaved]
       -> table + benchmarks/results/atomistic[-interleaved]-<machine>.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch
import vesin
from ase import Atoms
from ase.neighborlist import neighbor_list as ase_neighbor_list

try:  # the peers dependency group
    from matscipy.neighbours import neighbour_list as matscipy_list
except ImportError:
    matscipy_list = None
try:
    from nvalchemiops.torch.neighbors import neighbor_list as nvalchemi_list
except ImportError:
    nvalchemi_list = None
try:
    import vesin.torch as vesin_torch
except ImportError:
    vesin_torch = None

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import distributions as D  # noqa: E402

import warpbridge as wb  # noqa: E402
from warpbridge._cli.measure import interleaved_ms, median_ms  # noqa: E402

CUTOFF = 5.0


def box(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    side = (n / 0.1) ** (1 / 3)
    g = np.random.default_rng(seed)
    return g.random((n, 3)) * side, np.eye(3) * side


def periodic_box_row(n: int) -> dict:
    pos, cell = box(n)
    pt, ct = torch.tensor(pos), torch.tensor(cell)
    calc = vesin.NeighborList(cutoff=CUTOFF, full_list=True)
    ours = wb.ops.neighbor_list(pt, CUTOFF, cell=ct, quantities="ijS")
    theirs = calc.compute(points=pos, box=cell, periodic=True, quantities="ijS")
    assert len(ours[0]) == len(theirs[0]), "pair counts differ from vesin's"
    peers = {
        "warpbridge": lambda: wb.ops.neighbor_list(pt, CUTOFF, cell=ct, quantities="ijSd"),
        "vesin": lambda: calc.compute(points=pos, box=cell, periodic=True, quantities="ijSd"),
    }
    if matscipy_list is not None:
        peers["matscipy"] = lambda: matscipy_list("ijSd", positions=pos, cell=cell, pbc=[True] * 3, cutoff=CUTOFF)
    if nvalchemi_list is not None and n <= 100_000:
        pbc = torch.ones(1, 3, dtype=torch.bool)
        peers["nvalchemiops"] = lambda: nvalchemi_list(pt, CUTOFF, cell=ct[None], pbc=pbc, return_neighbor_list=True)
    if n <= 1_000:
        atoms = Atoms(f"H{n}", positions=pos, cell=cell, pbc=True)
        peers["ASE"] = lambda: ase_neighbor_list("ijSd", atoms, CUTOFF)
    return peers


def batch_row() -> dict:
    g = np.random.default_rng(1)
    parts = [box(int(m), seed=s) for s, m in enumerate(g.integers(50, 201, 64))]
    pos = torch.tensor(np.concatenate([p for p, _ in parts]))
    cells = torch.tensor(np.stack([c for _, c in parts]))
    ptr = torch.tensor([0, *np.cumsum([len(p) for p, _ in parts])])
    calc = vesin.NeighborList(cutoff=CUTOFF, full_list=True)
    peers = {
        "warpbridge": lambda: wb.ops.neighbor_list(pos, CUTOFF, cell=cells, batch_ptr=ptr, quantities="ijSd"),
        "vesin": lambda: [calc.compute(points=p, box=c, periodic=True, quantities="ijSd") for p, c in parts],
    }
    if matscipy_list is not None:
        peers["matscipy"] = lambda: [
            matscipy_list("ijSd", positions=p, cell=c, pbc=[True] * 3, cutoff=CUTOFF) for p, c in parts
        ]
    if nvalchemi_list is not None:
        pbc, ptr32 = torch.ones(len(parts), 3, dtype=torch.bool), ptr.int()
        peers["nvalchemiops"] = lambda: nvalchemi_list(
            pos, CUTOFF, cell=cells, pbc=pbc, batch_ptr=ptr32, return_neighbor_list=True
        )
    return peers


def cluster_row(n: int = 2_000) -> dict:
    """A non-periodic cluster: a liquid-like ball of atoms, no cell."""
    g = np.random.default_rng(2)
    radius = (3 * n / (4 * np.pi * 0.1)) ** (1 / 3)
    direction = g.normal(size=(n, 3))
    pos = direction / np.linalg.norm(direction, axis=1, keepdims=True) * radius * g.random((n, 1)) ** (1 / 3)
    pt, calc = torch.tensor(pos), vesin.NeighborList(cutoff=CUTOFF, full_list=True)
    peers = {
        "warpbridge": lambda: wb.ops.neighbor_list(pt, CUTOFF, quantities="ijSd"),
        "vesin": lambda: calc.compute(points=pos, box=np.zeros((3, 3)), periodic=False, quantities="ijSd"),
    }
    if matscipy_list is not None:
        peers["matscipy"] = lambda: matscipy_list("ijSd", positions=pos, cutoff=CUTOFF)
    return peers


def train_step_row(n: int = 1_000) -> dict:
    """One force-matching step of a radial pair MLP: energy, forces with create_graph, a loss
    on the forces, its backward into the weights; the pairs from each library's own torch API."""
    pos, cell = box(n)
    pt, ct = torch.tensor(pos), torch.tensor(cell)
    mlp = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.SiLU(), torch.nn.Linear(16, 1)).double()
    target = torch.zeros(n, 3, dtype=torch.float64)

    def step(distances) -> None:
        p = pt.clone().requires_grad_()
        d = distances(p)
        energy = mlp(d[:, None]).sum()
        forces = -torch.autograd.grad(energy, p, create_graph=True)[0]
        ((forces - target) ** 2).mean().backward()

    def ours(p):
        return wb.ops.neighbor_list(p, CUTOFF, cell=ct, quantities="d")[0]

    peers = {"warpbridge": lambda: step(ours)}
    if vesin_torch is not None:
        calc = vesin_torch.NeighborList(cutoff=CUTOFF, full_list=True)
        peers["vesin-torch"] = lambda: step(lambda p: calc.compute(p, ct, True, quantities="d")[0])
    return peers


def rows(quick: bool) -> dict:
    out = {}
    for n in (1_000, 10_000) if quick else (1_000, 10_000, 100_000, 1_000_000):
        out[f"periodic box, {n} atoms"] = periodic_box_row(n)
    out["64 periodic structures of 50-200 atoms"] = batch_row()
    out["cluster of 2000 atoms, no cell"] = cluster_row()
    out["force-matching step, 1000 atoms"] = train_step_row()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--interleaved",
        action="store_true",
        help="rounds that call each library once in turn, not each library's calls in a row",
    )
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args()
    t0, default_threads = time.perf_counter(), wb.ops.get_num_threads()
    results = []
    for name, peers in rows(args.quick).items():
        for threads in (1, default_threads):
            wb.ops.set_num_threads(threads)
            torch.set_num_threads(threads)
            rounds = 3 if "1000000" in name else 15
            if args.interleaved:
                times = interleaved_ms(peers, "cpu", rounds)
            else:
                times = {who: median_ms(fn, "cpu", rounds) for who, fn in peers.items()}
            ratio = times["warpbridge"] / min(t for who, t in times.items() if who != "warpbridge")
            results.append({"case": name, "threads": threads, "ms": times, "vs_fastest_peer": ratio})
            cells = "  ".join(f"{who} {t:9.2f}" for who, t in times.items())
            print(f"{name:<40} {threads} thr  {cells}  (warpbridge / fastest peer {ratio:.2f})", flush=True)
    wb.ops.set_num_threads(None)
    torch.set_num_threads(default_threads)
    print("->", D.save(args.out, "atomistic-interleaved" if args.interleaved else "atomistic", results, t0))


if __name__ == "__main__":
    main()
