"""PyTorch adapter.

Eager calls take a lean path: validation, a cached launch plan and, when gradients are
needed, one ``torch.autograd.Function``. Under ``torch.compile`` the same call is routed to
the registered custom op (``torch.ops.warpbridge.<name>``, see ``_library``), whose forward
and backward run the very same ``_core`` functions.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from . import _core


def call(op: Any, args: tuple, launch_dims: Any, output_dims: Any) -> Any:
    if torch.compiler.is_compiling():
        return _library_call(op, args, launch_dims, output_dims)
    c, tensors = _core.prepare_cached(op, args, launch_dims, output_dims)
    needs = torch.is_grad_enabled() and any(
        t.requires_grad for p, t in zip(op.sig.array_inputs, tensors) if p.differentiable
    )
    if needs:
        outs = _Apply.apply(c, *tensors)
    else:
        outs = _core.forward(c, tensors)
    return outs[0] if len(outs) == 1 else tuple(outs)


def _library_call(op: Any, args: tuple, launch_dims: Any, output_dims: Any) -> Any:
    from . import _library

    return _library.call(op, args, launch_dims, output_dims)


class _Apply(torch.autograd.Function):
    """One autograd node per call. Tensors needed by backward go through
    ``save_for_backward`` so PyTorch's version counter catches in-place changes between
    forward and backward (rule 5); ``ctx.call`` holds only the plan and the scalars."""

    @staticmethod
    def forward(ctx: Any, c: _core.Call, *tensors: torch.Tensor) -> tuple:
        outs = _core.forward(c, tensors)
        ctx.call = c
        ctx.save_for_backward(*tensors)
        for o, is_float in zip(outs, _core.float_outputs(c.op)):
            if not is_float:
                ctx.mark_non_differentiable(o)
        return tuple(outs)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        tensors = ctx.saved_tensors
        in_grads = _core.backward(ctx.call, tensors, grads, ctx.needs_input_grad[1:])
        return (None, *in_grads)
