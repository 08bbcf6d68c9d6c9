"""Everything warpbridge takes from Warp beyond its public API, in one place.

warpbridge relies on these Warp internals (checked by :func:`check_internals`, which
``tests/test_warp_runtime.py`` runs, so a Warp upgrade that changes one fails loudly):

- ``warp._src.context.runtime``: whether Warp is initialised, and its per-process active tape
  (per thread while one of warpbridge's own tapes records, see :class:`OwnTape`);
- ``wp.launch(..., record_cmd=True)``: a recorded launch's ``params``, ``hooks`` and
  ``module_exec``, and ``warp._src.types.array_t``, the ctypes array descriptor, to call a
  compiled CPU kernel directly (:func:`record`, :data:`ARRAY_DESCRIPTOR`);
- ``warp._src.codegen.Adjoint``: its loop visitors and ``materialize_redefinitions``, where the
  code generator finds a variable mutated in a dynamic loop, and ``add_call`` with
  ``return_resolved``, each builtin call's resolved overload (:func:`recording_codegen`), and
  ``warp._src.context.ModuleBuilder`` to generate a kernel's code without compiling it
  (:func:`build_code`); ``warp._src.types.strip_reference``, ``is_tile`` and ``float_types``
  (:func:`is_floating`);
- ``wp.Tape.record_launch`` / ``record_func`` and the layout of ``tape.launches`` entries
  (:class:`KeepingTape`, :func:`tape_contents`), and the error a ``wp.Tape`` entered under
  another raises (:func:`is_nested_tape_error`);
- ``warp._src.context.Function``, ``warp._src.codegen.Struct`` / ``StructInstance`` and ``warp._src.types.int_types``
  (:func:`is_user_function`, :func:`is_struct`, :data:`INT_TYPES`);
- ``warp._src.context._ResolvedBlockDim``, a block dimension ``wp.launch`` does not resolve
  again (:func:`exact_block_dim`), and ``warp._src.context.pack_arg`` with ``Module.load`` for
  a CPU launch in blocks, which a recorded launch cannot hold (:func:`record`); a kernel's
  ``overloads`` dict with its module's ``mark_modified`` (:func:`drop_overload`).

Supported: warp-lang ``SUPPORTED_WARP``. Nothing here changes what a user's own ``wp.Tape``,
launch or thread sees: the one hook on Warp's runtime (:class:`OwnTape`) is installed only while
one of warpbridge's own tapes records, and only that tape is per thread.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import inspect
import sys
import threading
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import warp as wp

SUPPORTED_WARP = ("1.19",)
_array_t = wp._src.types.array_t
ARRAY_DESCRIPTOR = _array_t  # the ctypes struct of an array argument: (data, grad, ndim, shape, strides)
INT_TYPES = wp._src.types.int_types


def is_user_function(obj: Any) -> bool:
    """A ``@wp.func`` written in Python (not a builtin)."""
    return isinstance(obj, wp._src.context.Function) and not obj.is_builtin() and obj.func is not None


def builtin_functions() -> dict:
    """Warp's builtin functions by name (each with its overloads)."""
    return wp._src.context.builtin_functions


def warp_builtin(name: str) -> Any:
    """Warp's builtin ``wp.<name>`` as kernels resolve it (many are not attributes of the
    ``warp`` module), or None."""
    return wp._src.context.builtin_functions.get(name)


def builtin_name(obj: Any) -> str | None:
    """The name of a Warp builtin function (``wp.tile_load`` -> ``"tile_load"``), else None."""
    if isinstance(obj, wp._src.context.Function) and obj.is_builtin():
        return obj.key
    return None


def is_struct(dtype: Any) -> bool:
    """A ``wp.struct`` type."""
    return isinstance(dtype, wp._src.codegen.Struct)


def _is_struct_value(value: Any) -> bool:
    """A ``wp.struct`` instance."""
    return isinstance(value, wp._src.codegen.StructInstance)


_INIT_LOCK = threading.Lock()
# Held while warpbridge builds or loads a Warp module (a plan's first launch, a launch
# function's first run, the point kernels' first use): Warp's module build and load are not
# safe to enter from several threads at once. Warm calls never take it.
LOAD_LOCK = threading.RLock()


def ensure_init() -> None:
    """Initialise Warp once (wp.from_paddle and friends fail before wp.init())."""
    if not wp._src.context.runtime:
        with _INIT_LOCK:
            if not wp._src.context.runtime:
                # warpbridge's own init skips Warp's greeting; warnings still show.
                level = wp.config.log_level
                wp.config.log_level = max(level, wp.LOG_WARNING)
                try:
                    wp.init()
                finally:
                    wp.config.log_level = level


def on_stream(stream: Any) -> Any:
    """A scope in which Warp's launches, allocations and copies go on ``stream`` (a ``wp.Stream``;
    None: the device's current one, unchanged).

    ``stream`` first waits for the work already queued on Warp's current stream, except while
    it captures a CUDA graph: a wait on work outside the capture invalidates it (CUDA error
    905), and inside a capture the graph itself orders the launches.
    """
    if stream is None:
        return contextlib.nullcontext()
    return wp.ScopedStream(stream, sync_enter=not stream.is_capturing)


class OwnTape(wp.Tape):
    """A ``wp.Tape`` of warpbridge's own (a launch function's forward, a probe run).

    Warp keeps one active tape per process (``runtime.tape``). Were warpbridge's tapes that
    one, every ``wp.launch`` from another thread (another op's forward, a data loader) would
    be recorded into a launch function's tape and replayed by its backward, and a second
    thread's tape would be refused as nested (1 fresh process in 2 failed
    ``tests/test_threads_cold.py``). So while an ``OwnTape`` records, Warp's runtime reads its
    active tape through a property that gives each thread with an ``OwnTape`` that tape, and
    every other thread the process-wide one, as plain Warp does. The property is installed
    when the first ``OwnTape`` starts recording and removed when the last one stops: a user's
    own tapes, launches and threads see Warp unchanged.
    """

    def __enter__(self) -> OwnTape:
        ensure_init()
        _hook_tapes(+1)
        try:
            return super().__enter__()
        except BaseException:
            _hook_tapes(-1)
            raise

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            _hook_tapes(-1)


_OWN = threading.local()  # .tape: this thread's recording OwnTape
_HOOK = {"users": 0, "classes": {}}  # OwnTapes recording; runtime class -> its hooked subclass
_HOOK_LOCK = threading.Lock()


def _active_tape(runtime: Any) -> Any:
    own = getattr(_OWN, "tape", None)
    return own if own is not None else runtime.__dict__.get("tape")


def _set_active_tape(runtime: Any, tape: Any) -> None:
    # the process-wide tape stays in the instance's dict, so removing the hook loses nothing
    if isinstance(tape, OwnTape) or (tape is None and getattr(_OWN, "tape", None) is not None):
        _OWN.tape = tape
    else:
        runtime.__dict__["tape"] = tape


def _hook_tapes(change: int) -> None:
    """Count one more (+1) or one fewer (-1) recording OwnTape; the first installs the
    per-thread property on Warp's runtime, the last removes it."""
    runtime = wp._src.context.runtime
    with _HOOK_LOCK:
        users = _HOOK["users"] = _HOOK["users"] + change
        hooked = getattr(type(runtime), "_warpbridge_hook", False)
        if users > 0 and not hooked:
            cls = type(runtime)
            sub = _HOOK["classes"].get(cls)
            if sub is None:
                attrs = {"_warpbridge_hook": True, "tape": property(_active_tape, _set_active_tape)}
                sub = _HOOK["classes"][cls] = type(cls.__name__, (cls,), attrs)
            runtime.__dict__.setdefault("tape", None)
            runtime.__class__ = sub
        elif users == 0 and hooked:
            runtime.__class__ = type(runtime).__bases__[0]


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


def exact_block_dim(block_dim: int | None) -> Any:
    """``block_dim`` as ``wp.launch`` takes it without resolving it again: honoured on the CPU
    too (Warp runs a block's threads as cooperative fibers there), whatever
    ``wp.config.enable_cpu_blocks`` says. None stays None (Warp's default per device)."""
    return None if block_dim is None else wp._src.context._ResolvedBlockDim(block_dim)


def default_block_dim(device: Any) -> int:
    """Warp's threads per block on ``device`` when a launch names none."""
    return 1 if device.is_cpu else 256


def drop_overload(kernel: Any, overload: Any) -> None:
    """Remove an overload ``kernel.add_overload`` made whose code does not generate: left in
    place, it fails every later load of its module, the other kernels' too."""
    kernel.overloads.pop(overload.sig, None)
    kernel.module.mark_modified()


def record(
    kernel: Any, dim: Any, inputs: Sequence[Any], device: Any, direct_cpu: bool = True, block_dim: int | None = None
) -> Recorded:
    """Record one launch of ``kernel`` (which resolves the bounds, validates the dims and loads,
    compiling if needed, the module) and return what a direct call needs."""
    if device.is_cpu and (block_dim or 1) > 1:
        return _record_cpu_blocks(kernel, inputs, device, block_dim)
    rec = wp.launch(kernel, dim=dim, inputs=list(inputs), device=device, record_cmd=True, block_dim=block_dim)
    Args = _args_type(kernel, rec.params[1:])
    direct = direct_cpu and device.is_cpu and rec.block_dim == 1
    return Recorded(Args, Args(*rec.params[1:]), rec.params[0], rec.hooks, rec.module_exec, direct)


def _record_cpu_blocks(kernel: Any, inputs: Sequence[Any], device: Any, block_dim: int) -> Recorded:
    """What a CPU launch in blocks of ``block_dim`` threads needs: a recorded launch resolves
    its block dim again and, without ``wp.config.enable_cpu_blocks``, records one thread per
    block. Such a launch goes through ``wp.launch``, never directly."""
    module_exec = kernel.module.load(device, block_dim)
    pack = wp._src.context.pack_arg
    params = [pack(kernel, a.type, a.label, v, device) for a, v in zip(kernel.adj.args, inputs)]
    Args = _args_type(kernel, params)
    return Recorded(Args, Args(*params), None, module_exec.get_kernel_hooks(kernel), module_exec, False)


def _args_type(kernel: Any, params: Sequence[Any]) -> Any:
    types = tuple(type(v) for v in params)
    Args = _ARGS_TYPES.get((kernel, types))
    if Args is None:
        fields = [(a.label, t) for a, t in zip(kernel.adj.args, types)]
        Args = _ARGS_TYPES.setdefault((kernel, types), type("Args", (ctypes.Structure,), {"_fields_": fields}))
    return Args


# -- dynamic loops, as Warp's code generator sees them ----------------------------------------

_RECORD = threading.local()


def _patched_visitors(Adjoint: Any):
    loop_stack: list = []

    def wrap_loop(emit):
        def visit(adj, node):
            loop_stack.append(node)
            try:
                return emit(adj, node)
            finally:
                loop_stack.pop()

        return visit

    original = Adjoint.materialize_redefinitions

    def materialize(adj, symbols):
        found = getattr(_RECORD, "found", None)
        if found is not None and not adj.custom_reverse_mode and loop_stack:
            loop = loop_stack[-1]
            for sym, var1 in symbols.items():
                var2 = adj.symbols.get(sym)
                if var2 is None or var1 == var2:
                    continue
                if adj.is_constant_iter_symbol(sym) and var1.constant is not None:
                    continue
                found.append((adj, loop, sym, var1.type))
        return original(adj, symbols)

    return wrap_loop, materialize, original


class BuiltinCall(NamedTuple):
    """A call of a Warp builtin as the code generator resolved it."""

    adj: Any  # the kernel's or @wp.func's Adjoint it is in
    line: int  # its statement's line, 0-based in adj.source_lines
    builtin: str
    differentiable: bool  # Warp's flag for the resolved overload
    params: tuple[str, ...]  # the overload's parameters, in order
    floating: tuple[str, ...]  # the parameters whose argument is a floating value or tile
    floating_result: bool


class Findings(NamedTuple):
    """What generating a kernel's code found: variables mutated in dynamic loops ``(adj, loop,
    symbol, type)`` and every builtin call."""

    loops: list
    calls: list[BuiltinCall]


def is_floating(t: Any) -> bool:
    """Whether a value of Warp type ``t`` (a scalar, vector, matrix, quaternion, transform or
    tile) has floating elements."""
    if t is None:
        return False
    t = wp._src.types.strip_reference(t)
    if wp._src.types.is_tile(t):
        t = t.dtype
    return getattr(t, "_wp_scalar_type_", t) in wp._src.types.float_types


def _recorded_call(original: Any):
    def add_call(adj, func, args, kwargs, type_args, min_outputs=None, return_value_used=True,
                 arg_nodes=None, kwarg_nodes=None, return_resolved=False):  # fmt: skip
        output, resolved, bound = original(
            adj, func, args, kwargs, type_args, min_outputs=min_outputs, return_value_used=return_value_used,
            arg_nodes=arg_nodes, kwarg_nodes=kwarg_nodes, return_resolved=True,
        )  # fmt: skip
        calls = getattr(_RECORD, "calls", None)
        if calls is not None and resolved.is_builtin():
            types = {k: getattr(v, "type", None) for k, v in bound.items()}
            outs = [o for o in (output if isinstance(output, (tuple, list)) else (output,)) if o is not None]
            # a builtin that returns nothing and takes a floating tile works on it in place
            result = any(is_floating(getattr(o, "type", None)) for o in outs) or (
                not outs and any(is_floating(t) and wp._src.types.is_tile(wp._src.types.strip_reference(t))
                                 for t in types.values() if t is not None)
            )  # fmt: skip
            floating = tuple(k for k, t in types.items() if t is not None and is_floating(t))
            calls.append(
                BuiltinCall(
                    adj, adj.lineno, resolved.key, bool(resolved.is_differentiable), tuple(types), floating, result
                )
            )
        return (output, resolved, bound) if return_resolved else output

    return add_call


@contextlib.contextmanager
def recording_codegen():
    """Record Warp's "mutated variable in a dynamic loop" findings and every builtin call while
    code is generated (under Warp's code-generation lock, the hooks removed on the way out)."""
    codegen = wp._src.codegen
    Adjoint = codegen.Adjoint
    with codegen._codegen_lock:
        wrap_loop, materialize, original = _patched_visitors(Adjoint)
        visitors = Adjoint.node_visitors
        saved = {t: visitors[t] for t in (ast.For, ast.While)}
        original_call = Adjoint.add_call
        for t, emit in saved.items():
            visitors[t] = wrap_loop(emit)
        Adjoint.materialize_redefinitions = materialize
        Adjoint.add_call = _recorded_call(original_call)
        _RECORD.found, _RECORD.calls = [], []
        try:
            yield Findings(_RECORD.found, _RECORD.calls)
        finally:
            _RECORD.found = _RECORD.calls = None
            Adjoint.materialize_redefinitions = original
            Adjoint.add_call = original_call
            visitors.update(saved)


def build_code(kernel: Any, options: dict) -> Findings:
    """Generate (never compile) ``kernel``'s code and the functions it calls; what it found."""
    context = wp._src.context
    with LOAD_LOCK, recording_codegen() as found:
        builder = context.ModuleBuilder(context.Module("warpbridge_adjoint_check", None), options)
        builder.build_kernel(kernel)
        for f in builder.deferred_functions:
            builder.build_function(f)
        return Findings(list(found.loops), list(found.calls))


def codegen_error(kernel: Any) -> str | None:
    """Warp's error generating ``kernel``'s code (nothing compiled), or None if it generates."""
    module = kernel.module
    options = module.resolve_options(wp.config, block_dim=module.options.get("block_dim"))
    try:
        build_code(kernel, options | {"output_arch": None, "enable_backward": True})
    except Exception as e:  # Warp's parse and type errors: their message is the user's answer
        return str(e)
    return None


class RecordedLaunch(NamedTuple):
    """One kernel launch a ``wp.Tape`` recorded: the kernel, its arguments by name, and the
    arrays among them (a struct's array fields under the struct parameter's label)."""

    kernel: Any
    args: list  # (parameter label, argument), inputs then outputs
    arrays: list  # (parameter label, array)
    site: str = ""  # file:line of the launch function's statement that led to it


def check_internals() -> list[str]:
    """The Warp internals listed above that this Warp lacks (empty: all present)."""
    missing = []
    checks = {
        "warp._src.context.runtime": lambda: hasattr(wp._src.context, "runtime"),
        "warp._src.types.array_t": lambda: hasattr(wp._src.types, "array_t"),
        "warp._src.types.int_types": lambda: hasattr(wp._src.types, "int_types"),
        "warp._src.context.Function": lambda: isinstance(wp._src.context.Function, type),
        "warp._src.context.ModuleBuilder": lambda: hasattr(wp._src.context, "ModuleBuilder"),
        "warp._src.codegen.Struct": lambda: isinstance(wp._src.codegen.Struct, type),
        "warp._src.codegen.StructInstance": lambda: isinstance(wp._src.codegen.StructInstance, type),
        "warp._src.codegen.Adjoint.node_visitors": lambda: ast.For in wp._src.codegen.Adjoint.node_visitors,
        "warp._src.codegen.Adjoint.materialize_redefinitions": lambda: callable(
            wp._src.codegen.Adjoint.materialize_redefinitions
        ),
        "warp._src.codegen._codegen_lock": lambda: hasattr(wp._src.codegen, "_codegen_lock"),
        "warp._src.codegen.Adjoint.add_call(return_resolved=)": lambda: (
            "return_resolved" in inspect.signature(wp._src.codegen.Adjoint.add_call).parameters
        ),
        "warp._src.types.strip_reference, is_tile, float_types": lambda: all(
            hasattr(wp._src.types, n) for n in ("strip_reference", "is_tile", "float_types")
        ),
        "warp._src.context._ResolvedBlockDim": lambda: issubclass(wp._src.context._ResolvedBlockDim, int),
        "wp.Kernel.overloads, Module.mark_modified": lambda: callable(wp._src.context.Module.mark_modified),
        "warp._src.context.pack_arg": lambda: callable(wp._src.context.pack_arg),
        "wp.Tape.record_launch": lambda: callable(wp.Tape.record_launch),
        "wp.Tape.record_func": lambda: callable(wp.Tape.record_func),
    }
    for name, present in checks.items():
        try:
            ok = present()
        except AttributeError:
            ok = False
        if not ok:
            missing.append(name)
    return missing


_WARP_DIR = str(Path(wp.__file__).parent)
_WARP_CODE: dict = {}  # code object -> whether it is Warp's


def _in_warp(code: Any) -> bool:
    found = _WARP_CODE.get(code)
    if found is None:
        if len(_WARP_CODE) > 4096:  # code made at run time (exec) must not pile up
            _WARP_CODE.clear()
        found = _WARP_CODE[code] = code.co_filename.startswith(_WARP_DIR)
    return found


class KeepingTape(OwnTape):
    """A ``wp.Tape`` that keeps alive the frames that launched what it recorded.

    The tape's launches refer to objects the function made (a ``wp.HashGrid``, a ``wp.Mesh``,
    scratch arrays) only through ids and pointers; they must outlive ``tape.backward()``, which
    runs after the function has returned. A frame kept past its return keeps its locals.
    Frames from the launch up to (not including) ``stop`` are kept: helpers' too.
    """

    def __init__(self, stop: Any):
        super().__init__()
        self.frames: list = []
        self.kept: list[dict] = []  # the frames' locals, once settled
        self._seen: set[int] = set()
        self._stop = stop
        self.sites: dict[int, str] = {}  # launch index -> file:line in the function that led to it

    def record_launch(self, *args: Any, **kwargs: Any) -> None:
        self._keep_frames()
        self.sites[len(self.launches)] = self._site()
        super().record_launch(*args, **kwargs)

    def record_func(self, *args: Any, **kwargs: Any) -> None:
        self._keep_frames()
        super().record_func(*args, **kwargs)

    def _site(self) -> str:
        """file:line of the statement in the function itself that led to this launch."""
        frame, site = sys._getframe(2), None
        while frame is not None and frame is not self._stop:
            site, frame = frame, frame.f_back
        return f"{site.f_code.co_filename}:{site.f_lineno}" if site is not None else "<unknown>"

    def _keep_frames(self) -> None:
        frame = sys._getframe(2)
        while frame is not None and frame is not self._stop:
            if _in_warp(frame.f_code):  # Warp's own frames hold no object of the function's
                frame = frame.f_back
                continue
            if id(frame) in self._seen:  # kept, and every frame above it
                return
            self._seen.add(id(frame))  # the frame is kept: its id is not reused
            self.frames.append(frame)
            frame = frame.f_back

    def settle(self) -> None:
        """Once the function has returned: keep its frames' locals, not the frames, which refer
        to their callers' frames (and through them to whoever holds this tape)."""
        for f in self.frames:
            self.kept.append({k: v for k, v in f.f_locals.items() if not isinstance(v, types.FrameType)})
        self.frames.clear()
        self._stop = None

    def kept_objects(self) -> list:
        """The objects the kept frames' locals hold."""
        return [v for f in self.frames for v in f.f_locals.values()] + [v for d in self.kept for v in d.values()]


_NESTED_TAPE = "entering a tape while one is already active"


def is_nested_tape_error(error: BaseException) -> bool:
    """Whether ``error`` is Warp refusing a ``wp.Tape`` entered while another is active: a
    launch function that opens its own, run under the tape warpbridge records it with."""
    return isinstance(error, RuntimeError) and _NESTED_TAPE in str(error)


class TapeContents(NamedTuple):
    """What a launch function's tape recorded, read once before its first backward."""

    launches: list  # RecordedLaunch, in order
    arrays: list  # every array, once: the launches' (struct fields included) and the recorded copies'
    fields: list  # (struct, field name, array) for the array fields of the structs the launches took


def tape_contents(tape: Any) -> TapeContents:
    """Read ``tape``'s kernel launches (recorded functions left out), their arrays and struct
    fields, and the arrays of the copies ``wp.copy`` recorded (kept in ``tape.gradients``)."""
    launches: list = []
    fields: list = []
    sites = getattr(tape, "sites", {})
    for index, entry in enumerate(tape.launches):
        if isinstance(entry, (list, tuple)) and entry and isinstance(entry[0], wp.Kernel):
            labels = (a.label for a in entry[0].adj.args)
            args = list(zip(labels, list(entry[3]) + list(entry[4])))
            launches.append(RecordedLaunch(entry[0], args, _launch_arrays(args, fields), sites.get(index, "")))
    found = {id(a): a for launch in launches for _, a in launch.arrays}
    for a in tape.gradients:
        if isinstance(a, wp.array):
            found.setdefault(id(a), a)
    return TapeContents(launches, list(found.values()), fields)


def drop_launches_without_adjoint(tape: Any) -> None:
    """Take the launches of kernels compiled with ``enable_backward=False`` off ``tape``: its
    backward would skip them anyway, warning each time (call once they are known to write
    nothing a gradient passes through)."""
    tape.launches = [
        entry
        for entry in tape.launches
        if not (isinstance(entry, (list, tuple)) and entry and isinstance(entry[0], wp.Kernel))
        or entry[0].options.get("enable_backward", entry[0].module.options.get("enable_backward", True))
    ]


def _launch_arrays(args: list, fields: list) -> list:
    """(label, array) for each array among ``args``, a struct's array fields under the struct
    parameter's label; the structs' (struct, field name, array) are added to ``fields``."""
    found = []
    for label, a in args:
        if isinstance(a, wp.array):
            found.append((label, a))
        elif _is_struct_value(a):
            held: list = []
            _add_struct_fields(a, held)
            fields.extend(held)
            found.extend((label, f) for _, _, f in held)
    return found


def _add_struct_fields(value: Any, found: list) -> None:
    for name in value._cls.vars:
        field = getattr(value, name, None)
        if isinstance(field, wp.array):
            found.append((value, name, field))
        elif _is_struct_value(field):
            _add_struct_fields(field, found)


def struct_arrays(value: Any) -> list:
    """(field path, array) for each array a ``wp.struct`` instance holds, nested structs too."""
    found: list = []
    _add_struct_fields(value, found)
    return [(_field_path(value, struct, name), a) for struct, name, a in found]


def _field_path(top: Any, struct: Any, name: str) -> str:
    if struct is top:
        return name
    for field in top._cls.vars:
        inner = getattr(top, field, None)
        if _is_struct_value(inner):
            found = _field_path(inner, struct, name)
            if found:
                return f"{field}.{found}"
    return ""


def refresh_struct_fields(fields: list) -> None:
    """Set each struct's array fields again: a struct copies an array's gradient pointer when
    the array is set, and the adjoint reads that copy."""
    for struct, name, a in fields:
        setattr(struct, name, a)


def recorded_kernels(launches: list[RecordedLaunch]) -> list:
    """The kernels of recorded ``launches``, each once, in launch order."""
    return list(dict.fromkeys(launch.kernel for launch in launches))
