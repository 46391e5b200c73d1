"""Reading classes from source: each file parsed once, base classes resolved by name across files.

Nothing is imported: engine code that imports a missing device library (``torch_npu``, ``sgl_kernel_npu``)
or a dozen engine modules reads just as well. Names are resolved the way Python would import them: from the
file's root (the folder that holds its top-level package, found from ``__init__.py`` files or, for PEP 420
namespace packages such as sglang's ``srt/``, from the file's own absolute imports), then the extra search
roots, then ``sys.path``. Classes built inside functions are read too, with the imports of their function.

Each file's tree lives only while :mod:`~workbench.contracts.facts` reads what the checks need from it (one walk
of each method); the index keeps those facts and the source bytes, not the tree.
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
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.contracts.facts import (
    METHOD_CALL,
    Ann,
    ClassInfo,
    Default,
    Function,
    FunctionInfo,
    Member,
    Params,
    _statements,
    read_class,
    read_function,
    scan_calls,
    spans_a_line,
    unparse,
)
from workbench.contracts.signatures import Method, SourceExpr

_P = inspect.Parameter
_EMPTY = inspect.Parameter.empty
NOT_METHODS = {"property", "cached_property", "setter", "getter", "deleter", "overload"}
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_METHOD_CALL = METHOD_CALL
_INDENTED_CLASS = re.compile(rb"^[ \t]+class\s", re.M)
_CLASS_WORD = re.compile(rb"class\b")  # a literal first: the regex engine skips to each ``class`` at once
_WORD_BYTES = frozenset(bytes([c]) for c in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


_OTHER_BREAKS = re.compile(rb"[\x0b\x0c\x1c-\x1e]|\xc2\x85|\xe2\x80[\xa8\xa9]")
"""The line breaks ``str.splitlines`` knows besides ``\\n`` and ``\\r`` (what ``bytes.splitlines`` splits on)."""


def _class_lines(source: bytes) -> tuple[bool, list[int]]:
    """Whether a line starts, indented, with ``class`` (a nested class, or one built in a function: the
    ``_INDENTED_CLASS`` test), and the lines where the word ``class`` appears, from one scan of the word."""
    deep, found, line, at = False, [], 1, 0
    for match in _CLASS_WORD.finditer(source):
        start = match.start()
        if start and source[start - 1 : start] in _WORD_BYTES:
            continue  # inside a longer word (``subclass``)
        line += source.count(b"\n", at, start)
        at = start
        found.append(line)
        if not deep:
            prefix = source[source.rfind(b"\n", 0, start) + 1 : start]
            deep = bool(prefix) and not prefix.strip(b" \t") and source[start + 5 : start + 6].isspace()
    return deep, found


Names = dict[str, tuple[Any, ...]]
"""local name -> ("class", ClassInfo) | ("from", mod, attr, level) | ("import", mod) | ("expr", node): a factory's
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
    """A class reached while reading source: a parsed class's facts, or only a name (``node`` is None).

    ``qualname``: the dotted name inside its module (``Outer.__new__.<locals>.Inner`` for a class built in a
    function); ``scope``: the names its function binds (imports inside the function), for its bases.
    """

    name: str
    module: str
    path: Path | None = None
    node: ClassInfo | None = None
    qualname: str = ""
    scope: Names | None = field(default=None, repr=False)
    _key: Any = field(default=None, init=False, repr=False)
    _hash: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:  # a Ref is a dict key in every table of the check: hashed once
        key = id(self.node) if self.node is not None else (self.module, self.name)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_hash", hash(key))

    def key(self) -> Any:
        return self._key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ref) and self._key == other._key

    def __hash__(self) -> int:
        return self._hash

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
    """One parsed file: its top-level names, every class in it, its star imports and its absolute imports;
    ``functions``: its top-level functions with an annotated parameter (their calls on those parameters)."""

    path: Path
    dotted: str
    names: Names
    root: Path
    class_nodes: list[tuple[ClassInfo, str, Names | None]] = field(default_factory=list)
    functions: list[FunctionInfo] = field(default_factory=list)
    stars: list[tuple[str, int]] = field(default_factory=list)
    imports: list[str] = field(default_factory=list)
    source: bytes = b""
    _refs: list[Ref] | None = None
    _method_calls: dict[str, list[int]] | None = None
    _lines: list[str] | list[bytes] | None = None
    _starts: list[int] | None = None
    _holds: dict[bytes, bool] = field(default_factory=dict)

    def holds(self, text: bytes) -> bool:
        """Whether the source holds ``text`` anywhere (once per text and file)."""
        found = self._holds.get(text)
        if found is None:
            found = self._holds[text] = text in self.source
        return found

    def line(self, number: int) -> str:
        """One line of the source (1-based), as text."""
        if self._lines is None:
            if _OTHER_BREAKS.search(self.source):
                self._lines = self.source.decode("utf-8", "replace").splitlines()
            else:  # the same lines: decode only the ones asked for
                self._lines = self.source.splitlines()
        found = self._lines[number - 1] if 0 < number <= len(self._lines) else ""
        return found.decode("utf-8", "replace") if isinstance(found, bytes) else found

    def enclosing(self, line: int) -> tuple[Ref, str] | None:
        """The class and method whose ``def`` spans a line (the innermost), or None."""
        best: tuple[int, Ref, str] | None = None
        for ref in self.refs():
            assert ref.node is not None
            if not ref.node.lineno <= line <= ref.node.end_lineno:
                continue
            for method in ref.node.methods:
                spans = method.lineno <= line <= method.end_lineno
                if spans and (best is None or method.lineno > best[0]):
                    best = (method.lineno, ref, method.name)
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

    def segment(self, span: tuple[int, int, int, int]) -> str:
        """The source text at a node's position (line, column, end line, end column; columns in UTF-8 bytes)."""
        if self._starts is None:
            starts, at = [0], self.source.find(b"\n")
            while at >= 0:
                starts.append(at + 1)
                at = self.source.find(b"\n", at + 1)
            self._starts = starts
        line, col, end_line, end_col = span
        if not 0 < line <= end_line <= len(self._starts):
            return ""
        return self.source[self._starts[line - 1] + col : self._starts[end_line - 1] + end_col].decode(
            "utf-8", "replace"
        )

    @property
    def classes(self) -> list[ClassInfo]:
        return [node for node, _, _ in self.class_nodes]

    def refs(self) -> list[Ref]:
        """Every class in the file, top-level, nested and built inside functions."""
        if self._refs is None:
            self._refs = [Ref(n.name, self.dotted, self.path, n, q, s) for n, q, s in self.class_nodes]
        return self._refs


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
    class_lines: list[int] | None = None,
) -> None:
    """Classes in a body: nested ones, and (``deep``) those built inside functions, with the function's own
    imports (added to ``imports``: they tell the file's root too). ``factories``: the first call the module
    makes of each of its top-level functions (``Backend = make_backend(MambaBase)``): a class the function
    builds on a parameter (``class Backend(base):``) derives from what that call passes. ``class_lines``: the
    lines where the word ``class`` appears: a function whose lines hold none builds no class (None: look)."""
    for statement in _statements(body):
        if isinstance(statement, ast.ClassDef):
            qualname = prefix + statement.name
            out.append((statement, qualname, scope))
            _class_nodes(statement.body, qualname + ".", scope, out, imports, deep, class_lines=class_lines)
        elif deep and isinstance(statement, _FUNCTIONS):
            if class_lines is not None and not spans_a_line(class_lines, statement.lineno, statement.end_lineno or 0):
                continue
            inner = [s for s in _statements(statement.body) if isinstance(s, (ast.ClassDef, *_FUNCTIONS))]
            if inner:  # most functions build no class: skip their bindings
                local: Names = dict(scope or {})
                call = (factories or {}).get(statement.name) if not prefix else None
                if call is not None:
                    local.update(_parameter_bindings(statement.args, call))
                _bindings(statement.body, local, imports, None)
                where = f"{prefix}{statement.name}.<locals>."
                _class_nodes(statement.body, where, local, out, imports, class_lines=class_lines)


def _dotted(expr: ast.expr | Ann) -> tuple[str, list[str]] | None:
    """``pkg.mod.Name[T]`` as ``("pkg", ["mod", "Name"])``; None when its root is no name. Loops: a subscript
    (``Name[T][T]...``) may nest thousands deep."""
    parts: list[str] = []
    if isinstance(expr, tuple):
        ann: Ann = expr
        while ann[0] == "S":
            ann = ann[1]
        while ann[0] == "A":
            parts.insert(0, ann[2])
            ann = ann[1]
        return (ann[1], parts) if ann[0] == "N" else None
    while isinstance(expr, ast.Subscript):
        expr = expr.value
    while isinstance(expr, ast.Attribute):
        parts.insert(0, expr.attr)
        expr = expr.value
    return (expr.id, parts) if isinstance(expr, ast.Name) else None


def _read_facts(module: SourceModule, tree: ast.Module, found: list[tuple[ast.ClassDef, str, Names | None]]) -> None:
    """The facts of the file's classes and of its top-level functions that take an annotated parameter; the
    names bound to a class (the module's, and those of the functions that build classes) point at its facts."""
    module._method_calls, lines = scan_calls(module.source)
    infos = {id(node): read_class(node, lines) for node, _, _ in found}
    module.class_nodes = [(infos[id(node)], qualname, scope) for node, qualname, scope in found]
    for info, qualname, _ in reversed(module.class_nodes):
        info.qualname = qualname  # the first entry's, as a lookup by name finds it
    scopes = {id(scope): scope for _, _, scope in found if scope is not None}
    for names in (module.names, *scopes.values()):
        for name, entry in names.items():
            if entry[0] == "class" and isinstance(entry[1], ast.ClassDef):
                known = infos.get(id(entry[1]))
                names[name] = ("class", known if known is not None else read_class(entry[1], lines))
    for statement in tree.body:
        if isinstance(statement, _FUNCTIONS) and _annotated(statement.args):
            function = read_function(statement, False, lines)
            if function.calls:
                module.functions.append(function)


def _annotated(args: ast.arguments) -> bool:
    return any(a.annotation is not None for a in [*args.posonlyargs, *args.args, *args.kwonlyargs])


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
    functions: dict[str, Function] | None = None  # the module's functions, once a class is built
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
        if functions is None:
            functions = {s.name: s for s in _statements(body) if isinstance(s, _FUNCTIONS)}
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


def members(node: ClassInfo) -> dict[str, Member]:
    """The last binding of each name in a class body: its method (overloads left out) or ``"assigned"``."""
    return node.members


def _class_member(node: ClassInfo, name: str) -> Member | None:
    return node.members.get(name)


def _source_default(node: Default) -> Any:
    if isinstance(node, tuple):  # a literal, its value kept as the parse gave it
        return node[0]
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return SourceExpr(unparse(node))


def signature_of(params: Params) -> inspect.Signature:
    """The signature a function's parameters make, defaults read from source (literals, or their text)."""
    positional = [*params.posonly, *params.args]
    defaults: list[Default | None] = [None] * (len(positional) - len(params.defaults)) + list(params.defaults)
    out = []
    for k, (name, default) in enumerate(zip(positional, defaults, strict=True)):
        kind = _P.POSITIONAL_ONLY if k < len(params.posonly) else _P.POSITIONAL_OR_KEYWORD
        out.append(_P(name, kind, default=_EMPTY if default is None else _source_default(default)))
    if params.vararg:
        out.append(_P(params.vararg, _P.VAR_POSITIONAL))
    for name, default in zip(params.kwonly, params.kw_defaults, strict=True):
        out.append(_P(name, _P.KEYWORD_ONLY, default=_EMPTY if default is None else _source_default(default)))
    if params.kwarg:
        out.append(_P(params.kwarg, _P.VAR_KEYWORD))
    return inspect.Signature(out)


def source_method(owner: Ref, name: str) -> Method | str | None:
    """The method ``name`` as the parsed class defines it, why it cannot be checked, or None (not defined).

    A decorator other than ``staticmethod``/``classmethod`` is taken to keep the signature, as a
    ``functools.wraps`` wrapper that forwards ``*args, **kwargs`` does: the call still reaches the ``def``.
    """
    assert owner.node is not None
    cache = owner.node.signatures
    if name in cache:
        return cache[name]
    member = owner.node.members.get(name)
    label = f"{owner.name}.{name}"
    result: Method | str | None
    if member is None:
        result = None
    elif isinstance(member, str):
        result = f"{label} is assigned, not defined with def; not checked"
    else:
        decorators = set(member.decorators)
        if decorators & NOT_METHODS:
            result = f"{label} is a property; not checked"
        else:
            kind = "staticmethod" if "staticmethod" in decorators else ""
            kind = kind or ("classmethod" if "classmethod" in decorators else "function")
            signature = signature_of(member.params)
            result = Method(label, signature, kind, str(owner.path), member.lineno, member.reads, member.uses)
    cache[name] = result
    return result


def calls_up(function: FunctionInfo, name: str) -> bool:
    """Whether a method body calls ``super().name(...)`` or ``SomeClass.name(self, ...)``: the base's runs."""
    return name in function.ups


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
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Unreadable(f"{_kind(info.st_mode) or 'a special file'}, not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise Unreadable(_too_large(info.st_size))
        chunks, total = [], 0
        want = info.st_size + 1  # its size and a byte more: one read, which tells a file that grew since
        while total <= MAX_FILE_BYTES:  # a file that grew since: still bounded
            chunk = os.read(fd, min(want, MAX_FILE_BYTES + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            want = 1 << 16
        source = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(fd)
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
        self._parents: dict[Path, Path] = {}
        self._lookups: dict[tuple[int, str], tuple[SourceModule, Ref | ModRef | None]] = {}  # the module kept: its id
        self._sys_path = [Path(entry or ".").resolve() for entry in sys.path if os.path.isdir(entry or ".")]

    # -- module names ----------------------------------------------------------------------------------
    def _regular_of(self, folder: Path) -> tuple[list[str], Path]:
        found = self._regular.get(folder)
        if found is None:
            found = self._regular[folder] = _regular_root(folder)
        return found

    def _parent(self, path: Path) -> Path:
        """``path.parent``, one object per path: a new Path hashes its parts again at every dict lookup."""
        found = self._parents.get(path)
        if found is None:
            found = self._parents[path] = path.parent
        return found

    def root_of(self, path: Path) -> Path:
        """The folder from which the file's module name is counted."""
        folder = self._parent(path)
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
            self._lookups.clear()
            for module in modules:
                module.root = self.root_of(module.path)
                module.dotted = self.dotted(module.path)
                module._refs = None
        return new

    def add_roots(self, roots: Iterable[Path]) -> None:
        """Search these folders too (after the current roots); forgets what was not found."""
        self.roots += [r for r in dict.fromkeys(roots) if r not in self.roots]
        self._found = {key: path for key, path in self._found.items() if path is not None}
        self._lookups.clear()

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
        module = SourceModule(path, self.dotted(path), names, self.root_of(path), stars=stars, imports=imports)
        module.source = source
        # a class inside a function is indented: without one, no function body needs a look
        deep, class_lines = _class_lines(source)
        factories = _factory_calls(tree.body) if deep else None
        found: list[tuple[ast.ClassDef, str, Names | None]] = []
        _class_nodes(tree.body, "", None, found, imports, deep=deep, factories=factories, class_lines=class_lines)
        if b"type(" in source:
            _type_classes(tree.body, names, found)
        _read_facts(module, tree, found)
        return module  # the tree goes here: only its facts stay

    # -- finding modules -------------------------------------------------------------------------------
    def find_module(self, dotted: str, level: int = 0, origin: Path | None = None) -> Path | None:
        """The file of a module, searched like Python would (relative to ``origin`` when ``level``)."""
        if origin is not None and level:
            anchor: Path | None = self._parent(origin)
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
        if depth == 0 and scope is None:  # a module's name means the same each time: asked once
            key = (id(module), name)
            if key not in self._lookups:
                self._lookups[key] = (module, self._lookup(module, name, 0, None))
            return self._lookups[key][1]
        return self._lookup(module, name, depth, scope)

    def _lookup(self, module: SourceModule, name: str, depth: int, scope: Names | None) -> Ref | ModRef | None:
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
            return Ref(name, module.dotted, module.path, entry[1], entry[1].qualname or name, scope)
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

    def resolve(self, module: SourceModule, expr: ast.expr | Ann, scope: Names | None = None) -> Ref | None:
        """The class a base-class expression (``Name``, ``pkg.mod.Name``, ``Name[T]``) refers to, given as a
        tree (a base) or as an :data:`~workbench.contracts.facts.Ann` (an annotation)."""
        chain = _dotted(expr)
        if chain is None:
            return None
        root, parts = chain
        found = self.lookup(module, root, scope=scope)
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
            return Ref(parts[-1] if parts else root, "builtins" if hasattr(builtins, root) else "?")
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
