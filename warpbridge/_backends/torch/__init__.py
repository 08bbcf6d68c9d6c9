"""PyTorch adapter.

Eager calls take a lean path: validation, a cached launch plan and, when gradients are
needed, one ``torch.autograd.Function``. Under ``torch.compile`` the same call is routed to
the registered custom op (``torch.ops.warpbridge.<name>``, see ``registered_op``), and
under torch.func transforms to ``func``; all three run the very same ``_core`` functions.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from ... import grad_buffer as _grad_buffer
from ..._core import op as _op
from ..._core.errors import fail
from . import arrays as _core
from . import func as _func
from . import registered_op as _library


def info(a: torch.Tensor) -> tuple[str, tuple[int, ...], str]:
    """(dtype name, shape, device) of a tensor, for validation that names them."""
    return _core.DTYPE_NAMES.get(a.dtype) or str(a.dtype).replace("torch.", ""), tuple(a.shape), str(a.device)


def cast(a: torch.Tensor, dtype_name: str) -> torch.Tensor:
    """A differentiable cast (gradients come back in ``a``'s dtype)."""
    return a.to(_core.TORCH_DTYPES[dtype_name])


def call(op: Any, args: tuple, launch_dims: Any, output_dims: Any) -> Any:
    if torch._C._is_any_autocast_enabled():
        args = _autocast(op, args)
    if _func.active():  # torch.vmap / torch.func.grad / vjp / jacrev
        op.check_arity(args)
        rule = _func.OpRule(op, args, launch_dims, output_dims)
        outs = _func.apply(rule, [args[i] for i in op._array_positions])
        return outs[0] if len(outs) == 1 else tuple(outs)
    if torch.compiler.is_compiling():
        if _library.unregistrable(op):  # (a wp.struct argument) no custom op: run it outside the graph
            return _outside_graph(op, args, launch_dims, output_dims)
        return _library.call(op, args, launch_dims, output_dims)
    return _eager(op, args, launch_dims, output_dims)


def _eager(op: Any, args: tuple, launch_dims: Any, output_dims: Any) -> Any:
    c, tensors = _core.prepare_cached(op, args, launch_dims, output_dims)
    needs = torch.is_grad_enabled() and any([tensors[k].requires_grad for k in op.differentiable_arrays])
    if needs:
        direct = _direct_buffers(tensors) if _grad_buffer._MANAGED else None
        outs = _Apply.apply(c, direct, *tensors)
    else:
        outs = _core.forward(c, tensors)
    return outs[0] if len(outs) == 1 else tuple(outs)


def _autocast(op: Any, args: tuple) -> tuple:
    """Under ``torch.autocast`` (and only there), floating tensors go to the dtype the kernel
    declares, as autocast does for PyTorch's own ops: a differentiable cast, traced by
    torch.compile like any other. Integer arrays and scalars are never touched."""
    out = list(args)
    for p in op.sig.array_inputs:
        if p.position >= len(out):
            break
        a = out[p.position]
        if not (p.is_float and isinstance(a, torch.Tensor) and a.is_floating_point()):
            continue
        if torch.is_autocast_enabled(a.device.type):
            want = _core.TORCH_DTYPES[p.dtype_name]
            if a.dtype != want:
                out[p.position] = a.to(want)
    return tuple(out)


# A graph break: torch.compile runs the op eagerly between compiled graphs (fullgraph=True
# refuses, naming this function).
_outside_graph = torch.compiler.disable(_eager, reason="warpbridge: an op with a wp.struct argument has no custom op")


def _direct_buffers(tensors: tuple) -> tuple | None:
    """Per array input, the GradBuffer managing it (direct write), or None."""
    found = tuple(_grad_buffer.buffer_of(t) if t.is_leaf and t.requires_grad else None for t in tensors)
    return found if any(b is not None for b in found) else None


def _direct_targets(direct: tuple, tensors: tuple, needs: tuple) -> list | None:
    """Buffer views the adjoint may add into, for inputs whose .grad the current backward
    will accumulate (``.backward()``, not ``autograd.grad``) and not under create_graph."""
    if torch.is_grad_enabled():
        return None  # create_graph=True: .grad must be built out of place, with its graph
    targets = [None] * len(tensors)
    for i, (gb, t, need) in enumerate(zip(direct, tensors, needs)):
        if gb is None or not need:
            continue
        try:
            will = torch._C._will_engine_execute_node(torch.autograd.graph.get_gradient_edge(t).node)
        except RuntimeError:  # inside autograd.grad(): the gradient is returned, not stored
            will = False
        if will:
            targets[i] = gb.direct_target(t)
    return targets if any(v is not None for v in targets) else None


class _Apply(torch.autograd.Function):
    """One autograd node per call. Tensors needed by backward go through
    ``save_for_backward`` so PyTorch's version counter catches in-place changes between
    forward and backward (rule 5); ``ctx.call`` holds only the plan and the scalars."""

    @staticmethod
    def forward(ctx: Any, c: _core.Call, direct: tuple | None, *tensors: torch.Tensor) -> tuple:
        # A launch function's forward is taped and the tape kept for the backward, as wp.Tape
        # does (its intermediates live until then), unless the op was made with recompute=True.
        if c.op.keeps_tape:
            outs, ctx.recording = _core.forward_recorded(c, tensors)
        else:
            outs, ctx.recording = _core.forward(c, tensors), None
        ctx.call = c
        ctx.direct = direct
        # the outputs too where the backward reads them: a custom backward, a kernel that reads
        # its outputs, a kept tape
        _core.save_for_backward(ctx, c.op.float_outputs, tensors, outs, c.op.saves_outputs or ctx.recording is not None)
        # Outputs no gradient reached (auxiliary and integer ones included) arrive as None:
        # the backward makes zeros only where its adjoint reads them.
        ctx.set_materialize_grads(False)
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        _core.refuse_second_order(ctx.call.op.name)
        return _Apply._backward(ctx, *grads)

    @staticmethod
    @once_differentiable
    def _backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        saved = ctx.saved_tensors
        needs = ctx.needs_input_grad[2:]
        tensors, outputs = saved[: len(needs)], saved[len(needs) :] or None
        targets = _direct_targets(ctx.direct, tensors, needs) if ctx.direct else None
        in_grads = _core.backward(ctx.call, tensors, grads, needs, targets, outputs, ctx.recording)
        return (None, None, *in_grads)


def take(values: torch.Tensor, indices: list) -> torch.Tensor:
    for d, idx in enumerate(indices):
        if idx is not None:
            values = values.index_select(d, idx if idx.dtype in (torch.int32, torch.int64) else idx.long())
    return values


class TorchBackend(_core._Torch):
    """PyTorch: eager autograd, ``torch.compile`` through the registered custom op,
    ``torch.func`` transforms, ``torch.autocast``."""

    call = staticmethod(call)
    info = staticmethod(info)
    cast = staticmethod(cast)
    take = staticmethod(take)

    @staticmethod
    def int_at(a: torch.Tensor, index: int, at_most: int, refuse: Any) -> Any:
        value = a[index].item()
        if torch.compiler.is_compiling():  # a symbolic size, known when the graph runs
            torch._check(value >= 0)
            torch._check(value <= at_most, lambda: f"more than {at_most} (see the eager call's error)")
            return value
        if value > at_most:
            raise refuse(value)
        return value

    def openmp_library(self) -> str | None:
        """PyTorch's GNU OpenMP runtime (its own libgomp copy where it ships one): the team its
        CPU ops spin on, which the neighbour ops' CPU launches join."""
        try:
            with open("/proc/self/maps") as fh:
                paths = sorted({line.split()[-1] for line in fh if "libgomp" in line and "/" in line})
        except OSError:
            return None
        own = [p for p in paths if "torch" in p]
        return (own or paths or [None])[0]

    def on_new_op(self, op: Any) -> None:
        # Registered now, so that a first call inside torch.compile finds it (registration
        # itself cannot be traced). A generic op registers each instance instead.
        if not op.generic and not _library.unregistrable(op):
            _library.registered(op)

    def on_backward_attached(self, op: Any) -> None:
        if op.states["torch"].get("shared"):
            raise fail(
                op.name,
                "this op shares its registered custom op with another op object made from the same kernel; "
                "attach the backward when the op is made (wb.op(kernel, backward=...)) or give this op its own "
                "name (wb.op(kernel, name=...))",
            )

    @staticmethod
    def tracing() -> bool:
        return torch.compiler.is_compiling()

    def op_attribute(self, op: Any, name: str) -> Any:
        if op.generic:
            raise fail(
                op.name,
                "a generic kernel has one registered custom op per binding of its Any types: use "
                "op.instance(*args).torch_op",
            )
        return _library.registered(op)  # torch_op


BACKEND = TorchBackend()
# Ops made before this adapter loaded (warpbridge imported before torch, its neighbour ops
# among them) are registered now: the first call may come inside torch.compile, which runs
# this import but cannot trace a registration.
for _existing in _op.live_ops():
    BACKEND.on_new_op(_existing)
