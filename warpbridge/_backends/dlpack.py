"""Any array producer: objects with ``__dlpack__`` or ``__cuda_array_interface__`` (CuPy,
Numba, NumPy-likes, ...) and ``wp.array`` itself. Forward only.

Inputs are shared with Warp without a copy (``wp.from_dlpack``, or a ``wp.array`` over the
``__cuda_array_interface__`` pointer); outputs are allocated by Warp and handed back in the
inputs' library where it can take them without a copy:

============================  =====================================================
inputs                        outputs
============================  =====================================================
CuPy arrays                   CuPy arrays (``cupy.from_dlpack``)
``wp.array``                  ``wp.array``
any other producer, CPU       NumPy arrays (views of the Warp allocation)
any other producer, CUDA      ``wp.array``: it exposes ``__dlpack__`` and
                              ``__cuda_array_interface__``, so any library takes it
============================  =====================================================

There are no gradients on this path: a producer has no autograd to hand them to. An input
that asks for them (``requires_grad=True``) is refused with the fix: pass framework tensors.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import warp as wp

from .._core import dtypes as _dtypes
from .._core import warp_runtime
from .._core.backend import WarpArrays
from .._core.errors import describe, fail

_DL_CPU, _DL_CUDA = 1, 2
_DL_DEVICE_NAMES = {
    3: "CUDA host (pinned)",
    4: "OpenCL",
    7: "Vulkan",
    8: "Metal",
    9: "VPI",
    10: "ROCm",
    11: "ROCm host",
    13: "CUDA managed",
    14: "oneAPI",
    15: "WebGPU",
    16: "Hexagon",
}


def is_producer(a: Any) -> bool:
    return isinstance(a, wp.array) or hasattr(a, "__dlpack__") or hasattr(a, "__cuda_array_interface__")


class _Warp(WarpArrays):
    """What ``validate.validate`` checks: the inputs as ``wp.array``."""

    name = "dlpack"
    array_name = "array (DLPack, __cuda_array_interface__ or wp.array)"
    default_device = "cpu"

    @staticmethod
    def info(a: Any) -> tuple[str, tuple[int, ...], str]:
        w = a if isinstance(a, wp.array) else (wp.from_dlpack(a) if hasattr(a, "__dlpack__") else None)
        if w is None:  # __cuda_array_interface__ only
            desc = a.__cuda_array_interface__
            return np.dtype(desc["typestr"]).name, tuple(desc["shape"]), "cuda"
        name, shape, _, _, device = BACKEND.meta(w)
        return name or str(w.dtype), shape, str(device)

    @staticmethod
    def cast(a: Any, dtype_name: str) -> Any:
        raise TypeError(f"arrays passed through DLPack are not cast; pass {dtype_name} arrays")

    @staticmethod
    def differentiated(a: Any) -> bool:
        return False  # nothing differentiates through DLPack

    @staticmethod
    def take(values: Any, indices: list) -> Any:
        raise TypeError("arrays passed through DLPack are not gathered; build the wp.indexedarray yourself")


def _to_warp(op: Any, p: Any, a: Any) -> wp.array:
    if getattr(a, "requires_grad", False) is True:
        raise fail(
            op.name,
            f"argument '{p.name}' requires gradients, but arrays passed through DLPack, "
            "__cuda_array_interface__ or as wp.array run forward only. For gradients pass framework tensors: "
            "torch.from_dlpack(x) (or jax.dlpack.from_dlpack, paddle.from_dlpack) shares the memory without a copy",
        )
    if isinstance(a, wp.array):
        return a
    if hasattr(a, "__dlpack__"):
        kind = int(a.__dlpack_device__()[0]) if hasattr(a, "__dlpack_device__") else _DL_CPU
        if kind not in (_DL_CPU, _DL_CUDA):
            where = _DL_DEVICE_NAMES.get(kind, "unknown")
            raise fail(
                op.name,
                f"argument '{p.name}' lives on DLPack device type {kind} ({where}); warpbridge runs on CPU "
                "and CUDA device memory: copy it there first",
            )
        if kind == _DL_CUDA:
            _need_cuda(op, p)
        try:
            return wp.from_dlpack(a)
        except Exception as e:  # dtype Warp has no type for, negative strides, ...
            raise fail(op.name, f"argument '{p.name}' could not be shared through DLPack: {e}") from e
    _need_cuda(op, p)
    return _from_cuda_array_interface(op, p, a.__cuda_array_interface__)


def _from_cuda_array_interface(op: Any, p: Any, desc: dict) -> wp.array:
    """A ``wp.array`` over the memory an ``__cuda_array_interface__`` describes, on the
    current CUDA device (the interface does not say which device owns the pointer)."""
    try:
        dtype = np.dtype(desc["typestr"])
        shape = tuple(int(d) for d in desc["shape"])
        ptr = int(desc["data"][0])
        strides = desc.get("strides")
        strides = tuple(int(s) for s in strides) if strides is not None else None
        warp_dtype = wp.dtype_from_numpy(dtype)
    except Exception as e:  # a malformed interface, or a dtype Warp has no type for
        raise fail(op.name, f"argument '{p.name}' could not be shared through __cuda_array_interface__: {e}") from e
    if strides is None:
        strides = _dtypes.contiguous_strides(shape, dtype.itemsize)
    device = wp.get_cuda_device()
    if desc.get("stream") is not None:
        # Version 3: the producer's work on that stream must finish first. The interface
        # gives a raw handle with no event to wait on, so synchronise the device.
        wp.synchronize_device(device)
    return wp.array(ptr=ptr, dtype=warp_dtype, shape=shape, strides=strides, device=device)


def _need_cuda(op: Any, p: Any) -> None:
    if not wp.is_cuda_available():
        raise fail(
            op.name,
            f"argument '{p.name}' is a CUDA array, but Warp finds no CUDA device here; copy it to host memory",
        )


def call(op: Any, args: tuple, launch_dims: Any, output_dims: Any) -> Any:
    warp_runtime.ensure_init()
    op.sig.check_arity(args)
    args = list(args)
    first = None
    for p in op.sig.array_inputs:
        a = args[p.position]
        if not is_producer(a):
            raise fail(op.name, f"argument '{p.name}' must be a {_Warp.array_name}, got {describe(a)}")
        first = a if first is None else first
        args[p.position] = _to_warp(op, p, a)
    pr = op.prepare(args, launch_dims, output_dims, BACKEND)
    device = wp.get_device(pr.device)
    stream = wp.get_stream(device) if device.is_cuda else None
    outs = _like(first, BACKEND.forward(pr.plan, pr.arrays, pr.scalars, device, stream), device)
    return outs[0] if len(outs) == 1 else tuple(outs)


def _like(first: Any, outs: list, device: Any) -> list:
    """Outputs in the inputs' library where it can take them without a copy (module doc)."""
    top = type(first).__module__.partition(".")[0] if first is not None else ""
    if top == "cupy" and "cupy" in sys.modules:
        cupy = sys.modules["cupy"]
        return [cupy.from_dlpack(o) for o in outs]
    if top == "warp" or device.is_cuda:
        return outs
    return [o.numpy() for o in outs]


class WarpBackend(_Warp):
    """wp.array and any DLPack / __cuda_array_interface__ producer; forward only."""

    call = staticmethod(call)


BACKEND = WarpBackend()
