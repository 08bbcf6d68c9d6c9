"""Farthest point sampling as two ops: ``fps_plan`` turns the batch vector into each cloud's
points and samples (offsets) and gives the start fractions of a sampling from each cloud's
first point (zeros), the caller reads the number of samples, ``fps_sample`` samples every
cloud in one launch from the start fractions it is given (``kdtree.sampling``).

No ``from __future__ import annotations``: the launch functions' annotations are read as
Warp types (as in ``_launches``)."""

import functools
from typing import Any

import numpy as np
import warp as wp

from . import _batches, _tree
from . import _cpu_launch as cpu_launch

FPS_LANES = 256  # threads per cloud on CUDA


def sample_counts(points: np.ndarray, ratio: float, num: int, dtype: Any) -> np.ndarray:
    """Each cloud's samples: ``min(num, n)`` with ``num`` > 0, else ``ceil(n * ratio)`` with
    the product rounded in the points' dtype, as torch_cluster computes it."""
    if num > 0:
        return np.minimum(points, num)
    product = points.astype(dtype) * np.asarray(ratio, dtype=dtype)
    return np.minimum(np.ceil(product).astype(np.int64), points)


def _plan(x: wp.array, batch: wp.array, ratio: float, num: int, cloud_ptr: wp.array, sample_ptr: wp.array) -> None:
    """Each cloud's first point and first sample, as offsets (a last entry for the end)."""
    n, clouds = x.shape[0], cloud_ptr.shape[0] - 1
    if batch.shape[0] == 0:
        points = np.array([n] * clouds, dtype=np.int64)
    else:
        points = np.bincount(_batches.batch_values("fps", "batch", batch), minlength=clouds).astype(np.int64)
    samples = sample_counts(points, ratio, num, np.float32 if x.dtype._wp_scalar_type_ is wp.float32 else np.float64)
    cloud_ptr.assign(np.concatenate([[0], np.cumsum(points)]))
    sample_ptr.assign(np.concatenate([[0], np.cumsum(samples)]))


@functools.cache
def declared(dtype: str, dim: int = 3) -> dict:
    """The sampling ops' launch functions and ``wb.op`` options for one float type and points
    of ``dim`` coordinates, by name (see ``_launches.declared``)."""
    T = wp.float32 if dtype == "float32" else wp.float64
    Points, Offsets = wp.array(dtype=wp.types.vector(dim, T)), wp.array(dtype=wp.int64)

    def fps_plan(
        x: Points, batch: Offsets, ratio: wp.float64, num: int, clouds: int,
        cloud_ptr: Offsets, sample_ptr: Offsets, first_points: wp.array(dtype=wp.float64),
    ):  # fmt: skip
        _plan(x, batch, ratio, num, cloud_ptr, sample_ptr)
        first_points.zero_()

    def fps_sample(
        x: Points, cloud_ptr: Offsets, sample_ptr: Offsets, start_at: wp.array(dtype=wp.float64), n_samples: int,
        samples: Offsets,
    ):  # fmt: skip
        k, clouds, device = _tree.kernels_for(dtype, x.device, dim), cloud_ptr.shape[0] - 1, x.device
        reach = wp.empty(x.shape[0], dtype=T, device=device)
        before = [x, cloud_ptr, sample_ptr, start_at]
        if device.is_cuda:  # a thread block per cloud
            wp.launch_tiled(
                k.fps_clouds_tiled, dim=[clouds], inputs=[*before, reach, samples], block_dim=FPS_LANES, device=device
            )
            return
        threads = min(cpu_launch.get_num_threads(), clouds)
        # one cloud per share (interleaved, as a scatter splits): a chunk of clouds would go to one thread
        cpu_launch.launch_queries(k.fps_clouds, clouds, threads, before, [reach, samples], device, None, True)

    def plan_dims(x, batch, ratio, num, clouds):
        return {"cloud_ptr": (clouds + 1,), "sample_ptr": (clouds + 1,), "first_points": (clouds,)}

    def sample_dims(x, cloud_ptr, sample_ptr, start_at, n_samples):
        return (n_samples,)

    return dict(
        fps_plan=dict(fn=fps_plan, num_outputs=3, output_dims=plan_dims),
        fps_sample=dict(fn=fps_sample, num_outputs=1, output_dims=sample_dims),
    )
