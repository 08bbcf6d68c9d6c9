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
