"""Launch functions (the ``jax_callable`` convention): run on foreign buffers, and
differentiated by re-running them under a fresh ``wp.Tape``."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from typing import Any

import warp as wp

from . import _adjoint, _plan
from ._errors import WarpBridgeError, fail
from ._signature import Param


def _wrap(p: Param, device: Any, ptr: int, shape: Sequence[int], strides: Sequence[int], grad: Any = None) -> Any:
    # wp.array over foreign memory: no copy, no ownership; the caller keeps the buffer alive.
    return wp.array(
        ptr=ptr, dtype=p.wp_type.dtype, shape=tuple(shape), strides=tuple(strides), device=device, grad=grad
    )


def _scoped(device: Any, stream: Any):
    if stream is not None:
        return wp.ScopedStream(stream)
    return wp.ScopedDevice(device)


def run_function(
    plan: _plan.Plan,
    ins: Sequence[int],
    scalars: Sequence[Any],
    outs: Sequence[int],
    stream: Any = None,
    keywords: dict | None = None,
) -> None:
    """Call a launch function on foreign buffers: ``ins``/``outs`` are data pointers."""
    sig, dev = plan.sig, plan.device
    args = _function_args(plan, ins, scalars, outs, None, None)
    with _scoped(dev, stream), first_run(plan, 0):
        sig.func(*args, **(keywords or {}))


def run_function_adjoint(
    op: Any,
    plan: _plan.Plan,
    ins: Sequence[int],
    scalars: Sequence[Any],
    outs: Sequence[int],
    in_grads: Sequence[int],
    out_grads: Sequence[tuple[int, tuple[int, ...]]],
    stream: Any = None,
) -> None:
    """Re-run the function under a fresh ``wp.Tape`` and back-propagate ``out_grads``.

    Recomputing keeps no Warp state between forward and backward, so a retained graph can
    be back-propagated any number of times. ``outs`` are scratch buffers, ``out_grads`` private
    copies (the tape may add into them), ``in_grads`` zeroed buffers (0: no gradient).
    """
    args = _function_args(plan, ins, scalars, outs, in_grads, out_grads)
    tape = wp.Tape()
    with _scoped(plan.device, stream), first_run(plan, 1):
        with tape:
            kept = call_keeping_locals(plan.sig.func, args)
        check_recorded(op, tape)
        tape.backward()
    del kept
    # No tape.reset(): it zeroes every gradient it tracked, the ones just computed included.


@contextlib.contextmanager
def first_run(plan: Any, which: int):
    """Hold the load lock while a launch function runs for the first time: its kernels'
    modules are built and loaded then."""
    if plan.warm[which]:
        yield
        return
    with _plan.LOAD_LOCK:
        yield
        plan.warm[which] = True


def call_keeping_locals(func: Any, args: Sequence[Any]) -> list:
    """Call ``func`` and return its local variables as they were when it returned.

    The tape's launches refer to objects the function made (a ``wp.HashGrid``, a ``wp.Mesh``,
    scratch arrays) only through ids and pointers; they must outlive ``tape.backward()``,
    which runs after the function has returned.
    """
    code = getattr(func, "__code__", None)
    kept: list = []
    previous = sys.getprofile()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "return" and frame.f_code is code:
            kept.append(dict(frame.f_locals))
        if previous is not None:
            previous(frame, event, arg)

    sys.setprofile(profile if code is not None else previous)
    try:
        func(*args)
    finally:
        sys.setprofile(previous)
    return kept


def recorded_kernels(tape: Any) -> list:
    """The kernels a ``wp.Tape`` recorded, in launch order."""
    found = []
    for entry in tape.launches:
        k = getattr(entry, "kernel", None)
        if k is None and isinstance(entry, (list, tuple)) and entry and isinstance(entry[0], wp.Kernel):
            k = entry[0]
        if isinstance(k, wp.Kernel) and k not in found:
            found.append(k)
    return found


def check_recorded(op: Any, tape: Any) -> None:
    """Rule 7 for launch functions: refuse if any kernel the tape recorded has a hazard."""
    if op.trust_adjoint:
        return
    found: tuple = ()
    for k in recorded_kernels(tape):
        if not k.options.get("enable_backward", k.module.options.get("enable_backward", True)):
            raise fail(op.name, f"cannot differentiate: kernel '{k.key}' was compiled with enable_backward=False")
        found += _adjoint.kernel_hazards(k)
    if found:
        raise WarpBridgeError(_adjoint.refusal(op.name, found))


# The most array views a plan keeps for the forward (see _function_args).
MAX_VIEWS = 64


def _function_args(plan, ins, scalars, outs, in_grads, out_grads):
    sig, dev = plan.sig, plan.device
    args = []
    k = 0
    vals = iter(scalars)
    # The forward's views (no gradients) are kept per plan, by position and pointer: a plan
    # fixes every shape, stride and dtype, so a view of the same pointer is the same view, and
    # making one (~3.5 us) and its launch descriptor cost a small call ~30 us of its ~100.
    views = None
    if in_grads is None and out_grads is None:
        views = plan.cache.get("views")
        if views is None or len(views) > MAX_VIEWS:
            views = plan.cache["views"] = {}
    for p in sig.inputs:
        if not p.is_array:
            args.append(next(vals))
            continue
        shape, strides = plan.in_layouts[k]
        grad = None
        if in_grads is not None and in_grads[k]:
            grad = _wrap(p, dev, in_grads[k], shape, plan.in_grad_strides[k])
        if views is None:
            args.append(_wrap(p, dev, ins[k], shape, strides, grad))
        else:
            args.append(_kept_view(views, k, p, dev, ins[k], shape, strides))
        k += 1
    for j, p in enumerate(sig.outputs):
        grad = None
        if out_grads is not None:
            gptr, gstrides = out_grads[j]
            grad = _wrap(p, dev, gptr, plan.out_shapes[j], gstrides)
        if views is None:
            args.append(_wrap(p, dev, outs[j], plan.out_shapes[j], plan.out_strides[j], grad))
        else:
            args.append(_kept_view(views, -1 - j, p, dev, outs[j], plan.out_shapes[j], plan.out_strides[j]))
    return args


def _kept_view(views: dict, position: int, p: Param, device: Any, ptr: int, shape: Any, strides: Any) -> Any:
    """The view of argument ``position`` (outputs: -1, -2, ...) at ``ptr``, kept in ``views``."""
    a = views.get((position, ptr))
    if a is None:
        a = views[position, ptr] = _wrap(p, device, ptr, shape, strides)
    return a
