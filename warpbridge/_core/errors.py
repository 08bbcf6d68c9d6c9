"""The library's one exception class and the helpers that word its messages."""

from __future__ import annotations


class WarpBridgeError(TypeError, ValueError):
    """Raised for any invalid use of a warpbridge op, always before a kernel is launched.

    It derives from both :class:`TypeError` and :class:`ValueError` so that code written
    against either convention catches it. Messages start with the op's name, name the
    argument, and say what was expected and what came.
    """


def fail(op: str, message: str) -> WarpBridgeError:
    """Build an error whose message starts with ``op(): ``."""
    return WarpBridgeError(f"{op}(): {message}")


def describe(value: object) -> str:
    """A short description of a value for error messages (type, and shape/dtype for arrays)."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    name = type(value).__module__.split(".")[0] + "." + type(value).__name__
    if shape is not None and dtype is not None:
        return f"{name} of shape {tuple(shape)} and dtype {dtype}"
    if isinstance(value, (int, float, bool, str)):
        return f"{type(value).__name__} {value!r}"
    return name
