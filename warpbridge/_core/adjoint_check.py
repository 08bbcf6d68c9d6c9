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

from .warp_runtime import INT_TYPES, build_code, builtin_name, is_user_function, warp_builtin

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
    variable: str
    why: str


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
    if isinstance(node, ast.Call) and not node.keywords and _constructor(node.func):
        return all(linear(a) for a in node.args)  # wp.vec3(v[0] + r[0], ...)
    return False


# Calls that build a value linearly from their arguments.
_CONSTRUCTORS = frozenset(
    {"float", "float16", "float32", "float64", "vec2", "vec3", "vec4", "vec2f", "vec3f", "vec4f", "vec2d", "vec3d",
     "vec4d", "vec2h", "vec3h", "vec4h", "vector"}
)  # fmt: skip


def _constructor(func: ast.AST) -> bool:
    return (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")) in _CONSTRUCTORS


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
            self.loads.setdefault(name, []).append((stmt.lineno, stmt.col_offset, access))
        else:  # tile_store is a store of the tile argument; tile_atomic_add adds it
            self.writes.add(name)
            (self.stores if kind == "store" else self.added).setdefault(name, []).append(
                (stmt, _tile_value(call), access)
            )

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


def _only_summed(tree: ast.AST, name: str, inert: frozenset[str] = frozenset()) -> bool:
    """Whether every read of the local ``name`` is an additive term (constant or ``inert``
    factors allowed) of an assignment's value or a return value: ``acc += a * b`` ...
    ``out[i] = acc * c``. Then the adjoint only passes gradients through it and never needs its
    (stale) value for anything warpbridge returns."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
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


def _reachable(adj: Any, seen: set) -> None:
    for f in getattr(adj, "called_user_functions", {}) or {}:
        fadj = getattr(f, "adj", None)
        if fadj is None or id(fadj) in seen or getattr(f, "custom_grad_func", None) is not None:
            continue
        seen.add(id(fadj))
        _reachable(fadj, seen)


_CACHE: dict[Any, tuple[Hazard, ...]] = {}
_CACHE_LOCK = threading.Lock()


def loop_hazards(kernel: Any) -> tuple[Hazard, ...]:
    """Variables that dynamic loops change in ``kernel`` or the functions it calls."""
    key = (kernel.module.name, kernel.key, getattr(kernel.adj, "source", None))
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    module = kernel.module
    try:
        options = module.resolve_options(wp.config, block_dim=module.options.get("block_dim"))
        found = build_code(kernel, options | {"output_arch": None, "enable_backward": True})
    except Exception:
        found = []  # the kernel does not generate: its launch reports Warp's own error
    reachable = {id(kernel.adj)}
    _reachable(kernel.adj, reachable)
    out: list[Hazard] = []
    seen = set()
    for adj, loop, sym, vtype in found:
        if id(adj) not in reachable:
            continue
        is_int = vtype in INT_TYPES or vtype in (wp.bool, int, bool)
        if is_int and isinstance(loop, ast.While) and not _used_outside(adj.tree, loop, sym):
            continue  # a while-loop counter: the reverse loop replays it in order
        if not is_int and _only_summed(adj.tree, sym, inert_names(adj)):
            continue  # an accumulator read only additively: its adjoint never needs its value
        line = loop.lineno - 1 + adj.fun_lineno
        kind = "while" if isinstance(loop, ast.While) else "for"
        where = f"{adj.filename}:{line}"
        if (where, sym) in seen:
            continue
        seen.add((where, sym))
        head = adj.source_lines[loop.lineno - 1].strip() if loop.lineno - 1 < len(adj.source_lines) else kind
        out.append(Hazard(adj.fun_name, where, sym, f"changed inside the dynamic loop `{head}`"))
    result = tuple(out)
    with _CACHE_LOCK:
        _CACHE[key] = result
    return result


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


def kernel_hazards(
    kernel: Any, outputs: frozenset[str] | None = None, in_out: frozenset[str] = frozenset()
) -> tuple[Hazard, ...]:
    """Every hazard of ``kernel``: dynamic loops, overwritten reads of ``outputs`` (of any array
    parameter when ``outputs`` is None, as for kernels a launch function recorded), and reads of
    an ``in_out`` parameter's element after the kernel stored it (its adjoint reads the input's
    value there). Once per kernel: a launch function's backward asks for every kernel it recorded."""
    key = (kernel.module.name, kernel.key, getattr(kernel.adj, "source", None), outputs, in_out)
    found = _HAZARDS.get(key)
    if found is None:
        acc = kernel_accesses(kernel)
        over = {k: v for k, v in acc.overwritten.items() if (outputs is None or k in outputs) and k not in in_out}
        stale = {k: v for k, v in acc.read_after_write.items() if k in in_out}
        found = loop_hazards(kernel) + output_hazards(kernel.key, kernel.func, over)
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
        lines.append(f"  - kernel '{h.kernel}', {h.where}: variable '{h.variable}' is {h.why}")
    lines.append(
        "Fixes: give the op its own backward (@op.backward, see docs/custom-backward.md); let Warp unroll the "
        "loop (a constant trip count up to the module's max_unroll option, 16 by default); "
        "or move the loop into a @wp.func with its own @wp.func_grad. If you know Warp's adjoint is right for this "
        "kernel, pass trust_adjoint=True to wb.op (or trust_adjoint=[kernel or @wp.func, ...] to vouch for "
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


def index_uses(tree: ast.AST, arrays: set[str], indices: set[str]) -> list[tuple[str, int, str, int]]:
    """(array, dim, index array, line) for each access ``a[..., idx[...], ...]`` in which the
    values of integer array ``idx`` (one of ``indices``) index dimension ``dim`` of array ``a``
    (one of ``arrays``), directly or through a local assigned once from ``idx[...]``
    (``j = idx[i]`` ... ``a[j]``). A debug-mode op checks those values before the launch."""
    stores = [n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    via: dict[str, str] = {}
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
            and (node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", ""))
            in _ATOMIC_WRITES
            and len(node.args) >= 3
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id in arrays
        ):
            array, positions = node.args[0].id, node.args[1:-1]  # wp.atomic_add(a, i, j, value)
        else:
            continue
        for dim, e in enumerate(positions):
            source = _index_source(e, indices, via)
            entry = (array, dim, source, node.lineno)
            if source is not None and entry[:3] not in {f[:3] for f in found}:
                found.append(entry)
    return found


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
