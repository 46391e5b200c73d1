"""Reading classes from source: each file parsed once, base classes resolved by name across files.

Nothing is imported: engine code that imports a missing device library (``torch_npu``, ``sgl_kernel_npu``)
or a dozen engine modules reads just as well. Names are resolved the way Python would import them, from the
file's own package root, then the extra search roots, then ``sys.path``.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import inspect
import os
import sys
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.contracts.signatures import CallSite, Method, SourceExpr

_P = inspect.Parameter
_EMPTY = inspect.Parameter.empty
NOT_METHODS = {"property", "cached_property", "setter", "getter", "deleter", "overload"}
_MAX_ARG_TEXT = 24


@dataclass(frozen=True, eq=False)
class Ref:
    """A class reached while reading source: a parsed ``ClassDef``, or only a name (``node`` is None)."""

    name: str
    module: str
    path: Path | None = None
    node: ast.ClassDef | None = None

    def key(self) -> tuple[Any, ...]:
        return (self.path, self.node.lineno) if self.node else (self.module, self.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ref) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    @property
    def label(self) -> str:
        return f"{self.module}:{self.name}" if self.module else self.name


@dataclass(frozen=True)
class ModRef:
    """A module name bound by an import statement."""

    dotted: str
    path: Path | None


@dataclass
class SourceModule:
    path: Path
    dotted: str
    names: dict[str, tuple[Any, ...]]  # local name -> ("class", node) | ("from", mod, attr, level) | ("import", mod)
    classes: list[ast.ClassDef] = field(default_factory=list)


_PACKAGE_ROOTS: dict[Path, tuple[str, Path]] = {}


def dotted_name(path: Path) -> tuple[str, Path]:
    """A file's module name (from its packages' ``__init__.py``) and the folder that holds the package."""
    folder = path.parent
    if folder not in _PACKAGE_ROOTS:
        parts: list[str] = []
        root = folder
        while (root / "__init__.py").is_file():
            parts.insert(0, root.name)
            root = root.parent
        _PACKAGE_ROOTS[folder] = (".".join(parts), root)
    package, root = _PACKAGE_ROOTS[folder]
    if path.stem == "__init__":
        return package, root
    return (f"{package}.{path.stem}" if package else path.stem), root


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


def decorator_name(node: ast.expr) -> str:
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
            if "overload" not in {decorator_name(d) for d in statement.decorator_list}:
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
        return SourceExpr(ast.unparse(node))


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


def source_method(owner: Ref, name: str) -> Method | str | None:
    """The method ``name`` as the parsed class defines it, why it cannot be checked, or None (not defined).

    A decorator other than ``staticmethod``/``classmethod`` is taken to keep the signature, as a
    ``functools.wraps`` wrapper that forwards ``*args, **kwargs`` does: the call still reaches the ``def``.
    """
    assert owner.node is not None
    member = _class_member(owner.node, name)
    label = f"{owner.name}.{name}"
    if member is None:
        return None
    if isinstance(member, str):
        return f"{label} is assigned, not defined with def; not checked"
    decorators = {decorator_name(d) for d in member.decorator_list}
    if decorators & NOT_METHODS:
        return f"{label} is a property; not checked"
    kind = "staticmethod" if "staticmethod" in decorators else "classmethod" if "classmethod" in decorators else ""
    return Method(label, signature_from_ast(member.args), kind or "function", str(owner.path), member.lineno)


def calls_up(function: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> bool:
    """Whether a method body calls ``super().name(...)`` or ``SomeClass.name(self, ...)``: the base's runs."""
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


def _walk_body(node: ast.AST) -> Iterator[ast.AST]:
    """Every node under ``node``, nested classes left out (their ``self`` is another object)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef):
            continue
        yield child
        yield from _walk_body(child)


def _via(value: ast.expr, self_name: str | None, cls_name: str | None) -> str | None:
    """How a call's receiver reaches the object: ``self``, its type, or ``super()``."""
    if isinstance(value, ast.Name):
        if value.id == self_name:
            return "self"
        return "type" if value.id == cls_name else None
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        if value.func.id == "super" and (not value.args or len(value.args) == 2):
            return "super"
        if value.func.id == "type" and len(value.args) == 1 and isinstance(value.args[0], ast.Name):
            return "type" if value.args[0].id == self_name else None
    if isinstance(value, ast.Attribute) and value.attr == "__class__" and isinstance(value.value, ast.Name):
        return "type" if value.value.id == self_name else None
    return None


def _short(node: ast.expr) -> str:
    text = ast.unparse(node)
    return text if len(text) <= _MAX_ARG_TEXT else "..."


def _call_text(node: ast.Call) -> str:
    """The call as written, long arguments shortened to ``...``: which go positionally, which by keyword."""
    args = [f"*{_short(a.value)}" if isinstance(a, ast.Starred) else _short(a) for a in node.args]
    args += [f"{k.arg}={_short(k.value)}" if k.arg else f"**{_short(k.value)}" for k in node.keywords]
    return f"{ast.unparse(node.func)}({', '.join(args)})"


def call_sites(ref: Ref) -> list[CallSite]:
    """Every ``self.NAME(...)``, ``type(self).NAME(...)``, ``super().NAME(...)`` in the class's methods."""
    assert ref.node is not None
    sites: list[CallSite] = []
    for statement in ref.node.body:
        if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        decorators = {decorator_name(d) for d in statement.decorator_list}
        positional = [*statement.args.posonlyargs, *statement.args.args]
        first_name = positional[0].arg if positional else None
        self_name = None if decorators & {"staticmethod", "classmethod"} else first_name
        cls_name = first_name if "classmethod" in decorators else None
        for node in _walk_body(statement):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            via = _via(node.func.value, self_name, cls_name)
            if via is None:
                continue
            site = CallSite(
                file=str(ref.path),
                line=node.lineno,
                cls=ref.name,
                caller=f"{ref.name}.{statement.name}",
                name=node.func.attr,
                via=via,
                positional=sum(not isinstance(a, ast.Starred) for a in node.args),
                keywords=tuple(k.arg for k in node.keywords if k.arg is not None),
                star=any(isinstance(a, ast.Starred) for a in node.args),
                starstar=any(k.arg is None for k in node.keywords),
                text=_call_text(node),
            )
            sites.append(site)
    return sites


def _c3(head: Ref, parents: list[Ref], parent_mros: list[list[Ref]]) -> list[Ref]:
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


class SourceIndex:
    """Parses files on demand (each once) and resolves class names through imports across files.

    ``roots``: folders searched for absolute imports after the importing file's own package root and
    before ``sys.path`` (``--search-path``).
    """

    def __init__(self, roots: list[Path] | tuple[Path, ...] = ()) -> None:
        self.roots = [Path(r).resolve() for r in roots]
        self.errors: dict[Path, str] = {}
        self._modules: dict[Path, SourceModule | None] = {}  # by the path as given and as resolved
        self._found: dict[tuple[str, int, Path | None], Path | None] = {}
        self._mros: dict[Ref, list[Ref]] = {}

    def add_roots(self, roots: list[Path]) -> None:
        """Search these folders too (after the current roots); forgets what was not found."""
        self.roots += [r for r in dict.fromkeys(roots) if r not in self.roots]
        self._found = {key: path for key, path in self._found.items() if path is not None}

    def module(self, path: Path) -> SourceModule | None:
        """The parsed module, or None (the reason is in ``errors``)."""
        if path in self._modules:
            return self._modules[path]
        resolved = path.resolve()
        if resolved not in self._modules:
            self._modules[resolved] = self._parse(resolved)
        found = self._modules[path] = self._modules[resolved]
        return found

    def _parse(self, path: Path) -> SourceModule | None:
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except SyntaxError as exc:
            self.errors[path] = f"SyntaxError: {exc.msg} (line {exc.lineno})"
            return None
        except (OSError, ValueError) as exc:
            self.errors[path] = f"{type(exc).__name__}: {exc}"
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
        return SourceModule(path, dotted_name(path)[0], names, classes)

    def find_module(self, dotted: str, level: int = 0, origin: Path | None = None) -> Path | None:
        """The file of a module, searched like Python would (relative to ``origin`` when ``level``)."""
        anchor = origin.parent if origin is not None and level else (dotted_name(origin)[1] if origin else None)
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
            roots += self.roots + [Path(entry or ".") for entry in sys.path if os.path.isdir(entry or ".")]
        parts = [part for part in dotted.split(".") if part]
        for root in roots:
            candidate = root.joinpath(*parts)
            if parts and candidate.with_suffix(".py").is_file():
                return candidate.with_suffix(".py").resolve()
            if (candidate / "__init__.py").is_file():
                return (candidate / "__init__.py").resolve()
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

    def lookup(self, module: SourceModule, name: str, depth: int = 0) -> Ref | ModRef | None:
        """What ``name`` means at the top level of ``module``."""
        entry = module.names.get(name)
        if entry is None or depth > 20:
            return None
        if entry[0] == "class":
            return Ref(name, module.dotted, module.path, entry[1])
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
                return ModRef(f"{source}.{attr}", submodule)
            return Ref(attr, inner.dotted)
        return Ref(attr, absolute)

    def resolve(self, module: SourceModule, expr: ast.expr) -> Ref | None:
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
        if found is None:  # a builtin (object), or a name from a star import
            return Ref(parts[-1] if parts else expr.id, "builtins" if hasattr(builtins, expr.id) else "?")
        return found if isinstance(found, Ref) else None

    def parents(self, ref: Ref) -> list[Ref]:
        """The class's direct bases; one that cannot be resolved is a name-only ``Ref``."""
        if ref.node is None or ref.path is None:
            return []
        module = self.module(ref.path)
        found = [(self.resolve(module, b) if module else None, b) for b in ref.node.bases]
        return [p or Ref(ast.unparse(b), "?") for p, b in found]

    def mro(self, ref: Ref, seen: frozenset[Ref] = frozenset()) -> list[Ref]:
        """The class's resolution order as far as source reveals it (memoized)."""
        if ref in self._mros:
            return self._mros[ref]
        if ref.node is None or ref in seen:
            return [ref]
        parents = self.parents(ref)
        order = _c3(ref, parents, [self.mro(p, seen | {ref}) for p in parents])
        self._mros[ref] = order
        return order

    def find_class(self, path: Path, qualname: str) -> Ref | None:
        """A class of a parsed file by its (possibly nested) qualified name."""
        module = self.module(path)
        if module is None:
            return None
        body: list[ast.stmt] = [*module.classes]
        node: ast.ClassDef | None = None
        for part in qualname.split("."):
            node = next((s for s in body if isinstance(s, ast.ClassDef) and s.name == part), None)
            if node is None:
                return None
            body = node.body
        return Ref(node.name, module.dotted, module.path, node) if node else None
