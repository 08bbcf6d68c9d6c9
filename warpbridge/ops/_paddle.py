"""Paddle adapter of the point ops: one PyLayer per op around the shared runners in ``_run``.

Warp sees Paddle tensors through their data pointers only (no DLPack capsules)."""

from __future__ import annotations

from typing import Any

import paddle
import warp as wp
from paddle.autograd import PyLayer

from .._paddle import DTYPE_NAMES, _Paddle, refuse_second_order
from .._plan import ensure_init
from . import _core, _run

_VEC = {"float32": wp.vec3f, "float64": wp.vec3d}
_WP = {"float32": wp.float32, "float64": wp.float64, "int32": wp.int32, "int64": wp.int64}


def meta(x: paddle.Tensor) -> tuple[str | None, tuple[int, ...], str]:
    return DTYPE_NAMES.get(x.dtype, str(x.dtype).replace("paddle.", "")), tuple(x.shape), _Paddle.meta(x)[4]


class _Fw:
    def __init__(self, like: paddle.Tensor):
        ensure_init()
        self.place = _Paddle.meta(like)[4]
        self.dtype = DTYPE_NAMES[like.dtype]
        self.device = _Paddle.warp_device(self.place)
        self.kernels = _core.kernels_for(self.dtype, self.device)
        self.stream = None if self.place == "cpu" else wp.stream_from_paddle(self.place)

    def empty(self, shape: tuple, dtype: str) -> paddle.Tensor:
        return paddle.empty(shape, dtype=dtype).to(self.place)

    def zeros(self, shape: tuple, dtype: str) -> paddle.Tensor:
        return paddle.zeros(shape, dtype=dtype).to(self.place)

    def warp(self, a: paddle.Tensor, vec3: bool = False) -> wp.array:
        name = DTYPE_NAMES[a.dtype]
        shape = tuple(a.shape)
        if vec3:
            return wp.array(ptr=a.data_ptr(), dtype=_VEC[name], shape=shape[:-1], device=self.device)
        return wp.array(ptr=a.data_ptr(), dtype=_WP[name], shape=shape, device=self.device)

    @staticmethod
    def fold(slots: paddle.Tensor) -> paddle.Tensor:
        return slots[0] if slots.shape[0] == 1 else slots.sum(0)


def _grads(needs, grads):
    out = tuple(g if need else None for g, need in zip(grads, needs))
    return out


class _Radius(PyLayer):
    @staticmethod
    def forward(ctx, query, ref, features, radius, sigma):
        m, n, f = query.shape[0], ref.shape[0], features.shape[1]
        out, stats, *tree = _run.radius_forward(_Fw(query), query, ref, features, m, n, f, radius, sigma)
        ctx.save_for_backward(query, ref, features, out, stats, *tree)
        ctx.radius, ctx.sigma = radius, sigma
        ctx.needs = [not t.stop_gradient for t in (query, ref, features)]
        return out

    @staticmethod
    def backward(ctx, grad):
        refuse_second_order("radius_aggregate")
        query, ref, features, out, stats, *tree = ctx.saved_tensor()
        m, n, f = query.shape[0], ref.shape[0], features.shape[1]
        grads = _run.radius_backward(
            _Fw(query),
            grad.contiguous(),
            query,
            ref,
            features,
            out,
            stats,
            tree,
            m,
            n,
            f,
            ctx.radius,
            ctx.sigma,
            ctx.needs,
        )
        return _grads(ctx.needs, grads)


class _Knn(PyLayer):
    @staticmethod
    def forward(ctx, query, ref, k):
        dist, idx, _ = _run.knn_forward(_Fw(query), query, ref, query.shape[0], ref.shape[0], k)
        ctx.save_for_backward(query, ref, idx)
        ctx.needs = [not t.stop_gradient for t in (query, ref)]
        ctx.mark_non_differentiable(idx)
        return dist, idx

    @staticmethod
    def backward(ctx, grad_dist, grad_idx=None):
        refuse_second_order("knn")
        query, ref, idx = ctx.saved_tensor()
        grads = _run.knn_backward(
            _Fw(query), grad_dist.contiguous(), query, ref, idx, query.shape[0], ref.shape[0], ctx.needs
        )
        return _grads(ctx.needs, grads)


class _KnnAggregate(PyLayer):
    @staticmethod
    def forward(ctx, query, ref, features, k, sigma):
        m, n, f = query.shape[0], ref.shape[0], features.shape[1]
        dist, idx, out = _run.knn_forward(_Fw(query), query, ref, m, n, k, features, f, sigma)
        ctx.save_for_backward(query, ref, features, dist, idx, out)
        ctx.sigma = sigma
        ctx.needs = [not t.stop_gradient for t in (query, ref, features)]
        return out

    @staticmethod
    def backward(ctx, grad):
        refuse_second_order("knn_aggregate")
        query, ref, features, dist, idx, out = ctx.saved_tensor()
        m, n, f = query.shape[0], ref.shape[0], features.shape[1]
        grads = _run.knn_aggregate_backward(
            _Fw(query), grad.contiguous(), query, ref, features, dist, idx, out, m, n, f, ctx.sigma, ctx.needs
        )
        return _grads(ctx.needs, grads)


def _c(t: Any) -> Any:
    return t.contiguous()


def radius_aggregate(query, ref, features, radius, sigma):
    return _Radius.apply(_c(query), _c(ref), _c(features), radius, sigma)


def knn(query, ref, k):
    return _Knn.apply(_c(query), _c(ref), k)


def knn_aggregate(query, ref, features, k, sigma):
    return _KnnAggregate.apply(_c(query), _c(ref), _c(features), k, sigma)


def cast(x: paddle.Tensor, dtype: str) -> paddle.Tensor:
    return x.astype(dtype)
