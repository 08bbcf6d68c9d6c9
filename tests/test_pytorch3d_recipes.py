"""PyTorch3D's ``knn_points`` and ``ball_query`` checks, reproduced against the recipes in
``examples/pytorch3d_recipes.py`` (docs/pyg.md): a naive loop of each op's definition as the
reference, padded batches with lengths, forward and gradients in float64."""

from __future__ import annotations

import itertools
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import pytorch3d_recipes as p3d  # noqa: E402


def naive_knn(p1, p2, lengths1, lengths2, k, norm):
    n, size1, _ = p1.shape
    dists, idx = p1.new_zeros(n, size1, k), torch.zeros(n, size1, k, dtype=torch.int64)
    for b in range(n):
        a, c = int(lengths1[b]), int(lengths2[b])
        diff = p1[b, :a, None] - p2[b, None, :c]
        d = diff.square().sum(-1) if norm == 2 else diff.abs().sum(-1)
        found = min(c, k)
        for i in range(a):
            value, order = torch.sort(d[i], stable=True)
            dists[b, i, :found], idx[b, i, :found] = value[:found], order[:found]
    return dists, idx


def naive_ball_query(p1, p2, lengths1, lengths2, k, radius):
    n, size1, _ = p1.shape
    dists, idx = p1.new_zeros(n, size1, k), torch.full((n, size1, k), -1, dtype=torch.int64)
    for b in range(n):
        for i in range(int(lengths1[b])):
            count = 0
            for j in range(int(lengths2[b])):
                d2 = (p2[b, j] - p1[b, i]).square().sum()
                if d2 < radius * radius and count < k:
                    dists[b, i, count], idx[b, i, count] = d2, j
                    count += 1
    return dists, idx


def _clouds(n, size1, size2, dim, seed):
    g = torch.Generator().manual_seed(seed)
    p1 = torch.rand(n, size1, dim, dtype=torch.float64, generator=g).requires_grad_()
    p2 = torch.rand(n, size2, dim, dtype=torch.float64, generator=g).requires_grad_()
    lengths1 = torch.randint(0, size1 + 1, (n,), generator=g)
    lengths2 = torch.randint(0, size2 + 1, (n,), generator=g)
    return p1, p2, lengths1, lengths2


def _gradients(outputs, inputs, seed):
    g = torch.Generator().manual_seed(seed)
    weights = [torch.randn(o.shape, dtype=o.dtype, generator=g) for o in outputs]
    loss = sum((o * w).sum() for o, w in zip(outputs, weights))
    return torch.autograd.grad(loss, inputs, allow_unused=True, materialize_grads=True)


CASES = list(itertools.product([1, 4], [(12, 30), (40, 9)], [3, 5], [1, 3, 10]))


@pytest.mark.parametrize("norm", [1, 2])
@pytest.mark.parametrize(("n", "sizes", "dim", "k"), CASES)
def test_knn_points_matches_pytorch3ds_definition(n, sizes, dim, k, norm):
    p1, p2, l1, l2 = _clouds(n, *sizes, dim, seed=n * 100 + dim * 10 + k)
    ours = p3d.knn_points(p1, p2, l1, l2, norm=norm, K=k, return_nn=True)
    dists, idx = naive_knn(p1, p2, l1, l2, k, norm)
    assert torch.equal(ours.idx, idx)
    torch.testing.assert_close(ours.dists, dists, rtol=1e-12, atol=1e-12)
    nn = torch.stack([torch.stack([p2[b][idx[b, i]] for i in range(sizes[0])]) for b in range(n)])
    mask = (torch.arange(k)[None, None] < l2[:, None, None].clamp(max=k)) & (
        torch.arange(sizes[0])[None, :, None] < l1[:, None, None]
    )
    torch.testing.assert_close(ours.knn, nn * mask[..., None], rtol=0, atol=0)
    for got, want in zip(
        _gradients([ours.dists, ours.knn], (p1, p2), 0), _gradients([dists, nn * mask[..., None]], (p1, p2), 0)
    ):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("n", "sizes", "dim", "k"), CASES)
@pytest.mark.parametrize("radius", [0.15, 0.4])
def test_ball_query_matches_pytorch3ds_definition(n, sizes, dim, k, radius):
    p1, p2, l1, l2 = _clouds(n, *sizes, dim, seed=n * 100 + dim * 10 + k + 7)
    ours = p3d.ball_query(p1, p2, l1, l2, K=k, radius=radius, return_nn=True)
    dists, idx = naive_ball_query(p1, p2, l1, l2, k, radius)
    assert torch.equal(ours.idx, idx)
    torch.testing.assert_close(ours.dists, dists, rtol=1e-12, atol=1e-12)
    nn = torch.stack([p2[b][idx[b].clamp(min=0)] for b in range(n)]) * (idx >= 0)[..., None]
    torch.testing.assert_close(ours.knn, nn, rtol=0, atol=0)
    for got, want in zip(_gradients([ours.dists, ours.knn], (p1, p2), 1), _gradients([dists, nn], (p1, p2), 1)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_ball_query_keeps_the_first_k_by_index_not_the_closest():
    p1 = torch.zeros(1, 1, 3)
    p2 = torch.tensor([[[0.3, 0, 0], [0.1, 0, 0], [0.5, 0, 0], [0.2, 0, 0]]])
    out = p3d.ball_query(p1, p2, K=2, radius=0.45)
    assert out.idx.tolist() == [[[0, 1]]]  # 0.3 and 0.1, though 0.2 is closer than 0.3
    torch.testing.assert_close(out.dists, torch.tensor([[[0.09, 0.01]]]))
    assert p3d.ball_query(p1, p2, K=4, radius=0.5).idx.tolist() == [[[0, 1, 3, -1]]]  # 0.5 is not < 0.5
