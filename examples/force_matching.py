"""Train a pair potential on forces and stress of periodic structures (force matching).

The reference is a Morse potential (well depth 1 at distance 1.2, smoothly cut at 2.5); the
model is a small radial MLP with the same cutoff. Each structure is a periodic box of 32 to
64 atoms with a random triclinic cell. `wb.ops.neighbor_list(pos, cutoff, cell=cell,
batch=batch, quantities="ijS")` finds every pair through the boundaries, one call for the
batch; the distances are built from (i, j, S) with torch ops, so forces
(`-dE/dpos`, `create_graph=True`) and the virial (`dE/dcell`) train the model like any loss.

Run: python examples/force_matching.py
"""

from __future__ import annotations

import torch

import warpbridge as wb

CUTOFF = 2.5


def smooth_cut(d: torch.Tensor) -> torch.Tensor:
    """1 at 0 falling to 0 at the cutoff with a zero slope there."""
    return (1 - (d / CUTOFF) ** 2) ** 2


def morse(d: torch.Tensor) -> torch.Tensor:
    return ((1 - torch.exp(-2 * (d - 1.2))) ** 2 - 1) * smooth_cut(d)


class RadialMLP(torch.nn.Module):
    def __init__(self, hidden: int = 32):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(1, hidden),
            torch.nn.SiLU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.SiLU(),
            torch.nn.Linear(hidden, 1),
        ).double()

    def forward(self, d: torch.Tensor) -> torch.Tensor:
        return self.net(d[:, None])[:, 0] * smooth_cut(d)


def make_batch(structures: int, g: torch.Generator) -> tuple:
    """(positions, batch, cells (B, 3, 3)): jittered lattices in random triclinic cells."""
    positions, batch, cells = [], [], []
    for b in range(structures):
        side = int(torch.randint(3, 5, (1,), generator=g))  # 27 to 64 atoms
        cell = torch.eye(3, dtype=torch.float64) * side * 1.12 + 0.15 * torch.randn(
            3, 3, generator=g, dtype=torch.float64
        ).triu(1)
        grid = torch.stack(torch.meshgrid(*[torch.arange(side)] * 3, indexing="ij"), -1).reshape(-1, 3).double()
        frac = (grid + 0.5 + 0.06 * torch.randn(grid.shape, generator=g, dtype=torch.float64)) / side
        positions.append(frac @ cell)
        batch.append(torch.full((len(grid),), b))
        cells.append(cell)
    return torch.cat(positions), torch.cat(batch), torch.stack(cells)


def energy_forces_virial(pair_energy, pos, batch, cells):
    """Per-structure energies, forces and dE/dcell, differentiable (create_graph)."""
    pos, cells = pos.clone().requires_grad_(), cells.clone().requires_grad_()
    i, j, S = wb.ops.neighbor_list(pos, CUTOFF, cell=cells, batch=batch, quantities="ijS")
    D = pos[j] - pos[i] + torch.einsum("ek,ekl->el", S.double(), cells[batch[i]])
    per_pair = pair_energy(D.norm(dim=1)) / 2  # a full list holds each pair twice
    energy = torch.zeros(len(cells), dtype=torch.float64).index_add(0, batch[i], per_pair)
    grad_pos, grad_cell = torch.autograd.grad(energy.sum(), (pos, cells), create_graph=True)
    return energy, -grad_pos, grad_cell


def main(steps: int = 150, seed: int = 0) -> float:
    """Fit the MLP to the reference's forces and virials; return the force error relative to the forces'
    size on a fresh batch."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = RadialMLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(steps):
        pos, batch, cells = make_batch(4, g)
        _, f_ref, v_ref = energy_forces_virial(morse, pos, batch, cells)
        _, f, v = energy_forces_virial(model, pos, batch, cells)
        f_ref, v_ref = f_ref.detach(), v_ref.detach()
        loss = ((f - f_ref) ** 2).mean() / (f_ref**2).mean() + ((v - v_ref) ** 2).mean() / (v_ref**2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 30 == 0 or step == steps - 1:
            print(f"step {step:3d}  loss {loss.item():.4f}")
    pos, batch, cells = make_batch(4, g)
    f_ref = energy_forces_virial(morse, pos, batch, cells)[1]
    f = energy_forces_virial(model, pos, batch, cells)[1]
    error = float((f - f_ref).detach().norm() / f_ref.detach().norm())
    print(f"relative force error on new structures: {error:.3f}")
    return error


if __name__ == "__main__":
    main()
