"""Check any warpbridge op the way PyTorch checks its own operators.

:func:`check_op` runs, on the inputs you give:

1. **gradients against finite differences**: for every floating-point input that takes a
   gradient, the op's vector-Jacobian product for a random output cotangent is compared with
   central finite differences of the same scalar, element by element;
2. **reentrancy**: three backwards through one retained graph give three times one gradient;
3. **nothing written**: inputs are unchanged after the forward and the backwards, and so is
   the incoming output gradient;
4. ``torch.library.opcheck`` on the registered op (schema, fake tensor, autograd registration,
   ``torch.compile``'s AOT dispatch).

Use float64 inputs where the kernel allows it: finite differences in float32 need loose
tolerances. An op whose gradient warpbridge refuses (rule 7) raises that
:class:`~warpbridge.WarpBridgeError` unchanged.
"""

from __future__ import annotations

from typing import Any

__all__ = ["check_op"]

_DEFAULTS = {  # dtype name: (finite-difference step, atol, rtol)
    "float64": (1e-6, 1e-5, 1e-4),
    "float32": (1e-3, 2e-2, 2e-2),
}


def check_op(
    op: Any,
    *inputs: Any,
    launch_dims: Any = None,
    output_dims: Any = None,
    eps: float | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    opcheck: bool = True,
    seed: int = 0,
) -> None:
    """Check ``op`` on ``inputs`` (PyTorch tensors and scalars); return None when all passes.

    Gradients are checked for the floating-point array inputs with ``requires_grad=True``, or
    for all of them when none has it. ``eps``/``atol``/``rtol`` default by dtype (float64:
    1e-6, 1e-5, 1e-4; float32: 1e-3, 2e-2, 2e-2).

    Raises:
        AssertionError: a check failed; the message names the check, the input and the
            largest error.
        WarpBridgeError: the op refuses gradients or rejects the inputs.
    """
    import torch

    from ._core.op import WarpOp

    if not isinstance(op, WarpOp):
        raise TypeError(f"check_op(): expected a warpbridge op, got {type(op).__name__}")
    op = op.instance(*inputs)  # a generic kernel: the instance these inputs run
    sig = op.sig
    kw = {"launch_dims": launch_dims, "output_dims": output_dims}
    args = list(inputs)
    op.sig.check_arity(args)
    chosen = _chosen_inputs(op, args)
    eps, atol, rtol = _tolerances(op.name, args, chosen, eps, atol, rtol)

    snapshot = {i: a.detach().clone() for i, a in enumerate(args) if isinstance(a, torch.Tensor)}

    def untouched(when: str) -> None:
        for i, before in snapshot.items():
            now = args[i].detach()
            same_nan = not now.is_floating_point() or torch.equal(now.isnan(), before.isnan())
            if not (same_nan and torch.equal(torch.nan_to_num(now), torch.nan_to_num(before))):
                raise AssertionError(f"check_op({op.name}): input '{sig.inputs[i].name}' was modified {when}")

    def outputs(a: list) -> tuple:
        out = op(*a, **kw)
        return out if isinstance(out, tuple) else (out,)

    outs = outputs(args)
    untouched("by the forward")
    gen = torch.Generator().manual_seed(seed)
    floats = [(j, o) for j, o in enumerate(outs) if o.is_floating_point()]
    if not floats:
        raise AssertionError(f"check_op({op.name}): the op has no floating-point output to differentiate")
    cot = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype) for _, o in floats]
    cot_before = [c.clone() for c in cot]
    xs = [args[p.position] for p in chosen]

    def scalar(a: list) -> torch.Tensor:
        o = outputs(a)
        return sum((o[j].double() * c.double()).sum() for (j, _), c in zip(floats, cot))

    # 1. the vector-Jacobian product against central finite differences
    grads = torch.autograd.grad([o for _, o in floats], xs, cot, retain_graph=True, allow_unused=True)
    for c, before in zip(cot, cot_before):
        if not torch.equal(c, before):
            raise AssertionError(f"check_op({op.name}): the incoming output gradient was modified by the backward")
    untouched("by the backward")
    for p, x, g in zip(chosen, xs, grads):
        _check_finite_differences(op.name, p, args, x, g, scalar, (eps, atol, rtol))
    # 2. each input differentiated alone gets the gradient it got with the others: a gradient
    # path must not depend on which other inputs require grad (a launch function's
    # wp.zeros_like(x) requires grad only when x does)
    if len(chosen) > 1:
        for p, g in zip(chosen, grads):
            _check_alone(op.name, p, args, g, outputs, [j for j, _ in floats], cot)
    # 3. reentrancy: a retained graph back-propagated three times gives exactly three times
    _check_reentrant(op.name, chosen, xs, grads, [o for _, o in floats], cot)
    untouched("by repeated backwards")
    # 4. torch.library.opcheck on the registered op
    if opcheck:
        from ._backends.torch import registered_op as _library

        torch.library.opcheck(op.torch_op, _library.schema_args(op, tuple(args), launch_dims, output_dims))


def _check_finite_differences(name: str, p: Any, args: list, x: Any, g: Any, scalar: Any, tol: tuple) -> None:
    """Input ``p``'s gradient ``g`` against central finite differences of ``scalar``."""
    import torch

    eps, atol, rtol = tol
    with torch.no_grad():
        g = torch.zeros_like(x) if g is None else g
        numeric = torch.zeros(x.shape, dtype=torch.float64)
        flat = numeric.view(-1)
        for k in range(x.numel()):
            a = list(args)
            xp, xm = x.detach().clone(), x.detach().clone()
            xp.view(-1)[k] += eps
            xm.view(-1)[k] -= eps
            a[p.position] = xp
            fp = scalar(a)
            a[p.position] = xm
            flat[k] = (fp - scalar(a)) / (2 * eps)
        err = (g.double() - numeric).abs()
        bound = atol + rtol * numeric.abs()
        if (err > bound).any():
            k = int(torch.argmax(err - bound))
            raise AssertionError(
                f"check_op({name}): gradient of input '{p.name}' disagrees with finite differences: "
                f"max error {float(err.max()):.3g} (at flat index {k}: op {float(g.reshape(-1)[k]):.6g}, "
                f"finite differences {float(flat[k]):.6g}; atol={atol}, rtol={rtol})"
            )


def _check_alone(name: str, p: Any, args: list, g: Any, outputs: Any, floats: list, cot: list) -> None:
    """Input ``p`` differentiated alone gets the gradient ``g`` it got with the others."""
    import torch

    alone = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    alone[p.position] = args[p.position].detach().clone().requires_grad_(True)
    o = outputs(alone)
    (g_alone,) = torch.autograd.grad([o[j] for j in floats], [alone[p.position]], cot, allow_unused=True)
    want = torch.zeros_like(alone[p.position]) if g is None else g
    got = torch.zeros_like(want) if g_alone is None else g_alone
    if not torch.allclose(got, want, rtol=1e-6, atol=1e-12):
        raise AssertionError(
            f"check_op({name}): the gradient of input '{p.name}' differentiated alone is "
            f"{float((got - want).abs().max()):.3g} off its gradient with the other inputs (a gradient "
            "path depends on which inputs require grad)"
        )


def _check_reentrant(name: str, chosen: list, xs: list, grads: tuple, outs: list, cot: list) -> None:
    """A retained graph back-propagated three times gives exactly three times the gradients."""
    import torch

    for x in xs:
        x.grad = None
    for _ in range(3):
        torch.autograd.backward(outs, cot, retain_graph=True)
    for p, x, g in zip(chosen, xs, grads):
        got = torch.zeros_like(x) if x.grad is None else x.grad
        want = 3 * (torch.zeros_like(x) if g is None else g)
        if not torch.allclose(got, want, rtol=1e-6, atol=1e-12):
            raise AssertionError(
                f"check_op({name}): three backwards through one graph gave {float((got - want).abs().max()):.3g} "
                f"off three times one gradient for input '{p.name}' (state survived a backward)"
            )
        x.grad = None


def _chosen_inputs(op: Any, args: list) -> list:
    """The floating array inputs whose gradients are checked (those that require grad, else
    all), each replaced in ``args`` by a fresh leaf."""
    import torch

    diff = [p for p in op.sig.array_inputs if p.differentiable and isinstance(args[p.position], torch.Tensor)]
    chosen = [p for p in diff if args[p.position].requires_grad] or diff
    if not chosen:
        raise AssertionError(f"check_op({op.name}): no floating-point array input to check gradients for")
    for p in chosen:
        args[p.position] = args[p.position].detach().clone().requires_grad_(True)
    return chosen


def _tolerances(name: str, args: list, chosen: list, eps: Any, atol: Any, rtol: Any) -> tuple:
    """(eps, atol, rtol): the given ones, the others by the inputs' dtype."""
    dtype_names = {str(args[p.position].dtype).removeprefix("torch.") for p in chosen}
    unsupported = dtype_names - set(_DEFAULTS)
    if unsupported:
        raise AssertionError(f"check_op({name}): finite differences need float32 or float64 inputs, got {unsupported}")
    d_eps, d_atol, d_rtol = _DEFAULTS["float32" if "float32" in dtype_names else "float64"]
    return eps or d_eps, atol or d_atol, rtol or d_rtol
