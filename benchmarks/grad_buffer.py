"""GradBuffer against plain PyTorch (one process) and DistributedDataParallel (two gloo
processes on 127.0.0.1), per training step after the first.

Models: an 8-layer x 1024-wide MLP (33.6 MB of gradients), and a small model that uses a
warpbridge op on a large parameter (a 262 144 x 4 table gathered by index, then an MLP), where
GradBuffer's direct write applies. 1 and 4 micro-batches per step; Adam.

Reported per step: median step time; gradient-sized allocations outside the optimizer step (ops
whose own allocation reaches the size of one of the model's large gradients, from
torch.profiler memory records: this includes the backward's own weight-gradient results
(torch's mm), which every mode allocates);
gradient-sized copies and adds outside the backward's math (aten::copy_/add_ on a tensor with a
large parameter's shape, outside the optimizer step: accumulation into .grad and copies into
buckets); collectives (gloo all_reduce records).

Usage: python benchmarks/grad_buffer.py [--quick] -> table + benchmarks/results/grad_buffer-<machine>.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from datetime import date

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _kernels import gather_rows  # noqa: E402

import warpbridge as wb  # noqa: E402

BIG = 64 * 1024  # bytes: smaller gradients (biases) are not counted


class MLP(torch.nn.Module):
    def __init__(self, width=1024, depth=8):
        super().__init__()
        torch.manual_seed(0)
        layers = []
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        self.net = torch.nn.Sequential(*layers[:-1])
        self.width = width

    def batch(self, rank, i):
        g = torch.Generator().manual_seed(1000 * rank + i)
        return torch.randn(32, self.width, generator=g), torch.randn(32, self.width, generator=g)

    def forward(self, x):
        return self.net(x)


class WarpTable(torch.nn.Module):
    """A large table parameter read through a warpbridge op (its adjoint scatters into the
    table's gradient), followed by a small MLP."""

    def __init__(self, rows=262_144, dim=4):
        super().__init__()
        torch.manual_seed(0)
        self.table = torch.nn.Parameter(torch.randn(rows, dim) * 0.1)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.gather = wb.op(gather_rows)
        self.rows, self.dim = rows, dim

    def batch(self, rank, i):
        g = torch.Generator().manual_seed(1000 * rank + i)
        idx = torch.randint(0, self.rows, (4096,), generator=g, dtype=torch.int32)
        return idx, torch.randn(4096, 1, generator=g)

    def forward(self, idx):
        n = idx.shape[0]
        return self.mlp(self.gather(self.table, idx, launch_dims=(n, self.dim), output_dims=(n, self.dim)))


MODELS = {"mlp 8x1024": MLP, "warpbridge table + MLP": WarpTable}


def train_step(model, opt, micro, rank, step, gb=None, mode="plain", ddp=None):
    opt.zero_grad()
    run = ddp or model
    for i in range(micro):
        x, y = model.batch(rank, step * micro + i)
        last = i == micro - 1
        ctx = (ddp.no_sync() if ddp is not None and not last else None) or (
            gb.no_sync() if gb is not None and gb.overlap and not last else None
        )
        if ctx is None:
            ((run(x) - y) ** 2).mean().backward()
        else:
            with ctx:
                ((run(x) - y) ** 2).mean().backward()
    if gb is not None and dist.is_initialized():
        gb.wait() if gb.overlap else gb.all_reduce()
    opt.step()


def counts(prof, model):
    shapes = {tuple(p.shape) for p in model.parameters() if p.numel() * p.element_size() >= BIG}
    sizes = [p.numel() * p.element_size() for p in model.parameters() if p.numel() * p.element_size() >= BIG]
    small = min(sizes)
    allocs = copies = colls = 0
    for e in prof.events():
        if e.self_cpu_memory_usage >= 0.9 * small and not e.name.startswith("[") and not _under(e, "Optimizer.step"):
            allocs += 1
        if (
            e.name in ("aten::copy_", "aten::add_", "aten::add")
            and e.input_shapes
            and tuple(e.input_shapes[0]) in shapes
        ):
            copies += not _under(e, "Optimizer.step")  # the optimizer's own math is not a gradient copy
        if e.name == "gloo:all_reduce":  # what the gloo backend records per collective (DDP included)
            colls += 1
    return allocs, copies, colls


def _under(e, prefix):
    while e is not None:
        if e.name.startswith(prefix):
            return True
        e = e.cpu_parent
    return False


def measure(model_name, mode, micro, steps, rank=0):
    model = MODELS[model_name]()
    gb = ddp = None
    if mode.startswith("GradBuffer"):
        gb = wb.GradBuffer(model.parameters(), overlap="overlap" in mode)
    if mode.startswith("DDP"):
        ddp = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    mode_ = "overlap" if gb is not None and gb.overlap else mode
    for s in range(2):  # warm-up: compiles, first .grad allocations, DDP bucket rebuild
        train_step(model, opt, micro, rank, s, gb, mode_, ddp)
    times = []
    for s in range(steps):
        if dist.is_initialized():
            dist.barrier()
        t = time.perf_counter()
        train_step(model, opt, micro, rank, s + 2, gb, mode_, ddp)
        times.append((time.perf_counter() - t) * 1e3)
    act = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=act, profile_memory=True, record_shapes=True) as prof:
        train_step(model, opt, micro, rank, steps + 2, gb, mode_, ddp)
    allocs, copies, colls = counts(prof, model)
    if gb is not None:
        aliased = all(
            p.grad is None or p.grad.untyped_storage().data_ptr() == gb.buffer.untyped_storage().data_ptr()
            for p in model.parameters()
        )
        assert aliased
    return {
        "step_ms": statistics.median(times),
        "grad_sized_allocs": allocs,
        "grad_sized_copies_adds": copies,
        "collectives": colls,
        "buckets": len(gb.buckets) if gb is not None else None,
    }


def _worker(rank, port, steps, out):
    torch.set_num_threads(1)  # two processes on two cores
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    results = {}
    try:
        for model_name in MODELS:
            for micro in (1, 4):
                for mode in ("DDP(gradient_as_bucket_view=True)", "GradBuffer + all_reduce", "GradBuffer overlap"):
                    r = measure(model_name, mode, micro, steps, rank)
                    results[f"{model_name} | {micro} micro | {mode}"] = r
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(results, fh)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    args = p.parse_args()
    steps = 3 if args.quick else 20
    single = {}
    for model_name in MODELS:
        for micro in (1, 4):
            for mode in ("plain PyTorch", "GradBuffer"):
                single[f"{model_name} | {micro} micro | {mode}"] = r = measure(model_name, mode, micro, steps)
                print(f"1 process  {model_name:<24} micro={micro} {mode:<36} {fmt(r)}", flush=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "two.json")
        mp.spawn(_worker, args=(port, steps, out), nprocs=2, join=True)
        with open(out) as fh:
            two = json.load(fh)
    for k, r in two.items():
        print(f"2 processes {k:<80} {fmt(r)}")
    print_table(single, two)
    machine = f"{platform.machine()}-{os.cpu_count()}cpu"
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"grad_buffer-{machine}.json")
    meta = {"date": date.today().isoformat(), "machine": machine, "torch": torch.__version__, "steps": steps}
    with open(path, "w") as fh:
        json.dump({"meta": meta, "one_process": single, "two_processes": two}, fh, indent=2)
    print(f"wrote {path}")


def fmt(r):
    return (
        f"step {r['step_ms']:.1f} ms, allocs {r['grad_sized_allocs']}, copies/adds {r['grad_sized_copies_adds']}, "
        f"collectives {r['collectives']}" + (f" (buckets {r['buckets']})" if r["buckets"] else "")
    )


def print_table(single, two):
    print(
        "\n| processes | model | micro-batches | mode | step ms | grad-sized allocs | grad-sized copies/adds | collectives |"
    )
    print("|---|---|---:|---|---:|---:|---:|---:|")
    for n, rows in (("1", single), ("2", two)):
        for k, r in rows.items():
            model, micro, mode = (s.strip() for s in k.split("|"))
            coll = f"{r['collectives']}" + (f" ({r['buckets']} buckets)" if r["buckets"] and n == "2" else "")
            print(
                f"| {n} | {model} | {micro.split()[0]} | {mode} | {r['step_ms']:.1f} | {r['grad_sized_allocs']} "
                f"| {r['grad_sized_copies_adds']} | {coll} |"
            )


if __name__ == "__main__":
    main()
