"""Forward kernels with hand-written backwards (custom backward tests and examples)."""

from typing import Any

import warp as wp

f64 = wp.float64


@wp.kernel
def power(x: wp.array(dtype=f64), n: int, y: wp.array(dtype=f64)):
    # x**n as a runtime loop: Warp's own adjoint of it is wrong (refused)
    i = wp.tid()
    acc = f64(1.0)
    for _k in range(n):
        acc = acc * x[i]
    y[i] = acc


@wp.kernel
def power_adjoint(
    x: wp.array(dtype=f64), n: int, y: wp.array(dtype=f64), adj_y: wp.array(dtype=f64), adj_x: wp.array(dtype=f64)
):
    i = wp.tid()
    if n > 0:
        adj_x[i] = f64(n) * wp.pow(x[i], f64(n - 1)) * adj_y[i]


@wp.kernel
def power_adjoint_wrong(
    x: wp.array(dtype=f64), n: int, y: wp.array(dtype=f64), adj_y: wp.array(dtype=f64), adj_x: wp.array(dtype=f64)
):
    i = wp.tid()
    adj_x[i] = wp.pow(x[i], f64(n - 1)) * adj_y[i]  # forgets the factor n


@wp.kernel
def power_adjoint_from_output(
    x: wp.array(dtype=f64), n: int, y: wp.array(dtype=f64), adj_y: wp.array(dtype=f64), adj_x: wp.array(dtype=f64)
):
    # uses the forward's output: y / x * n (x != 0)
    i = wp.tid()
    adj_x[i] = f64(n) * y[i] / x[i] * adj_y[i]


@wp.kernel
def power_adjoint_writes_input(
    x: wp.array(dtype=f64), n: int, y: wp.array(dtype=f64), adj_y: wp.array(dtype=f64), adj_x: wp.array(dtype=f64)
):
    i = wp.tid()
    adj_y[i] = f64(0.0)
    adj_x[i] = f64(0.0)


@wp.kernel
def power_adjoint_bad_name(
    x: wp.array(dtype=f64), n: int, y: wp.array(dtype=f64), grad_y: wp.array(dtype=f64), adj_x: wp.array(dtype=f64)
):
    i = wp.tid()
    adj_x[i] = grad_y[i]


@wp.kernel
def power_adjoint_bad_type(
    x: wp.array(dtype=f64), n: int, y: wp.array(dtype=f64), adj_y: wp.array(dtype=float), adj_x: wp.array(dtype=f64)
):
    i = wp.tid()
    adj_x[i] = f64(adj_y[i])


@wp.kernel(enable_backward=False)
def power_no_adjoint(x: wp.array(dtype=f64), n: int, y: wp.array(dtype=f64)):
    i = wp.tid()
    y[i] = wp.pow(x[i], f64(n))


@wp.kernel
def weighted(
    x: wp.array(dtype=f64),
    w: wp.array(dtype=f64),
    idx: wp.array(dtype=wp.int32),
    s: f64,
    y: wp.array(dtype=f64),
    count: wp.array(dtype=wp.int32),
):
    # two array inputs that take gradients, an integer input, a scalar, a float and an int output
    i = wp.tid()
    j = idx[i]
    y[i] = s * x[i] * w[j]
    count[i] = j


@wp.kernel
def weighted_adjoint(
    x: wp.array(dtype=f64),
    w: wp.array(dtype=f64),
    idx: wp.array(dtype=wp.int32),
    s: f64,
    y: wp.array(dtype=f64),
    count: wp.array(dtype=wp.int32),
    adj_y: wp.array(dtype=f64),
    adj_x: wp.array(dtype=f64),
    adj_w: wp.array(dtype=f64),
):
    i = wp.tid()
    j = idx[i]
    adj_x[i] = s * w[j] * adj_y[i]
    wp.atomic_add(adj_w, j, s * x[i] * adj_y[i])


@wp.kernel
def power_saving_slope(x: wp.array(dtype=f64), n: int, y: wp.array(dtype=f64), slope: wp.array(dtype=f64)):
    # x**n and, as an auxiliary output for the backward, its derivative n * x**(n - 1)
    i = wp.tid()
    acc = f64(1.0)
    for _k in range(n - 1):
        acc = acc * x[i]
    slope[i] = f64(n) * acc
    y[i] = acc * x[i]


@wp.kernel
def power_saving_slope_adjoint(
    x: wp.array(dtype=f64),
    n: int,
    y: wp.array(dtype=f64),
    slope: wp.array(dtype=f64),
    adj_y: wp.array(dtype=f64),
    adj_x: wp.array(dtype=f64),
):
    i = wp.tid()
    adj_x[i] = slope[i] * adj_y[i]


@wp.kernel
def power_saving_slope_adjoint_asks_aux(
    x: wp.array(dtype=f64),
    n: int,
    y: wp.array(dtype=f64),
    slope: wp.array(dtype=f64),
    adj_y: wp.array(dtype=f64),
    adj_slope: wp.array(dtype=f64),
    adj_x: wp.array(dtype=f64),
):
    i = wp.tid()
    adj_x[i] = slope[i] * adj_y[i] + adj_slope[i]


@wp.kernel
def outer(a: wp.array(dtype=f64), b: wp.array(dtype=f64), y: wp.array2d(dtype=f64)):
    # y[i, j] = a[i] * b[j]: its shape comes from both inputs (a callable output_dims)
    i, j = wp.tid()
    y[i, j] = a[i] * b[j]


def weighted_backward_skipping(
    x: wp.array(dtype=f64),
    w: wp.array(dtype=f64),
    idx: wp.array(dtype=wp.int32),
    s: f64,
    y: wp.array(dtype=f64),
    count: wp.array(dtype=wp.int32),
    adj_y: wp.array(dtype=f64),
    adj_x: wp.array(dtype=f64),
    adj_w: wp.array(dtype=f64),
    *,
    needs_input_grad,
):
    # a launch-function backward that computes only the gradients asked for
    SEEN.append(tuple(needs_input_grad))
    zero = wp.zeros_like(adj_x)
    wp.launch(
        weighted_adjoint,
        dim=x.shape[0],
        inputs=[x, w, idx, s, y, count, adj_y],
        outputs=[adj_x if needs_input_grad[0] else zero, adj_w if needs_input_grad[1] else wp.zeros_like(adj_w)],
        device=x.device,
    )


SEEN: list = []


@wp.kernel
def generic_scale(x: wp.array(dtype=Any), s: Any, y: wp.array(dtype=Any)):
    # one kernel for every dtype, vector and matrix element (warpbridge binds Any per call)
    i = wp.tid()
    y[i] = s * x[i]


@wp.kernel
def generic_cube(x: wp.array(dtype=Any), y: wp.array(dtype=Any)):
    # x**3 in a runtime loop: refused without a backward, like any kernel
    i = wp.tid()
    acc = x[i]
    n = int(2)
    for _k in range(n):
        acc = acc * x[i]
    y[i] = acc


@wp.kernel
def generic_cube_adjoint(
    x: wp.array(dtype=Any), y: wp.array(dtype=Any), adj_y: wp.array(dtype=Any), adj_x: wp.array(dtype=Any)
):
    i = wp.tid()
    adj_x[i] = type(x[i])(3.0) * x[i] * x[i] * adj_y[i]


@wp.struct
class Affine:
    scale: wp.float64
    shift: wp.float64


@wp.kernel
def affine(x: wp.array(dtype=f64), params: Affine, y: wp.array(dtype=f64)):
    # a wp.struct scalar argument: passed as the user's instance, not differentiated
    i = wp.tid()
    y[i] = params.scale * x[i] * x[i] + params.shift


@wp.kernel
def sum_of_affines(items: wp.array(dtype=Affine), y: wp.array(dtype=f64)):
    i = wp.tid()
    y[i] = items[i].scale + items[i].shift


@wp.kernel
def indexed_square(x: wp.indexedarray(dtype=f64), y: wp.array(dtype=f64)):
    # an indexedarray input: called with an array, or (values, indices)
    i = wp.tid()
    y[i] = x[i] * x[i]


@wp.kernel
def indexed_square_adjoint(
    x: wp.indexedarray(dtype=f64), y: wp.array(dtype=f64), adj_y: wp.array(dtype=f64), adj_x: wp.array(dtype=f64)
):
    # the gradient of the gathered values; the framework's gather scatters it back to `values`
    i = wp.tid()
    adj_x[i] = f64(2.0) * x[i] * adj_y[i]
