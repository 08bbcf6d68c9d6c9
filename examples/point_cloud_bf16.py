"""The PhysicsNeMo tutorial's point-cloud model in bfloat16, the tutorial's default data type.

An MLP encodes a reference cloud, ``wb.ops.knn_aggregate`` moves the features onto a 3-D grid
of query points, and a second MLP decodes them. The whole model, the points and the features
are bfloat16. The neighbour op computes distances, weights and sums in float32, then returns
the features in bfloat16, and gradients flow back in bfloat16 to both MLPs and to the points.

The same model, from the same weights, is trained in float32 for comparison.

Run: python examples/point_cloud_bf16.py [--steps 60]
"""

import argparse

import torch

import warpbridge as wb


def make_model(dtype):
    torch.manual_seed(0)
    enc = torch.nn.Sequential(torch.nn.Linear(3, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
    dec = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    return enc.to(dtype), dec.to(dtype)


def train(dtype, steps):
    g = torch.Generator().manual_seed(1)
    cloud = torch.randn(4000, 3, generator=g).to(dtype)
    x = torch.linspace(-1, 1, 12)
    grid = torch.stack(torch.meshgrid(x, x, x, indexing="ij"), -1).reshape(-1, 3).to(dtype)
    target = (grid.float().norm(dim=1, keepdim=True) < 0.7).to(dtype)  # a ball to fit
    enc, dec = make_model(dtype)
    opt = torch.optim.Adam([*enc.parameters(), *dec.parameters()], lr=3e-3)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        feats = enc(cloud)
        out = dec(wb.ops.knn_aggregate(grid, cloud, feats, k=7, sigma=0.1))
        assert out.dtype == dtype
        loss = torch.nn.functional.mse_loss(out.float(), target.float())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(p.grad.dtype == dtype for p in enc.parameters())
    return losses


def main(steps=60):
    bf16 = train(torch.bfloat16, steps)
    fp32 = train(torch.float32, steps)
    print(f"loss, bfloat16: {bf16[0]:.4f} -> {bf16[-1]:.4f}")
    print(f"loss, float32:  {fp32[0]:.4f} -> {fp32[-1]:.4f}")
    return bf16, fp32


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60)
    main(p.parse_args().steps)
