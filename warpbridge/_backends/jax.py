"""JAX adapter, built on Warp's own FFI (``wp.jax_callable``).

A call is validated against the op's signature like any other framework's, then turned into
one ``jax.custom_vjp`` function per (dims, scalar values, input shapes): its forward is a
``jax_callable`` that zeroes the outputs and launches the kernel (or runs the launch
function); its backward is a second ``jax_callable`` that launches the adjoint into zeroed
gradient buffers (kernels) or re-runs the function under a fresh ``wp.Tape`` (functions).
That goes past ``wp.jax_kernel(enable_backward=True)``, which supports neither output dims
nor launch functions, and it keeps warpbridge's gradient rules: inputs and incoming
cotangents are read-only to Warp, gradients are fresh, nothing survives a backward.

Works under ``jax.jit``, ``jax.grad``/``jax.vjp``, ``jax.vmap`` (one launch per batch element,
always correct; or, for ops made with ``vmap_method="broadcast_all"`` and inferred dims, the
batch folded into one launch) and ``shard_map``. Scalars must be static
Python numbers: they are baked into the compiled call.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import inspect
import types
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import warp as wp

from .._core import dtypes as _dtypes
from .._core import gradients as _gradients
from .._core import launch_function as _functions
from .._core import validate as _validate
from .._core import warp_runtime
from .._core.backend import Backend, WarpArrays
from .._core.errors import fail
from .._core.op import Prepared
from .._core.signature import Param

_MAX_CACHED = 256


def finish_pending_work() -> None:
    """Let a process that used warpbridge from JAX exit, whatever JAX still runs.

    Registered with ``atexit`` when this backend loads. JAX dispatches asynchronously, so a
    script may end while a computation that calls into warpbridge still runs. Python's
    finalisation would then destroy JAX's client, which joins XLA's threads while one of them
    waits to enter the interpreter for warpbridge's callback: the process hangs. JAX's own
    exit wait covers only computations it knows have side effects, which Warp's FFI calls
    are not (marking them so would make ``jax.checkpoint`` refuse them).

    So: first wait for every result the program still holds (those computations finish), then
    keep the clients alive past finalisation, so that nothing joins a thread that waits on the
    interpreter (a computation whose results were dropped is abandoned, as at any exit).
    """
    for a in jax.live_arrays():
        with contextlib.suppress(Exception):  # a failed computation: its error was JAX's to report
            a.block_until_ready()
    clients = set()
    for platform in (None, "cpu"):
        with contextlib.suppress(Exception):
            clients.update(d.client for d in jax.devices(platform))
    for client in clients:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(client))  # never released: the process is ending


atexit.register(finish_pending_work)


def info(a: Any) -> tuple[str, tuple[int, ...], str]:
    dev = "cpu"
    if isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer):
        dev = str(next(iter(a.devices())).platform)
    return np.dtype(a.dtype).name, tuple(int(s) for s in a.shape), dev


def cast(a: Any, dtype_name: str) -> Any:
    return a.astype(dtype_name)


def call(op: Any, args: tuple, launch_dims: Any, output_dims: Any) -> Any:
    sig = op.sig
    sig.check_arity(args)
    _refuse_traced_scalars(op, args)
    warp_runtime.ensure_init()
    v = _validate.validate(sig, args, BACKEND)  # the same checks as every framework's
    shapes = [shape for shape, _ in v.layouts]
    scalars = tuple(a.item() if isinstance(a, np.generic) else a for a in v.values)
    ld, od = op.dims(launch_dims, output_dims, _validate.input_values(sig, args, shapes))
    launch, out_shapes = _validate.resolve_dims(op.name, sig, shapes[0] if shapes else None, ld, od)
    _validate.check_bounds(op.name, sig, [(s, ()) for s in shapes], launch, out_shapes)
    # vmap_method="broadcast_all" folds a jax.vmap batch into the launch (Warp's FFI merges
    # the batch dims into the first dimension), which needs dims that follow the first
    # array; with explicit dims, or any other method, jax.vmap runs sequentially.
    fold = op.vmap_method == "broadcast_all" and ld is None and od is None and bool(shapes)
    avals = tuple((tuple(a.shape), np.dtype(a.dtype).name) for a in v.arrays)
    key = (launch, out_shapes, scalars, avals, fold)
    cache = BACKEND.state(op).setdefault("fns", {})
    fn = cache.get(key)
    if fn is None:
        if len(cache) >= _MAX_CACHED:
            cache.clear()
        fn = cache[key] = _build(op, launch, out_shapes, scalars, tuple(shapes), fold)
    outs = fn(*v.arrays)
    return outs[0] if len(outs) == 1 else tuple(outs)


def _refuse_traced_scalars(op: Any, args: tuple) -> None:
    for p, a in zip(op.sig.inputs, args):
        if not p.is_array and isinstance(a, jax.core.Tracer):
            raise fail(
                op.name,
                f"scalar argument '{p.name}' is a traced JAX value; Warp needs it as a static Python number. "
                "Pass it as a static argument (jax.jit(f, static_argnums=...)) or close over it",
            )


def _is_array(a: Any) -> bool:
    return isinstance(a, (jax.Array, jax.core.Tracer))


def _merge(sig: Any, arrays: list, scalars: tuple) -> list:
    """The function's argument list: arrays and scalars back in declaration order."""
    out, ai, si = [], iter(arrays), iter(scalars)
    for p in sig.inputs:
        out.append(next(ai) if p.is_array else next(si))
    return out


def _out_name(p: Param) -> str:
    """An output's parameter name in the callable: an in_out one's input has its name."""
    return f"{p.name}__updated" if p.in_out else p.name


def _annotated(fn: Any, params: list[tuple[str, Any]]) -> Any:
    """Give ``fn(*args)`` named, Warp-annotated parameters: jax_callable reads them."""
    fn.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=t) for n, t in params]
    )
    fn.__annotations__ = {**dict(params), "return": None}
    return fn


_WARP = WarpArrays()


def _plain(p: Param) -> Any:
    """The callable's view of an input: an indexedarray input arrives gathered, as a plain array."""
    return (
        wp.array(dtype=p.wp_type.dtype, ndim=p.ndim) if p.indexed else p.wp_type
    )  # inside the callbacks the arrays are wp.arrays


def _preparer(op: Any, scalars: tuple, ld: Any, od: Any) -> Any:
    """``prepared(arrays)``: the call on a callback's arrays. The arguments were validated when
    the call was traced, and a callback's layouts repeat on every run: each layout is prepared
    once (where preparing made no copy, the layout alone decides)."""
    validated: dict = {}  # the arrays' layouts -> (plan, scalars, device)

    def prepared(a_in: Sequence[wp.array]) -> Prepared:
        key = tuple([(a.shape, a.strides, a.dtype) for a in a_in])
        hit = validated.get(key)
        if hit is not None:
            return Prepared(hit[0], hit[1], list(a_in), hit[2])
        pr = op.prepare(_merge(op.sig, list(a_in), scalars), ld, od, _WARP)
        if all(x is y for x, y in zip(pr.arrays, a_in)):
            if len(validated) >= _MAX_CACHED:
                validated.clear()
            validated[key] = (pr.plan, pr.scalars, pr.device)
        return pr

    return prepared


def _callbacks(op: Any, prepared: Any, diff: list, fouts: list) -> tuple:
    """The forward and backward callbacks: Warp arrays in, launched through the same plans
    and ``_gradients.backward`` as every other framework's."""
    ins, outs, saves = op.sig.array_inputs, op.sig.outputs, op.saves_outputs
    state = types.SimpleNamespace(warm=[False, False])  # first runs load modules: under the lock

    def forward(*arrays):
        with _functions.first_run(state, 0):
            a_in, a_out = arrays[: len(ins)], arrays[len(ins) :]
            pr = prepared(a_in)
            for o in a_out:
                o.zero_()  # outputs start zeroed, as on every framework (kernels may accumulate)
            pr.plan.run([a.ptr for a in pr.arrays], pr.scalars, [o.ptr for o in a_out])

    def backward(*arrays):
        with _functions.first_run(state, 1):
            n, no, m = len(ins), len(outs) if saves else 0, len(fouts)
            a_in, saved = arrays[:n], list(arrays[n : n + no]) or None
            g_out, g_in = arrays[n + no : n + no + m], arrays[n + no + m :]
            for g in g_in:
                g.zero_()  # the adjoint adds into them (direct targets)
            pr = prepared(a_in)
            grads: list = [None] * len(outs)
            for j, g in zip(fouts, g_out):
                grads[j] = g
            targets: list = [None] * n
            for i, g in zip(diff, g_in):
                targets[i] = g
            needs = [p.differentiable for p in ins]
            _gradients.backward(
                op, pr.plan, pr.scalars, pr.arrays, grads, needs, _WARP, pr.device, None, targets, saved, True
            )

    return forward, backward


def _build(op: Any, launch: tuple, out_shapes: tuple, scalars: tuple, in_shapes: tuple, fold: bool) -> Any:
    """The op as a ``jax.custom_vjp`` whose forward and backward are ``wp.jax_callable``s.

    Inside them the arrays are ``wp.array``s, launched through the same plans and
    ``_gradients.backward`` as every other framework's, so JAX has no gradient rules of its
    own."""
    sig = op.sig
    ins: list[Param] = sig.array_inputs
    outs: list[Param] = sig.outputs
    diff = [i for i, p in enumerate(ins) if p.differentiable]
    fouts = [j for j, p in enumerate(outs) if p.carries_grad]
    saves = op.saves_outputs  # the backward reads the forward's outputs: residuals
    # folded (vmap_method="broadcast_all"): the batch sits in the first dim and the dims follow it
    ld = None if fold else launch
    od = None if fold else {p.name: s for p, s in zip(outs, out_shapes)}
    forward, backward = _callbacks(op, _preparer(op, scalars, ld, od), diff, fouts)
    fwd_params = [(p.name, _plain(p)) for p in ins] + [(_out_name(p), p.wp_type) for p in outs]
    vmap_method = "broadcast_all" if fold else "sequential"
    fwd = wp.jax_callable(
        _annotated(forward, fwd_params),
        num_outputs=len(outs),
        vmap_method=vmap_method,
        output_dims={_out_name(p): s for p, s in zip(outs, out_shapes)},
    )
    bwd_params = [(p.name, _plain(p)) for p in ins]
    if saves:
        bwd_params += [(f"out_{_out_name(p)}", p.wp_type) for p in outs]
    bwd_params += [(f"grad_{_out_name(outs[j])}", outs[j].wp_type) for j in fouts]
    bwd_params += [(f"grad_{ins[i].name}", _plain(ins[i])) for i in diff]
    cb = op.custom_backward
    bwd = (
        wp.jax_callable(
            _annotated(backward, bwd_params),
            num_outputs=len(diff),
            vmap_method=vmap_method,
            output_dims={f"grad_{ins[i].name}": in_shapes[i] for i in diff},
        )
        if diff and fouts and (sig.backward_enabled or cb is not None)
        else None
    )

    @jax.custom_vjp
    def f(*arrays):
        return tuple(fwd(*arrays))

    def f_fwd(*arrays):
        outs_ = f(*arrays)
        return outs_, (arrays, outs_ if saves else ())

    def f_bwd(res, cotangents):
        arrays, saved = res
        op.check_gradient()  # rule 7, at jax.grad trace time
        if bwd is None:
            return tuple(None for _ in arrays)
        grads = bwd(*arrays, *saved, *[cotangents[j] for j in fouts])
        result = [None] * len(arrays)
        for i, g in zip(diff, grads):
            result[i] = g
        return tuple(result)

    f.defvjp(f_fwd, f_bwd)
    return f


class JaxBackend(Backend):
    """JAX: one ``jax.custom_vjp`` of ``wp.jax_callable``s per call layout (module doc)."""

    name = "jax"
    array_name = "jax.Array"
    default_device = None  # JAX places a callback with its arrays

    @staticmethod
    def is_array(a: Any) -> bool:
        return _is_array(a)

    @staticmethod
    def meta(a: Any) -> tuple:
        """A JAX array is always dense: (dtype name, shape, element strides, itemsize, device),
        the device left to JAX (None)."""
        dtype = np.dtype(a.dtype)
        shape = tuple(int(s) for s in a.shape)
        return dtype.name, shape, _dtypes.contiguous_strides(shape, 1), dtype.itemsize, None

    call = staticmethod(call)
    info = staticmethod(info)
    cast = staticmethod(cast)

    def to_host(self, a: Any) -> Any:
        return np.asarray(a)  # a tracer raises here: the caller says why

    def from_host(self, values: Any, like: Any) -> Any:
        return jax.device_put(values, next(iter(like.devices())))

    def differentiated(self, a: Any) -> bool:
        return isinstance(a, jax.core.Tracer)  # a concrete array carries no derivative

    def uniform(self, like: Any, n: int) -> Any:
        raise TypeError("JAX keeps no global random state (its keys are explicit)")

    def take(self, values: Any, indices: list) -> Any:
        for d, idx in enumerate(indices):
            if idx is not None:
                values = jax.numpy.take(values, idx, axis=d)
        return values

    def on_backward_attached(self, op: Any) -> None:
        op.states.pop(self.name, None)  # functions built before now captured the old backward


BACKEND = JaxBackend()
