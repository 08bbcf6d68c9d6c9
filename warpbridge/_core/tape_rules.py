"""Rule 7 for launch functions: what a recorded forward must not have done for a backward
through its tape to be right. No kernel with a hazard (unless trusted), no write into an
input, no mesh or BVH over differentiable points, no copy Warp left off the tape. Checked
once per recording, before its first backward; and the memory spans those checks compare."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import warp as wp

from . import adjoint_check as _adjoint
from . import off_tape_fills
from .errors import WarpBridgeError, fail
from .plan import host_bytes
from .warp_runtime import KeepingTape, RecordedLaunch, TapeContents, recorded_kernels


def input_written(op_name: str, func: Any, names: Sequence[str], kernel: str = "") -> WarpBridgeError:
    by = f" (kernel '{kernel}')" if kernel else ""
    first = names[0]
    return fail(
        op_name,
        f"launch function {func.__name__}() writes into its input array(s) {list(names)}{by}; warpbridge never "
        f"modifies a caller's memory, and Warp's adjoint of a state updated in place is wrong. Update a copy "
        f"(`{first} = wp.clone({first})` at the top of the function) or write the new state into an output",
    )


class Untaped(NamedTuple):
    """What a recorded forward filled outside Warp's tape, as (array, why) pairs for
    :func:`refuse_gradients_into` at each backward."""

    outputs: list  # floating outputs that no recorded launch or copy writes, holding values
    inner: list  # arrays made with requires_grad that recorded launches read, filled the same way
    plain: list  # (place, parameter label, array): the same made without requires_grad
    numbers: list  # (place, parameter label, value): the floating numbers launches took by value


def check_recorded(op: Any, tape: KeepingTape, args: Sequence[Any], contents: TapeContents, spans: dict) -> Untaped:
    """Rule 7 for launch functions, before the tape's first backward: no kernel with a hazard
    (unless trusted), no write into an input, no mesh or BVH built over differentiable points,
    no copy Warp left off the tape. ``args``: the arrays the function was called with;
    ``contents``: what the tape recorded; ``spans``: :func:`spans_of` its arrays. Returns what
    was filled outside the tape, for :func:`refuse_gradients_into` at each backward."""
    sig = op.sig
    inputs = [args[p.position] for p in sig.array_inputs]
    launches = contents.launches
    kernels = recorded_kernels(launches)
    _check_backward_enabled(op, launches)
    _check_taped_kinds(op, launches)
    _check_input_writes(op, launches, inputs, spans)
    _check_geometry(op, tape, launches, inputs)
    outputs = {p.name: args[len(sig.inputs) + j] for j, p in enumerate(sig.outputs) if p.is_float}
    named = {p.name: a for p, a in zip(sig.array_inputs, inputs)} | outputs
    writes = {k: _writes(k) for k in kernels}
    written_arrays = [a for launch in launches for label, a in launch.arrays if label in writes[launch.kernel]]
    written_arrays += list(tape.gradients)  # recorded copies' arrays
    written = [spans.get(id(a)) or span(a) for a in written_arrays]
    ends = [span(a) for a in named.values()]
    outside = _filled_outside(contents.arrays, spans, {id(a) for a in written_arrays}, ends + written)
    _check_unrecorded_copies(op, [a for a in outside.values() if a.grad is None], named, contents.arrays)
    found: tuple = ()
    for k in kernels:
        if not op.trusts(k):
            found += tuple(h for h in _adjoint.kernel_hazards(k) if not op.trusts(h.kernel))
    if found:
        raise WarpBridgeError(_adjoint.refusal(op.name, found))
    places = off_tape_fills.places(launches)
    inner, plain = _untaped_inner(launches, places, kernels, outside)
    return Untaped(_untaped_outputs(outputs, written), inner, plain, _numbers(launches, places))


def _check_backward_enabled(op: Any, launches: list[RecordedLaunch]) -> None:
    """A kernel compiled with ``enable_backward=False`` has no adjoint, and Warp's tape skips it:
    refused where it writes a floating array (a gradient path would end there). One that writes
    only integers (indices, topology) carries no gradient, and passes."""
    for launch in launches:
        k = launch.kernel
        if k.options.get("enable_backward", k.module.options.get("enable_backward", True)):
            continue
        writes = _adjoint.kernel_accesses(k).writes
        written = [label for label, a in launch.arrays if label in writes and floating(a.dtype)]
        if written:
            raise fail(
                op.name,
                f"cannot differentiate: launch function {op.sig.func.__name__}() at {launch.site or 'an unknown line'} "
                f"runs kernel '{k.key}', compiled with enable_backward=False, and it writes the floating array(s) "
                f"{written}: no gradient can pass through it. Run that step outside the function (on its result, "
                "passed in as an argument), compile the kernel with enable_backward=True, or give the op its own "
                "backward (@op.backward)",
            )


def _filled_outside(arrays: Sequence[Any], spans: dict, written: set, filled: list) -> dict:
    """The floating arrays among ``arrays``, by id, that are no input or output and that
    nothing on the tape writes (``written``: the ids of the arrays it writes; ``filled``: the
    spans of those and of the inputs and outputs)."""
    return {
        id(a): a
        for a in arrays
        if a.size and floating(a.dtype) and id(a) not in written and not any(overlap(spans[id(a)], m) for m in filled)
    }


def spans_of(arrays: Sequence[Any]) -> dict:
    """Each array's :func:`span`, by ``id``: read once per recording, then compared."""
    return {id(a): span(a) for a in arrays}


_UNTAPED = (wp.indexedarray, wp.fabricarray, wp.indexedfabricarray)


def _check_taped_kinds(op: Any, launches: list[RecordedLaunch]) -> None:
    """Warp's tape has no adjoint for an indexed or fabric array argument (its backward fails)."""
    for launch in launches:
        for label, a in launch.args:
            if isinstance(a, _UNTAPED):
                raise fail(
                    op.name,
                    f"cannot differentiate: launch function {op.sig.func.__name__}() passes a wp.{type(a).__name__} "
                    f"as argument '{label}' of kernel '{launch.kernel.key}', and Warp's tape has no adjoint for "
                    "one. Pass the array and its indices to the kernel and index inside it, or give the op "
                    "its own backward (@op.backward)",
                )


def _check_input_writes(op: Any, launches: list[RecordedLaunch], inputs: Sequence[Any], spans: dict) -> None:
    inputs_at = [(p.name, span(a)) for p, a in zip(op.sig.array_inputs, inputs)]
    for launch in launches:
        writes = _adjoint.kernel_accesses(launch.kernel).writes
        for label, a in launch.arrays:
            if label not in writes:
                continue
            memory = spans[id(a)]
            hit = [name for name, at in inputs_at if overlap(at, memory)]
            if hit:
                raise input_written(op.name, op.sig.func, hit, launch.kernel.key)


def _check_geometry(op: Any, tape: KeepingTape, launches: list[RecordedLaunch], inputs: Sequence[Any]) -> None:
    """Warp's adjoint never reaches a mesh's or BVH's points: refuse one built over points that
    depend on an input receiving a gradient."""
    used = {v for launch in launches for _, v in launch.args if isinstance(v, int)}
    queried = [obj for obj in tape.kept_objects() if _geometry_points(obj) and obj.id in used]
    if not queried:
        return
    tainted = [span(a) for a in inputs if a.grad is not None]
    for launch in launches:  # what depends on those inputs, launch by launch
        acc = _adjoint.kernel_accesses(launch.kernel)
        arrays = launch.arrays
        read = [span(a) for label, a in arrays if label in acc.reads | acc.unknown]
        if any(overlap(r, t) for r in read for t in tainted):
            tainted += [span(a) for label, a in arrays if label in acc.writes]
    for obj in queried:
        if any(overlap(span(p), t) for p in _geometry_points(obj) for t in tainted):
            raise fail(
                op.name,
                f"cannot differentiate: launch function {op.sig.func.__name__}() queries a {type(obj).__name__} "
                "built over points that depend on a differentiable input, and Warp's adjoint never reaches a "
                f"{type(obj).__name__}'s points (their gradient would be zero). Give the op its own backward "
                "(@op.backward, see docs/custom-backward.md), or pass the points without requires_grad",
            )


def _check_unrecorded_copies(op: Any, bare: Sequence[Any], named: dict, arrays: Sequence[Any]) -> None:
    """Warp records a copy (``wp.copy``, ``.assign()``, ``wp.clone``) only between arrays that
    both have a gradient: a copy into an array made without ``requires_grad`` cuts the gradient
    silently. Refuse where the recording shows one: an array without a gradient that nothing on
    the tape writes (``bare``) holding a copy of another recorded array's values (of ``named``,
    the inputs and outputs, or ``arrays``; an array of zeros proves nothing and passes: zero
    forces a kernel only reads are common)."""
    sources = list(named.items()) + [(None, a) for a in arrays]
    for a in bare:
        copied = _copied_from(a, sources)
        if copied is not None:
            name, s = copied
            what = f"argument '{name}'" if name else f"a {_described(s)}"
            raise fail(
                op.name,
                f"cannot differentiate: launch function {op.sig.func.__name__}() reads a {_described(a)} made "
                f"without requires_grad that holds a copy of {what}; Warp's tape records no copy (wp.copy, "
                ".assign(), wp.clone(..., requires_grad=False)) into an array without a gradient, so the "
                "gradient through it would be lost. Make it with requires_grad=True "
                "(`wp.zeros(..., requires_grad=True)`, `wp.clone(x)`); if a call Warp never records filled it "
                "(wp.utils.array_sum, a launch with record_tape=False), compute it with a recorded kernel",
            )


def _untaped_outputs(outputs: dict, written: list) -> list:
    """The floating outputs nothing on the tape writes but that hold values: filled outside it
    (``wp.utils.array_sum``, ``array_scan``, ``.fill_()``, a copy from an array without a
    gradient), so the tape cannot carry their gradients."""
    found = []
    for name, y in outputs.items():
        memory = span(y) if y.size else None
        if memory and not any(overlap(memory, m) for m in written) and holds_values(y):
            found.append((y, _output_filled_outside(name)))
    return found


def _untaped_inner(launches: list[RecordedLaunch], places: list, kernels: list, outside: dict) -> tuple[list, list]:
    """The arrays filled outside the tape (``outside``, by id) that a recorded launch reads:
    those made with requires_grad and holding values, as (array, why); and those made without,
    as (place, label, array), for :func:`launch_function.refuse_host_dependence` (constants
    look the same)."""
    reads = {k: _reads(k) for k in kernels}
    found: dict = {}
    for place, launch in zip(places, launches):
        for label, a in launch.arrays:
            if id(a) in outside and id(a) not in found and label in reads[launch.kernel]:
                found[id(a)] = (place, label, a)
    untaped = list(found.values())
    inner = [(a, _inner_filled_outside(a)) for _, _, a in untaped if a.grad is not None and holds_values(a)]
    return inner, [(place, label, a) for place, label, a in untaped if a.grad is None]


def _numbers(launches: list[RecordedLaunch], places: list) -> list:
    """(place, label, value) for each floating scalar, vector or matrix a recorded launch took
    by value: computed on the host, it may come from the inputs (``x.numpy().max()``), and
    Warp's tape carries no gradient into a Python number."""
    return [
        (place, label, v)
        for place, launch in zip(places, launches)
        for label, v in launch.args
        if _is_floating_number(v)
    ]


def _is_floating_number(v: Any) -> bool:
    if isinstance(v, float):
        return True
    t = type(v)
    return t in _FLOATS or getattr(t, "_wp_scalar_type_", None) in _FLOATS


def holds_values(a: Any) -> bool:
    """Whether array ``a`` (None: none) holds anything but zeros, read on the host."""
    return a is not None and bool(host_bytes(a).strip(b"\0"))


def refuse_gradients_into(op: Any, untaped: list) -> None:
    """Refuse a backward that brought a non-zero gradient into an array filled outside the tape
    (``untaped``: (array, why) pairs, from :class:`Untaped`): it cannot go further."""
    for a, why in untaped:
        if holds_values(a.grad):
            raise fail(op.name, f"cannot differentiate: launch function {op.sig.func.__name__}() {why}")


def _output_filled_outside(name: str) -> str:
    return (
        f"fills its output '{name}' outside Warp's tape: no recorded launch or copy writes it "
        "(wp.utils.array_sum, array_scan, .fill_(), .assign() from host data and copies from an array without a "
        "gradient record nothing), so its gradient cannot reach the inputs. Compute it with a kernel, or copy it "
        "from an array made with requires_grad=True; if its values do not depend on the inputs, detach it before "
        "the loss"
    )


def input_dependent_number(kernel: Any, label: str) -> str:
    """Why a backward refuses a number passed to a kernel by value that changes with the inputs."""
    return (
        f"passes kernel '{kernel.key}' a number for '{label}' that changes with the inputs: computed on the host "
        "(from values read back out of arrays, wp.utils.array_sum without out=), it carries no gradient, so the "
        "gradient through it would be lost. Compute it with a kernel into an array the kernel reads, or make it "
        "an argument of the op"
    )


def input_dependent_fill(a: Any) -> str:
    """Why a backward refuses array ``a``, made without requires_grad and filled outside the
    tape, whose values change with the inputs."""
    return (
        f"reads a {_described(a)} that nothing on Warp's tape writes and whose values change with the inputs: it "
        "was filled outside the tape (wp.utils.array_sum, array_scan, a wp.launch with record_tape=False, "
        ".assign()), so the gradient through it would be lost. Compute it with a recorded kernel, into an array "
        "made with requires_grad=True"
    )


def _inner_filled_outside(a: Any) -> str:
    return (
        f"reads a {_described(a)} made with requires_grad that nothing on Warp's tape writes: it was filled "
        "outside the tape (wp.utils.array_sum, array_scan, a wp.launch with record_tape=False, .fill_(), "
        ".assign(), wp.copy from an array without a gradient), and the gradient that reaches it goes no further. "
        "If its values depend on the inputs, compute them with a recorded kernel (or copy them from an array "
        "made with requires_grad=True); if they are constants, make the array without requires_grad"
    )


def _writes(kernel: Any) -> set:
    acc = _adjoint.kernel_accesses(kernel)
    return acc.writes | acc.unknown


def _reads(kernel: Any) -> set:
    acc = _adjoint.kernel_accesses(kernel)
    return acc.reads | acc.unknown


def _copied_from(a: Any, sources: Sequence[tuple]) -> tuple | None:
    """The (name or None, array) among ``sources`` whose values hold all of ``a``'s (None: none,
    or ``a`` is all zeros). Only sources at least as large are read: a read-only table no
    other array could hold costs no copy."""
    size = _nbytes(a)
    larger = [(name, s) for name, s in sources if s is not a and s.size and floating(s.dtype) and _nbytes(s) >= size]
    if not larger:
        return None
    values = host_bytes(a)
    if not values.strip(b"\0"):
        return None
    for name, s in larger:
        if values in host_bytes(s):
            return name, s
    return None


def _nbytes(a: Any) -> int:
    return a.size * wp.types.type_size_in_bytes(a.dtype)


def _described(a: Any) -> str:
    return f"{getattr(a.dtype, '__name__', a.dtype)} array of shape {tuple(a.shape)}"


def _geometry_points(obj: Any) -> list:
    if isinstance(obj, wp.Mesh):
        return [obj.points]
    if isinstance(obj, wp.Bvh):
        return [obj.lowers, obj.uppers]
    return []


def span(a: Any) -> tuple[int, int]:
    """The bytes an array can touch: [first, end)."""
    if a is None or not a.size or not a.ptr:
        return (0, 0)
    last = sum((n - 1) * s for n, s in zip(a.shape, a.strides))
    return (a.ptr, a.ptr + last + wp.types.type_size_in_bytes(a.dtype))


def overlap(x: tuple[int, int], y: tuple[int, int]) -> bool:
    return x[0] < y[1] and y[0] < x[1]


_FLOATS = (wp.float16, wp.bfloat16, wp.float32, wp.float64)


def floating(dtype: Any) -> bool:
    return getattr(dtype, "_wp_scalar_type_", dtype) in _FLOATS
