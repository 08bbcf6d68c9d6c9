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
"""

import numpy as np
import pytest
import torch
import warp as wp
from warp.examples.core import example_sph as sph
from warp.examples.optim import example_diffray as diffray
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
    with pytest.raises(wb.WarpBridgeError, match="kernel 'compute_forces' was compiled with enable_backward=False"):
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
