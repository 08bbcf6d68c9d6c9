"""NumPy adapter: NumPy arrays in, NumPy arrays out, forward only, on the CPU."""

from __future__ import annotations

from typing import Any

import numpy as np
import warp as wp

from .._core import dtypes as _dtypes
from .._core.backend import Backend
from .._core.errors import fail


def _known(name: str) -> bool:
    try:
        np.dtype(name)
    except TypeError:  # bfloat16 without ml_dtypes
        return False
    return True


_NAMES = {np.dtype(n): n for n in _dtypes.ITEMSIZE if _known(n)}


class NumPyBackend(Backend):
    """NumPy arrays in, NumPy arrays out; forward only (NumPy has no autograd)."""

    name = "numpy"
    array_name = "numpy.ndarray"
    default_device = "cpu"
    array_types = (np.ndarray,)

    def is_array(self, a: Any) -> bool:
        return isinstance(a, np.ndarray)

    def meta(self, a: np.ndarray) -> tuple:
        strides = tuple(s // a.itemsize for s in a.strides) if a.itemsize else a.strides
        return _NAMES.get(a.dtype), a.shape, strides, a.itemsize, "cpu"

    def contiguous(self, a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a)

    def warp_device(self, device: str) -> Any:
        return wp.get_device(device)

    def zeros(self, shape: tuple, dtype_name: str, device: Any) -> np.ndarray:
        return np.zeros(shape, dtype=dtype_name)

    def private_copy(self, a: np.ndarray) -> np.ndarray:
        return np.array(a, order="C", copy=True)

    def ptr(self, a: np.ndarray) -> int:
        return a.ctypes.data

    def info(self, a: np.ndarray) -> tuple[str, tuple[int, ...], str]:
        return _NAMES.get(a.dtype) or a.dtype.name, tuple(a.shape), "cpu"

    def cast(self, a: np.ndarray, dtype_name: str) -> np.ndarray:
        return a.astype(dtype_name)

    def to_host(self, a: np.ndarray) -> np.ndarray:
        return np.asarray(a)

    def from_host(self, values: np.ndarray, like: np.ndarray) -> np.ndarray:
        return values

    def differentiated(self, a: np.ndarray) -> bool:
        return False  # NumPy differentiates nothing

    def uniform(self, like: np.ndarray, n: int) -> np.ndarray:
        return np.random.random(n)  # NumPy's global state, which np.random.seed sets

    def take(self, values: np.ndarray, indices: list) -> np.ndarray:
        for d, idx in enumerate(indices):
            if idx is not None:
                values = np.take(values, idx, axis=d)
        return values

    def call(self, op: Any, args: tuple, launch_dims: Any, output_dims: Any) -> Any:
        for p in op.sig.array_inputs:
            a = args[p.position] if p.position < len(args) else None
            if isinstance(a, np.ndarray) and any(s < 0 or s % max(a.itemsize, 1) for s in a.strides):
                raise fail(op.name, f"argument '{p.name}' has negative or unaligned strides {a.strides}; pass a copy")
        pr = op.prepare(args, launch_dims, output_dims, self)
        outs = self.forward(pr.plan, pr.arrays, pr.scalars, "cpu", None)
        return outs[0] if len(outs) == 1 else tuple(outs)


BACKEND = NumPyBackend()
