"""What the checks need from one parsed file, read in one walk of its tree, so that the tree can be dropped.

A whole engine's trees take some 25 times its source in memory (vLLM: 1.8 GiB): :class:`ClassInfo` and
:class:`FunctionInfo` keep only what the checks read. A class: its bases, its members, the annotations of its
attributes. A method: its parameters (defaults as their small expressions), its decorators, the methods it
calls up (``super().NAME(...)``), the keys it reads from its ``**kwargs``, and the calls it makes on
receivers whose class can be told, each with the statement lines that gate it. Which method names matter
is only known once every file is read, so the calls are kept whatever their name, and filtered later by
the same text scan (``.NAME(`` lines) as before.

The walk visits each node of a function once, in the order the earlier per-call-site walk visited them (so
call sites, and the findings built from them, come out in the same order): statement by statement, the
headers of a compound statement, then its blocks; every expression depth first with the last child first.
"""

from __future__ import annotations

import ast
import re
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

Function = ast.FunctionDef | ast.AsyncFunctionDef
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_NESTING: dict[type, tuple[str, ...]] = {}  # filled below: a compound statement (not def) -> its blocks
_COMPOUND: set[type[ast.AST]] = {ast.For, ast.AsyncFor, ast.While, ast.If, ast.With, ast.AsyncWith, ast.Match, ast.Try,
             ast.FunctionDef, ast.AsyncFunctionDef} | ({ast.TryStar} if hasattr(ast, "TryStar") else set())  # fmt: skip
_HEADERS = ("test", "iter", "items", "subject", "target")
_BLOCKS = ("body", "orelse", "finalbody")
_KWARGS_READERS = ("get", "pop", "setdefault")
_NOT_NODES = {"ctx", "op", "ops", "id", "attr", "arg", "name", "module", "level", "type_comment", "kind",
              "conversion", "is_async", "names", "kwd_attrs", "rest", "tag"}  # fmt: skip


def _node_fields() -> dict[type, tuple[str, ...]]:
    """Per node type, the fields that may hold nodes, in ``_fields`` order (contexts, operators and names out:
    no fact depends on them)."""
    out: dict[type, tuple[str, ...]] = {}
    stack: list[type] = [ast.AST]
    while stack:
        kind = stack.pop()
        stack.extend(kind.__subclasses__())
        out[kind] = tuple(f for f in getattr(kind, "_fields", ()) if f not in _NOT_NODES)
    out[ast.Constant] = ()
    return out


_CHILDREN = _node_fields()


def _statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """Every statement of a body, those under ``if``/``try``/``with``/``for`` included, not inside def/class
    (in order: a statement, then its blocks, its handlers' and its cases' bodies)."""
    out: list[ast.stmt] = []
    _gather(body, out)
    return out


def _gather(body: list[ast.stmt], out: list[ast.stmt]) -> None:
    nesting = _NESTING
    for statement in body:
        out.append(statement)
        inner = nesting.get(type(statement))
        if inner is None:
            continue  # a simple statement, a def or a class
        for block in inner:
            _gather(getattr(statement, block), out)
        for handler in getattr(statement, "handlers", ()):
            _gather(handler.body, out)
        for case in getattr(statement, "cases", ()):
            _gather(case.body, out)


def decorator_name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def unparse(node: ast.AST, fallback: str = "...") -> str:
    """``ast.unparse``, or ``fallback`` for an expression nested too deeply for it (it recurses per level)."""
    try:
        return ast.unparse(node)
    except (RecursionError, MemoryError):
        return fallback


# ----------------------------------------------------------------------------------------------- the facts

Ann = tuple
"""An annotation (or an ``isinstance()`` class) kept without its tree: ``("N", name)``, ``("A", value, attr)``,
``("S", value, slice)``, ``("T", (elements...))``, ``("|", left, right)`` (``X | Y``), ``("C", text)`` (a string),
``("?", (children...))`` for any other node (its children kept for the names they mention), and ``("*", names)``
where nesting runs deeper than any check reads (only its names kept). A few tuples instead of a node and its
``__dict__`` each: what stays of a whole engine's annotations weighs a third."""
_NO_NAMES: frozenset[str] = frozenset()
_MAX_NESTING = 32  # annotation_classes stops at 7 levels (each level is at most 3 of these): the rest is names


def compact(node: ast.AST, depth: int = 0) -> Ann:
    """An annotation's :data:`Ann`. A chain of attributes and subscripts (``a.b.c[T][T]``) is followed in a loop,
    however long; any other nesting deeper than ``_MAX_NESTING`` keeps only the names it mentions."""
    if depth > _MAX_NESTING:
        return ("*", tuple(_mentioned(node)))
    chain: list[Any] = []
    while type(node) is ast.Attribute or type(node) is ast.Subscript:
        chain.append(node)
        node = node.value
    kind = type(node)
    if kind is ast.Name:
        out: Ann = ("N", node.id)  # type: ignore[attr-defined]
    elif kind is ast.Tuple:
        out = ("T", tuple([compact(e, depth + 1) for e in node.elts]))  # type: ignore[attr-defined]
    elif kind is ast.Constant:
        out = ("C", node.value) if isinstance(node.value, str) else ("?", ())  # type: ignore[attr-defined]
    elif kind is ast.BinOp and type(node.op) is ast.BitOr:  # type: ignore[attr-defined]
        out = ("|", compact(node.left, depth + 1), compact(node.right, depth + 1))  # type: ignore[attr-defined]
    else:
        out = ("?", tuple([compact(c, depth + 1) for c in ast.iter_child_nodes(node)]))
    for link in reversed(chain):
        out = ("A", out, link.attr) if type(link) is ast.Attribute else ("S", out, compact(link.slice, depth + 1))
    return out


def _mentioned(node: ast.AST) -> list[str]:
    """The identifiers (and the words of strings) under a node, as :func:`annotation_names` counts them."""
    names: list[str] = []
    for inner in ast.walk(node):
        if isinstance(inner, ast.Name):
            names.append(inner.id)
        elif isinstance(inner, ast.Attribute):
            names.append(inner.attr)
        elif isinstance(inner, ast.Constant) and isinstance(inner.value, str):
            names += _words(inner.value)
    return names


@dataclass(frozen=True)
class Receiver:
    """How to find the class a call's receiver has.

    ``kind``: ``"self"``, ``"super"``, ``"type"`` (the calling class), ``"attr"`` (the calling class's
    attribute ``attr``) or ``"param"`` (``annotation``); ``item``: the receiver is an element of that
    attribute or parameter (``self.backends[i]``, ``for b in self.backends``).
    """

    kind: str
    attr: str = ""
    annotation: Ann | None = None
    item: bool = False


@dataclass(frozen=True)
class MaybeAlias:
    """A receiver named like a loop's variable (``for b in self.backends: b.NAME(...)``): that loop's element
    when the loop is read (its statement spans a line that calls a checked name), else ``otherwise`` (the
    annotated parameter of that name, or nothing)."""

    name: str
    otherwise: Receiver | None


class CallFact(NamedTuple):
    """One call ``RECEIVER.NAME(...)`` on a receiver whose class may be told: what a :class:`CallSite` needs.

    ``gate``: the lines of the statement that holds the call; the call is read only when a line in that span
    calls a checked name (as the per-call-site walk read only such statements). ``span``: the call's own
    position (line, column, end line, end column), to read its text back from the source when a finding
    shows it.
    """

    gate: tuple[int, int]
    line: int
    name: str
    receiver: Receiver | MaybeAlias
    positional: int
    keywords: tuple[str, ...]
    star: bool
    starstar: bool
    arg_names: tuple[str | None, ...]
    span: tuple[int, int, int, int]


Default = tuple[Any] | ast.expr
"""A parameter's default as kept: ``(value,)`` for a literal (a ``Constant``), else the expression's tree."""


class Params(NamedTuple):
    """A function's parameters as written: names by kind, and :data:`Default` s (None: a keyword-only one has none)."""

    posonly: tuple[str, ...]
    args: tuple[str, ...]
    defaults: tuple[Default, ...]
    vararg: str | None
    kwonly: tuple[str, ...]
    kw_defaults: tuple[Default | None, ...]
    kwarg: str | None


class FunctionInfo:
    """A function read from source: a method, or a top-level function with an annotated parameter.

    ``ups``: the names ``NAME`` of every ``super().NAME(...)`` and ``Cls.NAME(self, ...)`` call in it;
    ``reads``/``uses``: with ``**kwargs``, the keys the body reads from them and the parameters it reads;
    ``calls``/``loops``: the calls on receivers whose class may be told and the loops that alias one
    (gate, variable, element receiver); ``attrs``: ``self.attr`` annotations it gives (methods);
    ``annotated``: the identifiers its parameter annotations mention (top-level functions).
    """

    __slots__ = ("name", "lineno", "end_lineno", "decorators", "params", "ups", "reads", "uses", "calls", "loops",
                 "attrs", "annotated")  # fmt: skip

    def __init__(self, node: Function, name: str, decorators: tuple[str, ...], params: Params) -> None:
        self.name = name
        self.lineno: int = node.lineno
        self.end_lineno: int = node.end_lineno or node.lineno
        self.decorators = decorators
        self.params = params
        self.ups: frozenset[str] = _NO_NAMES  # one empty set for all: most functions have none of these
        self.reads: frozenset[str] = _NO_NAMES
        self.uses: frozenset[str] = _NO_NAMES
        self.calls: tuple[CallFact, ...] = ()
        self.loops: tuple[tuple[tuple[int, int], str, Receiver], ...] = ()
        self.attrs: tuple[tuple[str, Ann], ...] = ()
        self.annotated: frozenset[str] = _NO_NAMES

    def __repr__(self) -> str:
        return f"<FunctionInfo {self.name} line {self.lineno}>"


Member = FunctionInfo | str
Narrow = dict[str, Ann]
"""A receiver (``x``, or ``x.attr``) -> the class an ``isinstance()`` test around the call gave it."""


class ClassInfo:
    """A class read from source: what :class:`~workbench.contracts.source.Ref` points at.

    ``methods``: every ``def`` in its body, in order (overloads included); ``members``: the last binding of
    each name, its method or ``"assigned"`` (overloads left out); ``attributes``: the annotations of its
    attributes (``attr: T`` in the body, ``self.attr: T`` or ``self.attr = p`` with ``p: T`` in a method).
    """

    __slots__ = ("name", "qualname", "lineno", "end_lineno", "bases", "methods", "members", "attributes", "signatures")

    def __init__(self, node: ast.ClassDef) -> None:
        self.name = node.name
        self.qualname = ""  # the dotted name in its module, once the module's classes are listed
        self.lineno: int = node.lineno
        self.end_lineno: int = node.end_lineno or node.lineno
        self.bases: tuple[ast.expr, ...] = tuple(node.bases)
        self.methods: list[FunctionInfo] = []
        self.members: dict[str, Member] = {}
        self.attributes: dict[str, Ann] = {}
        self.signatures: dict[str, Any] = {}  # source_method's answers, by name

    def __repr__(self) -> str:
        return f"<ClassInfo {self.name} line {self.lineno}>"


def read_class(node: ast.ClassDef, lines: list[int] | None = None) -> ClassInfo:
    """A class's facts; each method read in one walk (``lines``: from :func:`scan_calls`; None: walk everything)."""
    info = ClassInfo(node)
    attributes = info.attributes
    for statement in node.body:
        if isinstance(statement, _FUNCTIONS):
            method = read_function(statement, True, lines)
            info.methods.append(method)
            if "overload" not in method.decorators:
                info.members[statement.name] = method
            for attr, annotation in method.attrs:
                attributes.setdefault(attr, annotation)
        elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                attributes[statement.target.id] = compact(statement.annotation)
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            if isinstance(statement, ast.AnnAssign) and statement.value is None:
                continue  # an annotation binds nothing
            for target in targets:
                if isinstance(target, ast.Name):
                    info.members[target.id] = "assigned"
    return info


def read_function(node: Function, method: bool, lines: list[int] | None = None) -> FunctionInfo:
    """A function's facts from one walk of it (``method``: a method, whose first parameter is the object)."""
    return _Walk(node, method, lines).info


_NARROW = rb"\.\s*([A-Za-z_][A-Za-z0-9_]*)\s*\("
METHOD_CALL = re.compile(_NARROW)
"""``.NAME(``: the checks' own scan of the calls a file makes by name (which lines call a checked name)."""
_GAP = rb"(?:[ \t\n\r\f\v]++|\\\r?\n|#[^\r\n]*+)*+"  # blanks, comments, continuations (possessive: no backtracking)
_BEFORE_CALL = rb"(?:[ \t\n\r\f\v)]++|\\\r?\n|#[^\r\n]*+)*+"  # the same, and closing brackets: ``(self.f)(x)``
_SCAN = re.compile(_NARROW + rb"|\." + _GAP + rb"[A-Za-z_\x80-\xff][A-Za-z0-9_\x80-\xff]*+" + _BEFORE_CALL + rb"\(")
"""``.NAME(`` as :data:`METHOD_CALL` matches it, else any other attribute call (a comment, a line continuation or
a bracket between, a name beyond ASCII): every call of an attribute in the text matches one or the other."""


def scan_calls(source: bytes) -> tuple[dict[str, list[int]], list[int]]:
    """One scan of the text for calls on attributes: the lines of each ``.NAME(`` by name, exactly as
    :data:`METHOD_CALL` finds them, and every line where an attribute may be called (the same lines, those of
    calls written otherwise too). A statement that spans none of the latter holds no call on an attribute,
    and no loop the checks read: its expressions are not walked."""
    calls: dict[bytes, list[int]] = {}
    lines: list[int] = []  # ascending, each once
    line, at, last = 1, 0, 0
    count, add, inner_scan = source.count, lines.append, METHOD_CALL.finditer
    for match in _SCAN.finditer(source):
        start = match.start()
        line += count(b"\n", at, start)
        at = start
        if line != last:
            add(line)
            last = line
        name = match.group(1)
        if name is not None:
            found = calls.get(name)
            if found is None:
                calls[name] = [line]
            else:
                found.append(line)
            continue
        # written otherwise: METHOD_CALL finds only what lies inside it (in a comment), and nothing past its end
        for inner in inner_scan(source, start + 1, match.end()):
            line += count(b"\n", at, inner.start())
            at = inner.start()
            if line != last:
                add(line)
                last = line
            calls.setdefault(inner.group(1), []).append(line)
    return {name.decode(): found for name, found in calls.items()}, lines


def spans_a_line(lines: list[int], lo: int, hi: int) -> bool:
    """Whether the sorted ``lines`` hold one in ``[lo, hi]`` (a statement's span against :func:`scan_calls`'s
    lines; the walk's hot loops inline the same test)."""
    at = bisect_left(lines, lo)
    return at < len(lines) and lines[at] <= hi


# ------------------------------------------------------------------------------------------------ the walk

_SELF, _TYPE, _SUPER = Receiver("self"), Receiver("type"), Receiver("super")
_VIA = {"self": _SELF, "type": _TYPE, "super": _SUPER}


class _Walk:
    """One function's walk: calls (in the per-call-site walk's order), loops, and the facts ``ast.walk`` of
    the whole function would give (calls up, ``**kwargs`` reads), each node visited once."""

    def __init__(self, node: Function, method: bool, lines: list[int] | None) -> None:
        self.method = method
        self.info = self._parameters(node, method)
        kwarg = self.info.params.kwarg
        self.kwarg = kwarg
        self.lines = lines if kwarg is None else None  # with **kwargs every node counts (its reads)
        self.ups: set[str] = set()
        self.reads: set[str] = set()
        self.uses: set[str] = set()
        self.found: list[tuple[ast.Call, Narrow, tuple[int, int]]] = []
        self.raw_loops: list[tuple[tuple[int, int], ast.expr, ast.expr]] = []
        self.attrs: list[tuple[str, Ann]] = []
        self.dict_bound = False  # an ``x = {...}`` or ``x = dict(...)`` somewhere: ``**x`` may pass known keys
        self._header(node)  # the parts of the def the per-call-site walk never read: whole-function facts only
        self._body(node.body, {}, True)
        self._finish(node)

    def _parameters(self, node: Function, method: bool) -> FunctionInfo:
        """The function's parameters and decorators, and the names the walk tells receivers by."""
        a = node.args
        posonly, plain, kwonly = a.posonlyargs, a.args, a.kwonlyargs
        every = [*posonly, *plain, *kwonly] if posonly or kwonly else plain
        names = [p.arg for p in every]
        cut, end = len(posonly), len(posonly) + len(plain)
        params = Params(
            tuple(names[:cut]), tuple(names[cut:end]), _defaults(a.defaults) if a.defaults else (),
            a.vararg.arg if a.vararg else None, tuple(names[end:]),
            _defaults(a.kw_defaults) if a.kw_defaults else (), a.kwarg.arg if a.kwarg else None,
        )  # fmt: skip
        decorators = tuple([decorator_name(d) for d in node.decorator_list]) if node.decorator_list else ()
        first = names[0] if end and method else None  # the first positional parameter: self or cls
        self.self_name = None if method and {"staticmethod", "classmethod"} & set(decorators) else first
        self.cls_name = first if method and "classmethod" in decorators else None
        self.up_self = names[0] if end else None  # calls up: ``Base.NAME(self, ...)``
        self.attr_self = names[0] if method and names else None  # ``self.attr: T`` in a method's statements
        self.named = set(names) if params.kwarg else set()
        self.params: dict[str, ast.expr] = {}  # the annotated parameters other than self and cls
        self.annotated: dict[str, ast.expr] = {}  # a method's annotated parameters after its first
        skip = (self.self_name, self.cls_name)
        for i, parameter in enumerate(every):
            if parameter.annotation is not None:
                if names[i] not in skip:
                    self.params[names[i]] = parameter.annotation
                if i and method:
                    self.annotated[names[i]] = parameter.annotation
        return FunctionInfo(node, node.name, decorators, params)

    # -- statements -----------------------------------------------------------------------------------
    def _body(self, body: list[ast.stmt], narrow: Narrow, own: bool) -> None:
        """A block, as the per-call-site walk read it; ``own``: not inside a nested def (attribute facts)."""
        attributes = own and self.attr_self is not None
        lines = self.lines
        count = len(lines) if lines is not None else 0
        shapes, assign, ann_assign = _SHAPES, _ASSIGN, _ANN_ASSIGN
        simple: list[tuple[Any, tuple[int, int] | None]] = []  # a run of simple statements, each its own gate
        for statement in body:
            kind = type(statement)
            if kind is assign or kind is ann_assign:
                self._assignment(statement, kind, attributes)
            shape = shapes.get(kind)
            if shape is None:  # a simple statement; on no line that calls an attribute, it holds nothing to read
                lo = statement.lineno
                hi = statement.end_lineno or lo
                if lines is None:
                    simple.append((statement, (lo, hi)))
                else:
                    at = bisect_left(lines, lo)
                    if at < count and lines[at] <= hi:
                        simple.append((statement, (lo, hi)))
                continue
            if simple:
                self._expressions(simple, narrow)
                simple = []
            self._compound(statement, shape, narrow, own)
        if simple:
            self._expressions(simple, narrow)

    def _compound(self, statement: Any, shape: tuple, narrow: Narrow, own: bool) -> None:
        """A compound statement: its headers under its own gate, then its blocks statement by statement."""
        headers, blocks, flags = shape
        if flags & _IS_CLASS:  # its calls are another object's: only the whole-function facts
            self.dict_bound = True  # its assignments count for ``_literal_dicts`` (which walks it all)
            self._expressions(self._gated([statement]))
            return
        gate = (statement.lineno, statement.end_lineno or statement.lineno)
        if flags & _IS_FOR:
            self.raw_loops.append((gate, statement.target, statement.iter))
        for name in headers:
            header = getattr(statement, name)
            if type(header) is list:  # ``with`` items
                self._expressions(self._gated(header, gate), narrow)
            elif header is not None and self._worth(header):
                self._expressions([(header, gate)], narrow)
        if flags & _IS_IF:
            test = statement.test
            self._body(statement.body, _narrowed(test, narrow) if type(test) in _TESTS else narrow, own)
            self._body(statement.orelse, narrow, own)
            return
        if flags & _IS_FUNCTION:
            own = False
            self._header(statement)
        for block in blocks:
            self._body(getattr(statement, block), narrow, own)
        for handler in statement.handlers if flags & _HAS_HANDLERS else ():
            if handler.type is not None:
                self._expressions(self._gated([handler.type]))
            self._body(handler.body, narrow, own)
        for case in statement.cases if flags & _HAS_CASES else ():
            self._expressions(self._gated([case.pattern, *([case.guard] if case.guard is not None else [])]))
            self._body(case.body, narrow, own)

    def _header(self, node: Function) -> None:
        """A def's parts outside its body, for the whole-function facts: skipped when no line from its first
        decorator to its first statement calls an attribute."""
        lines = self.lines
        if lines is not None:
            start = min([node.lineno, *[d.lineno for d in node.decorator_list]]) if node.decorator_list else node.lineno
            at = bisect_left(lines, start)
            if at >= len(lines) or lines[at] > node.body[0].lineno:
                return
        self._expressions(self._gated(_header_parts(node)))

    def _assignment(self, statement: Any, kind: type, attributes: bool) -> None:
        """``x = {...}`` (a dict ``**x`` may pass), and in a method's own statements ``self.attr: T = ...`` or
        ``self.attr = p`` where the method took ``p: T``: the attribute's class."""
        if kind is ast.AnnAssign:
            if attributes and (attr := _self_attr(statement.target, self.attr_self)):
                self.attrs.append((attr, compact(statement.annotation)))
            return
        value = statement.value
        if type(value) is ast.Dict or (type(value) is ast.Call and type(value.func) is ast.Name):
            self.dict_bound = True  # ``_literal_dicts`` may find the keys ``**x`` passes
        if not (attributes and self.annotated) or type(value) not in _ANNOTATED_VALUES:
            return
        annotation = _assigned_annotation(value, self.annotated)
        if annotation is not None:
            for target in statement.targets:
                if attr := _self_attr(target, self.attr_self):
                    self.attrs.append((attr, annotation))

    # -- expressions ----------------------------------------------------------------------------------
    def _expressions(self, roots: list[tuple[Any, tuple[int, int] | None]], narrow: Narrow | None = None) -> None:
        """Every node under each root in turn, depth first, the last child first. With ``narrow`` the calls
        on attributes and the comprehensions are collected too, each under its root's gate; without, only
        the whole-function facts."""
        children, kwarg, loops = _CHILDREN, self.kwarg, self.raw_loops
        Call, Attribute, Name, Constant = ast.Call, ast.Attribute, ast.Name, ast.Constant  # noqa: N806
        collect = narrow is not None
        stack: list[Any] = []
        pop, push, extend = stack.pop, stack.append, stack.extend
        for root, here in roots:
            push(root)
            while stack:
                node = pop()
                kind = type(node)
                # the commonest nodes first, each pushing its children as the generic loop below would
                if kind is Name or kind is Constant:
                    if kwarg is not None and kind is Name:
                        self._kwargs(node, kind)
                    continue
                if kind is Attribute:
                    push(node.value)
                    continue
                if kind is Call:
                    if type(node.func) is Attribute:
                        self._called(node, narrow, here)
                    push(node.func)
                    extend(node.args)
                    extend(node.keywords)
                    continue
                fields = children.get(kind)
                if fields is None:
                    continue  # a string in a list of names, a None key of a dict
                if kind is ast.comprehension:
                    if collect:
                        loops.append((here, node.target, node.iter))  # type: ignore[arg-type]
                elif kwarg is not None:
                    self._kwargs(node, kind)
                for name in fields:
                    child = getattr(node, name)
                    if type(child) is list:
                        extend(child)
                    elif child is not None:
                        push(child)

    def _worth(self, root: ast.expr) -> bool:
        """Whether an expression spans a line that may call an attribute (always, with ``**kwargs``)."""
        lines = self.lines
        if lines is None:
            return True
        at = bisect_left(lines, root.lineno)
        return at < len(lines) and lines[at] <= (root.end_lineno or root.lineno)

    def _gated(self, roots: list[Any], gate: tuple[int, int] | None = None) -> list[tuple[Any, tuple[int, int] | None]]:
        """The roots worth a walk, each with ``gate`` (what its calls get: the statement's that holds them): a
        root on no line that calls an attribute is left out."""
        lines = self.lines
        out = []
        for root in roots:
            lo = getattr(root, "lineno", None)
            if lo is not None and lines is not None:  # ``withitem`` has no position of its own: walked
                at = bisect_left(lines, lo)
                if at >= len(lines) or lines[at] > (root.end_lineno or lo):
                    continue
            out.append((root, gate))
        return out

    def _called(self, node: ast.Call, narrow: Narrow | None, here: tuple[int, int] | None) -> None:
        """A call on an attribute: a call up (``super().NAME(...)``, ``Base.NAME(self, ...)``), a key read from
        ``**kwargs`` (``kwargs.get("k")``), and (``narrow`` given) a call site."""
        func: ast.Attribute = node.func  # type: ignore[assignment]
        value, args = func.value, node.args
        owner = type(value)
        if owner is ast.Call:
            if type(value.func) is ast.Name and value.func.id == "super":  # type: ignore[attr-defined]
                self.ups.add(func.attr)
        elif args and (owner is ast.Name or owner is ast.Attribute):
            first = args[0]
            if type(first) is ast.Name and first.id == self.up_self and self.up_self is not None:
                self.ups.add(func.attr)
        kwarg = self.kwarg
        if kwarg is not None and owner is ast.Name and value.id == kwarg and func.attr in _KWARGS_READERS and args:  # type: ignore[attr-defined]
            self._read(args[0])
        if narrow is not None:
            self.found.append((node, narrow, here))  # type: ignore[arg-type]

    def _kwargs(self, node: Any, kind: type) -> None:
        """A node of a function with ``**kwargs``: a key read from them, or a parameter read."""
        kwarg = self.kwarg
        if kind is ast.Name:
            if node.id in self.named and type(node.ctx) is ast.Load:
                self.uses.add(node.id)
        elif kind is ast.Subscript:
            if type(node.value) is ast.Name and node.value.id == kwarg:
                self._read(node.slice)
        elif kind is ast.Compare and len(node.ops) == 1 and type(node.ops[0]) in (ast.In, ast.NotIn):
            right = node.comparators[0]
            if type(right) is ast.Name and right.id == kwarg:
                self._read(node.left)

    def _read(self, key: Any) -> None:
        if type(key) is ast.Constant and isinstance(key.value, str):
            self.reads.add(key.value)

    # -- the facts ------------------------------------------------------------------------------------
    def _finish(self, node: Function) -> None:
        info = self.info
        if self.ups:
            info.ups = frozenset(self.ups)
        if self.kwarg is not None:
            info.reads, info.uses = frozenset(self.reads) or _NO_NAMES, frozenset(self.uses) or _NO_NAMES
        info.attrs = tuple(self.attrs)
        if not self.found:
            return
        self._params: dict[tuple[str, bool], Receiver] = {}
        info.loops = self._loops()
        aliases = {name for _, name, _ in info.loops}
        kept = [
            (call, receiver, gate)
            for call, narrow, gate in self.found
            if (receiver := self._told(call, narrow, aliases))
        ]
        dicts = {}  # ``**extra`` of a name bound to a dict literal: its keys (only where the walk saw such a binding)
        if self.dict_bound and any(k.arg is None and type(k.value) is ast.Name for c, _, _ in kept for k in c.keywords):
            dicts = _literal_dicts(node)
        info.calls = tuple(_fact(call, receiver, gate, dicts) for call, receiver, gate in kept)
        if info.calls and not self.method and self.params:
            info.annotated = frozenset().union(*(annotation_names(compact(a)) for a in self.params.values()))

    def _loops(self) -> tuple[tuple[tuple[int, int], str, Receiver], ...]:
        """The loops over an attribute or a parameter (``for b in self.backends``), each with its variable."""
        loops = []
        for gate, target, iterated in self.raw_loops:
            if isinstance(target, ast.Tuple) and len(target.elts) == 2:  # for i, b in enumerate(self.backends)
                target = target.elts[1]
            if not isinstance(target, ast.Name):
                continue
            source = self._receiver(_iterated(iterated), None)
            if isinstance(source, Receiver) and source.kind in ("attr", "param") and not source.item:
                loops.append((gate, target.id, Receiver(source.kind, source.attr, source.annotation, item=True)))
        return tuple(loops)

    def _told(self, call: ast.Call, narrow: Narrow, aliases: set[str]) -> Receiver | MaybeAlias | None:
        """How a call's receiver reaches a class: the cases of :func:`_via`, the ``isinstance()`` narrowing and
        :meth:`_receiver`, in their order, the common ones first."""
        value = call.func.value  # type: ignore[attr-defined]
        kind = type(value)
        if kind is ast.Name:
            name = value.id
            if self.method and name == self.self_name:
                return _SELF
            if self.method and name == self.cls_name:
                return _TYPE
            if name in narrow:
                return Receiver("param", annotation=narrow[name])
            return self._receiver(value, aliases) if name in self.params or name in aliases else None
        if kind is ast.Attribute:
            inner = value.value
            if type(inner) is not ast.Name:
                return None
            attr = value.attr
            if self.method and attr == "__class__" and inner.id == self.self_name:
                return _TYPE
            if narrow and (key := f"{inner.id}.{attr}") in narrow:
                return Receiver("param", annotation=narrow[key])
            return Receiver("attr", attr) if inner.id == self.self_name and self.self_name is not None else None
        if kind is ast.Subscript:
            return self._receiver(value, aliases)
        if kind is ast.Call and self.method:
            via = _via(value, self.self_name, self.cls_name)
            return _VIA[via] if via else None
        return None

    def _receiver(self, value: ast.expr, aliases: set[str] | None) -> Receiver | MaybeAlias | None:
        """``self.attr``, ``self.attr[i]``, an annotated parameter (or an element of one), or a name a loop
        may alias (``aliases``; None: no alias considered)."""
        item = False
        if type(value) is ast.Subscript:
            value, item = value.value, True
        kind = type(value)
        if kind is ast.Attribute and type(value.value) is ast.Name and value.value.id == self.self_name:  # type: ignore[attr-defined]
            return Receiver("attr", value.attr, item=item)  # type: ignore[attr-defined]
        if kind is ast.Name:
            name = value.id  # type: ignore[attr-defined]
            annotation = self.params.get(name)
            param = None
            if annotation is not None:
                param = self._params.get((name, item))
                if param is None:
                    param = Receiver("param", annotation=compact(annotation), item=item)
                    self._params[(name, item)] = param
            if not item and aliases is not None and name in aliases:
                return MaybeAlias(name, param)
            return param
        return None


_CLASS, _ASSIGN, _ANN_ASSIGN = ast.ClassDef, ast.Assign, ast.AnnAssign
_ANNOTATED_VALUES = (ast.Name, ast.List, ast.Tuple)  # what ``self.attr = value`` takes an annotation from
_TESTS = (ast.Call, ast.BoolOp)  # an ``if`` test that may hold an ``isinstance()``
_FUNCTION_TYPES = frozenset(_FUNCTIONS)
_IS_CLASS, _IS_FOR, _IS_IF, _IS_FUNCTION, _HAS_HANDLERS, _HAS_CASES = 1, 2, 4, 8, 16, 32


def _shape(kind: type[ast.AST]) -> tuple[tuple[str, ...], tuple[str, ...], int]:
    """A compound statement's headers (walked under its gate), blocks (walked statement by statement) and kind."""
    flags = (
        (_IS_CLASS if kind is ast.ClassDef else 0) | (_IS_FOR if kind in (ast.For, ast.AsyncFor) else 0)
        | (_IS_IF if kind is ast.If else 0) | (_IS_FUNCTION if kind in _FUNCTION_TYPES else 0)
        | (_HAS_HANDLERS if "handlers" in kind._fields else 0) | (_HAS_CASES if "cases" in kind._fields else 0)
    )  # fmt: skip
    headers = tuple(h for h in _HEADERS if h in kind._fields)
    return headers, tuple(b for b in _BLOCKS if b in kind._fields), flags


_SHAPES = {kind: _shape(kind) for kind in (*_COMPOUND, ast.ClassDef)}
_NESTING.update({k: _SHAPES[k][1] for k in _COMPOUND if k not in _FUNCTION_TYPES})


def _defaults(defaults: Sequence[ast.expr | None]) -> tuple[Any, ...]:
    """Parameter defaults as kept: a literal's value in a 1-tuple (most are), any other expression's tree."""
    return tuple([(d.value,) if isinstance(d, ast.Constant) else d for d in defaults])


def _header_parts(node: Function) -> list[Any]:
    """A def's decorators, parameters (each with its annotation), defaults and return annotation: the parts
    of a def outside its body, each with a position (``arguments`` has none), so each can be gated."""
    a = node.args
    parts: list[Any] = [*node.decorator_list, *a.posonlyargs, *a.args, *a.kwonlyargs, *a.defaults]
    parts += [d for d in a.kw_defaults if d is not None]
    parts += [p for p in (a.vararg, a.kwarg, node.returns) if p is not None]
    return parts


def _fact(call: ast.Call, receiver: Receiver | MaybeAlias, gate: tuple[int, int], dicts: dict) -> CallFact:
    keywords, starstar = _keywords(call, dicts) if call.keywords else ((), False)
    starred = 0
    names: list[str | None] = []
    for arg in call.args:
        kind = type(arg)
        starred += kind is ast.Starred
        names.append(arg.id if kind is ast.Name else None)  # type: ignore[attr-defined]
    return CallFact(
        gate,
        call.lineno,
        call.func.attr,  # type: ignore[attr-defined]
        receiver,
        len(names) - starred,
        keywords,
        starred > 0,
        starstar,
        tuple(names),
        (call.lineno, call.col_offset, call.end_lineno or call.lineno, call.end_col_offset or 0),
    )


# ------------------------------------------------------------------------------------------ call helpers


def _via(value: ast.expr, self_name: str | None, cls_name: str | None) -> str | None:
    """How a call's receiver reaches the calling object: ``self``, its type, or ``super()``."""
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


def _iterated(expr: ast.expr) -> ast.expr:
    """``self.x`` for ``self.x``, ``self.x.values()`` and ``enumerate(self.x)``."""
    if isinstance(expr, ast.Call) and not expr.keywords:
        if isinstance(expr.func, ast.Attribute) and expr.func.attr == "values" and not expr.args:
            return expr.func.value
        if isinstance(expr.func, ast.Name) and expr.func.id == "enumerate" and len(expr.args) == 1:
            return expr.args[0]
    return expr


def _receiver_key(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return ""


def _narrowed(test: ast.expr, narrow: Narrow) -> Narrow:
    """``if isinstance(x, T):`` gives ``x`` the class ``T`` inside the block (a tuple of classes: their union)."""
    tests = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    out = narrow
    for part in tests:
        if not (isinstance(part, ast.Call) and isinstance(part.func, ast.Name) and part.func.id == "isinstance"):
            continue
        if len(part.args) != 2 or not (key := _receiver_key(part.args[0])):
            continue
        kind = part.args[1]
        out = {**out, key: ("S", ("N", "Union"), compact(kind)) if isinstance(kind, ast.Tuple) else compact(kind)}
    return out


def _dict_keys(node: ast.expr) -> tuple[str, ...] | None:
    """The keys of ``{"k": v, ...}`` or ``dict(k=v, ...)`` when every key is a plain string; else None."""
    if isinstance(node, ast.Dict):
        keys = node.keys
        if all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in keys):
            return tuple(k.value for k in keys)  # type: ignore[union-attr]
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args:
        names = [k.arg for k in node.keywords]
        return tuple(n for n in names if n is not None) if None not in names else None
    return None


def _literal_dicts(function: Function) -> dict[str, tuple[str, ...]]:
    """Local names bound once to a dict literal and never changed afterwards (no item assigned, no method
    called on them, not rebound): their keys, which ``**name`` passes as keywords. Read only for a function
    that passes ``**name`` to a call on a receiver whose class may be told (a second look at that one)."""
    bound: dict[str, tuple[str, ...] | None] = {}
    changed: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    keys = _dict_keys(node.value) if len(node.targets) == 1 else None
                    bound[target.id] = keys if target.id not in bound else None
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.withitem, ast.NamedExpr)):
            rebound: ast.AST | None = getattr(node, "target", None) or getattr(node, "optional_vars", None)
            changed.update(n.id for n in (ast.walk(rebound) if rebound is not None else ()) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.value, ast.Name):
            mutated = isinstance(node, ast.Attribute) or isinstance(node.ctx, (ast.Store, ast.Del))
            changed.update([node.value.id] if mutated else [])  # extra["k"] = v, extra.update(...), extra.pop(...)
    return {name: keys for name, keys in bound.items() if keys is not None and name not in changed}


def _keywords(node: ast.Call, dicts: dict[str, tuple[str, ...]]) -> tuple[tuple[str, ...], bool]:
    """A call's keywords, those a ``**`` of a dict literal (or of a name bound to one) passes included, and
    whether any ``**`` is left whose keys are unknown."""
    keywords: list[str] = []
    unknown = False
    for keyword in node.keywords:
        if keyword.arg is not None:
            keywords.append(keyword.arg)
            continue
        value = keyword.value
        keys = dicts.get(value.id) if isinstance(value, ast.Name) else _dict_keys(value)
        if keys is None:
            unknown = True
        else:
            keywords += keys
    return tuple(dict.fromkeys(keywords)), unknown


def _assigned_annotation(value: ast.expr, annotated: dict[str, ast.expr]) -> Ann | None:
    """The annotation an assigned value carries: an annotated parameter's (``self.b = backend``), or, for a
    list or tuple of annotated parameters (``self.backends = [full_backend, linear_backend]``), a list of
    their union."""
    if isinstance(value, ast.Name):
        found = annotated.get(value.id)
        return compact(found) if found is not None else None
    if isinstance(value, (ast.List, ast.Tuple)) and value.elts:
        each = [annotated.get(e.id) if isinstance(e, ast.Name) else None for e in value.elts]
        parts = [compact(part) for part in each if part is not None]
        if len(parts) < len(each):
            return None
        return ("S", ("N", "List"), ("S", ("N", "Union"), ("T", tuple(parts))))
    return None


def _self_attr(target: ast.expr, self_name: str | None) -> str:
    """``NAME`` when an assignment target is ``self.NAME``, else empty."""
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == self_name:
        return target.attr
    return ""


def annotation_names(annotation: Ann) -> set[str]:
    """Every identifier an annotation mentions (string annotations included): a cheap test of interest."""
    names: set[str] = set()
    stack = [annotation]
    while stack:
        tag, *rest = stack.pop()
        if tag == "N":
            names.add(rest[0])
        elif tag == "A":
            names.add(rest[1])
            stack.append(rest[0])
        elif tag == "C":
            names.update(_words(rest[0]))
        elif tag == "*":
            names.update(rest[0])
        elif tag in ("S", "|"):
            stack += rest
        else:  # "T", "?": their children
            stack += rest[0]
    return names


def _words(text: str) -> list[str]:
    word, out = [], []
    for ch in text + " ":
        if ch.isalnum() or ch == "_":
            word.append(ch)
        elif word:
            out.append("".join(word))
            word = []
    return out


def call_text(node: ast.Call) -> str:
    """The call as written, long arguments shortened to ``...``: which go positionally, which by keyword."""
    args = [f"*{_short(a.value)}" if isinstance(a, ast.Starred) else _short(a) for a in node.args]
    args += [f"{k.arg}={_short(k.value)}" if k.arg else f"**{_short(k.value)}" for k in node.keywords]
    func = unparse(node.func)
    if len(func) > 60:
        func = "..." + func[-57:]
    return f"{func}({', '.join(args)})"


_MAX_ARG_TEXT = 24


def _short(node: ast.expr) -> str:
    text = unparse(node)
    return text if len(text) <= _MAX_ARG_TEXT else "..."
