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
