"""Every Warp builtin that takes floating arguments: its generated adjoint against central
finite differences, parameter by parameter, at random points away from kinks.

One case per builtin overload, in float64 where Warp's code generator takes it, else in
float32. Each case is a generated kernel (Warp reads a kernel's source, so they are written
to a file) that builds the arguments from a row of an input array, calls the builtin and
writes every component of its result (or of each member of a returned tuple) into a row of
an output array. Cases whose code does not generate, or whose C++ does not compile, are left
out with the reason; the rest compile as one module.

A parameter's verdict: ``right`` (the adjoint matches finite differences, within their own
noise, measured by comparing two step sizes), ``lost`` (the adjoint is zero where the
derivative is not), ``wrong`` (it is neither), ``constant`` (both zero: rounding, signs).
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from typing import Any, NamedTuple

import numpy as np
import warp as wp

from warpbridge._core import warp_runtime

COMPONENTS = {
    "vec2": 2, "vec3": 3, "vec4": 4, "mat22": 4, "mat33": 9, "mat44": 16, "quat": 4, "spatial_vector": 6,
    "spatial_matrix": 36, "transform": 7,
}  # fmt: skip
NOT_FLOAT = ("int32", "uint32", "bool")
SLOT = 40  # output columns per member of a result (a spatial matrix has 36 components)
ARITIES = (1, 2, 3)  # results that are tuples of this many members are unpacked


class Case(NamedTuple):
    builtin: str
    types: tuple[str, ...]  # a concrete type name per parameter
    params: tuple[str, ...]  # the parameter names
    precision: str  # "d" (float64) or "f" (float32)
    overload: Any  # Warp's Function for this overload


class Verdict(NamedTuple):
    case: Case
    params: dict[str, str]  # floating parameter -> "right" / "lost" / "wrong" / "constant"
    error: float  # the largest relative error of the adjoint against finite differences
    floating_result: bool  # False: the result is an integer or a bool (nothing is written)

    @property
    def bad(self) -> frozenset[str]:
        return frozenset(p for p, v in self.params.items() if v in ("lost", "wrong"))


def _concrete(t: Any, p: str) -> str | None:
    """A concrete type name of precision ``p`` ("d" or "f") for a builtin parameter type, or
    None where the sweep cannot make a value of it (arrays, tiles, handles, callables)."""
    scalar = {"d": wp.float64, "f": wp.float32}[p]
    if t is scalar or (p == "f" and t is float) or repr(t) in ("~Float", "~Scalar"):
        return str(scalar.__name__)
    if t in (wp.int32, int) or repr(t) == "~Int":
        return "int32"
    if t is wp.uint32:
        return "uint32"
    if t in (wp.bool, bool):
        return "bool"
    if t is Any:
        return f"vec3{p}"
    kind = getattr(t, "_wp_generic_type_str_", "")
    element = getattr(t, "_wp_scalar_type_", None)
    if not kind or (element is not None and repr(element) not in ("~Float", "~Scalar") and element is not scalar):
        return None
    shape = tuple(getattr(t, "_shape_", ()) or ())
    if kind == "vec_t":
        n = shape[0] if shape and isinstance(shape[0], int) and shape[0] > 0 else 3
        return {2: f"vec2{p}", 3: f"vec3{p}", 4: f"vec4{p}", 6: f"spatial_vector{p}"}.get(n)
    if kind == "mat_t":
        if shape and all(isinstance(s, int) and s > 0 for s in shape):
            return {(2, 2): f"mat22{p}", (3, 3): f"mat33{p}", (4, 4): f"mat44{p}", (6, 6): f"spatial_matrix{p}"}.get(
                shape
            )
        return f"mat33{p}"
    return {"quat_t": f"quat{p}", "transform_t": f"transform{p}"}.get(kind)


def cases() -> list[Case]:
    """One case per builtin overload with a floating parameter, in both precisions, float64
    first (the sweep keeps float32 only where float64 does not generate)."""
    found: dict[tuple, Case] = {}
    for name, f in sorted(warp_runtime.builtin_functions().items()):
        for o in getattr(f, "overloads", None) or [f]:
            if "dtype" in o.input_types:  # a type argument (casts, identities): not a value
                continue
            for p in ("d", "f"):
                types = tuple(_concrete(t, p) for t in o.input_types.values())
                if not types or None in types or all(t in NOT_FLOAT for t in types):
                    continue
                found.setdefault((name, types), Case(name, types, tuple(o.input_types), p, o))
    return sorted(found.values(), key=lambda c: c.precision != "d")


def components(type_name: str) -> int:
    if type_name in NOT_FLOAT:
        return 0
    return 1 if type_name.startswith("float") else COMPONENTS[type_name[:-1]]


def _argument(type_name: str, first: int) -> str:
    """Source building one argument from columns ``first``... of row ``b`` of ``x``."""
    fixed = {"int32": "int(1)", "uint32": "wp.uint32(7)", "bool": "True"}
    if type_name in fixed:
        return fixed[type_name]
    cols = [f"x[b, {first + k}]" for k in range(components(type_name))]
    p = type_name[-1]
    if type_name.startswith("float"):
        return f"wp.{type_name}({cols[0]})"
    if type_name.startswith("transform"):
        return f"wp.transform{p}(wp.vec3{p}({', '.join(cols[:3])}), wp.quat{p}({', '.join(cols[3:])}))"
    return f"wp.{type_name}({', '.join(cols)})"


def _emit_source() -> str:
    """Overloads of ``emit(r, y, b, o)``: every component of ``r`` into row ``b`` of ``y`` from
    column ``o``; nothing for integer results."""
    head = "@wp.func\ndef emit(r: wp.{t}, y: wp.array2d(dtype=wp.float64), b: int, o: int):\n"
    out = [head.format(t=t) + "    y[b, o] = wp.float64(r)\n" for t in ("float64", "float32")]
    out += [head.format(t=t) + "    pass\n" for t in NOT_FLOAT]
    for base, n in COMPONENTS.items():
        for p in "df":
            if base == "transform":
                body = "    v = wp.transform_get_translation(r)\n    q = wp.transform_get_rotation(r)\n"
                body += "".join(f"    y[b, o + {k}] = wp.float64(v[{k}])\n" for k in range(3))
                body += "".join(f"    y[b, o + {3 + k}] = wp.float64(q[{k}])\n" for k in range(4))
            elif base.startswith(("mat", "spatial_matrix")):
                side = round(n**0.5)
                body = "".join(
                    f"    y[b, o + {i * side + j}] = wp.float64(r[{i}, {j}])\n"
                    for i in range(side)
                    for j in range(side)
                )
            else:
                body = "".join(f"    y[b, o + {k}] = wp.float64(r[{k}])\n" for k in range(n))
            out.append(head.format(t=f"{base}{p}") + body)
    return "\n\n".join(out)


SYMMETRIC = {"eig3"}  # builtins defined for symmetric matrices: their argument is M + M^T


def kernel_source(k: int, case: Case, arity: int) -> str:
    """Case ``k``'s kernel, its result unpacked into ``arity`` members."""
    args, first = [], 0
    for t in case.types:
        arg = _argument(t, first)
        args.append(f"({arg} + wp.transpose({arg}))" if case.builtin in SYMMETRIC and t.startswith("mat") else arg)
        first += components(t)
    members = [f"r{m}" for m in range(arity)]
    emits = "".join(f"    emit({r}, y, b, {m * SLOT})\n" for m, r in enumerate(members))
    scalar = "wp.float64" if case.precision == "d" else "wp.float32"
    return (
        f"@wp.kernel\ndef case_{k}(x: wp.array2d(dtype={scalar}), y: wp.array2d(dtype=wp.float64)):\n"
        f"    b = wp.tid()\n    {', '.join(members)} = wp.{case.builtin}({', '.join(args)})\n{emits}"
    )


def _module(path: str, name: str, sources: list[str]) -> Any:
    with open(path, "w") as f:
        f.write("import warp as wp\n\n\n" + _emit_source() + "\n\n\n" + "\n\n".join(sources))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class Built(NamedTuple):
    module: Any
    cases: dict[int, Case]  # kernel index -> case
    left_out: dict[tuple, str]  # (builtin, types) -> why


def build(workdir: str) -> Built:
    """The module of every case whose code generates and compiles, one precision per
    (builtin, parameter pattern): float64 where it generates."""
    everything = cases()
    arities = {}
    for arity in ARITIES:  # the first unpacking of the result that generates
        staging = _module(
            os.path.join(workdir, f"staging_{arity}.py"),
            f"warpbridge_sweep_staging_{arity}",
            [kernel_source(k, c, arity) for k, c in enumerate(everything)],
        )
        for k in range(len(everything)):
            if k not in arities and warp_runtime.codegen_error(getattr(staging, f"case_{k}")) is None:
                arities[k] = arity
    kept, left_out, done = {}, {}, set()
    for k, c in enumerate(everything):  # float64 first: cases() lists both precisions per overload
        pattern = (c.builtin, tuple(_without_precision(t) for t in c.types))
        if pattern in done:
            continue
        if k in arities:
            kept[k] = c
            done.add(pattern)
        elif c.precision == "f":
            left_out[(c.builtin, c.types)] = "its code does not generate"
    for attempt in range(4):
        name = f"warpbridge_sweep_cases_{attempt}"
        sources = [kernel_source(k, c, arities[k]) for k, c in kept.items()]
        module = _module(os.path.join(workdir, f"{name}.py"), name, sources)
        failing = _compile_failures(module, workdir)
        if not failing:
            return Built(module, {k: kept[k] for k in kept}, left_out)
        for k in failing:
            c = kept.pop(k)
            left_out[(c.builtin, c.types)] = "Warp's C++ for this overload does not compile"
    raise RuntimeError("the sweep's cases still do not compile after dropping the failing ones")


def _without_precision(type_name: str) -> str:
    if type_name in NOT_FLOAT:
        return type_name
    return "float" if type_name.startswith("float") else type_name[:-1]


def _compile_failures(module: Any, workdir: str) -> set[int]:
    """Load ``module`` on the CPU; the cases whose C++ the compiler refused (empty: loaded)."""
    log = os.path.join(workdir, "compile.log")
    saved = os.dup(2)
    with open(log, "w") as f:
        os.dup2(f.fileno(), 2)  # the compiler's messages name the failing kernels
        try:
            wp.load_module(module, device="cpu")
            return set()
        except Exception:
            pass
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    with open(log) as f:
        text = f.read()
    failing = set()
    for path, line in set(re.findall(r"(\S+\.cpp):(\d+):\d+: error", text)):
        with open(path) as f:
            before = f.read().splitlines()[: int(line)]
        for src in reversed(before):
            m = re.match(r"static (?:CUDA_CALLABLE )?void case_(\d+)_[0-9a-f]+_cpu_kernel_", src)
            if m:
                failing.add(int(m.group(1)))
                break
    if not failing:
        raise RuntimeError(f"the sweep's module does not compile, and no case is to blame:\n{text[-3000:]}")
    return failing


def _outputs(kernel: Any, rows: np.ndarray, precision: str) -> np.ndarray:
    x = wp.array(rows, dtype=wp.float64 if precision == "d" else wp.float32)
    y = wp.zeros((len(rows), SLOT * max(ARITIES)), dtype=wp.float64)
    wp.launch(kernel, dim=len(rows), inputs=[x], outputs=[y])
    return y.numpy()


def _finite_differences(kernel: Any, base: np.ndarray, eps: float, precision: str) -> np.ndarray:
    """The Jacobian (outputs x inputs) by central differences of step ``eps``."""
    n = len(base)
    rows = np.tile(base, (2 * n, 1))
    for j in range(n):
        rows[2 * j, j] += eps
        rows[2 * j + 1, j] -= eps
    out = _outputs(kernel, rows.astype(np.float64 if precision == "d" else np.float32), precision)
    return np.stack([(out[2 * j] - out[2 * j + 1]) / (2 * eps) for j in range(n)], axis=1)


POINTS = 3  # random points per case: a parameter's derivative may vanish at one (max, mod)


def check(kernel: Any, case: Case, seed: int) -> Verdict:
    """The verdict on each floating parameter of ``case``'s adjoint: the worst over ``POINTS``
    random points ("lost" or "wrong" at any point; "right" at some; else "constant")."""
    found = [_check_at(kernel, case, seed * POINTS + k) for k in range(POINTS)]
    rank = {"constant": 0, "right": 1, "wrong": 2, "lost": 3}
    params = {name: max((v.params[name] for v in found), key=rank.__getitem__) for name in found[0].params}
    return Verdict(case, params, max(v.error for v in found), any(v.floating_result for v in found))


def _check_at(kernel: Any, case: Case, seed: int) -> Verdict:
    rng = np.random.default_rng(seed)
    n = sum(components(t) for t in case.types)
    base = rng.uniform(0.2, 0.9, n)
    dtype = np.float64 if case.precision == "d" else np.float32
    eps = 1e-6 if case.precision == "d" else 1e-2
    w = rng.uniform(-1.0, 1.0, SLOT * max(ARITIES))
    want = _finite_differences(kernel, base, eps, case.precision).T @ w
    noise = np.abs(want - _finite_differences(kernel, base, 4 * eps, case.precision).T @ w)
    x = wp.array(
        base[None].astype(dtype), dtype=wp.float64 if case.precision == "d" else wp.float32, requires_grad=True
    )
    y = wp.zeros((1, len(w)), dtype=wp.float64, requires_grad=True)
    tape = wp.Tape()
    with tape:
        wp.launch(kernel, dim=1, inputs=[x], outputs=[y])
    tape.backward(grads={y: wp.array(w[None], dtype=wp.float64)})
    adj = x.grad.numpy()[0].astype(np.float64)
    scale = max(float(np.abs(want).max()), 1e-12)
    result = y.numpy()[0]
    single = np.array_equal(result, result.astype(np.float32))  # a result rounded to float32 (a cast)
    tol = 1e-6 if case.precision == "d" and not single else 1e-3
    verdicts, first, worst = {}, 0, 0.0
    for name, t in zip(case.params, case.types):
        k = components(t)
        if not k:
            continue
        a, f, e = adj[first : first + k], want[first : first + k], noise[first : first + k]
        first += k
        error = float(np.abs(a - f).max() / scale)
        if np.abs(f).max() <= 1e-9 and np.abs(a).max() <= 1e-9:
            verdicts[name] = "constant"
        elif np.all(np.abs(a - f) <= tol * scale + 10 * e):
            verdicts[name] = "right"
        else:
            verdicts[name] = "lost" if np.abs(a).max() == 0 else "wrong"
            worst = max(worst, error)
    return Verdict(case, verdicts, worst, bool(np.any(result)))


def sweep(workdir: str, seed: int = 0) -> tuple[list[Verdict], dict[tuple, str]]:
    """Every case's verdict, and the cases left out with the reason."""
    built = build(workdir)
    verdicts = [check(getattr(built.module, f"case_{k}"), c, seed + k) for k, c in built.cases.items()]
    return verdicts, built.left_out


# -- tile builtins ----------------------------------------------------------------------------
#
# A kernel per tile builtin, launched by blocks: ``A`` is row ``b`` of the input as a 4 x 4 tile
# (plus 4 on its diagonal where a builtin needs a well-conditioned matrix: ``S``), ``v`` its
# first row as a 1-D tile; the result goes into row ``b`` of the output. Builtins that take
# only float32 (the scans) run in float32.

TILE_CASES = {  # name -> (precision, body)
    "tile_sum": ("d", "wp.tile_store(y[b, 0], wp.tile_sum(A))"),
    "tile_sum(axis)": ("d", "wp.tile_store(y[b, 0], wp.tile_sum(A, axis=0))"),
    "tile_max": ("d", "wp.tile_store(y[b, 0], wp.tile_max(v))"),
    "tile_min": ("d", "wp.tile_store(y[b, 0], wp.tile_min(v))"),
    "tile_reduce": ("d", "wp.tile_store(y[b, 0], wp.tile_reduce(wp.add, v))"),
    "tile_scan_inclusive": ("f", "wp.tile_store(y[b, 0], wp.tile_scan_inclusive(v))"),
    "tile_scan_exclusive": ("f", "wp.tile_store(y[b, 0], wp.tile_scan_exclusive(v))"),
    "tile_scan_max_inclusive": ("f", "wp.tile_store(y[b, 0], wp.tile_scan_max_inclusive(v))"),
    "tile_scan_min_inclusive": ("f", "wp.tile_store(y[b, 0], wp.tile_scan_min_inclusive(v))"),
    "tile_map": ("d", "wp.tile_store(y[b], wp.tile_map(wp.sin, A))"),
    "tile_broadcast": ("d", "wp.tile_store(y[b], wp.tile_broadcast(wp.tile_load(x[b], shape=(1, 4)), shape=(4, 4)))"),
    "tile_transpose": ("d", "wp.tile_store(y[b], wp.tile_transpose(A))"),
    "tile_view": ("d", "wp.tile_store(y[b], wp.tile_view(A, offset=(1, 0), shape=(2, 4)))"),
    "tile_reshape": ("d", "wp.tile_store(y[b], wp.tile_reshape(A, shape=(2, 8)))"),
    "tile_squeeze": ("d", "wp.tile_store(y[b, 0], wp.tile_squeeze(wp.tile_load(x[b], shape=(1, 4))))"),
    "tile_extract": ("d", "y[b, 0, 0] = wp.tile_extract(A, 1, 2)"),
    "tile_dot": ("d", "wp.tile_store(y[b, 0], wp.tile_dot(v, wp.tile_load(x[b, 1], shape=4)))"),
    "tile_matmul": ("d", "wp.tile_store(y[b], wp.tile_matmul(A, A))"),
    "tile_cholesky": ("d", "wp.tile_store(y[b], wp.tile_cholesky(S))"),
    "tile_cholesky_solve": ("d", "wp.tile_store(y[b, 0], wp.tile_cholesky_solve(wp.tile_cholesky(S), v))"),
    "tile_lower_solve": ("d", "wp.tile_store(y[b, 0], wp.tile_lower_solve(S, v))"),
    "tile_upper_solve": ("d", "wp.tile_store(y[b, 0], wp.tile_upper_solve(S, v))"),
    "tile_diag_add": ("d", "wp.tile_store(y[b], wp.tile_diag_add(A, v))"),
    "tile_full": ("d", "wp.tile_store(y[b, 0], wp.tile_full(shape=4, value=x[b, 0, 0], dtype=wp.float64))"),
    "tile_from_thread": ("d", "wp.tile_store(y[b, 0], wp.tile_from_thread(shape=4, value=x[b, 0, 0], thread_idx=0))"),
    "tile_sort": ("f", "k = wp.tile_load(x[b, 1], shape=4, storage='shared')\n    s = wp.tile_load(x[b, 2], shape=4, storage='shared')\n    wp.tile_sort(k, s)\n    wp.tile_store(y[b, 0], s)"),
    "tile_axpy": ("d", "d = wp.tile_load(x[b, 1], shape=4, storage='shared')\n    wp.tile_axpy(x[b, 3, 3], v, d)\n    wp.tile_store(y[b, 0], d)"),
    "tile (from a value)": ("d", "wp.tile_store(y[b, 0], wp.tile(x[b, 0, 0] * x[b, 1, 1]))"),
    "untile": ("d", "a = x[b, 0, 0]\n    t = wp.tile(a)\n    u = wp.tile_map(wp.sin, t)\n    w = wp.untile(u)\n    y[b, 0, 0] = w"),
}  # fmt: skip


def tile_kernel_source(k: int, name: str) -> str:
    precision, body = TILE_CASES[name]
    scalar = "wp.float64" if precision == "d" else "wp.float32"
    return (
        f"@wp.kernel\ndef tile_case_{k}(x: wp.array3d(dtype={scalar}), e: wp.array2d(dtype={scalar}), "
        f"y: wp.array3d(dtype={scalar})):\n"
        "    b = wp.tid()\n"
        "    A = wp.tile_load(x[b], shape=(4, 4))\n"
        "    S = A + wp.tile_load(e, shape=(4, 4))\n"
        "    v = wp.tile_load(x[b, 0], shape=4)\n"
        f"    {body}\n"
    )


def tile_sweep(workdir: str, seed: int = 0) -> tuple[dict[str, str], dict[str, str]]:
    """Each tile case's verdict over all its inputs ("right", "lost", "wrong", "constant"),
    and the cases left out with the reason."""
    names = list(TILE_CASES)
    sources = [tile_kernel_source(k, n) for k, n in enumerate(names)]
    staging = _module(os.path.join(workdir, "tile_staging.py"), "warpbridge_sweep_tile_staging", sources)
    left_out, kept = {}, []
    for k, name in enumerate(names):
        problem = warp_runtime.codegen_error(getattr(staging, f"tile_case_{k}"))
        if problem is None:
            kept.append(k)
        else:
            left_out[name] = problem.strip().splitlines()[-1][:160]
    module = _module(os.path.join(workdir, "tile_cases.py"), "warpbridge_sweep_tile_cases", [sources[k] for k in kept])
    verdicts = {}
    for k in kept:
        name = names[k]
        kernel = getattr(module, f"tile_case_{k}")
        found = [_tile_check_at(kernel, TILE_CASES[name][0], seed * POINTS + j) for j in range(POINTS)]
        rank = {"constant": 0, "right": 1, "wrong": 2, "lost": 3}
        verdicts[name] = max(found, key=rank.__getitem__)
    return verdicts, left_out


def _tile_outputs(kernel: Any, rows: np.ndarray, dtype: Any, grad: np.ndarray | None = None) -> tuple:
    """Launch ``kernel`` on ``rows`` (n, 16); with ``grad``, also back-propagate it (n, 64)."""
    n = len(rows)
    x = wp.array(rows.reshape(n, 4, 4), dtype=dtype, requires_grad=grad is not None)
    e = wp.array(4.0 * np.eye(4), dtype=dtype)
    y = wp.zeros((n, 8, 8), dtype=dtype, requires_grad=grad is not None)
    tape = wp.Tape() if grad is not None else None
    with tape if tape is not None else _no_tape():
        wp.launch_tiled(kernel, dim=n, inputs=[x, e], outputs=[y], block_dim=1)
    if tape is None:
        return y.numpy().reshape(n, 64).astype(np.float64), None
    tape.backward(grads={y: wp.array(grad.reshape(n, 8, 8), dtype=dtype)})
    return y.numpy().reshape(n, 64).astype(np.float64), x.grad.numpy().reshape(n, 16).astype(np.float64)


class _no_tape:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _tile_check_at(kernel: Any, precision: str, seed: int) -> str:
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.2, 0.9, 16)
    dtype, np_dtype = (wp.float64, np.float64) if precision == "d" else (wp.float32, np.float32)
    eps = 1e-6 if precision == "d" else 1e-2
    w = rng.uniform(-1.0, 1.0, 64)

    def directional(step: float) -> np.ndarray:
        rows = np.tile(base, (32, 1))
        for j in range(16):
            rows[2 * j, j] += step
            rows[2 * j + 1, j] -= step
        out, _ = _tile_outputs(kernel, rows.astype(np_dtype), dtype)
        return np.stack([(out[2 * j] - out[2 * j + 1]) / (2 * step) for j in range(16)], axis=1).T @ w

    want = directional(eps)
    noise = np.abs(want - directional(4 * eps))
    _, adj = _tile_outputs(kernel, base[None].astype(np_dtype), dtype, w[None])
    adj = adj[0]
    scale = max(float(np.abs(want).max()), 1e-12)
    tol = 1e-6 if precision == "d" else 1e-3
    if np.abs(want).max() <= 1e-9 and np.abs(adj).max() <= 1e-9:
        return "constant"
    if np.all(np.abs(adj - want) <= tol * scale + 10 * noise):
        return "right"
    return "lost" if np.abs(adj).max() == 0 else "wrong"


if __name__ == "__main__":
    import tempfile
    import time

    wp.config.quiet = True
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        found, left = sweep(d)
    print(f"{len(found)} cases swept, {len(left)} left out, {time.perf_counter() - start:.1f} s")
    for v in found:
        if v.bad or "constant" in v.params.values():
            print(f"{v.case.builtin:26s} {v.case.types} differentiable={v.case.overload.is_differentiable} {v.params}")
    for (builtin, types), why in sorted(left.items()):
        print(f"left out: {builtin} {types}: {why}")
    with tempfile.TemporaryDirectory() as d:
        tiles, tiles_left = tile_sweep(d)
    for name, verdict in tiles.items():
        print(f"{name:28s} {verdict}")
    for name, why in tiles_left.items():
        print(f"left out: {name}: {why}")
