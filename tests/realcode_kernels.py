"""Warp code as users write it (in-place state, scratch arrays, meshes, augmented stores), for
``tests/test_real_warp_code.py``. float64 throughout, so gradients can be checked against finite
differences."""

import warp as wp

f64 = wp.float64


@wp.kernel
def advance(x: wp.array(dtype=f64), v: wp.array(dtype=f64), dt: f64):
    i = wp.tid()
    x[i] = x[i] + v[i] * dt


@wp.kernel
def square_into(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    i = wp.tid()
    y[i] = x[i] * x[i]


@wp.kernel
def axpy_into(x: wp.array(dtype=f64), v: wp.array(dtype=f64), a: f64, y: wp.array(dtype=f64)):
    i = wp.tid()
    y[i] = x[i] + a * v[i]


def step_in_place(x: wp.array(dtype=f64), v: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """Updates its input ``x`` in place (Warp's examples' style), then squares it."""
    wp.launch(advance, dim=x.shape[0], inputs=[x, v, f64(0.3)])
    wp.launch(square_into, dim=x.shape[0], inputs=[x, y])


def step_on_a_clone(x: wp.array(dtype=f64), v: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """The same step on a copy of ``x``: the caller's memory is never written."""
    x = wp.clone(x)
    wp.launch(advance, dim=x.shape[0], inputs=[x, v, f64(0.3)])
    wp.launch(square_into, dim=x.shape[0], inputs=[x, y])


def via_plain_zeros(x: wp.array(dtype=f64), v: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """A scratch array made without requires_grad between the inputs and the output."""
    s = wp.zeros(x.shape[0], dtype=f64, device=x.device)
    wp.launch(axpy_into, dim=x.shape[0], inputs=[x, v, f64(2.0), s])
    wp.launch(square_into, dim=x.shape[0], inputs=[s, y])


def via_empty_view(x: wp.array(dtype=f64), v: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """A scratch array made with wp.empty, written through one view and read through another."""
    n = x.shape[0]
    s = wp.empty(2 * n, dtype=f64, device=x.device)
    wp.launch(axpy_into, dim=n, inputs=[x, v, f64(2.0), s[n:]])
    wp.launch(square_into, dim=n, inputs=[s.reshape((2, n))[1], y])


def via_zeros_like(x: wp.array(dtype=f64), v: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """``wp.zeros_like(x)``: it requires grad only when ``x`` does."""
    s = wp.zeros_like(x)
    wp.launch(axpy_into, dim=x.shape[0], inputs=[x, v, f64(0.1), s])
    wp.launch(square_into, dim=x.shape[0], inputs=[s, y])


# -- augmented stores that read the output they update ---------------------------------------


@wp.kernel
def iadd_reads_output(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    i = wp.tid()
    y[i] = x[i]
    for _k in range(3):
        y[i] += f64(0.5) * y[i] * x[i]


@wp.kernel
def isub_reads_output(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    i = wp.tid()
    y[i] = x[i]
    y[i] -= wp.cos(y[i])


@wp.kernel
def component_iadd_reads_output(x: wp.array(dtype=wp.vec2d), y: wp.array(dtype=wp.vec2d)):
    i = wp.tid()
    y[i] = x[i]
    y[i][0] += y[i][0] * y[i][1]


@wp.kernel
def iadd_linear_in_output(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    # additive in y[i] (a constant factor): the adjoint never needs y's value
    i = wp.tid()
    y[i] = x[i] * x[i]
    y[i] += f64(2.0) * y[i] + x[i]


@wp.kernel
def iadd_accumulates(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    i = wp.tid()
    for k in range(3):
        y[i] += x[i] * f64(k + 1)


# -- a hash-grid density: a loop accumulator times a runtime scalar ---------------------------


@wp.kernel
def density_times_scalar(
    grid: wp.uint64, pts: wp.array(dtype=wp.vec3d), mass: wp.array(dtype=f64), c: f64, rho: wp.array(dtype=f64)
):
    # Warp's sph example's compute_density shape: acc summed in the query loop, then acc * c
    i = wp.tid()
    p = pts[i]
    acc = f64(0.0)
    for j in wp.hash_grid_query(grid, wp.vec3(p), 0.5):
        acc += mass[j] * wp.exp(-wp.length(pts[j] - p))
    rho[i] = acc * c


@wp.kernel
def density_times_array(
    grid: wp.uint64,
    pts: wp.array(dtype=wp.vec3d),
    mass: wp.array(dtype=f64),
    c: wp.array(dtype=f64),
    rho: wp.array(dtype=f64),
):
    # the same, but the factor is a differentiable array: its adjoint needs the stale acc
    i = wp.tid()
    p = pts[i]
    acc = f64(0.0)
    for j in wp.hash_grid_query(grid, wp.vec3(p), 0.5):
        acc += mass[j] * wp.exp(-wp.length(pts[j] - p))
    rho[i] = acc * c[i]


@wp.kernel
def scale_into(x: wp.array(dtype=f64), c: f64, y: wp.array(dtype=f64)):
    i = wp.tid()
    y[i] = x[i] * c


def _grid(pts: wp.array(dtype=wp.vec3d)) -> wp.HashGrid:
    grid = wp.HashGrid(8, 8, 8, device=pts.device)
    grid.build(wp.array(pts.numpy().astype("float32"), dtype=wp.vec3, device=pts.device), 0.5)
    return grid


def density_scaled(pts: wp.array(dtype=wp.vec3d), mass: wp.array(dtype=f64), rho: wp.array(dtype=f64)):
    grid = _grid(pts)
    wp.launch(density_times_scalar, dim=pts.shape[0], inputs=[grid.id, pts, mass, f64(2.0), rho])


def density_then_scale(
    pts: wp.array(dtype=wp.vec3d), mass: wp.array(dtype=f64), c: wp.array(dtype=f64), rho: wp.array(dtype=f64)
):
    """Two kernels: the refused one (``density_times_array``) and a harmless one."""
    grid = _grid(pts)
    tmp = wp.zeros(pts.shape[0], dtype=f64, device=pts.device, requires_grad=True)
    wp.launch(density_times_array, dim=pts.shape[0], inputs=[grid.id, pts, mass, c, tmp])
    wp.launch(scale_into, dim=pts.shape[0], inputs=[tmp, f64(3.0), rho])


# -- a mesh built from a differentiable input inside a launch function -----------------------


@wp.kernel
def closest_distance(mesh: wp.uint64, q: wp.array(dtype=wp.vec3), d: wp.array(dtype=float)):
    i = wp.tid()
    hit = wp.mesh_query_point_no_sign(mesh, q[i], 10.0)
    if hit.result:
        d[i] = wp.length(wp.mesh_eval_position(mesh, hit.face, hit.u, hit.v) - q[i])


def distance_to_mesh(
    verts: wp.array(dtype=wp.vec3),
    faces: wp.array(dtype=wp.int32),
    q: wp.array(dtype=wp.vec3),
    d: wp.array(dtype=float),
):
    mesh = wp.Mesh(points=verts, indices=faces)
    wp.launch(closest_distance, dim=q.shape[0], inputs=[mesh.id, q, d])


# -- a Warp-style loss of shape (1,) ---------------------------------------------------------


@wp.kernel
def sum_squares(x: wp.array(dtype=f64), loss: wp.array(dtype=f64)):
    i = wp.tid()
    wp.atomic_add(loss, 0, x[i] * x[i])


def loss_function(x: wp.array(dtype=f64), loss: wp.array(dtype=f64)):
    wp.launch(sum_squares, dim=x.shape[0], inputs=[x, loss])


# -- launch functions whose runs are counted and whose scratch arrays are watched ------------

CALLS: list = []
SCRATCH: list = []


def counted_scaled_square(x: wp.array2d(dtype=f64), y: wp.array2d(dtype=f64)):
    """y = (2 x)^2 through a scratch array; records each run and a weak reference to its scratch."""
    import weakref

    CALLS.append(1)
    s = wp.empty(x.shape, dtype=f64, device=x.device)
    SCRATCH.append(weakref.ref(s))
    wp.launch(double_2d, dim=x.shape, inputs=[x, s])
    wp.launch(square_2d, dim=x.shape, inputs=[s, y])


@wp.kernel
def double_2d(x: wp.array2d(dtype=f64), y: wp.array2d(dtype=f64)):
    i, j = wp.tid()
    y[i, j] = f64(2.0) * x[i, j]


@wp.kernel
def square_2d(x: wp.array2d(dtype=f64), y: wp.array2d(dtype=f64)):
    i, j = wp.tid()
    y[i, j] = x[i, j] * x[i, j]


# -- outputs anywhere, state updated in place (outputs= / in_out=) ---------------------------


@wp.kernel
def kick_drift(x: wp.array(dtype=wp.vec3d), v: wp.array(dtype=wp.vec3d), f: wp.array(dtype=wp.vec3d), dt: f64):
    # Warp's examples' integrator style: both states updated in place, each element read first
    i = wp.tid()
    v_new = v[i] + f[i] * dt - f64(0.1) * v[i] * wp.length(v[i]) * dt
    x[i] = x[i] + v_new * dt
    v[i] = v_new


@wp.kernel
def reads_after_store(x: wp.array(dtype=f64), c: f64):
    i = wp.tid()
    x[i] = x[i] * c
    x[i] = x[i] * x[i]


@wp.kernel
def output_in_the_middle(x: wp.array(dtype=f64), y: wp.array(dtype=f64), a: f64):
    i = wp.tid()
    y[i] = a * wp.sin(x[i])


# -- index arrays ---------------------------------------------------------------------------


@wp.kernel
def gather_rows(idx: wp.array(dtype=wp.int64), x: wp.array2d(dtype=f64), y: wp.array(dtype=f64)):
    i = wp.tid()
    y[i] = x[idx[i], 1]


@wp.kernel
def scatter_through_local(v: wp.array(dtype=f64), idx: wp.array(dtype=wp.int32), out: wp.array(dtype=f64)):
    i = wp.tid()
    j = idx[i]
    wp.atomic_add(out, j, v[i])


@wp.func
def row_value(x: wp.array2d(dtype=f64), row: int) -> f64:
    return x[row, 1]


@wp.func
def gather_through(rows: wp.array(dtype=wp.int64), x: wp.array2d(dtype=f64), i: int) -> f64:
    return x[rows[i], 0]


@wp.kernel
def gather_through_funcs(idx: wp.array(dtype=wp.int64), x: wp.array2d(dtype=f64), y: wp.array(dtype=f64)):
    # the index reaches x inside @wp.funcs: as a value, and as the array itself
    i = wp.tid()
    y[i] = row_value(x, int(idx[i])) + gather_through(idx, x, i)


# -- scalars of every kind ------------------------------------------------------------------


@wp.kernel
def scalar_sum(
    x: wp.array(dtype=f64), v: wp.vec3i, s: wp.float32, h: wp.float16, b: wp.bfloat16, y: wp.array(dtype=f64)
):
    i = wp.tid()
    y[i] = x[i] + f64(v[0]) + f64(v[1]) + f64(v[2]) + f64(s) + f64(h) + f64(b)


# -- views of the arguments: slices, reshapes, copies, raw pointers ----------------------------


def square_a_slice(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """Squares all of ``x`` but its first element, through a slice."""
    wp.launch(square_into, dim=y.shape[0], inputs=[x[1:], y])


def square_a_row(x: wp.array2d(dtype=f64), y: wp.array(dtype=f64)):
    """Squares row 1 of ``x`` (a view: strided when ``x`` is a transposed tensor)."""
    wp.launch(square_into, dim=y.shape[0], inputs=[x[1], y])


def square_flattened(x: wp.array2d(dtype=f64), y: wp.array(dtype=f64)):
    wp.launch(square_into, dim=y.shape[0], inputs=[x.flatten(), y])


def square_into_a_reshaped_output(x: wp.array(dtype=f64), y: wp.array2d(dtype=f64)):
    """Writes its 2-D output through a 1-D view of it."""
    wp.launch(square_into, dim=x.shape[0], inputs=[x, y.reshape((x.shape[0],))])


def square_a_clone_of_a_slice(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    s = wp.clone(x[1:])
    wp.launch(square_into, dim=y.shape[0], inputs=[s, y])


def square_through_a_pointer(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """Squares ``x`` through an array made over its pointer (no grad, no parent)."""
    v = wp.array(ptr=x.ptr, dtype=f64, shape=x.shape, device=x.device)
    wp.launch(square_into, dim=y.shape[0], inputs=[v, y])


def pointer_over_two_inputs(x: wp.array(dtype=f64), z: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """``x`` and ``z`` may be one memory: a raw-pointer view of it belongs to neither."""
    v = wp.array(ptr=z.ptr, dtype=f64, shape=z.shape, device=z.device)
    wp.launch(axpy_into, dim=y.shape[0], inputs=[x, v, f64(1.0), y])


# -- copies Warp's tape leaves off: into or out of arrays without a gradient -------------------


def copy_into_plain_zeros(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    s = wp.zeros(x.shape[0], dtype=f64, device=x.device)
    wp.copy(s, x)
    wp.launch(square_into, dim=y.shape[0], inputs=[s, y])


def assign_into_empty(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    s = wp.empty(x.shape[0], dtype=f64, device=x.device)
    s.assign(x)
    wp.launch(square_into, dim=y.shape[0], inputs=[s, y])


def clone_without_grad(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    s = wp.clone(x[1:], requires_grad=False)
    wp.launch(square_into, dim=y.shape[0], inputs=[s, y])


def copy_out_of_plain_zeros(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    s = wp.zeros(x.shape[0], dtype=f64, device=x.device)
    wp.launch(square_into, dim=x.shape[0], inputs=[x, s])
    wp.copy(y, s)


def copy_with_gradients(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """The same copies between arrays that have gradients: recorded, right."""
    s = wp.zeros(x.shape[0], dtype=f64, device=x.device, requires_grad=True)
    wp.copy(s, x)
    t = wp.zeros_like(s)
    wp.launch(square_into, dim=x.shape[0], inputs=[s, t])
    wp.copy(y, t)


def zero_forces_and_a_table(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """Read-only arrays without gradients that are no copies: zero forces, a constant table."""
    forces = wp.zeros(x.shape[0], dtype=f64, device=x.device)
    table = wp.full(x.shape[0], f64(0.25), dtype=f64, device=x.device)
    s = wp.zeros(x.shape[0], dtype=f64, device=x.device)
    wp.launch(axpy_into, dim=x.shape[0], inputs=[x, forces, f64(3.0), s])
    wp.launch(axpy_into, dim=x.shape[0], inputs=[s, table, f64(2.0), y])


def total_by_array_sum(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """The loss reduced with ``wp.utils.array_sum``: a native call Warp's tape never sees."""
    s = wp.zeros(x.shape[0], dtype=f64, device=x.device)
    wp.launch(square_into, dim=x.shape[0], inputs=[x, s])
    wp.utils.array_sum(s, out=y)


def squares_and_ones(x: wp.array(dtype=f64), y: wp.array(dtype=f64), ones: wp.array(dtype=f64)):
    """A second output filled with a constant outside the tape."""
    wp.launch(square_into, dim=x.shape[0], inputs=[x, y])
    ones.fill_(f64(1.0))


@wp.kernel
def square_gathered(x: wp.indexedarray(dtype=f64), y: wp.array(dtype=f64)):
    i = wp.tid()
    y[i] = x[i] * x[i]


def square_through_an_indexedarray(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    picked = wp.array([0, 2], dtype=wp.int32, device=x.device)
    wp.launch(square_gathered, dim=2, inputs=[wp.indexedarray(x, [picked]), y])


# -- structs: their array fields copy the gradient pointers when set ---------------------------


@wp.struct
class Pair:
    x: wp.array(dtype=f64)
    s: wp.array(dtype=f64)


@wp.kernel
def triple_into_scratch(p: Pair):
    i = wp.tid()
    p.s[i] = f64(3.0) * p.x[i]


@wp.kernel
def square_scratch(p: Pair, y: wp.array(dtype=f64)):
    i = wp.tid()
    y[i] = p.s[i] * p.s[i]


@wp.struct
class Outer:
    pair: Pair
    t: wp.array(dtype=f64)


@wp.kernel
def add_nested(o: Outer, y: wp.array(dtype=f64)):
    i = wp.tid()
    y[i] = o.t[i] * o.pair.x[i] + o.pair.s[i]


def through_a_nested_struct(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """An input and scratch arrays held by a struct inside a struct."""
    p = Pair()
    p.x = x
    p.s = wp.zeros(x.shape[0], dtype=f64, device=x.device)
    o = Outer()
    o.pair = p
    o.t = wp.zeros(x.shape[0], dtype=f64, device=x.device)
    wp.launch(triple_into_scratch, dim=x.shape[0], inputs=[p])
    wp.launch(square_into, dim=x.shape[0], inputs=[x, o.t])
    wp.launch(add_nested, dim=x.shape[0], inputs=[o, y])


def through_a_struct(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """An input, its slice and a scratch array without requires_grad, all held by a struct."""
    p = Pair()
    p.x = x[1:]
    p.s = wp.zeros(x.shape[0] - 1, dtype=f64, device=x.device)
    wp.launch(triple_into_scratch, dim=y.shape[0], inputs=[p])
    wp.launch(square_scratch, dim=y.shape[0], inputs=[p, y])


@wp.kernel
def scale_by_table(x: wp.array(dtype=f64), table: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    i = wp.tid()
    y[i] = x[i] * table[(i * 7) % table.shape[0]]


TABLE = 4096


def scaled_by_a_large_table(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """A read-only table without a gradient, larger than every other array: no copy of one."""
    table = wp.full(TABLE, f64(1.0), dtype=f64, device=x.device)
    wp.launch(scale_by_table, dim=x.shape[0], inputs=[x, table, y])


# -- arrays filled outside the tape ----------------------------------------------------------


@wp.kernel
def double_into(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    i = wp.tid()
    y[i] = f64(2.0) * x[i]


def scaled_by_an_array_sum(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """y = x * sum(x), the sum by ``wp.utils.array_sum`` into an array made with
    requires_grad: a native call Warp's tape never sees, so the sum's gradient is lost."""
    s = wp.zeros(1, dtype=f64, device=x.device, requires_grad=True)
    wp.utils.array_sum(x, out=s)
    wp.launch(scale_by_table, dim=x.shape[0], inputs=[x, s, y])


def doubled_off_the_tape(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """A launch the user keeps off the tape (``record_tape=False``) on the gradient's path."""
    t = wp.zeros_like(x)  # requires_grad as x has it
    wp.launch(double_into, dim=x.shape[0], inputs=[x], outputs=[t], record_tape=False)
    wp.launch(square_into, dim=x.shape[0], inputs=[t, y])


def copied_from_plain_scratch(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """A copy into an array with a gradient from scratch without one: Warp records no copy
    unless both have gradients."""
    s = wp.zeros(x.shape[0], dtype=f64, device=x.device)
    wp.launch(square_into, dim=x.shape[0], inputs=[x, s])
    t = wp.zeros(x.shape[0], dtype=f64, device=x.device, requires_grad=True)
    wp.copy(t, s)
    wp.launch(double_into, dim=x.shape[0], inputs=[t], outputs=[y])


def scaled_by_constants(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """Constants filled outside the tape, made without requires_grad: right, no alarm."""
    w = wp.full(x.shape[0], f64(3.0), dtype=f64, device=x.device)
    wp.launch(scale_by_table, dim=x.shape[0], inputs=[x, w, y])


def scaled_by_constants_with_grad(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """The same constants made with requires_grad: nothing tells them from values of x."""
    w = wp.full(x.shape[0], f64(3.0), dtype=f64, device=x.device, requires_grad=True)
    wp.launch(scale_by_table, dim=x.shape[0], inputs=[x, w, y])


def offset_by_an_array_sum(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """y = x * sum(x) + 1, the sum by ``wp.utils.array_sum`` into an array made without
    requires_grad: its values hold no copy of another array, and they change with x."""
    s = wp.zeros(1, dtype=f64, device=x.device)
    wp.utils.array_sum(x, out=s)
    wp.launch(scale_by_table, dim=x.shape[0], inputs=[x, s, y])
    wp.launch(add_one, dim=y.shape[0], inputs=[y])


@wp.kernel
def add_one(y: wp.array(dtype=f64)):
    i = wp.tid()
    y[i] = y[i] + f64(1.0)


# -- a function with a gradient of its own ---------------------------------------------------


@wp.kernel
def cubic_energy(x: wp.array(dtype=f64), e: wp.array(dtype=f64)):
    i = wp.tid()
    wp.atomic_add(e, 0, x[i] * x[i] * x[i])


def forces_from_an_energy(x: wp.array(dtype=f64), f: wp.array(dtype=f64)):
    """f = dE/dx = 3 x^2, from the energy's adjoint under a wp.Tape of the function's own."""
    xs = wp.clone(x, requires_grad=True)
    e = wp.zeros(1, dtype=f64, device=x.device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        wp.launch(cubic_energy, dim=x.shape[0], inputs=[xs], outputs=[e])
    tape.backward(e)
    wp.copy(f, xs.grad)


# -- numbers computed on the host ------------------------------------------------------------


def normalized_by_a_host_max(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """y = x / max(x), the max read on the host: a Python number the tape knows nothing of."""
    c = 1.0 / float(x.numpy().max())
    wp.launch(scale_into, dim=x.shape[0], inputs=[x, c, y])


def halved_until_small(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """y = x / 2^n, n the halvings until max(y) < 1, checked on the host: how many launches
    run depends on x, every number they take is a constant."""
    t = wp.clone(x, requires_grad=True)
    while float(t.numpy().max()) >= 1.0:
        half = wp.zeros_like(t)
        wp.launch(scale_into, dim=x.shape[0], inputs=[t, 0.5, half])
        t = half
    wp.copy(y, t)


def jittered_on_the_host(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """y = x * (1 + noise), the noise drawn on the host at every call: it changes between two
    runs on the same inputs, so it is no value of the inputs."""
    import numpy as np

    noise = wp.array(1.0 + 0.01 * np.random.default_rng().standard_normal(x.shape[0]), dtype=f64, device=x.device)
    wp.launch(scale_by_table, dim=x.shape[0], inputs=[x, noise, y])


def only_for_x0_equal_to_one(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    """Raises for any first value but 1 (read on the host), and passes a constant number."""
    if float(x.numpy()[0]) != 1.0:
        raise ValueError("x[0] must be 1")
    wp.launch(scale_into, dim=x.shape[0], inputs=[x, 2.0, y])


# -- random numbers drawn in a launch function -----------------------------------------------------

DRAWS = [0]  # a host counter, as training code seeds its noise


@wp.kernel
def noisy_square(x: wp.array(dtype=f64), seed: int, y: wp.array(dtype=f64)):
    i = wp.tid()
    state = wp.rand_init(seed, i)
    y[i] = x[i] * x[i] * (f64(1.0) + f64(wp.randf(state)))


def noise_from_a_counter(x: wp.array(dtype=f64), y: wp.array(dtype=f64)):
    DRAWS[0] += 1
    wp.launch(noisy_square, dim=x.shape, inputs=[x, DRAWS[0]], outputs=[y])


def noise_from_a_seed(x: wp.array(dtype=f64), seed: int, y: wp.array(dtype=f64)):
    wp.launch(noisy_square, dim=x.shape, inputs=[x, seed], outputs=[y])
