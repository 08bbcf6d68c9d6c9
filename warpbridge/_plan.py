"""The framework-neutral core of a call: validate arrays, resolve dims, launch.

Adapters describe each array as an :class:`ArrayArg` (pointer, dtype name, shape and
byte strides); this module checks it against the :class:`~warpbridge._signature.Param`,
resolves launch and output dims, and launches the forward or adjoint kernel through a
:class:`Plan` cached per (device, input layouts, dims). A plan depends only on the kernel
and on shapes, never on data pointers: memory is reused for other shapes and dtypes.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import sys
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

import warp as wp

from . import _adjoint
from ._errors import WarpBridgeError, fail
from ._errors import describe as describe_value
from ._signature import Param, Signature

_array_t = wp._src.types.array_t
_MAX_DIMS = 4
_INT32_MAX = 2**31 - 1
_ITEMSIZE = {
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "int16": 2, "int32": 4, "int64": 8,
    "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1,
}  # fmt: skip
_INIT_LOCK = threading.Lock()
# 16-bit float scalars travel as raw bits in kernel argument structs: (to bits, from bits)
_HALF_BITS = {
    "float16": (wp._src.types.float_to_half_bits, wp._src.types.half_bits_to_float),
    "bfloat16": (wp._src.types.float_to_bfloat16_bits, wp._src.types.bfloat16_bits_to_float),
}
# Held while warpbridge builds or loads a Warp module (a plan's first launch, a launch
# function's first run, the point kernels' first use): Warp's module build and load are not
# safe to enter from several threads at once. Warm calls never take it.
LOAD_LOCK = threading.RLock()

# Call compiled CPU kernels directly (the fast path). Tests turn this off to run the generic
# wp.launch path, the one CUDA takes, on machines without a GPU.
DIRECT_CPU = True


def ensure_init() -> None:
    """Initialise Warp once (wp.from_paddle and friends fail before wp.init()), with a
    ``wp.Tape`` per thread (see :func:`_thread_local_tape`)."""
    if not wp._src.context.runtime or not _TAPE_PER_THREAD:
        with _INIT_LOCK:
            if not wp._src.context.runtime:
                # warpbridge's own init skips Warp's greeting; warnings still show.
                level = wp.config.log_level
                wp.config.log_level = max(level, wp.LOG_WARNING)
                try:
                    wp.init()
                finally:
                    wp.config.log_level = level
            if not _TAPE_PER_THREAD:
                _thread_local_tape(wp._src.context.runtime)
                _TAPE_PER_THREAD.append(True)


_TAPE_PER_THREAD: list = []


def _thread_local_tape(runtime: Any) -> None:
    """Make Warp's active tape a per-thread setting.

    Warp keeps one active ``wp.Tape`` per process (``runtime.tape``): while a launch
    function's backward records its tape in one thread, every ``wp.launch`` from other
    threads (another op's forward, a data loader) was recorded into it and replayed by its
    backward, and a second thread opening a tape got "entering a tape while one is already
    active". Measured: 1 fresh process in 2 failed ``tests/test_threads_cold.py``. A tape now
    records the launches of the thread that opened it, which is what it does in a
    single-threaded program.
    """
    cls = type(runtime)
    if getattr(cls, "_tape_per_thread", False):
        return
    local = threading.local()
    current = runtime.__dict__.pop("tape", None)

    def get_tape(self: Any) -> Any:
        return getattr(local, "tape", None)

    def set_tape(self: Any, tape: Any) -> None:
        local.tape = tape

    runtime.__class__ = type(cls.__name__, (cls,), {"_tape_per_thread": True, "tape": property(get_tape, set_tape)})
    if current is not None:
        local.tape = current


class ArrayArg(NamedTuple):
    """An array handed over by an adapter: everything Warp needs, nothing framework-specific."""

    ptr: int
    dtype_name: str
    shape: tuple[int, ...]  # the framework's full shape, trailing vector/matrix dims included
    strides: tuple[int, ...]  # in bytes, one per dim of `shape`


def check_array(op: str, p: Param, a: ArrayArg) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Validate ``a`` against ``p``; return its Warp shape and Warp byte strides."""
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
    op: str, sig: Signature, first_shape: tuple[int, ...] | None, launch_dims: Any, output_dims: Any
) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """Launch dims and each output's Warp shape, from per-call or construction-time settings."""
    launch = launch_dims
    if launch is None:
        if first_shape is None:
            raise fail(op, "the op has no array input to take launch dims from: pass launch_dims")
        launch = first_shape
    out_shapes = []
    for p in sig.outputs:
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


def contiguous_strides(shape: Sequence[int], itemsize: int) -> tuple[int, ...]:
    strides, acc = [], itemsize
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))


def make_scalar_packer(op: str, p: Param):
    """A converter from a Python value to what the kernel's ctypes field takes, checked."""
    name = p.dtype_name
    if p.inner_shape:
        n = math.prod(p.inner_shape)

        def pack_composite(v: Any) -> Any:
            try:
                flat = [float(x) if p.is_float else int(x) for x in _flatten(v)]
            except TypeError:
                flat = None
            if flat is None or len(flat) != n:
                raise fail(
                    op, f"argument '{p.name}' must be a sequence of {n} numbers for {p.describe_type()}, got {v!r}"
                )
            return p.wp_type(*flat)

        return pack_composite
    if name == "bool":

        def pack_bool(v: Any) -> bool:
            if not isinstance(v, bool):
                raise fail(op, f"argument '{p.name}' must be a bool, got {type(v).__name__} {v!r}")
            return v

        return pack_bool
    if p.is_float:

        def pack_float(v: Any) -> Any:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise fail(op, f"argument '{p.name}' must be a Python number ({name} scalar), got {_what(v)}")
            # float16 / bfloat16 fields hold raw bits
            if name in _HALF_BITS:
                return _HALF_BITS[name][0](float(v))
            return float(v)

        return pack_float
    bits = _ITEMSIZE[name] * 8
    lo, hi = (0, 2**bits - 1) if name.startswith("u") else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)

    def pack_int(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise fail(op, f"argument '{p.name}' must be a Python int ({name} scalar), got {_what(v)}")
        if not lo <= v <= hi:
            raise fail(op, f"argument '{p.name}' = {v} does not fit {name} [{lo}, {hi}]")
        return v

    return pack_int


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


def _descriptor(ptr: int, shape: Sequence[int], strides: Sequence[int]) -> Any:
    return _array_t(ptr, 0, len(shape), shape, strides)


class Recorded(NamedTuple):
    """What calling a kernel's compiled CPU entry point directly needs: with ``direct``,
    ``hooks.forward(byref(bounds), byref(args))`` for an ``Args`` copied from ``template``."""

    Args: Any  # ctypes struct of the kernel's arguments, in order, named by their labels
    template: Any  # an Args holding the recorded values
    bounds: Any  # the launch bounds the record resolved
    hooks: Any
    module_exec: Any  # keep a reference, or the module may be unloaded
    direct: bool  # CPU, one thread per block: the entry point may be called directly


_ARGS_TYPES: dict = {}  # (kernel, field ctypes) -> Args struct


def record(kernel: Any, dim: Any, inputs: Sequence[Any], device: Any) -> Recorded:
    """Record one launch of ``kernel`` (which resolves the bounds, validates the dims and loads,
    compiling if needed, the module) and return what a direct call needs."""
    rec = wp.launch(kernel, dim=dim, inputs=list(inputs), device=device, record_cmd=True)
    types = tuple(type(v) for v in rec.params[1:])
    Args = _ARGS_TYPES.get((kernel, types))
    if Args is None:
        fields = [(a.label, t) for a, t in zip(kernel.adj.args, types)]
        Args = _ARGS_TYPES.setdefault((kernel, types), type("Args", (ctypes.Structure,), {"_fields_": fields}))
    direct = DIRECT_CPU and device.is_cpu and rec.block_dim == 1
    return Recorded(Args, Args(*rec.params[1:]), rec.params[0], rec.hooks, rec.module_exec, direct)


class Plan:
    """Launch state for one kernel, device and set of input layouts / dims.

    On the CPU the compiled forward and backward entry points are called directly with a
    ctypes argument struct copied from a template that already holds every shape and
    stride, so a call only writes data pointers and scalars (~1.5 us). Elsewhere (CUDA,
    CPU tile kernels) the launch goes through ``wp.launch`` on the caller's stream.
    """

    def __init__(self, sig: Signature, device: Any, in_layouts, launch, out_shapes):
        self.sig = sig
        self.device = device
        self.launch_dims = launch
        self.out_shapes = out_shapes  # Warp shapes
        self.size = math.prod(launch)
        self.out_strides = tuple(
            contiguous_strides(s + p.inner_shape, _ITEMSIZE[p.dtype_name])[: p.ndim]
            for p, s in zip(sig.outputs, out_shapes)
        )
        self.in_grad_strides = tuple(
            contiguous_strides(shape + p.inner_shape, _ITEMSIZE[p.dtype_name])[: p.ndim]
            for p, (shape, _) in zip(sig.array_inputs, in_layouts)
        )
        self.in_layouts = in_layouts
        self.cache: dict = {}  # per backend: what it derives once per plan (output allocations)
        self.warm = [False, False]  # functions: the forward / backward has run once (modules loaded)
        if sig.kind != "kernel" or self.size == 0:
            return  # functions launch their own kernels; empty launches launch nothing
        kernel = sig.kernel
        layouts = dict(zip((p.name for p in sig.array_inputs), in_layouts))
        layouts.update((p.name, (s, st)) for p, s, st in zip(sig.outputs, out_shapes, self.out_strides))
        templates = [_descriptor(0, *layouts[p.name]) if p.is_array else _zero_scalar(p) for p in sig.params]
        try:
            with LOAD_LOCK:
                rec = record(kernel, launch, templates, device)
        except (ValueError, RuntimeError, TypeError) as e:
            raise fail(sig.name, f"Warp rejected the launch (dims {launch}): {e}") from e
        self.bounds = rec.bounds
        self.hooks = rec.hooks
        self.module_exec = rec.module_exec
        self.direct = rec.direct
        self.Args = rec.Args
        self.template = rec.template
        self._copy = self.Args.from_buffer_copy
        self._fill = _make_filler(sig)
        self._bounds_ref = ctypes.byref(self.bounds)  # byref keeps self.bounds alive
        self._forward = self.hooks.forward

    def run(self, in_ptrs: Sequence[int], scalars: Sequence[Any], out_ptrs: Sequence[int], stream: Any = None) -> None:
        """The forward: the kernel, or the launch function, into outputs the caller allocated."""
        if self.sig.kind == "kernel":
            self.forward(in_ptrs, scalars, out_ptrs, stream)
        else:
            run_function(self, in_ptrs, scalars, out_ptrs, stream)

    def forward(
        self, in_ptrs: Sequence[int], scalars: Sequence[Any], out_ptrs: Sequence[int], stream: Any = None
    ) -> None:
        """Launch the forward kernel. ``scalars`` are already packed."""
        if self.size == 0:
            return
        args = self._copy(self.template)
        self._fill(args, in_ptrs, scalars, out_ptrs)
        if self.direct:
            self._forward(self._bounds_ref, ctypes.byref(args))
        else:
            values = self._launch_values(args)
            wp.launch(self.sig.kernel, dim=self.launch_dims, inputs=values, device=self.device, stream=stream)

    def adjoint(
        self,
        in_ptrs: Sequence[int],
        scalars: Sequence[Any],
        out_ptrs: Sequence[int],
        in_grad_ptrs: Sequence[int],
        out_grads: Sequence[tuple[int, tuple[int, ...]]],
        stream: Any = None,
    ) -> None:
        """Launch the adjoint kernel, accumulating into the input gradient buffers.

        ``in_grad_ptrs``: one pointer per array input (0 for no gradient, a contiguous buffer
        otherwise); ``out_grads``: (pointer, Warp byte strides) per output.
        """
        if self.size == 0:
            return
        if self.hooks.backward is None:
            raise fail(self.sig.name, "the kernel was compiled with enable_backward=False; it has no adjoint")
        args = self._copy(self.template)
        self._fill(args, in_ptrs, scalars, out_ptrs)
        for p, (ptr, _) in zip(self.sig.outputs, out_grads):
            if p.name in self.sig.tracked_outputs:
                # as Warp's Tape does: the adjoint of a store consumes (zeroes) the gradient of
                # the element it overwrote, so earlier stores and reads see only what reached them
                getattr(args, p.name).grad = ptr
        grads = iter(in_grad_ptrs)
        adj = []
        k = 0
        for p in self.sig.inputs:
            if p.is_array:
                ptr = next(grads)
                adj.append(_descriptor(ptr, self.in_layouts[k][0], self.in_grad_strides[k]) if ptr else _array_t())
                k += 1
            else:
                # scalar adjoints are discarded; the struct takes plain zeros (float16 fields hold bits)
                adj.append(_zero_scalar(p) if p.inner_shape or not self.direct else 0)
        for shape, (ptr, strides) in zip(self.out_shapes, out_grads):
            adj.append(_descriptor(ptr, shape, strides))
        if self.direct:
            adj_args = self.Args(*adj)
            self.hooks.backward(self._bounds_ref, ctypes.byref(args), ctypes.byref(adj_args))
        else:
            values = self._launch_values(args)
            n = len(self.sig.inputs)
            wp.launch(
                self.sig.kernel,
                dim=self.launch_dims,
                inputs=values[:n],
                outputs=values[n:],
                adj_inputs=adj[:n],
                adj_outputs=adj[n:],
                adjoint=True,
                device=self.device,
                stream=stream,
            )

    def _launch_values(self, args: Any) -> list:
        """The struct's fields as ``wp.launch`` takes them (array descriptors verbatim)."""
        values = []
        for p in self.sig.params:
            v = getattr(args, p.name)
            if p.dtype_name in _HALF_BITS and not p.is_array and not p.inner_shape:
                v = p.wp_type(_HALF_BITS[p.dtype_name][1](v))  # the field holds raw bits
            values.append(v)
        return values


def _make_filler(sig: Signature):
    """A function that writes the per-call values into an argument struct, one statement
    per field: generated once per signature (as ``collections.namedtuple`` does) because a
    generic loop costs more than the kernel launch itself on small inputs."""
    lines, arr, sc = [], 0, 0
    for p in sig.inputs:
        if p.is_array:
            lines.append(f"    a.{p.name}.data = ins[{arr}]")
            arr += 1
        else:
            lines.append(f"    a.{p.name} = scalars[{sc}]")
            sc += 1
    lines += [f"    a.{p.name}.data = outs[{j}]" for j, p in enumerate(sig.outputs)]
    namespace: dict[str, Any] = {}
    exec("def fill(a, ins, scalars, outs):\n" + "\n".join(lines), namespace)  # noqa: S102 - names are identifiers
    return namespace["fill"]


def _zero_scalar(p: Param) -> Any:
    if p.inner_shape:
        return p.wp_type()
    return p.wp_type(False) if p.dtype_name == "bool" else p.wp_type(0)


def check_strides(op: str, p: Param, shape: Sequence[int], strides: Sequence[int]) -> None:
    """Warp descriptors hold int32 shapes and byte strides."""
    if any(s > _INT32_MAX for s in shape) or any(abs(s) > _INT32_MAX for s in strides):
        raise fail(op, f"argument '{p.name}' is too large for Warp's 32-bit shapes/strides: shape {tuple(shape)}")


# -- launch functions (the jax_callable convention), differentiated with a per-call wp.Tape --


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
    plan: Plan,
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
    plan: Plan,
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
    with LOAD_LOCK:
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


def _function_args(plan, ins, scalars, outs, in_grads, out_grads):
    sig, dev = plan.sig, plan.device
    args = []
    k = 0
    vals = iter(scalars)
    for p in sig.inputs:
        if not p.is_array:
            args.append(next(vals))
            continue
        shape, strides = plan.in_layouts[k]
        grad = None
        if in_grads is not None and in_grads[k]:
            grad = _wrap(p, dev, in_grads[k], shape, plan.in_grad_strides[k])
        args.append(_wrap(p, dev, ins[k], shape, strides, grad))
        k += 1
    for j, p in enumerate(sig.outputs):
        grad = None
        if out_grads is not None:
            gptr, gstrides = out_grads[j]
            grad = _wrap(p, dev, gptr, plan.out_shapes[j], gstrides)
        args.append(_wrap(p, dev, outs[j], plan.out_shapes[j], plan.out_strides[j], grad))
    return args


class Prepared(NamedTuple):
    """A validated call: the plan, packed scalars, the arrays (made inner-contiguous where
    needed) and the framework's device. Adapters pass ``arrays`` on; nothing here keeps them."""

    plan: Plan
    scalars: tuple
    arrays: list
    device: Any


def prepare(op: Any, args: Sequence[Any], launch_dims: Any, output_dims: Any, fw: Any) -> Prepared:
    """Validate ``args`` for ``op`` through a framework description ``fw``.

    ``fw`` provides: ``name``; ``is_array(a)``; ``meta(a) -> (dtype name or None, shape,
    element strides, itemsize, device)``; ``contiguous(a)``; ``warp_device(device)``.
    """
    op.check_arity(args)
    sig = op.sig
    arrays, layouts, scalars = [], [], []
    device = None
    k = 0
    for p, a in zip(sig.inputs, args):
        if not p.is_array:
            packed = op._packers[k](a)
            scalars.append(a if sig.kind == "function" else packed)
            k += 1
            continue
        if not fw.is_array(a):
            raise fail(
                op.name, f"argument '{p.name}' must be a {fw.array_name} ({p.describe_type()}), got {describe_value(a)}"
            )
        dtype_name, shape, strides, itemsize, dev = fw.meta(a)
        if device is None:
            device = dev
        elif dev != device:
            raise fail(op.name, f"all arrays must be on one device: argument '{p.name}' is on {dev}, expected {device}")
        if dtype_name is None:
            raise fail(
                op.name, f"argument '{p.name}' has dtype {a.dtype}, which Warp cannot use; expected {p.dtype_name}"
            )
        if p.inner_shape and len(shape) == p.tensor_ndim and not inner_contiguous(p, shape, strides):
            a = fw.contiguous(a)  # Warp needs packed vector/matrix elements; outer dims may stride
            dtype_name, shape, strides, itemsize, dev = fw.meta(a)
        wshape, wstrides = check_array(op.name, p, ArrayArg(0, dtype_name, shape, tuple(s * itemsize for s in strides)))
        check_strides(op.name, p, wshape, wstrides)
        arrays.append(a)
        layouts.append((wshape, wstrides))
    if device is None:
        device = fw.default_device
    ld, od = op.dims(launch_dims, output_dims, input_values(sig, args, [s for s, _ in layouts]))
    plan = op.plan(fw.warp_device(device), tuple(layouts), ld, od)
    return Prepared(plan, tuple(scalars), arrays, device)


def needs_outputs(op: Any) -> bool:
    """Whether the backward reads the forward's outputs (a framework saves them for it)."""
    return op.custom_backward is not None or (op.sig.kind == "kernel" and bool(op.sig.reads_outputs))


def backward(
    op: Any,
    plan: Plan,
    scalars: Sequence[Any],
    arrays: Sequence[Any],
    grads: Sequence[Any],
    needs: Sequence[bool],
    fw: Any,
    device: Any,
    stream: Any,
    targets: Sequence[Any] | None = None,
    outputs: Sequence[Any] | None = None,
    fresh_targets: bool = False,
) -> list:
    """The framework-neutral backward: input gradients (None where not needed or where a
    ``targets`` array received them in place) from the output gradients ``grads``.

    Input gradients are fresh zeroed arrays from the framework (rule 3). Output gradients are
    only read, unless the adjoint could add into them (the kernel reads that output), in which
    case it gets a private copy (rule 2). ``targets`` receive Warp's adjoint by addition
    (a GradBuffer view); ``fresh_targets`` says they are zeroed buffers nothing else holds (a
    JAX callback's outputs), which a custom backward may fill too. ``outputs``: the forward's outputs, where the
    framework saved them; otherwise they are recomputed when the backward needs them. ``fw``
    adds to the ``prepare`` description: ``zeros(shape, dtype name, device)``,
    ``private_copy(a)`` and ``ptr(a)``.
    """
    sig = op.sig
    op.check_gradient()  # rule 7, before anything is launched
    if op.custom_backward is not None:
        fill = targets if fresh_targets else None  # a custom backward may assign: never into a .grad
        return _custom_backward(op, plan, scalars, arrays, grads, needs, fw, device, stream, outputs, fill)
    direct = [None] * len(arrays) if targets is None else targets
    in_grads: list = []
    for p, a, need, v in zip(sig.array_inputs, arrays, needs, direct):
        if not (need and p.differentiable) or v is not None:
            in_grads.append(None)
        else:
            dtype_name, shape, *_ = fw.meta(a)
            in_grads.append(fw.zeros(shape, dtype_name, device))
    if all(g is None for g in in_grads) and all(v is None for v in direct):
        return in_grads
    out_grads, keep, out_ptrs = [], [], []
    ins = [fw.ptr(a) for a in arrays]
    # The adjoint re-reads outputs only if the kernel does; it must see what the forward left
    # there. It gets a private copy (the framework's saved outputs, or a replay of the
    # forward); outputs it never reads need no memory at all.
    values = None
    if sig.kind == "function":  # scratch outputs: the tape re-runs the function into them
        values = [fw.zeros(s + p.inner_shape, p.dtype_name, device) for p, s in zip(sig.outputs, plan.out_shapes)]
    elif sig.reads_outputs:
        if outputs is not None:
            values = [fw.private_copy(o) for o in outputs]
        else:
            values = _replay(plan, ins, scalars, fw, device, stream)
    keep.extend(values or ())
    for j, (p, shape, g) in enumerate(zip(sig.outputs, plan.out_shapes, grads)):
        g, layout = _output_grad(fw, p, shape, g, device, private=p.name in sig.tracked_outputs)
        keep.append(g)
        out_grads.append(layout)
        out_ptrs.append(fw.ptr(values[j]) if values is not None and p.name in sig.reads_outputs else 0)
    gptrs = [
        fw.ptr(g) if g is not None else (fw.ptr(v) if v is not None and p.differentiable else 0)
        for g, v, p in zip(in_grads, direct, sig.array_inputs)
    ]
    if sig.kind == "kernel":
        plan.adjoint(ins, scalars, out_ptrs, gptrs, out_grads, stream)
    else:
        run_function_adjoint(op, plan, ins, scalars, out_ptrs, gptrs, out_grads, stream)
    del keep
    return in_grads


def _output_grad(fw: Any, p: Param, shape: tuple, g: Any, device: Any, private: bool) -> tuple[Any, tuple]:
    """An output's incoming gradient as the adjoint takes it: zeros where none came, a private
    copy where asked (or where its vector/matrix elements are not packed), and its
    (pointer, Warp byte strides)."""
    if g is None:
        g = fw.zeros(shape + p.inner_shape, p.dtype_name, device)
    else:
        _, gshape, gstrides, _, _ = fw.meta(g)
        if private or not inner_contiguous(p, gshape, gstrides):
            g = fw.private_copy(g)
    _, _, gstrides, itemsize, _ = fw.meta(g)
    return g, (fw.ptr(g), tuple(s * itemsize for s in gstrides[: p.ndim]))


def _replay(plan: Plan, ins: Sequence[int], scalars: Sequence[Any], fw: Any, device: Any, stream: Any) -> list:
    """The forward's outputs, recomputed into fresh zeroed arrays."""
    outs = [fw.zeros(s + p.inner_shape, p.dtype_name, device) for p, s in zip(plan.sig.outputs, plan.out_shapes)]
    plan.run(ins, scalars, [fw.ptr(o) for o in outs], stream)
    return outs


def _custom_backward(
    op: Any,
    plan: Plan,
    scalars: Sequence[Any],
    arrays: Sequence[Any],
    grads: Sequence[Any],
    needs: Sequence[bool],
    fw: Any,
    device: Any,
    stream: Any,
    outputs: Sequence[Any] | None,
    targets: Sequence[Any] | None = None,
) -> list:
    """Launch the op's own backward: it reads inputs, outputs and output gradients (its
    signature forbids writing them) and fills one zeroed gradient per floating array input
    (the ``targets`` array where one is given, zeroed by the caller: then None is returned)."""
    sig, cb = op.sig, op.custom_backward
    wanted = [need and p.differentiable for p, need in zip(sig.array_inputs, needs)]
    if not any(wanted):
        return [None] * len(arrays)
    keep: list = []
    ins = [fw.ptr(a) for a in arrays]
    if outputs is None:
        outputs = _replay(plan, ins, scalars, fw, device, stream)
    outputs = list(outputs)
    keep.extend(outputs)
    g_ptrs, g_layouts = [], []
    for p, shape, g in zip(sig.outputs, plan.out_shapes, grads):
        if not p.carries_grad:
            continue
        g, (ptr, strides) = _output_grad(fw, p, shape, g, device, private=False)
        keep.append(g)
        g_ptrs.append(ptr)
        g_layouts.append((shape, strides))
    in_grads = []
    given = list(targets) if targets is not None else [None] * len(arrays)
    for p, a, t in zip(sig.array_inputs, arrays, given):
        if p.differentiable:
            dtype_name, shape, *_ = fw.meta(a)
            in_grads.append(t if t is not None else fw.zeros(shape, dtype_name, device))
    bplan = cb.plan(plan, g_layouts)
    b_ins = ins + [fw.ptr(o) for o in outputs] + g_ptrs
    b_outs = [fw.ptr(g) for g in in_grads]
    if cb.sig.kind == "kernel":
        bplan.forward(b_ins, scalars, b_outs, stream)
    else:
        if sig.kind == "kernel":  # kernels take packed scalars; functions the Python values
            scalars = [
                _HALF_BITS[p.dtype_name][1](v) if p.dtype_name in _HALF_BITS and not p.inner_shape else v
                for p, v in zip((q for q in sig.inputs if not q.is_array), scalars)
            ]
        needs_kw = {"needs_input_grad": tuple(w for p, w in zip(sig.array_inputs, wanted) if p.differentiable)}
        run_function(bplan, b_ins, scalars, b_outs, stream, needs_kw if cb.takes_needs else None)
    del keep
    grads_iter = iter(in_grads)
    result = [next(grads_iter) if p.differentiable else None for p in sig.array_inputs]
    return [None if t is not None else g for g, t in zip(result, given)]
