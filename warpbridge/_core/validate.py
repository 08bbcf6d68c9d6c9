"""Validation of a call before anything launches: arrays against the signature, scalars
packed and range-checked, launch and output dims resolved (from a callable too), bounds of
thread-indexed arrays. ``validate`` checks a call against its signature through a framework
description, the same for every framework; the op turns a validated call into a plan."""

from __future__ import annotations

import math
import operator
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

from .dtypes import HALF_BITS, ITEMSIZE, contiguous_strides
from .errors import describe as describe_value
from .errors import fail
from .signature import GENERIC, STRUCT, Param, Signature
from .warp_runtime import struct_arrays

_MAX_DIMS = 4
_INT32_MAX = 2**31 - 1


class ArrayArg(NamedTuple):
    """An array handed over by an adapter: everything Warp needs, nothing framework-specific."""

    ptr: int
    dtype_name: str
    shape: tuple[int, ...]  # the framework's full shape, trailing vector/matrix dims included
    strides: tuple[int, ...]  # in bytes, one per dim of `shape`


def check_array(op: str, p: Param, a: ArrayArg) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Validate ``a`` against ``p``; return its Warp shape and Warp byte strides."""
    if a.dtype_name != p.dtype_name and p.dtype_name.startswith(STRUCT + ":"):
        raise fail(
            op,
            f"argument '{p.name}' must be a wp.array of wp.struct {p.wp_type.dtype.key} (framework arrays cannot "
            f"hold Warp structs: pass the wp.array itself, forward only), got {a.dtype_name}",
        )
    if a.dtype_name != p.dtype_name:
        raise fail(
            op, f"argument '{p.name}' must have dtype {p.dtype_name}, got {a.dtype_name} (warpbridge never casts)"
        )
    if len(a.shape) != p.tensor_ndim:
        inner = f" ({p.ndim} array dims + trailing {p.inner_shape})" if p.inner_shape else ""
        raise fail(op, f"argument '{p.name}' must be {p.tensor_ndim}-D{inner}, got shape {tuple(a.shape)}")
    if p.inner_shape and tuple(a.shape[p.ndim :]) != p.inner_shape:
        raise fail(
            op,
            f"argument '{p.name}' must have trailing dims {p.inner_shape} for its Warp dtype, got shape {tuple(a.shape)}",
        )
    return tuple(a.shape[: p.ndim]), tuple(a.strides[: p.ndim])


def inner_contiguous(p: Param, shape: Sequence[int], strides_elems: Sequence[int]) -> bool:
    """Whether the vector/matrix dims are packed as Warp needs (outer dims may be strided)."""
    expected = 1
    for k in range(len(p.inner_shape) - 1, -1, -1):
        d = p.ndim + k
        if shape[d] > 1 and strides_elems[d] != expected:
            return False
        expected *= p.inner_shape[k]
    return True


def normalize_dims(op: str, what: str, dims: Any) -> tuple[int, ...] | None:
    if dims is None:
        return None
    if isinstance(dims, bool):
        raise fail(op, f"{what} must be an int or a tuple of ints, got {dims!r}")
    if isinstance(dims, int):
        dims = (dims,)
    try:
        out = tuple(dims)
    except TypeError:
        raise fail(op, f"{what} must be an int or a tuple of ints, got {dims!r}") from None
    if not 1 <= len(out) <= _MAX_DIMS or not all(_is_dim(d) for d in out):
        raise fail(op, f"{what} must be 1 to {_MAX_DIMS} non-negative ints, got {dims!r}")
    return out


# Types of symbolic sizes a backend traces with (accepted as dims without forcing a guard).
SYMBOLIC_DIMS: set = set()


def _is_dim(d: Any) -> bool:
    if isinstance(d, bool):
        return False
    if isinstance(d, int):
        return d >= 0
    return type(d) in SYMBOLIC_DIMS


def normalize_output_dims(op: str, sig: Signature, output_dims: Any) -> Any:
    """``None``, one dims tuple for every output, a dict {output name: dims}, or a callable
    returning either from the op's inputs (see :func:`call_output_dims`)."""
    if output_dims is None or callable(output_dims):
        return output_dims
    if isinstance(output_dims, dict):
        names = [p.name for p in sig.outputs]
        unknown = [k for k in output_dims if k not in names]
        if unknown:
            raise fail(op, f"output_dims names unknown output(s) {unknown}; the outputs are {names}")
        return {k: normalize_dims(op, f"output_dims['{k}']", v) for k, v in output_dims.items()}
    return normalize_dims(op, "output_dims", output_dims)


def call_output_dims(op: str, sig: Signature, fn: Any, inputs: Sequence[Any]) -> Any:
    """Output dims from a callable: called with the op's inputs in order, each array replaced
    by its Warp shape (a tuple of ints) and each scalar by its value."""
    try:
        got = fn(*inputs)
    except Exception as e:
        raise fail(op, f"output_dims({', '.join(p.name for p in sig.inputs)}) raised {type(e).__name__}: {e}") from e
    if got is None or callable(got):
        raise fail(op, f"output_dims(...) must return dims (a tuple, or a dict by output name), got {got!r}")
    return normalize_output_dims(op, sig, got)


def input_values(sig: Signature, args: Sequence[Any], shapes: Sequence[tuple]) -> list:
    """What a callable ``output_dims`` is called with: scalars as given, arrays as Warp shapes."""
    it = iter(shapes)
    return [tuple(next(it)) if p.is_array else a for p, a in zip(sig.inputs, args)]


def resolve_dims(
    op: str,
    sig: Signature,
    first_shape: tuple[int, ...] | None,
    launch_dims: Any,
    output_dims: Any,
    in_shapes: Sequence[tuple[int, ...]] = (),
) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """Launch dims and each output's Warp shape, from per-call or construction-time settings;
    an in_out output has its input's shape (``in_shapes``: the array inputs' Warp shapes)."""
    launch = launch_dims
    if launch is None:
        if sig.tile_use:
            builtin, where = sig.tile_use
            raise fail(
                op,
                f"kernel '{sig.kernel.key}' uses tiles (wp.{builtin} at {where}): pass launch_dims, the grid of "
                f"blocks as wp.launch_tiled takes it, not the first array's shape {tuple(first_shape or ())}",
            )
        if first_shape is None:
            raise fail(op, "the op has no array input to take launch dims from: pass launch_dims")
        launch = first_shape
    out_shapes = []
    updated = {j: in_shapes[k] for k, j in sig.in_out_pairs if k < len(in_shapes)}
    for j, p in enumerate(sig.outputs):
        if j in updated:
            out_shapes.append(tuple(updated[j]))
            continue
        dims = output_dims.get(p.name) if isinstance(output_dims, dict) else output_dims
        dims = launch if dims is None else dims
        if len(dims) != p.ndim:
            src = (
                "output_dims"
                if (output_dims is not None and dims is not launch)
                else f"the launch dims {tuple(launch)}"
            )
            raise fail(
                op,
                f"output '{p.name}' is a {p.ndim}-D array but {src} give {len(dims)} dims; "
                f"pass output_dims={{'{p.name}': <{p.ndim} ints>}}",
            )
        out_shapes.append(tuple(dims))
    return tuple(launch), tuple(out_shapes)


def check_bounds(op: str, sig: Signature, layouts: Sequence[tuple], launch: tuple, out_shapes: Sequence[tuple]) -> None:
    """Refuse a launch in which the kernel would index an array past its end with a thread
    index (``i = wp.tid()`` ... ``x[i]``): the array must cover the launch dims there."""
    if not sig.tid_indexed:
        return
    shapes = {p.name: shape for p, (shape, _) in zip(sig.array_inputs, layouts)}
    shapes.update((p.name, s) for p, s in zip(sig.outputs, out_shapes))
    for name, uses in sig.tid_indexed.items():
        shape = shapes.get(name)
        if shape is None:
            continue
        for pos, dim, line in uses:
            if pos < len(shape) and dim < len(launch) and shape[pos] < launch[dim]:
                what = "output" if name in {p.name for p in sig.outputs} else "argument"
                raise fail(
                    op,
                    f"{what} '{name}' has shape {tuple(shape)}, but kernel '{sig.kernel.key}' indexes its dimension "
                    f"{pos} with the thread index of launch dimension {dim} (line {sig._first_line + line - 1}), and "
                    f"the launch dims are {tuple(launch)}: it would be accessed past its end. Pass arrays that cover "
                    "the launch dims, or launch_dims/output_dims that fit them",
                )


def _refuse_differentiable_fields(op: str, p: Param, value: Any) -> None:
    """A struct passed to an op is a constant: its arrays' gradients would be silently lost
    (the op's outputs would not even require grad), so one that requires grad is refused."""
    for path, a in struct_arrays(value):
        if a.requires_grad:
            raise fail(
                op,
                f"argument '{p.name}': field '{path}' of {p.describe_type()} holds an array that requires grad, "
                f"but an op passes a struct as a constant: that array's "
                f"gradient would be silently lost. Pass the array as an array argument of the op (or of a launch "
                f"function that builds the struct inside, see docs/interop.md), or an array made "
                f"from a detached tensor if it needs no gradient",
            )


def make_scalar_packer(op: str, p: Param):
    """A converter from a Python value to what the kernel's ctypes field takes, checked."""
    name = p.dtype_name
    if name == GENERIC:  # checked by the instance the call runs (WarpOp.instance)
        return lambda v: v
    if name == STRUCT:

        def pack_struct(v: Any) -> Any:
            if getattr(v, "_cls", None) is not p.wp_type:
                raise fail(op, f"argument '{p.name}' must be {p.describe_type()} instance, got {_what(v)}")
            _refuse_differentiable_fields(op, p, v)
            return v

        return pack_struct
    if p.inner_shape:
        n = math.prod(p.inner_shape)
        component = _float_checker(op, p) if p.is_float else _int_checker(op, p)

        def pack_composite(v: Any) -> Any:
            try:
                items = _flatten(v)
            except TypeError:
                items = None
            if items is None or len(items) != n:
                raise fail(
                    op, f"argument '{p.name}' must be a sequence of {n} numbers for {p.describe_type()}, got {v!r}"
                )
            return p.wp_type(*[component(x, f" component {k}") for k, x in enumerate(items)])

        return pack_composite
    if name == "bool":

        def pack_bool(v: Any) -> bool:
            if not isinstance(v, bool):
                raise fail(op, f"argument '{p.name}' must be a bool, got {type(v).__name__} {v!r}")
            return v

        return pack_bool
    if p.is_float:
        check = _float_checker(op, p)

        def pack_float(v: Any) -> Any:
            f = check(v)
            # float16 / bfloat16 fields hold raw bits
            return HALF_BITS[name][0](f) if name in HALF_BITS else f

        return pack_float
    return _int_checker(op, p)


# The largest finite value of each float type: a finite scalar beyond it would round to inf.
_FLOAT_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38}
# Half the gap to the next power of two past the largest value: below it a value rounds down.
_ROUNDS_TO_MAX = {"float16": 65520.0, "bfloat16": 3.39617752923046e38, "float32": 3.4028235677973366e38}


def _float_checker(op: str, p: Param):
    """A float scalar (or component), checked: a real number that is finite in the kernel's type
    unless given as inf or nan itself."""
    name = p.dtype_name
    limit = _ROUNDS_TO_MAX.get(name)

    def check(v: Any, where: str = "") -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise fail(op, f"argument '{p.name}'{where} must be a Python number ({name} scalar), got {_what(v)}")
        try:
            f = float(v)
        except OverflowError:
            shown = str(v) if len(str(v)) < 24 else f"{str(v)[:12]}... ({len(str(v))} digits)"
            raise fail(op, f"argument '{p.name}'{where} = {shown} is too large for any float type") from None
        if limit is not None and math.isfinite(f) and abs(f) >= limit:
            raise fail(
                op,
                f"argument '{p.name}'{where} = {v!r} would round to inf in {name} (largest finite value "
                f"{_FLOAT_MAX[name]:.9g}); pass inf itself if you mean it",
            )
        return f

    return check


def _int_checker(op: str, p: Param):
    """An integer scalar (or component), checked: a Python int, NumPy integer or 0-d integer
    tensor, in the kernel type's range. Never truncated, parsed or wrapped."""
    name = p.dtype_name
    bits = ITEMSIZE[name] * 8
    lo, hi = (0, 2**bits - 1) if name.startswith("u") else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)

    def check(v: Any, where: str = "") -> int:
        try:
            i = None if isinstance(v, bool) else operator.index(v)
        except TypeError:
            i = None
        if i is None:
            raise fail(
                op,
                f"argument '{p.name}'{where} must be a Python int ({name} scalar), got {_what(v)} (integer "
                "scalars of array libraries and 0-d integer arrays work too; values are never truncated)",
            )
        if not lo <= i <= hi:
            raise fail(op, f"argument '{p.name}'{where} = {i} does not fit {name} [{lo}, {hi}]")
        return i

    return check


def _what(v: Any) -> str:
    if hasattr(v, "shape"):
        return f"{type(v).__name__} of shape {tuple(v.shape)}; scalars are Python numbers and are not differentiable"
    return f"{type(v).__name__} {v!r}"


def _flatten(v: Any) -> list:
    out = []
    for x in v:
        if isinstance(x, (list, tuple)):
            out.extend(_flatten(x))
        else:
            out.append(x)
    return out


def check_strides(op: str, p: Param, shape: Sequence[int], strides: Sequence[int]) -> None:
    """Warp descriptors hold int32 shapes and byte strides."""
    if any(s > _INT32_MAX for s in shape) or any(abs(s) > _INT32_MAX for s in strides):
        raise fail(op, f"argument '{p.name}' is too large for Warp's 32-bit shapes/strides: shape {tuple(shape)}")


class Validated(NamedTuple):
    """A call checked against its signature (``validate``): nothing here keeps the arrays."""

    arrays: list  #: the array inputs, made inner-contiguous where Warp needs it
    layouts: tuple  #: each array's (Warp shape, Warp byte strides)
    values: tuple  #: the scalar arguments as given
    packed: tuple  #: the scalar arguments checked and packed for the kernel
    device: Any  #: the framework's device of the arrays (``fw.default_device`` without any)


# each signature's scalar packers (make_scalar_packer), made on its first call
_PACKERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def packers(sig: Signature) -> tuple:
    """A checker-packer for each scalar input of ``sig``, in order (``make_scalar_packer``)."""
    found = _PACKERS.get(sig)
    if found is None:
        found = _PACKERS[sig] = tuple(make_scalar_packer(sig.name, p) for p in sig.inputs if not p.is_array)
    return found


def scalars_of(sig: Signature, args: Sequence[Any]) -> tuple[tuple, tuple]:
    """A call's scalar arguments as given, and checked and packed (``packers``): all a warm
    call whose arrays' layouts were validated before still needs checking."""
    values = tuple([args[i] for i in sig.scalar_positions])
    return values, tuple([pack(v) for pack, v in zip(packers(sig), values)])


def validate(sig: Signature, args: Sequence[Any], fw: Any) -> Validated:
    """Check the call ``args`` against ``sig`` through a framework description ``fw``, every
    framework the same way; raise the first problem, naming the argument.

    ``fw`` provides: ``array_name``; ``is_array(a)``; ``unsupported(a)`` (a reason or None);
    ``values(a)``; ``meta(a) -> (dtype name or None, shape, element strides, itemsize,
    device)``; ``contiguous(a)``; ``default_device``.
    """
    sig.check_arity(args)
    arrays, layouts, packed, values = [], [], [], []
    device, scalar_packers = None, packers(sig)
    for p, a in zip(sig.inputs, args):
        if not p.is_array:
            packed.append(scalar_packers[len(values)](a))  # checked (exact or refused) and packed
            values.append(a)
            continue
        a, layout, device = _checked_array(sig, p, a, fw, device)
        arrays.append(a)
        layouts.append(layout)
    return Validated(
        arrays, tuple(layouts), tuple(values), tuple(packed), fw.default_device if device is None else device
    )


def _checked_array(sig: Signature, p: Param, a: Any, fw: Any, device: Any) -> tuple:
    """(the array as Warp takes it, its (Warp shape, byte strides), its device), which must be
    ``device`` unless that is None (the first array)."""
    if not fw.is_array(a):
        raise fail(
            sig.name, f"argument '{p.name}' must be a {fw.array_name} ({p.describe_type()}), got {describe_value(a)}"
        )
    problem = fw.unsupported(a)
    if problem:
        raise fail(
            sig.name,
            f"argument '{p.name}' is {problem}; warpbridge hands Warp plain strided memory: pass a dense array "
            "on a real device",
        )
    a = fw.values(a)  # a view whose memory does not hold its values (a negative or conjugate bit)
    dtype_name, shape, strides, itemsize, dev = fw.meta(a)
    if device is not None and dev != device:
        raise fail(sig.name, f"all arrays must be on one device: argument '{p.name}' is on {dev}, expected {device}")
    if dtype_name is None:
        raise fail(sig.name, f"argument '{p.name}' has dtype {a.dtype}, which Warp cannot use; expected {p.dtype_name}")
    if (p.inner_shape and len(shape) == p.tensor_ndim and not inner_contiguous(p, shape, strides)) or (
        p.name in sig.layout_grads and tuple(strides) != contiguous_strides(shape, 1)
    ):
        # Warp needs packed vector/matrix elements (outer dims may stride); an array whose
        # adjoint addresses its gradient at its own layout must have the gradient's
        a = fw.contiguous(a)
        dtype_name, shape, strides, itemsize, dev = fw.meta(a)
    wshape, wstrides = check_array(sig.name, p, ArrayArg(0, dtype_name, shape, tuple(s * itemsize for s in strides)))
    check_strides(sig.name, p, wshape, wstrides)
    return a, (wshape, wstrides), dev
