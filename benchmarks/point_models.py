"""The neighbour steps of point-cloud models (PointNet++, DGCNN, Point Transformer), each
against what those models' users run today, side by side in one process.

Rows:
- farthest point sampling, 16 clouds x 1 024 points, ratio 0.5 (PointNet++'s set
  abstraction): ``wb.ops.fps(random_start=False)`` against ``torch_cluster.fps`` (CPU, when
  installed) and a torch loop of the same steps; the samples are checked equal first;
- DGCNN's EdgeConv graphs, 8 clouds x 1 024 points, k = 20, in 3-D (the first layer) and in
  64-D and 128-D feature space (the later ones): ``wb.ops.knn_graph``
  against dense torch (``cdist`` + ``topk`` on the (8, 1 024, 1 024) batch),
  ``torch_cluster.knn_graph``, and loops of cKDTree and pykdtree;
- PointNet++ feature propagation, 16 clouds of 256 -> 1 024 points, F = 128, k = 3:
  ``wb.ops.knn_interpolate`` against PyG's formula on dense torch (the 3 nearest by ``topk``);
- a 100-point cloud's ``knn``, ``knn_graph`` (k = 16) and ``radius_graph``: the fixed cost of a
  call.

Each at one thread and at the default threads (``torch.set_num_threads`` and warpbridge's
together); medians of per-call wall times after warm-up (for the 100-point rows, medians of rounds
of 100 calls).

Usage: python benchmarks/point_models.py [--quick]
       -> table + benchmarks/results/point_models-<machine>.json
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import distributions as D  # noqa: E402

import warpbridge as wb  # noqa: E402
from warpbridge._cli.measure import median_ms, per_call_ms  # noqa: E402

try:
    import torch_cluster
except ImportError:  # built from source only: the rows then leave it out
    torch_cluster = None


def torch_fps(pos: torch.Tensor, ptr: list, ratio: float) -> torch.Tensor:
    """torch_cluster's fps steps as a torch loop (squared distances, argmax, min)."""
    out = []
    for c in range(len(ptr) - 1):
        y = pos[ptr[c] : ptr[c + 1]]
        dist = (y - y[0]).pow(2).sum(1)
        out.append(ptr[c])
        for _ in range(1, math.ceil(len(y) * ratio)):
            a = int(dist.argmax())
            out.append(ptr[c] + a)
            dist = torch.minimum(dist, (y - y[a]).pow(2).sum(1))
    return torch.tensor(out)


def scans(clouds: int, n: int, dim: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """``clouds`` real-shaped clouds of ``n`` points (distributions.py's shapes in turn)."""
    names = list(D.DISTRIBUTIONS)
    parts = [torch.from_numpy(D.make(names[c % len(names)], n, seed=c)[0]).float() for c in range(clouds)]
    if dim != 3:
        g = torch.Generator().manual_seed(dim)
        parts = [torch.randn(n, dim, generator=g) for _ in range(clouds)]
    return torch.cat(parts), torch.arange(clouds).repeat_interleave(n)


def dense_knn_graph(x: torch.Tensor, clouds: int, k: int) -> torch.Tensor:
    b = x.view(clouds, -1, x.shape[1])
    return torch.cdist(b, b).topk(k + 1, dim=-1, largest=False).indices


def tree_loop(x: np.ndarray, clouds: int, k: int, who: str) -> list:
    out = []
    for c in np.split(x, clouds):
        if who == "cKDTree":
            from scipy.spatial import cKDTree

            out.append(cKDTree(c).query(c, k + 1, workers=-1)[1])
        else:
            from pykdtree.kdtree import KDTree

            out.append(KDTree(c).query(c, k + 1)[1])
    return out


def open3d_knn(x: np.ndarray, ptr: list, k: int) -> list:
    """Open3D's kNN (a kd-tree, its own threads) cloud by cloud."""
    import open3d.core as o3c

    out = []
    for c in range(len(ptr) - 1):
        cloud = o3c.Tensor.from_numpy(np.ascontiguousarray(x[ptr[c] : ptr[c + 1]]))
        nns = o3c.nns.NearestNeighborSearch(cloud)
        nns.knn_index()
        out.append(nns.knn_search(cloud, k)[0].numpy())
    return out


def ragged_tree_loop(q: np.ndarray, qptr: list, r: np.ndarray, rptr: list, k: int, who: str, bound=np.inf) -> list:
    """cKDTree or pykdtree cloud by cloud: the k nearest (within ``bound``) of each query."""
    out = []
    for c in range(len(qptr) - 1):
        qc, rc = q[qptr[c] : qptr[c + 1]], r[rptr[c] : rptr[c + 1]]
        if who == "cKDTree":
            from scipy.spatial import cKDTree

            out.append(cKDTree(rc).query(qc, k, distance_upper_bound=bound, workers=-1)[1])
        else:
            from pykdtree.kdtree import KDTree

            out.append(KDTree(rc).query(qc, k, distance_upper_bound=bound)[1])
    return out


def open3d_ball(q: np.ndarray, qptr: list, r: np.ndarray, rptr: list, radius: float, k: int) -> list:
    """Open3D's hybrid search (the k nearest within the radius) cloud by cloud."""
    import open3d.core as o3c

    out = []
    for c in range(len(qptr) - 1):
        nns = o3c.nns.NearestNeighborSearch(o3c.Tensor.from_numpy(np.ascontiguousarray(r[rptr[c] : rptr[c + 1]])))
        nns.hybrid_index(radius)
        out.append(nns.hybrid_search(o3c.Tensor.from_numpy(np.ascontiguousarray(q[qptr[c] : qptr[c + 1]])), radius, k))
    return out


def dense_ball(q: torch.Tensor, r: torch.Tensor, clouds: int, radius: float, k: int):
    d = torch.cdist(q.view(clouds, -1, 3), r.view(clouds, -1, 3))
    return d.masked_fill(d >= radius, math.inf).topk(k, dim=-1, largest=False)


def unit_clouds(pos: torch.Tensor, clouds: int) -> torch.Tensor:
    """Each cloud centred and scaled into the unit sphere (PointNet++'s input convention)."""
    b = pos.view(clouds, -1, 3)
    b = b - b.mean(1, keepdim=True)
    return (b / b.norm(dim=-1).amax(1)[:, None, None]).reshape(-1, 3)


def ball_query_row(pos: torch.Tensor, clouds: int, centres: int, radius: float, k: int) -> dict:
    """PointNet++'s set abstraction grouping: ``centres`` fps samples per cloud, the ``k``
    nearest references within ``radius`` of each."""
    n = len(pos) // clouds
    batch = torch.arange(clouds).repeat_interleave(n)
    q = pos[wb.ops.fps(pos, num=centres, batch=batch, random_start=False)]
    qb = torch.arange(clouds).repeat_interleave(centres)
    qn, rn = q.numpy(), pos.numpy()
    qptr, rptr = list(range(0, len(q) + 1, centres)), list(range(0, len(pos) + 1, n))
    row = {
        "warpbridge": lambda: wb.ops.radius(q, pos, radius, query_batch=qb, ref_batch=batch, max_neighbors=k),
        "dense torch": lambda: dense_ball(q, pos, clouds, radius, k),
        "cKDTree loop": lambda: ragged_tree_loop(qn, qptr, rn, rptr, k, "cKDTree", radius),
        "pykdtree loop": lambda: ragged_tree_loop(qn, qptr, rn, rptr, k, "pykdtree", radius),
    }
    if D.available("open3d"):
        row["Open3D loop"] = lambda: open3d_ball(qn, qptr, rn, rptr, radius, k)
    if torch_cluster is not None:
        row["torch_cluster"] = lambda: torch_cluster.radius(pos, q, radius, batch, qb, max_num_neighbors=k)
    return row


def point_transformer_row(sizes: list, k: int) -> dict:
    """Point Transformer's kNN on a ragged batch of scans (every point's k nearest, itself included)."""
    parts = [
        torch.from_numpy(D.make(list(D.DISTRIBUTIONS)[c % len(D.DISTRIBUTIONS)], n, seed=c)[0]).float()
        for c, n in enumerate(sizes)
    ]
    x, b = torch.cat(parts), torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    ptr, xn = [0, *np.cumsum(sizes).tolist()], x.numpy()
    row = {
        "warpbridge": lambda: wb.ops.knn(x, x, k, query_batch=b, ref_batch=b),
        "dense torch": lambda: [torch.cdist(p, p).topk(k, largest=False) for p in torch.split(x, sizes)],
        "cKDTree loop": lambda: ragged_tree_loop(xn, ptr, xn, ptr, k, "cKDTree"),
        "pykdtree loop": lambda: ragged_tree_loop(xn, ptr, xn, ptr, k, "pykdtree"),
    }
    if D.available("open3d"):
        row["Open3D loop"] = lambda: open3d_knn(xn, ptr, k)
    if torch_cluster is not None:
        row["torch_cluster"] = lambda: torch_cluster.knn(x, x, k, b, b)
    return row


def dense_interpolate(x, pos_x, pos_y, clouds, k=3):
    px, py = pos_x.view(clouds, -1, 3), pos_y.view(clouds, -1, 3)
    d2, idx = (torch.cdist(py, px, compute_mode="donot_use_mm_for_euclid_dist") ** 2).topk(k, dim=-1, largest=False)
    w = 1.0 / d2.clamp(min=1e-16)
    feats = torch.gather(
        x.view(clouds, -1, 1, x.shape[1]).expand(-1, -1, k, -1), 1, idx[..., None].expand(-1, -1, -1, x.shape[1])
    )
    return ((feats * w[..., None]).sum(2) / w.sum(-1, keepdim=True)).reshape(-1, x.shape[1])


def cases(quick: bool) -> dict:
    rows = {}
    pos, batch = scans(16, 1024)
    ptr = list(range(0, 16 * 1024 + 1, 1024))
    fps = {"warpbridge": lambda: wb.ops.fps(pos, 0.5, batch=batch, random_start=False)}
    if torch_cluster is not None:
        fps["torch_cluster"] = lambda: torch_cluster.fps(pos, batch, 0.5, random_start=False)
    if not quick:
        fps["torch loop"] = lambda: torch_fps(pos, ptr, 0.5)
    assert torch.equal(fps["warpbridge"](), torch_fps(pos, ptr, 0.5)), "fps samples differ from torch_cluster's steps"
    rows["fps, 16 x 1024, ratio 0.5"] = fps
    for dim in (3, 64, 128):
        x, b = scans(8, 1024, dim)
        xn = x.numpy()
        graph = {
            "warpbridge": lambda x=x, b=b: wb.ops.knn_graph(x, 20, batch=b),
            "dense torch": lambda x=x: dense_knn_graph(x, 8, 20),
            "cKDTree loop": lambda xn=xn: tree_loop(xn, 8, 20, "cKDTree"),
        }
        if dim < 128:  # pykdtree takes at most 127 coordinates
            graph["pykdtree loop"] = lambda xn=xn: tree_loop(xn, 8, 20, "pykdtree")
        if D.available("open3d"):
            graph["Open3D loop"] = lambda xn=xn: open3d_knn(xn, list(range(0, 8 * 1024 + 1, 1024)), 21)
        if torch_cluster is not None:
            graph["torch_cluster"] = lambda x=x, b=b: torch_cluster.knn_graph(x, 20, b)
        rows[f"DGCNN knn_graph, 8 x 1024, k 20, {dim}-D"] = graph
    sa_pos = unit_clouds(scans(16, 1024)[0], 16)
    rows["SA1 ball query, 16 x 512 of 1024, r 0.2, K 32"] = ball_query_row(sa_pos, 16, 512, 0.2, 32)
    sa2_pos = sa_pos[wb.ops.fps(sa_pos, num=512, batch=torch.arange(16).repeat_interleave(1024), random_start=False)]
    rows["SA2 ball query, 16 x 128 of 512, r 0.4, K 64"] = ball_query_row(sa2_pos, 16, 128, 0.4, 64)
    rows["Point Transformer kNN, 4 scans of 2-6k, k 16"] = point_transformer_row([2300, 4100, 3500, 5900], 16)
    fine, fb = scans(16, 1024)
    coarse_idx = wb.ops.fps(fine, 0.25, batch=fb, random_start=False)
    coarse, cb = fine[coarse_idx], fb[coarse_idx]
    feats = torch.randn(len(coarse), 128)
    ours = wb.ops.knn_interpolate(feats, coarse, fine, cb, fb, k=3)
    torch.testing.assert_close(ours, dense_interpolate(feats, coarse, fine, 16), rtol=1e-4, atol=1e-4)
    rows["3-NN interpolation, 16 x 256 -> 1024, F 128"] = {
        "warpbridge": lambda: wb.ops.knn_interpolate(feats, coarse, fine, cb, fb, k=3),
        "dense torch": lambda: dense_interpolate(feats, coarse, fine, 16),
    }
    return rows | tiny_rows(scans(1, 100)[0])


def tiny_rows(small: torch.Tensor) -> dict:
    """A 100-point cloud's knn, knn_graph and radius_graph: the fixed cost of a call."""
    tiny = {
        "warpbridge": lambda: wb.ops.knn_graph(small, 16),
        "dense torch": lambda: dense_knn_graph(small, 1, 16),
        "pykdtree": lambda: tree_loop(small.numpy(), 1, 16, "pykdtree"),
    }
    if D.available("open3d"):
        tiny["Open3D"] = lambda: open3d_knn(small.numpy(), [0, 100], 17)
    if torch_cluster is not None:
        tiny["torch_cluster"] = lambda: torch_cluster.knn_graph(small, 16)
    knn = {
        "warpbridge": lambda: wb.ops.knn(small, small, 16),
        "dense torch": lambda: torch.cdist(small, small).topk(16, largest=False),
    }
    if torch_cluster is not None:
        knn["torch_cluster"] = lambda: torch_cluster.knn(small, small, 16)
    r = float(wb.ops.knn(small, small, 17).dist[:, -1].median())  # about 16 neighbours a point
    radius = {
        "warpbridge": lambda: wb.ops.radius_graph(small, r),
        "dense torch": lambda: (torch.cdist(small, small) <= r).fill_diagonal_(False).nonzero().T,
    }
    if torch_cluster is not None:
        radius["torch_cluster"] = lambda: torch_cluster.radius_graph(small, r, max_num_neighbors=100)
    return {
        "100-point knn, k 16": knn,
        "100-point knn_graph, k 16": tiny,
        "100-point radius_graph, ~16 neighbours": radius,
    }


def timed(case: str, who: str, fn, repeat: int) -> float:
    """Milliseconds per call: the median of ``repeat`` calls; for a 100-point cloud (calls of
    tens of microseconds, where one call's time is mostly noise) of ``repeat`` rounds' means
    over 100 calls."""
    if case.startswith("100-point"):
        return per_call_ms(fn, repeat)
    return median_ms(fn, "cpu", 3 if who == "torch loop" else repeat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, no torch loop")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args()
    t0, repeat, default_threads = time.perf_counter(), 3 if args.quick else 15, torch.get_num_threads()
    results = []
    for name, peers in cases(args.quick).items():
        for threads in (1, default_threads):
            torch.set_num_threads(threads)
            wb.ops.set_num_threads(threads)
            times = {who: timed(name, who, fn, repeat) for who, fn in peers.items()}
            best_peer = min(t for who, t in times.items() if who != "warpbridge")
            results.append({"case": name, "threads": threads, "ms": times, "speedup": best_peer / times["warpbridge"]})
            cells = "  ".join(f"{who} {t:8.2f}" for who, t in times.items())
            print(
                f"{name:<44} {threads} thr  {cells}  (warpbridge {best_peer / times['warpbridge']:.2f}x the best peer)"
            )
    torch.set_num_threads(default_threads)
    wb.ops.set_num_threads(default_threads)
    print("->", D.save(args.out, "point_models", results, t0))


if __name__ == "__main__":
    main()
