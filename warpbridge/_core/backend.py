"""The protocol a framework backend implements: everything the core asks of a framework.

The core (``_op``, ``_signature``, ``_validate``, ``_plan``, ``_functions``, ``_gradients``,
``_backward``, ``_adjoint``) imports and names no framework. Each framework has one adapter module with one
:class:`Backend` instance, ``BACKEND``; ``_frameworks`` says which adapter serves which array
type and loads it the first time an array of its framework arrives. Adding a framework means
writing one subclass and one line in ``_frameworks.ADAPTERS``; see ``docs/architecture.md``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

import warp as wp

from .dtypes import WARP_TYPES, contiguous_strides
from .signature import _SCALAR_NAMES, struct_array_name
from .warp_runtime import is_struct


class Backend:
    """One framework's side of every call. Subclasses override what their framework needs;
    the defaults here are shared by all of them."""

    name: str = "?"  # the key in _frameworks.ADAPTERS, op.states and plan.cache
    array_name: str = "array"  # in messages: "argument 'x' must be a <array_name>"
    default_device: Any = "cpu"  # where an op with no array input runs
    array_types: tuple = ()  # its arrays' usual types, known to the registry when it loads

    # -- arrays: what validation (_validate.validate) and the gradient rules (_gradients) use --

    def is_array(self, a: Any) -> bool:
        raise NotImplementedError

    def meta(self, a: Any) -> tuple:
        """(dtype name or None if Warp has no such type, shape, element strides, itemsize, device)."""
        raise NotImplementedError

    def contiguous(self, a: Any) -> Any:
        """A packed copy (for vector/matrix elements Warp needs packed); differentiable where
        the framework has autograd."""
        raise NotImplementedError

    def warp_device(self, device: Any) -> Any:
        raise NotImplementedError

    def zeros(self, shape: tuple, dtype_name: str, device: Any) -> Any:
        raise NotImplementedError

    def private_copy(self, a: Any) -> Any:
        """A contiguous copy nothing else references (the adjoint may write into it)."""
        raise NotImplementedError

    def ptr(self, a: Any) -> int:
        raise NotImplementedError

    def info(self, a: Any) -> tuple[str, tuple[int, ...], str]:
        """(dtype name, shape, device in words), for validation that names them."""
        raise NotImplementedError

    @staticmethod
    def unsupported(a: Any) -> str | None:
        """What makes ``a`` an array Warp cannot read as plain strided memory (a sparse or
        nested layout, no storage, quantized), in words; None when it can."""
        return None

    @staticmethod
    def values(a: Any) -> Any:
        """``a``, or an array whose memory holds ``a``'s values where a view's does not (PyTorch's
        negative and conjugate bits), differentiably."""
        return a

    @staticmethod
    def tracing() -> bool:
        """Whether the call is being traced by a compiler that cannot run warpbridge's one-time
        set-up (making an op, registering it)."""
        return False

    @staticmethod
    def int_at(a: Any, index: int, at_most: int, refuse: Callable[[int], Exception]) -> Any:
        """The integer ``a[index]`` on the host (waits for the device): what a result's size is
        read from when it depends on the data (a neighbour list's length); ``refuse(value)``
        is raised above ``at_most``. A compiler that traces data-dependent sizes
        (``torch.compile``) gets a symbolic integer instead, checked when the graph runs."""
        value = int(a[index])
        if value > at_most:
            raise refuse(value)
        return value

    def cast(self, a: Any, dtype_name: str) -> Any:
        """A cast the framework differentiates (gradients come back in ``a``'s dtype)."""
        raise NotImplementedError

    def to_host(self, a: Any) -> Any:
        """A NumPy copy of ``a``'s values (detached; waits for the device): for host work on
        integers that carry no gradient, such as a neighbour list's search."""
        raise TypeError(f"{self.array_name} cannot be read on the host here")

    def from_host(self, values: Any, like: Any) -> Any:
        """The NumPy array ``values`` as this framework's array on ``like``'s device."""
        raise TypeError(f"{self.array_name} cannot be made from host values here")

    @staticmethod
    def on_host(fn: Callable, *args: Any) -> Any:
        """``fn(*args)``: host work on NumPy values (a neighbour list's search), run as written,
        outside any graph a compiler traces of the call."""
        return fn(*args)

    def uniform(self, like: Any, n: int) -> Any:
        """(n,) float64 numbers uniform in [0, 1) from the framework's own random state (what
        its seed functions set), on ``like``'s device; TypeError where it keeps none."""
        raise TypeError(f"{self.array_name} has no global random state to draw from")

    def compiling(self) -> bool:
        """Whether a compiler is tracing the call now (``torch.compile``): the ops then take the
        path whose graph serves every size."""
        return False

    def differentiated(self, a: Any) -> bool:
        """Whether a gradient may flow into ``a`` from what is computed now (True where the
        framework cannot tell)."""
        return True

    def take(self, values: Any, indices: Sequence[Any]) -> Any:
        """``values`` gathered along each dimension by its index array (None: all of it),
        differentiably: what a ``wp.indexedarray(values, indices)`` parameter reads."""
        raise NotImplementedError

    # -- calls ------------------------------------------------------------------------------

    def call(self, op: Any, args: tuple, launch_dims: Any, output_dims: Any) -> Any:
        """Run ``op`` on this framework's arrays; return every output (one array, or a tuple)."""
        raise NotImplementedError

    def forward(self, plan: Any, arrays: Sequence[Any], scalars: Sequence[Any], device: Any, stream: Any) -> list:
        """Zeroed outputs from the framework, and the kernel or launch function run into them."""
        outs = plan.zeroed_outputs(self, device)
        plan.run([self.ptr(a) for a in arrays], scalars, [self.ptr(o) for o in outs], stream)
        return outs

    # -- hooks: the op's life, seen by every loaded backend ------------------------------------

    def on_new_op(self, op: Any) -> None:
        """An op was made while this framework is loaded (torch registers its custom op)."""

    def on_backward_attached(self, op: Any) -> None:
        """A custom backward is about to be attached: refuse, or drop what captured the old one."""

    def openmp_library(self) -> str | None:
        """The path of the OpenMP runtime this framework runs its CPU ops on, if the neighbour
        ops' CPU threads should join its thread team (None: they use their own threads)."""
        return None

    def op_attribute(self, op: Any, name: str) -> Any:
        """An attribute this backend gives every op (``_frameworks.OP_ATTRIBUTES``)."""
        raise AttributeError(f"'WarpOp' object has no attribute '{name}'")

    def state(self, op: Any) -> dict:
        """This backend's per-op state (caches, registrations): never attributes on the op."""
        return op.states[self.name]

    def __repr__(self) -> str:
        return f"<warpbridge backend {self.name}>"


class WarpArrays(Backend):
    """``wp.array``s as a backend's arrays: the DLPack backend's inputs, and what a JAX
    callback receives, so JAX runs the very same gradient rules (``_gradients.backward``)."""

    name = "warp"
    array_name = "wp.array"

    def is_array(self, a: Any) -> bool:
        return isinstance(a, wp.array)

    def meta(self, a: wp.array) -> tuple:
        # A vector/matrix dtype is seen as trailing dims of its scalar, as frameworks hold them.
        if is_struct(a.dtype):  # an array of structs: one element per struct
            size = ctypes.sizeof(a.dtype.ctype)
            strides = tuple(s // size for s in a.strides)
            return struct_array_name(a.dtype), tuple(a.shape), strides, size, a.device.alias
        scalar = getattr(a.dtype, "_wp_scalar_type_", a.dtype)
        inner = tuple(getattr(a.dtype, "_shape_", ()))
        itemsize = wp.types.type_size_in_bytes(scalar)
        strides = tuple(s // itemsize for s in a.strides) + contiguous_strides(inner, 1)
        return _SCALAR_NAMES.get(scalar), tuple(a.shape) + inner, strides, itemsize, a.device.alias

    def contiguous(self, a: wp.array) -> wp.array:
        return wp.clone(a)

    def warp_device(self, device: Any) -> Any:
        return wp.get_device(device)

    def zeros(self, shape: tuple, dtype_name: str, device: Any) -> wp.array:
        return wp.zeros(shape, dtype=WARP_TYPES[dtype_name], device=device)

    def private_copy(self, a: wp.array) -> wp.array:
        return wp.clone(a)

    @staticmethod
    def int_at(a: wp.array, index: int, at_most: int, refuse: Callable[[int], Exception]) -> int:
        cell = wp.empty(1, dtype=a.dtype, device="cpu")
        wp.copy(cell, a, src_offset=index % a.shape[0], count=1)
        value = int(cell.list()[0])
        if value > at_most:
            raise refuse(value)
        return value

    def ptr(self, a: wp.array) -> int:
        return a.ptr
