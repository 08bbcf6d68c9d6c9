"""CUDA: launches go on PyTorch's current stream and are capturable in a CUDA graph; JAX
arrays on the GPU go through the same ops. Marked `gpu`: skipped with a reason on machines
without one."""

import os

import kernels as K
import numpy as np
import pytest
import torch

import warpbridge as wb

pytestmark = pytest.mark.gpu


def test_cuda_gradcheck_and_output_device():
    op = wb.op(K.vec_mat, num_outputs=2)
    v = torch.randn(16, 3, dtype=torch.float64, device="cuda", requires_grad=True)
    m = torch.randn(16, 3, 3, dtype=torch.float64, device="cuda", requires_grad=True)
    a, b = op(v, m, 0.5)
    assert a.device == v.device and b.device == v.device
    assert torch.autograd.gradcheck(lambda v, m: op(v, m, 0.5), (v, m))


def test_cuda_launches_on_the_current_stream_without_device_sync():
    op = wb.op(K.mul64)
    x = torch.randn(1 << 20, dtype=torch.float64, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)  # keep the side stream busy
        y = op(x, x)
        assert not s.query(), "the op waited for the stream (a device-wide sync)"
    s.synchronize()
    torch.testing.assert_close(y, x.sin() * x)


def test_cuda_graph_capture():
    op = wb.op(K.mul64)
    x = torch.randn(1024, dtype=torch.float64, device="cuda")
    y = torch.randn(1024, dtype=torch.float64, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        op(x, y)  # warm-up: compiles and caches the plan outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = op(x, y)
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x.sin() * y)


def test_tensors_on_two_devices_are_refused_naming_both():
    op = wb.op(K.mul64)
    x, y = torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64, device="cuda")
    with pytest.raises(wb.WarpBridgeError, match=r"all arrays must be on one device: argument 'y' is on cuda:0"):
        op(x, y)


@pytest.mark.parametrize("kind", ["kernel", "launch function"])
def test_jax_arrays_on_the_gpu_forward_and_jitted_gradient(kind):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave the GPU to torch too
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    gpu = jax.devices("gpu")[0]
    x, k = (jax.device_put(jnp.asarray(np.random.default_rng(s).standard_normal(4096)), gpu) for s in (0, 1))
    if kind == "kernel":
        op, f, dfx, dfk = wb.op(K.mul64), np.sin, np.cos, np.sin
    else:
        op, f, dfx, dfk = wb.op(K.exp_times), np.exp, np.exp, np.exp
    out = op(x, k)
    assert out.devices() == {gpu}
    xn, kn = np.asarray(x), np.asarray(k)
    y = f(xn) * kn
    np.testing.assert_allclose(np.asarray(out), y, rtol=1e-12)
    gx, gk = jax.jit(jax.grad(lambda a, b: jnp.sum(op(a, b) ** 2), argnums=(0, 1)))(x, k)
    assert gx.devices() == {gpu}
    np.testing.assert_allclose(np.asarray(gx), 2 * y * dfx(xn) * kn, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(gk), 2 * y * dfk(xn), rtol=1e-10)
