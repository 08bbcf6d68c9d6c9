"""Kernels where Warp's own adjoint is silently wrong or missing (holes warpbridge must refuse
or fill), and their right twins. float64 unless Warp's builtin takes only float32."""

import warp as wp

f64 = wp.float64


# -- a struct of arrays -------------------------------------------------------------------------


@wp.struct
class Pair:
    a: wp.array(dtype=f64)
    b: wp.array(dtype=f64)


@wp.kernel
def pair_product(p: Pair, y: wp.array(dtype=f64)):
    i = wp.tid()
    y[i] = p.a[i] * p.b[i]


def pair_product_of(a: wp.array(dtype=f64), b: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """The recipe that carries the gradients: the struct built inside a launch function."""
    p = Pair()
    p.a, p.b = a, b
    wp.launch(pair_product, dim=a.shape, inputs=[p], outputs=[y])


# -- tiles and views made inside a kernel ---------------------------------------------------------

ROW = 8


@wp.kernel
def tile_read_modify_write(x: wp.array2d(dtype=f64), y: wp.array2d(dtype=f64)):
    i = wp.tid()
    t = wp.tile_load(x[i], shape=ROW)
    wp.tile_store(y[i], t)
    u = wp.tile_load(y[i], shape=ROW)
    wp.tile_store(y[i], wp.tile_map(wp.mul, u, t))


@wp.kernel
def tile_stored_twice(x: wp.array2d(dtype=f64), y: wp.array2d(dtype=f64)):
    # the first store is overwritten: only the second one's value reaches y
    i = wp.tid()
    t = wp.tile_load(x[i], shape=ROW)
    wp.tile_store(y[i], t)
    wp.tile_store(y[i], wp.tile_map(wp.mul, t, t))


@wp.kernel
def tile_added_twice(x: wp.array2d(dtype=f64), y: wp.array2d(dtype=f64)):
    i = wp.tid()
    t = wp.tile_load(x[i], shape=ROW)
    wp.tile_atomic_add(y[i], t)
    wp.tile_atomic_add(y[i], wp.tile_map(wp.mul, t, t))


@wp.kernel
def tile_of_the_whole_array(x: wp.array2d(dtype=f64), y: wp.array2d(dtype=f64)):
    i = wp.tid()
    t = wp.tile_load(x, shape=(1, ROW), offset=(i, 0))
    wp.tile_store(y, wp.tile_map(wp.mul, t, t), offset=(i, 0))


@wp.kernel
def row_views(x: wp.array2d(dtype=f64), y: wp.array2d(dtype=f64)):
    i, j = wp.tid()
    xr = x[i]
    yr = y[i]
    yr[j] = xr[j] * xr[j]


# -- builtins whose adjoint loses a gradient -------------------------------------------------------


@wp.kernel
def max_pool(x: wp.array2d(dtype=f64), y: wp.array(dtype=f64)):
    i = wp.tid()
    wp.tile_store(y, wp.tile_max(wp.tile_load(x[i], shape=ROW)), offset=i)


@wp.kernel
def cumulative_sum(x: wp.array2d(dtype=float), y: wp.array2d(dtype=float)):
    i = wp.tid()
    wp.tile_store(y[i], wp.tile_scan_inclusive(wp.tile_load(x[i], shape=ROW)))


@wp.kernel
def cholesky_solve(a: wp.array2d(dtype=f64), b: wp.array(dtype=f64), x: wp.array(dtype=f64)):
    L = wp.tile_cholesky(wp.tile_load(a, shape=(4, 4)))
    wp.tile_store(x, wp.tile_cholesky_solve(L, wp.tile_load(b, shape=4)))


@wp.kernel
def upper_solve_of_a_transpose(a: wp.array2d(dtype=f64), b: wp.array(dtype=f64), x: wp.array(dtype=f64)):
    L = wp.tile_load(a, shape=(4, 4))
    wp.tile_store(x, wp.tile_upper_solve(wp.tile_transpose(L), wp.tile_load(b, shape=4)))


@wp.kernel
def transpose_next_to_its_tile(a: wp.array2d(dtype=f64), v: wp.array2d(dtype=f64), y: wp.array2d(dtype=f64)):
    m = wp.tile_load(a, shape=(4, 4))
    t = wp.tile_load(v, shape=(4, 4))
    wp.tile_store(y, wp.tile_matmul(m, t) + wp.tile_matmul(wp.tile_transpose(m), t))


@wp.kernel
def transpose_alone(a: wp.array2d(dtype=f64), v: wp.array2d(dtype=f64), y: wp.array2d(dtype=f64)):
    m = wp.tile_load(a, shape=(4, 4))
    t = wp.tile_load(v, shape=(4, 4))
    wp.tile_store(y, wp.tile_matmul(wp.tile_transpose(m), t))


@wp.kernel
def fractional_part(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    i = wp.tid()
    y[i] = wp.frac(x[i] * f64(3.0))


@wp.kernel
def vector_mod(x: wp.array(dtype=wp.vec3d), y: wp.array(dtype=wp.vec3d)):
    i = wp.tid()
    y[i] = wp.mod(x[i], wp.vec3d(f64(0.4), f64(0.5), f64(0.7)))


@wp.kernel
def mod_by_an_input(x: wp.array(dtype=f64), d: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    i = wp.tid()
    y[i] = wp.mod(x[i], d[i])


@wp.kernel
def rounding_and_comparisons(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    # floor's derivative is zero almost everywhere, and frac here only picks a branch
    i = wp.tid()
    cell = wp.floor(x[i] * f64(4.0))
    if wp.frac(x[i] * f64(4.0)) > f64(0.5):
        y[i] = x[i] * x[i] + cell
    else:
        y[i] = f64(2.0) * x[i] + cell


# -- max and min reductions with ties ----------------------------------------------------------------


@wp.kernel
def segment_max(x: wp.array(dtype=f64), segment: wp.array(dtype=wp.int32), y: wp.array(dtype=f64)):
    i = wp.tid()
    wp.atomic_max(y, segment[i], x[i] * x[i])


@wp.kernel
def segment_min_2d(x: wp.array2d(dtype=f64), segment: wp.array(dtype=wp.int32), y: wp.array2d(dtype=f64)):
    i, j = wp.tid()
    wp.atomic_min(y, segment[i], j, x[i, j] - f64(2.0))


def segment_max_of_squares(x: wp.array(dtype=f64), segment: wp.array(dtype=wp.int32), y: wp.array(dtype=f64)):
    """The same reduction inside a launch function, through an intermediate."""
    squares = wp.zeros_like(x)
    wp.launch(square_into, dim=x.shape, inputs=[x], outputs=[squares])
    wp.launch(max_into, dim=x.shape, inputs=[squares, segment], outputs=[y])


@wp.kernel
def square_into(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    i = wp.tid()
    y[i] = x[i] * x[i]


@wp.kernel
def max_into(x: wp.array(dtype=f64), segment: wp.array(dtype=wp.int32), y: wp.array(dtype=f64)):
    i = wp.tid()
    wp.atomic_max(y, segment[i], x[i])
