"""torch.func support: ``torch.vmap``, ``torch.func.grad``, ``vjp`` and ``jacrev`` over Warp ops.

torch.func sees through an ``autograd.Function`` only if it has a separate ``setup_context``,
a ``vmap`` rule, and a backward made of operations torch.func can transform again
(``jacrev`` vmaps the backward over the rows of the Jacobian). The eager ``_Apply`` node and
the custom ops' generated autograd wrappers have neither, so calls made while a transform is
active come here instead:

- :class:`_Forward` runs a :class:`Rule`'s forward on plain tensors (torch.func unwraps them
  level by level before calling it) and saves what the backward needs.
- Its backward is :class:`_Backward`, a second Function with its own vmap rule, so that
  ``vmap(grad(f))`` (per-sample gradients) and ``jacrev`` batch the backward too.

A :class:`Rule` holds everything about one call that is not a tensor (the op, its scalars,
dims) and says how to batch it. The default, ``"sequential"``, runs the call once per batch
element and stacks the results: correct for any kernel. ``warpbridge.op`` rules can instead
fold the batch into the launch (``vmap_method="broadcast_all"`` / ``"expand_dims"``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..._core.errors import fail
from . import backend as eager
from . import registered_op
from .backend import save_for_backward

# Whether a torch.func transform (vmap, grad, vjp, jacrev, ...) is running
active = torch._C._are_functorch_transforms_active


class Rule:
    """How to run, differentiate and batch one call. Subclasses set the attributes and
    implement ``forward``, ``backward`` and ``eager``."""

    name: str = "op"
    float_outputs: tuple[bool, ...] = ()  # which outputs carry gradients
    save_outputs: bool = False  # whether the backward reads the forward's outputs

    def forward(self, tensors: Sequence[torch.Tensor]) -> tuple:
        """All outputs, from plain tensors, recording nothing."""
        raise NotImplementedError

    def backward(self, needs: tuple, tensors: Sequence, outputs: Sequence, grads: Sequence) -> tuple:
        """The gradients of the inputs flagged in ``needs`` (and only those), from the output
        gradients of the differentiable outputs ``grads``; recording nothing."""
        raise NotImplementedError

    def eager(self, tensors: Sequence[torch.Tensor]) -> tuple:
        """All outputs through the op's ordinary (autograd-recording) path."""
        raise NotImplementedError

    def call(self, tensors: Sequence[torch.Tensor]) -> tuple:
        """All outputs, under whatever transforms are still active."""
        return _Forward.apply(self, *tensors) if active() else self.eager(tensors)

    def vmap_forward(self, batch: int, in_dims: Sequence, tensors: Sequence) -> tuple[tuple, tuple]:
        return sequential(batch, in_dims, tensors, self.call)

    def vmap_backward(
        self, batch: int, in_dims: Sequence, needs: tuple, tensors: Sequence, outputs: Sequence, grads: Sequence
    ) -> tuple[tuple, tuple]:
        nt, no = len(tensors), len(outputs)

        def one(xs: list) -> tuple:
            return backward_call(self, needs, xs[:nt], xs[nt : nt + no], xs[nt + no :])

        return sequential(batch, in_dims, [*tensors, *outputs, *grads], one)

    def jvp_error(self) -> Exception:
        return fail(
            self.name,
            "forward-mode differentiation (torch.func.jvp, jacfwd, hessian) is not supported: Warp generates "
            "reverse-mode adjoints only. Use torch.func.vjp or jacrev",
        )


def _plain(xs: Sequence) -> list:
    """Tensors without the wrappers of transforms that have already exited.

    A ``vjp`` pullback (or a saved graph) used after its transform returns holds "dead"
    wrappers: they behave like tensors in PyTorch ops but expose no data pointer. Nothing
    below a Function's forward is transformed any more, so they can be peeled.
    """
    out = []
    for x in xs:
        while isinstance(x, torch.Tensor) and torch._C._functorch.is_functorch_wrapped_tensor(x):
            x = torch._C._functorch.get_unwrapped(x)
        out.append(x)
    return out


def sequential(batch: int, in_dims: Sequence, xs: Sequence, fn: Callable[[list], tuple]) -> tuple[tuple, tuple]:
    """Run ``fn`` once per batch element on the slices of ``xs`` and stack the results."""
    rows = [fn([x if d is None else x.select(d, b) for x, d in zip(xs, in_dims)]) for b in range(batch)]
    outs = tuple(torch.stack(col) for col in zip(*rows))
    return outs, (0,) * len(outs)


def call(op: Any, args: tuple, launch_dims: Any, output_dims: Any) -> Any:
    """A call of ``op`` while a torch.func transform is active: its :class:`OpRule` on the
    wrapped tensors."""
    op.sig.check_arity(args)
    rule = OpRule(op, args, launch_dims, output_dims)
    outs = _Forward.apply(rule, *[args[i] for i in op.sig.array_positions])
    return outs[0] if len(outs) == 1 else tuple(outs)


def backward_call(rule: Rule, needs: tuple, tensors: Sequence, outputs: Sequence, grads: Sequence) -> tuple:
    if active():
        return _Backward.apply(rule, needs, len(tensors), len(outputs), *tensors, *outputs, *grads)
    return tuple(rule.backward(needs, _plain(tensors), _plain(outputs), _plain(grads)))


class _Forward(torch.autograd.Function):
    @staticmethod
    def forward(rule: Rule, *tensors: torch.Tensor) -> tuple:
        return tuple(rule.forward(_plain(tensors)))

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        rule, *tensors = inputs
        ctx.rule = rule
        ctx.n_tensors = len(tensors)
        save_for_backward(ctx, rule.float_outputs, tensors, output, rule.save_outputs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        rule, n = ctx.rule, ctx.n_tensors
        needs = tuple(ctx.needs_input_grad[1:])
        if not any(needs):
            return (None,) * (1 + n)
        saved = ctx.saved_tensors
        dgrads = [g for g, f in zip(grads, rule.float_outputs) if f]
        got = iter(backward_call(rule, needs, saved[:n], saved[n:], dgrads))
        return (None, *[next(got) if need else None for need in needs])

    @staticmethod
    def vmap(info: Any, in_dims: tuple, rule: Rule, *tensors: torch.Tensor) -> tuple:
        return rule.vmap_forward(info.batch_size, in_dims[1:], tensors)

    @staticmethod
    def jvp(ctx: Any, *tangents: Any) -> Any:
        raise ctx.rule.jvp_error()


class _Backward(torch.autograd.Function):
    """The backward as a transformable operation: vmappable, not differentiable again."""

    @staticmethod
    def forward(rule: Rule, needs: tuple, nt: int, no: int, *xs: torch.Tensor) -> tuple:
        xs = _plain(xs)
        return tuple(rule.backward(needs, xs[:nt], xs[nt : nt + no], xs[nt + no :]))

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        ctx.rule = inputs[0]

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple:
        advice = getattr(getattr(ctx.rule, "op", None), "second_order_advice", "Differentiate once")
        raise fail(
            ctx.rule.name,
            "second-order gradients (grad of grad, hessian) are not supported: Warp's adjoint is not "
            f"differentiable again. {advice}",
        )

    @staticmethod
    def vmap(info: Any, in_dims: tuple, rule: Rule, needs: tuple, nt: int, no: int, *xs: torch.Tensor) -> tuple:
        dims = in_dims[4:]
        return rule.vmap_backward(
            info.batch_size,
            dims,
            needs,
            xs[:nt],
            xs[nt : nt + no],
            xs[nt + no :],
        )

    @staticmethod
    def jvp(ctx: Any, *tangents: Any) -> Any:
        raise ctx.rule.jvp_error()


# -- warpbridge.op ---------------------------------------------------------------------------


def _example_shape(t: torch.Tensor, d: int | None) -> tuple[int, ...]:
    shape = tuple(t.shape)
    return shape if d is None else shape[:d] + shape[d + 1 :]


class OpRule(Rule):
    """One call of a :class:`~warpbridge.WarpOp`, batched by the op's ``vmap_method``.

    ``"broadcast_all"`` and ``"expand_dims"`` fold the batch into the first dimension of the
    launch: batched arrays of per-example shape ``(n, ...)`` become ``(B * n, ...)``, one
    launch runs them all and the outputs are split back into ``(B, n, ...)``. That is right
    exactly when the kernel is elementwise over its first dimension, which the user declares
    by choosing the method. ``"broadcast_all"`` first expands unbatched arrays to the batch;
    ``"expand_dims"`` passes them unchanged, shared by every element (lookup tables,
    parameters not indexed by the thread), as Warp's ``jax_kernel`` does. The shape checks
    below catch what they can; in particular an unbatched array with the folded first
    dimension is refused under ``"expand_dims"``, since a kernel reading it per thread would
    read past its end. (``"broadcast_all"`` would give a shared table the right values but
    not per-element gradients: its adjoint adds every element's gradient into the first
    copy. Shared tables belong to ``"expand_dims"``, whose backward runs sequentially when
    they need a gradient.)
    """

    save_outputs = False

    def __init__(self, op: Any, args: Sequence[Any], launch_dims: Any, output_dims: Any):
        self.op, self.name = op, op.name
        self.args = list(args)
        for i in op.sig.array_positions:
            self.args[i] = None  # the tensors travel through the Functions, not in the rule
        self.ld, self.od = launch_dims, output_dims
        self.float_outputs = op.float_outputs
        self.save_outputs = op.saves_outputs  # a custom backward reads them: saved, not replayed

    def _args(self, tensors: Sequence[torch.Tensor]) -> list:
        args = list(self.args)
        for i, t in zip(self.op.sig.array_positions, tensors):
            args[i] = t
        return args

    def forward(self, tensors: Sequence[torch.Tensor]) -> tuple:
        if torch.compiler.is_compiling():  # traced: the registered op, which has a fake kernel
            out = registered_op.call(self.op, self._args(tensors), self.ld, self.od)
            return out if isinstance(out, tuple) else (out,)
        c, ts = eager.prepare_cached(self.op, self._args(tensors), self.ld, self.od)
        return tuple(eager.forward(c, ts))

    def backward(self, needs: tuple, tensors: Sequence, outputs: Sequence, grads: Sequence) -> tuple:
        c, ts = eager.prepare_cached(self.op, self._args(tensors), self.ld, self.od)
        it = iter(grads)
        full = [next(it) if f else None for f in self.float_outputs]
        got = eager.backward(c, ts, full, needs, outputs=outputs if self.save_outputs else None)
        return tuple(g if g is not None else torch.zeros_like(t) for g, t, n in zip(got, ts, needs) if n)

    def eager(self, tensors: Sequence[torch.Tensor]) -> tuple:
        out = self.op.call_all(*self._args(tensors), launch_dims=self.ld, output_dims=self.od)
        return out if isinstance(out, tuple) else (out,)

    # -- folding the batch into the launch --

    def _check_fold(self, method: str, in_dims: Sequence, tensors: Sequence) -> None:
        op = self.op
        ld, od = op.dims(self.ld, self.od)
        if ld is not None or od is not None:
            raise fail(
                op.name,
                f"vmap_method={method!r} folds the batch into the launch, so the launch and output dims must "
                "follow the first array argument, but this op sets launch_dims/output_dims. "
                "Use vmap_method='sequential'",
            )
        params = op.sig.array_inputs
        first = params[0].name
        if method == "expand_dims" and in_dims[0] is None:
            raise fail(
                op.name,
                f"vmap_method='expand_dims' folds the batch into the launch over the first array argument "
                f"'{first}', which is not batched here. Batch it, or use vmap_method='broadcast_all' or 'sequential'",
            )
        n = _example_shape(tensors[0], in_dims[0])[:1]
        for p, t, d in zip(params, tensors, in_dims):
            shape = _example_shape(t, d)
            if d is None and method == "expand_dims":
                if shape[:1] == n:
                    # Most likely read per thread: the folded launch would read past its end.
                    raise fail(
                        op.name,
                        f"vmap_method='expand_dims' shares the unbatched argument '{p.name}' across the batch, but it "
                        f"has the folded first dimension ({n[0]}), so a kernel that reads it per thread would read "
                        "past its end. Batch it, use vmap_method='broadcast_all' if the kernel reads it per thread, "
                        "or vmap_method='sequential'",
                    )
                continue
            if shape[:1] != n:
                which = "batched array argument" if method == "expand_dims" else "array argument"
                raise fail(
                    op.name,
                    f"vmap_method={method!r} needs every {which} to share the first dimension of '{first}' "
                    f"({n[0] if n else 'none'}), the one the batch is folded into; '{p.name}' has per-example "
                    f"shape {shape}. Use vmap_method='sequential'",
                )

    @staticmethod
    def _fold(batch: int, in_dims: Sequence, xs: Sequence, expand: bool) -> list:
        out = []
        for x, d in zip(xs, in_dims):
            if d is not None:
                x = x.movedim(d, 0)
            elif expand:
                x = x.expand(batch, *x.shape)
            else:
                out.append(x)
                continue
            out.append(x.reshape(batch * x.shape[1], *x.shape[2:]))
        return out

    @staticmethod
    def _unfold(batch: int, xs: Sequence) -> tuple[tuple, tuple]:
        outs = tuple(x.reshape(batch, x.shape[0] // batch, *x.shape[1:]) for x in xs)
        return outs, (0,) * len(outs)

    def vmap_forward(self, batch: int, in_dims: Sequence, tensors: Sequence) -> tuple[tuple, tuple]:
        method = self.op.vmap_method
        if method == "sequential" or batch == 0:
            return super().vmap_forward(batch, in_dims, tensors)
        self._check_fold(method, in_dims, tensors)
        return self._unfold(batch, self.call(self._fold(batch, in_dims, tensors, method == "broadcast_all")))

    def vmap_backward(
        self, batch: int, in_dims: Sequence, needs: tuple, tensors: Sequence, outputs: Sequence, grads: Sequence
    ) -> tuple[tuple, tuple]:
        method = self.op.vmap_method
        nt = len(tensors)
        tdims, gdims = in_dims[:nt], in_dims[nt + len(outputs) :]
        # expand_dims shares unbatched arrays across the batch: fine for their values, but
        # their gradient must be per element, which one folded launch would sum. jacrev
        # (batched cotangents, unbatched inputs) is the common case; it runs sequentially.
        fold = method == "broadcast_all" or (
            method == "expand_dims"
            and tdims[0] is not None
            and all(d is not None or not n for d, n in zip(tdims, needs))
        )
        if not fold or batch == 0:
            return super().vmap_backward(batch, in_dims, needs, tensors, outputs, grads)
        self._check_fold(method, tdims, tensors)
        ft = self._fold(batch, tdims, tensors, method == "broadcast_all")
        fg = self._fold(batch, gdims, grads, True)
        return self._unfold(batch, backward_call(self, needs, ft, (), fg))
