"""The neighbour ops' declared ops, per float type and dimension, and how a call reaches
one: float16/bfloat16 computed in float32 (``widen``), each op declared twice, with and without
batch vectors (``declare_both``), and ``run_declared``, the checks and the call in one."""

from __future__ import annotations

import functools
import threading
import types
from typing import Any

from .._core import op as _op
from .._core.errors import WarpBridgeError, fail
from .._core.launch_function import reads_only_inputs
from .._core.op import op as _declare
from . import _knn_launches, _launches, _list_launches, _row_launches, _sampling_launches
from ._checks import HALF, MAX_DIM, checked


def widen(op: str, adapter: Any, arrays: dict[str, Any], dtype: str, dim: int = 0) -> tuple[list, Any, str | None]:
    """The arrays, the ops for their float type and, for float16 and bfloat16, the dtype to
    return in: those are computed in float32 (distances, weights and sums would lose too much
    in 8 or 11 bits), through float32 copies made by ordinary framework casts, so gradients
    come back in the input dtype. The ops are those for the points' dimension (``dim``; 0:
    read from the first array)."""
    dim = dim or adapter.info(next(iter(arrays.values())))[1][1]
    if dtype not in HALF:
        return list(arrays.values()), ops_for(dtype, dim), None
    try:
        wide = [adapter.cast(v, "float32") for v in arrays.values()]
    except TypeError as e:
        raise fail(op, f"{dtype} inputs are computed in float32, but these arrays cannot be cast: {e}") from e
    return wide, ops_for("float32", dim), dtype


def declare_both(tag: str, specs: dict) -> types.SimpleNamespace:
    """Each op of ``specs`` (name: its launch function as ``fn``, and ``wb.op``'s options),
    declared twice: ``<name>_batched`` takes the batch vectors, ``<name>`` is the same op for
    one cloud, without them (so a call on one cloud passes nothing more than before). Each
    gets its own registered name per float type and dimension (``tag``:
    ``torch.ops.warpbridge.<...>knn_float64<...>``)."""
    ops = {}
    for name, spec in specs.items():
        options = dict(spec)
        fn, backward = options.pop("fn"), options.pop("backward", None)
        ops[f"{name}_batched"] = _declare(
            _named(fn, f"{name}_batched_{tag}"),
            backward=backward and _named(backward, f"{name}_batched_backward_{tag}"),
            **options,
        )
        options["output_dims"] = _launches.one_cloud(options["output_dims"], lambda first: (0,))
        ops[name] = _declare(
            _named(_launches.one_cloud(fn, _launches.no_batch), f"{name}_{tag}"),
            backward=backward and _named(_launches.one_cloud(backward, _launches.no_batch), f"{name}_backward_{tag}"),
            **options,
        )
    for declared in ops.values():
        declared.second_order_advice = SECOND_ORDER_ADVICE
    return types.SimpleNamespace(**ops)


SECOND_ORDER_ADVICE = (
    "For distances differentiable to any order (force matching, stress, Hessians), take the integer pairs "
    "(wb.ops.neighbor_list(..., quantities='ijS'), or the indices of knn/radius) and build the distances with "
    "your framework's operations; see docs/atomistic.md"
)


def _named(fn: Any, qualname: str) -> Any:
    """``fn`` as ``qualname``, marked as reading only its inputs (``reads_only_inputs``: every
    launch function here does, which the tests check for every op, forward and backward)."""
    fn.__qualname__ = qualname
    return reads_only_inputs(fn)


def _declarations(dtype: str, dim: int) -> dict:
    """Every point op's launch functions and options, for one float type and dimension."""
    modules = (_launches, _knn_launches, _list_launches, _sampling_launches)
    return {name: spec for m in modules for name, spec in m.declared(dtype, dim).items()}


# Declared at import (~45 ms for both), not on first use: a first call may come inside
# torch.compile, which cannot trace making an op.
with _op.deferred_init():
    _DECLARED: dict[str, Any] = {
        dtype: declare_both(
            dtype,
            _declarations(dtype, 3),
        )
        for dtype in ("float32", "float64")
    }


def ops_for(dtype: str, dim: int = 3) -> Any:
    """The ops for a float type and points of ``dim`` coordinates: 3-D ones declared at
    import, the others on first use (outside ``torch.compile``, which cannot trace making an
    op)."""
    if dim > MAX_DIM:
        return _rows(dtype)
    return _DECLARED[dtype] if dim == 3 else _other_dims(dtype, dim)


@functools.cache
def _rows(dtype: str) -> Any:
    """The brute-force ops over (M, D) rows, with the kd-tree ops' ``knn_graph_fill`` (it
    reads only indices). Declared on first use (outside ``torch.compile``)."""
    ops = declare_both(f"{dtype}_rows", _row_launches.declared(dtype))
    ops.knn_graph_fill = _DECLARED[dtype].knn_graph_fill
    ops.knn_graph_fill_batched = _DECLARED[dtype].knn_graph_fill_batched
    return ops


_OTHER_DIMS: dict[tuple[str, int], Any] = {}
_OTHER_DIMS_LOCK = threading.Lock()


def _other_dims(dtype: str, dim: int) -> Any:
    """The ops for ``dim``-D points, declared once: threads asking at once get the same ops
    (two declarations would register two ops under one name)."""
    found = _OTHER_DIMS.get((dtype, dim))
    if found is None:
        with _OTHER_DIMS_LOCK:
            found = _OTHER_DIMS.get((dtype, dim))
            if found is None:
                ops = _declarations(dtype, dim)
                found = _OTHER_DIMS[(dtype, dim)] = declare_both(f"{dtype}_{dim}d", ops)
    return found


def run_declared(op: str, arrays: dict[str, Any], clouds: dict[str, Any], **numbers: Any) -> Any:
    """Validate the clouds ``arrays`` (the query points, the reference points, then any
    features, by the caller's names) and their batch vectors ``clouds`` (query side, then
    reference side; see ``batches``), then the op's numeric arguments ``numbers`` (``k``,
    ``radius``, ``sigma``, in the op's order; checked in the dtype the op computes in), and
    run the declared op ``op``. Its floating results are cast back to float16/bfloat16 where
    the clouds came in one of those."""
    a, dtype, dim, batch, extra = checked(op, arrays, clouds, numbers)
    args, ops, half = widen(op, a, arrays, dtype, dim)
    result = declared_op(ops, op, batch)(*args, *batch, *extra)
    if half is None:
        return result
    if isinstance(result, tuple):  # knn's (dist, idx, count)
        return (a.cast(result[0], half), *result[1:])
    return a.cast(result, half)


def size_on_host(op: str, a: Any, values: Any, at_most: int, refuse: Any, what: str, instead: str = "") -> int:
    """``values[-1]``, a result's size, read on the host (under ``torch.compile``, a symbolic
    size); ``refuse(value)`` is raised above ``at_most``. Under a tracer that cannot read
    values (``jax.jit``), an error saying ``what`` depends on the data, and ``instead``."""
    try:
        return a.int_at(values, -1, at_most, refuse)
    except WarpBridgeError:
        raise
    except Exception as e:  # a tracer: the size of the result depends on the data
        raise fail(op, f"{what} depends on the data and cannot be read while tracing{instead}: {e}") from e


def declared_op(ops: Any, op: str, batch: list) -> Any:
    """The declared op ``op``: its batched variant where there are batch vectors."""
    return getattr(ops, f"{op}_batched" if batch else op)
