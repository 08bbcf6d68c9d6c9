"""The dtypes the core knows by name: their sizes, their Warp scalar types, the raw-bit form
16-bit float scalars travel in, and packed strides. A leaf: it imports nothing of the core but
the signature's scalar names."""

from __future__ import annotations

import ctypes
import math
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .signature import _SCALAR_NAMES

if TYPE_CHECKING:
    from .signature import Param

ITEMSIZE = {
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "int16": 2, "int32": 4, "int64": 8,
    "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1,
}  # fmt: skip
WARP_TYPES = {name: t for t, name in _SCALAR_NAMES.items()}  # dtype name -> Warp scalar type


def _float_to_half_bits(f: float) -> int:
    return struct.unpack("<H", struct.pack("<e", f))[0]  # round to nearest even, as Warp's


def _half_bits_to_float(bits: int) -> float:
    return struct.unpack("<e", struct.pack("<H", bits))[0]


def _float_to_bfloat16_bits(f: float) -> int:
    bits = struct.unpack("<I", struct.pack("<f", f))[0] if abs(f) < 3.5e38 or not math.isfinite(f) else None
    if bits is None:  # past float32's range: inf of the same sign
        return 0xFF80 if f < 0 else 0x7F80
    if (bits & 0x7F800000) == 0x7F800000 and bits & 0x7FFFFF:
        return (bits >> 16) | 0x40  # a NaN stays a (quiet) NaN
    return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even, as Warp's


def _bfloat16_bits_to_float(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


# float16 / bfloat16 scalars travel as raw bits (no Warp runtime needed to convert them)
HALF_BITS = {
    "float16": (_float_to_half_bits, _half_bits_to_float),
    "bfloat16": (_float_to_bfloat16_bits, _bfloat16_bits_to_float),
}


def itemsize(p: Param) -> int:
    """Bytes per scalar element of ``p`` (per struct for an array of structs)."""
    size = ITEMSIZE.get(p.dtype_name)
    return size if size is not None else ctypes.sizeof(p.wp_type.dtype.ctype)


def contiguous_strides(shape: Sequence[int], itemsize: int) -> tuple[int, ...]:
    strides, acc = [], itemsize
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))
