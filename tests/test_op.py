"""warpbridge.op on PyTorch: values, gradients and the gradient rules (DESIGN.md)."""

import kernels as K
import pytest
import torch
import warp as wp

import warpbridge as wb

torch.manual_seed(0)
f64 = torch.float64


def rand(*shape, grad=True):
    return torch.randn(*shape, dtype=f64, requires_grad=grad)


# -- values and API -------------------------------------------------------------------------


def test_forward_matches_formula_and_decorator_forms():
    op1 = wb.op(K.square)
    x = torch.arange(5.0)
    torch.testing.assert_close(op1(x), x * x)

    @wb.op(num_outputs=1, name="square_again")
    @wp.kernel
    def square_again(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        i = wp.tid()
        y[i] = x[i] * x[i]

    torch.testing.assert_close(square_again(x), x * x)
    assert isinstance(square_again, wb.WarpOp)
    assert square_again.torch_op is torch.ops.warpbridge.square_again


def test_multiple_outputs_return_a_tuple_with_vec_mat_dims():
    op = wb.op(K.vec_mat, num_outputs=2)
    v, m = rand(6, 3, grad=False), rand(6, 3, 3, grad=False)
    out_v, out_n = op(v, m, 0.5)
    w = torch.einsum("nij,nj->ni", m, v)
    torch.testing.assert_close(out_v, 0.5 * w)
    torch.testing.assert_close(out_n, (w * v).sum(-1))
    assert out_v.shape == (6, 3) and out_n.shape == (6,)


def test_scalars_of_every_kind():
    op = wb.op(K.scale_shift)
    x = rand(4, grad=False)
    torch.testing.assert_close(op(x, 2.0, 3, False), x * 2 + 3)
    torch.testing.assert_close(op(x, 2, 3, True), -(x * 2 + 3))


def test_launch_dims_and_output_dims_at_construction_and_per_call():
    a, b = rand(3, grad=False), rand(4, grad=False)
    op = wb.op(K.outer, launch_dims=(3, 4))
    torch.testing.assert_close(op(a, b), a[:, None] * b.exp()[None, :])
    # per call overrides construction; output_dims as a dict keyed by output name
    op2 = wb.op(K.outer, name="outer_dict")
    c = op2(a, b, launch_dims=(2, 4), output_dims={"c": (3, 4)})
    assert c.shape == (3, 4)
    torch.testing.assert_close(c[:2], a[:2, None] * b.exp()[None, :])
    assert (c[2] == 0).all()  # outputs are zero-initialised


def test_outputs_live_on_the_inputs_device_with_the_kernels_dtype():
    y = wb.op(K.square)(torch.ones(3))
    assert y.device == torch.device("cpu") and y.dtype == torch.float32


# -- 3.1 gradients match, gradcheck in float64 ---------------------------------------------


def test_gradcheck_scalar_arrays_several_inputs():
    op = wb.op(K.mul64)
    assert torch.autograd.gradcheck(op, (rand(7), rand(7)))


def test_gradcheck_vector_and_matrix_arrays_several_outputs():
    op = wb.op(K.vec_mat, num_outputs=2)
    assert torch.autograd.gradcheck(lambda v, m: op(v, m, 1.7), (rand(5, 3), rand(5, 3, 3)))


def test_gradcheck_partial_output_gradients():
    op = wb.op(K.vec_mat, num_outputs=2)
    v, m = rand(4, 3), rand(4, 3, 3)
    assert torch.autograd.gradcheck(lambda v, m: op(v, m, 0.3)[1], (v, m))
    # the analytic gradient of out_n = v^T M v is (M + M^T) v
    op(v, m, 0.3)[1].sum().backward()
    torch.testing.assert_close(v.grad, torch.einsum("nij,nj->ni", m + m.transpose(1, 2), v.detach()))


def test_gradcheck_custom_launch_dims():
    op = wb.op(K.outer, launch_dims=(3, 5))
    assert torch.autograd.gradcheck(op, (rand(3), rand(5)))


def test_analytic_gradient_of_rosenbrock():
    op = wb.op(K.eval_rosenbrock)
    xy = torch.randn(50, 2, requires_grad=True)
    op(xy).sum().backward()
    x, y = xy.detach()[:, 0], xy.detach()[:, 1]
    expected = torch.stack([-2 * (1 - x) - 400 * x * (y - x * x), 200 * (y - x * x)], dim=1)
    torch.testing.assert_close(xy.grad, expected, rtol=1e-4, atol=1e-3)


def test_gradcheck_multi_kernel_function():
    op = wb.op(K.exp_times)
    assert op.sig.kind == "function"
    x, k = rand(6), rand(6)
    torch.testing.assert_close(op(x, k), x.exp() * k)
    assert torch.autograd.gradcheck(op, (x, k))


def test_a_launch_function_gets_views_of_each_calls_own_buffers():
    """The forward's array views are kept per plan by position and pointer
    (``_functions._function_args``): every call still reads its own inputs and writes its own
    outputs, and the kept views stay bounded."""
    from warpbridge._core import launch_function as _functions

    op = wb.op(K.exp_times)
    k = torch.randn(6, dtype=f64)
    xs = [torch.randn(6, dtype=f64) for _ in range(_functions.MAX_VIEWS + 20)]
    outs = [op(x, k) for x in xs + xs[:3]]  # all alive at once: every output a new buffer
    for x, out in zip(xs + xs[:3], outs):
        torch.testing.assert_close(out, x.exp() * k)
    kept = [len(plan.cache["views"]) for plan in op._plans.values() if "views" in plan.cache]
    assert kept and all(0 < n <= _functions.MAX_VIEWS + 3 for n in kept)


# -- 3.2 the forward never touches .grad ----------------------------------------------------


def test_forward_does_not_allocate_or_touch_grad():
    op = wb.op(K.mul64)
    x, y = rand(8), rand(8)
    op(x, y)
    assert x.grad is None and y.grad is None
    x.grad = torch.full_like(x, 7.0)
    before = x.grad.clone()
    op(x, y)
    assert torch.equal(x.grad, before)


# -- 3.3 inputs and incoming output gradients are never modified ----------------------------


def test_inputs_unchanged_after_forward_and_backward_vec3():
    # The 003 scenario: tensors passed straight into a differentiable launch.
    op = wb.op(K.add_vec3)
    x = torch.ones(10, 3, requires_grad=True)
    y = torch.ones(10, 3, requires_grad=True)
    xs, ys = x.detach().clone(), y.detach().clone()
    z = op(x, y)
    z.backward(torch.ones_like(z))
    assert torch.equal(x.detach(), xs) and torch.equal(y.detach(), ys)
    assert torch.equal(x.grad, torch.ones(10, 3)) and torch.equal(y.grad, torch.ones(10, 3))


def test_output_gradient_is_read_only_even_when_the_adjoint_would_write_it():
    op = wb.op(K.reads_output)
    assert op.sig.reads_outputs == {"z"}
    x = rand(6)
    z = op(x)
    g = torch.randn(6, dtype=f64)
    g0 = g.clone()
    z.backward(g)
    assert torch.equal(g, g0)
    torch.testing.assert_close(x.grad, 2 * x.detach() * g0)
    assert torch.autograd.gradcheck(op, (rand(5),))


def test_expanded_output_gradient_from_sum():
    # sum().backward() hands in a stride-0 gradient; it must be read correctly, not written.
    op = wb.op(K.mul64)
    x, y = rand(5), rand(5)
    op(x, y).sum().backward()
    torch.testing.assert_close(x.grad, x.detach().cos() * y.detach())


# -- 3.4 exactly once; 3.5 reentrant --------------------------------------------------------


def test_leaf_gradient_accumulates_once():
    op = wb.op(K.sum_squares)
    xs = rand(20, 2)
    loss = op(xs, launch_dims=20, output_dims=1)
    loss.backward()
    torch.testing.assert_close(xs.grad, 2 * xs.detach())  # not 2x (Warp #159)


@pytest.mark.parametrize("kernel", ["kernel", "function"])
def test_retained_graph_backward_three_times_gives_three_times(kernel):
    op = wb.op(K.mul64) if kernel == "kernel" else wb.op(K.exp_times)
    x, y = rand(6), rand(6)
    out = op(x, y)
    g = torch.randn(6, dtype=f64)
    out.backward(g, retain_graph=True)
    once = x.grad.clone()
    assert once.abs().sum() > 0
    out.backward(g, retain_graph=True)
    out.backward(g)
    torch.testing.assert_close(x.grad, 3 * once)  # Warp #1732 returned zeros the second time


# -- 3.6 version counter --------------------------------------------------------------------


def test_in_place_change_between_forward_and_backward_raises():
    op = wb.op(K.mul64)
    x, y = rand(4), rand(4)
    out = op(x, y)
    with torch.no_grad():
        y.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


# -- 3.7 integer arrays, partial requires_grad, no_grad, odd layouts ------------------------


def test_integer_index_array_scatter_gradient():
    op = wb.op(K.scatter_add)
    x, w = rand(6, 3), rand(6)
    idx = torch.tensor([0, 2, 2, 1, 0, 3])
    out = op(x, idx, w, output_dims=(4, 3))
    dense = torch.zeros(4, 3, dtype=f64).index_add(0, idx, x * w[:, None])
    torch.testing.assert_close(out, dense)
    assert torch.autograd.gradcheck(lambda x, w: op(x, idx, w, output_dims=(4, 3)), (x, w))
    g = torch.randn(4, 3, dtype=f64)
    op(x, idx, w, output_dims=(4, 3)).backward(g)
    torch.testing.assert_close(x.grad, g[idx] * w.detach()[:, None])
    assert not op.sig.params[1].differentiable


def test_only_some_inputs_require_grad():
    op = wb.op(K.mul64)
    x, y = rand(5), rand(5, grad=False)
    op(x, y).sum().backward()
    assert y.grad is None
    torch.testing.assert_close(x.grad, x.detach().cos() * y)


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_no_grad_and_inference_mode_record_nothing(mode):
    op = wb.op(K.mul64)
    x, y = rand(5), rand(5)
    with mode():
        out = op(x, y)
    assert out.grad_fn is None and not out.requires_grad


def test_non_contiguous_inputs():
    op = wb.op(K.mul64)
    base = rand(6, 4)
    x = base[:, 1]  # stride 4
    y = rand(12)[::2]
    torch.testing.assert_close(op(x, y), x.sin() * y)
    assert torch.autograd.gradcheck(op, (x, y))
    # vector arrays whose components are not packed get a copy, gradients still flow
    vop = wb.op(K.vec_mat, num_outputs=2)
    v = rand(3, 5).t()  # (5, 3) with strides (1, 5)
    assert torch.autograd.gradcheck(lambda v, m: vop(v, m, 1.0), (v, rand(5, 3, 3)))


def test_empty_inputs():
    op = wb.op(K.mul64)
    x, y = rand(0), rand(0)
    out = op(x, y)
    assert out.shape == (0,)
    out.sum().backward()
    assert x.grad.shape == (0,)


# -- 3.8 enable_backward=False --------------------------------------------------------------


def test_kernel_without_adjoint_forward_works_backward_raises():
    op = wb.op(K.no_adjoint)
    x = torch.ones(3, requires_grad=True)
    y = op(x)
    torch.testing.assert_close(y.detach(), torch.full((3,), 3.0))
    with pytest.raises(wb.WarpBridgeError, match=r"no_adjoint\(\).*enable_backward=False"):
        y.sum().backward()


# -- the training loop of the README --------------------------------------------------------


def test_rosenbrock_optimisation_follows_pure_pytorch():
    op = wb.op(K.eval_rosenbrock)
    g = torch.Generator().manual_seed(42)
    start = torch.randn(200, 2, generator=g)

    def train(f, steps=300):
        xy = start.clone().requires_grad_()
        opt = torch.optim.Adam([xy], lr=5e-2)
        for _ in range(steps):
            opt.zero_grad()
            f(xy).sum().backward()
            opt.step()
        return xy.detach()

    def reference(xy):
        x, y = xy[:, 0], xy[:, 1]
        return (1 - x) ** 2 + 100 * (y - x * x) ** 2

    ours, ref = train(op), train(reference)
    torch.testing.assert_close(ours, ref, atol=2e-3, rtol=0)
    assert reference(ours).mean() < 0.01 * reference(start).mean()


# -- the generic wp.launch path (the one CUDA takes), run on the CPU --------------------------


@pytest.fixture(params=["direct", "wp.launch"])
def launch_path(request, monkeypatch):
    from warpbridge._core import plan as _plan

    monkeypatch.setattr(_plan, "DIRECT_CPU", request.param == "direct")
    return request.param


def test_both_launch_paths_give_the_same_values_and_gradients(launch_path):
    op = wb.WarpOp(K.vec_mat, num_outputs=2)  # a fresh op: its plans follow the patched launch path
    v, m = rand(5, 3), rand(5, 3, 3)
    (plan,) = [op.plan(wp.get_device, "cpu", ((((5,), (24,))), ((5,), (72,))), None, None)]
    assert plan.direct == (launch_path == "direct")
    assert torch.autograd.gradcheck(lambda v, m: op(v, m, 1.3), (v, m))
    op16 = wb.WarpOp(K.axpy16)
    x = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float16, requires_grad=True)
    y = op16(x, 1.5)
    torch.testing.assert_close(y, x.detach() * 1.5)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 1.5, dtype=torch.float16))


def test_plan_caches_stay_bounded_when_shapes_keep_changing():
    from warpbridge._core import op as _op

    op = wb.op(K.mul64)
    for n in range(1, _op.MAX_CACHED + 40):
        x = torch.ones(n, dtype=f64)
        assert op(x, x).shape == (n,)
    assert len(op._plans) <= _op.MAX_CACHED and len(op.states["torch"]["fast"]) <= _op.MAX_CACHED


def test_deepcopy_of_a_model_shares_the_op():
    import copy

    from kernels import mul64

    op = wb.op(mul64)
    model = torch.nn.Module()
    model.op = op
    assert copy.deepcopy(model).op is op and copy.copy(op) is op
