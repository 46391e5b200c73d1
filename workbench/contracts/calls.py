"""The calls code in the trees makes on objects whose class it can tell, read from source.

``self.NAME(...)``, ``type(self).NAME(...)``, ``super().NAME(...)`` inside a class; and calls through an
annotated attribute or parameter: ``self.linear_attn_backend.forward_decode(...)`` where ``__init__`` took
``linear_attn_backend: MambaAttnBackendBase``, ``self.attn_backends[i].init_cuda_graph_state(...)`` or a
``for`` loop over them where the attribute is a ``List[AttentionBackend]``, ``backend.replay(...)`` where
the function took ``backend: GraphBackend``. Where most hook calls of a hybrid engine are.
"""

from __future__ import annotations

import ast

from workbench.contracts.facts import (
    Ann,
    ClassInfo,
    FunctionInfo,
    MaybeAlias,
    Receiver,
    annotation_names,
    call_text,
    compact,
    spans_a_line,
)
from workbench.contracts.signatures import CallSite
from workbench.contracts.source import Names, Ref, SourceIndex, SourceModule

_SEQUENCES = {"List", "list", "Sequence", "Iterable", "Tuple", "tuple", "Set", "set", "FrozenSet", "frozenset",
              "Deque", "deque", "MutableSequence", "Collection", "Iterator"}  # fmt: skip
_MAPPINGS = {"Dict", "dict", "Mapping", "MutableMapping", "OrderedDict", "DefaultDict", "defaultdict"}
_UNIONS = {"Optional", "Union"}
__all__ = [
    "Ann",
    "Receiver",
    "annotation_classes",
    "annotation_names",
    "attribute_types",
    "function_calls",
    "site_text",
]


def function_calls(
    function: FunctionInfo, path: str, cls: str, wanted: set[str] | frozenset[str], lines: list[int]
) -> list[tuple[CallSite, Receiver]]:
    """The calls of one function (a method when ``cls``) on receivers whose class can be told.

    ``wanted``: the method names worth reading (those some class in the trees overrides); ``lines``: the
    sorted lines of the file where one of them is called (``.NAME(``): only the calls of statements that span
    one of them are read, and only the loops there alias a receiver. A site's ``text`` is left empty (its
    ``span`` says where it is): :func:`site_text` reads it back for the few calls a finding shows.
    """
    calls = [c for c in function.calls if c.name in wanted and spans_a_line(lines, *c.gate)]
    if not calls:
        return []
    aliases = {name: receiver for gate, name, receiver in function.loops if spans_a_line(lines, *gate)}
    caller = f"{cls}.{function.name}" if cls else function.name
    out = []
    for call in calls:
        receiver = call.receiver
        if isinstance(receiver, MaybeAlias):
            found = aliases.get(receiver.name, receiver.otherwise)
            if found is None:
                continue
            receiver = found
        site = CallSite(
            file=path,
            line=call.line,
            cls=cls,
            caller=caller,
            name=call.name,
            via=receiver.kind,
            positional=call.positional,
            keywords=call.keywords,
            star=call.star,
            starstar=call.starstar,
            text="",
            arg_names=call.arg_names,
            span=call.span,
        )
        out.append((site, receiver))
    return out


def site_text(module: SourceModule, site: CallSite) -> str:
    """A call site as written (long arguments shortened to ``...``), read back from the source: the call's
    own text parsed again, or, where that text does not parse to the same call (a call inside an f-string on
    an old Python), the whole file."""
    if site.text or site.span is None:
        return site.text
    text = module.segment(site.span)
    try:
        node = ast.parse(f"(\n{text}\n)", mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        node = None
    if not _same_call(node, site):
        node = next((n for n in _calls_at(module, site.span)), None)
    return call_text(node) if isinstance(node, ast.Call) else ""


def _same_call(node: ast.AST | None, site: CallSite) -> bool:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == site.name):
        return False
    names = tuple(a.id if isinstance(a, ast.Name) else None for a in node.args)
    return names == site.arg_names and any(isinstance(a, ast.Starred) for a in node.args) == site.star


def _calls_at(module: SourceModule, span: tuple[int, int, int, int]) -> list[ast.Call]:
    try:
        tree = ast.parse(module.source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and (n.lineno, n.col_offset, n.end_lineno, n.end_col_offset) == span
    ]


def attribute_types(node: ClassInfo) -> dict[str, Ann]:
    """The annotations of a class's attributes: ``attr: T`` in the body, ``self.attr: T = ...`` in a method,
    ``self.attr = p`` where the method took ``p: T`` (read with the class)."""
    return node.attributes


def annotation_classes(
    index: SourceIndex, module: SourceModule, annotation: Ann, scope: Names | None = None, depth: int = 0
) -> tuple[list[Ref], bool]:
    """The parsed classes an annotation names, and whether it is a container of them (``List[T]``,
    ``Dict[K, T]``); ``Optional``, ``Union`` and ``T | None`` unwrap."""
    if depth > 6:
        return [], False
    tag = annotation[0]
    if tag == "C":
        try:
            parsed = ast.parse(annotation[1], mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):  # a string nested too deeply to parse too
            return [], False
        return annotation_classes(index, module, compact(parsed), scope, depth + 1)
    if tag == "|":
        left = annotation_classes(index, module, annotation[1], scope, depth + 1)
        right = annotation_classes(index, module, annotation[2], scope, depth + 1)
        return left[0] + right[0], left[1] or right[1]
    if tag == "S":
        outer, inner = annotation[1], annotation[2]
        name = outer[2] if outer[0] == "A" else outer[1] if outer[0] == "N" else ""
        elements = list(inner[1]) if inner[0] == "T" else [inner]
        if name in _UNIONS:
            refs: list[Ref] = []
            container = False
            for element in elements:
                found, within = annotation_classes(index, module, element, scope, depth + 1)
                refs += found
                container = container or within
            return refs, container
        if name in _SEQUENCES and elements:
            return annotation_classes(index, module, elements[0], scope, depth + 1)[0], True
        if name in _MAPPINGS and len(elements) == 2:
            return annotation_classes(index, module, elements[1], scope, depth + 1)[0], True
        return [], False
    if tag in ("N", "A"):
        ref = index.resolve(module, annotation, scope)
        return ([ref] if ref is not None and ref.node is not None else []), False
    return [], False
