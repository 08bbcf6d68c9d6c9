"""Which backend serves which array type. The one module that names frameworks: as data,
never importing one. A backend is loaded (its adapter module imported) the first time an
array of its framework arrives, so ``import warpbridge`` imports no framework."""

from __future__ import annotations

import importlib
import sys
from typing import Any

from .._core import frameworks as _slot
from .._core.errors import describe, fail

# Adapter module by the top-level module of the array types it serves.
ADAPTERS = {
    "torch": "warpbridge._backends.torch",
    "numpy": "warpbridge._backends.numpy",
    "jax": "warpbridge._backends.jax",
    "paddle": "warpbridge._backends.paddle",
    "dlpack": "warpbridge._backends.dlpack",  # any other producer of DLPack / __cuda_array_interface__ arrays
}
# Top-level modules whose array types another adapter serves: concrete JAX arrays live in
# jaxlib, tracers in jax.
ALIASES = {"jaxlib": "jax", "warp": "dlpack", "cupy": "dlpack"}
# With no array input, the first of these frameworks the caller has imported.
DEFAULTS = ("torch", "numpy")
FROM_DLPACK = {
    "torch": "torch.from_dlpack(x)",
    "numpy": "numpy.from_dlpack(x)",
    "jax": "jax.dlpack.from_dlpack(x)",
    "paddle": "paddle.utils.dlpack.from_dlpack(x)",
}
# Attributes of every op that a backend provides, by the framework providing them.
OP_ATTRIBUTES = {"torch_op": "torch"}  # the registered torch.ops.warpbridge.<name>


class Table:
    """A lookup table read and filled by attribute: torch.compile guards a read on that
    attribute alone (a dict read on the dict's length, so each new entry would recompile
    graphs), and traces setting one (which it cannot on a SimpleNamespace)."""


_LOADED = Table()  # backends by framework name
# (array type, its backend) by the type's __name__, filled as arrays arrive and when a backend
# loads (so that a first call traced by torch.compile finds it). By name, not by type in a
# dict, nor by module (Dynamo cannot read a Parameter's __module__ as a constant); a name two
# frameworks share (NumPy's and CuPy's ndarray) keeps the first type, the other takes
# for_arrays each time.
BY_TYPE_NAME = Table()


def load(name: str) -> Any:
    """The backend of a framework (its adapter imported on first use)."""
    b = getattr(_LOADED, name, None)
    if b is None:
        b = _import(name).BACKEND
        for t in b.array_types:
            remember(t, b)
        setattr(_LOADED, name, b)
    return b


def remember(t: type, backend: Any) -> None:
    """Serve arrays of type ``t`` by ``backend`` from now on, where :func:`for_arrays` gives
    every array of ``t``'s package one backend (it checks each array of a package outside
    the frameworks on its own: DLPack producer or not)."""
    package = t.__module__.partition(".")[0]
    if ALIASES.get(package, package) in ADAPTERS and not hasattr(BY_TYPE_NAME, t.__name__):
        setattr(BY_TYPE_NAME, t.__name__, (t, backend))


def _import(name: str) -> Any:
    """An adapter module, by import statements: a first call inside ``torch.compile`` runs
    them (Dynamo executes an import; it cannot trace ``importlib``)."""
    if name == "torch":
        from . import torch as adapter
    elif name == "numpy":
        from . import numpy as adapter
    elif name == "jax":
        from . import jax as adapter
    elif name == "paddle":
        from . import paddle as adapter
    elif name == "dlpack":
        from . import dlpack as adapter
    else:
        adapter = importlib.import_module(ADAPTERS[name])
    return adapter


def loaded() -> list:
    """The backends of the frameworks the caller has imported (loading their adapters)."""
    return [load(name) for name in ADAPTERS if hasattr(_LOADED, name) or (name != "dlpack" and name in sys.modules)]


def for_arrays(op_name: str, named: Any) -> Any:
    """The backend of the framework the arrays come from: ``named`` holds (argument name,
    array, expected type in words). All arrays must come from one framework."""
    found = None
    for name, a, want in named:
        top = type(a).__module__.partition(".")[0]
        top = ALIASES.get(top, top)
        if top not in ADAPTERS:
            if not (hasattr(a, "__dlpack__") or hasattr(a, "__cuda_array_interface__")):
                raise fail(
                    op_name,
                    f"argument '{name}' must be an array ({want}): a torch, NumPy, JAX or Paddle "
                    f"array, or any array exposing __dlpack__ or __cuda_array_interface__; got {describe(a)}",
                )
            top = "dlpack"
        if found is not None and top != found:
            hint = ""
            if "dlpack" in (top, found):
                other = found if top == "dlpack" else top
                hint = f": convert the DLPack array first ({FROM_DLPACK[other]} shares its memory)"
            raise fail(
                op_name, f"all arrays must come from one framework, got {found} and {top} (argument '{name}'){hint}"
            )
        found = top
    if found is None:
        found = next((n for n in DEFAULTS if n in sys.modules), DEFAULTS[-1])
    return load(found)


def op_attribute(op: Any, name: str) -> Any:
    framework = OP_ATTRIBUTES.get(name)
    if framework is None:
        raise AttributeError(f"'WarpOp' object has no attribute '{name}'")
    return load(framework).op_attribute(op, name)


_slot.fill(sys.modules[__name__])  # the core reaches the backends through this
