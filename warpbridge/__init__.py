"""warpbridge: any NVIDIA Warp kernel as a differentiable operator in PyTorch (and NumPy).

Importing warpbridge imports Warp and NumPy, never a deep-learning framework: adapters are
loaded when an argument of their framework arrives.
"""

# First: the registry fills the core's slot for the backends (ops are declared on import).
from ._backends import registry as _registry  # noqa: F401

# isort: split
from . import ops as ops
from . import testing as testing
from ._backends.memory_pool import get_memory_pool as get_memory_pool
from ._backends.memory_pool import set_memory_pool as set_memory_pool
from ._core.errors import WarpBridgeError as WarpBridgeError
from ._core.op import WarpOp as WarpOp
from ._core.op import op as op

__version__ = "0.1.0"

__all__ = [
    "GradBuffer",
    "TorchAllocator",
    "WarpBridgeError",
    "WarpOp",
    "__version__",
    "get_memory_pool",
    "op",
    "ops",
    "set_memory_pool",
    "testing",
]


def __getattr__(name: str):
    # These need torch: import them on first use, so `import warpbridge` imports no framework.
    if name == "GradBuffer":
        from .grad_buffer import GradBuffer

        return GradBuffer
    if name == "TorchAllocator":
        from ._backends.torch.pool import TorchAllocator

        return TorchAllocator
    raise AttributeError(f"module 'warpbridge' has no attribute {name!r}")
