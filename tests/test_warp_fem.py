"""warp.fem's differentiable residual assembly as a launch function: its gradient equals
wp.Tape's (with the test field made once, as Warp's optimization examples do) and finite
differences, also with the test field made inside the function (warp.fem fills its topology
with integer kernels that have no adjoint, which pass); the residual trains; a kernel without
an adjoint on the gradient's path is refused naming the function's line."""

import fem_kernels as F
import numpy as np
import pytest
import torch
import warp as wp

import warpbridge as wb

N = F.SPACE.node_count()


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(N, generator=g), torch.rand(N, generator=g) + 0.5


def tape_gradient(u, k, w):
    """Warp's own: fem.integrate under wp.Tape, as in example_darcy_ls_optimization."""
    ua = wp.array(u.numpy(), dtype=float, requires_grad=True)
    ka = wp.array(k.numpy(), dtype=float, requires_grad=True)
    r = wp.zeros(N, dtype=float, requires_grad=True)
    tape = wp.Tape()
    with tape:
        F.residual(ua, ka, r)
    tape.backward(grads={r: wp.array(w.numpy(), dtype=float)})
    return torch.from_numpy(ua.grad.numpy()), torch.from_numpy(ka.grad.numpy())


@pytest.mark.parametrize("fn", [F.residual, F.residual_with_its_own_test_field], ids=lambda f: f.__name__)
def test_the_residual_gradient_equals_warps_tape_and_finite_differences(fn):
    u0, k0 = inputs()
    w = torch.rand(N, generator=torch.Generator().manual_seed(1))
    op = wb.op(fn, output_dims=(N,))
    u, k = u0.clone().requires_grad_(), k0.clone().requires_grad_()
    (op(u, k) * w).sum().backward()
    want_u, want_k = tape_gradient(u0, k0, w)
    torch.testing.assert_close(u.grad, want_u, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(k.grad, want_k, rtol=1e-5, atol=1e-6)
    assert u.grad.abs().max() > 0 and k.grad.abs().max() > 0
    eps = 1e-2
    for grad, which in ((u.grad, 0), (k.grad, 1)):
        for j in (0, N // 2, N - 1):
            plus, minus = [u0.clone(), k0.clone()], [u0.clone(), k0.clone()]
            plus[which][j] += eps
            minus[which][j] -= eps
            fd = float(((op(*plus) - op(*minus)).double() * w).sum()) / (2 * eps)
            assert grad[j].item() == pytest.approx(fd, rel=2e-2, abs=1e-3)


def test_the_residual_trains():
    """Fit the diffusivity k so that the residual of a fixed u matches a target's."""
    u = inputs()[0]
    target = wb.op(F.residual, output_dims=(N,))(u, torch.full((N,), 1.3))
    k = torch.full((N,), 0.6, requires_grad=True)
    opt = torch.optim.Adam([k], lr=0.05)
    op = wb.op(F.residual, output_dims=(N,))
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss = ((op(u, k) - target) ** 2).sum()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] / 50, losses[::10]


def test_a_kernel_without_an_adjoint_on_the_gradients_path_is_refused_naming_the_line():
    x = torch.rand(4, requires_grad=True)
    y = wb.op(F.scaled_square)(x)
    torch.testing.assert_close(y, 4 * x.detach() ** 2)
    with pytest.raises(
        wb.WarpBridgeError,
        match=r"scaled_square\(\) at .*fem_kernels\.py:\d+ runs kernel 'scale_without_adjoint', compiled with "
        r"enable_backward=False, and it writes the floating array\(s\) \['y'\]",
    ):
        y.sum().backward()
    assert np.isfinite(y.detach().numpy()).all()
