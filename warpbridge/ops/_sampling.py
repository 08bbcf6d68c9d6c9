"""Farthest point sampling (PointNet++'s and PyG's ``fps``)."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from .._core.errors import WarpBridgeError, describe, fail
from . import _sampling_launches
from ._batches import MAX_CLOUDS
from ._checks import adapter_of, batches, check_clouds
from ._op_table import declared_op, size_on_host, widen

# The most samples one call returns: the kernel addresses them with 32-bit places.
MAX_SAMPLES = (1 << 31) - 1


def fps(
    pos: Any, ratio: float | None = None, *, num: int | None = None, batch: Any = None, random_start: bool = True
) -> Any:
    """Farthest point sampling: per cloud, a start point, then again and again the point
    farthest from all chosen so far (squared Euclidean distances; ties to the smaller index).
    Returns indices into ``pos``, PyG's convention: ``pos[fps(pos, 0.5)]`` is the sample.

    Args:
        pos: (N, D) points, D from 1 to 16.
        ratio: the fraction of each cloud to keep, 0 < ratio <= 1: ``ceil(n * ratio)`` of a
            cloud of ``n`` points (the product rounded in ``pos``'s dtype, as in
            ``torch_cluster.fps``). Default 0.5 unless ``num`` is given.
        num: instead of ``ratio``, the points to keep per cloud (all of a smaller cloud).
        batch: (N,) int64 cloud numbers, sorted (PyG's batch vector): each cloud sampled on
            its own, all in one launch. None (default): one cloud.
        random_start: start from a random point of each cloud, drawn from the framework's
            random state (``torch.manual_seed``, ``np.random.seed``, ``paddle.seed``); with
            False, from each cloud's first point, which gives ``torch_cluster.fps``'s samples.

    Returns:
        (S,) int64 indices into ``pos``, cloud after cloud, each cloud's in the order chosen.
        A point that is not finite is never chosen while a finite one is left.

    Raises:
        WarpBridgeError: wrong types, shapes or dtypes; ratio not in (0, 1] or num < 1, or
            both given; ``random_start=True`` on JAX arrays (JAX keeps no global random state:
            pass False) or wp.arrays; under ``jax.jit`` with ``batch`` (the number of samples
            depends on the data).

    Example::

        idx = wb.ops.fps(pos, 0.25, batch=batch)
        pos_down, batch_down = pos[idx], batch[idx]
    """
    op = "fps"
    a = adapter_of(op, {"pos": pos}, {"batch": batch})
    dtype = check_clouds(op, a, {"pos": pos})
    ratio, num = _ratio_or_num(op, ratio, num)
    if not isinstance(random_start, bool):
        raise fail(op, f"'random_start' must be True or False, got {describe(random_start)}")
    clouds = batches(op, a, {"pos": pos}, {"batch": batch})
    n = a.info(pos)[1][0]
    count = (_last(op, a, clouds[0], MAX_CLOUDS - 1) + 1 if n else 0) if clouds else 1
    args, ops, _ = widen(op, a, {"pos": pos}, dtype)
    cloud_ptr, sample_ptr, first_points = declared_op(ops, "fps_plan", clouds)(*args, *clouds, ratio, num, count)
    start_at = first_points
    if random_start:
        try:
            start_at = a.uniform(pos, count)
        except TypeError as e:
            raise fail(
                op, f"random_start=True draws from the framework's random state: {e}; pass random_start=False"
            ) from e
    if not clouds and isinstance(n, int):  # one cloud of a known size: no read (so it traces under jax.jit)
        n_samples = int(_sampling_launches.sample_counts(np.array([n]), ratio, num, ops_dtype(dtype))[0])
    else:
        n_samples = _last(op, a, sample_ptr, MAX_SAMPLES)
    return ops.fps_sample(args[0], cloud_ptr, sample_ptr, start_at, n_samples)


def ops_dtype(dtype: str) -> Any:
    """The NumPy type a cloud's sample count is rounded in: the points' (float32 for half)."""
    return np.float64 if dtype == "float64" else np.float32


def _ratio_or_num(op: str, ratio: Any, num: Any) -> tuple[float, int]:
    """(ratio, num): one of them given (ratio 0.5 when neither is), the other 0."""
    if num is not None:
        if ratio is not None:
            raise fail(op, f"give 'ratio' or 'num', not both (got ratio={ratio!r}, num={num!r})")
        if isinstance(num, bool) or not isinstance(num, numbers.Integral) or not 1 <= num <= MAX_SAMPLES:
            raise fail(op, f"'num' must be an int from 1 to {MAX_SAMPLES:,}, got {describe(num)}")
        return 0.0, int(num)
    if ratio is None:
        return 0.5, 0
    if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real) or not 0 < float(ratio) <= 1:
        raise fail(op, f"'ratio' must be a number with 0 < ratio <= 1, got {describe(ratio)}")
    return float(ratio), 0


def _last(op: str, a: Any, values: Any, at_most: int) -> int:
    """``values[-1]`` read on the host (a symbolic size under ``torch.compile``)."""

    def too_many(value: int) -> WarpBridgeError:
        return fail(op, f"{value:,} is more than one call handles ({at_most:,})")

    return size_on_host(op, a, values, at_most, too_many, "the number of samples")
