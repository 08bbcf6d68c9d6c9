"""kNN in 1 to 16 dimensions: warpbridge against pykdtree and SciPy's cKDTree, side by side in
one process.

Two clouds per dimension D, 100,000 reference points and 20,000 queries each, float32: a
Gaussian blob (every dimension spread), and points on a 2-D sheet embedded in D dimensions
with a little noise (the low intrinsic dimension of real feature spaces and 2-D layouts,
where a kd-tree still prunes). k = 8. warpbridge: ``wb.ops.knn(query, ref, 8)``; pykdtree:
``KDTree(ref).query(query, 8)`` (OpenMP threads); cKDTree: ``query(workers=-1)``. The same
distances are checked first. Medians of per-call wall times after warm-up; the first call
of each dimension (its kernels' compile) is not timed.

Usage: python benchmarks/dimensions.py [--quick]
       -> table + benchmarks/results/dimensions-<machine>.json
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

K = 8
DIMS = (1, 2, 3, 4, 8, 16)


def clouds(name: str, dim: int, n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(dim)
    if name == "gaussian":
        pts = g.standard_normal((n + m, dim))
    else:  # a 2-D sheet, turned into D dimensions, with noise
        uv = g.uniform(-1, 1, (n + m, min(dim, 2)))
        basis = np.linalg.qr(g.standard_normal((dim, dim)))[0][: uv.shape[1]]
        pts = uv @ basis + 0.01 * g.standard_normal((n + m, dim))
    pts = pts.astype(np.float32)
    return pts[:n], pts[n:]


def row(name: str, dim: int, repeat: int) -> dict:
    from pykdtree.kdtree import KDTree
    from scipy.spatial import cKDTree

    r, q = clouds(name, dim, 100_000, 20_000)
    rt, qt = torch.from_numpy(r), torch.from_numpy(q)
    ours = wb.ops.knn(qt, rt, K)[0].numpy()
    theirs = KDTree(r).query(q, K)[0]
    worst = float(np.abs(ours - theirs).max())
    if worst > 1e-4 * max(1.0, float(theirs.max())):
        raise SystemExit(f"{name}, D={dim}: warpbridge and pykdtree disagree by {worst}")
    ms = {
        "warpbridge": median_ms(lambda: wb.ops.knn(qt, rt, K), "cpu", repeat),
        "pykdtree": median_ms(lambda: KDTree(r).query(q, K), "cpu", repeat),
        "cKDTree": median_ms(lambda: cKDTree(r).query(q, K, workers=-1), "cpu", repeat),
    }
    best = min(ms["pykdtree"], ms["cKDTree"])
    return {"cloud": name, "dim": dim, "ms": ms, "vs_best_peer": best / ms["warpbridge"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    args = p.parse_args()
    t0 = time.perf_counter()
    rows = []
    print(f"{'cloud':10s} {'D':>3s} | {'warpbridge':>10s} {'pykdtree':>9s} {'cKDTree':>8s} | vs best peer")
    for name in ("gaussian", "2-D sheet"):
        for dim in DIMS:
            r = row(name, dim, 3 if args.quick else 7)
            rows.append(r)
            t = r["ms"]
            print(
                f"{name:10s} {dim:3d} | {t['warpbridge']:10.1f} {t['pykdtree']:9.1f} {t['cKDTree']:8.1f} |"
                f" {r['vs_best_peer']:8.2f}x"
            )
    path = D.save(args.out, "dimensions", rows, t0)
    print(f"-> {path}")


if __name__ == "__main__":
    main()
