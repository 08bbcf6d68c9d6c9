"""The `warpbridge` command end to end: demo --quick, doctor, --help and bad options."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from warpbridge._cli import main as cli


def run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "warpbridge", *args], capture_output=True, text=True, timeout=timeout)


def test_demo_quick_end_to_end(tmp_path):
    p = run("demo", "--quick", "--no-progress", "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr
    data = json.loads((tmp_path / "demo.json").read_text())
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    assert data["meta"]["device"] == "cpu" and data["meta"]["quick"] is True
    for variant in ("radius", "knn"):
        rows = data["variants"][variant]
        tutorial = {"tutorial kernel"} if variant == "radius" else set()
        assert set(rows) == {"torch", "torch.compile", "warpbridge"} | tutorial
        for name, r in rows.items():
            assert r["forward_ms"] > 0 and r["step_ms"] > 0, name
            assert len(r["losses"]) == data["meta"]["sizes"][variant]["steps"]
            if name == "tutorial kernel":
                continue
            assert r["max_grad_error"] < 1e-4, (variant, name)  # float32 against the float64 model
            assert r["losses"][-1] < r["losses"][0]
        # the three backends train the same model from the same weights: same loss curve
        for name in ("torch.compile", "warpbridge"):
            assert rows[name]["losses"] == pytest.approx(rows["torch"]["losses"], rel=1e-4)
    # the tutorial's kernel with Warp's adjoint: the bug the demo exists to show
    bad = data["variants"]["radius"]["tutorial kernel"]
    assert bad["max_grad_error"] > 0.1
    assert "| warpbridge      |" in p.stdout and "| tutorial kernel |" in p.stdout
    # Warp's banner, module-load lines and the no-CUDA-driver warning would cut through the
    # progress bar: the demo keeps them quiet
    for noise in ("Module ", "Warp 1.", "CUDA driver"):
        assert noise not in p.stdout + p.stderr, noise


def test_doctor():
    p = run("doctor", timeout=120)
    assert p.returncode == 0, p.stderr
    assert "warp-lang" in p.stdout and "Warp kernel cache:" in p.stdout and "torch" in p.stdout
    report = cli.doctor_report()
    assert report["frameworks"]["torch"]["usable"] is True
    assert report["versions"]["warp-lang"] and os.path.isdir(report["warp_kernel_cache"])
    for name in ("jax", "paddle"):
        assert report["frameworks"][name]["why"]  # usable or not, it says why


@pytest.mark.parametrize("args", [[], ["demo"], ["bench"], ["doctor"]])
def test_help(args, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([*args, "--help"])
    assert e.value.code == 0
    assert "usage: warpbridge" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args,message",
    [
        (["demo", "--device", "tpu"], "invalid choice: 'tpu'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "required"),
        (["bench", "--only", "nope"], "invalid choice: 'nope'"),
    ],
)
def test_bad_options_exit_1_with_a_message(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(args)
    assert e.value.code == 1
    assert message in capsys.readouterr().err


def test_demo_cuda_without_a_gpu_fails_cleanly(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the failure path cannot be exercised")
    assert cli.main(["demo", "--device", "cuda"]) == 1
    assert "no CUDA device" in capsys.readouterr().err


def test_bench_charts_every_committed_result(tmp_path):
    results = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
    jsons = sorted(results.glob("*.json"))
    assert {p.name.split("-")[0] for p in jsons} >= {"overhead", "neighbors", "grad_buffer", "memory_pool"}
    for p in jsons:
        shutil.copy(p, tmp_path / p.name)
    written = cli._charts(tmp_path)
    assert sorted(w.name for w in written) == sorted(p.with_suffix(".png").name for p in jsons)
    assert all(w.stat().st_size > 5_000 for w in written)


@pytest.mark.parametrize("where", ["under_a_file", "empty"])
def test_an_unusable_output_folder_is_refused_before_any_work(where, tmp_path, capsys, monkeypatch):
    started = []
    monkeypatch.setattr(cli, "demo", lambda args: started.append(args) or 0)
    (tmp_path / "file").write_text("")
    out = str(tmp_path / "file" / "demo-out") if where == "under_a_file" else ""
    assert cli.main(["demo", "--quick", "--out", out]) == 1
    assert not started  # refused before the demo began
    assert "error: --out" in capsys.readouterr().err


def test_ctrl_c_exits_130(monkeypatch, tmp_path, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "demo", interrupted)
    assert cli.main(["demo", "--out", str(tmp_path)]) == 130
    assert "interrupted" in capsys.readouterr().err
