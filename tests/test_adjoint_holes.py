"""Where Warp's own adjoint is silently wrong (plain ``wp.Tape`` gives the same wrong number),
warpbridge gives the right gradient or refuses with an error naming the fix: one test per
construct that used to pass through unnoticed."""

import hole_kernels as H
import numpy as np
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


REFUSED = [  # (kernel, make inputs, launch dims, output dims, what the refusal names)
    (H.max_pool, lambda: [torch.rand(3, H.ROW, dtype=f64)], (3,), (3,), r"wp\.tile_max\(\), whose adjoint .* 'a'"),
    (H.cumulative_sum, lambda: [torch.rand(3, H.ROW)], (3,), (3, H.ROW), r"wp\.tile_scan_inclusive\(\)"),
    (H.cholesky_solve, lambda: [torch.eye(4, dtype=f64) * 3 + 0.1, torch.rand(4, dtype=f64)], (1,), (4,),
     r"wp\.tile_cholesky_solve\(\), whose adjoint .* argument 'L'"),
    (H.upper_solve_of_a_transpose, lambda: [torch.eye(4, dtype=f64) * 3, torch.rand(4, dtype=f64)], (1,), (4,),
     r"wp\.tile_upper_solve\(\)"),
    (H.transpose_next_to_its_tile, lambda: [torch.rand(4, 4, dtype=f64), torch.rand(4, 4, dtype=f64)], (1,), (4, 4),
     r"wp\.tile_transpose\(\) of tile 'm', which the function uses elsewhere too"),
    (H.fractional_part, lambda: [torch.rand(5, dtype=f64)], None, None, r"wp\.frac\(\), whose adjoint .* 'x'"),
    (H.vector_mod, lambda: [torch.rand(5, 3, dtype=f64)], None, None, r"wp\.mod\(\), whose adjoint .* 'a'"),
    (H.mod_by_an_input, lambda: [torch.rand(5, dtype=f64) + 1, torch.rand(5, dtype=f64) * 0.5 + 0.2], None, None,
     r"wp\.mod\(\), whose adjoint in Warp loses the gradient of its argument 'b' \(it adds nothing for it\)"),
]  # fmt: skip


@pytest.mark.parametrize(("kernel", "make", "dims", "out_dims", "names"), REFUSED, ids=lambda v: getattr(v, "key", ""))
def test_a_builtin_whose_adjoint_loses_the_gradient_is_refused_naming_it(kernel, make, dims, out_dims, names):
    inputs = [t.requires_grad_() for t in make()]
    y = wb.op(kernel, launch_dims=dims, output_dims=out_dims)(*inputs)
    with pytest.raises(wb.WarpBridgeError, match=rf"(?s)cannot differentiate.*hole_kernels\.py:\d+: {names}.*"
                       r"@op\.backward.*@wp\.func_grad.*trust_adjoint"):  # fmt: skip
        y.sum().backward()


def test_the_max_pool_is_refused_from_jax_too():
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    op = wb.op(H.max_pool, launch_dims=(3,), output_dims=(3,))
    x = jnp.asarray(torch.rand(3, H.ROW, dtype=f64).numpy())
    assert float(jnp.abs(op(x) - x.max(axis=1)).max()) == 0.0
    with pytest.raises(wb.WarpBridgeError, match=r"wp\.tile_max\(\)"):
        jax.grad(lambda a: op(a).sum())(x)


def test_a_transpose_that_is_its_tiles_only_use_passes_and_is_right():
    a, v = (torch.rand(4, 4, dtype=f64, requires_grad=True) for _ in range(2))
    y = wb.op(H.transpose_alone, launch_dims=(1,), output_dims=(4, 4))(a, v)
    g = torch.rand(4, 4, dtype=f64)
    ga, gv = torch.autograd.grad(y, (a, v), g)
    torch.testing.assert_close(ga, v.detach() @ g.T)
    torch.testing.assert_close(gv, a.detach() @ g)


def test_rounding_and_a_builtin_that_only_picks_a_branch_are_not_refused():
    x = torch.tensor([0.05, 0.2, 0.4, 0.7, 0.95], dtype=f64, requires_grad=True)
    y = wb.op(H.rounding_and_comparisons)(x)
    y.sum().backward()
    upper = (x.detach() * 4) % 1 > 0.5
    torch.testing.assert_close(x.grad, torch.where(upper, 2 * x.detach(), torch.full_like(x, 2.0)))


def test_a_call_is_refused_only_when_the_lost_gradient_is_asked_for():
    # mod drops the divisor's gradient: a divisor that needs none passes, with the right gradient
    x = torch.rand(5, dtype=f64, requires_grad=True)
    y = wb.op(H.mod_by_an_input)(x, torch.full((5,), 0.3, dtype=f64))
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones_like(x))
    d = torch.full((5,), 0.3, dtype=f64, requires_grad=True)
    with pytest.raises(wb.WarpBridgeError, match=r"wp\.mod\(\), whose adjoint .* argument 'b'"):
        wb.op(H.mod_by_an_input)(x, d).sum().backward()


def torch_segment_amax(values, segment, n, floor):
    """torch.amax per segment (ties share the gradient evenly), with the output's initial value
    (0 for max, as warpbridge's outputs start zeroed) as one more candidate."""
    out = []
    for s in range(n):
        members = values[segment == s]
        out.append(torch.amax(torch.cat([members, floor.reshape(1)]), dim=0))
    return torch.stack(out)


def test_ties_of_a_max_reduction_share_its_gradient_evenly():
    # ReLU-like ties: several elements of a segment reach the same maximum
    x = torch.tensor([1.0, -1.0, 0.5, 2.0, -2.0, 2.0, 0.3], dtype=f64, requires_grad=True)
    segment = torch.tensor([0, 0, 0, 1, 1, 1, 2], dtype=torch.int32)
    y = wb.op(H.segment_max, output_dims=(3,))(x, segment)
    g = torch.tensor([1.0, 3.0, 5.0], dtype=f64)
    (got,) = torch.autograd.grad(y, x, g)
    ref = x.detach().clone().requires_grad_()
    want_y = torch_segment_amax(ref * ref, segment.long(), 3, torch.zeros((), dtype=f64))
    (want,) = torch.autograd.grad(want_y, ref, g)
    torch.testing.assert_close(y.detach(), want_y.detach())
    torch.testing.assert_close(got, want)
    assert got.tolist()[:2] == [1.0, -1.0]  # 2·x·(1/2): the tie at 1 in segment 0 is split, sign kept
    for s in range(3):
        assert float((got / (2 * x.detach()))[segment == s].sum()) == pytest.approx(g[s].item())


def test_ties_of_a_2d_min_reduction_share_its_gradient_and_jax_agrees():
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    base = torch.tensor([[0.0, 1.0], [0.0, 3.0], [1.0, 1.0]], dtype=f64)
    segment = torch.tensor([0, 0, 0], dtype=torch.int32)
    op = wb.op(H.segment_min_2d, output_dims=(1, 2))
    x = base.clone().requires_grad_()
    op(x, segment).sum().backward()
    want = torch.tensor([[0.5, 0.5], [0.5, 0.0], [0.0, 0.5]], dtype=f64)  # min 0 - 2 tied twice, 1 - 2 twice
    torch.testing.assert_close(x.grad, want)
    jax_grad = jax.grad(lambda a: op(a, jnp.asarray(segment.numpy())).sum())(jnp.asarray(base.numpy()))
    np.testing.assert_array_equal(np.asarray(jax_grad), want.numpy())


def test_a_max_reduction_inside_a_launch_function_is_refused():
    x = torch.tensor([1.0, -1.0, 0.5], dtype=f64, requires_grad=True)
    y = wb.op(H.segment_max_of_squares, output_dims=(1,))(x, torch.zeros(3, dtype=torch.int32))
    torch.testing.assert_close(y, torch.ones(1, dtype=f64))
    with pytest.raises(wb.WarpBridgeError, match=r"wp\.atomic_max\(\) into 'y': Warp's adjoint gives every value"):
        y.sum().backward()
