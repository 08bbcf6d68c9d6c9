"""Farthest point sampling: torch_cluster's fps checks, reproduced; the same samples as
torch_cluster's algorithm (a torch loop of its steps, below) on ragged batches of
real-shaped clouds; random starts from the framework's seed; odd clouds and bad input."""

from __future__ import annotations

import importlib.util
import math
import os

import numpy as np
import pytest
import torch

import warpbridge as wb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SPEC = importlib.util.spec_from_file_location("distributions", os.path.join(ROOT, "benchmarks", "distributions.py"))
D = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(D)


def torch_cluster_fps(pos, ptr, ratio, starts=None):
    """torch_cluster's CPU fps step for step: squared distances in pos's dtype, argmax (first of
    equal ones), min; ceil(n * ratio) samples with the product in pos's dtype."""
    out = []
    for c in range(len(ptr) - 1):
        y = pos[ptr[c] : ptr[c + 1]]
        n = len(y)
        m = int(math.ceil(float(torch.tensor(n, dtype=pos.dtype) * torch.tensor(ratio, dtype=pos.dtype))))
        s = 0 if starts is None else starts[c]
        if m == 0:
            continue
        out.append(ptr[c] + s)
        dist = (y - y[s]).pow(2).sum(1)
        for _ in range(1, m):
            a = int(dist.argmax())
            out.append(ptr[c] + a)
            dist = torch.min(dist, (y - y[a]).pow(2).sum(1))
    return torch.tensor(out, dtype=torch.int64)


SQUARES = [[-1, -1], [-1, 1], [1, 1], [1, -1], [-2, -2], [-2, 2], [2, 2], [2, -2]]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_torch_clusters_fps_checks(dtype):
    x = torch.tensor(SQUARES, dtype=dtype)
    batch = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    assert wb.ops.fps(x, batch=batch, random_start=False).tolist() == [0, 2, 4, 6]
    assert wb.ops.fps(x, 0.5, batch=batch, random_start=False).tolist() == [0, 2, 4, 6]
    assert wb.ops.fps(x, 0.5, random_start=False).sort()[0].tolist() == [0, 5, 6, 7]


def test_random_starts_stay_in_their_clouds():
    n = 1024
    for seed in range(5):
        pos = torch.randn(2 * n, 3, generator=torch.Generator().manual_seed(seed))
        batch = torch.cat([torch.zeros(n, dtype=torch.long), torch.ones(n, dtype=torch.long)])
        idx = wb.ops.fps(pos, batch=batch, ratio=0.5)
        assert idx.shape == (n,) and idx.min() >= 0 and idx.max() < 2 * n
        assert (idx[: n // 2] < n).all() and (idx[n // 2 :] >= n).all()
        assert len(set(idx.tolist())) == n  # no point twice (no duplicates in the cloud)


def _scans(dtype):
    clouds = [
        torch.from_numpy(D.make(name, 300 + 170 * c, seed=c)[0]).to(dtype) for c, name in enumerate(D.DISTRIBUTIONS)
    ]
    ptr = [0, *np.cumsum([len(c) for c in clouds]).tolist()]
    batch = torch.repeat_interleave(torch.arange(len(clouds)), torch.tensor([len(c) for c in clouds]))
    return torch.cat(clouds), batch, ptr


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("ratio", [0.1, 0.25, 0.5, 1.0])
def test_the_same_samples_as_torch_cluster_on_real_shaped_batches(dtype, ratio):
    pos, batch, ptr = _scans(dtype)
    idx = wb.ops.fps(pos, ratio, batch=batch, random_start=False)
    assert torch.equal(idx, torch_cluster_fps(pos, ptr, ratio))


def test_a_random_start_is_the_frameworks_draw_and_the_rest_follows_from_it():
    pos, batch, ptr = _scans(torch.float64)
    torch.manual_seed(7)
    first = wb.ops.fps(pos, 0.2, batch=batch)
    torch.manual_seed(7)
    assert torch.equal(first, wb.ops.fps(pos, 0.2, batch=batch))  # torch.manual_seed decides
    assert not torch.equal(first, wb.ops.fps(pos, 0.2, batch=batch))
    sizes = np.diff(ptr)
    starts_at = np.concatenate([[0], np.cumsum(np.ceil(sizes * 0.2).astype(int))[:-1]])
    starts = [int(first[s]) - ptr[c] for c, s in enumerate(starts_at)]
    assert torch.equal(first, torch_cluster_fps(pos, ptr, 0.2, starts))
    assert len(set(starts)) > 1


def test_num_picks_a_count_per_cloud():
    pos, batch, ptr = _scans(torch.float64)
    idx = wb.ops.fps(pos, num=400, batch=batch, random_start=False)
    sizes = np.diff(ptr)
    assert len(idx) == np.minimum(sizes, 400).sum()
    full = torch_cluster_fps(pos, ptr, 1.0)
    want = torch.cat([full[ptr[c] : ptr[c] + min(400, sizes[c])] for c in range(len(sizes))])
    assert torch.equal(idx, want)  # the first num of a full sampling


def test_points_that_are_not_finite_are_not_chosen_while_finite_ones_are_left():
    pos = torch.rand(50, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    pos[[0, 10, 11]] = torch.tensor([math.nan, 0.0, 0.0], dtype=torch.float64)
    pos[20, 1] = math.inf
    idx = wb.ops.fps(pos, num=46, random_start=False)
    finite = [i for i in range(50) if i not in (0, 10, 11, 20)]
    assert sorted(idx.tolist()) == finite and idx[0] == 1  # the first finite point starts
    keep = torch.tensor(finite)
    assert torch.equal(idx, keep[torch_cluster_fps(pos[keep], [0, 46], 1.0)])


def test_duplicates_small_clouds_and_empty_input():
    same = torch.zeros(6, 3)
    assert wb.ops.fps(same, random_start=False).tolist() == [0, 0, 0]  # torch_cluster repeats too
    assert wb.ops.fps(torch.rand(1, 3), 0.01).tolist() == [0]
    assert wb.ops.fps(torch.rand(0, 3)).shape == (0,)
    batch = torch.tensor([0, 2, 2])  # cloud 1 is empty
    assert wb.ops.fps(torch.rand(3, 3), 1.0, batch=batch, random_start=False).tolist() == [0, 1, 2]
    assert wb.ops.fps(torch.rand(0, 3), batch=torch.zeros(0, dtype=torch.long)).shape == (0,)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(ratio=0.0), r"'ratio' must be a number with 0 < ratio <= 1, got float 0.0"),
        (dict(ratio=1.5), r"'ratio' must be a number with 0 < ratio <= 1, got float 1.5"),
        (dict(ratio=math.nan), r"'ratio' must be a number with 0 < ratio <= 1, got float nan"),
        (dict(ratio="0.5"), r"'ratio' must be a number with 0 < ratio <= 1, got str"),
        (dict(num=0), r"'num' must be an int from 1 to"),
        (dict(num=2.0), r"'num' must be an int from 1 to"),
        (dict(ratio=0.5, num=3), r"give 'ratio' or 'num', not both"),
        (dict(random_start=1), r"'random_start' must be True or False, got int 1"),
        (dict(batch=torch.tensor([1, 0, 0, 0])), r"'batch' must be sorted"),
        (dict(batch=torch.tensor([0, 0])), r"'batch'"),
    ],
)
def test_bad_input_is_refused_by_name(kwargs, message):
    with pytest.raises(wb.WarpBridgeError, match=r"^fps\(\): " + message):
        wb.ops.fps(torch.rand(4, 3), **kwargs)


def test_numpy_jax_and_paddle_give_torchs_samples():
    pos, batch, ptr = _scans(torch.float32)
    want = wb.ops.fps(pos, 0.3, batch=batch, random_start=False)
    got = wb.ops.fps(pos.numpy(), 0.3, batch=batch.numpy(), random_start=False)
    assert isinstance(got, np.ndarray) and np.array_equal(got, want.numpy())
    np.random.seed(3)
    first = wb.ops.fps(pos.numpy(), 0.3, batch=batch.numpy())
    np.random.seed(3)
    assert np.array_equal(first, wb.ops.fps(pos.numpy(), 0.3, batch=batch.numpy()))
    import jax
    import jax.numpy as jnp
    import paddle

    jax.config.update("jax_enable_x64", True)  # int64 batch vectors
    got = wb.ops.fps(jnp.asarray(pos.numpy()), 0.3, batch=jnp.asarray(batch.numpy()), random_start=False)
    assert np.array_equal(np.asarray(got), want.numpy())
    one_cloud = jax.jit(lambda p: wb.ops.fps(p, 0.3, random_start=False))(jnp.asarray(pos.numpy()))  # a static size
    assert np.array_equal(np.asarray(one_cloud), wb.ops.fps(pos, 0.3, random_start=False).numpy())
    with pytest.raises(wb.WarpBridgeError, match=r"^fps\(\): the number of samples depends on the data"):
        jax.jit(lambda p, b: wb.ops.fps(p, 0.3, batch=b, random_start=False))(
            jnp.asarray(pos.numpy()), jnp.asarray(batch.numpy())
        )
    with pytest.raises(wb.WarpBridgeError, match=r"^fps\(\): random_start=True .*JAX keeps no global random state"):
        wb.ops.fps(jnp.asarray(pos.numpy()), 0.3)
    got = wb.ops.fps(paddle.to_tensor(pos.numpy()), 0.3, batch=paddle.to_tensor(batch.numpy()), random_start=False)
    assert np.array_equal(got.numpy(), want.numpy())
    assert wb.ops.fps(paddle.to_tensor(pos.numpy()), 0.3).shape == [math.ceil(len(pos) * 0.3)]


def test_the_block_per_cloud_kernel_samples_what_the_thread_per_cloud_kernel_does():
    """CUDA samples each cloud with a thread block (``fps_clouds_tiled``); on the CPU a block is
    one thread, so there it runs the per-lane steps alone: the same samples as ``fps_clouds``
    on ragged clouds with empty ones, duplicates, NaN points and a start past the last finite
    point. (The reductions across lanes are checked on a GPU, in ``test_points_gpu.py``.)"""
    import warp as wp

    from warpbridge.ops import kdtree

    sizes = np.array([0, 1, 5, 1024, 37, 0, 300])
    pos = np.random.default_rng(0).random((sizes.sum(), 3))
    pos[::13] = np.nan
    pos[1040:1066] = np.nan  # the end of the 37-point cloud
    pos[3:9] = pos[2]
    samples = np.minimum(sizes, (sizes + 1) // 2)
    for scalar in (wp.float32, wp.float64):
        k = kdtree.kernels(scalar)
        args = [
            wp.array(pos, dtype=k.V),
            wp.array(np.r_[0, np.cumsum(sizes)], dtype=wp.int64),
            wp.array(np.r_[0, np.cumsum(samples)], dtype=wp.int64),
            wp.array(np.r_[0.1, 0.5, 0.9, 0.3, 0.99, 0.0, 0.7], dtype=wp.float64),
        ]
        got, want = (wp.zeros(int(samples.sum()), dtype=wp.int64) for _ in range(2))
        wp.launch(k.fps_clouds, len(sizes), [*args, 1, 0, wp.empty(len(pos), dtype=scalar), want])
        wp.launch_tiled(
            k.fps_clouds_tiled, dim=[len(sizes)], inputs=[*args, wp.empty(len(pos), dtype=scalar), got], block_dim=1
        )
        assert np.array_equal(got.numpy(), want.numpy())
        assert len(set(want.numpy()[samples[:3].sum() : samples[:4].sum()])) == samples[3]  # no repeats
