"""torch.library registration and torch.compile (10-20 s per inductor graph on the CPU:
the inductor tests are few; the rest use cheaper backends)."""

import kernels as K
import pytest
import torch
from torch._dynamo.testing import CompileCounter

import warpbridge as wb

f64 = torch.float64


def rand(*shape, grad=True):
    return torch.randn(*shape, dtype=f64, requires_grad=grad)


@pytest.mark.parametrize(
    "make, args",
    [
        (lambda: wb.op(K.mul64), lambda: (rand(5), rand(5))),
        (lambda: wb.op(K.vec_mat, num_outputs=2), lambda: (rand(4, 3), rand(4, 3, 3), 0.5)),
        (lambda: wb.op(K.scatter_add), lambda: (rand(5, 2), torch.tensor([0, 1, 1, 2, 0]), rand(5))),
        (lambda: wb.op(K.exp_times), lambda: (rand(5), rand(5))),
        (lambda: wb.op(K.reads_output), lambda: (rand(5),)),
    ],
    ids=["scalars", "vec_mat_two_outputs", "int_index", "function", "reads_output"],
)
def test_opcheck_forward(make, args):
    op = make()
    torch.library.opcheck(op.torch_op, args())


def test_opcheck_backward_op_and_gradcheck_through_the_registered_op():
    op = wb.op(K.vec_mat, num_outputs=2)
    v, m = rand(4, 3), rand(4, 3, 3)
    assert torch.autograd.gradcheck(lambda v, m: op.torch_op(v, m, 0.7), (v, m))
    bwd = getattr(torch.ops.warpbridge, op.torch_op._qualified_op_name.split("::")[1] + "_backward")
    grads = [torch.randn(4, 3, dtype=f64), torch.randn(4, dtype=f64)]
    torch.library.opcheck(bwd, (v.detach(), m.detach(), 0.7, None, None, None, grads, [True, True]))


def test_registered_op_accepts_dims_like_the_op():
    op = wb.op(K.scatter_add)
    x, idx, w = rand(5, 2), torch.tensor([0, 1, 1, 2, 0]), rand(5)
    eager = op(x, idx, w, output_dims=(3, 2))
    registered = op.torch_op(x, idx, w, None, [3, 2])
    torch.testing.assert_close(eager, registered)
    torch.library.opcheck(op.torch_op, (x, idx, w, None, [3, 2]))


def test_registered_op_enforces_enable_backward_false():
    op = wb.op(K.no_adjoint)
    y = op.torch_op(torch.ones(3, requires_grad=True))
    with pytest.raises(wb.WarpBridgeError, match=r"no_adjoint\(\).*enable_backward=False"):
        y.sum().backward()


@pytest.mark.compile
def test_compile_fullgraph_inductor_forward_and_backward():
    op = wb.op(K.vec_mat, num_outputs=2)

    def loss(v, m):
        a, b = op(v, m, 2.0)
        return (a.sin().sum() + (b * b).sum()) / 3

    v, m = rand(8, 3), rand(8, 3, 3)
    ref = loss(v, m)
    gv, gm = torch.autograd.grad(ref, (v, m))
    compiled = torch.compile(loss, fullgraph=True)
    out = compiled(v, m)
    cv, cm = torch.autograd.grad(out, (v, m))
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(cv, gv)
    torch.testing.assert_close(cm, gm)


@pytest.mark.compile
def test_compile_dynamic_does_not_recompile_per_size():
    op = wb.op(K.mul64)
    counter = CompileCounter()
    f = torch.compile(lambda x, y: op(x, y).sum(), backend=counter, fullgraph=True, dynamic=True)
    for n in (5, 7, 11, 13):
        x, y = rand(n), rand(n)
        out = f(x, y)
        out.backward()
        torch.testing.assert_close(out, (x.sin() * y).sum())
        torch.testing.assert_close(x.grad, x.detach().cos() * y.detach())
    assert counter.frame_count == 1


@pytest.mark.compile
def test_compile_aot_eager_with_launch_dims_and_function_ops():
    outer = wb.op(K.outer, launch_dims=(3, 4))
    fn_op = wb.op(K.exp_times)

    def f(a, b, k):
        return outer(a, b).sum() + fn_op(a, k).sum()

    a, b, k = rand(3), rand(4), rand(3)
    ref = torch.autograd.grad(f(a, b, k), (a, b, k))
    got = torch.autograd.grad(torch.compile(f, backend="aot_eager", fullgraph=True)(a, b, k), (a, b, k))
    for r, g in zip(ref, got):
        torch.testing.assert_close(g, r)


def test_compile_around_torch_func_transforms():
    # torch.compile(vmap(grad(f))): the transforms route the op through warpbridge's
    # torch.func Functions; dynamo breaks the graph around them and the result is exact.
    from torch.func import grad, vmap

    op = wb.op(K.mul64, name="compile_func_mul", vmap_method="broadcast_all")
    X, Y = rand(4, 5, grad=False), rand(4, 5, grad=False)
    per_sample = torch.compile(vmap(grad(lambda x, y: op(x, y).sum())), backend="aot_eager")
    torch.testing.assert_close(per_sample(X, Y), torch.cos(X) * Y)
    batched = torch.compile(vmap(op), backend="aot_eager")
    torch.testing.assert_close(batched(X, Y), torch.sin(X) * Y)


@pytest.mark.compile
def test_an_op_with_a_struct_argument_runs_outside_the_graph():
    """A wp.struct cannot be in a custom op's schema: torch.compile runs the op between graphs
    (gradients intact), and fullgraph=True refuses, naming the reason."""
    import backward_kernels as B

    op = wb.op(B.affine)
    params = B.Affine()
    params.scale, params.shift = 2.0, 0.5
    x = torch.rand(4, dtype=torch.float64, requires_grad=True)
    y = torch.compile(lambda v: (op(v * 1.0, params) * 3).sum(), backend="aot_eager")(x)
    y.backward()
    torch.testing.assert_close(x.grad, 12 * x.detach())
    with pytest.raises(Exception, match="wp.struct"):
        torch.compile(lambda v: op(v, params).sum(), fullgraph=True, backend="aot_eager")(x)


FIRST_CALL_COMPILED = """
import sys
sys.path.insert(0, {tests!r})
import warpbridge as wb  # before torch: no backend is loaded yet
import torch
import warp as wp
import backward_kernels as B
import kernels as K

op = wb.op(K.mul64)
generic = wb.op(B.generic_cube)


@torch.compile(fullgraph=True, backend="aot_eager")
def step(q, r, x):
    d, _, _ = wb.ops.knn(q, r, 3)  # the neighbour ops' first call, inside the compiled region
    return d.sum().double() + op(x, x).sum()


q, r, x = torch.rand(20, 3), torch.rand(30, 3), torch.rand(4, dtype=torch.float64)
want = torch.cdist(q, r).topk(3, largest=False).values.sum().double() + (torch.sin(x) * x).sum()
assert torch.allclose(step(q, r, x), want.double(), rtol=1e-5), "wrong value"


@torch.compile(fullgraph=True, backend="eager")
def generic_first(x):
    return generic(x)


try:
    generic_first(torch.rand(3))
except Exception as e:  # Dynamo wraps it; our message must be there
    assert "call the op once with float32 arrays before compiling" in str(e), str(e)
else:
    raise AssertionError("no error")
print("ok")
"""


@pytest.mark.compile
def test_first_call_inside_torch_compile_with_warpbridge_imported_first():
    import os
    import subprocess
    import sys

    code = FIRST_CALL_COMPILED.format(tests=os.path.dirname(__file__))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


@pytest.mark.compile
def test_a_new_mesh_every_step_does_not_recompile():
    # the mesh follows the parameters: a new wp.Mesh (a new id) each step, passed as an int
    import warp as wp
    from realcode_kernels import closest_distance

    op = wb.op(closest_distance)
    counter = CompileCounter()

    @torch.compile(backend=counter, dynamic=True, fullgraph=True)
    def distances(mesh_id, q):
        return op(mesh_id, q)

    faces = wp.array([0, 1, 2], dtype=wp.int32)
    q = torch.tensor([[0.2, 0.2, 0.5], [0.1, 0.3, -0.4]])
    meshes = []
    for step in range(6):
        z = 0.05 * step  # the triangle moves up: the distances change
        pts = wp.array([[0.0, 0.0, z], [1.0, 0.0, z], [0.0, 1.0, z]], dtype=wp.vec3)
        meshes.append(wp.Mesh(points=pts, indices=faces))
        d = distances(meshes[-1].id, q)
        torch.testing.assert_close(d, (q[:, 2] - z).abs())
    assert counter.frame_count <= 2  # the first trace fills a type cache once; never per mesh
