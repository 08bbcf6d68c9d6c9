"""Odd tensors and scalars: read as their values, exact, or refused with a WarpBridgeError
naming the parameter, the component and the range. Never silently cast, truncated or wrapped."""

import kernels as K
import numpy as np
import pytest
import realcode_kernels as R
import torch

import warpbridge as wb

f64 = torch.float64


def ones(n=3):
    return torch.ones(n, dtype=f64)


@pytest.mark.parametrize(
    "view",
    [
        lambda v: torch._neg_view(v),  # the memory holds -v
        lambda v: torch.complex(-v, -v).conj().imag,  # a negative bit through a conjugate view
    ],
    ids=["neg_view", "conj_imag"],
)
def test_views_whose_memory_does_not_hold_their_values_are_read_as_values(view):
    op = wb.op(K.mul64)
    base = torch.tensor([-1.0, -2.0, -3.0], dtype=f64)
    x = view(base)
    assert x.is_neg()
    torch.testing.assert_close(op(x, ones()), torch.sin(x.resolve_neg()))
    for _ in range(2):  # the second call takes the cached fast path
        torch.testing.assert_close(op(x, ones()), torch.sin(x.resolve_neg()))
    leaf = base.clone().requires_grad_()
    op(torch._neg_view(leaf), ones()).sum().backward()
    torch.testing.assert_close(leaf.grad, -torch.cos(-base))  # the sign of the chain rule kept


def test_neighbour_features_with_a_negative_bit():
    g = torch.Generator().manual_seed(0)
    q, r, f = torch.rand(10, 3, generator=g), torch.rand(60, 3, generator=g), torch.rand(60, 4, generator=g)
    for agg in (
        lambda feats: wb.ops.knn_aggregate(q, r, feats, k=4, sigma=0.1),
        lambda feats: wb.ops.radius_aggregate(q, r, feats, radius=0.3, sigma=0.1),
    ):
        torch.testing.assert_close(agg(torch._neg_view(f)), agg(-f))


def call(v=(1, 2, 3), s=1.0, h=1.0, b=1.0):
    return wb.op(R.scalar_sum)(ones(2), v, s, h, b)


def test_exact_scalars_of_every_integer_kind_are_taken():
    want = torch.full((2,), 1.0 + 6 + 3, dtype=f64)
    torch.testing.assert_close(call((1, 2, 3)), want)
    torch.testing.assert_close(call((np.int64(1), torch.tensor(2), np.uint8(3))), want)
    torch.testing.assert_close(call(s=float("inf"))[0], torch.tensor(float("inf"), dtype=f64))  # inf is meant


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"v": (1.9, 2.9, 3.9)}, r"'v' component 0 must be a Python int \(int32 scalar.*got float 1.9"),
        ({"v": ("1", "2", "3")}, r"'v' component 0 must be a Python int.*got str '1'"),
        ({"v": ("a", 2, 3)}, r"'v' component 0 must be a Python int.*got str 'a'"),
        ({"v": (1, 2, True)}, r"'v' component 2 must be a Python int.*got bool True"),
        ({"v": (2**32 + 1, 0, 0)}, r"'v' component 0 = 4294967297 does not fit int32 \[-2147483648, 2147483647\]"),
        ({"v": (1, 2)}, r"'v' must be a sequence of 3 numbers"),
        ({"s": 1e300}, r"'s' = 1e\+300 would round to inf in float32 \(largest finite value 3.40282347e\+38\)"),
        ({"s": 3.4028236e38}, r"'s' = 3.4028236e\+38 would round to inf in float32"),
        ({"s": 10**400}, r"'s' = 100000000000\.\.\. \(401 digits\) is too large for any float type"),
        ({"h": 70000.0}, r"'h' = 70000.0 would round to inf in float16 \(largest finite value 65504\)"),
        ({"b": 3.4e38}, r"'b' = 3.4e\+38 would round to inf in bfloat16"),
        ({"s": "1.0"}, r"'s' must be a Python number \(float32 scalar\), got str '1.0'"),
    ],
)
def test_inexact_scalars_are_refused(kwargs, message):
    with pytest.raises(wb.WarpBridgeError, match=message):
        call(**kwargs)


def test_largest_finite_values_pass_and_stay_finite():
    out = call(s=3.4028234e38, h=65504.0, b=3.38e38)
    assert torch.isfinite(out).all()


def _clouds(dtype):
    g = torch.Generator().manual_seed(1)
    return [torch.rand(n, d, generator=g).to(dtype) for n, d in ((12, 3), (80, 3), (80, 4))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_sigma_or_radius_that_is_zero_in_the_compute_type_is_refused(dtype):
    q, r, f = _clouds(dtype)
    with pytest.raises(wb.WarpBridgeError, match=r"'sigma' = 1e-50 is 0 in float32, which float(32|16) inputs"):
        wb.ops.knn_aggregate(q, r, f, k=4, sigma=1e-50)
    with pytest.raises(wb.WarpBridgeError, match=r"'radius' = 1e-50 is 0 in float32"):
        wb.ops.radius_aggregate(q, r, f, radius=1e-50, sigma=0.1)
    with pytest.raises(wb.WarpBridgeError, match=r"'sigma' = 1e\+300 is inf in float32"):
        wb.ops.radius_aggregate(q, r, f, radius=0.3, sigma=1e300)


def test_tiny_sigmas_that_float32_holds_stay_finite_and_float64_takes_any():
    q, r, f = (t.requires_grad_() for t in _clouds(torch.float32))
    out = wb.ops.knn_aggregate(q, r, f, k=4, sigma=1e-40)  # subnormal in float32, not zero
    out.sum().backward()
    assert torch.isfinite(out).all() and all(torch.isfinite(t.grad).all() for t in (q, r, f))
    q64, r64, f64_ = (t.double() for t in _clouds(torch.float32))
    nearest = wb.ops.knn(q64, r64, 1)[1][:, 0]
    torch.testing.assert_close(wb.ops.knn_aggregate(q64, r64, f64_, k=4, sigma=1e-50), f64_[nearest])


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: torch.rand(3, dtype=f64).to_sparse(), r"'x' is a tensor with layout torch.sparse_coo"),
        (
            lambda: torch.empty(3, dtype=f64, device="meta"),
            r"'x' is a meta tensor \(it has no data\)",
        ),
        (
            lambda: torch.nested.nested_tensor([torch.rand(2, dtype=f64), torch.rand(3, dtype=f64)]),
            r"'x' is a nested tensor",
        ),
        (lambda: torch.quantize_per_tensor(torch.rand(3), 0.1, 0, torch.quint8), r"'x' is a quantized tensor"),
        (lambda: torch.rand(3, dtype=torch.complex128), r"'x' has dtype torch.complex128, which Warp cannot use"),
    ],
    ids=["sparse", "meta", "nested", "quantized", "complex"],
)
def test_tensor_kinds_warp_cannot_read_are_refused(make, message):
    op = wb.op(K.mul64)
    for _ in range(2):  # the second call must not slip through the cached fast path
        with pytest.raises(wb.WarpBridgeError, match=message):
            op(make(), ones())


def test_a_sparse_reference_cloud_is_refused():
    with pytest.raises(wb.WarpBridgeError, match="layout torch.sparse_coo"):
        wb.ops.knn(torch.rand(4, 3), torch.rand(10, 3).to_sparse(), 2)


def test_keyword_arguments_are_refused_by_name():
    op = wb.op(K.mul64)
    with pytest.raises(wb.WarpBridgeError, match=r"mul64\(\): takes its inputs by position \(x, y\); got keyword"):
        op(x=ones(), y=ones())


def test_queries_at_the_centre_of_a_sphere_are_exact():
    # the kd-tree's inherent worst case: every point (nearly) equidistant from the queries
    g = torch.Generator().manual_seed(2)
    d = torch.randn(3000, 3, generator=g, dtype=f64)
    sphere = d / d.norm(dim=1, keepdim=True)
    q = 1e-6 * torch.randn(5, 3, generator=g, dtype=f64)
    dist, idx, _ = wb.ops.knn(q, sphere, 8)
    want = torch.cdist(q, sphere).topk(8, largest=False)
    torch.testing.assert_close(dist, want.values)
    torch.testing.assert_close(torch.cdist(q, sphere).gather(1, idx), want.values)
