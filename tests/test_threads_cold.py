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

    def job(k):
        g = torch.Generator().manual_seed(k)
        x = (0.5 + torch.rand(64, generator=g, dtype=torch.float64)).requires_grad_(True)
        kind = k % 5
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

    with ThreadPoolExecutor(5) as ex:
        results = list(ex.map(job, range(10)))
    print("OK" if all(results) else f"WRONG {{results}}")
    """
)


def test_first_calls_from_many_threads_at_once_in_fresh_processes():
    for run in range(5):
        out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
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
