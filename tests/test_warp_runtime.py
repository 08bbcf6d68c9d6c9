"""The Warp internals warpbridge relies on are all there, in a Warp version it supports; a Warp
upgrade that moves one fails here, by name, before it fails anywhere else."""

import warp as wp

from warpbridge._core import warp_runtime


def test_every_warp_internal_warpbridge_uses_exists():
    assert warp_runtime.check_internals() == []


def test_the_installed_warp_is_a_supported_version():
    assert wp.config.version.startswith(warp_runtime.SUPPORTED_WARP), (
        f"warp-lang {wp.config.version} is not among the versions warp_runtime supports "
        f"({warp_runtime.SUPPORTED_WARP}): check its internals, then add the version"
    )


def test_a_missing_internal_is_reported_by_name(monkeypatch):
    monkeypatch.delattr(wp._src.types, "array_t")
    assert "warp._src.types.array_t" in warp_runtime.check_internals()


def test_an_own_tape_is_per_thread_and_the_hook_lives_only_while_one_records():
    import threading

    warp_runtime.ensure_init()
    runtime = wp._src.context.runtime
    plain = type(runtime)
    seen = {}
    with warp_runtime.OwnTape() as own:
        assert type(runtime) is not plain  # the hook, while an own tape records

        def other():
            seen["other"] = runtime.tape

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert runtime.tape is own
    assert seen["other"] is None
    assert type(runtime) is plain and runtime.tape is None


def test_a_users_tape_is_warps_own_process_wide_one():
    import threading

    warp_runtime.ensure_init()
    seen = {}
    with wp.Tape() as users:
        t = threading.Thread(target=lambda: seen.setdefault("other", wp._src.context.runtime.tape))
        t.start()
        t.join()
    assert seen["other"] is users


def test_warp_still_refuses_a_tape_entered_under_another_as_warpbridge_expects():
    warp_runtime.ensure_init()
    with wp.Tape():
        try:
            with wp.Tape():
                pass
        except RuntimeError as e:
            assert warp_runtime.is_nested_tape_error(e)
        else:
            raise AssertionError("Warp now allows nested tapes: revisit launch_function._run_untaped")


def test_a_users_tape_records_a_worker_threads_launch_after_every_kind_of_op():
    """Plain Warp records a launch from a worker thread into the tape open in the main thread;
    making and calling warpbridge ops (a kernel, a launch function forward and backward, a
    neighbour op) must not change that."""
    import threading

    import kernels as K
    import numpy as np
    import torch

    import warpbridge as wb

    x = torch.rand(8, dtype=torch.float64, requires_grad=True)
    wb.op(K.mul64)(x, x).sum().backward()
    wb.op(K.exp_times)(x, x).sum().backward()
    wb.ops.knn(torch.rand(5, 3), torch.rand(9, 3), 2)
    a = wp.array(np.arange(4.0), dtype=wp.float64, requires_grad=True)
    b = wp.array(np.ones(4), dtype=wp.float64, requires_grad=True)
    out = wp.zeros(4, dtype=wp.float64, requires_grad=True)
    tape = wp.Tape()
    with tape:
        worker = threading.Thread(target=lambda: wp.launch(K.mul64, dim=4, inputs=[a, b], outputs=[out]))
        worker.start()
        worker.join()
    assert len(tape.launches) == 1
    tape.backward(grads={out: wp.ones(4, dtype=wp.float64)})
    np.testing.assert_allclose(b.grad.numpy(), np.sin(np.arange(4.0)))
