"""A launch function that draws new random numbers on each run: where its backward runs it again
(recompute=True, torch.func, JAX, Paddle) the gradient would belong to another draw, so it is
refused, naming the fix; with the forward's tape kept (eager PyTorch) or the seed an argument,
the gradient is the forward draw's."""

import numpy as np
import pytest
import realcode_kernels as K
import torch

import warpbridge as wb

f64 = torch.float64
REFUSED = r"noise_from_a_counter\(\) gives another 'y' when run again on the same inputs \(random numbers drawn anew"


def x0():
    return torch.tensor([0.5, 1.0, 1.5, 2.0], dtype=f64)


def test_eager_with_the_forwards_tape_differentiates_the_forward_draw():
    x = x0().requires_grad_()
    y = wb.op(K.noise_from_a_counter)(x)
    (g,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(g, 2 * y.detach() / x.detach())


def test_recompute_refuses_a_function_that_draws_anew():
    x = x0().requires_grad_()
    y = wb.op(K.noise_from_a_counter, recompute=True)(x)
    with pytest.raises(wb.WarpBridgeError, match=REFUSED):
        y.sum().backward()


def test_torch_func_refuses_a_function_that_draws_anew():
    op = wb.op(K.noise_from_a_counter)
    with pytest.raises(wb.WarpBridgeError, match=REFUSED):
        torch.func.grad(lambda a: op(a).sum())(x0())


def test_jax_refuses_a_function_that_draws_anew():
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    op = wb.op(K.noise_from_a_counter)
    with pytest.raises(Exception, match=REFUSED):  # raised in JAX's callback: JAX re-raises it as its own
        jax.grad(lambda a: op(a).sum())(jnp.asarray(x0().numpy()))


def test_paddle_refuses_a_function_that_draws_anew():
    import paddle

    op = wb.op(K.noise_from_a_counter)
    x = paddle.to_tensor(x0().numpy(), stop_gradient=False)
    with pytest.raises(Exception, match=REFUSED):  # Paddle re-raises a PyLayer's error as its own
        op(x).sum().backward()


@pytest.mark.parametrize("recompute", [False, True])
def test_the_seed_as_an_argument_differentiates_the_forward_draw_on_every_path(recompute):
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    op = wb.op(K.noise_from_a_seed, recompute=recompute)
    x = x0().requires_grad_()
    y = op(x, 7)
    (g,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(g, 2 * y.detach() / x.detach())
    gj = jax.grad(lambda a: op(a, 7).sum())(jnp.asarray(x0().numpy()))
    np.testing.assert_allclose(np.asarray(gj), g.numpy(), rtol=1e-12)
