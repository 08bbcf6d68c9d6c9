import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # so tests import the shared `kernels` module


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    if _cuda():
        return
    skip = pytest.mark.skip(reason="no CUDA device on this machine (run these whenever a GPU is available)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
