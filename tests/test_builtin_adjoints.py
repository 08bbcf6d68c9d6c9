"""Warp's builtins against float64 finite differences (``builtin_sweep``), and warpbridge's
table of the ones whose adjoint loses a gradient (``builtin_adjoints``, which rule 7 refuses):
every gradient the sweep finds lost is refused, no right gradient is refused, nothing whose
derivative is zero almost everywhere is refused. Runs the whole sweep once (about a minute of
compilation on a fresh machine)."""

import re

import builtin_sweep as S
import pytest
import warp as wp

from warpbridge._core import builtin_adjoints as table
from warpbridge._core import warp_runtime


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    verdicts, left_out = S.sweep(str(tmp_path_factory.mktemp("sweep")))
    return verdicts, left_out


@pytest.fixture(scope="module")
def tiles(tmp_path_factory):
    return S.tile_sweep(str(tmp_path_factory.mktemp("tiles")))


def refused(v):
    c = v.case
    floating = tuple(p for p, t in zip(c.params, c.types) if S.components(t))
    return table.lost_gradients(c.builtin, bool(c.overload.is_differentiable), floating, v.floating_result)


def test_the_table_was_measured_on_the_installed_warp():
    assert wp.config.version.startswith(table.MEASURED_ON), (
        f"builtin_adjoints was measured on warp-lang {table.MEASURED_ON}, this is {wp.config.version}: run "
        "tests/builtin_sweep.py and update the table"
    )


def test_the_sweep_covers_the_builtins_that_take_floating_arguments(swept):
    verdicts, _ = swept
    assert len(verdicts) > 300
    covered = {v.case.builtin for v in verdicts}
    assert {"sin", "frac", "mod", "curlnoise", "svd3", "eig3", "quat_rotate", "transform_point", "inverse"} <= covered


def test_every_gradient_the_sweep_finds_lost_is_refused(swept):
    verdicts, _ = swept
    holes = [f"wp.{v.case.builtin}{v.case.types}: {sorted(v.bad - refused(v))}" for v in verdicts if v.bad - refused(v)]
    assert not holes, "Warp's adjoint loses these gradients and builtin_adjoints does not refuse them:\n" + "\n".join(
        holes
    )
    found = {v.case.builtin for v in verdicts if v.bad}
    assert {"frac", "mod", "curlnoise", "randf"} <= found  # what the table was built from


def test_no_right_gradient_is_refused(swept):
    verdicts, _ = swept
    over = [
        f"wp.{v.case.builtin}{v.case.types}: {p}" for v in verdicts for p in refused(v) if v.params.get(p) == "right"
    ]
    assert not over, "builtin_adjoints refuses gradients Warp's adjoint gets right:\n" + "\n".join(over)


def test_nothing_whose_derivative_is_zero_is_refused(swept):
    verdicts, _ = swept
    over = [
        f"wp.{v.case.builtin}{v.case.types}"
        for v in verdicts
        if refused(v) and all(verdict == "constant" for verdict in v.params.values())
    ]
    assert not over, "builtin_adjoints refuses builtins whose derivative is zero:\n" + "\n".join(over)
    rounding = {v.case.builtin for v in verdicts if v.case.builtin in table.ZERO_ALMOST_EVERYWHERE}
    assert rounding == table.ZERO_ALMOST_EVERYWHERE  # each one is swept


def tile_builtin(case_name):
    return re.match(r"\w+", case_name).group(0)


def test_tile_builtins_are_refused_exactly_where_their_gradient_is_lost(tiles):
    verdicts, left_out = tiles
    assert len(verdicts) >= 27, left_out
    functions = warp_runtime.builtin_functions()
    wrong = []
    for name, verdict in verdicts.items():
        builtin = tile_builtin(name)
        lost = table.lost_gradients(builtin, bool(functions[builtin].is_differentiable), ("a",), True)
        if bool(lost) != (verdict in ("lost", "wrong")):
            wrong.append(f"{name}: the sweep says {verdict}, the table {'refuses' if lost else 'passes'} it")
    assert not wrong, "\n".join(wrong)
    assert {n for n, v in verdicts.items() if v == "lost"} >= {"tile_max", "tile_scan_inclusive", "tile_cholesky_solve"}


def test_the_docs_list_every_builtin_the_sweep_finds_lost(swept, tiles):
    with open(S.__file__.replace("tests/builtin_sweep.py", "docs/correctness.md")) as f:
        docs = f.read()
    lost = {v.case.builtin for v in swept[0] if v.bad} | {tile_builtin(n) for n, v in tiles[0].items() if v == "lost"}
    missing = sorted(b for b in lost if f"`{b}`" not in docs)
    assert not missing, f"docs/correctness.md does not name {missing}"
