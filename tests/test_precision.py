"""Mixed precision: bfloat16 and float16 arrays and scalars through wb.op, gradients included,
checked against float64 at each type's tolerance; torch.autocast casts to the kernel's dtype
(and nothing is cast outside autocast)."""

import precision_kernels as P
import pytest
import torch

import warpbridge as wb

TOL = {torch.bfloat16: dict(rtol=2e-2, atol=2e-2), torch.float16: dict(rtol=2e-3, atol=2e-3)}


@pytest.mark.parametrize(
    "dtype, kernel", [(torch.bfloat16, P.scaled_square_bf16), (torch.float16, P.scaled_square_f16)]
)
def test_16_bit_values_and_gradients_against_float64(dtype, kernel):
    op = wb.op(kernel)
    x64 = torch.linspace(-2.0, 3.0, 41, dtype=torch.float64)
    x = x64.to(dtype).requires_grad_(True)
    y = op(x, 1.5)
    assert y.dtype == dtype
    torch.testing.assert_close(y.double(), 1.5 * x.detach().double() ** 2, **TOL[dtype])
    v = torch.linspace(1.0, 2.0, 41, dtype=torch.float64)
    y.backward(v.to(dtype))
    assert x.grad.dtype == dtype
    torch.testing.assert_close(x.grad.double(), 3.0 * x.detach().double() * v, **TOL[dtype])


def test_16_bit_wrong_dtype_is_refused_not_cast():
    op = wb.op(P.scaled_square_bf16)
    with pytest.raises(wb.WarpBridgeError, match="must have dtype bfloat16, got float32"):
        op(torch.ones(3), 1.0)


def test_autocast_casts_to_the_kernels_dtype_and_only_under_autocast():
    op = wb.op(P.affine32, output_dims=None)
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(5, 4)
    idx = torch.arange(5, dtype=torch.int32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = lin(x)
        assert h.dtype == torch.bfloat16  # autocast made the layer bf16
        y = op(h, idx)  # cast to the kernel's float32
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, 2 * h.float() + idx[:, None].float())
    y.sum().backward()
    assert lin.weight.grad is not None and lin.weight.grad.dtype == torch.float32
    with pytest.raises(wb.WarpBridgeError, match="must have dtype float32, got bfloat16"):
        op(h.detach(), idx)  # outside autocast: never cast


@pytest.mark.compile
def test_autocast_under_torch_compile_agrees_with_eager():
    op = wb.op(P.affine32)
    idx = torch.arange(3, dtype=torch.int32)

    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return op(x.to(torch.bfloat16), idx)

    x = torch.randn(3, 2)
    eager = f(x)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(x)
    assert compiled.dtype == torch.float32
    torch.testing.assert_close(compiled, eager)


def test_jax_bfloat16():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    op = wb.op(P.scaled_square_bf16)
    x = jnp.linspace(-2.0, 3.0, 9, dtype=jnp.bfloat16)
    y = op(x, 1.5)
    assert y.dtype == jnp.bfloat16
    assert jnp.allclose(y.astype(jnp.float32), 1.5 * x.astype(jnp.float32) ** 2, rtol=2e-2, atol=2e-2)
    g = jax.grad(lambda v: op(v, 1.5).astype(jnp.float32).sum())(x)
    assert jnp.allclose(g.astype(jnp.float32), 3.0 * x.astype(jnp.float32), rtol=2e-2, atol=2e-2)


def test_paddle_bfloat16():
    paddle = pytest.importorskip("paddle")
    op = wb.op(P.scaled_square_bf16)
    x = paddle.to_tensor([0.5, -1.0, 2.0], dtype="float32").astype("bfloat16")
    x.stop_gradient = False
    y = op(x, 1.5)
    assert y.dtype == paddle.bfloat16
    assert paddle.allclose(y.astype("float32"), paddle.to_tensor([0.375, 1.5, 6.0]), rtol=2e-2).item()
    y.astype("float32").sum().backward()
    assert paddle.allclose(x.grad.astype("float32"), paddle.to_tensor([1.5, -3.0, 6.0]), rtol=2e-2).item()
