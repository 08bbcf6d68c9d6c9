"""PyTorch backend: ``backend`` (tensors, the eager path, the forward and backward every path
runs), ``registered_op`` (``torch.compile``), ``func`` (torch.func transforms), ``pool``
(Warp allocations on PyTorch's caching allocator)."""

from ..._core import op as _op
from . import func, registered_op
from .backend import TorchBackend

BACKEND = TorchBackend(transforms=func, compiled=registered_op)
# Ops made before this backend loaded (warpbridge imported before torch, its neighbour ops
# among them) are registered now: the first call may come inside torch.compile, which runs
# this import but cannot trace a registration.
for _existing in _op.live_ops():
    BACKEND.on_new_op(_existing)
