"""kNN and kNN graphs on feature vectors (DGCNN's dynamic graphs: 64 or 128 coordinates and
more), where the ops search by an exact blocked brute force instead of a kd-tree: the same
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
    from warpbridge.ops.kdtree import brute, template

    module = f"test_rows_{flags.split()[-1] if flags else 'sse2'}"
    scope = template.instantiate((brute,), {"T": wp.float32}, module, {"REAL": "wp::float32"})
    wp.set_module_options({"cpu_compiler_flags": flags}, module=wp.get_module(module))
    names = ("rows_knn", "rows_transpose", "rows_knn_backward")
    kernels = types.SimpleNamespace(module=module, T=wp.float32, **{n: scope[n] for n in names})
    x, b = _ties(64, torch.float32)
    want = wb.ops.knn(x, x, 20, query_batch=b, ref_batch=b)
    monkeypatch.setattr(kdtree, "row_kernels", lambda scalar: kernels)
    got = wb.ops.knn(x, x, 20, query_batch=b, ref_batch=b)
    for ours, theirs in zip(got, want):
        assert torch.equal(ours, theirs)


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


@pytest.mark.parametrize("op", ["radius", "radius_graph", "knn_aggregate", "radius_aggregate", "fps"])
def test_ops_without_a_feature_space_path_say_so(op):
    x = torch.randn(20, 32)
    call = {
        "radius": lambda: wb.ops.radius(x, x, 0.5),
        "radius_graph": lambda: wb.ops.radius_graph(x, 0.5),
        "knn_aggregate": lambda: wb.ops.knn_aggregate(x, x, torch.ones(20, 2), 3, 0.1),
        "radius_aggregate": lambda: wb.ops.radius_aggregate(x, x, torch.ones(20, 2), 0.5, 0.1),
        "fps": lambda: wb.ops.fps(x),
    }[op]
    with pytest.raises(
        wb.WarpBridgeError,
        match=rf"^{op}\(\): '\w+' must have shape \(\w, D\) with 1 <= D <= 16, got \(20, 32\) \(knn and knn_graph take up to 4096\)",
    ):
        call()
