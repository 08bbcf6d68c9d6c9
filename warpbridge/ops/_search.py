"""The neighbour searches and aggregations (``knn``, ``knn_aggregate``, ``radius_aggregate``),
and what every neighbour op checks before it runs and how it reaches its declared op: the
point clouds' shapes, dtypes and devices, the numbers' ranges, float16/bfloat16 computed in
float32."""

from __future__ import annotations

import functools
import math
import numbers
import threading
import types
from typing import Any

from .._core import op as _op
from .._core.errors import WarpBridgeError, describe, fail
from .._core.launch_function import reads_only_inputs
from .._core.op import op as _declare
from . import _declared, _declared_knn, _declared_lists, _declared_rows, _declared_sampling

_WANT = {
    "query": "(M, D) points",
    "ref": "(N, D) points",
    "x": "(N, D) points",
    "pos_x": "(N, D) points",
    "pos": "(N, D) points",
}
_WANT |= {"pos_y": "(M, D) points", "features": "(N, F) features", "positions": "(N, 3) positions"}
_WANT |= {name: "int64 cloud numbers" for name in ("query_batch", "ref_batch", "batch", "batch_x", "batch_y")}
_FEATURE_WORDS = "(N, F) features"


def adapter_of(op: str, arrays: dict[str, Any], batches: dict[str, Any] | None = None, features: str = "") -> Any:
    """The backend of ``arrays`` and of the batch vectors given in ``batches`` (None: not
    given), all from one framework; ``features``: the name of the feature rows among
    ``arrays``, if any."""
    named = {**arrays, **{name: b for name, b in (batches or {}).items() if b is not None}}
    return _op.backend_of(op, [(name, a, _wanted(name, features)) for name, a in named.items()])


def _wanted(name: str, features: str) -> str:
    return _FEATURE_WORDS if name == features else _WANT[name]


def check_clouds(op: str, adapter: Any, arrays: dict[str, Any], features: str = "") -> str:
    """Shapes (.., D) for points, D from 1 to MAX_DIM and the same for all, (N, F) features
    (the array named ``features``, one row per point of the second cloud), one float dtype,
    one device; the dtype. ``arrays``: the query points, the reference points (or one
    cloud), then any features, by the caller's names."""
    metas = {name: adapter.info(a) for name, a in arrays.items()}
    most = MAX_ROWS_DIM if op in ROWS_OPS else MAX_DIM
    for name, (dtype, shape, _) in metas.items():
        want = _wanted(name, features).rsplit(" ", 1)[0]
        if len(shape) != 2 or (name != features and not 1 <= shape[1] <= most):
            more = (
                ""
                if op in ROWS_OPS or len(shape) != 2
                else f" (knn, knn_graph, radius, radius_graph, knn_aggregate and knn_interpolate take up to {MAX_ROWS_DIM})"
            )
            raise fail(op, f"'{name}' must have shape {want} with 1 <= D <= {most}, got {shape}{more}")
        if dtype not in _FLOATS:
            raise fail(op, f"'{name}' must be float16, bfloat16, float32 or float64, got {dtype}")
    first, (qd, qshape, qdev) = next(iter(metas.items()))
    for name, (dtype, shape, dev) in metas.items():
        if name != features and shape[1] != qshape[1]:
            raise fail(op, f"'{name}' has {shape[1]} coordinates per point but '{first}' has {qshape[1]}")
        if dtype != qd:
            raise fail(op, f"'{name}' has dtype {dtype} but '{first}' has {qd}: all inputs must share one dtype")
        if dev != qdev:
            raise fail(op, f"'{name}' is on {dev} but '{first}' is on {qdev}: all inputs must be on one device")
    if features:
        ref = list(metas)[1]
        if metas[features][1][0] != metas[ref][1][0]:
            raise fail(
                op,
                f"'{features}' must have one row per reference point: '{ref}' has {metas[ref][1][0]} points, "
                f"'{features}' has shape {metas[features][1]}",
            )
    return qd


_FLOATS = ("float16", "bfloat16", "float32", "float64")
MAX_DIM = 16  # the most coordinates per point of a kd-tree op
MAX_ROWS_DIM = 4096  # the most for the ops with a brute-force path past MAX_DIM (_declared_rows)
ROWS_OPS = ("knn", "knn_graph", "radius", "radius_graph", "knn_aggregate", "knn_interpolate")
_HALF = ("float16", "bfloat16")


def widen(op: str, adapter: Any, arrays: dict[str, Any], dtype: str) -> tuple[list, Any, str | None]:
    """The arrays, the ops for their float type and, for float16 and bfloat16, the dtype to
    return in: those are computed in float32 (distances, weights and sums would lose too much
    in 8 or 11 bits), through float32 copies made by ordinary framework casts, so gradients
    come back in the input dtype. The ops are those for the points' dimension."""
    dim = adapter.info(next(iter(arrays.values())))[1][1]
    if dtype not in _HALF:
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
        options["output_dims"] = _declared.one_cloud(options["output_dims"], lambda first: (0,))
        ops[name] = _declare(
            _named(_declared.one_cloud(fn, _declared.no_batch), f"{name}_{tag}"),
            backward=backward and _named(_declared.one_cloud(backward, _declared.no_batch), f"{name}_backward_{tag}"),
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
    modules = (_declared, _declared_knn, _declared_lists, _declared_sampling)
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
    ops = declare_both(f"{dtype}_rows", _declared_rows.declared(dtype))
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


# float32 rounds a double at or below this to 0, and one at or above _FLOAT32_INF to inf
# (both ties to even); comparisons, unlike a struct round trip, trace under torch.compile.
_FLOAT32_ZERO = 2.0**-150
_FLOAT32_INF = float(2**128 - 2**103)


def positive(op: str, name: str, value: Any, dtype: str) -> float:
    """A positive, finite number that stays so in the float type the op computes in (float32
    for float16/bfloat16/float32 inputs): ``sigma=1e-50`` is 0 in float32, and every weight NaN."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise fail(op, f"'{name}' must be a positive Python number, got {describe(value)}")
    v = float(value)
    if not 0 < v < math.inf:  # comparisons, not math.isfinite, trace with a symbolic float
        raise fail(op, f"'{name}' must be positive and finite, got {v!r}")
    if dtype != "float64" and not _FLOAT32_ZERO < v < _FLOAT32_INF:
        raise fail(
            op,
            f"'{name}' = {v!r} is {'0' if v <= _FLOAT32_ZERO else 'inf'} in float32, which {dtype} inputs are computed "
            f"in (its positive values run from 1.4e-45 to 3.4e+38): pass a {name} in that range, or float64 "
            "inputs",
        )
    return v


def k_of(op: str, k: Any, m: int) -> int:
    """A neighbour count ``k >= 1`` whose (M, k) results fit one array's 32-bit places; more
    than a cloud has pads its rows (see ``knn``'s ``count``)."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise fail(op, f"'k' must be an int, got {describe(k)}")
    if k < 1:
        raise fail(op, f"'k' must be at least 1, got {int(k)}")
    if m * k > MAX_ENTRIES:
        raise fail(op, f"M * k = {m * int(k):,} results, more than one array holds ({MAX_ENTRIES:,}, 32-bit places)")
    return int(k)


MAX_ENTRIES = (1 << 31) - 1  # the most (M, k) results: the kernels address them with 32-bit places


def batches(op: str, a: Any, points: dict[str, Any], given: dict[str, Any]) -> list:
    """The batch vectors ``given`` (name: array or None), each over the cloud of the same
    place in ``points``, checked: int64, one per point, on the points' device; all or none
    (then an empty list: one cloud). Their values are checked where they are read
    (``_batches.batch_values``)."""
    names = list(given)
    present = [name for name in names if given[name] is not None]
    if not present:
        return []
    if len(present) != len(names):
        missing = [name for name in names if name not in present]
        raise fail(op, f"pass {' and '.join(repr(n) for n in names)} together (or neither): '{missing[0]}' is missing")
    for (name, b), (cloud, p) in zip(given.items(), points.items()):
        dtype, shape, where = a.info(b)
        _, (n, *_), there = a.info(p)
        if dtype != "int64" or shape != (n,):
            raise fail(
                op,
                f"'{name}' must be an int64 ({n},) vector, one cloud number per point of '{cloud}', got {dtype} {shape}",
            )
        if where != there:
            raise fail(op, f"'{name}' is on {where} but '{cloud}' is on {there}: all inputs must be on one device")
    return [given[name] for name in names]


def run_declared(op: str, arrays: dict[str, Any], clouds: dict[str, Any], **numbers: Any) -> Any:
    """Validate the clouds ``arrays`` (the query points, the reference points, then any
    features, by the caller's names) and their batch vectors ``clouds`` (query side, then
    reference side; see ``batches``), then the op's numeric arguments ``numbers`` (``k``,
    ``radius``, ``sigma``, in the op's order; checked in the dtype the op computes in), and
    run the declared op ``op``. Its floating results are cast back to float16/bfloat16 where
    the clouds came in one of those."""
    features = list(arrays)[2] if len(arrays) == 3 else ""
    a = adapter_of(op, arrays, clouds, features)
    dtype = check_clouds(op, a, arrays, features)
    points = dict(list(arrays.items())[:2])
    batch = batches(op, a, points, clouds)
    m = a.info(next(iter(arrays.values())))[1][0]
    extra = [k_of(op, value, m) if name == "k" else positive(op, name, value, dtype) for name, value in numbers.items()]
    args, ops, half = widen(op, a, arrays, dtype)
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


def radius_aggregate(
    query: Any, ref: Any, features: Any, radius: float, sigma: float, *, query_batch: Any = None, ref_batch: Any = None
) -> Any:
    """Distance-weighted mean of the reference features within ``radius`` of each query point.

    ``out_i = sum_j w_ij f_j / sum_j w_ij`` over the references with ``|q_i - r_j| <= radius``,
    ``w_ij = exp(-|q_i - r_j| / sigma)``; rows with no neighbour are 0. The exponent is shifted
    by the nearest neighbour's distance, so any ``radius / sigma`` gives the weighted mean.
    Differentiable w.r.t. ``query``, ``ref`` and ``features`` (the radius cut-off itself is
    treated as fixed, as in the dense formula); where a query coincides with a reference the
    direction term is taken as 0.

    Args:
        query: (M, D) query points, D from 1 to 16 (3-D is the fastest path).
        ref: (N, D) reference points, same D.
        features: (N, F) reference features, same dtype and device.
        radius: search radius, > 0.
        sigma: distance scale of the weights, > 0.
        query_batch, ref_batch: (M,) and (N,) int64 cloud numbers, sorted (PyG's batch
            vectors): each query sees only the references of its own cloud. None (default):
            one cloud. See ``docs/batches.md``.

    Returns:
        (M, F) aggregated features.

    Raises:
        WarpBridgeError: wrong types, shapes, dtypes or devices; radius or sigma not > 0.

    Example::

        out = wb.ops.radius_aggregate(grid, cloud, feats, radius=0.2, sigma=0.1)
    """
    clouds = {"query": query, "ref": ref, "features": features}
    batch = {"query_batch": query_batch, "ref_batch": ref_batch}
    return run_declared("radius_aggregate", clouds, batch, radius=radius, sigma=sigma)
