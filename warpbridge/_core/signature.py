"""Read a Warp kernel or an annotated launch function once, into a :class:`Signature`.

The signature is all a framework adapter needs to know about the callable: which
parameters are inputs and which are outputs, each array's element dtype, rank and
vector/matrix shape, which inputs are differentiable, and two facts about the kernel's
adjoint that the gradient rules depend on (see :mod:`warpbridge._adjoint`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import warp as wp

from . import adjoint_check as _adjoint
from . import ties as _ties
from .errors import WarpBridgeError, fail
from .warp_runtime import is_struct

# Warp scalar types by the framework-neutral names that adapters map to their dtypes.
_SCALAR_NAMES: dict[Any, str] = {
    wp.float16: "float16",
    wp.bfloat16: "bfloat16",
    wp.float32: "float32",
    wp.float64: "float64",
    wp.int8: "int8",
    wp.int16: "int16",
    wp.int32: "int32",
    wp.int64: "int64",
    wp.uint8: "uint8",
    wp.uint16: "uint16",
    wp.uint32: "uint32",
    wp.uint64: "uint64",
    wp.bool: "bool",
}
_PYTHON_SCALARS = {float: wp.float32, int: wp.int32, bool: wp.bool}
_FLOAT_NAMES = frozenset({"float16", "bfloat16", "float32", "float64"})


@dataclass(frozen=True)
class Param:
    """One parameter of the wrapped callable."""

    name: str
    position: int
    is_array: bool
    wp_type: Any
    dtype_name: str  # element scalar type, e.g. "float32"
    inner_shape: tuple[int, ...]  # (3,) for wp.vec3, (3, 3) for wp.mat33, () otherwise
    ndim: int  # Warp array rank; 0 for scalars
    aux: bool = False  # an auxiliary output: kept for the backward, never returned or differentiated
    indexed: bool = False  # a wp.indexedarray input: called with an array or (values, indices...)
    slot: int = -1  # the kernel's parameter index (an input's ``position`` is its argument index)
    in_out: bool = False  # an output that starts as the input of the same name (``in_out=``)
    # Derived from the fields above (plain attributes: the call path reads them on every call)
    is_float: bool = dataclasses.field(init=False)
    carries_grad: bool = dataclasses.field(init=False)  # an output that receives a gradient: float, not aux
    differentiable: bool = dataclasses.field(init=False)  # rule 6: floating arrays; not integers, not scalars
    tensor_ndim: int = dataclasses.field(init=False)  # the array's rank with its vector/matrix dims

    def __post_init__(self) -> None:
        is_float = self.dtype_name in _FLOAT_NAMES
        object.__setattr__(self, "is_float", is_float)
        object.__setattr__(self, "carries_grad", is_float and not self.aux)
        object.__setattr__(self, "differentiable", self.is_array and is_float)
        object.__setattr__(self, "tensor_ndim", self.ndim + len(self.inner_shape))

    def describe_type(self) -> str:
        if self.dtype_name == STRUCT:
            return f"a wp.struct {self.wp_type.key}"
        inner = f" with trailing dims {self.inner_shape}" if self.inner_shape else ""
        if self.is_array:
            return f"a {self.tensor_ndim}-D {self.dtype_name} array{inner}"
        return f"a {self.dtype_name} scalar{inner}"


class Signature:
    """Everything warpbridge needs to know about a kernel or launch function."""

    def __init__(
        self,
        fn: Any,
        num_outputs: int,
        name: str,
        aux: Any = (),
        keywords: tuple[str, ...] = (),
        outputs: Any = None,
        in_out: Any = (),
    ):
        self.name = name
        if isinstance(fn, wp.Kernel):
            self.kind = "kernel"
            self.kernel = fn
            self.func = None
            self.keywords = frozenset()
            raw = [(a.label, a.type) for a in fn.adj.args]
        elif callable(fn):
            self.kind = "function"
            self.kernel = None
            self.func = fn
            raw, self.keywords = _function_params(fn, name, keywords)
        else:
            raise WarpBridgeError(
                f"{name}(): op() expects a wp.Kernel or an annotated function, got {type(fn).__name__}"
            )

        params = tuple(_make_param(name, i, label, t) for i, (label, t) in enumerate(raw))
        out_names, in_out = _output_names(name, self.kind, [p.name for p in params], num_outputs, outputs, in_out)
        self.inputs = tuple(
            dataclasses.replace(p, position=k, slot=p.position)
            for k, p in enumerate(q for q in params if q.name not in out_names)
        )
        named = tuple(dataclasses.replace(p, slot=p.position) for p in params if p.name in out_names)
        updated = tuple(dataclasses.replace(p, slot=p.position, in_out=True) for p in params if p.name in in_out)
        self.outputs = named + updated  # the updated states after the named outputs, in signature order
        _check_outputs(name, self.kind, params, self.outputs, num_outputs, explicit=outputs is not None or bool(in_out))
        self.outputs = _mark_aux(name, self.outputs, aux)
        by_slot = {p.slot: p for p in self.inputs + self.outputs}  # an in_out parameter: its output
        self.params = tuple(by_slot[i] for i in sorted(by_slot))  # one per kernel parameter, in order
        self.grad_outputs = tuple(p for p in self.outputs if p.carries_grad)
        self.visible = tuple(j for j, p in enumerate(self.outputs) if not p.aux)  # what a call returns
        self.array_inputs = tuple(p for p in self.inputs if p.is_array)
        self.array_positions = tuple(p.position for p in self.array_inputs)  # in a call's arguments
        self.scalar_positions = tuple(p.position for p in self.inputs if not p.is_array)
        # (array input index, output index) of each in_out parameter
        self.in_out_pairs = tuple(
            (k, j)
            for j, o in enumerate(self.outputs)
            if o.in_out
            for k, p in enumerate(self.array_inputs)
            if p.name == o.name
        )
        self.differentiable_inputs = tuple(p for p in self.inputs if p.differentiable)

        if self.kind == "kernel":
            self._read_kernel(fn, name, frozenset(in_out))
        else:
            self._read_function()
        self._hazards: tuple | None = None

    def _read_kernel(self, fn: Any, name: str, in_out: frozenset) -> None:
        """What the gradient rules and the checks need from a kernel's code: whether it has an
        adjoint, the outputs it reads or stores more than once, its thread-indexed and
        value-indexed accesses (see ``adjoint_check``); refuses a kernel that writes an input."""
        opts = fn.options
        self.backward_enabled = bool(opts.get("enable_backward", fn.module.options.get("enable_backward", True)))
        acc = _adjoint.array_accesses(fn.adj.tree, fn.func, {p.name for p in self.array_inputs + self.outputs})
        written = [p.name for p in self.array_inputs if p.name in acc.writes and p.name not in in_out]
        if written:
            raise WarpBridgeError(
                f"{name}(): kernel '{fn.key}' writes to its input array(s) {written} (directly or through a "
                "@wp.func it calls); warpbridge never modifies inputs. Make the written array an output "
                f"(outputs=[...] names them anywhere), or in_out={tuple(written)!r} to update it on a copy that "
                "the op returns"
            )
        # Reading an output makes Warp's adjoint need that output's value (the backward
        # replays the forward into a scratch buffer) and add into that output's gradient
        # (which then gets a private copy).
        # An in_out parameter is not among them: its adjoint reads the input's values.
        self.reads_outputs = frozenset(
            p.name for p in self.outputs if p.name in acc.reads | acc.unknown and not p.in_out
        )
        # Outputs whose gradient the adjoint must consume as it undoes each store, as Warp's
        # Tape arranges it (the output's descriptor carries its gradient's pointer): the
        # ones it reads, the ones stored more than once, and the in_out ones (whose gradient
        # buffer becomes the input's gradient as the adjoint runs).
        # Arrays whose adjoint finds their gradient at their own layout (tiles, views made in
        # the kernel): each input is handed over contiguous, as its gradient buffer is, with
        # the buffer set as its gradient; each output's gradient is a private contiguous copy
        # (a tile store's adjoint also consumes it).
        ndims = {p.name: p.ndim for p in self.array_inputs + self.outputs}
        self.layout_grads = _adjoint.addressed_by_layout(fn.adj.tree, fn.func, ndims)
        self.tracked_outputs = (
            self.reads_outputs
            | frozenset(p.name for p in self.outputs if p.name in acc.restored | self.layout_grads)
            | in_out
        )
        self._overwritten = {k: v for k, v in acc.overwritten.items() if k in {p.name for p in self.outputs}}
        self._in_out = in_out
        # (array dim, launch dim, line) per array the kernel indexes with a thread index
        self.tid_indexed = _adjoint.tid_indexed(fn.adj.tree, {p.name for p in self.array_inputs + self.outputs})
        # (array, dim, index array, line): array values used as indices, checked in debug mode
        ints = {p.name for p in self.array_inputs if p.dtype_name.startswith(("int", "uint")) and not p.inner_shape}
        names = {p.name for p in self.array_inputs + self.outputs}
        self.index_uses = _adjoint.index_uses(fn.adj.tree, names, ints, fn.func)
        # (builtin, file:line) of the first tile operation: the kernel is launched by blocks
        self.tile_use = _adjoint.tile_use(fn.func, fn.adj.tree)
        # floating scalar outputs reduced into with atomic_max/atomic_min: ties share the gradient
        scalar_outputs = {p.name: p.ndim for p in self.outputs if p.is_float and not p.inner_shape}
        self.extrema = _ties.extrema(fn.adj.tree, scalar_outputs)
        self._first_line = fn.adj.fun_lineno

    def _read_function(self) -> None:
        """A launch function: its kernels are known only when it runs (checked per recording);
        its backward may read every output."""
        self.backward_enabled = True
        self.reads_outputs = frozenset(p.name for p in self.outputs)
        self.tracked_outputs = self.reads_outputs
        self._overwritten = {}
        self._in_out = frozenset()
        self.tid_indexed = {}
        self.index_uses = []
        self.tile_use = None
        self.layout_grads = frozenset()
        self.extrema = ()

    def hazards(self) -> tuple:
        """Constructs whose generated adjoint would be silently wrong (kernels; see ``_adjoint``)."""
        if self._hazards is None:
            if self.kind != "kernel":
                self._hazards = ()
            else:
                self._hazards = _adjoint.kernel_hazards(
                    self.kernel, frozenset(self._overwritten), self._in_out, frozenset(self.extrema)
                )
        return self._hazards

    @property
    def target(self) -> Any:
        return self.kernel if self.kind == "kernel" else self.func

    def check_arity(self, args: Sequence[Any]) -> None:
        """Raise unless ``args`` has one argument per input."""
        n = len(self.inputs)
        if len(args) != n:
            names = ", ".join(p.name for p in self.inputs)
            raise fail(self.name, f"expected {n} input(s) ({names}), got {len(args)}")


def _names(name: str, what: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    try:
        names = tuple(value)
    except TypeError:
        raise WarpBridgeError(f"{name}(): {what} must be a sequence of parameter names, got {value!r}") from None
    if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise WarpBridgeError(f"{name}(): {what} must be distinct parameter names, got {value!r}")
    return names


def _output_names(
    name: str, kind: str, labels: list[str], num_outputs: Any, outputs: Any, in_out: Any
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names of the outputs (``outputs=``, else the last ``num_outputs``) and of the
    in_out parameters."""
    in_out = _names(name, "in_out", in_out)
    if outputs is not None:
        out_names = _names(name, "outputs", outputs)
    elif in_out:
        out_names = ()  # in_out alone: the updated states are the outputs
    else:
        if not isinstance(num_outputs, int) or isinstance(num_outputs, bool) or not 1 <= num_outputs <= len(labels):
            raise WarpBridgeError(
                f"{name}(): num_outputs must be an int between 1 and the number of parameters ({len(labels)}), "
                f"got {num_outputs!r}"
            )
        out_names = tuple(labels[len(labels) - num_outputs :])
    unknown = [n for n in out_names + in_out if n not in labels]
    if unknown:
        raise WarpBridgeError(f"{name}(): {unknown} name no parameter; the parameters are {labels}")
    both = [n for n in out_names if n in in_out]
    if both:
        raise WarpBridgeError(f"{name}(): {both} are named in both outputs and in_out; name each parameter once")
    if not out_names and not in_out:
        raise WarpBridgeError(f"{name}(): outputs=() names no output; an op must return one")
    if kind != "kernel" and (outputs is not None or in_out):
        raise WarpBridgeError(
            f"{name}(): outputs= and in_out= are for kernels; a launch function puts its outputs last and copies "
            "what it updates (x = wp.clone(x))"
        )
    return out_names, in_out


def _check_outputs(name: str, kind: str, params: tuple, outputs: tuple, num_outputs: int, explicit: bool) -> None:
    """Outputs are plain arrays; an indexedarray is a kernel input only."""
    for p in outputs:
        if p.is_array:
            continue
        if not explicit:
            raise WarpBridgeError(
                f"{name}(): the last {num_outputs} parameter(s) are outputs and must be arrays, "
                f"but '{p.name}' is {p.describe_type()}"
            )
        what = "an in_out parameter" if p.in_out else "an output"
        raise WarpBridgeError(f"{name}(): '{p.name}' is {what} and must be an array, but is {p.describe_type()}")
    for p in outputs:
        if p.dtype_name.startswith(STRUCT + ":"):
            raise WarpBridgeError(
                f"{name}(): output '{p.name}' is an array of wp.struct {p.wp_type.dtype.key}; no framework array "
                "holds Warp structs, so warpbridge cannot allocate it. Return each field as its own array"
            )
    for p in params:
        is_output = p.name in {o.name for o in outputs}
        if p.indexed and (kind != "kernel" or is_output):
            raise WarpBridgeError(
                f"{name}(): parameter '{p.name}' is a wp.indexedarray "
                f"{'output' if is_output else 'of a launch function'}; indexed arrays are supported as "
                "kernel inputs only. Declare it wp.array (a launch function can build the indexedarray itself)"
            )


def _mark_aux(name: str, outputs: tuple[Param, ...], aux: Any) -> tuple[Param, ...]:
    aux = _names(name, "aux", aux)
    names = [p.name for p in outputs]
    unknown = [a for a in aux if a not in names]
    if unknown:
        raise WarpBridgeError(f"{name}(): aux names {unknown}, which are not outputs; the outputs are {names}")
    if aux and len(set(aux)) == len(outputs):
        raise WarpBridgeError(f"{name}(): every output is auxiliary (aux={list(aux)}); an op must return one")
    return tuple(dataclasses.replace(p, aux=True) if p.name in aux else p for p in outputs)


def _function_params(fn: Callable, name: str, keywords: tuple[str, ...] = ()) -> tuple[list, frozenset]:
    sig = inspect.signature(fn)
    out = []
    found = set()
    for p in sig.parameters.values():
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name in keywords:
            found.add(p.name)  # a keyword warpbridge fills in itself (a backward's needs_input_grad)
            continue
        ann = p.annotation
        if ann is inspect.Parameter.empty:
            raise WarpBridgeError(f"{name}(): parameter '{p.name}' of {fn.__name__}() needs a Warp type annotation")
        if isinstance(ann, str):
            # `from __future__ import annotations` leaves strings: resolve them where fn was written.
            try:
                ann = eval(ann, getattr(fn, "__globals__", {}))  # noqa: S307 - the user's own annotation
            except Exception as e:
                raise WarpBridgeError(
                    f"{name}(): cannot resolve annotation {ann!r} of parameter '{p.name}': {e}"
                ) from e
        if p.kind not in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            raise WarpBridgeError(f"{name}(): parameter '{p.name}' must be positional, not {p.kind.description}")
        out.append((p.name, ann))
    return out, frozenset(found)


STRUCT = "struct"  # a wp.struct scalar: passed as the user's instance, never differentiated
GENERIC = "any"  # the dtype name of a generic (``Any``) parameter: bound per call (WarpOp.instance)


def struct_array_name(struct: Any) -> str:
    """The dtype name of an array of a wp.struct (only ``wp.array``s carry one)."""
    return f"{STRUCT}:{struct.key}"


def bind_generic(kernel: Any, element: Any, scalar: Any) -> Any:
    """The overload of a generic kernel with ``Any`` bound: array elements to ``element``,
    scalars to ``scalar`` (made once by Warp, then looked up)."""

    def bind(t: Any) -> Any:
        if wp.types.is_array(t) and t.dtype is Any:
            return wp.array(dtype=element, ndim=t.ndim)
        return scalar if t is Any else t

    return kernel.add_overload([bind(a.type) for a in kernel.adj.args])


def _element_info(op: str, label: str, dtype: Any) -> tuple[str, tuple[int, ...]]:
    dtype = _PYTHON_SCALARS.get(dtype, dtype)
    if dtype in _SCALAR_NAMES:
        return _SCALAR_NAMES[dtype], ()
    if dtype is Any:
        return GENERIC, ()
    if is_struct(dtype):
        return STRUCT, ()
    t = wp.types
    if (
        t.type_is_vector(dtype)
        or t.type_is_matrix(dtype)
        or t.type_is_quaternion(dtype)
        or t.type_is_transformation(dtype)
    ):
        scalar = dtype._wp_scalar_type_
        if scalar in _SCALAR_NAMES:
            return _SCALAR_NAMES[scalar], tuple(int(s) for s in dtype._shape_)
    raise WarpBridgeError(
        f"{op}(): parameter '{label}' has Warp type {wp.types.type_repr(dtype)}, which warpbridge does not support "
        f"(supported: scalars, vectors, matrices, quaternions and transforms of float16/32/64, bfloat16, (u)int8/16/32/64 and bool)"
    )


def _make_param(op: str, position: int, label: str, t: Any) -> Param:
    if wp.types.is_array(t):
        indexed = type(t).__name__ == "indexedarray"
        if type(t).__name__ not in ("array", "_ArrayAnnotation") and not indexed:
            raise WarpBridgeError(
                f"{op}(): parameter '{label}' is a {type(t).__name__}; only wp.array and wp.indexedarray "
                "parameters are supported"
            )
        dtype_name, inner = _element_info(op, label, t.dtype)
        if dtype_name == STRUCT:
            dtype_name = struct_array_name(t.dtype)
        return Param(label, position, True, t, dtype_name, inner, int(t.ndim), indexed=indexed)
    dtype_name, inner = _element_info(op, label, t)
    return Param(label, position, False, _PYTHON_SCALARS.get(t, t), dtype_name, inner, 0)
