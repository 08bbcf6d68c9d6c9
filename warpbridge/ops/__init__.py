"""Differentiable neighbour ops on point clouds: radius and kNN aggregation, and kNN itself.

Each op builds a balanced kd-tree over the reference points inside the call (median splits:
the same depth on any data, outliers and clusters included), searches it with Warp kernels,
keeps it for the backward, and differentiates with hand-written adjoints
(exact for features, query points and reference points). No neighbour cap, no truncation,
no dense (M, N) intermediate. Deterministic on the CPU, where queries are split over
threads (:func:`set_num_threads`).

The ops are declared with ``wb.op`` like any user's op (see ``_launches``): one launch function
per forward, a hand-written backward attached with ``backward=``, the kd-tree kept for it as
auxiliary outputs. So they run wherever a ``wb.op`` runs: PyTorch (eager, ``torch.compile``,
``torch.func``), JAX, Paddle, and forward-only on NumPy arrays and DLPack producers.
``_searches``, ``_lists``, ``_sampling`` and ``_atomistic`` hold the public functions: they
validate the point clouds (``_checks``) and pick the declared ops for their float type and
dimension (``_op_table``).

Non-finite coordinates never crash and never poison other rows: a reference point with a
NaN or infinite coordinate is nobody's neighbour; a non-finite query point has no neighbours
(a zero row from the aggregations, ``dist = inf`` and ``idx = -1`` from :func:`knn`).
"""

from __future__ import annotations

from ._atomistic import neighbor_list
from ._cpu_launch import get_num_threads as get_num_threads
from ._cpu_launch import set_num_threads as set_num_threads
from ._lent_memory import release_memory as release_memory
from ._lists import Neighbors, knn_graph, radius, radius_graph
from ._sampling import fps
from ._searches import KNN, knn, knn_aggregate, knn_interpolate, radius_aggregate

__all__ = [
    "KNN", "Neighbors", "fps", "get_num_threads", "knn", "knn_aggregate", "knn_graph", "knn_interpolate", "neighbor_list", "radius",
    "radius_aggregate", "radius_graph", "release_memory", "set_num_threads",
]  # fmt: skip
