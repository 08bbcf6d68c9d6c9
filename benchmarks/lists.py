"""Radius neighbour lists and graphs: warpbridge against SciPy's cKDTree and Open3D, side by
side in one process, on every distribution of ``distributions.py``.

"radius lists": every reference point within the radius of each query (about 16 neighbours
per query: the radius is the median 16th-nearest distance), as CSR (index, ptr) with the
distances. warpbridge: ``wb.ops.radius`` (rows sorted by distance). cKDTree:
``query_ball_point(workers=-1)`` turned into CSR with distances (NumPy). Open3D (when
installed): ``NearestNeighborSearch.fixed_radius_search`` (a spatial hash grid). The same neighbours are
checked first: a pair in one list only must lie within float32 rounding of the radius. Then ``radius_graph`` on 10^6 points with about 30 neighbours each: time and
peak memory. Last, small graphs (100 and 1 000 points, as a molecule or a mesh patch per
step): ``radius_graph`` and ``knn_graph`` against the dense PyTorch a user would write there
(``torch.cdist``, a mask or ``topk``). Medians of per-call wall times after warm-up (for the
small graphs, medians of rounds of 100 calls); peak memory is the process's peak RSS above its
level before the call (Linux).

Past 2^28 edges (--huge): a (2, E) int64 edge array's row stride no longer fits Warp's 32-bit
descriptor there (the list ops crashed). ``radius_graph`` of 16 385 points all within the radius
of each other, loops kept (2^28 + 2^15 + 1 edges), and ``knn_graph`` of 2^22 + 1 points with
k = 64 (2^28 + 64 edges): the time, the peak RSS, and a check of the first and last rows.

Usage: python benchmarks/lists.py [--sizes 10000,100000] [--quick] [--graph-points 1000000]
       -> table + benchmarks/results/lists-<machine>.json
       python benchmarks/lists.py --huge   -> table + benchmarks/results/lists-huge-<machine>.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import date

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import distributions as D  # noqa: E402

import warpbridge as wb  # noqa: E402
from warpbridge._cli.measure import median_ms, peak_mib, per_call_ms  # noqa: E402

NEIGHBOURS = 16
GRAPH_NEIGHBOURS = 30


def ckdtree_lists(q: np.ndarray, r: np.ndarray, radius: float) -> tuple:
    """cKDTree's ball query as CSR: (index, distance, ptr)."""
    from scipy.spatial import cKDTree

    lists = cKDTree(r).query_ball_point(q, radius, workers=-1, return_sorted=False)
    counts = np.fromiter((len(x) for x in lists), np.int64, len(lists))
    ptr = np.concatenate([[0], np.cumsum(counts)])
    index = np.concatenate(lists).astype(np.int64) if ptr[-1] else np.zeros(0, np.int64)
    rows = np.repeat(np.arange(len(q)), counts)
    return index, np.linalg.norm(q[rows] - r[index], axis=1), ptr


def open3d_lists(q: np.ndarray, r: np.ndarray, radius: float) -> tuple:
    """Open3D's fixed-radius search (CPU, a spatial hash grid): (index, distance, ptr)."""
    import open3d.core as o3c

    nns = o3c.nns.NearestNeighborSearch(o3c.Tensor.from_numpy(r))
    nns.fixed_radius_index(radius)
    index, d2, splits = nns.fixed_radius_search(o3c.Tensor.from_numpy(q), radius, sort=True)
    return index.numpy(), np.sqrt(d2.numpy()), splits.numpy()


def differences(a: tuple, b: tuple, q: np.ndarray, r: np.ndarray, radius: float) -> tuple[int, int]:
    """(pairs in one list only, those of them within float32 rounding of the radius, where
    a float32 and a float64 distance may fall either side)."""
    (ia, _, pa), (ib, _, pb) = a, b
    odd = at_cutoff = 0
    for i in range(len(q)):
        for j in set(ia[pa[i] : pa[i + 1]].tolist()) ^ set(ib[pb[i] : pb[i + 1]].tolist()):
            odd += 1
            d = np.linalg.norm(q[i].astype(np.float64) - r[j].astype(np.float64))
            at_cutoff += int(abs(d - radius) <= 1e-6 * radius)
    return odd, at_cutoff


def run_one(name: str, n: int, repeat: int) -> dict:
    r, q = D.make(name, n)
    qt, rt = torch.from_numpy(q), torch.from_numpy(r)
    radius = float(np.median(wb.ops.knn(qt, rt, NEIGHBOURS)[0][:, -1].numpy()))
    nb = wb.ops.radius(qt, rt, radius)
    ours = (nb.index.numpy(), nb.distance.numpy(), nb.ptr.numpy())
    row: dict = {"distribution": name, "n": n, "m": len(q), "radius": radius, "pairs": int(nb.ptr[-1])}
    row["differing_pairs_ckdtree"] = differences(ours, ckdtree_lists(q, r, radius), q, r, radius)
    t = {"warpbridge": median_ms(lambda: wb.ops.radius(qt, rt, radius), "cpu", repeat)}
    t["cKDTree"] = median_ms(lambda: ckdtree_lists(q, r, radius), "cpu", repeat)
    if D.available("open3d"):
        row["differing_pairs_open3d"] = differences(ours, open3d_lists(q, r, radius), q, r, radius)
        t["Open3D"] = median_ms(lambda: open3d_lists(q, r, radius), "cpu", repeat)
    row["ms"] = t
    row["vs_ckdtree"] = t["cKDTree"] / t["warpbridge"]
    if "Open3D" in t:
        row["vs_open3d"] = t["Open3D"] / t["warpbridge"]
    return row


def graph_row(n: int, repeat: int) -> dict:
    """radius_graph over n uniform points with about GRAPH_NEIGHBOURS neighbours each."""
    pos = torch.from_numpy(D.make("uniform", n)[0])
    sample = pos[torch.randperm(n, generator=torch.Generator().manual_seed(0))[:2000]]
    r = float(wb.ops.knn(sample, pos, GRAPH_NEIGHBOURS + 1)[0][:, -1].median())
    edges = wb.ops.radius_graph(pos, r)
    row = {"n": n, "r": r, "edges": int(edges.shape[1]), "edges_per_point": edges.shape[1] / n}
    row["ms"] = median_ms(lambda: wb.ops.radius_graph(pos, r), "cpu", repeat)
    row["peak_mib"] = peak_mib(lambda: wb.ops.radius_graph(pos, r), "cpu")
    row["output_mib"] = edges.numel() * 8 / 2**20
    return row


SMALL_NEIGHBOURS = 16


def per_call_us(fn, rounds: int) -> float:
    """Median over ``rounds`` of the mean time of 100 calls, in microseconds."""
    return per_call_ms(fn, rounds) * 1e3


def small_graph_rows(rounds: int) -> list:
    """radius_graph (about SMALL_NEIGHBOURS neighbours each) and knn_graph (k = SMALL_NEIGHBOURS),
    self-loops left out, on 100 and 1 000 uniform points, against dense PyTorch; the same edges
    checked (but for pairs within float32 rounding of the radius)."""
    return [row for n in (100, 1000) for row in _small_graph(torch.from_numpy(D.make("uniform", n)[0]), rounds)]


def _small_graph(pos: torch.Tensor, rounds: int) -> list:
    n, k = pos.shape[0], SMALL_NEIGHBOURS
    r = float(wb.ops.knn(pos, pos, k + 1)[0][:, -1].median())

    def distances():
        return torch.cdist(pos, pos, compute_mode="donot_use_mm_for_euclid_dist")

    def dense_radius():
        near = distances() <= r
        near.fill_diagonal_(False)
        return near.nonzero().T.flip(0)  # (neighbour, centre), as PyG

    def dense_knn():
        idx = distances().topk(k + 1, largest=False).indices[:, 1:]
        return torch.stack([idx.reshape(-1), torch.arange(n).repeat_interleave(k)])

    ours = {tuple(e) for e in wb.ops.radius_graph(pos, r).T.tolist()}
    theirs = {tuple(e) for e in dense_radius().T.tolist()}
    d = distances()
    assert all(abs(float(d[j, i]) - r) <= 1e-5 * r for j, i in ours ^ theirs), "different graphs"
    assert wb.ops.knn_graph(pos, k).shape == dense_knn().shape
    rows = []
    for what, fn, dense in (
        ("radius_graph", lambda: wb.ops.radius_graph(pos, r), dense_radius),
        ("knn_graph", lambda: wb.ops.knn_graph(pos, k), dense_knn),
    ):
        t = {"warpbridge": per_call_us(fn, rounds), "dense torch": per_call_us(dense, rounds)}
        rows.append({"graph": what, "n": n, "us": t, "vs_dense": t["dense torch"] / t["warpbridge"]})
    return rows


def huge_rows() -> list[dict]:
    """The two graphs past 2^28 edges, checked: every row is a query's true neighbours."""
    import resource

    rows = []
    g = torch.Generator().manual_seed(0)
    n = 16385
    x = torch.rand(n, 3, generator=g) * 0.01
    t = time.perf_counter()
    e = wb.ops.radius_graph(x, 1.0, loop=True)
    seconds = time.perf_counter() - t
    every = torch.arange(n)
    right = all(torch.equal(e[1, s * n : (s + 1) * n], torch.full((n,), s)) for s in (0, n - 1))
    right &= all(torch.equal(e[0, s * n : (s + 1) * n].sort().values, every) for s in (0, n - 1))
    rows.append({"graph": "radius_graph, 16 385 points, all within r", "edges": int(e.shape[1]), "seconds": seconds,
                 "right": bool(right)})  # fmt: skip
    del e
    n, k = (1 << 22) + 1, 64
    x = torch.rand(n, 3, generator=g)
    t = time.perf_counter()
    e = wb.ops.knn_graph(x, k)
    seconds = time.perf_counter() - t
    d = (x[e[0, -k:]] - x[n - 1]).norm(dim=1).sort().values
    full = (x - x[n - 1]).norm(dim=1)
    full[n - 1] = float("inf")
    right = torch.equal(e[1, -k:], torch.full((k,), n - 1)) and torch.equal(d, full.topk(k, largest=False).values)
    rows.append({"graph": "knn_graph, 2^22 + 1 points, k = 64", "edges": int(e.shape[1]), "seconds": seconds,
                 "right": bool(right)})  # fmt: skip
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    for row in rows:
        row["process_peak_gib"] = peak
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10000,100000")
    p.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    p.add_argument("--graph-points", type=int, default=1_000_000)
    p.add_argument("--huge", action="store_true", help="radius_graph and knn_graph past 2^28 edges")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    args = p.parse_args()
    if args.huge:
        rows = huge_rows()
        for row in rows:
            print(f"{row['graph']:44s} {row['edges']:>13,d} edges {row['seconds']:7.1f} s  right: {row['right']}")
        meta = {"date": date.today().isoformat(), "device": platform.machine(), "cpu_count": os.cpu_count()}
        path = os.path.join(args.out, f"lists-huge-{platform.machine()}-{os.cpu_count()}cpu.json")
        with open(path, "w") as fh:
            json.dump({"meta": meta, "rows": rows}, fh, indent=1)
        print(f"peak RSS of the process: {rows[-1]['process_peak_gib']:.1f} GiB\n-> {path}")
        return
    repeat = 3 if args.quick else 7
    t0 = time.perf_counter()
    rows = []
    print(
        f"{'distribution':28s} {'N':>9s} {'pairs':>9s} | {'warpbridge':>10s} {'cKDTree':>9s} {'Open3D':>8s} | vs cKDTree vs Open3D"
    )
    for n in (int(s) for s in args.sizes.split(",")):
        for name in D.DISTRIBUTIONS:
            row = run_one(name, n, repeat)
            rows.append(row)
            t = row["ms"]
            o3d = f"{t['Open3D']:8.1f}" if "Open3D" in t else f"{'-':>8s}"
            vs_o3d = f"{row['vs_open3d']:8.2f}x" if "vs_open3d" in row else f"{'-':>9s}"
            odd = [row[k] for k in ("differing_pairs_ckdtree", "differing_pairs_open3d") if k in row]
            same = "" if all(n == cut for n, cut in odd) else "  DIFFERENT LISTS"
            print(
                f"{name:28s} {n:9,d} {row['pairs']:9,d} | {t['warpbridge']:10.1f} {t['cKDTree']:9.1f} {o3d} |"
                f" {row['vs_ckdtree']:9.2f}x {vs_o3d}{same}"
            )
    graph = graph_row(args.graph_points, 3 if args.quick else 5)
    print(
        f"radius_graph: {graph['n']:,} points, {graph['edges_per_point']:.1f} edges each: {graph['ms']:.0f} ms, "
        f"peak {graph['peak_mib']:.0f} MiB (the edge_index alone: {graph['output_mib']:.0f} MiB)"
    )
    small = small_graph_rows(5 if args.quick else 15)
    for row in small:
        t = row["us"]
        print(
            f"{row['graph']:12s} {row['n']:5d} points: warpbridge {t['warpbridge']:7.1f} us,"
            f" dense torch {t['dense torch']:7.1f} us ({row['vs_dense']:.2f}x)"
        )
    meta = {
        "date": date.today().isoformat(),
        "device": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "open3d": D.available("open3d"),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"lists-{platform.machine()}-{os.cpu_count()}cpu.json")
    with open(path, "w") as fh:
        json.dump({"meta": meta, "rows": rows, "radius_graph": graph, "small_graphs": small}, fh, indent=1)
    print(f"-> {path}")


if __name__ == "__main__":
    main()
