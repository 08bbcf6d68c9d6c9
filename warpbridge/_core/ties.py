"""Ties in ``wp.atomic_max`` / ``wp.atomic_min`` reductions into a kernel's output.

Warp's adjoint of ``atomic_max(y, i, v)`` adds ``y``'s whole gradient to every ``v`` equal to
the final ``y[i]``: with ties (ReLU zeros, duplicated points) the gradients sum to a multiple
of the true one, which is no subgradient of the maximum. warpbridge shares it evenly between
the tied values, as ``torch.amax`` does: before the adjoint runs, a counting kernel derived
from the op's own kernel counts, for each element of the output, the calls whose value
equals it, and the output's gradient (a private copy) is divided by that count.

The counting kernel is the op's kernel with each such call replaced by one that counts a tie
(``tie_kernels.count_tie_<n>``) and the counts as extra parameters; it is generated once per
kernel from the kernel's source, registered with ``linecache`` so that Warp can read it.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import linecache
import math
import threading
from collections.abc import Sequence
from typing import Any

import warp as wp

from . import tie_kernels
from .warp_runtime import LOAD_LOCK, on_stream

EXTREMA = ("atomic_max", "atomic_min")


def extrema(tree: ast.AST, outputs: dict[str, int]) -> tuple[str, ...]:
    """The outputs (of ``outputs``: name -> rank, floating scalars) that the kernel reduces
    into with ``wp.atomic_max`` or ``wp.atomic_min``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node) in EXTREMA and node.args:
            target = node.args[0]
            if isinstance(target, ast.Name) and target.id in outputs and target.id not in found:
                found.append(target.id)
    return tuple(found)


def _name(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


class _CountTies(ast.NodeTransformer):
    """``wp.atomic_max(y, i, j, v)`` -> ``__wb_count_tie_2(__wb_ties_y, y, i, j, v)``."""

    def __init__(self, names: Sequence[str]):
        self.names = set(names)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        target = node.args[0] if node.args else None
        if _name(node) in EXTREMA and isinstance(target, ast.Name) and target.id in self.names:
            func = ast.Name(id=f"__wb_count_tie_{len(node.args) - 2}", ctx=ast.Load())
            counts = ast.Name(id=f"__wb_ties_{target.id}", ctx=ast.Load())
            return ast.copy_location(ast.Call(func=func, args=[counts, *node.args], keywords=[]), node)
        return node


_KERNELS: dict = {}
_LOCK = threading.Lock()


def counting_kernel(kernel: Any, names: Sequence[str], ndims: Sequence[int]) -> Any:
    """``kernel`` with its extrema into ``names`` counting ties into extra int32 arrays (one
    per name, of rank ``ndims``), made once per kernel."""
    key = (kernel.module.name, kernel.key, kernel.adj.source, tuple(names))
    with _LOCK:
        found = _KERNELS.get(key)
        if found is None:
            found = _KERNELS[key] = _generate(kernel, names, ndims)
    return found


def _generate(kernel: Any, names: Sequence[str], ndims: Sequence[int]) -> Any:
    tree = ast.parse(kernel.adj.source)
    fn = tree.body[0]
    fn.decorator_list = []
    fn.name = f"{kernel.func.__name__}__counting_ties"
    for name, ndim in zip(names, ndims):
        annotation = ast.parse(f"__wb_wp.array(dtype=__wb_wp.int32, ndim={ndim})", mode="eval").body
        fn.args.args.append(ast.arg(arg=f"__wb_ties_{name}", annotation=annotation))
    _CountTies(names).visit(fn)
    ast.fix_missing_locations(tree)
    source = ast.unparse(tree) + "\n"
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    filename = f"<warpbridge counting ties of {kernel.key} {digest}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # Warp reads the source
    namespace = dict(kernel.func.__globals__)
    namespace.update(inspect.getclosurevars(kernel.func).nonlocals)
    namespace.update({f"__wb_count_tie_{n}": getattr(tie_kernels, f"count_tie_{n}") for n in range(1, 5)})
    namespace.update(__wb_wp=wp, __name__="warpbridge_counting_ties")
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - the op's own kernel, transformed
    return wp.kernel(namespace[fn.name], enable_backward=False, module="unique")


def share(plan: Any, ins: Sequence[int], scalars: Sequence[Any], out_ptrs: Sequence[int], out_grads: list, stream: Any):
    """Divide each extremum output's gradient (``out_grads``: private contiguous copies, as
    (pointer, strides)) by how many calls tie for each of its elements. ``out_ptrs``: the
    forward's outputs, where the adjoint reads them (every extremum output is among them)."""
    sig, device = plan.sig, plan.device
    positions = [j for j, p in enumerate(sig.outputs) if p.name in sig.extrema]
    names = [sig.outputs[j].name for j in positions]
    kernel = counting_kernel(sig.kernel, names, [sig.outputs[j].ndim for j in positions])
    scratch = [
        None if out_ptrs[j] else wp.zeros(s, dtype=p.wp_type.dtype, device=device)
        for j, (p, s) in enumerate(zip(sig.outputs, plan.out_shapes))
    ]  # the outputs the adjoint does not read: what the counting kernel writes there is dropped
    outs = [ptr or scratch[j].ptr for j, ptr in enumerate(out_ptrs)]
    counts = [wp.zeros(plan.out_shapes[j], dtype=wp.int32, device=device) for j in positions]
    with on_stream(stream), LOAD_LOCK:
        wp.launch(
            kernel, dim=plan.warp_dims, inputs=plan.launch_values(ins, scalars, outs) + counts,
            device=device, block_dim=plan.warp_block_dim,
        )  # fmt: skip
    for j, c in zip(positions, counts):
        p, size = sig.outputs[j], math.prod(plan.out_shapes[j])
        grad = wp.array(ptr=out_grads[j][0], dtype=p.wp_type.dtype, shape=(size,), device=device)
        wp.launch(tie_kernels.share_between_ties, dim=size, inputs=[grad, c.flatten()], device=device, stream=stream)
