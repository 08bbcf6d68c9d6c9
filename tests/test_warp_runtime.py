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


def test_the_per_thread_tape_keeps_one_active_tape_per_thread():
    import threading

    warp_runtime.ensure_init()
    seen = {}
    with wp.Tape() as outer:

        def other():
            seen["other"] = wp._src.context.runtime.tape

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert wp._src.context.runtime.tape is outer
    assert seen["other"] is None


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
