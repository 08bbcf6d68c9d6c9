"""PyTorch3D's ``knn_points`` and ``ball_query`` on warpbridge: padded (N, P, D) batches with
``lengths`` in, PyTorch3D's outputs out (squared distances, its padding), differentiable in
both point sets. ``tests/test_pytorch3d_recipes.py`` runs PyTorch3D's checks against them.

Run it: ``python examples/pytorch3d_recipes.py``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

import warpbridge as wb


class KNN(NamedTuple):
    dists: torch.Tensor  # (N, P1, K) squared distances (|.|_1 with norm=1), 0 where padded
    idx: torch.Tensor  # (N, P1, K) indices into each cloud of p2
    knn: torch.Tensor | None  # (N, P1, K, D) the neighbours, with return_nn


def _packed(p: torch.Tensor, lengths: torch.Tensor | None) -> tuple:
    """The valid points of a padded batch, their batch vector, the mask, and each cloud's start."""
    n, size = p.shape[:2]
    lengths = torch.full((n,), size, dtype=torch.int64, device=p.device) if lengths is None else lengths
    mask = torch.arange(size, device=p.device)[None] < lengths[:, None]
    batch = torch.arange(n, device=p.device)[:, None].expand(n, size)[mask]
    return p[mask], batch, mask, torch.cumsum(lengths, 0) - lengths


def knn_points(p1, p2, lengths1=None, lengths2=None, norm=2, K=1, return_nn=False) -> KNN:
    """PyTorch3D's ``knn_points``: the K nearest of p2 per point of p1, squared Euclidean
    distances (norm=2) or L1 ones (norm=1), sorted; idx and dists padded with 0 where a cloud
    of p2 has fewer than K points or a cloud of p1 ends."""
    q, qb, qmask, _ = _packed(p1, lengths1)
    r, rb, _, starts = _packed(p2, lengths2)
    n, size1 = p1.shape[:2]
    if norm == 1:  # the L1 order is not the L2 one: rank every candidate (small clouds only)
        dist, idx, count = _l1_knn(q, r, qb, rb, K)
    else:
        dist, idx, count = wb.ops.knn(q, r, K, query_batch=qb, ref_batch=rb)
        dist = dist.square()
    valid = idx >= 0
    local = torch.where(valid, idx - starts[qb][:, None], 0)
    dists = p1.new_zeros(n, size1, K).masked_scatter(qmask[..., None], torch.where(valid, dist, 0.0))
    index = torch.zeros(n, size1, K, dtype=torch.int64, device=p1.device).masked_scatter(qmask[..., None], local)
    nn = None
    if return_nn:
        gathered = torch.cat([r, r.new_zeros(1, r.shape[1])])[idx]  # -1 reads the zero row
        nn = p1.new_zeros(n, size1, K, p1.shape[2]).masked_scatter(qmask[..., None, None], gathered)
    return KNN(dists, index, nn)


def _l1_knn(q, r, qb, rb, k):
    """L1 kNN by brute force within clouds, ties by index (PyTorch3D sorts its own that way)."""
    d = (q[:, None] - r[None]).abs().sum(-1).masked_fill(qb[:, None] != rb[None], float("inf"))
    dist, idx = torch.sort(d, dim=1, stable=True)
    dist, idx = dist[:, :k], idx[:, :k]
    if dist.shape[1] < k:
        pad = k - dist.shape[1]
        dist = torch.cat([dist, dist.new_full((len(q), pad), float("inf"))], 1)
        idx = torch.cat([idx, idx.new_full((len(q), pad), -1)], 1)
    idx = torch.where(torch.isinf(dist), -1, idx)
    return dist, idx, (idx >= 0).sum(1)


def ball_query(p1, p2, lengths1=None, lengths2=None, K=500, radius=0.2, return_nn=True) -> KNN:
    """PyTorch3D's ``ball_query``: per point of p1, the first K points of p2 by index with
    squared distance < radius² (strict), not the closest K; dists squared, padded with 0, idx
    with -1, nn with 0."""
    q, qb, qmask, _ = _packed(p1, lengths1)
    r, rb, _, starts = _packed(p2, lengths2)
    n, size1 = p1.shape[:2]
    # every candidate (a hair wider: the strict test below is the one that decides)
    nb = wb.ops.radius(q, r, radius * (1 + 1e-5), query_batch=qb, ref_batch=rb)
    row = torch.repeat_interleave(torch.arange(len(q), device=q.device), nb.count)
    d2 = (q[row] - r[nb.index]).square().sum(-1)  # as PyTorch3D computes it, for its strict test
    keep = d2 < radius * radius
    row, index, d2 = row[keep], nb.index[keep], d2[keep]
    order = torch.argsort(row * len(r) + index)  # each row by index: PyTorch3D's scan order
    row, index, d2 = row[order], index[order], d2[order]
    first = torch.searchsorted(row, torch.arange(len(q), device=q.device))
    rank = torch.arange(len(row), device=q.device) - first[row]
    row, index, d2, rank = row[rank < K], index[rank < K], d2[rank < K], rank[rank < K]
    dist = q.new_zeros(len(q), K).index_put((row, rank), d2)
    idx = torch.full((len(q), K), -1, dtype=torch.int64, device=q.device).index_put(
        (row, rank), index - starts[qb[row]]
    )
    dists = p1.new_zeros(n, size1, K).masked_scatter(qmask[..., None], dist)
    idx = torch.full((n, size1, K), -1, dtype=torch.int64, device=p1.device).masked_scatter(qmask[..., None], idx)
    nn = None
    if return_nn:
        found = q.new_zeros(len(q), K, q.shape[1]).index_put((row, rank), r[index])
        nn = p1.new_zeros(n, size1, K, p1.shape[2]).masked_scatter(qmask[..., None, None], found)
    return KNN(dists, idx, nn)


if __name__ == "__main__":
    g = torch.Generator().manual_seed(0)
    p1, p2 = torch.rand(2, 500, 3, generator=g), torch.rand(2, 800, 3, generator=g)
    out = knn_points(p1, p2, lengths2=torch.tensor([800, 5]), K=8, return_nn=True)
    print("knn_points:", tuple(out.dists.shape), "padding in cloud 1:", out.dists[1, 0].tolist()[-3:])
    out = ball_query(p1, p2, K=16, radius=0.1)
    print("ball_query:", tuple(out.idx.shape), "found per point:", (out.idx >= 0).sum(-1).float().mean().item())
