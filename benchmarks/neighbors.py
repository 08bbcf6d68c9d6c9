"""Point-cloud neighbour ops: warpbridge against dense PyTorch, torch.compile, the tutorial's
Warp kernel, SciPy's cKDTree and pykdtree, side by side in one process.

Radius aggregation (issue sizes, CPU): 20^3 grid queries on [-1, 1]^3, 8 000 reference points
from N(0, 1), F = 16, radius 0.2, sigma 0.1. "step" = forward + backward for query, ref and
features (torch.autograd.grad, the op alone). "train step" = the step as users run it: a
Linear before the op and a Linear + MSE loss after it, loss.backward() accumulating into
.grad of the parameters and both point sets, an optimizer step, PyTorch's default threads. kNN aggregation: 30^3 grid queries, 100 000 reference points, k = 7, F = 16.
With --device cuda: the tutorial's GPU sizes (25 000 points, 30^3 grid, F = 25).

Peak memory on the CPU is the process's peak RSS above its level before the measurement
(Linux: /proc/self/clear_refs resets the high-water mark); on CUDA, torch.cuda peak stats.
Medians of per-call wall times after warm-up.

Usage: python benchmarks/neighbors.py [--quick] [--device cpu|cuda]
       -> table + benchmarks/results/neighbors-<machine>.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from datetime import date

import numpy as np
import torch
import warp as wp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import warpbridge as wb  # noqa: E402
from warpbridge._cli import tutorial as _tutorial  # noqa: E402
from warpbridge._cli.measure import median_ms, peak_mib  # noqa: E402

# -- the dense formulas the tutorial starts from ----------------------------------------------


def dense_radius(q, r, f, radius, sigma):
    d = torch.cdist(q, r)
    w = torch.where(d <= radius, torch.exp(-d / sigma), torch.zeros_like(d))
    return (w @ f) / (w.sum(1, keepdim=True) + 1e-8)


def kdtree_knn_aggregate(q, r, f, k, sigma):
    from scipy.spatial import cKDTree

    dist, idx = cKDTree(r.numpy()).query(q.numpy(), k=k, workers=-1)
    dist = torch.from_numpy(dist).to(q.dtype)
    w = torch.softmax(-dist / sigma, dim=1)
    return (w.unsqueeze(-1) * f[torch.from_numpy(idx)]).sum(1)


def pykdtree_knn_aggregate(q, r, f, k, sigma):
    """The same with pykdtree, the fastest CPU kd-tree in the distribution benchmark."""
    from pykdtree.kdtree import KDTree

    dist, idx = KDTree(r.numpy()).query(q.numpy(), k=k)
    w = torch.softmax(-torch.from_numpy(dist).to(q.dtype) / sigma, dim=1)
    return (w.unsqueeze(-1) * f[torch.from_numpy(idx.astype(np.int64))]).sum(1)


def tutorial_forward(q, r, f, radius, sigma):
    """The tutorial's recipe: a HashGrid built per call (dims from the [-1, 1] query box)."""
    return _tutorial.forward(q, r, f, radius, sigma)


# -- measurement ------------------------------------------------------------------------------


def machine_floor():
    """Sustained memory bandwidth (a 256 MiB copy) and float32 matmul rate of this machine."""
    a = np.ones(2**26, dtype=np.float32)
    b = np.empty_like(a)
    t = min(_timed(lambda: np.copyto(b, a)) for _ in range(5))
    bandwidth = 2 * a.nbytes / t
    x = torch.randn(1024, 1024)
    torch.mm(x, x)
    t = min(_timed(lambda: torch.mm(x, x)) for _ in range(5))
    return bandwidth, 2 * 1024**3 / t


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# -- the runs ----------------------------------------------------------------------------------


def data(device, dtype, n_grid, n_ref, n_feat, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.linspace(-1, 1, n_grid, dtype=dtype)
    grid = torch.stack(torch.meshgrid(x, x, x, indexing="ij"), -1).reshape(-1, 3)
    cloud = torch.randn(n_ref, 3, generator=g, dtype=dtype)
    feats = torch.randn(n_ref, n_feat, generator=g, dtype=dtype)
    return grid.to(device), cloud.to(device), feats.to(device)


def step_fn(fn, q, r, f):
    ins = [t.detach().clone().requires_grad_() for t in (q, r, f)]
    g = None

    def step():
        nonlocal g
        out = fn(*ins)
        if g is None:
            g = torch.randn_like(out)
        torch.autograd.grad(out, ins, g)

    return step


def train_step_fn(agg, q, r, f):
    """A training step as users run it: a Linear on the reference features before the op, a
    Linear and an MSE loss after it, ``loss.backward()`` accumulating into ``.grad`` of the
    parameters and of both point sets, then an SGD step (lr 0, so every step does the same
    work). PyTorch's default threads: its OpenMP workers spin after each of its ops."""
    torch.manual_seed(0)
    nf = f.shape[1]
    pre = torch.nn.Linear(nf, nf).to(device=q.device, dtype=q.dtype)
    post = torch.nn.Linear(nf, 1).to(device=q.device, dtype=q.dtype)
    qq, rr = (t.detach().clone().requires_grad_() for t in (q, r))
    target = torch.zeros(q.shape[0], 1, device=q.device, dtype=q.dtype)
    opt = torch.optim.SGD([*pre.parameters(), *post.parameters(), qq, rr], lr=0.0)

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(post(agg(qq, rr, pre(f))), target)
        loss.backward()
        opt.step()

    return step


def radius_rows(args, q, r, f, radius, sigma):
    dev, rep = args.device, args.repeat
    rows = {}
    ours = lambda a, b, c: wb.ops.radius_aggregate(a, b, c, radius, sigma)

    def measure(name, fwd, step, rep_fwd=rep, rep_step=rep, extra=None):
        with torch.no_grad():
            row = {"forward_ms": median_ms(fwd, dev, rep_fwd)}
        if step is not None:
            row["step_ms"] = median_ms(step, dev, rep_step)
            row["peak_step_mib"] = peak_mib(step, dev)
        row.update(extra or {})
        rows[name] = row
        print(f"  {name:<34} " + "  ".join(f"{k}={v:.3g}" for k, v in row.items()), flush=True)

    if not args.only_ours:
        dense_rep = max(2, rep // 5)
        measure("dense eager", lambda: dense_radius(q, r, f, radius, sigma), None, dense_rep)
        dense = lambda a, b, c: dense_radius(a, b, c, radius, sigma)
        rows["dense eager"]["step_ms"] = median_ms(step_fn(dense, q, r, f), dev, dense_rep)
        rows["dense eager"]["peak_step_mib"] = peak_mib(step_fn(dense, q, r, f), dev)
        compiled = torch.compile(dense_radius)
        t = time.perf_counter()
        step_fn(lambda a, b, c: compiled(a, b, c, radius, sigma), q, r, f)()
        with torch.no_grad():
            compiled(q, r, f, radius, sigma)
        compile_s = time.perf_counter() - t
        measure(
            "dense torch.compile",
            lambda: compiled(q, r, f, radius, sigma),
            None,
            dense_rep,
            extra={"compile_s": compile_s},
        )
        cstep = step_fn(lambda a, b, c: compiled(a, b, c, radius, sigma), q, r, f)
        rows["dense torch.compile"]["step_ms"] = median_ms(cstep, dev, dense_rep)
        rows["dense torch.compile"]["peak_step_mib"] = peak_mib(cstep, dev)
        ctrain = train_step_fn(lambda a, b, c: compiled(a, b, c, radius, sigma), q, r, f)
        rows["dense torch.compile"]["train_step_ms"] = median_ms(ctrain, dev, dense_rep)
        measure("tutorial Warp kernel (forward only)", lambda: tutorial_forward(q, r, f, radius, sigma), None)
    for name in warpbridge_configs(args):
        measure(name, lambda: ours(q, r, f), step_fn(ours, q, r, f))
        rows[name]["train_step_ms"] = median_ms(train_step_fn(ours, q, r, f), dev, rep)
        print(f"  {name:<34} train_step_ms={rows[name]['train_step_ms']:.3g}", flush=True)
    return rows


def warpbridge_configs(args):
    """Set warpbridge's CPU threads to 1, then all cores, yielding each row's name."""
    threads = [1, os.cpu_count() or 1] if args.device == "cpu" else [None]
    try:
        for n in dict.fromkeys(threads):
            if n is not None:
                wb.ops.set_num_threads(n)
            name = "warpbridge" + (f" ({n} thread{'s' if n > 1 else ''})" if n else "")
            yield name + (" [OMP_WAIT_POLICY=passive]" if args.only_ours else "")
    finally:
        wb.ops.set_num_threads(None)


def knn_rows(args, q, r, f, k, sigma):
    dev, rep = args.device, args.repeat
    rows = {}
    if dev == "cpu" and not args.only_ours:
        t = median_ms(lambda: kdtree_knn_aggregate(q, r, f, k, sigma), dev, rep)
        rows["scipy cKDTree(workers=-1) + gather + softmax"] = {"forward_ms": t}
        if importlib.util.find_spec("pykdtree") is not None:
            t = median_ms(lambda: pykdtree_knn_aggregate(q, r, f, k, sigma), dev, rep)
            rows["pykdtree (OpenMP) + gather + softmax"] = {"forward_ms": t}
    for name in warpbridge_configs(args):
        with torch.no_grad():
            rows[name] = {"forward_ms": median_ms(lambda: wb.ops.knn_aggregate(q, r, f, k, sigma), dev, rep)}
        rows[name]["step_ms"] = median_ms(
            step_fn(lambda a, b, c: wb.ops.knn_aggregate(a, b, c, k, sigma), q, r, f), dev, rep
        )
    for name, row in rows.items():
        print(f"  {name:<34} " + "  ".join(f"{a}={v:.3g}" for a, v in row.items()), flush=True)
    return rows


def floor(q, r, f, radius, pairs, bandwidth, flops):
    """Minimum bytes and FLOPs any implementation must spend on one radius train step."""
    m, n, nf = q.shape[0], r.shape[0], f.shape[1]
    item = q.element_size()
    # forward: read points and features, write the output; backward: read them again with
    # the output gradient, write three gradients.
    fwd_bytes = (3 * m + 3 * n + nf * n + nf * m) * item
    step_bytes = fwd_bytes + (3 * m + 3 * n + 2 * nf * n + 2 * nf * m + 3 * m + 3 * n) * item
    # per neighbour pair: distance (8), weight (exp counted as 1), weighted sum (2F);
    # backward: weight again (10), feature gradient (2F), g.f (2F), two position gradients (12).
    fwd_flops = pairs * (9 + 2 * nf)
    step_flops = fwd_flops + pairs * (22 + 4 * nf)
    t_fwd = max(fwd_bytes / bandwidth, fwd_flops / flops)
    t_step = max(step_bytes / bandwidth, step_flops / flops)
    return {
        "pairs": pairs,
        "forward_bytes": fwd_bytes,
        "forward_flops": fwd_flops,
        "step_bytes": step_bytes,
        "step_flops": step_flops,
        "bandwidth_GBps": bandwidth / 1e9,
        "matmul_GFLOPs": flops / 1e9,
        "floor_forward_ms": t_fwd * 1e3,
        "floor_step_ms": t_step * 1e3,
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--repeat", type=int, default=None)
    p.add_argument("--only-ours", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)
    args.repeat = args.repeat or (3 if args.quick else 15)
    dev = args.device
    if dev == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here")
    torch.manual_seed(0)
    wb.op  # noqa: B018  (import side effects: Warp initialised by warpbridge)
    from warpbridge._core.warp_runtime import ensure_init

    ensure_init()

    if dev == "cpu":
        n_grid, n_ref, n_feat = 20, 8000, 16
    else:
        n_grid, n_ref, n_feat = 30, 25000, 25
    radius, sigma = 0.2, 0.1
    q, r, f = data(dev, torch.float32, n_grid, n_ref, n_feat)
    print(f"radius_aggregate: {q.shape[0]} queries, {n_ref} points, F={n_feat}, radius {radius}, sigma {sigma}")
    result = {"radius": radius_rows(args, q, r, f, radius, sigma)}

    qk, rk, fk = data(dev, torch.float32, 30, 100_000, 16 if dev == "cpu" else 1, seed=1)
    print(f"knn_aggregate: {qk.shape[0]} queries, {rk.shape[0]} points, k=7")
    result["knn"] = knn_rows(args, qk, rk, fk, 7, sigma)

    if args.only_ours:
        print("JSON " + json.dumps(result))
        return result

    if dev == "cpu":
        # The same warpbridge rows with OpenMP threads that sleep instead of spin (see docs).
        env = dict(os.environ, OMP_WAIT_POLICY="passive")
        cmd = [sys.executable, __file__, "--only-ours", "--repeat", str(args.repeat)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        passive = json.loads(out.rsplit("JSON ", 1)[1])
        for section in ("radius", "knn"):
            result[section].update(passive[section])
            for name, row in passive[section].items():
                print(f"  {name:<34} " + "  ".join(f"{a}={v:.3g}" for a, v in row.items()))

    pairs = int((torch.cdist(q, r) <= radius).sum()) if dev == "cpu" else None
    bw, fl = machine_floor() if dev == "cpu" else (None, None)
    summary = summarise(result, dev)
    if pairs is not None:
        result["floor"] = floor(q, r, f, radius, pairs, bw, fl)
        best = min(v["step_ms"] for k, v in result["radius"].items() if k.startswith("warpbridge"))
        result["floor"]["fraction_of_floor_step"] = result["floor"]["floor_step_ms"] / best
    result["summary"] = summary
    print_table(result)

    device_name = torch.cuda.get_device_name() if dev == "cuda" else platform.processor() or platform.machine()
    meta = {
        "date": date.today().isoformat(),
        "device": device_name,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "warp": wp.config.version,
        "repeat": args.repeat,
    }
    os.makedirs(args.out, exist_ok=True)
    tag = "cuda-" + device_name.replace(" ", "_") if dev == "cuda" else f"{platform.machine()}-{os.cpu_count()}cpu"
    path = os.path.join(args.out, f"neighbors-{tag}.json")
    with open(path, "w") as fh:
        json.dump({"meta": meta, **result}, fh, indent=2)
    print(f"wrote {path}")
    return result


def summarise(result, dev):
    rad, knn = result["radius"], result["knn"]
    ours = {k: v for k, v in rad.items() if k.startswith("warpbridge")}
    best_step = min(v["step_ms"] for v in ours.values())
    default_rows = {k: v for k, v in ours.items() if "passive" not in k}
    best_default = min(v["step_ms"] for v in default_rows.values())
    s = {}
    if "dense torch.compile" in rad:
        c = rad["dense torch.compile"]
        s["step_speedup_vs_compile"] = c["step_ms"] / best_default
        s["step_speedup_vs_compile_omp_passive"] = c["step_ms"] / best_step
        if "train_step_ms" in c:
            # the realistic step: .grad accumulation, torch ops around the op, default threads
            best_train = min(v["train_step_ms"] for v in default_rows.values())
            s["train_step_speedup_vs_compile"] = c["train_step_ms"] / best_train
            passive = [v["train_step_ms"] for k, v in ours.items() if "passive" in k]
            if passive:
                s["train_step_speedup_vs_compile_omp_passive"] = c["train_step_ms"] / min(passive)
        ours_peak = min(v["peak_step_mib"] for v in default_rows.values())
        s["peak_memory_ratio_vs_compile"] = ours_peak / c["peak_step_mib"] if c["peak_step_mib"] else None
        s["forward_speedup_vs_tutorial_kernel"] = rad["tutorial Warp kernel (forward only)"]["forward_ms"] / min(
            v["forward_ms"] for v in default_rows.values()
        )
    kd = knn.get("scipy cKDTree(workers=-1) + gather + softmax")
    if kd:
        best = min(v["forward_ms"] for k, v in knn.items() if k.startswith("warpbridge") and "passive" not in k)
        s["knn_speedup_vs_ckdtree"] = kd["forward_ms"] / best
        pk = knn.get("pykdtree (OpenMP) + gather + softmax")
        if pk:
            s["knn_speedup_vs_pykdtree"] = pk["forward_ms"] / best
    return s


def print_table(result):
    print("\nradius_aggregate")
    print(f"| {'implementation':<46} | forward ms | step ms | train step ms | peak step MiB |")
    print(f"|{'-' * 48}|-----------:|--------:|--------------:|--------------:|")
    for name, row in result["radius"].items():
        step = f"{row['step_ms']:.1f}" if "step_ms" in row else "-"
        train = f"{row['train_step_ms']:.1f}" if "train_step_ms" in row else "-"
        peak = f"{row['peak_step_mib']:.1f}" if "peak_step_mib" in row else "-"
        print(f"| {name:<46} | {row['forward_ms']:10.1f} | {step:>7} | {train:>13} | {peak:>13} |")
    print("\nknn_aggregate")
    print(f"| {'implementation':<46} | forward ms | step ms |")
    print(f"|{'-' * 48}|-----------:|--------:|")
    for name, row in result["knn"].items():
        step = f"{row['step_ms']:.1f}" if "step_ms" in row else "-"
        print(f"| {name:<46} | {row['forward_ms']:10.1f} | {step:>7} |")
    if "floor" in result:
        fl = result["floor"]
        print(
            f"\nphysical floor of one radius train step: {fl['pairs']} pairs, {fl['step_bytes'] / 1e6:.2f} MB, "
            f"{fl['step_flops'] / 1e6:.1f} MFLOP -> {fl['floor_step_ms']:.2f} ms at {fl['bandwidth_GBps']:.1f} GB/s "
            f"and {fl['matmul_GFLOPs']:.0f} GFLOP/s; warpbridge reaches {100 * fl['fraction_of_floor_step']:.0f}%"
        )
    print("summary: " + ", ".join(f"{k}={v:.3g}" for k, v in result["summary"].items() if v is not None))


if __name__ == "__main__":
    main()
