"""DGCNN on ragged batches: EdgeConv layers whose graphs are rebuilt in feature space.

The first EdgeConv layer connects each point to its k nearest points in space; each later
layer connects it to its k nearest in the 32-dimensional feature space of the layer before
(the "dynamic graph"). All three graphs are one `wb.ops.knn_graph(h, k, batch=batch)` call on
the whole batch: in 3-D a kd-tree, in 32-D an exact brute force per cloud. The graph carries
no gradient; the features through it do (plain PyTorch gathers and a max per point).

The data: spheres, cubes, tori and cones of 200 to 500 points, scaled and shifted at
random, with PyG's batch vector.

Run: python examples/dgcnn.py
"""

from __future__ import annotations

import math

import torch

import warpbridge as wb

SHAPES = ("sphere", "cube", "torus", "cone")
K = 16


def random_cloud(shape: str, n: int, g: torch.Generator) -> torch.Tensor:
    """``n`` points on the surface of a unit ``shape``, scaled and shifted."""
    u, v = torch.rand(n, generator=g), torch.rand(n, generator=g)
    theta, phi = 2 * math.pi * u, 2 * math.pi * v
    if shape == "sphere":
        z = 2 * v - 1
        x = torch.stack([(1 - z**2).sqrt() * theta.cos(), (1 - z**2).sqrt() * theta.sin(), z], 1)
    elif shape == "cube":
        face = torch.randint(6, (n,), generator=g)
        side = torch.stack([2 * u - 1, 2 * v - 1, torch.where(face % 2 == 0, 1.0, -1.0)], 1)
        axes = (torch.arange(3)[None] + face[:, None] // 2) % 3  # the face's normal axis in turn
        x = side.gather(1, axes)
    elif shape == "torus":
        ring = 1 + 0.35 * phi.cos()
        x = torch.stack([ring * theta.cos(), ring * theta.sin(), 0.35 * phi.sin()], 1)
    else:
        h = v.sqrt()  # uniform on the cone's side
        x = torch.stack([h * theta.cos(), h * theta.sin(), 1 - 2 * h], 1)
    return (x + 0.01 * torch.randn(n, 3, generator=g)) * (0.5 + torch.rand(1, generator=g)) + torch.randn(
        3, generator=g
    )


def make_batch(clouds: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(points (P, 3), batch vector (P,), labels (clouds,)) of a ragged batch."""
    labels = torch.randint(len(SHAPES), (clouds,), generator=g)
    sizes = torch.randint(200, 501, (clouds,), generator=g)
    pos = torch.cat([random_cloud(SHAPES[c], int(n), g) for c, n in zip(labels, sizes)])
    return pos, torch.repeat_interleave(torch.arange(clouds), sizes), labels


class EdgeConv(torch.nn.Module):
    """h_i' = max over the k nearest j of MLP([h_i, h_j - h_i]) (DGCNN's EdgeConv)."""

    def __init__(self, inputs: int, outputs: int):
        super().__init__()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(2 * inputs, outputs), torch.nn.LeakyReLU(0.2))

    def forward(self, h: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        source, target = wb.ops.knn_graph(h.detach(), K, batch=batch)  # the graph of this layer's space
        messages = self.mlp(torch.cat([h[target], h[source] - h[target]], 1))
        index = target[:, None].expand_as(messages)
        return torch.zeros(len(h), messages.shape[1]).scatter_reduce(0, index, messages, "amax", include_self=False)


class DGCNN(torch.nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        self.convs = torch.nn.ModuleList([EdgeConv(3, width), EdgeConv(width, width), EdgeConv(width, width)])
        self.head = torch.nn.Sequential(
            torch.nn.Linear(3 * width, 64), torch.nn.ReLU(), torch.nn.Linear(64, len(SHAPES))
        )

    def forward(self, pos: torch.Tensor, batch: torch.Tensor, clouds: int) -> torch.Tensor:
        counts = torch.bincount(batch, minlength=clouds).clamp(min=1)[:, None].float()
        x = pos - (torch.zeros(clouds, 3).index_add_(0, batch, pos) / counts)[batch]  # each cloud centred
        x = x / (torch.zeros(clouds).index_add_(0, batch, x.norm(dim=1)) / counts[:, 0])[batch, None]
        features, h = [], x
        for conv in self.convs:
            h = conv(h, batch)  # layers 2 and 3 search the 32-D features of the layer before
            features.append(h)
        index = batch[:, None].expand(-1, 3 * h.shape[1])
        pooled = torch.zeros(clouds, index.shape[1]).scatter_reduce(
            0, index, torch.cat(features, 1), "amax", include_self=False
        )
        return self.head(pooled)


def main(steps: int = 40, clouds: int = 16, seed: int = 0) -> float:
    """Train for ``steps`` batches; return the accuracy on a fresh batch of 64 clouds."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = DGCNN()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(steps):
        pos, batch, labels = make_batch(clouds, g)
        loss = torch.nn.functional.cross_entropy(model(pos, batch, clouds), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == steps - 1:
            print(f"step {step:3d}  loss {loss.item():.3f}")
    pos, batch, labels = make_batch(64, g)
    with torch.no_grad():
        accuracy = (model(pos, batch, 64).argmax(1) == labels).float().mean().item()
    print(f"accuracy on 64 new clouds: {accuracy:.2f}")
    return accuracy


if __name__ == "__main__":
    main()
