"""What Warp's generated adjoint of a kernel can and cannot get right (rule 7).

Two facts are read once per kernel:

* **Array accesses** (:func:`array_accesses`): which array parameters the kernel reads, writes,
  or reads and then overwrites, followed through every ``@wp.func`` it passes them to.
* **Hazards** (:func:`hazards`): constructs whose generated adjoint is silently wrong.

  - A variable that a *dynamic* loop changes (``while``; ``for`` over a runtime ``range`` or
    one longer than the module's ``max_unroll``; ``wp.hash_grid_query``, ``wp.mesh_query_*``,
    ``wp.bvh_query_*`` iterators). Warp's adjoint does not replay such loops, so those values
    are stale when it runs. The loops are the ones Warp's own code generator leaves dynamic:
    warpbridge runs the generator (no compilation) and records what it reports, so a loop
    Warp unrolls is never flagged. Integer variables a ``while`` loop changes and nothing
    after the loop reads are fine (the reverse loop replays them in order) and are not
    reported, nor are accumulators only ever added to and read as additive terms
    (``acc += a[i, k] * b[k, j]`` ... ``c[i, j] = acc``): their adjoint never needs their value.
    Functions with their own ``@wp.func_grad`` are not looked into.
  - An output element read and then overwritten by a non-additive store (``y[i] *= v``,
    ``y[i] = y[i] * v``): the adjoint only has the final value, not the one that was read.
"""

from __future__ import annotations

import ast
import inspect
import threading
from typing import Any, NamedTuple

import warp as wp

from .builtin_adjoints import lost_gradients
from .warp_runtime import (
    INT_TYPES,
    Findings,
    build_code,
    builtin_name,
    is_floating,
    is_struct,
    is_user_function,
    warp_builtin,
)

_ATOMIC_WRITES = frozenset(
    {"atomic_add", "atomic_sub", "atomic_min", "atomic_max", "atomic_cas", "atomic_exch", "atomic_and",
     "atomic_or", "atomic_xor"}
)  # fmt: skip
# Atomics whose adjoint reads the array's value (min/max compare against it): reads as well.
_ATOMIC_READS = frozenset({"atomic_min", "atomic_max", "atomic_cas", "atomic_exch"})
_METADATA = frozenset({"shape", "ndim", "size", "strides", "dtype"})
_MAX_DEPTH = 16


class Accesses(NamedTuple):
    reads: frozenset[str]
    writes: frozenset[str]
    unknown: frozenset[str]  # used in a way that cannot be followed: treated as a possible read
    overwritten: dict[str, int]  # array -> line of a non-additive store after a read of it
    restored: frozenset[str]  # stored more than once (or in a loop): the adjoint must consume its gradient
    read_after_write: dict[str, int]  # array -> line of a read that may see an element the kernel stored


class Hazard(NamedTuple):
    """One construct whose generated adjoint cannot be trusted."""

    kernel: str
    where: str  # file:line
    variable: str  # "" for a construct that is not a variable (a call)
    why: str
    # the kernel parameters whose gradient passes through it (None: whichever is asked for)
    sources: frozenset[str] | None = None

    def concerns(self, asked: frozenset[str]) -> bool:
        """Whether it matters when the gradients of parameters ``asked`` are asked for."""
        return self.sources is None or bool(self.sources & asked)


def _resolve(fn_globals: dict, closure: dict, node: ast.AST) -> Any:
    """The object an ``f`` or ``mod.f`` call refers to in the kernel's scope, or None."""
    if isinstance(node, ast.Name):
        if node.id in closure:
            return closure[node.id]
        return fn_globals.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _resolve(fn_globals, closure, node.value)
        found = getattr(base, node.attr, None) if base is not None else None
        if found is None and base is wp:
            return warp_builtin(node.attr)  # wp.tile_load and others are not module attributes
        return found
    return None


def _scope(pyfunc: Any) -> tuple[dict, dict]:
    try:
        cv = inspect.getclosurevars(pyfunc)
        return dict(getattr(pyfunc, "__globals__", {})), dict(cv.nonlocals)
    except (TypeError, ValueError):
        return dict(getattr(pyfunc, "__globals__", {})), {}


def _user_function(obj: Any) -> Any:
    """A user ``@wp.func`` (with source we can read), else None."""
    if not is_user_function(obj):
        return None
    return obj if getattr(getattr(obj, "adj", None), "tree", None) is not None else None


def _constant(node: ast.AST) -> bool:
    """A literal, or a type constructor of literals (``wp.float64(2.0)``)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _constant(node.operand)
    if isinstance(node, ast.Call):
        return not node.keywords and all(_constant(a) for a in node.args)
    return False


def _additive_term(node: ast.AST, target: ast.AST, inert: frozenset[str] = frozenset()) -> bool:
    """Whether ``node`` depends on ``target`` only through sums, differences, components and
    factors that are constants or ``inert`` names (values whose gradient nobody needs), so that
    its adjoint does not need ``target``'s value."""
    if node is target:
        return True

    def factor(n: ast.AST) -> bool:
        return _constant(n) or _inert(n, inert)

    def linear(n: ast.AST) -> bool:
        return not _contains(n, target) or _additive_term(n, target, inert)

    if isinstance(node, ast.BinOp):
        if isinstance(node.op, (ast.Add, ast.Sub)):
            return linear(node.left) and linear(node.right)
        if isinstance(node.op, ast.Mult):
            if factor(node.right):
                return _additive_term(node.left, target, inert)
            if factor(node.left):
                return _additive_term(node.right, target, inert)
        if isinstance(node.op, ast.Div) and factor(node.right):
            return _additive_term(node.left, target, inert)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _additive_term(node.operand, target, inert)
    if isinstance(node, ast.Subscript) and not _contains(node.slice, target):
        return _additive_term(node.value, target, inert)  # a component: v[0]
    if isinstance(node, ast.Call) and not node.keywords and _cast(node.func, inert):
        return all(linear(a) for a in node.args)  # wp.vec3(v[0] + r[0], ...), a cast
    return False


# Calls that build a value linearly from their arguments.
_CONSTRUCTORS = frozenset(
    {"float", "float16", "float32", "float64", "vec2", "vec3", "vec4", "vec2f", "vec3f", "vec4f", "vec2d", "vec3d",
     "vec4d", "vec2h", "vec3h", "vec4h", "vector"}
)  # fmt: skip


def _constructor(func: ast.AST) -> bool:
    return (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")) in _CONSTRUCTORS


def _cast(func: ast.AST, inert: frozenset[str]) -> bool:
    """A call that builds a value linearly from its arguments: a constructor, a name holding a
    Warp value type (in ``inert``), or an array's own type (``result.dtype(v)``)."""
    if isinstance(func, ast.Attribute) and func.attr == "dtype":
        return True
    return _constructor(func) or (isinstance(func, ast.Name) and func.id in inert)


def _inert(node: ast.AST, inert: frozenset[str]) -> bool:
    """An expression of constants and ``inert`` names only (arithmetic and calls on them)."""
    names = [n for n in ast.walk(node) if isinstance(n, ast.Name)]
    calls = {id(c.func) for c in ast.walk(node) if isinstance(c, ast.Call)}
    calls |= {id(n) for c in ast.walk(node) if isinstance(c, ast.Call) for n in ast.walk(c.func)}
    if any(isinstance(n, (ast.Subscript, ast.Attribute)) and id(n) not in calls for n in ast.walk(node)):
        return False  # a load from an array or a struct: a differentiable value
    return all(n.id in inert or id(n) in calls for n in names)


def inert_names(adj: Any) -> frozenset[str]:
    """Names in a kernel whose value no adjoint warpbridge returns depends on: its scalar
    parameters (warpbridge discards scalar adjoints) and locals computed from those and
    constants only (``n2 = float(n * n)``), none ever reassigned otherwise. A ``@wp.func``'s
    parameters carry gradients to its caller: none of them is inert."""
    if getattr(adj, "is_user_function", True):
        return frozenset()
    inert = {a.label for a in adj.args if not wp.types.is_array(a.type)}
    assigned: dict[str, list[ast.AST | None]] = {}
    for node in ast.walk(adj.tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        assigned.setdefault(n.id, []).append(node.value if isinstance(t, ast.Name) else None)
        elif isinstance(node, (ast.AugAssign, ast.For)):
            for n in ast.walk(node.target):
                if isinstance(n, ast.Name):
                    assigned.setdefault(n.id, []).append(None)
    inert -= set(assigned)  # a scalar parameter reassigned in the kernel
    changed = True
    while changed:  # locals from inert values, to a fixed point
        changed = False
        for name, values in assigned.items():
            if name not in inert and all(v is not None and _inert(v, frozenset(inert)) for v in values):
                inert.add(name)
                changed = True
    return frozenset(inert)


def _chain(sub: ast.AST) -> list[ast.AST]:
    """The index expressions of ``a[i][j]`` / ``a[i, j]``, outermost array index first."""
    out = []
    while isinstance(sub, ast.Subscript):
        sl = sub.slice
        out[:0] = list(sl.elts) if isinstance(sl, ast.Tuple) else [sl]
        sub = sub.value
    return out


def _disjoint(a: ast.AST, b: ast.AST) -> bool:
    """Whether two accesses of one array provably touch different elements: the same index
    expressions up to a position where both are different integer literals."""
    for x, y in zip(_chain(a), _chain(b)):
        if isinstance(x, ast.Constant) and isinstance(y, ast.Constant):
            if x.value != y.value:
                return True
            continue
        if ast.dump(x) != ast.dump(y):
            return False
    return False


def _contains(node: ast.AST, target: ast.AST) -> bool:
    return any(n is target for n in ast.walk(node))


def array_accesses(tree: ast.AST, pyfunc: Any, names: set[str], depth: int = 0) -> Accesses:
    """How the function whose AST is ``tree`` uses each of ``names`` (array parameters).

    Stores ``a[i] = v``, ``a[i][j] = v``, augmented assignments and atomics are writes; a load
    ``a[i]`` is a read (its adjoint adds into ``adj_a``); ``a[i] *= v`` and ``atomic_min/max``
    are both. An array passed to a ``@wp.func`` is followed into that function for its reads
    and writes, and is also *unknown*: the function's adjoint replays its forward, stores
    included, so it needs the real array. Anything else (aliasing it, a native or unresolvable
    function) is *unknown* too. Metadata (``a.shape``) is
    none of these.
    """
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    fn_globals, closure = _scope(pyfunc)
    f = _Found()

    def stmt_of(node: ast.AST) -> ast.AST:
        while node in parents and not isinstance(node, ast.stmt):
            node = parents[node]
        return node

    for node in ast.walk(tree):
        if not (isinstance(node, ast.Name) and node.id in names and isinstance(node.ctx, ast.Load)):
            continue
        parent = parents.get(node)
        if isinstance(parent, ast.Attribute) and parent.attr in _METADATA:
            continue
        tile = _tile_access(parents, node)
        if tile is not None:
            call, kind, access = tile
            f.tile_access(node.id, kind, stmt_of(call), call, access)
            continue
        if isinstance(parent, ast.Subscript) and parent.value is node:
            sub, outer = parent, parents.get(parent)
            if isinstance(outer, ast.Subscript) and outer.value is parent:
                sub = outer  # a[i][j]
            f.element_access(node.id, sub, stmt_of(sub))
            continue
        if isinstance(parent, ast.Call) and node in parent.args + [k.value for k in parent.keywords]:
            fname = _call_name(parent)
            if fname in _ATOMIC_WRITES and parent.args and parent.args[0] is node:
                f.writes.add(node.id)
                if fname in _ATOMIC_READS:
                    f.reads.add(node.id)
                continue
            callee = _user_function(_resolve(fn_globals, closure, parent.func))
            if callee is not None and depth < _MAX_DEPTH:
                label = _parameter_of(callee, parent, node)
                if label is not None:
                    f.through_function(node.id, callee, label, parent.lineno, depth)
                    continue
        f.unknown.add(node.id)

    restored = f.restored_via | {
        name for name, sts in f.stores.items() if len(sts) > 1 or any(_in_loop(parents, stmt) for stmt, _, _ in sts)
    }
    f.keep_tile_loads_after_stores()
    _mark_overwritten(f.stores, f.added, f.loads, f.overwritten)
    return Accesses(
        frozenset(f.reads), frozenset(f.writes), frozenset(f.unknown), f.overwritten, frozenset(restored),
        _reads_after_writes(parents, f.stores, f.added, f.loads, f.unknown | f.restored_via),
    )  # fmt: skip


class _Found:
    """What :func:`array_accesses` finds, array by array."""

    def __init__(self):
        self.reads, self.writes, self.unknown = set(), set(), set()  # array names
        self.loads: dict[str, list[tuple[int, int, ast.AST]]] = {}  # name -> (line, col, load node)
        self.stores: dict[str, list[tuple[ast.stmt, ast.AST | None, ast.AST]]] = {}  # name -> (stmt, rhs, target)
        self.added: dict[str, list[tuple[ast.stmt, ast.AST | None, ast.AST]]] = {}  # name -> a[i] += v stores
        self.overwritten: dict[str, int] = {}
        self.restored_via: set[str] = set()
        self.tile_loads: dict[str, list[tuple[int, int, ast.AST]]] = {}  # name -> (line, col, access)

    def element_access(self, name: str, sub: ast.Subscript, stmt: ast.AST) -> None:
        if not isinstance(sub.ctx, ast.Store):
            self.reads.add(name)
            self.loads.setdefault(name, []).append((stmt.lineno, stmt.col_offset, sub))
            return
        self.writes.add(name)
        if not isinstance(stmt, ast.AugAssign):
            self.stores.setdefault(name, []).append((stmt, getattr(stmt, "value", None), sub))
        elif not isinstance(stmt.op, (ast.Add, ast.Sub)):
            self.reads.add(name)  # a[i] *= v reads a[i]
            self.stores.setdefault(name, []).append((stmt, None, sub))
            self.loads.setdefault(name, []).append((stmt.lineno, stmt.col_offset, sub))
        else:
            # a[i] += f(a[i]) is a[i] = a[i] + f(a[i]): checked like a store, but an atomic add
            # needs no restoring of a's gradient
            self.added.setdefault(name, []).append((stmt, stmt.value, sub))

    def tile_access(self, name: str, kind: str, stmt: ast.AST, call: ast.Call, access: ast.AST) -> None:
        if kind == "read":
            self.reads.add(name)
            self.tile_loads.setdefault(name, []).append((stmt.lineno, stmt.col_offset, access))
        else:  # tile_store is a store of the tile argument; tile_atomic_add adds it
            self.writes.add(name)
            (self.stores if kind == "store" else self.added).setdefault(name, []).append(
                (stmt, _tile_value(call), access)
            )

    def keep_tile_loads_after_stores(self) -> None:
        """A tile loaded from an array the kernel stored to before is read back (checked like
        any read); one loaded before the first store reads what the caller passed (an output's
        zeros), as a GEMM with ``beta`` accumulates into its output, and is left out."""
        for name, entries in self.tile_loads.items():
            writes = [(st.lineno, st.col_offset) for st, _, _ in self.stores.get(name, []) + self.added.get(name, [])]
            first = min(writes, default=None)
            self.loads.setdefault(name, []).extend(e for e in entries if first is not None and e[:2] > first)

    def through_function(self, name: str, callee: Any, label: str, line: int, depth: int) -> None:
        """``name`` passed to ``@wp.func`` ``callee`` as its parameter ``label``."""
        sub_acc = array_accesses(callee.adj.tree, callee.func, {label}, depth + 1)
        for mine, theirs in ((self.writes, sub_acc.writes), (self.reads, sub_acc.reads)):
            if label in theirs:
                mine.add(name)
        if label in sub_acc.overwritten:
            self.overwritten[name] = line
        if label in sub_acc.restored:
            self.restored_via.add(name)
        # The function's adjoint replays its forward, stores included, and a hand-written
        # adjoint or replay may read it: it needs the real array (unknown either way).
        self.unknown.add(name)


# Tile builtins that take an array first: what each does to it, and where its tile argument is
_TILE_ACCESS = {
    "tile_load": ("read", None), "tile_load_indexed": ("read", None),
    "tile_store": ("store", 1), "tile_store_indexed": ("store", 2),
    "tile_atomic_add": ("add", 1), "tile_atomic_add_indexed": ("add", 2),
}  # fmt: skip


def _call_name(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


def _tile_access(parents: dict, node: ast.AST) -> tuple[ast.Call, str, ast.AST] | None:
    """(call, "read" / "store" / "add", the accessed expression) when the array name ``node``,
    or a subscript of it (``y[i]``), is the array argument of a tile load, store or atomic add."""
    access = node
    while isinstance(parents.get(access), ast.Subscript) and parents[access].value is access:
        access = parents[access]
    call = parents.get(access)
    if isinstance(call, ast.Call) and call.args and call.args[0] is access and _call_name(call) in _TILE_ACCESS:
        return call, _TILE_ACCESS[_call_name(call)][0], access
    return None


def _tile_value(call: ast.Call) -> ast.AST | None:
    """The tile a tile store or atomic add writes (positional or ``t=``)."""
    at = _TILE_ACCESS[_call_name(call)][1]
    if at is not None and at < len(call.args):
        return call.args[at]
    return next((k.value for k in call.keywords if k.arg == "t"), None)


def _parameter_of(callee: Any, call: ast.Call, node: ast.AST) -> str | None:
    """The parameter of ``callee`` that the argument ``node`` of ``call`` binds (None: past its
    parameters)."""
    if node in call.args:
        labels = [a.label for a in callee.adj.args]
        i = call.args.index(node)
        return labels[i] if i < len(labels) else None
    return next(k.arg for k in call.keywords if k.value is node)


def _mark_overwritten(stores: dict, added: dict, loads: dict, overwritten: dict) -> None:
    """Add to ``overwritten`` each array with a read followed (or accompanied) by a
    non-additive store: the adjoint sees the stored value (first such store's line)."""
    for name in stores.keys() | added.keys():
        for stmt, rhs, target in stores.get(name, []) + added.get(name, []):
            for line, col, load in loads.get(name, ()):
                if (line, col) > (stmt.lineno, stmt.col_offset) or _disjoint(target, load):
                    continue
                inside = rhs is not None and any(n is load for n in ast.walk(rhs))
                if inside and _additive_term(rhs, load):
                    continue
                if line == stmt.lineno and col == stmt.col_offset and not inside and rhs is not None:
                    continue  # the load is the store's own target chain (a[i][j] = v)
                overwritten.setdefault(name, stmt.lineno)


def _reads_after_writes(parents: dict, stores: dict, added: dict, loads: dict, unknown: set) -> dict[str, int]:
    """Arrays with a load that may see an element the kernel itself stored: after the store in
    the source, or both in one loop (the next iteration reads it). Arrays used in ways that
    cannot be followed count too."""
    found: dict[str, int] = {name: 0 for name in unknown}
    for name in stores.keys() | added.keys():
        for stmt, _, target in stores.get(name, []) + added.get(name, []):
            loop = _loop_of(parents, stmt)
            for line, col, load in loads.get(name, ()):
                if _disjoint(target, load) or (line, col) == (stmt.lineno, stmt.col_offset):
                    continue  # another element, or the store's own statement (read before it stores)
                later = (line, col) > (stmt.lineno, stmt.col_offset)
                if later or (loop is not None and any(n is load for n in ast.walk(loop))):
                    found.setdefault(name, line)
    return found


def _loop_of(parents: dict, node: ast.AST) -> ast.AST | None:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.For, ast.While)):
            return node
    return None


def _in_loop(parents: dict, node: ast.AST) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.For, ast.While)):
            return True
    return False


# -- dynamic loops, as Warp's code generator sees them ----------------------------------------


def _live(tree: ast.AST, pyfunc: Any) -> list[ast.AST]:
    """The nodes of ``tree`` Warp generates code for: the branch of an ``if wp.static(...)``
    (which Warp's parser turns into a constant) whose condition is false is left out."""
    fn_globals, closure = _scope(pyfunc) if pyfunc is not None else ({}, {})
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        found.append(node)
        if isinstance(node, ast.If):
            value = _static_value(node.test, fn_globals, closure)
            if value is not None:
                todo.extend(node.body if value else node.orelse)
                continue
        todo.extend(ast.iter_child_nodes(node))
    return found


def _static_value(test: ast.AST, fn_globals: dict, closure: dict) -> bool | None:
    """The truth of a condition Warp decides when it generates code: a constant, or
    ``wp.static(expr)`` evaluated in the function's scope; None for any other condition."""
    if isinstance(test, ast.Constant):
        return bool(test.value)
    if not (isinstance(test, ast.Call) and _call_name(test) == "static" and len(test.args) == 1):
        return None
    try:
        code = compile(ast.Expression(test.args[0]), "<static>", "eval")
        return bool(eval(code, dict(fn_globals), dict(closure)))  # noqa: S307 - the kernel's own static expression
    except Exception:
        return None


def _only_summed(tree: ast.AST, name: str, inert: frozenset[str] = frozenset(), pyfunc: Any = None) -> bool:
    """Whether every read of the local ``name`` is an additive term (constant or ``inert``
    factors allowed) of an assignment's value or a return value: ``acc += a * b`` ...
    ``out[i] = acc * c``. Then the adjoint only passes gradients through it and never needs its
    (stale) value for anything warpbridge returns."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in _live(tree, pyfunc):
        if not (isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load)):
            continue
        stmt = node
        while stmt in parents and not isinstance(stmt, ast.stmt):
            stmt = parents[stmt]
        value = getattr(stmt, "value", None)
        if not isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return)) or value is None:
            return False
        if not _contains(value, node) or not _additive_term(value, node, inert):
            return False
        if isinstance(stmt, ast.AugAssign) and not isinstance(stmt.op, (ast.Add, ast.Sub)):
            return False
    # and it is never updated other than by adding to it
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.AugAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == name
            and not isinstance(node.op, (ast.Add, ast.Sub))
        ):
            return False
    return True


def _used_outside(tree: ast.AST, loop: ast.AST, name: str) -> bool:
    inside = {id(n) for n in ast.walk(loop)}
    return any(
        isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) and id(n) not in inside
        for n in ast.walk(tree)
    )


def _reachable(adj: Any, seen: dict) -> None:
    """Add to ``seen`` (id -> Adjoint) the ``@wp.func``s ``adj`` calls, and theirs, except
    those with a ``@wp.func_grad`` of their own."""
    for f in getattr(adj, "called_user_functions", {}) or {}:
        fadj = getattr(f, "adj", None)
        if fadj is None or id(fadj) in seen or getattr(f, "custom_grad_func", None) is not None:
            continue
        seen[id(fadj)] = fadj
        _reachable(fadj, seen)


def _functions_of(kernel: Any) -> dict:
    """The kernel's Adjoint and those of the functions whose adjoint Warp generates for it
    (known once its code was generated)."""
    _findings(kernel)
    found = {id(kernel.adj): kernel.adj}
    _reachable(kernel.adj, found)
    return found


_CACHE: dict[Any, Any] = {}
_CACHE_LOCK = threading.Lock()


def _findings(kernel: Any) -> Findings:
    """What generating ``kernel``'s code finds (loops, builtin calls), once per kernel."""
    key = (kernel.module.name, kernel.key, getattr(kernel.adj, "source", None))
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    module = kernel.module
    try:
        options = module.resolve_options(wp.config, block_dim=module.options.get("block_dim"))
        found = build_code(kernel, options | {"output_arch": None, "enable_backward": True})
    except Exception:
        found = Findings([], [])  # the kernel does not generate: its launch reports Warp's own error
    with _CACHE_LOCK:
        _CACHE[key] = found
    return found


def _type_names(adj: Any) -> frozenset[str]:
    """Names the function calls that hold a Warp value type (``accumulate_dtype(v)``, with
    ``accumulate_dtype = wp.float64`` in its scope): casts, linear in their argument."""
    fn_globals, closure = _scope(adj.func)
    called = {n.func.id for n in ast.walk(adj.tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return frozenset(
        name for name in called if _is_value_type(closure[name] if name in closure else fn_globals.get(name))
    )


def _integer_like(t: Any) -> bool:
    """An integer or bool type, or a struct of only such fields (indices, counters)."""
    if t in INT_TYPES or t in (wp.bool, int, bool):
        return True
    return is_struct(t) and all(_integer_like(v.type) for v in t.vars.values())


def _is_value_type(t: Any) -> bool:
    return isinstance(t, type) and (
        t in INT_TYPES or is_floating(t) or getattr(t, "_wp_scalar_type_", None) is not None
    )


def loop_hazards(kernel: Any) -> tuple[Hazard, ...]:
    """Variables that dynamic loops change in ``kernel`` or the functions it calls, in
    functions that compute something floating (a function of integers and indices alone has
    no gradient to get wrong: a caller replays its forward to take its results)."""
    reachable = _functions_of(kernel)
    findings = _findings(kernel)
    floating = {id(c.adj) for c in findings.calls if c.floating or c.floating_result}
    out: list[Hazard] = []
    seen = set()
    for adj, loop, sym, vtype in findings.loops:
        if id(adj) not in reachable or id(adj) not in floating:
            continue
        is_int = _integer_like(vtype)
        if is_int and isinstance(loop, ast.While) and not _used_outside(adj.tree, loop, sym):
            continue  # a while-loop counter: the reverse loop replays it in order
        if not is_int and _only_summed(adj.tree, sym, inert_names(adj) | _type_names(adj), adj.func):
            continue  # an accumulator read only additively: its adjoint never needs its value
        line = loop.lineno - 1 + adj.fun_lineno
        kind = "while" if isinstance(loop, ast.While) else "for"
        where = f"{adj.filename}:{line}"
        if (where, sym) in seen:
            continue
        seen.add((where, sym))
        head = adj.source_lines[loop.lineno - 1].strip() if loop.lineno - 1 < len(adj.source_lines) else kind
        out.append(Hazard(adj.fun_name, where, sym, f"changed inside the dynamic loop `{head}`"))
    return tuple(out)


# -- builtin calls whose adjoint loses a gradient, and transposed tiles ------------------------

_INT_CASTS = frozenset({"int", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool"})


def call_hazards(kernel: Any) -> tuple[Hazard, ...]:
    """Calls in ``kernel`` (or the functions it calls) that Warp's adjoint gets wrong for a
    differentiable argument: a builtin that loses that argument's gradient
    (``builtin_adjoints``), and a ``wp.tile_transpose`` of a tile used elsewhere too. Each
    names the kernel parameters whose gradient would pass through it."""
    functions = _functions_of(kernel)
    out, seen = [], set()
    for call in _findings(kernel).calls:
        lost = lost_gradients(call.builtin, call.differentiable, call.floating, call.floating_result)
        if id(call.adj) not in functions or not lost:
            continue
        sources = _sources(call.adj)
        for node in _calls_named(call.adj.tree, call.builtin, call.line + 1):
            for param, arg in _bound(node, call.params):
                reached = _sources_of(arg, sources)
                if param in lost and reached != frozenset() and (node.lineno, param) not in seen:
                    seen.add((node.lineno, param))
                    out.append(_builtin_hazard(call, node, param, reached))
    for adj in functions.values():
        out.extend(_transpose_hazards(adj))
    return tuple(out)


def _builtin_hazard(call: Any, node: ast.Call, param: str, sources: frozenset[str] | None) -> Hazard:
    adj = call.adj
    why = (
        f"wp.{call.builtin}(), whose adjoint in Warp loses the gradient of its argument '{param}' "
        f"({'Warp generates none for it' if not call.differentiable else 'it adds nothing for it'}): the gradient "
        "through it would be 0 where the derivative is not"
    )
    return Hazard(adj.fun_name, f"{adj.filename}:{node.lineno - 1 + adj.fun_lineno}", "", why, sources)


def _transpose_hazards(adj: Any) -> list[Hazard]:
    """``wp.tile_transpose(t)`` of a differentiable tile ``t`` that the function also uses
    elsewhere: the transposed view shares ``t``'s gradient storage, and Warp's adjoint counts
    the gradient through it again (measured 0.25x to 2x, stored or inline)."""
    sources = _sources(adj)
    found = []
    for node in ast.walk(adj.tree):
        if not (isinstance(node, ast.Call) and _call_name(node) == "tile_transpose" and node.args):
            continue
        t = node.args[0]
        reached = _sources_of(t, sources)
        if not isinstance(t, ast.Name) or reached == frozenset():
            continue
        others = [n for n in ast.walk(adj.tree) if isinstance(n, ast.Name) and n.id == t.id and n is not t]
        if any(isinstance(n.ctx, ast.Load) for n in others):
            why = (
                f"wp.tile_transpose() of tile '{t.id}', which the function uses elsewhere too: the transposed view "
                f"shares '{t.id}''s gradient storage, and Warp's adjoint counts the gradient through it wrongly "
                f"(measured 0.25x to 2x). Transpose a copy instead (wp.tile_map of a @wp.func returning its "
                f"argument; measured right)"
            )
            where = f"{adj.filename}:{node.lineno - 1 + adj.fun_lineno}"
            found.append(Hazard(adj.fun_name, where, "", why, reached))
    return found


def _calls_named(tree: ast.AST, builtin: str, line: int) -> list[ast.Call]:
    """Calls of ``builtin`` in ``tree`` that span ``line`` (1-based, as the AST counts), where an
    argument evaluates last (the line the code generator was at)."""
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and _call_name(n) == builtin
        and n.lineno <= line <= (n.end_lineno or n.lineno)
        and not _only_compared(n, tree)
    ]


def _only_compared(node: ast.Call, tree: ast.AST) -> bool:
    """A call whose value only feeds a comparison or an integer cast (its gradient is 0 there)."""
    for parent in ast.walk(tree):
        if node in list(ast.iter_child_nodes(parent)):
            return isinstance(parent, ast.Compare) or (
                isinstance(parent, ast.Call) and _call_name(parent) in _INT_CASTS
            )
    return False


def _bound(node: ast.Call, params: tuple[str, ...]) -> list[tuple[str, ast.AST]]:
    """(parameter, argument expression) for each argument of the call."""
    pairs = list(zip(params, node.args))
    pairs += [(k.arg, k.value) for k in node.keywords if k.arg is not None]
    return pairs


def _sources_of(expr: ast.AST, sources: dict) -> frozenset[str] | None:
    """The kernel parameters whose values reach ``expr`` (their metadata, ``a.shape``, left
    out): a set, empty when none does, or None when any may (a ``@wp.func``'s parameters)."""
    if isinstance(expr, ast.Attribute) and expr.attr in _METADATA:
        return frozenset()
    if isinstance(expr, ast.Name):
        return sources.get(expr.id, frozenset())
    found: frozenset[str] | None = frozenset()
    for child in ast.iter_child_nodes(expr):
        more = _sources_of(child, sources)
        found = None if found is None or more is None else found | more
    return found


_SOURCES: dict[int, tuple[Any, dict]] = {}


def _sources(adj: Any) -> dict:
    """Name -> the parameters whose values it may carry (None: any), for the names in a kernel
    or ``@wp.func`` whose values may carry a gradient: a kernel's floating arrays and structs,
    every parameter of a function (its caller's values), and every local assigned from one of
    them, to a fixed point (loops)."""
    cached = _SOURCES.get(id(adj))
    if cached is not None and cached[0] is adj:
        return cached[1]
    if getattr(adj, "is_user_function", False):
        found: dict = {a.label: None for a in adj.args}
    else:
        found = {a.label: frozenset({a.label}) for a in adj.args if _differentiable_type(a.type)}
    changed = True
    while changed:
        changed = False
        for node in ast.walk(adj.tree):
            value, targets = _assigned(node)
            reached = _sources_of(value, found) if value is not None else frozenset()
            if reached == frozenset():
                continue
            for name in (n for t in targets for n in _target_names(t)):
                before = found.get(name, frozenset())
                after = None if before is None or reached is None else before | reached
                if after != before:
                    found[name] = after
                    changed = True
    _SOURCES[id(adj)] = (adj, found)
    return found


def _target_names(target: ast.AST) -> list[str]:
    """The names an assignment to ``target`` gives a value: ``v`` for ``v``, ``a, b``, and the
    array ``y`` for ``y[i]`` or ``y.x`` (never the index ``i``)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for e in target.elts for n in _target_names(e)]
    if isinstance(target, (ast.Subscript, ast.Attribute)):
        return _target_names(target.value)
    return []


def _differentiable_type(t: Any) -> bool:
    if wp.types.is_array(t):
        return is_floating(t.dtype) or is_struct(t.dtype)
    return is_struct(t)


def _assigned(node: ast.AST) -> tuple[ast.AST | None, list[ast.AST]]:
    """(value, targets) of an assignment or a for loop's header; (None, []) otherwise."""
    if isinstance(node, ast.Assign):
        return node.value, node.targets
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
        return node.value, [node.target]
    if isinstance(node, ast.For):
        return node.iter, [node.target]
    return None, []


_ACCESSES: dict[Any, Accesses] = {}


def kernel_accesses(kernel: Any) -> Accesses:
    """:func:`array_accesses` of every array parameter of ``kernel``, once per kernel."""
    key = (kernel.module.name, kernel.key, getattr(kernel.adj, "source", None))
    acc = _ACCESSES.get(key)
    if acc is None:
        names = {a.label for a in kernel.adj.args if wp.types.is_array(a.type)}
        acc = _ACCESSES[key] = array_accesses(kernel.adj.tree, kernel.func, names)
    return acc


_HAZARDS: dict[Any, tuple[Hazard, ...]] = {}


def extremum_hazards(kernel: Any, shared: frozenset[str] = frozenset()) -> tuple[Hazard, ...]:
    """``wp.atomic_max``/``wp.atomic_min`` of a differentiable value into a floating array whose
    ties warpbridge does not share (``shared``: the kernel op's outputs it shares them for):
    Warp's adjoint gives each tied value the whole gradient."""
    adj = kernel.adj
    sources = _sources(adj)
    floating = {a.label for a in adj.args if _differentiable_type(a.type)}
    found = []
    for node in ast.walk(adj.tree):
        if not (isinstance(node, ast.Call) and _call_name(node) in ("atomic_max", "atomic_min") and len(node.args) > 2):
            continue
        target = node.args[0]
        if not isinstance(target, ast.Name) or target.id not in floating or target.id in shared:
            continue
        reached = _sources_of(node.args[-1], sources)
        if reached != frozenset():
            why = (
                f"wp.{_call_name(node)}() into '{target.id}': Warp's adjoint gives every value that ties for the "
                f"result the whole gradient (the gradients add up to a multiple of it). A kernel op shares it "
                f"evenly between ties for a floating scalar output: make the reduction a kernel op of its own"
            )
            found.append(Hazard(adj.fun_name, f"{adj.filename}:{node.lineno - 1 + adj.fun_lineno}", "", why, reached))
    return tuple(found)


def kernel_hazards(
    kernel: Any,
    outputs: frozenset[str] | None = None,
    in_out: frozenset[str] = frozenset(),
    shared: frozenset[str] = frozenset(),
) -> tuple[Hazard, ...]:
    """Every hazard of ``kernel``: dynamic loops, overwritten reads of ``outputs`` (of any array
    parameter when ``outputs`` is None, as for kernels a launch function recorded), and reads of
    an ``in_out`` parameter's element after the kernel stored it (its adjoint reads the input's
    value there). Once per kernel: a launch function's backward asks for every kernel it recorded."""
    key = (kernel.module.name, kernel.key, getattr(kernel.adj, "source", None), outputs, in_out, shared)
    found = _HAZARDS.get(key)
    if found is None:
        acc = kernel_accesses(kernel)
        # an integer array carries no gradient: reading it back is no hazard
        floating = {a.label for a in kernel.adj.args if _differentiable_type(a.type)}
        over = {
            k: v
            for k, v in acc.overwritten.items()
            if (outputs is None or k in outputs) and k not in in_out and k in floating
        }
        stale = {k: v for k, v in acc.read_after_write.items() if k in in_out}
        found = loop_hazards(kernel) + call_hazards(kernel) + extremum_hazards(kernel, shared)
        found += output_hazards(kernel.key, kernel.func, over)
        found += output_hazards(kernel.key, kernel.func, stale, IN_OUT_WHY)
        _HAZARDS[key] = found
    return found


IN_OUT_WHY = (
    "an in_out element read after the kernel stored it (or used in a way that cannot be followed): the adjoint "
    "reads the input's value there. Read each element before storing it, once"
)
OVERWRITTEN_WHY = (
    "an output element read, then overwritten (by `=`, `*=`, or a `+=` of a value computed from it): the adjoint "
    "only sees the final value"
)


def output_hazards(
    kernel_name: str, pyfunc: Any, overwritten: dict[str, int], why: str = OVERWRITTEN_WHY
) -> tuple[Hazard, ...]:
    filename = inspect.getsourcefile(pyfunc) or "<kernel>"
    try:
        first = inspect.getsourcelines(pyfunc)[1]
    except (OSError, TypeError):
        first = 1
    return tuple(
        Hazard(
            kernel_name,
            f"{filename}:{first + line - 1}",
            name,
            why,
        )
        for name, line in overwritten.items()
    )


def refusal(op_name: str, hazards: tuple[Hazard, ...]) -> str:
    lines = [
        f"{op_name}(): cannot differentiate: Warp's generated adjoint would be silently wrong for this op.",
    ]
    for h in hazards:
        what = f"variable '{h.variable}' is {h.why}" if h.variable else h.why
        lines.append(f"  - kernel '{h.kernel}', {h.where}: {what}")
    loops = " let Warp unroll the loop (a constant trip count up to the module's max_unroll option, 16 by default);"
    lines.append(
        "Fixes: give the op its own backward (@op.backward, see docs/custom-backward.md);"
        + (loops if any("dynamic loop" in h.why for h in hazards) else "")
        + " or move the construct into a @wp.func with its own @wp.func_grad. If you know Warp's adjoint is right "
        "for this kernel, pass trust_adjoint=True to wb.op (or trust_adjoint=[kernel or @wp.func, ...] to vouch for "
        "those only)."
    )
    return "\n".join(lines)


# -- arrays indexed by the thread index -------------------------------------------------------


def tid_indexed(tree: ast.AST, names: set[str]) -> dict[str, list[tuple[int, int, int]]]:
    """For each of ``names`` that the kernel subscripts directly with a thread index
    (``i = wp.tid()`` ... ``a[i]``, ``a[i, j]``, ``a[i][j]``): (array dim, launch dim, line) triples.

    Such an access reads or writes past the array's end whenever the array is shorter than
    the launch in that dimension. Arrays whose ``.shape`` the kernel reads are left out: the
    kernel may guard its accesses itself.
    """
    tids: dict[str, int] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Call)):
            continue
        func = node.value.func
        if (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")) != "tid":
            continue
        target = node.targets[0]
        if isinstance(target, ast.Name):
            tids[target.id] = 0
        elif isinstance(target, ast.Tuple):
            for d, elt in enumerate(target.elts):
                if isinstance(elt, ast.Name):
                    tids[elt.id] = d
    stores = [n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    reassigned = {t for t in tids if stores.count(t) > 1}
    guarded = {
        n.value.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and n.attr == "shape" and isinstance(n.value, ast.Name)
    }
    found: dict[str, list[tuple[int, int, int]]] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)):
            continue
        name = node.value.id
        if name not in names or name in guarded:
            continue
        sl = node.slice
        idx = list(sl.elts) if isinstance(sl, ast.Tuple) else [sl]
        for pos, e in enumerate(idx):
            if isinstance(e, ast.Name) and e.id in tids and e.id not in reassigned:
                entry = (pos, tids[e.id], node.lineno)
                if entry[:2] not in {x[:2] for x in found.get(name, [])}:
                    found.setdefault(name, []).append(entry)
    return found


# -- arrays indexed by another array's values -------------------------------------------------


def index_uses(
    tree: ast.AST,
    arrays: set[str],
    indices: set[str],
    pyfunc: Any = None,
    via: dict[str, str] | None = None,
    depth: int = 0,
) -> list[tuple[str, int, str, int]]:
    """(array, dim, index array, line) for each access ``a[..., idx[...], ...]`` in which the
    values of integer array ``idx`` (one of ``indices``) index dimension ``dim`` of array ``a``
    (one of ``arrays``), directly, through a local assigned once from ``idx[...]``
    (``j = idx[i]`` ... ``a[j]``), or in a ``@wp.func`` that gets the arrays or the index
    (``gather(a, idx[i])``; the line is the call's). ``via``: names already holding an index
    array's values. A debug-mode op checks those values before the launch."""
    stores = [n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    via = dict(via or {})
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            source = _index_source(node.value, indices, {})
            if source is not None and stores.count(node.targets[0].id) == 1:
                via[node.targets[0].id] = source
    found: list[tuple[str, int, str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in arrays:
            sl = node.slice
            array, positions = node.value.id, sl.elts if isinstance(sl, ast.Tuple) else [sl]
        elif (
            isinstance(node, ast.Call)
            and _call_name(node) in _ATOMIC_WRITES
            and len(node.args) >= 3
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id in arrays
        ):
            array, positions = node.args[0].id, node.args[1:-1]  # wp.atomic_add(a, i, j, value)
        else:
            if isinstance(node, ast.Call) and pyfunc is not None and depth < _MAX_DEPTH:
                _add_uses(found, _uses_in_function(node, pyfunc, arrays, indices, via, depth))
            continue
        for dim, e in enumerate(positions):
            source = _index_source(e, indices, via)
            if source is not None:
                _add_uses(found, [(array, dim, source, node.lineno)])
    return found


def _add_uses(found: list, uses: list) -> None:
    for use in uses:
        if use[:3] not in {f[:3] for f in found}:
            found.append(use)


def _uses_in_function(
    call: ast.Call, pyfunc: Any, arrays: set[str], indices: set[str], via: dict[str, str], depth: int
) -> list[tuple[str, int, str, int]]:
    """The index uses inside the ``@wp.func`` that ``call`` calls, in the caller's names."""
    fn_globals, closure = _scope(pyfunc)
    callee = _user_function(_resolve(fn_globals, closure, call.func))
    if callee is None:
        return []
    bound = list(zip((a.label for a in callee.adj.args), call.args))
    bound += [(k.arg, k.value) for k in call.keywords if k.arg is not None]
    names = {label: arg.id for label, arg in bound if isinstance(arg, ast.Name)}
    sub_arrays = {label for label, name in names.items() if name in arrays}
    sub_indices = {label for label, name in names.items() if name in indices}
    sub_via = {label: src for label, arg in bound if (src := _index_source(arg, indices, via)) is not None}
    if not sub_arrays or not (sub_indices or sub_via):
        return []
    uses = index_uses(callee.adj.tree, sub_arrays, sub_indices, callee.func, sub_via, depth + 1)
    return [(names[a], dim, names.get(src, src) if src in sub_indices else src, call.lineno) for a, dim, src, _ in uses]


def _index_source(e: ast.AST, indices: set[str], via: dict[str, str]) -> str | None:
    if isinstance(e, ast.Name):
        return via.get(e.id)
    if isinstance(e, ast.Subscript) and isinstance(e.value, ast.Name) and e.value.id in indices:
        return e.value.id
    if isinstance(e, ast.Call) and len(e.args) == 1 and not e.keywords:  # int(idx[i])
        return _index_source(e.args[0], indices, via)
    return None


# -- tiles ------------------------------------------------------------------------------------


def addressed_by_layout(tree: ast.AST, pyfunc: Any, ndims: dict[str, int]) -> frozenset[str]:
    """The arrays among ``ndims`` (name -> rank) whose adjoint finds their gradient at their
    own layout: those a tile builtin takes (``wp.tile_load(x, ...)``, ``wp.tile_store(y[i], t)``:
    its adjoint reads the gradient through the array's strides) and those the kernel takes a
    view of (``x[i]`` on a 2-D ``x``: the view's adjoint uses the array's own gradient pointer),
    or passes to a ``@wp.func`` (which may do either)."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    fn_globals, closure = _scope(pyfunc)
    found = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Name) and node.id in ndims and isinstance(node.ctx, ast.Load)):
            continue
        if _tile_access(parents, node) is not None:
            found.add(node.id)
            continue
        access, depth = node, 0
        while isinstance(parents.get(access), ast.Subscript) and parents[access].value is access:
            sl = parents[access].slice
            depth += len(sl.elts) if isinstance(sl, ast.Tuple) else 1
            access = parents[access]
        if 0 < depth < ndims[node.id]:
            found.add(node.id)  # a view
        call = parents.get(access)
        passed = depth == 0 and isinstance(call, ast.Call) and node in call.args
        if passed and _user_function(_resolve(fn_globals, closure, call.func)) is not None:
            found.add(node.id)
    return frozenset(found)


def tile_use(pyfunc: Any, tree: ast.AST, depth: int = 0) -> tuple[str, str] | None:
    """The first tile builtin (``wp.tile_*``, ``wp.tile``, ``wp.untile``) the function whose
    AST is ``tree`` calls, directly or through a ``@wp.func``: (its name, file:line), or None."""
    fn_globals, closure = _scope(pyfunc)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        target = _resolve(fn_globals, closure, node.func)
        name = builtin_name(target)
        if name is not None and (name.startswith("tile") or name == "untile"):
            return name, _where(pyfunc, node.lineno)
        callee = _user_function(target)
        if callee is not None and depth < _MAX_DEPTH:
            found = tile_use(callee.func, callee.adj.tree, depth + 1)
            if found is not None:
                return found
    return None


def _where(pyfunc: Any, line: int) -> str:
    """file:line of line ``line`` of ``pyfunc``'s source (1: its first line)."""
    try:
        first = inspect.getsourcelines(pyfunc)[1]
    except (OSError, TypeError):
        first = 1
    return f"{inspect.getsourcefile(pyfunc) or '<kernel>'}:{first + line - 1}"
