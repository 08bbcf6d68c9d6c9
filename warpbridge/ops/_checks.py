"""What every neighbour op checks before it runs: the point clouds' framework, shapes,
dtypes and devices, the batch vectors, and the numbers' ranges (in the float type the op
computes in)."""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

from .._core import op as _op
from .._core.errors import describe, fail

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
    return _cloud_metas(op, dict(zip(arrays, map(adapter.info, arrays.values()))), features)[0][0]


class Checked(NamedTuple):
    """A call of a row or aggregation op, checked (``checked``)."""

    adapter: Any
    dtype: str  #: the clouds' float type
    dim: int  #: coordinates per point
    batch: list  #: the batch vectors, or [] for one cloud
    numbers: list  #: the op's numeric arguments, checked


def checked(op: str, arrays: dict[str, Any], clouds: dict[str, Any], numbers: dict[str, Any]) -> Checked:
    """Every check of a call of ``op`` on the clouds ``arrays`` (the query points, the
    reference points, then any features, by the caller's names), their batch vectors
    ``clouds`` (query side, then reference side; see ``batches``) and its numeric arguments
    ``numbers`` (``k``, ``radius``, ``sigma``, in the op's order; checked in the float type
    the op computes in)."""
    features = list(arrays)[2] if len(arrays) == 3 else ""
    a = adapter_of(op, arrays, clouds, features)
    metas = dict(zip(arrays, map(a.info, arrays.values())))  # right after the backend: one hop there
    (dtype, (m, dim), _), *_ = _cloud_metas(op, metas, features)
    batch = batches(op, a, dict(list(arrays.items())[:2]), clouds)
    checked_numbers = [k_of(op, v, m) if name == "k" else positive(op, name, v, dtype) for name, v in numbers.items()]
    return Checked(a, dtype, dim, batch, checked_numbers)


def _cloud_metas(op: str, metas: dict[str, tuple], features: str) -> list:
    """``check_clouds``' checks of the arrays' (dtype, shape, device) ``metas``; the metas, in order."""
    most = MAX_ROWS_DIM if op in ROWS_OPS else MAX_DIM
    for name, (dtype, shape, _) in metas.items():
        if len(shape) != 2 or (name != features and not 1 <= shape[1] <= most):
            want = _wanted(name, features).rsplit(" ", 1)[0]
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
    return list(metas.values())


_FLOATS = ("float16", "bfloat16", "float32", "float64")
MAX_DIM = 16  # the most coordinates per point of a kd-tree op
MAX_ROWS_DIM = 4096  # the most for the ops with a brute-force path past MAX_DIM (_row_launches)
ROWS_OPS = ("knn", "knn_graph", "radius", "radius_graph", "knn_aggregate", "knn_interpolate")
HALF = ("float16", "bfloat16")  # computed in float32


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
