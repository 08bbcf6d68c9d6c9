"""The torch adapter's forward and backward: shared by the eager autograd path and the
registered custom ops, so both have exactly the same semantics."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import warp as wp

from ..._core import errors as _errors
from ..._core import gradients as _gradients
from ..._core import op as _op
from ..._core import plan as _plan
from ..._core import validate as _validate
from ..._core.backend import Backend
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
    """The torch backend's array side (what ``_validate.prepare`` and the gradient rules use);
    ``warpbridge._torch.BACKEND`` adds the calls and hooks."""

    name = "torch"
    array_name = "torch.Tensor"
    default_device = torch.device("cpu")

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


_ARRAYS = _Torch()


class Call(NamedTuple):
    """A validated call: the plan and the packed scalars. Holds no tensor (rule 5)."""

    op: WarpOp
    plan: _plan.Plan
    scalars: tuple
    device: torch.device


def prepare(op: WarpOp, args: Sequence[Any], launch_dims: Any, output_dims: Any) -> tuple[Call, list[torch.Tensor]]:
    """Validate ``args``; return the call and the array inputs (made inner-contiguous)."""
    pr = _validate.prepare(op, args, launch_dims, output_dims, _Torch)
    return Call(op, pr.plan, pr.scalars, pr.device), pr.arrays


def prepare_cached(op: WarpOp, args: Sequence[Any], launch_dims: Any, output_dims: Any) -> tuple[Call, list]:
    """``prepare`` for the eager hot path.

    A call whose tensors have the dtypes, shapes, strides and devices of an earlier valid
    call (and the same dims arguments) reuses that call's plan: only the scalars are checked
    again. Anything unusual (wrong arity, non-tensors, unhashable dims) takes the full path,
    which raises the precise error.
    """
    positions = op._array_positions
    if len(args) == len(op.sig.inputs):
        try:
            # The adapter was chosen from these arguments' types, so they are torch types:
            # anything without tensor attributes fails here and takes the full path.
            key = (
                launch_dims,
                output_dims,
                *[(t.dtype, t.shape, t.stride(), t.device, t.is_neg()) for t in map(args.__getitem__, positions)],
            )
            if op._dims_from_inputs or callable(output_dims):  # output shapes may depend on the scalars too
                key += tuple([args[i] for _, i in op._scalar_packers])
            entry = op.states["torch"].get("fast", _NO_CALLS).get(key)
        except (AttributeError, TypeError, RuntimeError):  # RuntimeError: a sparse tensor has no strides
            key = entry = None
        if entry is not None:
            plan, device = entry
            scalars = ()
            if op._scalar_packers:
                scalars = tuple([pack(args[i]) for pack, i in op._scalar_packers])  # checked, packed
                if plan.takes_values:
                    scalars = tuple([args[i] for _, i in op._scalar_packers])
            return Call(op, plan, scalars, device), [args[i] for i in positions]
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


def refuse_second_order(name: str) -> None:
    """Raise if the engine runs this backward under ``create_graph=True``: Warp's adjoint is not
    differentiable again, and a gradient silently cut from the graph would be wrong."""
    if torch.is_grad_enabled():
        raise _errors.fail(
            name,
            "second-order gradients are not supported: backward(create_graph=True) / autograd.grad(..., "
            "create_graph=True) would need the gradient of Warp's adjoint, which warpbridge cannot provide. "
            "Differentiate once (without create_graph), or take finite differences of the gradient",
        )
