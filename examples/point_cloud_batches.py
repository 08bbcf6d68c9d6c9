"""Train a small point-cloud classifier on ragged batches, the way a PyG model is fed.

Each step draws a batch of clouds of 200 to 600 points: spheres, planes and cylinders, each
rotated, scaled and shifted at random. The clouds go in one tensor with PyG's batch vector.
`wb.ops.knn_graph(pos, k, batch=batch)` gives each point its neighbours within its own cloud
in one call, an EdgeConv layer (plain PyTorch: an MLP on |x_i|, x_j - x_i and its length,
max over j) turns them into point features, and a mean over each cloud classifies it.

Run: python examples/point_cloud_batches.py
"""

from __future__ import annotations

import math

import torch

import warpbridge as wb

SHAPES = ("sphere", "plane", "cylinder")
K = 12


def random_cloud(shape: str, n: int, g: torch.Generator) -> torch.Tensor:
    """``n`` points on a unit sphere, square or cylinder, rotated, scaled and shifted."""
    u, v = torch.rand(n, generator=g), torch.rand(n, generator=g)
    if shape == "sphere":
        theta, z = 2 * math.pi * u, 2 * v - 1
        r = (1 - z**2).sqrt()
        x = torch.stack([r * theta.cos(), r * theta.sin(), z], 1)
    elif shape == "plane":
        x = torch.stack([2 * u - 1, 2 * v - 1, torch.zeros(n)], 1)
    else:
        theta = 2 * math.pi * u
        x = torch.stack([theta.cos(), theta.sin(), 2 * v - 1], 1)
    rotation = torch.linalg.qr(torch.randn(3, 3, generator=g))[0]
    scale = 0.5 + torch.rand(1, generator=g)
    return (x + 0.01 * torch.randn(n, 3, generator=g)) @ rotation * scale + torch.randn(3, generator=g)


def make_batch(clouds: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(points (P, 3), batch vector (P,), labels (clouds,)) of a ragged batch."""
    labels = torch.randint(len(SHAPES), (clouds,), generator=g)
    sizes = torch.randint(200, 601, (clouds,), generator=g)
    pos = torch.cat([random_cloud(SHAPES[c], int(n), g) for c, n in zip(labels, sizes)])
    return pos, torch.repeat_interleave(torch.arange(clouds), sizes), labels


class EdgeConvClassifier(torch.nn.Module):
    def __init__(self, hidden: int = 32):
        super().__init__()
        self.edge = torch.nn.Sequential(torch.nn.Linear(5, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden))
        self.point = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU())
        self.head = torch.nn.Linear(hidden, len(SHAPES))

    def forward(self, pos: torch.Tensor, batch: torch.Tensor, clouds: int) -> torch.Tensor:
        # each cloud centred and scaled to unit size, so the shape is what is learnt
        counts = torch.bincount(batch, minlength=clouds).clamp(min=1)[:, None].float()
        centre = torch.zeros(clouds, 3).index_add_(0, batch, pos) / counts
        x = pos - centre[batch]
        size = torch.zeros(clouds).index_add_(0, batch, x.norm(dim=1)) / counts[:, 0]
        x = x / size[batch, None]
        source, target = wb.ops.knn_graph(x, K, batch=batch)  # PyG's edge_index, within each cloud
        # rotation-free inputs: the centre's distance from the cloud's middle, and the edge
        offset = x[source] - x[target]
        messages = self.edge(
            torch.cat([x[target].norm(dim=1, keepdim=True), offset, offset.norm(dim=1, keepdim=True)], 1)
        )
        index = target[:, None].expand_as(messages)
        points = torch.zeros(len(x), messages.shape[1]).scatter_reduce(0, index, messages, "amax", include_self=False)
        pooled = torch.zeros(clouds, points.shape[1]).index_add_(0, batch, self.point(points)) / counts
        return self.head(pooled)


def main(steps: int = 60, clouds: int = 24, seed: int = 0) -> float:
    """Train for ``steps`` batches; return the accuracy on a fresh batch of 96 clouds."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = EdgeConvClassifier()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(steps):
        pos, batch, labels = make_batch(clouds, g)
        loss = torch.nn.functional.cross_entropy(model(pos, batch, clouds), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0 or step == steps - 1:
            print(f"step {step:3d}  loss {loss.item():.3f}")
    pos, batch, labels = make_batch(96, g)
    with torch.no_grad():
        accuracy = (model(pos, batch, 96).argmax(1) == labels).float().mean().item()
    print(f"accuracy on 96 new clouds: {accuracy:.2f}")
    return accuracy


if __name__ == "__main__":
    main()
