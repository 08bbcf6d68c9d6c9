"""Whether what a launch function filled outside Warp's tape (arrays no recorded launch
writes, numbers its kernels take by value) holds constants or values of its inputs: the tape
shows neither how they were filled nor from what, so the function is run again on perturbed
inputs and they are compared.

No ``from __future__ import annotations`` here: the kernel's annotations must be objects.
"""

import struct
from collections.abc import Sequence
from typing import Any

import warp as wp

from .plan import host_bytes
from .warp_runtime import OwnTape, tape_contents


@wp.kernel(enable_backward=False)
def _perturb(x: wp.array(dtype=Any)):
    # every element moves, zeros included: a value that depends on them moves too
    i = wp.tid()
    x[i] = x[i] * type(x[i])(1.01) + type(x[i])(0.001)


def perturbed(a: Any) -> Any:
    """A contiguous copy of floating array ``a`` with every scalar moved (x * 1.01 + 0.001)."""
    copy = wp.clone(a, requires_grad=False)
    scalar = getattr(a.dtype, "_wp_scalar_type_", a.dtype)  # a vector's or matrix's scalar
    n = copy.size * (wp.types.type_size_in_bytes(a.dtype) // wp.types.type_size_in_bytes(scalar))
    flat = wp.array(ptr=copy.ptr, dtype=scalar, shape=(n,), device=copy.device)
    wp.launch(_perturb, dim=n, inputs=[flat], device=copy.device)
    return copy


def places(launches: Sequence[Any]) -> list:
    """Each recorded launch's place: (kernel, how many launches of that kernel came before),
    which a re-run whose loops ran more or fewer times still shares for what both ran."""
    seen: dict = {}
    found = []
    for launch in launches:
        n = seen.get(launch.kernel, 0)
        seen[launch.kernel] = n + 1
        found.append((launch.kernel, n))
    return found


def input_dependent(
    func: Any, args: list, n_inputs: int, moved: Sequence[int], fills: Sequence[tuple], values: Sequence[tuple]
) -> tuple:
    """What of the first run of ``func`` on ``args`` (its first ``n_inputs`` are inputs) moves
    with the inputs at positions ``moved``: ``fills``, (place, parameter label, array), and
    ``values``, (place, label, number) a launch took by value. Returns the arrays and the
    (kernel, label) of the numbers that moved on perturbed inputs but not in one more run on
    the same inputs (what moves there is randomness, not a value of the inputs)."""
    arrays, numbers = _changed(func, args, n_inputs, moved, fills, values)
    if arrays or numbers:
        random_arrays, random_numbers = _changed(func, args, n_inputs, [], fills, values)
        arrays = [a for a in arrays if not any(a is b for b in random_arrays)]
        numbers = [n for n in numbers if n not in random_numbers]
    return arrays, numbers


def _changed(
    func: Any, args: list, n_inputs: int, moved: Sequence[int], fills: Sequence[tuple], values: Sequence[tuple]
) -> tuple:
    """Run ``func`` on fresh zeroed outputs, with the array inputs at positions ``moved``
    perturbed, recorded on a ``wp.Tape``, and compare with the first run. Returns the arrays
    of ``fills`` that differ or that this run has no counterpart for, and the (kernel, label)
    of the numbers that differ (one this run has no counterpart for, as when a loop ran fewer
    times, is left out)."""
    outputs = [wp.zeros_like(y, requires_grad=False) for y in args[n_inputs:]]
    args = [perturbed(a) if k in moved else a for k, a in enumerate(args[:n_inputs])] + outputs
    probe = OwnTape()
    with probe:
        func(*args)
    launches = tape_contents(probe).launches
    at = dict(zip(places(launches), launches))
    arrays = []
    for place, label, a in fills:
        b = dict(at[place].arrays).get(label) if place in at else None
        if b is None or b.shape != a.shape or b.dtype != a.dtype or host_bytes(b) != host_bytes(a):
            arrays.append(a)
    numbers = [
        (place[0], label)
        for place, label, v in values
        if place in at and _bits(dict(at[place].args).get(label)) != _bits(v)
    ]
    return arrays, numbers


def _bits(v: Any) -> bytes:
    """A number's bits (NaN equals NaN): a Python float, a Warp scalar, vector or matrix."""
    v = getattr(v, "value", v)
    return struct.pack("<d", v) if isinstance(v, float) else bytes(v)
