"""Ragged batches (PyG's sorted batch vectors) on every neighbour op: one search over the
whole batch gives each cloud exactly what a call on that cloud alone gives, values and
gradients, and bad batch vectors are refused before any launch."""

from __future__ import annotations

import importlib.util
import os
import re

import numpy as np
import points_reference as ref_ops
import pytest
import torch

import warpbridge as wb
from warpbridge.ops import _launches

ROOT = os.path.join(os.path.dirname(__file__), "..")
# clouds of references and of queries: empty ones, one smaller than k, one that spans leaves
REF_SIZES = (0, 5, 300, 1, 2000, 40)
QUERY_SIZES = (3, 0, 100, 4, 700, 9)


def _batch(sizes: tuple) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))


def _starts(sizes: tuple) -> np.ndarray:
    return np.cumsum((0, *sizes))


def _clouds_of(dtype: torch.dtype) -> tuple:
    g = np.random.default_rng(0)
    ref = g.normal(size=(sum(REF_SIZES), 3))
    ref[400:420] = ref[420:440]  # duplicated points in one cloud
    query = g.normal(size=(sum(QUERY_SIZES), 3))
    features = g.normal(size=(sum(REF_SIZES), 5))
    return tuple(torch.tensor(a, dtype=dtype) for a in (query, ref, features))


@pytest.fixture(params=[torch.float32, torch.float64], ids=["float32", "float64"])
def clouds(request):
    return _clouds_of(request.param)


def _per_cloud():
    """(cloud, query rows, ref rows) of every cloud with queries."""
    qs, rs = _starts(QUERY_SIZES), _starts(REF_SIZES)
    for c in range(len(REF_SIZES)):
        if QUERY_SIZES[c]:
            yield c, slice(qs[c], qs[c + 1]), slice(rs[c], rs[c + 1])


def _leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def _weights(y: torch.Tensor) -> torch.Tensor:
    return torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape)


def test_knn_gives_each_cloud_what_a_call_on_it_alone_gives(clouds):
    query, ref, _ = clouds
    qb, rb = _batch(QUERY_SIZES), _batch(REF_SIZES)
    q, r = _leaves(query, ref)
    dist, idx, _ = wb.ops.knn(q, r, 7, query_batch=qb, ref_batch=rb)
    (torch.where(torch.isfinite(dist), dist, 0) * _weights(dist)).sum().backward()
    for c, qs, rs in _per_cloud():
        if rs.stop - rs.start < 7:
            found = rs.stop - rs.start
            assert torch.isinf(dist[qs, found:]).all() and (idx[qs, found:] == -1).all(), c
            assert ((idx[qs, :found] >= rs.start) & (idx[qs, :found] < rs.stop)).all(), c
            continue
        q1, r1 = _leaves(query[qs], ref[rs])
        d1, i1, _ = wb.ops.knn(q1, r1, 7)
        (d1 * _weights(dist)[qs]).sum().backward()
        assert torch.equal(dist[qs], d1) and torch.equal(idx[qs], i1 + rs.start), c
        assert torch.equal(q.grad[qs], q1.grad), c
        torch.testing.assert_close(r.grad[rs], r1.grad, rtol=0, atol=1e-12)


def test_knn_aggregate_gives_each_cloud_what_a_call_on_it_alone_gives(clouds):
    query, ref, features = clouds
    qb, rb = _batch(QUERY_SIZES), _batch(REF_SIZES)
    q, r, f = _leaves(query, ref, features)
    out = wb.ops.knn_aggregate(q, r, f, 6, 0.3, query_batch=qb, ref_batch=rb)
    (out * _weights(out)).sum().backward()
    for c, qs, rs in _per_cloud():
        if rs.stop - rs.start < 6:
            continue  # no single-cloud call: k > N there
        q1, r1, f1 = _leaves(query[qs], ref[rs], features[rs])
        o1 = wb.ops.knn_aggregate(q1, r1, f1, 6, 0.3)
        (o1 * _weights(out)[qs]).sum().backward()
        assert torch.equal(out[qs], o1), c
        assert torch.equal(q.grad[qs], q1.grad), c
        torch.testing.assert_close(r.grad[rs], r1.grad, rtol=0, atol=1e-12)
        torch.testing.assert_close(f.grad[rs], f1.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("path", ["one pass", "pair list", "two searches"])
def test_radius_aggregate_gives_each_cloud_what_a_call_on_it_alone_gives(clouds, path, monkeypatch):
    if path != "one pass":
        monkeypatch.setattr(_launches, "one_pass_fits", lambda *a: False)
    if path == "two searches":
        monkeypatch.setattr(_launches, "PAIRS_PER_POINT", -(1 << 40))
    query, ref, features = clouds
    qb, rb = _batch(QUERY_SIZES), _batch(REF_SIZES)
    q, r, f = _leaves(query, ref, features)
    out = wb.ops.radius_aggregate(q, r, f, 0.6, 0.2, query_batch=qb, ref_batch=rb)
    (out * _weights(out)).sum().backward()
    for c, qs, rs in _per_cloud():
        q1, r1, f1 = _leaves(query[qs], ref[rs], features[rs])
        o1 = wb.ops.radius_aggregate(q1, r1, f1, 0.6, 0.2)
        (o1 * _weights(out)[qs]).sum().backward()
        assert torch.equal(out[qs], o1), c
        torch.testing.assert_close(q.grad[qs], q1.grad, rtol=0, atol=1e-12)
        torch.testing.assert_close(r.grad[rs], r1.grad, rtol=0, atol=1e-12)
        torch.testing.assert_close(f.grad[rs], f1.grad, rtol=0, atol=1e-12)


def test_radius_lists_give_each_cloud_what_a_call_on_it_alone_gives(clouds):
    query, ref, _ = clouds
    qb, rb = _batch(QUERY_SIZES), _batch(REF_SIZES)
    q, r = _leaves(query, ref)
    nb = wb.ops.radius(q, r, 0.5, query_batch=qb, ref_batch=rb, max_neighbors=6)
    (nb.distance * _weights(nb.distance)).sum().backward()
    for c, qs, rs in _per_cloud():
        q1, r1 = _leaves(query[qs], ref[rs])
        n1 = wb.ops.radius(q1, r1, 0.5, max_neighbors=6)
        rows = slice(int(nb.ptr[qs.start]), int(nb.ptr[qs.stop]))
        (n1.distance * _weights(nb.distance)[rows]).sum().backward()
        assert torch.equal(nb.index[rows], n1.index + rs.start) and torch.equal(nb.distance[rows], n1.distance), c
        assert torch.equal(nb.count[qs], n1.count) and torch.equal(nb.ptr[qs] - rows.start, n1.ptr[:-1]), c
        assert torch.equal(q.grad[qs], q1.grad), c
        torch.testing.assert_close(r.grad[rs], r1.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("loop", [False, True])
def test_graphs_give_each_cloud_its_own_graph(clouds, loop):
    _, ref, _ = clouds
    batch = _batch(REF_SIZES)
    knn_edges = wb.ops.knn_graph(ref, 4, batch=batch, loop=loop)
    radius_edges = wb.ops.radius_graph(ref, 0.3, batch=batch, loop=loop, max_neighbors=9)
    starts, sizes = _starts(REF_SIZES), REF_SIZES
    found, found_knn = [], []
    for c in range(len(sizes)):
        x = ref[starts[c] : starts[c + 1]]
        if sizes[c]:  # a cloud too small for k neighbours gives each point those it has
            found_knn.append(wb.ops.knn_graph(x, 4, loop=loop) + int(starts[c]))
            found.append(wb.ops.radius_graph(x, 0.3, loop=loop, max_neighbors=9) + int(starts[c]))
    assert torch.equal(knn_edges, torch.cat(found_knn, 1))
    assert torch.equal(radius_edges, torch.cat(found, 1))


# -- real-shaped clouds against dense float64 references ------------------------------------------

_SPEC = importlib.util.spec_from_file_location("distributions", os.path.join(ROOT, "benchmarks", "distributions.py"))
D = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(D)
SCANS = (
    "lidar sweep 150 m, 10% duplicates",
    "indoor room planes",
    "object scan, 30^3 grid queries",
    "duplicated points",
)


def _scan_batch():
    """Four real-shaped clouds of different sizes, each with its own queries, in float64."""
    refs, queries = [], []
    for c, name in enumerate(SCANS):
        r, q = D.make(name, 600 + 500 * c, seed=c)
        refs.append(torch.from_numpy(r).double())
        queries.append(torch.from_numpy(q).double())
    sizes = lambda parts: torch.tensor([len(p) for p in parts])  # noqa: E731
    ref_batch = torch.repeat_interleave(torch.arange(len(SCANS)), sizes(refs))
    query_batch = torch.repeat_interleave(torch.arange(len(SCANS)), sizes(queries))
    return torch.cat(queries), torch.cat(refs), query_batch, ref_batch


def test_batched_scans_match_a_dense_masked_reference():
    query, ref, qb, rb = _scan_batch()
    dense = (query[:, None] - ref[None]).norm(dim=-1).masked_fill(qb[:, None] != rb[None, :], float("inf"))
    dist, idx, _ = wb.ops.knn(query, ref, 8, query_batch=qb, ref_batch=rb)
    expected = torch.sort(dense, dim=1, stable=True)
    assert torch.equal(idx, expected.indices[:, :8])
    torch.testing.assert_close(dist, expected.values[:, :8], rtol=1e-12, atol=1e-12)
    radius = float(expected.values[:, 10].median())
    nb = wb.ops.radius(query, ref, radius, query_batch=qb, ref_batch=rb)
    inside = dense <= radius
    assert torch.equal(nb.count, inside.sum(1))
    rows = torch.repeat_interleave(torch.arange(len(query)), nb.count)
    torch.testing.assert_close(nb.distance, dense[rows, nb.index], rtol=1e-12, atol=1e-12)


def test_batched_aggregation_gradients_match_dense_float64_references():
    query, ref, qb, rb = _scan_batch()
    features = torch.randn(len(ref), 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    q, r, f = _leaves(query, ref, features)
    out = wb.ops.knn_aggregate(q, r, f, 5, 0.05, query_batch=qb, ref_batch=rb)
    (out * _weights(out)).sum().backward()
    for c in range(len(SCANS)):
        qs, rs = qb == c, rb == c
        q1, r1, f1 = _leaves(query[qs], ref[rs], features[rs])
        o1 = ref_ops.knn_aggregate(q1, r1, f1, 5, 0.05)
        (o1 * _weights(out)[qs]).sum().backward()
        torch.testing.assert_close(out[qs], o1, rtol=1e-10, atol=1e-12)
        for ours, theirs in ((q.grad[qs], q1.grad), (r.grad[rs], r1.grad), (f.grad[rs], f1.grad)):
            torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-11)


# -- bad batch vectors ------------------------------------------------------------------------------


def _points(n=10):
    return torch.randn(n, 3)


@pytest.mark.parametrize(
    ("query_batch", "ref_batch", "message"),
    [
        (torch.zeros(10, dtype=torch.int64), None, "'ref_batch' is missing"),
        (None, torch.zeros(10, dtype=torch.int64), "'query_batch' is missing"),
        (torch.zeros(10, dtype=torch.int32), torch.zeros(10, dtype=torch.int64), "int64 (10,) vector"),
        (torch.zeros(9, dtype=torch.int64), torch.zeros(10, dtype=torch.int64), "got int64 (9,)"),
        (torch.zeros(10, dtype=torch.int64), np.zeros(10, dtype=np.int64), "from one framework"),
        (torch.zeros(10, dtype=torch.int64), [0] * 10, "'ref_batch'"),
        (torch.zeros(10, dtype=torch.int64), torch.tensor([0, 0, 1, 1, 0, 1, 1, 1, 1, 1]), "ref_batch[4] = 0 follows"),
        (torch.full((10,), -1, dtype=torch.int64), torch.zeros(10, dtype=torch.int64), "from 0 to"),
        (torch.full((10,), 1 << 40, dtype=torch.int64), torch.zeros(10, dtype=torch.int64), "from 0 to"),
        (
            torch.full((10,), 1 << 29, dtype=torch.int64),
            torch.zeros(10, dtype=torch.int64),
            "go up to 536870912 for 20 points",
        ),
    ],
)
@pytest.mark.parametrize("op", ["knn", "knn_aggregate", "radius_aggregate", "radius"])
def test_bad_batch_vectors_are_refused(op, query_batch, ref_batch, message):
    q, r = _points(), _points()
    batches = {"query_batch": query_batch, "ref_batch": ref_batch}
    call = {
        "knn": lambda: wb.ops.knn(q, r, 3, **batches),
        "knn_aggregate": lambda: wb.ops.knn_aggregate(q, r, torch.ones(10, 2), 3, 0.1, **batches),
        "radius_aggregate": lambda: wb.ops.radius_aggregate(q, r, torch.ones(10, 2), 0.5, 0.1, **batches),
        "radius": lambda: wb.ops.radius(q, r, 0.5, **batches),
    }[op]
    with pytest.raises(wb.WarpBridgeError, match=re.escape(message)) as caught:
        call()
    assert op in str(caught.value)


def test_a_graph_refuses_a_batch_that_is_not_its_points():
    x = _points()
    with pytest.raises(wb.WarpBridgeError, match=r"'batch' must be an int64 \(10,\) vector"):
        wb.ops.knn_graph(x, 3, batch=torch.zeros(4, dtype=torch.int64))
    with pytest.raises(wb.WarpBridgeError, match=r"batch\[2\] = 0 follows"):
        wb.ops.radius_graph(x, 0.3, batch=torch.tensor([0, 1, 0, 1, 1, 1, 1, 1, 1, 1]))


def test_a_forest_is_each_cloud_s_own_tree_and_comes_back_from_its_order():
    """Cloud c's tree in the forest is the tree a build over cloud c alone makes (its nodes
    and places shifted, its indices offset), and the lists' rebuild from the order alone
    (no splits) gives the forest back."""
    import warp as wp

    from warpbridge.ops import _batches, _tree

    r = torch.from_numpy(D.make("lidar sweep 150 m, 10% duplicates", sum(REF_SIZES), seed=4)[0])
    r[301, 1] = float("nan")  # a point that is not finite sorts last in its cloud
    k = _tree.kernels_for("float32", wp.get_device("cpu"))
    points = wp.from_torch(r, dtype=wp.vec3)
    values = _batch(REF_SIZES).numpy()
    forest = _tree.Forest(*_batches.clouds(values, len(REF_SIZES), points.device))
    built = [a.numpy().copy() for a in _tree.tree(k, points, forest=forest)]
    again = [a.numpy() for a in _tree.tree_of_order(k, points, wp.array(built[0], dtype=wp.int32), forest)]
    for a, b in zip(built, again):
        np.testing.assert_array_equal(a, b)
    order, pts, lo, hi, min_index = built
    for c, (first, n, base, depth) in enumerate(forest.clouds.numpy()):
        if n == 0:
            continue
        alone = [a.numpy() for a in _tree.tree(k, wp.from_torch(r[first : first + n].contiguous(), dtype=wp.vec3))]
        nodes = slice(base + 1, base + (2 << depth))
        assert len(alone[2]) == 2 << depth, c
        np.testing.assert_array_equal(order[first : first + n], alone[0] + first)
        np.testing.assert_array_equal(pts[first : first + n], alone[1])
        np.testing.assert_array_equal(lo[nodes], alone[2][1:])
        np.testing.assert_array_equal(hi[nodes], alone[3][1:])
        np.testing.assert_array_equal(min_index[nodes], alone[4][1:] + first)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_forest_split_by_sorting_is_each_cloud_s_sorted_tree(dtype):
    """CUDA builds a forest by sorting all points at each level, every tree's nodes of that
    level numbered across the forest (``_tree._split_by_sort``); run here on the CPU,
    cloud c's tree is exactly the tree CUDA's sort build makes over cloud c alone (empty,
    one-point and leaf-sized clouds, duplicates and a NaN point among them)."""
    import warp as wp

    from warpbridge.ops import _batches, _tree

    sizes = [0, *REF_SIZES, 1, 22, 23, 0]
    r = torch.from_numpy(D.make("lidar sweep 150 m, 10% duplicates", sum(sizes), seed=5)[0])
    r[17, 2] = float("nan")
    cpu = wp.get_device("cpu")
    k = _tree.kernels_for(dtype, cpu)
    points = wp.from_torch(r.to(getattr(torch, dtype)), dtype=k.V)
    forest = _tree.Forest(*_batches.clouds(_batch(sizes).numpy(), len(sizes), cpu))
    built = [wp.empty_like(a) for a in _tree.tree(k, points, forest=forest)]
    _tree.build_forest(k, points, tuple(built), forest, by_sort=True)
    order, pts, lo, hi, min_index = (a.numpy() for a in built)
    for first, n, base, depth in forest.clouds.numpy():
        if n == 0:
            continue
        alone = tuple(wp.empty_like(a) for a in _tree.tree(k, wp.array(points.numpy()[first : first + n], dtype=k.V)))
        _tree.build_tree(k, wp.array(points.numpy()[first : first + n], dtype=k.V), alone, cpu, None, by_sort=True)
        alone = [a.numpy() for a in alone]
        nodes = slice(base + 1, base + (2 << depth))
        np.testing.assert_array_equal(order[first : first + n], alone[0] + first)
        np.testing.assert_array_equal(pts[first : first + n], alone[1])
        np.testing.assert_array_equal(lo[nodes], alone[2][1:])
        np.testing.assert_array_equal(hi[nodes], alone[3][1:])
        np.testing.assert_array_equal(min_index[nodes], alone[4][1:] + first)


@pytest.mark.compile
def test_batched_ops_compile_into_one_graph_with_their_gradients():
    query, ref, features = (t.float() for t in _clouds_of(torch.float64))
    qb, rb = _batch(QUERY_SIZES), _batch(REF_SIZES)

    def model(q, r, f):
        batches = {"query_batch": qb, "ref_batch": rb}
        a = wb.ops.radius_aggregate(q, r, f, 0.6, 0.2, **batches).square().sum()
        b = wb.ops.knn_aggregate(q, r, f, 4, 0.2, **batches).sum()
        d = wb.ops.knn(q, r, 4, **batches)[0]
        return a + b + torch.where(torch.isfinite(d), d, 0).sum(), wb.ops.knn_graph(r, 3, batch=rb)

    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    ins, ins2 = _leaves(query, ref, features), _leaves(query, ref, features)
    (loss, edges), (loss2, edges2) = compiled(*ins), model(*ins2)
    torch.testing.assert_close(loss, loss2)
    assert torch.equal(edges, edges2)
    for a, b in zip(torch.autograd.grad(loss, ins), torch.autograd.grad(loss2, ins2)):
        torch.testing.assert_close(a, b)

    def mean_distance(q, r):
        return wb.ops.radius(q, r, 0.5, query_batch=qb, ref_batch=rb).distance.mean()

    compiled = torch.compile(mean_distance, fullgraph=True, backend="aot_eager")  # a symbolic length
    torch.testing.assert_close(compiled(*ins[:2]), mean_distance(*ins2[:2]))
    for a, b in zip(
        torch.autograd.grad(compiled(*ins[:2]), ins[:2]), torch.autograd.grad(mean_distance(*ins2[:2]), ins2[:2])
    ):
        torch.testing.assert_close(a, b)


def test_strided_batch_vectors_clouds_without_references_and_numpy():
    g = torch.Generator().manual_seed(9)
    r, q = torch.randn(40, 3, generator=g), torch.randn(10, 3, generator=g)
    ref_batch = torch.arange(80).div(20, rounding_mode="floor")[::2]  # a strided view: clouds 0 to 3
    query_batch = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 7, 7])  # cloud 7 has no references
    dist, idx, _ = wb.ops.knn(q, r, 3, query_batch=query_batch, ref_batch=ref_batch)
    assert torch.isinf(dist[8:]).all() and (idx[8:] == -1).all()
    for c in range(4):
        rows, refs = slice(2 * c, 2 * c + 2), slice(10 * c, 10 * c + 10)
        d1, i1, _ = wb.ops.knn(q[rows], r[refs], 3)
        assert torch.equal(dist[rows], d1) and torch.equal(idx[rows], i1 + 10 * c), c
    nb = wb.ops.radius(q, r, 1.5, query_batch=query_batch, ref_batch=ref_batch)
    assert nb.count[8:].tolist() == [0, 0]
    as_numpy = wb.ops.knn(q.numpy(), r.numpy(), 3, query_batch=query_batch.numpy(), ref_batch=ref_batch.numpy())
    np.testing.assert_array_equal(as_numpy[1], idx.numpy())
