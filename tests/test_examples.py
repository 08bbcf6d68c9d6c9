"""Every example runs and reaches its documented result."""

import importlib.util
import os

import pytest
import torch

ROOT = os.path.join(os.path.dirname(__file__), "..", "examples")


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rosenbrock_example_reaches_the_minimum(capsys):
    mean = load("rosenbrock").main(steps=3000)
    torch.testing.assert_close(mean, torch.tensor([1.0, 1.0]), atol=0.06, rtol=0)
    out = capsys.readouterr().out
    err = float(out.split("vs PyTorch autograd: ")[1].split()[0])
    assert err < 1e-5


def test_warp_loss_adam_example_converges(capsys):
    assert load("warp_loss_adam").main(steps=200) < 1e-6
    assert "loss" in capsys.readouterr().out


def test_compile_custom_op_example_matches_eager(capsys):
    eager, compiled = load("compile_custom_op").main(steps=60)
    assert abs(eager - compiled) <= 1e-4 * max(1.0, abs(eager))
    assert "opcheck: ok" in capsys.readouterr().out


def test_deferred_allocation_example_allocates_no_grad_in_forward(capsys):
    result = load("deferred_allocation").main(n=200_000, device="cpu", iters=3)
    assert result["grad_allocated_in_forward"] == {"by_hand": True, "warpbridge": False}
    assert result["warpbridge_ms"] > 0 and result["by_hand_ms"] > 0


def test_cuda_graph_capture_example_without_gpu_says_so(capsys):
    if torch.cuda.is_available():
        return test_cuda_graph_capture_example()
    assert load("cuda_graph_capture").main() is None
    assert "no CUDA device" in capsys.readouterr().out


@pytest.mark.gpu
def test_cuda_graph_capture_example():
    x = load("cuda_graph_capture").main(n=1024, replays=20)
    assert x is not None and x.is_cuda


@pytest.mark.gpu
def test_deferred_allocation_example_on_gpu():
    result = load("deferred_allocation").main(n=20_000_000, device="cuda", iters=5)
    assert result["grad_allocated_in_forward"]["warpbridge"] is False


def test_paddle_adam_example_converges():
    pytest.importorskip("paddle", reason="Paddle is not installed in this environment")
    assert load("paddle_adam").main(steps=300) < 1e-6


JAX_EXAMPLES = """
import sys, numpy as np
sys.path.insert(0, {root!r})
import jax_examples as ex
np.testing.assert_allclose(ex.single_output(), [0, 3, 6, 9, 12])
s, p = ex.multiple_outputs()
np.testing.assert_allclose(s, [2, 3, 4, 5]); np.testing.assert_allclose(p, [0, 2, 4, 6])
np.testing.assert_allclose(ex.vector_matrix_arrays(), [[0, 1]] * 3, atol=1e-6)
c, grad_a, expect = ex.launch_dims_with_gradients()
np.testing.assert_allclose(c, expect, rtol=1e-6); np.testing.assert_allclose(grad_a, np.ones((3, 4)) * 2)
out, grad = ex.multi_kernel_function_with_gradients()
np.testing.assert_allclose(out, [1, 2, 5, 10]); np.testing.assert_allclose(grad, [0, 2, 4, 6])
np.testing.assert_allclose(ex.shard_map_two_devices(), 3 * np.arange(8))
print("jax examples ok")
"""


def test_jax_examples():
    import subprocess
    import sys

    pytest.importorskip("jax", reason="JAX is not installed in this environment")
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    p = subprocess.run(
        [sys.executable, "-c", JAX_EXAMPLES.format(root=ROOT)], env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "jax examples ok" in p.stdout


def test_torch_func_example_matches_loops(capsys):
    result = load("torch_func").main(batch=16, n=500)
    for method in ("sequential", "broadcast_all"):
        assert result["per_sample"][method]["max_error"] < 1e-12
    assert result["clouds"]["value_error"] < 1e-12 and result["clouds"]["grad_error"] < 1e-12
    assert "vmap_method='broadcast_all'" in capsys.readouterr().out


def test_custom_backward_example_refuses_checks_and_trains(capsys):
    result = load("custom_backward").main(steps=40)
    assert "cannot differentiate" in result["refusal"] and "variable 'total'" in result["refusal"]
    assert result["value_err"] < 1e-10 and result["grad_err"] < 1e-8
    assert result["losses"][-1] < 0.05 * result["losses"][0]
    assert "check_op: ok" in capsys.readouterr().out


def test_point_cloud_bf16_example_trains_like_float32(capsys):
    bf16, fp32 = load("point_cloud_bf16").main(steps=25)
    assert bf16[-1] < 0.7 * bf16[0]
    assert abs(bf16[-1] - fp32[-1]) <= 0.1 * fp32[-1]  # bfloat16 follows the float32 run
    assert "loss, bfloat16" in capsys.readouterr().out


def test_warp_state_example_lands_the_projectiles(capsys):
    assert load("warp_state").main(iters=100) < 1e-2
    out = capsys.readouterr().out
    assert "mean squared miss" in out
    low, high = (float(v) for v in out.split("apex heights: ")[1].split(" m")[0].split(" to "))
    assert 0 < low <= high < 20  # launched upwards, none to the sky


def test_point_cloud_batches_example_learns_the_shapes(capsys):
    """A classifier fed ragged batches through knn_graph(batch=...) tells spheres, planes and
    cylinders apart (chance is 1/3)."""
    assert load("point_cloud_batches").main(steps=60) >= 0.85
    assert "accuracy on 96 new clouds" in capsys.readouterr().out


def test_dgcnn_example_learns_the_shapes_on_feature_space_graphs(capsys):
    """DGCNN whose second and third graphs are built in 32-D feature space tells spheres,
    cubes, tori and cones apart (chance is 1/4)."""
    assert load("dgcnn").main(steps=40) >= 0.85
    assert "accuracy on 64 new clouds" in capsys.readouterr().out


def test_force_matching_example_fits_forces_and_virials_through_periodic_cells(capsys):
    """A radial MLP trained on forces and dE/dcell (create_graph through neighbor_list's
    distances) reproduces the reference potential's forces on new triclinic structures."""
    assert load("force_matching").main(steps=150) < 0.1
    assert "relative force error on new structures" in capsys.readouterr().out
