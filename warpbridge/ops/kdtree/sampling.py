"""Farthest point sampling: per cloud, a start point, then again and again the point farthest
from everything chosen so far (torch_cluster's ``fps``, PointNet++'s sampling)."""

from __future__ import annotations

import warp as wp

from .dtypes import T, V
from .template import func, kernel


@func
def lowered_reach(points: wp.array(dtype=V), j: int, p: V, reach: wp.array(dtype=T)) -> T:
    # Point j's squared distance to the chosen set (`reach`), lowered by its distance to the
    # point `p` chosen last; -1 stays -1 (a point that is not finite, never chosen).
    d2 = reach[j]
    if d2 >= T(0.0):
        diff = points[j] - p
        d2 = wp.min(d2, wp.dot(diff, diff))
        reach[j] = d2
    return d2


@func
def farthest_of(points: wp.array(dtype=V), first: int, end: int, step: int, p: V, reach: wp.array(dtype=T)) -> wp.vec2i:
    # Lowers the reach of points first, first + step, ... (< end) by the point `p` chosen last;
    # returns (1 if any is finite else 0, the place of the largest: the first of equal ones, as
    # torch's argmax).
    best, chosen = T(-1.0), first
    for j in range(first, end, step):
        d2 = lowered_reach(points, j, p, reach)
        if d2 > best:
            best = d2
            chosen = j
    return wp.vec2i(wp.where(best >= T(0.0), 1, 0), chosen)


@func
def start_point(points: wp.array(dtype=V), first: int, n: int, fraction: wp.float64) -> int:
    # The point at `fraction` of the cloud, or the first finite point after it, else the first
    # finite one; that place itself in a cloud without one.
    s = first + wp.min(int(fraction * wp.float64(n)), n - 1)
    start, found = s, int(0)
    for j in range(s, first + n):
        if found == 0 and wp.isfinite(points[j]):
            start, found = j, 1
    for j in range(first, s):
        if found == 0 and wp.isfinite(points[j]):
            start, found = j, 1
    return start


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
    # sample_ptr[c + 1]] from its start point (a cloud without a finite point repeats it).
    # `reach` is scratch, one per point.
    c = wp.tid() * stride + offset
    first, o = int(cloud_ptr[c]), int(sample_ptr[c])
    n, m = int(cloud_ptr[c + 1]) - first, int(sample_ptr[c + 1]) - o
    if m == 0:
        return
    start = start_point(points, first, n, start_at[c])
    for j in range(first, first + n):
        reach[j] = wp.where(wp.isfinite(points[j]), T(wp.inf), T(-1.0))
    samples[o] = wp.int64(start)
    reach[start] = T(0.0)
    last = start
    for t in range(1, m):
        found = farthest_of(points, first, first + n, 1, points[last], reach)
        if found[0] == 1:  # else no finite point is left: the last one again
            last = found[1]
        samples[o + t] = wp.int64(last)


@kernel
def fps_clouds_tiled(
    points: wp.array(dtype=V),
    cloud_ptr: wp.array(dtype=wp.int64),
    sample_ptr: wp.array(dtype=wp.int64),
    start_at: wp.array(dtype=wp.float64),
    reach: wp.array(dtype=T),
    samples: wp.array(dtype=wp.int64),
):
    # fps_clouds with a thread block per cloud (CUDA): lane l keeps the points first + l,
    # first + l + lanes, ...; each step's farthest point is the largest of the lanes' (the
    # first of equal ones), found by two block reductions.
    c, lane = wp.tid()
    lanes = wp.block_dim()
    first, o = int(cloud_ptr[c]), int(sample_ptr[c])
    n, m = int(cloud_ptr[c + 1]) - first, int(sample_ptr[c + 1]) - o
    start = first
    if m > 0:
        start = start_point(points, first, n, start_at[c])
    for j in range(first + lane, first + n, lanes):
        reach[j] = wp.where(j == start, T(0.0), wp.where(wp.isfinite(points[j]), T(wp.inf), T(-1.0)))
    if lane == 0 and m > 0:
        samples[o] = wp.int64(start)
    last = start
    for t in range(1, m):
        found = farthest_of(points, first + lane, first + n, lanes, points[last], reach)
        best = T(-1.0)
        if found[0] == 1:
            best = reach[found[1]]
        top = wp.tile_max(wp.tile(best))[0]
        pick = wp.tile_min(wp.tile(wp.where(found[0] == 1 and best == top, found[1], first + n)))[0]
        if top >= T(0.0):
            last = pick
        if lane == 0:
            samples[o + t] = wp.int64(last)
