"""Radius neighbour lists and PyG-style graphs (``wb.ops.radius``, ``radius_graph``,
``knn_graph``): the same neighbours as a dense float64 reference on clouds shaped like real
data, rows nearest first, caps that keep the closest, self-loops as asked, distances whose
gradients match autograd through a dense formula, and bad input refused before any launch."""

import importlib.util
import math
import os

import numpy as np
import pytest
import torch
import warp as wp

import warpbridge as wb
from warpbridge import WarpBridgeError

ROOT = os.path.join(os.path.dirname(__file__), "..")
_spec = importlib.util.spec_from_file_location("distributions", os.path.join(ROOT, "benchmarks", "distributions.py"))
D = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(D)


def cloud(name, n=2000, seed=0, dtype=torch.float64):
    r, q = D.make(name, n, seed)
    return torch.from_numpy(r).to(dtype), torch.from_numpy(q).to(dtype)


def dense_distances(q, r):
    """|q_i - r_j| in float64 from the differences (cdist's matrix-product form rounds more)."""
    q, r = q.double(), r.double()
    return torch.cat([(q[s : s + 64, None, :] - r[None]).norm(dim=-1) for s in range(0, q.shape[0], 64)])


def dense_lists(q, r, radius, cap=None, skip_self=False):
    """Each query's neighbours within ``radius`` as (index, distance) rows sorted by (distance,
    index), computed densely in float64 from the same float values."""
    d = dense_distances(q, r)
    rows = []
    for i in range(q.shape[0]):
        inside = torch.nonzero(d[i] <= radius).flatten()
        if skip_self:
            inside = inside[inside != i]
        order = sorted(inside.tolist(), key=lambda j: (d[i, j].item(), j))
        rows.append(order[:cap] if cap else order)
    return rows, d


def rows_of(nb):
    ptr = nb.ptr.tolist()
    return [nb.index[ptr[i] : ptr[i + 1]].tolist() for i in range(len(ptr) - 1)]


def near_cutoff(d, radius, rel=1e-5):
    """Whether a distance lies within float32 rounding of the radius."""
    return ((d - radius).abs() <= rel * radius).any().item()


@pytest.mark.parametrize("name", list(D.DISTRIBUTIONS))
def test_radius_lists_match_a_dense_reference(name, tree_build):
    r, q = cloud(name)
    radius = float(dense_distances(q[:200], r).kthvalue(12, dim=1).values.median())
    nb = wb.ops.radius(q, r, radius)
    want, d = dense_lists(q, r, radius)
    # same neighbours, nearest first, ties (duplicated points) by the smaller index
    assert rows_of(nb) == want
    assert nb.count.tolist() == [len(w) for w in want]
    assert nb.ptr[0] == 0 and torch.equal(torch.diff(nb.ptr), nb.count)
    assert nb.index.dtype == torch.int64 and nb.ptr.dtype == torch.int64 and nb.count.dtype == torch.int64
    row = torch.repeat_interleave(torch.arange(q.shape[0]), nb.count)
    torch.testing.assert_close(nb.distance, d[row, nb.index], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("threads", [1, 2])
def test_float32_lists_and_many_queries_in_morton_order(threads):
    """Above QUERY_ORDER_MIN queries (Morton order), float32, both thread counts."""
    wb.ops.set_num_threads(threads)
    try:
        r, q = cloud("lidar rings + 20 far", n=90_000, seed=3, dtype=torch.float32)
        q = q[:17_000]
        radius = 0.4
        nb = wb.ops.radius(q, r, radius)
        want, d = dense_lists(q[:300], r, radius)
        clean = [i for i in range(300) if not near_cutoff(d[i], radius)]  # float32 may round either way there
        assert len(clean) > 250
        got = rows_of(nb)
        assert [got[i] for i in clean] == [want[i] for i in clean]
        assert int(nb.ptr[-1]) == nb.index.shape[0] == int(nb.count.sum())
    finally:
        wb.ops.set_num_threads(None)


def test_max_neighbors_keeps_the_closest_and_count_shows_the_cut():
    r, q = cloud("duplicated points", n=1500, seed=1)
    radius = float(dense_distances(q, r).kthvalue(40, dim=1).values.median())
    full = wb.ops.radius(q, r, radius)
    capped = wb.ops.radius(q, r, radius, max_neighbors=5)
    want, _ = dense_lists(q, r, radius, cap=5)
    assert rows_of(capped) == want
    assert torch.equal(capped.count, full.count)
    assert torch.equal(torch.diff(capped.ptr), full.count.clamp(max=5))
    assert (full.count > 5).any()  # the cap did cut


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_capped_rows_are_the_first_of_the_full_rows_on_a_lattice(dtype):
    """A lattice: most distances tie, and the radii fall exactly on lattice distances (d = r is
    in). A capped row (the closest of more, found by a kNN walk bounded by the radius) is the
    start of the full row (all of them, sorted by distance, then index), self-joins without the
    point itself included."""
    g = torch.arange(6.0, dtype=dtype)
    x = torch.stack(torch.meshgrid(g, g, g, indexing="ij"), -1).reshape(-1, 3)
    for radius, cap in [(1.0, 3), (1.0, 5), (2.0, 5), (3.0, 1)]:
        for q, loop in ((x, True), (x[::3], True), (x, False)):
            full = rows_of(wb.ops.radius(q, x, radius, loop=loop))
            capped = wb.ops.radius(q, x, radius, loop=loop, max_neighbors=cap)
            assert rows_of(capped) == [row[:cap] for row in full]
            assert any(len(row) > cap for row in full)


def test_loop_false_drops_only_the_point_itself():
    r, _ = cloud("duplicated points", n=1200, seed=2)
    radius = 0.05
    with_self = rows_of(wb.ops.radius(r, r, radius))
    without = rows_of(wb.ops.radius(r, r, radius, loop=False))
    want, _ = dense_lists(r, r, radius, skip_self=True)
    assert without == want
    assert all(i in row for i, row in enumerate(with_self))
    assert all(i not in row for i, row in enumerate(without))
    assert any(len(row) > 0 for row in without)  # duplicates stay neighbours of each other


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_distance_gradients_match_autograd_through_the_dense_formula(dtype):
    r, q = cloud("gaussian", n=800, seed=4, dtype=dtype)
    radius = 0.5
    q.requires_grad_()
    r.requires_grad_()
    nb = wb.ops.radius(q, r, radius)
    w = torch.linspace(-1, 1, nb.distance.numel(), dtype=dtype)
    (nb.distance * w).sum().backward()
    q64, r64 = q.detach().double().requires_grad_(), r.detach().double().requires_grad_()
    row = torch.repeat_interleave(torch.arange(q.shape[0]), nb.count)
    ((q64[row] - r64[nb.index]).norm(dim=1) * w.double()).sum().backward()
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(q.grad.double(), q64.grad, **tol)
    torch.testing.assert_close(r.grad.double(), r64.grad, **tol)


def test_coincident_points_get_a_zero_gradient_not_nan():
    x = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.1, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    nb = wb.ops.radius(x, x, 0.5)
    nb.distance.sum().backward()
    assert torch.isfinite(x.grad).all()
    # point 2 is pulled away from both others: d/dx2 of |x2 - x0| + |x2 - x1| (twice: both directions)
    torch.testing.assert_close(x.grad[2], torch.tensor([4.0, 0.0, 0.0], dtype=torch.float64))


def test_radius_graph_is_pyg_edge_index():
    r, _ = cloud("sphere surface", n=1000, seed=5)
    ei = wb.ops.radius_graph(r, 0.1)
    assert ei.shape[0] == 2 and ei.dtype == torch.int64
    nb = wb.ops.radius(r, r, 0.1, loop=False)
    assert torch.equal(ei[0], nb.index)  # row 0: the neighbour (source)
    assert torch.equal(ei[1], torch.repeat_interleave(torch.arange(1000), nb.count))  # row 1: the centre
    assert not (ei[0] == ei[1]).any()
    with_loops = wb.ops.radius_graph(r, 0.1, loop=True)
    assert with_loops.shape[1] == ei.shape[1] + 1000
    capped = wb.ops.radius_graph(r, 0.1, max_neighbors=3)
    assert torch.bincount(capped[1], minlength=1000).max() <= 3


@pytest.mark.parametrize("loop", [False, True])
def test_knn_graph_matches_a_dense_reference(loop):
    r, _ = cloud("duplicated points", n=900, seed=6)
    k = 6
    ei = wb.ops.knn_graph(r, k, loop=loop)
    assert ei.shape == (2, 900 * k) and ei.dtype == torch.int64
    d = dense_distances(r, r)
    if not loop:
        d.fill_diagonal_(float("inf"))
    for i in range(0, 900, 7):
        want = sorted(range(900), key=lambda j: (d[i, j].item(), j))[:k]
        assert ei[0, i * k : (i + 1) * k].tolist() == want
        assert (ei[1, i * k : (i + 1) * k] == i).all()
    if not loop:
        assert not (ei[0] == ei[1]).any()
        assert (d[ei[1], ei[0]] == 0).any()  # duplicates of a point are its neighbours


def test_knn_graph_never_holds_minus_one():
    """A point that is not finite has no edges and is nobody's neighbour; a cloud with k
    points or fewer gives each of its points n - 1 edges (n with loop=True), and k past every
    cloud gives what exists (torch_cluster's knn_graph); an empty cloud gives (2, 0). Where
    -1 was the padding, x[edge_index[0]] read the last point of another cloud."""
    x = torch.randn(50, 3, dtype=torch.float64)
    x[7, 0] = float("nan")
    ei = wb.ops.knn_graph(x, 3)
    assert ei.shape == (2, 49 * 3) and not (ei == 7).any() and (ei >= 0).all()
    batch = torch.tensor([0] * 3 + [1] * 40 + [2] * 1 + [3] * 6)
    for loop in (False, True):
        ei = wb.ops.knn_graph(x, 5, batch=batch, loop=loop)
        assert (ei >= 0).all() and (batch[ei[0]] == batch[ei[1]]).all()
        degree = torch.bincount(ei[1], minlength=50)
        sizes = torch.bincount(batch)[batch] - (batch == 1).long()  # cloud 1 holds the NaN point
        want = torch.clamp(sizes - (0 if loop else 1), max=5)
        want[7] = 0
        assert torch.equal(degree, want), loop
    big = wb.ops.knn_graph(x[8:18], 1000)  # k past the cloud: every other point, nearest first
    assert big.shape == (2, 10 * 9)
    d = dense_distances(x[8:18], x[8:18]).fill_diagonal_(float("inf"))
    assert torch.equal(big[0].view(10, 9), d.sort(dim=1, stable=True).indices[:, :9])
    assert wb.ops.knn_graph(x[:0], 3).shape == (2, 0)
    assert wb.ops.knn_graph(x[:1], 3).shape == (2, 0)


def test_empty_clouds_and_empty_lists():
    q = torch.rand(5, 3, dtype=torch.float64) + 10
    r = torch.rand(8, 3, dtype=torch.float64)
    nb = wb.ops.radius(q, r, 0.1)
    assert nb.index.shape == (0,) and nb.ptr.tolist() == [0] * 6 and nb.count.tolist() == [0] * 5
    nb = wb.ops.radius(torch.zeros(0, 3, dtype=torch.float64), r, 0.1)
    assert nb.ptr.tolist() == [0] and nb.index.shape == (0,)
    nb = wb.ops.radius(q, torch.zeros(0, 3, dtype=torch.float64), 0.1)
    assert nb.count.tolist() == [0] * 5


def test_numpy_and_warp_inputs_give_their_own_arrays():
    r, q = cloud("uniform", n=500, seed=7)
    nb = wb.ops.radius(q.numpy(), r.numpy(), 0.2)
    assert isinstance(nb.index, np.ndarray) and isinstance(nb.ptr, np.ndarray)
    assert rows_of(wb.ops.radius(q, r, 0.2)) == [
        nb.index[nb.ptr[i] : nb.ptr[i + 1]].tolist() for i in range(q.shape[0])
    ]
    ei = wb.ops.knn_graph(r.numpy(), 4)
    assert isinstance(ei, np.ndarray) and ei.shape == (2, 2000)
    nb_wp = wb.ops.radius(wp.array(q.numpy(), dtype=wp.vec3d), wp.array(r.numpy(), dtype=wp.vec3d), 0.2)
    assert isinstance(nb_wp.index, wp.array) and np.array_equal(nb_wp.index.numpy(), nb.index)


def test_half_precision_is_searched_in_float32():
    r, q = cloud("gaussian", n=600, seed=8, dtype=torch.float32)
    nb16 = wb.ops.radius(q.half(), r.half(), 0.3)
    nb32 = wb.ops.radius(q.half().float(), r.half().float(), 0.3)
    assert torch.equal(nb16.index, nb32.index) and nb16.distance.dtype == torch.float16


def test_callers_tensors_are_not_modified():
    r, q = cloud("clusters" if "clusters" in D.DISTRIBUTIONS else "20 tight clusters", n=700, seed=9)
    before = (q.clone(), r.clone())
    wb.ops.radius(q, r, 0.2, max_neighbors=4)
    wb.ops.radius_graph(r, 0.2)
    wb.ops.knn_graph(r, 3)
    assert torch.equal(q, before[0]) and torch.equal(r, before[1])


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda q, r: wb.ops.radius(q, r, 0.1, max_neighbors=0),
            r"'max_neighbors' must be None \(no cap\) or a positive int",
        ),
        (
            lambda q, r: wb.ops.radius(q, r, 0.1, max_neighbors=2.5),
            r"'max_neighbors' must be None \(no cap\) or a positive int",
        ),
        (lambda q, r: wb.ops.radius(q, r, 0.1, loop=1), "'loop' must be True or False"),
        (lambda q, r: wb.ops.radius(q, r, -1.0), "'radius' must be positive"),
        (lambda q, r: wb.ops.radius(q, r[:, :2], 0.1), "'ref' has 2 coordinates per point but 'query' has 3"),
        (lambda q, r: wb.ops.radius(q, r.float(), 0.1), "must share one dtype"),
        (lambda q, r: wb.ops.radius_graph(r, 0.0), "'r' must be positive"),
        (lambda q, r: wb.ops.knn_graph(r, 10, loop=True), None),
        (lambda q, r: wb.ops.knn_graph(r, 0), "'k' must be at least 1, got 0"),
        (lambda q, r: wb.ops.knn_graph(r, 2.0), "'k' must be an int"),
        (
            lambda q, r: wb.ops.knn_graph(r[:, :0], 2),
            r"'x' must have shape \(N, D\) with 1 <= D <= 4096, got \(10, 0\)",
        ),
    ],
)
def test_bad_input_is_refused_before_launch(call, match):
    q, r = torch.rand(4, 3, dtype=torch.float64), torch.rand(10, 3, dtype=torch.float64)
    if match is None:
        assert call(q, r).shape == (2, 100)
        return
    with pytest.raises(WarpBridgeError, match=match):
        call(q, r)


@pytest.mark.compile
def test_compile_knn_graph_and_radius_lists_fullgraph():
    r, q = cloud("gaussian", n=400, seed=10, dtype=torch.float32)

    def graph(x):
        return wb.ops.knn_graph(x, 5)

    compiled = torch.compile(graph, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(r), graph(r))

    def mean_distance(q, r):
        return wb.ops.radius(q, r, 0.4).distance.mean()

    ins = [t.clone().requires_grad_() for t in (q, r)]
    ins2 = [t.clone().requires_grad_() for t in (q, r)]
    for fullgraph in (False, True):  # the lists' length is a symbolic size in one graph
        torch._dynamo.reset()  # (else the second compile takes the first's frames)
        compiled = torch.compile(mean_distance, fullgraph=fullgraph, backend="aot_eager")
        torch.testing.assert_close(compiled(*ins), mean_distance(*ins2))
        for a, b in zip(torch.autograd.grad(compiled(*ins), ins), torch.autograd.grad(mean_distance(*ins2), ins2)):
            torch.testing.assert_close(a, b)


@pytest.mark.compile
def test_radius_lists_compile_once_without_fullgraph():
    """Without fullgraph the lists break the graph where their length is read; no graph
    compiles again for new sizes, a new radius or the library seeing another framework."""
    from torch._dynamo.testing import CompileCounter

    def model(x, r):
        nb = wb.ops.radius(x, x, r, loop=False)
        return nb.distance.sum() + wb.ops.radius_graph(x, r).shape[1]

    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, dynamic=True)
    for i, (n, r) in enumerate([(100, 0.15), (130, 0.15), (160, 0.2), (190, 0.25)]):
        x = cloud("uniform", n=n, seed=i, dtype=torch.float32)[0]
        torch.testing.assert_close(compiled(x, r), model(x, r))
        if i == 0:
            frames = counter.frame_count
            wb.ops.radius_graph(x.numpy(), r)  # another framework's backend, loaded or looked up
    assert counter.frame_count == frames


def test_check_op_on_the_list_ops():
    """The list ops are wb.op ops: finite differences on the distances, untouched inputs,
    torch.library.opcheck on their registered custom ops."""
    from warpbridge.ops import _op_table
    from warpbridge.testing import check_op

    ops = _op_table.ops_for("float64")
    r, q = cloud("uniform", n=150, seed=11)
    radius = 0.3
    _, d = dense_lists(q, r, radius)
    keep = ~((d - radius).abs() < 0.02).any(1)  # finite differences must not straddle the cut-off
    q = q[keep][:25]
    ins = [q.clone().requires_grad_(), r.clone().requires_grad_()]
    count, ptr, order, queries, listed = ops.radius_count(*ins, radius, 1000, 0)
    check_op(ops.radius_list, *ins, ptr, order, queries, listed, radius, 0, 1000, int(ptr[-1]))
    batches = ((torch.arange(len(q)) >= 10).long(), (torch.arange(len(r)) >= 70).long())  # two clouds
    count, ptr, order, queries, listed = ops.radius_count_batched(*ins, *batches, radius, 1000, 0)
    check_op(ops.radius_list_batched, *ins, *batches, ptr, order, queries, listed, radius, 0, 1000, int(ptr[-1]))


@pytest.mark.parametrize("name", ["lidar rings + 20 far", "duplicated points", "one far outlier"])
def test_a_tree_rebuilt_from_its_order_is_the_built_tree(name):
    """radius_list takes up the count's tree from its order alone (no splits): the same
    points, boxes and smallest indices as the build made."""
    import warp as wp

    from warpbridge.ops import _tree

    r, _ = cloud(name, n=5000, seed=12, dtype=torch.float32)
    r[7, 2] = float("nan")  # a point that is not finite sorts last either way
    k = _tree.kernels_for("float32", wp.get_device("cpu"))
    points = wp.from_torch(r, dtype=wp.vec3)
    built = [a.numpy().copy() for a in _tree.tree(k, points)]
    again = [a.numpy() for a in _tree.tree_of_order(k, points, wp.array(built[0], dtype=wp.int32))]
    for a, b in zip(built, again):
        np.testing.assert_array_equal(a[1:], b[1:])  # node 0 is unused


def test_points_that_are_not_finite_have_and_are_no_neighbours():
    x = torch.randn(60, 3, dtype=torch.float64) * 0.1
    x[4, 1] = float("nan")
    x[9] = float("inf")
    nb = wb.ops.radius(x, x, 10.0)
    rows = rows_of(nb)
    assert rows[4] == [] and rows[9] == []
    assert all(4 not in row and 9 not in row for row in rows)
    assert all(len(row) == 58 for i, row in enumerate(rows) if i not in (4, 9))
    assert torch.isfinite(nb.distance).all()


def test_more_pairs_than_a_list_holds_are_refused_before_the_fill(monkeypatch):
    from warpbridge.ops import _lists

    monkeypatch.setattr(_lists, "MAX_PAIRS", 50)
    r = torch.rand(40, 3, dtype=torch.float64)
    with pytest.raises(WarpBridgeError, match="neighbour pairs found, more than one list holds .50.*max_neighbors"):
        wb.ops.radius(r, r, 10.0)
    assert wb.ops.radius(r, r, 10.0, max_neighbors=1).index.shape == (40,)  # capped: 40 pairs
    with pytest.raises(WarpBridgeError, match=r"N \* k = 80 edges, more than one graph holds"):
        wb.ops.knn_graph(r, 2)


def test_a_capped_radius_list_is_the_radius_masked_knn():
    """What the docs offer for a fixed size under jax.jit: the kNN rows masked at the radius
    hold exactly the capped list's neighbours, in the same order."""
    r, q = cloud("lidar rings + 20 far", n=2000, seed=21)
    dist, idx, _ = wb.ops.knn(q, r, 8)
    radius = float(dist[:, 4].median())
    nb = wb.ops.radius(q, r, radius, max_neighbors=8)
    for i in range(len(q)):
        inside = idx[i][dist[i] <= radius]
        assert torch.equal(inside, nb.index[nb.ptr[i] : nb.ptr[i + 1]]), i


@pytest.mark.parametrize("width", [1, 3, 4, 7, 64])
def test_rows_longer_than_the_count_keeps_are_walked_on_from_where_it_stopped(width, monkeypatch):
    """The count keeps at most ``width`` places a row for the fill. A longer row keeps
    ``width - 3`` of them and where the walk stood after them, and the fill walks only the rest;
    narrower than 4, the fill walks the whole row again. The lists are the dense reference's
    either way: duplicated points (rows up to ~250), a self-join without the point itself, a
    batch of two clouds, and a capped list."""
    from warpbridge.ops import _list_launches

    monkeypatch.setattr(_list_launches, "LISTED", width)
    r, q = cloud("duplicated points", n=1500, seed=5)
    radius = float(dense_distances(q[:100], r).kthvalue(40, dim=1).values.median())
    nb = wb.ops.radius(q, r, radius)
    want, _ = dense_lists(q, r, radius)
    assert rows_of(nb) == want
    assert (nb.count > width).sum() > 20 and int(nb.count.max()) > 100
    own = wb.ops.radius(r, r, radius, loop=False)
    assert rows_of(own) == dense_lists(r, r, radius, skip_self=True)[0]
    half = r.shape[0] // 2
    batch = (torch.arange(r.shape[0]) >= half).long()
    both = rows_of(wb.ops.radius(r, r, radius, query_batch=batch, ref_batch=batch))
    first, second = dense_lists(r[:half], r[:half], radius)[0], dense_lists(r[half:], r[half:], radius)[0]
    assert both == first + [[j + half for j in row] for row in second]
    capped = wb.ops.radius(q, r, radius, max_neighbors=50)
    assert rows_of(capped) == dense_lists(q, r, radius, cap=50)[0]


@pytest.mark.parametrize("scale", [1e-18, 1e18, 1e20])
def test_float32_lists_at_extreme_scales_match_a_float64_reference(scale):
    """Coordinates whose squared differences underflow (1e-18) or overflow (1e20) float32, and
    a radius whose square does (1e20): the walk compares scaled norms there. Rows, capped rows
    and distances match the float64 reference on the same float32 values, but for pairs
    within float32 rounding of the radius."""
    g = torch.Generator().manual_seed(11)
    r = (torch.rand(400, 3, generator=g, dtype=torch.float64) * scale).float()
    q = (torch.rand(60, 3, generator=g, dtype=torch.float64) * scale).float()
    radius = 0.25 * scale
    nb = wb.ops.radius(q, r, radius)
    want, d = dense_lists(q, r, radius)
    got = rows_of(nb)
    assert sum(map(len, want)) > 300
    for i, (row, expected) in enumerate(zip(got, want)):
        if row != expected:
            differ = set(row) ^ set(expected)
            assert differ and near_cutoff(d[i, sorted(differ)], radius), (i, row, expected)
    for i, row in enumerate(got):
        torch.testing.assert_close(nb.distance[nb.ptr[i] : nb.ptr[i + 1]].double(), d[i, row], rtol=1e-6, atol=0)
    capped = wb.ops.radius(q, r, radius, max_neighbors=3)
    assert all(row[:3] == expected[:3] for row, expected in zip(rows_of(capped), got))


def test_edge_rows_keep_their_strides_past_32_bits():
    """A (2, E) int64 edge array's row stride is 8 E bytes: from E = 2^28 on it no longer fits
    the 32-bit strides of Warp's array descriptor (radius_graph and knn_graph crashed there).
    The list kernels take rows 0 and 1 as two 1-D arrays, whose stride is 8 bytes. Checked on
    the descriptors alone (no memory of that size is touched); the real size, 2^28 + 2^15 + 1
    pairs, is a benchmark (``benchmarks/lists.py --huge``)."""
    from warpbridge.ops import _tree
    from warpbridge.ops._list_launches import edge_rows

    e = (1 << 28) + 1
    base = 1 << 20  # a made-up address: only descriptors are built
    edges = wp.array(ptr=base, dtype=wp.int64, shape=(2, e), strides=(8 * e, 8), device="cpu")
    sources, targets = edge_rows(edges)
    assert (sources.ptr, targets.ptr) == (base, base + 8 * e)
    assert sources.shape == targets.shape == (e,) and sources.strides == targets.strides == (8,)
    k = _tree.kernels_for("float32", wp.get_device("cpu"))
    for name in ("radius_fill", "knn_edges", "list_backward"):
        args = {a.label: a.type for a in getattr(k, name).adj.args}
        if name == "radius_fill":  # its edges in a struct of 1-D arrays
            args = {field: var.type for field, var in args["edges"].vars.items()}
        assert args["sources"].ndim == 1 and args.get("targets", args["sources"]).ndim == 1, name


def _small_lists_cases():
    """One small cloud (``_lists._small``): a lattice with distances exactly at the radius,
    points that are not finite and duplicated, squares that overflow or underflow, float32
    in 2-D, 16-D."""
    g = torch.Generator().manual_seed(22)
    lattice = torch.stack(torch.meshgrid(*[torch.arange(5.0, dtype=torch.float64)] * 3, indexing="ij"), -1).reshape(
        -1, 3
    )
    odd = torch.randn(60, 3, generator=g, dtype=torch.float64)
    odd[3], odd[7, 1], odd[9] = math.nan, math.inf, odd[2]
    return {
        "lattice at the radius": (lattice, 1.0),
        "not finite and duplicated": (odd, 1.2),
        "huge": (odd * 1e200, 1.2e200),
        "tiny": (odd * 1e-200, 1.2e-200),
        "float32, 2-D": (torch.rand(100, 2, generator=g), 0.2),
        "16-D": (torch.randn(40, 16, generator=g, dtype=torch.float64), 5.0),
    }


def _small_calls(monkeypatch) -> list:
    """What each ``_lists._small`` check answered, in call order."""
    from warpbridge.ops import _lists

    calls, real_small = [], _lists._small
    monkeypatch.setattr(_lists, "_small", lambda *a: calls.append(real_small(*a)) or calls[-1])
    return calls


@pytest.mark.parametrize("case", list(_small_lists_cases()))
def test_a_small_clouds_lists_in_one_op_are_the_trees(case, monkeypatch):
    """A small cloud's radius lists come from one op that compares each query with every
    point: the same rows, distances, counts and caps as through the tree, bit for bit, and
    so do its radius graphs; the same gradients (a point's is summed in the queries' order,
    which differs)."""
    from warpbridge.ops import _knn_launches

    x, r = _small_lists_cases()[case]
    calls = _small_calls(monkeypatch)
    results = []
    for pairs in (_knn_launches.SMALL_PAIRS, 0):  # in one op, then through the tree
        monkeypatch.setattr(_knn_launches, "SMALL_PAIRS", pairs)
        xg = x.clone().requires_grad_()
        nb = wb.ops.radius(xg, xg, r, loop=False)
        capped = wb.ops.radius(xg, xg, r, max_neighbors=3)
        grad = torch.autograd.grad(nb.distance.sum() + capped.distance.square().sum(), xg)[0]
        graphs = [wb.ops.radius_graph(x, r, loop=loop, max_neighbors=cap) for loop, cap in ((False, None), (True, 2))]
        results.append((*nb, *capped, *graphs, grad))
    assert calls[:4] == [True] * 4 and calls[4:] == [False] * 4
    for ours, tree in zip(results[0][:-1], results[1][:-1]):
        assert ours.dtype == tree.dtype and torch.equal(ours, tree) and ours.is_contiguous()
    rtol = 1e-12 if x.dtype == torch.float64 else 1e-5
    torch.testing.assert_close(results[0][-1], results[1][-1], rtol=rtol, atol=rtol * results[1][-1].abs().max())
    assert len(results[0][0]) > 0


@pytest.mark.parametrize("case", list(_small_lists_cases()))
def test_a_small_clouds_knn_graph_in_one_launch_is_the_trees(case, monkeypatch):
    """A small cloud's kNN graph comes from one op and one launch (``knn_graph_small``): the
    same edges as the tree's two ops, bit for bit, for every k (past the cloud's size too),
    with and without self-loops, contiguous and never -1."""
    from warpbridge.ops import _knn_launches

    x, _ = _small_lists_cases()[case]
    calls = _small_calls(monkeypatch)
    graphs = []
    for pairs in (_knn_launches.SMALL_PAIRS, 0):  # in one launch, then through the tree
        monkeypatch.setattr(_knn_launches, "SMALL_PAIRS", pairs)
        graphs.append([wb.ops.knn_graph(x, k, loop=loop) for k in (1, 4, 16, 500) for loop in (False, True)])
    assert calls == [True] * 8 + [False] * 8
    for ours, tree in zip(*graphs):
        assert ours.dtype == torch.int64 and torch.equal(ours, tree) and ours.is_contiguous()
        assert ours.shape[1] > 0 and int(ours.min()) >= 0


@pytest.mark.parametrize("cap", [1, 3, 2**31 - 1])
def test_row_offsets_by_scan_are_the_one_thread_sums(cap):
    """CUDA takes the rows' offsets from Warp's parallel scan of the capped counts; run here on
    the CPU, it gives the one-thread kernel's offsets (empty, zero and huge counts)."""
    from warpbridge.ops import _launches, _tree

    k, device = _tree.kernels_for("float32", wp.get_device("cpu")), wp.get_device("cpu")
    rng = np.random.default_rng(7)
    for counts in (np.zeros(0), np.zeros(5), rng.integers(0, 9, 1000), np.array([2**40, 4, 0, 2**33])):
        c = wp.array(counts.astype(np.int64), dtype=wp.int64)
        one, scan = (wp.zeros(len(counts) + 1, dtype=wp.int64) for _ in range(2))
        _launches.row_offsets(k, c, cap, one, device, by_scan=False)
        _launches.row_offsets(k, c, cap, scan, device, by_scan=True)
        want = np.r_[0, np.cumsum(np.minimum(counts.astype(np.int64), cap))]
        assert np.array_equal(one.numpy(), want) and np.array_equal(scan.numpy(), want)
