"""Rule 7: every gradient is right, or refused with a WarpBridgeError before any adjoint runs."""

import adjoint_kernels as A
import numpy as np
import pytest
import torch
import warp as wp

import warpbridge as wb

f64 = torch.float64


def x64(n=5, lo=0.5, hi=1.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (lo + (hi - lo) * torch.rand(n, generator=g, dtype=f64)).requires_grad_(True)


def fd_jacobian(fn, x, eps=1e-6):
    """Dense central finite differences of sum(fn(x)) (float64)."""
    x = x.detach().clone()
    g = torch.zeros_like(x)
    for i in range(x.numel()):
        xp, xm = x.clone(), x.clone()
        xp.view(-1)[i] += eps
        xm.view(-1)[i] -= eps
        g.view(-1)[i] = (fn(xp).sum() - fn(xm).sum()) / (2 * eps)
    return g


@pytest.mark.parametrize(
    "kernel, line_of",
    [
        (A.pow_while, "while k < n:"),
        (A.pow_runtime_range, "for _k in range(n):"),
        (A.counter_used_after, "while c < n:"),
        (A.pow_long_constant, "for _k in range(LONG):"),
        (A.static_trip_count, "for _k in range(wp.static(20)):"),
    ],
)
def test_dynamic_loop_refused_with_location_and_fixes(kernel, line_of):
    op = wb.op(kernel)
    x = x64()
    args = (x, 4) if kernel.adj.args[1].label == "n" else (x,)
    y = op(*args)  # the forward always runs
    assert torch.isfinite(y).all()
    with pytest.raises(wb.WarpBridgeError) as e:
        y.sum().backward()
    msg = str(e.value)
    with open(A.__file__) as fh:
        lines = fh.read().splitlines()
    lineno = next(i + 1 for i, s in enumerate(lines) if s.strip() == line_of)
    assert f"{op.name}()" in msg and f"kernel '{kernel.key}'" in msg
    assert f"adjoint_kernels.py:{lineno}" in msg
    assert "@op.backward" in msg and "max_unroll" in msg and "func_grad" in msg and "trust_adjoint=True" in msg
    assert x.grad is None


def test_refused_variable_is_named():
    op = wb.op(A.counter_used_after)
    with pytest.raises(wb.WarpBridgeError, match="variable 'c'"):
        op(x64(), 3).sum().backward()
    op = wb.op(A.pow_while)
    with pytest.raises(wb.WarpBridgeError, match="variable 'acc'"):
        op(x64(), 3).sum().backward()


@pytest.mark.parametrize("kernel", [A.counter_inside_only, A.sum_into_output])
def test_dynamic_loops_warp_gets_right_are_not_refused(kernel):
    op = wb.op(kernel)
    assert torch.autograd.gradcheck(lambda x: op(x, 4), (x64(),))


@pytest.mark.parametrize("kernel", [A.pow_unrolled, A.iterate_16])
def test_unrolled_loops_are_not_refused(kernel):
    op = wb.op(kernel)
    assert torch.autograd.gradcheck(op, (x64(),))


def test_loop_inside_a_func_is_found_and_func_grad_clears_it():
    with pytest.raises(wb.WarpBridgeError, match="kernel 'pow_func'"):
        wb.op(A.loop_in_func)(x64(), 3).sum().backward()
    op = wb.op(A.loop_in_graded_func)
    assert torch.autograd.gradcheck(lambda x: op(x, 3), (x64(),))


@pytest.mark.parametrize("kernel", [A.pow_runtime_range, A.pow_while, A.counter_used_after])
def test_refused_gradient_is_really_wrong_and_trust_adjoint_opts_out(kernel):
    # What the refusal protects against: with the check off, Warp's adjoint is wrong.
    op = wb.op(kernel, trust_adjoint=True)
    assert not torch.autograd.gradcheck(lambda x: op(x, 3), (x64(),), raise_exception=False)
    with pytest.raises(wb.WarpBridgeError, match="trust_adjoint must be a bool"):
        wb.op(A.pow_runtime_range, trust_adjoint="yes")


def test_no_grad_forward_and_autograd_grad_of_other_inputs_are_unaffected():
    op = wb.op(A.pow_while)
    x = x64()
    with torch.no_grad():
        torch.testing.assert_close(op(x, 3), x.detach() ** 3)
    torch.testing.assert_close(op(x.detach(), 2), x.detach() ** 2)


def test_hash_grid_query_loop_in_a_launch_function_is_refused():
    op = _grid_op(A.radius_sum)
    g = torch.Generator().manual_seed(1)
    q = torch.rand(16, 3, generator=g, dtype=f64)
    r = torch.rand(40, 3, generator=g, dtype=f64)
    f = torch.rand(40, generator=g, dtype=f64, requires_grad=True)
    out = op(q, r, f, 0.4)
    d = torch.cdist(q, r)
    w = torch.where(d <= 0.4, torch.exp(-d), torch.zeros_like(d))
    ref_out = torch.where(w.sum(1) > 0, (w * f).sum(1) / w.sum(1), torch.zeros(16, dtype=f64))
    torch.testing.assert_close(out, ref_out)
    with pytest.raises(wb.WarpBridgeError, match=r"kernel 'radius_sum'.*variable '(w_sum|acc)'"):
        out.sum().backward()
    assert f.grad is None


def test_func_that_writes_an_input_is_refused_at_construction():
    with pytest.raises(wb.WarpBridgeError, match=r"writes to its input array\(s\) \['x'\].*@wp.func"):
        wb.op(A.writes_input_in_func)


@pytest.mark.parametrize("kernel, formula", [(A.atomic_max_out, "max"), (A.atomic_min_out, "min")])
def test_atomic_min_max_on_an_output_is_right(kernel, formula):
    op = wb.op(kernel, output_dims=(1,))
    x = torch.tensor([0.3, -1.7, 1.2, 0.4], dtype=f64, requires_grad=True)
    y = op(x)
    expected = (x.detach() ** 2).max() if formula == "max" else (x.detach() - 10).min()
    # outputs start at zero: max(0, ...) and min(0, ...)
    expected = torch.clamp(expected, min=0) if formula == "max" else torch.clamp(expected, max=0)
    torch.testing.assert_close(y, expected.reshape(1))
    y.sum().backward()
    torch.testing.assert_close(x.grad, fd_jacobian(lambda v: op(v), x))


def test_read_then_overwritten_output_is_refused():
    op = wb.op(A.mul_in_place)
    with pytest.raises(wb.WarpBridgeError, match="variable 'y' is an output element read, then overwritten"):
        op(x64()).sum().backward()


@pytest.mark.parametrize("kernel, nout", [(A.store_then_read, 2), (A.component_update, 1)])
def test_outputs_the_adjoint_reads_get_the_forward_values(kernel, nout):
    op = wb.op(kernel, num_outputs=nout)
    assert torch.autograd.gradcheck(op, (x64(),))
    x = x64()
    outs = op(x)
    last = outs[-1] if nout > 1 else outs
    last.sum().backward()

    def f(v):
        o = op(v)
        return o[-1] if nout > 1 else o

    torch.testing.assert_close(x.grad, fd_jacobian(f, x))


def test_generic_launch_path_also_checks(monkeypatch):
    from warpbridge._core import plan as _plan

    monkeypatch.setattr(_plan, "DIRECT_CPU", False)
    op = wb.op(A.store_then_read, num_outputs=2)
    assert torch.autograd.gradcheck(op, (x64(),))
    op = wb.op(A.component_update)
    assert torch.autograd.gradcheck(op, (x64(),))
    op = wb.op(A.atomic_max_out, output_dims=(1,))
    x = x64()
    op(x).sum().backward()
    assert torch.count_nonzero(x.grad) == 1


def test_accumulators_only_added_to_are_not_refused():
    op = wb.op(A.matmul, launch_dims=None, output_dims=None)
    g = torch.Generator().manual_seed(2)
    a = torch.rand(3, 4, generator=g, dtype=f64, requires_grad=True)
    b = torch.rand(4, 2, generator=g, dtype=f64, requires_grad=True)

    def f(a, b):
        return op(a, b, launch_dims=(3, 2))

    torch.testing.assert_close(f(a, b), 2 * a @ b)
    assert torch.autograd.gradcheck(f, (a, b))


def _grid_op(kernel):
    def fn(
        query: wp.array(dtype=wp.vec3d),
        ref: wp.array(dtype=wp.vec3d),
        feat: wp.array(dtype=wp.float64),
        radius: float,
        out: wp.array(dtype=wp.float64),
    ):
        pts = wp.array(ref.numpy().astype(np.float32), dtype=wp.vec3, device=ref.device)
        grid = wp.HashGrid(8, 8, 8, device=ref.device)
        grid.build(pts, radius)
        wp.launch(kernel, dim=query.shape[0], inputs=[query, ref, feat, grid.id, radius], outputs=[out])

    fn.__name__ = f"{kernel.key}_fn"
    return wb.op(fn)


def test_hash_grid_neighbour_sum_is_right():
    op = _grid_op(A.neighbour_sum)
    g = torch.Generator().manual_seed(3)
    q = torch.rand(12, 3, generator=g, dtype=f64, requires_grad=True)
    r = torch.rand(30, 3, generator=g, dtype=f64, requires_grad=True)
    f = torch.rand(30, generator=g, dtype=f64, requires_grad=True)
    d = torch.cdist(q, r)
    expected = (torch.where(d <= 0.45, torch.exp(-d), torch.zeros_like(d)) * f).sum(1)
    torch.testing.assert_close(op(q, r, f, 0.45), expected)
    assert torch.autograd.gradcheck(lambda q, r, f: op(q, r, f, 0.45), (q, r, f))


def test_second_order_is_refused_not_silently_cut():
    import kernels as K

    op = wb.op(K.mul64)
    x, y = x64(), x64(seed=1)
    (g,) = torch.autograd.grad(op(x, y).sum(), x)  # first order: fine
    torch.testing.assert_close(g, torch.cos(x.detach()) * y.detach())
    with pytest.raises(wb.WarpBridgeError, match=r"mul64\(\): second-order gradients are not supported"):
        torch.autograd.grad(op(x, y).sum(), x, create_graph=True)
    with pytest.raises(wb.WarpBridgeError, match="second-order"):
        op(x, y).sum().backward(create_graph=True)
    with pytest.raises(wb.WarpBridgeError, match="second-order"):  # the registered op (torch.compile's path)
        torch.autograd.grad(op.torch_op(x, y).sum(), x, create_graph=True)
    custom = wb.op(A.pow_runtime_range, backward=A.pow_runtime_range_adjoint)
    with pytest.raises(wb.WarpBridgeError, match="second-order"):
        torch.autograd.grad(custom(x, 3).sum(), x, create_graph=True)
    q = torch.rand(20, 3, dtype=f64, requires_grad=True)
    r = torch.rand(30, 3, dtype=f64)
    f = torch.rand(30, 2, dtype=f64)
    for out in (
        wb.ops.radius_aggregate(q, r, f, 0.5, 0.2),
        wb.ops.knn(q, r, 3)[0],
        wb.ops.knn_aggregate(q, r, f, 3, 0.2),
    ):
        with pytest.raises(wb.WarpBridgeError, match="second-order"):
            torch.autograd.grad(out.sum(), q, create_graph=True)
