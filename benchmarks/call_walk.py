"""How many Python calls, file changes and distinct files one warm call walks through.

Traces one warm call of each case with ``sys.setprofile`` (warpbridge's own Python functions): a kernel op's forward and backward in torch eager, its first call with a new
shape, and ``wb.ops.knn_aggregate``'s forward and backward. Prints a table and writes
``benchmarks/results/call_walk.json``. ``python benchmarks/call_walk.py``.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import date

import torch
import warp as wp

import warpbridge as wb

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import kernels as K  # noqa: E402

PACKAGE = os.path.dirname(wb.__file__)


def walk(fn) -> dict:
    """Calls into warpbridge's own Python functions (PyTorch's and Warp's frames are not
    counted), how often the walk changes file among them, and how many files it touches."""
    calls, files, changes, last = 0, set(), 0, None

    def prof(frame, event, arg):
        nonlocal calls, changes, last
        f = frame.f_code.co_filename
        if event != "call" or not f.startswith(PACKAGE):
            return
        calls += 1
        files.add(f)
        if f != last:
            changes += 1
            last = f

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return {"python_calls": calls, "file_changes": changes, "files": len(files)}


def cases() -> dict:
    op = wb.op(K.mul64)
    x = torch.rand(64, dtype=torch.float64, requires_grad=True)
    y = torch.rand(64, dtype=torch.float64)
    op(x, y).sum().backward()  # warm
    out = {}
    out["op(x), torch eager, warm"] = walk(lambda: op(x, y))
    g = torch.ones(64, dtype=torch.float64)
    op(x, y).backward(g)  # warm, with this gradient's layout
    z = op(x, y)
    out["its .backward()"] = walk(lambda: z.backward(g))
    sizes = iter(range(65, 1000))

    def new_shape():
        n = next(sizes)
        op(torch.rand(n, dtype=torch.float64), torch.rand(n, dtype=torch.float64))

    new_shape()
    out["first call with a new shape"] = walk(new_shape)
    q = torch.rand(500, 3)
    r = torch.rand(2000, 3, requires_grad=True)
    f = torch.rand(2000, 8, requires_grad=True)
    wb.ops.knn_aggregate(q, r, f, k=7, sigma=0.1).sum().backward()  # warm
    out["wb.ops.knn_aggregate forward, warm"] = walk(lambda: wb.ops.knn_aggregate(q, r, f, k=7, sigma=0.1))
    gh = torch.ones(500, 8)
    wb.ops.knn_aggregate(q, r, f, k=7, sigma=0.1).backward(gh)  # warm, with this gradient's layout
    h = wb.ops.knn_aggregate(q, r, f, k=7, sigma=0.1)
    out["its backward"] = walk(lambda: h.backward(gh))
    return out


def main() -> None:
    wp.config.quiet = True
    rows = cases()
    print(f"{'call':40s} {'Python calls':>13s} {'file changes':>13s} {'files':>6s}")
    for k, v in rows.items():
        print(f"{k:40s} {v['python_calls']:13d} {v['file_changes']:13d} {v['files']:6d}")
    out = {"date": date.today().isoformat(), "torch": torch.__version__, "warp": wp.config.version, "rows": rows}
    path = os.path.join(os.path.dirname(__file__), "results", "call_walk.json")
    with open(path, "w") as fh:
        json.dump(out, fh, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
