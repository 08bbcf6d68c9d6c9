"""Tile kernels as ops: launched by blocks as wp.launch_tiled launches them (launch_dims is
the grid of blocks and is required), or by threads in blocks (tiled=False, Warp's tile MLP);
block_dim honoured on the CPU as on CUDA, at construction or per call; Warp's own tile GEMM and
tile MLP give float64 products and wp.Tape's gradients."""

import numpy as np
import pytest
import tile_kernels as T
import torch
import warp as wp

import warpbridge as wb
from warpbridge.testing import check_op

f64 = torch.float64


def gemm_inputs(dtype=f64, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(24, 16, dtype=dtype, generator=g, requires_grad=True)
    b = torch.rand(16, 8, dtype=dtype, generator=g, requires_grad=True)
    return a, b


def test_a_kernel_that_uses_tiles_needs_launch_dims():
    from warp.tests.tile import test_tile_matmul as TM

    with pytest.raises(
        wb.WarpBridgeError,
        match=r"tile_gemm\(\): kernel 'tile_gemm' uses tiles \(wp\.tile_\w+ at .*test_tile_matmul\.py:\d+\): pass "
        r"launch_dims, the grid of blocks as wp\.launch_tiled takes it, not the first array's shape \(24, 16\)",
    ):
        wb.op(TM.tile_gemm)(*gemm_inputs())


@pytest.mark.parametrize("block_dim", [None, 8, 64])
def test_warps_tile_gemm_gives_float64_products_and_gradients(block_dim):
    from warp.tests.tile import test_tile_matmul as TM

    a, b = gemm_inputs()
    op = wb.op(TM.tile_gemm, launch_dims=(24 // TM.TILE_M, 8 // TM.TILE_N), output_dims=(24, 8), block_dim=block_dim)
    c = op(a, b)
    torch.testing.assert_close(c, a.detach() @ b.detach())
    g = torch.rand(24, 8, dtype=f64)
    ga, gb = torch.autograd.grad(c, (a, b), g)
    torch.testing.assert_close(ga, g @ b.detach().T)
    torch.testing.assert_close(gb, a.detach().T @ g)
    check_op(op, *gemm_inputs(seed=1))


def test_a_tile_kernel_from_jax_under_jit_and_grad():
    import jax
    import jax.numpy as jnp
    from warp.tests.tile import test_tile_matmul as TM

    jax.config.update("jax_enable_x64", True)
    a, b = (jnp.asarray(t.detach().numpy()) for t in gemm_inputs())
    op = wb.op(TM.tile_gemm, launch_dims=(3, 2), output_dims=(24, 8), block_dim=8)
    np.testing.assert_allclose(np.asarray(jax.jit(op)(a, b)), np.asarray(a) @ np.asarray(b), rtol=1e-12)
    ga, gb = jax.grad(lambda p, q: jnp.sum(op(p, q) ** 2), argnums=(0, 1))(a, b)
    c = np.asarray(a) @ np.asarray(b)
    np.testing.assert_allclose(np.asarray(ga), 2 * c @ np.asarray(b).T, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(gb), 2 * np.asarray(a).T @ c, rtol=1e-10)


def test_block_dim_reaches_the_kernel_on_the_cpu_at_construction_and_per_call():
    x = torch.ones(8, requires_grad=True)
    assert wb.op(T.times_block_dim)(x).tolist() == [1.0] * 8
    op = wb.op(T.times_block_dim, block_dim=4)
    y = op(x)
    y.sum().backward()
    assert y.tolist() == [4.0] * 8 and x.grad.tolist() == [4.0] * 8
    assert op(x, block_dim=16).tolist() == [16.0] * 8


def test_warps_tile_mlp_kernel_as_an_op_equals_warps_own_tape(monkeypatch):
    """Warp's example_tile_mlp ``compute`` kernel, launched by threads in blocks of 32 as the
    example launches it: the loss and the weights' gradients equal wp.Tape's."""
    from warp.examples.tile import example_tile_mlp as M

    batch, pixels = 64, 512 * 512
    rng = np.random.default_rng(0)
    indices = torch.from_numpy(rng.choice(pixels, batch, replace=False).astype(np.int32))
    sizes = [(M.DIM_IN, M.DIM_HID), (M.DIM_HID, M.DIM_HID), (M.DIM_HID, M.DIM_HID), (M.DIM_HID, M.DIM_OUT)]
    params = []
    for n_in, n_out in sizes:
        params += [
            torch.from_numpy(rng.uniform(-0.3, 0.3, shape)).half().requires_grad_()
            for shape in ((n_out, n_in), (n_out, 1))
        ]
    reference = torch.from_numpy(rng.random((3, pixels), dtype=np.float32))
    op = wb.op(
        M.compute, num_outputs=2, tiled=False, block_dim=M.NUM_THREADS, launch_dims=(batch,),
        output_dims={"loss": (1,), "out": (3, pixels)},
    )  # fmt: skip
    loss, _ = op(indices, *params, reference)
    loss.sum().backward()

    monkeypatch.setattr(wp.config, "enable_cpu_blocks", True)  # plain Warp's CPU blocks are opt-in
    arrays = [wp.from_torch(p.detach().clone(), requires_grad=True) for p in params]
    warp_loss = wp.zeros(1, dtype=float, requires_grad=True)
    out = wp.zeros((3, pixels), dtype=float, requires_grad=True)
    with wp.Tape() as tape:
        inputs = [wp.from_torch(indices), *arrays, wp.from_torch(reference), warp_loss, out]
        wp.launch(M.compute, dim=[batch], inputs=inputs, block_dim=M.NUM_THREADS)
    tape.backward(warp_loss)
    assert loss.item() == pytest.approx(float(warp_loss.numpy()[0]), rel=1e-6) and loss.item() > 0
    for p, a in zip(params, arrays):
        assert p.grad.abs().sum() > 0
        torch.testing.assert_close(p.grad, torch.from_numpy(a.grad.numpy()), rtol=0, atol=0)


def test_a_generic_binding_that_does_not_compile_names_wp_overload_and_breaks_nothing():
    x64 = torch.ones(3, dtype=f64)
    with pytest.raises(
        wb.WarpBridgeError,
        match=r"(?s)the generic kernel 'twice_any' bound with Any = float64 \(from argument 'x', float64\) does not "
        r"compile: .*Input types must be the same.*wb\.op\(wp\.overload\(twice_any,",
    ):
        wb.op(T.twice_any)(x64)
    # the failed binding is gone: the module still loads, for the binding that compiles too
    assert wb.op(T.twice_any)(torch.ones(3)).tolist() == [2.0] * 3
    assert wb.op(T.plus_one)(torch.ones(2)).tolist() == [2.0, 2.0]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"block_dim": 0}, r"block_dim must be an int from 1 to 1024 \(threads per block\), got 0"),
        ({"block_dim": True}, r"block_dim must be an int from 1 to 1024 \(threads per block\), got True"),
        ({"block_dim": 2048}, r"block_dim must be an int from 1 to 1024 \(threads per block\), got 2048"),
        ({"tiled": "yes"}, r"tiled must be a bool or None, got 'yes'"),
    ],
)
def test_bad_block_options_are_refused(options, message):
    with pytest.raises(wb.WarpBridgeError, match=r"times_block_dim\(\): " + message):
        wb.op(T.times_block_dim, **options)


def test_a_launch_function_takes_no_block_options():
    def double(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        wp.launch(T.times_block_dim, dim=x.shape, inputs=[x], outputs=[y])

    with pytest.raises(wb.WarpBridgeError, match=r"block_dim= and tiled= are for kernels"):
        wb.op(double, block_dim=8)


def grouped(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(3, 8, 8, generator=g, requires_grad=True), torch.rand(3, 8, 4, generator=g, requires_grad=True))


def test_a_launch_function_that_launches_by_blocks_itself():
    a, b = grouped()
    c = wb.op(T.grouped_gemm, output_dims=(3, 8, 4))(a, b)
    torch.testing.assert_close(c, a.detach() @ b.detach(), rtol=1e-5, atol=1e-5)
    g = torch.rand(3, 8, 4)
    ga, gb = torch.autograd.grad(c, (a, b), g)
    torch.testing.assert_close(ga, g @ b.detach().transpose(1, 2), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gb, a.detach().transpose(1, 2) @ g, rtol=1e-5, atol=1e-5)


@pytest.mark.compile
def test_a_tile_kernel_op_under_torch_compile_fullgraph():
    from warp.tests.tile import test_tile_matmul as TM

    op = wb.op(TM.tile_grouped_gemm, launch_dims=(3,), output_dims=(3, 8, 4), block_dim=8)

    def step(a, b):
        return (torch.relu(op(a, b)) ** 2).sum()

    compiled = torch.compile(step, fullgraph=True)
    a, b = grouped()
    loss = compiled(a, b)
    loss.backward()
    ra, rb = (t.detach().clone().requires_grad_() for t in (a, b))
    want = (torch.relu(ra @ rb) ** 2).sum()
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(a.grad, ra.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(b.grad, rb.grad, rtol=1e-4, atol=1e-4)
