"""Warp kernels shared by the tests (kernels need a source file; one module compiles once)."""

import warp as wp


@wp.kernel
def square(x: wp.array(dtype=float), y: wp.array(dtype=float)):
    i = wp.tid()
    y[i] = x[i] * x[i]


@wp.kernel
def mul64(x: wp.array(dtype=wp.float64), y: wp.array(dtype=wp.float64), z: wp.array(dtype=wp.float64)):
    i = wp.tid()
    z[i] = wp.sin(x[i]) * y[i]


@wp.kernel
def vec_mat(
    v: wp.array(dtype=wp.vec3d),
    m: wp.array(dtype=wp.mat33d),
    s: wp.float64,
    out_v: wp.array(dtype=wp.vec3d),
    out_n: wp.array(dtype=wp.float64),
):
    i = wp.tid()
    w = m[i] * v[i]
    out_v[i] = w * s
    out_n[i] = wp.dot(w, v[i])


@wp.kernel
def outer(a: wp.array(dtype=wp.float64), b: wp.array(dtype=wp.float64), c: wp.array2d(dtype=wp.float64)):
    i, j = wp.tid()
    c[i, j] = a[i] * wp.exp(b[j])


@wp.kernel
def scatter_add(
    x: wp.array2d(dtype=wp.float64),
    idx: wp.array(dtype=wp.int64),
    w: wp.array(dtype=wp.float64),
    out: wp.array2d(dtype=wp.float64),
):
    i, j = wp.tid()
    wp.atomic_add(out, int(idx[i]), j, x[i, j] * w[i])


@wp.kernel
def sum_squares(xs: wp.array2d(dtype=wp.float64), loss: wp.array(dtype=wp.float64)):
    i = wp.tid()
    wp.atomic_add(loss, 0, xs[i, 0] * xs[i, 0] + xs[i, 1] * xs[i, 1])


@wp.kernel
def reads_output(x: wp.array(dtype=wp.float64), z: wp.array(dtype=wp.float64)):
    # z[i] is read before it is written: Warp's adjoint adds into adj_z for that read.
    i = wp.tid()
    z[i] = z[i] * wp.float64(2.0) + x[i] * x[i]


@wp.kernel
def add_vec3(x: wp.array(dtype=wp.vec3), y: wp.array(dtype=wp.vec3), z: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    z[i] = x[i] + y[i]


@wp.kernel(enable_backward=False)
def no_adjoint(x: wp.array(dtype=float), y: wp.array(dtype=float)):
    i = wp.tid()
    y[i] = x[i] * 3.0


@wp.kernel
def writes_input(a: wp.array(dtype=float), b: wp.array(dtype=float)):
    i = wp.tid()
    a[i] = 0.0
    b[i] = 1.0


@wp.kernel
def scale_shift(x: wp.array(dtype=wp.float64), s: wp.float64, n: int, flag: bool, y: wp.array(dtype=wp.float64)):
    i = wp.tid()
    v = x[i] * s + wp.float64(n)
    if flag:
        v = -v
    y[i] = v


@wp.kernel
def exp_k(x: wp.array(dtype=wp.float64), y: wp.array(dtype=wp.float64)):
    i = wp.tid()
    y[i] = wp.exp(x[i])


@wp.kernel
def times_k(y: wp.array(dtype=wp.float64), k: wp.array(dtype=wp.float64), z: wp.array(dtype=wp.float64)):
    i = wp.tid()
    z[i] = y[i] * k[i]


def exp_times(x: wp.array(dtype=wp.float64), k: wp.array(dtype=wp.float64), z: wp.array(dtype=wp.float64)):
    """A launch function: two kernels and an intermediate (requires_grad so the tape
    carries gradients through it)."""
    y = wp.zeros(x.shape, dtype=wp.float64, device=x.device, requires_grad=True)
    wp.launch(exp_k, dim=x.shape, inputs=[x], outputs=[y])
    wp.launch(times_k, dim=x.shape, inputs=[y, k], outputs=[z])


@wp.func
def rosenbrock(x: float, y: float):
    return (1.0 - x) ** 2.0 + 100.0 * (y - x**2.0) ** 2.0


@wp.kernel
def eval_rosenbrock(xy: wp.array(dtype=wp.vec2), z: wp.array(dtype=float)):
    i = wp.tid()
    v = xy[i]
    z[i] = rosenbrock(v[0], v[1])


@wp.kernel
def axpy16(x: wp.array(dtype=wp.float16), a: wp.float16, y: wp.array(dtype=wp.float16)):
    i = wp.tid()
    y[i] = a * x[i]


@wp.kernel
def axpb(x: wp.array(dtype=wp.float64), a: wp.float64, b: wp.array(dtype=wp.float64), y: wp.array(dtype=wp.float64)):
    i = wp.tid()
    y[i] = a * x[i] + b[i]


@wp.kernel
def square_and_sign(x: wp.array(dtype=wp.float64), y: wp.array(dtype=wp.float64), s: wp.array(dtype=wp.int32)):
    i = wp.tid()
    y[i] = x[i] * x[i]
    if x[i] > wp.float64(0.0):
        s[i] = 1


@wp.kernel(enable_backward=False)
def visit(stride: int, offset: int, hits: wp.array(dtype=wp.int32), offsets: wp.array(dtype=wp.int32)):
    # A launch over queries (ops._core.launch_queries): counts each query's runs, keeps its offset.
    i = wp.tid() * stride + offset
    hits[i] = hits[i] + 1
    offsets[i] = offset


@wp.kernel
def sign_and_square(x: wp.array(dtype=wp.float64), s: wp.array(dtype=wp.int32), y: wp.array(dtype=wp.float64)):
    # an integer output before the float one
    i = wp.tid()
    y[i] = x[i] * x[i]
    if x[i] > wp.float64(0.0):
        s[i] = 1
