"""Differentiable neighbour ops on point clouds: radius and kNN aggregation, and kNN itself.

Each op builds a balanced kd-tree over the reference points inside the call (median splits:
the same depth on any data, outliers and clusters included), searches it with Warp kernels,
keeps it for the backward, and differentiates with hand-written adjoints
(exact for features, query points and reference points). No neighbour cap, no truncation,
no dense (M, N) intermediate. Deterministic on the CPU, where queries are split over
threads (:func:`set_num_threads`).

Non-finite coordinates never crash and never poison other rows: a reference point with a
NaN or infinite coordinate is nobody's neighbour; a non-finite query point has no neighbours
(a zero row from the aggregations, ``dist = inf`` and ``idx = -1`` from :func:`knn`).
"""

from __future__ import annotations

import importlib
import math
import numbers
import sys
from typing import Any

from .._errors import describe, fail
from ._core import get_num_threads as get_num_threads
from ._core import set_num_threads as set_num_threads

__all__ = ["get_num_threads", "knn", "knn_aggregate", "radius_aggregate", "set_num_threads"]

_ADAPTERS: dict[type, Any] = {}  # array type -> adapter module; a dict lookup torch.compile can trace
_MODULES = {"torch": "torch", "jax": "jax", "jaxlib": "jax", "paddle": "paddle"}  # top-level module -> adapter


def _adapter(op: str, arrays: dict[str, Any]) -> Any:
    mods = {_ADAPTERS.get(type(a)) for a in arrays.values()}
    if len(mods) == 1 and None not in mods:
        return mods.pop()
    found = None
    for name, a in arrays.items():
        top = _MODULES.get(type(a).__module__.partition(".")[0])
        if top is None:
            raise fail(op, f"'{name}' must be a torch.Tensor, jax.Array or paddle.Tensor, got {describe(a)}")
        if found is not None and found != top:
            raise fail(op, f"all arrays must come from one framework, got {found} and {top} ('{name}')")
        found = top
    mod = importlib.import_module(f"warpbridge.ops._{found}")
    for a in arrays.values():
        _ADAPTERS[type(a)] = mod
    return mod


def _preload_torch() -> None:
    # torch.compile cannot trace an import: when torch is already loaded, load its adapter
    # (and register the custom ops) now, so that a first call inside a compiled region finds
    # it in the dict. Frameworks the caller has not imported stay unimported.
    if "torch" in sys.modules:
        _ADAPTERS[sys.modules["torch"].Tensor] = importlib.import_module("warpbridge.ops._torch")


def _check_clouds(op: str, adapter: Any, arrays: dict[str, Any]) -> None:
    """Shapes (.., 3) for points, (N, F) features, one float dtype, one device."""
    metas = {name: adapter.meta(a) for name, a in arrays.items()}
    for name, (dtype, shape, _) in metas.items():
        want = "(N, F)" if name == "features" else f"({'M' if name == 'query' else 'N'}, 3)"
        if len(shape) != 2 or (name != "features" and shape[1] != 3):
            raise fail(op, f"'{name}' must have shape {want}, got {shape}")
        if dtype not in _FLOATS:
            raise fail(op, f"'{name}' must be float16, bfloat16, float32 or float64, got {dtype}")
    (qd, _, qdev) = metas["query"]
    for name, (dtype, _, dev) in metas.items():
        if dtype != qd:
            raise fail(op, f"'{name}' has dtype {dtype} but 'query' has {qd}: all inputs must share one dtype")
        if dev != qdev:
            raise fail(op, f"'{name}' is on {dev} but 'query' is on {qdev}: all inputs must be on one device")
    if "features" in metas and metas["features"][1][0] != metas["ref"][1][0]:
        raise fail(
            op,
            f"'features' must have one row per reference point: 'ref' has {metas['ref'][1][0]} points, "
            f"'features' has shape {metas['features'][1]}",
        )


_FLOATS = ("float16", "bfloat16", "float32", "float64")
_HALF = ("float16", "bfloat16")


def _widen(adapter: Any, arrays: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """float16 and bfloat16 inputs are computed in float32 (distances, weights and sums would
    lose too much in 8 or 11 bits): float32 copies, and the input dtype to return in. The
    casts are ordinary framework ops, so gradients come back in the input dtype."""
    dtype = adapter.meta(arrays["query"])[0]
    if dtype not in _HALF:
        return arrays, None
    return {k: adapter.cast(v, "float32") for k, v in arrays.items()}, dtype


def _positive(op: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise fail(op, f"'{name}' must be a positive Python number, got {describe(value)}")
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise fail(op, f"'{name}' must be positive and finite, got {v!r}")
    return v


def _k(op: str, k: Any, n: int) -> int:
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise fail(op, f"'k' must be an int, got {describe(k)}")
    if not 1 <= k <= n:
        raise fail(op, f"'k' must satisfy 1 <= k <= N = {n} (the number of reference points), got {int(k)}")
    return int(k)


def radius_aggregate(query: Any, ref: Any, features: Any, radius: float, sigma: float) -> Any:
    """Distance-weighted mean of the reference features within ``radius`` of each query point.

    ``out_i = sum_j w_ij f_j / sum_j w_ij`` over the references with ``|q_i - r_j| <= radius``,
    ``w_ij = exp(-|q_i - r_j| / sigma)``; rows with no neighbour are 0. The exponent is shifted
    by the nearest neighbour's distance, so any ``radius / sigma`` gives the weighted mean.
    Differentiable w.r.t. ``query``, ``ref`` and ``features`` (the radius cut-off itself is
    treated as fixed, as in the dense formula); where a query coincides with a reference the
    direction term is taken as 0.

    Args:
        query: (M, 3) query points.
        ref: (N, 3) reference points.
        features: (N, F) reference features, same dtype and device.
        radius: search radius, > 0.
        sigma: distance scale of the weights, > 0.

    Returns:
        (M, F) aggregated features.

    Raises:
        WarpBridgeError: wrong types, shapes, dtypes or devices; radius or sigma not > 0.

    Example::

        out = wb.ops.radius_aggregate(grid, cloud, feats, radius=0.2, sigma=0.1)
    """
    op = "radius_aggregate"
    arrays = {"query": query, "ref": ref, "features": features}
    a = _adapter(op, arrays)
    _check_clouds(op, a, arrays)
    radius, sigma = _positive(op, "radius", radius), _positive(op, "sigma", sigma)
    arrays, half = _widen(a, arrays)
    out = a.radius_aggregate(*arrays.values(), radius, sigma)
    return a.cast(out, half) if half else out


def knn(query: Any, ref: Any, k: int) -> tuple[Any, Any]:
    """The ``k`` nearest reference points of each query point.

    Args:
        query: (M, 3) query points.
        ref: (N, 3) reference points.
        k: neighbours per query, ``1 <= k <= N``.

    Returns:
        ``(dist, idx)``: (M, k) Euclidean distances in ascending order (ties broken by the
        smaller index), differentiable w.r.t. both point sets, and (M, k) int64 indices.

    Raises:
        WarpBridgeError: wrong types, shapes, dtypes or devices; k out of range.

    Example::

        dist, idx = wb.ops.knn(grid, cloud, k=7)
    """
    op = "knn"
    arrays = {"query": query, "ref": ref}
    a = _adapter(op, arrays)
    _check_clouds(op, a, arrays)
    k = _k(op, k, a.meta(ref)[1][0])
    arrays, half = _widen(a, arrays)
    dist, idx = a.knn(*arrays.values(), k)
    return (a.cast(dist, half) if half else dist), idx


def knn_aggregate(query: Any, ref: Any, features: Any, k: int, sigma: float) -> Any:
    """Softmax-weighted sum of the features of the ``k`` nearest reference points.

    ``out_i = sum_n softmax(-dist_i / sigma)_n f_{idx_in}`` over the k nearest (see :func:`knn`).
    Differentiable w.r.t. ``query``, ``ref`` and ``features``.

    Args:
        query: (M, 3) query points.
        ref: (N, 3) reference points.
        features: (N, F) reference features.
        k: neighbours per query, ``1 <= k <= N``.
        sigma: distance scale of the softmax, > 0.

    Returns:
        (M, F) aggregated features.

    Raises:
        WarpBridgeError: wrong types, shapes, dtypes or devices; k out of range; sigma not > 0.

    Example::

        out = wb.ops.knn_aggregate(grid, cloud, feats, k=7, sigma=0.1)
    """
    op = "knn_aggregate"
    arrays = {"query": query, "ref": ref, "features": features}
    a = _adapter(op, arrays)
    _check_clouds(op, a, arrays)
    k, sigma = _k(op, k, a.meta(ref)[1][0]), _positive(op, "sigma", sigma)
    arrays, half = _widen(a, arrays)
    out = a.knn_aggregate(*arrays.values(), k, sigma)
    return a.cast(out, half) if half else out


_preload_torch()
