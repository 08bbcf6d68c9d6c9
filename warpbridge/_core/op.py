"""WarpOp: the user-facing callable. It validates nothing framework-specific itself: it
finds the caller's framework from the arguments' types and hands over to that adapter."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import os
import pickle
import re
import sys
import threading
import weakref
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypedDict, overload

import warp as wp

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # a dependency on Python 3.10 only
    from typing_extensions import Unpack

from . import adjoint_check as _adjoint
from . import custom_backward as _backward
from . import dtypes as _dtypes
from . import frameworks as _frameworks
from . import gradients as _gradients
from . import launch_function as _functions
from . import plan as _plan
from . import validate as _validate
from . import warp_runtime
from .errors import WarpBridgeError, fail
from .signature import GENERIC, Signature, bind_generic

# Plans are cheap to rebuild (~50 us) but eager shapes can vary without end (a new batch size
# every step): past this many, a cache starts over rather than grow for the life of the op.
MAX_CACHED = 256
# How torch.vmap (and, for broadcast_all, jax.vmap) batch an op; see warpbridge/_torch/_func.py.
VMAP_METHODS = ("sequential", "expand_dims", "broadcast_all")


class Prepared(NamedTuple):
    """A validated call (``WarpOp.prepare``): the plan, the scalars as the plan takes them, the
    arrays (made inner-contiguous where needed) and the framework's device. Adapters pass
    ``arrays`` on; nothing here keeps them."""

    plan: _plan.Plan
    scalars: tuple
    arrays: list
    device: Any


class WarpOp:
    """A Warp kernel (or launch function) callable with framework arrays. See :func:`op`."""

    def __init__(
        self,
        fn: Any,
        *,
        num_outputs: int = 1,
        launch_dims: Any = None,
        output_dims: Any = None,
        name: str | None = None,
        vmap_method: str = "sequential",
        backward: Any = None,
        trust_adjoint: bool | Sequence[Any] = False,
        aux: Any = (),
        recompute: bool = False,
        outputs: Any = None,
        in_out: Any = (),
        debug: bool = False,
        block_dim: int | None = None,
        tiled: bool | None = None,
        _registered_as: str | None = None,
    ):
        explicit = name is not None
        name = _default_name(fn) if name is None else name
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise WarpBridgeError(f"op(): name must be a Python identifier, got {name!r}")
        if vmap_method not in VMAP_METHODS:
            raise fail(name, f"vmap_method must be one of {', '.join(map(repr, VMAP_METHODS))}, got {vmap_method!r}")
        self.vmap_method = vmap_method
        self.trust_adjoint = _trusted(name, trust_adjoint)
        if not isinstance(recompute, bool):
            raise fail(name, f"recompute must be a bool, got {recompute!r}")
        if not isinstance(debug, bool):
            raise fail(name, f"debug must be a bool, got {debug!r}")
        self.debug = debug or os.environ.get("WARPBRIDGE_DEBUG", "") not in ("", "0")
        self.custom_backward: _backward.CustomBackward | None = None
        self.saves_outputs = self.keeps_tape = False  # set by _set_backward
        if not _DEFERRED_INIT:
            warp_runtime.ensure_init()  # the caller may go on with Warp calls that need the runtime
        self.name = name
        # what a second-order refusal advises instead (the neighbour ops name their recipe)
        self.second_order_advice = (
            "Differentiate once (without create_graph), or take finite differences of the gradient"
        )
        self.sig = Signature(fn, num_outputs, name, aux, outputs=outputs, in_out=in_out)
        # A generic kernel (``Any`` types) is a template: each call runs the instance for its
        # arrays' dtypes (``instance``), made once per binding.
        self.generic = self.sig.kind == "kernel" and bool(getattr(fn, "is_generic", False))
        self._instances: dict[Any, WarpOp] = {}
        self.block_dim, self.tiled = _blocks(name, self.sig, block_dim, tiled)
        self.launch_dims = _validate.normalize_dims(name, "launch_dims", launch_dims)
        self.output_dims = _validate.normalize_output_dims(name, self.sig, output_dims)
        self._plans: dict[Any, _plan.Plan] = {}
        self.states: defaultdict[str, dict] = defaultdict(dict)  # per backend: caches, registrations
        # What every call reads, derived once: the array inputs that take gradients, the
        # outputs that carry them (_set_backward derives the rest)
        self.differentiable_arrays = tuple(k for k, p in enumerate(self.sig.array_inputs) if p.differentiable)
        self.float_outputs = tuple(p.carries_grad for p in self.sig.outputs)
        self._indexed = tuple(p for p in self.sig.inputs if p.indexed)
        self._handles = tuple(p.position for p in self.sig.inputs if not p.is_array and p.dtype_name == "uint64")
        self._lock = threading.Lock()
        self.__doc__ = getattr(fn, "__doc__", None) or f"warpbridge op wrapping {name}."
        self.__wrapped__ = fn
        self._options = self._options_given(num_outputs, explicit, vmap_method, recompute, debug, outputs)
        self._set_backward(None)
        if backward is not None:
            self.backward(backward)
        # The registered torch op's name: the given name, or the wrapped callable's module and
        # qualified name with a hash of its source and options, so that it never depends on
        # import order and an exported program cannot find a different kernel under it.
        self.registration_name = _registered_as or (
            name if explicit else _registration_name(fn, {**self._options, "backward": _source_of(backward)})
        )
        _LIVE.add(self)
        for backend in _frameworks.registry.loaded():
            backend.on_new_op(self)  # e.g. a registration that cannot happen while tracing

    def _options_given(
        self, num_outputs: int, explicit: bool, vmap_method: str, recompute: bool, debug: bool, outputs: Any
    ) -> dict:
        """The options the op was made with, as ``wb.op`` takes them (the defaults left out):
        they name its registration and rebuild it when unpickled."""
        sig = self.sig
        options = dict(
            num_outputs=num_outputs,
            launch_dims=self.launch_dims,
            output_dims=self.output_dims,
            name=self.name if explicit else None,
            vmap_method=vmap_method,
            trust_adjoint=self.trust_adjoint,
        )
        if recompute:
            options["recompute"] = True
        if self.block_dim is not None:
            options["block_dim"] = self.block_dim
        if self.tiled != bool(sig.tile_use):
            options["tiled"] = self.tiled
        if debug:
            options["debug"] = True
        if outputs is not None:
            options["outputs"] = tuple(p.name for p in sig.outputs if not p.in_out)
        if sig.in_out_pairs:
            options["in_out"] = tuple(p.name for p in sig.outputs if p.in_out)
        if sig.visible != tuple(range(len(sig.outputs))):
            options["aux"] = tuple(p.name for p in sig.outputs if p.aux)
        return options

    def _set_backward(self, custom: Any) -> None:
        """Attach ``custom`` (a CustomBackward, or None: Warp's adjoint) and derive what the
        call path reads on every call: whether the backward reads the forward's outputs
        (``saves_outputs``: a framework saves them) and whether a differentiable call keeps its
        forward's tape for the backward (``keeps_tape``: a launch function with Warp's adjoint,
        made without ``recompute=True``)."""
        self.custom_backward = custom
        self.trusted_needs: set = set()  # the needs_input_grad patterns check_gradient passed
        self.saves_outputs = _gradients.needs_outputs(self)
        self.keeps_tape = self.sig.kind == "function" and custom is None and not self._options.get("recompute")

    @property
    def fn(self) -> Any:
        """The wrapped kernel or function."""
        return self.sig.target

    def __getattr__(self, name: str) -> Any:
        # Attributes a backend gives every op: ``op.torch_op``, the registered custom op.
        return _frameworks.registry.op_attribute(self, name)

    def backward(self, fn: Any) -> Any:
        """Give the op its own backward, replacing Warp's generated adjoint; returns ``fn``.

        ``fn`` is a ``wp.Kernel`` (launched with the forward's launch dims) or an annotated
        launch function taking, in order: the op's inputs (scalars included), its outputs as
        the forward left them, ``adj_<name>`` for each floating-point output (the incoming
        gradients, read-only) and ``adj_<name>`` for each floating-point array input (zeroed
        gradient arrays it fills). See ``docs/custom-backward.md``.
        """
        if self.sig.in_out_pairs:
            raise fail(
                self.name,
                "an op with in_out parameters takes Warp's adjoint only (its own backward would have to undo the "
                "update); wrap the kernel without in_out, with its updated state as outputs=, to give it a backward",
            )
        if self.custom_backward is not None:
            raise fail(
                self.name,
                f"already has a backward ({self.custom_backward.name}); an op takes one. Make a new op with "
                "wb.op(kernel, backward=...) to use another",
            )
        for backend in _frameworks.registry.loaded():
            backend.on_backward_attached(self)  # may refuse; drops what captured the old backward
        if self.generic:
            self._instances.clear()  # made with the old backward (none)
            self._set_backward(_backward.GenericBackward(self, fn))
            return fn
        self._set_backward(_backward.CustomBackward(self, fn))
        return fn

    def check_gradient(self, needs: Any = None) -> None:
        """Raise :class:`WarpBridgeError` if this op's gradient cannot be trusted (rule 7).
        ``needs``: per array input, whether its gradient is asked for (default: all)."""
        if self.custom_backward is not None:
            return
        asked = [p for i, p in enumerate(self.sig.array_inputs) if needs is None or needs[i]]
        indexed = [p.name for p in asked if p.indexed and p.differentiable]
        if indexed:
            raise fail(
                self.name,
                f"cannot differentiate with respect to wp.indexedarray input(s) {indexed}: Warp's adjoint of a read "
                "through an indexedarray does nothing (warp/native/array.h: 'do not support gradient computation'), "
                "so the gradient would be zero. Declare the parameter wp.array and pass the gathered array "
                "(x[idx] is differentiable), or give the op its own backward (@op.backward)",
            )
        sig = self.sig
        if not sig.backward_enabled:
            raise fail(
                self.name,
                f"cannot differentiate: kernel '{sig.kernel.key}' was compiled with enable_backward=False. "
                "Re-create it with enable_backward=True, give the op its own backward (@op.backward), or run "
                "the op without gradients",
            )
        if self.trusts(sig.kernel):
            return
        names = frozenset(p.name for p in asked) | frozenset(p.name for p in sig.outputs)
        found = tuple(h for h in sig.hazards() if not self.trusts(h.kernel) and h.concerns(names))
        if found:
            raise WarpBridgeError(_adjoint.refusal(self.name, found))

    def trusts(self, what: Any) -> bool:
        """Whether ``trust_adjoint`` vouches for ``what``: a kernel, or a kernel's or
        ``@wp.func``'s name (as a hazard names it)."""
        if isinstance(self.trust_adjoint, bool) or what is None:
            return self.trust_adjoint is True
        if isinstance(what, str):
            return any(what in (t.key, getattr(t.func, "__name__", None)) for t in self.trust_adjoint)
        return what in self.trust_adjoint

    def __call__(
        self, *args: Any, launch_dims: Any = None, output_dims: Any = None, block_dim: int | None = None, **named: Any
    ) -> Any:
        """Run the op on framework arrays; see :func:`warpbridge.op`."""
        if named:
            self._refuse_keywords(named)
        if block_dim is not None and block_dim != self.block_dim:
            return self.with_options(block_dim=block_dim)(*args, launch_dims=launch_dims, output_dims=output_dims)
        outs = self.call_all(*args, launch_dims=launch_dims, output_dims=output_dims)
        visible = self.sig.visible
        if len(visible) == len(self.sig.outputs):
            return outs
        return outs[visible[0]] if len(visible) == 1 else tuple(outs[j] for j in visible)

    def call_all(self, *args: Any, launch_dims: Any = None, output_dims: Any = None) -> Any:
        """Like calling the op, auxiliary outputs included (one array, or a tuple of all)."""
        if self._indexed:
            args = self._gather(args)
        if self._handles:
            args = self._handle_ids(args)
        if self.generic:
            return self.instance(*args).call_all(*args, launch_dims=launch_dims, output_dims=output_dims)
        return _adapter(self, args).call(self, args, launch_dims, output_dims)

    def _refuse_keywords(self, named: dict) -> None:
        order = ", ".join(p.name for p in self.sig.inputs)
        raise fail(
            self.name,
            f"takes its inputs by position ({order}); got keyword argument(s) {sorted(named)}. Only launch_dims=, "
            "output_dims= and block_dim= are keywords",
        )

    def with_options(self, **changes: Any) -> WarpOp:
        """The op made from the same callable with these options changed (``wb.op`` returns
        the same one for the same options)."""
        options = {**self._options, **changes}
        if self.custom_backward is not None:
            options["backward"] = self.custom_backward.fn
        return op(self.fn, **options)

    def _handle_ids(self, args: tuple) -> tuple:
        """A ``wp.Mesh``, ``wp.HashGrid``, ``wp.Bvh`` or ``wp.Volume`` given for a uint64
        parameter stands for its id (under ``torch.compile(dynamic=True)`` pass the id itself:
        an object is guarded by identity, so a new one each step would recompile)."""
        out = list(args)
        for i in self._handles:
            if i < len(out) and isinstance(out[i], _HANDLE_TYPES):
                out[i] = out[i].id
        return tuple(out)

    def _gather(self, args: tuple) -> tuple:
        """A ``wp.indexedarray`` input called with ``(values, index, ...)``: the framework's own
        gather (differentiable, so the values get their gradient by its backward), one index
        array or None per dimension, as Warp's ``indexedarray(values, indices)`` reads it. The
        kernel then gets the gathered array as an indexedarray without indices."""
        out = list(args)
        for p in self._indexed:
            a = args[p.position] if p.position < len(args) else None
            if not isinstance(a, tuple):
                continue
            if not a or len(a) - 1 > p.ndim:
                raise fail(
                    self.name,
                    f"argument '{p.name}' is a wp.indexedarray: pass an array, or (values, index, ...) with at most "
                    f"{p.ndim} index array(s) (one per dimension, None to take it whole), got a tuple of {len(a)}",
                )
            values, indices = a[0], list(a[1:])
            named = [(p.name, values, p.describe_type())]
            named += [
                (f"{p.name}[{k + 1}]", idx, "a 1-D integer index array")
                for k, idx in enumerate(indices)
                if idx is not None
            ]
            backend = _frameworks.registry.for_arrays(self.name, named)
            for k, idx in enumerate(indices):
                if idx is None:
                    continue
                dtype, shape, _ = backend.info(idx)
                if len(shape) != 1 or not dtype.startswith(("int", "uint")):
                    raise fail(
                        self.name,
                        f"index {k + 1} of argument '{p.name}' must be a 1-D integer array, got {dtype} of shape {shape}",
                    )
            out[p.position] = backend.take(values, indices)
        return tuple(out)

    def instance(self, *args: Any) -> WarpOp:
        """The op a generic kernel's call with these arguments runs (itself otherwise).

        Every ``Any`` in the kernel's signature is bound to the element type of the first
        generic array argument: its dtype, and a vector (one trailing dim beyond the declared
        rank) or a matrix (two). Generic scalars get that type's scalar. Each binding is one
        Warp overload and one op (with its own registered custom op), made on first use: call
        the op once eagerly per dtype before ``torch.compile``. Other combinations need
        ``wp.overload`` and one op per overload.
        """
        if not self.generic:
            return self
        first = next((p for p in self.sig.array_inputs if p.dtype_name == GENERIC and p.position < len(args)), None)
        if first is None:
            raise fail(self.name, "a generic kernel binds its Any types from a generic array argument; none was given")
        dtype, shape, _ = _adapter(self, args).info(args[first.position])
        key = (dtype, tuple(shape[first.ndim :]))
        found = self._instances.get(key)
        if found is None:
            if _adapter(self, args).tracing():
                raise fail(
                    self.name,
                    f"a generic op makes its {dtype} instance on first use, which a compiler cannot trace: call the "
                    f"op once with {dtype} arrays before compiling (or make it with op.instance(*args))",
                )
            with self._lock:
                found = self._instances.get(key)
                if found is None:
                    found = self._instances[key] = self._instantiate(first, *key)
        return found

    def _instantiate(self, first: Any, dtype: str, inner: tuple) -> WarpOp:
        scalar = _dtypes.WARP_TYPES.get(dtype)
        if scalar is None or len(inner) > 2:
            raise fail(
                self.name,
                f"cannot bind the generic kernel's Any types from argument '{first.name}' of dtype {dtype} with "
                f"{len(inner)} trailing dims: expected a Warp scalar type and at most 2 (vector or matrix) trailing dims",
            )
        element = scalar
        if len(inner) == 1:
            element = wp.types.vector(inner[0], scalar)
        elif len(inner) == 2:
            element = wp.types.matrix(inner, scalar)
        kernel = self.sig.kernel
        with warp_runtime.LOAD_LOCK:  # a new overload changes its module: not while another thread loads it
            overload = bind_generic(kernel, element, scalar)
            problem = warp_runtime.codegen_error(overload)
            if problem is not None:
                warp_runtime.drop_overload(kernel, overload)  # or it fails every later load of its module
        if problem is not None:
            raise fail(
                self.name,
                f"the generic kernel '{kernel.key}' bound with Any = {wp.types.type_repr(element)} (from argument "
                f"'{first.name}', {dtype}) does not compile: {problem.strip()}\nBind its Any types yourself, one op "
                f"per binding: wb.op(wp.overload({kernel.key}, {{'<param>': <type>, ...}}))",
            )
        options = {k: v for k, v in self._options.items() if k != "name"}
        bwd = self.custom_backward.bind(element, scalar) if self.custom_backward is not None else None
        return WarpOp(
            overload, **options, name=self.name, backward=bwd,
            _registered_as=f"{self.registration_name}__{overload.sig}",
        )  # fmt: skip

    def __reduce__(self) -> tuple:
        # Pickled by reference: the wrapped callable's module and qualified name, and the
        # options (torch.save(model), spawn/forkserver DataLoader workers).
        fn, bwd = self.fn, self.custom_backward.fn if self.custom_backward is not None else None
        options = dict(self._options)
        if isinstance(self.trust_adjoint, tuple):
            options["trust_adjoint"] = [_reference(self.name, t) for t in self.trust_adjoint]
        return (
            _unpickle,
            (_reference(self.name, fn), _reference(self.name, bwd) if bwd is not None else None, options),
        )

    def __deepcopy__(self, memo: dict) -> WarpOp:
        # An op is a stateless function of its inputs (its caches only memoise): copies of a
        # model that holds one (EMA models, DDP references) share it.
        return self

    def __copy__(self) -> WarpOp:
        return self

    def __repr__(self) -> str:
        ins = ", ".join(p.name for p in self.sig.inputs)
        outs = ", ".join(p.name for p in self.sig.outputs)
        return f"WarpOp({self.name}: ({ins}) -> ({outs}), {self.sig.kind})"

    # -- framework-neutral helpers for the adapters ---------------------------------------

    def prepare(self, args: Sequence[Any], launch_dims: Any, output_dims: Any, fw: Any) -> Prepared:
        """Validate the call ``args`` through a framework description ``fw``
        (``_validate.validate``) and find its plan."""
        v = _validate.validate(self.sig, args, fw)
        inputs = _validate.input_values(self.sig, args, [shape for shape, _ in v.layouts])
        ld, od = self.dims(launch_dims, output_dims, inputs)
        plan = self.plan(fw.warp_device, v.device, v.layouts, ld, od)
        return Prepared(plan, v.values if plan.takes_values else v.packed, v.arrays, v.device)

    def dims(self, launch_dims: Any, output_dims: Any, inputs: Any = None) -> tuple[Any, Any]:
        """Per-call dims take precedence over the ones given at construction. A callable
        ``output_dims`` is evaluated with ``inputs`` (see ``_validate.input_values``) when given."""
        ld = (
            _validate.normalize_dims(self.name, "launch_dims", launch_dims)
            if launch_dims is not None
            else self.launch_dims
        )
        od = self.output_dims
        if output_dims is not None:
            od = _validate.normalize_output_dims(self.name, self.sig, output_dims)
            if isinstance(od, dict) and isinstance(self.output_dims, dict):
                od = {**self.output_dims, **od}
        if callable(od) and inputs is not None:
            od = _validate.call_output_dims(self.name, self.sig, od, inputs)
        return ld, od

    def plan(self, warp_device: Any, device: Any, layouts: tuple, launch_dims: Any, output_dims: Any) -> _plan.Plan:
        """The launch plan for arrays on framework ``device`` (``warp_device`` maps it to Warp's)
        with these layouts and dims. Warp's runtime is set up here, on the first call, not when
        an op is made: ``import warpbridge`` declares ops without touching it."""
        warp_runtime.ensure_init()
        device = warp_device(device)
        first = layouts[0][0] if layouts else None
        shapes = [shape for shape, _ in layouts]
        launch, out_shapes = _validate.resolve_dims(self.name, self.sig, first, launch_dims, output_dims, shapes)
        key = (device.alias, layouts, launch, out_shapes)  # wp.Device is not hashable
        plan = self._plans.get(key)
        if plan is None:
            _validate.check_bounds(self.name, self.sig, layouts, launch, out_shapes)
            plan = _functions.new_plan(
                self.sig, device, layouts, launch, out_shapes, self.debug, self.block_dim, self.tiled
            )
            if len(self._plans) >= MAX_CACHED:
                self._plans.clear()
            self._plans[key] = plan
        return plan


def _reference(op_name: str, fn: Any) -> tuple[str, str]:
    target = fn.func if isinstance(fn, (wp.Kernel, wp.Function)) else fn
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", "")
    if not module or "<locals>" in qualname or "<lambda>" in qualname:
        raise pickle.PicklingError(
            f"{op_name}(): cannot pickle an op whose kernel or function is not importable by name "
            f"({module}.{qualname}): define it at module level"
        )
    return module, qualname


def _resolve(ref: tuple[str, str]) -> Any:
    module, qualname = ref
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj.fn if isinstance(obj, WarpOp) else obj


def _unpickle(fn_ref: tuple, bwd_ref: tuple | None, options: dict) -> WarpOp:
    if isinstance(options.get("trust_adjoint"), list):
        options = {**options, "trust_adjoint": tuple(_resolve(r) for r in options["trust_adjoint"])}
    module, qualname = fn_ref
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if isinstance(obj, WarpOp) and obj._options == options:
        result = obj  # the module's own `@wb.op` object
    else:
        result = op(_resolve(fn_ref), **options)
    if bwd_ref is not None and result.custom_backward is None:
        result.backward(_resolve(bwd_ref))
    return result


MAX_BLOCK_DIM = 1024  # threads per block, on CUDA and on the CPU's cooperative blocks


def _blocks(name: str, sig: Any, block_dim: Any, tiled: Any) -> tuple[int | None, bool]:
    """``block_dim`` checked, and whether launches are tiled (``tiled``; None: a kernel that
    uses tiles is)."""
    if sig.kind != "kernel" and (block_dim is not None or tiled is not None):
        raise fail(
            name,
            "block_dim= and tiled= are for kernels: a launch function passes block_dim to its own wp.launch or "
            "wp.launch_tiled calls",
        )
    if block_dim is not None and (
        isinstance(block_dim, bool) or not isinstance(block_dim, int) or not 1 <= block_dim <= MAX_BLOCK_DIM
    ):
        raise fail(name, f"block_dim must be an int from 1 to {MAX_BLOCK_DIM} (threads per block), got {block_dim!r}")
    if tiled is not None and not isinstance(tiled, bool):
        raise fail(name, f"tiled must be a bool or None, got {tiled!r}")
    return block_dim, bool(sig.tile_use) if tiled is None else tiled


def _trusted(name: str, trust: Any) -> bool | tuple:
    """``trust_adjoint`` as True, False or a tuple of the kernels and ``@wp.func``s vouched for."""
    if isinstance(trust, bool):
        return trust
    if isinstance(trust, (wp.Kernel, wp.Function)):
        trust = (trust,)
    if isinstance(trust, (list, tuple)) and all(isinstance(t, (wp.Kernel, wp.Function)) for t in trust):
        return tuple(trust)
    raise fail(
        name,
        f"trust_adjoint must be a bool or a list of wp.Kernel / @wp.func objects whose adjoint you vouch for, "
        f"got {trust!r}",
    )


def _registration_name(fn: Any, options: dict) -> str:
    target = fn.func if isinstance(fn, wp.Kernel) else fn
    module = getattr(target, "__module__", None) or "main"
    qualname = getattr(target, "__qualname__", None) or getattr(target, "__name__", "op")
    # callables (a backward, output_dims) by their source: a repr would hold a memory address
    stable = sorted((k, _stable(v)) for k, v in options.items())
    digest = hashlib.sha256((_source_of(fn) + repr(stable)).encode()).hexdigest()[:10]
    base = re.sub(r"\W+", "_", f"{module}__{qualname.replace('<locals>', 'locals')}").strip("_")
    return f"{base}__{digest}"


def _stable(value: Any) -> Any:
    """An option as text that is the same in every process (callables and kernels by source)."""
    if isinstance(value, tuple) and value and all(isinstance(v, (wp.Kernel, wp.Function)) for v in value):
        return tuple(_source_of(v) for v in value)
    return _source_of(value) if callable(value) else value


def _source_of(fn: Any) -> str:
    if fn is None:
        return ""
    if isinstance(fn, wp.Kernel):
        return fn.adj.source
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return repr(fn)


def _default_name(fn: Any) -> str:
    raw = fn.key if isinstance(fn, wp.Kernel) else getattr(fn, "__name__", "op")
    return re.sub(r"\W", "_", str(raw)) or "op"


def _adapter(op: WarpOp, args: tuple) -> Any:
    """The backend of the call's arrays (an attribute read per array once their types are
    known: see ``_backends.registry.BY_TYPE_NAME``)."""
    mod = None
    for i in op.sig.array_positions:
        if i >= len(args):
            break
        t = type(args[i])
        known = getattr(_frameworks.registry.BY_TYPE_NAME, t.__name__, None)
        m = known[1] if known is not None and known[0] is t else None
        if m is None or (mod is not None and m is not mod):
            return _find_adapter(op, args)
        mod = m
    return mod if mod is not None else _find_adapter(op, args)


def _find_adapter(op: WarpOp, args: tuple) -> Any:
    named = [(p.name, args[p.position], p.describe_type()) for p in op.sig.array_inputs if p.position < len(args)]
    return backend_of(op.name, named)


def loaded_backends() -> list:
    """The backends of the frameworks the caller has imported."""
    return _frameworks.registry.loaded()


def backend_of(op_name: str, named: Sequence[tuple[str, Any, str]]) -> Any:
    """The backend serving the arrays ``named`` ((argument name, array, expected type in
    words)), all from one framework: an attribute read per array once their types are known."""
    found = None
    for _, a, _ in named:
        known = getattr(_frameworks.registry.BY_TYPE_NAME, type(a).__name__, None)
        m = known[1] if known is not None and known[0] is type(a) else None
        if m is None or (found is not None and m is not found):
            found = None
            break
        found = m
    if found is None:
        found = _frameworks.registry.for_arrays(op_name, named)
        for _, a, _ in named:
            _frameworks.registry.remember(type(a), found)
    return found


class OpOptions(TypedDict, total=False):
    """The keyword options of :func:`op`, for type checkers (defaults and meanings there)."""

    num_outputs: int
    launch_dims: Any
    output_dims: Any
    name: str | None
    vmap_method: str
    backward: Any
    trust_adjoint: bool | Sequence[Any]
    aux: Any
    recompute: bool
    outputs: Sequence[str] | None
    in_out: Sequence[str]
    debug: bool
    block_dim: int | None
    tiled: bool | None


@overload
def op(**options: Unpack[OpOptions]) -> Callable[[Any], WarpOp]: ...


@overload
def op(fn: Any, **options: Unpack[OpOptions]) -> WarpOp: ...


def op(
    fn: Any = None,
    *,
    num_outputs: int = 1,
    launch_dims: Any = None,
    output_dims: Any = None,
    name: str | None = None,
    vmap_method: str = "sequential",
    backward: Any = None,
    trust_adjoint: bool | Sequence[Any] = False,
    aux: Any = (),
    recompute: bool = False,
    outputs: Sequence[str] | None = None,
    in_out: Sequence[str] = (),
    debug: bool = False,
    block_dim: int | None = None,
    tiled: bool | None = None,
) -> WarpOp | Callable[[Any], WarpOp]:
    """Turn a Warp kernel, or a function that launches kernels, into a differentiable operator.

    Args:
        fn: a ``wp.Kernel``, or a Python function whose parameters are annotated with Warp
            array/scalar types and which launches one or more kernels (the ``jax_callable``
            convention). Inputs come first; the last ``num_outputs`` parameters are outputs,
            allocated zeroed by the op.
        num_outputs: how many trailing parameters are outputs.
        launch_dims: launch dims (int or tuple); default: the Warp shape of the first array
            input. For a tiled launch, the grid of blocks (``wp.launch_tiled``'s ``dim``), and
            required for a kernel that uses tiles. Overridable per call.
        output_dims: output Warp shape(s): one tuple for all outputs or a dict keyed by output
            name; default: the launch dims. Or a callable that returns those from the op's
            inputs, called with each array replaced by its Warp shape and each scalar by its
            value (``lambda x, idx, n: {"y": (n, x[1])}``), evaluated per call, under
            ``torch.compile`` too. Overridable per call.
        name: the op's name in messages and, when given, its registered name
            (``torch.ops.warpbridge.<name>``); default: the kernel's key, registered as its
            module and qualified name plus a hash of its source and options
            (``op.registration_name``). ``wb.op`` returns the same op for the same callable
            and options.
        vmap_method: how ``torch.vmap`` batches the op. ``"sequential"`` (default, always
            correct) launches once per batch element. ``"broadcast_all"`` folds the batch
            into the first launch dimension (one launch; unbatched arrays are expanded to the
            batch); ``"expand_dims"`` folds batched arrays and shares unbatched ones. Both
            declare that the kernel is elementwise over its first dimension; see
            ``docs/torch-func.md``. ``jax.vmap`` folds for ``"broadcast_all"`` too and
            runs the other methods sequentially.
        backward: the op's own backward, a kernel or launch function (see
            :meth:`WarpOp.backward` and ``docs/custom-backward.md``), used instead of Warp's
            generated adjoint.
        aux: names of outputs that only carry state from the forward to a custom backward
            (a search structure, saved statistics): allocated and passed like any output,
            saved for the backward, but never returned to the caller and never differentiated
            (the backward gets no ``adj_`` for them). See ``docs/custom-backward.md``.
        trust_adjoint: skip the check that refuses gradients Warp's adjoint gets wrong
            (variables changed in dynamic loops, outputs read then overwritten): ``True`` for
            every kernel, or a list of the kernels and ``@wp.func``s you vouch for (the others
            a launch function runs are still checked). Only for adjoints you have checked, e.g.
            with ``warpbridge.testing.check_op``.
        outputs: kernels: the names of the output parameters, wherever they stand in the
            signature (instead of the last ``num_outputs``); returned in signature order.
        in_out: kernels: parameters the kernel updates in place (``x[i] = x[i] + v[i] * dt``).
            Each is an input (the caller's array is never written) and an output: the kernel
            runs on a fresh copy, returned after the named outputs, in signature order. Its
            gradient is right where each element is read before it is stored (refused
            otherwise, naming the line).
        debug: kernels: before each launch, check the values of every integer array the kernel
            uses as indices into another array (``x[idx[i]]``, or ``j = idx[i]`` ... ``x[j]``)
            against that array's size, and raise a ``WarpBridgeError`` naming both instead of
            reading or writing out of bounds (Warp's own debug checks end the process). Costs a
            pass over those arrays on the host per call. Also on for every op with the
            environment variable ``WARPBRIDGE_DEBUG=1``.
        block_dim: kernels: threads per block (1 to 1024), as ``wp.launch`` and
            ``wp.launch_tiled`` take it, in the forward and the adjoint; honoured on the CPU
            too, where Warp runs a block's threads cooperatively (no need for
            ``wp.config.enable_cpu_blocks``). None (default): Warp's own, 1 on the CPU and 256
            on CUDA. Overridable per call (``op(x, block_dim=64)``).
        tiled: kernels: launch by blocks, as ``wp.launch_tiled``: ``launch_dims`` is the grid
            of blocks, each of ``block_dim`` threads, and ``wp.tid()`` returns the block's
            place in it. False: as ``wp.launch``, ``launch_dims`` counts threads (grouped into
            blocks of ``block_dim``, for kernels that make tiles from per-thread values with
            ``wp.tile``). None (default): True for a kernel that uses tiles. See
            ``docs/interop.md``, "Tile kernels".
        recompute: for a launch function: re-run it under a fresh ``wp.Tape`` in the backward
            instead of keeping the forward's tape (and its intermediates) until then. Saves
            memory between forward and backward, costs one more forward. PyTorch eager calls
            keep the tape by default; ``torch.compile``, ``torch.func``, JAX and Paddle always
            recompute.

    Returns:
        A :class:`WarpOp`; without ``fn``, a decorator that makes one.

    Raises:
        WarpBridgeError: the kernel or function cannot be wrapped (unsupported parameter
            types, outputs that are not arrays, a kernel that writes its inputs).

    Example::

        @wb.op
        @wp.kernel
        def square(x: wp.array(dtype=float), y: wp.array(dtype=float)):
            i = wp.tid()
            y[i] = x[i] * x[i]

        y = square(torch.arange(4.0, requires_grad=True))  # tensor([0., 1., 4., 9.])
    """
    kw = dict(
        num_outputs=num_outputs,
        launch_dims=launch_dims,
        output_dims=output_dims,
        name=name,
        vmap_method=vmap_method,
        backward=backward,
        trust_adjoint=trust_adjoint,
        aux=aux,
        recompute=recompute,
        outputs=outputs,
        in_out=in_out,
        debug=debug,
        block_dim=block_dim,
        tiled=tiled,
    )
    if fn is None:
        return lambda f: _cached(f, kw)
    return _cached(fn, kw)


_HANDLE_TYPES = (wp.Mesh, wp.HashGrid, wp.Bvh, wp.Volume)  # passed to kernels by their uint64 id
_DEFERRED_INIT: list = []  # non-empty while ops are declared at import (see deferred_init)


@contextlib.contextmanager
def deferred_init():
    """Make ops without setting up Warp's runtime (``import warpbridge`` declares the neighbour
    ops; the runtime, and Warp's device warnings, come with the first call)."""
    _DEFERRED_INIT.append(True)
    try:
        yield
    finally:
        _DEFERRED_INIT.pop()


_REGISTRY: dict[Any, WarpOp] = {}
_LIVE: weakref.WeakSet = weakref.WeakSet()  # every op, for a backend loaded after they were made


def live_ops() -> list[WarpOp]:
    """Every op that exists (a backend loaded later sets itself up for each, see ``on_new_op``)."""
    return list(_LIVE)


_REGISTRY_LOCK = threading.Lock()


def _cached(fn: Any, kw: dict) -> WarpOp:
    """``wb.op`` on the same callable with the same options returns the same op, so that an op
    made inside ``forward`` is not registered again on every call."""
    try:
        key = (fn, tuple((k, _freeze(v)) for k, v in kw.items()))
        hash(key)
    except TypeError:
        return WarpOp(fn, **kw)
    with _REGISTRY_LOCK:
        found = _REGISTRY.get(key)
        if found is None:
            found = _REGISTRY[key] = WarpOp(fn, **kw)
        return found


def _freeze(v: Any) -> Any:
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    return v
