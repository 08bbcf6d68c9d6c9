"""warpbridge.ops from JAX and Paddle: the same runners as PyTorch, checked against the dense
PyTorch reference (values and gradients), with jit for JAX."""

import numpy as np
import points_reference as ref_ops
import pytest
import torch

import warpbridge as wb
from warpbridge import WarpBridgeError

OPS = {
    "radius": (
        lambda q, r, f: wb.ops.radius_aggregate(q, r, f, 0.6, 0.2),
        lambda q, r, f: ref_ops.radius_aggregate(q, r, f, 0.6, 0.2),
    ),
    "knn_aggregate": (
        lambda q, r, f: wb.ops.knn_aggregate(q, r, f, 5, 0.2),
        lambda q, r, f: ref_ops.knn_aggregate(q, r, f, 5, 0.2),
    ),
    "knn": (lambda q, r, f: wb.ops.knn(q, r, 5)[0], lambda q, r, f: ref_ops.knn(q, r, 5)[0]),
}


def data(seed=0):
    g = np.random.default_rng(seed)
    q = g.random((40, 3)) * 2 - 1
    r = g.standard_normal((60, 3))
    f = g.standard_normal((60, 4))
    d = np.sort(np.linalg.norm(q[:, None] - r[None], axis=-1), axis=1)
    keep = (np.abs(d - 0.6).min(1) > 0.02) & (d[:, 5] - d[:, 4] > 1e-3)  # off the cut-off, no kNN ties
    return q[keep], r, f


def torch_reference(name, q, r, f, w):
    ts = [torch.tensor(a, requires_grad=True) for a in (q, r, f)]
    out = OPS[name][1](*ts)
    grads = torch.autograd.grad((out * torch.tensor(w)).sum(), ts, allow_unused=True)
    return out.detach().numpy(), [None if g is None else g.numpy() for g in grads]


@pytest.mark.parametrize("name", list(OPS))
def test_jax(name):
    jax = pytest.importorskip("jax", reason="JAX is not installed in this environment")
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    q, r, f = data()
    w = np.random.default_rng(1).standard_normal((len(q), 4 if name != "knn" else 5))
    expect, grads = torch_reference(name, q, r, f, w)
    fn = OPS[name][0]
    args = [jnp.asarray(a) for a in (q, r, f)]
    out = jax.jit(fn)(*args)
    np.testing.assert_allclose(np.asarray(out), expect, rtol=1e-10, atol=1e-12)
    got = jax.grad(lambda *a: jnp.sum(fn(*a) * w), argnums=(0, 1, 2))(*args)
    for g, e in zip(got, grads):
        np.testing.assert_allclose(
            np.asarray(g), np.zeros_like(np.asarray(g)) if e is None else e, rtol=1e-9, atol=1e-11
        )


@pytest.mark.parametrize("name", list(OPS))
def test_paddle(name):
    paddle = pytest.importorskip("paddle", reason="Paddle is not installed in this environment")
    q, r, f = data(2)
    w = np.random.default_rng(3).standard_normal((len(q), 4 if name != "knn" else 5))
    expect, grads = torch_reference(name, q, r, f, w)
    ts = []
    for a in (q, r, f):
        t = paddle.to_tensor(a)
        t.stop_gradient = False
        ts.append(t)
    out = OPS[name][0](*ts)
    np.testing.assert_allclose(out.numpy(), expect, rtol=1e-10, atol=1e-12)
    (out * paddle.to_tensor(w)).sum().backward()
    for t, e in zip(ts, grads):
        if e is None:
            assert t.grad is None or np.all(t.grad.numpy() == 0)
        else:
            np.testing.assert_allclose(t.grad.numpy(), e, rtol=1e-9, atol=1e-11)


def test_mixed_frameworks_are_refused():
    jax = pytest.importorskip("jax", reason="JAX is not installed in this environment")
    q, r, f = data()
    with pytest.raises(WarpBridgeError, match="all arrays must come from one framework, got torch and jax"):
        wb.ops.radius_aggregate(torch.tensor(q), jax.numpy.asarray(r), torch.tensor(f), 0.5, 0.1)


@pytest.mark.parametrize("framework", ["jax", "paddle"])
def test_bfloat16_in_jax_and_paddle(framework):
    """bfloat16 points and features: computed in float32, returned (and differentiated) in
    bfloat16, close to the float64 reference at bfloat16's tolerance."""
    q, r, f = data(4)
    w = np.random.default_rng(5).standard_normal((len(q), 4))
    name = "radius"
    rounded = [np.asarray(torch.tensor(a).to(torch.bfloat16).double()) for a in (q, r, f)]
    expect, grads = torch_reference(name, *rounded, w)
    fn = OPS[name][0]
    if framework == "jax":
        jax = pytest.importorskip("jax", reason="JAX is not installed in this environment")
        jnp = jax.numpy
        args = [jnp.asarray(a, dtype=jnp.bfloat16) for a in rounded]
        out = jax.jit(fn)(*args)
        got = jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32) * w), argnums=(0, 1, 2))(*args)
        out, got = np.asarray(out.astype(jnp.float32)), [(g.dtype, np.asarray(g.astype(jnp.float32))) for g in got]
        dtype_name = str(args[0].dtype)
    else:
        paddle = pytest.importorskip("paddle", reason="Paddle is not installed in this environment")
        args = []
        for a in rounded:
            t = paddle.to_tensor(a.astype(np.float32)).astype("bfloat16")
            t.stop_gradient = False
            args.append(t)
        res = fn(*args)
        (res.astype("float32") * paddle.to_tensor(w.astype(np.float32))).sum().backward()
        out = res.astype("float32").numpy()
        got = [(t.grad.dtype, t.grad.astype("float32").numpy()) for t in args]
        dtype_name = str(res.dtype)
    assert "bfloat16" in dtype_name
    np.testing.assert_allclose(out, expect, rtol=3e-2, atol=3e-2)
    for (dt, g), e in zip(got, grads):
        assert "bfloat16" in str(dt)
        scale = max(1.0, float(np.abs(e).max()))
        np.testing.assert_allclose(g / scale, e / scale, rtol=3e-2, atol=3e-2)
