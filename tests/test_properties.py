"""Hostile input, by property (Hypothesis): every call returns the reference result or raises
a WarpBridgeError; no other exception, no crash, no hang, inputs unchanged."""

import math

import kernels as K
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import warpbridge as wb

SETTINGS = settings(max_examples=150, deadline=5000, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
DTYPES = [torch.float64, torch.float32, torch.float16, torch.int32, torch.bool]
VALUES = st.one_of(
    st.floats(-1e3, 1e3, allow_nan=False),
    st.sampled_from([0.0, -0.0, math.nan, math.inf, -math.inf, 1e30, -1e-30]),
)


@st.composite
def tensors(draw, max_len=12):
    n = draw(st.integers(0, max_len))
    step = draw(st.integers(1, 3))
    dtype = draw(st.sampled_from(DTYPES))
    vals = draw(st.lists(VALUES, min_size=n * step, max_size=n * step))
    base = torch.tensor(vals, dtype=torch.float64).to(dtype) if vals else torch.zeros(0, dtype=dtype)
    return base[::step]  # strided when step > 1


def snapshot(*ts):
    return [t.clone() for t in ts]


def unchanged(before, after):
    for a, b in zip(before, after):
        if a.is_floating_point():
            assert torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)) and torch.equal(a.isnan(), b.isnan())
        else:
            assert torch.equal(a, b)


@SETTINGS
@given(x=tensors(), y=tensors(), launch=st.one_of(st.none(), st.integers(0, 16)), grad=st.booleans())
def test_wb_op_returns_the_reference_or_refuses(x, y, launch, grad):
    op = wb.op(K.mul64)
    if grad and x.dtype == torch.float64:
        x = x.clone().requires_grad_(True)
    before = snapshot(x.detach(), y)
    kw = {} if launch is None else {"launch_dims": (launch,)}
    try:
        z = op(x, y, **kw)
    except wb.WarpBridgeError as e:
        assert str(e).startswith("mul64(): ")
        ok_dtypes = x.dtype == torch.float64 and y.dtype == torch.float64
        n = len(x) if launch is None else launch
        assert not ok_dtypes or len(x) < n or len(y) < n, f"refused a valid call: {e}"
    else:
        n = len(x) if launch is None else launch
        expected = torch.sin(x.detach()[:n].double()) * y[:n].double()
        assert z.shape == (n,)
        torch.testing.assert_close(z.detach(), expected, equal_nan=True)
        if grad and x.requires_grad and n:
            z.sum().backward()
            torch.testing.assert_close(x.grad[:n], torch.cos(x.detach()[:n]) * y[:n], equal_nan=True)
    unchanged(before, [x.detach(), y])


# -- neighbour ops ----------------------------------------------------------------------------

COORD = st.one_of(
    st.floats(-2.0, 2.0, allow_nan=False),
    st.sampled_from([0.0, 0.5, math.nan, math.inf, -math.inf, 1e30]),
)


@st.composite
def clouds(draw):
    m, n, f = draw(st.integers(0, 10)), draw(st.integers(0, 14)), draw(st.integers(1, 3))
    q = torch.tensor(draw(st.lists(COORD, min_size=3 * m, max_size=3 * m)), dtype=torch.float64).reshape(m, 3)
    pts = draw(st.lists(st.lists(COORD, min_size=3, max_size=3), min_size=1, max_size=4)) if n else []
    # duplicates on purpose: reference points drawn from a few distinct ones
    picks = draw(st.lists(st.integers(0, max(len(pts) - 1, 0)), min_size=n, max_size=n))
    r = torch.tensor([pts[i] for i in picks], dtype=torch.float64).reshape(n, 3)
    feats = torch.tensor(draw(st.lists(st.floats(-1, 1), min_size=n * f, max_size=n * f)), dtype=torch.float64)
    return q, r, feats.reshape(n, f)


def finite_rows(a):
    return torch.isfinite(a).all(1)


def dense_radius(q, r, f, radius, sigma):
    """Reference: non-finite points are nobody's neighbours (huge finite ones are points)."""
    keep = finite_rows(r)
    r, f = r[keep], f[keep]
    out = torch.zeros(len(q), f.shape[1], dtype=q.dtype)
    for i in range(len(q)):
        if not finite_rows(q[i : i + 1])[0] or not len(r):
            continue
        d = (q[i] - r).norm(dim=1)
        mask = d <= radius
        if mask.any():
            w = torch.exp(-(d[mask] - d[mask].min()) / sigma)
            out[i] = (w[:, None] * f[mask]).sum(0) / w.sum()
    return out


@SETTINGS
@given(
    data=clouds(),
    radius=st.sampled_from([0.0, 1e-12, 0.3, 1.0, 5.0, math.inf, math.nan, -1.0]),
    sigma=st.sampled_from([1e-3, 0.1, 1.0, 0.0, math.inf]),
)
def test_radius_aggregate_returns_the_reference_or_refuses(data, radius, sigma):
    q, r, f = data
    before = snapshot(q, r, f)
    try:
        out = wb.ops.radius_aggregate(q, r, f, radius, sigma)
    except wb.WarpBridgeError as e:
        assert str(e).startswith("radius_aggregate(): ")
        assert not (0 < radius < math.inf and 0 < sigma < math.inf), f"refused a valid call: {e}"
    else:
        assert 0 < radius < math.inf and 0 < sigma < math.inf
        torch.testing.assert_close(out, dense_radius(q, r, f, radius, sigma), atol=1e-9, rtol=1e-9)
    unchanged(before, [q, r, f])


@SETTINGS
@given(data=clouds(), k=st.integers(-1, 16), sigma=st.sampled_from([0.05, 1.0, 0.0, math.nan]))
def test_knn_and_knn_aggregate_return_the_reference_or_refuse(data, k, sigma):
    q, r, f = data
    before = snapshot(q, r, f)
    try:
        dist, idx, count = wb.ops.knn(q, r, k)
    except wb.WarpBridgeError as e:
        assert str(e).startswith("knn(): ")
        assert k < 1, f"refused a valid call: {e}"
    else:
        assert k >= 1 and dist.shape == idx.shape == (len(q), k) and count.shape == (len(q),)
        keep = finite_rows(r)
        for i in range(len(q)):
            if not finite_rows(q[i : i + 1])[0]:
                assert (idx[i] == -1).all() and torch.isinf(dist[i]).all() and count[i] == 0
                continue
            d = (q[i] - r).norm(dim=1)
            d[~keep] = math.inf
            want = torch.cat([torch.sort(d, stable=True).values, torch.full((k,), math.inf, dtype=d.dtype)])[:k]
            torch.testing.assert_close(dist[i], want, atol=1e-9, rtol=1e-9)
            found = idx[i] >= 0
            assert torch.equal(found, torch.isfinite(want))  # -1 exactly where too few finite refs
            assert count[i] == found.sum() and found[: int(count[i])].all()  # the count masks the -1s
            torch.testing.assert_close(d[idx[i][found]], dist[i][found], atol=1e-9, rtol=1e-9)
        try:
            agg = wb.ops.knn_aggregate(q, r, f, k, sigma)
        except wb.WarpBridgeError as e:
            assert str(e).startswith("knn_aggregate(): ") and not (0 < sigma < math.inf)
        else:
            assert torch.isfinite(agg).all() and agg.shape == (len(q), f.shape[1])
    unchanged(before, [q, r, f])


SCALARS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([True, "3", None, (1, 2), 2**31 - 1, -(2**31), 2**31, 3.4028235677973366e38, 65520.0]),
)


@SETTINGS
@given(v=st.tuples(SCALARS, SCALARS, SCALARS), s=SCALARS, h=SCALARS, b=SCALARS)
def test_scalars_are_exact_or_refused(v, s, h, b):
    """Integer components must be ints in int32's range, floats must not round to inf in their
    type: the kernel then sees exactly those values, else a WarpBridgeError."""
    import realcode_kernels as R

    op = wb.op(R.scalar_sum)
    x = torch.zeros(1, dtype=torch.float64)
    ints_ok = all(isinstance(c, int) and not isinstance(c, bool) and -(2**31) <= c < 2**31 for c in v)
    limits = {"s": 3.4028235677973366e38, "h": 65520.0, "b": 3.39617752923046e38}

    def float_ok(value, limit):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        try:
            f = float(value)
        except OverflowError:
            return False
        return not math.isfinite(f) or abs(f) < limit

    valid = ints_ok and all(float_ok(val, limits[k]) for k, val in (("s", s), ("h", h), ("b", b)))
    try:
        out = op(x, v, s, h, b)
    except wb.WarpBridgeError:
        assert not valid, (v, s, h, b)
        return
    assert valid, (v, s, h, b)
    halves = (
        torch.tensor([float(h)], dtype=torch.float16).double() + torch.tensor([float(b)], dtype=torch.bfloat16).double()
    )
    want = sum(v) + torch.tensor([float(s)], dtype=torch.float32).double() + halves
    torch.testing.assert_close(out, want, equal_nan=True, rtol=1e-12, atol=0)


@st.composite
def batch_vectors(draw, m, n):
    """Sorted cloud numbers for m queries and n references, among up to 4 clouds (some empty)."""
    clouds = draw(st.integers(1, 4))
    query = sorted(draw(st.lists(st.integers(0, clouds - 1), min_size=m, max_size=m)))
    ref = sorted(draw(st.lists(st.integers(0, clouds - 1), min_size=n, max_size=n)))
    return torch.tensor(query, dtype=torch.int64), torch.tensor(ref, dtype=torch.int64)


@settings(max_examples=60, deadline=5000, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(data=clouds(), k=st.integers(1, 5), radius=st.sampled_from([1e-12, 0.5, 2.0]), batches=st.data())
def test_batched_knn_and_radius_lists_return_the_per_cloud_reference(data, k, radius, batches):
    q, r, _ = data
    query_batch, ref_batch = batches.draw(batch_vectors(len(q), len(r)))
    before = snapshot(q, r, query_batch, ref_batch)
    if not 1 <= k <= len(r):
        return
    dist, idx, _ = wb.ops.knn(q, r, k, query_batch=query_batch, ref_batch=ref_batch)
    nb = wb.ops.radius(q, r, radius, query_batch=query_batch, ref_batch=ref_batch)
    for i in range(len(q)):
        d = (q[i] - r).norm(dim=1)
        d[~finite_rows(r) | (ref_batch != query_batch[i])] = math.inf
        if not finite_rows(q[i : i + 1])[0]:
            d[:] = math.inf
        order = torch.sort(d, stable=True)
        want = order.values[:k]
        torch.testing.assert_close(dist[i], want, atol=1e-9, rtol=1e-9)
        assert torch.equal(idx[i], torch.where(torch.isfinite(want), order.indices[:k], -1))
        inside = order.indices[order.values <= radius]
        assert torch.equal(nb.index[nb.ptr[i] : nb.ptr[i + 1]], inside)
    unchanged(before, [q, r, query_batch, ref_batch])
