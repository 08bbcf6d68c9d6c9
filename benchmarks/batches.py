"""Ragged batches: one warpbridge call over a whole batch of clouds against a Python loop of
calls, one per cloud (pykdtree's, cKDTree's, and warpbridge's own), side by side in one process.

Two batches: 64 clouds of 500 to 4,000 points, and 512 clouds of 64 to 512 points (sizes
drawn once, seeded), each cloud shaped like a real scan: the distributions of
``distributions.py`` in turn (LiDAR sweep with duplicated returns, indoor room planes, closed
object surface, uniform, Gaussian, tight clusters), scaled so that its median distance to
the 16th neighbour is 1 (as a dataset's clouds are normalised), in float32, concatenated with
a sorted int64 batch vector (PyG's layout).

Rows:
- kNN, k = 16, self-join (every point's 16 nearest in its own cloud): ``wb.ops.knn(x, x, 16,
  query_batch=batch, ref_batch=batch)`` against a loop of pykdtree ``KDTree(c).query(c, 16)``
  (OpenMP threads), a loop of cKDTree ``query(workers=-1)``, and a loop of ``wb.ops.knn``;
- the same with the distances' backward (``dist.sum().backward()``, gradients accumulating
  into ``.grad``): warpbridge batched against its own loop (the peers have no gradients);
- ``knn_graph(x, 16, batch=batch)`` and ``radius_graph(x, 1.0, batch=batch)`` (about 16
  neighbours each) against loops of the single-cloud graphs and, for the radius graph, of
  cKDTree ``query_ball_point(workers=-1)`` turned into edges.

The neighbours are checked first: the same distances as pykdtree's (float32 rounding).
Medians of per-call wall times after warm-up.

Usage: python benchmarks/batches.py [--quick]
       -> table + benchmarks/results/batches-<machine>.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import distributions as D  # noqa: E402

import warpbridge as wb  # noqa: E402
from warpbridge._cli.measure import median_ms  # noqa: E402

K = 16
SHAPES = (
    "lidar sweep 150 m, 10% duplicates",
    "indoor room planes",
    "object scan, closed surface",
    "uniform",
    "gaussian",
    "20 tight clusters",
)


# (clouds, fewest points, most points) per batch
BATCHES = ((64, 500, 4000), (512, 64, 512))


def make_batch(clouds: int, low: int, high: int, seed: int = 0) -> tuple[list, torch.Tensor, torch.Tensor]:
    """(the clouds, their points concatenated (P, 3) float32, the batch vector (P,) int64)."""
    g = np.random.default_rng(seed)
    sizes = g.integers(low, high + 1, clouds)
    parts = [_unit(D.make(SHAPES[c % len(SHAPES)], int(n), seed=c)[0]) for c, n in enumerate(sizes)]
    x = torch.from_numpy(np.concatenate(parts))
    batch = torch.repeat_interleave(torch.arange(clouds), torch.from_numpy(sizes))
    return parts, x, batch


def _unit(cloud: np.ndarray) -> np.ndarray:
    """The cloud scaled so that its median distance to the 16th neighbour is 1."""
    t = torch.from_numpy(cloud)
    spacing = float(wb.ops.knn(t, t, K + 1)[0][:, -1].median())
    return (cloud / spacing).astype(np.float32)


def pykdtree_loop(parts: list) -> list:
    from pykdtree.kdtree import KDTree

    return [KDTree(c).query(c, K) for c in parts]


def ckdtree_loop(parts: list) -> list:
    from scipy.spatial import cKDTree

    return [cKDTree(c).query(c, K, workers=-1) for c in parts]


def ckdtree_edges(parts: list, r: float) -> list:
    """cKDTree's ball query per cloud, as (2, E) edges without self-loops."""
    from scipy.spatial import cKDTree

    edges, start = [], 0
    for c in parts:
        lists = cKDTree(c).query_ball_point(c, r, workers=-1, return_sorted=False)
        counts = np.fromiter((len(x) for x in lists), np.int64, len(lists))
        centre = np.repeat(np.arange(len(c)), counts)
        nb = np.concatenate(lists).astype(np.int64)
        keep = nb != centre
        edges.append(np.stack([nb[keep], centre[keep]]) + start)
        start += len(c)
    return edges


def our_loop(parts_t: list, backward: bool = False) -> None:
    for c in parts_t:
        if backward:
            c = c.detach().requires_grad_()
        dist, _, _ = wb.ops.knn(c, c, K)
        if backward:
            dist.sum().backward()


def check_same(x: torch.Tensor, batch: torch.Tensor, parts: list) -> None:
    dist, _, _ = wb.ops.knn(x, x, K, query_batch=batch, ref_batch=batch)
    theirs = np.concatenate([d for d, _ in pykdtree_loop(parts)])
    worst = float(np.abs(dist.numpy() - theirs).max())
    if worst > 1e-4 * float(theirs.max()):
        raise SystemExit(f"warpbridge and pykdtree disagree: distances differ by up to {worst}")


def rows_for(parts: list, x: torch.Tensor, batch: torch.Tensor, repeat: int) -> list[dict]:
    parts_t = [torch.from_numpy(c) for c in parts]
    xg = x.clone().requires_grad_()
    r = 1.0  # ~16 neighbours: each cloud's median 16th-neighbour distance (see _unit)

    def batched_backward() -> None:
        dist, _, _ = wb.ops.knn(xg, xg, K, query_batch=batch, ref_batch=batch)
        dist.sum().backward()

    cases = {
        f"kNN k={K}, self-join": {
            "warpbridge batch": lambda: wb.ops.knn(x, x, K, query_batch=batch, ref_batch=batch),
            "warpbridge loop": lambda: our_loop(parts_t),
            "pykdtree loop": lambda: pykdtree_loop(parts),
            "cKDTree loop": lambda: ckdtree_loop(parts),
        },
        f"kNN k={K} + backward": {
            "warpbridge batch": batched_backward,
            "warpbridge loop": lambda: our_loop(parts_t, backward=True),
        },
        f"knn_graph k={K}": {
            "warpbridge batch": lambda: wb.ops.knn_graph(x, K, batch=batch),
            "warpbridge loop": lambda: [wb.ops.knn_graph(c, K) for c in parts_t],
        },
        "radius_graph": {
            "warpbridge batch": lambda: wb.ops.radius_graph(x, r, batch=batch),
            "warpbridge loop": lambda: [wb.ops.radius_graph(c, r) for c in parts_t],
            "cKDTree loop": lambda: ckdtree_edges(parts, r),
        },
    }
    rows = []
    for name, runs in cases.items():
        ms = {who: median_ms(fn, "cpu", repeat) for who, fn in runs.items() if _available(who)}
        base = ms["warpbridge batch"]
        rows.append({"case": name, "ms": ms, "speedup": {who: t / base for who, t in ms.items()}})
    return rows


def _available(who: str) -> bool:
    module = {"pykdtree loop": "pykdtree", "cKDTree loop": "scipy"}.get(who)
    return module is None or D.available(module)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    args = p.parse_args()
    t0 = time.perf_counter()
    rows = []
    for clouds, low, high in BATCHES:
        parts, x, batch = make_batch(clouds, low, high)
        check_same(x, batch, parts)
        print(f"\n{clouds} clouds of {low} to {high} points, {len(x):,} in all")
        print(f"{'case':24s} | {'batch ms':>8s} | loops: ms (batch speed-up)")
        for row in rows_for(parts, x, batch, 3 if args.quick else 9):
            row |= {"clouds": clouds, "points": len(x), "sizes": [low, high]}
            rows.append(row)
            loops = "  ".join(
                f"{who.replace(' loop', '')} {t:.1f} ({row['speedup'][who]:.2f}x)"
                for who, t in row["ms"].items()
                if who != "warpbridge batch"
            )
            print(f"{row['case']:24s} | {row['ms']['warpbridge batch']:8.2f} | {loops}")
    path = D.save(args.out, "batches", rows, t0)
    print(f"-> {path}")


if __name__ == "__main__":
    main()
