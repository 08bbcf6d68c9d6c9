"""torch.func over warpbridge ops: vmap (each vmap_method), grad, vjp, jacrev, per-sample
gradients, and the point ops over a batch of clouds. References: loops over the batch and
plain autograd, which test_op and test_points check against float64 formulas."""

import itertools

import kernels as K
import pytest
import torch
import warp as wp
from points_reference import knn as dense_knn
from points_reference import knn_aggregate as dense_knn_aggregate
from points_reference import radius_aggregate as dense_radius_aggregate
from torch.func import grad, jacfwd, jacrev, vjp, vmap

import warpbridge as wb

f64 = torch.float64
METHODS = ["sequential", "broadcast_all", "expand_dims"]


def rand(*shape):
    return torch.rand(*shape, dtype=f64)


def mul_op(method):
    return wb.op(K.mul64, name=f"func_mul_{method}", vmap_method=method)


_made = itertools.count()


def counted_function(method):
    """A two-kernel launch function that records the shapes it was called with."""
    calls = []

    def exp_times(x: wp.array(dtype=wp.float64), k: wp.array(dtype=wp.float64), z: wp.array(dtype=wp.float64)):
        calls.append(tuple(x.shape))
        K.exp_times(x, k, z)

    # each call makes a new function: give each its own registered name
    return wb.op(exp_times, name=f"func_exp_times_{method}_{next(_made)}", vmap_method=method), calls


# -- vmap -----------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_vmap_matches_a_loop_for_every_method_and_in_dims(method):
    mul = mul_op(method)
    X, Y = rand(4, 5), rand(4, 5)
    X0, Y0 = X.clone(), Y.clone()
    torch.testing.assert_close(vmap(mul)(X, Y), torch.sin(X) * Y, rtol=0, atol=1e-15)
    # batch dim last, on non-contiguous views
    torch.testing.assert_close(vmap(mul, in_dims=(1, 1))(X.T, Y.T), torch.sin(X) * Y, rtol=0, atol=1e-15)
    torch.testing.assert_close(vmap(mul, out_dims=1)(X, Y), (torch.sin(X) * Y).T, rtol=0, atol=1e-15)
    assert torch.equal(X, X0) and torch.equal(Y, Y0)  # inputs untouched


@pytest.mark.parametrize("method", ["sequential", "broadcast_all"])
def test_vmap_with_an_unbatched_argument(method):
    mul = mul_op(method)
    X, y = rand(3, 6), rand(6)
    torch.testing.assert_close(vmap(mul, in_dims=(0, None))(X, y), torch.sin(X) * y, rtol=0, atol=1e-15)
    torch.testing.assert_close(vmap(mul, in_dims=(None, 0))(y, X), torch.sin(y) * X, rtol=0, atol=1e-15)


def test_vmap_vector_and_matrix_arguments_with_two_outputs():
    for method in ("sequential", "broadcast_all"):
        op = wb.op(K.vec_mat, num_outputs=2, name=f"func_vec_mat_{method}", vmap_method=method)
        V, M = rand(3, 4, 3), rand(3, 4, 3, 3)
        out_v, out_n = vmap(op, in_dims=(0, 0, None))(V, M, 0.5)
        w = torch.einsum("bnij,bnj->bni", M, V)
        torch.testing.assert_close(out_v, w * 0.5)
        torch.testing.assert_close(out_n, (w * V).sum(-1))


def test_broadcast_all_folds_the_batch_into_one_launch_and_sequential_loops():
    fold, fold_calls = counted_function("broadcast_all")
    seq, seq_calls = counted_function("sequential")
    X, k = rand(4, 5), rand(5)
    want = torch.exp(X) * k
    torch.testing.assert_close(vmap(fold, in_dims=(0, None))(X, k), want)
    torch.testing.assert_close(vmap(seq, in_dims=(0, None))(X, k), want)
    assert fold_calls == [(20,)]
    assert seq_calls == [(5,)] * 4


def test_expand_dims_shares_an_unbatched_table_without_copying_it():
    @wb.op(vmap_method="expand_dims", name="func_lookup")
    @wp.kernel
    def lookup(idx: wp.array(dtype=wp.int32), table: wp.array(dtype=wp.float64), out: wp.array(dtype=wp.float64)):
        i = wp.tid()
        out[i] = table[idx[i]] * wp.float64(2.0)

    idx = torch.randint(0, 7, (3, 10), dtype=torch.int32)
    table = rand(7)
    torch.testing.assert_close(vmap(lookup, in_dims=(0, None))(idx, table), table[idx.long()] * 2)


def test_expand_dims_per_sample_gradients_of_a_shared_table():
    # The table is shared (not read per thread) and needs a per-sample gradient: the forward
    # folds, the backward runs per sample, and each sample's gradient is its own.
    @wb.op(vmap_method="expand_dims", name="func_lookup_grad")
    @wp.kernel
    def lookup(idx: wp.array(dtype=wp.int32), table: wp.array(dtype=wp.float64), out: wp.array(dtype=wp.float64)):
        i = wp.tid()
        out[i] = table[idx[i]] * table[idx[i]]

    idx = torch.randint(0, 7, (4, 10), dtype=torch.int32)
    table = rand(7)
    g = vmap(grad(lambda i, t: lookup(i, t).sum(), argnums=1), in_dims=(0, None))(idx, table)
    want = torch.stack([torch.bincount(row.long(), minlength=7).double() * 2 * table for row in idx])
    torch.testing.assert_close(g, want)


def test_nested_vmap_folds_twice():
    fold, calls = counted_function("broadcast_all")
    X, k = rand(2, 3, 4), rand(2, 3, 4)
    torch.testing.assert_close(vmap(vmap(fold))(X, k), torch.exp(X) * k)
    assert calls == [(24,)]


@pytest.mark.parametrize("method", ["sequential", "broadcast_all"])
def test_an_integer_output_under_vmap_grad_and_jacrev(method):
    op = wb.op(K.square_and_sign, num_outputs=2, name=f"func_square_and_sign_{method}", vmap_method=method)
    X = rand(3, 5) - 0.5
    y, s = vmap(op)(X)
    torch.testing.assert_close(y, X * X)
    assert s.dtype == torch.int32 and torch.equal(s, (X > 0).int())
    torch.testing.assert_close(vmap(grad(lambda x: op(x)[0].sum()))(X), 2 * X)
    torch.testing.assert_close(jacrev(lambda x: op(x)[0])(X[0]), torch.diag(2 * X[0]))


def test_a_function_op_under_vmap_with_gradients():
    for method in ("sequential", "broadcast_all"):
        fn, _ = counted_function(method)
        X, k = rand(3, 5), rand(3, 5)
        g = vmap(grad(lambda x, k, fn=fn: fn(x, k).sum(), argnums=(0, 1)))(X, k)
        torch.testing.assert_close(g[0], torch.exp(X) * k)
        torch.testing.assert_close(g[1], torch.exp(X))


# -- grad, vjp, jacrev ---------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_func_grad_vjp_and_jacrev_match_autograd(method):
    mul = mul_op(method)
    x, y = rand(6), rand(6)

    gx, gy = grad(lambda x, y: (mul(x, y) ** 2).sum(), argnums=(0, 1))(x, y)
    xr, yr = x.clone().requires_grad_(), y.clone().requires_grad_()
    ex, ey = torch.autograd.grad((mul(xr, yr) ** 2).sum(), (xr, yr))
    torch.testing.assert_close(gx, ex)
    torch.testing.assert_close(gy, ey)

    out, pullback = vjp(mul, x, y)
    v = rand(6)
    px, py = pullback(v)
    ref_out, (rx, ry) = torch.autograd.functional.vjp(lambda a, b: torch.sin(a) * b, (x, y), v)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(px, rx)
    torch.testing.assert_close(py, ry)
    torch.testing.assert_close(px, v * torch.cos(x) * y)  # and the formula itself

    jx, jy = jacrev(mul, argnums=(0, 1))(x, y)
    ax, ay = torch.autograd.functional.jacobian(lambda a, b: torch.sin(a) * b, (x, y))
    torch.testing.assert_close(jx, ax)
    torch.testing.assert_close(jy, ay)


@pytest.mark.parametrize("method", METHODS)
def test_per_sample_gradients_with_vmap_of_grad(method):
    mul = mul_op(method)
    X, Y = rand(5, 4), rand(5, 4)

    def loss(x, y):
        return (mul(x, y) ** 2).sum()

    gx, gy = vmap(grad(loss, argnums=(0, 1)))(X, Y)
    for b in range(5):
        xr, yr = X[b].clone().requires_grad_(), Y[b].clone().requires_grad_()
        ex, ey = torch.autograd.grad((torch.sin(xr) * yr).pow(2).sum(), (xr, yr))
        torch.testing.assert_close(gx[b], ex)
        torch.testing.assert_close(gy[b], ey)


@pytest.mark.parametrize("method", ["sequential", "broadcast_all"])
def test_per_sample_gradient_of_a_shared_argument(method):
    # vmap(grad) with y shared by the batch: its gradient is still one per sample.
    mul = mul_op(method)
    X, y = rand(5, 4), rand(4)
    gy = vmap(grad(lambda x, y: mul(x, y).sum(), argnums=1), in_dims=(0, None))(X, y)
    torch.testing.assert_close(gy, torch.sin(X))


@pytest.mark.parametrize("method", METHODS)
def test_grad_of_vmap_and_plain_backward_through_vmap(method):
    mul = mul_op(method)
    X, Y = rand(3, 4), rand(3, 4)
    g = grad(lambda x: vmap(mul)(x, Y).sum())(X)
    torch.testing.assert_close(g, torch.cos(X) * Y)
    Xr = X.clone().requires_grad_()
    vmap(mul)(Xr, Y).sum().backward()
    torch.testing.assert_close(Xr.grad, torch.cos(X) * Y)


def test_gradcheck_through_vmap():
    mul = mul_op("broadcast_all")
    X, Y = rand(3, 4).requires_grad_(), rand(3, 4).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: vmap(mul)(a, b), (X, Y))


# -- errors ---------------------------------------------------------------------------------


def test_unknown_vmap_method_is_refused_at_construction():
    with pytest.raises(wb.WarpBridgeError, match="vmap_method must be one of 'sequential', 'expand_dims'"):
        wb.op(K.mul64, vmap_method="fold")


def test_folding_needs_inferred_dims():
    op = wb.op(K.outer, launch_dims=(3, 4), output_dims=(3, 4), name="func_outer", vmap_method="broadcast_all")
    with pytest.raises(wb.WarpBridgeError, match="func_outer.*sets launch_dims/output_dims.*'sequential'"):
        vmap(op)(rand(2, 3), rand(2, 4))
    seq = wb.op(K.outer, launch_dims=(3, 4), output_dims=(3, 4), name="func_outer_seq")
    A, B = rand(2, 3), rand(2, 4)
    torch.testing.assert_close(vmap(seq)(A, B), A[:, :, None] * torch.exp(B)[:, None, :])


def test_folding_refuses_arguments_of_another_length():
    mul = mul_op("broadcast_all")
    with pytest.raises(wb.WarpBridgeError, match="share the first dimension of 'x' \\(5\\).*'y' has per-example"):
        vmap(mul)(rand(2, 5), rand(2, 6))


def test_expand_dims_refusals():
    mul = mul_op("expand_dims")
    with pytest.raises(wb.WarpBridgeError, match="first array argument 'x', which is not batched"):
        vmap(mul, in_dims=(None, 0))(rand(5), rand(2, 5))
    with pytest.raises(wb.WarpBridgeError, match="unbatched argument .y.*read past its end.*broadcast_all.*sequential"):
        vmap(mul, in_dims=(0, None))(rand(2, 5), rand(5))


def test_forward_mode_and_second_order_are_clear_errors():
    mul = mul_op("sequential")
    x, y = rand(4), rand(4)
    with pytest.raises(wb.WarpBridgeError, match="forward-mode.*jacrev"):
        jacfwd(mul)(x, y)
    with pytest.raises(wb.WarpBridgeError, match="second-order gradients"):
        grad(lambda x: grad(lambda x: mul(x, y).sum())(x).sum())(x)


def test_bad_input_under_vmap_is_reported_before_any_launch():
    mul = mul_op("sequential")
    with pytest.raises(wb.WarpBridgeError, match="argument 'y' has dtype float32.*expected float64|'y'.*float32"):
        vmap(mul)(rand(2, 3), torch.rand(2, 3))


# -- point ops over a batch of clouds ------------------------------------------------------


def clouds(b=3, m=24, n=40, f=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.rand(b, m, 3, generator=g, dtype=f64),
        torch.rand(b, n, 3, generator=g, dtype=f64),
        torch.randn(b, n, f, generator=g, dtype=f64),
    )


POINT_OPS = {
    "radius_aggregate": (
        lambda q, r, f: wb.ops.radius_aggregate(q, r, f, 0.35, 0.1),
        lambda q, r, f: dense_radius_aggregate(q, r, f, 0.35, 0.1),
    ),
    "knn_aggregate": (
        lambda q, r, f: wb.ops.knn_aggregate(q, r, f, 5, 0.2),
        lambda q, r, f: dense_knn_aggregate(q, r, f, 5, 0.2),
    ),
    "knn_dist": (
        lambda q, r, f: wb.ops.knn(q, r, 5)[0],
        lambda q, r, f: dense_knn(q, r, 5)[0],
    ),
}


@pytest.mark.parametrize("name", POINT_OPS)
def test_point_op_vmapped_over_a_batch_of_clouds(name):
    ours, dense = POINT_OPS[name]
    Q, R, F = clouds()
    got = vmap(ours)(Q, R, F)
    for b in range(Q.shape[0]):
        torch.testing.assert_close(got[b], dense(Q[b], R[b], F[b]))


@pytest.mark.parametrize("name", POINT_OPS)
def test_point_op_per_cloud_gradients_match_the_dense_formula(name):
    ours, dense = POINT_OPS[name]
    Q, R, F = clouds(seed=1)
    argnums = (0, 1) if name == "knn_dist" else (0, 1, 2)

    def loss(fn):
        return lambda q, r, f: (fn(q, r, f) ** 2).sum()

    got = vmap(grad(loss(ours), argnums=argnums))(Q, R, F)
    for b in range(Q.shape[0]):
        ins = [t[b].clone().requires_grad_() for t in (Q, R, F)]
        want = torch.autograd.grad(loss(dense)(*ins), [ins[i] for i in argnums])
        for g, w in zip(got, want):
            torch.testing.assert_close(g[b], w)


def test_knn_indices_under_vmap_and_jacrev_of_a_point_op():
    Q, R, F = clouds(b=2, seed=2)
    _, idx, _ = vmap(lambda q, r: wb.ops.knn(q, r, 3))(Q, R)
    for b in range(2):
        assert torch.equal(idx[b], dense_knn(Q[b], R[b], 3)[1])
    J = jacrev(lambda f: wb.ops.radius_aggregate(Q[0], R[0], f, 0.35, 0.1))(F[0])
    Jd = torch.autograd.functional.jacobian(lambda f: dense_radius_aggregate(Q[0], R[0], f, 0.35, 0.1), F[0])
    torch.testing.assert_close(J, Jd)
