"""The point-model neighbour steps on a CUDA GPU, against dense torch on the same GPU where a
dense version exists: DGCNN's ``knn_graph`` (8 clouds x 1 024 points, k = 20, 3-, 64- and
128-D), fps (16 x 1 024, ratio 0.5), PointNet++'s SA1 ball query (16 x 512 of 1 024, r 0.2,
K 32) and ``neighbor_list`` on 10^4 atoms whose arrays are on the GPU (the search runs on the
host). Medians of 15 synchronised calls, float32 (float64 atoms).

Usage: python benchmarks/gpu_point_models.py -> table + benchmarks/results/gpu_point_models-<machine>.json
       python benchmarks/gpu_point_models.py --profile -> where each warpbridge row's time goes
       (torch.profiler: CUDA kernels and host calls, five calls each), no JSON
"""

from __future__ import annotations

import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import distributions as D  # noqa: E402

import warpbridge as wb  # noqa: E402


def median_cuda_ms(fn, repeat: int = 15) -> float:
    fn()
    times = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return sorted(times)[repeat // 2] * 1e3


def rows() -> dict:
    out, cuda = {}, "cuda"
    b = torch.arange(8, device=cuda).repeat_interleave(1024)
    for dim in (3, 64, 128):
        h = torch.randn(8 * 1024, dim, device=cuda)
        hb = h.view(8, 1024, dim)
        out[f"DGCNN knn_graph, 8 x 1024, k 20, {dim}-D"] = {
            "warpbridge": lambda h=h: wb.ops.knn_graph(h, 20, batch=b),
            "dense torch": lambda hb=hb: torch.cdist(hb, hb).topk(21, largest=False),
        }
    pos, pb = torch.rand(16 * 1024, 3, device=cuda), torch.arange(16, device=cuda).repeat_interleave(1024)
    out["fps, 16 x 1024, ratio 0.5"] = {"warpbridge": lambda: wb.ops.fps(pos, 0.5, batch=pb, random_start=False)}
    q = pos[wb.ops.fps(pos, num=512, batch=pb, random_start=False)]
    qb = torch.arange(16, device=cuda).repeat_interleave(512)
    out["SA1 ball query, 16 x 512 of 1024, r 0.2, K 32"] = {
        "warpbridge": lambda: wb.ops.radius(q, pos, 0.2, query_batch=qb, ref_batch=pb, max_neighbors=32)
    }
    side = (10_000 / 0.1) ** (1 / 3)
    atoms = torch.rand(10_000, 3, dtype=torch.float64, device=cuda) * side
    cell = torch.eye(3, dtype=torch.float64, device=cuda) * side
    out["neighbor_list, 10^4 atoms on the GPU"] = {"warpbridge": lambda: wb.ops.neighbor_list(atoms, 5.0, cell=cell)}
    return out


def profile() -> None:
    """Each warpbridge row, warmed, then five calls under torch.profiler: the kernels by GPU
    time, the host calls by CPU time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiled

    for name, peers in rows().items():
        fn = peers["warpbridge"]
        fn()
        torch.cuda.synchronize()
        with profiled(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
        events = prof.key_averages()
        print(f"== {name}, 5 calls", flush=True)
        print(events.table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60), flush=True)
        print(events.table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=60), flush=True)


def main() -> None:
    if "--profile" in sys.argv:
        profile()
        return
    t0, results = time.perf_counter(), []
    for name, peers in rows().items():
        times = {who: median_cuda_ms(fn) for who, fn in peers.items()}
        results.append({"case": name, "device": torch.cuda.get_device_name(), "ms": times})
        print(f"{name:<48}" + "  ".join(f"{who} {t:8.2f} ms" for who, t in times.items()), flush=True)
    print("->", D.save(os.path.join(HERE, "results"), "gpu_point_models", results, t0))


if __name__ == "__main__":
    main()
