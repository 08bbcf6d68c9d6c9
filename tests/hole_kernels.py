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
