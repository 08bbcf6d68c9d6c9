"""The import rules of docs/architecture.md, checked on the source: the core names no
framework, an adapter imports no other framework's adapter or framework, and the neighbour
ops reach frameworks only through ``wb.op``."""

import ast
import pathlib
import re

import pytest

PKG = pathlib.Path(__file__).resolve().parent.parent / "warpbridge"
FRAMEWORKS = ("torch", "jax", "jaxlib", "paddle", "cupy")
ADAPTERS = ("_torch", "_jax", "_paddle", "_numpy", "_dlpack")
CORE = (
    "_op",
    "_signature",
    "_plan",
    "_validate",
    "_functions",
    "_gradients",
    "_backward",
    "_adjoint",
    "_backend",
    "_errors",
)
WORD = re.compile(r"\b(" + "|".join(FRAMEWORKS + ("numpy",)) + r")\b", re.IGNORECASE)


def _source(module: str) -> pathlib.Path:
    path = PKG / (module.replace(".", "/") + ".py")
    return path if path.exists() else PKG / module.replace(".", "/") / "__init__.py"


def _imports(tree: ast.AST) -> set[str]:
    """Modules imported, as absolute names relative to warpbridge (``.x`` -> ``x``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ("." * node.level) + (node.module or "")
            found.add(base)
            found.update(base + a.name if base.endswith(".") else f"{base}.{a.name}" for a in node.names)
    return found


def _top(name: str) -> str:
    return name.lstrip(".").split(".")[0]


def _code_words(tree: ast.AST) -> list[tuple[int, str]]:
    """Framework names in identifiers and string constants, docstrings excluded."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    hits = []
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
        elif isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            text = node.name
        elif isinstance(node, ast.arg):
            text = node.arg
        if text and WORD.search(text.replace("_", " ")):
            hits.append((getattr(node, "lineno", 0), text))
    return hits


@pytest.mark.parametrize("module", [m for m in CORE if _source(m).exists()])
def test_the_core_imports_and_names_no_framework(module):
    tree = ast.parse(_source(module).read_text())
    bad = [m for m in _imports(tree) if _top(m) in FRAMEWORKS + ("numpy",) or _top(m) in ADAPTERS or "ops" in m]
    assert not bad, f"warpbridge/{module}.py imports {bad}: the core reaches frameworks only through backends"
    # (numpy too: it is an adapter's framework, even though Warp depends on it)
    words = _code_words(tree)
    assert not words, f"warpbridge/{module}.py names a framework in code: {words}"


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_an_adapter_imports_only_its_own_framework_and_no_other_adapter(adapter):
    own = {"_torch": "torch", "_jax": "jax", "_paddle": "paddle", "_numpy": "numpy", "_dlpack": None}[adapter]
    files = (
        [_source(adapter)] + sorted((PKG / adapter).glob("*.py")) if (PKG / adapter).is_dir() else [_source(adapter)]
    )
    for path in files:
        imported = {_top(m) for m in _imports(ast.parse(path.read_text())) if not m.startswith(".")}
        others = [f for f in FRAMEWORKS if f in imported and f != own and not (own == "jax" and f == "jaxlib")]
        assert not others, f"{path.name} imports {others}"
        # every component of a relative import: `from .. import _jax` and `from .._jax import x`
        rel = {part for m in _imports(ast.parse(path.read_text())) if m.startswith(".") for part in m.split(".")}
        assert not (set(ADAPTERS) - {adapter}) & rel, f"{path.name} imports another adapter: {rel}"


@pytest.mark.parametrize("module", ["ops/__init__", "ops/_run", "ops/_core", "ops/_kernels"])
def test_the_neighbour_ops_reach_frameworks_only_through_wb_op(module):
    tree = ast.parse((PKG / f"{module}.py").read_text())
    bad = [m for m in _imports(tree) if _top(m) in FRAMEWORKS or _top(m) in ADAPTERS]
    assert not bad, f"warpbridge/{module}.py imports {bad}"


def test_the_rules_catch_a_violation(tmp_path):
    """The checks above can fail: a core-like module importing torch and naming jax is caught."""
    tree = ast.parse("import torch\nfrom . import _jax\nx = 'jax'\n")
    assert {_top(m) for m in _imports(tree)} >= {"torch"}
    assert any("_jax" in m for m in _imports(tree))
    assert _code_words(tree)
