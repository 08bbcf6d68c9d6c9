"""Points of any dimension from 1 to 16 (2-D layouts, feature spaces): every neighbour op
against dense float64 references, values and gradients, the kd-tree's special cases (exact
duplicates, points that are not finite) included, and dimensions out of range refused."""

from __future__ import annotations

import points_reference as ref_ops
import pytest
import torch

import warpbridge as wb

DIMS = (1, 2, 16)


def _cloud(dim: int, n: int, seed: int, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, dtype=torch.float64, generator=g)
    x[n // 2 : n // 2 + 10] = x[:10]  # exact duplicates
    return x.to(dtype)


def _dense(q: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    return (q[:, None] - r[None]).norm(dim=-1)


def _weights(y: torch.Tensor) -> torch.Tensor:
    return torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape)


@pytest.mark.parametrize("dim", DIMS)
def test_knn_is_exact_with_its_gradients(dim):
    q, r = _cloud(dim, 90, 1), _cloud(dim, 700, 2)
    qg, rg = q.clone().requires_grad_(), r.clone().requires_grad_()
    dist, idx, _ = wb.ops.knn(qg, rg, 6)
    expected = torch.sort(_dense(q, r), dim=1, stable=True)
    assert torch.equal(idx, expected.indices[:, :6])  # ties (duplicates) to the smaller index
    torch.testing.assert_close(dist, expected.values[:, :6], rtol=1e-12, atol=1e-12)
    (dist * _weights(dist)).sum().backward()
    q2, r2 = q.clone().requires_grad_(), r.clone().requires_grad_()
    (_dense(q2, r2).gather(1, idx) * _weights(dist)).sum().backward()
    torch.testing.assert_close(qg.grad, q2.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(rg.grad, r2.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dim", DIMS)
def test_radius_lists_are_exact_with_their_gradients(dim):
    q, r = _cloud(dim, 90, 3), _cloud(dim, 700, 4)
    dense = _dense(q, r)
    radius = float(torch.kthvalue(dense, 9, dim=1).values.median())
    qg, rg = q.clone().requires_grad_(), r.clone().requires_grad_()
    nb = wb.ops.radius(qg, rg, radius, max_neighbors=12)
    inside = dense <= radius
    assert torch.equal(nb.count, inside.sum(1))
    expected = torch.sort(dense.masked_fill(~inside, float("inf")), dim=1, stable=True)
    rows = torch.repeat_interleave(torch.arange(len(q)), torch.diff(nb.ptr))
    places = torch.arange(len(nb.index)) - nb.ptr[rows]
    assert torch.equal(nb.index, expected.indices[rows, places])
    (nb.distance * _weights(nb.distance)).sum().backward()
    q2, r2 = q.clone().requires_grad_(), r.clone().requires_grad_()
    ((q2[rows] - r2[nb.index]).norm(dim=-1) * _weights(nb.distance)).sum().backward()
    torch.testing.assert_close(qg.grad, q2.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(rg.grad, r2.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dim", DIMS)
def test_aggregations_match_dense_references(dim):
    q, r = _cloud(dim, 60, 5), _cloud(dim, 400, 6)
    f = torch.randn(400, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    dense = _dense(q, r)
    radius = float(torch.kthvalue(dense, 12, dim=1).values.median())
    q = q[((dense - radius).abs() > 1e-9).all(1)]  # off the cut-off, where the dense mask is ambiguous
    for ours, theirs in (
        (lambda a, b, c: wb.ops.radius_aggregate(a, b, c, radius, radius / 2), ref_ops.radius_aggregate),
        (lambda a, b, c: wb.ops.knn_aggregate(a, b, c, 5, radius / 2), ref_ops.knn_aggregate),
    ):
        ins = [t.clone().requires_grad_() for t in (q, r, f)]
        ins2 = [t.clone().requires_grad_() for t in (q, r, f)]
        out = ours(*ins)
        expected = (
            theirs(*ins2, radius, radius / 2) if theirs is ref_ops.radius_aggregate else theirs(*ins2, 5, radius / 2)
        )
        torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
        (out * _weights(out)).sum().backward()
        (expected * _weights(out)).sum().backward()
        for a, b in zip(ins, ins2):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-11)


def test_two_d_float32_batches_and_points_that_are_not_finite():
    x = _cloud(2, 600, 8, torch.float32)
    x[5, 1] = float("nan")
    batch = (torch.arange(600) >= 250).long()
    edges = wb.ops.knn_graph(x, 4, batch=batch)
    alone = [wb.ops.knn_graph(x[part], 4) + part.start for part in (slice(0, 250), slice(250, 600))]
    assert torch.equal(edges, torch.cat(alone, 1))
    assert edges.shape == (2, 4 * 599) and not (edges == 5).any()  # NaN point: no edges, nobody's neighbour


@pytest.mark.parametrize(
    ("query", "ref", "message"),
    [
        (
            torch.zeros(4, 0),
            torch.zeros(5, 0),
            r"'query' must have shape \(M, D\) with 1 <= D <= 4096, got \(4, 0\)",
        ),
        (torch.zeros(4, 4097), torch.zeros(5, 4097), r"1 <= D <= 4096, got \(4, 4097\)"),
        (torch.zeros(4, 2), torch.zeros(5, 3), "'ref' has 3 coordinates per point but 'query' has 2"),
    ],
)
def test_dimensions_out_of_range_or_mismatched_are_refused(query, ref, message):
    with pytest.raises(wb.WarpBridgeError, match=message):
        wb.ops.knn(query, ref, 2)
