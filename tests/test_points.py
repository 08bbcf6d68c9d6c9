"""warpbridge.ops: values and gradients against dense float64 references, numerics, threads,
determinism, autograd invariants, torch.compile and bad input."""

import math
import os
import subprocess
import sys

import numpy as np
import points_reference as ref_ops
import pytest
import torch
import warp as wp

import warpbridge as wb
from warpbridge import WarpBridgeError
from warpbridge.ops import _cpu_launch as cpu_launch
from warpbridge.ops import _cpu_pool as cpu_pool
from warpbridge.ops import _cpu_team as cpu_team
from warpbridge.ops import _tree

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: dict(atol=2e-5, rtol=1e-4), torch.float64: dict(atol=1e-11, rtol=1e-9)}


def clouds(m, n, f, dtype=torch.float64, seed=0, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.rand(m, 3, generator=g, dtype=dtype) * 2 - 1) * spread
    r = torch.randn(n, 3, generator=g, dtype=dtype) * spread
    feats = torch.randn(n, f, generator=g, dtype=dtype)
    return q, r, feats


def away_from_cutoff(q, r, radius, margin=0.02):
    """Drop queries with a reference within `margin` of the radius: the cut-off is a jump
    that finite differences would straddle."""
    d = torch.cdist(q, r)
    keep = ~((d - radius).abs() < margin).any(1)
    return q[keep].contiguous()


def separated_knn(q, r, k, margin=1e-3):
    """Drop queries whose k-th and (k+1)-th neighbours are nearly tied (the selection would flip)."""
    d = torch.sort(torch.cdist(q, r), dim=1).values
    keep = (d[:, k] - d[:, k - 1]) > margin
    return q[keep].contiguous()


def grads(out, inputs, g):
    return torch.autograd.grad(out, inputs, g, allow_unused=True)


# -- values -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("radius,sigma", [(0.3, 0.1), (0.6, 1.0), (2.5, 0.05)])
def test_radius_values(dtype, radius, sigma):
    q, r, f = clouds(300, 500, 5, dtype)
    out = wb.ops.radius_aggregate(q, r, f, radius, sigma)
    assert out.dtype == dtype and out.shape == (300, 5)
    # The reference runs in float64 on the same (float32-rounded) inputs: torch's float32
    # cdist can put a point within ~1e-6 of the radius on either side, and which side varies
    # with the memory alignment of its inputs (seen in about 1 process in 4).
    expect = ref_ops.radius_aggregate(q.double(), r.double(), f.double(), radius, sigma).to(dtype)
    torch.testing.assert_close(out, expect, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [1, 7, 40])
def test_knn_values_and_order(dtype, k, tree_build):
    q, r, _ = clouds(300, 500, 1, dtype, seed=1)
    dist, idx, _ = wb.ops.knn(q, r, k)
    assert idx.dtype == torch.int64 and dist.shape == idx.shape == (300, k)
    rd, ri = ref_ops.knn(q, r, k)
    assert torch.equal(idx, ri)
    torch.testing.assert_close(dist, rd, **TOL[dtype])
    assert (dist[:, 1:] >= dist[:, :-1]).all()


def test_knn_ties_take_the_smaller_index(tree_build):
    # Duplicated reference points: equal distances, so the index decides.
    base = torch.randn(50, 3, dtype=torch.float64)
    r = torch.cat([base, base, base])  # j, j + 50, j + 100 coincide
    q = torch.randn(40, 3, dtype=torch.float64)
    dist, idx, _ = wb.ops.knn(q, r, 6)
    _, ri = ref_ops.knn(q, r, 6)
    assert torch.equal(idx, ri)
    assert (idx[:, 0] < 50).all() and (idx[:, 1] == idx[:, 0] + 50).all() and (idx[:, 2] == idx[:, 0] + 100).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "nf, k",
    [(6, 7), (8, 7), (8, 16), (8, 20)],  # rows by value / as groups of 4; weights local up to k = 16
)
def test_knn_aggregate_values(dtype, nf, k, tree_build):
    q, r, f = clouds(300, 500, nf, dtype, seed=2)
    out = wb.ops.knn_aggregate(q, r, f, k, 0.1)
    torch.testing.assert_close(out, ref_ops.knn_aggregate(q, r, f, k, 0.1), **TOL[dtype])


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: torch.randn(400, 3, dtype=torch.float64) * torch.tensor([5.0, 0.0, 0.0]), id="line"),
        pytest.param(lambda: torch.randn(400, 3, dtype=torch.float64) * torch.tensor([3.0, 3.0, 1e-9]), id="flat"),
        pytest.param(lambda: torch.zeros(30, 3, dtype=torch.float64), id="one-point"),
        pytest.param(lambda: torch.randn(400, 3, dtype=torch.float64) * 1e4, id="huge-extent"),
        pytest.param(lambda: torch.randn(400, 3, dtype=torch.float64) * 1e-6, id="tiny-extent"),
    ],
)
def test_degenerate_clouds(make, tree_build):
    r = make()
    n = r.shape[0]
    f = torch.randn(n, 3, dtype=torch.float64)
    m = min(50, n)
    q = r[torch.randperm(n)[:m]] + 1e-3 * torch.randn(m, 3, dtype=torch.float64) * r.abs().max().clamp(min=1e-6)
    scale = float(r.abs().max().clamp(min=1e-6))
    radius = 0.3 * scale
    torch.testing.assert_close(
        wb.ops.radius_aggregate(q, r, f, radius, 0.1 * scale),
        ref_ops.radius_aggregate(q, r, f, radius, 0.1 * scale),
    )
    k = min(9, n)
    dist, idx, _ = wb.ops.knn(q, r, k)
    rd, ri = ref_ops.knn(q, r, k)
    torch.testing.assert_close(dist, rd)
    # Exact ties may order differently only if distances differ in the last bit; compare sets of distance.
    torch.testing.assert_close(torch.gather(torch.cdist(q, r), 1, idx), rd)


def test_queries_far_outside_the_cloud():
    q, r, f = clouds(40, 300, 2)
    q = q + torch.tensor([50.0, -80.0, 3.0], dtype=q.dtype)
    torch.testing.assert_close(wb.ops.knn(q, r, 5)[0], ref_ops.knn(q, r, 5)[0])
    assert torch.equal(wb.ops.radius_aggregate(q, r, f, 1.0, 0.1), torch.zeros(40, 2, dtype=q.dtype))


def test_stable_for_large_distance_over_sigma():
    # d/sigma ~ 1000: exp underflows in float32 (the dense unshifted formula gives 0/0 = NaN).
    q, r, f = clouds(200, 400, 4, torch.float32, seed=3)
    radius, sigma = 0.5, 5e-4
    out = wb.ops.radius_aggregate(q, r, f, radius, sigma)
    assert torch.isfinite(out).all()
    d = torch.cdist(q, r)
    naive_w = torch.where(d <= radius, torch.exp(-d / sigma), torch.zeros_like(d))
    naive = (naive_w @ f) / naive_w.sum(1, keepdim=True)
    has = (d <= radius).any(1)
    assert torch.isnan(naive[has]).any()  # the failure mode this guards against
    expect = ref_ops.radius_aggregate(q.double(), r.double(), f.double(), radius, sigma).float()
    torch.testing.assert_close(out, expect, atol=1e-4, rtol=1e-4)
    out2 = wb.ops.knn_aggregate(q, r, f, 5, sigma)
    expect2 = ref_ops.knn_aggregate(q.double(), r.double(), f.double(), 5, sigma).float()
    torch.testing.assert_close(out2, expect2, atol=1e-4, rtol=1e-3)  # float32 distances / sigma


def test_rows_without_neighbours_are_zero():
    q, r, f = clouds(100, 50, 3, seed=4)
    out = wb.ops.radius_aggregate(q, r, f, 0.05, 0.1)
    lonely = ~(torch.cdist(q, r) <= 0.05).any(1)
    assert lonely.sum() > 50
    assert torch.equal(out[lonely], torch.zeros_like(out[lonely]))


# -- gradients --------------------------------------------------------------------------


def test_radius_gradcheck_all_inputs():
    q, r, f = clouds(60, 80, 3, seed=5)
    radius = 0.5
    q = away_from_cutoff(q, r, radius)
    inputs = [t.clone().requires_grad_() for t in (q, r, f)]
    assert torch.autograd.gradcheck(lambda a, b, c: wb.ops.radius_aggregate(a, b, c, radius, 0.2), inputs)


def test_knn_gradcheck_both_point_sets():
    q, r, _ = clouds(60, 80, 1, seed=6)
    q = separated_knn(q, r, 5)
    inputs = [t.clone().requires_grad_() for t in (q, r)]
    assert torch.autograd.gradcheck(lambda a, b: wb.ops.knn(a, b, 5)[0], inputs)


def test_knn_aggregate_gradcheck_all_inputs():
    q, r, f = clouds(60, 80, 3, seed=7)
    q = separated_knn(q, r, 5)
    inputs = [t.clone().requires_grad_() for t in (q, r, f)]
    assert torch.autograd.gradcheck(lambda a, b, c: wb.ops.knn_aggregate(a, b, c, 5, 0.2), inputs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["radius", "knn_aggregate", "knn"])
def test_gradients_match_dense_autograd(dtype, op):
    q, r, f = clouds(700, 900, 8, dtype, seed=8)
    if op == "radius":
        q = away_from_cutoff(q, r, 0.35)
        ours = lambda a, b, c: wb.ops.radius_aggregate(a, b, c, 0.35, 0.1)
        dense = lambda a, b, c: ref_ops.radius_aggregate(a, b, c, 0.35, 0.1)
    elif op == "knn_aggregate":
        q = separated_knn(q, r, 7)
        ours = lambda a, b, c: wb.ops.knn_aggregate(a, b, c, 7, 0.1)
        dense = lambda a, b, c: ref_ops.knn_aggregate(a, b, c, 7, 0.1)
    else:
        q = separated_knn(q, r, 7)
        ours = lambda a, b, c: wb.ops.knn(a, b, 7)[0] + 0 * c.sum()
        dense = lambda a, b, c: ref_ops.knn(a, b, 7)[0] + 0 * c.sum()
    ins = [t.clone().requires_grad_() for t in (q, r, f)]
    out = ours(*ins)
    g = torch.randn_like(out)
    got = grads(out, ins, g)
    expect = grads(dense(*ins), ins, g)
    tol = dict(atol=1e-3, rtol=1e-3) if dtype == torch.float32 else dict(atol=1e-9, rtol=1e-7)
    for a, b in zip(got, expect):
        torch.testing.assert_close(a, b, **tol)


def test_coincident_query_and_reference_give_finite_gradients():
    q, r, f = clouds(30, 60, 3, seed=9)
    q[:10] = r[:10]  # exact coincidences
    for fn in (
        lambda a, b, c: wb.ops.radius_aggregate(a, b, c, 0.6, 0.2),
        lambda a, b, c: wb.ops.knn_aggregate(a, b, c, 4, 0.2),
        lambda a, b, c: wb.ops.knn(a, b, 4)[0] + 0 * c.sum(),
    ):
        ins = [t.clone().requires_grad_() for t in (q, r, f)]
        for gr in torch.autograd.grad(fn(*ins).sum(), ins):
            assert torch.isfinite(gr).all()


def test_only_requested_gradients_are_computed():
    q, r, f = clouds(80, 100, 3, seed=10)
    f.requires_grad_()
    out = wb.ops.radius_aggregate(q, r, f, 0.5, 0.1)
    (gf,) = torch.autograd.grad(out.sum(), [f])
    (expect,) = torch.autograd.grad(ref_ops.radius_aggregate(q, r, f, 0.5, 0.1).sum(), [f])
    torch.testing.assert_close(gf, expect)
    assert q.grad is None and r.grad is None


def test_retained_graph_accumulates_exactly_once_per_backward():
    q, r, f = clouds(80, 100, 3, seed=11)
    ins = [t.clone().requires_grad_() for t in (q, r, f)]
    out = wb.ops.radius_aggregate(*ins, 0.5, 0.1)
    loss = (out**2).sum()
    loss.backward(retain_graph=True)
    once = [t.grad.clone() for t in ins]
    loss.backward(retain_graph=True)
    loss.backward()
    for t, g1 in zip(ins, once):
        torch.testing.assert_close(t.grad, 3 * g1)


def test_inputs_are_never_modified_and_no_grad_is_allocated_in_forward():
    q, r, f = clouds(80, 100, 3, seed=12)
    ins = [t.clone().requires_grad_() for t in (q, r, f)]
    before = [t.detach().clone() for t in ins]
    out = wb.ops.radius_aggregate(*ins, 0.5, 0.1) + wb.ops.knn_aggregate(*ins, 5, 0.1)
    assert all(t.grad is None for t in ins)
    g = torch.randn_like(out)
    g_copy = g.clone()
    out.backward(g)
    assert torch.equal(g, g_copy)
    for t, b in zip(ins, before):
        assert torch.equal(t.detach(), b)


def test_in_place_change_after_forward_is_caught():
    q, r, f = clouds(20, 30, 2, seed=13)
    f.requires_grad_()
    ref_pts = r.clone()
    out = wb.ops.radius_aggregate(q, ref_pts, f, 0.8, 0.1)
    ref_pts.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_tree_is_built_once_per_forward_and_reused_by_backward(monkeypatch):
    calls = []
    real = _tree.build_tree
    monkeypatch.setattr(_tree, "build_tree", lambda *a, **k: calls.append(a[1].shape[0]) or real(*a, **k))
    q, r, f = clouds(50, 70, 2, seed=14)
    r.requires_grad_()
    out = wb.ops.knn_aggregate(q, r, f, 3, 0.1)
    assert calls == [70]
    out.sum().backward()
    assert calls == [70]  # kNN backward needs no search at all
    calls.clear()
    f.requires_grad_()
    out = wb.ops.radius_aggregate(q, r, f, 0.5, 0.1)
    assert calls == [70]
    out.sum().backward()
    # The reference grid is reused; on the CPU the reference side gathers over the pairs the
    # query pass recorded, so no other grid is built either.
    assert calls == [70]


PATHS = [
    "one pass",
    "one pass, searching again",
    "one pass, two threads",
    "pair list",
    "two searches",
    "two searches, trees by sort",  # CUDA's whole path at many queries, run on the CPU
]


@pytest.mark.parametrize("nf", [3, 4], ids=["F=3", "F=4"])
@pytest.mark.parametrize("path", PATHS)
def test_radius_backward_paths_agree(path, nf, monkeypatch):
    """Every backward path gives the same gradients, checked in float64 against the dense
    formula: the CPU's one pass (each thread adding into its own copy of the reference-side
    gradients) over the neighbours the forward listed, or searching again for a query with
    more than it lists; the pair list (CPU, when those copies would not fit); and the two
    searches (CUDA, or more pairs than the budget), with CUDA's trees too. With F = 4 the
    feature terms go 4 at a time, with F = 3 one by one."""
    from warpbridge.ops import _launches, _tree

    grids, passes = [], []
    real_tree, real_launch = _tree.build_tree, cpu_launch.launch_queries
    by_sort = {"by_sort": True} if path.endswith("by sort") else {}
    sorted_levels = []
    real_sort = _tree._split_by_sort
    monkeypatch.setattr(_tree, "_split_by_sort", lambda *a: sorted_levels.append(a[3]) or real_sort(*a))
    monkeypatch.setattr(
        _tree, "build_tree", lambda *a, **k: grids.append(a[1].shape[0]) or real_tree(*a, **k, **by_sort)
    )
    monkeypatch.setattr(
        cpu_launch, "launch_queries", lambda kernel, *a, **k: passes.append(kernel.key) or real_launch(kernel, *a, **k)
    )
    if path == "one pass, two threads":
        monkeypatch.setattr(cpu_launch, "MIN_QUERIES_PER_SLOT", 8)
        monkeypatch.setattr(cpu_launch, "num_threads", 2)
    if path.startswith(("pair list", "two searches")):
        monkeypatch.setattr(_launches, "one_pass_fits", lambda *a: False)
    if path.startswith("two searches"):
        monkeypatch.setattr(_launches, "PAIRS_PER_POINT", -(10**9))
    ordered = []
    if by_sort:  # and both sides in Morton order, as for many points
        monkeypatch.setattr(_tree, "QUERY_ORDER_MIN", 0)
        real_order = _tree.query_order
        monkeypatch.setattr(_tree, "query_order", lambda *a: ordered.append(a[1].shape[0]) or real_order(*a))
    if path == "one pass, searching again":  # every reference point within the radius of every query
        q, r, f = clouds(30, 2 * _launches.LISTED, nf, seed=21)
        radius = 100.0
        assert torch.cdist(q, r).max() < radius
    else:
        q, r, f = clouds(60, 80, nf, seed=21)
        radius = 0.5
        q = away_from_cutoff(q, r, radius)
    ins = [t.clone().requires_grad_() for t in (q, r, f)]
    assert torch.autograd.gradcheck(lambda a, b, c: wb.ops.radius_aggregate(a, b, c, radius, 0.2), ins)
    assert (len(q) in grids) == path.startswith("two searches")  # the query tree of the second search
    reference_passes = {key.split("__")[-1] for key in passes if "radius_backward_ref" in key}
    expected = {"pair list": {"radius_backward_ref_pairs"}, "two searches": {"radius_backward_ref"}}
    assert reference_passes == expected.get(path.split(",")[0], set())
    assert bool(sorted_levels) == bool(by_sort) and all(
        sorted_levels
    )  # both trees, when by sort  # one pass: the query pass alone
    # Morton order: the queries in every forward, the references in every second search
    assert set(ordered) == ({len(q), len(r)} if by_sort else set())
    if path == "one pass, two threads":
        assert cpu_launch.slots(wp.get_device("cpu"), len(q)) == 2  # two copies, added after


# -- threads, determinism, non-finite input -----------------------------------------------


@pytest.mark.parametrize("nf", [4, 5], ids=["F=4", "F=5"])  # feature terms 4 at a time, one by one
def test_threads_agree_and_results_are_deterministic(nf):
    q, r, f = clouds(3000, 2000, nf, torch.float32, seed=15)
    ins = [t.clone().requires_grad_() for t in (q, r, f)]
    results = {}
    try:
        for n in (1, 2, 2):
            wb.ops.set_num_threads(n)
            outs = []
            for fn in (
                lambda: wb.ops.radius_aggregate(*ins, 0.3, 0.1),
                lambda: wb.ops.knn_aggregate(*ins, 6, 0.1),
            ):
                out = fn()
                outs.append((out.detach(), *torch.autograd.grad(out.square().sum(), ins)))
            results.setdefault(n, []).append(outs)
    finally:
        wb.ops.set_num_threads(None)
    one, (two_a, two_b) = results[1][0], results[2]
    for xs, ys, zs in zip(one, two_a, two_b):
        for x, y, z in zip(xs, ys, zs):
            assert torch.equal(y, z)  # bitwise deterministic run to run
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("env,want", [("3", 3), ("0", None), ("two", None), ("", None)])
def test_the_thread_count_comes_from_the_environment_at_import(env, want):
    """WARPBRIDGE_NUM_THREADS, read when warpbridge is imported: a positive int is the default
    (set_num_threads overrides it, None restores it); anything else leaves os.cpu_count()."""
    code = (
        "import os, warpbridge as wb; n = wb.ops.get_num_threads(); wb.ops.set_num_threads(5); m = wb.ops.get_num_threads();"
        " wb.ops.set_num_threads(None); print(n, m, wb.ops.get_num_threads(), os.cpu_count())"
    )
    env_vars = dict(os.environ, WARPBRIDGE_NUM_THREADS=env)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env_vars)
    n, m, back, cpus = map(int, out.stdout.split()[-4:])
    assert (n, m, back) == (want or cpus, 5, want or cpus), out.stderr[-2000:]


def _two_thread_results(ins):
    wb.ops.set_num_threads(2)
    try:
        outs = []
        for fn in (lambda: wb.ops.radius_aggregate(*ins, 0.3, 0.1), lambda: wb.ops.knn_aggregate(*ins, 6, 0.1)):
            out = fn()
            outs += [out.detach(), *torch.autograd.grad(out.square().sum(), ins)]
        return outs
    finally:
        wb.ops.set_num_threads(None)


def _counting_team_jobs(monkeypatch, timed: bool = False) -> list:
    """Count the launches that went to PyTorch's OpenMP team (each makes one TeamJob), every
    kernel's launches on the team (none runs on one thread for having found a thread late
    before: the machine running the tests may be busy); with ``timed``, as the launches' own
    timing decides, from a clean slate."""
    jobs: list = []

    class Counted(cpu_team.TeamJob):
        def __init__(self, *a):
            super().__init__(*a)
            jobs.append(self)

    monkeypatch.setattr(cpu_team, "TeamJob", Counted)
    if not timed:
        monkeypatch.setattr(cpu_launch._Run, "solo", lambda run: False)
    for direct in cpu_launch._RECORDED.values():
        monkeypatch.setattr(direct, "solo_until", 0.0)
    return jobs


def test_openmp_workers_and_own_pool_give_the_same_bits(monkeypatch):
    """With PyTorch's GNU OpenMP loaded, the op's CPU threads are PyTorch's own workers (no
    contention with their spinning), driven by a native loop; without it, a pool of our own.
    Same results, bitwise."""
    assert cpu_team.gomp() is not None  # the Linux CPU build of torch ships libgomp
    jobs = _counting_team_jobs(monkeypatch)
    q, r, f = clouds(3000, 2000, 4, torch.float32, seed=15)
    ins = [t.clone().requires_grad_() for t in (q, r, f)]
    with_omp = _two_thread_results(ins)
    assert len(jobs) >= 6  # the build, the searches and the backwards, scatters included
    assert {job.chunk for job in jobs} >= {0} and any(job.chunk > 0 for job in jobs)  # slots and chunks
    monkeypatch.setattr(cpu_team, "TEAMS", {})
    jobs.clear()
    own_pool = _two_thread_results(ins)
    assert not jobs
    for a, b in zip(with_omp, own_pool):
        assert torch.equal(a, b)


@pytest.mark.parametrize("openmp", [True, False], ids=["OpenMP team", "own pool"])
@pytest.mark.parametrize("scatter", [False, True], ids=["chunks", "slots"])
@pytest.mark.parametrize("m, n_slots", [(1, 2), (2, 5), (7, 3), (1000, 2), (1001, 5)])
def test_a_parallel_launch_runs_every_query_once(m, n_slots, scatter, openmp, monkeypatch):
    """launch_queries on several CPU threads: every query runs exactly once; a scatter runs
    query i in slot i % slots (offset), whichever thread takes the slot; chunks of one query
    up to more queries than threads."""
    import kernels

    cpu = wp.get_device("cpu")
    _tree.kernels_for("float32", cpu)  # loads the team launch too
    jobs = _counting_team_jobs(monkeypatch)
    monkeypatch.setattr(cpu_launch, "CHUNK_MIN", 1)
    if not openmp:
        monkeypatch.setattr(cpu_team, "TEAMS", {})
    hits, offsets = wp.zeros(m, dtype=wp.int32, device=cpu), wp.full(m, -1, dtype=wp.int32, device=cpu)
    cpu_launch.launch_queries(kernels.visit, m, n_slots, [], [hits, offsets], cpu, None, scatter=scatter)
    assert len(jobs) == int(openmp)
    assert (hits.numpy() == 1).all()
    starts = offsets.numpy()
    if scatter:
        assert (starts == np.arange(m) % n_slots).all()
    else:  # contiguous chunks of about m / (threads * CHUNKS_PER_THREAD), each from its offset
        chunk = -(-m // (n_slots * cpu_launch.CHUNKS_PER_THREAD))
        assert (starts == np.arange(m) // chunk * chunk).all()


class _Clock:
    """time for _cpu_launch: perf_counter in seconds as set, and perf_counter_ns advancing a
    second a call (every team launch looks far slower than its work on one thread)."""

    def __init__(self):
        self.now, self.ns = 100.0, 0

    def perf_counter(self) -> float:
        return self.now

    def perf_counter_ns(self) -> int:
        self.ns += 10**9
        return self.ns


@pytest.mark.parametrize("scatter", [False, True], ids=["chunks", "slots"])
def test_a_kernel_that_waited_for_a_late_thread_runs_alone_for_a_while(scatter, monkeypatch):
    """A team launch that takes longer than its work would on one thread (a thread came late:
    its core was busy) sends that kernel's next launches to the calling thread, in turn (a
    scatter's slots one after the other: the same sums), for SOLO_SECONDS; then the team again."""
    import types

    import kernels

    cpu = wp.get_device("cpu")
    _tree.kernels_for("float32", cpu)
    clock = _Clock()
    monkeypatch.setattr(
        cpu_launch,
        "time",
        types.SimpleNamespace(perf_counter=clock.perf_counter, perf_counter_ns=clock.perf_counter_ns),
    )
    jobs = _counting_team_jobs(monkeypatch, timed=True)
    m, slots = 1000, 2

    def launch():
        hits, offsets = wp.zeros(m, dtype=wp.int32, device=cpu), wp.full(m, -1, dtype=wp.int32, device=cpu)
        cpu_launch.launch_queries(kernels.visit, m, slots, [], [hits, offsets], cpu, None, scatter=scatter)
        assert (hits.numpy() == 1).all()
        if scatter:
            assert (offsets.numpy() == np.arange(m) % slots).all()

    launch()
    assert len(jobs) == 1 and jobs[0].chunk_ns < 10**9  # a thread took work, and timed it
    clock.now += cpu_launch.SOLO_SECONDS / 2
    launch()
    assert len(jobs) == 1  # alone, in turn
    clock.now += cpu_launch.SOLO_SECONDS
    launch()
    assert len(jobs) == 2  # the team again


@pytest.mark.parametrize("scatter", [False, True], ids=["chunks", "slots"])
def test_the_caller_does_not_wait_for_a_helper_that_never_started(scatter, monkeypatch):
    """On warpbridge's own pool, a helper that has not started by the time the caller has run
    every share is cancelled, not waited for (a helper on a busy or idle core starts late):
    here the pool's only worker is held by another task until after the launch returns."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import kernels

    cpu = wp.get_device("cpu")
    _tree.kernels_for("float32", cpu)
    monkeypatch.setattr(cpu_team, "TEAMS", {})
    monkeypatch.setattr(cpu_launch, "CHUNK_MIN", 1)
    held, release = threading.Event(), threading.Event()
    pool = ThreadPoolExecutor(max_workers=1)
    blocker = pool.submit(lambda: (held.set(), release.wait()))
    held.wait()
    monkeypatch.setattr(cpu_pool, "_pool", lambda: pool)
    m = 300
    hits, offsets = wp.zeros(m, dtype=wp.int32, device=cpu), wp.full(m, -1, dtype=wp.int32, device=cpu)
    try:
        cpu_launch.launch_queries(kernels.visit, m, 2, [], [hits, offsets], cpu, None, scatter=scatter)
        assert not blocker.done()  # returned while the helper's thread was still held
        assert (hits.numpy() == 1).all()  # the caller ran every share itself
        if scatter:
            assert (offsets.numpy() == np.arange(m) % 2).all()
    finally:
        release.set()
        pool.shutdown()


def test_the_launchers_copy_and_minus_ones_write_only_their_arrays():
    """cpu_launch.copy and minus_ones (a memmove and a memset on contiguous CPU arrays) write
    what wp.copy and fill_(-1) would, and nothing around a view; strided arrays take Warp's
    own path."""
    cpu = wp.get_device("cpu")
    base = wp.array(np.arange(10, dtype=np.int32), device=cpu)
    cpu_launch.copy(base[3:7], wp.array(np.arange(100, 104, dtype=np.int32), device=cpu))
    assert base.numpy().tolist() == [0, 1, 2, 100, 101, 102, 103, 7, 8, 9]
    cpu_launch.minus_ones(base[2:5])
    assert base.numpy().tolist() == [0, 1, -1, -1, -1, 102, 103, 7, 8, 9]
    every_other = wp.array(ptr=base.ptr, dtype=wp.int32, shape=(5,), strides=(8,), device=cpu)
    cpu_launch.copy(every_other, wp.array(np.arange(50, 55, dtype=np.int32), device=cpu))
    assert base.numpy().tolist() == [50, 1, 51, -1, 52, 102, 53, 7, 54, 9]
    cpu_launch.minus_ones(every_other)
    assert base.numpy().tolist() == [-1, 1, -1, -1, -1, 102, -1, 7, -1, 9]


def test_small_scratch_is_reused_per_thread_and_calls_in_threads_stay_apart(monkeypatch):
    """The tree's CPU scratch is kept per thread while small (cpu_launch.kept): the next call of the
    same size reuses it, a big one is not kept, and calls running at once in two threads,
    each on its own kept arrays, give the results they give alone."""
    import threading

    cpu = wp.get_device("cpu")
    first = cpu_launch.kept("sorted_points", (100,), wp.vec3, cpu)
    assert cpu_launch.kept("sorted_points", (100,), wp.vec3, cpu) is first
    assert cpu_launch.kept("sorted_points", (101,), wp.vec3, cpu) is not first
    assert cpu_launch.kept("sorted_points", (101,), wp.vec3d, cpu).dtype is wp.vec3d
    monkeypatch.setattr(cpu_launch, "KEEP_BYTES", 1000)
    big = cpu_launch.kept("sorted_points", (1000,), wp.vec3, cpu)
    assert cpu_launch.kept("sorted_points", (1000,), wp.vec3, cpu) is not big
    monkeypatch.undo()

    clouds_ = [clouds(600, 900, 4, torch.float32, seed=s) for s in (31, 32)]
    alone = [wb.ops.knn_aggregate(q, r, f, 5, 0.2) for q, r, f in clouds_]
    together: dict = {}
    start = threading.Barrier(2)

    def worker(i):
        q, r, f = clouds_[i]
        start.wait()
        together[i] = [wb.ops.knn_aggregate(q, r, f, 5, 0.2) for _ in range(20)]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i in range(2):
        assert all(torch.equal(out, alone[i]) for out in together[i])


def _child(conn):
    # As a DataLoader worker does: once the parent has run a parallel PyTorch op, any torch op
    # large enough to go parallel hangs in a forked child with PyTorch's default threads
    # (GNU OpenMP does not survive fork; measured with torch.zeros(3000, 64) alone).
    torch.set_num_threads(1)
    q, r, f = clouds(3000, 2000, 4, torch.float32, seed=15)
    conn.send([float(t.sum()) for t in _two_thread_results([t.clone().requires_grad_() for t in (q, r, f)])])


def test_forked_child_does_not_hang():
    """libgomp's and a thread pool's threads do not survive fork(): a child of a process that
    already ran the ops on two threads must not wait for them (DataLoader workers fork)."""
    import multiprocessing

    q, r, f = clouds(3000, 2000, 4, torch.float32, seed=15)
    want = [float(t.sum()) for t in _two_thread_results([t.clone().requires_grad_() for t in (q, r, f)])]
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_child, args=(child,))
    p.start()
    p.join(120)
    if p.is_alive():
        p.kill()
        pytest.fail("the forked child hung")
    assert p.exitcode == 0
    assert parent.recv() == want


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_computed_in_float32_and_returned_in_its_dtype(dtype):
    """float16/bfloat16 points and features (the tutorial generates bfloat16 data): distances,
    weights and sums in float32, outputs and gradients in the input dtype, checked against the
    float64 dense formula on the same (rounded) inputs at the dtype's tolerance."""
    q, r, f = (t.to(dtype) for t in clouds(200, 300, 4, torch.float64, seed=31))
    q = away_from_cutoff(q.double(), r.double(), 0.5).to(dtype)
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=3e-3, rtol=3e-3)
    ops = {
        "radius": (
            lambda a, b, c: wb.ops.radius_aggregate(a, b, c, 0.5, 0.2),
            lambda a, b, c: ref_ops.radius_aggregate(a, b, c, 0.5, 0.2),
        ),
        "knn_aggregate": (
            lambda a, b, c: wb.ops.knn_aggregate(a, b, c, 5, 0.2),
            lambda a, b, c: ref_ops.knn_aggregate(a, b, c, 5, 0.2),
        ),
        "knn": (lambda a, b, c: wb.ops.knn(a, b, 5)[0], lambda a, b, c: ref_ops.knn(a, b, 5)[0]),
    }
    for name, (ours, dense) in ops.items():
        ins = [t.clone().requires_grad_() for t in (q, r, f)]
        ref = [t.double().requires_grad_() for t in (q, r, f)]
        out, want = ours(*ins), dense(*ref)
        assert out.dtype == dtype, name
        torch.testing.assert_close(out.double(), want, **tol)
        g = torch.randn(want.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        got = torch.autograd.grad(out, ins, g.to(dtype), allow_unused=True)
        exp = torch.autograd.grad(want, ref, g, allow_unused=True)
        for a, b in zip(got, exp):
            if b is None:
                continue
            assert a.dtype == dtype, name
            scale = b.abs().max().clamp(min=1.0)
            torch.testing.assert_close(a.double() / scale, b / scale, **tol)
    dist, idx, _ = wb.ops.knn(q, r, 5)
    assert idx.dtype == torch.int64 and torch.equal(idx, wb.ops.knn(q.float(), r.float(), 5)[1])


def test_non_finite_points_are_nobodys_neighbours(tree_build):
    q, r, f = clouds(40, 60, 2, seed=16)
    r_bad = r.clone()
    r_bad[5] = float("nan")
    r_bad[7, 1] = float("inf")
    q_bad = q.clone()
    q_bad[3] = float("nan")
    keep = torch.ones(60, dtype=torch.bool)
    keep[[5, 7]] = False
    out = wb.ops.radius_aggregate(q_bad, r_bad, f, 0.8, 0.1)
    expect = ref_ops.radius_aggregate(q, r[keep], f[keep], 0.8, 0.1)
    torch.testing.assert_close(out[torch.arange(40) != 3], expect[torch.arange(40) != 3])
    assert torch.equal(out[3], torch.zeros(2, dtype=out.dtype))
    dist, idx, _ = wb.ops.knn(q_bad, r_bad, 4)
    assert torch.isinf(dist[3]).all() and (idx[3] == -1).all()
    assert not ((idx == 5) | (idx == 7)).any()
    agg = wb.ops.knn_aggregate(q_bad, r_bad, f, 4, 0.1)
    assert torch.equal(agg[3], torch.zeros(2, dtype=agg.dtype)) and torch.isfinite(agg).all()


def test_fewer_finite_references_than_k(tree_build):
    """Rows past what exists are padded, and count says how many are real (PyTorch3D's
    lengths convention): -1 never comes without it."""
    r = torch.randn(5, 3, dtype=torch.float64)
    r[1:] = float("nan")
    dist, idx, count = wb.ops.knn(torch.zeros(2, 3, dtype=torch.float64), r, 3)
    assert (idx[:, 0] == 0).all() and (idx[:, 1:] == -1).all() and torch.isinf(dist[:, 1:]).all()
    assert count.tolist() == [1, 1] and count.dtype == torch.int64
    dist, idx, count = wb.ops.knn(torch.zeros(2, 3, dtype=torch.float64), r[:0], 2)  # no reference point
    assert count.tolist() == [0, 0] and (idx == -1).all()
    r = torch.randn(6, 3, dtype=torch.float64)
    dist, idx, count = wb.ops.knn(r, r, 8)  # k past the cloud: what exists, then padding
    assert count.tolist() == [6] * 6 and (idx[:, 6:] == -1).all() and (idx[:, :6] >= 0).all()
    assert torch.equal(idx[:, :6], wb.ops.knn(r, r, 6).idx)


def test_empty_sets():
    q, r, f = clouds(10, 20, 3)
    assert wb.ops.radius_aggregate(q[:0], r, f, 0.5, 0.1).shape == (0, 3)
    assert torch.equal(wb.ops.radius_aggregate(q, r[:0], f[:0], 0.5, 0.1), torch.zeros(10, 3, dtype=q.dtype))
    d, i, _ = wb.ops.knn(q[:0], r, 2)
    assert d.shape == i.shape == (0, 2)
    assert wb.ops.knn_aggregate(q[:0], r, f, 2, 0.1).shape == (0, 3)
    x = q[:0].clone().requires_grad_()
    y = r.clone().requires_grad_()
    wb.ops.radius_aggregate(x, y, f, 0.5, 0.1).sum().backward()
    assert torch.equal(y.grad, torch.zeros_like(y))


def test_non_contiguous_inputs():
    q, r, f = clouds(50, 80, 6, seed=17)
    qt = torch.cat([q, q], 1)[:, ::2]  # strided views
    ft = f[:, ::2]
    torch.testing.assert_close(
        wb.ops.radius_aggregate(qt, r, ft, 0.5, 0.1), ref_ops.radius_aggregate(qt, r, ft, 0.5, 0.1)
    )
    # knn_aggregate reads packed feature rows by pointer and others element by element
    f8 = torch.randn(80, 8, generator=torch.Generator().manual_seed(3), dtype=q.dtype)
    for feats in (ft, f8, f8[:, ::2], f8.t().contiguous().t()):
        torch.testing.assert_close(
            wb.ops.knn_aggregate(qt, r, feats, 5, 0.1), ref_ops.knn_aggregate(qt, r, feats, 5, 0.1)
        )


# -- training: a tutorial-style model follows the dense reference -------------------------


class _MLP(torch.nn.Sequential):
    def __init__(self, i, h, o):
        super().__init__(
            torch.nn.Linear(i, h), torch.nn.ReLU(), torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, o)
        )


class _Model(torch.nn.Module):
    def __init__(self, agg):
        super().__init__()
        self.proj, self.out, self.agg = _MLP(3, 16, 16), _MLP(16, 16, 1), agg

    def forward(self, grid, cloud):
        return self.out(self.agg(grid, cloud, self.proj(cloud)))


@pytest.mark.parametrize("kind", ["radius", "knn"])
def test_training_follows_dense_reference(kind):
    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 8, dtype=torch.float64)
    grid = torch.stack(torch.meshgrid(x, x, x, indexing="ij"), -1).reshape(-1, 3)
    cloud = torch.randn(600, 3, dtype=torch.float64)
    target = torch.sin(3 * grid[:, :1]) * grid[:, 1:2]
    if kind == "radius":
        grid = away_from_cutoff(grid, cloud, 0.45)
        target = torch.sin(3 * grid[:, :1]) * grid[:, 1:2]
        ours = lambda g, c, f: wb.ops.radius_aggregate(g, c, f, 0.45, 0.1)
        dense = lambda g, c, f: ref_ops.radius_aggregate(g, c, f, 0.45, 0.1)
    else:
        ours = lambda g, c, f: wb.ops.knn_aggregate(g, c, f, 7, 0.1)
        dense = lambda g, c, f: ref_ops.knn_aggregate(g, c, f, 7, 0.1)
    a, b = _Model(ours).double(), _Model(dense).double()
    b.load_state_dict(a.state_dict())
    losses = []
    for model in (a, b):
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        curve = []
        for _ in range(30):
            opt.zero_grad()
            loss = torch.mean((model(grid, cloud) - target) ** 2)
            loss.backward()
            opt.step()
            curve.append(loss.item())
        losses.append(curve)
    assert losses[0][-1] < 0.8 * losses[0][0]  # it learns
    for x, y in zip(*losses):
        assert math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9)


# -- torch.compile and registration ---------------------------------------------------------


@pytest.mark.compile
def test_compile_fullgraph_forward_and_backward():
    q, r, f = clouds(200, 300, 4, torch.float32, seed=18)
    q = away_from_cutoff(q.double(), r.double(), 0.4).float()

    def model(q, r, f):
        return wb.ops.radius_aggregate(q, r, f, 0.4, 0.1).square().sum() + wb.ops.knn_aggregate(q, r, f, 5, 0.1).sum()

    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    ins = [t.clone().requires_grad_() for t in (q, r, f)]
    ins2 = [t.clone().requires_grad_() for t in (q, r, f)]
    torch.testing.assert_close(compiled(*ins), model(*ins2))
    g1 = torch.autograd.grad(compiled(*ins), ins)
    g2 = torch.autograd.grad(model(*ins2), ins2)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)


def test_opcheck_registered_ops():
    """The point ops are wb.op ops like any user's: check_op runs finite differences,
    reentrancy, untouched inputs and torch.library.opcheck on their registered custom ops."""
    from warpbridge.ops import _op_table
    from warpbridge.testing import check_op

    ops = _op_table.ops_for("float64")
    q, r, f = clouds(30, 40, 3, torch.float64, seed=19)
    q = away_from_cutoff(q, r, 0.7)
    ins = [t.clone().requires_grad_() for t in (q, r, f)]
    check_op(ops.radius_aggregate, *ins, 0.7, 0.2)
    check_op(ops.knn, ins[0], ins[1], 4)
    check_op(ops.knn_aggregate, *ins, 4, 0.2)
    torch.library.opcheck(ops.knn.torch_op, (ins[0], ins[1], 4))  # no dims: they follow the inputs
    # over a batch of two clouds
    qb, rb = (torch.arange(30) >= 12).long(), (torch.arange(40) >= 25).long()
    check_op(ops.radius_aggregate_batched, *ins, qb, rb, 0.7, 0.2)
    check_op(ops.knn_aggregate_batched, *ins, qb, rb, 4, 0.2)
    torch.library.opcheck(ops.knn_batched.torch_op, (ins[0], ins[1], qb, rb, 4))


def test_numpy_and_warp_arrays_run_the_forward_like_any_wb_op():
    """The point ops are wb.op ops: NumPy arrays and wp.arrays (any DLPack producer) get the
    forward, in their own array type, with the same values as torch."""
    import numpy as np
    import warp as wp

    q, r, f = clouds(40, 60, 3, torch.float64, seed=23)
    expect = wb.ops.radius_aggregate(q, r, f, 0.6, 0.2).numpy()
    got = wb.ops.radius_aggregate(q.numpy(), r.numpy(), f.numpy(), 0.6, 0.2)
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, expect)
    dist, idx, _ = wb.ops.knn(wp.array(q.numpy()), wp.array(r.numpy()), 4)
    assert isinstance(dist, wp.array) and idx.dtype == wp.int64
    td, ti, _ = wb.ops.knn(q, r, 4)
    np.testing.assert_array_equal(dist.numpy(), td.numpy())
    np.testing.assert_array_equal(idx.numpy(), ti.numpy())
    half = wb.ops.knn_aggregate(
        q.numpy().astype(np.float16), r.numpy().astype(np.float16), f.numpy().astype(np.float16), 4, 0.2
    )
    assert half.dtype == np.float16


# -- bad input ----------------------------------------------------------------------------------


def _bad_cases():
    q, r, f = clouds(5, 6, 2, torch.float32)
    return [
        (
            "radius_aggregate",
            lambda: wb.ops.radius_aggregate(q[:, :2], r, f, 0.5, 0.1),
            "'ref' has 3 coordinates per point but 'query' has 2",
        ),
        (
            "radius_aggregate",
            lambda: wb.ops.radius_aggregate(q, r[None], f, 0.5, 0.1),
            r"'ref' must have shape \(N, D\) with 1 <= D <= 16, got \(1, 6, 3\)",
        ),
        ("radius_aggregate", lambda: wb.ops.radius_aggregate(q, r, f[:4], 0.5, 0.1), "one row per reference point"),
        (
            "radius_aggregate",
            lambda: wb.ops.radius_aggregate(q, r, f.double(), 0.5, 0.1),
            "'features' has dtype float64",
        ),
        (
            "radius_aggregate",
            lambda: wb.ops.radius_aggregate(q.half(), r, f, 0.5, 0.1),
            "'ref' has dtype float32 but 'query' has float16",
        ),
        (
            "radius_aggregate",
            lambda: wb.ops.radius_aggregate(q.long(), r, f, 0.5, 0.1),
            "float32 or float64, got int64",
        ),
        (
            "radius_aggregate",
            lambda: wb.ops.radius_aggregate(q, r, f, 0.0, 0.1),
            "'radius' must be positive and finite, got 0.0",
        ),
        ("radius_aggregate", lambda: wb.ops.radius_aggregate(q, r, f, float("nan"), 0.1), "'radius' must be positive"),
        (
            "radius_aggregate",
            lambda: wb.ops.radius_aggregate(q, r, f, 0.5, -1),
            "'sigma' must be positive and finite, got -1.0",
        ),
        (
            "radius_aggregate",
            lambda: wb.ops.radius_aggregate(q, r, f, torch.tensor(0.5), 0.1),
            "'radius' must be a positive Python number, got torch.Tensor",
        ),
        (
            "radius_aggregate",
            lambda: wb.ops.radius_aggregate(q, r, f, True, 0.1),
            "'radius' must be a positive Python number",
        ),
        (
            "radius_aggregate",
            lambda: wb.ops.radius_aggregate(q.numpy(), r, f, 0.5, 0.1),
            "all arrays must come from one framework, got numpy and torch",
        ),
        (
            "radius_aggregate",
            lambda: wb.ops.radius_aggregate(q.tolist(), r, f, 0.5, 0.1),
            r"argument 'query' must be an array \(\(M, D\) points\).*got builtins.list",
        ),
        (
            "radius_aggregate",
            lambda: wb.ops.radius_aggregate(q, r.to("meta"), f, 0.5, 0.1),
            "'ref' is on meta but 'query' is on cpu",
        ),
        ("knn", lambda: wb.ops.knn(q, r, 0), r"'k' must be at least 1, got 0"),
        ("knn", lambda: wb.ops.knn(q, r, 2**40), r"M \* k = .* more than one array holds"),
        ("knn", lambda: wb.ops.knn(q, r, 2.0), "'k' must be an int, got float 2.0"),
        ("knn_aggregate", lambda: wb.ops.knn_aggregate(q, r, f, 3, 0.0), "'sigma' must be positive"),
        ("knn_aggregate", lambda: wb.ops.knn_aggregate(q, r, f[:, 0], 3, 0.1), r"'features' must have shape \(N, F\)"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_cases())))
def test_bad_input_raises_before_any_launch(case, monkeypatch):
    name, call, pattern = _bad_cases()[case]
    launched = []
    monkeypatch.setattr(cpu_launch, "launch_queries", lambda *a, **k: launched.append(a))
    monkeypatch.setattr(_tree, "build_tree", lambda *a, **k: launched.append(a))
    with pytest.raises(WarpBridgeError, match=pattern) as info:
        call()
    assert str(info.value).startswith(f"{name}(): ")
    assert not launched


def test_the_tutorials_warp_adjoint_is_zero_and_ours_is_exact():
    """Why these ops exist: the tutorial launches its kernel's Warp adjoint for the feature
    gradient; the neighbour loop is dynamic, so that adjoint returns zeros."""
    import sys

    import warp as wp

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    from _kernels import tutorial_radius_aggregate

    q, r, f = (t.float() for t in clouds(100, 200, 4, seed=20))
    grid = wp.HashGrid(11, 11, 11, device="cpu")
    wq, wr, wf = (wp.from_torch(t, dtype=d, requires_grad=False) for t, d in ((q, wp.vec3), (r, wp.vec3), (f, None)))
    grid.build(wr, 0.5)
    out, g, tutorial_grad = torch.zeros(100, 4), torch.randn(100, 4), torch.zeros_like(f)
    args = dict(dim=100, inputs=[wq, wr, wf, grid.id, 0.5, 0.1], outputs=[wp.from_torch(out, requires_grad=False)])
    wp.launch(tutorial_radius_aggregate, **args)
    wp.launch(
        tutorial_radius_aggregate,
        **args,
        adj_inputs=[None, None, wp.from_torch(tutorial_grad, requires_grad=False), None, 0.0, 0.0],
        adj_outputs=[wp.from_torch(g, requires_grad=False)],
        adjoint=True,
    )
    fr = f.clone().requires_grad_()
    (ours,) = torch.autograd.grad(wb.ops.radius_aggregate(q, r, fr, 0.5, 0.1), fr, g)
    (dense,) = torch.autograd.grad(ref_ops.radius_aggregate(q, r, fr, 0.5, 0.1), fr, g)
    assert torch.equal(tutorial_grad, torch.zeros_like(f)) and dense.abs().max() > 0.1
    torch.testing.assert_close(ours, dense)


def test_the_neighbour_ops_write_no_input_and_copy_none_on_a_new_shape(monkeypatch):
    """Every neighbour op, on one cloud and on a ragged batch, forward and backward, leaves
    its inputs (points, features, batch vectors, incoming gradients) byte for byte as they
    were. Trusted to, they run on the inputs themselves at every new shape (clouds change
    size every step), while a user's launch function still runs first on copies."""
    from warpbridge._core import launch_function

    copied = []
    real = launch_function._copies_of_inputs
    monkeypatch.setattr(
        launch_function, "_copies_of_inputs", lambda plan, args: copied.append(plan) or real(plan, args)
    )
    q, r, f = clouds(57, 83, 4, seed=31)  # shapes no other test uses: every plan is new
    qb = torch.sort(torch.randint(0, 3, (57,), generator=torch.Generator().manual_seed(1)))[0]
    rb = torch.sort(torch.randint(0, 3, (83,), generator=torch.Generator().manual_seed(2)))[0]
    ins = [t.clone().requires_grad_() for t in (q, r, f)]
    frozen = [t.detach().clone() for t in (*ins, qb, rb)]
    batch = {"query_batch": qb, "ref_batch": rb}
    outs = [
        wb.ops.radius_aggregate(*ins, 0.6, 0.2),
        wb.ops.radius_aggregate(*ins, 0.6, 0.2, **batch),
        wb.ops.knn_aggregate(*ins, 4, 0.2),
        wb.ops.knn_aggregate(*ins, 4, 0.2, **batch),
        wb.ops.knn(ins[0], ins[1], 3)[0],
        wb.ops.knn(ins[0], ins[1], 3, **batch)[0],
        wb.ops.radius(ins[0], ins[1], 0.6).distance,
        wb.ops.radius(ins[0], ins[1], 0.6, max_neighbors=2, **batch).distance,
    ]
    wb.ops.radius_graph(ins[1], 0.6, batch=rb)
    wb.ops.knn_graph(ins[1], 2, batch=rb)
    grads = [torch.randn_like(o) for o in outs]
    kept = [g.clone() for g in grads]
    torch.autograd.backward(outs, grads)
    for t, b in zip((*ins, qb, rb), frozen):
        assert torch.equal(t.detach(), b)
    assert all(torch.equal(g, k) for g, k in zip(grads, kept))
    assert copied == []

    @wb.op
    def passed_on(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        wp.copy(y, x)

    passed_on(torch.ones(5))
    assert len(copied) == 1


def _small_cases():
    """Clouds a kNN call searches without a tree (``_knn_launches.small``): ties on a lattice,
    duplicates, points that are not finite, coordinates whose squares overflow or underflow,
    2-D and 16-D, k above and at the cloud's size."""
    g = torch.Generator().manual_seed(21)
    lattice = torch.stack(torch.meshgrid(*[torch.arange(5.0)] * 3, indexing="ij"), -1).reshape(-1, 3)
    odd = torch.randn(60, 3, generator=g, dtype=torch.float64)
    odd[3], odd[7, 1], odd[9] = math.nan, math.inf, odd[2]  # NaN, inf, a duplicate
    return {
        "lattice, k 7": (lattice, lattice, 7),
        "not finite and duplicated, k 60": (odd, odd, 60),
        "k past the cloud": (odd[:10], odd, 80),
        "huge": (odd[:20] * 1e200, odd * 1e200, 5),
        "tiny": (odd[:20] * 1e-200, odd * 1e-200, 5),
        "float32, 2-D": (torch.rand(90, 2, generator=g), torch.rand(120, 2, generator=g), 9),
        "16-D": (
            torch.randn(30, 16, generator=g, dtype=torch.float64),
            torch.randn(200, 16, generator=g, dtype=torch.float64),
            4,
        ),
    }


@pytest.mark.parametrize("case", list(_small_cases()))
def test_a_small_cloud_searched_without_a_tree_gets_the_trees_result(case, monkeypatch):
    """A small cloud's kNN compares each query with every reference: the same distances,
    indices, counts and gradients as the tree's search, bit for bit (so a cloud alone and
    the same cloud in a batch, which always takes the tree, agree)."""
    from warpbridge.ops import _knn_launches

    q, r, k = _small_cases()[case]
    assert _knn_launches.small(len(q), len(r))
    results = []
    for pairs in (_knn_launches.SMALL_PAIRS, 0):  # compared with every point, then through the tree
        monkeypatch.setattr(_knn_launches, "SMALL_PAIRS", pairs)
        qg, rg = q.clone().requires_grad_(), r.clone().requires_grad_()
        dist, idx, count = wb.ops.knn(qg, rg, k)
        grads = torch.autograd.grad(torch.where(idx >= 0, dist, 0.0).nan_to_num(posinf=0.0).sum(), (qg, rg))
        results.append((dist, idx, count, *grads))
    for ours, tree in zip(*results):
        assert torch.equal(ours, tree)
    assert (results[0][2] > 0).any()
