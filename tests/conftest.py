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


@pytest.fixture(params=["quickselect", "sort"])
def tree_build(request, monkeypatch):
    """Both kd-tree builds, on this machine: the CPU's (a quickselect per node) and CUDA's
    (every level split by two radix sorts, ``_core._split_by_sort``), so the CUDA build is
    checked on every commit without a GPU. Asserts the forced build ran."""
    from warpbridge.ops import _core

    built = []
    if request.param == "sort":
        real = _core.build_tree

        def by_sort(*args, **kwargs):
            built.append(args[1].shape[0])
            return real(*args, **{**kwargs, "by_sort": True})

        monkeypatch.setattr(_core, "build_tree", by_sort)
    yield request.param
    assert request.param == "quickselect" or built, "the sort build did not run"
