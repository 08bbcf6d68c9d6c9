"""The neighbour ops on point clouds shaped like real data (the distributions of
``benchmarks/distributions.py``): exact against dense float64 references, gradients included,
and in bounded time on the inputs that used to blow up a bounding-box grid."""

import importlib.util
import os

import points_reference as ref_ops
import pytest
import torch

import warpbridge as wb

ROOT = os.path.join(os.path.dirname(__file__), "..")
_spec = importlib.util.spec_from_file_location("distributions", os.path.join(ROOT, "benchmarks", "distributions.py"))
D = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(D)

NAMES = list(D.DISTRIBUTIONS)


def cloud(name, n=3000, seed=0):
    r, q = D.make(name, n, seed)
    return torch.from_numpy(r).double(), torch.from_numpy(q).double()


def dense_knn(q, r, k):
    d = ref_ops.distances(q, r)
    idx = torch.sort(d, dim=1, stable=True).indices[:, :k]
    return idx


@pytest.mark.parametrize("name", NAMES)
def test_knn_is_exact(name, tree_build):
    r, q = cloud(name)
    dist, idx, _ = wb.ops.knn(q, r, 7)
    ref_idx = dense_knn(q, r, 7)
    # The same neighbours in the same order; exact ties (duplicated points) go to the smaller index.
    assert torch.equal(idx, ref_idx)
    torch.testing.assert_close(dist, (q[:, None] - r[ref_idx]).norm(dim=-1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_aggregations_and_gradients_are_exact(name, tree_build):
    r, q = cloud(name, n=1500, seed=1)
    f = torch.randn(len(r), 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    d = ref_ops.distances(q, r)
    radius = float(torch.kthvalue(d, 16, dim=1).values.median())  # ~16 neighbours per query
    sigma = radius / 2
    # keep queries off the cut-off, where the dense formula's mask would be ambiguous
    keep = ((d - radius).abs() > 1e-9 * max(radius, 1.0)).all(1)
    q = q[keep]
    for op, dense in (
        (
            lambda a, b, c: wb.ops.radius_aggregate(a, b, c, radius, sigma),
            lambda a, b, c: ref_ops.radius_aggregate(a, b, c, radius, sigma),
        ),
        (
            lambda a, b, c: wb.ops.knn_aggregate(a, b, c, 5, sigma),
            lambda a, b, c: ref_ops.knn_aggregate(a, b, c, 5, sigma),
        ),
    ):
        ours = [t.clone().requires_grad_() for t in (q, r, f)]
        theirs = [t.clone().requires_grad_() for t in (q, r, f)]
        out, want = op(*ours), dense(*theirs)
        torch.testing.assert_close(out, want)
        g = torch.randn_like(want)
        for a, b in zip(torch.autograd.grad(out, ours, g), torch.autograd.grad(want, theirs, g)):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_copies_of_one_point_give_the_smallest_indices(dtype):
    """kNN over 200,000 copies of one point with 20,000 queries on it: every distance is 0 and
    the ties go to the smallest indices. (It used to scan all the copies for each query: the
    time this takes, with the grids' worst distributions, is ``benchmarks/distributions.py
    --bounded``, target 1.5 s.)"""
    r = torch.full((200_000, 3), 0.25, dtype=dtype)
    d, i, _ = wb.ops.knn(r[:20_000].clone(), r, 7)
    assert (d == 0).all() and (i == torch.arange(7)).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_huge_and_tiny_coordinates(dtype):
    """Coordinates near 1e30 (their squares overflow float32) and near 1e-30: the same
    neighbours and distances as the cloud at unit scale, scaled."""
    g = torch.Generator().manual_seed(3)
    r = torch.randn(400, 3, generator=g, dtype=torch.float64)
    q = torch.randn(60, 3, generator=g, dtype=torch.float64)
    f = torch.randn(400, 2, generator=g, dtype=torch.float64)
    d0, i0, _ = wb.ops.knn(q, r, 5)
    out0 = wb.ops.radius_aggregate(q, r, f, 0.5, 0.3)
    for scale in (1e30, 1e-30):
        s = torch.tensor(scale, dtype=torch.float64)
        qs, rs = (q * s).to(dtype), (r * s).to(dtype)
        d, i, _ = wb.ops.knn(qs, rs, 5)
        assert torch.equal(i, i0)
        torch.testing.assert_close(d.double() / s, d0, rtol=1e-5, atol=0)
        out = wb.ops.radius_aggregate(qs, rs, f.to(dtype), 0.5 * scale, 0.3 * scale)
        torch.testing.assert_close(out.double(), out0, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("by_sort", [False, True], ids=["quickselect", "sort"])
@pytest.mark.parametrize("name", ["gaussian", "20 tight clusters", "points along a line", "duplicated points"])
def test_tree_is_a_median_split_by_planes(name, by_sort):
    """The tree both builds make (the search is exact on any partition, so this checks what the
    value tests cannot: that the build splits): the points are a permutation of the input,
    every internal node's two children are separated by a plane along one axis, and both
    halves have the sizes the implicit layout gives."""
    import warp as wp

    from warpbridge.ops import _tree

    r, _ = D.make(name, 3000)
    k = _tree.kernels_for("float32", wp.get_device("cpu"))
    points = wp.from_numpy(r, dtype=wp.vec3)
    tree = _tree.tree(k, points)  # the arrays; built again, the asked way:
    _tree.build_tree(k, points, tree, wp.get_device("cpu"), None, by_sort=by_sort)
    order, pts, lo, hi, _ = (a.numpy() for a in tree)
    assert sorted(order.tolist()) == list(range(len(r)))
    assert (pts == r[order]).all()
    leaves = len(lo) // 2
    for node in range(1, leaves):
        a, b = 2 * node, 2 * node + 1
        assert (hi[a] <= lo[b]).any() or (hi[b] <= lo[a]).any(), f"node {node}: children overlap on every axis"
    starts = [len(r) * leaf // leaves for leaf in range(leaves + 1)]
    for leaf in range(leaves):  # each leaf's box holds exactly its own points
        p = pts[starts[leaf] : starts[leaf + 1]]
        assert (lo[leaves + leaf] == p.min(0)).all() and (hi[leaves + leaf] == p.max(0)).all()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", ["uniform", "20 tight clusters", "points along a line", "duplicated points"])
def test_a_packed_build_makes_the_same_tree(name, dtype, monkeypatch):
    """The CPU build splits subtrees that fit a thread's scratch as records of point and index,
    with a native partition (``partition_items``), and the levels above in place: the same
    steps, so the same tree bit for bit, whatever the room and the thread count."""
    import numpy as np
    import warp as wp

    from warpbridge.ops import _cpu_launch as cpu_launch
    from warpbridge.ops import _tree

    r, _ = D.make(name, 3000)
    k = _tree.kernels_for(dtype, wp.get_device("cpu"))
    points = wp.from_numpy(r.astype(dtype), dtype=k.V)
    trees = {}
    for threads in (1, 2):
        # 0: every level in place; 50: in place down to the nodes of at most 50 points
        for room in (0, 50, _tree.ITEMS_ROOM):
            monkeypatch.setattr(_tree, "ITEMS_ROOM", room)
            monkeypatch.setattr(cpu_launch, "num_threads", threads)
            trees[threads, room] = [a.numpy().copy() for a in _tree.tree(k, points)]
    first = trees[1, 0]
    assert sorted(first[0].tolist()) == list(range(len(r)))
    for key, tree in trees.items():
        assert all(np.array_equal(a, b) for a, b in zip(first, tree)), key


def _morton_keys(q, sorted_points, root, bits, sample):
    """Morton codes as ``query_box`` and ``query_keys`` define them, computed here with NumPy
    in float32. The box: from ``sample`` of the tree's points, evenly spread over its order,
    per axis the third smallest and third largest of the finite ones (the root box when
    fewer than sample / 4 are finite). Each coordinate's cell among 2**bits across it,
    clamped; a query that is not finite gets the largest code."""
    import numpy as np

    n = len(sorted_points)
    picked = sorted_points[[(2 * j + 1) * n // (2 * sample) for j in range(sample)]]
    picked = picked[np.isfinite(picked).all(1)]
    if len(picked) >= sample // 4:
        ordered = np.sort(picked, 0)
        lo, hi = ordered[2], ordered[-3]
    else:
        lo, hi = root
    cells = np.zeros(q.shape, dtype=np.int64)
    for a in range(3):
        ext = np.float32(hi[a] - lo[a])
        if 0 < ext < np.inf:
            with np.errstate(invalid="ignore", over="ignore"):
                x = (q[:, a] - lo[a]) / ext * np.float32(1 << bits)
            cells[:, a] = np.clip(np.nan_to_num(x, nan=0.0), 0, (1 << bits) - 1).astype(np.int64)
    key = np.zeros(len(q), dtype=np.int64)
    for b in range(bits):
        for a in range(3):
            key |= ((cells[:, a] >> b) & 1) << (3 * b + a)
    key[~np.isfinite(q).all(1)] = (1 << (3 * bits)) - 1
    return key


def assert_morton_order(q, tree, perm):
    """``perm`` (what ``query_order`` wrote) takes every query of ``q`` once, in the order of
    their Morton codes over ``tree``'s trimmed box, equal codes in their given order. Returns
    the codes in that order."""
    import numpy as np

    from warpbridge.ops.kdtree import morton as _kernels

    assert sorted(perm.tolist()) == list(range(len(q)))
    root = (tree[2].numpy()[1], tree[3].numpy()[1])
    key = _morton_keys(q, tree[1].numpy(), root, _kernels.MORTON_BITS, _kernels.MORTON_SAMPLE)[perm]
    assert (np.diff(key) >= 0).all(), "codes out of order"
    assert ((np.diff(key) > 0) | (np.diff(perm) > 0)).all(), "equal codes out of their given order"
    return key


@pytest.mark.parametrize("name", ["uniform", "lidar rings + 20 far", "one far outlier", "duplicated points"])
def test_queries_go_in_morton_order(name, monkeypatch):
    """The order the searches take the queries in, which the value tests cannot see (any order
    gives the same results): every query exactly once, by Morton code over the reference
    points' box trimmed of its extremes, equal codes in the given order, queries that are not
    finite last; below QUERY_ORDER_MIN queries, -1 everywhere (the given order)."""
    import numpy as np
    import warp as wp

    from warpbridge.ops import _tree
    from warpbridge.ops.kdtree import morton as _kernels

    r, q = D.make(name, 3000)
    q[::97] = np.nan
    q[5::97] = (np.inf, 0.0, 0.0)
    k = _tree.kernels_for("float32", wp.get_device("cpu"))
    cpu = wp.get_device("cpu")
    refs = wp.from_numpy(r, dtype=wp.vec3)
    tree = _tree.tree(k, refs)
    queries = wp.empty(len(q), dtype=wp.int32)
    monkeypatch.setattr(_tree, "QUERY_ORDER_MIN", len(q))
    _tree.query_order(k, wp.from_numpy(q, dtype=wp.vec3), tree, queries, cpu, None, refs)
    perm = queries.numpy()
    key = assert_morton_order(q, tree, perm)
    last = (1 << (3 * _kernels.MORTON_BITS)) - 1  # shared only with the box's far corner
    place = np.empty(len(q), dtype=np.int64)
    place[perm] = np.arange(len(q))
    assert (place[~np.isfinite(q).all(1)] >= (key < last).sum()).all(), "a query that is not finite is not last"
    # the outliers do not stretch the cells: the queries spread over many of them
    assert len(np.unique(key)) > (30 if name == "duplicated points" else 200), "too few cells: no order to speak of"
    monkeypatch.setattr(_tree, "QUERY_ORDER_MIN", len(q) + 1)
    _tree.query_order(k, wp.from_numpy(q, dtype=wp.vec3), tree, queries, cpu, None, refs)
    assert (queries.numpy() == -1).all()


@pytest.mark.parametrize(
    "name, backward",
    [("gaussian", "one pass"), ("lidar rings + 20 far", "one pass"), ("duplicated points", "one pass")]
    + [("gaussian", "two searches")],
)
def test_a_self_join_goes_in_tree_order_and_changes_no_result(name, backward, monkeypatch):
    """Queries that are the reference points themselves (the same tensor, as in self-kNN) are
    taken in the tree's own order, and so are the references of the radius backward's second
    search (CUDA's path). They give what a copy of the points gives, which goes in another
    order: the same neighbours and outputs bit for bit, exact against the dense reference, and
    the same gradients up to the order of the sums."""
    import numpy as np

    from warpbridge.ops import _launches, _tree

    if backward == "two searches":
        monkeypatch.setattr(_launches, "one_pass_fits", lambda *a: False)
        monkeypatch.setattr(_launches, "PAIRS_PER_POINT", -(10**9))

    took_tree_order = []
    real_order = _tree.query_order

    def spy(k, points, tree, order, *rest):
        real_order(k, points, tree, order, *rest)
        took_tree_order.append(bool(np.array_equal(order.numpy(), tree[0].numpy())))

    monkeypatch.setattr(_tree, "query_order", spy)
    r, _ = cloud(name, 1200)
    f = torch.randn(len(r), 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    radius = float(torch.kthvalue(torch.cdist(r, r), 60, dim=1).values.median())  # > 0 on 50 copies
    results = []
    for same in (True, False):
        took_tree_order.clear()
        p, fg = r.clone().requires_grad_(), f.clone().requires_grad_()
        q = p if same else p.clone()
        d, i, _ = wb.ops.knn(q, p, 6)
        out = wb.ops.radius_aggregate(q, p, fg, radius, radius / 2)
        agg = wb.ops.knn_aggregate(q, p, fg, 6, radius / 2)
        (d.sum() + (out * out).sum() + (agg * agg).sum()).backward()
        # the three forwards, then the radius backward's second search
        assert took_tree_order == [same] * (3 if backward == "one pass" else 4)
        results.append(([d, i, out, agg], [p.grad, fg.grad]))
    (own, own_grads), (copy, copy_grads) = results
    for a, b in zip(own, copy):
        assert torch.equal(a, b)
    assert torch.equal(own[1], dense_knn(r, r, 6))
    for a, b in zip(own_grads, copy_grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_the_query_order_changes_no_result(monkeypatch):
    """The same neighbours, distances and outputs bit for bit in Morton order as in the given
    order, and the same gradients up to the order of the sums."""
    from warpbridge.ops import _tree

    r, q = cloud("gaussian", 5000)
    f = torch.randn(len(r), 5, dtype=torch.float64)
    results = []
    for minimum in (len(q) + 1, len(q)):  # the given order, then Morton order
        monkeypatch.setattr(_tree, "QUERY_ORDER_MIN", minimum)
        qg, rg, fg = (x.clone().requires_grad_() for x in (q, r, f))
        d, i, _ = wb.ops.knn(qg, rg, 6)
        out = wb.ops.radius_aggregate(qg, rg, fg, 0.3, 0.2)
        agg = wb.ops.knn_aggregate(qg, rg, fg, 6, 0.2)
        (d.sum() + (out * out).sum() + (agg * agg).sum()).backward()
        results.append(([d, i, out, agg], [qg.grad, rg.grad, fg.grad]))
    (given, given_grads), (morton, morton_grads) = results
    for a, b in zip(given, morton):
        assert torch.equal(a, b)
    for a, b in zip(given_grads, morton_grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def _gradients(q, r, f, scale, dtype):
    """d/dq, d/dr and d/df of each op's sum(out * w) for the cloud scaled by ``scale``."""
    s = torch.tensor(scale, dtype=torch.float64)
    qs, rs = ((q * s).to(dtype).requires_grad_(), (r * s).to(dtype).requires_grad_())
    fs = f.to(dtype).requires_grad_()
    found = {}
    for name, fn in {
        "radius_aggregate": lambda: wb.ops.radius_aggregate(
            qs, rs, fs, 50 * scale, 0.3 * scale
        ),  # no pair near the cut
        "knn_aggregate": lambda: wb.ops.knn_aggregate(qs, rs, fs, 5, 0.3 * scale),
        "knn": lambda: wb.ops.knn(qs, rs, 5)[0],
        "radius": lambda: wb.ops.radius(qs, rs, 50 * scale).distance,
    }.items():
        out = fn()
        w = torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype).reshape(out.shape)
        found[name] = [t.double() for t in torch.autograd.grad((out * w).sum(), (qs, rs, fs), allow_unused=True)
                       if t is not None]  # fmt: skip
    return found


@pytest.mark.parametrize(
    ("dtype", "scale"),
    [(torch.float32, 1e-20), (torch.float32, 1e-37), (torch.float64, 1e-155), (torch.float64, 1e-300),
     (torch.bfloat16, 1e-30)],
)  # fmt: skip
def test_gradients_at_tiny_scales_are_the_unit_scale_ones_scaled(dtype, scale):
    """Points and sigma scaled together: an aggregation's gradient w.r.t. the points is the
    unit-scale one divided by the scale, a distance's is the same unit vectors; both finite
    wherever that fits the dtype (1 / (sigma d) overflowed from 1e-20 in float32)."""
    g = torch.Generator().manual_seed(5)
    r = torch.randn(200, 3, generator=g, dtype=torch.float64)
    q = torch.randn(40, 3, generator=g, dtype=torch.float64)
    f = torch.randn(200, 2, generator=g, dtype=torch.float64)
    unit, tiny = _gradients(q, r, f, 1.0, torch.float64), _gradients(q, r, f, scale, dtype)
    tol = {torch.float64: 1e-6, torch.float32: 2e-3, torch.bfloat16: 5e-2}[dtype]
    for name, grads in tiny.items():
        for k, (a, b) in enumerate(zip(grads, unit[name])):
            assert torch.isfinite(a).all(), (name, k)
            points = k < 2 and name.endswith("aggregate")
            expect = b / scale if points else b
            err = float((a - expect).abs().max() / expect.abs().max())
            assert err < tol, (name, k, err)


@pytest.mark.parametrize(("dtype", "scale"), [(torch.float32, 1e-40), (torch.float64, 1e-310)])
def test_distance_gradients_of_subnormal_points_are_unit_vectors(dtype, scale):
    g = torch.Generator().manual_seed(6)
    r = (torch.rand(50, 3, generator=g, dtype=torch.float64) * scale).to(dtype)
    q = (torch.rand(10, 3, generator=g, dtype=torch.float64) * scale).to(dtype).requires_grad_()
    d, _, _ = wb.ops.knn(q, r, 1)
    (grad,) = torch.autograd.grad(d.sum(), q)
    assert torch.isfinite(grad).all()
    lengths = grad.double().norm(dim=1)
    assert ((lengths - 1).abs() < 0.2).all(), lengths  # a unit vector, within subnormal rounding
