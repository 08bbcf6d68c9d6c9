"""NVIDIA Warp's own example programs (``warp.examples`` in the installed warp-lang, imported,
never copied) through ``wb.op``: right where Warp's adjoint is right (against a float64 model
or Warp's own ``wp.Tape``), refused where it is not.

- SPH (``core/example_sph.py``): ``compute_density`` sums over hash-grid neighbours, then
  multiplies by a runtime scalar; its gradient is right, and accepted.
- Particle repulsion (``optim/example_particle_repulsion.py``): the forward equals Warp's; the
  module is compiled without adjoints, so the gradient is refused; its step updates ``x`` and
  ``v`` in place, refused before the caller's arrays are touched.
- Differentiable ray casting (``optim/example_diffray.py``): ``downsample_kernel`` (a dynamic
  loop whose accumulator is scaled by a runtime value) is accepted and right; ``draw_kernel``,
  whose Tape gradient is wrong, is refused.
- The fluid solver with checkpoints (``optim/example_fluid_checkpoint.py``): one step as a
  launch function (ten launches, scratch fields made without ``requires_grad``) has the
  gradient of the example's own tape; the example's checkpointing by hand becomes ops
  chained in torch, with ``recompute=True`` replaying each step in the backward.
"""

import numpy as np
import pytest
import torch
import warp as wp
from warp.examples.core import example_sph as sph
from warp.examples.optim import example_diffray as diffray
from warp.examples.optim import example_fluid_checkpoint as fluid
from warp.examples.optim import example_particle_repulsion as repulsion

import warpbridge as wb
from warpbridge._core import adjoint_check as _adjoint

H = 0.3  # smoothing length
NORM = 2.5  # density normalisation


def cloud(n=40, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return scale * torch.rand(n, 3, generator=g)


# -- SPH density ----------------------------------------------------------------------------


def sph_density(x: wp.array(dtype=wp.vec3), rho: wp.array(dtype=float)):
    grid = wp.HashGrid(16, 16, 16, device=x.device)
    grid.build(x, H)
    wp.launch(sph.compute_density, dim=x.shape[0], inputs=[grid.id, x, rho, NORM, H])


def density_reference(x):
    d2 = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    return NORM * torch.clamp(H**2 - d2, min=0.0).pow(3).sum(1)


def test_sph_density_is_accepted_and_right():
    x0 = cloud()
    x = x0.clone().requires_grad_()
    rho = wb.op(sph_density)(x)
    x64 = x0.double().requires_grad_()
    ref = density_reference(x64)
    torch.testing.assert_close(rho.double(), ref, rtol=1e-4, atol=1e-7)
    w = torch.linspace(0.5, 1.5, x0.shape[0])
    (rho * w).sum().backward()
    (ref * w.double()).sum().backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-3, atol=1e-6)


# -- particle repulsion ---------------------------------------------------------------------


def repulsion_forces(x: wp.array(dtype=wp.vec3), v: wp.array(dtype=wp.vec3), f: wp.array(dtype=wp.vec3)):
    grid = wp.HashGrid(repulsion.N_GRID, repulsion.N_GRID, 1, device=x.device)
    grid.build(x, repulsion.RADIUS)
    wp.launch(repulsion.compute_forces, dim=x.shape[0], inputs=[grid.id, x, v, f])


def repulsion_step(x: wp.array(dtype=wp.vec3), v: wp.array(dtype=wp.vec3), x_out: wp.array(dtype=wp.vec3)):
    """The example's step as written: forces, then integrate() updating x and v in place."""
    f = wp.zeros_like(x)
    grid = wp.HashGrid(repulsion.N_GRID, repulsion.N_GRID, 1, device=x.device)
    grid.build(x, repulsion.RADIUS)
    wp.launch(repulsion.compute_forces, dim=x.shape[0], inputs=[grid.id, x, v, f])
    wp.launch(repulsion.integrate, dim=x.shape[0], inputs=[x, v, f, 0.01])
    wp.copy(x_out, x)


def particles(n=30, seed=1):
    x = cloud(n, seed, scale=12.0) + 4.0
    x[:, 2] = 0.0
    v = 0.1 * cloud(n, seed + 1)
    return x, v


def test_repulsion_forces_equal_warp_and_their_gradient_is_refused():
    # the example's module is compiled with enable_backward=False: no adjoint to trust
    x0, v0 = particles()
    x = wp.array(x0.numpy(), dtype=wp.vec3)
    f_ref = wp.zeros_like(x)
    repulsion_forces(x, wp.array(v0.numpy(), dtype=wp.vec3), f_ref)
    xt = x0.clone().requires_grad_()
    f = wb.op(repulsion_forces)(xt, v0)
    np.testing.assert_array_equal(f.detach().numpy(), f_ref.numpy())
    assert np.abs(f_ref.numpy()).max() > 0
    with pytest.raises(
        wb.WarpBridgeError,
        match=r"repulsion_forces\(\) at .*test_warp_examples\.py:\d+ runs kernel 'compute_forces', compiled with "
        r"enable_backward=False, and it writes the floating array\(s\) \['f'\]",
    ):
        f.sum().backward()
    assert xt.grad is None


def test_repulsion_step_in_place_is_refused_before_it_writes():
    x0, v0 = particles()
    x, v = x0.clone().requires_grad_(), v0.clone()
    with pytest.raises(wb.WarpBridgeError, match=r"writes into its input array\(s\) \['x', 'v'\]"):
        wb.op(repulsion_step)(x, v)
    assert torch.equal(x.detach(), x0) and torch.equal(v, v0)


# -- differentiable ray casting -------------------------------------------------------------

WIDTH, SAMPLES = 8, 2


def downsample(rays: wp.array(dtype=wp.vec3), pixels: wp.array(dtype=wp.vec3)):
    wp.launch(diffray.downsample_kernel, dim=pixels.shape[0], inputs=[rays, pixels, WIDTH, SAMPLES])


def test_diffray_downsample_is_accepted_and_right():
    op = wb.op(downsample, output_dims=((WIDTH // SAMPLES) ** 2,))
    rays = torch.rand(WIDTH * WIDTH, 3, generator=torch.Generator().manual_seed(2)).requires_grad_()
    pixels = op(rays)
    image = rays.detach().reshape(WIDTH // SAMPLES, SAMPLES, WIDTH // SAMPLES, SAMPLES, 3)
    ref = image.mean(dim=(1, 3)).reshape(-1, 3)
    torch.testing.assert_close(pixels, ref)
    w = torch.rand(pixels.shape, generator=torch.Generator().manual_seed(3))
    (pixels * w).sum().backward()
    want = w.reshape(WIDTH // SAMPLES, 1, WIDTH // SAMPLES, 1, 3).expand(-1, SAMPLES, -1, SAMPLES, -1)
    torch.testing.assert_close(rays.grad, want.reshape(-1, 3) / SAMPLES**2)


def test_diffray_draw_kernel_is_refused():
    # its lambert term is changed inside a dynamic loop: Warp's Tape gradient of the example is wrong
    found = _adjoint.kernel_hazards(diffray.draw_kernel)
    assert [h.variable for h in found] == ["lambert"]
    assert "changed inside the dynamic loop" in found[0].why


@pytest.mark.parametrize("kernel", [sph.compute_density, diffray.downsample_kernel])
def test_examples_kernels_warp_gets_right_raise_no_alarm(kernel):
    assert _adjoint.kernel_hazards(kernel) == ()


# -- the fluid solver with checkpoints -----------------------------------------------------

N_GRID = fluid.N_GRID  # the example's grid: its kernels wrap indices around N_GRID
JACOBI = 3  # pressure iterations a step (the example runs 50)
FIELD = wp.array2d(dtype=float)


def fluid_step(vx: FIELD, vy: FIELD, density: FIELD, p: FIELD, vx1: FIELD, vy1: FIELD, density1: FIELD, p1: FIELD):
    """One step of the example's solver, its scratch fields made without requires_grad, as
    users make them (under a plain ``wp.Tape`` that cuts every gradient through them)."""
    run_fluid_step((vx, vy, density, p), (vx1, vy1, density1, p1), lambda shape: wp.empty(shape, dtype=float))


def run_fluid_step(fields, out, scratch):
    """Launch one step as the example's ``Example.step`` does: velocity self-advection,
    pressure projection (damped Jacobi), density advection. ``scratch(shape)`` makes the
    intermediate fields."""
    (vx, vy, density, p), (vx1, vy1, density1, p1) = fields, out
    shape = vx.shape
    wx, wy, div = scratch(shape), scratch(shape), scratch(shape)
    wp.launch(fluid.advect, shape, inputs=[1.0, vx, vy, vx], outputs=[wx])
    wp.launch(fluid.advect, shape, inputs=[1.0, vx, vy, vy], outputs=[wy])
    wp.launch(fluid.divergence, shape, inputs=[wx, wy], outputs=[div])
    p_in = p
    for k in range(JACOBI):
        p_out = p1 if k == JACOBI - 1 else scratch(shape)
        wp.launch(fluid.jacobi_iter, shape, inputs=[div, p_in], outputs=[p_out])
        p_in = p_out
    wp.launch(fluid.update_velocities, shape, inputs=[p1, wx, wy], outputs=[vx1, vy1])
    wp.launch(fluid.advect, shape, inputs=[1.0, vx1, vy1, density], outputs=[density1])


def differentiable_field(shape):
    return wp.zeros(shape, dtype=float, requires_grad=True)


def fluid_state(seed=4):
    """Smooth random velocities of a few cells a step, the example's three bands of fluid, a
    pressure field, and a target density."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(4, 16, 16, generator=g)
    vx, vy, p, target = torch.nn.functional.interpolate(coarse[None], size=(N_GRID, N_GRID), mode="bilinear")[0]
    density = wp.zeros((N_GRID, N_GRID), dtype=float)
    wp.launch(fluid.fill_initial_density, (N_GRID, N_GRID), inputs=[density])
    return 3.0 * vx, 3.0 * vy, wp.to_torch(density).clone(), 1e-5 * p, target.abs()


def fluid_tape_gradients(state, steps, scratch=differentiable_field):
    """The gradients of the example's loss w.r.t. the initial velocities and density, with
    ``steps`` steps recorded on one ``wp.Tape``, as the example's segments are (every field
    made with requires_grad, as the example makes them)."""
    vx, vy, density, p, target = (wp.array(t.numpy(), dtype=float, requires_grad=True) for t in state)
    loss = wp.zeros(1, dtype=float, requires_grad=True)
    fields = (vx, vy, density, p)
    tape = wp.Tape()
    with tape:
        for _ in range(steps):
            out = tuple(differentiable_field((N_GRID, N_GRID)) for _ in range(4))
            run_fluid_step(fields, out, scratch)
            fields = out
        wp.launch(fluid.compute_loss, (N_GRID, N_GRID), inputs=[fields[2], target], outputs=[loss])
    tape.backward(loss)
    return [torch.from_numpy(a.grad.numpy()) for a in (vx, vy, density)], float(loss.numpy()[0])


def test_fluid_step_gradient_equals_the_examples_tape():
    state = fluid_state()
    step, loss_op = wb.op(fluid_step, num_outputs=4), wb.op(fluid.compute_loss, output_dims=(1,))
    vx, vy, density = (t.clone().requires_grad_() for t in state[:3])
    fields = step(vx, vy, density, state[3])
    loss = loss_op(fields[2], state[4])
    loss.sum().backward()
    want, want_loss = fluid_tape_gradients(state, steps=1)
    assert loss.item() == want_loss
    for got, ref in zip((vx.grad, vy.grad, density.grad), want):
        assert ref.abs().max() > 0
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-12)
    # the same function under a plain wp.Tape: its scratch fields cut the velocity gradients
    cut, _ = fluid_tape_gradients(state, steps=1, scratch=lambda shape: wp.empty(shape, dtype=float))
    assert cut[0].abs().max() == 0 and cut[1].abs().max() == 0
    torch.testing.assert_close(cut[2], want[2])  # the density's path crosses none


@pytest.mark.parametrize("recompute", [False, True])
def test_fluid_segments_chained_in_torch_equal_one_tape_over_both(recompute):
    # the example checkpoints by hand (segments replayed under fresh tapes, adjoints carried
    # between them); here each step is one op call, recompute=True replaying it in the backward
    state = fluid_state(seed=5)
    step = wb.op(fluid_step, num_outputs=4, recompute=recompute)
    loss_op = wb.op(fluid.compute_loss, output_dims=(1,))
    vx, vy, density = (t.clone().requires_grad_() for t in state[:3])
    fields = (vx, vy, density, state[3])
    for _ in range(2):
        fields = step(*fields)
    loss_op(fields[2], state[4]).sum().backward()
    want, _ = fluid_tape_gradients(state, steps=2)
    for got, ref in zip((vx.grad, vy.grad, density.grad), want):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-10)
    for t, before in zip((vx, vy, density), state[:3]):
        assert torch.equal(t.detach(), before)  # the caller's fields untouched


def test_fluid_step_gradient_matches_finite_differences():
    # float32 kernels: a smooth direction and a step large enough for the loss's rounding
    state = fluid_state(seed=6)
    step, loss_op = wb.op(fluid_step, num_outputs=4), wb.op(fluid.compute_loss, output_dims=(1,))

    def loss(vx, vy):
        return loss_op(step(vx, vy, state[2], state[3])[2], state[4]).sum()

    vx, vy = state[0].clone().requires_grad_(), state[1].clone().requires_grad_()
    loss(vx, vy).backward()
    g = torch.Generator().manual_seed(7)
    dx, dy = torch.nn.functional.interpolate(torch.randn(1, 2, 8, 8, generator=g), size=(N_GRID, N_GRID))[0]
    eps = 0.02  # 0.01 to 0.03 agree within 1.5%: below, the loss's rounding shows; above, the cells crossed
    with torch.no_grad():
        ahead, behind = loss(state[0] + eps * dx, state[1] + eps * dy), loss(state[0] - eps * dx, state[1] - eps * dy)
    fd = (ahead - behind) / (2 * eps)
    analytic = (vx.grad * dx).sum() + (vy.grad * dy).sum()
    assert abs(analytic.item()) > 1e-4
    assert abs(fd.item() - analytic.item()) <= 0.05 * abs(analytic.item())
