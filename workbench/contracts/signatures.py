"""Comparing an override with the calls it must take.

Two sources of calls: a public method's signature in the base (callers outside the base call it the base's
way: required parameters positionally, optional ones by keyword) and a concrete call the base makes on itself
(``self._hook(a, b, in_capture=...)``). Either way the verdict is Python's own: the call is made on a stub
function with the override's exact parameters and qualified name, so a ``TypeError`` is the message the real
call would raise; an accepted call is inspected for arguments that land in another parameter or defaults
that changed under a call that relies on them.
"""

from __future__ import annotations

import inspect
import re
import types
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any

from workbench.contracts.results import (
    CHANGED_DEFAULT,
    DROPPED_VARARGS,
    DROPPED_VARKW,
    KIND_CHANGED,
    MISSING,
    NEW_REQUIRED,
    RENAMED,
    REORDERED,
    SWALLOWED,
    Finding,
    display_path,
)

_P = inspect.Parameter
_EMPTY = inspect.Parameter.empty
_POSITIONAL = (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)
_VARIADIC = (_P.VAR_POSITIONAL, _P.VAR_KEYWORD)


@dataclass(frozen=True)
class SourceExpr:
    """A default value read from source that is not a literal: only its text is known."""

    text: str

    def __repr__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Method:
    """A method's signature and where it is defined.

    ``kind``: ``"function"``, ``"staticmethod"`` or ``"classmethod"``; a function or classmethod receives
    self/cls as its first parameter when called through an instance.
    """

    qualname: str
    signature: inspect.Signature
    kind: str
    file: str
    line: int | None
    reads: frozenset[str] = frozenset()  # keys the body reads from its **kwargs (when it has them)
    uses: frozenset[str] = frozenset()  # the parameters the body reads (when it has **kwargs)

    @property
    def bound(self) -> bool:
        return self.kind != "staticmethod"

    @property
    def owner(self) -> str:
        return self.qualname.rpartition(".")[0] or self.qualname

    @cached_property  # asked for on every comparison: computed once per method
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


def _stub_text(method: Method) -> tuple[str, str, list[str]]:
    params = [
        p.replace(default=None if p.default is not _EMPTY else _EMPTY, annotation=_EMPTY)
        for p in method.signature.parameters.values()
    ]
    name = method.qualname.rpartition(".")[2]
    body = "return {" + ", ".join(f"{p.name!r}: {p.name}" for p in params) + "}"  # where each argument landed
    # Only identifiers reach this text: inspect.Parameter validated every name, ``name`` comes from a def.
    return name, f"def {name}{inspect.Signature(params)}:\n    {body}\n", [p.name for p in params]


@lru_cache(maxsize=4096)
def _compiled(text: str, name: str) -> Any:
    namespace: dict[str, Any] = {}
    exec(compile(text, "<contract stub>", "exec"), namespace)
    return namespace[name]


def stub(method: Method) -> Any:
    """A function with the method's exact parameters and qualified name, returning its arguments by name
    (made once per method: a base's method is called against every override)."""
    made = method.__dict__.get("_stub")
    if made is None:
        made = method.__dict__["_stub"] = _make_stub(method)
    return made


def _make_stub(method: Method) -> Any:
    name, text, _ = _stub_text(method)
    template = _compiled(text, name)  # one compile per distinct signature, however many classes share it
    code = template.__code__
    if hasattr(code, "co_qualname"):  # Python >= 3.11 names the code object in messages
        code = code.replace(co_qualname=method.qualname)
    function = types.FunctionType(code, template.__globals__, name, template.__defaults__)
    function.__kwdefaults__ = template.__kwdefaults__
    function.__qualname__ = method.qualname
    return function


def _bind(method: Method, args: list[Any], kwargs: dict[str, Any]) -> dict[int, str] | str:
    """Python's TypeError message for the call, or where each argument (by id) landed."""
    try:
        bound = stub(method)(*args, **kwargs)
    except TypeError as exc:
        return f"TypeError: {exc}"
    landed: dict[int, str] = {}
    for name, value in bound.items():
        kind = method.signature.parameters[name].kind
        if kind is _P.VAR_POSITIONAL:
            landed.update({id(v): f"*{name}" for v in value})
        elif kind is _P.VAR_KEYWORD:
            landed.update({id(v): f"**{name}" for v in value.values()})
        else:
            landed[id(value)] = name
    return landed


def same_default(a: Any, b: Any) -> bool:
    """Whether two defaults are equal; a non-literal source expression compares only with another one."""
    if isinstance(a, SourceExpr) or isinstance(b, SourceExpr):
        both = isinstance(a, SourceExpr) and isinstance(b, SourceExpr)
        return a == b if both else True  # an expression against a value: cannot tell, do not report
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - arrays and tensors: fall back to their text
        return repr(a) == repr(b)


# ------------------------------------------------------------------ calls a public signature promises


@dataclass(frozen=True)
class PromisedCall:
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


def _outcome(method: Method, call: PromisedCall) -> str:
    """Python's own TypeError message for the call, or where its arguments land when it is accepted."""
    args, kwargs = call.arguments(method.bound)
    landed = _bind(method, args, kwargs)
    if isinstance(landed, str):
        return landed
    markers = [*args[1 if method.bound else 0 :], *kwargs.values()]
    moved = [f"'{m.name}' lands in '{landed[id(m)]}'" for m in markers if landed[id(m)] != m.name]
    return "no exception, but " + "; ".join(moved) if moved else "no exception"


class _Comparison:
    """Checks one override against the base method's signature, parameter by parameter."""

    def __init__(self, name: str, base: Method, override: Method) -> None:
        self.name, self.base, self.override = name, base, override
        self.b_pos = [p for p in base.params if p.kind in _POSITIONAL]
        self.b_kwonly = [p for p in base.params if p.kind is _P.KEYWORD_ONLY]
        self.b_named = {p.name: p for p in base.params if p.kind in (_P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY)}
        self.o_pos = [p for p in override.params if p.kind in _POSITIONAL]
        self.o_named = {p.name: p for p in override.params if p.kind not in _VARIADIC}
        self.o_varargs = any(p.kind is _P.VAR_POSITIONAL for p in override.params)
        self.o_varkw = any(p.kind is _P.VAR_KEYWORD for p in override.params)
        self.issues: list[tuple[str, str | None, PromisedCall, str]] = []

    def _required_kwonly(self, skip: str = "") -> tuple[str, ...]:
        return tuple(p.name for p in self.b_kwonly if p.default is _EMPTY and p.name != skip)

    def positional_call(self, extra: bool = False) -> PromisedCall:
        names = tuple(p.name for p in self.b_pos)
        return PromisedCall(self.name, names, self._required_kwonly(), extra_positional=extra)

    def minimal_call(self, extra_keyword: str | None = None) -> PromisedCall:
        names = tuple(p.name for p in self.b_pos if p.default is _EMPTY)
        return PromisedCall(self.name, names, self._required_kwonly(), extra_keyword=extra_keyword)

    def keyword_call(self, param: inspect.Parameter) -> PromisedCall:
        """Required positional parameters positionally, ``param`` by keyword (and what follows it)."""
        if param.kind is _P.KEYWORD_ONLY:
            before, after = self.b_pos, []
        else:
            i = self.b_pos.index(param)
            before, after = self.b_pos[:i], self.b_pos[i + 1 :]
        positional = tuple(p.name for p in before if p.default is _EMPTY)
        keywords = (param.name, *(p.name for p in after if p.default is _EMPTY))
        return PromisedCall(self.name, positional, keywords + self._required_kwonly(skip=param.name))

    def add(self, kind: str, param: str | None, call: PromisedCall, silent: str | None = None) -> None:
        if kind == REORDERED and any(issue[0] == REORDERED for issue in self.issues):
            return  # one reordering shows up at every moved position: report it once
        message = _outcome(self.override, call)
        if silent and not message.startswith("TypeError"):
            message = silent
        self.issues.append((kind, param, call, message))

    def run(self) -> list[tuple[str, str | None, PromisedCall, str]]:
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
            call = PromisedCall(self.name, posonly, (op.name, *required, *self._required_kwonly(skip=op.name)))
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
        elif not same_default(bp.default, op.default):
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


def signature_findings(cls: str, name: str, base: Method, override: Method, label: str = "") -> list[Finding]:
    """Findings for ``cls``'s override of the public method ``name`` against the base's signature."""
    issues = _Comparison(name, base, override).run()
    return [
        Finding(override.file, override.line, cls, name, kind, message, str(call), param, override.owner, label)
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
    kind = "function" if bound else "staticmethod"
    methods = (Method(qualname, base, kind, "", None), Method(qualname, override, kind, "", None))
    return signature_findings(cls, name, *methods)


# ----------------------------------------------------------------------------- calls the base makes


@dataclass(frozen=True)
class CallSite:
    """A call that code in the trees makes on an object whose class it knows, read from source.

    ``via``: ``"self"`` (``self.NAME(...)``), ``"super"`` (``super().NAME(...)``), ``"type"``
    (``type(self).NAME(...)``, ``cls.NAME(...)`` in a classmethod: a plain function then gets no self),
    ``"attr"`` (``self.backend.NAME(...)``, ``self.backends[i].NAME(...)``: an annotated attribute) or
    ``"param"`` (``backend.NAME(...)``: an annotated parameter). ``positional``: explicit positional
    arguments; ``star``/``starstar``: ``*args``/``**kwargs`` unpacked. ``cls``: the class whose method makes
    the call (empty in a plain function).
    """

    file: str
    line: int
    cls: str
    caller: str
    name: str
    via: str
    positional: int
    keywords: tuple[str, ...]
    star: bool
    starstar: bool
    text: str
    arg_names: tuple[str | None, ...] = ()  # each positional argument's name, when it is a plain name
    span: tuple[int, int, int, int] | None = field(default=None, compare=False, repr=False)  # where ``text`` is

    @property
    def file_line(self) -> str:
        return f"{display_path(self.file)}:{self.line}"


_UNEXPECTED = re.compile(r"unexpected keyword argument '([^']+)'")
_MISSING = re.compile(r"missing \d+ required (positional|keyword-only) arguments?: '([^']+)'")
_MULTIPLE = re.compile(r"multiple values for argument '([^']+)'")
_POSONLY = re.compile(r"positional-only arguments passed as keyword arguments: '([^']+)'")


def _kind_of(message: str, base: Method | None) -> tuple[str, str | None]:
    """The finding kind and the parameter a TypeError message names."""
    if m := _UNEXPECTED.search(message):
        return MISSING, m.group(1)
    if m := _MISSING.search(message):
        name = m.group(2)
        had = base is not None and name in base.signature.parameters
        return (CHANGED_DEFAULT if had else NEW_REQUIRED), name
    if m := _MULTIPLE.search(message):
        return REORDERED, m.group(1)
    if m := _POSONLY.search(message):
        return KIND_CHANGED, m.group(1)
    return MISSING, None  # "takes N positional arguments but M were given"


Issue = tuple[str, str | None, str, tuple[str, ...]]
"""One way a call fails on an override: kind, parameter, message, the keywords it cannot take."""


def call_site_findings(
    cls: str, site: CallSite, override: Method, base: Method | None, label: str = ""
) -> list[Finding]:
    """Findings for ``cls``'s ``override`` of ``site.name`` against one call the base makes.

    ``base``: the base's own definition of the method, when it has one: it names the positional arguments
    (to see them land elsewhere) and gives the defaults the call relies on.
    """
    return site_findings(cls, site, override, label, site_issues(site, override, base))


def site_findings(cls: str, site: CallSite, override: Method, label: str, issues: list[Issue]) -> list[Finding]:
    """The findings of :func:`site_issues` at one call site."""
    return [
        Finding(
            override.file,
            override.line,
            cls,
            site.name,
            kind,
            message,
            site.text,
            param,
            override.owner,
            label,
            site.file,
            site.line,
            site.caller,
            params,
        )  # fmt: skip
        for kind, param, message, params in issues
    ]


def site_issues(site: CallSite, override: Method, base: Method | None) -> list[Issue]:
    """How a call fails on an override. It depends only on the call's shape (``via``, how many positional
    arguments, which keywords, ``*``/``**``), not on where it is: callers memoize it per shape."""
    receives_self = override.kind == "classmethod" or (override.kind == "function" and site.via != "type")
    slots: list[str] = []
    if base is not None:
        base_receives = base.kind == "classmethod" or (base.kind == "function" and site.via != "type")
        params = list(base.signature.parameters.values())[1 if base_receives else 0 :]
        slots = [p.name for p in params if p.kind in _POSITIONAL]
    names = [slots[i] if i < len(slots) else f"arg{i + 1}" for i in range(site.positional)]
    positional = [_Marker(n) for n in names]
    keywords = {k: _Marker(k) for k in site.keywords}
    args: list[Any] = ([_Marker("self")] if receives_self else []) + positional
    landed = _bind(override, args, keywords)

    def finding(kind: str, param: str | None, message: str, params: tuple[str, ...] = ()) -> Issue:
        return kind, param, message, params

    if isinstance(landed, str):
        if (site.star or site.starstar) and "missing" in landed:
            return []  # the unpacked arguments may fill what is missing
        kind, param = _kind_of(landed, base)
        taken = {p.name for p in override.params if p.kind in (_P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY)}
        varkw = any(p.kind is _P.VAR_KEYWORD for p in override.params)
        lacking = () if varkw else tuple(k for k in site.keywords if k not in taken)
        return [finding(kind, param, landed, lacking)]
    # a positional argument may land in a renamed parameter; it is misplaced when it lands in another of the
    # base's parameters (the override reordered them)
    others = set(slots) | {p.name for p in base.params} if base is not None else set()
    moved = [
        f"'{m.name}' lands in '{landed[id(m)]}'"
        for m in positional
        if m.name in slots and landed[id(m)] != m.name and landed[id(m)] in others
    ]
    if moved:
        return [finding(REORDERED, None, "no exception, but " + "; ".join(moved))]
    swallow = _swallowed(site, override, base, landed, keywords, set(slots[: site.positional]))
    if swallow is not None:
        return [finding(SWALLOWED, *swallow)]
    if base is None or site.star or site.starstar:
        return []
    passed = set(slots[: site.positional]) | set(site.keywords)
    out = []
    for bp in base.params:
        op = override.signature.parameters.get(bp.name)
        if bp.default is _EMPTY or bp.name in passed or op is None or op.default is _EMPTY:
            continue
        if not same_default(bp.default, op.default):
            text = (
                f"no exception, but silently changes meaning: the call omits '{bp.name}', "
                f"which gets {op.default!r} here, not the base's {bp.default!r}"
            )
            out.append(finding(CHANGED_DEFAULT, bp.name, text))
    return out


def _swallowed(
    site: CallSite,
    override: Method,
    base: Method | None,
    landed: dict[int, str],
    keywords: dict[str, Any],
    passed_positionally: set[str],
) -> tuple[str, str, tuple[str, ...]] | None:
    """A keyword the override's ``**kwargs`` swallows while its body reads, under the old name, what the
    call no longer passes: a key of the ``**kwargs`` or a parameter the base does not have (a rename)."""
    varkw = next((p.name for p in override.params if p.kind is _P.VAR_KEYWORD), None)
    if varkw is None or site.starstar:
        return None
    # a keyword the body reads from **kwargs is not lost; a key the base's own signature names is an
    # optional argument this call leaves out, not a rename
    swallowed = tuple(k for k in site.keywords if landed[id(keywords[k])] == f"**{varkw}" and k not in override.reads)
    if not swallowed:
        return None
    passed = set(site.keywords) | passed_positionally
    head = f"no exception, but **{varkw} swallows {', '.join(map(repr, swallowed))} while the body reads"
    keys = sorted(override.reads - passed - ({p.name for p in base.params} if base is not None else set()))
    if keys:
        read = ", ".join(f"{varkw}[{k!r}]" for k in keys)
        return keys[0], f"{head} {read}, which this call does not pass", swallowed
    if base is None:
        return None
    own = {p.name for p in base.params}
    old = sorted(
        p.name for p in override.params
        if p.name in override.uses and p.name not in own and p.name not in passed and p.default is not _EMPTY
    )  # fmt: skip
    if old:
        names = ", ".join(map(repr, old))
        text = f"{head} {names}, which the base no longer has and this call does not pass: it keeps its default"
        return old[0], text, swallowed
    return None
