"""set_memory_pool: Warp's own allocations inside warpbridge ops (launch functions' scratch
arrays and their tape's gradients) through PyTorch's caching allocator on CUDA; harmless on
the CPU."""

import os
import subprocess
import sys

import kernels as K
import pytest
import torch
import warp as wp

import warpbridge as wb

f64 = torch.float64


def function_op(name):
    return wb.op(K.exp_times, name=name)  # allocates an intermediate with wp.zeros


def step(op, device="cpu"):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(1000, dtype=f64, generator=g).to(device).requires_grad_()
    k = torch.rand(1000, dtype=f64, generator=g).to(device).requires_grad_()
    out = op(x, k)
    (out * out).sum().backward()
    return out.detach(), x.grad, k.grad


def test_default_set_restore_and_bad_names():
    assert wb.get_memory_pool() == "warp"
    with wb.set_memory_pool("torch") as setting:
        assert wb.get_memory_pool() == "torch"
        assert "torch" in repr(setting)
        with wb.set_memory_pool("warp"):
            assert wb.get_memory_pool() == "warp"
        assert wb.get_memory_pool() == "torch"
    assert wb.get_memory_pool() == "warp"
    wb.set_memory_pool("torch")  # as a plain call it stays set
    try:
        assert wb.get_memory_pool() == "torch"
    finally:
        wb.set_memory_pool("warp")
    with pytest.raises(
        wb.WarpBridgeError, match="set_memory_pool\\(\\): the memory pool must be 'warp' or 'torch', got 'rmm'"
    ):
        wb.set_memory_pool("rmm")
    assert wb.get_memory_pool() == "warp"


def test_the_torch_pool_is_harmless_on_the_cpu():
    op = function_op("pool_exp_times_cpu")
    want = step(op)
    with wb.set_memory_pool("torch"):
        got = step(op)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    x = want[0]
    torch.testing.assert_close(want[1], 2 * x * x)  # d/dx (e^x k)^2 = 2 (e^x k)^2


def test_environment_variable_sets_the_initial_pool():
    code = "import warpbridge as wb; print(wb.get_memory_pool())"
    env = {**os.environ, "WARPBRIDGE_MEMORY_POOL": "torch"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "torch"
    env["WARPBRIDGE_MEMORY_POOL"] = "cuda"
    bad = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert bad.returncode != 0
    assert "WARPBRIDGE_MEMORY_POOL: the memory pool must be 'warp' or 'torch', got 'cuda'" in bad.stderr


def test_torch_allocator_needs_a_cuda_device():
    with pytest.raises(wb.WarpBridgeError, match="TorchAllocator\\(\\): device must be a CUDA device, got cpu"):
        wb.TorchAllocator("cpu")


# -- CUDA -------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_function_scratch_goes_through_torch_and_back_to_its_cache():
    op = function_op("pool_exp_times_cuda")
    want = step(op, "cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    with wb.set_memory_pool("torch"):
        from warpbridge._backends.torch.pool import allocator

        alloc = allocator(torch.device("cuda"))
        n0 = alloc.allocations
        got = step(op, "cuda")
        torch.cuda.synchronize()
    warp_allocs = alloc.allocations - n0
    assert warp_allocs >= 2  # the forward's intermediate, the backward's intermediate and its gradient
    assert torch.cuda.memory_stats()["allocation.all.allocated"] - before >= warp_allocs
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("pool", ["warp", "torch"])
def test_launch_function_inside_cuda_graph_capture(pool):
    op = function_op(f"pool_exp_times_graph_{pool}")
    x = torch.rand(1000, dtype=f64, device="cuda")
    k = torch.rand(1000, dtype=f64, device="cuda")
    with wb.set_memory_pool(pool):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            op(x, k)  # warm-up: compile and cache outside the capture
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = op(x, k)
    x.copy_(torch.rand_like(x))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, torch.exp(x) * k)


@pytest.mark.gpu
def test_forward_and_backward_as_graphed_callable():
    """A training step's op captured by ``torch.cuda.make_graphed_callables``: the replayed
    forward and backward on new data equal the eager op's."""
    op = function_op("pool_exp_times_graphed")
    x, k = (torch.rand(1000, dtype=f64, device="cuda", requires_grad=True) for _ in range(2))
    graphed = torch.cuda.make_graphed_callables(op, (x, k))
    with torch.no_grad():
        x.copy_(torch.rand_like(x))
        k.copy_(torch.rand_like(k))
    out = graphed(x, k)
    (out * out).sum().backward()
    got = out.detach(), x.grad.clone(), k.grad.clone()
    x.grad, k.grad = None, None
    want = op(x, k)
    (want * want).sum().backward()
    for a, b in zip(got, (want.detach(), x.grad, k.grad)):
        torch.testing.assert_close(a, b)


@pytest.mark.gpu
def test_torch_allocator_with_warps_scoped_allocator():
    alloc = wb.TorchAllocator("cuda")
    before = torch.cuda.memory_allocated()
    with wp.ScopedAllocator("cuda:0", alloc):
        a = wp.zeros(1 << 20, dtype=float, device="cuda:0")
    assert alloc.allocations == 1 and alloc.allocated_bytes == 4 << 20
    assert torch.cuda.memory_allocated() - before >= 4 << 20
    del a
    assert torch.cuda.memory_allocated() == before
