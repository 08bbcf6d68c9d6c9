"""The searches whose results are rows of neighbours or aggregated features, as public
functions: ``knn``, ``knn_aggregate``, ``knn_interpolate`` and ``radius_aggregate``."""

from __future__ import annotations

from typing import Any, NamedTuple

from ._op_table import run_declared


class KNN(NamedTuple):
    """The k nearest reference points of each query: row ``i`` holds ``count[i]`` of them,
    then padding (``dist`` inf, ``idx`` -1) where its cloud has fewer than k points or the
    query is not finite. Mask with ``idx >= 0`` (or the first ``count[i]`` entries) before
    indexing: -1 would read the last point."""

    dist: Any  #: (M, k) Euclidean distances, ascending (ties by the smaller index), differentiable
    idx: Any  #: (M, k) int64 indices into ``ref``, -1 past ``count``
    count: Any  #: (M,) int64 neighbours found per query: min(k, points of its cloud), 0 if not finite


def knn(query: Any, ref: Any, k: int, *, query_batch: Any = None, ref_batch: Any = None) -> KNN:
    """The ``k`` nearest reference points of each query point: ``knn(query, ref, k)``, the
    points searched for first (PyTorch3D's ``knn_points(p1, p2, K)`` order; torch_cluster's
    ``knn(x, y, k)`` takes the searched set ``x`` first).

    Args:
        query: (M, D) query points, D from 1 to 4096 (3-D is the fastest path; past 16, an exact
            brute force per cloud).
        ref: (N, D) reference points, same D.
        k: neighbours per query, ``k >= 1``; rows past a cloud's size are padded.
        query_batch, ref_batch: (M,) and (N,) int64 cloud numbers, sorted (PyG's batch
            vectors): each query's neighbours come from its own cloud only, one search for
            the whole batch. None (default): one cloud. See ``docs/batches.md``.

    Returns:
        :class:`KNN` ``(dist, idx, count)``: (M, k) distances ascending (ties by the smaller
        index), differentiable w.r.t. both point sets; (M, k) int64 indices into ``ref``; (M,)
        int64 number found per row. Past ``count[i]`` a row is padded with ``inf`` and -1.

    Raises:
        WarpBridgeError: wrong types, shapes, dtypes or devices; k < 1.

    Example::

        dist, idx, count = wb.ops.knn(grid, cloud, k=7)
        valid = idx >= 0  # all True unless a cloud is short or a query is not finite
    """
    batch = {"query_batch": query_batch, "ref_batch": ref_batch}
    return KNN(*run_declared("knn", {"query": query, "ref": ref}, batch, k=k))


def knn_aggregate(
    query: Any, ref: Any, features: Any, k: int, sigma: float, *, query_batch: Any = None, ref_batch: Any = None
) -> Any:
    """Softmax-weighted sum of the features of the ``k`` nearest reference points.

    ``out_i = sum_n softmax(-dist_i / sigma)_n f_{idx_in}`` over the k nearest (see :func:`knn`).
    Differentiable w.r.t. ``query``, ``ref`` and ``features``.

    Args:
        query: (M, D) query points, D from 1 to 4096 (3-D is the fastest path; past 16, an
            exact brute force per cloud).
        ref: (N, D) reference points, same D.
        features: (N, F) reference features.
        k: neighbours per query, ``k >= 1``; a query with fewer aggregates the ones it has.
        sigma: distance scale of the softmax, > 0.
        query_batch, ref_batch: as in :func:`knn`; a query whose cloud has fewer than k
            points aggregates the ones it has.

    Returns:
        (M, F) aggregated features.

    Raises:
        WarpBridgeError: wrong types, shapes, dtypes or devices; k < 1; sigma not > 0.

    Example::

        out = wb.ops.knn_aggregate(grid, cloud, feats, k=7, sigma=0.1)
    """
    clouds = {"query": query, "ref": ref, "features": features}
    batch = {"query_batch": query_batch, "ref_batch": ref_batch}
    return run_declared("knn_aggregate", clouds, batch, k=k, sigma=sigma)


def knn_interpolate(x: Any, pos_x: Any, pos_y: Any, batch_x: Any = None, batch_y: Any = None, k: int = 3) -> Any:
    """PyG's ``knn_interpolate`` (PointNet++ feature propagation): the features ``x`` at the
    points ``pos_x`` carried to the points ``pos_y``, each a weighted mean over its ``k``
    nearest in ``pos_x``, with weights ``1 / max(d^2, 1e-16)``.

    Unlike PyG's (whose weights are computed without gradient), differentiable w.r.t.
    ``x``, ``pos_x`` and ``pos_y``. A target point on a source point takes that point's
    features (no NaN); one whose cloud has fewer than ``k`` points averages those it has; one
    that is not finite gets zeros.

    Args:
        x: (N, F) features of the source points.
        pos_x: (N, D) source points, D from 1 to 4096 (past 16, an exact brute force per cloud).
        pos_y: (M, D) target points.
        batch_x, batch_y: (N,) and (M,) int64 cloud numbers, sorted, or None (one cloud).
        k: neighbours per target point (default 3).

    Returns:
        (M, F) interpolated features.

    Raises:
        WarpBridgeError: wrong types, shapes, dtypes or devices; k < 1.

    Example::

        up = wb.ops.knn_interpolate(x, pos_coarse, pos_fine, batch_coarse, batch_fine, k=3)
    """
    clouds = {"pos_y": pos_y, "pos_x": pos_x, "x": x}
    batch = {"batch_y": batch_y, "batch_x": batch_x}
    return run_declared("knn_interpolate", clouds, batch, k=k)


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
    clouds = {"query": query, "ref": ref, "features": features}
    batch = {"query_batch": query_batch, "ref_batch": ref_batch}
    return run_declared("radius_aggregate", clouds, batch, radius=radius, sigma=sigma)
