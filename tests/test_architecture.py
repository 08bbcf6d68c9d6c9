"""The rules of docs/architecture.md, checked on the source.

- ``_core`` and ``ops`` name no framework (imports, identifiers, strings); each backend imports
  only its own framework and no other backend;
- no import cycle among the package's modules;
- Warp's internals (``wp._src``) only in ``_core/warp_runtime.py``;
- functions stay short; the neighbour-op kernels take few parameters, in files of a few
  hundred lines;
- no process-wide hooks and no class swaps (an object's ``__class__`` assigned, another
  module's attributes set) outside the few places that need one, each named below with why;
- an op's private attributes are read in ``_core/op.py`` alone, and validation sees a
  signature, never the op.
"""

import ast
import pathlib
import re

import pytest

PKG = pathlib.Path(__file__).resolve().parent.parent / "warpbridge"
FRAMEWORKS = ("torch", "jax", "jaxlib", "paddle", "cupy", "numpy")
BACKENDS = {"torch": "torch", "jax": "jax", "paddle": "paddle", "numpy": "numpy", "dlpack": None}
WORD = re.compile(r"\b(" + "|".join(FRAMEWORKS) + r")\b", re.IGNORECASE)
MAX_FUNCTION_LINES = 80  # lines of code: a docstring does not count
MAX_KERNEL_PARAMS = 12
MAX_FUNC_PARAMS = 14  # a @wp.func or native function of ops/
MAX_OPS_FILE_LINES = 400


def _files(under: str = "") -> list[pathlib.Path]:
    return sorted((PKG / under).rglob("*.py"))


def _name(path: pathlib.Path) -> str:
    return path.relative_to(PKG).as_posix()


def _module(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in _files()}


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:``."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside.update(id(n) for b in node.body for n in ast.walk(b))
    return inside


def _imports(path: pathlib.Path, module_scope: bool = False, strict: bool = False) -> set[str]:
    """Absolute names of what ``path`` imports (package modules resolved; ``if TYPE_CHECKING``
    left out unless ``strict``). ``module_scope``: only imports run when the module is imported."""
    tree = ast.parse(path.read_text())
    skip = set() if strict else _type_checking_only(tree)
    nodes = [n for n in ast.walk(tree) if id(n) not in skip]
    if module_scope:
        nodes = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    here = _module(path).split(".")
    base = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                target = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            for a in node.names:
                full = f"{target}.{a.name}"
                found.add(full if full in MODULES else target)
    return found


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


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict = {}
    low: dict = {}
    stack: list = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


FRAMEWORK_FREE = [p for p in _files("_core") + _files("ops")]


@pytest.mark.parametrize("path", FRAMEWORK_FREE, ids=_name)
def test_the_core_and_the_ops_name_no_framework(path):
    """The ops may use NumPy, Warp's own dependency, for host arithmetic on Warp arrays; the
    core not even that."""
    banned = FRAMEWORKS if _name(path).startswith("_core/") else tuple(f for f in FRAMEWORKS if f != "numpy")
    bad = [m for m in _imports(path) if m.split(".")[0] in banned or m.startswith("warpbridge._backends")]
    if _name(path) == "_core/op.py":  # the registry, which loads backends as data, is the one way in
        bad = [m for m in bad if m != "warpbridge._backends.registry"]
    assert not bad, f"warpbridge/{_name(path)} imports {bad}: the core reaches frameworks only through backends"
    words = [(line, w) for line, w in _code_words(ast.parse(path.read_text())) if re.search(_word(banned), w)]
    assert not words, f"warpbridge/{_name(path)} names a framework in code: {words}"


def _word(names: tuple) -> str:
    return r"(?i)(^|[^a-z])(" + "|".join(names) + r")($|[^a-z])"


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_backend_imports_only_its_own_framework_and_no_other_backend(backend):
    own = BACKENDS[backend]
    root = PKG / "_backends" / backend
    files = _files(f"_backends/{backend}") if root.is_dir() else [root.with_suffix(".py")]
    for path in files:
        imported = _imports(path)
        others = [f for f in FRAMEWORKS if f in {m.split(".")[0] for m in imported} and f not in (own, "numpy")]
        if own == "jax":
            others = [f for f in others if f != "jaxlib"]
        assert not others, f"{_name(path)} imports {others}"
        siblings = {f"warpbridge._backends.{b}" for b in BACKENDS if b != backend}
        crossed = [m for m in imported if any(m == s or m.startswith(s + ".") for s in siblings)]
        assert not crossed, f"{_name(path)} imports another backend: {crossed}"


def test_no_import_cycle_among_the_modules():
    """No cycle, counting every import (module scope, inside functions, under TYPE_CHECKING:
    the core reaches the backends through the slot the registry fills, ``_core.frameworks``),
    and the framework-free modules defer no import of another package module into a function;
    the backend registry's lazy load of a backend is the one deferred import, by design."""
    graph = {m: {i for i in _imports(p, strict=True) if i in MODULES and i != m} for m, p in MODULES.items()}
    assert not _cycles(graph), f"import cycles: {_cycles(graph)}"
    for path in FRAMEWORK_FREE:
        deferred = _imports(path) - _imports(path, module_scope=True)
        inside = sorted(m for m in deferred if m in MODULES)
        assert not inside, f"warpbridge/{_name(path)} imports {inside} inside a function"


def test_warp_internals_only_in_the_runtime_module():
    offenders = [
        _name(p) for p in _files() if "_src" in p.read_text() and _name(p) != "_core/warp_runtime.py"
    ]  # fmt: skip
    assert not offenders, f"wp._src used outside _core/warp_runtime.py: {offenders}"


def _functions():
    for path in _files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{_name(path)}:{node.name}", node


def _code_lines(node: ast.AST) -> int:
    """A function's lines, its docstring left out (a public function documents its arguments)."""
    lines = node.end_lineno - node.lineno + 1
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def test_functions_are_short():
    too_long = {key: _code_lines(node) for key, node in _functions() if _code_lines(node) > MAX_FUNCTION_LINES}
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines: {too_long}"


def test_the_neighbour_kernels_take_few_parameters():
    kernels = {}
    for key, node in _functions():
        if key.startswith("ops/") and any(isinstance(d, ast.Name) and d.id == "kernel" for d in node.decorator_list):
            kernels[node.name] = len(node.args.args)
    assert len(kernels) >= 15, f"the rule sees only {sorted(kernels)}: are the kernels still tagged @kernel?"
    wide = {name: n for name, n in kernels.items() if n > MAX_KERNEL_PARAMS}
    assert not wide, f"kernels over {MAX_KERNEL_PARAMS} parameters: {wide}"


def _warp_function(node: ast.AST) -> bool:
    """A Warp function of ops/: ``@func``, ``@kernel``, ``@template.func_native(...)``, ``@wp.func``."""
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name in ("func", "kernel", "func_native"):
            return True
    return False


def test_every_warp_function_takes_few_parameters():
    functions = {
        key: len(node.args.args) for key, node in _functions() if key.startswith("ops/") and _warp_function(node)
    }
    assert len(functions) >= 60, f"the rule sees only {len(functions)} Warp functions: are they still tagged?"
    wide = {key: n for key, n in functions.items() if n > MAX_FUNC_PARAMS}
    assert not wide, f"Warp functions over {MAX_FUNC_PARAMS} parameters: {wide}"


def test_the_neighbour_op_files_are_small():
    sizes = {_name(p): len(p.read_text().splitlines()) for p in _files("ops")}
    big = {name: n for name, n in sizes.items() if n > MAX_OPS_FILE_LINES}
    assert not big, f"files in ops/ over {MAX_OPS_FILE_LINES} lines: {big}"


# Calls that change the whole process: tracing and profiling, signal handlers, exit and fork
# handlers, audit hooks, warning filters.
PROCESS_HOOKS = {
    "sys.setprofile", "sys.settrace", "threading.setprofile", "threading.settrace", "signal.signal",
    "atexit.register", "os.register_at_fork", "sys.addaudithook", "warnings.filterwarnings",
    "warnings.simplefilter", "faulthandler.enable",
}  # fmt: skip
# What may do one of them, and why.
ALLOWED_HOOKS = {
    # JAX dispatches asynchronously: a computation still running a warpbridge op when the
    # interpreter exits would hang it (tests/test_exit.py); waited for at exit.
    ("_backends/jax.py", "atexit.register"),
    # While one of warpbridge's own tapes records, Warp's runtime gets a per-thread ``tape``
    # property (its class swapped for a subclass, swapped back after): the only way to keep
    # Warp's one process-wide tape from recording other threads' launches.
    ("_core/warp_runtime.py", "__class__"),
    # Warp's greeting silenced around warpbridge's own wp.init(), and restored.
    ("_core/warp_runtime.py", "wp.config"),
    # The command-line tool owns its process.
    ("_cli/main.py", "wp.config"),
}
_IMPORTED_MODULES = ("wp", "warp", "torch", "jax", "paddle", "np", "numpy", "sys", "os", "threading", "builtins")


def _hooks(tree: ast.AST) -> set[str]:
    """The process hooks a module calls, the ``__class__`` it assigns and the attributes of
    imported modules it sets (as ``wp.config``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in PROCESS_HOOKS:
            found.add(ast.unparse(node.func))
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
        )
        for t in targets:
            if isinstance(t, ast.Attribute) and t.attr == "__class__":
                found.add("__class__")
            elif isinstance(t, ast.Attribute) and ast.unparse(t).split(".")[0] in _IMPORTED_MODULES:
                found.add(ast.unparse(t.value))
    return found


def test_no_process_hooks_or_class_swaps_but_the_named_ones():
    seen = {(_name(p), hook) for p in _files() for hook in _hooks(ast.parse(p.read_text()))}
    assert seen - ALLOWED_HOOKS == set(), f"process hooks or class swaps not allowed: {sorted(seen - ALLOWED_HOOKS)}"
    assert ALLOWED_HOOKS - seen == set(), f"allowed but gone (drop them from the list): {sorted(ALLOWED_HOOKS - seen)}"


def _op_private_reads(tree: ast.AST) -> set[str]:
    """``op._x`` / ``self.op._x`` reads: an op's private attributes."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "op") or (
                isinstance(owner, ast.Attribute) and owner.attr == "op"
            ):
                found.add(ast.unparse(node))
    return found


def _names_an_op(tree: ast.AST) -> set[str]:
    """Parameters or names called ``op`` used as an object (``op.x``)."""
    return {ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and ast.unparse(n.value) == "op"}


def test_an_ops_private_state_stays_in_the_op_and_validation_sees_only_the_signature():
    reads = {
        (_name(p), r)
        for p in _files()
        if _name(p) != "_core/op.py"
        for r in _op_private_reads(ast.parse(p.read_text()))
    }
    assert not reads, f"an op's private attributes read outside _core/op.py: {sorted(reads)}"
    uses = _names_an_op(ast.parse((PKG / "_core" / "validate.py").read_text()))
    assert not uses, f"_core/validate.py reaches into an op: {sorted(uses)}"


def test_the_rules_catch_a_violation(tmp_path):
    """The checks above can fail: imports of a framework, framework names, a cycle."""
    tree = ast.parse("import torch\nx = 'jax'\n")
    assert _code_words(tree)
    bad = tmp_path / "m.py"
    bad.write_text("import torch\n")
    assert "torch" in {m.split(".")[0] for m in ast.dump(ast.parse(bad.read_text())).split("'") if m}
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert not _cycles({"a": {"b"}, "b": set()})
    hooks = "import sys, atexit\nsys.setprofile(f)\natexit.register(g)\nx.__class__ = Y\ntorch.Tensor.add = h\n"
    assert _hooks(ast.parse(hooks)) == {"sys.setprofile", "atexit.register", "__class__", "torch.Tensor"}
    peeks = ast.parse("op._packers[0](x)\nself.op._array_positions\nop.__class__\n_op._helper()\n")
    assert _op_private_reads(peeks) == {"op._packers", "self.op._array_positions"}
    assert _names_an_op(ast.parse("def f(op): op.check_arity(a)\n")) == {"op.check_arity"}
