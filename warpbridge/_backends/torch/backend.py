"""The PyTorch backend: tensors as Warp sees them, validation with a cache for the eager hot
path, the forward and backward every torch path runs, and the eager autograd node.

Eager calls take a lean path: validation, a cached launch plan and, when gradients are
needed, one ``torch.autograd.Function`` (``_Apply``). Under ``torch.compile`` the same call
goes to the registered custom op (``registered_op``) and under torch.func transforms to
``func``; both are handed to :class:`TorchBackend` when the package loads (they build on this
module), and all three run the same ``forward`` / ``backward`` below."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import warp as wp
from torch.autograd.function import once_differentiable

from ... import grad_buffer as _grad_buffer
from ..._core import errors as _errors
from ..._core import gradients as _gradients
from ..._core import op as _op
from ..._core import plan as _plan
from ..._core import validate as _validate
from ..._core.backend import Backend
from ..._core.errors import fail
from ..._core.op import WarpOp
from . import pool as _pool

DTYPE_NAMES = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.bool: "bool",
}
for _name in ("uint16", "uint32", "uint64"):  # torch >= 2.3 has these, with limited op support
    if hasattr(torch, _name):
        DTYPE_NAMES[getattr(torch, _name)] = _name
TORCH_DTYPES = {v: k for k, v in DTYPE_NAMES.items()}
_validate.SYMBOLIC_DIMS.add(torch.SymInt)  # sizes under torch.compile(dynamic=True)

_NO_SCOPE = contextlib.nullcontext()
_NO_CALLS: dict = {}
_devices: dict[torch.device, Any] = {}
_streams: dict[int, Any] = {}


def warp_device(device: torch.device) -> Any:
    d = _devices.get(device)
    if d is None:
        d = _devices[device] = wp.get_device(wp.device_from_torch(device))
    return d


def warp_stream(device: torch.device) -> Any:
    """Warp's view of PyTorch's *current* stream on ``device`` (None on the CPU).

    Cached by the CUDA stream handle, so no Warp or CUDA stream is created per call; the
    cached torch stream object is kept so that its handle cannot be reused by another one.
    """
    if device.type != "cuda":
        return None
    ts = torch.cuda.current_stream(device)
    entry = _streams.get(ts.cuda_stream)
    if entry is None or entry[0] is not ts:
        entry = _streams[ts.cuda_stream] = (ts, wp.stream_from_torch(ts))
    return entry[1]


class _Torch(Backend):
    """The torch backend's array side (what ``_validate.validate`` and the gradient rules use);
    :class:`TorchBackend` below adds the calls and hooks."""

    name = "torch"
    array_name = "torch.Tensor"
    default_device = torch.device("cpu")
    array_types = (torch.Tensor, torch.nn.Parameter)

    @staticmethod
    def is_array(a: Any) -> bool:
        return isinstance(a, torch.Tensor)

    @staticmethod
    def meta(a: torch.Tensor) -> tuple:
        return DTYPE_NAMES.get(a.dtype), tuple(a.shape), a.stride(), a.element_size(), a.device

    @staticmethod
    def contiguous(a: torch.Tensor) -> torch.Tensor:
        return a.contiguous()  # an autograd op: gradients flow back through the copy

    @staticmethod
    def zeros(shape: tuple, dtype_name: str, device: torch.device) -> torch.Tensor:
        return torch.zeros(shape, dtype=TORCH_DTYPES[dtype_name], device=device)

    @staticmethod
    def private_copy(a: torch.Tensor) -> torch.Tensor:
        """A contiguous copy that nothing else references."""
        return a.contiguous().clone() if a.is_contiguous() else a.contiguous()

    @staticmethod
    def ptr(a: torch.Tensor) -> int:
        return a.data_ptr()

    @staticmethod
    def unsupported(a: torch.Tensor) -> str | None:
        if a.is_nested:
            return "a nested tensor"
        if a.layout != torch.strided:
            return f"a tensor with layout {a.layout}"
        if a.device.type == "meta":
            return "a meta tensor (it has no data)"
        if a.is_quantized:
            return f"a quantized tensor ({a.dtype})"
        return None  # complex dtypes: refused by the dtype check, which names the dtype Warp expects

    @staticmethod
    def values(a: torch.Tensor) -> torch.Tensor:
        # torch._neg_view(x), x.conj().imag: the memory holds -x, the tensor means x
        return a.resolve_neg().resolve_conj() if a.is_neg() or a.is_conj() else a

    warp_device = staticmethod(warp_device)

    @staticmethod
    def info(a: torch.Tensor) -> tuple[str, tuple[int, ...], str]:
        """(dtype name, shape, device) of a tensor, for validation that names them."""
        return DTYPE_NAMES.get(a.dtype) or str(a.dtype).replace("torch.", ""), tuple(a.shape), str(a.device)

    @staticmethod
    def cast(a: torch.Tensor, dtype_name: str) -> torch.Tensor:
        """A differentiable cast (gradients come back in ``a``'s dtype)."""
        return a.to(TORCH_DTYPES[dtype_name])

    @staticmethod
    @torch.compiler.disable  # host values: torch.compile breaks the graph here
    def to_host(a: torch.Tensor) -> Any:
        return a.detach().cpu().numpy()

    @staticmethod
    @torch.compiler.disable
    def from_host(values: Any, like: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(values).to(like.device)

    @staticmethod
    @torch.compiler.disable(reason="warpbridge: host work on NumPy values, run as written")
    def on_host(fn: Callable, *args: Any) -> Any:
        return fn(*args)

    @staticmethod
    def compiling() -> bool:
        return torch.compiler.is_compiling()

    @staticmethod
    def differentiated(a: torch.Tensor) -> bool:
        return torch.is_grad_enabled() and a.requires_grad

    @staticmethod
    def uniform(like: torch.Tensor, n: int) -> torch.Tensor:
        return torch.rand(n, dtype=torch.float64, device=like.device)

    @staticmethod
    def take(values: torch.Tensor, indices: list) -> torch.Tensor:
        for d, idx in enumerate(indices):
            if idx is not None:
                values = values.index_select(d, idx if idx.dtype in (torch.int32, torch.int64) else idx.long())
        return values


class Call(NamedTuple):
    """A validated call: the plan and the packed scalars. Holds no tensor (rule 5)."""

    op: WarpOp
    plan: _plan.Plan
    scalars: tuple
    device: torch.device


def prepare(op: WarpOp, args: Sequence[Any], launch_dims: Any, output_dims: Any) -> tuple[Call, list[torch.Tensor]]:
    """Validate ``args``; return the call and the array inputs (made inner-contiguous)."""
    pr = op.prepare(args, launch_dims, output_dims, _Torch)
    return Call(op, pr.plan, pr.scalars, pr.device), pr.arrays


def prepare_cached(op: WarpOp, args: Sequence[Any], launch_dims: Any, output_dims: Any) -> tuple[Call, list]:
    """``prepare`` for the eager hot path.

    A call whose tensors have the dtypes, shapes, strides and devices of an earlier valid
    call (and the same dims arguments) reuses that call's plan: only the scalars are checked
    again. Anything unusual (wrong arity, non-tensors, unhashable dims) takes the full path,
    which raises the precise error.
    """
    positions, scalar_positions = op.sig.array_positions, op.sig.scalar_positions
    if len(args) == len(op.sig.inputs):
        try:
            # The adapter was chosen from these arguments' types, so they are torch types:
            # anything without tensor attributes fails here and takes the full path.
            key = (
                launch_dims,
                output_dims,
                *[(t.dtype, t.shape, t.stride(), t.device, t.is_neg()) for t in map(args.__getitem__, positions)],
            )
            if callable(op.output_dims) or callable(output_dims):  # output shapes may depend on the scalars too
                key += tuple([args[i] for i in scalar_positions])
            entry = op.states["torch"].get("fast", _NO_CALLS).get(key)
        except (AttributeError, TypeError, RuntimeError):  # RuntimeError: a sparse tensor has no strides
            key = entry = None
        if entry is not None:
            plan, device = entry
            tensors, scalars = [args[i] for i in positions], ()
            if scalar_positions:
                values, packed = _validate.scalars_of(op.sig, args)  # checked
                scalars = values if plan.takes_values else packed
            return Call(op, plan, scalars, device), tensors
    else:
        key = None
    c, tensors = prepare(op, args, launch_dims, output_dims)
    if key is not None and all(t is args[i] for t, i in zip(tensors, positions)):
        fast = op.states["torch"].setdefault("fast", {})  # the op's validated calls by tensor layout
        if len(fast) >= _op.MAX_CACHED:
            fast.clear()
        fast[key] = (c.plan, c.device)
    return c, tensors


def forward(call: Call, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Allocate zeroed outputs and launch the forward kernel (or function)."""
    return _forward(call, tensors, False)[0]


def forward_recorded(call: Call, tensors: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], Any]:
    """``forward``, with a launch function's run taped: (outputs, recording for ``backward``)."""
    return _forward(call, tensors, True)


def _forward(call: Call, tensors: Sequence[torch.Tensor], record: bool) -> tuple[list[torch.Tensor], Any]:
    plan, device = call.plan, call.device
    outs = [torch.zeros(shape, dtype=dtype, device=device) for shape, dtype in _out_alloc(plan)]
    ins = [t.data_ptr() for t in tensors]
    out_ptrs = [o.data_ptr() for o in outs]
    stream = None if device.type == "cpu" else warp_stream(device)
    if not plan.allocates:
        return outs, plan.run(ins, call.scalars, out_ptrs, stream)
    # a launch function's own Warp allocations (on the CPU, Warp's own allocator)
    with _NO_SCOPE if stream is None else _pool.scope(device, plan.device):
        return outs, plan.run(ins, call.scalars, out_ptrs, stream, record=record)


def _out_alloc(plan: _plan.Plan) -> tuple:
    alloc = plan.cache.get("torch")
    if alloc is None:
        alloc = plan.cache["torch"] = tuple(
            (s + p.inner_shape, TORCH_DTYPES[p.dtype_name]) for p, s in zip(plan.sig.outputs, plan.out_shapes)
        )
    return alloc


def backward(
    call: Call,
    tensors: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor | None],
    needs: Sequence[bool],
    targets: Sequence[torch.Tensor | None] | None = None,
    outputs: Sequence[torch.Tensor] | None = None,
    recording: Any = None,
) -> list[torch.Tensor | None]:
    """Input gradients (None where not needed) from the output gradients (``_gradients.backward``).

    Where ``targets`` gives a GradBuffer view, the adjoint adds into it in place and the
    input's gradient is returned as None (direct write).
    """
    stream = warp_stream(call.device)
    with _pool.scope(call.device, call.plan.device) if call.plan.allocates and stream is not None else _NO_SCOPE:
        return _gradients.backward(
            call.op, call.plan, call.scalars, tensors, grads, needs, _Torch, call.device, stream, targets, outputs,
            recording=recording,
        )  # fmt: skip


def save_for_backward(ctx: Any, float_outputs: Sequence[bool], inputs: Sequence, outs: Sequence, keep: bool) -> None:
    """What every torch autograd node of an op keeps (eager, the registered op, torch.func):
    the array inputs, and the outputs where the backward reads them (``keep``): saved, so no
    replay, their memory lives, and the version counter guards them (rule 5). Outputs that
    carry no gradient (integer, auxiliary) are marked non-differentiable."""
    ctx.save_for_backward(*inputs, *(outs if keep else ()))
    plain = [o for o, carries in zip(outs, float_outputs) if not carries]
    if plain:
        ctx.mark_non_differentiable(*plain)


def refuse_second_order(op: Any) -> None:
    """Raise if the engine runs this backward under ``create_graph=True``: Warp's adjoint is not
    differentiable again, and a gradient silently cut from the graph would be wrong."""
    if torch.is_grad_enabled():
        raise _errors.fail(
            op.name,
            "second-order gradients are not supported: backward(create_graph=True) / autograd.grad(..., "
            "create_graph=True) would need the gradient of Warp's adjoint, which warpbridge cannot provide. "
            + op.second_order_advice,
        )


def _eager(op: Any, args: tuple, launch_dims: Any, output_dims: Any) -> Any:
    c, tensors = prepare_cached(op, args, launch_dims, output_dims)
    needs = torch.is_grad_enabled() and any([tensors[k].requires_grad for k in op.differentiable_arrays])
    if needs:
        direct = _direct_buffers(tensors) if _grad_buffer._MANAGED else None
        outs = _Apply.apply(c, direct, *tensors)
    else:
        outs = forward(c, tensors)
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
            want = TORCH_DTYPES[p.dtype_name]
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
    def forward(ctx: Any, c: Call, direct: tuple | None, *tensors: torch.Tensor) -> tuple:
        # A launch function's forward is taped and the tape kept for the backward, as wp.Tape
        # does (its intermediates live until then), unless the op was made with recompute=True.
        if c.op.keeps_tape:
            outs, ctx.recording = forward_recorded(c, tensors)
        else:
            outs, ctx.recording = forward(c, tensors), None
        ctx.call = c
        ctx.direct = direct
        # the outputs too where the backward reads them: a custom backward, a kernel that reads
        # its outputs, a kept tape
        save_for_backward(ctx, c.op.float_outputs, tensors, outs, c.op.saves_outputs or ctx.recording is not None)
        # Outputs no gradient reached (auxiliary and integer ones included) arrive as None:
        # the backward makes zeros only where its adjoint reads them.
        ctx.set_materialize_grads(False)
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        refuse_second_order(ctx.call.op)
        return _Apply._backward(ctx, *grads)

    @staticmethod
    @once_differentiable
    def _backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        saved = ctx.saved_tensors
        needs = ctx.needs_input_grad[2:]
        tensors, outputs = saved[: len(needs)], saved[len(needs) :] or None
        targets = _direct_targets(ctx.direct, tensors, needs) if ctx.direct else None
        in_grads = backward(ctx.call, tensors, grads, needs, targets, outputs, ctx.recording)
        return (None, None, *in_grads)


class TorchBackend(_Torch):
    """PyTorch: eager autograd, ``torch.compile`` through the registered custom op,
    ``torch.func`` transforms, ``torch.autocast``.

    ``transforms`` (the ``func`` module) and ``compiled`` (the ``registered_op`` module) are
    the two other paths: they build on this module, so the package hands them in."""

    def __init__(self, transforms: Any, compiled: Any):
        self.transforms = transforms
        self.compiled = compiled

    def call(self, op: Any, args: tuple, launch_dims: Any, output_dims: Any) -> Any:
        if torch._C._is_any_autocast_enabled():
            args = _autocast(op, args)
        if self.transforms.active():  # torch.vmap / torch.func.grad / vjp / jacrev
            return self.transforms.call(op, args, launch_dims, output_dims)
        if torch.compiler.is_compiling():
            if self.compiled.unregistrable(op):  # (a wp.struct argument) no custom op: run it outside the graph
                return _outside_graph(op, args, launch_dims, output_dims)
            return self.compiled.call(op, args, launch_dims, output_dims)
        return _eager(op, args, launch_dims, output_dims)

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
        if not op.generic and not self.compiled.unregistrable(op):
            self.compiled.registered(op)

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
        return self.compiled.registered(op)  # torch_op
