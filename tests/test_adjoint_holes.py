"""Where Warp's own adjoint is silently wrong (plain ``wp.Tape`` gives the same wrong number),
warpbridge gives the right gradient or refuses with an error naming the fix: one test per
construct that used to pass through unnoticed."""

import hole_kernels as H
import pytest
import torch
import warp as wp

import warpbridge as wb

f64 = torch.float64


def test_a_struct_holding_an_array_that_requires_grad_is_refused_with_the_recipe():
    a = torch.rand(5, dtype=f64, requires_grad=True)
    b = torch.rand(5, dtype=f64)
    op = wb.op(H.pair_product, launch_dims=(5,), output_dims=(5,))
    p = H.Pair()
    p.a, p.b = wp.from_torch(a), wp.from_torch(b)
    with pytest.raises(
        wb.WarpBridgeError,
        match=r"pair_product\(\): argument 'p': field 'a' of a wp\.struct Pair holds an array that requires grad.*"
        r"launch function that builds the struct inside",
    ):
        op(p)
    p.a = wp.from_torch(a.detach())  # no gradient wanted: a constant, as before
    torch.testing.assert_close(op(p), a.detach() * b)
    recipe = wb.op(H.pair_product_of)
    a.grad = None
    recipe(a, b).sum().backward()
    torch.testing.assert_close(a.grad, b)


def test_a_tile_read_back_from_an_output_and_stored_again_is_refused():
    x = torch.rand(2, H.ROW, dtype=f64, requires_grad=True)
    y = wb.op(H.tile_read_modify_write, launch_dims=(2,), output_dims=(2, H.ROW))(x)
    torch.testing.assert_close(y, x.detach() ** 2)  # the forward is fine
    with pytest.raises(
        wb.WarpBridgeError,
        match=r"(?s)tile_read_modify_write\(\): cannot differentiate.*hole_kernels\.py:\d+: variable 'y' is an output "
        r"element read, then overwritten",
    ):
        y.sum().backward()


TILE_AND_VIEW_KERNELS = [  # (kernel, launch dims, y as a function of x)
    (H.tile_stored_twice, (2,), lambda x: x * x),
    (H.tile_added_twice, (2,), lambda x: x + x * x),
    (H.tile_of_the_whole_array, (2,), lambda x: x * x),
    (H.row_views, (2, H.ROW), lambda x: x * x),
]


@pytest.mark.parametrize(("kernel", "dims", "reference"), TILE_AND_VIEW_KERNELS, ids=lambda v: getattr(v, "key", ""))
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_tiles_and_views_made_in_a_kernel_carry_gradients_and_leave_the_incoming_one_alone(
    kernel, dims, reference, layout
):
    """A view's or a tile's adjoint finds the gradient at the array's own layout: with the
    input transposed, with an incoming gradient that is not contiguous, and without touching
    that gradient (a tile store's adjoint zeroes what it consumed)."""
    base = torch.rand(H.ROW, 2, dtype=f64) if layout == "transposed" else torch.rand(2, H.ROW, dtype=f64)
    leaf = base.clone().requires_grad_()
    x = leaf.T if layout == "transposed" else leaf
    y = wb.op(kernel, launch_dims=dims, output_dims=(2, H.ROW))(x)
    torch.testing.assert_close(y, reference(x.detach()))
    g = torch.rand(H.ROW, 2, dtype=f64).T  # a transposed view
    g_before = g.clone()
    (got,) = torch.autograd.grad(y, leaf, g)
    ref_leaf = base.clone().requires_grad_()
    (want,) = torch.autograd.grad(reference(ref_leaf.T if layout == "transposed" else ref_leaf), ref_leaf, g)
    torch.testing.assert_close(got, want)
    assert torch.equal(g, g_before)
