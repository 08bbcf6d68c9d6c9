"""Launch plans: what one call of an op needs once its layouts and dims are known.

Two kinds behind one interface (``run``, ``run_adjoint``), chosen once per plan by
``launch_function.new_plan``: :class:`KernelPlan` here, a kernel's argument struct recorded
once per (device, layouts, dims) and called directly on the CPU, or through ``wp.launch``
elsewhere; ``launch_function.FunctionPlan``, a launch function run on views of the buffers.

A plan depends only on the callable and on shapes, never on data pointers: memory is reused
for other shapes and dtypes. The rest of a call lives next door: validation and dims in
``validate``, the gradient rules in ``gradients``.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from typing import Any

import warp as wp

from .dtypes import HALF_BITS, contiguous_strides, itemsize
from .errors import fail
from .signature import STRUCT, Param, Signature
from .warp_runtime import ARRAY_DESCRIPTOR, LOAD_LOCK, default_block_dim, exact_block_dim, record

# Call compiled CPU kernels directly (the fast path). Tests turn this off to run the generic
# wp.launch path, the one CUDA takes, on machines without a GPU.
DIRECT_CPU = True

_INT_FORMATS = {"int8": "b", "uint8": "B", "int16": "h", "uint16": "H", "int32": "i", "uint32": "I", "int64": "q",
                "uint64": "Q"}  # fmt: skip


def _descriptor(ptr: int, shape: Sequence[int], strides: Sequence[int]) -> Any:
    return ARRAY_DESCRIPTOR(ptr, 0, len(shape), shape, strides)


class Plan:
    """What every plan holds for one callable, device and set of input layouts / dims.

    Each kind answers ``run(in_ptrs, scalars, out_ptrs, stream, keywords, record)``, the
    forward into outputs the caller allocated (with ``record``, a launch function's run is
    taped and its recording returned), and ``run_adjoint(op, in_ptrs, scalars, out_ptrs,
    in_grad_ptrs, out_grads, stream, recording)``, Warp's adjoint accumulating into the input
    gradient buffers."""

    # Whether the callable allocates Warp arrays of its own (a launch function; a framework
    # lends its memory pool), and whether its adjoint re-runs it into scratch outputs
    allocates = False
    # Whether ``run`` takes the scalars' Python values (a launch function) or them packed for
    # the kernel's argument struct (16-bit floats as bits)
    takes_values = False
    # A kernel's threads per block (None: Warp's default), and whether it is launched by
    # blocks (``wp.launch_tiled``: the launch dims are the grid of blocks)
    block_dim: int | None = None
    tiled = False

    def __init__(self, sig: Signature, device: Any, in_layouts, launch, out_shapes):
        self.sig = sig
        self.device = device
        self.launch_dims = launch
        self.out_shapes = out_shapes  # Warp shapes
        self.size = math.prod(launch)
        self.out_strides = tuple(
            contiguous_strides(s + p.inner_shape, itemsize(p))[: p.ndim] for p, s in zip(sig.outputs, out_shapes)
        )
        self.in_grad_strides = tuple(
            contiguous_strides(shape + p.inner_shape, itemsize(p))[: p.ndim]
            for p, (shape, _) in zip(sig.array_inputs, in_layouts)
        )
        self.in_layouts = in_layouts
        # what is derived once per plan: per backend (output allocations), the custom backward's plans
        self.cache: dict = {}

    def zeroed_outputs(self, fw: Any, device: Any) -> list:
        """The outputs (full shapes, vector/matrix dims included), zeroed by backend ``fw``."""
        return [fw.zeros(s + p.inner_shape, p.dtype_name, device) for p, s in zip(self.sig.outputs, self.out_shapes)]


class KernelPlan(Plan):
    """A kernel's plan.

    On the CPU the compiled forward and backward entry points are called directly with a
    ctypes argument struct copied from a template that already holds every shape and
    stride, so a call only writes data pointers and scalars (~1.5 us). Elsewhere (CUDA,
    CPU tile kernels) the launch goes through ``wp.launch`` on the caller's stream.
    """

    def __init__(
        self,
        sig: Signature,
        device: Any,
        in_layouts,
        launch,
        out_shapes,
        debug: bool = False,
        block_dim: int | None = None,
        tiled: bool = False,
    ):
        super().__init__(sig, device, in_layouts, launch, out_shapes)
        self.check_indices = debug and bool(sig.index_uses)
        self.block_dim, self.tiled = block_dim, tiled
        # what wp.launch takes: a tiled launch's trailing dimension is the block's threads
        lanes = block_dim or default_block_dim(device)
        self.warp_dims = (*launch, lanes) if tiled else tuple(launch)
        self.warp_block_dim = exact_block_dim(lanes if tiled else block_dim)
        if self.size == 0:
            return  # an empty launch launches nothing
        kernel = sig.kernel
        layouts = dict(zip((p.name for p in sig.array_inputs), in_layouts))
        layouts.update((p.name, (s, st)) for p, s, st in zip(sig.outputs, out_shapes, self.out_strides))
        templates = [
            (_indexed(p, 0, *layouts[p.name], device) if p.indexed else _descriptor(0, *layouts[p.name]))
            if p.is_array
            else _zero_scalar(p)
            for p in sig.params
        ]
        try:
            with LOAD_LOCK:
                rec = record(kernel, self.warp_dims, templates, device, DIRECT_CPU, lanes if tiled else block_dim)
        except (ValueError, RuntimeError, TypeError) as e:
            raise fail(sig.name, f"Warp rejected the launch (dims {launch}{_blocks_of(self)}): {e}") from e
        self.bounds = rec.bounds
        self.hooks = rec.hooks
        self.module_exec = rec.module_exec
        self.direct = rec.direct
        self.Args = rec.Args
        # Warp's adjoint takes a plain array for the gradient of an indexedarray input
        self.AdjArgs = rec.Args if not any(p.indexed for p in sig.params) else _adjoint_args(sig, rec.Args)
        self.template = rec.template
        self._copy = self.Args.from_buffer_copy
        self._fill = _make_filler(sig)
        self._bounds_ref = ctypes.byref(self.bounds) if self.direct else None  # keeps self.bounds alive
        self._forward = self.hooks.forward

    def run(
        self,
        in_ptrs: Sequence[int],
        scalars: Sequence[Any],
        out_ptrs: Sequence[int],
        stream: Any = None,
        keywords: dict | None = None,
        record: bool = False,
    ) -> None:
        """Launch the forward kernel. ``scalars`` are already packed. An in_out output starts as
        a copy of its input. A kernel records nothing (its adjoint needs only its arguments)."""
        if self.check_indices:
            self._check_indices(in_ptrs)
        for k, j in self.sig.in_out_pairs:
            self._seed(k, j, in_ptrs[k], out_ptrs[j], stream)
        if self.size == 0:
            return
        args = self._copy(self.template)
        self._fill(args, in_ptrs, scalars, out_ptrs)
        if self.direct:
            self._forward(self._bounds_ref, ctypes.byref(args))
        else:
            values = self._launch_values(args)
            wp.launch(
                self.sig.kernel,
                dim=self.warp_dims,
                inputs=values,
                device=self.device,
                stream=stream,
                block_dim=self.warp_block_dim,
            )

    def run_adjoint(
        self,
        op: Any,
        in_ptrs: Sequence[int],
        scalars: Sequence[Any],
        out_ptrs: Sequence[int],
        in_grad_ptrs: Sequence[int],
        out_grads: Sequence[tuple[int, tuple[int, ...]]],
        stream: Any = None,
        recording: Any = None,
    ) -> None:
        """Launch the adjoint kernel, accumulating into the input gradient buffers.

        ``in_grad_ptrs``: one pointer per array input (0 for no gradient, a contiguous buffer
        otherwise); ``out_grads``: (pointer, Warp byte strides) per output.
        """
        if self.size == 0:
            return
        if self.hooks.backward is None:
            raise fail(self.sig.name, "the kernel was compiled with enable_backward=False; it has no adjoint")
        args = self._copy(self.template)
        self._fill(args, in_ptrs, scalars, out_ptrs)
        for p, (ptr, _) in zip(self.sig.outputs, out_grads):
            if p.name in self.sig.tracked_outputs:
                # as Warp's Tape does: the adjoint of a store consumes (zeroes) the gradient of
                # the element it overwrote, so earlier stores and reads see only what reached them
                getattr(args, p.name).grad = ptr
        grads = iter(in_grad_ptrs)
        by_name = {}
        k = 0
        for p in self.sig.inputs:
            if p.is_array:
                ptr = next(grads)
                if p.name in self.sig.layout_grads:
                    # as under wp.Tape: a view's or a tile's adjoint adds into the array's own gradient
                    getattr(args, p.name).grad = ptr
                by_name[p.name] = (
                    _descriptor(ptr, self.in_layouts[k][0], self.in_grad_strides[k]) if ptr else ARRAY_DESCRIPTOR()
                )
                k += 1
            elif p.dtype_name == STRUCT:
                # scalar adjoints are discarded; the struct takes plain zeros (float16 fields hold bits)
                by_name[p.name] = p.wp_type().__ctype__() if self.direct else p.wp_type()
            else:
                by_name[p.name] = _zero_scalar(p) if p.inner_shape or not self.direct else 0
        for p, shape, (ptr, strides) in zip(self.sig.outputs, self.out_shapes, out_grads):
            by_name[p.name] = _descriptor(ptr, shape, strides)  # an in_out one: its output's
        adj = [by_name[p.name] for p in self.sig.params]
        if self.direct:
            adj_args = self.AdjArgs(*adj)
            self.hooks.backward(self._bounds_ref, ctypes.byref(args), ctypes.byref(adj_args))
        else:
            values = self._launch_values(args)  # in the kernel's order, as adj
            wp.launch(
                self.sig.kernel,
                dim=self.warp_dims,
                inputs=values,
                adj_inputs=adj,
                adjoint=True,
                device=self.device,
                stream=stream,
                block_dim=self.warp_block_dim,
            )

    def launch_values(self, in_ptrs: Sequence[int], scalars: Sequence[Any], out_ptrs: Sequence[int]) -> list:
        """The kernel's arguments over these buffers, as ``wp.launch`` takes them."""
        args = self._copy(self.template)
        self._fill(args, in_ptrs, scalars, out_ptrs)
        return self._launch_values(args)

    def _check_indices(self, in_ptrs: Sequence[int]) -> None:
        """Debug mode: refuse index arrays whose values would reach past the arrays they index
        (Warp's own bounds checks stop the process)."""
        sig = self.sig
        shapes = {p.name: layout[0] for p, layout in zip(sig.array_inputs, self.in_layouts)}
        shapes.update((p.name, s) for p, s in zip(sig.outputs, self.out_shapes))
        position = {p.name: k for k, p in enumerate(sig.array_inputs)}
        for array, dim, source, line in sig.index_uses:
            shape = shapes.get(array, ())
            if dim >= len(shape) or source not in position:
                continue
            k = position[source]
            n = shape[dim]
            for i, v in enumerate(self._host_values(k, in_ptrs[k])):
                if not -n <= v < n:
                    raise fail(
                        sig.name,
                        f"argument '{source}' holds {v} at flat index {i}, but kernel '{sig.kernel.key}' indexes "
                        f"dimension {dim} of '{array}' (size {n}) with its values (line "
                        f"{sig._first_line + line - 1}): the launch would access memory out of bounds. Valid "
                        f"indices are {-n}..{n - 1}",
                    )

    def _host_values(self, k: int, ptr: int) -> memoryview:
        """Array input ``k``'s integer values, read on the host."""
        p = self.sig.array_inputs[k]
        shape, strides = self.in_layouts[k]
        if not math.prod(shape):
            return memoryview(b"").cast("B")
        view = wp.array(ptr=ptr, dtype=p.wp_type.dtype, shape=shape, strides=strides, device=self.device)
        return memoryview(host_bytes(view)).cast(_INT_FORMATS[p.dtype_name])

    def _seed(self, k: int, j: int, in_ptr: int, out_ptr: int, stream: Any) -> None:
        """Copy array input ``k`` into output ``j`` (Warp views over both buffers)."""
        p = self.sig.outputs[j]
        shape, strides = self.in_layouts[k]
        if not math.prod(shape):
            return
        src = wp.array(ptr=in_ptr, dtype=p.wp_type.dtype, shape=shape, strides=strides, device=self.device)
        dst = wp.array(
            ptr=out_ptr,
            dtype=p.wp_type.dtype,
            shape=self.out_shapes[j],
            strides=self.out_strides[j],
            device=self.device,
        )
        wp.copy(dst, src, stream=stream)

    def _launch_values(self, args: Any) -> list:
        """The struct's fields as ``wp.launch`` takes them (array descriptors verbatim)."""
        values = []
        for p in self.sig.params:
            v = getattr(args, p.name)
            if p.indexed:  # wp.launch takes an indexedarray as a wp.indexedarray
                v = _indexed(
                    p, v.data.data, tuple(v.data.shape[: p.ndim]), tuple(v.data.strides[: p.ndim]), self.device
                )
            elif p.dtype_name == STRUCT:
                v = p.wp_type.instance_type(ctype=v)  # wp.launch takes the struct as an instance
            elif p.dtype_name in HALF_BITS and not p.is_array and not p.inner_shape:
                v = p.wp_type(HALF_BITS[p.dtype_name][1](v))  # the field holds raw bits
            values.append(v)
        return values


def _blocks_of(plan: KernelPlan) -> str:
    if plan.tiled:
        return f", tiled, {plan.warp_dims[-1]} threads per block"
    return f", {plan.block_dim} threads per block" if plan.block_dim else ""


def host_bytes(a: Any) -> bytes:
    """The bytes of Warp array ``a``'s elements, packed, read on the host."""
    packed = wp.clone(a, device="cpu", requires_grad=False)
    return ctypes.string_at(packed.ptr, packed.size * wp.types.type_size_in_bytes(packed.dtype))


def _indexed(p: Param, ptr: int, shape: Sequence[int], strides: Sequence[int], device: Any) -> Any:
    """An indexedarray without indices over foreign memory (see ``WarpOp._gather``)."""
    data = wp.array(ptr=ptr, dtype=p.wp_type.dtype, shape=tuple(shape), strides=tuple(strides), device=device)
    return wp.indexedarray(data)


def _adjoint_args(sig: Signature, Args: Any) -> Any:
    fields = [(name, ARRAY_DESCRIPTOR if p.indexed else t) for (name, t), p in zip(Args._fields_, sig.params)]
    return type("AdjArgs", (ctypes.Structure,), {"_fields_": fields})


def _make_filler(sig: Signature):
    """A function that writes the per-call values into an argument struct, one statement
    per field: generated once per signature (as ``collections.namedtuple`` does) because a
    generic loop costs more than the kernel launch itself on small inputs."""
    lines, arr, sc = [], 0, 0
    for p in sig.inputs:
        if p.is_array:
            lines.append(f"    a.{p.name}.data{'.data' if p.indexed else ''} = ins[{arr}]")
            arr += 1
        elif p.dtype_name == STRUCT:
            lines.append(f"    a.{p.name} = scalars[{sc}].__ctype__()")
            sc += 1
        else:
            lines.append(f"    a.{p.name} = scalars[{sc}]")
            sc += 1
    lines += [f"    a.{p.name}.data = outs[{j}]" for j, p in enumerate(sig.outputs)]
    namespace: dict[str, Any] = {}
    exec("def fill(a, ins, scalars, outs):\n" + "\n".join(lines), namespace)  # noqa: S102 - names are identifiers
    return namespace["fill"]


def _zero_scalar(p: Param) -> Any:
    if p.inner_shape or p.dtype_name == STRUCT:
        return p.wp_type()
    return p.wp_type(False) if p.dtype_name == "bool" else p.wp_type(0)
