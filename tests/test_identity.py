"""Stable op identity: registered names from the kernel's module, qualified name and source
(never import order), one op per kernel and options, collisions refused, ops pickled by
reference."""

import os
import pickle
import subprocess
import sys
import textwrap

import kernels as K
import pytest
import torch
import warp as wp

import warpbridge as wb
from warpbridge._backends.torch import registered_op

HERE = os.path.dirname(__file__)


def test_same_kernel_and_options_give_the_same_op_and_no_new_registration():
    a = wb.op(K.mul64)
    assert wb.op(K.mul64) is a
    assert wb.op(K.mul64, launch_dims=(3,)) is not a
    before = len(registered_op._REGISTERED)
    x = torch.ones(4, dtype=torch.float64)
    for _ in range(300):  # an op made inside forward, every step
        wb.op(K.mul64)(x, x)
    assert len(registered_op._REGISTERED) == before


def test_registered_name_comes_from_module_qualname_and_source():
    op = wb.op(K.square)
    assert op.registration_name.startswith("kernels__square__")
    assert op.torch_op is getattr(torch.ops.warpbridge, op.registration_name)
    other = wb.op(K.square, launch_dims=(2,))
    assert other.registration_name != op.registration_name  # options are part of it


def test_registered_names_do_not_depend_on_import_order(tmp_path):
    (tmp_path / "mod_a.py").write_text(
        "import warp as wp\n\n@wp.kernel\ndef sq(x: wp.array(dtype=float), y: wp.array(dtype=float)):\n"
        "    i = wp.tid()\n    y[i] = x[i] * x[i]\n"
    )
    (tmp_path / "mod_b.py").write_text(
        "import warp as wp\n\n@wp.kernel\ndef sq(x: wp.array(dtype=float), y: wp.array(dtype=float)):\n"
        "    i = wp.tid()\n    y[i] = x[i] + x[i]\n"
    )
    script = textwrap.dedent(
        """
        import sys, torch, warpbridge as wb
        order = sys.argv[1].split(",")
        mods = {m: __import__(m) for m in order}
        ops = {m: wb.op(mods[m].sq) for m in order}
        print(ops["mod_a"].registration_name, ops["mod_b"].registration_name)
        x = torch.tensor([3.0])
        print(float(ops["mod_a"].torch_op(x)), float(ops["mod_b"].torch_op(x)))
        """
    )
    runs = []
    for order in ("mod_a,mod_b", "mod_b,mod_a"):
        out = subprocess.run(
            [sys.executable, "-c", script, order], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True
        )
        runs.append([line for line in out.stdout.splitlines() if not line.startswith("Module ")][:2])
    assert runs[0] == runs[1]
    names = runs[0][0].split()
    assert names[0].startswith("mod_a__sq__") and names[1].startswith("mod_b__sq__")
    assert runs[0][1] == "9.0 6.0"


def test_an_explicit_name_taken_by_another_kernel_is_refused():
    wb.op(K.square, name="identity_taken")
    with pytest.raises(wb.WarpBridgeError, match=r"identity_taken is already registered for another kernel.*name="):
        wb.op(K.mul64, name="identity_taken")


def test_an_op_pickles_by_reference():
    op = wb.op(K.mul64)
    assert pickle.loads(pickle.dumps(op)) is op
    model = torch.nn.Module()
    model.op = op
    model.w = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    back = pickle.loads(pickle.dumps(model))
    torch.testing.assert_close(back.op(back.w, back.w), torch.sin(torch.ones(3, dtype=torch.float64)))


def test_a_pickled_op_runs_in_a_fresh_process():
    op = wb.op(K.mul64, launch_dims=(2,))
    blob = pickle.dumps(op)
    script = textwrap.dedent(
        f"""
        import pickle, sys, torch
        sys.path.insert(0, {HERE!r})
        op = pickle.loads({blob!r})
        x = torch.zeros(3, dtype=torch.float64)
        print(op.launch_dims, op(x + 1.0, x + 2.0).tolist())
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    z = 2 * torch.sin(torch.tensor(1.0, dtype=torch.float64)).item()
    lines = [line for line in out.stdout.splitlines() if not line.startswith("Module ")]
    assert lines == [f"(2,) [{z}, {z}]"]


def test_an_op_with_a_local_kernel_refuses_to_pickle_clearly():
    @wp.kernel
    def local_sq(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        i = wp.tid()
        y[i] = x[i] * x[i]

    with pytest.raises(pickle.PicklingError, match="not importable by name"):
        pickle.dumps(wb.op(local_sq))


def test_custom_backward_survives_pickling():
    import backward_kernels as B

    op = wb.op(B.power, backward=B.power_adjoint)
    back = pickle.loads(pickle.dumps(op))
    assert back.custom_backward is not None and back.custom_backward.fn is B.power_adjoint


EXPORT = textwrap.dedent(
    """
    import sys, torch, warpbridge as wb
    import exp_mod
    op = wb.op(exp_mod.sq)

    class M(torch.nn.Module):
        def forward(self, x):
            return op(x) + 1.0

    if sys.argv[1] == "save":
        ep = torch.export.export(M(), (torch.ones(3),))
        torch.export.save(ep, "prog.pt2")
        print("saved")
    else:
        ep = torch.export.load("prog.pt2")
        print(ep.module()(torch.tensor([1.0, 2.0, 3.0])).tolist())
    """
)


def _write_kernel(path, body):
    path.write_text(
        "import warp as wp\n\n@wp.kernel\ndef sq(x: wp.array(dtype=float), y: wp.array(dtype=float)):\n"
        f"    i = wp.tid()\n    y[i] = {body}\n"
    )


def _run(tmp_path, mode):
    return subprocess.run(
        [sys.executable, "-c", EXPORT, mode], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )


@pytest.mark.compile
def test_an_exported_program_never_runs_a_different_kernel(tmp_path):
    _write_kernel(tmp_path / "exp_mod.py", "x[i] * x[i]")
    saved = _run(tmp_path, "save")
    assert saved.returncode == 0, saved.stderr[-2000:]
    same = _run(tmp_path, "load")
    assert same.returncode == 0, same.stderr[-2000:]
    assert same.stdout.strip().splitlines()[-1] == "[2.0, 5.0, 10.0]"
    _write_kernel(tmp_path / "exp_mod.py", "x[i] + x[i]")  # same module and name, other source
    changed = _run(tmp_path, "load")
    assert changed.returncode != 0 and "warpbridge" in changed.stderr  # fails loudly, no other kernel runs


def test_a_module_executed_again_reuses_the_registration():
    import importlib.util

    def load():
        spec = importlib.util.spec_from_file_location("kernels", os.path.join(HERE, "kernels.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    first, second = wb.op(load().square), wb.op(load().square)
    assert first is not second and first.registration_name == second.registration_name
    assert first.torch_op is second.torch_op
    torch.testing.assert_close(second(torch.tensor([3.0])), torch.tensor([9.0]))


def test_a_backward_on_an_op_sharing_another_ops_registration_is_refused():
    first, second = wb.WarpOp(K.square), wb.WarpOp(K.square)  # two objects, one registration
    assert first.torch_op is second.torch_op
    with pytest.raises(wb.WarpBridgeError, match="shares its registered custom op with another op object"):
        second.backward(K.square)
