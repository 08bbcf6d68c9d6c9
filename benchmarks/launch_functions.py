"""Launch functions (several kernels, intermediates) differentiated through warpbridge, against
Warp's own ``wp.Tape`` loop, the same Warp code wrapped by hand in a ``torch.autograd.Function``
(what users write without warpbridge) and, for the rollout, the same model in plain PyTorch.

* **rollout**: 1000 steps of 10,000 particles under gravity and quadratic drag, as one launch
  function allocating two arrays a step, then a squared-distance loss: forward + backward time
  and the peak memory it adds. Also as a Python loop of 1000 calls of one in-place step kernel
  wrapped with ``in_out=("x", "v")``.
* **Warp's examples**: a training step (forward, backward) through kernels of Warp's own
  examples: SPH density (``core/example_sph.py``, a hash-grid query per particle) and the ray
  caster's downsampling (``optim/example_diffray.py``), each against the same step written with
  ``wp.Tape`` as the examples do; and one step of the fluid solver
  (``optim/example_fluid_checkpoint.py``: 512 x 512 cells, the example's 50 pressure
  iterations, 55 launches), from the velocities, density and pressure to the new density.

"by hand" is the usual port of Warp code to PyTorch: an ``autograd.Function`` whose forward runs
the function under a ``wp.Tape`` on ``wp.from_torch`` views and whose backward runs
``tape.backward`` with the incoming gradient. It pays PyTorch's autograd node like warpbridge
does, so it tells what of the gap to ``wp.Tape`` is PyTorch's and what is warpbridge's.

warpbridge runs each way users do: tensors with ``requires_grad``, the loss reduced in torch,
``.backward()`` accumulating into ``.grad``. "kept tape" is the default (the forward's tape
kept for the backward); "recompute" is ``wb.op(..., recompute=True)`` (the function re-run
under a fresh tape in the backward). Side by side in one process, interleaved rounds,
medians of 11 (for the examples, each the mean of 10 calls in a row: they take milliseconds).

Usage: python benchmarks/launch_functions.py [--quick] [--repeat 11] [--out DIR]
    -> table + DIR/launch_functions-<machine>.json (DIR: benchmarks/results)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from datetime import date

import numpy as np
import torch
import warp as wp
from warp.examples.core import example_sph as sph
from warp.examples.optim import example_diffray as diffray
from warp.examples.optim import example_fluid_checkpoint as fluid

import warpbridge as wb
from warpbridge._cli.measure import peak_mib

STEPS = 1000
N = 10_000
DT = 1e-3
DRAG = 0.1


@wp.kernel
def ballistic_step(
    x: wp.array(dtype=wp.vec3),
    v: wp.array(dtype=wp.vec3),
    x_new: wp.array(dtype=wp.vec3),
    v_new: wp.array(dtype=wp.vec3),
):
    i = wp.tid()
    a = wp.vec3(0.0, -9.8, 0.0) - DRAG * v[i] * wp.length(v[i])
    v_new[i] = v[i] + a * DT
    x_new[i] = x[i] + v_new[i] * DT


@wp.kernel
def ballistic_in_place(x: wp.array(dtype=wp.vec3), v: wp.array(dtype=wp.vec3)):
    # the same step as Warp's examples write it: the state updated in place
    i = wp.tid()
    v_new = v[i] + (wp.vec3(0.0, -9.8, 0.0) - DRAG * v[i] * wp.length(v[i])) * DT
    x[i] = x[i] + v_new * DT
    v[i] = v_new


@wp.kernel
def squared_distance(x: wp.array(dtype=wp.vec3), target: wp.array(dtype=wp.vec3), loss: wp.array(dtype=float)):
    i = wp.tid()
    d = x[i] - target[i]
    wp.atomic_add(loss, 0, wp.dot(d, d))


def rollout(
    x0: wp.array(dtype=wp.vec3),
    v0: wp.array(dtype=wp.vec3),
    target: wp.array(dtype=wp.vec3),
    loss: wp.array(dtype=float),
):
    x, v = x0, v0
    for _ in range(STEPS):
        x_new, v_new = wp.empty_like(x), wp.empty_like(v)
        wp.launch(ballistic_step, dim=x.shape[0], inputs=[x, v], outputs=[x_new, v_new])
        x, v = x_new, v_new
    wp.launch(squared_distance, dim=x.shape[0], inputs=[x, target], outputs=[loss])


def torch_rollout(x, v, target):
    gravity = torch.tensor([0.0, -9.8, 0.0])
    for _ in range(STEPS):
        v = v + (gravity - DRAG * v * v.norm(dim=1, keepdim=True)) * DT
        x = x + v * DT
    return ((x - target) ** 2).sum()


class ByHand(torch.autograd.Function):
    """Warp code wrapped by hand, as ported without warpbridge: the forward taped on views of
    the tensors, the tape kept on the context for the backward."""

    @staticmethod
    def forward(ctx, fn, out_shape, in_dtype, out_dtype, *tensors):
        views = [wp.from_torch(t.detach(), dtype=in_dtype, requires_grad=True) for t in tensors]
        out = torch.zeros(out_shape)
        out_view = wp.from_torch(out, dtype=out_dtype, requires_grad=True)
        tape = wp.Tape()
        with tape:
            kept = fn(*views, out_view)
        ctx.tape, ctx.views, ctx.out_view, ctx.kept = tape, views, out_view, kept  # kept: alive until backward
        return out

    @staticmethod
    def backward(ctx, grad):
        ctx.out_view.grad.assign(wp.from_torch(grad.contiguous(), dtype=ctx.out_view.dtype))
        ctx.tape.backward()
        return (None, None, None, None, *(wp.to_torch(v.grad) for v in ctx.views))


def rollout_cases(seed: int = 0, check: bool = True) -> dict:
    g = np.random.default_rng(seed)
    x0 = g.random((N, 3), dtype=np.float32)
    v0 = g.standard_normal((N, 3)).astype(np.float32)
    target = x0 + np.float32(0.5)
    kept, again = wb.op(rollout, output_dims=(1,)), wb.op(rollout, output_dims=(1,), recompute=True)
    xt, vt, tt = (torch.from_numpy(a) for a in (x0, v0, target))

    def through(op):
        x, v = xt.clone().requires_grad_(), vt.clone().requires_grad_()
        op(x, v, tt).sum().backward()
        return x.grad

    step = wb.op(ballistic_in_place, in_out=("x", "v"))

    def steps():
        x, v = xt.clone().requires_grad_(), vt.clone().requires_grad_()
        xs, vs = x, v
        for _ in range(STEPS):
            xs, vs = step(xs, vs)
        ((xs - tt) ** 2).sum().backward()
        return x.grad

    def tape():
        x = wp.array(x0, dtype=wp.vec3, requires_grad=True)
        v = wp.array(v0, dtype=wp.vec3, requires_grad=True)
        loss = wp.zeros(1, dtype=float, requires_grad=True)
        t = wp.Tape()
        with t:
            rollout(x, v, wp.array(target, dtype=wp.vec3), loss)
        t.backward(loss)
        return x.grad

    def plain_torch():
        x, v = xt.clone().requires_grad_(), vt.clone().requires_grad_()
        torch_rollout(x, v, tt).backward()
        return x.grad

    def by_hand():
        x, v = xt.clone().requires_grad_(), vt.clone().requires_grad_()
        ByHand.apply(rollout, (1,), wp.vec3, wp.float32, x, v, tt).sum().backward()
        return x.grad

    if check:
        ref = tape().numpy()
        for fn in (lambda: through(kept), lambda: through(again), steps, by_hand):
            np.testing.assert_allclose(fn().numpy(), ref, rtol=1e-4, atol=1e-4)
    return {
        "warpbridge (kept tape)": lambda: through(kept),
        "warpbridge (recompute)": lambda: through(again),
        "warpbridge (in_out op per step)": steps,
        "by hand (autograd.Function + wp.Tape)": by_hand,
        "wp.Tape": tape,
        "PyTorch": plain_torch,
    }


# -- Warp's own examples ----------------------------------------------------------------------

H = 0.04  # smoothing length
NORM = 1.0


def sph_density(x: wp.array(dtype=wp.vec3), rho: wp.array(dtype=float)):
    return _density(x, rho)


def _density(x, rho):
    grid = wp.HashGrid(64, 64, 64, device=x.device)
    grid.build(x, H)
    wp.launch(sph.compute_density, dim=x.shape[0], inputs=[grid.id, x, rho, NORM, H])
    return grid  # under a plain wp.Tape the caller must keep it alive until tape.backward()


@wp.kernel
def total(values: wp.array(dtype=float), loss: wp.array(dtype=float)):
    wp.atomic_add(loss, 0, values[wp.tid()])


@wp.kernel
def total_vec3(values: wp.array(dtype=wp.vec3), loss: wp.array(dtype=float)):
    v = values[wp.tid()]
    wp.atomic_add(loss, 0, v[0] + v[1] + v[2])


WIDTH, SAMPLES = 512, 4


def downsample(rays: wp.array(dtype=wp.vec3), pixels: wp.array(dtype=wp.vec3)):
    wp.launch(diffray.downsample_kernel, dim=pixels.shape[0], inputs=[rays, pixels, WIDTH, SAMPLES])


def example_cases(seed: int = 1) -> dict:
    g = np.random.default_rng(seed)
    pts = g.random((8000, 3), dtype=np.float32) * np.float32(0.6)
    rays = g.random((WIDTH * WIDTH, 3), dtype=np.float32)
    cases = {}
    for name, fn, data, reduce_kernel, dims in (
        ("SPH density, 8000 particles", sph_density, pts, total, None),
        ("diffray downsample, 512x512 rays", downsample, rays, total_vec3, ((WIDTH // SAMPLES) ** 2,)),
    ):
        op = wb.op(fn, output_dims=dims)
        t = torch.from_numpy(data)

        def through(op=op, t=t):
            x = t.clone().requires_grad_()
            op(x).sum().backward()
            return x.grad

        def tape(fn=fn, data=data, reduce_kernel=reduce_kernel, dims=dims):
            x = wp.array(data, dtype=wp.vec3, requires_grad=True)
            out_shape = dims[0] if dims else data.shape[0]
            out = wp.zeros(out_shape, dtype=wp.vec3 if reduce_kernel is total_vec3 else float, requires_grad=True)
            loss = wp.zeros(1, dtype=float, requires_grad=True)
            tp = wp.Tape()
            with tp:
                kept = fn(x, out)  # noqa: F841 - the hash grid, alive until the backward
                wp.launch(reduce_kernel, dim=out_shape, inputs=[out], outputs=[loss])
            tp.backward(loss)
            return x.grad

        out_dtype = wp.vec3 if reduce_kernel is total_vec3 else wp.float32
        out_shape = (dims[0], 3) if dims else (data.shape[0],)

        def by_hand(fn=fn, t=t, out_shape=out_shape, out_dtype=out_dtype):
            x = t.clone().requires_grad_()
            ByHand.apply(fn, out_shape, wp.vec3, out_dtype, x).sum().backward()
            return x.grad

        expected = tape().numpy()
        for way in (through, by_hand):
            np.testing.assert_allclose(way().numpy(), expected, rtol=1e-5, atol=1e-6)
        cases[name] = {
            "warpbridge (kept tape)": through,
            "by hand (autograd.Function + wp.Tape)": by_hand,
            "wp.Tape": tape,
        }
    return cases


JACOBI = 50  # the fluid example's pressure iterations a step


def fluid_step(vx: wp.array2d(dtype=float), vy: wp.array2d(dtype=float), density: wp.array2d(dtype=float),
               p: wp.array2d(dtype=float), density1: wp.array2d(dtype=float)):  # fmt: skip
    """One step of the fluid example, as its ``Example.step`` launches it."""
    shape = vx.shape
    wx, wy, div, vx1, vy1 = (wp.empty_like(vx) for _ in range(5))
    wp.launch(fluid.advect, shape, inputs=[1.0, vx, vy, vx], outputs=[wx])
    wp.launch(fluid.advect, shape, inputs=[1.0, vx, vy, vy], outputs=[wy])
    wp.launch(fluid.divergence, shape, inputs=[wx, wy], outputs=[div])
    for _ in range(JACOBI):
        p_next = wp.empty_like(vx)
        wp.launch(fluid.jacobi_iter, shape, inputs=[div, p], outputs=[p_next])
        p = p_next
    wp.launch(fluid.update_velocities, shape, inputs=[p, wx, wy], outputs=[vx1, vy1])
    wp.launch(fluid.advect, shape, inputs=[1.0, vx1, vy1, density], outputs=[density1])


def fluid_case(seed: int = 2) -> dict:
    """A training step through one fluid step and the example's loss: warpbridge (the loss in
    torch), by hand, and ``wp.Tape`` (the loss with the example's kernel)."""
    g = np.random.default_rng(seed)
    n = fluid.N_GRID
    vx0, vy0, p0 = (g.standard_normal((n, n)).astype(np.float32) for _ in range(3))
    density0 = wp.zeros((n, n), dtype=float)
    wp.launch(fluid.fill_initial_density, (n, n), inputs=[density0])
    data = [vx0, vy0, density0.numpy(), 1e-5 * p0]
    target = g.random((n, n), dtype=np.float32)
    op = wb.op(fluid_step)
    tensors, tt = [torch.from_numpy(a) for a in data], torch.from_numpy(target)

    def loss(density1):
        return ((density1 - tt) ** 2).sum() / (n * n)

    def through():
        vx, vy = tensors[0].clone().requires_grad_(), tensors[1].clone().requires_grad_()
        loss(op(vx, vy, *tensors[2:])).backward()
        return vx.grad

    def by_hand():
        vx, vy = tensors[0].clone().requires_grad_(), tensors[1].clone().requires_grad_()
        loss(ByHand.apply(fluid_step, (n, n), wp.float32, wp.float32, vx, vy, *tensors[2:])).backward()
        return vx.grad

    def tape():
        fields = [wp.array(a, dtype=float, requires_grad=k < 2) for k, a in enumerate(data)]
        density1 = wp.zeros((n, n), dtype=float, requires_grad=True)
        out = wp.zeros(1, dtype=float, requires_grad=True)
        t = wp.Tape()
        with t:
            fluid_step(*fields, density1)
            wp.launch(fluid.compute_loss, (n, n), inputs=[density1, wp.array(target, dtype=float)], outputs=[out])
        t.backward(out)
        return fields[0].grad

    expected = tape().numpy()
    for way in (through, by_hand):
        np.testing.assert_allclose(way().numpy(), expected, rtol=1e-4, atol=1e-9)
    return {"warpbridge (kept tape)": through, "by hand (autograd.Function + wp.Tape)": by_hand, "wp.Tape": tape}


def interleaved(fns: dict, repeat: int, inner: int = 1) -> tuple[dict, dict]:
    """Per function, its ms per call (the mean of ``inner`` calls in a row) in each of
    ``repeat`` rounds, and its page faults per call. Each round runs every function, in an
    order reversed every other round, so drift on a noisy machine hits every function alike.
    A fault maps a fresh page of memory: the C heap hands freed memory back to the system or
    not depending on what ran before, and a step that then faults in its buffers page by page
    runs slower; the count shows when that happened."""
    for fn in fns.values():
        fn()  # warm: modules loaded, plans made
    times: dict = {k: [] for k in fns}
    faults: dict = dict.fromkeys(fns, 0)
    order = list(fns)
    for r in range(repeat):
        for k in order if r % 2 == 0 else order[::-1]:
            before = _minor_faults()
            t = time.perf_counter()
            for _ in range(inner):
                fns[k]()
            times[k].append((time.perf_counter() - t) * 1e3 / inner)
            faults[k] += _minor_faults() - before
    return times, {k: n / (repeat * inner) for k, n in faults.items()}


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def paired_ratio(times: list, against: list) -> float:
    """The median over rounds of one function's time over another's in the same round: the
    ratio a noisy machine moves least."""
    return statistics.median(a / b for a, b in zip(times, against))


def _rows(case: str, measured: tuple[dict, dict], mem: dict) -> list:
    """A row per way: its median ms, against wp.Tape the ratio of medians and the paired
    per-round ratio, and its page faults per call."""
    times, faults = measured
    tape = times["wp.Tape"]
    return [
        {
            "case": case,
            "way": way,
            "ms": statistics.median(t),
            "vs_tape": statistics.median(t) / statistics.median(tape),
            "paired_vs_tape": paired_ratio(t, tape),
            "peak_mib": mem.get(way),
            "faults_per_call": faults[way],
        }
        for way, t in times.items()
    ]


def peak_in_own_process(way: str, quick: bool) -> float:
    """The rollout ``way``'s peak memory, measured in a fresh process: in one shared by every
    way, a way reuses the heap pages the previous one freed and its peak reads low."""
    cmd = [sys.executable, __file__, "--peak-of", way] + (["--quick"] if quick else [])
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    global STEPS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=11)
    ap.add_argument("--quick", action="store_true", help="100 steps, 3 rounds (a smoke run)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--peak-of", help=argparse.SUPPRESS)  # internal: one way's peak, in this process
    args = ap.parse_args()
    if args.quick:
        STEPS, args.repeat = 100, 3
    wp.config.quiet = True
    wp.init()
    if args.peak_of:
        # the way's first call: no earlier call's freed pages to reuse (its kernels are cached on disk)
        print(json.dumps(peak_mib(rollout_cases(check=False)[args.peak_of], "cpu")))
        return
    started = time.time()
    rows = []
    fns = rollout_cases()
    measured = interleaved(fns, args.repeat)
    mem = {k: peak_in_own_process(k, args.quick) for k in fns}
    rows.extend(_rows(f"rollout, {STEPS} steps x {N} particles", measured, mem))
    for case, case_fns in example_cases().items():
        measured = interleaved(case_fns, args.repeat, inner=10)  # milliseconds a call: 10 in a row
        rows.extend(_rows(case, measured, {}))
    rows.extend(_rows(f"fluid step, 512x512, {JACOBI} pressure iterations", interleaved(fluid_case(), args.repeat), {}))
    head = f"{'case':44s} {'way':38s} {'median ms':>10s} {'x wp.Tape':>10s} {'paired':>7s} {'peak MiB':>9s}"
    print(f"{head} {'faults/call':>12s}")
    for r in rows:
        mib = f"{r['peak_mib']:.0f}" if r["peak_mib"] is not None else "-"
        line = f"{r['case']:44s} {r['way']:38s} {r['ms']:10.2f} {r['vs_tape']:10.2f} {r['paired_vs_tape']:7.2f}"
        print(f"{line} {mib:>9s} {r['faults_per_call']:12.0f}")
    machine = f"{platform.machine()}-{os.cpu_count()}cpu"
    out = {
        "date": date.today().isoformat(),
        "machine": machine,
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "warp": wp.config.version,
        "threads": torch.get_num_threads(),
        "repeat": args.repeat,
        "quick": args.quick,
        "seconds": round(time.time() - started, 1),
        "rows": rows,
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"launch_functions-{machine}.json")
    with open(path, "w") as fh:
        json.dump(out, fh, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
