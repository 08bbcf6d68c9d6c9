"""The gradient rules, once for every backend: fresh input gradients, incoming gradients
read-only (private copies where an adjoint could write them), outputs the adjoint reads as
the forward left them, rule 7 before any launch, Warp's adjoint or the op's own backward."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import warp as wp

from . import ties
from .compare_kernels import count_differing
from .dtypes import HALF_BITS, WARP_TYPES
from .errors import fail
from .plan import Plan
from .signature import Param
from .validate import inner_contiguous, packers


def needs_outputs(op: Any) -> bool:
    """Whether the backward reads the forward's outputs (a framework saves them for it): a
    custom backward's, a kernel's that reads its outputs, and a launch function's, whose
    re-run in the backward is compared with them (:func:`_check_rerun`)."""
    return op.custom_backward is not None or op.sig.kind == "function" or bool(op.sig.reads_outputs)


def backward(
    op: Any,
    plan: Plan,
    scalars: Sequence[Any],
    arrays: Sequence[Any],
    grads: Sequence[Any],
    needs: Sequence[bool],
    fw: Any,
    device: Any,
    stream: Any,
    targets: Sequence[Any] | None = None,
    outputs: Sequence[Any] | None = None,
    fresh_targets: bool = False,
    recording: Any = None,
) -> list:
    """The framework-neutral backward: input gradients (None where not needed or where a
    ``targets`` array received them in place) from the output gradients ``grads``.

    Input gradients are fresh zeroed arrays from the framework (rule 3). Output gradients are
    only read, unless the adjoint could add into them (the kernel reads that output), in which
    case it gets a private copy (rule 2). ``targets`` receive Warp's adjoint by addition (a
    GradBuffer view); ``fresh_targets`` says they are zeroed buffers nothing else holds (a JAX
    callback's outputs), which a custom backward may fill too. ``outputs``: the forward's
    outputs, where the framework saved them; otherwise they are recomputed when the backward
    needs them. ``recording``: a launch function's taped forward (``Plan.run(record=True)``),
    back-propagated instead of re-running the function. ``fw``
    adds to the ``prepare`` description: ``zeros(shape, dtype name, device)``,
    ``private_copy(a)`` and ``ptr(a)``.
    """
    sig = op.sig
    _check_gradient(op, needs)  # rule 7, before anything is launched
    if op.custom_backward is not None:
        fill = targets if fresh_targets else None  # a custom backward may assign: never into a .grad
        return _custom_backward(op, plan, scalars, arrays, grads, needs, fw, device, stream, outputs, fill)
    direct = [None] * len(arrays) if targets is None else list(targets)
    for k, _ in sig.in_out_pairs:
        direct[k] = None  # its gradient is the in_out output's, worked on in its own buffer
    in_grads = _fresh_gradients(sig, arrays, needs, direct, fw, device)
    if all(g is None for g in in_grads) and all(v is None for v in direct):
        return in_grads
    out_grads, keep, out_ptrs = [], [], []
    ins = [fw.ptr(a) for a in arrays]
    # The adjoint re-reads outputs only if the kernel does; it must see what the forward left
    # there. It gets a private copy (the framework's saved outputs, or a replay of the
    # forward); outputs it never reads need no memory at all.
    values = None
    if plan.allocates and recording is None:  # scratch outputs: the tape re-runs the function into them
        values = plan.zeroed_outputs(fw, device)
    elif sig.reads_outputs and recording is None:  # a recording holds the values its adjoint reads
        if outputs is not None:
            values = [fw.private_copy(o) for o in outputs]
        else:
            values = _replay(plan, ins, scalars, fw, device, stream)
    values = list(values) if values is not None else [None] * len(sig.outputs)
    updated = {j: k for k, j in sig.in_out_pairs}
    input_of_updated: dict = {}
    for j, k in updated.items():
        values[j] = fw.private_copy(arrays[k])  # an in_out output's adjoint reads its input's values
    keep.extend(values)
    for j, (p, shape, g) in enumerate(zip(sig.outputs, plan.out_shapes, grads)):
        g, layout = _output_grad(fw, p, shape, g, device, private=p.name in sig.tracked_outputs)
        keep.append(g)
        out_grads.append(layout)
        reads = p.name in sig.reads_outputs or j in updated
        out_ptrs.append(fw.ptr(values[j]) if values[j] is not None and reads else 0)
        if j in updated:  # the adjoint turns the output's gradient into the input's
            input_of_updated[updated[j]] = g
            if in_grads[updated[j]] is not None:
                in_grads[updated[j]] = g
    gptrs = [
        fw.ptr(g) if g is not None else (fw.ptr(v) if v is not None and p.differentiable else 0)
        for g, v, p in zip(in_grads, direct, sig.array_inputs)
    ]
    if sig.extrema:  # ties of atomic_max/atomic_min share the gradient
        ties.share(plan, ins, scalars, out_ptrs, out_grads, stream)
    plan.run_adjoint(op, ins, scalars, out_ptrs, gptrs, out_grads, stream, recording)
    if plan.allocates and recording is None:
        _check_rerun(op, plan, values, outputs, fw)
    if fresh_targets and targets is not None:
        for k, g in input_of_updated.items():
            if targets[k] is not None:  # the caller reads gradients from its buffers only
                _copy_into(fw, targets[k], g)
    del keep
    return in_grads


def _check_rerun(op: Any, plan: Plan, rerun: Sequence[Any], outputs: Sequence[Any] | None, fw: Any) -> None:
    """A launch function's backward re-runs it (``recompute``, and every path but eager
    PyTorch): the gradient is the re-run's. Once per plan, the re-run's outputs are compared
    with the forward's: a function that draws new random numbers on each run (a seed from a
    host counter, NumPy) gives others, and its gradient would belong to another draw."""
    if outputs is None or plan.cache.get("the re-run matched"):
        return
    for p, again, first in zip(plan.sig.outputs, rerun, outputs):
        tol = {"float64": 1e-9, "float32": 1e-4}.get(p.dtype_name, 1e-2) if p.is_float else 0.0
        if fw.meta(again)[1] != fw.meta(first)[1] or not _close(fw, again, first, tol):
            raise fail(
                op.name,
                f"cannot differentiate: launch function {plan.sig.func.__name__}() gives another '{p.name}' when run "
                "again on the same inputs (random numbers drawn anew on each run?), and its backward runs it again: "
                "the gradient would belong to another draw. Make what the draw depends on an argument of the op "
                "(the seed as an int), or, in eager PyTorch, let the op keep its forward's tape (no recompute=True)",
            )
    plan.cache["the re-run matched"] = True


def _flat(fw: Any, a: Any) -> wp.array:
    """The framework array ``a`` as a packed 1-D Warp array of its scalars (bools as bytes)."""
    dtype_name, shape, strides, itemsize, device = fw.meta(a)
    dtype = wp.uint8 if dtype_name == "bool" else WARP_TYPES[dtype_name]
    view = wp.array(
        ptr=fw.ptr(a), dtype=dtype, shape=shape, device=fw.warp_device(device),
        strides=tuple(s * itemsize for s in strides),
    )  # fmt: skip
    return wp.clone(view).flatten()


def _close(fw: Any, a: Any, b: Any, tol: float) -> bool:
    """The arrays equal within ``tol`` (relative, and absolute near 0), NaN where both are."""
    flat_a, flat_b = _flat(fw, a), _flat(fw, b)
    if flat_a.size == 0:
        return True
    count = wp.zeros(1, dtype=wp.int32, device=flat_a.device)
    wp.launch(count_differing, dim=flat_a.size, inputs=[flat_a, flat_b, wp.float64(tol), count], device=flat_a.device)
    return int(count.list()[0]) == 0


def _check_gradient(op: Any, needs: Sequence[bool]) -> None:
    """``op.check_gradient`` (rule 7), once per pattern of gradients asked for: its verdict
    depends only on the op."""
    asked = tuple(needs)
    if asked not in op.trusted_needs:
        op.check_gradient(asked)
        op.trusted_needs.add(asked)


def _fresh_gradients(
    sig: Any, arrays: Sequence[Any], needs: Sequence[bool], direct: list, fw: Any, device: Any
) -> list:
    """A zeroed gradient per array input asked for that no ``direct`` target receives (rule 3)."""
    in_grads: list = []
    for p, a, need, v in zip(sig.array_inputs, arrays, needs, direct):
        if not (need and p.differentiable) or v is not None:
            in_grads.append(None)
        else:
            dtype_name, shape, *_ = fw.meta(a)
            in_grads.append(fw.zeros(shape, dtype_name, device))
    return in_grads


def _copy_into(fw: Any, dst: Any, src: Any) -> None:
    """Copy framework array ``src`` into ``dst`` (same shape and dtype) through Warp views."""
    views = []
    for a in (dst, src):
        dtype_name, shape, strides, itemsize, device = fw.meta(a)
        dtype = WARP_TYPES[dtype_name]
        views.append(
            wp.array(
                ptr=fw.ptr(a), dtype=dtype, shape=shape, strides=tuple(s * itemsize for s in strides),
                device=fw.warp_device(device),
            )
        )  # fmt: skip
    wp.copy(views[0], views[1])


def _output_grad(fw: Any, p: Param, shape: tuple, g: Any, device: Any, private: bool) -> tuple[Any, tuple]:
    """An output's incoming gradient as the adjoint takes it: zeros where none came, a private
    copy where asked (or where its vector/matrix elements are not packed), and its
    (pointer, Warp byte strides)."""
    if g is None:
        g = fw.zeros(shape + p.inner_shape, p.dtype_name, device)
    else:
        _, gshape, gstrides, _, _ = fw.meta(g)
        if private or (p.inner_shape and not inner_contiguous(p, gshape, gstrides)):
            g = fw.private_copy(g)
    _, _, gstrides, itemsize, _ = fw.meta(g)
    return g, (fw.ptr(g), tuple(map(itemsize.__mul__, gstrides[: p.ndim])))


def _replay(plan: Plan, ins: Sequence[int], scalars: Sequence[Any], fw: Any, device: Any, stream: Any) -> list:
    """The forward's outputs, recomputed into fresh zeroed arrays."""
    outs = plan.zeroed_outputs(fw, device)
    plan.run(ins, scalars, [fw.ptr(o) for o in outs], stream)
    return outs


def _custom_backward(
    op: Any,
    plan: Plan,
    scalars: Sequence[Any],
    arrays: Sequence[Any],
    grads: Sequence[Any],
    needs: Sequence[bool],
    fw: Any,
    device: Any,
    stream: Any,
    outputs: Sequence[Any] | None,
    targets: Sequence[Any] | None = None,
) -> list:
    """Launch the op's own backward: it reads inputs, outputs and output gradients (its
    signature forbids writing them) and fills one zeroed gradient per floating array input
    (the ``targets`` array where one is given, zeroed by the caller: then None is returned)."""
    sig, cb = op.sig, op.custom_backward
    wanted = [need and p.differentiable for p, need in zip(sig.array_inputs, needs)]
    if not any(wanted):
        return [None] * len(arrays)
    keywords = None
    if cb.takes_needs:
        keywords = {"needs_input_grad": tuple(w for p, w in zip(sig.array_inputs, wanted) if p.differentiable)}
    # The framework's pointers and zeroed arrays are taken after this module's own work, in
    # one run of calls.
    g_ptrs, g_layouts, keep = [], [], []
    for p, shape, g in zip(sig.outputs, plan.out_shapes, grads):
        if p.carries_grad:
            g, (ptr, strides) = _output_grad(fw, p, shape, g, device, private=False)
            keep.append(g)
            g_ptrs.append(ptr)
            g_layouts.append((shape, strides))
    given = list(targets) if targets is not None else [None] * len(arrays)
    in_grads, result = [], []  # what the backward fills; what the caller gets
    for p, a, t in zip(sig.array_inputs, arrays, given):
        g = None
        if p.differentiable:
            dtype_name, shape, *_ = fw.meta(a)
            g = t if t is not None else fw.zeros(shape, dtype_name, device)
            in_grads.append(g)
        result.append(None if t is not None else g)
    key = ("backward", tuple(g_layouts))  # the backward's plan lives as long as the forward's
    bplan = plan.cache.get(key)
    if bplan is None:
        bplan = plan.cache[key] = cb.plan(plan, key[1])
    ins = list(map(fw.ptr, arrays))
    if outputs is None:
        outputs = _replay(plan, ins, scalars, fw, device, stream)  # the forward's scalars
    keep.extend(outputs)
    if bplan.takes_values != plan.takes_values:  # packed scalars (16-bit floats as bits), or the values
        scalars = (
            [
                HALF_BITS[p.dtype_name][1](v) if p.dtype_name in HALF_BITS and not p.inner_shape else v
                for p, v in zip((q for q in sig.inputs if not q.is_array), scalars)
            ]
            if bplan.takes_values
            else [pack(v) for pack, v in zip(packers(sig), scalars)]
        )
    b_ins = ins + list(map(fw.ptr, outputs)) + g_ptrs
    bplan.run(b_ins, scalars, list(map(fw.ptr, in_grads)), stream, keywords)
    del keep
    return result
