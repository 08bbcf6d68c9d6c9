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

from typing import Any

from ._checks import k_of, positive, run_declared
from ._launch import get_num_threads as get_num_threads
from ._launch import set_num_threads as set_num_threads
from ._lists import Neighbors, knn_graph, radius, radius_graph

__all__ = [
    "Neighbors", "get_num_threads", "knn", "knn_aggregate", "knn_graph", "radius", "radius_aggregate",
    "radius_graph", "set_num_threads",
]  # fmt: skip


def radius_aggregate(
    query: Any, ref: Any, features: Any, radius: float, sigma: float, *, query_batch: Any = None, ref_batch: Any = None
) -> Any:
    """Distance-weighted mean of the reference features within ``radius`` of each query point.

    ``out_i = sum_j w_ij f_j / sum_j w_ij`` over the references with ``|q_i - r_j| <= radius``,
    ``w_ij = exp(-|q_i - r_j| / sigma)``; rows with no neighbour are 0. The exponent is shifted
    by the nearest neighbour's distance, so any ``radius / sigma`` gives the weighted mean.
    Differentiable w.r.t. ``query``, ``ref`` and ``features`` (the radius cut-off itself is
    treated as fixed, as in the dense formula); where a query coincides with a reference the
    direction term is taken as 0.

    Args:
        query: (M, D) query points, D from 1 to 16 (3-D is the fastest path).
        ref: (N, D) reference points, same D.
        features: (N, F) reference features, same dtype and device.
        radius: search radius, > 0.
        sigma: distance scale of the weights, > 0.
        query_batch, ref_batch: (M,) and (N,) int64 cloud numbers, sorted (PyG's batch
            vectors): each query sees only the references of its own cloud. None (default):
            one cloud. See ``docs/batches.md``.

    Returns:
        (M, F) aggregated features.

    Raises:
        WarpBridgeError: wrong types, shapes, dtypes or devices; radius or sigma not > 0.

    Example::

        out = wb.ops.radius_aggregate(grid, cloud, feats, radius=0.2, sigma=0.1)
    """
    op = "radius_aggregate"
    out, a, half = run_declared(
        op,
        {"query": query, "ref": ref, "features": features},
        lambda a, dtype: (positive(op, "radius", radius, dtype), positive(op, "sigma", sigma, dtype)),
        {"query_batch": query_batch, "ref_batch": ref_batch},
    )
    return a.cast(out, half) if half else out


def knn(query: Any, ref: Any, k: int, *, query_batch: Any = None, ref_batch: Any = None) -> tuple[Any, Any]:
    """The ``k`` nearest reference points of each query point.

    Args:
        query: (M, D) query points, D from 1 to 16 (3-D is the fastest path).
        ref: (N, D) reference points, same D.
        k: neighbours per query, ``1 <= k <= N``.
        query_batch, ref_batch: (M,) and (N,) int64 cloud numbers, sorted (PyG's batch
            vectors): each query's neighbours come from its own cloud only, one search for
            the whole batch. None (default): one cloud. See ``docs/batches.md``.

    Returns:
        ``(dist, idx)``: (M, k) Euclidean distances in ascending order (ties broken by the
        smaller index), differentiable w.r.t. both point sets, and (M, k) int64 indices
        into ``ref``; a query whose cloud has fewer than k points pads its row with
        ``inf`` and -1.

    Raises:
        WarpBridgeError: wrong types, shapes, dtypes or devices; k out of range.

    Example::

        dist, idx = wb.ops.knn(grid, cloud, k=7)
    """
    (dist, idx), a, half = run_declared(
        "knn",
        {"query": query, "ref": ref},
        lambda a, dtype: (k_of("knn", k, a.info(ref)[1][0]),),
        {"query_batch": query_batch, "ref_batch": ref_batch},
    )
    return (a.cast(dist, half) if half else dist), idx


def knn_aggregate(
    query: Any, ref: Any, features: Any, k: int, sigma: float, *, query_batch: Any = None, ref_batch: Any = None
) -> Any:
    """Softmax-weighted sum of the features of the ``k`` nearest reference points.

    ``out_i = sum_n softmax(-dist_i / sigma)_n f_{idx_in}`` over the k nearest (see :func:`knn`).
    Differentiable w.r.t. ``query``, ``ref`` and ``features``.

    Args:
        query: (M, D) query points, D from 1 to 16 (3-D is the fastest path).
        ref: (N, D) reference points, same D.
        features: (N, F) reference features.
        k: neighbours per query, ``1 <= k <= N``.
        sigma: distance scale of the softmax, > 0.
        query_batch, ref_batch: as in :func:`knn`; a query whose cloud has fewer than k
            points aggregates the ones it has.

    Returns:
        (M, F) aggregated features.

    Raises:
        WarpBridgeError: wrong types, shapes, dtypes or devices; k out of range; sigma not > 0.

    Example::

        out = wb.ops.knn_aggregate(grid, cloud, feats, k=7, sigma=0.1)
    """
    op = "knn_aggregate"
    out, a, half = run_declared(
        op,
        {"query": query, "ref": ref, "features": features},
        lambda a, dtype: (k_of(op, k, a.info(ref)[1][0]), positive(op, "sigma", sigma, dtype)),
        {"query_batch": query_batch, "ref_batch": ref_batch},
    )
    return a.cast(out, half) if half else out
