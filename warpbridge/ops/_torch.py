"""PyTorch adapter of the point ops: ``torch.ops.warpbridge.{radius_aggregate, knn,
knn_aggregate}`` and their backward ops.

Eager calls and ``torch.compile`` go through the same registered ops: these kernels take
milliseconds, so the ~10 us of custom-op dispatch does not matter, and one path means one
set of semantics. The grid built in the forward is returned as extra (integer and geometry)
outputs and saved for the backward: plain tensors, so no Python object crosses the op
boundary and ``fullgraph=True`` traces forward and backward.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch
import warp as wp
from torch import Tensor

from .._plan import ensure_init
from .._torch._core import warp_device, warp_stream
from . import _core

_VEC = {torch.float32: wp.vec3f, torch.float64: wp.vec3d}
_NAME = {torch.float32: "float32", torch.float64: "float64"}
RADIUS_CELLS_PER_POINT = 8
KNN_CELLS_PER_POINT = 2


def meta(x: Tensor) -> tuple[str | None, tuple[int, ...], str]:
    return _NAME.get(x.dtype, str(x.dtype).replace("torch.", "")), tuple(x.shape), str(x.device)


def _w(t: Tensor, dtype: Any = None) -> wp.array:
    # requires_grad=False: from_torch would otherwise allocate t.grad (and sync on CUDA).
    return wp.from_torch(t.detach(), dtype=dtype, requires_grad=False)


def _zeros(shape: tuple, like: Tensor) -> Tensor:
    t = like.new_empty(shape)
    if t.device.type == "cpu":
        # A single-threaded memset: torch's parallel fill would leave OpenMP threads spinning
        # on the cores our kernel threads are about to use.
        if t.numel():
            ctypes.memset(t.data_ptr(), 0, t.numel() * t.element_size())
    else:
        t.zero_()
    return t


def _env(t: Tensor) -> tuple[Any, Any, Any]:
    ensure_init()
    return _core.kernels_for(_NAME[t.dtype]), warp_device(t.device), warp_stream(t.device)


# -- the grid -------------------------------------------------------------------------------


def _grid(ref: Tensor, min_cell: float, cells_per_point: int) -> tuple[Tensor, ...]:
    k, device, stream = _env(ref)
    n = ref.shape[0]
    cap = _core.grid_capacity(n, cells_per_point)
    dev = ref.device
    i32 = dict(dtype=torch.int32, device=dev)
    order = torch.empty(n, **i32)
    sorted_points = torch.empty_like(ref)
    starts = torch.empty(cap + 2, **i32)
    geom = torch.empty(4, dtype=ref.dtype, device=dev)
    dims = torch.empty(3, **i32)
    lohi = torch.empty(2, 3, dtype=ref.dtype, device=dev)
    lohi[0] = float("inf")
    lohi[1] = float("-inf")
    cell_of = torch.empty(n, **i32)
    counts = _zeros((cap + 2,), order)
    cursor = torch.empty(cap + 2, **i32)
    v = _VEC[ref.dtype]
    _core.build_grid(
        k,
        _w(ref, v),
        min_cell,
        (_w(lohi, v), _w(cell_of), _w(counts), _w(cursor)),
        (_w(order), _w(sorted_points, v), _w(starts), _w(geom), _w(dims)),
        device,
        stream,
    )
    return order, sorted_points, starts, geom, dims


def _fake_grid(ref: Tensor, cells_per_point: int) -> tuple[Tensor, ...]:
    n = ref.shape[0]
    return (
        ref.new_empty(n, dtype=torch.int32),
        torch.empty_like(ref),
        ref.new_empty(_core.grid_capacity(n, cells_per_point) + 2, dtype=torch.int32),
        ref.new_empty(4),
        ref.new_empty(3, dtype=torch.int32),
    )


def _grads_out(m: int, n: int, f: int, like: Tensor, needs: list[bool], device: Any) -> tuple:
    """Zeroed gradient buffers (an empty tensor stands for one not needed) and slot count."""
    s = _core.slots(device, m)
    dq = _zeros((m, 3) if needs[0] else (0, 3), like)
    dr = _zeros((s, n, 3) if needs[1] else (1, 0, 3), like)
    df = _zeros((s, n, f) if len(needs) > 2 and needs[2] else (1, 0, f), like)
    return s, dq, dr, df


def _fold(slots: Tensor) -> Tensor:
    """Sum the per-thread scatter slots in a fixed order (deterministic)."""
    return slots[0] if slots.shape[0] == 1 else slots.sum(0)


# -- radius_aggregate -------------------------------------------------------------------------


@torch.library.custom_op("warpbridge::radius_aggregate", mutates_args=())
def radius_aggregate_op(
    query: Tensor, ref: Tensor, features: Tensor, radius: float, sigma: float
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    k, device, stream = _env(query)
    grid = _grid(ref, radius, RADIUS_CELLS_PER_POINT)
    m, f = query.shape[0], features.shape[1]
    out = query.new_empty((m, f))
    stats = query.new_empty((m, 2))
    order, sorted_points, starts, geom, dims = grid
    v = _VEC[query.dtype]
    before = [
        _w(query, v),
        _w(features),
        _w(order),
        _w(sorted_points, v),
        _w(starts),
        _w(geom),
        _w(dims),
        radius,
        sigma,
    ]
    _core.launch_queries(k.radius_forward, m, _core.slots(device, m), before, [_w(out), _w(stats)], device, stream)
    return (out, stats, *grid)


@radius_aggregate_op.register_fake
def _(query, ref, features, radius, sigma):
    m = query.shape[0]
    return (query.new_empty((m, features.shape[1])), query.new_empty((m, 2)), *_fake_grid(ref, RADIUS_CELLS_PER_POINT))


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
    starts: Tensor,
    geom: Tensor,
    dims: Tensor,
    radius: float,
    sigma: float,
    needs: list[bool],
) -> tuple[Tensor, Tensor, Tensor]:
    k, device, stream = _env(query)
    m, n, f = query.shape[0], features.shape[0], features.shape[1]
    v = _VEC[query.dtype]
    dq = query.new_empty((m, 3) if needs[0] else (0, 3))
    dr = query.new_empty((n, 3) if needs[1] else (0, 3))
    df = query.new_empty((n, f) if needs[2] else (0, f))
    if not any(needs):
        return dq, dr, df
    grad = grad.contiguous()
    g_out = query.new_empty(m)
    before = [_w(query, v), _w(features), _w(order), _w(sorted_points, v), _w(starts), _w(geom), _w(dims)]
    before += [radius, sigma, _w(out), _w(stats), _w(grad), int(needs[0])]
    slots = _core.slots(device, m)
    _core.launch_queries(k.radius_backward_query, m, slots, before, [_w(g_out), _w(dq, v)], device, stream)
    if needs[1] or needs[2]:
        # The reference side gathers over the queries within the radius: a grid over them.
        qgrid = _grid(query, radius, RADIUS_CELLS_PER_POINT)
        before = [_w(ref, v), _w(features), _w(qgrid[0]), _w(qgrid[1], v), *(_w(t) for t in qgrid[2:])]
        before += [radius, sigma, _w(stats), _w(grad), _w(g_out), int(needs[1]), int(needs[2])]
        slots = _core.slots(device, n)
        _core.launch_queries(k.radius_backward_ref, n, slots, before, [_w(dr, v), _w(df)], device, stream)
    return dq, dr, df


@radius_aggregate_backward_op.register_fake
def _(grad, query, ref, features, out, stats, order, sorted_points, starts, geom, dims, radius, sigma, needs):
    m, n, f = query.shape[0], features.shape[0], features.shape[1]
    return (
        query.new_empty((m, 3) if needs[0] else (0, 3)),
        query.new_empty((n, 3) if needs[1] else (0, 3)),
        query.new_empty((n, f) if needs[2] else (0, f)),
    )


def _radius_setup(ctx, inputs, output):
    query, ref, features, radius, sigma = inputs
    ctx.save_for_backward(query, ref, features, *output)
    ctx.radius, ctx.sigma = radius, sigma


def _radius_backward(ctx, grad, *unused):
    query, ref, features, out, stats, *grid = ctx.saved_tensors
    needs = list(ctx.needs_input_grad[:3])
    dq, dr, df = torch.ops.warpbridge.radius_aggregate_backward(
        grad, query, ref, features, out, stats, *grid, ctx.radius, ctx.sigma, needs
    )
    return (dq if needs[0] else None), (dr if needs[1] else None), (df if needs[2] else None), None, None


radius_aggregate_op.register_autograd(_radius_backward, setup_context=_radius_setup)


# -- knn --------------------------------------------------------------------------------------


def _knn_search(
    query: Tensor, ref: Tensor, k_: int, features: Tensor | None = None, sigma: float = 1.0
) -> tuple[Tensor, Tensor, Tensor]:
    k, device, stream = _env(query)
    order, sorted_points, starts, geom, dims = _grid(ref, 0.0, KNN_CELLS_PER_POINT)
    m = query.shape[0]
    dist = query.new_empty((m, k_))
    idx = torch.empty((m, k_), dtype=torch.int64, device=query.device)
    if features is None:  # no aggregation: empty stand-ins
        features, out = query.new_empty((0, 0)), query.new_empty((0, 0))
    else:
        out = query.new_empty((m, features.shape[1]))
    v = _VEC[query.dtype]
    before = [_w(query, v), _w(order), _w(sorted_points, v), _w(starts), _w(geom), _w(dims), k_, _w(features), sigma]
    after = [_w(dist), _w(idx), _w(out)]
    _core.launch_queries(k.knn_search, m, _core.slots(device, m), before, after, device, stream)
    return dist, idx, out


@torch.library.custom_op("warpbridge::knn", mutates_args=())
def knn_op(query: Tensor, ref: Tensor, k: int) -> tuple[Tensor, Tensor]:
    return _knn_search(query, ref, k)[:2]


@knn_op.register_fake
def _(query, ref, k):
    m = query.shape[0]
    return query.new_empty((m, k)), query.new_empty((m, k), dtype=torch.int64)


@torch.library.custom_op("warpbridge::knn_backward", mutates_args=())
def knn_backward_op(grad: Tensor, query: Tensor, ref: Tensor, idx: Tensor, needs: list[bool]) -> tuple[Tensor, Tensor]:
    k, device, stream = _env(query)
    m, n = query.shape[0], ref.shape[0]
    s, dq, dr, _ = _grads_out(m, n, 0, query, needs, device)
    v = _VEC[query.dtype]
    before = [_w(query, v), _w(ref, v), _w(idx), _w(grad.contiguous()), int(needs[0]), int(needs[1])]
    if any(needs):
        _core.launch_queries(k.knn_backward, m, s, before, [_w(dq, v), _w(dr, v)], device, stream, scatter=True)
    return dq, _fold(dr)


@knn_backward_op.register_fake
def _(grad, query, ref, idx, needs):
    return query.new_empty((query.shape[0], 3) if needs[0] else (0, 3)), ref.new_empty(
        (ref.shape[0], 3) if needs[1] else (0, 3)
    )


def _knn_setup(ctx, inputs, output):
    query, ref, _ = inputs
    ctx.save_for_backward(query, ref, output[1])


def _knn_backward(ctx, grad_dist, grad_idx):
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
    dist, idx, out = _knn_search(query, ref, k, features, sigma)
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
    kern, device, stream = _env(query)
    m, n, f = query.shape[0], ref.shape[0], features.shape[1]
    s, dq, dr, df = _grads_out(m, n, f, query, needs, device)
    v = _VEC[query.dtype]
    before = [_w(query, v), _w(ref, v), _w(features), _w(dist), _w(idx), sigma, _w(out), _w(grad.contiguous())]
    before += [int(needs[0]), int(needs[1]), int(needs[2])]
    if any(needs):
        _core.launch_queries(
            kern.knn_aggregate_backward, m, s, before, [_w(dq, v), _w(dr, v), _w(df)], device, stream, scatter=True
        )
    return dq, _fold(dr), _fold(df)


@knn_aggregate_backward_op.register_fake
def _(grad, query, ref, features, dist, idx, out, sigma, needs):
    m, n, f = query.shape[0], ref.shape[0], features.shape[1]
    return (
        query.new_empty((m, 3) if needs[0] else (0, 3)),
        query.new_empty((n, 3) if needs[1] else (0, 3)),
        query.new_empty((n, f) if needs[2] else (0, f)),
    )


def _knn_aggregate_setup(ctx, inputs, output):
    query, ref, features, _, sigma = inputs
    out, dist, idx = output
    ctx.save_for_backward(query, ref, features, dist, idx, out)
    ctx.sigma = sigma


def _knn_aggregate_backward(ctx, grad, *unused):
    query, ref, features, dist, idx, out = ctx.saved_tensors
    needs = list(ctx.needs_input_grad[:3])
    dq, dr, df = torch.ops.warpbridge.knn_aggregate_backward(
        grad, query, ref, features, dist, idx, out, ctx.sigma, needs
    )
    return (dq if needs[0] else None), (dr if needs[1] else None), (df if needs[2] else None), None, None


knn_aggregate_op.register_autograd(_knn_aggregate_backward, setup_context=_knn_aggregate_setup)


# -- entry points used by warpbridge.ops ---------------------------------------------------


def radius_aggregate(query: Tensor, ref: Tensor, features: Tensor, radius: float, sigma: float) -> Tensor:
    return radius_aggregate_op(query.contiguous(), ref.contiguous(), features.contiguous(), radius, sigma)[0]


def knn(query: Tensor, ref: Tensor, k: int) -> tuple[Tensor, Tensor]:
    return knn_op(query.contiguous(), ref.contiguous(), k)


def knn_aggregate(query: Tensor, ref: Tensor, features: Tensor, k: int, sigma: float) -> Tensor:
    return knn_aggregate_op(query.contiguous(), ref.contiguous(), features.contiguous(), k, sigma)[0]
