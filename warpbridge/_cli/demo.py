"""`warpbridge demo`: the PhysicsNeMo tutorial's point-cloud model, trained three ways (four
for the radius variant: also with the tutorial's own Warp kernel and its wrong adjoint).

The model (as in the tutorial): an MLP learns features on a reference point cloud, an
aggregation carries them onto a 3-D grid of query points (radius or kNN variant), a second
MLP maps them to the output. Backends: dense PyTorch eager (the tutorial's formula),
``torch.compile`` of the whole model, and warpbridge's neighbour ops. Every backend starts
from the same weights and data; the table reports real measurements of this run and the
largest gradient error against a float64 dense reference at the initial weights.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .. import ops
from .measure import median_ms, peak_mib, sync

RADIUS, SIGMA, K = 0.2, 0.1, 7
BACKENDS = ("torch", "torch.compile", "warpbridge")
# The tutorial's own Warp kernel with Warp's generated adjoint (a wp.Tape in an
# autograd.Function): the bug warpbridge exists to fix. Radius only: the tutorial's kNN is
# cuML's, which has no gradient at all.
TUTORIAL = "tutorial kernel"


def backends(variant: str) -> tuple[str, ...]:
    return (*BACKENDS, TUTORIAL) if variant == "radius" else BACKENDS


def tutorial_radius(q, r, f):
    from . import tutorial as _tutorial

    return _tutorial.TapeFunction.apply(q, r, f, RADIUS, SIGMA)


@dataclass
class Sizes:
    grid: int  # queries: grid**3 points on [-1, 1]^3
    points: int  # reference points from N(0, 1)
    hidden: int
    steps: int
    repeat: int  # forward timings


def sizes(device: str, quick: bool) -> dict[str, Sizes]:
    if device == "cuda":  # the tutorial's sizes
        return {"radius": Sizes(30, 25_000, 25, 20, 10), "knn": Sizes(30, 100_000, 25, 20, 10)}
    if quick:
        return {"radius": Sizes(10, 1500, 16, 8, 3), "knn": Sizes(10, 1500, 16, 8, 3)}
    return {"radius": Sizes(20, 8000, 16, 15, 3), "knn": Sizes(20, 8000, 16, 15, 3)}


# -- the tutorial's model and its dense aggregations -----------------------------------------


class MLP(torch.nn.Sequential):
    def __init__(self, i: int, h: int, o: int):
        super().__init__(
            torch.nn.Linear(i, h), torch.nn.ReLU(), torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, o)
        )


def dense_radius(q, r, f):
    d = torch.cdist(q, r)
    logits = torch.where(d <= RADIUS, -d / SIGMA, float("-inf"))
    # softmax shifts by the row maximum; a row without neighbours is all -inf -> NaN -> 0
    return torch.softmax(logits, dim=1).nan_to_num(0.0) @ f


def dense_knn(q, r, f):
    d = torch.cdist(q, r)
    dist, idx = torch.topk(d, K, dim=1, largest=False)
    w = torch.softmax(-dist / SIGMA, dim=1)
    return (w.unsqueeze(-1) * f[idx]).sum(1)


def wb_radius(q, r, f):
    return ops.radius_aggregate(q, r, f, RADIUS, SIGMA)


def wb_knn(q, r, f):
    return ops.knn_aggregate(q, r, f, K, SIGMA)


class Projector(torch.nn.Module):
    def __init__(self, hidden: int, aggregate: Any):
        super().__init__()
        self.proj = MLP(3, hidden, hidden)
        self.proj_out = MLP(hidden, hidden, 1)
        self.aggregate = aggregate

    def forward(self, grid: torch.Tensor, cloud: torch.Tensor) -> torch.Tensor:
        return self.proj_out(self.aggregate(grid, cloud, self.proj(cloud)))


def make_data(s: Sizes, device: str, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    x = torch.linspace(-1, 1, s.grid, dtype=dtype)
    grid = torch.stack(torch.meshgrid(x, x, x, indexing="ij"), -1).reshape(-1, 3)
    cloud = torch.randn(s.points, 3, generator=g, dtype=dtype)
    target = (torch.sin(2 * grid[:, :1]) * torch.cos(2 * grid[:, 1:2]) + grid[:, 2:] ** 2).to(dtype)
    return grid.to(device), cloud.to(device), target.to(device)


# -- one backend ---------------------------------------------------------------------------------


@dataclass
class Result:
    forward_ms: float = 0.0
    step_ms: float = 0.0
    first_step_s: float = 0.0
    peak_mib: float = 0.0
    final_loss: float = 0.0
    max_grad_error: float = 0.0
    losses: list = field(default_factory=list)


def _grads(model, grid, cloud, target) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    torch.mean((model(grid, cloud) - target) ** 2).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def run_backend(name, variant, s, state, data, ref_grads, device, bar) -> Result:
    dense, ours = (dense_radius, wb_radius) if variant == "radius" else (dense_knn, wb_knn)
    aggregate = {"warpbridge": ours, TUTORIAL: tutorial_radius}.get(name, dense)
    model = Projector(s.hidden, aggregate).to(device)
    model.load_state_dict(state)
    run = torch.compile(model) if name == "torch.compile" else model
    grid, cloud, target = data
    res = Result()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.mean((run(grid, cloud) - target) ** 2)
        loss.backward()
        opt.step()
        return loss

    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    t = time.perf_counter()
    grads = _grads(run, grid, cloud, target)  # also the compile, for torch.compile
    sync(device)
    res.first_step_s = time.perf_counter() - t
    res.max_grad_error = max(
        float((g.double() - r).abs().max() / r.abs().max().clamp(min=1e-30)) for g, r in zip(grads, ref_grads)
    )
    with torch.no_grad():
        res.forward_ms = median_ms(lambda: run(grid, cloud), device, s.repeat)
    times = []
    for _ in range(s.steps):
        t = time.perf_counter()
        loss = step()
        sync(device)
        times.append((time.perf_counter() - t) * 1e3)
        res.losses.append(loss.item())
        bar.update(1)
    res.step_ms = sorted(times)[len(times) // 2]
    res.final_loss = res.losses[-1]
    model.load_state_dict(state)  # peak memory of one more step, from the same weights
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    res.peak_mib = peak_mib(step, device)
    return res


def run(device: str = "cpu", quick: bool = False, out: str | None = "demo-out", progress: bool = True) -> dict:
    """Train the tutorial's model with each backend and variant; return (and write) the results."""
    from tqdm.auto import tqdm

    torch.manual_seed(0)
    plan = sizes(device, quick)
    total = sum(len(backends(v)) * s.steps for v, s in plan.items())
    results: dict[str, Any] = {"meta": _meta(device, quick, plan), "variants": {}}
    with tqdm(total=total, desc="warpbridge demo", unit="step", disable=not progress) as bar:
        for variant, s in plan.items():
            data = make_data(s, device)
            model = Projector(s.hidden, None).to(device)
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            ref = Projector(s.hidden, dense_radius if variant == "radius" else dense_knn).to(device).double()
            ref.load_state_dict({k: v.double() for k, v in state.items()})
            ref_grads = _grads(ref, *(t.double() for t in data))
            del ref
            results["variants"][variant] = {}
            for name in backends(variant):
                bar.set_postfix_str(f"{variant}: {name}")
                r = run_backend(name, variant, s, state, data, ref_grads, device, bar)
                results["variants"][variant][name] = asdict(r)
    print(table(results))
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "demo.json"), "w") as fh:
            json.dump(results, fh, indent=2)
        plot(results, os.path.join(out, "demo.png"))
        print(f"wrote {os.path.join(out, 'demo.json')} and {os.path.join(out, 'demo.png')}")
    return results


def _meta(device: str, quick: bool, plan: dict) -> dict:
    import warp as wp

    name = torch.cuda.get_device_name() if device == "cuda" else (platform.processor() or platform.machine())
    return {
        "date": time.strftime("%Y-%m-%d"),
        "device": device,
        "device_name": name,
        "cpu_count": os.cpu_count(),
        "quick": quick,
        "torch": torch.__version__,
        "warp": wp.config.version,
        "sizes": {k: asdict(v) for k, v in plan.items()},
        "radius": RADIUS,
        "sigma": SIGMA,
        "k": K,
    }


def table(results: dict) -> str:
    lines = []
    for variant, rows in results["variants"].items():
        s = results["meta"]["sizes"][variant]
        what = f"radius {RADIUS}" if variant == "radius" else f"k = {K}"
        lines.append(f"\n{variant} aggregation ({s['grid']}^3 queries, {s['points']} points, {what}, sigma {SIGMA})")
        lines.append("| backend         | forward ms |   train step ms  | peak MiB | final loss | max grad error |")
        lines.append("|-----------------|-----------:|-----------------:|---------:|-----------:|---------------:|")
        base = rows["torch.compile"]["step_ms"]
        for name, r in rows.items():
            speed = f" ({base / r['step_ms']:.1f}x)" if name == "warpbridge" else ""
            lines.append(
                f"| {name:<15} | {r['forward_ms']:10.1f} | {r['step_ms']:8.1f}{speed:>8} | {r['peak_mib']:8.1f} "
                f"| {r['final_loss']:10.4f} | {r['max_grad_error']:14.1e} |"
            )
    lines.append("(speed-up in brackets: against torch.compile; gradient error: relative to a float64 dense model)")
    lines.append(
        f"({TUTORIAL}: the PhysicsNeMo tutorial's HashGrid kernel, its backward by Warp's generated adjoint "
        "(wp.Tape), which does not replay the neighbour loop: its gradients are wrong)"
    )
    return "\n".join(lines)


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = list(results["variants"])
    fig, axes = plt.subplots(3, len(variants), figsize=(5.5 * len(variants), 10.5), squeeze=False)
    colors = {"torch": "#888888", "torch.compile": "#ee7733", "warpbridge": "#0077bb", TUTORIAL: "#cc3311"}
    for col, variant in enumerate(variants):
        rows = results["variants"][variant]
        ax = axes[0][col]
        names = list(rows)
        ax.bar(names, [rows[n]["step_ms"] for n in names], color=[colors[n] for n in names])
        ax.set_yscale("log")
        ax.set_ylim(top=3 * max(rows[n]["step_ms"] for n in names))
        ax.set_ylabel("train step, ms (log)")
        ax.set_title(f"{variant} aggregation")
        for i, n in enumerate(names):
            ax.annotate(f"{rows[n]['step_ms']:.1f}", (i, rows[n]["step_ms"]), ha="center", va="bottom")
        # the gradient error is what the loss curves hide: they coincide at a glance even where
        # a gradient is wrong (the tutorial kernel's)
        ax = axes[1][col]
        errors = [max(rows[n]["max_grad_error"], 1e-12) for n in names]
        ax.bar(names, errors, color=[colors[n] for n in names])
        ax.set_yscale("log")
        ax.set_ylim(bottom=1e-9, top=30 * max(errors))
        ax.set_ylabel("largest gradient error vs float64 (log)")
        for i, n in enumerate(names):
            ax.annotate(f"{rows[n]['max_grad_error']:.1e}", (i, errors[i]), ha="center", va="bottom")
        ax = axes[2][col]
        for n in names:
            ax.plot(rows[n]["losses"], label=n, color=colors[n], ls="--" if n == "torch" else "-")
        ax.set_xlabel("Adam step")
        ax.set_ylabel("MSE loss")
        ax.legend(title="loss curves (gradient errors above)", title_fontsize="small")
    meta = results["meta"]
    fig.suptitle(f"warpbridge demo on {meta['device_name']} ({meta['device']}), {meta['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
