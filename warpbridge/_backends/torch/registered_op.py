"""Registration of every WarpOp as ``torch.ops.warpbridge.<name>`` (for torch.compile).

Each op gets a forward op and a ``<name>_backward`` op, a fake (meta) implementation for
both, and ``register_autograd`` wiring. Their real implementations call the same
``eager.forward`` / ``eager.backward`` as the eager path. Schema (inputs in order, then the
optional per-call dims)::

    warpbridge::<name>(Tensor x, Scalar s, SymInt[]? launch_dims=None, SymInt[]? dims_<out>=None, ...)
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from ..._core import op as _op
from ..._core import validate as _validate
from ..._core.errors import fail
from ..._core.op import WarpOp
from ..._core.signature import STRUCT
from . import backend as eager

_LIB = torch.library.Library("warpbridge", "FRAGMENT")  # keep alive: it owns the registrations
_REGISTERED: dict[str, tuple[Any, Any]] = {}  # name -> (the op it was registered for, the torch op)
_LOCK = threading.RLock()


def _same(a: WarpOp, b: WarpOp) -> bool:
    same_backward = (a.custom_backward is None and b.custom_backward is None) or (
        a.custom_backward is not None and b.custom_backward is not None and a.custom_backward.fn is b.custom_backward.fn
    )
    if a is b:
        return True
    # The same callable, or the same source under the same module and name (a module executed
    # again, importlib.reload): the registered implementation runs identical code.
    same_fn = a.fn is b.fn or (
        _op._source_of(a.fn) == _op._source_of(b.fn)
        and getattr(a.fn, "key", None) == getattr(b.fn, "key", None)
        and _op._registration_name(a.fn, {}) == _op._registration_name(b.fn, {})
    )
    return same_fn and a._options == b._options and same_backward


def _scalar_schema(p: Any) -> str:
    # SymInt, not int, and Scalar, not float: under torch.compile(dynamic=True) a scalar that
    # changes between calls (a new wp.Mesh's or wp.HashGrid's id, a step count, a radius) stays
    # symbolic instead of being specialised, which recompiled the graph for each value
    if p.inner_shape:
        return "float[]" if p.is_float else ("bool[]" if p.dtype_name == "bool" else "SymInt[]")
    return "Scalar" if p.is_float else ("bool" if p.dtype_name == "bool" else "SymInt")


def _dims_names(op: WarpOp) -> list[str]:
    taken = {p.name for p in op.sig.inputs} | {"launch_dims", "grads", "needs"}
    names = []
    for p in op.sig.outputs:
        n = f"dims_{p.name}"
        while n in taken:
            n += "_"
        taken.add(n)
        names.append(n)
    return names


class _Registered:
    """Splits flat schema arguments back into (inputs, launch_dims, output_dims)."""

    def __init__(self, op: WarpOp):
        self.op = op
        self.n_in = len(op.sig.inputs)
        self.out_names = [p.name for p in op.sig.outputs]
        self.arg_names = [p.name for p in op.sig.inputs] + ["launch_dims"] + _dims_names(op)
        self.n_bwd = len(self.arg_names) + 2  # the backward op's arguments before its optional outputs

    def split(self, args: tuple, kwargs: dict) -> tuple[tuple, Any, Any]:
        # The dispatcher omits trailing defaulted arguments or passes them by name.
        args = tuple(args) + tuple(kwargs.get(n) for n in self.arg_names[len(args) :])
        inputs = args[: self.n_in]
        launch = args[self.n_in]
        dims = args[self.n_in + 1 : self.n_in + 1 + len(self.out_names)]
        od = {n: tuple(d) for n, d in zip(self.out_names, dims) if d is not None} or None
        return inputs, (tuple(launch) if launch is not None else None), od

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        inputs, ld, od = self.split(args, kwargs)
        c, tensors = eager.prepare(self.op, inputs, ld, od)
        outs = eager.forward(c, tensors)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def forward_fake(self, *args: Any, **kwargs: Any) -> Any:
        inputs, ld, od = self.split(args, kwargs)
        shapes, device = self._fake_shapes(inputs, ld, od)
        outs = [
            torch.empty(s + p.inner_shape, dtype=eager.TORCH_DTYPES[p.dtype_name], device=device)
            for p, s in zip(self.op.sig.outputs, shapes)
        ]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _fake_shapes(self, inputs: tuple, ld: Any, od: Any) -> tuple[tuple, torch.device]:
        op = self.op
        op.sig.check_arity(inputs)
        first, device, shapes = None, torch.device("cpu"), []
        for p in op.sig.array_inputs:
            a = inputs[p.position]
            name = eager.DTYPE_NAMES.get(a.dtype, str(a.dtype))
            _validate.check_array(op.name, p, _validate.ArrayArg(0, name, tuple(a.shape), (0,) * a.dim()))
            shapes.append(tuple(a.shape[: p.ndim]))
            if first is None:
                first, device = shapes[0], a.device
        ld, od = op.dims(ld, od, _validate.input_values(op.sig, inputs, shapes))
        _, shapes = _validate.resolve_dims(op.name, op.sig, first, ld, od, shapes)
        return shapes, device

    def backward_impl(self, *args: Any, outputs: Any = None) -> list[torch.Tensor]:
        if len(args) > self.n_bwd:  # the outputs passed positionally
            args, outputs = args[: self.n_bwd], args[self.n_bwd]
        grads, needs = args[-2], args[-1]
        inputs, ld, od = self.split(args[:-2], {})
        c, tensors = eager.prepare(self.op, inputs, ld, od)
        in_grads = eager.backward(c, tensors, grads, needs, outputs=outputs or None)
        return [g for g, n in zip(in_grads, needs) if n]

    def backward_fake(self, *args: Any, outputs: Any = None) -> list[torch.Tensor]:
        args = args[: self.n_bwd]
        needs = args[-1]
        inputs = args[: self.n_in]
        tensors = [inputs[p.position] for p in self.op.sig.array_inputs]
        return [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t, n in zip(tensors, needs) if n]


def register(op: WarpOp) -> Any:
    with _LOCK:
        name = op.registration_name
        found = _REGISTERED.get(name)
        if found is not None:
            if _same(found[0], op):
                # the same kernel with the same options: one registration, whose implementation
                # belongs to the first op object (so a backward attached later is refused here)
                op.states["torch"]["shared"] = found[0] is not op
                return found[1]
            raise fail(
                op.name,
                f"the name torch.ops.warpbridge.{name} is already registered for another kernel or function "
                f"({found[0].fn}); give this op another name (wb.op(..., name=...))",
            )
        if hasattr(torch.ops.warpbridge, name):
            raise fail(op.name, f"torch.ops.warpbridge.{name} is already defined elsewhere; give this op another name")
        result = _register(op, name)
        _REGISTERED[name] = (op, result)
        return result


def _register(op: WarpOp, name: str) -> Any:
    sig = op.sig
    reg = _Registered(op)
    params = [f"Tensor {p.name}" if p.is_array else f"{_scalar_schema(p)} {p.name}" for p in sig.inputs]
    params.append("SymInt[]? launch_dims=None")
    params += [f"SymInt[]? {n}=None" for n in _dims_names(op)]
    ret = "Tensor" if len(sig.outputs) == 1 else "(" + ", ".join(["Tensor"] * len(sig.outputs)) + ")"
    _LIB.define(f"{name}({', '.join(params)}) -> {ret}")
    # The forward's outputs, where the backward reads them (a custom backward): saved, not replayed.
    bwd_params = [s.split("=")[0] for s in params] + ["Tensor[] grads", "bool[] needs", "Tensor[]? outputs=None"]
    _LIB.define(f"{name}_backward({', '.join(bwd_params)}) -> Tensor[]")
    for key in ("CPU", "CUDA"):
        _LIB.impl(name, reg.forward, key)
        _LIB.impl(f"{name}_backward", reg.backward_impl, key)
    torch.library.register_fake(f"warpbridge::{name}", reg.forward_fake, lib=_LIB)
    torch.library.register_fake(f"warpbridge::{name}_backward", reg.backward_fake, lib=_LIB)
    backward_op = getattr(torch.ops.warpbridge, f"{name}_backward").default
    n_in = len(sig.inputs)
    n_args = n_in + 1 + len(sig.outputs)

    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        inputs = tuple(inputs) + (None,) * (n_args - len(inputs))
        outs = output if isinstance(output, tuple) else (output,)
        ctx.n_outputs = len(outs) if op.saves_outputs else 0
        arrays = [inputs[p.position] for p in sig.array_inputs]
        eager.save_for_backward(ctx, op.float_outputs, arrays, outs, op.saves_outputs)
        ctx.rest = [None if p.is_array else inputs[p.position] for p in sig.inputs] + list(inputs[n_in:])
        ctx.out_meta = [(o.shape, o.dtype) for o in outs]

    def backward(ctx: Any, *grads: Any) -> tuple:
        eager.refuse_second_order(op)
        needs = [bool(ctx.needs_input_grad[p.position]) and p.differentiable for p in sig.array_inputs]
        result: list[Any] = [None] * n_args
        if not any(needs):
            return tuple(result)
        saved = ctx.saved_tensors
        outputs = list(saved[len(saved) - ctx.n_outputs :]) if ctx.n_outputs else None
        tensors = iter(saved)
        args = [next(tensors) if p.is_array else ctx.rest[i] for i, p in enumerate(sig.inputs)] + ctx.rest[n_in:]
        ref = saved[0]
        grads = [
            g if g is not None else torch.zeros(shape, dtype=dtype, device=ref.device)
            for g, (shape, dtype) in zip(grads, ctx.out_meta)
        ]
        in_grads = iter(backward_op(*args, grads, needs, outputs))
        for p, n in zip(sig.array_inputs, needs):
            if n:
                result[p.position] = next(in_grads)
        return tuple(result)

    torch.library.register_autograd(f"warpbridge::{name}", backward, setup_context=setup_context, lib=_LIB)
    return getattr(torch.ops.warpbridge, name)


def unregistrable(op: WarpOp) -> str | None:
    """Why ``op`` cannot be a custom op (its schema holds tensors and numbers only), or None."""
    structs = [p.name for p in op.sig.inputs if p.dtype_name == STRUCT]
    if structs:
        return (
            f"its wp.struct argument(s) {structs} cannot cross torch.compile's custom-op boundary (the schema holds "
            "tensors and numbers). torch.compile runs such an op between graphs (not with fullgraph=True); or pass "
            "the struct's fields as scalar arguments"
        )
    return None


def registered(op: WarpOp) -> Any:
    """``op.torch_op``: the op's registered custom op, registered on first use."""
    why = unregistrable(op)
    if why:
        raise fail(op.name, f"has no registered custom op: {why}")
    st = op.states["torch"]  # its registered op
    found = st.get("op")
    if found is None:
        with _LOCK:
            found = st.get("op")
            if found is None:
                found = st["op"] = register(op)
    return found


def schema_args(op: WarpOp, args: tuple, launch_dims: Any, output_dims: Any) -> tuple:
    """A call's arguments as the registered op's schema takes them (dims flattened)."""
    ld, od = op.dims(launch_dims, output_dims)
    if callable(od):
        od = None  # evaluated from the inputs by the registered op itself
    dims = [(od.get(p.name) if isinstance(od, dict) else od) for p in op.sig.outputs]
    return (*args, list(ld) if ld is not None else None, *[list(d) if d is not None else None for d in dims])


def call(op: WarpOp, args: tuple, launch_dims: Any, output_dims: Any) -> Any:
    """The torch.compile path: the registered op, with dims flattened into the schema."""
    return registered(op)(*schema_args(op, args, launch_dims, output_dims))
