"""GradBuffer: every managed parameter's ``.grad`` is a view into one flat buffer.

PyTorch's AccumulateGrad adds a new gradient *in place* into an existing ``.grad`` when no
graph is being built (``variable_grad += new_grad``), so once ``.grad`` is a view into the
buffer, every backward lands there with no copy. Two things can replace ``.grad`` with
another tensor: ``zero_grad(set_to_none=True)`` (the optimizer default) and backward with
``create_graph=True``. After ``set_to_none``, PyTorch takes the first new gradient itself as
``.grad`` (no copy); a post-accumulate-grad hook then copies it into the view and re-attaches
the view (one pass), so later backward passes add into the buffer again, with exact values.
A ``.grad`` assigned by hand is moved into the view by a tensor hook just before PyTorch
accumulates. ``create_graph=True`` builds a new ``.grad`` out of place, with its graph;
:meth:`GradBuffer.sync` (called by :meth:`all_reduce`) copies it back.

warpbridge ops go further (*direct write*): when an op's input is a managed parameter, its
Warp adjoint accumulates straight into the parameter's buffer view and the op returns None
for it, so no gradient tensor is allocated, copied or added. See ``docs/grad-buffer.md``
for when that applies and what it means for hooks.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from ._core.errors import WarpBridgeError, describe

ALIGN_BYTES = 256
# id(parameter) -> (weakref to it, weakref to its GradBuffer). Keyed by id: a tensor's
# __eq__ is elementwise, so tensors cannot be dictionary keys compared by value.
_MANAGED: dict[int, tuple[Any, Any]] = {}


def buffer_of(t: torch.Tensor) -> GradBuffer | None:
    """The GradBuffer managing ``t``, if any."""
    entry = _MANAGED.get(id(t))
    if entry is None or entry[0]() is not t:
        return None
    return entry[1]()


def _register(p: torch.Tensor, gb: GradBuffer) -> None:
    key = id(p)

    def forget(dead: Any) -> None:
        if _MANAGED.get(key, (None,))[0] is dead:
            del _MANAGED[key]

    _MANAGED[key] = (weakref.ref(p, forget), weakref.ref(gb))


class _Bucket:
    __slots__ = ("params", "tensor", "work", "ready")

    def __init__(self, params: list, tensor: torch.Tensor):
        self.params, self.tensor, self.work, self.ready = params, tensor, None, set()


class GradBuffer:
    """Give ``params`` gradients that live in one flat, bucketed buffer.

    Args:
        params: parameters (leaf tensors). Those that do not require grad are skipped; a
            parameter listed twice (tied weights) is managed once.
        dtype: the buffer's dtype. A ``.grad`` must have its parameter's dtype, so every
            managed parameter must have it; default: the parameters' common dtype.
        bucket_bytes: the size of one collective; consecutive parameters (in reverse order,
            the order backward produces them) fill a bucket up to this size.
        overlap: start each bucket's all-reduce during backward, as soon as all its
            gradients are final; :meth:`wait` completes them. Use :meth:`no_sync` for the
            micro-batches that only accumulate.

    Raises:
        WarpBridgeError: a non-tensor or non-leaf parameter, parameters on different devices
            (make one GradBuffer per device), mixed dtypes, or a parameter already managed by
            another GradBuffer.

    Example::

        gb = wb.GradBuffer(model.parameters())
        loss.backward()            # every p.grad is a view into gb.buffer
        gb.all_reduce()            # one collective per bucket under torch.distributed
        opt.step(); opt.zero_grad()
    """

    def __init__(
        self, params: Iterable[torch.Tensor], *, dtype: torch.dtype | None = None, bucket_bytes: int = 25 * 2**20,
        overlap: bool = False,
    ):  # fmt: skip
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes <= 0:
            raise WarpBridgeError(f"GradBuffer(): 'bucket_bytes' must be a positive int, got {describe(bucket_bytes)}")
        self.params: list[torch.Tensor] = _managed(params)
        devices = {p.device for p in self.params}
        dtype = _common_dtype(self.params, dtype, devices)
        self.device, self.dtype, self.overlap = devices.pop(), dtype, overlap
        item = torch.empty((), dtype=dtype).element_size()
        align = max(1, ALIGN_BYTES // item)
        order = list(reversed(self.params))  # backward produces the last layers' gradients first
        offsets, total = {}, 0
        for p in order:
            offsets[id(p)] = total
            total += -(-p.numel() // align) * align
        self.buffer = torch.zeros(total, dtype=dtype, device=self.device)
        self._views: dict[int, torch.Tensor] = {}
        for p in order:
            self._views[id(p)] = _view(self.buffer, offsets[id(p)], p)
        self.buckets: list[_Bucket] = []
        start, members, size = 0, [], 0
        for p in order:
            end = offsets[id(p)] + p.numel()
            members.append(p)
            size = (end - start) * item
            if size >= bucket_bytes:
                self.buckets.append(_Bucket(members, self.buffer[start:end]))
                start, members = -(-end // align) * align, []
        if members:
            self.buckets.append(_Bucket(members, self.buffer[start : offsets[id(members[-1])] + members[-1].numel()]))
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self.collectives = 0  # collectives issued so far (tests and benchmarks count them)
        self._no_sync = False
        self._group: Any = None
        self._handles = []
        ref = weakref.ref(self)
        self._own_hooks: dict[int, int] = {}  # id(p) -> the id of this buffer's tensor hook on p
        with torch.no_grad():
            for p in self.params:
                v = self._views[id(p)]
                if p.grad is not None:
                    v.copy_(p.grad)
                p.grad = v
                _register(p, self)
                pre = p.register_hook(_make_pre_hook(ref, p))
                self._own_hooks[id(p)] = pre.id
                self._handles.append(pre)
                self._handles.append(p.register_post_accumulate_grad_hook(_make_post_hook(ref)))
                if overlap:
                    self._handles.append(p.register_post_accumulate_grad_hook(_make_ready_hook(ref)))

    # -- state ---------------------------------------------------------------------------------

    def view(self, p: torch.Tensor) -> torch.Tensor:
        """The buffer view that holds ``p``'s gradient."""
        return self._views[id(p)]

    def attach(self, p: torch.Tensor) -> torch.Tensor:
        """Make ``p.grad`` the buffer view again (zeroed if ``.grad`` was None); return it."""
        v = self._views[id(p)]
        g = p.grad
        if g is None:
            v.zero_()
        elif g.data_ptr() == v.data_ptr() and g.stride() == v.stride():
            return v
        else:
            with torch.no_grad():
                v.copy_(g)
        p.grad = v
        return v

    def sync(self) -> None:
        """Bring values that live outside the buffer back into it.

        After ``create_graph=True`` (or a ``.grad`` assigned by hand) a parameter's ``.grad`` is
        another tensor: copy it in and re-attach the view. A parameter whose ``.grad`` is None
        contributes zeros (its ``.grad`` stays None).
        """
        for p in self.params:
            v = self._views[id(p)]
            g = p.grad
            if g is None:
                v.zero_()
            elif g.data_ptr() != v.data_ptr() or g.stride() != v.stride():
                with torch.no_grad():
                    v.copy_(g)
                p.grad = v

    def zero_(self) -> GradBuffer:
        """Zero every managed gradient in one operation (``.grad`` stays attached)."""
        self.buffer.zero_()
        for p in self.params:
            if p.grad is None or p.grad.data_ptr() != self._views[id(p)].data_ptr():
                p.grad = self._views[id(p)]
        return self

    def close(self) -> None:
        """Stop managing: remove the hooks; ``.grad`` tensors keep their values."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for p in self.params:
            if buffer_of(p) is self:
                del _MANAGED[id(p)]

    # -- collectives ---------------------------------------------------------------------------

    def all_reduce(self, group: Any = None, average: bool = True) -> int:
        """Sum (or average) the gradients across ranks, one collective per bucket.

        A no-op without an initialised ``torch.distributed`` process group. Returns the
        number of collectives issued.
        """
        import torch.distributed as dist

        self.sync()
        if not (dist.is_available() and dist.is_initialized()):
            return 0
        for b in self.buckets:
            dist.all_reduce(b.tensor, group=group)
            self.collectives += 1
        if average:
            self.buffer.div_(dist.get_world_size(group))
        return len(self.buckets)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """With ``overlap=True``: backward passes inside only accumulate (micro-batches)."""
        prev, self._no_sync = self._no_sync, True
        try:
            yield
        finally:
            self._no_sync = prev

    def wait(self, group: Any = None, average: bool = True) -> int:
        """With ``overlap=True``: finish this step's bucket all-reduces (starting any that
        backward did not start) and average. Returns the number of collectives issued."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            self._reset()
            return 0
        self.sync()
        n = 0
        for b in self.buckets:
            if b.work is None:
                b.work = dist.all_reduce(b.tensor, group=group or self._group, async_op=True)
                self.collectives += 1
            n += 1
        for b in self.buckets:
            b.work.wait()
        if average:
            self.buffer.div_(dist.get_world_size(group or self._group))
        self._reset()
        return n

    def _reset(self) -> None:
        for b in self.buckets:
            b.work = None
            b.ready.clear()

    def _ready(self, p: torch.Tensor) -> None:
        """Called once ``p``'s gradient is final for this backward (post-accumulate hook).

        AccumulateGrad runs once per backward after all of a parameter's contributions, and
        its post hooks run even when every contribution was a direct write (it then receives
        no tensor), so this also marks direct-written parameters at the right time."""
        if self._no_sync:
            return
        b = self._bucket_of.get(id(p))
        if b is None or b.work is not None:
            return
        b.ready.add(id(p))
        if len(b.ready) == len(b.params):
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                b.work = dist.all_reduce(b.tensor, group=self._group, async_op=True)
                self.collectives += 1

    # -- direct write (used by warpbridge ops' backward) ---------------------------------------

    def direct_target(self, p: torch.Tensor) -> torch.Tensor | None:
        """The contiguous buffer view an adjoint may accumulate into for ``p``, or None when
        direct write does not apply (non-contiguous view). Attaches the view first."""
        v = self._views[id(p)]
        if not v.is_contiguous() or self._user_hooks(p):
            return None  # a tensor hook of the user's must receive the gradient, as in plain PyTorch
        self.attach(p)
        return v

    def _user_hooks(self, p: torch.Tensor) -> bool:
        hooks = getattr(p, "_backward_hooks", None) or {}
        return any(k != self._own_hooks.get(id(p)) for k in hooks)

    def __repr__(self) -> str:
        return (
            f"GradBuffer({len(self.params)} parameters, {self.buffer.numel()} x {self.dtype} on {self.device}, "
            f"{len(self.buckets)} bucket(s){', overlap' if self.overlap else ''})"
        )


def _view(buffer: torch.Tensor, offset: int, p: torch.Tensor) -> torch.Tensor:
    """A view of ``buffer`` at ``offset`` with ``p``'s shape and, when ``p`` is dense, its strides."""
    dense = p.numel() == 0 or _span(p) == p.numel()
    stride = p.stride() if dense else torch.empty(p.shape, device="meta").stride()
    return buffer.as_strided(p.shape, stride, offset)


def _span(p: torch.Tensor) -> int:
    return 1 + sum((s - 1) * abs(st) for s, st in zip(p.shape, p.stride())) if p.numel() else 0


def _make_pre_hook(ref: Any, p_ref: torch.Tensor) -> Any:
    p_weak = weakref.ref(p_ref)

    def hook(grad: torch.Tensor) -> None:
        # Runs just before AccumulateGrad. A .grad assigned by hand is moved into the view
        # first, so PyTorch adds into the buffer in place. A .grad of None is left alone:
        # PyTorch then takes the new gradient as .grad without a copy, and the post hook
        # moves it into the buffer (one copy, instead of zeroing the view and adding).
        gb, p = ref(), p_weak()
        if gb is not None and p is not None and p.grad is not None and not torch.is_grad_enabled():
            gb.attach(p)

    return hook


def _make_post_hook(ref: Any) -> Any:
    def hook(p: torch.Tensor) -> None:
        gb = ref()
        g = p.grad
        # A .grad that carries a graph (create_graph=True) must stay as it is: sync() later.
        if gb is not None and g is not None and not g.requires_grad:
            v = gb._views[id(p)]
            if g.data_ptr() != v.data_ptr() or g.stride() != v.stride():
                with torch.no_grad():
                    v.copy_(g)
                p.grad = v

    return hook


def _make_ready_hook(ref: Any) -> Any:
    def hook(p: torch.Tensor) -> None:
        gb = ref()
        if gb is not None:
            gb._ready(p)

    return hook


def _managed(params: Iterable[torch.Tensor]) -> list:
    """The parameters a GradBuffer manages: leaf tensors that require grad, each once."""
    seen: dict[int, torch.Tensor] = {}
    for i, p in enumerate(params):
        if not isinstance(p, torch.Tensor):
            raise WarpBridgeError(f"GradBuffer(): parameter {i} must be a torch.Tensor, got {describe(p)}")
        if not p.requires_grad:
            continue  # frozen parameters have no gradient to hold (documented)
        if not p.is_leaf:
            raise WarpBridgeError(
                f"GradBuffer(): parameter {i} must be a leaf tensor (a parameter), got a tensor computed by "
                f"{type(p.grad_fn).__name__}: its gradient is never stored in .grad"
            )
        if buffer_of(p) is not None:
            raise WarpBridgeError(
                f"GradBuffer(): parameter {i} (shape {tuple(p.shape)}) is already managed by another GradBuffer; "
                "call .close() on that one first"
            )
        seen.setdefault(id(p), p)
    if not seen:
        raise WarpBridgeError("GradBuffer(): no parameter requires grad: nothing to manage")
    return list(seen.values())


def _common_dtype(params: list, dtype: torch.dtype | None, devices: set) -> torch.dtype:
    """The buffer's dtype: the one every parameter has (refused: several devices or dtypes)."""
    if len(devices) > 1:
        raise WarpBridgeError(
            f"GradBuffer(): parameters are on different devices ({', '.join(sorted(map(str, devices)))}); "
            "make one GradBuffer per device"
        )
    dtypes = {p.dtype for p in params}
    dtype = dtype or (dtypes.pop() if len(dtypes) == 1 else None)
    if dtype is None or any(p.dtype != dtype for p in params):
        found = ", ".join(sorted(str(d) for d in {p.dtype for p in params}))
        raise WarpBridgeError(
            f"GradBuffer(): every parameter must have the buffer's dtype {dtype or '(one common dtype)'}, got {found} "
            "(a .grad must match its parameter's dtype); make one GradBuffer per dtype"
        )
    return dtype
