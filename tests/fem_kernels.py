"""warp.fem residuals as launch functions (warp.fem's integrands and integrate(), written by
NVIDIA; only the residual form is ours), and a kernel compiled without an adjoint."""

import warp as wp
import warp.fem as fem

GEO = fem.Grid2D(res=wp.vec2i(4, 4))
SPACE = fem.make_polynomial_space(GEO, degree=1)
TEST = fem.make_test(space=SPACE)  # made once, at module level, as Warp's optimization examples do


@fem.integrand
def nonlinear_diffusion(s: fem.Sample, u: fem.Field, v: fem.Field, k: fem.Field):
    return k(s) * wp.dot(fem.grad(u, s), fem.grad(v, s)) + u(s) * u(s) * v(s)


def field_of(dofs: wp.array):
    field = fem.make_discrete_field(space=SPACE)
    field.dof_values = dofs
    return field


def residual(u: wp.array(dtype=float), k: wp.array(dtype=float), r: wp.array(dtype=float)):
    fem.integrate(nonlinear_diffusion, fields={"u": field_of(u), "v": TEST, "k": field_of(k)}, output=r)


def residual_with_its_own_test_field(u: wp.array(dtype=float), k: wp.array(dtype=float), r: wp.array(dtype=float)):
    test = fem.make_test(space=SPACE)  # warp.fem fills its topology with kernels that have no adjoint
    fem.integrate(nonlinear_diffusion, fields={"u": field_of(u), "v": test, "k": field_of(k)}, output=r)


@wp.kernel(enable_backward=False)
def scale_without_adjoint(x: wp.array(dtype=float), y: wp.array(dtype=float)):
    i = wp.tid()
    y[i] = 2.0 * x[i]


@wp.kernel
def square(x: wp.array(dtype=float), y: wp.array(dtype=float)):
    i = wp.tid()
    y[i] = x[i] * x[i]


def scaled_square(x: wp.array(dtype=float), y: wp.array(dtype=float)):
    doubled = wp.zeros_like(x)
    wp.launch(scale_without_adjoint, dim=x.shape, inputs=[x], outputs=[doubled])
    wp.launch(square, dim=x.shape, inputs=[doubled], outputs=[y])
