"""Paddle adapter: validation and launch plans from ``_plan``, gradients through one
``paddle.autograd.PyLayer`` per call, the backward shared with the other adapters
(``_gradients.backward``).

Warp only ever sees raw data pointers of Paddle tensors: no ``wp.from_paddle`` /
``wp.to_paddle``, so no DLPack capsules whose deleters warp-lang 1.19 can hang on at
interpreter exit, and no ``wp.init()`` ordering trap (warpbridge initialises Warp itself).
"""

from __future__ import annotations

from typing import Any

import paddle
import warp as wp
from paddle.autograd import PyLayer

from .._core import gradients as _gradients
from .._core.backend import Backend
from .._core.errors import fail
from .._core.op import Prepared

DTYPE_NAMES = {
    paddle.float16: "float16",
    paddle.bfloat16: "bfloat16",
    paddle.float32: "float32",
    paddle.float64: "float64",
    paddle.int8: "int8",
    paddle.int16: "int16",
    paddle.int32: "int32",
    paddle.int64: "int64",
    paddle.uint8: "uint8",
    paddle.bool: "bool",
}
_devices: dict[str, Any] = {}


def _place_name(t: paddle.Tensor) -> str:
    place = t.place
    if place.is_gpu_place():
        return f"cuda:{place.gpu_device_id()}"
    return "cpu"


class _Paddle(Backend):
    """The Paddle backend: one PyLayer per call; ``BACKEND`` below."""

    name = "paddle"
    array_name = "paddle.Tensor"
    default_device = "cpu"

    @staticmethod
    def is_array(a: Any) -> bool:
        return isinstance(a, paddle.Tensor)

    @staticmethod
    def meta(a: paddle.Tensor) -> tuple:
        return DTYPE_NAMES.get(a.dtype), tuple(a.shape), tuple(a.strides), a.element_size(), _place_name(a)

    @staticmethod
    def contiguous(a: paddle.Tensor) -> paddle.Tensor:
        return a.contiguous()

    @staticmethod
    def warp_device(device: str) -> Any:
        d = _devices.get(device)
        if d is None:
            d = _devices[device] = wp.get_device(device)
        return d

    @staticmethod
    def zeros(shape: tuple, dtype_name: str, device: str) -> paddle.Tensor:
        return paddle.zeros(shape, dtype=dtype_name).to(device)

    @staticmethod
    def private_copy(a: paddle.Tensor) -> paddle.Tensor:
        return a.contiguous().clone()

    @staticmethod
    def ptr(a: paddle.Tensor) -> int:
        return a.data_ptr()

    @staticmethod
    def info(a: paddle.Tensor) -> tuple[str, tuple[int, ...], str]:
        return DTYPE_NAMES.get(a.dtype) or str(a.dtype).replace("paddle.", ""), tuple(a.shape), _place_name(a)

    @staticmethod
    def cast(a: paddle.Tensor, dtype_name: str) -> paddle.Tensor:
        return a.astype(dtype_name)

    @staticmethod
    def to_host(a: paddle.Tensor) -> Any:
        return a.detach().numpy()

    @staticmethod
    def from_host(values: Any, like: paddle.Tensor) -> paddle.Tensor:
        return paddle.to_tensor(values, place=like.place)

    @staticmethod
    def differentiated(a: paddle.Tensor) -> bool:
        return paddle.is_grad_enabled() and not a.stop_gradient

    @staticmethod
    def uniform(like: paddle.Tensor, n: int) -> paddle.Tensor:
        return paddle.rand([n], dtype="float64").to(like.place)

    @staticmethod
    def take(values: paddle.Tensor, indices: list) -> paddle.Tensor:
        for d, idx in enumerate(indices):
            if idx is not None:
                values = paddle.index_select(values, idx, axis=d)
        return values


def refuse_second_order(op: Any) -> None:
    """Paddle runs a PyLayer's backward with gradients enabled only under create_graph=True:
    Warp's adjoint is not differentiable again, so refuse instead of cutting the graph."""
    if paddle.is_grad_enabled():
        raise fail(
            op.name,
            "second-order gradients are not supported: paddle.grad(..., create_graph=True) would need the "
            "gradient of Warp's adjoint. " + op.second_order_advice,
        )


def _stream(device: str) -> Any:
    if device == "cpu":
        return None
    # Paddle's current stream on that device, as a Warp stream (launch order with Paddle's work)
    return wp.stream_from_paddle(device)


def _forward(op: Any, pr: Prepared) -> list:
    return BACKEND.forward(pr.plan, pr.arrays, pr.scalars, pr.device, _stream(pr.device))


def _output_grads(outputs: Any, grads: tuple) -> list:
    """The incoming gradient of each output, None for those that carry none. Paddle 3.x hands
    one per output, zeros for the non-differentiable ones (an int output before a float one
    comes first); older versions only those of the differentiable outputs, in order."""
    if len(grads) == len(outputs):
        return [g if p.carries_grad else None for p, g in zip(outputs, grads)]
    floats = iter(grads)
    return [next(floats, None) if p.carries_grad else None for p in outputs]


class _Apply(PyLayer):
    """One autograd node per call; inputs saved with ``save_for_backward``."""

    @staticmethod
    def forward(ctx: Any, op: Any, pr: Prepared, *tensors: paddle.Tensor) -> Any:
        outs = _forward(op, pr)
        ctx.op, ctx.pr = op, pr._replace(arrays=[])  # the plan and scalars; tensors are saved below
        ctx.n_inputs = len(tensors)
        ctx.save_for_backward(*tensors, *(outs if op.saves_outputs else ()))
        ctx.needs = [not t.stop_gradient for t in tensors]
        for o, p in zip(outs, op.sig.outputs):
            if not p.carries_grad:
                ctx.mark_non_differentiable(o)
        return outs[0] if len(outs) == 1 else tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: paddle.Tensor) -> Any:
        refuse_second_order(ctx.op)
        saved = ctx.saved_tensor()
        tensors, outputs = saved[: ctx.n_inputs], list(saved[ctx.n_inputs :]) or None
        op, pr = ctx.op, ctx.pr
        out_grads = _output_grads(op.sig.outputs, grads)
        in_grads = _gradients.backward(
            op,
            pr.plan,
            pr.scalars,
            tensors,
            out_grads,
            ctx.needs,
            _Paddle,
            pr.device,
            _stream(pr.device),
            outputs=outputs,
        )
        result = tuple(g if need else None for g, need in zip(in_grads, ctx.needs))
        return result[0] if len(result) == 1 else result


def call(op: Any, args: tuple, launch_dims: Any, output_dims: Any) -> Any:
    pr = op.prepare(args, launch_dims, output_dims, _Paddle)
    # no node where no output carries a gradient (Paddle would call its backward all the same)
    needs = (
        paddle.is_grad_enabled()
        and any(op.float_outputs)
        and any(not t.stop_gradient for p, t in zip(op.sig.array_inputs, pr.arrays) if p.differentiable)
    )
    if needs:
        return _Apply.apply(op, pr, *pr.arrays)
    outs = _forward(op, pr)
    return outs[0] if len(outs) == 1 else tuple(outs)


class PaddleBackend(_Paddle):
    """Paddle: one ``PyLayer`` per call (``_Apply``), the shared gradient rules in its backward."""

    call = staticmethod(call)


BACKEND = PaddleBackend()
