"""Row arithmetic of the searches and their backwards: feature rows over the feature dim F,
and the reference points' gradient rows.

Unrolled by 4 by hand: a loop with a run-time bound is not unrolled by the CPU compiler and
measured ~2x slower here. Where ``Rows.v4`` is not empty, the rows go 4 at a time.
"""

from __future__ import annotations

import warp as wp

from .dtypes import V4, Grads, Rows, T, V
from .geometry import norm, unit_of
from .template import func


@func
def row_axpy(y: wp.array2d(dtype=T), i: int, a: T, x: wp.array2d(dtype=T), j: int, n: int):
    for f4 in range(n // 4):
        f = f4 * 4
        y[i, f] = y[i, f] + a * x[j, f]
        y[i, f + 1] = y[i, f + 1] + a * x[j, f + 1]
        y[i, f + 2] = y[i, f + 2] + a * x[j, f + 2]
        y[i, f + 3] = y[i, f + 3] + a * x[j, f + 3]
    for f in range(n - n % 4, n):
        y[i, f] = y[i, f] + a * x[j, f]


@func
def atomic_axpy(y: wp.array2d(dtype=T), j: int, a: T, x: wp.array2d(dtype=T), i: int):
    # y[j] += a x[i], atomically per element (queries on CUDA share rows of y)
    for f in range(x.shape[1]):
        wp.atomic_add(y, j, f, a * x[i, f])


@func
def atomic_axpy4(y: wp.array2d(dtype=V4), j: int, a: T, x: wp.array2d(dtype=V4), i: int):
    # the same over rows seen as groups of 4
    for f in range(x.shape[1]):
        wp.atomic_add(y, j, f, a * x[i, f])


@func
def row_scale(y: wp.array2d(dtype=T), i: int, a: T, n: int):
    for f in range(n):
        y[i, f] = y[i, f] * a


@func
def row_dot(x: wp.array2d(dtype=T), i: int, y: wp.array2d(dtype=T), j: int, n: int) -> T:
    a0 = T(0.0)
    a1 = T(0.0)
    a2 = T(0.0)
    a3 = T(0.0)
    for f4 in range(n // 4):
        f = f4 * 4
        a0 += x[i, f] * y[j, f]
        a1 += x[i, f + 1] * y[j, f + 1]
        a2 += x[i, f + 2] * y[j, f + 2]
        a3 += x[i, f + 3] * y[j, f + 3]
    for f in range(n - n % 4, n):
        a0 += x[i, f] * y[j, f]
    return (a0 + a1) + (a2 + a3)


@func
def dot4(x: wp.array2d(dtype=V4), i: int, y: wp.array2d(dtype=V4), j: int) -> T:
    # x[i] . y[j] over rows seen as groups of 4
    acc = T(0.0)
    for f in range(x.shape[1]):
        acc += wp.dot(x[i, f], y[j, f])
    return acc


@func
def feature_dot(grad: Rows, i: int, features: Rows, j: int) -> T:
    # grad[i] . features[j], 4 at a time where the groups of 4 are there
    acc = T(0.0)
    if grad.v4.shape[1] > 0:
        acc = dot4(grad.v4, i, features.v4, j)
    else:
        acc = row_dot(grad.v, i, features.v, j, grad.v.shape[1])
    return acc


@func
def add_feature_row(p: T, i: int, j: int, slot: int, atomic: int, grad: Rows, grads: Grads):
    # Row j of the features' gradient += p grad[i]: the gradient itself (slot 0) or thread
    # slot's copy; 4 at a time where the groups of 4 are there; with atomics where other
    # threads may add to the same row (CUDA), else the unrolled row_axpy.
    if grad.v4.shape[1] > 0:
        if slot == 0:
            atomic_axpy4(grads.d_features4, j, p, grad.v4, i)
        else:
            atomic_axpy4(grads.feature_slots4[slot - 1], j, p, grad.v4, i)
    elif atomic != 0:
        if slot == 0:
            atomic_axpy(grads.d_features, j, p, grad.v, i)
        else:
            atomic_axpy(grads.feature_slots[slot - 1], j, p, grad.v, i)
    elif slot == 0:
        row_axpy(grads.d_features, j, p, grad.v, i, grad.v.shape[1])
    else:
        row_axpy(grads.feature_slots[slot - 1], j, p, grad.v, i, grad.v.shape[1])


@func
def sub_from_ref(grads: Grads, slot: int, j: int, v: V):
    # dL/dr_j -= v: into the gradient itself (slot 0) or thread slot's copy; atomically, since
    # queries on other CUDA threads may share reference j.
    if slot == 0:
        wp.atomic_sub(grads.d_ref, j, v)
    else:
        wp.atomic_sub(grads.ref_slots, slot - 1, j, v)


@func
def pull_on_distance(grads: Grads, needs_ref: bool, slot: int, q: V, r: V, j: int, g: T) -> V:
    # The gradient g of the distance |q - r_j| w.r.t. q, returned: (diff / d) g, 0 where they
    # coincide; its opposite goes into r_j's gradient where asked (see sub_from_ref). The unit
    # vector first: g / d overflows where d is tiny or subnormal (an aggregation's g carries a
    # 1 / sigma of the same scale), though the gradient itself fits.
    diff = q - r
    d = norm(diff)
    v = V(T(0.0))
    if d > T(0.0):
        v = unit_of(diff, d) * g
        if needs_ref:
            sub_from_ref(grads, slot, j, v)
    return v
