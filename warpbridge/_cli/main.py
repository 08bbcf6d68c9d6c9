"""The ``warpbridge`` command: ``demo``, ``bench`` and ``doctor``.

Exit codes: 0 on success, 1 on failure (including bad options, with a message on stderr).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

BENCHMARKS = (
    "overhead",
    "neighbors",
    "grad_buffer",
    "memory_pool",
    "launch_functions",
    "lists",
    "batches",
    "dimensions",
    "point_models",
    "threads",
    "atomistic",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits with 2; the documented code is 1
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="warpbridge", description="NVIDIA Warp kernels as differentiable framework ops.")
    sub = p.add_subparsers(dest="command", metavar="{demo,bench,doctor}", parser_class=_Parser)
    sub.required = True
    d = sub.add_parser(
        "demo",
        help="train the PhysicsNeMo tutorial's point-cloud model with torch, torch.compile and warpbridge",
        description="Train the tutorial's point-cloud model (MLP -> radius or kNN aggregation onto a 3-D "
        "grid -> MLP) with dense PyTorch, torch.compile and warpbridge side by side; print timings, peak "
        "memory, final loss and gradient error against float64; write DIR/demo.json and DIR/demo.png.",
    )
    d.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="default: cpu")
    d.add_argument("--quick", action="store_true", help="small sizes, under a minute on 2 CPU cores")
    d.add_argument("--out", default="demo-out", metavar="DIR", help="output folder (default: demo-out)")
    d.add_argument("--no-progress", action="store_true", help="no progress bar")
    b = sub.add_parser(
        "bench",
        help="run the benchmarks and write their JSON and charts",
        description="Run benchmarks/overhead.py, neighbors.py, grad_buffer.py and memory_pool.py (from a source "
        "checkout), "
        "print their tables, and write JSON and PNG charts to DIR.",
    )
    b.add_argument("--quick", action="store_true", help="fewer repeats")
    b.add_argument("--out", default="bench-out", metavar="DIR", help="output folder (default: bench-out)")
    b.add_argument("--only", choices=BENCHMARKS, action="append", help="run only this benchmark (repeatable)")
    sub.add_parser(
        "doctor",
        help="versions, devices, Warp's kernel cache, and which frameworks are usable",
        description="Report versions (warp-lang, torch, jax, paddle, numpy, Python), devices, Warp's kernel "
        "cache location, and which frameworks warpbridge can use here and why not.",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    problem = _unwritable(args.out) if args.command in ("demo", "bench") else None
    if problem:  # before any work: a run must not train for a minute and then fail to save
        print(f"warpbridge {args.command}: error: --out {args.out!r}: {problem}", file=sys.stderr)
        return 1
    try:
        if args.command == "demo":
            return demo(args)
        if args.command == "bench":
            return bench(args)
        return doctor()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130  # the shell's code for SIGINT
    except Exception as e:  # a clear one-line failure, exit code 1
        print(f"warpbridge {args.command}: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


def _unwritable(out: str) -> str | None:
    """Why ``out`` cannot become the output folder, or None. Creates nothing: the nearest
    existing ancestor must be a folder this process may write into."""
    if not out.strip():
        return "an empty path; name a folder"
    path = Path(out).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


def demo(args: argparse.Namespace) -> int:
    missing = [m for m in ("torch", "tqdm", "matplotlib") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"warpbridge demo: error: needs {', '.join(missing)}: pip install 'warpbridge[demo]'", file=sys.stderr)
        return 1
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("warpbridge demo: error: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 1
    from . import demo as _demo

    quiet_warp(keep_cuda_warning=args.device == "cuda")
    _demo.run(args.device, args.quick, args.out, progress=not args.no_progress)
    return 0


_NO_DRIVER = b"Could not find or load the NVIDIA CUDA driver"


def quiet_warp(keep_cuda_warning: bool = False) -> None:
    """Initialise Warp without its banner, its per-module load lines and (on a CPU-only run)
    the native warning that no CUDA driver is present: they would cut through the progress
    bar. Anything else Warp's native code writes to stderr while initialising is passed on."""
    import tempfile

    import warp as wp

    from .._core.warp_runtime import ensure_init

    wp.config.log_level = wp.LOG_WARNING
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            ensure_init()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        lines = tmp.read().splitlines(keepends=True)
    kept = b"".join(x for x in lines if keep_cuda_warning or _NO_DRIVER not in x)
    if kept:
        sys.stderr.buffer.write(kept)
        sys.stderr.flush()


def _benchmarks_dir() -> Path | None:
    d = Path(__file__).resolve().parents[2] / "benchmarks"
    return d if (d / "overhead.py").exists() else None


def bench(args: argparse.Namespace) -> int:
    where = _benchmarks_dir()
    if where is None:
        print(
            "warpbridge bench: error: the benchmark scripts ship with the source checkout, not the wheel",
            file=sys.stderr,
        )
        return 1
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    status = 0
    for name in args.only or BENCHMARKS:
        cmd = [sys.executable, str(where / f"{name}.py"), "--out", str(out)] + (["--quick"] if args.quick else [])
        print(f"$ {' '.join(cmd)}", flush=True)
        if subprocess.run(cmd).returncode != 0:
            print(f"warpbridge bench: error: {name} failed", file=sys.stderr)
            status = 1
    charts = _charts(out)
    for c in charts:
        print(f"wrote {c}")
    return status


def _charts(out: Path) -> list[Path]:
    """One bar chart per benchmark JSON in ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for path in sorted(out.glob("*.json")):
        data = json.loads(path.read_text())
        sections = _chart_sections(path.name, data)
        if sections is None:
            continue
        sections = {k: v for k, v in sections.items() if v}
        if not sections:
            continue
        fig, axes = plt.subplots(len(sections), 1, figsize=(9, 3.2 * len(sections)), squeeze=False)
        for ax, (title, rows) in zip(axes[:, 0], sections.items()):
            names = list(rows)
            values = [rows[n] for n in names]
            ax.barh(names, values, color=["#0077bb" if "warpbridge" in n else "#999999" for n in names])
            ax.set_xscale("log")
            # bars on a log axis start at its left edge: start it a decade below, and label each bar
            ax.set_xlim(left=10 ** (math.floor(math.log10(min(values))) - 1), right=max(values) * 3)
            for y, v in enumerate(values):
                ax.annotate(f"{v:.3g}", (v, y), xytext=(3, 0), textcoords="offset points", va="center")
            ax.set_title(title)
            ax.invert_yaxis()
        fig.tight_layout()
        png = path.with_suffix(".png")
        fig.savefig(png, dpi=100)
        plt.close(fig)
        written.append(png)
    return written


def _chart_sections(name: str, data: dict) -> dict | None:
    """The bar groups of one benchmark JSON (None: not a benchmark to chart)."""
    if name.startswith("overhead"):
        sections = {"per-call overhead, µs (median)": data.get("median_us", {})}
    elif name.startswith("neighbors"):
        sections = {
            "radius_aggregate train step, ms": {k: v["step_ms"] for k, v in data["radius"].items() if "step_ms" in v},
            "knn_aggregate forward, ms": {k: v["forward_ms"] for k, v in data["knn"].items()},
        }
    elif name.startswith("grad_buffer"):
        rows = {**data.get("one_process", {}), **data.get("two_processes", {})}
        sections = {
            f"train step, ms ({model})": {
                k.split("|", 1)[1].strip(): v["step_ms"] for k, v in rows.items() if k.startswith(model)
            }
            for model in dict.fromkeys(k.split("|")[0].strip() for k in rows)
        }
    elif name.startswith("memory_pool"):
        sections = {
            f"{case}, ms": {f"{pool} pool": row["ms"] for pool, row in pools.items()}
            for case, pools in data["median"].items()
        }
    elif name.startswith("lists-huge"):
        rows = data["rows"]
        sections = {
            "lists past 2^28 edges, seconds": {r["graph"]: r["seconds"] for r in rows},
            "lists past 2^28 edges, process peak GiB": {r["graph"]: r["process_peak_gib"] for r in rows},
        }
    elif name.startswith("bounded"):
        sections = {"bounded time, seconds": {r["workload"]: r["seconds"] for r in data["rows"]}}
    elif name.startswith("interrupt"):
        sections = {"Ctrl-C to exception, median seconds": {r["case"]: r["median_s"] for r in data["rows"]}}
    elif name.startswith(("distributions", "lists", "batches", "dimensions")):
        sections = _neighbour_sections(name, data)
    elif name.startswith("threads"):
        sections = {}
        for r in data["rows"]:
            sections.setdefault(f"default threads / one thread, {r['condition']}", {})[r["case"]] = r["ratio"]
    elif name.startswith(("atomistic", "point_models")):
        sections = {f"{r['case']}, {r['threads']} thread(s): ms": r["ms"] for r in data["rows"]}
    elif name.startswith("gpu_point_models"):
        sections = {f"{r['case']}, {r['device']}: ms": r["ms"] for r in data["rows"]}
    elif name.startswith("scale"):
        rows = data["rows"]
        sections = {
            "kNN, seconds": {f"{r['distribution']} N={r['n']:.0e}": r["knn_s"] for r in rows},
            "kNN, peak MiB": {f"{r['distribution']} N={r['n']:.0e}": r["knn_peak_mib"] for r in rows},
        }
    elif name.startswith("launch_functions"):
        sections = {}
        for r in data["rows"]:
            sections.setdefault(f"{r['case']}: forward + backward, ms", {})[r["way"]] = r["ms"]
    elif name.startswith("call_walk"):
        rows = data["rows"]
        sections = {
            "files one call crosses": {k: v["files"] for k, v in rows.items()},
            "changes of file in one call": {k: v["file_changes"] for k, v in rows.items()},
        }
    elif name.startswith("soak"):
        rows = data["rows"]
        sections = {
            "soak: step ms, start -> end": {
                f"{r['op']} {when}": r[f"step_ms_{when}"] for r in rows for when in ("start", "end")
            },
            "soak: RSS MiB, start -> end": {
                f"{r['op']} {when}": r[f"rss_mib_{when}"] for r in rows for when in ("start", "end")
            },
        }
    else:
        return None
    return sections


def _neighbour_sections(name: str, data: dict) -> dict:
    """The bar groups of the neighbour ops' benchmarks against their peers."""
    rows = data["rows"]
    if name.startswith("batches"):
        return {
            f"{r['clouds']} clouds of {r['sizes'][0]}-{r['sizes'][1]} points, {r['case']}: ms": r["ms"] for r in rows
        }
    if name.startswith("dimensions"):
        return {
            f"kNN, {cloud}: speed-up over the best peer (x)": {
                f"D = {r['dim']}": r["vs_best_peer"] for r in rows if r["cloud"] == cloud
            }
            for cloud in dict.fromkeys(r["cloud"] for r in rows)
        }
    if name.startswith("distributions"):  # distributions-self: kNN alone, M = N
        n = 100_000 if any(r["n"] == 100_000 for r in rows) else max(r["n"] for r in rows)
        knn = "kNN self-join" if name.startswith("distributions-self") else "kNN"
        return {
            f"{knn} at N = {n:,}: speed-up over the best peer (x)": {
                r["distribution"]: r["knn_vs_best_peer"] for r in rows if r["n"] == n
            },
            f"radius aggregation at N = {n:,}: speed-up over cKDTree + torch (x)": {
                r["distribution"]: r["radius_vs_best_peer"] for r in rows if r["n"] == n and "radius_vs_best_peer" in r
            },
        }
    n = max(r["n"] for r in rows)  # lists
    return {
        f"radius lists at N = {n:,}: speed-up of warpbridge over {peer} (x)": {
            r["distribution"]: r[key] for r in rows if r["n"] == n and key in r
        }
        for peer, key in (("cKDTree", "vs_ckdtree"), ("Open3D", "vs_open3d"))
    }


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def doctor_report() -> dict:
    """Everything ``warpbridge doctor`` prints, as a dict."""
    from .. import __version__
    from .._core.warp_runtime import ensure_init

    ensure_init()
    import warp as wp

    report: dict = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "versions": {
            "warpbridge": __version__,
            "warp-lang": wp.config.version,
            **{d: _version(d) for d in ("numpy", "torch", "jax", "jaxlib", "paddlepaddle", "tqdm", "matplotlib")},
        },
        "warp_devices": [str(d) for d in wp.get_devices()],
        "warp_kernel_cache": wp.config.kernel_cache_dir,
        "frameworks": {},
    }
    fw = report["frameworks"]
    fw["numpy"] = {"usable": True, "why": "forward only (NumPy has no autograd)"}
    if report["versions"]["torch"]:
        import torch

        cuda = torch.cuda.is_available()
        fw["torch"] = {
            "usable": True,
            "why": f"CPU{' and CUDA: ' + torch.cuda.get_device_name() if cuda else '; no CUDA device visible to torch'}",
        }
    else:
        fw["torch"] = {"usable": False, "why": "torch is not installed: pip install 'warpbridge[torch]'"}
    for name, dist, extra in (("jax", "jax", "jax"), ("paddle", "paddlepaddle", "paddle")):
        if not report["versions"][dist]:
            fw[name] = {"usable": False, "why": f"{dist} is not installed: pip install 'warpbridge[{extra}]'"}
            continue
        try:
            importlib.import_module(name)
            fw[name] = {"usable": True, "why": "ops, gradients and warpbridge.ops (see docs/jax-paddle.md)"}
        except Exception as e:  # an installed framework that fails to import says why
            fw[name] = {"usable": False, "why": f"import {name} failed: {type(e).__name__}: {e}"}
    return report


def doctor() -> int:
    r = doctor_report()
    print(f"Python {r['python']} on {r['platform']} ({r['cpu_count']} CPUs)")
    print("versions:")
    for k, v in r["versions"].items():
        print(f"  {k:<13} {v or 'not installed'}")
    print("Warp devices: " + ", ".join(r["warp_devices"]))
    print(f"Warp kernel cache: {r['warp_kernel_cache']}")
    print("frameworks:")
    for k, v in r["frameworks"].items():
        print(f"  {k:<7} {'usable' if v['usable'] else 'not usable'}: {v['why']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
