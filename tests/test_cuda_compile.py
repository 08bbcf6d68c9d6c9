"""CUDA on every commit, without a GPU: every Warp module warpbridge ships or wraps in its tests,
examples and benchmarks is compiled to PTX for sm_80 and sm_90 with Warp's bundled NVRTC, and
every kernel must come out with its forward entry point and, where it has one, its adjoint."""

import importlib
import importlib.util
import os
import re

import pytest
import warp as wp

from warpbridge._core.signature import bind_generic

ROOT = os.path.join(os.path.dirname(__file__), "..")


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _point_module(dtype, dim=3):
    from warpbridge.ops import kdtree as _kernels

    return _kernels.kernels(dtype, dim).tree_init.module


def _row_module(dtype):
    from warpbridge.ops import kdtree as _kernels

    return _kernels.row_kernels(dtype).rows_knn.module


MODULES = {
    "points_float32": lambda: _point_module(wp.float32),
    "points_float64_16d": lambda: _point_module(wp.float64, 16),
    "rows_float32": lambda: _row_module(wp.float32),
    "cells": lambda: importlib.import_module("warpbridge.ops.kdtree").cell_kernels().pair_count.module,
    "tests/kernels": lambda: _load("tests/kernels.py", "kernels"),
    "tests/adjoint_kernels": lambda: _load("tests/adjoint_kernels.py", "adjoint_kernels"),
    "tests/backward_kernels": lambda: _load("tests/backward_kernels.py", "backward_kernels"),
    "examples/custom_backward": lambda: _load("examples/custom_backward.py", "custom_backward"),
    "examples/rosenbrock": lambda: _load("examples/rosenbrock.py", "rosenbrock"),
    "benchmarks/_kernels": lambda: _load("benchmarks/_kernels.py", "_kernels"),
    "warpbridge/_cli/tutorial": lambda: _load("warpbridge/_cli/tutorial.py", "warpbridge._cli.tutorial"),
    "warpbridge/_core/off_tape_fills": lambda: importlib.import_module("warpbridge._core.off_tape_fills"),
    "warpbridge/_core/compare_kernels": lambda: importlib.import_module("warpbridge._core.compare_kernels"),
}


def _warp_module(obj):
    if isinstance(obj, wp._src.context.Module):
        return obj
    # kernels defined in this file (not ones it imports, which another entry compiles)
    kernels = [v for v in vars(obj).values() if isinstance(v, wp.Kernel) and v.func.__module__ == obj.__name__]
    kernels += [v.fn for v in vars(obj).values() if type(v).__name__ == "WarpOp" and isinstance(v.fn, wp.Kernel)]
    assert kernels, f"no kernels in {obj}"
    return kernels[0].module


@pytest.mark.parametrize("name", sorted(MODULES))
def test_compiles_to_ptx_for_sm80_and_sm90(name, tmp_path):
    module = _warp_module(MODULES[name]())
    for kernel in list(module._get_live_kernels()):
        if kernel.is_generic:  # instantiated as a call binds it: float32 and float64
            for t in (wp.float32, wp.float64):
                bind_generic(kernel, t, t)
    paths = wp.compile_aot_module(module, arch=[80, 90], module_dir=str(tmp_path), use_ptx=True)
    assert sorted(p.suffixes[-2] for p in paths) == [".sm80", ".sm90"]
    kernels = list(module._get_live_kernels())
    assert kernels
    for p in paths:
        entries = set(re.findall(rb"\.entry (\w+)_cuda_kernel_(forward|backward)", p.read_bytes()))
        names = {(k.decode(), d.decode()) for k, d in entries}
        for kernel in kernels:
            backward = kernel.options.get("enable_backward", module.options.get("enable_backward", True))
            found = {d for k, d in names if k.startswith(f"{kernel.key}_")}
            assert "forward" in found, f"{kernel.key}: no forward entry in {p.name}"
            assert ("backward" in found) == bool(backward), f"{kernel.key}: adjoint entry missing in {p.name}"
