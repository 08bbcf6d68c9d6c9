"""NumPy adapter: NumPy arrays in, NumPy arrays out, forward only, on the CPU."""

from __future__ import annotations

from typing import Any

import numpy as np
import warp as wp

from . import _plan
from ._errors import fail


def _known(name: str) -> bool:
    try:
        np.dtype(name)
    except TypeError:  # bfloat16 without ml_dtypes
        return False
    return True


_NAMES = {np.dtype(n): n for n in _plan._ITEMSIZE if _known(n)}


class _NumPy:
    name = "numpy"
    array_name = "numpy.ndarray"
    default_device = "cpu"

    @staticmethod
    def is_array(a: Any) -> bool:
        return isinstance(a, np.ndarray)

    @staticmethod
    def meta(a: np.ndarray) -> tuple:
        strides = tuple(s // a.itemsize for s in a.strides) if a.itemsize else a.strides
        return _NAMES.get(a.dtype), a.shape, strides, a.itemsize, "cpu"

    @staticmethod
    def contiguous(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a)

    @staticmethod
    def warp_device(device: str) -> Any:
        return wp.get_device(device)


def info(a: np.ndarray) -> tuple[str, tuple[int, ...], str]:
    return _NAMES.get(a.dtype) or a.dtype.name, tuple(a.shape), "cpu"


def cast(a: np.ndarray, dtype_name: str) -> np.ndarray:
    return a.astype(dtype_name)


def call(op: Any, args: tuple, launch_dims: Any, output_dims: Any) -> Any:
    for p, a in zip(op.sig.array_inputs, (args[p.position] for p in op.sig.array_inputs if p.position < len(args))):
        if isinstance(a, np.ndarray) and any(s < 0 or s % max(a.itemsize, 1) for s in a.strides):
            raise fail(op.name, f"argument '{p.name}' has negative or unaligned strides {a.strides}; pass a copy")
    pr = _plan.prepare(op, args, launch_dims, output_dims, _NumPy)
    plan, sig = pr.plan, op.sig
    outs = [np.zeros(s + p.inner_shape, dtype=p.dtype_name) for p, s in zip(sig.outputs, plan.out_shapes)]
    ins = [a.ctypes.data for a in pr.arrays]
    out_ptrs = [o.ctypes.data for o in outs]
    if sig.kind == "kernel":
        plan.forward(ins, pr.scalars, out_ptrs)
    else:
        _plan.run_function(plan, ins, pr.scalars, out_ptrs)
    return outs[0] if len(outs) == 1 else tuple(outs)
