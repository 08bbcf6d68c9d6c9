"""Worker processes for test_distributed.py (spawned; two ranks on 127.0.0.1 with gloo)."""

import copy
import os
import sys

import torch
import torch.distributed as dist
from kernels import axpb

import warpbridge as wb

WORLD = 2


class Model(torch.nn.Module):
    """An MLP plus a warpbridge op whose array input is a parameter (direct write)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8)).double()
        self.shift = torch.nn.Parameter(torch.randn(8, dtype=torch.float64))
        self.op = wb.op(axpb)

    def forward(self, x):
        h = self.net(x)
        return torch.stack([self.op(row, 0.5, self.shift) for row in h])


def data(rank, micro=0):
    g = torch.Generator().manual_seed(100 * rank + micro)
    return torch.randn(4, 6, generator=g, dtype=torch.float64), torch.randn(4, 8, generator=g, dtype=torch.float64)


def loss_of(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).mean()


def reference(model, micro):
    """Average over both ranks of the sum over micro-batches, in one process."""
    grads = None
    for rank in range(WORLD):
        m = copy.deepcopy(model)
        for i in range(micro):
            loss_of(m, data(rank, i)).backward()
        g = [p.grad for p in m.parameters()]
        grads = g if grads is None else [a + b for a, b in zip(grads, g)]
    return [g / WORLD for g in grads]


def run(rank, port, scenario):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        count = {"n": 0}
        real = dist.all_reduce

        def counting(*a, **k):
            count["n"] += 1
            return real(*a, **k)

        dist.all_reduce = counting
        model = Model()
        micro = 2
        expect = reference(model, micro)
        if scenario == "ddp":
            ddp = torch.nn.parallel.DistributedDataParallel(model)
            for i in range(micro - 1):
                with ddp.no_sync():
                    loss_of(ddp, data(rank, i)).backward()
            loss_of(ddp, data(rank, micro - 1)).backward()
        else:
            gb = wb.GradBuffer(model.parameters(), bucket_bytes=1024, overlap=scenario == "overlap")
            assert len(gb.buckets) >= 2, gb
            if scenario == "overlap":
                with gb.no_sync():
                    for i in range(micro - 1):
                        loss_of(model, data(rank, i)).backward()
                assert count["n"] == 0
                loss_of(model, data(rank, micro - 1)).backward()  # buckets start during this backward
                started = count["n"]
                n = gb.wait()
                assert started > 0, "no bucket started during backward"
            else:
                for i in range(micro):
                    loss_of(model, data(rank, i)).backward()
                n = gb.all_reduce()
            assert n == len(gb.buckets) == count["n"] == gb.collectives, (n, len(gb.buckets), count["n"])
            for p in model.parameters():
                assert p.grad.untyped_storage().data_ptr() == gb.buffer.untyped_storage().data_ptr()
        for p, e in zip(model.parameters(), expect):
            torch.testing.assert_close(p.grad, e, rtol=1e-12, atol=1e-14)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Every check above has passed. Leave without running C++ static destructors: under load,
    # gloo's threads can abort the interpreter's exit ("terminate called without an active
    # exception"), which would fail the test after the fact.
    sys.stdout.flush()
    os._exit(0)
