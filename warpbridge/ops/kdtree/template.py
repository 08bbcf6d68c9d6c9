"""Warp code written once, compiled per float type.

The kd-tree's functions and kernels are plain module-level Python functions, tagged with
``@func``, ``@kernel`` or ``@template.func_native(snippet)``. Their annotations and bodies name the float
types (``T``, ``V``, the structs of ``dtypes``) and each other by global name.
``instantiate`` copies every tagged function onto one namespace per float type (the types
for that float, then the Warp functions as they are made) and hands the copies to Warp,
which reads each function's source from its file and resolves its names in that namespace.
The modules' own globals hold the float32 types, so they read (and lint) as float32 code.
"""

from __future__ import annotations

import inspect
import pathlib
import types
from collections.abc import Callable, Iterable
from typing import Any

import warp as wp

_TAG = "__warpbridge_kind__"
NATIVE = pathlib.Path(__file__).parent / "native"  # the native snippets, C++ function bodies


def native(name: str) -> str:
    """The native snippet in ``native/<name>``: a C++ function body, with the placeholder words
    its module fills in (``REAL``, ``NDIM``, ...)."""
    return (NATIVE / name).read_text()


def func(f: Callable) -> Callable:
    """A ``wp.func``, once per float type."""
    setattr(f, _TAG, ("func", None))
    return f


def kernel(f: Callable) -> Callable:
    """A ``wp.kernel`` without a generated adjoint, once per float type."""
    setattr(f, _TAG, ("kernel", None))
    return f


def func_native(snippet: str) -> Callable:
    """A ``wp.func_native`` of ``snippet`` (C++; ``REAL`` stands for the float type). Used as
    ``@template.func_native(...)``: Warp's code generator tells a native function by a
    decorator spelled ``<module>.func_native``, and takes its return type only then. ``NDIM``
    stands for the points' dimension."""

    def tag(f: Callable) -> Callable:
        setattr(f, _TAG, ("native", snippet))
        return f

    return tag


def instantiate(modules: Iterable[types.ModuleType], names: dict, module: str, words: dict[str, str]) -> dict:
    """Every tagged function of ``modules`` as Warp code in the Warp module ``module``, on one
    namespace: the modules' globals, then ``names`` (the float types), then the Warp
    functions by name. ``words`` are replaced in the native snippets (``REAL``: the float
    type's C++ name, ``NDIM``: the points' dimension)."""
    modules = list(modules)
    scope: dict[str, Any] = {}
    for m in modules:
        scope.update(vars(m))
    scope.update(names)
    for m in modules:
        for name, f in list(vars(m).items()):
            kind = getattr(f, _TAG, None)
            if kind is not None and getattr(f, "__module__", None) == m.__name__:
                scope[name] = _warp_function(f, kind, scope, module, words)
    return scope


def _warp_function(f: Callable, kind: tuple, scope: dict, module: str, words: dict[str, str]) -> Any:
    copy = types.FunctionType(f.__code__, scope, f.__name__, f.__defaults__, f.__closure__)
    copy.__annotations__ = inspect.get_annotations(f, globals=scope, eval_str=True)  # this float type's
    copy.__qualname__, copy.__module__ = f.__qualname__, f.__module__
    what, snippet = kind
    if what == "kernel":
        return wp.kernel(copy, enable_backward=False, module=module)
    if what == "native":
        for word, value in words.items():
            snippet = snippet.replace(word, value)
        return wp.func_native(snippet)(copy)
    return wp.func(copy, module=module)
