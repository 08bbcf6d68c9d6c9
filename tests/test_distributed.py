"""GradBuffer and warpbridge ops across two processes (gloo on 127.0.0.1): gradients equal the
average of a single-process reference; collectives are counted."""

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import warpbridge as wb

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="this torch build has no torch.distributed")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _warm_up():
    # compile the kernel module here, so two children do not race to compile it
    from kernels import axpb

    wb.op(axpb)(torch.zeros(2, dtype=torch.float64), 1.0, torch.zeros(2, dtype=torch.float64))


@pytest.mark.parametrize("scenario", ["all_reduce", "overlap", "ddp"])
def test_two_ranks(scenario):
    import dist_worker

    _warm_up()
    mp.spawn(dist_worker.run, args=(free_port(), scenario), nprocs=2, join=True)
