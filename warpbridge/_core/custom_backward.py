"""A user-supplied backward for an op (``@op.backward`` / ``wb.op(f, backward=...)``).

The backward is a Warp kernel or an annotated launch function whose parameters are, in
order: the op's inputs (scalars included), the op's outputs as the forward left them,
``adj_<o>`` for each floating-point output ``o`` (the incoming gradients) and ``adj_<x>`` for
each floating-point array input ``x`` (zeroed gradients it fills). It is read into a
:class:`~warpbridge._signature.Signature` of its own, whose outputs are the ``adj_<x>``
arrays: so the same checks hold for it as for any op (it may not write the forward's inputs,
outputs or incoming gradients), and a kernel backward launches through a cached
:class:`~warpbridge._core.plan.Plan` like any forward.
"""

from __future__ import annotations

from typing import Any

import warp as wp

from .errors import WarpBridgeError
from .launch_function import new_plan
from .signature import Param, Signature, bind_generic


def _same_type(a: Param, b: Param) -> bool:
    if a.is_array != b.is_array or a.dtype_name != b.dtype_name or a.inner_shape != b.inner_shape:
        return False
    return a.ndim == b.ndim


def _spell(name: str, p: Param) -> str:
    return f"{name}: {wp.types.type_repr(p.wp_type)}"


class CustomBackward:
    """The backward of one op: its signature and its launch plans."""

    def __init__(self, op: Any, fn: Any):
        sig = op.sig
        self.op_name = op.name
        self.fn = fn
        self.name = getattr(fn, "key", None) or getattr(fn, "__name__", "backward")
        self.float_outputs = sig.grad_outputs
        self.grad_inputs = sig.differentiable_inputs
        if not self.grad_inputs:
            raise WarpBridgeError(
                f"{op.name}(): the op has no floating-point array input, so there is nothing for a backward to compute"
            )
        expected = (
            [(p.name, p) for p in sig.inputs]
            + [(p.name, p) for p in sig.outputs]
            + [(f"adj_{p.name}", p) for p in self.float_outputs]
            + [(f"adj_{p.name}", p) for p in self.grad_inputs]
        )
        want = ", ".join(_spell(n, p) for n, p in expected)
        if not (isinstance(fn, wp.Kernel) or callable(fn)):
            raise WarpBridgeError(
                f"{op.name}(): backward must be a wp.Kernel or an annotated launch function, got {type(fn).__name__}"
            )
        try:
            self.sig = Signature(fn, len(self.grad_inputs), f"{op.name}_backward", keywords=("needs_input_grad",))
        except WarpBridgeError as e:
            raise WarpBridgeError(
                f"{op.name}(): backward '{self.name}' cannot be used: {e}. Its parameters must be ({want})"
            ) from e
        got = self.sig.params
        problems = []
        if len(got) != len(expected):
            problems.append(f"it has {len(got)} parameters, expected {len(expected)}")
        for p, (n, q) in zip(got, expected):
            if p.name != n:
                problems.append(f"parameter {p.position + 1} is '{p.name}', expected '{n}'")
            elif not _same_type(p, q):
                problems.append(f"'{n}' is {p.describe_type()}, expected {q.describe_type()}")
        asked = [p.name for p in sig.outputs if p.aux and f"adj_{p.name}" in {q.name for q in got}]
        if asked:
            problems.insert(
                0,
                f"'{asked[0]}' is auxiliary (aux=...): it is never differentiated, so the backward takes no "
                f"adj_{asked[0]}; drop that parameter",
            )
        if problems:
            raise WarpBridgeError(
                f"{op.name}(): backward '{self.name}' does not match the forward's signature: "
                f"{'; '.join(problems)}. Expected parameters: ({want})"
            )
        # A launch function that declares ``*, needs_input_grad`` gets one bool per adj_ array
        # (the gradients asked for) and may leave the others untouched.
        self.takes_needs = "needs_input_grad" in self.sig.keywords

    def plan(self, fwd_plan: Any, grad_layouts: tuple) -> Any:
        """A new plan of the backward for a forward plan and the incoming gradients' layouts
        (``gradients`` keeps it in the forward plan's cache)."""
        layouts = tuple(fwd_plan.in_layouts) + tuple(zip(fwd_plan.out_shapes, fwd_plan.out_strides)) + grad_layouts
        in_shapes = tuple(
            shape for p, (shape, _) in zip(fwd_plan.sig.array_inputs, fwd_plan.in_layouts) if p.differentiable
        )
        return new_plan(
            self.sig, fwd_plan.device, layouts, fwd_plan.launch_dims, in_shapes,
            block_dim=fwd_plan.block_dim, tiled=fwd_plan.tiled,
        )  # fmt: skip


class GenericBackward:
    """The backward of a generic op: bound with the same types as each instance's kernel."""

    def __init__(self, op: Any, fn: Any):
        if not (isinstance(fn, wp.Kernel) or callable(fn)):
            raise WarpBridgeError(
                f"{op.name}(): backward must be a wp.Kernel or an annotated launch function, got {type(fn).__name__}"
            )
        self.fn = fn
        self.name = getattr(fn, "key", None) or getattr(fn, "__name__", "backward")

    def bind(self, element: Any, scalar: Any) -> Any:
        """The backward for one instance: a generic kernel's overload, anything else itself
        (checked against the instance's signature when the instance is made)."""
        if isinstance(self.fn, wp.Kernel) and self.fn.is_generic:
            return bind_generic(self.fn, element, scalar)
        return self.fn
