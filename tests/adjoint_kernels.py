"""Kernels whose generated adjoint is right, or silently wrong (rule 7). float64 throughout."""

import warp as wp

f64 = wp.float64
LONG = wp.constant(20)  # past the default max_unroll of 16: Warp generates a dynamic loop


@wp.kernel
def pow_while(x: wp.array(dtype=f64), n: int, y: wp.array(dtype=f64)):
    i = wp.tid()
    acc = f64(1.0)
    k = int(0)
    while k < n:
        acc = acc * x[i]
        k += 1
    y[i] = acc


@wp.kernel
def pow_runtime_range(x: wp.array(dtype=f64), n: int, y: wp.array(dtype=f64)):
    i = wp.tid()
    acc = f64(1.0)
    for _k in range(n):
        acc = acc * x[i]
    y[i] = acc


@wp.kernel
def counter_used_after(x: wp.array(dtype=f64), n: int, y: wp.array(dtype=f64)):
    i = wp.tid()
    c = int(0)
    while c < n:
        c += 1
    y[i] = x[i] * f64(c)


@wp.kernel
def counter_inside_only(x: wp.array(dtype=f64), n: int, y: wp.array(dtype=f64)):
    # an integer changed by a while loop and read only inside it: the reverse loop replays it
    i = wp.tid()
    j = int(0)
    while j < n:
        y[i] += x[i] * x[i] * f64(j)
        j += 1


@wp.kernel
def sum_into_output(x: wp.array(dtype=f64), n: int, y: wp.array(dtype=f64)):
    # no loop-carried local: every iteration adds into the output
    i = wp.tid()
    for _k in range(n):
        y[i] += x[i] * x[i]


@wp.kernel
def pow_unrolled(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    i = wp.tid()
    acc = f64(1.0)
    for _k in range(3):
        acc = acc * x[i]
    y[i] = acc


@wp.kernel
def pow_long_constant(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    i = wp.tid()
    acc = f64(0.0)
    for _k in range(LONG):
        acc = acc * f64(0.5) + wp.sin(acc + x[i])
    y[i] = acc


@wp.kernel
def iterate_16(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    # 16 iterations: at the default max_unroll, so Warp unrolls them
    i = wp.tid()
    acc = f64(0.0)
    for _k in range(16):
        acc = acc * f64(0.5) + wp.sin(acc + x[i])
    y[i] = acc


@wp.kernel
def static_trip_count(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    # wp.static as the trip count (or in the body) does not make Warp unroll past max_unroll
    i = wp.tid()
    acc = f64(0.0)
    for _k in range(wp.static(20)):
        acc = acc * f64(0.5) + wp.sin(acc + x[i])
    y[i] = acc


@wp.func
def pow_func(x: f64, n: int) -> f64:
    acc = f64(1.0)
    for _k in range(n):
        acc = acc * x
    return acc


@wp.kernel
def loop_in_func(x: wp.array(dtype=f64), n: int, y: wp.array(dtype=f64)):
    i = wp.tid()
    y[i] = pow_func(x[i], n)


@wp.func
def pow_func_graded(x: f64, n: int) -> f64:
    acc = f64(1.0)
    for _k in range(n):
        acc = acc * x
    return acc


@wp.func_grad(pow_func_graded)
def adj_pow_func_graded(x: f64, n: int, adj_ret: f64):
    d = f64(0.0)
    if n > 0:
        d = f64(n) * pow_func_graded(x, n - 1)
    wp.adjoint[x] += d * adj_ret


@wp.kernel
def loop_in_graded_func(x: wp.array(dtype=f64), n: int, y: wp.array(dtype=f64)):
    i = wp.tid()
    y[i] = pow_func_graded(x[i], n)


@wp.kernel
def radius_sum(
    query: wp.array(dtype=wp.vec3d),
    ref: wp.array(dtype=wp.vec3d),
    feat: wp.array(dtype=f64),
    grid: wp.uint64,
    radius: f64,
    out: wp.array(dtype=f64),
):
    # the PhysicsNeMo tutorial's pattern: accumulators carried through a hash-grid query loop
    i = wp.tid()
    p = wp.vec3(wp.float32(query[i][0]), wp.float32(query[i][1]), wp.float32(query[i][2]))
    w_sum = f64(0.0)
    acc = f64(0.0)
    for j in wp.hash_grid_query(grid, p, wp.float32(radius)):
        d = wp.length(query[i] - ref[j])
        if d <= radius:
            w = wp.exp(-d)
            w_sum += w
            acc += w * feat[j]
    if w_sum > f64(0.0):
        out[i] = acc / w_sum


@wp.func
def bump(a: wp.array(dtype=f64), i: int):
    a[i] = a[i] + f64(1.0)


@wp.kernel
def writes_input_in_func(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    i = wp.tid()
    bump(x, i)
    y[i] = x[i]


@wp.kernel
def atomic_max_out(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    i = wp.tid()
    wp.atomic_max(y, 0, x[i] * x[i])


@wp.kernel
def atomic_min_out(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    i = wp.tid()
    wp.atomic_min(y, 0, x[i] - f64(10.0))


@wp.kernel
def mul_in_place(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    i = wp.tid()
    y[i] = x[i]
    y[i] *= x[i]


@wp.kernel
def store_then_read(x: wp.array(dtype=f64), y: wp.array(dtype=f64), z: wp.array(dtype=f64)):
    i = wp.tid()
    y[i] = x[i] * x[i]
    z[i] = wp.sin(y[i])


@wp.kernel
def component_update(x: wp.array(dtype=f64), c: wp.array(dtype=wp.vec3d)):
    i = wp.tid()
    c[i] = wp.vec3d(x[i], x[i] * x[i], f64(1.0))
    c[i][1] = c[i][1] + wp.sin(c[i][0]) * c[i][2]


@wp.kernel
def matmul(a: wp.array2d(dtype=f64), b: wp.array2d(dtype=f64), c: wp.array2d(dtype=f64)):
    # Warp's own example: the accumulator is only added to, so its stale value is never needed
    i, j = wp.tid()
    acc = f64(0.0)
    for k in range(a.shape[1]):
        acc += a[i, k] * b[k, j]
    c[i, j] = acc * f64(2.0)


@wp.kernel
def neighbour_sum(
    query: wp.array(dtype=wp.vec3d),
    ref: wp.array(dtype=wp.vec3d),
    feat: wp.array(dtype=f64),
    grid: wp.uint64,
    radius: f64,
    out: wp.array(dtype=f64),
):
    i = wp.tid()
    p = wp.vec3(wp.float32(query[i][0]), wp.float32(query[i][1]), wp.float32(query[i][2]))
    acc = f64(0.0)
    for j in wp.hash_grid_query(grid, p, wp.float32(radius)):
        d = wp.length(query[i] - ref[j])
        if d <= radius:
            acc += wp.exp(-d) * feat[j]
    out[i] = acc


@wp.kernel
def pow_runtime_range_adjoint(
    x: wp.array(dtype=f64), n: int, y: wp.array(dtype=f64), adj_y: wp.array(dtype=f64), adj_x: wp.array(dtype=f64)
):
    i = wp.tid()
    adj_x[i] = f64(n) * wp.pow(x[i], f64(n - 1)) * adj_y[i]
