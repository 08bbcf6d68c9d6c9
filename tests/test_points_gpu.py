"""The neighbour ops on CUDA, whenever a GPU is available: the same neighbours, values and
gradients as the dense float64 references and as the CPU, on every distribution of
``benchmarks/distributions.py``, with the tree built on the device by sorting
(``_tree._split_by_sort``). Marked `gpu`: skipped with a reason on machines without one; the
CPU runs the same sort build in ``test_distributions.py`` and ``test_points.py``."""

import importlib.util
import os

import points_reference as ref_ops
import pytest
import torch

import warpbridge as wb
from warpbridge.ops import _tree

pytestmark = pytest.mark.gpu

ROOT = os.path.join(os.path.dirname(__file__), "..")
_spec = importlib.util.spec_from_file_location("distributions", os.path.join(ROOT, "benchmarks", "distributions.py"))
D = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(D)


def clouds(m, n, nf, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(m, 3, generator=g, dtype=dtype) * 2 - 1
    r = torch.randn(n, 3, generator=g, dtype=dtype)
    f = torch.randn(n, nf, generator=g, dtype=dtype)
    return q, r, f


def test_the_tree_is_built_on_the_device_by_sort(monkeypatch):
    levels = []
    real = _tree._split_by_sort
    monkeypatch.setattr(_tree, "_split_by_sort", lambda *a: levels.append((a[3], a[4].alias)) or real(*a))
    q, r, _ = clouds(100, 5000, 1, torch.float32)
    wb.ops.knn(q.cuda(), r.cuda(), 7)
    assert levels and levels[0][0] > 0 and levels[0][1].startswith("cuda")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_values_match_the_cpu(dtype):
    q, r, f = clouds(2000, 5000, 8, dtype, seed=1)
    for op in (
        lambda a, b, c: wb.ops.knn(a, b, 7),
        lambda a, b, c: (wb.ops.radius_aggregate(a, b, c, 0.2, 0.1),),
        lambda a, b, c: (wb.ops.knn_aggregate(a, b, c, 7, 0.1),),
    ):
        cpu = op(q, r, f)
        gpu = op(q.cuda(), r.cuda(), f.cuda())
        for a, b in zip(cpu, gpu):
            assert b.is_cuda and b.dtype == a.dtype
            if a.dtype == torch.int64:
                # float32 distances may differ in the last bit (contracted multiply-adds), which
                # can swap near-tied neighbours: there, the chosen points must be as near
                d_cpu, d_gpu = ((q[:, None] - r[i]).norm(dim=-1) for i in (a, b.cpu()))
                assert torch.equal(a, b.cpu()) if dtype == torch.float64 else torch.allclose(d_gpu, d_cpu)
            else:
                torch.testing.assert_close(b.cpu(), a)


def test_gradients_against_the_dense_reference():
    q, r, f = (t.cuda() for t in clouds(60, 200, 3, torch.float64, seed=2))
    d = torch.cdist(q, r)
    q = q[((d - 0.5).abs() > 0.02).all(1)].contiguous()  # off the radius' jump
    ins = [t.clone().requires_grad_() for t in (q, r, f)]
    assert torch.autograd.gradcheck(lambda a, b, c: wb.ops.radius_aggregate(a, b, c, 0.5, 0.2), ins)
    for op, dense in (
        (
            lambda a, b, c: wb.ops.radius_aggregate(a, b, c, 0.5, 0.2),
            lambda a, b, c: ref_ops.radius_aggregate(a, b, c, 0.5, 0.2),
        ),
        (lambda a, b, c: wb.ops.knn_aggregate(a, b, c, 5, 0.2), lambda a, b, c: ref_ops.knn_aggregate(a, b, c, 5, 0.2)),
        (lambda a, b, c: wb.ops.knn(a, b, 5)[0], lambda a, b, c: ref_ops.knn(a, b, 5)[0]),
    ):
        ours = [t.clone().requires_grad_() for t in (q, r, f)]
        theirs = [t.clone().requires_grad_() for t in (q, r, f)]
        out, want = op(*ours), dense(*theirs)
        torch.testing.assert_close(out, want)
        g = torch.randn_like(want)
        got = torch.autograd.grad(out, ours, g, allow_unused=True)
        exp = torch.autograd.grad(want, theirs, g, allow_unused=True)
        for a, b in zip(got, exp):
            if b is not None:
                torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", list(D.DISTRIBUTIONS))
def test_every_distribution_is_exact(name):
    r, q = (torch.from_numpy(a).double().cuda() for a in D.make(name, 3000))
    dist, idx, _ = wb.ops.knn(q, r, 7)
    want = torch.sort(torch.cdist(q, r), dim=1, stable=True).indices[:, :7]  # ties: the smaller index
    assert torch.equal(idx, want)
    torch.testing.assert_close(dist, (q[:, None] - r[want]).norm(dim=-1), rtol=1e-12, atol=1e-12)


def test_tutorial_size_matches_ckdtree():
    from scipy.spatial import cKDTree

    x = torch.linspace(-1, 1, 30)
    q = torch.stack(torch.meshgrid(x, x, x, indexing="ij"), -1).reshape(-1, 3)
    r = torch.randn(100_000, 3, generator=torch.Generator().manual_seed(3))
    dist, idx, _ = wb.ops.knn(q.cuda(), r.cuda(), 7)
    want, _ = cKDTree(r.numpy()).query(q.numpy(), 7)
    torch.testing.assert_close(dist.cpu(), torch.from_numpy(want).float(), rtol=1e-5, atol=1e-6)


def test_queries_go_in_morton_order_on_the_device():
    """The query order CUDA computes (``query_box``, ``query_keys`` and the device's radix
    sort): every query once, in the order of the codes NumPy computes over the device tree's
    trimmed box, equal codes in their given order. At 20 000 queries, where the ops use it."""
    import warp as wp
    from test_distributions import assert_morton_order

    from warpbridge.ops import _tree

    r, q = D.make("lidar rings + 20 far", 100_000)
    assert len(q) >= _tree.QUERY_ORDER_MIN
    device = wp.get_device("cuda:0")
    k = _tree.kernels_for("float32", device)
    refs = wp.array(r, dtype=wp.vec3, device=device)
    tree = _tree.tree(k, refs)
    queries = wp.empty(len(q), dtype=wp.int32, device=device)
    _tree.query_order(k, wp.array(q, dtype=wp.vec3, device=device), tree, queries, device, None, refs)
    assert_morton_order(q, tree, queries.numpy())


def test_a_self_join_on_the_device():
    """Queries that are the reference points themselves take the tree's order on the device
    (a copy on the current stream) and give what a copy of the points gives, bit for bit."""
    _, r, f = clouds(1, 30_000, 4, torch.float64, seed=5)
    p, fp = r.cuda(), f.cuda()
    for op in (
        lambda a, b: wb.ops.knn(a, b, 7),
        lambda a, b: (wb.ops.radius_aggregate(a, b, fp, 0.1, 0.05),),
        lambda a, b: (wb.ops.knn_aggregate(a, b, fp, 7, 0.05),),
    ):
        for own, copy in zip(op(p, p), op(p.clone(), p)):
            assert torch.equal(own, copy)
    assert torch.equal(wb.ops.knn(p, p, 1)[1][:, 0].cpu(), torch.arange(len(r)))


def test_lists_graphs_and_batches_match_the_cpu():
    """Radius lists (all, capped, without self-pairs), radius and kNN graphs over a batch of
    three clouds, and the lists' distance gradients: the same on CUDA as on the CPU (float64,
    bit for bit for the indices)."""
    _, r, _ = clouds(1, 6000, 1, torch.float64, seed=6)
    q = r[::3].contiguous()
    batch = torch.repeat_interleave(torch.arange(3), torch.tensor([2500, 2000, 1500]))
    calls = (
        lambda a, b, bb: wb.ops.radius(a, b, 0.2),
        lambda a, b, bb: wb.ops.radius(a, b, 0.2, max_neighbors=5),
        lambda a, b, bb: wb.ops.radius(b, b, 0.2, loop=False),
        lambda a, b, bb: (wb.ops.radius_graph(b, 0.2, batch=bb),),
        lambda a, b, bb: (wb.ops.knn_graph(b, 6, batch=bb),),
    )
    for call in calls:
        cpu, gpu = call(q, r, batch), call(q.cuda(), r.cuda(), batch.cuda())
        for a, b in zip(cpu, gpu):
            assert b.is_cuda and b.dtype == a.dtype and b.shape == a.shape
            assert torch.equal(b.cpu(), a) if a.dtype == torch.int64 else torch.allclose(b.cpu(), a, rtol=0, atol=1e-14)
    grads = []
    for device in ("cpu", "cuda"):
        a, b = (t.to(device).requires_grad_() for t in (q, r))
        nb = wb.ops.radius(a, b, 0.2)
        w = torch.linspace(0, 1, len(nb.distance), dtype=torch.float64, device=device)
        grads.append([g.cpu() for g in torch.autograd.grad((nb.distance * w).sum(), (a, b))])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a)


def test_the_point_model_and_atomistic_ops_match_the_cpu():
    """What the point-cloud models and force fields call, on CUDA against the CPU: feature-space
    kNN and graphs (64-D, ties, a short and an empty cloud: the scalar CUDA block), capped radius
    rows on a lattice (the kNN walk bounded by the radius, self-join), fps, knn_interpolate, and
    neighbor_list with its arrays on the device (the search on the host, D and d built there)."""
    sizes = torch.tensor([40, 3, 0, 97])
    b = torch.repeat_interleave(torch.arange(4), sizes)
    h = torch.randint(0, 2, (int(sizes.sum()), 64), generator=torch.Generator().manual_seed(1)).float()
    for got, want in zip(
        wb.ops.knn(h.cuda(), h.cuda(), 20, query_batch=b.cuda(), ref_batch=b.cuda()),
        wb.ops.knn(h, h, 20, query_batch=b, ref_batch=b),
    ):
        assert torch.equal(got.cpu(), want)
    assert torch.equal(wb.ops.knn_graph(h.cuda(), 6, batch=b.cuda()).cpu(), wb.ops.knn_graph(h, 6, batch=b))
    g = torch.arange(6.0, dtype=torch.float64)
    lat = torch.stack(torch.meshgrid(g, g, g, indexing="ij"), -1).reshape(-1, 3)
    for loop in (True, False):
        got = wb.ops.radius(lat.cuda(), lat.cuda(), 1.0, loop=loop, max_neighbors=4)
        want = wb.ops.radius(lat, lat, 1.0, loop=loop, max_neighbors=4)
        for a, c in zip((got.index, got.ptr, got.distance), (want.index, want.ptr, want.distance)):
            assert torch.equal(a.cpu(), c)
    _, pos, feats = clouds(1, 4096, 8, torch.float32, seed=5)
    pb = torch.arange(4).repeat_interleave(1024)
    assert torch.equal(
        wb.ops.fps(pos.cuda(), 0.25, batch=pb.cuda(), random_start=False).cpu(),
        wb.ops.fps(pos, 0.25, batch=pb, random_start=False),
    )
    coarse = pos[::4]
    up = wb.ops.knn_interpolate(feats[::4].cuda(), coarse.cuda(), pos.cuda(), pb[::4].cuda(), pb.cuda(), k=3)
    torch.testing.assert_close(
        up.cpu(), wb.ops.knn_interpolate(feats[::4], coarse, pos, pb[::4], pb, k=3), rtol=1e-5, atol=1e-5
    )
    atoms, cell = torch.rand(200, 3, dtype=torch.float64) * 9, torch.eye(3, dtype=torch.float64) * 9
    got = wb.ops.neighbor_list(atoms.cuda().requires_grad_(), 3.0, cell=cell.cuda(), quantities="ijSd")
    want = wb.ops.neighbor_list(atoms, 3.0, cell=cell, quantities="ijSd")
    assert got[3].is_cuda and got[3].requires_grad
    for a, c in zip(got[:3], want[:3]):
        assert torch.equal(a.cpu(), c)
    torch.testing.assert_close(got[3].detach().cpu(), want[3], rtol=1e-12, atol=1e-12)


def test_feature_space_lists_aggregations_and_small_clouds_match_the_cpu():
    """Paths added since the last GPU run, on CUDA against the CPU: feature-space radius lists
    and graphs (capped, ragged, ties at the radius: the scalar CUDA block), knn_aggregate and
    knn_interpolate on feature vectors, and a small cloud's kNN without a tree (knn_small)."""
    sizes = torch.tensor([40, 3, 0, 97])
    b = torch.repeat_interleave(torch.arange(4), sizes)
    h = torch.randint(0, 2, (int(sizes.sum()), 64), generator=torch.Generator().manual_seed(2)).float()
    for cap in (None, 10):
        got = wb.ops.radius(h.cuda(), h.cuda(), 5.0, query_batch=b.cuda(), ref_batch=b.cuda(), max_neighbors=cap)
        want = wb.ops.radius(h, h, 5.0, query_batch=b, ref_batch=b, max_neighbors=cap)
        for a, c in zip(got, want):
            assert torch.equal(a.cpu(), c)
    assert torch.equal(wb.ops.radius_graph(h.cuda(), 5.0, batch=b.cuda()).cpu(), wb.ops.radius_graph(h, 5.0, batch=b))
    f = torch.randn(len(h), 5, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(
        wb.ops.knn_aggregate(h.cuda(), h.cuda(), f.cuda(), 6, 2.0).cpu(),
        wb.ops.knn_aggregate(h, h, f, 6, 2.0),
        rtol=1e-5,
        atol=1e-5,
    )
    torch.testing.assert_close(
        wb.ops.knn_interpolate(f.cuda(), h.cuda(), h.cuda(), k=3).cpu(),
        wb.ops.knn_interpolate(f, h, h, k=3),
        rtol=1e-5,
        atol=1e-5,
    )
    g = torch.arange(4.0)
    small = torch.stack(torch.meshgrid(g, g, g, indexing="ij"), -1).reshape(-1, 3)  # 64 points: no tree
    for got, want in zip(wb.ops.knn(small.cuda(), small.cuda(), 7), wb.ops.knn(small, small, 7)):
        assert torch.equal(got.cpu(), want)


def test_a_thread_per_query_and_a_block_per_cloud_give_the_cpus_results():
    """The CUDA layouts of the brute force (a thread per query, its accumulators in registers)
    and of fps (a thread block per cloud, each step's farthest point by block reductions) against
    the CPU: DGCNN-sized feature kNN in both float types, a radius graph over them, and fps on
    ragged clouds longer and shorter than a block, with empty ones, duplicates and NaN points,
    and 3-D kNN graphs and capped radius rows over those clouds (a forest split by sorting)."""
    b = torch.arange(8).repeat_interleave(1024)
    for dtype in (torch.float32, torch.float64):
        h = torch.randn(8 * 1024, 64, generator=torch.Generator().manual_seed(4), dtype=dtype)
        (gd, gi, gc), (wd, wi, wc) = (
            wb.ops.knn(h.cuda(), h.cuda(), 20, query_batch=b.cuda(), ref_batch=b.cuda()),
            wb.ops.knn(h, h, 20, query_batch=b, ref_batch=b),
        )
        assert torch.equal(gi.cpu(), wi) and torch.equal(gc.cpu(), wc)
        torch.testing.assert_close(gd.cpu(), wd, rtol=1e-6, atol=0)
        r = float(wd[:, 5].median())
        assert torch.equal(wb.ops.radius_graph(h.cuda(), r, batch=b.cuda()).cpu(), wb.ops.radius_graph(h, r, batch=b))
    sizes = torch.tensor([0, 1, 300, 1024, 5, 0, 2000, 257])
    pos = torch.rand(int(sizes.sum()), 3, generator=torch.Generator().manual_seed(6))
    pos[::97] = float("nan")
    pos[400:420] = pos[399]
    pb = torch.repeat_interleave(torch.arange(len(sizes)), sizes)
    for kw in (dict(ratio=0.5), dict(ratio=1.0), dict(num=64)):
        assert torch.equal(
            wb.ops.fps(pos.cuda(), batch=pb.cuda(), random_start=False, **kw).cpu(),
            wb.ops.fps(pos, batch=pb, random_start=False, **kw),
        )
    # 3-D ragged batches through a forest split by sorting (CUDA) against one built per cloud (CPU)
    assert torch.equal(wb.ops.knn_graph(pos.cuda(), 16, batch=pb.cuda()).cpu(), wb.ops.knn_graph(pos, 16, batch=pb))
    got = wb.ops.radius(pos.cuda(), pos.cuda(), 0.1, query_batch=pb.cuda(), ref_batch=pb.cuda(), max_neighbors=32)
    want = wb.ops.radius(pos, pos, 0.1, query_batch=pb, ref_batch=pb, max_neighbors=32)
    assert torch.equal(got.index.cpu(), want.index) and torch.equal(got.ptr.cpu(), want.ptr)
    # float32 distances of random points: CUDA fuses the squares' multiply-adds where the CPU may not
    torch.testing.assert_close(got.distance.cpu(), want.distance, rtol=1e-6, atol=0)
