"""kNN, radius lists, their graphs and the kNN aggregations on feature vectors (DGCNN's dynamic graphs: 64 or 128
coordinates and more), where the ops search by an exact blocked brute force instead of a kd-tree: the same
neighbours as a dense float64 sort, on ragged batches with short and empty clouds, gradients
by gradcheck, points that are not finite nobody's neighbour."""

from __future__ import annotations

import math
import platform
import types

import numpy as np
import pytest
import torch
import warp as wp

import warpbridge as wb

SIZES = [40, 3, 0, 97]  # a short cloud (3 points < k) and an empty one


def _batch(dim, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(SIZES), dim, dtype=dtype, generator=g)
    return x, torch.repeat_interleave(torch.arange(len(SIZES)), torch.tensor(SIZES))


def dense(q, r, qb, rb):
    d = torch.cdist(q.double(), r.double(), compute_mode="donot_use_mm_for_euclid_dist")
    return d.masked_fill(qb[:, None] != rb[None], math.inf)


@pytest.mark.parametrize("dim", [17, 64, 200])
def test_knn_in_feature_space_is_exact_on_ragged_batches(dim):
    x, b = _batch(dim)
    dist, idx, count = wb.ops.knn(x, x, 8, query_batch=b, ref_batch=b)
    want = torch.sort(dense(x, x, b, b), dim=1, stable=True)
    sizes = torch.tensor(SIZES)[b]
    assert torch.equal(count, sizes.clamp(max=8))
    found = torch.arange(8)[None] < count[:, None]
    assert torch.equal(idx, torch.where(found, want.indices[:, :8], -1))
    torch.testing.assert_close(dist, torch.where(found, want.values[:, :8], math.inf), rtol=1e-12, atol=1e-12)


def _ties(dim, dtype, seed=3):
    """Coordinates in {0, 1}: distances are square roots of small integers, most of them tied."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 2, (sum(SIZES), dim), generator=g).to(dtype)
    return x, torch.repeat_interleave(torch.arange(len(SIZES)), torch.tensor(SIZES))


@pytest.mark.parametrize("k", [20, 90])  # kept in registers / in the output rows (more than 64)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ties_go_to_the_smaller_index(k, dtype):
    x, b = _ties(64, dtype)
    dist, idx, count = wb.ops.knn(x, x, k, query_batch=b, ref_batch=b)
    want = torch.sort(dense(x, x, b, b), dim=1, stable=True)
    found = torch.arange(k)[None] < count[:, None]
    assert torch.equal(count, torch.tensor(SIZES)[b].clamp(max=k))
    assert torch.equal(idx, torch.where(found, want.indices[:, :k], -1))
    torch.testing.assert_close(dist.double(), torch.where(found, want.values[:, :k], math.inf))


def test_strided_queries_are_read_as_their_values():
    x, b = _batch(40)
    strided = x.t().contiguous().t()  # the same values, column-major
    assert not strided.is_contiguous()
    for got, want in zip(wb.ops.knn(strided, x, 5), wb.ops.knn(x, x, 5)):
        assert torch.equal(got, want)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 instruction sets")
@pytest.mark.parametrize("flags", ["-target-cpu haswell", ""])  # 32-byte (AVX2) and 16-byte (SSE2) vectors
def test_every_vector_width_finds_the_same_neighbours(flags, monkeypatch):
    from warpbridge.ops import kdtree
    from warpbridge.ops.kdtree import template

    module = f"test_rows_{flags.split()[-1] if flags else 'sse2'}"
    scope = template.instantiate(kdtree.ROW_MODULES, {"T": wp.float32}, module, {"REAL": "wp::float32"})
    wp.set_module_options({"cpu_compiler_flags": flags}, module=wp.get_module(module))
    kernels = types.SimpleNamespace(module=module, T=wp.float32, **{n: scope[n] for n in kdtree.ROW_KERNELS})
    x, b = _ties(64, torch.float32)
    searches = (
        lambda: wb.ops.knn(x, x, 20, query_batch=b, ref_batch=b),
        lambda: wb.ops.radius(x, x, 5.0, query_batch=b, ref_batch=b, max_neighbors=10),
    )
    want = [search() for search in searches]
    monkeypatch.setattr(kdtree, "row_kernels", lambda scalar: kernels)
    for search, theirs in zip(searches, want):
        for ours, their in zip(search(), theirs):
            assert torch.equal(ours, their)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_lower_precisions_find_neighbours_at_their_own_distances(dtype, tol):
    x, b = _batch(64, dtype)
    dist, idx, count = wb.ops.knn(x, x, 5, query_batch=b, ref_batch=b)
    assert dist.dtype == dtype
    d = dense(x, x, b, b)
    found = idx >= 0
    rows = torch.arange(len(x))[:, None].expand_as(idx)
    torch.testing.assert_close(d[rows[found], idx[found]], dist[found].double(), rtol=tol, atol=tol)
    kth = torch.sort(d, dim=1).values.gather(1, (count - 1).clamp(min=0)[:, None])[:, 0]
    assert (dist.double().masked_fill(~found, 0).max(1).values <= kth * (1 + tol) + tol).all()


@pytest.mark.parametrize("loop", [False, True])
def test_knn_graph_in_feature_space_is_pygs_graph(loop):
    x, b = _batch(128, seed=1)
    edges = wb.ops.knn_graph(x, 6, batch=b, loop=loop)
    d = dense(x, x, b, b)
    if not loop:
        d.fill_diagonal_(math.inf)
    want = []
    for i in range(len(x)):
        order = torch.sort(d[i], stable=True)
        keep = order.indices[torch.isfinite(order.values)][:6]
        want.append(torch.stack([keep, torch.full_like(keep, i)]))
    assert torch.equal(edges, torch.cat(want, 1))
    assert (edges >= 0).all()


def test_distance_gradients_by_gradcheck():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(30, 33, dtype=torch.float64, generator=g, requires_grad=True)
    r = torch.randn(45, 33, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, r: wb.ops.knn(q, r, 4).dist, (q, r))
    qb = torch.tensor([0] * 10 + [1] * 20)
    rb = torch.tensor([0] * 40 + [1] * 5)

    def found(q, r):  # cloud 1 has 5 references: its rows are padded past count
        dist, idx, _ = wb.ops.knn(q, r, 7, query_batch=qb, ref_batch=rb)
        return torch.where(idx >= 0, dist, 0.0)

    assert torch.autograd.gradcheck(found, (q, r))


def test_points_that_are_not_finite_are_nobodys_neighbour():
    x, _ = _batch(64)
    x[3, 10] = math.nan
    x[7, 0] = math.inf
    dist, idx, count = wb.ops.knn(x, x, 10)
    assert count[3] == 0 and count[7] == 0 and (idx[3] == -1).all() and torch.isinf(dist[7]).all()
    assert not ((idx == 3) | (idx == 7)).any()
    edges = wb.ops.knn_graph(x, 10)
    assert not ((edges == 3) | (edges == 7)).any()


def test_frameworks_get_torchs_neighbours():
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    x, b = _batch(64)
    want = wb.ops.knn(x, x, 4, query_batch=b, ref_batch=b)
    got = wb.ops.knn(x.numpy(), x.numpy(), 4, query_batch=b.numpy(), ref_batch=b.numpy())
    for ours, theirs in zip(got, want):
        np.testing.assert_array_equal(ours, theirs.numpy())
    got = jax.jit(lambda x, b: wb.ops.knn(x, x, 4, query_batch=b, ref_batch=b))(
        jnp.asarray(x.numpy()), jnp.asarray(b.numpy())
    )
    for ours, theirs in zip(got, want):
        np.testing.assert_array_equal(np.asarray(ours), theirs.numpy())


def _rows(d, radius, cap=None):
    """Each row's (index) within ``radius`` of the dense distances ``d``, sorted by distance,
    ties by index; the first ``cap``."""
    rows = []
    for row in d:
        order = torch.sort(row, stable=True)
        rows.append(order.indices[order.values <= radius][:cap])
    return rows


@pytest.mark.parametrize("dim", [17, 64, 200])
def test_radius_in_feature_space_is_exact_on_ragged_batches(dim):
    x, b = _batch(dim)
    d = dense(x, x, b, b)
    radius = float(torch.kthvalue(d[:40], 12, dim=1).values.median())
    for cap in (None, 5):
        nb = wb.ops.radius(x, x, radius, query_batch=b, ref_batch=b, max_neighbors=cap)
        want = _rows(d, radius, cap)
        assert torch.equal(nb.count, (d <= radius).sum(1))
        assert torch.equal(
            nb.ptr, torch.cat([torch.zeros(1, dtype=torch.long), torch.tensor([len(w) for w in want]).cumsum(0)])
        )
        assert torch.equal(nb.index, torch.cat(want))
        i = torch.repeat_interleave(torch.arange(len(x)), nb.ptr.diff())
        torch.testing.assert_close(nb.distance, d[i, nb.index], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_radius_on_its_boundary_and_ties_in_feature_space(dtype):
    x, b = _ties(64, dtype)  # squared distances are integers: 25 sits exactly on a radius of 5
    d = dense(x, x, b, b)
    assert (d == 5).any()
    nb = wb.ops.radius(x, x, 5.0, query_batch=b, ref_batch=b)
    assert torch.equal(nb.index, torch.cat(_rows(d, 5.0)))
    long_rows = wb.ops.radius(x, x, 6.0, query_batch=b, ref_batch=b)  # rows of up to 97: sorted by a heap
    assert nb.ptr.diff().max() <= 32 < long_rows.ptr.diff().max()
    assert torch.equal(long_rows.index, torch.cat(_rows(d, 6.0)))
    capped = wb.ops.radius(x, x, 6.0, query_batch=b, ref_batch=b, max_neighbors=40)
    assert torch.equal(capped.index, torch.cat(_rows(d, 6.0, 40)))


@pytest.mark.parametrize("loop", [False, True])
def test_radius_graph_in_feature_space_is_pygs_graph(loop):
    x, b = _batch(128, seed=1)
    d = dense(x, x, b, b)
    if not loop:
        d.fill_diagonal_(math.inf)
    radius = float(torch.kthvalue(d[:40], 6, dim=1).values.median())
    edges = wb.ops.radius_graph(x, radius, batch=b, loop=loop, max_neighbors=4)
    want = [torch.stack([row, torch.full_like(row, i)]) for i, row in enumerate(_rows(d, radius, 4))]
    assert torch.equal(edges, torch.cat(want, 1))


def test_radius_distance_gradients_match_torchs():
    g = torch.Generator().manual_seed(4)
    q = torch.randn(30, 33, dtype=torch.float64, generator=g, requires_grad=True)
    r = torch.randn(45, 33, dtype=torch.float64, generator=g, requires_grad=True)
    nb = wb.ops.radius(q, r, 8.0)
    assert 0 < len(nb.index) < 30 * 45
    i = torch.repeat_interleave(torch.arange(30), nb.ptr.diff())
    theirs = (q[i] - r[nb.index]).norm(dim=1)
    weights = torch.randn(len(theirs), dtype=torch.float64, generator=g)
    ours_grads = torch.autograd.grad(nb.distance, (q, r), weights)
    for ours, want in zip(ours_grads, torch.autograd.grad(theirs, (q, r), weights)):
        torch.testing.assert_close(ours, want, rtol=1e-12, atol=1e-12)


def test_points_that_are_not_finite_are_nobodys_neighbour_within_a_radius():
    x, _ = _batch(64)
    x[3, 10] = math.nan
    x[7, 0] = math.inf
    nb = wb.ops.radius(x, x, 1e3)
    assert nb.count[3] == 0 and nb.count[7] == 0
    assert not ((nb.index == 3) | (nb.index == 7)).any()
    assert torch.equal(nb.count, torch.full((len(x),), len(x) - 2).index_fill(0, torch.tensor([3, 7]), 0))


def _aggregated(q, r, f, qb, rb, k, sigma=None):
    """The dense float64 reference of knn_aggregate (softmax of -d / sigma) or, without
    sigma, of knn_interpolate (1 / max(d^2, 1e-16)), differentiable through torch."""
    order = torch.sort(dense(q.detach(), r.detach(), qb, rb), dim=1, stable=True)
    idx, found = order.indices[:, :k], torch.isfinite(order.values[:, :k])
    d = (q[:, None, :] - r[idx]).norm(dim=-1)
    if sigma is None:
        w = 1 / torch.clamp(d**2, min=1e-16)
    else:
        w = torch.exp(-(d - d[:, :1].detach()) / sigma)
    w = torch.where(found, w, 0.0)
    return ((w / w.sum(1, keepdim=True).clamp(min=1e-300))[..., None] * f[idx]).sum(1)


@pytest.mark.parametrize("op", ["knn_aggregate", "knn_interpolate"])
def test_aggregations_in_feature_space_match_dense_torch(op):
    g = torch.Generator().manual_seed(5)
    sizes_q, sizes_r = [20, 0, 30, 7], [40, 5, 3, 0]  # a query cloud of 3 references (< k), one of none
    q = torch.randn(sum(sizes_q), 48, dtype=torch.float64, generator=g, requires_grad=True)
    r = torch.randn(sum(sizes_r), 48, dtype=torch.float64, generator=g, requires_grad=True)
    f = torch.randn(sum(sizes_r), 5, dtype=torch.float64, generator=g, requires_grad=True)
    qb, rb = (torch.repeat_interleave(torch.arange(4), torch.tensor(s)) for s in (sizes_q, sizes_r))
    if op == "knn_aggregate":
        ours = wb.ops.knn_aggregate(q, r, f, 6, 2.0, query_batch=qb, ref_batch=rb)
        want = _aggregated(q, r, f, qb, rb, 6, 2.0)
    else:
        ours = wb.ops.knn_interpolate(f, r, q, rb, qb, k=6)
        want = _aggregated(q, r, f, qb, rb, 6)
    torch.testing.assert_close(ours, want, rtol=1e-12, atol=1e-12)
    assert (ours[qb == 3] == 0).all()  # no references: zeros
    weights = torch.randn(ours.shape, dtype=torch.float64, generator=g)
    for a, b in zip(torch.autograd.grad(ours, (q, r, f), weights), torch.autograd.grad(want, (q, r, f), weights)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_interpolation_onto_its_own_points_in_feature_space_has_no_nan():
    x, b = _batch(64)
    x.requires_grad_(True)
    f = torch.randn(len(x), 3, dtype=torch.float64)
    out = wb.ops.knn_interpolate(f, x, x, b, b, k=3)
    present = torch.tensor(SIZES)[b] > 0
    torch.testing.assert_close(out[present], f[present], rtol=0, atol=1e-12)  # each point's own features
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize("op", ["radius_aggregate", "fps"])
def test_ops_without_a_feature_space_path_say_so(op):
    x = torch.randn(20, 32)
    call = {
        "radius_aggregate": lambda: wb.ops.radius_aggregate(x, x, torch.ones(20, 2), 0.5, 0.1),
        "fps": lambda: wb.ops.fps(x),
    }[op]
    with pytest.raises(
        wb.WarpBridgeError,
        match=rf"^{op}\(\): '\w+' must have shape \(\w, D\) with 1 <= D <= 16, got \(20, 32\) \(knn, knn_graph, radius, radius_graph, knn_aggregate and knn_interpolate take up to 4096\)",
    ):
        call()
