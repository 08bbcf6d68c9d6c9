"""The JAX scenarios of Warp's interoperability guide, with warpbridge: one WarpOp, called with jax.Arrays.

Each function returns what it computed so that tests/test_examples.py can check it:
single output, multiple outputs, vector and matrix arrays, launch and output dims (with
gradients, which Warp's jax_kernel(enable_backward=True) does not allow), a function that
launches several kernels (with gradients), and shard_map over two host devices.

Run: XLA_FLAGS=--xla_force_host_platform_device_count=2 python examples/jax_examples.py
"""

import jax
import jax.numpy as jnp
import numpy as np
import warp as wp

import warpbridge as wb


@wb.op
@wp.kernel
def triple(x: wp.array(dtype=float), y: wp.array(dtype=float)):
    i = wp.tid()
    y[i] = 3.0 * x[i]


@wp.kernel
def sum_and_product(
    a: wp.array(dtype=float), b: wp.array(dtype=float), s: wp.array(dtype=float), p: wp.array(dtype=float)
):
    i = wp.tid()
    s[i] = a[i] + b[i]
    p[i] = a[i] * b[i]


sum_product = wb.op(sum_and_product, num_outputs=2)


@wb.op
@wp.kernel
def rotate(m: wp.array(dtype=wp.mat22), v: wp.array(dtype=wp.vec2), out: wp.array(dtype=wp.vec2)):
    i = wp.tid()
    out[i] = m[i] * v[i]


@wp.kernel
def matmul_kernel(a: wp.array2d(dtype=float), b: wp.array2d(dtype=float), c: wp.array2d(dtype=float)):
    i, j = wp.tid()
    acc = float(0.0)
    for k in range(a.shape[1]):
        acc += a[i, k] * b[k, j]
    c[i, j] = acc


@wp.kernel
def square_kernel(x: wp.array(dtype=float), y: wp.array(dtype=float)):
    i = wp.tid()
    y[i] = x[i] * x[i]


@wp.kernel
def add_kernel(a: wp.array(dtype=float), b: wp.array(dtype=float), c: wp.array(dtype=float)):
    i = wp.tid()
    c[i] = a[i] + b[i]


@wb.op
def square_plus(x: wp.array(dtype=float), y: wp.array(dtype=float), out: wp.array(dtype=float)):
    """Several kernels and a scratch array: a launch function, differentiable as a whole."""
    sq = wp.zeros(x.shape, dtype=float, device=x.device, requires_grad=True)
    wp.launch(square_kernel, dim=x.shape, inputs=[x], outputs=[sq])
    wp.launch(add_kernel, dim=x.shape, inputs=[sq, y], outputs=[out])


def single_output():
    return triple(jnp.arange(5, dtype=jnp.float32))


def multiple_outputs():
    a, b = jnp.arange(4, dtype=jnp.float32), jnp.full(4, 2.0, dtype=jnp.float32)
    return sum_product(a, b)


def vector_matrix_arrays():
    angle = jnp.pi / 2
    m = jnp.tile(
        jnp.array([[jnp.cos(angle), -jnp.sin(angle)], [jnp.sin(angle), jnp.cos(angle)]], jnp.float32), (3, 1, 1)
    )
    v = jnp.tile(jnp.array([1.0, 0.0], jnp.float32), (3, 1))
    return rotate(m, v)  # (3, 2): each (1, 0) rotated to (0, 1)


def launch_dims_with_gradients(n=3, k=4, m=2):
    op = wb.op(matmul_kernel, launch_dims=(n, m), output_dims=(n, m))
    a = jnp.arange(n * k, dtype=jnp.float32).reshape(n, k) / 10
    b = jnp.ones((k, m), jnp.float32)
    c = op(a, b)
    grad_a = jax.grad(lambda x: jnp.sum(op(x, b)))(a)  # d sum(a @ b) / da = ones @ b.T
    return c, grad_a, a @ b


def multi_kernel_function_with_gradients():
    x, y = jnp.arange(4, dtype=jnp.float32), jnp.ones(4, jnp.float32)
    out = jax.jit(square_plus)(x, y)
    grad = jax.grad(lambda v: jnp.sum(square_plus(v, y)))(x)  # 2x
    return out, grad


def shard_map_two_devices():
    """Each device runs the kernel on its shard (needs 2 devices: see the module docstring)."""
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:  # older JAX
        from jax.experimental.shard_map import shard_map
    if len(jax.devices()) < 2:
        return None
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    f = shard_map(triple, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    return jax.jit(f)(jnp.arange(8, dtype=jnp.float32))


if __name__ == "__main__":
    for fn in (
        single_output,
        multiple_outputs,
        vector_matrix_arrays,
        launch_dims_with_gradients,
        multi_kernel_function_with_gradients,
        shard_map_two_devices,
    ):
        print(f"{fn.__name__}: {fn()}")
