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


@pytest.fixture(autouse=True)
def _same_draws():
    """Every test starts torch's global generator from the same seed, so its random inputs are
    the same whatever ran before it and a failure reproduces when it runs alone (an unseeded
    output gradient once failed one run in 60, on a reference's rounding)."""
    import torch

    torch.manual_seed(0)


@pytest.fixture(params=["quickselect", "sort"])
def tree_build(request, monkeypatch):
    """The two ways the ops search, on this machine. "quickselect": the CPU's kd-tree build
    (a quickselect per node), queries taken in their given order, as for fewer than
    ``QUERY_ORDER_MIN`` of them. "sort": CUDA's build (every level split by two radix sorts,
    ``_tree._split_by_sort``, forests too) and the queries taken in Morton order (``_tree.query_order``),
    as for many queries, and every kNN search through a tree (a small cloud's otherwise
    compares each query with every point, ``_knn_launches.small``). So CUDA's build and the
    query order are checked on every commit without a GPU and at test sizes. Asserts the
    forced paths ran."""
    from warpbridge.ops import _knn_launches, _tree

    built, ordered = [], []
    if request.param == "sort":
        real_build, real_forest, real_order = _tree.build_tree, _tree.build_forest, _tree.query_order

        def by_sort(*args, **kwargs):
            built.append(args[1].shape[0])
            return real_build(*args, **{**kwargs, "by_sort": True})

        def forest_by_sort(*args, **kwargs):
            built.append(args[1].shape[0])
            return real_forest(*args, **{**kwargs, "by_sort": True})

        def in_morton_order(*args, **kwargs):
            ordered.append(args[1].shape[0])
            return real_order(*args, **kwargs)

        monkeypatch.setattr(_tree, "build_tree", by_sort)
        monkeypatch.setattr(_tree, "build_forest", forest_by_sort)
        monkeypatch.setattr(_tree, "query_order", in_morton_order)
        monkeypatch.setattr(_tree, "QUERY_ORDER_MIN", 0)
        monkeypatch.setattr(_knn_launches, "SMALL_PAIRS", 0)
    yield request.param
    assert request.param == "quickselect" or built, "the sort build did not run"
    assert request.param == "quickselect" or ordered, "the queries were not put in Morton order"
