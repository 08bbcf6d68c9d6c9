"""Whether arrays a launch function filled outside Warp's tape hold constants or values of
its inputs: the tape shows neither how they were filled nor from what, so the function is
run again on perturbed inputs and the arrays compared.

No ``from __future__ import annotations`` here: the kernel's annotations must be objects.
"""

from collections.abc import Sequence
from typing import Any

import warp as wp

from .plan import host_bytes
from .warp_runtime import tape_contents


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


def changed(func: Any, args: list, moved: Sequence[int], fills: Sequence[tuple]) -> list:
    """Run ``func`` on ``args`` with the array arguments at positions ``moved`` perturbed (the
    caller passes fresh outputs), recorded on a ``wp.Tape``; return the arrays of ``fills``
    ((launch index, parameter label, array) from the first run) whose counterparts in this run
    differ, or that this run has no counterpart for (its launches differ)."""
    args = [perturbed(a) if k in moved else a for k, a in enumerate(args)]
    probe = wp.Tape()
    with probe:
        func(*args)
    launches = tape_contents(probe).launches
    found = []
    for n, label, a in fills:
        b = dict(launches[n].arrays).get(label) if n < len(launches) else None
        if b is None or b.shape != a.shape or b.dtype != a.dtype or host_bytes(b) != host_bytes(a):
            found.append(a)
    return found
