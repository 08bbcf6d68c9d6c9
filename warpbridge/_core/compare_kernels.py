"""A Warp kernel comparing two arrays within a tolerance, for the core, which reads no array
on the host through a framework: the launch-function re-run check (``gradients``)."""

from typing import Any

import warp as wp


@wp.kernel(enable_backward=False)
def count_differing(a: wp.array(dtype=Any), b: wp.array(dtype=Any), tol: wp.float64, count: wp.array(dtype=wp.int32)):
    """Adds 1 to ``count[0]`` per element where ``a`` and ``b`` differ by more than ``tol``
    (relative, and absolute near 0); equal values and NaN in both are the same."""
    i = wp.tid()
    x = wp.float64(a[i])
    y = wp.float64(b[i])
    if x == y or (x != x and y != y):
        return
    if wp.abs(x - y) > tol * (wp.float64(1.0) + wp.abs(y)) or x != x or y != y:
        wp.atomic_add(count, 0, 1)
