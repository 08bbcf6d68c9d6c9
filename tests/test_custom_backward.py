"""Custom backwards (@op.backward / backward=) and warpbridge.testing.check_op."""

import backward_kernels as B
import pytest
import torch
import warp as wp

import warpbridge as wb
from warpbridge.testing import check_op

f64 = torch.float64


def xs(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (0.5 + torch.rand(n, generator=g, dtype=f64)).requires_grad_(True)


def power_op(backward=B.power_adjoint, **kw):
    return wb.op(B.power, backward=backward, **kw)


def test_without_a_backward_the_gradient_is_refused_and_with_one_it_is_right():
    with pytest.raises(wb.WarpBridgeError, match="variable 'acc'"):
        wb.op(B.power)(xs(), 3).sum().backward()
    op = power_op()
    x = xs()
    y = op(x, 3)
    torch.testing.assert_close(y, x.detach() ** 3)
    y.sum().backward()
    torch.testing.assert_close(x.grad, 3 * x.detach() ** 2)
    assert torch.autograd.gradcheck(lambda v: op(v, 3), (xs(),))


def test_decorator_spelling_returns_its_argument():
    op = wb.op(B.power, name="power_decorated")
    got = op.backward(B.power_adjoint)
    assert got is B.power_adjoint
    check_op(op, xs(), 4)


@pytest.mark.parametrize("bwd", [B.power_adjoint, B.power_adjoint_from_output])
def test_check_op_passes_right_backwards(bwd):
    check_op(power_op(bwd), xs(), 3)


def test_check_op_catches_a_wrong_backward_naming_the_input():
    with pytest.raises(AssertionError, match=r"gradient of input 'x' disagrees with finite differences: max error"):
        check_op(power_op(B.power_adjoint_wrong), xs(), 3, opcheck=False)


def test_check_op_catches_a_backward_that_keeps_state_between_calls():
    calls = []

    def drifting_adjoint(
        x: wp.array(dtype=wp.float64),
        n: int,
        y: wp.array(dtype=wp.float64),
        adj_y: wp.array(dtype=wp.float64),
        adj_x: wp.array(dtype=wp.float64),
    ):
        calls.append(n)  # right the first time, off by more with each call after
        wp.launch(B.power_adjoint, dim=x.shape, inputs=[x, n + len(calls) - 1, y, adj_y], outputs=[adj_x])

    op = wb.op(B.power, backward=drifting_adjoint)
    with pytest.raises(
        AssertionError, match=r"three backwards through one graph gave .* for input 'x' \(state survived"
    ):
        check_op(op, xs(), 3, opcheck=False)


def test_check_op_catches_a_gradient_that_depends_on_which_inputs_require_grad():
    def weighted_backward_uneven(
        x: wp.array(dtype=wp.float64),
        w: wp.array(dtype=wp.float64),
        idx: wp.array(dtype=wp.int32),
        s: wp.float64,
        y: wp.array(dtype=wp.float64),
        count: wp.array(dtype=wp.int32),
        adj_y: wp.array(dtype=wp.float64),
        adj_x: wp.array(dtype=wp.float64),
        adj_w: wp.array(dtype=wp.float64),
        *,
        needs_input_grad,
    ):
        # right when both gradients are asked for; x's gradient doubled when w's is not
        scale = s if needs_input_grad[1] else 2.0 * s
        wp.launch(B.weighted_adjoint, dim=x.shape[0], inputs=[x, w, idx, scale, y, count, adj_y],
                  outputs=[adj_x, adj_w if needs_input_grad[1] else wp.zeros_like(adj_w)], device=x.device)  # fmt: skip

    op = wb.op(B.weighted, num_outputs=2, backward=weighted_backward_uneven)
    x, w = xs(5), xs(3, seed=1)
    idx = torch.tensor([0, 2, 1, 2, 0], dtype=torch.int32)
    with pytest.raises(AssertionError, match=r"gradient of input 'x' differentiated alone is .* off its gradient"):
        check_op(op, x, w, idx, 0.5, opcheck=False)


def test_check_op_reports_refusals_unchanged():
    with pytest.raises(wb.WarpBridgeError, match="cannot differentiate"):
        check_op(wb.op(B.power), xs(), 3)


def test_backward_reads_outputs_as_the_forward_left_them_and_keeps_rules():
    op = power_op(B.power_adjoint_from_output)
    x = xs()
    y = op(x, 3)
    v = torch.randn(6, dtype=f64)
    v0 = v.clone()
    x0 = x.detach().clone()
    for _ in range(3):  # reentrant: a retained graph three times gives three times
        y.backward(v, retain_graph=True)
    torch.testing.assert_close(x.grad, 3 * (3 * x0**2 * v0))
    assert torch.equal(v, v0) and torch.equal(x.detach(), x0)
    with torch.no_grad():
        y.mul_(2)  # the saved output changed: PyTorch's version counter catches it (rule 5)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward(v)


def test_several_inputs_integer_arrays_scalars_and_outputs():
    op = wb.op(B.weighted, num_outputs=2, backward=B.weighted_adjoint)
    g = torch.Generator().manual_seed(4)
    x = torch.rand(8, generator=g, dtype=f64, requires_grad=True)
    w = torch.rand(3, generator=g, dtype=f64, requires_grad=True)
    idx = torch.randint(0, 3, (8,), generator=g, dtype=torch.int32)
    y, count = op(x, w, idx, 1.5)
    torch.testing.assert_close(y, 1.5 * x.detach() * w.detach()[idx.long()])
    assert torch.equal(count, idx) and not count.requires_grad
    check_op(op, x, w, idx, 1.5)
    # only one input asks: the other gets no gradient
    w2 = w.detach().requires_grad_(True)
    y, _ = op(x.detach(), w2, idx, 1.5)
    y.sum().backward()
    expected = torch.zeros(3, dtype=f64).index_add_(0, idx.long(), 1.5 * x.detach())
    torch.testing.assert_close(w2.grad, expected)


def test_generic_launch_path(monkeypatch):
    from warpbridge._core import plan as _plan

    monkeypatch.setattr(_plan, "DIRECT_CPU", False)
    check_op(power_op(name="power_generic"), xs(), 3, opcheck=False)


def test_a_kernel_without_adjoint_can_take_a_custom_backward():
    with pytest.raises(wb.WarpBridgeError, match="enable_backward=False"):
        wb.op(B.power_no_adjoint)(xs(), 2).sum().backward()
    op = wb.op(B.power_no_adjoint, backward=B.power_adjoint)
    check_op(op, xs(), 2)


def test_launch_function_backward():
    def power_fn(x: wp.array(dtype=wp.float64), n: int, y: wp.array(dtype=wp.float64)):
        wp.launch(B.power, dim=x.shape, inputs=[x, n], outputs=[y])

    def power_fn_adjoint(
        x: wp.array(dtype=wp.float64),
        n: int,
        y: wp.array(dtype=wp.float64),
        adj_y: wp.array(dtype=wp.float64),
        adj_x: wp.array(dtype=wp.float64),
    ):
        wp.launch(B.power_adjoint, dim=x.shape, inputs=[x, n, y, adj_y], outputs=[adj_x])

    op = wb.op(power_fn)
    with pytest.raises(wb.WarpBridgeError, match="kernel 'power'"):
        op(xs(), 3).sum().backward()  # the tape's kernels are checked too
    check_op(wb.op(power_fn, backward=power_fn_adjoint), xs(), 3)


@pytest.mark.parametrize(
    "bwd, match",
    [
        (B.power_adjoint_bad_name, r"parameter 4 is 'grad_y', expected 'adj_y'"),
        (B.power_adjoint_bad_type, r"'adj_y' is a 1-D float32 array, expected a 1-D float64 array"),
        (B.power, r"it has 3 parameters, expected 5"),
        (B.power_adjoint_writes_input, r"writes to its input array\(s\) \['adj_y'\]"),
        (42, r"must be a wp.Kernel or an annotated launch function, got int"),
    ],
)
def test_bad_backwards_are_refused_when_attached(bwd, match):
    with pytest.raises(wb.WarpBridgeError, match=match) as e:
        power_op(bwd)
    if not isinstance(bwd, int):
        assert "x: array(ndim=1, dtype=float64), n: int32" in str(e.value) or "Expected parameters" in str(e.value)


def test_backward_attached_twice_is_refused():
    op = power_op()
    with pytest.raises(wb.WarpBridgeError, match="already has a backward"):
        op.backward(B.power_adjoint)


def test_torch_func_uses_the_custom_backward():
    op = power_op(name="power_func")
    x = xs()
    g = torch.func.grad(lambda v: op(v, 3).sum())(x.detach())
    torch.testing.assert_close(g, 3 * x.detach() ** 2)
    batch = torch.stack([xs(seed=1), xs(seed=2)]).detach()
    per_sample = torch.func.vmap(torch.func.grad(lambda v: op(v, 2).sum()))(batch)
    torch.testing.assert_close(per_sample, 2 * batch)


@pytest.mark.compile
def test_torch_compile_fullgraph_uses_the_custom_backward():
    op = power_op(name="power_compiled")
    f = torch.compile(lambda v: op(v, 3).sin().sum(), backend="aot_eager", fullgraph=True)
    x = xs()
    f(x).backward()
    ref = xs()
    torch.sin(ref**3).sum().backward()
    torch.testing.assert_close(x.grad, ref.grad)


def test_gradbuffer_receives_custom_backward_gradients():
    op = power_op(name="power_gb")
    p = torch.nn.Parameter(xs().detach())
    gb = wb.GradBuffer([p])
    for _ in range(2):
        op(p, 2).sum().backward()
    torch.testing.assert_close(p.grad, 2 * 2 * p.detach())
    assert p.grad.data_ptr() >= gb.buffer.data_ptr()
    gb.close()


def test_jax_grad_uses_the_custom_backward_and_refuses_without():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        x = jnp.linspace(0.5, 1.5, 6, dtype=jnp.float64)
        op = power_op(name="power_jax")
        g = jax.grad(lambda v: op(v, 3).sum())(x)
        assert jnp.allclose(g, 3 * x**2)
        g = jax.jit(jax.grad(lambda v: jnp.sin(op(v, 2)).sum()))(x)
        assert jnp.allclose(g, jnp.cos(x**2) * 2 * x)
        with pytest.raises(wb.WarpBridgeError, match="variable 'acc'"):
            jax.grad(lambda v: wb.op(B.power)(v, 3).sum())(x)
    finally:
        jax.config.update("jax_enable_x64", before)


def test_paddle_backward_uses_the_custom_backward_and_refuses_without():
    paddle = pytest.importorskip("paddle")
    x = paddle.to_tensor([0.5, 1.0, 1.5], dtype="float64", stop_gradient=False)
    op = power_op(name="power_paddle")
    op(x, 3).sum().backward()
    assert paddle.allclose(x.grad, 3 * x.detach() ** 2).item()
    x2 = paddle.to_tensor([0.5, 1.0, 1.5], dtype="float64", stop_gradient=False)
    # Paddle re-raises errors from a PyLayer's backward as OSError, with our message inside
    with pytest.raises((wb.WarpBridgeError, OSError), match=r"WarpBridgeError: power\(\): cannot differentiate"):
        wb.op(B.power)(x2, 3).sum().backward()


# -- auxiliary outputs, needs_input_grad, output dims from the inputs -----------------------------


def test_aux_outputs_reach_the_backward_and_never_the_caller():
    op = wb.op(B.power_saving_slope, num_outputs=2, aux="slope", backward=B.power_saving_slope_adjoint)
    x = xs()
    y = op(x, 3)  # one array: the auxiliary slope is not returned
    assert isinstance(y, torch.Tensor)
    torch.testing.assert_close(y, x.detach() ** 3)
    y_all, slope = op.call_all(x, 3)
    torch.testing.assert_close(slope, 3 * x.detach() ** 2)
    assert not slope.requires_grad  # auxiliary outputs are never differentiated
    check_op(op, xs(), 3)
    assert "aux" in repr(op._options)


def test_a_backward_may_not_ask_for_the_gradient_of_an_aux_output():
    with pytest.raises(wb.WarpBridgeError, match=r"'slope' is auxiliary.*no adj_slope"):
        wb.op(B.power_saving_slope, num_outputs=2, aux=("slope",), backward=B.power_saving_slope_adjoint_asks_aux)


@pytest.mark.parametrize(
    "aux, pattern",
    [(("nope",), r"aux names \['nope'\], which are not outputs"), (("y", "slope"), "every output is auxiliary")],
)
def test_bad_aux_names_are_refused(aux, pattern):
    with pytest.raises(wb.WarpBridgeError, match=pattern):
        wb.op(B.power_saving_slope, num_outputs=2, aux=aux)


def test_a_launch_function_backward_gets_the_gradients_asked_for():
    op = wb.op(B.weighted, num_outputs=2, backward=B.weighted_backward_skipping)
    g = torch.Generator().manual_seed(3)
    x, w = torch.rand(5, generator=g, dtype=f64), torch.rand(3, generator=g, dtype=f64)
    idx = torch.tensor([0, 2, 1, 2, 0], dtype=torch.int32)
    B.SEEN.clear()
    wr = w.clone().requires_grad_()
    (gw,) = torch.autograd.grad(op(x, wr, idx, 0.5)[0].sum(), [wr])
    assert B.SEEN == [(False, True)]
    torch.testing.assert_close(gw, torch.zeros(3, dtype=f64).index_add_(0, idx.long(), 0.5 * x))
    check_op(op, x.requires_grad_(), w.requires_grad_(), idx, 0.5)


def test_output_dims_may_be_computed_from_the_inputs():
    op = wb.op(B.outer, launch_dims=None, output_dims=lambda a, b: (a[0], b[0]), name="outer_from_inputs")
    a, b = xs(4), xs(3, seed=1)
    y = op(a, b, launch_dims=(4, 3))
    torch.testing.assert_close(y, torch.outer(a, b))
    # the registered op needs no dims either
    torch.testing.assert_close(op.torch_op(a, b, [4, 3]), y)
    check_op(op, xs(4), xs(3, seed=1), launch_dims=(4, 3))


def test_a_failing_output_dims_callable_is_named():
    op = wb.op(B.outer, output_dims=lambda a, b: a[5], name="outer_bad_dims")
    with pytest.raises(wb.WarpBridgeError, match=r"outer_bad_dims\(\): output_dims\(a, b\) raised IndexError"):
        op(xs(4), xs(3), launch_dims=(4, 3))


# -- generic kernels -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, dtype",
    [
        (lambda g, dt: torch.rand(5, generator=g, dtype=dt), torch.float32),
        (lambda g, dt: torch.rand(5, generator=g, dtype=dt), torch.float64),
        (lambda g, dt: torch.rand(5, 3, generator=g, dtype=dt), torch.float64),  # bound to vec3d
        (lambda g, dt: torch.rand(4, 2, 2, generator=g, dtype=dt), torch.float64),  # bound to mat22d
    ],
    ids=["float32", "float64", "vec3d", "mat22d"],
)
def test_a_generic_kernel_runs_with_the_calls_dtypes(make, dtype):
    op = wb.op(B.generic_scale)
    x = make(torch.Generator().manual_seed(5), dtype).requires_grad_()
    y = op(x, 0.5)
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y, 0.5 * x.detach())
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 0.5))
    inst = op.instance(x, 0.5)
    assert inst is op.instance(x, 0.5) and inst is not op and not inst.generic
    if dtype == torch.float64:
        check_op(op, x.detach().clone().requires_grad_(), 0.5)


def test_a_generic_kernel_is_checked_like_any_and_takes_a_generic_backward():
    x = xs()
    with pytest.raises(wb.WarpBridgeError, match="cannot differentiate"):
        wb.op(B.generic_cube)(x).sum().backward()
    op = wb.op(B.generic_cube, backward=B.generic_cube_adjoint)
    check_op(op, xs())
    y = op(xs().float())
    torch.testing.assert_close(y, xs().float().detach() ** 3)


def test_a_generic_kernel_refuses_what_it_cannot_bind():
    op = wb.op(B.generic_scale)
    with pytest.raises(wb.WarpBridgeError, match="3 trailing dims"):
        op(torch.rand(2, 2, 2, 2, dtype=f64), 1.0)
    with pytest.raises(wb.WarpBridgeError, match=r"op.instance\(\*args\).torch_op"):
        _ = op.torch_op
    torch.library.opcheck(op.instance(xs(), 2.0).torch_op, (xs(), 2.0))


# -- wp.struct arguments ------------------------------------------------------------------------------


def _affine(scale, shift):
    a = B.Affine()
    a.scale, a.shift = scale, shift
    return a


@pytest.mark.parametrize("direct", [True, False], ids=["direct CPU call", "wp.launch (the CUDA path)"])
def test_a_struct_argument_reaches_the_kernel_and_its_adjoint(direct, monkeypatch):
    from warpbridge._core import plan as _plan

    monkeypatch.setattr(_plan, "DIRECT_CPU", direct)
    op = wb.op(B.affine)
    x = xs()
    y = op(x, _affine(2.0, 0.5))
    torch.testing.assert_close(y, 2.0 * x.detach() ** 2 + 0.5)
    y.sum().backward()
    torch.testing.assert_close(x.grad, 4.0 * x.detach())
    check_op(op, xs(), _affine(-1.5, 3.0), opcheck=False)  # no custom op: see below


def test_struct_arguments_are_checked_and_stay_out_of_torch_compile():
    op = wb.op(B.affine)
    with pytest.raises(wb.WarpBridgeError, match=r"argument 'params' must be a wp\.struct Affine instance, got float"):
        op(xs(), 2.0)
    with pytest.raises(wb.WarpBridgeError, match="cannot cross torch.compile's custom-op boundary"):
        _ = op.torch_op


# -- wp.indexedarray inputs ------------------------------------------------------------------------


@pytest.mark.parametrize("direct", [True, False], ids=["direct CPU call", "wp.launch (the CUDA path)"])
def test_an_indexedarray_input_takes_values_and_indices_with_their_gradient(direct, monkeypatch):
    from warpbridge._core import plan as _plan

    monkeypatch.setattr(_plan, "DIRECT_CPU", direct)
    with pytest.raises(
        wb.WarpBridgeError, match=r"cannot differentiate with respect to wp.indexedarray input\(s\) \['x'\]"
    ):
        wb.op(B.indexed_square)((xs(6), torch.tensor([1], dtype=torch.int32))).sum().backward()
    op = wb.op(B.indexed_square, backward=B.indexed_square_adjoint)
    values = xs(6)
    idx = torch.tensor([5, 0, 2, 2], dtype=torch.int32)
    y = op((values, idx))
    torch.testing.assert_close(y, values.detach()[idx.long()] ** 2)
    y.sum().backward()  # the repeated index 2 gets both contributions
    expect = torch.zeros(6, dtype=f64).index_add_(0, idx.long(), 2 * values.detach()[idx.long()])
    torch.testing.assert_close(values.grad, expect)
    torch.testing.assert_close(op(values.detach()), values.detach() ** 2)  # a plain array: no indices
    check_op(op, xs(6))


def test_indexedarray_arguments_are_checked():
    op = wb.op(B.indexed_square)
    with pytest.raises(wb.WarpBridgeError, match=r"index 1 of argument 'x' must be a 1-D integer array, got float64"):
        op((xs(6), xs(2)))
    with pytest.raises(wb.WarpBridgeError, match=r"at most 1 index array\(s\).*got a tuple of 3"):
        op((xs(6), torch.tensor([0]), torch.tensor([0])))


def test_an_array_of_structs_runs_as_a_wp_array_and_is_refused_from_a_framework():
    import numpy as np

    op = wb.op(B.sum_of_affines)
    items = wp.array([_affine(1.0, 2.0), _affine(3.0, -1.0), _affine(0.5, 0.25)], dtype=B.Affine)
    y = op(items)
    assert isinstance(y, wp.array)
    np.testing.assert_array_equal(y.numpy(), [3.0, 2.0, 0.75])
    with pytest.raises(wb.WarpBridgeError, match=r"'items' must be a wp.array of wp.struct Affine .*got float64"):
        op(torch.zeros(3, dtype=f64))
