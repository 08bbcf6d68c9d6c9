"""PyTorch adapter of the point ops: ``torch.ops.warpbridge.{radius_aggregate, knn,
knn_aggregate}`` and their backward ops, around the shared runners in ``_run``.

Eager calls and ``torch.compile`` go through the same registered ops: these kernels take
milliseconds, so the ~10 us of custom-op dispatch does not matter, and one path means one
set of semantics. The kd-tree built in the forward is returned as extra (index and box)
outputs and saved for the backward: plain tensors, so no Python object crosses the op
boundary and ``fullgraph=True`` traces forward and backward.
"""

from __future__ import annotations

import ctypes

import torch
import warp as wp
from torch import Tensor

from .._plan import ensure_init
from .._torch import _func
from .._torch._core import refuse_second_order as _refuse_second_order
from .._torch._core import warp_device, warp_stream
from . import _core, _run

_VEC = {torch.float32: wp.vec3f, torch.float64: wp.vec3d}
_NAME = {torch.float32: "float32", torch.float64: "float64"}
_TORCH = {"float32": torch.float32, "float64": torch.float64, "int32": torch.int32, "int64": torch.int64}


def meta(x: Tensor) -> tuple[str | None, tuple[int, ...], str]:
    return _NAME.get(x.dtype, str(x.dtype).replace("torch.", "")), tuple(x.shape), str(x.device)


class _Fw:
    """The torch description the runners allocate and convert through."""

    def __init__(self, like: Tensor):
        ensure_init()
        self.torch_device = like.device
        self.dtype = _NAME[like.dtype]
        self.device = warp_device(like.device)
        self.kernels = _core.kernels_for(self.dtype, self.device)
        self.stream = warp_stream(like.device)
        self._views: dict = {}

    def empty(self, shape: tuple, dtype: str) -> Tensor:
        return torch.empty(shape, dtype=_TORCH[dtype], device=self.torch_device)

    def zeros(self, shape: tuple, dtype: str) -> Tensor:
        t = self.empty(shape, dtype)
        if t.device.type == "cpu":
            # A single-threaded memset: torch's parallel fill would leave OpenMP threads
            # spinning on the cores our kernel threads are about to use.
            if t.numel():
                ctypes.memset(t.data_ptr(), 0, t.numel() * t.element_size())
        else:
            t.zero_()
        return t

    def warp(self, a: Tensor, vec3: bool = False) -> wp.array:
        # One view per tensor and call: the runners pass the tree's arrays to several launches.
        key = (id(a), vec3)
        entry = self._views.get(key)
        if entry is None:
            # requires_grad=False: from_torch would otherwise allocate a.grad (and sync on CUDA).
            view = wp.from_torch(a.detach(), dtype=_VEC[a.dtype] if vec3 else None, requires_grad=False)
            entry = self._views[key] = (view, a)  # the tensor is kept alive, so its id stays unique
        return entry[0]

    @staticmethod
    def fold(slots: Tensor) -> Tensor:
        return slots[0] if slots.shape[0] == 1 else slots.sum(0)  # a fixed order: deterministic


def _fake_tree(ref: Tensor) -> tuple[Tensor, ...]:
    shapes = _run.tree_shapes(ref.shape[0], _NAME[ref.dtype])
    return tuple(ref.new_empty(s, dtype=_TORCH[d]) for s, d in shapes)


def _needs_shapes(m, n, f, needs, like):
    return (
        like.new_empty((m, 3) if needs[0] else (0, 3)),
        like.new_empty((n, 3) if needs[1] else (0, 3)),
        like.new_empty((n, f) if needs[2] else (0, f)),
    )


# -- radius_aggregate -------------------------------------------------------------------------


@torch.library.custom_op("warpbridge::radius_aggregate", mutates_args=())
def radius_aggregate_op(
    query: Tensor, ref: Tensor, features: Tensor, radius: float, sigma: float
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    m, n, f = query.shape[0], ref.shape[0], features.shape[1]
    return _run.radius_forward(_Fw(query), query, ref, features, m, n, f, radius, sigma)


@radius_aggregate_op.register_fake
def _(query, ref, features, radius, sigma):
    m = query.shape[0]
    tree = _fake_tree(ref)
    return (query.new_empty((m, features.shape[1])), query.new_empty((m, _run.STATS)), *tree)


@torch.library.custom_op("warpbridge::radius_aggregate_backward", mutates_args=())
def radius_aggregate_backward_op(
    grad: Tensor,
    query: Tensor,
    ref: Tensor,
    features: Tensor,
    out: Tensor,
    stats: Tensor,
    order: Tensor,
    sorted_points: Tensor,
    lo: Tensor,
    hi: Tensor,
    min_index: Tensor,
    radius: float,
    sigma: float,
    needs: list[bool],
) -> tuple[Tensor, Tensor, Tensor]:
    m, n, f = query.shape[0], ref.shape[0], features.shape[1]
    tree = (order, sorted_points, lo, hi, min_index)
    return _run.radius_backward(
        _Fw(query), grad.contiguous(), query, ref, features, out, stats, tree, m, n, f, radius, sigma, needs
    )


@radius_aggregate_backward_op.register_fake
def _(grad, query, ref, features, out, stats, order, sorted_points, lo, hi, min_index, radius, sigma, needs):
    return _needs_shapes(query.shape[0], ref.shape[0], features.shape[1], needs, query)


def _radius_setup(ctx, inputs, output):
    query, ref, features, radius, sigma = inputs
    ctx.save_for_backward(query, ref, features, *output)
    ctx.radius, ctx.sigma = radius, sigma
    _aux_outputs(ctx, output[1:])


def _aux_outputs(ctx, aux):
    # The saved state (stats, tree, dist/idx) gets no gradient. Without this, autograd would
    # fill zero gradients for it on every backward: a parallel fill that wakes PyTorch's
    # OpenMP threads, which then spin on the cores the backward kernels are about to use.
    ctx.mark_non_differentiable(*aux)
    ctx.set_materialize_grads(False)


def _radius_backward(ctx, grad, *unused):
    _refuse_second_order("radius_aggregate")
    if grad is None:
        return None, None, None, None, None
    query, ref, features, out, stats, *tree = ctx.saved_tensors
    needs = list(ctx.needs_input_grad[:3])
    dq, dr, df = torch.ops.warpbridge.radius_aggregate_backward(
        grad, query, ref, features, out, stats, *tree, ctx.radius, ctx.sigma, needs
    )
    return (dq if needs[0] else None), (dr if needs[1] else None), (df if needs[2] else None), None, None


radius_aggregate_op.register_autograd(_radius_backward, setup_context=_radius_setup)


# -- knn --------------------------------------------------------------------------------------


@torch.library.custom_op("warpbridge::knn", mutates_args=())
def knn_op(query: Tensor, ref: Tensor, k: int) -> tuple[Tensor, Tensor]:
    return _run.knn_forward(_Fw(query), query, ref, query.shape[0], ref.shape[0], k)[:2]


@knn_op.register_fake
def _(query, ref, k):
    m = query.shape[0]
    return query.new_empty((m, k)), query.new_empty((m, k), dtype=torch.int64)


@torch.library.custom_op("warpbridge::knn_backward", mutates_args=())
def knn_backward_op(grad: Tensor, query: Tensor, ref: Tensor, idx: Tensor, needs: list[bool]) -> tuple[Tensor, Tensor]:
    return _run.knn_backward(_Fw(query), grad.contiguous(), query, ref, idx, query.shape[0], ref.shape[0], needs)


@knn_backward_op.register_fake
def _(grad, query, ref, idx, needs):
    return _needs_shapes(query.shape[0], ref.shape[0], 0, [*needs, False], query)[:2]


def _knn_setup(ctx, inputs, output):
    query, ref, _ = inputs
    ctx.save_for_backward(query, ref, output[1])
    _aux_outputs(ctx, output[1:])


def _knn_backward(ctx, grad_dist, grad_idx):
    _refuse_second_order("knn")
    if grad_dist is None:
        return None, None, None
    query, ref, idx = ctx.saved_tensors
    needs = list(ctx.needs_input_grad[:2])
    dq, dr = torch.ops.warpbridge.knn_backward(grad_dist, query, ref, idx, needs)
    return (dq if needs[0] else None), (dr if needs[1] else None), None


knn_op.register_autograd(_knn_backward, setup_context=_knn_setup)


# -- knn_aggregate ----------------------------------------------------------------------------


@torch.library.custom_op("warpbridge::knn_aggregate", mutates_args=())
def knn_aggregate_op(
    query: Tensor, ref: Tensor, features: Tensor, k: int, sigma: float
) -> tuple[Tensor, Tensor, Tensor]:
    m, n, f = query.shape[0], ref.shape[0], features.shape[1]
    dist, idx, out = _run.knn_forward(_Fw(query), query, ref, m, n, k, features, f, sigma)
    return out, dist, idx


@knn_aggregate_op.register_fake
def _(query, ref, features, k, sigma):
    m = query.shape[0]
    return (
        query.new_empty((m, features.shape[1])),
        query.new_empty((m, k)),
        query.new_empty((m, k), dtype=torch.int64),
    )


@torch.library.custom_op("warpbridge::knn_aggregate_backward", mutates_args=())
def knn_aggregate_backward_op(
    grad: Tensor,
    query: Tensor,
    ref: Tensor,
    features: Tensor,
    dist: Tensor,
    idx: Tensor,
    out: Tensor,
    sigma: float,
    needs: list[bool],
) -> tuple[Tensor, Tensor, Tensor]:
    m, n, f = query.shape[0], ref.shape[0], features.shape[1]
    return _run.knn_aggregate_backward(
        _Fw(query), grad.contiguous(), query, ref, features, dist, idx, out, m, n, f, sigma, needs
    )


@knn_aggregate_backward_op.register_fake
def _(grad, query, ref, features, dist, idx, out, sigma, needs):
    return _needs_shapes(query.shape[0], ref.shape[0], features.shape[1], needs, query)


def _knn_aggregate_setup(ctx, inputs, output):
    query, ref, features, _, sigma = inputs
    out, dist, idx = output
    ctx.save_for_backward(query, ref, features, dist, idx, out)
    ctx.sigma = sigma
    _aux_outputs(ctx, output[1:])


def _knn_aggregate_backward(ctx, grad, *unused):
    _refuse_second_order("knn_aggregate")
    if grad is None:
        return None, None, None, None, None
    query, ref, features, dist, idx, out = ctx.saved_tensors
    needs = list(ctx.needs_input_grad[:3])
    dq, dr, df = torch.ops.warpbridge.knn_aggregate_backward(
        grad, query, ref, features, dist, idx, out, ctx.sigma, needs
    )
    return (dq if needs[0] else None), (dr if needs[1] else None), (df if needs[2] else None), None, None


knn_aggregate_op.register_autograd(_knn_aggregate_backward, setup_context=_knn_aggregate_setup)


# -- torch.func (vmap over a batch of clouds, functional grad, jacrev) -----------------------
# Under a transform the calls go through ``_func`` (see its docstring); batching is
# sequential: each cloud gets its own tree, and clouds of one batch share the shapes, so the
# saved trees stack like any output.


class _PointRule(_func.Rule):
    """One point-op call: the forward op's scalars, the backward op's scalars (before
    ``needs``), and which forward outputs the backward op takes after the inputs."""

    save_outputs = True
    float_outputs = (True,) + (False,) * 8  # the first output carries gradients; the rest is state

    def __init__(self, name: str, scalars: tuple, backward_scalars: tuple, saved: tuple):
        self.name, self.scalars, self.backward_scalars, self.saved = name, scalars, backward_scalars, saved
        self.op = getattr(torch.ops.warpbridge, name)
        self.backward_op = getattr(torch.ops.warpbridge, f"{name}_backward")

    def forward(self, tensors):
        return tuple(self.op(*[t.contiguous() for t in tensors], *self.scalars))

    eager = forward  # outside transforms the custom op records its own autograd node

    def backward(self, needs, tensors, outputs, grads):
        saved = [outputs[i] for i in self.saved]
        got = self.backward_op(grads[0].contiguous(), *tensors, *saved, *self.backward_scalars, list(needs))
        return tuple(g for g, n in zip(got, needs) if n)


# -- entry points used by warpbridge.ops ---------------------------------------------------


def radius_aggregate(query: Tensor, ref: Tensor, features: Tensor, radius: float, sigma: float) -> Tensor:
    if _func.active():
        rule = _PointRule("radius_aggregate", (radius, sigma), (radius, sigma), saved=tuple(range(7)))
        return _func.apply(rule, (query, ref, features))[0]
    return radius_aggregate_op(query.contiguous(), ref.contiguous(), features.contiguous(), radius, sigma)[0]


def knn(query: Tensor, ref: Tensor, k: int) -> tuple[Tensor, Tensor]:
    if _func.active():
        return _func.apply(_PointRule("knn", (k,), (), saved=(1,)), (query, ref))
    return knn_op(query.contiguous(), ref.contiguous(), k)


def knn_aggregate(query: Tensor, ref: Tensor, features: Tensor, k: int, sigma: float) -> Tensor:
    if _func.active():
        rule = _PointRule("knn_aggregate", (k, sigma), (sigma,), saved=(1, 2, 0))  # dist, idx, out
        return _func.apply(rule, (query, ref, features))[0]
    return knn_aggregate_op(query.contiguous(), ref.contiguous(), features.contiguous(), k, sigma)[0]


def cast(x: Tensor, dtype: str) -> Tensor:
    return x.to(getattr(torch, dtype))
