"""Kernels from Warp's own test suite (``warp.tests`` in the installed warp-lang, written by
NVIDIA), each wrapped with ``wb.op`` and checked: the forward equals ``wp.launch``; the
gradient is refused with a WarpBridgeError, or equals ``wp.Tape``'s *and* central finite
differences. Never silently wrong, never a crash.

Left out on purpose: kernels whose ``@wp.func_grad`` is deliberately not the derivative (Warp's
tests check that a custom gradient is *called*; a user's ``func_grad`` is their own backward),
kernels that index past arrays of equal length (their shapes are test-specific), and
discontinuous ones (rounding), where finite differences mean nothing.
"""

import ast
import contextlib
import importlib
import io

import pytest
import torch
import warp as wp

import warpbridge as wb

N = 6
# (module in warp.tests, kernel, number of trailing outputs, expected: "right" or "refused")
CORPUS = [
    ("test_adam", "objective", 1, "right"),
    ("test_adam", "objective_vec3", 1, "right"),
    ("test_adam", "objective_two_inputs_vec3", 1, "right"),
    ("test_array", "sum_array", 1, "right"),
    ("test_array", "inplace_add_rhs", 1, "right"),
    ("test_array", "multiply_by_two", 1, "right"),
    ("test_array", "add_one", 1, "right"),
    ("test_array_subclass", "read_regular", 1, "right"),
    ("test_array_subclass", "square_float", 1, "right"),
    ("test_array_subclass", "sum_values", 1, "right"),
    ("test_array_subclass", "read_or_default", 1, "right"),
    ("test_array_subclass", "read_vec3", 1, "right"),
    ("test_composite_component_adjoint", "array_rooted_vec3_subscript_component_iadd_kernel", 1, "right"),
    ("test_composite_component_adjoint", "slot_write_rhs_eval_order_kernel", 1, "right"),
    ("test_composite_component_adjoint", "mat22_row_iadd_atomic_kernel", 1, "right"),
    ("test_composite_component_adjoint", "vec3_component_iadd_atomic_kernel", 1, "right"),
    ("test_composite_component_adjoint", "vec2_component_iadd_replay_kernel", 5, "right"),
    ("test_composite_component_adjoint", "vec2_component_isub_replay_kernel", 5, "right"),
    ("test_conditional", "test_short_circuit_and_grad_kernel", 1, "right"),
    ("test_conditional", "branch_local_merge_codegen_kernel", 1, "right"),
    ("test_grad", "scalar_grad", 1, "right"),
    ("test_grad", "for_loop_grad", 1, "right"),
    ("test_grad", "for_loop_nested_if_grad", 1, "right"),
    ("test_grad", "copy_kernel", 1, "right"),
    ("test_grad", "square_kernel", 1, "right"),
    ("test_grad_customs", "run_atomic_add", 3, "right"),
    ("test_grad_debug", "vec_length_kernel", 1, "right"),
    ("test_grad_debug", "square_readout_kernel", 1, "right"),
    ("test_grad_debug", "scaled_square_readout_kernel", 1, "right"),
    ("test_grad_debug", "kernel_mixed", 2, "right"),
    ("test_grad_debug", "transform_point_kernel", 1, "right"),
    ("test_grad_debug", "kernel_backward_disabled_scale_kernel", 1, "refused"),
    ("test_overwrite", "square_kernel", 1, "right"),
    ("test_overwrite", "overwrite_kernel_a", 1, "right"),
    ("test_overwrite", "double_kernel", 1, "right"),
    ("test_overwrite", "triple_kernel", 1, "right"),
    ("test_overwrite", "read_kernel", 1, "right"),
    ("test_overwrite", "func_kernel", 2, "right"),
    ("test_quat", "quat_extract_subscript", 1, "right"),
    ("test_quat", "quat_assign_subscript", 1, "right"),
    ("test_quat", "quat_add_inplace_subscript", 1, "right"),
    ("test_quat", "quat_sub_inplace_attribute", 1, "right"),
    ("test_quat", "quat_array_add_inplace", 1, "right"),
    ("test_quat", "scalar_quat_div", 1, "right"),
    ("test_spatial", "transform_extract_subscript", 1, "right"),
    ("test_spatial", "transform_extract_attribute", 2, "right"),
    ("test_spatial", "transform_assign_attribute", 1, "right"),
    ("test_spatial", "transform_add_inplace_subscript", 1, "right"),
    ("test_spatial", "transform_array_sub_inplace", 1, "right"),
    ("test_struct", "scaled_vec_struct_dot_kernel", 1, "right"),
    ("test_tape", "mul_constant", 1, "right"),
    ("test_tape", "dot_product", 1, "right"),
    ("test_tape", "assign_chain_kernel", 2, "right"),
    ("test_tape", "sum_kernel", 1, "right"),
    ("test_tape", "sum_kernel_vec", 1, "right"),
    ("test_tape", "accumulate_jacobi_grad", 1, "refused"),
    ("test_vec", "vec_extract_subscript", 1, "right"),
    ("test_vec", "vec_extract_attribute", 1, "right"),
    ("test_vec", "vec_assign_subscript", 1, "right"),
    ("test_vec", "vec_assign_attribute", 1, "right"),
    ("test_vec", "vec_add_inplace_subscript", 1, "right"),
    ("test_vec", "vec_sub_inplace_attribute", 1, "right"),
    ("test_vec", "vec_array_add_inplace", 1, "right"),
    ("test_vec", "vec_array_sub_inplace", 1, "right"),
    ("test_vec", "scalar_vec_div", 1, "right"),
]


def _kernel(module: str, name: str) -> wp.Kernel:
    with contextlib.redirect_stdout(io.StringIO()):
        mod = importlib.import_module(f"warp.tests.{module}")
    return getattr(mod, name)


def _inputs(kernel: wp.Kernel, n_out: int, gen: torch.Generator) -> list:
    out = []
    for a in kernel.adj.args[: len(kernel.adj.args) - n_out]:
        t = a.type
        if not wp.types.is_array(t):
            out.append(3 if t in (wp.int32, int) else 0.7)
            continue
        scalar = getattr(t.dtype, "_wp_scalar_type_", t.dtype)
        inner = tuple(getattr(t.dtype, "_shape_", ()))
        if scalar is wp.int32:
            out.append(torch.randint(0, N, (N, *inner), generator=gen, dtype=torch.int32))
            continue
        x = 0.3 + torch.rand((N, *inner), generator=gen, dtype=torch.float64)
        if wp.types.type_is_quaternion(t.dtype):
            x = x / x.norm(dim=-1, keepdim=True)
        out.append(x.to(torch.float64 if scalar is wp.float64 else torch.float32))
    return out


def _tape(kernel, n_out, dims, inputs, cotangents):
    """Warp's own answer: outputs and input gradients through wp.Tape."""
    params = kernel.adj.args
    ins = []
    for p, a in zip(params, inputs):
        if isinstance(a, torch.Tensor):
            ins.append(wp.from_torch(a.clone(), dtype=p.type.dtype, requires_grad=a.is_floating_point()))
        else:
            ins.append(a)
    outs = []
    for p in params[len(params) - n_out :]:
        scalar = getattr(p.type.dtype, "_wp_scalar_type_", p.type.dtype)
        outs.append(wp.zeros(N, dtype=p.type.dtype, requires_grad=scalar in (wp.float32, wp.float64)))
    tape = wp.Tape()
    with tape:
        wp.launch(kernel, dim=dims, inputs=ins, outputs=outs)
    values = [wp.to_torch(o).clone() for o in outs]
    tape.backward(
        grads={o: wp.from_torch(c.contiguous(), dtype=o.dtype) for o, c in zip(outs, cotangents) if c is not None}
    )
    grads = [wp.to_torch(a.grad).clone() if isinstance(a, wp.array) and a.grad is not None else None for a in ins]
    return values, grads


@pytest.mark.parametrize("module, name, n_out, expected", CORPUS, ids=[f"{m}.{k}" for m, k, _, _ in CORPUS])
def test_warp_suite_kernel_is_right_or_refused(module, name, n_out, expected):
    kernel = _kernel(module, name)
    uses_tid = any(isinstance(n, ast.Attribute) and n.attr == "tid" for n in ast.walk(kernel.adj.tree))
    dims = (N,) if uses_tid else (1,)
    op = wb.op(kernel, num_outputs=n_out, name=f"corpus_{module}_{name}", launch_dims=dims, output_dims=(N,))
    gen = torch.Generator().manual_seed(0)
    inputs = _inputs(kernel, n_out, gen)
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in inputs]
    diff = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor) and a.is_floating_point()]
    args = list(inputs)
    for i in diff:
        args[i] = inputs[i].clone().requires_grad_(True)
    outs = op(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    cot = [
        torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype) if o.is_floating_point() else None
        for o in outs
    ]
    tape_values, tape_grads = _tape(kernel, n_out, dims, inputs, cot)
    for o, t in zip(outs, tape_values):  # the forward is Warp's
        torch.testing.assert_close(o.detach(), t.reshape(o.shape))
    floats = [(o, c) for o, c in zip(outs, cot) if c is not None]
    try:
        grads = torch.autograd.grad(
            [o for o, _ in floats], [args[i] for i in diff], [c for _, c in floats], allow_unused=True
        )
    except wb.WarpBridgeError as e:
        assert expected == "refused", f"refused unexpectedly: {e}"
        assert "cannot differentiate" in str(e)
        return
    assert expected == "right", "expected a refusal, got a gradient"
    for i, a in zip(range(len(inputs)), inputs):  # no input written
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, before[i])

    def scalar(a):
        o = op(*a)
        o = o if isinstance(o, tuple) else (o,)
        return sum((x.double() * c.double()).sum() for x, c in zip(o, cot) if c is not None)

    for i, g in zip(diff, grads):
        x = inputs[i]
        g = torch.zeros_like(x) if g is None else g
        if tape_grads[i] is not None:  # the same as Warp's Tape
            torch.testing.assert_close(g, tape_grads[i].reshape(g.shape), rtol=1e-5, atol=1e-5)
        h = 1e-3 if x.dtype == torch.float32 else 1e-6
        for _ in range(2):  # and as central finite differences along random directions
            u = torch.randn(x.shape, generator=gen, dtype=torch.float64)
            plus, minus = list(inputs), list(inputs)
            plus[i] = (x.double() + h * u).to(x.dtype)
            minus[i] = (x.double() - h * u).to(x.dtype)
            with torch.no_grad():
                fd = float((scalar(plus) - scalar(minus)) / (2 * h))
            an = float((g.double() * u).sum())
            assert abs(fd - an) <= 2e-2 * max(1.0, abs(fd)), f"input {i}: op {an}, finite differences {fd}"
