"""Warp code as users write it, through ``wb.op``: right or refused, never silently wrong.

Launch functions that update an input in place, scratch arrays made without
``requires_grad``, augmented stores that read an output, meshes over differentiable points,
Warp-style ``(1,)`` losses, a profiler running, hash-grid accumulators times a scalar, and
``trust_adjoint`` for some kernels only. Gradients against float64 finite differences.
"""

import cProfile
import pathlib

import numpy as np
import pytest
import realcode_kernels as K
import torch
import warp as wp

import warpbridge as wb
from warpbridge.testing import check_op

f64 = torch.float64


def fd(fn, args, i, eps=1e-6):
    """Central finite differences of sum(fn(*args)) with respect to args[i] (float64)."""
    x = args[i].detach().clone()
    g = torch.zeros_like(x)
    for k in range(x.numel()):
        plus = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]
        minus = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]
        plus[i].view(-1)[k] += eps
        minus[i].view(-1)[k] -= eps
        g.view(-1)[k] = (fn(*plus).sum() - fn(*minus).sum()) / (2 * eps)
    return g


def state(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return 0.5 + torch.rand(n, generator=g, dtype=f64), torch.rand(n, generator=g, dtype=f64)


# -- the caller's memory is never written -----------------------------------------------------


@pytest.mark.parametrize("grad", [False, True])
def test_launch_function_writing_an_input_is_refused_before_it_touches_it(grad):
    x0, v0 = state()
    x, v = x0.clone().requires_grad_(grad), v0.clone()
    op = wb.op(K.step_in_place)
    with pytest.raises(wb.WarpBridgeError, match=r"step_in_place\(\) writes into its input array\(s\) \['x'\]") as e:
        op(x, v)
    assert "wp.clone(x)" in str(e.value)
    assert torch.equal(x.detach(), x0)  # never written, not even on the first call
    assert x.grad is None


def test_the_same_step_on_a_copy_is_right():
    x0, v0 = state()
    op = wb.op(K.step_on_a_clone)
    x, v = x0.clone().requires_grad_(), v0.clone().requires_grad_()
    y = op(x, v)
    torch.testing.assert_close(y, (x0 + 0.3 * v0) ** 2)
    y.sum().backward()
    assert torch.equal(x.detach(), x0)
    torch.testing.assert_close(x.grad, fd(op, [x0, v0], 0))
    torch.testing.assert_close(v.grad, fd(op, [x0, v0], 1))


# -- no gradient path silently dropped by a scratch array -------------------------------------


@pytest.mark.parametrize("fn", [K.via_plain_zeros, K.via_empty_view, K.via_zeros_like])
@pytest.mark.parametrize("which", [0, 1])
def test_scratch_arrays_without_requires_grad_carry_the_gradient(fn, which):
    x0, v0 = state()
    op = wb.op(fn)
    args = [x0.clone(), v0.clone()]
    args[which].requires_grad_(True)  # the other input does not require grad
    op(*args).sum().backward()
    torch.testing.assert_close(args[which].grad, fd(op, [x0, v0], which))


def test_check_op_differentiates_each_input_alone():
    x0, v0 = state()
    check_op(wb.op(K.via_zeros_like), x0, v0, opcheck=False)


def test_gradient_of_a_global_scratch_array_is_given_back():
    # an array the function did not make gets its gradient state back after the backward
    x0, v0 = state()
    K.GLOBAL_SCRATCH = wp.zeros(6, dtype=wp.float64)

    def via_global(x: wp.array(dtype=wp.float64), v: wp.array(dtype=wp.float64), y: wp.array(dtype=wp.float64)):
        wp.launch(K.axpy_into, dim=6, inputs=[x, v, wp.float64(2.0), K.GLOBAL_SCRATCH])
        wp.launch(K.square_into, dim=6, inputs=[K.GLOBAL_SCRATCH, y])

    op = wb.op(via_global)
    v = v0.clone().requires_grad_()
    op(x0, v).sum().backward()
    torch.testing.assert_close(v.grad, fd(op, [x0, v0], 1))
    assert K.GLOBAL_SCRATCH.grad is None and not K.GLOBAL_SCRATCH.requires_grad


# -- augmented stores that read the output ---------------------------------------------------


@pytest.mark.parametrize(
    "kernel, line",
    [
        (K.iadd_reads_output, "y[i] += f64(0.5) * y[i] * x[i]"),
        (K.isub_reads_output, "y[i] -= wp.cos(y[i])"),
        (K.component_iadd_reads_output, "y[i][0] += y[i][0] * y[i][1]"),
    ],
)
def test_augmented_store_that_reads_the_output_is_refused(kernel, line):
    op = wb.op(kernel)
    x = torch.rand(4, 2, dtype=f64) if kernel is K.component_iadd_reads_output else state()[0]
    x.requires_grad_(True)
    with pytest.raises(wb.WarpBridgeError, match="variable 'y' is an output element read, then overwritten") as e:
        op(x).sum().backward()
    where = str(e.value).split(".py:")[1].split(":")[0]
    source = pathlib.Path(K.__file__).read_text().splitlines()
    assert source[int(where) - 1].strip() == line


@pytest.mark.parametrize("kernel", [K.iadd_linear_in_output, K.iadd_accumulates])
def test_augmented_stores_warp_gets_right_are_accepted(kernel):
    check_op(wb.op(kernel), state()[0], opcheck=False)


# -- meshes and BVHs over differentiable points -----------------------------------------------


def query_count(verts, faces, q):
    return (q[0],)


def _triangle():
    verts = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    faces = torch.tensor([0, 1, 2], dtype=torch.int32)
    q = torch.tensor([[0.2, 0.2, 0.5], [0.3, 0.1, -0.7], [0.1, 0.6, 0.3]])
    return verts, faces, q


def test_mesh_built_over_differentiable_points_is_refused():
    verts, faces, q = _triangle()
    op = wb.op(K.distance_to_mesh, output_dims=query_count)
    verts.requires_grad_(True)
    d = op(verts, faces, q)
    torch.testing.assert_close(d, torch.tensor([0.5, 0.7, 0.3]))
    with pytest.raises(wb.WarpBridgeError, match="queries a Mesh built over points that depend on a differentiable"):
        d.sum().backward()
    assert verts.grad is None


def test_mesh_over_constant_points_differentiates_the_queries():
    verts, faces, q = _triangle()
    op = wb.op(K.distance_to_mesh, output_dims=query_count)
    q.requires_grad_(True)
    op(verts, faces, q).sum().backward()
    # the distance to the triangle's plane z = 0: d/dq = sign(z) along z
    torch.testing.assert_close(q.grad, torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, -1.0], [0.0, 0.0, 1.0]]))


# -- a Warp-style (1,) loss, and a profiler ---------------------------------------------------


@pytest.mark.parametrize("reduce", ["sum", "index", "backward"])
def test_a_shape_one_loss_back_propagates(reduce):
    x0 = state()[0]
    op = wb.op(K.loss_function, output_dims=(1,))
    x = x0.clone().requires_grad_()
    loss = op(x)
    assert loss.shape == (1,)
    {"sum": lambda: loss.sum().backward(), "index": lambda: loss[0].backward(), "backward": loss.backward}[
        reduce
    ]() if reduce != "backward" else loss.backward(torch.ones(1, dtype=f64))
    torch.testing.assert_close(x.grad, 2 * x0)


def test_launch_function_backward_under_a_profiler():
    x0, v0 = state()
    op = wb.op(K.via_plain_zeros)
    v = v0.clone().requires_grad_()
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        op(x0, v).sum().backward()
        ops_after = sum(1 for _ in range(3))  # noqa: F841 - something for the profiler to see
    finally:
        profiler.disable()
    torch.testing.assert_close(v.grad, fd(op, [x0, v0], 1))
    stats = profiler.getstats()
    assert any(getattr(e.code, "co_name", "") == "via_plain_zeros" for e in stats)  # still profiling


# -- hash-grid accumulators, helpers' objects kept alive, trust per kernel -------------------


def _cloud(n=24, seed=3):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, generator=g, dtype=f64), 0.5 + torch.rand(n, generator=g, dtype=f64)


def test_loop_accumulator_times_a_scalar_is_accepted_and_right():
    pts, mass = _cloud()
    op = wb.op(K.density_scaled)
    m = mass.clone().requires_grad_()
    op(pts, m).sum().backward()
    torch.testing.assert_close(m.grad, fd(op, [pts, mass], 1))


def test_loop_accumulator_times_an_array_is_refused():
    pts, mass = _cloud()
    op = wb.op(K.density_then_scale)
    c = torch.rand(24, dtype=f64, requires_grad=True)
    with pytest.raises(wb.WarpBridgeError, match=r"kernel 'density_times_array'.*variable 'acc'"):
        op(pts, mass, c).sum().backward()


def test_objects_a_helper_made_live_through_the_backward():
    # the hash grid exists only in the helper's frame, which has returned before the backward
    pts, mass = _cloud()

    def launch_density(pts, mass, rho):
        grid = K._grid(pts)
        wp.launch(K.density_times_scalar, dim=pts.shape[0], inputs=[grid.id, pts, mass, wp.float64(2.0), rho])

    def density(pts: wp.array(dtype=wp.vec3d), mass: wp.array(dtype=wp.float64), rho: wp.array(dtype=wp.float64)):
        launch_density(pts, mass, rho)

    op = wb.op(density)
    m = mass.clone().requires_grad_()
    op(pts, m).sum().backward()
    torch.testing.assert_close(m.grad, fd(op, [pts, mass], 1))


def test_trust_adjoint_covers_only_the_kernels_named():
    pts, mass = _cloud()
    c = torch.rand(24, dtype=f64, requires_grad=True)
    with pytest.raises(wb.WarpBridgeError, match="density_times_array"):
        wb.op(K.density_then_scale, trust_adjoint=[K.scale_into])(pts, mass, c).sum().backward()
    trusted = wb.op(K.density_then_scale, trust_adjoint=[K.density_times_array])
    trusted(pts, mass, c).sum().backward()  # the user vouched for it: no refusal
    assert c.grad is not None
    with pytest.raises(wb.WarpBridgeError, match="trust_adjoint must be a bool or a list of wp.Kernel"):
        wb.op(K.density_then_scale, trust_adjoint=["density_times_array"])


def test_trust_adjoint_names_a_func():
    # a hazard inside a @wp.func is cleared by trusting that function
    import adjoint_kernels as A

    with pytest.raises(wb.WarpBridgeError):
        wb.op(A.loop_in_func)(torch.rand(3, dtype=f64, requires_grad=True), 2).sum().backward()
    x = torch.rand(3, dtype=f64, requires_grad=True)
    wb.op(A.loop_in_func, trust_adjoint=[A.pow_func])(x, 2).sum().backward()
    assert x.grad is not None


def test_no_input_bytes_change_in_any_call():
    # forward, backward, repeated: every caller's array keeps its bytes
    x0, v0 = state()
    x, v = x0.clone().requires_grad_(), v0.clone().requires_grad_()
    op = wb.op(K.via_empty_view)
    for _ in range(2):
        op(x, v).sum().backward()
    assert np.array_equal(x.detach().numpy(), x0.numpy()) and np.array_equal(v.detach().numpy(), v0.numpy())


def test_op_is_typed_for_both_call_forms():
    import typing

    returns = [typing.get_type_hints(f)["return"] for f in typing.get_overloads(wb.op)]
    assert wb.WarpOp in returns  # wb.op(kernel)
    assert any(typing.get_origin(r) is not None and wb.WarpOp in typing.get_args(r)[-1:] for r in returns)


# -- the forward's tape kept for the backward ------------------------------------------------


@pytest.mark.parametrize("recompute", [False, True])
def test_backward_reuses_the_forwards_tape_unless_asked_to_recompute(recompute):
    op = wb.op(K.counted_scaled_square, recompute=recompute)
    x0 = torch.rand(4, 3, dtype=f64)
    op(x0)  # the plan's first run (on copies of the inputs)
    K.CALLS.clear()
    x = x0.clone().requires_grad_()
    y = op(x)
    y.sum().backward()
    assert len(K.CALLS) == (2 if recompute else 1)
    torch.testing.assert_close(x.grad, 8 * x0)


def test_kept_tape_with_strided_inputs_expanded_gradients_and_retained_graphs():
    op = wb.op(K.counted_scaled_square)
    base = torch.rand(3, 4, dtype=f64)
    x = base.t().requires_grad_()  # a transposed (strided) leaf
    y = op(x)
    for k in range(1, 4):  # .sum() sends a stride-0 gradient; each pass adds exactly one gradient
        y.sum().backward(retain_graph=True)
        torch.testing.assert_close(x.grad, k * 8 * base.t())
    w = torch.rand(4, 3, dtype=f64)
    (g,) = torch.autograd.grad(y, x, w)
    torch.testing.assert_close(g, 8 * base.t() * w)


def test_kept_tape_frees_the_functions_arrays_with_the_graph():
    op = wb.op(K.counted_scaled_square)
    x = torch.rand(4, 3, dtype=f64, requires_grad=True)
    op(x.detach())
    K.SCRATCH.clear()
    y = op(x)
    alive = K.SCRATCH[-1]() is not None  # (no assert on the referent: pytest would keep it)
    assert alive  # kept for the backward
    y.sum().backward()
    del y
    alive = K.SCRATCH[-1]() is not None
    assert not alive  # freed with the graph, without waiting for the cycle collector


def test_output_changed_in_place_before_the_backward_is_caught():
    op = wb.op(K.counted_scaled_square)
    x = torch.rand(4, 3, dtype=f64, requires_grad=True)
    y = op(x)
    y.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


# -- outputs anywhere, state updated in place ------------------------------------------------


def _states(n=5, seed=4):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(n, 3, generator=g, dtype=f64) for _ in range(3)]


def _kick_drift_reference(x, v, f, dt):
    v_new = v + f * dt - 0.1 * v * v.norm(dim=1, keepdim=True) * dt
    return x + v_new * dt, v_new


def test_in_out_updates_a_copy_and_is_differentiable():
    x0, v0, f0 = _states()
    op = wb.op(K.kick_drift, in_out=("x", "v"))
    x, v, f = (t.clone().requires_grad_() for t in (x0, v0, f0))
    x1, v1 = op(x, v, f, 0.01)
    rx, rv = _kick_drift_reference(x0, v0, f0, 0.01)
    torch.testing.assert_close(x1, rx)
    torch.testing.assert_close(v1, rv)
    assert torch.equal(x.detach(), x0) and torch.equal(v.detach(), v0)  # the caller's state untouched
    check_op(op, x0, v0, f0, 0.01)  # finite differences, each input alone, reentrancy, opcheck


def test_in_out_rollout_chains_steps_in_torch():
    x0, v0, f0 = _states()
    op = wb.op(K.kick_drift, in_out=("x", "v"))
    x, v = x0.clone().requires_grad_(), v0.clone().requires_grad_()
    xs, vs = x, v
    rx, rv = x0.clone().requires_grad_(), v0.clone().requires_grad_()
    ax, av = rx, rv
    for _ in range(20):
        xs, vs = op(xs, vs, f0, 0.05)
        ax, av = _kick_drift_reference(ax, av, f0, 0.05)
    (xs.sum() + (vs**2).sum()).backward()
    (ax.sum() + (av**2).sum()).backward()
    torch.testing.assert_close(x.grad, rx.grad)
    torch.testing.assert_close(v.grad, rv.grad)


def test_in_out_read_after_its_store_is_refused():
    op = wb.op(K.reads_after_store, in_out=("x",))
    x0 = state()[0]
    x = x0.clone().requires_grad_()
    y = op(x, 2.0)
    torch.testing.assert_close(y, (2 * x0) ** 2)  # the forward is right
    with pytest.raises(wb.WarpBridgeError, match="variable 'x' is an in_out element read after the kernel stored it"):
        y.sum().backward()


def test_outputs_named_anywhere():
    op = wb.op(K.output_in_the_middle, outputs=("y",))
    assert [p.name for p in op.sig.inputs] == ["x", "a"]
    x0 = state()[0]
    torch.testing.assert_close(op(x0, 3.0), 3.0 * torch.sin(x0))
    check_op(op, x0, 3.0)


def test_outputs_and_in_out_are_validated():
    with pytest.raises(wb.WarpBridgeError, match=r"\['z'\] name no parameter"):
        wb.op(K.output_in_the_middle, outputs=("z",))
    with pytest.raises(wb.WarpBridgeError, match="'a' is an output and must be an array"):
        wb.op(K.output_in_the_middle, outputs=("a",))
    with pytest.raises(wb.WarpBridgeError, match="named in both outputs and in_out"):
        wb.op(K.kick_drift, outputs=("x",), in_out=("x",))
    with pytest.raises(wb.WarpBridgeError, match="outputs= and in_out= are for kernels"):
        wb.op(K.step_on_a_clone, outputs=("y",))
    with pytest.raises(wb.WarpBridgeError, match=r"writes to its input array\(s\) \['v'\].*in_out=\('v',\)"):
        wb.op(K.kick_drift, in_out=("x",))
    with pytest.raises(wb.WarpBridgeError, match="in_out parameters takes Warp's adjoint only"):
        wb.op(K.kick_drift, in_out=("x", "v"), backward=K.advance)


@pytest.mark.compile
def test_in_out_under_torch_compile():
    op = wb.op(K.kick_drift, in_out=("x", "v"))
    x0, v0, f0 = _states()

    @torch.compile(fullgraph=True)
    def step(x, v, f):
        x1, v1 = op(x, v, f, 0.01)
        return (x1 * x1).sum() + v1.sum()

    x = x0.clone().requires_grad_()
    step(x, v0, f0).backward()
    rx = x0.clone().requires_grad_()
    ax, av = _kick_drift_reference(rx, v0, f0, 0.01)
    ((ax * ax).sum() + av.sum()).backward()
    torch.testing.assert_close(x.grad, rx.grad)


def test_a_mesh_object_stands_for_its_id():
    points = wp.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=wp.vec3)
    mesh = wp.Mesh(points=points, indices=wp.array([0, 1, 2], dtype=wp.int32))
    op = wb.op(K.closest_distance)
    q = torch.tensor([[0.2, 0.2, 0.5], [0.3, 0.1, -0.7]], requires_grad=True)
    d = op(mesh, q)
    torch.testing.assert_close(d, op(mesh.id, q))
    torch.testing.assert_close(d, torch.tensor([0.5, 0.7]))
    d.sum().backward()
    torch.testing.assert_close(q.grad, torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, -1.0]]))


# -- debug mode: index arrays checked before the launch --------------------------------------


def test_debug_mode_refuses_out_of_range_indices_before_the_launch():
    op = wb.op(K.gather_rows, debug=True)
    x = torch.rand(4, 3, dtype=f64)
    torch.testing.assert_close(op(torch.tensor([3, 0, -1]), x), x[[3, 0, -1], 1])
    with pytest.raises(wb.WarpBridgeError, match=r"'idx' holds 4 at flat index 1.*dimension 0 of 'x' \(size 4\)"):
        op(torch.tensor([0, 4, 1]), x)
    with pytest.raises(wb.WarpBridgeError, match=r"'idx' holds 0 at flat index 0.*\(size 0\)"):
        op(torch.tensor([0]), torch.zeros(0, 3, dtype=f64))  # a zero-size array indexed


def test_debug_mode_follows_an_index_through_a_local():
    op = wb.op(K.scatter_through_local, output_dims=(3,), debug=True)
    v = torch.ones(4, dtype=f64)
    torch.testing.assert_close(
        op(v, torch.tensor([0, 2, 2, 1], dtype=torch.int32)), torch.tensor([1.0, 1.0, 2.0], dtype=f64)
    )
    with pytest.raises(wb.WarpBridgeError, match=r"'idx' holds 7 at flat index 3.*'out' \(size 3\)"):
        op(v, torch.tensor([0, 2, 2, 7], dtype=torch.int32))


def test_debug_mode_follows_an_index_into_a_wp_func():
    op = wb.op(K.gather_through_funcs, debug=True)
    x = torch.rand(4, 3, dtype=f64)
    idx = torch.tensor([3, 0, 2])
    torch.testing.assert_close(op(idx, x), x[idx, 1] + x[idx, 0])
    assert {(a, d, s) for a, d, s, _ in op.sig.index_uses} == {("x", 0, "idx")}
    with pytest.raises(wb.WarpBridgeError, match=r"'idx' holds 9 at flat index 2.*dimension 0 of 'x' \(size 4\)"):
        op(torch.tensor([0, 1, 9]), x)


@pytest.mark.parametrize("recompute", [False, True])
def test_a_function_with_a_tape_of_its_own_runs_and_its_backward_is_refused(recompute):
    # its forward raised Warp's "entering a tape while one is already active" for inputs that
    # require grad; its gradient would be the energy's second derivative, through Warp's adjoint
    op = wb.op(K.forces_from_an_energy, recompute=recompute)
    x = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    torch.testing.assert_close(op(x), 3 * x**2)
    xg = x.clone().requires_grad_()
    f = op(xg)
    torch.testing.assert_close(f.detach(), 3 * x**2)
    with pytest.raises(wb.WarpBridgeError, match=r"forces_from_an_energy\(\) runs its own wp.Tape"):
        f.sum().backward()
    assert xg.grad is None
    (f.detach() * xg).sum().backward()  # detached, as the message says
    torch.testing.assert_close(xg.grad, 3 * x**2)


@pytest.mark.parametrize("recompute", [False, True])
def test_a_number_computed_on_the_host_from_the_inputs_is_refused(recompute):
    # y = x / max(x) with the max read on the host: the gradient came back as 1 / max alone
    op = wb.op(K.normalized_by_a_host_max, recompute=recompute)
    x = torch.tensor([1.0, 4.0, 2.0], dtype=f64, requires_grad=True)
    y = op(x)
    torch.testing.assert_close(y, x.detach() / 4.0)
    with pytest.raises(wb.WarpBridgeError, match="passes kernel 'scale_into' a number for 'c' that changes with"):
        y.sum().backward()
    assert x.grad is None


def test_a_loop_run_as_often_as_the_data_asks_with_constant_numbers_is_right():
    # the re-run on moved inputs may halve once more or less; the numbers both runs share match
    op = wb.op(K.halved_until_small)
    # 1.99 halves once; moved to 1.99 * 1.01 + 0.001 it halves twice
    for values, halvings in (([1.99, 0.5, 0.25, 0.125], 1), ([0.5, 3.0, 1.5], 2), ([7.9, 0.1], 3), ([0.2, 0.99], 0)):
        x = torch.tensor(values, dtype=f64, requires_grad=True)
        y = op(x)
        torch.testing.assert_close(y, x.detach() / 2**halvings)
        y.sum().backward()
        torch.testing.assert_close(x.grad, torch.full_like(x, 0.5**halvings))


def test_host_randomness_is_not_taken_for_a_value_of_the_inputs():
    # the re-run on moved inputs sees new noise; one more on the same inputs sees it change too
    op = wb.op(K.jittered_on_the_host)
    x = torch.tensor([1.0, 2.0, 3.0], dtype=f64, requires_grad=True)
    y = op(x)
    noise = y.detach() / x.detach()
    assert ((noise - 1).abs() < 0.1).all() and not torch.equal(noise, torch.ones(3, dtype=f64))
    y.sum().backward()
    torch.testing.assert_close(x.grad, noise)


def test_a_rerun_that_raises_is_reported_as_a_refusal():
    op = wb.op(K.only_for_x0_equal_to_one)
    x = torch.tensor([1.0, 3.0], dtype=f64, requires_grad=True)
    y = op(x)
    with pytest.raises(wb.WarpBridgeError, match="re-running it on slightly moved inputs .* raised ValueError"):
        y.sum().backward()
