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

import inspect
import types
from typing import Any

import jax
import numpy as np
import warp as wp

from . import _plan
from ._backend import Backend
from ._errors import describe, fail
from ._signature import Param

_MAX_CACHED = 256


def info(a: Any) -> tuple[str, tuple[int, ...], str]:
    dev = "cpu"
    if isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer):
        dev = str(next(iter(a.devices())).platform)
    return np.dtype(a.dtype).name, tuple(int(s) for s in a.shape), dev


def cast(a: Any, dtype_name: str) -> Any:
    return a.astype(dtype_name)


def call(op: Any, args: tuple, launch_dims: Any, output_dims: Any) -> Any:
    op.check_arity(args)
    _plan.ensure_init()
    sig = op.sig
    arrays, layouts, scalars, avals = [], [], [], []
    for p, a in zip(sig.inputs, args):
        if not p.is_array:
            if isinstance(a, jax.core.Tracer):
                raise fail(
                    op.name,
                    f"scalar argument '{p.name}' is a traced JAX value; Warp needs it as a static Python number. "
                    "Pass it as a static argument (jax.jit(f, static_argnums=...)) or close over it",
                )
            op._packers[len(scalars)](a)  # the same validation as every framework's
            scalars.append(a.item() if isinstance(a, np.generic) else a)
            continue
        if not _is_array(a):
            raise fail(op.name, f"argument '{p.name}' must be a jax.Array ({p.describe_type()}), got {describe(a)}")
        dtype = np.dtype(a.dtype)
        shape = tuple(int(s) for s in a.shape)
        strides = _plan.contiguous_strides(shape, dtype.itemsize)  # JAX arrays are always dense
        wshape, _ = _plan.check_array(op.name, p, _plan.ArrayArg(0, dtype.name, shape, strides))
        arrays.append(a)
        layouts.append(wshape)
        avals.append((shape, dtype.name))
    ld, od = op.dims(launch_dims, output_dims, _plan.input_values(sig, args, layouts))
    launch, out_shapes = _plan.resolve_dims(op.name, sig, layouts[0] if layouts else None, ld, od)
    _plan.check_bounds(op.name, sig, [(s, ()) for s in layouts], launch, out_shapes)
    # vmap_method="broadcast_all" folds a jax.vmap batch into the launch (Warp's FFI merges
    # the batch dims into the first dimension), which needs dims that follow the first
    # array; with explicit dims, or any other method, jax.vmap runs sequentially.
    fold = op.vmap_method == "broadcast_all" and ld is None and od is None and bool(layouts)
    key = (launch, out_shapes, tuple(scalars), tuple(avals), fold)
    cache = BACKEND.state(op).setdefault("fns", {})
    fn = cache.get(key)
    if fn is None:
        if len(cache) >= _MAX_CACHED:
            cache.clear()
        fn = cache[key] = _build(op, launch, out_shapes, tuple(scalars), tuple(layouts), fold)
    outs = fn(*arrays)
    return outs[0] if len(outs) == 1 else tuple(outs)


def _is_array(a: Any) -> bool:
    return isinstance(a, (jax.Array, jax.core.Tracer))


def _merge(sig: Any, arrays: list, scalars: tuple) -> list:
    """The function's argument list: arrays and scalars back in declaration order."""
    out, ai, si = [], iter(arrays), iter(scalars)
    for p in sig.inputs:
        out.append(next(ai) if p.is_array else next(si))
    return out


def _annotated(fn: Any, params: list[tuple[str, Any]]) -> Any:
    """Give ``fn(*args)`` named, Warp-annotated parameters: jax_callable reads them."""
    fn.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=t) for n, t in params]
    )
    fn.__annotations__ = {**dict(params), "return": None}
    return fn


def _build(op: Any, launch: tuple, out_shapes: tuple, scalars: tuple, in_shapes: tuple, fold: bool) -> Any:
    sig = op.sig
    ins: list[Param] = sig.array_inputs
    outs: list[Param] = sig.outputs
    diff = [i for i, p in enumerate(ins) if p.differentiable]
    fouts = [j for j, p in enumerate(outs) if p.carries_grad]

    state = types.SimpleNamespace(warm=[False, False, False])  # first runs load modules: under the lock

    def forward(*arrays):
        with _plan.first_run(state, 0):
            _forward(*arrays)

    def _forward(*arrays):
        a_in, a_out = list(arrays[: len(ins)]), list(arrays[len(ins) :])
        for o in a_out:
            o.zero_()  # outputs start zeroed, as on every framework (kernels may accumulate)
        if sig.kind == "kernel":
            dim = a_in[0].shape if fold else launch  # folded: the batch is in the first dim
            wp.launch(sig.kernel, dim=dim, inputs=_merge(sig, a_in, scalars), outputs=a_out)
        else:
            sig.func(*_merge(sig, a_in, scalars), *a_out)

    vmap_method = "broadcast_all" if fold else "sequential"
    fwd_params = [(p.name, p.wp_type) for p in ins] + [(p.name, p.wp_type) for p in outs]
    fwd = wp.jax_callable(
        _annotated(forward, fwd_params),
        num_outputs=len(outs),
        vmap_method=vmap_method,
        output_dims={p.name: s for p, s in zip(outs, out_shapes)},
    )

    def backward(*arrays):
        with _plan.first_run(state, 1):
            _backward(*arrays)

    def _backward(*arrays):
        n, m = len(ins), len(fouts)
        a_in = list(arrays[:n])
        g_out = list(arrays[n : n + m])
        g_in = list(arrays[n + m :])
        for g in g_in:
            g.zero_()  # gradients are fresh: the adjoint accumulates into them
        grads_by_input = dict(zip(diff, g_in))
        adj_out, scratch = [], []
        gi = iter(g_out)
        for j, (p, shape) in enumerate(zip(outs, out_shapes)):
            if j in fouts:
                g = next(gi)
                # The adjoint may add into an output's gradient when the kernel reads that
                # output, and a tape may always: give it a private copy of JAX's cotangent.
                if sig.kind == "function" or p.name in sig.tracked_outputs:
                    g = wp.clone(g)
                adj_out.append(g)
            else:
                adj_out.append(None)
            # the forward's outputs (folded: outputs follow the first array, batch included)
            scratch.append(wp.zeros(a_in[0].shape if fold else shape, dtype=p.wp_type.dtype))
        if sig.kind == "kernel" and sig.reads_outputs:  # the adjoint reads what the forward left
            dim = a_in[0].shape if fold else launch
            wp.launch(sig.kernel, dim=dim, inputs=_merge(sig, a_in, scalars), outputs=scratch)
        for p, s_, g in zip(outs, scratch, adj_out):
            if g is not None and p.name in sig.tracked_outputs:
                s_.grad = g  # as Warp's Tape: stores consume the gradient of what they overwrite
        if sig.kind == "kernel":
            adj_in = []
            ai = iter(range(len(ins)))
            for p in sig.inputs:
                if p.is_array:
                    adj_in.append(grads_by_input.get(next(ai)))
                else:
                    adj_in.append(_zero_scalar(p))
            wp.launch(
                sig.kernel,
                dim=a_in[0].shape if fold else launch,
                inputs=_merge(sig, a_in, scalars),
                outputs=scratch,
                adj_inputs=adj_in,
                adj_outputs=adj_out,
                adjoint=True,
            )
        else:
            wrapped = [_with_grad(a, grads_by_input.get(i)) for i, a in enumerate(a_in)]
            outs_g = [_with_grad(s, g) for s, g in zip(scratch, adj_out)]
            tape = wp.Tape()
            with tape:
                kept = _plan.call_keeping_locals(sig.func, [*_merge(sig, wrapped, scalars), *outs_g])
            _plan.check_recorded(op, tape)
            tape.backward()
            del kept
            # no tape.reset(): it would zero the gradients just computed

    cb = op.custom_backward

    def custom(*arrays):
        with _plan.first_run(state, 2):
            _custom(*arrays)

    def _custom(*arrays):
        n, no, m = len(ins), len(outs), len(fouts)
        a_in, a_out = list(arrays[:n]), list(arrays[n : n + no])
        g_out, g_in = list(arrays[n + no : n + no + m]), list(arrays[n + no + m :])
        for g in g_in:
            g.zero_()
        args = [*_merge(sig, a_in, scalars), *a_out, *g_out]
        if cb.sig.kind == "kernel":
            wp.launch(cb.sig.kernel, dim=a_in[0].shape if fold else launch, inputs=args, outputs=g_in)
        else:
            needs = {"needs_input_grad": (True,) * len(g_in)} if cb.takes_needs else {}
            cb.sig.func(*args, *g_in, **needs)

    bwd_params = [(p.name, p.wp_type) for p in ins]
    if cb is not None:
        bwd_params += [(f"out_{p.name}", p.wp_type) for p in outs]
    bwd_params += [(f"grad_{outs[j].name}", outs[j].wp_type) for j in fouts]
    bwd_params += [(f"grad_{ins[i].name}", ins[i].wp_type) for i in diff]
    bwd = (
        wp.jax_callable(
            _annotated(custom if cb is not None else backward, bwd_params),
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
        return outs_, (arrays, outs_ if cb is not None else ())

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


def _zero_scalar(p: Param) -> Any:
    return p.wp_type(0) if not p.inner_shape else p.wp_type()


def _with_grad(a: wp.array, grad: wp.array | None) -> wp.array:
    """A view of ``a`` that carries ``grad`` (None: no gradient)."""
    return wp.array(
        ptr=a.ptr,
        dtype=a.dtype,
        shape=a.shape,
        strides=a.strides,
        device=a.device,
        grad=grad,
        requires_grad=grad is not None,
    )


class JaxBackend(Backend):
    """JAX: one ``jax.custom_vjp`` of ``wp.jax_callable``s per call layout (module doc)."""

    name = "jax"
    array_name = "jax.Array"

    def call(self, op: Any, args: tuple, launch_dims: Any, output_dims: Any) -> Any:
        return call(op, args, launch_dims, output_dims)

    def info(self, a: Any) -> tuple:
        return info(a)

    def cast(self, a: Any, dtype_name: str) -> Any:
        return cast(a, dtype_name)

    def on_backward_attached(self, op: Any) -> None:
        op._state.pop(self.name, None)  # functions built before now captured the old backward


BACKEND = JaxBackend()
