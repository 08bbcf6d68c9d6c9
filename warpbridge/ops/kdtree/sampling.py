"""Farthest point sampling: per cloud, a start point, then again and again the point farthest
from everything chosen so far (torch_cluster's ``fps``, PointNet++'s sampling)."""

from __future__ import annotations

import warp as wp

from .dtypes import T, V
from .template import func, kernel


@func
def farthest_step(
    points: wp.array(dtype=V), first: int, n: int, last: int, reach: wp.array(dtype=T), fallback: int
) -> int:
    # Lowers each point's squared distance to the chosen set (`reach`) by its distance to the
    # point chosen last, and returns the place of the largest (the first of equal ones, as
    # torch's argmax); a point that is not finite keeps -1 and is never chosen, `fallback` is
    # returned when no finite point is left.
    p = points[last]
    best, chosen = T(-1.0), fallback
    for j in range(first, first + n):
        d2 = reach[j]
        if d2 >= T(0.0):
            diff = points[j] - p
            d2 = wp.min(d2, wp.dot(diff, diff))
            reach[j] = d2
            if d2 > best:
                best = d2
                chosen = j
    return chosen


@kernel
def fps_clouds(
    points: wp.array(dtype=V),
    cloud_ptr: wp.array(dtype=wp.int64),
    sample_ptr: wp.array(dtype=wp.int64),
    start_at: wp.array(dtype=wp.float64),
    stride: int,
    offset: int,
    reach: wp.array(dtype=T),
    samples: wp.array(dtype=wp.int64),
):
    # Cloud c (points cloud_ptr[c] .. cloud_ptr[c + 1]) sampled into samples[sample_ptr[c] ..
    # sample_ptr[c + 1]]: from the point at fraction start_at[c] of it, or the first finite
    # point after it, else the first finite one (a cloud without one repeats that start).
    # `reach` is scratch, one per point.
    c = wp.tid() * stride + offset
    first, o = int(cloud_ptr[c]), int(sample_ptr[c])
    n, m = int(cloud_ptr[c + 1]) - first, int(sample_ptr[c + 1]) - o
    if m == 0:
        return
    s = wp.min(int(start_at[c] * wp.float64(n)), n - 1)
    for j in range(first, first + n):
        finite = wp.isfinite(points[j])
        reach[j] = wp.where(finite, T(wp.inf), T(-1.0))
    start = first + s
    for j in range(first, first + n):
        if reach[start] < T(0.0) and reach[j] >= T(0.0) and j >= first + s:
            start = j
    if reach[start] < T(0.0):  # none at or after s: the first finite one, else s itself
        for j in range(first + n - 1, first - 1, -1):
            if reach[j] >= T(0.0):
                start = j
    samples[o] = wp.int64(start)
    reach[start] = T(0.0)
    last = start
    for t in range(1, m):
        last = farthest_step(points, first, n, last, reach, last)
        samples[o + t] = wp.int64(last)
