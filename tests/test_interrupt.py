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
from warpbridge.ops import _cpu_launch as cpu_launch
from warpbridge.ops import _cpu_team as cpu_team
from warpbridge.ops import _tree


def _cloud(n, f, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, generator=g, dtype=torch.float64), torch.randn(n, f, generator=g, dtype=torch.float64)


def _every_result(q, r, f):
    """The values of knn, knn_aggregate and radius_aggregate and their gradients w.r.t. all
    three inputs (the backward launches scatter into per-thread slots)."""
    q, r, f = (t.clone().requires_grad_(True) for t in (q, r, f))
    dist, idx, _ = wb.ops.knn(q, r, 6)
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


# A fresh process: a long call, and SIGINT sent from another thread while one of its CPU
# segments runs (the segment given as argument 2 of the launches of the phase given as
# argument 3). The call must raise KeyboardInterrupt before any further segment starts,
# however fast the machine is, and the process must answer a small call afterwards.
SCRIPT = """
    import os, signal, sys, threading
    import numpy as np
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also under a shell's background job
    if sys.argv[1] == "torch":
        import torch
    import warpbridge as wb
    from warpbridge.ops import _cpu_launch as cpu_launch

    state = {"phase": "forward", "segments": 0, "after": 0}
    running, sent = threading.Event(), threading.Event()
    real_segments = cpu_launch.segments

    def counted(m, align, first):
        for span in real_segments(m, align, first):
            # resuming the generator above acts on a pending signal: past it, a segment starts
            if sent.is_set():
                state["after"] += 1
            elif state["phase"] == sys.argv[3]:
                state["segments"] += 1
                if state["segments"] == int(sys.argv[2]):
                    running.set()
            yield span

    def interrupt():
        running.wait()
        os.kill(os.getpid(), signal.SIGINT)
        sent.set()

    cpu_launch.segments = counted
    threading.Thread(target=interrupt, daemon=True).start()
    rng = np.random.default_rng(0)
    x = rng.random((POINTS, 3), dtype=np.float32)
    f = rng.random((POINTS, 4), dtype=np.float32)
    if sys.argv[1] == "torch":
        x, f = torch.from_numpy(x), torch.from_numpy(f).requires_grad_(True)
    try:
        if sys.argv[3] == "backward":
            out = wb.ops.knn_aggregate(x, x, f, 8, 0.1).sum()
            state["phase"] = "backward"
            out.backward()
        else:
            wb.ops.knn(x, x, 16)
        print("finished")
    except KeyboardInterrupt:
        print("interrupted", state["segments"], state["after"])
    cpu_launch.segments = real_segments
    small = x[:500]
    d, i, _ = wb.ops.knn(small, small, 3)
    print("usable", bool((np.asarray(i)[:, 0] == np.arange(500)).all()))
"""


@pytest.mark.parametrize(
    "framework,segment,phase",
    [("torch", 1, "forward"), ("torch", 12, "forward"), ("numpy", 12, "forward"), ("torch", 3, "backward")],
)
def test_ctrl_c_is_acted_on_before_the_next_segment(framework, segment, phase):
    """SIGINT during the first segments (the tree build), later ones (the search) or the
    scatter backward: KeyboardInterrupt comes before another segment starts, and the process
    stays usable. How soon that is in seconds is a benchmark (``benchmarks/interrupt.py``)."""
    code = textwrap.dedent(SCRIPT).replace("POINTS", "3_000_000")
    env = dict(os.environ, WARPBRIDGE_NUM_THREADS="2")
    out = subprocess.run(
        [sys.executable, "-c", code, framework, str(segment), phase],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert "interrupted" in lines, out.stdout
    reached, after = (int(v) for v in lines["interrupted"].split())
    # the signalling thread may be scheduled a segment or two late on a busy machine (a CI run
    # saw 3 for 1); what must hold is that no segment starts once the signal is sent
    assert reached >= segment and after == 0, out.stdout
    assert lines["usable"] == "True"
