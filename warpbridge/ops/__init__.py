"""Differentiable neighbour ops on point clouds: radius and kNN aggregation, and kNN itself.

Each op builds a balanced kd-tree over the reference points inside the call (median splits:
the same depth on any data, outliers and clusters included), searches it with Warp kernels,
keeps it for the backward, and differentiates with hand-written adjoints
(exact for features, query points and reference points). No neighbour cap, no truncation,
no dense (M, N) intermediate. Deterministic on the CPU, where queries are split over
threads (:func:`set_num_threads`).

The ops are declared with ``wb.op`` like any user's op (see ``_run``): one launch function
per forward, a hand-written backward attached with ``backward=``, the kd-tree kept for it as
auxiliary outputs. So they run wherever a ``wb.op`` runs: PyTorch (eager, ``torch.compile``,
``torch.func``), JAX, Paddle, and forward-only on NumPy arrays and DLPack producers. This
module only validates the point clouds and picks the ops for their float type.

Non-finite coordinates never crash and never poison other rows: a reference point with a
NaN or infinite coordinate is nobody's neighbour; a non-finite query point has no neighbours
(a zero row from the aggregations, ``dist = inf`` and ``idx = -1`` from :func:`knn`).
"""

from __future__ import annotations

import math
import numbers
import struct
from typing import Any

from .._core import op as _op
from .._core.errors import describe, fail
from . import _declared as _run
from ._launch import get_num_threads as get_num_threads
from ._launch import set_num_threads as set_num_threads

__all__ = ["get_num_threads", "knn", "knn_aggregate", "radius_aggregate", "set_num_threads"]

_WANT = {"query": "(M, 3) points", "ref": "(N, 3) points", "features": "(N, F) features"}


def _adapter(op: str, arrays: dict[str, Any]) -> Any:
    return _op.backend_of(op, [(name, a, _WANT[name]) for name, a in arrays.items()])


def _check_clouds(op: str, adapter: Any, arrays: dict[str, Any]) -> str:
    """Shapes (.., 3) for points, (N, F) features, one float dtype, one device; the dtype."""
    metas = {name: adapter.info(a) for name, a in arrays.items()}
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
    return qd


_FLOATS = ("float16", "bfloat16", "float32", "float64")
_HALF = ("float16", "bfloat16")


def _widen(op: str, adapter: Any, arrays: dict[str, Any], dtype: str) -> tuple[list, Any, str | None]:
    """The arrays, the ops for their float type and, for float16 and bfloat16, the dtype to
    return in: those are computed in float32 (distances, weights and sums would lose too much
    in 8 or 11 bits), through float32 copies made by ordinary framework casts, so gradients
    come back in the input dtype."""
    if dtype not in _HALF:
        return list(arrays.values()), _ops(dtype), None
    try:
        wide = [adapter.cast(v, "float32") for v in arrays.values()]
    except TypeError as e:
        raise fail(op, f"{dtype} inputs are computed in float32, but these arrays cannot be cast: {e}") from e
    return wide, _ops("float32"), dtype


# Declared at import (~45 ms for both), not on first use: a first call may come inside
# torch.compile, which cannot trace making an op.
with _op.deferred_init():
    _DECLARED: dict[str, Any] = {dtype: _run.declared(dtype) for dtype in ("float32", "float64")}


def _ops(dtype: str) -> Any:
    return _DECLARED[dtype]


def _positive(op: str, name: str, value: Any, dtype: str) -> float:
    """A positive, finite number that stays so in the float type the op computes in (float32
    for float16/bfloat16/float32 inputs): ``sigma=1e-50`` is 0 in float32, and every weight NaN."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise fail(op, f"'{name}' must be a positive Python number, got {describe(value)}")
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise fail(op, f"'{name}' must be positive and finite, got {v!r}")
    if dtype != "float64":
        try:
            single = struct.unpack("<f", struct.pack("<f", v))[0]
        except OverflowError:
            single = math.inf
        if not (math.isfinite(single) and single > 0):
            raise fail(
                op,
                f"'{name}' = {v!r} is {'0' if single == 0 else 'inf'} in float32, which {dtype} inputs are computed "
                f"in (its positive values run from 1.4e-45 to 3.4e+38): pass a {name} in that range, or float64 "
                "inputs",
            )
    return v


def _k(op: str, k: Any, n: int) -> int:
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise fail(op, f"'k' must be an int, got {describe(k)}")
    if not 1 <= k <= n:
        raise fail(op, f"'k' must satisfy 1 <= k <= N = {n} (the number of reference points), got {int(k)}")
    return int(k)


def _run_declared(op: str, arrays: dict[str, Any], numbers: Any) -> tuple[Any, Any, str | None]:
    """Validate the clouds ``arrays``, then the op's numeric arguments (``numbers(adapter,
    dtype)``, checked in the dtype the op computes in), and run the declared op: (its result,
    the adapter, the half dtype to cast floating results back to, or None)."""
    a = _adapter(op, arrays)
    dtype = _check_clouds(op, a, arrays)
    extra = numbers(a, dtype)
    args, ops, half = _widen(op, a, arrays, dtype)
    return getattr(ops, op)(*args, *extra), a, half


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
    out, a, half = _run_declared(
        op,
        {"query": query, "ref": ref, "features": features},
        lambda a, dtype: (_positive(op, "radius", radius, dtype), _positive(op, "sigma", sigma, dtype)),
    )
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
    (dist, idx), a, half = _run_declared(
        "knn", {"query": query, "ref": ref}, lambda a, dtype: (_k("knn", k, a.info(ref)[1][0]),)
    )
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
    out, a, half = _run_declared(
        op,
        {"query": query, "ref": ref, "features": features},
        lambda a, dtype: (_k(op, k, a.info(ref)[1][0]), _positive(op, "sigma", sigma, dtype)),
    )
    return a.cast(out, half) if half else out
