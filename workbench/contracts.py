"""Method contracts: does every subclass still accept the calls its base class promises?

A base class is a contract: callers (a scheduler, a graph runner) call its methods the base's way, on objects
of whatever subclass a device picked. When a subclass's override cannot take such a call, nothing fails until
that device runs it. The sglang NPU backend is the example: the base grew
``init_forward_metadata_out_graph(self, batch, in_capture=False)``, the NPU override kept
``(self, batch)``, and the scheduler crashed at start with ``TypeError: ... got an unexpected keyword
argument 'in_capture'``; no CPU test had called it.

:func:`check` finds every subclass of a base in a module, file or directory, compares each overriding
method's signature with the base's and reports, per finding, the call made the base's way and what it
would do: the ``TypeError`` Python would raise (produced by calling a stub with the override's exact
signature, so it is Python's own message) or, for silent changes (reordered parameters, changed defaults),
how the arguments would land. Code that cannot be imported here (``import torch_npu`` at the top) is read
with :mod:`ast` instead, resolving base classes by name across the files of its directory or package.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import importlib
import importlib.util
import inspect
import linecache
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from workbench.errors import WorkbenchError

DEFAULT_BASE = "workbench.backends:MetadataBackend"
"""The base the CLI checks against when ``--base`` is not given."""
DEFAULT_TARGETS = ("workbench",)
"""What the CLI checks when no module or path is given: the whole workbench package."""

MISSING = "missing-parameter"
RENAMED = "renamed-parameter"
REORDERED = "reordered-parameter"
KIND_CHANGED = "parameter-kind-changed"
CHANGED_DEFAULT = "changed-default"
DROPPED_VARARGS = "dropped-varargs"
DROPPED_VARKW = "dropped-varkw"
NEW_REQUIRED = "new-required-parameter"
KINDS = (
    MISSING,
    RENAMED,
    REORDERED,
    KIND_CHANGED,
    CHANGED_DEFAULT,
    DROPPED_VARARGS,
    DROPPED_VARKW,
    NEW_REQUIRED,
)
"""Every finding kind, for filtering and for documentation."""

Target = ModuleType | str | os.PathLike

_P = inspect.Parameter
_EMPTY = inspect.Parameter.empty
_POSITIONAL = (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)
_VARIADIC = (_P.VAR_POSITIONAL, _P.VAR_KEYWORD)
_NOT_METHODS = {"property", "cached_property", "setter", "getter", "deleter", "overload"}


class ContractError(WorkbenchError, ValueError):
    """A target or base class could not be found, or the base lacks a method that was asked for."""


# --------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Finding:
    """One way a base-style call breaks (or silently changes meaning) on one subclass's override."""

    file: str
    line: int | None
    cls: str
    method: str
    kind: str
    message: str
    call: str = ""
    param: str | None = None
    owner: str | None = None  # the class that defines the override, when ``cls`` inherits it

    def __str__(self) -> str:
        where = _display_path(self.file) + (f":{self.line}" if self.line else "")
        head = f"{where}: {self.cls}.{self.method} [{self.kind}]"
        if self.owner and self.owner != self.cls:
            head += f" (inherited from {self.owner})"
        lines = [head]
        if self.call:
            lines.append(f"    call:   {self.call}")
        lines.append(f"    result: {self.message}")
        return "\n".join(lines)


@dataclass
class Report:
    """The outcome of :func:`check`: findings, what was checked and how each file was read."""

    base: str
    methods: tuple[str, ...]
    findings: list[Finding] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    read_from_source: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no subclass breaks a base-style call."""
        return not self.findings

    def __str__(self) -> str:
        lines = [f"contract of {self.base}: {', '.join(self.methods) or '(no methods)'}"]
        lines += [f"note: {note}" for note in self.notes]
        if self.checked:
            lines.append(f"checked {len(self.checked)} subclass(es): {', '.join(self.checked)}")
        else:
            lines.append(f"no subclass of {self.base} found")
        lines += [str(finding) for finding in self.findings]
        count = len(self.findings)
        lines.append("OK: no findings" if self.ok else f"{count} finding{'s' if count > 1 else ''}")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- comparing two signatures


@dataclass(frozen=True)
class _SourceExpr:
    """A default value read from source that is not a literal: only its text is known."""

    text: str

    def __repr__(self) -> str:
        return self.text


@dataclass(frozen=True)
class _Method:
    """A method's signature and where it is defined; ``bound``: the first parameter receives self/cls."""

    qualname: str
    signature: inspect.Signature
    bound: bool
    file: str
    line: int | None

    @property
    def owner(self) -> str:
        return self.qualname.rpartition(".")[0] or self.qualname

    @property
    def params(self) -> list[inspect.Parameter]:
        """The parameters a caller fills (self/cls left out)."""
        params = list(self.signature.parameters.values())
        return params[1:] if self.bound and params and params[0].kind in _POSITIONAL else params


class _Marker:
    """A distinct argument value, so that a successful binding shows where each argument landed."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


@dataclass(frozen=True)
class _Call:
    """A call made the base's way: which base parameters go positionally and which by keyword."""

    method: str
    positional: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()
    extra_positional: bool = False
    extra_keyword: str | None = None

    def __str__(self) -> str:
        parts = list(self.positional) + (["extra_arg"] if self.extra_positional else [])
        parts += [f"{name}=..." for name in self.keywords]
        parts += [f"{self.extra_keyword}=..."] if self.extra_keyword else []
        return f"obj.{self.method}({', '.join(parts)})"

    def arguments(self, bound: bool) -> tuple[list[Any], dict[str, Any]]:
        args: list[Any] = [_Marker("self")] if bound else []
        args += [_Marker(name) for name in self.positional]
        args += [_Marker("extra_arg")] if self.extra_positional else []
        kwargs = {name: _Marker(name) for name in self.keywords}
        if self.extra_keyword:
            kwargs[self.extra_keyword] = _Marker(self.extra_keyword)
        return args, kwargs


def _stub(method: _Method) -> Any:
    """A function with the method's exact parameters and qualified name, returning its arguments by name."""
    params = [
        p.replace(default=None if p.default is not _EMPTY else _EMPTY, annotation=_EMPTY)
        for p in method.signature.parameters.values()
    ]
    name = method.qualname.rpartition(".")[2]
    body = "return {" + ", ".join(f"{p.name!r}: {p.name}" for p in params) + "}"  # where each argument landed
    namespace: dict[str, Any] = {}
    # Only identifiers reach this text: inspect.Parameter validated every name, ``name`` comes from a def.
    text = f"def {name}{inspect.Signature(params)}:\n    {body}\n"
    exec(compile(text, "<contract stub>", "exec"), namespace)
    function = namespace[name]
    function.__qualname__ = method.qualname
    if hasattr(function.__code__, "co_qualname"):  # Python >= 3.11 names the code object in messages
        function.__code__ = function.__code__.replace(co_qualname=method.qualname)
    return function


def _outcome(method: _Method, call: _Call) -> str:
    """Python's own TypeError message for the call, or where its arguments land when it is accepted."""
    args, kwargs = call.arguments(method.bound)
    try:
        bound = _stub(method)(*args, **kwargs)
    except TypeError as exc:
        return f"TypeError: {exc}"
    landed = {}
    for name, value in bound.items():
        kind = method.signature.parameters[name].kind
        if kind is _P.VAR_POSITIONAL:
            landed.update({id(v): f"*{name}" for v in value})
        elif kind is _P.VAR_KEYWORD:
            landed.update({id(v): f"**{name}" for v in value.values()})
        else:
            landed[id(value)] = name
    markers = [*args[1 if method.bound else 0 :], *kwargs.values()]
    moved = [f"'{m.name}' lands in '{landed[id(m)]}'" for m in markers if landed[id(m)] != m.name]
    return "no exception, but " + "; ".join(moved) if moved else "no exception"


def _same_default(a: Any, b: Any) -> bool:
    """Whether two defaults are equal; a non-literal source expression compares only with another one."""
    if isinstance(a, _SourceExpr) or isinstance(b, _SourceExpr):
        both = isinstance(a, _SourceExpr) and isinstance(b, _SourceExpr)
        return a == b if both else True  # an expression against a value: cannot tell, do not report
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - arrays and tensors: fall back to their text
        return repr(a) == repr(b)


class _Comparison:
    """Checks one override against the base method, parameter by parameter."""

    def __init__(self, name: str, base: _Method, override: _Method) -> None:
        self.name, self.base, self.override = name, base, override
        self.b_pos = [p for p in base.params if p.kind in _POSITIONAL]
        self.b_kwonly = [p for p in base.params if p.kind is _P.KEYWORD_ONLY]
        self.b_named = {p.name: p for p in base.params if p.kind in (_P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY)}
        self.o_pos = [p for p in override.params if p.kind in _POSITIONAL]
        self.o_named = {p.name: p for p in override.params if p.kind not in _VARIADIC}
        self.o_varargs = any(p.kind is _P.VAR_POSITIONAL for p in override.params)
        self.o_varkw = any(p.kind is _P.VAR_KEYWORD for p in override.params)
        self.issues: list[tuple[str, str | None, _Call, str]] = []

    # calls made the base's way
    def _required_kwonly(self, skip: str = "") -> tuple[str, ...]:
        return tuple(p.name for p in self.b_kwonly if p.default is _EMPTY and p.name != skip)

    def positional_call(self, extra: bool = False) -> _Call:
        names = tuple(p.name for p in self.b_pos)
        return _Call(self.name, names, self._required_kwonly(), extra_positional=extra)

    def minimal_call(self, extra_keyword: str | None = None) -> _Call:
        names = tuple(p.name for p in self.b_pos if p.default is _EMPTY)
        return _Call(self.name, names, self._required_kwonly(), extra_keyword=extra_keyword)

    def keyword_call(self, param: inspect.Parameter) -> _Call:
        """Required positional parameters positionally, ``param`` by keyword (and what follows it)."""
        if param.kind is _P.KEYWORD_ONLY:
            before, after = self.b_pos, []
        else:
            i = self.b_pos.index(param)
            before, after = self.b_pos[:i], self.b_pos[i + 1 :]
        positional = tuple(p.name for p in before if p.default is _EMPTY)
        keywords = (param.name, *(p.name for p in after if p.default is _EMPTY))
        return _Call(self.name, positional, keywords + self._required_kwonly(skip=param.name))

    def add(self, kind: str, param: str | None, call: _Call, silent: str | None = None) -> None:
        if kind == REORDERED and any(issue[0] == REORDERED for issue in self.issues):
            return  # one reordering shows up at every moved position: report it once
        message = _outcome(self.override, call)
        if silent and not message.startswith("TypeError"):
            message = silent
        self.issues.append((kind, param, call, message))

    # the checks
    def run(self) -> list[tuple[str, str | None, _Call, str]]:
        for i, param in enumerate(self.b_pos):
            self._positional(i, param)
        for param in self.b_kwonly:
            self._keyword_only(param)
        self._variadics()
        self._new_required()
        return self.issues

    def _positional(self, i: int, bp: inspect.Parameter) -> None:
        op = self.o_pos[i] if i < len(self.o_pos) else None
        named = self.b_named.get(op.name) if op is not None else None
        if op is not None and op.name != bp.name and bp.kind is _P.POSITIONAL_ONLY and named is not None:
            # the slot a positional-only argument fills is a name base callers also pass by keyword
            posonly = tuple(p.name for p in self.b_pos if p.kind is _P.POSITIONAL_ONLY)
            required = (p.name for p in self.b_pos if p.default is _EMPTY and p.name not in (*posonly, op.name))
            call = _Call(self.name, posonly, (op.name, *required, *self._required_kwonly(skip=op.name)))
            self.add(REORDERED, op.name, call)
        elif op is not None and (op.name == bp.name or bp.kind is _P.POSITIONAL_ONLY):
            if bp.kind is _P.POSITIONAL_OR_KEYWORD and op.kind is _P.POSITIONAL_ONLY:
                self.add(KIND_CHANGED, bp.name, self.keyword_call(bp))
            self._default(bp, op)
        elif op is not None:  # another name at this position
            if bp.name in self.o_named:
                self.add(REORDERED, bp.name, self.positional_call())
            else:
                self.add(RENAMED, bp.name, self.keyword_call(bp))
        elif bp.kind is _P.POSITIONAL_ONLY:
            if not self.o_varargs:
                self.add(MISSING, bp.name, self.positional_call())
        elif bp.name in self.o_named:  # the override has it, but not at this position
            twin = self.o_named[bp.name]
            if twin.kind in _POSITIONAL:
                self.add(REORDERED, bp.name, self.positional_call())
            elif bp.default is _EMPTY:  # required: callers pass it positionally, and it is keyword-only now
                self.add(KIND_CHANGED, bp.name, self.positional_call())
            else:
                self._default(bp, twin)
        elif bp.default is not _EMPTY:  # optional: callers pass it by keyword
            if not self.o_varkw:
                self.add(MISSING, bp.name, self.keyword_call(bp))
        elif not self.o_varargs:
            self.add(MISSING, bp.name, self.positional_call())

    def _keyword_only(self, bp: inspect.Parameter) -> None:
        twin = self.o_named.get(bp.name)
        if twin is not None and twin.kind is _P.POSITIONAL_ONLY:
            self.add(KIND_CHANGED, bp.name, self.keyword_call(bp))
        elif twin is None:
            if not self.o_varkw:
                self.add(MISSING, bp.name, self.keyword_call(bp))
        else:
            self._default(bp, twin)

    def _default(self, bp: inspect.Parameter, op: inspect.Parameter) -> None:
        if bp.default is _EMPTY:
            return
        if op.default is _EMPTY:
            self.add(CHANGED_DEFAULT, bp.name, self.minimal_call())
        elif not _same_default(bp.default, op.default):
            text = f"no exception, but a call that omits '{bp.name}' gets {op.default!r}, not {bp.default!r}"
            self.add(CHANGED_DEFAULT, bp.name, self.minimal_call(), silent=text)

    def _variadics(self) -> None:
        if any(p.kind is _P.VAR_POSITIONAL for p in self.base.params) and not self.o_varargs:
            self.add(DROPPED_VARARGS, None, self.positional_call(extra=True))
        if any(p.kind is _P.VAR_KEYWORD for p in self.base.params) and not self.o_varkw:
            taken = {p.name for p in self.base.params} | set(self.o_named)
            extra = next(f"extra{n or ''}" for n in range(len(taken) + 1) if f"extra{n or ''}" not in taken)
            self.add(DROPPED_VARKW, None, self.minimal_call(extra_keyword=extra))

    def _new_required(self) -> None:
        known = set(self.b_named)  # the names a base caller can use
        for j, op in enumerate(self.o_pos):
            if op.default is _EMPTY and op.name not in known and j >= len(self.b_pos):
                self.add(NEW_REQUIRED, op.name, self.minimal_call())
        for op in self.override.params:
            if op.kind is _P.KEYWORD_ONLY and op.default is _EMPTY and op.name not in known:
                self.add(NEW_REQUIRED, op.name, self.minimal_call())


def _findings(cls: str, name: str, base: _Method, override: _Method) -> list[Finding]:
    issues = _Comparison(name, base, override).run()
    return [
        Finding(override.file, override.line, cls, name, kind, message, str(call), param, override.owner)
        for kind, param, call, message in issues
    ]


def compare_signatures(
    base: inspect.Signature,
    override: inspect.Signature,
    *,
    name: str,
    cls: str = "Override",
    bound: bool = True,
) -> list[Finding]:
    """Compare two method signatures directly (``bound``: both take self first); findings carry no file."""
    qualname = f"{cls}.{name}"
    return _findings(cls, name, _Method(qualname, base, bound, "", None), _Method(qualname, override, bound, "", None))


# ------------------------------------------------------------------------------------ imported methods


def _def_line(file: str, first: int) -> int:
    """The ``def`` line of a function whose code starts at ``first`` (its first decorator)."""
    for number in range(first, first + 50):
        text = linecache.getline(file, number).lstrip()
        if text.startswith(("def ", "async def ")):
            return number
        if not text:
            break
    return first


def _imported_method(owner: type, name: str) -> _Method | str:
    """The method ``name`` as ``owner`` defines it, or why it cannot be checked."""
    raw = vars(owner)[name]
    bound = not isinstance(raw, staticmethod)
    function = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    target = inspect.unwrap(function) if callable(function) else function
    label = f"{owner.__qualname__}.{name}"
    if not inspect.isfunction(target):
        return f"{label} is not a plain function ({type(raw).__name__}); not checked"
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError) as exc:
        return f"{label}: no signature ({exc}); not checked"
    code = target.__code__
    file = code.co_filename
    return _Method(target.__qualname__, signature, bound, file, _def_line(file, code.co_firstlineno))


def _public_methods_of(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        if klass is object:
            continue
        for name, value in vars(klass).items():
            is_method = inspect.isfunction(value) or isinstance(value, (staticmethod, classmethod))
            if is_method and not name.startswith("_") and name not in names:
                names.append(name)
    return names


def _source_file(obj: Any) -> Path | None:
    try:
        file = inspect.getsourcefile(obj)
    except TypeError:
        return None
    return Path(file).resolve() if file else None


# -------------------------------------------------------------------------------------- source reading


@dataclass(frozen=True, eq=False)
class _Ref:
    """A class reached while reading source: a parsed ``ClassDef``, or only a name (``node`` is None)."""

    name: str
    module: str
    path: Path | None = None
    node: ast.ClassDef | None = None

    def key(self) -> tuple[Any, ...]:
        return (self.path, self.node.lineno) if self.node else (self.module, self.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Ref) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())


@dataclass(frozen=True)
class _ModRef:
    """A module name bound by an import statement."""

    dotted: str
    path: Path | None


@dataclass
class _SourceModule:
    path: Path
    dotted: str
    names: dict[str, tuple[Any, ...]]  # local name -> ("class", node) | ("from", mod, attr, level) | ("import", mod)
    classes: list[ast.ClassDef]


def _dotted_name(path: Path) -> tuple[str, Path]:
    """A file's module name (from its packages' ``__init__.py``) and the folder that holds the package."""
    parts = [] if path.stem == "__init__" else [path.stem]
    folder = path.parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join(parts), folder


def _top_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements, including those under ``if``/``try``/``with`` (``try: import torch_npu``)."""
    for statement in body:
        yield statement
        for block in ("body", "orelse", "finalbody"):
            if isinstance(statement, (ast.If, ast.Try, ast.With)) and hasattr(statement, block):
                yield from _top_statements(getattr(statement, block))
        if isinstance(statement, ast.Try):
            for handler in statement.handlers:
                yield from _top_statements(handler.body)


def _decorator_name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _class_member(node: ast.ClassDef, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | str | None:
    """The last binding of ``name`` in a class body: a function, ``"assigned"``, or None."""
    found: ast.FunctionDef | ast.AsyncFunctionDef | str | None = None
    for statement in node.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name == name:
            if "overload" not in {_decorator_name(d) for d in statement.decorator_list}:
                found = statement
        elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                found = "assigned"
    return found


def _source_default(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _SourceExpr(ast.unparse(node))


def _signature_from_ast(args: ast.arguments) -> inspect.Signature:
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


def _source_method(owner: _Ref, name: str) -> _Method | str | None:
    """The method ``name`` as the parsed class defines it, why it cannot be checked, or None (not defined)."""
    assert owner.node is not None
    member = _class_member(owner.node, name)
    label = f"{owner.name}.{name}"
    if member is None:
        return None
    if isinstance(member, str):
        return f"{label} is assigned, not defined with def; not checked"
    decorators = {_decorator_name(d) for d in member.decorator_list}
    if decorators & _NOT_METHODS:
        return f"{label} is a property; not checked"
    bound = "staticmethod" not in decorators
    return _Method(label, _signature_from_ast(member.args), bound, str(owner.path), member.lineno)


def _c3(head: _Ref, parents: list[_Ref], parent_mros: list[list[_Ref]]) -> list[_Ref]:
    """Python's method resolution order; an inconsistent hierarchy falls back to depth-first order."""
    sequences = [list(s) for s in [*parent_mros, parents] if s]
    order = [head]
    while sequences:
        for sequence in sequences:
            candidate = sequence[0]
            if not any(candidate in other[1:] for other in sequences):
                break
        else:
            return [head, *dict.fromkeys(r for s in parent_mros for r in s)]
        order.append(candidate)
        sequences = [[r for r in s if r != candidate] for s in sequences]
        sequences = [s for s in sequences if s]
    return order


class _SourceIndex:
    """Parses files on demand and resolves class names through imports across files."""

    def __init__(self) -> None:
        self._modules: dict[Path, _SourceModule | None] = {}

    def module(self, path: Path) -> _SourceModule | None:
        path = path.resolve()
        if path not in self._modules:
            self._modules[path] = self._parse(path)
        return self._modules[path]

    @staticmethod
    def _parse(path: Path) -> _SourceModule | None:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            return None
        names: dict[str, tuple[Any, ...]] = {}
        classes = []
        for statement in _top_statements(tree.body):
            if isinstance(statement, ast.ClassDef):
                names[statement.name] = ("class", statement)
                classes.append(statement)
            elif isinstance(statement, ast.Import):
                for alias in statement.names:
                    local = alias.asname or alias.name.partition(".")[0]
                    names[local] = ("import", alias.name if alias.asname else local)
            elif isinstance(statement, ast.ImportFrom):
                for alias in statement.names:
                    if alias.name != "*":
                        entry = ("from", statement.module or "", alias.name, statement.level)
                        names[alias.asname or alias.name] = entry
        return _SourceModule(path, _dotted_name(path)[0], names, classes)

    @staticmethod
    def find_module(dotted: str, level: int = 0, origin: Path | None = None) -> Path | None:
        """The file of a module, searched like Python would (relative to ``origin`` when ``level``)."""
        if level:
            if origin is None:
                return None
            root = origin.parent
            for _ in range(level - 1):
                root = root.parent
            roots = [root]
        else:
            roots = [_dotted_name(origin)[1]] if origin else []
            roots += [Path(entry or ".") for entry in sys.path if os.path.isdir(entry or ".")]
        parts = [part for part in dotted.split(".") if part]
        for root in roots:
            candidate = root.joinpath(*parts)
            if parts and candidate.with_suffix(".py").is_file():
                return candidate.with_suffix(".py").resolve()
            if (candidate / "__init__.py").is_file():
                return (candidate / "__init__.py").resolve()
        return None

    def lookup(self, module: _SourceModule, name: str, depth: int = 0) -> _Ref | _ModRef | None:
        """What ``name`` means at the top level of ``module``."""
        entry = module.names.get(name)
        if entry is None or depth > 20:
            return None
        if entry[0] == "class":
            return _Ref(name, module.dotted, module.path, entry[1])
        if entry[0] == "import":
            return _ModRef(entry[1], self.find_module(entry[1], 0, module.path))
        _, source, attr, level = entry
        absolute = ("." * level) + source
        path = self.find_module(source, level, module.path)
        inner = self.module(path) if path else None
        if inner is not None:
            found = self.lookup(inner, attr, depth + 1)
            if found is not None:
                return found
            submodule = self.find_module(attr, 1, path)  # ``from pkg import mod``
            if path.name == "__init__.py" and submodule:
                return _ModRef(f"{source}.{attr}", submodule)
            return _Ref(attr, inner.dotted)
        return _Ref(attr, absolute)

    def resolve(self, module: _SourceModule, expr: ast.expr) -> _Ref | None:
        """The class a base-class expression (``Name``, ``pkg.mod.Name``, ``Name[T]``) refers to."""
        if isinstance(expr, ast.Subscript):
            return self.resolve(module, expr.value)
        parts: list[str] = []
        while isinstance(expr, ast.Attribute):
            parts.insert(0, expr.attr)
            expr = expr.value
        if not isinstance(expr, ast.Name):
            return None
        found = self.lookup(module, expr.id)
        for i, part in enumerate(parts):
            if not isinstance(found, _ModRef):
                return None
            inner = self.module(found.path) if found.path else None
            resolved = self.lookup(inner, part) if inner else None
            last = i == len(parts) - 1
            if resolved is None:
                dotted = f"{found.dotted}.{part}"
                path = self.find_module(part, 1, found.path) if found.path else None
                resolved = _Ref(part, found.dotted) if last else _ModRef(dotted, path)
            found = resolved
        if found is None:  # a builtin (object), or a name from a star import
            return _Ref(parts[-1] if parts else expr.id, "builtins" if hasattr(builtins, expr.id) else "?")
        return found if isinstance(found, _Ref) else None

    def mro(self, ref: _Ref, stop: _BaseSpec | None = None, seen: frozenset[_Ref] = frozenset()) -> list[_Ref]:
        """The class's resolution order as far as source reveals it; ``stop``'s class counts as a leaf."""
        if ref.node is None or ref in seen or (stop is not None and stop.matches_ref(ref)):
            return [ref]
        module = self.module(ref.path) if ref.path else None
        parents = [self.resolve(module, b) if module else None for b in ref.node.bases]
        parents = [p or _Ref("?", "?") for p in parents]
        return _c3(ref, parents, [self.mro(p, stop, seen | {ref}) for p in parents])


# --------------------------------------------------------------------------------------- the base class


@dataclass
class _BaseSpec:
    """The contract's base class: an imported class, a parsed ``ClassDef``, or (until found) just a name."""

    name: str
    label: str
    module: str | None = None
    cls: type | None = None
    path: Path | None = None
    node: ast.ClassDef | None = None

    def matches_class(self, cls: type) -> bool:
        if self.cls is not None:
            if cls is self.cls:
                return True
            same = cls.__qualname__ == self.cls.__qualname__
            return same and _source_file(cls) is not None and _source_file(cls) == _source_file(self.cls)
        return cls.__name__ == self.name and (self.module is None or cls.__module__ == self.module)

    def matches_ref(self, ref: _Ref) -> bool:
        if ref.name != self.name:
            return False
        if ref.path is not None and self.path is not None:
            return ref.path == self.path
        if ref.path is None and self.module and not ref.module.startswith("."):
            return ref.module == self.module
        return True

    def public_methods(self, index: _SourceIndex) -> list[str]:
        if self.cls is not None:
            return _public_methods_of(self.cls)
        names: list[str] = []
        for ref in index.mro(self.as_ref()):
            for statement in ref.node.body if ref.node else []:
                if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                decorators = {_decorator_name(d) for d in statement.decorator_list}
                if not statement.name.startswith("_") and not decorators & _NOT_METHODS:
                    names += [statement.name] if statement.name not in names else []
        return names

    def as_ref(self) -> _Ref:
        return _Ref(self.name, self.module or "", self.path, self.node)

    def method(self, name: str, index: _SourceIndex) -> _Method:
        found: _Method | str | None = None
        if self.cls is not None:
            owner = next((c for c in self.cls.__mro__ if name in vars(c) and c is not object), None)
            found = _imported_method(owner, name) if owner else None
        else:
            for ref in index.mro(self.as_ref()):
                found = _source_method(ref, name) if ref.node else None
                if found is not None:
                    break
        if not isinstance(found, _Method):
            raise ContractError(found or f"{self.label} has no method {name!r}")
        return found


def _parse_base(base: type | str) -> _BaseSpec:
    if isinstance(base, type):
        label = f"{base.__module__}:{base.__qualname__}"
        return _BaseSpec(base.__name__, label, base.__module__, base, _source_file(base))
    if ":" in base:
        module, _, name = base.partition(":")
    elif "." in base:
        module, _, name = base.rpartition(".")
    else:
        return _BaseSpec(base, base)
    return _BaseSpec(name, f"{module}:{name}", module)


def _resolve_base(spec: _BaseSpec, loaded: list[_Loaded], index: _SourceIndex, report: Report) -> None:
    """Find the base's class (import) or ``ClassDef`` (source) so that its method signatures are known."""
    if spec.cls is not None:
        return
    if spec.module is not None:
        try:
            cls = getattr(importlib.import_module(spec.module), spec.name)
        except Exception as exc:  # noqa: BLE001 - any failure at import: read the source instead
            path = index.find_module(spec.module)
            parsed = index.module(path) if path else None
            ref = index.lookup(parsed, spec.name) if parsed else None
            if not isinstance(ref, _Ref) or ref.node is None:
                raise ContractError(f"cannot import or find base class {spec.label} ({_why(exc)})") from exc
            spec.path, spec.node = ref.path, ref.node
            report.read_from_source.append(str(ref.path))
            report.notes.append(f"read source of base {_display_path(str(ref.path))} ({_why(exc)})")
            return
        if not isinstance(cls, type):
            raise ContractError(f"{spec.label} is not a class")
        spec.cls, spec.path = cls, _source_file(cls)
        return
    for item in loaded:  # a bare name: what the targets themselves call it
        found = getattr(item.module, spec.name, None) if item.module else None
        if isinstance(found, type):
            spec.cls, spec.module, spec.path = found, found.__module__, _source_file(found)
            return
        ref = index.lookup(item.source, spec.name) if item.source else None
        if isinstance(ref, _Ref) and ref.node is not None:
            spec.path, spec.node, spec.module = ref.path, ref.node, ref.module
            return
    raise ContractError(f"cannot find base class {spec.name!r} in the targets; pass it as pkg.module:{spec.name}")


# ----------------------------------------------------------------------------------------- the targets


@dataclass
class _Loaded:
    """One file of the targets: imported (``module``) or parsed (``source``)."""

    path: Path | None
    module: ModuleType | None = None
    source: _SourceModule | None = None


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _display_path(file: str) -> str:
    """Relative to the working directory when under it, else as given."""
    try:
        return str(Path(file).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return file


def _python_files(folder: Path) -> list[Path]:
    """The folder's modules; ``__main__.py`` is left out, since importing it would run it."""
    files = (p.resolve() for p in folder.rglob("*.py") if p.name != "__main__.py")
    return sorted(p for p in files if not any(part.startswith((".", "__pycache__")) for part in p.parts))


@contextmanager
def _on_sys_path(folders: list[Path]) -> Iterator[None]:
    """Let the targets' packages and sibling modules import each other for the duration of the check."""
    added = [str(f) for f in dict.fromkeys(folders) if str(f) not in sys.path]
    sys.path[:0] = added
    try:
        yield
    finally:
        for entry in added:
            if entry in sys.path:
                sys.path.remove(entry)


def _load_file(path: Path, index: _SourceIndex, report: Report) -> _Loaded:
    """Import a file by its package name; where that fails, parse it and say so in the report."""
    path = path.resolve()
    dotted = _dotted_name(path)[0]
    try:
        module = importlib.import_module(dotted)
        imported = Path(getattr(module, "__file__", "") or "").resolve()
        if imported != path:
            raise ImportError(f"the name {dotted!r} is already {imported}")
        return _Loaded(path, module=module)
    except Exception as exc:  # noqa: BLE001 - whatever the import raised, source can still be read
        source = index.module(path)
        if source is None:
            report.notes.append(f"cannot import or parse {_display_path(str(path))} ({_why(exc)}); skipped")
            return _Loaded(path)
        report.read_from_source.append(str(path))
        report.notes.append(f"read source of {_display_path(str(path))} instead of importing it ({_why(exc)})")
        return _Loaded(path, source=source)


def _expand(target: Target) -> list[ModuleType | Path]:
    """A module object as is; a path or a package name as its files; an importable module name imported."""
    if isinstance(target, ModuleType):
        return [target]
    path = Path(target)
    if path.exists():
        return list(_python_files(path)) if path.is_dir() else [path.resolve()]
    name = str(target)
    try:
        module = importlib.import_module(name)
    except Exception:  # noqa: BLE001 - find its file and let _load_file read it
        spec = None
        with suppress(Exception):
            spec = importlib.util.find_spec(name)
        origin = Path(spec.origin) if spec and spec.origin and os.path.isfile(spec.origin) else None
        origin = origin or _SourceIndex.find_module(name)
        if origin is None:
            raise ContractError(f"no module or path named {name!r}") from None
    else:
        if not hasattr(module, "__path__"):
            return [module]
        origin = Path(getattr(module, "__file__", None) or next(iter(module.__path__)) + "/__init__.py")
    return list(_python_files(origin.parent)) if origin.name == "__init__.py" else [origin.resolve()]


# ------------------------------------------------------------------------------------------- checking


def _check_module(module: ModuleType, spec: _BaseSpec, base: dict[str, _Method], report: Report) -> None:
    seen: set[int] = set()
    for obj in list(vars(module).values()):
        if not isinstance(obj, type) or obj.__module__ != module.__name__ or id(obj) in seen:
            continue
        seen.add(id(obj))
        anchor = next((c for c in obj.__mro__[1:] if spec.matches_class(c)), None)
        if anchor is None or spec.matches_class(obj):
            continue
        report.checked.append(obj.__qualname__)
        for name, base_method in base.items():
            owner = next((c for c in obj.__mro__ if name in vars(c)), None)
            if owner is None or owner in anchor.__mro__:
                continue  # not overridden
            override = _imported_method(owner, name)
            if isinstance(override, str):
                report.notes.append(override)
                continue
            report.findings += _findings(obj.__qualname__, name, base_method, override)


def _check_source(
    source: _SourceModule, spec: _BaseSpec, base: dict[str, _Method], index: _SourceIndex, report: Report
) -> None:
    for node in source.classes:
        ref = _Ref(node.name, source.dotted, source.path, node)
        if spec.matches_ref(ref):
            continue
        mro = index.mro(ref, stop=spec)
        at = next((i for i, r in enumerate(mro) if spec.matches_ref(r)), None)
        if at is None:
            continue
        report.checked.append(node.name)
        unknown = [r.name for r in mro[:at] if r.node is None and r.module != "builtins"]
        if unknown:
            report.notes.append(f"{node.name}: cannot read {', '.join(unknown)}; methods defined there not checked")
        for name, base_method in base.items():
            for owner in mro[:at]:
                override = _source_method(owner, name) if owner.node else None
                if isinstance(override, str):
                    report.notes.append(override)
                elif override is not None:
                    report.findings += _findings(node.name, name, base_method, override)
                if override is not None:
                    break


def check(
    target: Target | Sequence[Target],
    base: type | str,
    methods: Sequence[str] | None = None,
) -> Report:
    """Check every subclass of ``base`` found in ``target`` against the base's method signatures.

    ``target``: a module object, a dotted module name (a package means all its files), a file or directory
    path, or a list of these. Each file is imported if it can be; otherwise its source is parsed and the file
    is listed in ``Report.read_from_source``. ``base``: a class, ``"pkg.mod:Class"``, or a bare class name
    that the targets import or define. ``methods``: the methods to compare; by default every public method the
    base defines or inherits (``__init__`` and other underscored names are not part of the contract).
    """
    targets = list(target) if isinstance(target, (list, tuple)) else [target]
    spec = _parse_base(base)
    index = _SourceIndex()
    report = Report(spec.label, ())
    items = list(dict.fromkeys(item for t in targets for item in _expand(t)))
    files = [item for item in items if isinstance(item, Path)]
    with _on_sys_path([_dotted_name(p)[1] for p in files]):
        loaded = [
            _load_file(item, index, report) if isinstance(item, Path) else _Loaded(None, module=item) for item in items
        ]
        _resolve_base(spec, loaded, index, report)
        names = tuple(methods) if methods is not None else tuple(spec.public_methods(index))
        base_methods = {name: spec.method(name, index) for name in names}
    report.base, report.methods = spec.label, names
    for item in loaded:
        if item.module is not None:
            _check_module(item.module, spec, base_methods, report)
        elif item.source is not None:
            _check_source(item.source, spec, base_methods, index, report)
    return report


# ------------------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    """``workbench check-contracts [module-or-path ...] [--base pkg.mod:Class]``.

    Prints the report; returns 0 when clean, 1 when there are findings, 2 on a usage or lookup error.
    """
    parser = argparse.ArgumentParser(
        prog="workbench check-contracts",
        description="Report subclass methods that cannot take the calls their base class promises.",
    )
    parser.add_argument("targets", nargs="*", metavar="module-or-path", help=f"default: {' '.join(DEFAULT_TARGETS)}")
    parser.add_argument("--base", default=DEFAULT_BASE, help=f"the contract's class (default: {DEFAULT_BASE})")
    parser.add_argument("--method", action="append", dest="methods", help="check only this method (repeatable)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse already printed
        return exc.code if isinstance(exc.code, int) else 2
    try:
        report = check(args.targets or list(DEFAULT_TARGETS), args.base, args.methods)
    except ContractError as exc:
        print(f"check-contracts: {exc}", file=sys.stderr)
        return 2
    print(report)
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
