"""Launch functions that reach their arguments through views (``x[1:]``, ``x.reshape``,
``x.flatten()``, a row, an array over ``x.ptr``, a view of an output) or through copies
(``wp.copy``, ``.assign()``, ``wp.clone``): the gradient flows into the argument the view was
made from, or the call is refused where Warp's tape recorded no copy. Gradients against
float64 finite differences and, where Warp's own tape is right, ``wp.Tape``."""

import numpy as np
import pytest
import realcode_kernels as K
import torch
import warp as wp

import warpbridge as wb
from warpbridge._core import launch_function, off_tape_fills, tape_rules

f64 = torch.float64

VIEWS = [  # (function, input shape, output_dims)
    (K.square_a_slice, (5,), (4,)),
    (K.square_a_row, (3, 4), (4,)),
    (K.square_flattened, (3, 2), (6,)),
    (K.square_into_a_reshaped_output, (6,), (3, 2)),
    (K.square_a_clone_of_a_slice, (5,), (4,)),
    (K.square_through_a_pointer, (5,), None),
    (K.copy_with_gradients, (5,), None),
    (K.zero_forces_and_a_table, (5,), None),
    (K.through_a_struct, (5,), (4,)),
    (K.through_a_nested_struct, (5,), None),
]


def fd(fn, x, eps=1e-6):
    g = torch.zeros_like(x)
    for k in range(x.numel()):
        plus, minus = x.clone(), x.clone()
        plus.view(-1)[k] += eps
        minus.view(-1)[k] -= eps
        g.view(-1)[k] = (fn(plus).sum() - fn(minus).sum()) / (2 * eps)
    return g


def _values(shape, seed=0):
    return 0.5 + torch.rand(shape, generator=torch.Generator().manual_seed(seed), dtype=f64)


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("fn,shape,dims", VIEWS, ids=[v[0].__name__ for v in VIEWS])
def test_a_view_of_an_argument_carries_its_gradient(fn, shape, dims, recompute):
    op = wb.op(fn, output_dims=dims, recompute=recompute)
    x = _values(shape).requires_grad_()
    op(x).sum().backward()
    want = fd(lambda a: op(a), x.detach())
    assert want.abs().sum() > 0
    torch.testing.assert_close(x.grad, want, rtol=1e-7, atol=1e-7)


@pytest.mark.parametrize("fn,shape,dims", VIEWS[:5], ids=[v[0].__name__ for v in VIEWS[:5]])
def test_views_match_warps_own_tape(fn, shape, dims):
    data = _values(shape, seed=1)
    x = data.clone().requires_grad_()
    wb.op(fn, output_dims=dims)(x).sum().backward()
    xw = wp.array(data.numpy(), dtype=wp.float64, requires_grad=True)
    y = wp.zeros(dims or shape, dtype=wp.float64, requires_grad=True)
    tape = wp.Tape()
    with tape:
        fn(xw, y)
    tape.backward(grads={y: wp.ones_like(y)})
    np.testing.assert_array_equal(x.grad.numpy(), xw.grad.numpy())


def test_a_row_of_a_transposed_input():
    base = _values((4, 3), seed=2)
    x = base.t().requires_grad_()  # strided: the gradient goes through a buffer of its own
    wb.op(K.square_a_row, output_dims=(4,))(x).sum().backward()
    want = torch.zeros(3, 4, dtype=f64)
    want[1] = 2 * x.detach()[1]
    torch.testing.assert_close(x.grad, want)


def test_retained_graph_through_a_view_adds_one_gradient_per_pass():
    op = wb.op(K.square_a_slice, output_dims=(4,))
    x = _values((5,), seed=3).requires_grad_()
    y = op(x)
    want = torch.cat([torch.zeros(1, dtype=f64), 2 * x.detach()[1:]])
    for k in range(1, 4):
        y.sum().backward(retain_graph=True)
        torch.testing.assert_close(x.grad, k * want)


def test_a_pointer_view_over_two_arguments_is_refused():
    op = wb.op(K.pointer_over_two_inputs)
    x = _values((5,), seed=4).requires_grad_()
    y = op(x, x.detach())  # one memory, two arguments: whose gradient is the view's?
    with pytest.raises(wb.WarpBridgeError, match=r"over the memory of \['x', 'z'\] that was not made from one"):
        y.sum().backward()
    assert x.grad is None


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize(
    "fn,dims,message",
    [
        (K.copy_into_plain_zeros, None, r"reads a float64 array of shape \(5,\) made without requires_grad that holds a copy of argument 'x'"),
        (K.assign_into_empty, None, "holds a copy of argument 'x'"),
        (K.clone_without_grad, (4,), r"shape \(4,\) made without requires_grad that holds a copy of argument 'x'"),
        (K.copy_out_of_plain_zeros, None, "fills its output 'y' outside Warp's tape: no recorded launch or copy"),
        (K.total_by_array_sum, (1,), "fills its output 'y' outside Warp's tape"),
    ],
    ids=["wp.copy", "assign", "wp.clone", "copy out", "array_sum"],
)  # fmt: skip
def test_a_copy_warps_tape_leaves_off_is_refused(fn, dims, message, recompute):
    op = wb.op(fn, output_dims=dims, recompute=recompute)
    x = _values((5,), seed=5).requires_grad_()
    y = op(x)
    want = x.detach() ** 2
    torch.testing.assert_close(y, want.sum(0, keepdim=True) if dims == (1,) else want[-y.shape[0] :])
    with pytest.raises(wb.WarpBridgeError, match=message) as e:
        y.sum().backward()
    assert "requires_grad=True" in str(e.value)
    assert x.grad is None


def test_an_output_filled_outside_the_tape_is_refused_only_when_a_gradient_reaches_it():
    op = wb.op(K.squares_and_ones, num_outputs=2)
    x = _values((4,), seed=7).requires_grad_()
    y, ones = op(x)
    y.sum().backward(retain_graph=True)  # no gradient comes into `ones`
    torch.testing.assert_close(x.grad, 2 * x.detach())
    with pytest.raises(wb.WarpBridgeError, match="fills its output 'ones' outside Warp's tape"):
        (y + ones).sum().backward()


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize(
    "fn,want",
    [
        (K.scaled_by_an_array_sum, lambda x: x * x.sum()),
        (K.doubled_off_the_tape, lambda x: (2 * x) ** 2),
        (K.copied_from_plain_scratch, lambda x: 2 * x**2),
        (K.scaled_by_constants_with_grad, lambda x: 3 * x),
    ],
    ids=["array_sum", "record_tape=False", "copy from plain scratch", "constants with requires_grad"],
)
def test_an_array_filled_outside_the_tape_on_the_gradients_path_is_refused(fn, want, recompute):
    # each gave a silently wrong gradient before (the sum's and the launch's parts lost, zero)
    op = wb.op(fn, recompute=recompute)
    x = _values((5,), seed=10).requires_grad_()
    y = op(x)
    torch.testing.assert_close(y, want(x.detach()))
    with pytest.raises(wb.WarpBridgeError, match="made with requires_grad that nothing on Warp's tape writes") as e:
        y.sum().backward()
    assert "record_tape=False" in str(e.value) and "make the array without requires_grad" in str(e.value)
    assert x.grad is None


def test_constants_made_without_requires_grad_raise_no_alarm():
    op = wb.op(K.scaled_by_constants)
    x = _values((5,), seed=11).requires_grad_()
    op(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0))


def test_a_table_larger_than_every_other_array_is_read_once_per_plan(monkeypatch):
    # no other array could hold its values: the copy check reads none of its bytes; the first
    # backward reads them once to find them constant (the function re-run on moved inputs)
    read, probes = [], []
    for module in (tape_rules, launch_function, off_tape_fills):
        real = module.host_bytes
        monkeypatch.setattr(module, "host_bytes", lambda a, real=real: read.append(a.size) or real(a))
    real_probe = off_tape_fills.input_dependent
    monkeypatch.setattr(off_tape_fills, "input_dependent", lambda *a: probes.append(1) or real_probe(*a))
    op = wb.op(K.scaled_by_a_large_table)
    x = _values((5,), seed=9).requires_grad_()
    for step in range(3):
        if step == 1:
            read.clear()
        op(x).sum().backward()
    torch.testing.assert_close(x.grad, 3 * torch.ones_like(x))
    assert probes == [1] and K.TABLE not in read


@pytest.mark.parametrize("recompute", [False, True])
def test_an_input_dependent_array_filled_outside_the_tape_without_requires_grad_is_refused(recompute):
    # y = x * sum(x) + 1 with the sum by wp.utils.array_sum: the sum's gradient was lost (3x the
    # right value's share missing), and no copy of another array shows it
    op = wb.op(K.offset_by_an_array_sum, recompute=recompute)
    x = _values((5,), seed=12).requires_grad_()
    y = op(x)
    torch.testing.assert_close(y, x.detach() * x.detach().sum() + 1)
    with pytest.raises(wb.WarpBridgeError, match="whose values change with the inputs: it was filled outside"):
        y.sum().backward()
    assert x.grad is None


def test_constants_filled_outside_the_tape_are_probed_once_per_plan(monkeypatch):
    probes = []
    real_probe = off_tape_fills.input_dependent
    monkeypatch.setattr(off_tape_fills, "input_dependent", lambda *a: probes.append(1) or real_probe(*a))
    op = wb.op(K.scaled_by_constants)
    x = _values((7,), seed=13).requires_grad_()  # a shape of its own: a plan no other test made
    for _ in range(3):
        op(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 9.0))
    assert probes == [1]


def test_an_indexedarray_in_a_launch_function_is_refused():
    op = wb.op(K.square_through_an_indexedarray, output_dims=(2,))
    x = _values((3,), seed=8).requires_grad_()
    y = op(x)
    torch.testing.assert_close(y, x.detach()[[0, 2]] ** 2)
    with pytest.raises(
        wb.WarpBridgeError, match="passes a wp.indexedarray as argument 'x' of kernel 'square_gathered'"
    ):
        y.sum().backward()


def test_views_and_copies_from_jax():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    op = wb.op(K.square_a_slice, output_dims=(4,))
    x = _values((5,), seed=6).numpy()
    g = jax.grad(lambda a: op(a).sum())(jax.numpy.asarray(x))
    np.testing.assert_allclose(np.asarray(g), np.r_[0.0, 2 * x[1:]], rtol=1e-12)
    # the check runs in the backward's callback: JAX raises its own error, carrying warpbridge's
    with pytest.raises(Exception, match="WarpBridgeError: .*holds a copy of argument 'x'"):
        jax.grad(lambda a: wb.op(K.copy_into_plain_zeros)(a).sum())(jax.numpy.asarray(x))
