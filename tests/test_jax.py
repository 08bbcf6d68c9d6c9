"""The same WarpOp from JAX: values against the PyTorch path, gradients against finite
differences (jax.test_util.check_grads, float64), jit, vmap, shard_map, bad input."""

import os
import subprocess
import sys
import textwrap

import kernels as K
import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed in this environment")
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import warpbridge as wb  # noqa: E402
from warpbridge import WarpBridgeError  # noqa: E402

jax.config.update("jax_enable_x64", True)


def rng(seed=0):
    return np.random.default_rng(seed)


def test_forward_matches_torch_and_returns_jax_arrays():
    op = wb.op(K.mul64)
    x, y = rng().standard_normal(7), rng(1).standard_normal(7)
    out = op(jnp.asarray(x), jnp.asarray(y))
    assert isinstance(out, jax.Array) and out.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(out), op(torch.tensor(x), torch.tensor(y)).numpy())


def test_grad_of_a_kernel_and_jit():
    op = wb.op(K.mul64)
    x, y = jnp.asarray(rng().standard_normal(6)), jnp.asarray(rng(1).standard_normal(6))
    check_grads(op, (x, y), order=1, modes=["rev"])
    f = lambda a, b: jnp.sum(op(a, b) ** 2)
    gx, gy = jax.jit(jax.grad(f, argnums=(0, 1)))(x, y)
    z = jnp.sin(x) * y
    np.testing.assert_allclose(gx, 2 * z * jnp.cos(x) * y, rtol=1e-12)
    np.testing.assert_allclose(gy, 2 * z * jnp.sin(x), rtol=1e-12)


def test_vector_matrix_arrays_multiple_outputs_and_scalars():
    op = wb.op(K.vec_mat, num_outputs=2)
    v = jnp.asarray(rng().standard_normal((5, 3)))
    m = jnp.asarray(rng(1).standard_normal((5, 3, 3)))
    out_v, out_n = op(v, m, 1.5)
    assert out_v.shape == (5, 3) and out_n.shape == (5,)
    tv, tn = op(torch.tensor(np.asarray(v)), torch.tensor(np.asarray(m)), 1.5)
    np.testing.assert_allclose(out_v, tv.numpy(), rtol=1e-12)
    np.testing.assert_allclose(out_n, tn.numpy(), rtol=1e-12)
    check_grads(lambda a, b: op(a, b, 1.5), (v, m), order=1, modes=["rev"])


def test_output_dims_with_gradients_past_warps_limit():
    # wp.jax_kernel(enable_backward=True) refuses output_dims; warpbridge supports both.
    op = wb.op(K.outer, launch_dims=(3, 4), output_dims=(3, 4))
    a, b = jnp.asarray(rng().standard_normal(3)), jnp.asarray(rng(1).standard_normal(4))
    np.testing.assert_allclose(op(a, b), np.outer(a, np.exp(b)), rtol=1e-12)
    check_grads(op, (a, b), order=1, modes=["rev"])


def test_multi_kernel_function_with_gradients():
    op = wb.op(K.exp_times)
    x, k = jnp.asarray(rng().standard_normal(5)), jnp.asarray(rng(1).standard_normal(5))
    np.testing.assert_allclose(op(x, k), np.exp(x) * k, rtol=1e-12)
    check_grads(op, (x, k), order=1, modes=["rev"])
    g1 = jax.grad(lambda a: jnp.sum(op(a, k)))(x)
    g2 = jax.grad(lambda a: jnp.sum(op(a, k)))(x)  # stateless: the same every time
    np.testing.assert_array_equal(g1, g2)


def test_zeroed_outputs_accumulating_kernel_and_integer_inputs():
    loss = wb.op(K.sum_squares, output_dims=(1,), launch_dims=(10,))
    xs = jnp.asarray(rng().standard_normal((10, 2)))
    np.testing.assert_allclose(loss(xs)[0], np.sum(np.asarray(xs) ** 2), rtol=1e-12)
    np.testing.assert_allclose(jax.grad(lambda a: loss(a)[0])(xs), 2 * xs, rtol=1e-12)
    scatter = wb.op(K.scatter_add, launch_dims=(6, 2), output_dims=(3, 2))
    x = jnp.asarray(rng(2).standard_normal((6, 2)))
    idx = jnp.asarray([0, 2, 2, 1, 0, 2], dtype=jnp.int64)
    w = jnp.asarray(rng(3).standard_normal(6))
    # check_grads perturbs with NumPy arrays; one call takes one framework's arrays
    check_grads(lambda a, b: scatter(jnp.asarray(a), idx, jnp.asarray(b)), (x, w), order=1, modes=["rev"])


def test_a_kernel_that_reads_its_output():
    op = wb.op(K.reads_output)
    x = jnp.asarray(rng().standard_normal(5))
    check_grads(op, (x,), order=1, modes=["rev"])


def test_vmap_runs_one_launch_per_element():
    op = wb.op(K.mul64)
    x = jnp.asarray(rng().standard_normal((3, 4)))
    y = jnp.asarray(rng(1).standard_normal((3, 4)))
    np.testing.assert_allclose(jax.vmap(op)(x, y), np.sin(x) * y, rtol=1e-12)
    g = jax.grad(lambda a: jnp.sum(jax.vmap(op)(a, y)))(x)
    np.testing.assert_allclose(g, np.cos(x) * y, rtol=1e-12)


def test_vmap_broadcast_all_folds_the_batch_into_one_launch():
    import warp as wp

    calls = []

    def exp_times(x: wp.array(dtype=wp.float64), k: wp.array(dtype=wp.float64), z: wp.array(dtype=wp.float64)):
        calls.append(tuple(x.shape))
        K.exp_times(x, k, z)

    fold = wb.op(exp_times, name="jax_exp_times_fold", vmap_method="broadcast_all")
    mul = wb.op(K.mul64, name="jax_mul_fold", vmap_method="broadcast_all")
    x, y = jnp.asarray(rng().random((4, 5))), jnp.asarray(rng(1).random((4, 5)))
    np.testing.assert_allclose(jax.jit(jax.vmap(fold))(x, y), np.exp(x) * y, rtol=1e-12)
    assert calls == [(20,)]  # one launch function call for the whole batch
    calls.clear()
    g = jax.vmap(jax.grad(lambda a, b: jnp.sum(fold(a, b)), argnums=(0, 1)))(x, y)
    np.testing.assert_allclose(g[0], np.exp(x) * y, rtol=1e-12)
    np.testing.assert_allclose(g[1], np.exp(x), rtol=1e-12)
    assert calls == [(20,), (20,)]  # forward, and the backward's re-run under a tape
    # a kernel, with an argument shared by the batch (expanded, so read per thread)
    gy = jax.vmap(jax.grad(lambda a, b: jnp.sum(mul(a, b)), argnums=1), in_axes=(0, None))(x, y[0])
    np.testing.assert_allclose(gy, np.sin(x), rtol=1e-12)
    np.testing.assert_allclose(jax.vmap(mul, in_axes=(0, None))(x, y[0]), np.sin(x) * y[0], rtol=1e-12)


def test_bad_input():
    op = wb.op(K.scale_shift)
    x = jnp.ones(3)
    with pytest.raises(WarpBridgeError, match="scalar argument 's' is a traced JAX value.*static_argnums"):
        jax.jit(lambda s: op(x, s, 1, False))(2.0)
    with pytest.raises(WarpBridgeError, match="all arrays must come from one framework"):
        wb.op(K.mul64)(x, np.ones(3))
    with pytest.raises(WarpBridgeError, match="must have dtype float64, got float32"):
        wb.op(K.mul64)(jnp.ones(3, dtype=jnp.float32), jnp.ones(3, dtype=jnp.float32))
    with pytest.raises(WarpBridgeError, match="must be 1-D"):
        wb.op(K.mul64)(jnp.ones((3, 2)), jnp.ones((3, 2)))
    no_adj = wb.op(K.no_adjoint)
    with pytest.raises(WarpBridgeError, match="enable_backward=False"):
        jax.grad(lambda a: jnp.sum(no_adj(a)))(jnp.ones(3, dtype=jnp.float32))


SHARD_MAP = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    from jax.sharding import Mesh, PartitionSpec as P
    import kernels as K, warpbridge as wb
    assert len(jax.devices()) == 2, jax.devices()
    op = wb.op(K.mul64)
    mesh = Mesh(np.array(jax.devices()), ("x",))
    shard_map = getattr(jax, "shard_map", None) or __import__("jax.experimental.shard_map", fromlist=["x"]).shard_map
    f = shard_map(lambda a, b: op(a, b), mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x"))
    x = jnp.arange(8.0); y = jnp.arange(8.0) + 1
    out = jax.jit(f)(x, y)
    np.testing.assert_allclose(out, np.sin(x) * y, rtol=1e-12)
    assert len(out.sharding.device_set) == 2
    g = jax.grad(lambda a: jnp.sum(f(a, y)))(x)
    np.testing.assert_allclose(g, np.cos(x) * y, rtol=1e-12)
    print("shard_map ok")
    """
)


def test_shard_map_across_two_host_devices():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    code = SHARD_MAP.format(tests=os.path.dirname(__file__))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "shard_map ok" in p.stdout


def test_arrays_shorter_than_the_launch_are_refused():
    op = wb.op(K.mul64)
    with pytest.raises(wb.WarpBridgeError, match=r"argument 'y' has shape \(2,\)"):
        op(jnp.ones(5, jnp.float64), jnp.ones(2, jnp.float64))


def test_generic_kernel_and_its_generic_backward_under_jit_and_grad():
    import backward_kernels as B

    op = wb.op(B.generic_cube, backward=B.generic_cube_adjoint)
    x = jnp.asarray(np.linspace(0.5, 1.5, 5), dtype=jnp.float32)
    np.testing.assert_allclose(np.asarray(jax.jit(op)(x)), np.asarray(x) ** 3, rtol=1e-6)
    g = jax.grad(lambda v: jnp.sum(op(v)))(x)
    np.testing.assert_allclose(np.asarray(g), 3 * np.asarray(x) ** 2, rtol=1e-6)
    v = jax.jit(wb.op(B.generic_scale), static_argnums=1)(jnp.ones((3, 3), jnp.float32), 2.0)  # vec3f
    np.testing.assert_array_equal(np.asarray(v), np.full((3, 3), 2.0, np.float32))


def test_indexedarray_input_with_values_and_indices_and_its_backward():
    import backward_kernels as B

    op = wb.op(B.indexed_square, backward=B.indexed_square_adjoint)
    v = jnp.asarray(np.linspace(0.5, 1.5, 6))
    idx = jnp.asarray([5, 0, 2, 2], dtype=jnp.int32)
    np.testing.assert_allclose(np.asarray(op((v, idx))), np.asarray(v[idx]) ** 2)
    g = jax.grad(lambda a: jnp.sum(op((a, idx))))(v)
    expect = np.zeros(6)
    np.add.at(expect, np.asarray(idx), 2 * np.asarray(v[idx]))
    np.testing.assert_allclose(np.asarray(g), expect)


def test_in_out_and_outputs_anywhere_match_torch():
    import realcode_kernels as R

    op = wb.op(R.kick_drift, in_out=("x", "v"))
    x0, v0, f0 = (rng(s).random((5, 3)) for s in (1, 2, 3))

    def loss(x, v, f):
        x1, v1 = op(x, v, f, 0.01)
        return (x1 * x1).sum() + v1.sum()

    ts = [torch.tensor(a, requires_grad=True) for a in (x0, v0, f0)]
    loss(*ts).backward()
    js = [jnp.asarray(a) for a in (x0, v0, f0)]
    for grads in (jax.grad(loss, argnums=(0, 1, 2))(*js), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*js)):
        for g, t in zip(grads, ts):
            np.testing.assert_allclose(np.asarray(g), t.grad.numpy(), rtol=1e-10)
    check_grads(lambda x, v: op(jnp.asarray(x), jnp.asarray(v), js[2], 0.01), (js[0], js[1]), order=1, modes=["rev"])
    mid = wb.op(R.output_in_the_middle, outputs=("y",))
    check_grads(lambda x: mid(x, 2.0), (js[0][:, 0],), order=1, modes=["rev"])


def test_a_jitted_step_validates_its_callbacks_once(monkeypatch):
    """The arguments are validated when the call is traced; the callbacks, which see the same
    layouts on every run, prepare each layout once, and later runs launch straight away."""
    from warpbridge._core import validate

    op = wb.op(K.mul64)  # z = sin(x) * y
    step = jax.jit(jax.grad(lambda a, b: jnp.sum(op(a, b) ** 2)))

    def expected(x, y):
        return 2 * np.sin(x) * np.cos(x) * y**2

    y = rng(1).standard_normal(6)
    x0 = rng().standard_normal(6)
    np.testing.assert_allclose(np.asarray(step(jnp.asarray(x0), jnp.asarray(y))), expected(x0, y))
    calls = []
    real = validate.validate
    monkeypatch.setattr(validate, "validate", lambda *a, **k: calls.append(a[0].name) or real(*a, **k))
    for seed in range(3):
        x = rng(seed + 5).standard_normal(6)
        np.testing.assert_allclose(np.asarray(step(jnp.asarray(x), jnp.asarray(y))), expected(x, y))
    assert calls == []


def test_neighbour_lists_eagerly_with_gradients_and_refused_under_jit():
    g = np.random.default_rng(0)
    q, r = g.normal(size=(200, 3)), g.normal(size=(300, 3))

    def loss(q, r):
        d = wb.ops.radius(q, r, 0.5).distance
        return (d * jnp.linspace(-1.0, 1.0, d.shape[0])).sum()

    nb = wb.ops.radius(jnp.asarray(q), jnp.asarray(r), 0.5)
    qt, rt = torch.tensor(q, requires_grad=True), torch.tensor(r, requires_grad=True)
    nt = wb.ops.radius(qt, rt, 0.5)
    np.testing.assert_array_equal(np.asarray(nb.index), nt.index.numpy())
    np.testing.assert_array_equal(np.asarray(nb.ptr), nt.ptr.numpy())
    w = torch.linspace(-1.0, 1.0, nt.distance.shape[0], dtype=torch.float64)
    (nt.distance * w).sum().backward()
    gq, gr = jax.grad(loss, argnums=(0, 1))(jnp.asarray(q), jnp.asarray(r))
    np.testing.assert_allclose(np.asarray(gq), qt.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(gr), rt.grad.numpy(), rtol=1e-12, atol=1e-12)
    with pytest.raises(WarpBridgeError, match="depends on the data and cannot be read while tracing"):
        jax.jit(loss)(jnp.asarray(q), jnp.asarray(r))
    with pytest.raises(WarpBridgeError, match=r"knn_graph\(\): .*tracing \(a fixed-size graph: knn\(x, x, k \+ 1\)"):
        jax.jit(lambda x: wb.ops.knn_graph(x, 3))(jnp.asarray(r))  # how many edges depends on the data
    dist, idx, count = jax.jit(lambda x: wb.ops.knn(x, x, 4))(jnp.asarray(r))  # the fixed-size form
    ours = wb.ops.knn(torch.tensor(r), torch.tensor(r), 4)
    for got, want in zip((dist, idx, count), ours):
        np.testing.assert_array_equal(np.asarray(got), want.numpy())


def test_ragged_batches_under_jit_and_grad_have_torchs_values_and_gradients():
    g = np.random.default_rng(1)
    q, r, f = g.normal(size=(120, 3)), g.normal(size=(200, 3)), g.normal(size=(200, 4))
    qb, rb = np.repeat([0, 1, 3], [50, 30, 40]), np.repeat([0, 1, 2, 3], [60, 70, 20, 50])
    w = np.linspace(-1, 1, 120 * 4).reshape(120, 4)

    def loss(q, r, f, qb, rb):
        out = wb.ops.radius_aggregate(q, r, f, 0.9, 0.3, query_batch=qb, ref_batch=rb)
        return (out * w).sum()

    args = [jnp.asarray(a) for a in (q, r, f, qb, rb)]
    value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(*args)
    qt, rt, ft = (torch.tensor(a, requires_grad=True) for a in (q, r, f))
    ot = wb.ops.radius_aggregate(qt, rt, ft, 0.9, 0.3, query_batch=torch.tensor(qb), ref_batch=torch.tensor(rb))
    lt = (ot * torch.tensor(w)).sum()
    lt.backward()
    np.testing.assert_allclose(float(value), float(lt), rtol=1e-12)
    for ours, theirs in zip(grads, (qt, rt, ft)):
        np.testing.assert_allclose(np.asarray(ours), theirs.grad.numpy(), rtol=1e-12, atol=1e-12)
    knn = jax.jit(lambda x, b: wb.ops.knn(x, x, 3, query_batch=b, ref_batch=b))(args[1], args[4])
    ours = wb.ops.knn(rt, rt, 3, query_batch=torch.tensor(rb), ref_batch=torch.tensor(rb))
    for got, want in zip(knn, ours):
        np.testing.assert_array_equal(np.asarray(got), want.detach().numpy())


def test_what_the_tape_cannot_follow_is_refused_under_jax_too():
    # a launch function's kernels are known only when it runs: the refusal comes out of the
    # backward's callback as JAX's runtime error, carrying warpbridge's message
    import realcode_kernels as R

    x = jnp.asarray([1.0, 4.0, 2.0])
    host_max, array_sum = wb.op(R.normalized_by_a_host_max), wb.op(R.offset_by_an_array_sum)
    np.testing.assert_allclose(np.asarray(host_max(x)), np.asarray(x) / 4.0)
    with pytest.raises(jax.errors.JaxRuntimeError, match="WarpBridgeError: .*a number for 'c' that changes with"):
        jax.grad(lambda a: jnp.sum(host_max(a)))(x)
    with pytest.raises(jax.errors.JaxRuntimeError, match="WarpBridgeError: .*whose values change with the inputs"):
        jax.grad(lambda a: jnp.sum(array_sum(a)))(x)
