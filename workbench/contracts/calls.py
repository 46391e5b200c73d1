"""The calls code in the trees makes on objects whose class it can tell, read from source.

``self.NAME(...)``, ``type(self).NAME(...)``, ``super().NAME(...)`` inside a class; and calls through an
annotated attribute or parameter: ``self.linear_attn_backend.forward_decode(...)`` where ``__init__`` took
``linear_attn_backend: MambaAttnBackendBase``, ``self.attn_backends[i].init_cuda_graph_state(...)`` or a
``for`` loop over them where the attribute is a ``List[AttentionBackend]``, ``backend.replay(...)`` where
the function took ``backend: GraphBackend``. Where most hook calls of a hybrid engine are.
"""

from __future__ import annotations

import ast
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass

from workbench.contracts.signatures import CallSite
from workbench.contracts.source import (
    Function,
    Names,
    Ref,
    SourceIndex,
    SourceModule,
    _statements,
    decorator_name,
    unparse,
)

_MAX_ARG_TEXT = 24
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_SEQUENCES = {"List", "list", "Sequence", "Iterable", "Tuple", "tuple", "Set", "set", "FrozenSet", "frozenset",
              "Deque", "deque", "MutableSequence", "Collection", "Iterator"}  # fmt: skip
_MAPPINGS = {"Dict", "dict", "Mapping", "MutableMapping", "OrderedDict", "DefaultDict", "defaultdict"}
_UNIONS = {"Optional", "Union"}


@dataclass(frozen=True)
class Receiver:
    """How to find the class a call's receiver has.

    ``kind``: ``"self"``, ``"super"``, ``"type"`` (the calling class), ``"attr"`` (the calling class's
    attribute ``attr``) or ``"param"`` (``annotation``); ``item``: the receiver is an element of that
    attribute or parameter (``self.backends[i]``, ``for b in self.backends``).
    """

    kind: str
    attr: str = ""
    annotation: ast.expr | None = None
    item: bool = False


def _walk_body(node: ast.AST, include_self: bool = False) -> Iterator[ast.AST]:
    """Every node under ``node``, nested classes left out (their ``self`` is another object)."""
    stack = [node] if include_self else list(ast.iter_child_nodes(node))
    while stack:
        child = stack.pop()
        if isinstance(child, ast.ClassDef):
            continue
        yield child
        stack.extend(ast.iter_child_nodes(child))


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


def _short(node: ast.expr) -> str:
    text = unparse(node)
    return text if len(text) <= _MAX_ARG_TEXT else "..."


def _call_text(node: ast.Call) -> str:
    """The call as written, long arguments shortened to ``...``: which go positionally, which by keyword."""
    args = [f"*{_short(a.value)}" if isinstance(a, ast.Starred) else _short(a) for a in node.args]
    args += [f"{k.arg}={_short(k.value)}" if k.arg else f"**{_short(k.value)}" for k in node.keywords]
    func = unparse(node.func)
    if len(func) > 60:
        func = "..." + func[-57:]
    return f"{func}({', '.join(args)})"


def _iterated(expr: ast.expr) -> ast.expr:
    """``self.x`` for ``self.x``, ``self.x.values()`` and ``enumerate(self.x)``."""
    if isinstance(expr, ast.Call) and not expr.keywords:
        if isinstance(expr.func, ast.Attribute) and expr.func.attr == "values" and not expr.args:
            return expr.func.value
        if isinstance(expr.func, ast.Name) and expr.func.id == "enumerate" and len(expr.args) == 1:
            return expr.args[0]
    return expr


def _within(lines: list[int], node: ast.AST) -> bool:
    """Whether a sorted list of line numbers has one inside the node's span."""
    at = bisect_left(lines, node.lineno)  # type: ignore[attr-defined]
    return at < len(lines) and lines[at] <= (node.end_lineno or node.lineno)  # type: ignore[attr-defined]


_HEADERS = ("test", "iter", "items", "subject", "target")
_BLOCKS = ("body", "orelse", "finalbody")


Narrowed = dict[str, ast.expr]  # receiver ("name" or "self.attr") -> the class an isinstance() test gave it
Found = list[tuple[ast.Call, Narrowed]]


def _receiver_key(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return ""


def _narrowed(test: ast.expr, narrow: Narrowed) -> Narrowed:
    """``if isinstance(x, T):`` gives ``x`` the class ``T`` inside the block (a tuple of classes: their union)."""
    tests = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    out = narrow
    for part in tests:
        if not (isinstance(part, ast.Call) and isinstance(part.func, ast.Name) and part.func.id == "isinstance"):
            continue
        if len(part.args) != 2 or not (key := _receiver_key(part.args[0])):
            continue
        kind = part.args[1]
        if isinstance(kind, ast.Tuple):
            kind = ast.Subscript(value=ast.Name("Union", ast.Load()), slice=kind, ctx=ast.Load())
        out = {**out, key: kind}
    return out


def _candidates(body: list[ast.stmt], lines: list[int], calls: Found, loops: list, narrow: Narrowed) -> None:
    """The calls and loops of the statements that span a candidate line; nested classes left out."""
    for statement in body:
        if isinstance(statement, ast.ClassDef) or not _within(lines, statement):
            continue
        blocks = [b for b in (getattr(statement, name, None) for name in _BLOCKS) if isinstance(b, list)]
        blocks += [h.body for h in getattr(statement, "handlers", ())]
        blocks += [c.body for c in getattr(statement, "cases", ())]
        if not blocks:
            _collect(statement, calls, loops, narrow)
            continue
        if isinstance(statement, (ast.For, ast.AsyncFor)):
            loops.append((statement.target, statement.iter))
        for name in _HEADERS:
            header = getattr(statement, name, None)
            for part in header if isinstance(header, list) else [header] if header is not None else []:
                _collect(part, calls, loops, narrow)
        if isinstance(statement, ast.If):
            _candidates(statement.body, lines, calls, loops, _narrowed(statement.test, narrow))
            _candidates(statement.orelse, lines, calls, loops, narrow)
            continue
        for block in blocks:
            _candidates(block, lines, calls, loops, narrow)


def _collect(node: ast.AST, calls: Found, loops: list, narrow: Narrowed) -> None:
    for child in _walk_body(node, include_self=True):
        if isinstance(child, ast.Call):
            if isinstance(child.func, ast.Attribute):
                calls.append((child, narrow))
        elif isinstance(child, ast.comprehension):
            loops.append((child.target, child.iter))


def function_calls(
    function: Function, path: str, cls: str, wanted: set[str] | frozenset[str], in_class: bool, lines: list[int]
) -> list[tuple[CallSite, Receiver]]:
    """The calls of one function (a method when ``in_class``) on receivers whose class can be told.

    ``wanted``: the method names worth reading (those some class in the trees overrides); ``lines``: the
    sorted lines of the file where one of them is called (``.NAME(``): only statements there are read.
    """
    if not _within(lines, function):
        return []
    decorators = {decorator_name(d) for d in function.decorator_list} if in_class else set()
    positional = [*function.args.posonlyargs, *function.args.args]
    first = positional[0].arg if positional and in_class else None
    self_name = None if decorators & {"staticmethod", "classmethod"} else first
    cls_name = first if "classmethod" in decorators else None
    every = [*positional, *function.args.kwonlyargs]
    params = {a.arg: a.annotation for a in every if a.annotation is not None and a.arg not in (self_name, cls_name)}
    found: Found = []
    loops: list[tuple[ast.expr, ast.expr]] = []
    _candidates(function.body, lines, found, loops, {})
    calls = [(c, n) for c, n in found if isinstance(c.func, ast.Attribute) and c.func.attr in wanted]
    if not calls:
        return []
    aliases: dict[str, Receiver] = {}
    for target, iterated in loops:
        if isinstance(target, ast.Tuple) and len(target.elts) == 2:  # for i, b in enumerate(self.backends)
            target = target.elts[1]
        if not isinstance(target, ast.Name):
            continue
        source = _receiver(_iterated(iterated), self_name, params, {})
        if source is not None and source.kind in ("attr", "param") and not source.item:
            aliases[target.id] = Receiver(source.kind, source.attr, source.annotation, item=True)
    caller = f"{cls}.{function.name}" if cls else function.name
    dicts = _literal_dicts(function) if any(k.arg is None for c, _ in calls for k in c.keywords) else {}
    out = []
    for node, narrow in calls:
        assert isinstance(node.func, ast.Attribute)
        value = node.func.value
        via = _via(value, self_name, cls_name) if in_class else None
        if not via and (key := _receiver_key(value)) in narrow:  # isinstance() told the class
            receiver: Receiver | None = Receiver("param", annotation=narrow[key])
        else:
            receiver = Receiver(via) if via else _receiver(value, self_name, params, aliases)
        if receiver is None:
            continue
        text = _call_text(node)
        keywords, starstar = _keywords(node, dicts)
        site = CallSite(
            file=path,
            line=node.lineno,
            cls=cls,
            caller=caller,
            name=node.func.attr,
            via=receiver.kind,
            positional=sum(not isinstance(a, ast.Starred) for a in node.args),
            keywords=keywords,
            star=any(isinstance(a, ast.Starred) for a in node.args),
            starstar=starstar,
            text=text,
            arg_names=tuple(a.id if isinstance(a, ast.Name) else None for a in node.args),
        )
        out.append((site, receiver))
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
    called on them, not rebound): their keys, which ``**name`` passes as keywords."""
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


def _receiver(
    value: ast.expr, self_name: str | None, params: dict[str, ast.expr], aliases: dict[str, Receiver]
) -> Receiver | None:
    item = False
    if isinstance(value, ast.Subscript):
        value, item = value.value, True
    if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == self_name:
        return Receiver("attr", value.attr, item=item)
    if isinstance(value, ast.Name):
        if not item and value.id in aliases:
            return aliases[value.id]
        if value.id in params:
            return Receiver("param", annotation=params[value.id], item=item)
    return None


def attribute_types(node: ast.ClassDef) -> dict[str, ast.expr]:
    """The annotations of a class's attributes: ``attr: T`` in the body, ``self.attr: T = ...`` in a method,
    ``self.attr = p`` where the method took ``p: T``."""
    cached: dict[str, ast.expr] | None = getattr(node, "_wb_attrs", None)
    if cached is not None:
        return cached
    found: dict[str, ast.expr] = {}
    for statement in node.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            found[statement.target.id] = statement.annotation
        elif isinstance(statement, _FUNCTIONS):
            args = [*statement.args.posonlyargs, *statement.args.args, *statement.args.kwonlyargs]
            if not args:
                continue
            self_name = args[0].arg
            annotated = {a.arg: a.annotation for a in args[1:] if a.annotation is not None}
            for inner in _statements(statement.body):
                if isinstance(inner, ast.AnnAssign) and (attr := _self_attr(inner.target, self_name)):
                    found.setdefault(attr, inner.annotation)
                elif isinstance(inner, ast.Assign) and annotated:
                    annotation = _assigned_annotation(inner.value, annotated)
                    for target in inner.targets:
                        if annotation is not None and (attr := _self_attr(target, self_name)):
                            found.setdefault(attr, annotation)
    node._wb_attrs = found  # type: ignore[attr-defined]
    return found


def _assigned_annotation(value: ast.expr, annotated: dict[str, ast.expr]) -> ast.expr | None:
    """The annotation an assigned value carries: an annotated parameter's (``self.b = backend``), or, for a
    list or tuple of annotated parameters (``self.backends = [full_backend, linear_backend]``), a list of
    their union."""
    if isinstance(value, ast.Name):
        return annotated.get(value.id)
    if isinstance(value, (ast.List, ast.Tuple)) and value.elts:
        found = [annotated.get(e.id) if isinstance(e, ast.Name) else None for e in value.elts]
        parts = [part for part in found if part is not None]
        if len(parts) < len(found):
            return None
        union = ast.Subscript(value=ast.Name("Union", ast.Load()), slice=ast.Tuple(parts, ast.Load()), ctx=ast.Load())
        return ast.Subscript(value=ast.Name("List", ast.Load()), slice=union, ctx=ast.Load())
    return None


def _self_attr(target: ast.expr, self_name: str) -> str:
    """``NAME`` when an assignment target is ``self.NAME``, else empty."""
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == self_name:
        return target.attr
    return ""


def annotation_classes(
    index: SourceIndex, module: SourceModule, annotation: ast.expr, scope: Names | None = None, depth: int = 0
) -> tuple[list[Ref], bool]:
    """The parsed classes an annotation names, and whether it is a container of them (``List[T]``,
    ``Dict[K, T]``); ``Optional``, ``Union`` and ``T | None`` unwrap."""
    if depth > 6:
        return [], False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            parsed = ast.parse(annotation.value, mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):  # a string nested too deeply to parse too
            return [], False
        return annotation_classes(index, module, parsed, scope, depth + 1)
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        left = annotation_classes(index, module, annotation.left, scope, depth + 1)
        right = annotation_classes(index, module, annotation.right, scope, depth + 1)
        return left[0] + right[0], left[1] or right[1]
    if isinstance(annotation, ast.Subscript):
        outer = annotation.value
        name = outer.attr if isinstance(outer, ast.Attribute) else outer.id if isinstance(outer, ast.Name) else ""
        elements = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        if name in _UNIONS:
            refs: list[Ref] = []
            container = False
            for element in elements:
                found, inner = annotation_classes(index, module, element, scope, depth + 1)
                refs += found
                container = container or inner
            return refs, container
        if name in _SEQUENCES and elements:
            return annotation_classes(index, module, elements[0], scope, depth + 1)[0], True
        if name in _MAPPINGS and len(elements) == 2:
            return annotation_classes(index, module, elements[1], scope, depth + 1)[0], True
        return [], False
    if isinstance(annotation, (ast.Name, ast.Attribute)):
        ref = index.resolve(module, annotation, scope)
        return ([ref] if ref is not None and ref.node is not None else []), False
    return [], False


def annotation_names(annotation: ast.expr) -> set[str]:
    """Every identifier an annotation mentions (string annotations included): a cheap test of interest."""
    names: set[str] = set()
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.update(part for part in _words(node.value))
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
