"""Every example runs and reaches its documented result."""

import importlib.util
import os

import torch

ROOT = os.path.join(os.path.dirname(__file__), "..", "examples")


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rosenbrock_example_reaches_the_minimum(capsys):
    mean = load("rosenbrock").main(steps=3000)
    torch.testing.assert_close(mean, torch.tensor([1.0, 1.0]), atol=0.06, rtol=0)
    out = capsys.readouterr().out
    err = float(out.split("vs PyTorch autograd: ")[1].split()[0])
    assert err < 1e-5
