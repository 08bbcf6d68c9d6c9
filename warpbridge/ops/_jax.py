"""JAX adapter of the point ops: ``jax.custom_vjp`` functions whose forward and backward are
``wp.jax_callable``s running the shared runners in ``_run`` (Warp's own FFI; jit, grad and
vmap work; radius, sigma and k are static)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
import warp as wp

from .._jax import _annotated
from .._plan import ensure_init
from . import _core, _run

_WP = {"float32": wp.float32, "float64": wp.float64, "int32": wp.int32, "int64": wp.int64}
_VEC = {"float32": wp.vec3f, "float64": wp.vec3d}


def meta(x: Any) -> tuple[str | None, tuple[int, ...], str]:
    dev = "cpu"
    if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
        dev = str(next(iter(x.devices())).platform)
    return np.dtype(x.dtype).name, tuple(int(s) for s in x.shape), dev


class _Fw:
    """Runs inside a jax_callable: arrays are Warp arrays; scratch comes from Warp."""

    max_slots = 1  # no scatter slots to fold inside the callback

    def __init__(self, device: Any, dtype: str):
        self.device, self.dtype = device, dtype
        self.kernels = _core.kernels_for(dtype, device)
        self.stream = None if device.is_cpu else device.stream

    def empty(self, shape, dtype):
        return wp.empty(shape, dtype=_WP[dtype], device=self.device)

    def zeros(self, shape, dtype):
        return wp.zeros(shape, dtype=_WP[dtype], device=self.device)

    def warp(self, a: wp.array, vec3: bool = False) -> wp.array:
        if not vec3:
            return a
        return wp.array(ptr=a.ptr, dtype=_VEC[self.dtype], shape=a.shape[:-1], device=self.device)

    @staticmethod
    def fold(slots: wp.array) -> wp.array:
        return slots[0]


def _copy_out(outs: list, results: tuple) -> None:
    for dst, src in zip(outs, results):
        if dst.size:
            wp.copy(dst, src)


def _callable(fn, inputs, outputs):
    """jax_callable over ``fn(*warp_inputs) -> results`` that copies results into its outputs."""
    names_in = [n for n, _ in inputs]

    def run(*arrays):
        ins, outs = arrays[: len(names_in)], list(arrays[len(names_in) :])
        _copy_out(outs, fn(*ins))

    params = inputs + [(n, t) for n, t, _ in outputs]
    return wp.jax_callable(
        _annotated(run, params),
        num_outputs=len(outputs),
        vmap_method="sequential",
        output_dims={n: s for n, _, s in outputs},
    )


def _arr(dtype: str, ndim: int) -> Any:
    return wp.array(dtype=_WP[dtype], ndim=ndim)


@functools.cache
def _radius(m: int, n: int, f: int, dtype: str, radius: float, sigma: float) -> Any:
    A2, I1 = _arr(dtype, 2), _arr("int32", 1)
    gshapes = _run.tree_shapes(n, dtype)
    gnames = ["order", "sorted_points", "lo", "hi", "min_index"]
    gtypes = [I1, A2, A2, A2, I1]

    def forward(q, r, feats):
        fw = _Fw(q.device, dtype)
        return _run.radius_forward(fw, q, r, feats, m, n, f, radius, sigma)

    fwd = _callable(
        forward,
        [("query", A2), ("ref", A2), ("features", A2)],
        [("out", A2, (m, f)), ("stats", A2, (m, _run.STATS))]
        + [(nm, t, s) for nm, t, (s, _) in zip(gnames, gtypes, gshapes)],
    )

    def backward(grad, q, r, feats, out, stats, *tree):
        fw = _Fw(q.device, dtype)
        return _run.radius_backward(fw, grad, q, r, feats, out, stats, tree, m, n, f, radius, sigma, [True] * 3)

    bwd = _callable(
        backward,
        [("grad", A2), ("query", A2), ("ref", A2), ("features", A2), ("out", A2), ("stats", A2)]
        + list(zip(gnames, gtypes)),
        [("d_query", A2, (m, 3)), ("d_ref", A2, (n, 3)), ("d_features", A2, (n, f))],
    )

    @jax.custom_vjp
    def op(q, r, feats):
        return fwd(q, r, feats)[0]

    def op_fwd(q, r, feats):
        res = fwd(q, r, feats)
        return res[0], (q, r, feats, *res)

    def op_bwd(saved, g):
        q, r, feats, out, stats, *tree = saved
        return tuple(bwd(g, q, r, feats, out, stats, *tree))

    op.defvjp(op_fwd, op_bwd)
    return op


@functools.cache
def _knn(m: int, n: int, f: int, dtype: str, k: int, sigma: float, aggregate: bool) -> Any:
    A2, I64 = _arr(dtype, 2), _arr("int64", 2)

    def forward(q, r, *feats):
        fw = _Fw(q.device, dtype)
        dist, idx, out = _run.knn_forward(fw, q, r, m, n, k, feats[0] if feats else None, f, sigma)
        return (out, dist, idx) if aggregate else (dist, idx)

    ins = [("query", A2), ("ref", A2)] + ([("features", A2)] if aggregate else [])
    outs = [("dist", A2, (m, k)), ("idx", I64, (m, k))]
    fwd = _callable(forward, ins, ([("out", A2, (m, f))] if aggregate else []) + outs)

    if aggregate:

        def backward(grad, q, r, feats, dist, idx, out):
            fw = _Fw(q.device, dtype)
            return _run.knn_aggregate_backward(fw, grad, q, r, feats, dist, idx, out, m, n, f, sigma, [True] * 3)

        bwd = _callable(
            backward,
            [("grad", A2), ("query", A2), ("ref", A2), ("features", A2), ("dist", A2), ("idx", I64), ("out", A2)],
            [("d_query", A2, (m, 3)), ("d_ref", A2, (n, 3)), ("d_features", A2, (n, f))],
        )

        @jax.custom_vjp
        def op(q, r, feats):
            return fwd(q, r, feats)[0]

        def op_fwd(q, r, feats):
            out, dist, idx = fwd(q, r, feats)
            return out, (q, r, feats, dist, idx, out)

        def op_bwd(saved, g):
            q, r, feats, dist, idx, out = saved
            return tuple(bwd(g, q, r, feats, dist, idx, out))

    else:

        def backward(grad, q, r, idx):
            fw = _Fw(q.device, dtype)
            return _run.knn_backward(fw, grad, q, r, idx, m, n, [True, True])

        bwd = _callable(
            backward,
            [("grad", A2), ("query", A2), ("ref", A2), ("idx", I64)],
            [("d_query", A2, (m, 3)), ("d_ref", A2, (n, 3))],
        )

        @jax.custom_vjp
        def op(q, r):
            dist, idx = fwd(q, r)
            return dist, jax.lax.stop_gradient(idx)

        def op_fwd(q, r):
            dist, idx = fwd(q, r)
            return (dist, idx), (q, r, idx)

        def op_bwd(saved, g):
            q, r, idx = saved
            return tuple(bwd(g[0], q, r, idx))

    op.defvjp(op_fwd, op_bwd)
    return op


def _dt(x: Any) -> str:
    return np.dtype(x.dtype).name


def radius_aggregate(query, ref, features, radius, sigma):
    ensure_init()
    m, n, f = query.shape[0], ref.shape[0], features.shape[1]
    return _radius(m, n, f, _dt(query), radius, sigma)(query, ref, features)


def knn(query, ref, k):
    ensure_init()
    return _knn(query.shape[0], ref.shape[0], 0, _dt(query), k, 1.0, False)(query, ref)


def knn_aggregate(query, ref, features, k, sigma):
    ensure_init()
    m, n, f = query.shape[0], ref.shape[0], features.shape[1]
    return _knn(m, n, f, _dt(query), k, sigma, True)(query, ref, features)


def cast(x: Any, dtype: str) -> Any:
    return x.astype(dtype)
