"""Periodic neighbour lists as atomistic models use them: ``wb.ops.neighbor_list`` against
vesin (the fastest CPU peer) and ASE, side by side in one process, on liquid-like periodic
boxes (density 0.1 per cubic angstrom, cutoff 5 angstrom) and on a batch of 64 small periodic
structures; the pairs are checked equal to vesin's first.

Medians of per-call wall times (i, j, S and d), one thread and default threads.

Usage: python benchmarks/atomistic.py [--quick]
       -> table + benchmarks/results/atomistic-<machine>.json
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import distributions as D  # noqa: E402

import warpbridge as wb  # noqa: E402
from warpbridge._cli.measure import median_ms  # noqa: E402

CUTOFF = 5.0


def box(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    side = (n / 0.1) ** (1 / 3)
    g = np.random.default_rng(seed)
    return g.random((n, 3)) * side, np.eye(3) * side


def rows(quick: bool) -> dict:
    out = {}
    for n in (1_000, 10_000) if quick else (1_000, 10_000, 100_000):
        pos, cell = box(n)
        pt, ct = torch.tensor(pos), torch.tensor(cell)
        calc = vesin.NeighborList(cutoff=CUTOFF, full_list=True)
        ours = wb.ops.neighbor_list(pt, CUTOFF, cell=ct, quantities="ijS")
        theirs = calc.compute(points=pos, box=cell, periodic=True, quantities="ijS")
        assert len(ours[0]) == len(theirs[0]), "pair counts differ from vesin's"
        peers = {
            "warpbridge": lambda pt=pt, ct=ct: wb.ops.neighbor_list(pt, CUTOFF, cell=ct, quantities="ijSd"),
            "vesin": lambda pos=pos, cell=cell, calc=calc: calc.compute(
                points=pos, box=cell, periodic=True, quantities="ijSd"
            ),
        }
        if n <= 1_000:
            atoms = Atoms(f"H{n}", positions=pos, cell=cell, pbc=True)
            peers["ASE"] = lambda atoms=atoms: ase_neighbor_list("ijSd", atoms, CUTOFF)
        out[f"periodic box, {n} atoms"] = peers
    g = np.random.default_rng(1)
    parts = [box(int(m), seed=s) for s, m in enumerate(g.integers(50, 201, 64))]
    pos = torch.tensor(np.concatenate([p for p, _ in parts]))
    cells = torch.tensor(np.stack([c for _, c in parts]))
    ptr = torch.tensor([0, *np.cumsum([len(p) for p, _ in parts])])
    calc = vesin.NeighborList(cutoff=CUTOFF, full_list=True)
    out["64 periodic structures of 50-200 atoms"] = {
        "warpbridge": lambda: wb.ops.neighbor_list(pos, CUTOFF, cell=cells, batch_ptr=ptr, quantities="ijSd"),
        "vesin loop": lambda: [calc.compute(points=p, box=c, periodic=True, quantities="ijSd") for p, c in parts],
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args()
    t0, default_threads = time.perf_counter(), wb.ops.get_num_threads()
    results = []
    for name, peers in rows(args.quick).items():
        for threads in (1, default_threads):
            wb.ops.set_num_threads(threads)
            torch.set_num_threads(threads)
            times = {who: median_ms(fn, "cpu", 3 if who == "ASE" else 7) for who, fn in peers.items()}
            ratio = times["warpbridge"] / min(t for who, t in times.items() if who != "warpbridge")
            results.append({"case": name, "threads": threads, "ms": times, "vs_fastest_peer": ratio})
            cells = "  ".join(f"{who} {t:9.2f}" for who, t in times.items())
            print(f"{name:<40} {threads} thr  {cells}  (warpbridge / fastest peer {ratio:.2f})", flush=True)
    wb.ops.set_num_threads(None)
    torch.set_num_threads(default_threads)
    print("->", D.save(args.out, "atomistic", results, t0))


if __name__ == "__main__":
    main()
