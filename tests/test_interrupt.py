"""Long neighbour-op calls stay interruptible: CPU launches run in short segments, Ctrl-C
raises KeyboardInterrupt within about half a second and leaves the process usable, and the
segments change no value or gradient by a single bit."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import warpbridge as wb
from warpbridge._core import cpu_launch, cpu_team
from warpbridge.ops import _tree


def _cloud(n, f, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, generator=g, dtype=torch.float64), torch.randn(n, f, generator=g, dtype=torch.float64)


def _every_result(q, r, f):
    """The values of knn, knn_aggregate and radius_aggregate and their gradients w.r.t. all
    three inputs (the backward launches scatter into per-thread slots)."""
    q, r, f = (t.clone().requires_grad_(True) for t in (q, r, f))
    dist, idx = wb.ops.knn(q, r, 6)
    a = wb.ops.knn_aggregate(q, r, f, 5, 0.2)
    b = wb.ops.radius_aggregate(q, r, f, 0.2, 0.1)
    (dist.sum() + (a * a).sum() + (b * b).sum()).backward()
    return [dist.detach(), idx, a.detach(), b.detach(), q.grad, r.grad, f.grad]


@pytest.mark.parametrize("openmp", [True, False], ids=["openmp-team", "thread-pool"])
def test_many_small_segments_give_the_same_bits(monkeypatch, openmp):
    q, _ = _cloud(3000, 1, 1)
    r, f = _cloud(4000, 4, 2)
    whole = _every_result(q, r, f)
    if not openmp:
        monkeypatch.setattr(cpu_team, "TEAMS", {})
    monkeypatch.setattr(cpu_launch, "FIRST_SEGMENT", 37)  # not a multiple of the slots
    monkeypatch.setattr(cpu_launch, "SEGMENT_SECONDS", 1e-9)  # every later segment as short as allowed
    monkeypatch.setattr(_tree, "SUBTREE_MAX", 300)  # the build's subtrees in many segments
    cut = _every_result(q, r, f)
    for name, a, b in zip(["dist", "idx", "knn_aggregate", "radius_aggregate", "dq", "dr", "df"], whole, cut):
        assert torch.equal(a, b), name


def test_segments_cover_every_query_once_aligned_to_the_slots():
    spans = list(cpu_launch.segments(1001, 4, 10))
    starts = [s for s, _ in spans]
    assert all(s % 4 == 0 for s in starts)
    covered = [i for s, c in spans for i in range(s, s + c)]
    assert covered == list(range(1001))


SCRIPT = """
    import os, signal, sys, threading, time
    import numpy as np
    # Python's own Ctrl-C handler, also where the parent ran us with SIGINT ignored (a
    # background job of a shell without job control)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if sys.argv[1] == "torch":
        import torch
    import warpbridge as wb
    rng = np.random.default_rng(0)
    x = rng.random((POINTS, 3), dtype=np.float32)
    f = rng.random((POINTS, 4), dtype=np.float32)
    if sys.argv[1] == "torch":
        x, f = torch.from_numpy(x), torch.from_numpy(f).requires_grad_(True)
    sent = []

    def interrupt():
        time.sleep(float(sys.argv[2]))
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    began = time.perf_counter()
    try:
        if sys.argv[3] == "backward":
            wb.ops.knn_aggregate(x, x, f, 8, 0.1).sum().backward()
        else:
            wb.ops.knn(x, x, 16)
        print("finished", time.perf_counter() - began)
    except KeyboardInterrupt:
        print("interrupted", time.perf_counter() - sent[0])
    small = x[:500]
    d, i = wb.ops.knn(small, small, 3)
    print("usable", bool((np.asarray(i)[:, 0] == np.arange(500)).all()))
"""


@pytest.mark.parametrize(
    "framework,when,part",
    [("torch", 0.2, "forward"), ("torch", 1.0, "forward"), ("numpy", 2.0, "forward"), ("torch", 1.5, "backward")],
)
def test_ctrl_c_stops_a_long_call_within_half_a_second(framework, when, part):
    """The call would take several seconds; SIGINT arrives during the tree build (0.2 s), the
    search (1 s; NumPy 2 s, past the first writes into NumPy's fresh output, which can stall in
    the kernel's huge-page compaction for most of a second) or the scatter backward (1.5 s)."""
    code = textwrap.dedent(SCRIPT).replace("POINTS", "3_000_000")
    env = dict(os.environ, WARPBRIDGE_NUM_THREADS="2")
    out = subprocess.run(
        [sys.executable, "-c", code, framework, str(when), part], capture_output=True, text=True, timeout=180, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert "interrupted" in lines, out.stdout
    assert float(lines["interrupted"]) < 0.5, out.stdout
    assert lines["usable"] == "True"
