"""Launch functions (the ``jax_callable`` convention): run on foreign buffers, taped when a
gradient may follow, and differentiated through that recording (or a taped re-run). Their
plan kind, :class:`FunctionPlan`, and ``new_plan``, the one place a call is told a kernel
from a launch function."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Sequence
from typing import Any

import warp as wp

from . import off_tape_fills
from .errors import fail
from .plan import KernelPlan, Plan, host_bytes
from .signature import Param, Signature
from .tape_rules import (
    Untaped,
    check_recorded,
    floating,
    holds_values,
    input_dependent_fill,
    input_dependent_number,
    input_written,
    overlap,
    refuse_gradients_into,
    span,
    spans_of,
)
from .warp_runtime import (
    LOAD_LOCK,
    KeepingTape,
    drop_launches_without_adjoint,
    is_nested_tape_error,
    on_stream,
    refresh_struct_fields,
    tape_contents,
)

_READS_ONLY_INPUTS = "__warpbridge_reads_only_inputs__"


def reads_only_inputs(fn: Any) -> Any:
    """Mark a launch function that never writes its inputs (warpbridge's own neighbour ops,
    whose tests check it): a plan's first run then goes on the inputs themselves, not on
    copies compared afterwards. A plan is per input layout, so on clouds whose size changes
    every step every call is a first run; on 10^6 points the copies cost a radius
    aggregation step about 1.7x its time and 2.5x its peak memory."""
    setattr(fn, _READS_ONLY_INPUTS, True)
    return fn


def _wrap(p: Param, device: Any, ptr: int, shape: Sequence[int], strides: Sequence[int]) -> Any:
    # wp.array over foreign memory: no copy, no ownership; the caller keeps the buffer alive.
    return wp.array(ptr=ptr, dtype=p.wp_type.dtype, shape=tuple(shape), strides=tuple(strides), device=device)


_NOTHING_TO_HOLD = contextlib.nullcontext()  # a scope that changes nothing


def _scoped(device: Any, stream: Any):
    if stream is not None:
        return on_stream(stream)
    return _NOTHING_TO_HOLD if wp.get_device() is device else wp.ScopedDevice(device)


def run_function(
    plan: Plan,
    ins: Sequence[int],
    scalars: Sequence[Any],
    outs: Sequence[int],
    stream: Any = None,
    keywords: dict | None = None,
    record: bool = False,
) -> Recording | None:
    """Call a launch function on foreign buffers: ``ins``/``outs`` are data pointers.

    A plan's first run is on copies of the inputs, compared with them afterwards (unless the
    function is marked ``reads_only_inputs``): a function that writes into an input is
    refused before it ever touches the caller's memory. With ``record``, the run is taped and
    the :class:`Recording` returned, for :func:`run_recorded_adjoint`.
    """
    sig, dev = plan.sig, plan.device
    args = _function_args(plan, ins, scalars, outs, fresh=record)
    holder = [KeepingTape(sys._getframe())] if record else [contextlib.nullcontext()]
    with _scoped(dev, stream), first_run(plan, 0):
        originals = args
        if not plan.warm[0] and not getattr(sig.func, _READS_ONLY_INPUTS, False):
            args = _copies_of_inputs(plan, args)
        placeholders = [_mirror(a, zeroed=False) for a in _floating_ends(plan, args)] if record else []
        refusal = None
        try:
            with holder[0]:
                sig.func(*args, **(keywords or {}))
        except RuntimeError as e:
            if not (record and is_nested_tape_error(e)):
                raise
            refusal = _run_untaped(plan, args, keywords)
            holder[0] = None
        if holder[0] is not None and record:
            holder[0].settle()
        if args is not originals:
            _check_copies(plan, originals, args)
    # the function's frames refer to this one: keep no reference to the tape here
    return Recording(plan, holder.pop(), args, placeholders, refusal) if record else None


def _run_untaped(plan: Plan, args: list, keywords: dict | None) -> str:
    """Run a function that opens its own ``wp.Tape`` (a gradient inside it, forces from an
    energy) again without warpbridge's, on zeroed outputs; return why its backward is refused:
    it would need the gradient of Warp's adjoint, which Warp does not give."""
    sig = plan.sig
    for a in _floating_ends(plan, args):
        a.grad = None
    for y in args[len(sig.inputs) :]:
        y.zero_()
    sig.func(*args, **(keywords or {}))
    return (
        f"cannot differentiate: launch function {sig.func.__name__}() runs its own wp.Tape (a gradient inside "
        "the function, such as forces from an energy), so differentiating its outputs would take the gradient "
        "of Warp's adjoint, which Warp does not provide. Its forward is right: detach its outputs before the "
        "loss, or give the op its own backward (@op.backward, see docs/custom-backward.md)"
    )


def _floating_ends(plan: Plan, args: list) -> list:
    """The floating array inputs and outputs a function is called with."""
    sig = plan.sig
    ends = [args[p.position] for p in sig.array_inputs if p.differentiable]
    return ends + [args[len(sig.inputs) + j] for j, p in enumerate(sig.outputs) if p.is_float]


def _mirror(a: Any, zeroed: bool = True) -> Any:
    """Give ``a`` a gradient laid out like it (its own buffer, zeroed); return the buffer.

    A recorded forward's inputs and outputs carry one (``zeroed=False``), as under ``wp.Tape``,
    so that Warp records the copies the function makes of them (``wp.clone(x)``); the backward
    replaces it, and zeroes the gradients those copies copied from it.
    """
    if a.is_contiguous:
        a.grad = (wp.zeros if zeroed else wp.empty)(a.shape, dtype=a.dtype, device=a.device)
        return a.grad
    return _shared_gradient([a], zeroed)


def _copies_of_inputs(plan: Plan, args: list) -> list:
    copies = list(args)
    made: dict = {}  # one copy per view: inputs passed twice (a self-join) stay one array
    for p in plan.sig.array_inputs:
        a = args[p.position]
        key = (a.ptr, a.shape, a.strides, a.dtype)
        if key not in made:
            made[key] = wp.clone(a, requires_grad=False)
        copies[p.position] = made[key]
    return copies


def _check_copies(plan: Plan, originals: list, copies: list) -> None:
    sig = plan.sig
    written = [p.name for p in sig.array_inputs if not _same_bytes(originals[p.position], copies[p.position])]
    if written:
        raise input_written(sig.name, sig.func, written)


def _same_bytes(a: Any, b: Any) -> bool:
    return a.size == 0 or host_bytes(a) == host_bytes(b)


class Recording:
    """A launch function's taped forward, kept for its backward: the tape (with the frames
    that keep the function's objects alive) and the arrays it was called with."""

    def __init__(self, plan: Plan, tape: KeepingTape | None, args: list, placeholders: list, refusal: str | None):
        self.plan = plan
        self.tape = tape
        self.refusal = refusal  # why no backward runs through it (None: one may)
        self.args = args
        self.placeholders = placeholders  # the forward's gradient buffers of the inputs and outputs
        self.checked = False  # rule 7 passed once: the recorded launches do not change
        self.arrays: list = []  # every array the tape recorded (read before its first backward)
        self.spans: dict = {}  # their memory spans, by id
        self.fields: list = []  # the array fields of the structs its launches took
        self.untaped = Untaped([], [], [], [])  # what was filled outside the tape: no gradient may come into it
        self.passes = 0  # backwards run through the tape
        self.lock = threading.Lock()  # one backward at a time: they share the gradients


def run_recorded_adjoint(
    op: Any,
    rec: Recording,
    in_grads: Sequence[int],
    out_grads: Sequence[tuple[int, tuple[int, ...]]],
    stream: Any = None,
) -> None:
    """Back-propagate ``out_grads`` through the forward's own tape, as ``wp.Tape`` does, into
    the zeroed buffers ``in_grads`` (0: no gradient), on ``stream``.

    warpbridge owns this tape: every floating array its launches use gets a gradient, whatever
    ``requires_grad`` it was made with, so a scratch array cannot cut a gradient path. Every
    backward starts from zeroed intermediate gradients, so a retained graph can be
    back-propagated any number of times."""
    plan, tape = rec.plan, rec.tape
    if rec.refusal is not None:
        raise fail(op.name, rec.refusal)
    with rec.lock, _scoped(plan.device, stream):
        ends = _attach_end_gradients(plan, rec.args, in_grads, out_grads)
        owned: list = [[]]
        aliases: list = []
        try:
            if not rec.checked:
                contents = tape_contents(tape)
                rec.arrays, rec.fields, rec.spans = contents.arrays, contents.fields, spans_of(contents.arrays)
                rec.untaped = check_recorded(op, tape, rec.args, contents, rec.spans)
                drop_launches_without_adjoint(tape)  # checked: they write no floating array
                rec.checked = True
            refuse_gradients_into(op, rec.untaped.outputs)
            aliases = _alias_gradients(op, rec.arrays, rec.spans, [a for a, _, _ in ends])
            skip = {id(a) for a, _, _ in ends} | {id(a) for a in aliases}
            if rec.passes:  # an earlier backward left values in every intermediate gradient
                _zero_intermediate_gradients(rec.arrays, skip)
            else:  # the forward made them zeroed, but for copies of the placeholders' content
                _zero_copied_gradients(tape, skip)
            rec.passes += 1
            owned = own_gradients(rec.arrays)
            refresh_struct_fields(rec.fields)
            tape.backward()
            refuse_gradients_into(op, rec.untaped.inner)
            refuse_host_dependence(op, rec, in_grads)
            for a, target, _ in ends:
                if target is not None:  # a gradient laid out unlike its buffer: copied back
                    wp.copy(target, a.grad)
        finally:
            for a in [a for a, _, _ in ends] + aliases + owned[1:]:
                a.grad = None  # the next backward starts from fresh zeros; a global array gets its state back
            refresh_struct_fields(rec.fields)
            tape.gradients = {}  # no reference to this backward's buffers survives it


def refuse_host_dependence(op: Any, rec: Recording, in_grads: Sequence[int]) -> None:
    """Refuse a backward through what the tape cannot follow back to the inputs: an array made
    without requires_grad that nothing on the tape writes (filled by ``wp.utils.array_sum``, a
    launch with ``record_tape=False``) and that a gradient reached, or a floating number a
    kernel took by value, whose values change with the inputs: the gradient stops there.

    Constants look the same on the tape. The first backward of a plan that meets either re-runs
    the function on perturbed copies of the inputs that take a gradient (:mod:`off_tape_fills`)
    and compares; the plan remembers what it found constant."""
    untaped = rec.untaped
    if not untaped.plain and not untaped.numbers:
        return
    plan = rec.plan
    constants = plan.cache.setdefault("constant fills", set())
    key = tuple((place, label) for place, label, _ in untaped.plain + untaped.numbers)
    if key in constants:
        return
    reached = [(p, label, a) for p, label, a in untaped.plain if holds_values(a.grad)]
    if not reached and not untaped.numbers:
        return
    sig = plan.sig
    moved = [p.position for k, p in enumerate(sig.array_inputs) if in_grads[k] and p.is_float]
    try:
        with LOAD_LOCK:  # rare, and its kernel's module may load now
            arrays, numbers = off_tape_fills.input_dependent(
                sig.func, rec.args, len(sig.inputs), moved, reached, untaped.numbers
            )
    except Exception as e:
        raise fail(
            op.name,
            f"cannot differentiate: launch function {sig.func.__name__}() fills arrays or passes numbers outside "
            "Warp's tape, and re-running it on slightly moved inputs to see whether they depend on them raised "
            f"{type(e).__name__}: {e}",
        ) from e
    why = [input_dependent_fill(a) for a in arrays] + [input_dependent_number(k, label) for k, label in numbers]
    if why:
        raise fail(op.name, f"cannot differentiate: launch function {sig.func.__name__}() {why[0]}")
    constants.add(key)


def _attach_end_gradients(plan: Plan, args: list, in_grads: Sequence[int], out_grads: Sequence) -> list:
    """Give the recorded inputs and outputs this backward's gradient buffers: (array, buffer to
    copy the gradient into afterwards, or None)."""
    sig = plan.sig
    ends = []
    for k, p in enumerate(sig.array_inputs):
        a = args[p.position]
        ends.append(_end_gradient(p, a, in_grads[k], plan.in_grad_strides[k], zeroed=True))
    for j, p in enumerate(sig.outputs):
        gptr, gstrides = out_grads[j]
        ends.append(_end_gradient(p, args[len(sig.inputs) + j], gptr, gstrides, zeroed=False))
    return ends


def _alias_gradients(op: Any, arrays: list, spans: dict, ends: list) -> list:
    """Give each recorded array over an input's or output's memory (a slice, a reshape, a
    flatten of it) the matching view of that array's gradient: a launch through the view
    differentiates the input or output. Returns the arrays so given a gradient (None where the
    input takes none: the backward then gives them zeros of their own). ``spans``: the
    arrays' memory spans, by id."""
    by_id = {id(a): a for a in ends}
    end_spans = [span(a) for a in ends]
    aliases = []
    for v in arrays:
        if id(v) in by_id or not v.size or not floating(v.dtype):
            continue
        end = _viewed_end(op, v, spans[id(v)], ends, end_spans, by_id)
        if end is not None:
            v.grad = None if end.grad is None else _gradient_view(end, v)
            aliases.append(v)
    return aliases


def _viewed_end(op: Any, v: Any, memory: tuple, ends: list, end_spans: list, by_id: dict) -> Any:
    """The input or output whose memory ``v`` (over ``memory``) views (None: none): the one it
    was made from (``x[1:]``, ``x.reshape(...)``), else the one whose memory holds it."""
    parent = getattr(v, "_ref", None)
    while parent is not None:
        if id(parent) in by_id:
            return by_id[id(parent)]
        parent = getattr(parent, "_ref", None)
    hits = [(a, at) for a, at in zip(ends, end_spans) if overlap(memory, at)]
    if not hits:
        return None
    if len(hits) == 1 and hits[0][1][0] <= memory[0] and memory[1] <= hits[0][1][1]:
        return hits[0][0]
    names = [p.name for p in op.sig.array_inputs + op.sig.outputs]
    which = [names[k] for k, a in enumerate(ends) if any(a is h for h, _ in hits)]
    raise fail(
        op.name,
        f"cannot differentiate: launch function {op.sig.func.__name__}() launches a kernel on a "
        f"{v.dtype.__name__} array of shape {v.shape} over the memory of {which} that was not made from one of "
        "them, so its gradient belongs to no one argument. Make it from the argument (a slice, "
        "`.reshape()`, `.flatten()`, `.view()`) or copy the argument with `wp.clone`",
    )


def _gradient_view(end: Any, v: Any) -> Any:
    """The view of ``end``'s gradient (laid out like ``end``) that matches ``v``'s view of it."""
    return wp.array(
        ptr=end.grad.ptr + (v.ptr - end.ptr), dtype=v.dtype, shape=v.shape, strides=v.strides, device=v.device
    )


def _end_gradient(p: Param, a: Any, ptr: int, strides: Sequence[int], zeroed: bool) -> tuple[Any, Any, Any]:
    """Give ``a`` the gradient buffer at ``ptr`` (0: none) laid out with ``strides``."""
    if not ptr:
        a.grad = None
        return a, None, None
    if not any(n > 1 and x != y for n, x, y in zip(a.shape, a.strides, strides)):
        a.grad = _wrap(p, a.device, ptr, a.shape, a.strides)
        return a, None, None
    # laid out like the array, in a buffer of its own: an incoming gradient copied in, an input
    # gradient copied out after the backward
    grad = _wrap(p, a.device, ptr, a.shape, strides)
    buffer = _mirror(a)
    if not zeroed:
        wp.copy(a.grad, grad)
    return a, grad if zeroed else None, buffer  # the view owns nothing: the buffer is kept with it


def _zero_copied_gradients(tape: Any, ends: set[int]) -> None:
    """Zero the gradients of the arrays Warp recorded copies of or into (``wp.copy`` copies the
    gradient too, and a placeholder's holds garbage)."""
    for a in tape.gradients:
        if isinstance(a, wp.array) and id(a) not in ends and a.grad is not None:
            a.grad.zero_()


def _zero_intermediate_gradients(arrays: list, ends: set[int]) -> None:
    """Zero what an earlier backward left in the gradients of the tape's other arrays."""
    for a in arrays:
        if a.grad is not None and id(a) not in ends:
            a.grad.zero_()


def run_function_adjoint(
    op: Any,
    plan: Plan,
    ins: Sequence[int],
    scalars: Sequence[Any],
    outs: Sequence[int],
    in_grads: Sequence[int],
    out_grads: Sequence[tuple[int, tuple[int, ...]]],
    stream: Any = None,
) -> None:
    """Re-run the function, taped, into the scratch outputs ``outs``, and back-propagate
    ``out_grads`` through that recording (:func:`run_recorded_adjoint`).

    Recomputing keeps no Warp state between forward and backward (``recompute=True``, and the
    paths that cannot keep a recording: ``torch.compile``, ``torch.func``, JAX, Paddle).
    """
    with first_run(plan, 1):
        recording = run_function(plan, ins, scalars, outs, stream, record=True)
    run_recorded_adjoint(op, recording, in_grads, out_grads, stream)


def first_run(plan: Any, which: int) -> Any:
    """Hold the load lock while a launch function runs for the first time: its kernels'
    modules are built and loaded then (a warm plan's scope is a shared no-op)."""
    return _NOTHING_TO_HOLD if plan.warm[which] else _first_run(plan, which)


@contextlib.contextmanager
def _first_run(plan: Any, which: int):
    with LOAD_LOCK:
        yield
        plan.warm[which] = True


def own_gradients(arrays: list) -> list:
    """Give each floating array of ``arrays`` (a tape's) that has no gradient one, zeroed.

    Arrays over overlapping memory (a scratch array and its views) share one gradient buffer
    laid out like their memory, so a gradient written through one view is read through the
    others. Returns the buffers first, then the arrays given a gradient.
    """
    bare = [a for a in arrays if a.grad is None and a.size and floating(a.dtype)]
    arrays = sorted(bare, key=lambda a: span(a)[0])
    buffers, group, end = [], [], 0
    for a in arrays + [None]:
        memory = span(a) if a is not None else (end, end)
        if group and memory[0] >= end:
            buffers.append(_shared_gradient(group))
            group = []
        if a is not None:
            end = max(end, memory[1]) if group else memory[1]
            group.append(a)
    return [buffers, *arrays]


def _shared_gradient(group: list, zeroed: bool = True) -> Any:
    """Give each array of ``group`` (arrays over one stretch of memory) a gradient laid out like
    it in one buffer mirroring that memory (zeroed, or not); return the buffer."""
    start = min(span(a)[0] for a in group)
    end = max(span(a)[1] for a in group)
    make = wp.zeros if zeroed else wp.empty
    buffer = make(max(end - start, 1), dtype=wp.uint8, device=group[0].device)
    for a in group:
        a.grad = wp.array(
            ptr=buffer.ptr + span(a)[0] - start, dtype=a.dtype, shape=a.shape, strides=a.strides, device=a.device
        )
    return buffer


# The most array views a plan keeps for the forward (see _function_args).
MAX_VIEWS = 64


def _function_args(plan, ins, scalars, outs, fresh=False):
    sig, dev = plan.sig, plan.device
    args = []
    k = 0
    vals = iter(scalars)
    # The forward's views are kept per plan, by position and pointer: a plan fixes every shape,
    # stride and dtype, so a view of the same pointer is the same view, and making one (~3.5 us)
    # and its launch descriptor cost a small call ~30 us of its ~100. A recording (``fresh``)
    # gets views of its own: its backward gives them gradients.
    views = None
    if not fresh:
        views = plan.cache.get("views")
        if views is None or len(views) > MAX_VIEWS:
            views = plan.cache["views"] = {}
    for p in sig.inputs:
        if not p.is_array:
            args.append(next(vals))
            continue
        shape, strides = plan.in_layouts[k]
        if views is not None:
            args.append(_kept_view(views, k, p, dev, ins[k], shape, strides))
        else:
            args.append(_wrap(p, dev, ins[k], shape, strides))
        k += 1
    for j, p in enumerate(sig.outputs):
        shape, strides = plan.out_shapes[j], plan.out_strides[j]
        if views is not None:
            args.append(_kept_view(views, -1 - j, p, dev, outs[j], shape, strides))
        else:
            args.append(_wrap(p, dev, outs[j], shape, strides))
    return args


def _kept_view(views: dict, position: int, p: Param, device: Any, ptr: int, shape: Any, strides: Any) -> Any:
    """The view of argument ``position`` (outputs: -1, -2, ...) at ``ptr``, kept in ``views``."""
    a = views.get((position, ptr))
    if a is None:
        a = views[position, ptr] = _wrap(p, device, ptr, shape, strides)
    return a


class FunctionPlan(Plan):
    """A launch function's plan: it runs the function on Warp views of the buffers (taped when
    asked) and differentiates through that recording, or through a taped re-run."""

    allocates = True
    takes_values = True

    def __init__(self, sig: Signature, device: Any, in_layouts, launch, out_shapes, debug: bool = False):
        super().__init__(sig, device, in_layouts, launch, out_shapes)
        self.warm = [False, False]  # the forward / backward has run once (its modules are loaded)

    run = run_function  # (plan, in_ptrs, scalars, out_ptrs, stream, keywords, record)

    def run_adjoint(
        self, op: Any, in_ptrs, scalars, out_ptrs, in_grad_ptrs, out_grads, stream: Any = None, recording: Any = None
    ) -> None:
        """Back-propagate the forward's recording, or (none kept) a taped re-run."""
        if recording is not None:
            run_recorded_adjoint(op, recording, in_grad_ptrs, out_grads, stream)
        else:
            run_function_adjoint(op, self, in_ptrs, scalars, out_ptrs, in_grad_ptrs, out_grads, stream)


def new_plan(
    sig: Signature,
    device: Any,
    in_layouts,
    launch,
    out_shapes,
    debug: bool = False,
    block_dim: int | None = None,
    tiled: bool = False,
) -> Plan:
    """The plan of a call with these layouts and dims: a kernel's (launched in blocks of
    ``block_dim`` threads, by blocks if ``tiled``) or a launch function's."""
    if sig.kind == "kernel":
        return KernelPlan(sig, device, in_layouts, launch, out_shapes, debug, block_dim, tiled)
    return FunctionPlan(sig, device, in_layouts, launch, out_shapes, debug)
