"""Ragged batches: PyG's sorted batch vectors, read on the host, and the clouds they make
(the layout of a kd-tree forest, one tree per cloud, see ``kdtree.geometry.cloud_of``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import warp as wp

from .._core.errors import fail
from . import kdtree

# The most clouds in a batch: cloud numbers are int32 in the kernels.
MAX_CLOUDS = 1 << 30


def batch_values(op: str, name: str, batch: wp.array) -> np.ndarray:
    """A batch vector's values on the host, checked: non-negative, sorted, below MAX_CLOUDS."""
    values = batch.numpy()
    if values.size == 0:
        return values
    low, high = int(values.min()), int(values.max())
    if low < 0 or high >= MAX_CLOUDS:
        raise fail(op, f"'{name}' must hold cloud numbers from 0 to {MAX_CLOUDS - 1}, got values from {low} to {high}")
    steps = np.flatnonzero(values[1:] < values[:-1])
    if steps.size:
        at = int(steps[0]) + 1
        raise fail(
            op,
            f"'{name}' must be sorted (each cloud's points together, clouds in increasing order, as PyG's batch "
            f"vectors are), but {name}[{at}] = {int(values[at])} follows {name}[{at - 1}] = {int(values[at - 1])}",
        )
    return values


def cloud_count(*values: np.ndarray) -> int:
    """The number of clouds: one more than the largest cloud number in any of ``values``."""
    return max((int(v[-1]) + 1 for v in values if v.size), default=0)


def tree_depths(counts: np.ndarray) -> np.ndarray:
    """Per cloud of ``counts`` points, the depth of its tree: the fewest levels that leave at
    most LEAF_SIZE points per leaf (0 for an empty cloud)."""
    leaves_wanted = np.maximum(-(-counts // kdtree.LEAF_SIZE) - 1, 0)
    return np.frexp(leaves_wanted.astype(np.float64))[1].astype(np.int64)  # bit lengths


def clouds(values: np.ndarray, count: int, device: Any) -> tuple[wp.array, int, int, int]:
    """The forest over points of the sorted cloud numbers ``values``, ``count`` clouds: per
    cloud (first place, points, first node, depth) as a (count,) vec4i array, the forest's
    node count, the most points in one cloud and the deepest tree's depth."""
    points = np.bincount(values, minlength=count).astype(np.int64)
    depths = tree_depths(points)
    nodes = np.int64(2) << depths
    table = np.empty((count, 4), dtype=np.int32)
    table[:, 0] = np.cumsum(points) - points
    table[:, 1] = points
    table[:, 2] = np.cumsum(nodes) - nodes
    table[:, 3] = depths
    total = int(nodes.sum())
    if total >= 1 << 31:
        raise OverflowError(f"a forest of {total} nodes: more than 32-bit node numbers address")
    deepest = int(depths.max(initial=0))
    return wp.array(table, dtype=wp.vec4i, device=device), total, int(points.max(initial=0)), deepest
