"""warpbridge: any NVIDIA Warp kernel as a differentiable operator in PyTorch (and NumPy).

Importing warpbridge imports Warp and NumPy, never a deep-learning framework: adapters are
loaded when an argument of their framework arrives.
"""

from . import ops as ops
from ._errors import WarpBridgeError as WarpBridgeError
from ._op import WarpOp as WarpOp
from ._op import op as op

__version__ = "0.1.0"

__all__ = ["GradBuffer", "WarpBridgeError", "WarpOp", "__version__", "op", "ops"]


def __getattr__(name: str):
    # GradBuffer needs torch: import it on first use, so `import warpbridge` imports no framework.
    if name == "GradBuffer":
        from .grad_buffer import GradBuffer

        return GradBuffer
    raise AttributeError(f"module 'warpbridge' has no attribute {name!r}")
