"""Reading classes from source: each file parsed once, base classes resolved by name across files.

Nothing is imported: engine code that imports a missing device library (``torch_npu``, ``sgl_kernel_npu``)
or a dozen engine modules reads just as well. Names are resolved the way Python would import them: from the
file's root (the folder that holds its top-level package, found from ``__init__.py`` files or, for PEP 420
namespace packages such as sglang's ``srt/``, from the file's own absolute imports), then the extra search
roots, then ``sys.path``. Classes built inside functions are read too, with the imports of their function.
"""

from __future__ import annotations

import ast
import builtins
import copy
import importlib.util
import inspect
import os
import re
import stat
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.contracts.signatures import Method, SourceExpr

_P = inspect.Parameter
_EMPTY = inspect.Parameter.empty
NOT_METHODS = {"property", "cached_property", "setter", "getter", "deleter", "overload"}
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
Function = ast.FunctionDef | ast.AsyncFunctionDef
_METHOD_CALL = re.compile(rb"\.\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_INDENTED_CLASS = re.compile(rb"^[ \t]+class\s", re.M)
Names = dict[str, tuple[Any, ...]]
"""local name -> ("class", node) | ("from", mod, attr, level) | ("import", mod) | ("expr", node): a factory's
parameter, bound to what the module's call of it passes (resolved at the module's top level)."""

MAX_FILE_BYTES = 5_000_000
"""A larger file is skipped (noted), never read: real engine sources stay far below (sglang's largest module is
well under 1 MB, torch's 1.4 MB), and parsing takes some 25 times a file's size in memory."""
NOT_READ = "not read: "
"""How the reason a file was left unread begins (in :attr:`SourceIndex.errors`): a special file, too large, or
nested too deeply to parse; any other reason is Python's own error (``SyntaxError``, ``OSError``)."""
MAX_ANCESTORS = 1000
"""The most classes a resolution order may hold: real hierarchies hold a few dozen, and every class of a chain
holds the whole chain above it (the time and memory grow with the square of its length)."""
_SPECIAL = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"))  # fmt: skip


@dataclass(frozen=True, eq=False)
class Ref:
    """A class reached while reading source: a parsed ``ClassDef``, or only a name (``node`` is None).

    ``qualname``: the dotted name inside its module (``Outer.__new__.<locals>.Inner`` for a class built in a
    function); ``scope``: the names its function binds (imports inside the function), for its bases.
    """

    name: str
    module: str
    path: Path | None = None
    node: ast.ClassDef | None = None
    qualname: str = ""
    scope: Names | None = field(default=None, repr=False)

    def key(self) -> Any:
        return id(self.node) if self.node is not None else (self.module, self.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ref) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    @property
    def label(self) -> str:
        name = self.qualname or self.name
        return f"{self.module}:{name}" if self.module else name


@dataclass(frozen=True)
class ModRef:
    """A module name bound by an import statement."""

    dotted: str
    path: Path | None


@dataclass
class SourceModule:
    """One parsed file: its top-level names, every class in it, its star imports and its absolute imports."""

    path: Path
    dotted: str
    names: Names
    tree: ast.Module
    root: Path
    class_nodes: list[tuple[ast.ClassDef, str, Names | None]] = field(default_factory=list)
    stars: list[tuple[str, int]] = field(default_factory=list)
    imports: list[str] = field(default_factory=list)
    source: bytes = b""
    _refs: list[Ref] | None = None
    _method_calls: dict[str, list[int]] | None = None
    _lines: list[str] | None = None

    def line(self, number: int) -> str:
        """One line of the source (1-based), as text."""
        if self._lines is None:
            self._lines = self.source.decode("utf-8", "replace").splitlines()
        return self._lines[number - 1] if 0 < number <= len(self._lines) else ""

    def enclosing(self, line: int) -> tuple[Ref, str] | None:
        """The class and method whose ``def`` spans a line (the innermost), or None."""
        best: tuple[int, Ref, str] | None = None
        for ref in self.refs():
            assert ref.node is not None
            if not ref.node.lineno <= line <= (ref.node.end_lineno or 0):
                continue
            for statement in ref.node.body:
                if not isinstance(statement, _FUNCTIONS):
                    continue
                spans = statement.lineno <= line <= (statement.end_lineno or 0)
                if spans and (best is None or statement.lineno > best[0]):
                    best = (statement.lineno, ref, statement.name)
        return (best[1], best[2]) if best else None

    def method_calls(self) -> dict[str, list[int]]:
        """The lines on which ``.NAME(`` appears, by NAME: a cheap text scan that tells which functions can
        make a call worth reading before any of their nodes is visited."""
        if self._method_calls is None:
            found: dict[str, list[int]] = {}
            line, at = 1, 0
            for match in _METHOD_CALL.finditer(self.source):
                line += self.source.count(b"\n", at, match.start())
                at = match.start()
                found.setdefault(match.group(1).decode(), []).append(line)
            self._method_calls = found
        return self._method_calls

    @property
    def classes(self) -> list[ast.ClassDef]:
        return [node for node, _, _ in self.class_nodes]

    def refs(self) -> list[Ref]:
        """Every class in the file, top-level, nested and built inside functions."""
        if self._refs is None:
            self._refs = [Ref(n.name, self.dotted, self.path, n, q, s) for n, q, s in self.class_nodes]
        return self._refs


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement of a body, those under ``if``/``try``/``with``/``for`` included, not inside def/class."""
    for statement in body:
        yield statement
        if isinstance(statement, (*_FUNCTIONS, ast.ClassDef)):
            continue
        for block in ("body", "orelse", "finalbody"):
            inner = getattr(statement, block, None)
            if isinstance(inner, list):
                yield from _statements(inner)
        for handler in getattr(statement, "handlers", ()):
            yield from _statements(handler.body)
        for case in getattr(statement, "cases", ()):
            yield from _statements(case.body)


def _bindings(body: list[ast.stmt], names: Names, imports: list[str] | None, stars: list | None) -> None:
    """The names a body binds by ``class``, ``import`` and ``from ... import``."""
    for statement in _statements(body):
        if isinstance(statement, ast.ClassDef):
            names[statement.name] = ("class", statement)
        elif isinstance(statement, ast.Import):
            for alias in statement.names:
                local = alias.asname or alias.name.partition(".")[0]
                names[local] = ("import", alias.name if alias.asname else local)
                if imports is not None:
                    imports.append(alias.name)
        elif isinstance(statement, ast.ImportFrom):
            if imports is not None and statement.level == 0 and statement.module:
                imports.append(statement.module)
            for alias in statement.names:
                if alias.name == "*":
                    if stars is not None:
                        stars.append((statement.module or "", statement.level))
                else:
                    names[alias.asname or alias.name] = ("from", statement.module or "", alias.name, statement.level)


def _class_nodes(
    body: list[ast.stmt],
    prefix: str,
    scope: Names | None,
    out: list[tuple[ast.ClassDef, str, Names | None]],
    imports: list[str],
    deep: bool = True,
    factories: dict[str, ast.Call] | None = None,
) -> None:
    """Classes in a body: nested ones, and (``deep``) those built inside functions, with the function's own
    imports (added to ``imports``: they tell the file's root too). ``factories``: the first call the module
    makes of each of its top-level functions (``Backend = make_backend(MambaBase)``): a class the function
    builds on a parameter (``class Backend(base):``) derives from what that call passes."""
    for statement in _statements(body):
        if isinstance(statement, ast.ClassDef):
            qualname = prefix + statement.name
            out.append((statement, qualname, scope))
            _class_nodes(statement.body, qualname + ".", scope, out, imports, deep)
        elif deep and isinstance(statement, _FUNCTIONS):
            inner = [s for s in _statements(statement.body) if isinstance(s, (ast.ClassDef, *_FUNCTIONS))]
            if inner:  # most functions build no class: skip their bindings
                local: Names = dict(scope or {})
                call = (factories or {}).get(statement.name) if not prefix else None
                if call is not None:
                    local.update(_parameter_bindings(statement.args, call))
                _bindings(statement.body, local, imports, None)
                _class_nodes(statement.body, f"{prefix}{statement.name}.<locals>.", local, out, imports)


def _parameter_bindings(args: ast.arguments, call: ast.Call) -> Names:
    """The parameters a module-level call of a factory fills with a name (``make_backend(MambaBase)``): each
    bound to that expression, resolved at the module's top level."""
    positional = [*args.posonlyargs, *args.args]
    found: Names = {}
    for arg, value in zip(positional, call.args, strict=False):
        if isinstance(value, ast.Starred):
            break
        if isinstance(value, (ast.Name, ast.Attribute)):
            found[arg.arg] = ("expr", value)
    named = {a.arg for a in [*positional, *args.kwonlyargs]}
    for keyword in call.keywords:
        if keyword.arg in named and isinstance(keyword.value, (ast.Name, ast.Attribute)):
            found[keyword.arg] = ("expr", keyword.value)
    return found


def _factory_calls(body: list[ast.stmt]) -> dict[str, ast.Call]:
    """The first top-level call of each name (``X = make(Base)``, ``make(Base)``): the factories' arguments."""
    found: dict[str, ast.Call] = {}
    for statement in _statements(body):
        value = statement.value if isinstance(statement, (ast.Assign, ast.AnnAssign, ast.Expr)) else None
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            found.setdefault(value.func.id, value)
    return found


def _type_classes(body: list[ast.stmt], names: Names, out: list[tuple[ast.ClassDef, str, Names | None]]) -> None:
    """Classes built by ``Name = type("Name", (Base, ...), {"hook": function, ...})`` at the top level: each
    read as a ``class`` statement whose methods are the module's functions (or lambdas) the dict names, so an
    override keeps the location of its ``def``."""
    functions = {s.name: s for s in _statements(body) if isinstance(s, _FUNCTIONS)}
    for statement in _statements(body):
        if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1):
            continue
        target, call = statement.targets[0], statement.value
        if not (isinstance(target, ast.Name) and isinstance(call, ast.Call) and not call.keywords):
            continue
        if not (isinstance(call.func, ast.Name) and call.func.id == "type" and len(call.args) == 3):
            continue
        bases, namespace = call.args[1], call.args[2]
        if not (isinstance(bases, ast.Tuple) and isinstance(namespace, ast.Dict)):
            continue
        methods: list[ast.stmt] = []
        for key, value in zip(namespace.keys, namespace.values, strict=True):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                continue
            methods.append(_type_member(key.value, value, functions))
        node = ast.ClassDef(
            name=target.id, bases=list(bases.elts), keywords=[], body=methods or [ast.Pass()], decorator_list=[]
        )
        ast.copy_location(node, call)
        node.end_lineno, node.end_col_offset = call.end_lineno, call.end_col_offset
        out.append((node, target.id, None))
        names[target.id] = ("class", node)


def _type_member(name: str, value: ast.expr, functions: dict[str, Function]) -> ast.stmt:
    """One entry of ``type()``'s namespace as the statement a ``class`` body would hold."""
    if isinstance(value, ast.Name) and value.id in functions:
        function = functions[value.id]
        if function.name == name:
            return function
        renamed = copy.copy(function)  # the same node under the key's name (its caches stay its own)
        renamed.name = name
        return renamed
    if isinstance(value, ast.Lambda):
        body: list[ast.stmt] = [ast.copy_location(ast.Return(value=value.body), value)]
        made = ast.FunctionDef(name=name, args=value.args, body=body, decorator_list=[], returns=None)
        return ast.copy_location(made, value)
    return ast.copy_location(ast.Assign(targets=[ast.Name(name, ast.Store())], value=value), value)


def decorator_name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


Member = Function | str


def members(node: ast.ClassDef) -> dict[str, Member]:
    """The last binding of each name in a class body: its ``def`` (overloads left out) or ``"assigned"``.

    Cached on the node itself (as the other per-class facts here): the cache dies with the tree.
    """
    found: dict[str, Member] | None = getattr(node, "_wb_members", None)
    if found is None:
        found = {}
        for statement in node.body:
            if isinstance(statement, _FUNCTIONS):
                if not any(decorator_name(d) == "overload" for d in statement.decorator_list):
                    found[statement.name] = statement
            elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
                targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                if isinstance(statement, ast.AnnAssign) and statement.value is None:
                    continue  # an annotation binds nothing
                for target in targets:
                    if isinstance(target, ast.Name):
                        found[target.id] = "assigned"
        node._wb_members = found  # type: ignore[attr-defined]
    return found


def _class_member(node: ast.ClassDef, name: str) -> Member | None:
    return members(node).get(name)


def unparse(node: ast.AST, fallback: str = "...") -> str:
    """``ast.unparse``, or ``fallback`` for an expression nested too deeply for it (it recurses per level)."""
    try:
        return ast.unparse(node)
    except (RecursionError, MemoryError):
        return fallback


def _source_default(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return SourceExpr(unparse(node))


def signature_from_ast(args: ast.arguments) -> inspect.Signature:
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params = []
    for k, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
        kind = _P.POSITIONAL_ONLY if k < len(args.posonlyargs) else _P.POSITIONAL_OR_KEYWORD
        params.append(_P(arg.arg, kind, default=_EMPTY if default is None else _source_default(default)))
    if args.vararg:
        params.append(_P(args.vararg.arg, _P.VAR_POSITIONAL))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        value = _EMPTY if default is None else _source_default(default)
        params.append(_P(arg.arg, _P.KEYWORD_ONLY, default=value))
    if args.kwarg:
        params.append(_P(args.kwarg.arg, _P.VAR_KEYWORD))
    return inspect.Signature(params)


def kwargs_reads(function: Function) -> tuple[frozenset[str], frozenset[str]]:
    """For a function with ``**kwargs``: the keys its body reads from them (``kwargs["k"]``,
    ``kwargs.get("k")``, ``.pop("k")``, ``"k" in kwargs``) and the parameters it reads; else nothing."""
    kwarg = function.args.kwarg.arg if function.args.kwarg else None
    if kwarg is None:
        return frozenset(), frozenset()
    params = {a.arg for a in [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]}
    keys: set[str] = set()
    used: set[str] = set()
    for node in ast.walk(function):
        key: ast.expr | None = None
        if isinstance(node, ast.Name):
            if node.id in params and isinstance(node.ctx, ast.Load):
                used.add(node.id)
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == kwarg:
            key = node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id == kwarg and node.func.attr in ("get", "pop", "setdefault"):
                key = node.args[0]
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            right = node.comparators[0]
            if isinstance(right, ast.Name) and right.id == kwarg:
                key = node.left
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            keys.add(key.value)
    return frozenset(keys), frozenset(used)


def source_method(owner: Ref, name: str) -> Method | str | None:
    """The method ``name`` as the parsed class defines it, why it cannot be checked, or None (not defined).

    A decorator other than ``staticmethod``/``classmethod`` is taken to keep the signature, as a
    ``functools.wraps`` wrapper that forwards ``*args, **kwargs`` does: the call still reaches the ``def``.
    """
    assert owner.node is not None
    cache: dict[str, Method | str | None] | None = getattr(owner.node, "_wb_methods", None)
    if cache is None:
        cache = owner.node._wb_methods = {}  # type: ignore[attr-defined]
    if name in cache:
        return cache[name]
    member = _class_member(owner.node, name)
    label = f"{owner.name}.{name}"
    result: Method | str | None
    if member is None:
        result = None
    elif isinstance(member, str):
        result = f"{label} is assigned, not defined with def; not checked"
    else:
        decorators = {decorator_name(d) for d in member.decorator_list}
        if decorators & NOT_METHODS:
            result = f"{label} is a property; not checked"
        else:
            kind = "staticmethod" if "staticmethod" in decorators else ""
            kind = kind or ("classmethod" if "classmethod" in decorators else "function")
            signature = signature_from_ast(member.args)
            reads, uses = kwargs_reads(member)
            result = Method(label, signature, kind, str(owner.path), member.lineno, reads, uses)
    cache[name] = result
    return result


def calls_up(function: Function, name: str) -> bool:
    """Whether a method body calls ``super().name(...)`` or ``SomeClass.name(self, ...)``: the base's runs.

    Cached on the function's node: a long hierarchy asks it of the same override for every subclass."""
    cache: dict[str, bool] | None = getattr(function, "_wb_calls_up", None)
    if cache is None:
        cache = function._wb_calls_up = {}  # type: ignore[union-attr]
    if name not in cache:
        cache[name] = _calls_up(function, name)
    return cache[name]


def _calls_up(function: Function, name: str) -> bool:
    positional = [*function.args.posonlyargs, *function.args.args]
    self_name = positional[0].arg if positional else None
    for node in ast.walk(function):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name:
            value = node.func.value
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super":
                return True
            first = node.args[0] if node.args else None
            if isinstance(value, (ast.Name, ast.Attribute)) and isinstance(first, ast.Name) and first.id == self_name:
                return True
    return False


def _c3(head: Ref, parents: list[Ref], parent_mros: list[list[Ref]]) -> list[Ref]:
    """Python's method resolution order; an inconsistent hierarchy falls back to depth-first order.

    Linear in the orders' lengths (times the number of bases): each sequence keeps a cursor, and a count of
    the sequences holding each class past their cursor says which heads are free to go next. A chain of
    500 classes costs 500 steps per class, not 500 squared.
    """
    sequences = [s for s in [*parent_mros, parents] if s]
    tails: Counter[Ref] = Counter(r for s in sequences for r in s[1:])
    cursors = [0] * len(sequences)
    live = list(range(len(sequences)))
    order = [head]
    while live:
        for i in live:
            candidate = sequences[i][cursors[i]]
            if not tails[candidate]:
                break
        else:
            return [head, *dict.fromkeys(r for s in parent_mros for r in s)]
        order.append(candidate)
        for i in live:  # in no tail: it can only be a head
            sequence = sequences[i]
            while cursors[i] < len(sequence) and sequence[cursors[i]] == candidate:
                cursors[i] += 1
                if cursors[i] < len(sequence):
                    tails[sequence[cursors[i]]] -= 1  # the next one leaves the tail for the head
        live = [i for i in live if cursors[i] < len(sequences[i])]
    return order


def _regular_root(folder: Path) -> tuple[list[str], Path]:
    """The package parts above a folder that ``__init__.py`` files make, and the folder that holds them."""
    parts: list[str] = []
    root = folder
    while (root / "__init__.py").is_file():
        parts.insert(0, root.name)
        root = root.parent
    return parts, root


class HierarchyTooDeep(ValueError):
    """A class whose resolution order holds more than :data:`MAX_ANCESTORS` classes."""

    def __init__(self, ref: Ref, ancestors: int) -> None:
        super().__init__(f"{ref.label} derives from {ancestors} classes")
        self.ref = ref
        self.ancestors = ancestors


class Unreadable(ValueError):
    """A file that is not read at all: a special file (a FIFO would block), or one over ``MAX_FILE_BYTES``."""


def _kind(mode: int) -> str | None:
    return next((name for test, name in _SPECIAL if test(mode)), None)


def special_file(path: Path) -> str | None:
    """What a path is when it is neither a regular file nor missing (``"a FIFO"``), found without opening it."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return None if stat.S_ISREG(mode) else _kind(mode) or "a special file"


def read_source(path: Path) -> bytes:
    """A source file's bytes. A special file is refused before it is opened (reading a FIFO blocks until a
    writer comes, a device may never end), and a file over :data:`MAX_FILE_BYTES` is refused unread."""
    kind = special_file(path)
    if kind is not None:
        raise Unreadable(f"{kind}, not a regular file")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # swapped for a FIFO meanwhile: no block
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise Unreadable(f"{_kind(info.st_mode) or 'a special file'}, not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise Unreadable(_too_large(info.st_size))
        source = file.read(MAX_FILE_BYTES + 1)  # a file that grew since: still bounded
    if len(source) > MAX_FILE_BYTES:
        raise Unreadable(_too_large(len(source)))
    return source


def _too_large(size: int) -> str:
    return f"{size / 1e6:.1f} MB, over the {MAX_FILE_BYTES / 1e6:g} MB limit for a source file"


class SourceIndex:
    """Parses files on demand (each once) and resolves class names through imports across files.

    ``roots``: folders searched for absolute imports after the importing file's own root and before
    ``sys.path`` (``--search-path``). :meth:`infer_roots` adds the roots of namespace packages that the
    targets' own imports reveal.
    """

    def __init__(self, roots: Iterable[Path] = ()) -> None:
        self.roots = [Path(r).resolve() for r in roots]
        self.errors: dict[Path, str] = {}
        self.namespace_roots: list[Path] = []
        self.namespace_packages: list[Path] = []  # the top-level folders those roots hold
        self._modules: dict[Path, SourceModule | None] = {}
        self._found: dict[tuple[str, int, Path | None], Path | None] = {}
        self._mros: dict[Ref, list[Ref]] = {}
        self._regular: dict[Path, tuple[list[str], Path]] = {}
        self._exists: dict[Path, bool] = {}
        self._root_cache: dict[Path, Path] = {}
        self._sys_path = [Path(entry or ".").resolve() for entry in sys.path if os.path.isdir(entry or ".")]

    # -- module names ----------------------------------------------------------------------------------
    def _regular_of(self, folder: Path) -> tuple[list[str], Path]:
        found = self._regular.get(folder)
        if found is None:
            found = self._regular[folder] = _regular_root(folder)
        return found

    def root_of(self, path: Path) -> Path:
        """The folder from which the file's module name is counted."""
        folder = path.parent
        best = self._root_cache.get(folder)
        if best is None:
            _, best = self._regular_of(folder)
            for package in self.namespace_packages:  # a namespace package: the highest root above the regular one
                root = package.parent
                if len(root.parts) < len(best.parts) and folder.parts[: len(package.parts)] == package.parts:
                    best = root
            self._root_cache[folder] = best
        return best

    def dotted(self, path: Path) -> str:
        """The file's module name, counted from :meth:`root_of`."""
        root = self.root_of(path)
        parts = list(path.parts[len(root.parts) : -1])
        if path.stem != "__init__":
            parts.append(path.stem)
        return ".".join(parts)

    def _is(self, path: Path) -> bool:
        found = self._exists.get(path)
        if found is None:
            found = self._exists[path] = path.exists()
        return found

    def infer_roots(self, modules: Iterable[SourceModule]) -> list[Path]:
        """Namespace-package roots from the modules' absolute imports: a file under ``.../sglang/srt/`` that
        imports ``sglang.srt.x`` roots at the folder above ``sglang``. Renames the modules to match."""
        modules = list(modules)
        found: dict[Path, None] = {}
        for module in modules:
            by_name = {p.name: p for p in reversed(module.path.parents)}  # the nearest folder of a name wins
            for dotted in module.imports:
                top, _, rest = dotted.partition(".")
                folder = by_name.get(top)
                if folder is None or folder in found:
                    continue
                target = folder.joinpath(*rest.split(".")) if rest else folder
                if self._is(target) or self._is(target.with_suffix(".py")):
                    found[folder] = None
        new = [p for p in found if p not in self.namespace_packages]
        self.namespace_packages += new
        self.namespace_roots += [p.parent for p in new if p.parent not in self.namespace_roots]
        if new:
            self._found.clear()
            self._root_cache.clear()
            for module in modules:
                module.root = self.root_of(module.path)
                module.dotted = self.dotted(module.path)
                module._refs = None
        return new

    def add_roots(self, roots: Iterable[Path]) -> None:
        """Search these folders too (after the current roots); forgets what was not found."""
        self.roots += [r for r in dict.fromkeys(roots) if r not in self.roots]
        self._found = {key: path for key, path in self._found.items() if path is not None}

    # -- parsing ---------------------------------------------------------------------------------------
    def module(self, path: Path) -> SourceModule | None:
        """The parsed module, or None (the reason is in ``errors``)."""
        if path not in self._modules:
            self._modules[path] = self._parse(path)
        return self._modules[path]

    @property
    def parsed(self) -> list[SourceModule]:
        """Every module parsed so far (targets and the files their bases live in)."""
        return [m for m in self._modules.values() if m is not None]

    def _parse(self, path: Path) -> SourceModule | None:
        try:
            source = read_source(path)
            tree = ast.parse(source, filename=str(path))
        except SyntaxError as exc:
            self.errors[path] = f"SyntaxError: {exc.msg} (line {exc.lineno})"
            return None
        except Unreadable as exc:
            self.errors[path] = NOT_READ + str(exc)
            return None
        except (RecursionError, MemoryError) as exc:  # a+a+...+a some 3000 deep: the parser's own limit
            self.errors[path] = f"{NOT_READ}nested too deeply to parse: {exc or type(exc).__name__}"
            return None
        except (OSError, ValueError) as exc:
            self.errors[path] = f"{type(exc).__name__}: {exc}"
            return None
        names: Names = {}
        imports: list[str] = []
        stars: list[tuple[str, int]] = []
        _bindings(tree.body, names, imports, stars)
        module = SourceModule(path, self.dotted(path), names, tree, self.root_of(path), stars=stars, imports=imports)
        module.source = source
        # a class inside a function is indented: without one, no function body needs a look
        deep = bool(_INDENTED_CLASS.search(source))
        factories = _factory_calls(tree.body) if deep else None
        _class_nodes(tree.body, "", None, module.class_nodes, imports, deep=deep, factories=factories)
        if b"type(" in source:
            _type_classes(tree.body, names, module.class_nodes)
        return module

    # -- finding modules -------------------------------------------------------------------------------
    def find_module(self, dotted: str, level: int = 0, origin: Path | None = None) -> Path | None:
        """The file of a module, searched like Python would (relative to ``origin`` when ``level``)."""
        if origin is not None and level:
            anchor: Path | None = origin.parent
        else:
            anchor = self.root_of(origin) if origin is not None else None
        key = (dotted, level, anchor)
        if key not in self._found:
            self._found[key] = self._find(dotted, level, anchor)
        return self._found[key]

    def _find(self, dotted: str, level: int, anchor: Path | None) -> Path | None:
        if level:
            if anchor is None:
                return None
            root = anchor
            for _ in range(level - 1):
                root = root.parent
            roots = [root]
        else:
            roots = [anchor] if anchor else []
            roots += self.namespace_roots + self.roots + self._sys_path
        parts = [part for part in dotted.split(".") if part]
        for root in dict.fromkeys(roots):
            candidate = root.joinpath(*parts)
            if parts and candidate.with_suffix(".py").is_file():
                return candidate.with_suffix(".py")
            if (candidate / "__init__.py").is_file():
                return candidate / "__init__.py"
        if level or not parts:
            return None
        # an editable install is found by an import hook, not a sys.path folder: ask for the top package's
        # location only (finding a top-level name imports nothing)
        spec = None
        with suppress(Exception):
            spec = importlib.util.find_spec(parts[0])
        for folder in (spec.submodule_search_locations or []) if spec else []:
            candidate = Path(folder).joinpath(*parts[1:])
            if len(parts) > 1 and candidate.with_suffix(".py").is_file():
                return candidate.with_suffix(".py").resolve()
            if (candidate / "__init__.py").is_file():
                return (candidate / "__init__.py").resolve()
        return None

    # -- resolving names -------------------------------------------------------------------------------
    def lookup(
        self, module: SourceModule, name: str, depth: int = 0, scope: Names | None = None
    ) -> Ref | ModRef | None:
        """What ``name`` means at the top level of ``module`` (or in ``scope``, a function's own names)."""
        entry = (scope or {}).get(name) or module.names.get(name)
        if depth > 20:
            return None
        if entry is None:
            for source, level in module.stars:  # ``from .abstract import *``: followed within the trees
                path = self.find_module(source, level, module.path)
                inner = self.module(path) if path else None
                found = self.lookup(inner, name, depth + 1) if inner else None
                if found is not None:
                    return found
            return None
        if entry[0] == "expr":  # a factory's parameter: what the module's call passes, at the top level
            found = self.resolve(module, entry[1]) if depth < 20 else None
            return found if found is not None and found.module != "?" else None
        if entry[0] == "class":
            qualname = next((q for n, q, _ in module.class_nodes if n is entry[1]), name)
            return Ref(name, module.dotted, module.path, entry[1], qualname, scope)
        if entry[0] == "import":
            return ModRef(entry[1], self.find_module(entry[1], 0, module.path))
        _, source, attr, level = entry
        absolute = ("." * level) + source
        path = self.find_module(source, level, module.path)
        inner = self.module(path) if path else None
        if path is not None and inner is not None:
            found = self.lookup(inner, attr, depth + 1)
            if found is not None:
                return found
            submodule = self.find_module(attr, 1, path)  # ``from pkg import mod``
            if path.name == "__init__.py" and submodule:
                return ModRef(f"{inner.dotted}.{attr}" if inner.dotted else attr, submodule)
            return Ref(attr, inner.dotted)
        return Ref(attr, absolute)

    def resolve(self, module: SourceModule, expr: ast.expr, scope: Names | None = None) -> Ref | None:
        """The class a base-class expression (``Name``, ``pkg.mod.Name``, ``Name[T]``) refers to."""
        while isinstance(expr, ast.Subscript):  # a loop: ``Name[T][T]...`` may be nested thousands deep
            expr = expr.value
        parts: list[str] = []
        while isinstance(expr, ast.Attribute):
            parts.insert(0, expr.attr)
            expr = expr.value
        if not isinstance(expr, ast.Name):
            return None
        found = self.lookup(module, expr.id, scope=scope)
        for i, part in enumerate(parts):
            if not isinstance(found, ModRef):
                return None
            inner = self.module(found.path) if found.path else None
            resolved = self.lookup(inner, part) if inner else None
            last = i == len(parts) - 1
            if resolved is None:
                dotted = f"{found.dotted}.{part}"
                path = self.find_module(part, 1, found.path) if found.path else None
                resolved = Ref(part, found.dotted) if last else ModRef(dotted, path)
            found = resolved
        if found is None:  # a builtin (object), or a name nothing binds
            return Ref(parts[-1] if parts else expr.id, "builtins" if hasattr(builtins, expr.id) else "?")
        return found if isinstance(found, Ref) else None

    def parents(self, ref: Ref) -> list[Ref]:
        """The class's direct bases; one that cannot be resolved is a name-only ``Ref``."""
        if ref.node is None or ref.path is None:
            return []
        module = self.module(ref.path)
        found = [(self.resolve(module, b, ref.scope) if module else None, b) for b in ref.node.bases]
        return [p or Ref(unparse(b), "?") for p, b in found]

    def mro(self, ref: Ref) -> list[Ref]:
        """The class's resolution order as far as source reveals it (memoized). A loop, not a recursion: an
        inheritance chain thousands of classes long is read like any other; a class that (through imports)
        derives from itself ends its own order there."""
        if ref in self._mros:
            return self._mros[ref]
        if ref.node is None:
            return [ref]
        stack: list[tuple[Ref, list[Ref], list[list[Ref]]]] = [(ref, self.parents(ref), [])]
        open_ = {ref}  # the classes whose order is being computed: a base among them is a cycle
        while stack:
            current, parents, done = stack[-1]
            if len(done) < len(parents):
                parent = parents[len(done)]
                if parent in self._mros:
                    done.append(self._mros[parent])
                elif parent.node is None or parent in open_:
                    done.append([parent])
                else:
                    if len(stack) > MAX_ANCESTORS:
                        raise HierarchyTooDeep(ref, len(stack))
                    stack.append((parent, self.parents(parent), []))
                    open_.add(parent)
                continue
            stack.pop()
            open_.discard(current)
            order = self._mros[current] = _c3(current, parents, done)
            if len(order) - 1 > MAX_ANCESTORS:
                raise HierarchyTooDeep(current, len(order) - 1)
            if stack:
                stack[-1][2].append(order)
        return self._mros[ref]

    def find_class(self, path: Path, qualname: str) -> Ref | None:
        """A class of a parsed file by its (possibly nested) qualified name."""
        module = self.module(path)
        if module is None:
            return None
        return next((r for r in module.refs() if r.qualname == qualname), None)
