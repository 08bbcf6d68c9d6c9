"""Thread safety from the first call: several threads make their first calls at once in a
fresh process (kernel ops, a launch function, a custom backward and the
neighbour ops), several times. Before the load lock, such a start crashed in most runs."""

import os
import subprocess
import sys
import textwrap

HERE = os.path.dirname(__file__)

SCRIPT = textwrap.dedent(
    f"""
    import sys
    sys.path.insert(0, {HERE!r})
    from concurrent.futures import ThreadPoolExecutor
    import torch, warp as wp
    import warpbridge as wb
    import adjoint_kernels as A
    import backward_kernels as B

    def fn(x: wp.array(dtype=wp.float64), y: wp.array(dtype=wp.float64)):
        wp.launch(A.pow_unrolled, dim=x.shape, inputs=[x], outputs=[y])

    import kernels_generic as G

    def job(k):
        g = torch.Generator().manual_seed(k)
        x = (0.5 + torch.rand(64, generator=g, dtype=torch.float64)).requires_grad_(True)
        kind = k % 8
        if kind >= 5:  # a generic op bound to three dtypes at once, neighbour ops on 2-D and 5-D points
            dtype = (torch.float64, torch.float32, torch.float16)[kind - 5]
            y = wb.op(G.scale_any)(x.detach().to(dtype))
            d = 2 if kind == 5 else 5
            q, r, f = torch.rand(30, d, generator=g), torch.rand(50, d, generator=g), torch.rand(50, 2, generator=g)
            out = wb.ops.radius_aggregate(q, r, f, 0.5, 0.2)
            return bool(torch.allclose(y.double(), 2 * x.detach(), rtol=1e-2)) and bool(torch.isfinite(out).all())
        if kind == 0:
            wb.op(A.pow_unrolled)(x).sum().backward()
            expected = 3 * x.detach() ** 2
        elif kind == 1:
            wb.op(fn)(x).sum().backward()
            expected = 3 * x.detach() ** 2
        elif kind == 2:
            wb.op(B.power, backward=B.power_adjoint)(x, 4).sum().backward()
            expected = 4 * x.detach() ** 3
        else:
            q, r = torch.rand(40, 3, generator=g), torch.rand(60, 3, generator=g)
            f = torch.rand(60, 4, generator=g, requires_grad=True)
            op = wb.ops.knn_aggregate if kind == 3 else wb.ops.radius_aggregate
            out = op(q, r, f, 3, 0.2) if kind == 3 else op(q, r, f, 0.3, 0.2)
            out.sum().backward()
            return bool(torch.isfinite(f.grad).all())
        return bool(torch.allclose(x.grad, expected))

    with ThreadPoolExecutor(8) as ex:
        results = list(ex.map(job, range(16)))
    print("OK" if all(results) else f"WRONG {{results}}")
    """
)


def test_first_calls_from_many_threads_at_once_in_fresh_processes(tmp_path):
    """The first process compiles into an empty kernel cache (where generic bindings of one
    module raced: 38 of 39 runs failed, 9 of them a segfault), the second loads from it."""
    env = dict(os.environ, WARP_CACHE_PATH=str(tmp_path / "kernel-cache"))
    for run in range(2):
        out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, env=env)
        assert out.returncode == 0, f"run {run}: exit {out.returncode}\n{out.stderr[-3000:]}"
        assert out.stdout.strip().splitlines()[-1] == "OK", out.stdout[-2000:]


def test_a_tape_records_only_the_launches_of_its_own_thread():
    """Warp keeps one active tape per process; while one of warpbridge's own tapes records (a
    launch function's forward), it is per thread: it neither records another thread's
    launches nor collides with a tape opened in another thread at the same time."""
    import threading

    import adjoint_kernels as A
    import warp as wp

    import warpbridge as wb
    from warpbridge._core.warp_runtime import OwnTape

    wb.op(A.pow_unrolled)  # warpbridge initialises Warp
    x = wp.array([1.0, 2.0], dtype=wp.float64)
    y = wp.zeros(2, dtype=wp.float64)
    inside, errors = threading.Event(), []

    def other_thread():
        try:
            wp.launch(A.pow_unrolled, dim=2, inputs=[x], outputs=[y])  # not recorded by the main thread's tape
            with wp.Tape() as users:  # a user's tape at the same time
                wp.launch(A.pow_unrolled, dim=2, inputs=[x], outputs=[y])
            assert len(users.launches) == 1
        except Exception as e:  # re-raised in the main thread
            errors.append(e)
        inside.set()

    with OwnTape() as tape:
        t = threading.Thread(target=other_thread)
        t.start()
        assert inside.wait(60)
        t.join()
    assert not errors, errors
    assert tape.launches == []


TWO_PROCESSES = textwrap.dedent(
    f"""
    import sys
    sys.path.insert(0, {HERE!r})
    import torch
    import warpbridge as wb
    import points_reference as ref
    import kernels_generic as G

    g = torch.Generator().manual_seed(int(sys.argv[1]))
    q, r, f = torch.rand(300, 3, generator=g), torch.rand(500, 3, generator=g), torch.rand(500, 4, generator=g)
    same = torch.allclose(wb.ops.radius_aggregate(q, r, f, 0.2, 0.1), ref.radius_aggregate(q, r, f, 0.2, 0.1), atol=1e-5)
    same &= torch.allclose(wb.ops.knn_aggregate(q, r, f, 5, 0.1), ref.knn_aggregate(q, r, f, 5, 0.1), atol=1e-5)
    x = torch.rand(100, dtype=torch.float64, generator=g)
    same &= torch.equal(wb.op(G.scale_any)(x), 2 * x)
    print("OK" if same else "WRONG")
    """
)


def test_two_processes_compiling_into_one_empty_kernel_cache_get_exact_results(tmp_path):
    env = dict(os.environ, WARP_CACHE_PATH=str(tmp_path / "kernel-cache"))
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", TWO_PROCESSES, str(seed)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )  # fmt: skip
        for seed in (1, 2)
    ]
    for run in runs:
        out, err = run.communicate(timeout=600)
        assert run.returncode == 0, err[-3000:]
        assert out.strip().splitlines()[-1] == "OK", out[-2000:]
