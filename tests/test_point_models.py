"""The neighbour steps of three point-cloud models built on wb.ops, against brute-force
torch versions of the same layers, forward and backward in float64: PointNet++'s set
abstraction (fps, then the closest K within a radius) and feature propagation (3-NN
interpolation), DGCNN's EdgeConv on graphs in space and in feature space, and Point
Transformer's vector attention over a ragged batch's kNN."""

from __future__ import annotations

import math

import torch

import warpbridge as wb

SIZES = [300, 120, 450]


def _batch(seed=0, dim=3):
    g = torch.Generator().manual_seed(seed)
    pos = torch.rand(sum(SIZES), dim, dtype=torch.float64, generator=g)
    batch = torch.repeat_interleave(torch.arange(len(SIZES)), torch.tensor(SIZES))
    return pos, batch


def _dense(q, r, qb, rb):
    d = torch.cdist(q, r, compute_mode="donot_use_mm_for_euclid_dist")
    return d.masked_fill(qb[:, None] != rb[None], math.inf)


def _mlp(seed, inputs, outputs):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(inputs, outputs), torch.nn.ReLU()).double()


def _grads(out, inputs):
    w = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    return torch.autograd.grad((out * w).sum(), inputs)


def test_pointnet2_set_abstraction_and_propagation_match_brute_force():
    pos, batch = _batch()
    feats = torch.randn(len(pos), 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    mlp = _mlp(0, 3 + 8, 16)
    radius, k = 0.15, 24
    centres = wb.ops.fps(pos, 0.25, batch=batch, random_start=False)
    # brute-force fps: each cloud's farthest point steps on the dense distances
    want = []
    for c, start in enumerate([0, *torch.tensor(SIZES).cumsum(0).tolist()[:-1]]):
        y = pos[start : start + SIZES[c]]
        reach, chosen = (y - y[0]).square().sum(1), [0]
        for _ in range(1, math.ceil(SIZES[c] * 0.25)):
            chosen.append(int(reach.argmax()))
            reach = torch.minimum(reach, (y - y[chosen[-1]]).square().sum(1))
        want += [start + i for i in chosen]
    assert centres.tolist() == want

    def abstraction(pos, feats, neighbours):
        q, qb = pos[centres], batch[centres]
        source, target = neighbours(q, qb, pos)
        grouped = torch.cat([pos[source] - q[target], feats[source]], 1)
        out = mlp(grouped)
        index = target[:, None].expand_as(out)
        return torch.zeros(len(q), out.shape[1], dtype=out.dtype).scatter_reduce(
            0, index, out, "amax", include_self=False
        )

    def ours(q, qb, pos):
        nb = wb.ops.radius(q, pos, radius, query_batch=qb, ref_batch=batch, max_neighbors=k)
        return nb.index, torch.repeat_interleave(torch.arange(len(q)), torch.diff(nb.ptr))

    def brute(q, qb, pos):
        d = _dense(q, pos, qb, batch)
        dist, idx = torch.sort(d, dim=1, stable=True)
        keep = dist[:, :k] <= radius
        return idx[:, :k][keep], torch.arange(len(q))[:, None].expand(-1, k)[keep]

    p1, f1 = pos.clone().requires_grad_(), feats.clone().requires_grad_()
    p2, f2 = pos.clone().requires_grad_(), feats.clone().requires_grad_()
    a, b = abstraction(p1, f1, ours), abstraction(p2, f2, brute)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    for x, y in zip(_grads(a, (p1, f1)), _grads(b, (p2, f2))):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)

    # feature propagation: the coarse features back onto every point (PyG's knn_interpolate)
    coarse = a.detach().requires_grad_()
    p3, p4 = pos.clone().requires_grad_(), pos.clone().requires_grad_()
    up = wb.ops.knn_interpolate(coarse, p3[centres], p3, batch[centres], batch, k=3)
    d = _dense(p4, p4[centres], batch, batch[centres])
    d3, idx = torch.sort(d, dim=1, stable=True)
    w = 1.0 / (p4[:, None] - p4[centres][idx[:, :3]]).square().sum(-1).clamp(min=1e-16)
    dense_up = (coarse[idx[:, :3]] * w[..., None]).sum(1) / w.sum(1, keepdim=True)
    torch.testing.assert_close(up, dense_up, rtol=1e-12, atol=1e-12)
    for x, y in zip(_grads(up, (coarse, p3)), _grads(dense_up, (coarse, p4))):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-12)
    assert torch.isfinite(up).all()  # the centres sit on their own points: no NaN


def test_dgcnn_edgeconv_in_space_and_feature_space_matches_brute_force():
    pos, batch = _batch(2)
    mlp1, mlp2 = _mlp(1, 6, 32), _mlp(2, 64, 16)

    def edgeconv(h, mlp, graph):
        source, target = graph(h.detach())
        out = mlp(torch.cat([h[target], h[source] - h[target]], 1))
        index = target[:, None].expand_as(out)
        return torch.zeros(len(h), out.shape[1], dtype=out.dtype).scatter_reduce(
            0, index, out, "amax", include_self=False
        )

    def ours(h):
        return wb.ops.knn_graph(h, 20, batch=batch)

    def brute(h):
        d = _dense(h, h, batch, batch).fill_diagonal_(math.inf)
        idx = torch.sort(d, dim=1, stable=True).indices[:, :20]
        return idx.reshape(-1), torch.arange(len(h)).repeat_interleave(20)

    x1, x2 = pos.clone().requires_grad_(), pos.clone().requires_grad_()
    a = edgeconv(edgeconv(x1, mlp1, ours), mlp2, ours)  # the second graph in 32-D features
    b = edgeconv(edgeconv(x2, mlp1, brute), mlp2, brute)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(_grads(a, x1)[0], _grads(b, x2)[0], rtol=1e-12, atol=1e-12)


def test_point_transformer_vector_attention_on_a_ragged_batch_matches_brute_force():
    pos, batch = _batch(3)
    feats = torch.randn(len(pos), 16, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    q_idx = wb.ops.fps(pos, 0.5, batch=batch, random_start=False)  # transition down: the queries
    qb, k = batch[q_idx], 16
    to_qkv, to_pos, to_weight = _mlp(5, 16, 48), _mlp(6, 3, 16), _mlp(7, 16, 16)

    def attention(pos, feats, idx):
        q, key, value = to_qkv(feats).split(16, dim=1)
        rel = to_pos(pos[q_idx][:, None] - pos[idx])
        weight = torch.softmax(to_weight(q[q_idx][:, None] - key[idx] + rel), dim=1)
        return (weight * (value[idx] + rel)).sum(1)

    p1, f1 = pos.clone().requires_grad_(), feats.clone().requires_grad_()
    p2, f2 = pos.clone().requires_grad_(), feats.clone().requires_grad_()
    _, idx, count = wb.ops.knn(pos[q_idx], pos, k, query_batch=qb, ref_batch=batch)
    assert (count == k).all()
    brute_idx = torch.sort(_dense(pos[q_idx], pos, qb, batch), dim=1, stable=True).indices[:, :k]
    assert torch.equal(idx, brute_idx)
    a, b = attention(p1, f1, idx), attention(p2, f2, brute_idx)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    for x, y in zip(_grads(a, (p1, f1)), _grads(b, (p2, f2))):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)
