"""Tile kernels from Warp's own test suite (``warp.tests.tile`` in the installed warp-lang,
written by NVIDIA), each wrapped with ``wb.op`` and launched by blocks as Warp's tests launch
them: the forward equals ``wp.launch_tiled``; the gradient is refused with a WarpBridgeError,
or equals ``wp.Tape``'s and central finite differences. Never silently wrong.

The kernels run in float32 where Warp's tests do, so finite differences use a 1e-2 step and a
loose tolerance; ``wp.Tape`` is matched tightly wherever the gradient is right.
"""

import importlib

import numpy as np
import pytest
import torch
import warp as wp

import warpbridge as wb


def spd(n, rng):
    a = rng.uniform(-0.5, 0.5, (n, n))
    return a @ a.T + n * np.eye(n)


def lower(n, rng):
    return np.tril(rng.uniform(0.2, 0.8, (n, n))) + 2.0 * np.eye(n)


def upper(n, rng):
    return lower(n, rng).T.copy()


def uniform(*shape):
    return lambda rng: rng.uniform(0.2, 0.9, shape)


# (module in warp.tests.tile, kernel, overload dtypes or None, inputs, output shapes, launch_dims, block_dim,
#  expected: "right" / "refused" / "forward only")
CORPUS = [
    ("test_tile_reduce", "tile_sum_kernel", None, [uniform(3, 128)], [(3,)], (3,), 8, "right"),
    ("test_tile_reduce", "tile_min_kernel", None, [uniform(3, 64)], [(3,)], (3,), 8, "refused"),
    ("test_tile_reduce", "tile_max_kernel", None, [uniform(3, 64)], [(3,)], (3,), 8, "refused"),
    ("test_tile_reduce", "tile_argmax_kernel", None, [uniform(3, 64)], [(3,)], (3,), 8, "forward only"),
    ("test_tile_reduce", "tile_sum_axis0_gradient_kernel", None, [uniform(2, 3)], [(3,)], (1,), 4, "right"),
    ("test_tile_reduce", "tile_sum_axis1_gradient_kernel", None, [uniform(3, 2)], [(3,)], (1,), 4, "right"),
    ("test_tile_reduce", "tile_sum_axis_3d_axis1_gradient_kernel", None, [uniform(2, 3, 4)], [(2, 4)], (1,), 4, "right"),
    ("test_tile_reduce", "tile_sum_axis_broadcast_gradient_kernel", None, [uniform(3, 1)], [(4,)], (1,), 4, "right"),
    ("test_tile_reduce", "tile_reduce_axis_tier1_prod_axis1_kernel", None, [uniform(32, 8)], [(32,)], (1,), 8, "refused"),
    ("test_tile_matmul", "tile_grouped_gemm", None, [uniform(3, 8, 8), uniform(3, 8, 4)], [(3, 8, 4)], (3,), 8, "right"),
    ("test_tile_matmul", "tile_gemm", wp.float64, [uniform(16, 16), uniform(16, 8)], [(16, 8)], (2, 2), 8, "right"),
    ("test_tile_matmul", "test_tile_transpose_matmul_kernel", None, [uniform(8, 4)], [(4, 4)], (1,), 8, "refused"),
    ("test_tile_matmul", "tile_matmul_mixed_precision_kernel", None,
     [lambda rng: rng.uniform(0.2, 0.9, (8, 8)).astype(np.float16), uniform(8, 4)], [(8, 4)], (1, 1), 8, "right"),
    # its module is compiled with enable_backward=False
    ("test_tile_solve", "tile_upper_solve_kernel", None, [lambda rng: upper(8, rng), uniform(8)], [(8,)], (1,), 8, "refused"),
    ("test_tile_solve", "tile_math_lower_solve_backward", None, [lambda rng: lower(8, rng), uniform(8)], [(8,)], (1,), 8, "right"),
    ("test_tile_solve", "tile_math_lower_solve_backward_transposed", None, [lambda rng: upper(8, rng), uniform(8)], [(8,)], (1,), 8, "right"),
    ("test_tile_solve", "tile_math_lower_solve_backward_multiple_rhs_colmajor", None, [lambda rng: lower(8, rng), uniform(4, 8)], [(8, 4)], (1,), 8, "right"),
    ("test_tile_cholesky", "tile_cholesky_lower_backward_kernel", wp.float64, [lambda rng: spd(8, rng)], [(8, 8)], (1,), 8, "right"),
    ("test_tile", "tile_sum_kernel", None, [uniform(3, 8, 4)], [(3,)], (3,), 8, "right"),
    ("test_tile", "test_tile_transpose_kernel", None, [uniform(8, 4)], [(4, 8)], (1,), 8, "right"),
    ("test_tile", "test_tile_broadcast_grad_kernel", None, [uniform(5)], [(5, 5)], (1,), 8, "right"),
    ("test_tile", "test_tile_squeeze_kernel", None, [uniform(1, 8, 1)], [(8,)], (1,), 8, "right"),
    ("test_tile", "test_tile_reshape_kernel", None, [uniform(8, 4)], [(32, 1)], (1,), 8, "right"),
    ("test_tile", "tile_mul_elementwise_kernel", None, [uniform(16, 8), uniform(16, 8)], [(16, 8)], (2, 2), 8, "right"),
    ("test_tile", "tile_n_map_kernel", None, [uniform(8), uniform(8), uniform(8)], [(8,)], (1,), 8, "right"),
]  # fmt: skip


def kernel_of(module, name, dtype):
    k = getattr(importlib.import_module(f"warp.tests.tile.{module}"), name)
    if dtype is None:
        return k
    return wp.overload(k, {a.label: wp.array(dtype=dtype, ndim=a.type.ndim) for a in k.adj.args})


def case_inputs(entry, seed=0):
    module, name, dtype, makers, outs, dims, block, expected = entry
    kernel = kernel_of(module, name, dtype)
    rng = np.random.default_rng(seed)
    arrays = []
    for arg, make in zip(kernel.adj.args, makers):
        want = wp.dtype_to_numpy(arg.type.dtype)
        arrays.append(torch.from_numpy(np.ascontiguousarray(make(rng)).astype(want)))
    return kernel, arrays


def make_op(entry, kernel):
    module, name, dtype, makers, outs, dims, block, expected = entry
    names = [a.label for a in kernel.adj.args[len(makers) :]]
    return wb.op(
        kernel, num_outputs=len(outs), launch_dims=dims, block_dim=block,
        output_dims=dict(zip(names, outs)),
    )  # fmt: skip


def warps_own(kernel, entry, arrays, seeds):
    """wp.launch_tiled under wp.Tape on copies: (outputs, input gradients for ``seeds``)."""
    module, name, dtype, makers, outs, dims, block, expected = entry
    ins = [wp.from_torch(a.clone(), requires_grad=a.is_floating_point()) for a in arrays]
    out_arrays = [
        wp.zeros(shape, dtype=arg.type.dtype, requires_grad=True)
        for shape, arg in zip(outs, kernel.adj.args[len(makers) :])
    ]
    tape = wp.Tape()
    with tape:
        wp.launch_tiled(kernel, dim=dims, inputs=ins, outputs=out_arrays, block_dim=block)
    if seeds is None:
        return [torch.from_numpy(o.numpy()) for o in out_arrays], None
    tape.backward(grads={o: wp.from_torch(s) for o, s in zip(out_arrays, seeds)})
    grads = [torch.from_numpy(a.grad.numpy()) if a.grad is not None else None for a in ins]
    return [torch.from_numpy(o.numpy()) for o in out_arrays], grads


@pytest.mark.parametrize("entry", CORPUS, ids=lambda e: f"{e[0]}.{e[1]}")
def test_warps_tile_kernel_is_right_or_refused(entry, monkeypatch):
    monkeypatch.setattr(wp.config, "enable_cpu_blocks", True)  # Warp's own reference launches, by blocks
    expected = entry[-1]
    kernel, arrays = case_inputs(entry)
    op = make_op(entry, kernel)
    floating = [a.clone().requires_grad_(a.is_floating_point() and expected != "forward only") for a in arrays]
    got = op(*floating)
    got = list(got) if isinstance(got, tuple) else [got]
    want, _ = warps_own(kernel, entry, arrays, None)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.detach(), w, rtol=1e-5, atol=1e-6)
    if expected == "forward only":
        assert not any(g.requires_grad for g in got)
        return
    seeds = [torch.rand_like(g.detach()) for g in got]
    loss = sum((g * s).sum() for g, s in zip(got, seeds))
    if expected == "refused":
        with pytest.raises(wb.WarpBridgeError, match="cannot differentiate"):
            loss.backward()
        return
    loss.backward()
    _, tape_grads = warps_own(kernel, entry, arrays, seeds)
    for a, t in zip(floating, tape_grads):
        if a.requires_grad:
            torch.testing.assert_close(a.grad, t.to(a.grad.dtype), rtol=1e-4, atol=1e-5)
    check_finite_differences(op, arrays, seeds, floating)


def check_finite_differences(op, arrays, seeds, floating):
    """The gradient of sum(outputs * seeds) against central differences in the inputs' own
    precision (a relative step of 1e-2 in float32 and float16, 1e-6 in float64)."""

    def loss_of(inputs):
        outs = op(*inputs)
        outs = list(outs) if isinstance(outs, tuple) else [outs]
        return sum(float((o.double() * s.double()).sum()) for o, s in zip(outs, seeds))

    for k, a in enumerate(floating):
        if not a.requires_grad:
            continue
        eps = 1e-6 if a.dtype == torch.float64 else 1e-2
        flat = arrays[k].reshape(-1)
        fd = torch.zeros(flat.numel(), dtype=torch.float64)
        for j in range(flat.numel()):
            plus, minus = [x.clone() for x in arrays], [x.clone() for x in arrays]
            plus[k].view(-1)[j] += eps
            minus[k].view(-1)[j] -= eps
            step = float(plus[k].view(-1)[j]) - float(minus[k].view(-1)[j])
            fd[j] = (loss_of(plus) - loss_of(minus)) / step
        scale = max(float(fd.abs().max()), 1e-6)
        tol = 1e-6 if a.dtype == torch.float64 else 3e-2
        err = float((a.grad.double().reshape(-1) - fd).abs().max()) / scale
        assert err <= tol, f"input {k}: relative error {err:.3g} against finite differences"
