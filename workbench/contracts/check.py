"""Checking subclasses against the calls made on them: breaks first, drift on request.

A *break* is a call that code in the trees really makes and that would raise ``TypeError``, bind an argument
to another parameter, or silently change meaning (a default the call relies on, a renamed keyword a
``**kwargs`` swallows) on a class it can reach: the calling class's subclasses through ``self``, ``cls`` or
``super()`` (an intermediate base's calls included; a subclass that overrides the calling method without
calling up is not reached), and the subclasses of an annotated attribute's or parameter's class
(``self.linear_attn_backend.forward_decode(...)``). A public calling method is always entered (the engine's
runner, outside the trees, calls it); a private one only through the calls the trees show, so a private
method whose every caller the subclass replaced does not reach it. A *drift* is a public signature that
differs from the method it overrides where no call in the trees shows it; narrowing a base declared
``(self, *args, **kwargs)`` is no drift at all.

:func:`check` reads the targets from source (each file parsed once, nothing imported) and reports each
break once, under the class that defines the override, with the subclasses that inherit it.
"""

from __future__ import annotations

import gc
import importlib.util
import inspect
import os
import re
import sysconfig
import time
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Sequence
from contextlib import suppress
from dataclasses import replace
from pathlib import Path
from types import ModuleType

from workbench.contracts.calls import (
    Ann,
    Receiver,
    annotation_classes,
    annotation_names,
    attribute_types,
    function_calls,
    site_text,
)
from workbench.contracts.results import (
    BREAK,
    DRIFT,
    MISSING,
    RENAMED,
    REORDERED,
    Contract,
    Finding,
    Report,
    display_path,
)
from workbench.contracts.signatures import (
    CallSite,
    Issue,
    Method,
    signature_findings,
    site_findings,
    site_issues,
)
from workbench.contracts.source import (
    MAX_ANCESTORS,
    NOT_METHODS,
    NOT_READ,
    HierarchyTooDeep,
    Names,
    Ref,
    SourceIndex,
    SourceModule,
    _class_member,
    calls_up,
    members,
    source_method,
    special_file,
)
from workbench.errors import WorkbenchError

DEFAULT_BASE = "workbench.backends:MetadataBackend"
"""The base the CLI checks against when neither ``--base`` nor a target is given."""
DEFAULT_TARGETS = ("workbench",)
"""What the CLI checks when no module or path is given: the whole workbench package."""

WORKBENCH_ROOT = Path(__file__).resolve().parents[1]
"""The installed ``workbench`` package: its classes are contracts, and its files are read for the calls its runner
makes, when a target class derives from one of them (whatever bases the targets define)."""

Target = ModuleType | str | os.PathLike
_MAX_NOTE_ITEMS = 8
_MAX_CALL_CHAIN = 200  # private methods calling one another deeper than this are taken as entered
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class ContractError(WorkbenchError, ValueError):
    """A target or base class could not be found or read, or no subclass of the base was found."""


class NothingToCheck(ContractError):
    """The targets hold no subclass of the base (or, without a base, of any class they can reach)."""


# ----------------------------------------------------------------------------------------- the targets


def python_files(folder: Path) -> list[Path]:
    """The folder's modules; ``__main__.py`` and hidden or cache folders below ``folder`` are left out."""
    folder = folder.resolve()
    depth = len(folder.parts)
    files = (p for p in folder.rglob("*.py") if p.name != "__main__.py")
    return sorted(p for p in files if not any(part.startswith((".", "__pycache__")) for part in p.parts[depth:-1]))


def _expand(target: Target, index: SourceIndex) -> list[Path]:
    """The files of a target: a module object, a path, or a dotted module name (a package: all its files)."""
    if isinstance(target, ModuleType):
        file = getattr(target, "__file__", None)
        if not file:
            raise ContractError(f"module {target.__name__!r} has no source file")
        origin = Path(file)
    else:
        path = Path(target)
        if path.exists():
            return python_files(path) if path.is_dir() else [path.resolve()]
        name = str(target)
        found = index.find_module(name)
        if found is None:
            spec = None
            with suppress(Exception):
                spec = importlib.util.find_spec(name)
            found = Path(spec.origin) if spec and spec.origin and os.path.isfile(spec.origin) else None
        if found is None:
            raise ContractError(f"no module or path named {name!r}")
        origin = found
    return python_files(origin.parent) if origin.name == "__init__.py" else [origin.resolve()]


def _package_folder(name: str, index: SourceIndex) -> Path:
    """The folder of an installed or search-path package (``--against sglang``), or a folder given as is."""
    if os.sep in name and Path(name).is_dir():
        return Path(name).resolve()
    found = index.find_module(name)
    if found is None:
        spec = None
        with suppress(Exception):
            spec = importlib.util.find_spec(name)
        locations = list(spec.submodule_search_locations or []) if spec else []
        if not locations:
            raise ContractError(f"--against {name!r}: no such package installed or on the search path")
        return Path(locations[0]).resolve()
    return found.parent if found.name == "__init__.py" else found


def _base_ref(base: type | str, index: SourceIndex, modules: list[SourceModule]) -> Ref:
    """The base's ``ClassDef``: from a class object's file, a ``pkg.mod:Class`` name, or a bare name."""
    if isinstance(base, type):
        label = f"{base.__module__}:{base.__qualname__}"
        file = None
        with suppress(TypeError):
            file = inspect.getsourcefile(base)
        ref = index.find_class(Path(file).resolve(), base.__qualname__) if file else None
        if ref is None:
            raise ContractError(f"cannot read the source of base class {label}")
        return ref
    if ":" in base or "." in base:
        module_name, _, name = base.partition(":") if ":" in base else base.rpartition(".")
        path = index.find_module(module_name)
        parsed = index.module(path) if path else None
        if path is None or parsed is None:
            why = index.errors.get(path, "does not parse") if path else "no such module on the search path"
            raise ContractError(f"base class {module_name}:{name} not found: {module_name} ({why})")
        found = index.lookup(parsed, name) if "." not in name else index.find_class(path, name)
        if not isinstance(found, Ref) or found.node is None:
            raise ContractError(f"base class {module_name}:{name} not found: {display_path(str(path))} has no {name}")
        return found
    for module in modules:  # a bare name: what the targets themselves call it
        found = index.lookup(module, base)
        if isinstance(found, Ref) and found.node is not None:
            return found
    raise ContractError(f"base class {base!r} not found in the targets; pass it as pkg.module:{base}")


# ------------------------------------------------------------------------------------- the hierarchy


class _Trees:
    """The classes of the targets, their resolution orders, and which classes in the trees derive from which.

    ``trees``: folders whose classes are contracts (the targets' top-level packages, the search roots,
    ``--against`` packages); a base elsewhere (a third-party or stdlib class) is noted, never a contract.
    """

    def __init__(self, index: SourceIndex, modules: list[SourceModule], trees: list[Path]) -> None:
        self.index = index
        self.targets = [ref for module in modules for ref in module.refs()]
        self.target_files = {m.path for m in modules}
        self.target_files |= {t for t in trees if t.suffix == ".py"}
        self.tree_prefixes = tuple(dict.fromkeys(str(t).rstrip(os.sep) + os.sep for t in trees if t.suffix != ".py"))
        self.mros = {ref: index.mro(ref) for ref in self.targets}
        self.subclasses: dict[Ref, list[Ref]] = defaultdict(list)
        self.outside: dict[str, list[str]] = defaultdict(list)  # base label -> classes deriving from it
        for ref in self.targets:
            for parent in self.mros[ref][1:]:
                if parent.node is not None and self.local(parent):
                    self.subclasses[parent].append(ref)
                elif parent.module != "builtins":
                    self.outside[self._outside_label(parent)].append(ref.name)
        self._resolved: dict[tuple[Ref, str, int], Ref | None] = {}
        self._positions: dict[Ref, dict[Ref, int]] = {}
        self._definers: dict[tuple[Ref, str], list[int]] = {}
        self._mro_sets: dict[Ref, frozenset[Ref]] = {}
        self.reaches: dict[tuple[Ref, Ref, str], bool] = {}
        self.entered: dict[tuple[Ref, str], bool] = {}
        self._occurrences: dict[str, list[tuple[SourceModule, int]]] | None = None
        self._issues: dict[tuple, list[Issue]] = {}

    def issues(self, site: CallSite, override: Method, base: Method | None) -> list[Issue]:
        """:func:`site_issues`, once per override, base and call shape (the methods live as long as the check)."""
        shape = (site.via == "type", site.positional, site.keywords, site.star, site.starstar)
        key = (id(override), id(base), *shape)
        found = self._issues.get(key)
        if found is None:
            found = self._issues[key] = site_issues(site, override, base)
        return found

    def occurrences(self) -> dict[str, list[tuple[SourceModule, int]]]:
        """Every ``.NAME(`` of a private NAME in the files read, by NAME (built once, after every file is
        read): :func:`_entered` asks only about private names."""
        if self._occurrences is None:
            found: dict[str, list[tuple[SourceModule, int]]] = defaultdict(list)
            for module in self.index.parsed:
                for name, lines in module.method_calls().items():
                    if name.startswith("_") and not name.startswith("__"):
                        found[name] += [(module, line) for line in lines]
            self._occurrences = found
        return self._occurrences

    def local(self, ref: Ref) -> bool:
        if ref.path is None:
            return False
        return ref.path in self.target_files or str(ref.path).startswith(self.tree_prefixes)

    def _outside_label(self, ref: Ref) -> str:
        if ref.path is not None:
            return f"{ref.label} (in {display_path(str(ref.path))})"
        if ref.module.startswith("."):
            return f"{ref.name} (from {ref.module}: not found)"
        return f"{ref.label.replace('?:', '')} (not found)"

    def mro(self, ref: Ref) -> list[Ref]:
        found = self.mros.get(ref)
        if found is None:
            found = self.mros[ref] = self.index.mro(ref)
        return found

    def mro_set(self, ref: Ref) -> frozenset[Ref]:
        found = self._mro_sets.get(ref)
        if found is None:
            found = self._mro_sets[ref] = frozenset(self.mro(ref))
        return found

    def resolve(self, ref: Ref, name: str, after: Ref | None = None) -> Ref | None:
        """The class in ``ref``'s resolution order that defines ``name`` (after ``after``, for ``super()``).

        Near-linear on long hierarchies: each order's positions and the positions of the classes in it
        that define ``name`` are computed once, so a lookup is a bisection, not a scan (a chain of 500
        classes would otherwise scan 500 classes for each of its 250,000 class pairs)."""
        key = (ref, name, id(after.node) if after is not None and after.node is not None else 0)
        if key in self._resolved:
            return self._resolved[key]
        order = self.mro(ref)
        start = 0
        if after is not None:
            positions = self._positions.get(ref)
            if positions is None:
                positions = self._positions[ref] = {}
                for i, r in enumerate(order):
                    positions.setdefault(r, i)  # the first place, as list.index finds it
            at = positions.get(after)
            start = len(order) if at is None else at + 1
        definers = self._definers.get((ref, name))
        if definers is None:
            definers = [i for i, r in enumerate(order) if r.node is not None and name in members(r.node)]
            self._definers[(ref, name)] = definers
        i = bisect_left(definers, start)
        found = order[definers[i]] if i < len(definers) else None
        self._resolved[key] = found
        return found


def shown(ref: Ref) -> str:
    """A class's name in a finding: a class built inside a function by its qualified name
    (``make_backend.<locals>.Backend``), which tells it from a module-level twin and says where it is built."""
    return ref.qualname if "<locals>" in ref.qualname else ref.name


def _reaches(trees: _Trees, sub: Ref, caller: Ref, method: str) -> bool:
    """Whether ``caller``'s ``method`` still runs on ``sub``: not overridden, or every override calls up."""
    key = (sub, caller, method)
    found = trees.reaches.get(key)
    if found is None:
        found = trees.reaches[key] = _reaches_now(trees, sub, caller, method)
    return found


def _reaches_now(trees: _Trees, sub: Ref, caller: Ref, method: str) -> bool:
    own = trees.mro_set(caller)
    for ref in trees.mro(sub):
        if ref.node is None:
            continue
        member = _class_member(ref.node, method)
        if member is None:
            continue
        if ref in own or isinstance(member, str):
            return True
        if not calls_up(member, method):
            return False
    return True


def _entered(trees: _Trees, sub: Ref, method: str, seen: frozenset[str] = frozenset()) -> bool:
    """Whether ``method`` can be entered on ``sub``. A public method (no leading ``_``: a hook of the engine's
    or the workbench's contract) or a dunder is always entered: the engine's runner, which is not in the
    trees, calls it. A private method is entered unless every ``.method(`` in the files read is a
    ``self``/``super()`` call from a method that no longer runs on ``sub`` (the subclass overrode it without
    calling up, or that one is private and nothing enters it either); a private name nothing in the trees
    calls is entered too."""
    if not method.startswith("_") or method.startswith("__"):
        return True
    if method in seen:
        return False
    if len(seen) > _MAX_CALL_CHAIN:  # a chain of private calls that long: entered, as a cycle is (no recursion)
        return True
    key = (sub, method)
    if key in trees.entered:
        return trees.entered[key]
    trees.entered[key] = True  # a cycle: assume entered while deciding
    occurrences = trees.occurrences().get(method, ())
    own = re.compile(rf"\b(self|cls|super\(\))\.{re.escape(method)}\s*\(")
    order = trees.mro_set(sub)
    inside = False  # a self/super() call from the subclass's own hierarchy
    found = False
    for module, line in occurrences:
        where = module.enclosing(line) if own.search(module.line(line)) else None
        if where is None:
            found = True  # called on another object, or outside any class: an entry point
            break
        cls, caller = where
        if cls not in order:
            continue  # another hierarchy's own call: it neither enters nor rules out
        inside = True
        if _reaches(trees, sub, cls, caller) and _entered(trees, sub, caller, seen | {method}):
            found = True
            break
    found = found or not inside  # only the hierarchy's own calls, none of which runs here, rule it out
    trees.entered[key] = found
    return found


def _generic(method: Method) -> bool:
    """A hook declared ``(self, *args, **kwargs)``: any narrowing of it is by design."""
    kinds = [p.kind for p in method.params]
    return kinds == [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]


# ------------------------------------------------------------------------------------------ call sites


def _overridden_names(trees: _Trees) -> set[str]:
    """The method names a call can reach in another class than its receiver's: those some target class
    defines over a base in the trees, and those of a mixin after such a base (``super()`` reaches it)."""
    names: set[str] = set()
    for ref in trees.targets:
        order = trees.mro(ref)
        seen_base = False
        if len(order) == 1:
            continue
        for i, cls in enumerate(order):
            if cls.node is not None and (i == 0 or seen_base):  # the target, or a class after a base in its order
                names.update(n for n, m in members(cls.node).items() if not isinstance(m, str))
            if i and cls.node is not None and cls in trees.subclasses:
                seen_base = True
    return names


class _Receivers:
    """Which bases (with subclasses in the targets) a call's receiver can be: ``self``/``cls``/``super()`` in
    a base's own method, an annotated attribute of the calling class, an annotated parameter."""

    def __init__(self, trees: _Trees, bases: list[Ref]) -> None:
        self.trees = trees
        self.bases = set(bases)
        self.names = {b.name for b in bases}
        self._attributes: dict[tuple[Ref, str], list[tuple[Ref, bool]]] = {}
        self._classes: dict[tuple[int, int], list[tuple[Ref, bool]]] = {}
        self._interest: dict[int, bool] = {}

    def attribute(self, cls: Ref, attr: str) -> list[tuple[Ref, bool]]:
        """The classes ``cls``'s attribute ``attr`` is annotated with, each with whether it is a container's
        item; the first class in ``cls``'s order that annotates it decides (once per pair)."""
        key = (cls, attr)
        if key not in self._attributes:
            self._attributes[key] = self._annotated_attribute(cls, attr)
        return self._attributes[key]

    def _annotated_attribute(self, cls: Ref, attr: str) -> list[tuple[Ref, bool]]:
        for owner in self.trees.mro(cls):
            annotation = attribute_types(owner.node).get(attr) if owner.node is not None else None
            if annotation is None or owner.path is None:
                continue
            module = self.trees.index.module(owner.path)
            if module is None or not self.interesting(annotation):
                return []
            return self._annotated(module, annotation, owner.scope)
        return []

    def _annotated(self, module: SourceModule, annotation: Ann, scope: Names | None) -> list[tuple[Ref, bool]]:
        key = (id(annotation), id(scope))  # one parameter's annotation serves every call on it
        found = self._classes.get(key)
        if found is None:
            refs, container = annotation_classes(self.trees.index, module, annotation, scope)
            found = self._classes[key] = [(r, container) for r in refs]
        return found

    def interesting(self, annotation: Ann) -> bool:
        """Whether an annotation mentions a base's name at all (a cheap test, once per annotation)."""
        found = self._interest.get(id(annotation))
        if found is None:
            found = self._interest[id(annotation)] = bool(annotation_names(annotation) & self.names)
        return found

    def classes(self, cls: Ref | None, module: SourceModule, receiver: Receiver) -> list[Ref]:
        """The bases a call on ``receiver``, made in ``cls`` (None: a module-level function), can reach."""
        if receiver.kind in ("self", "type", "super"):
            return [cls] if cls is not None and cls in self.bases else []
        if receiver.kind == "attr" and cls is not None:
            found = self.attribute(cls, receiver.attr)
        elif receiver.kind == "param" and receiver.annotation is not None:
            if not self.interesting(receiver.annotation):
                return []
            found = self._annotated(module, receiver.annotation, cls.scope if cls else None)
        else:
            return []
        return [r for r, container in found if container == receiver.item and r in self.bases]


def _sites(trees: _Trees, bases: list[Ref], wanted: set[str]) -> list[tuple[CallSite, Ref]]:
    """Every call on a receiver whose class is a base (with subclasses in the targets), with that class."""
    receivers = _Receivers(trees, bases)
    out: list[tuple[CallSite, Ref]] = []
    for module in trees.index.parsed:
        by_name = module.method_calls()
        lines = sorted({line for name in wanted.intersection(by_name) for line in by_name[name]})
        if lines:
            out += _method_sites(module, receivers, wanted, lines)
            out += _function_sites(module, receivers, wanted, lines)
    return out


def _method_sites(
    module: SourceModule, receivers: _Receivers, wanted: set[str], lines: list[int]
) -> list[tuple[CallSite, Ref]]:
    """The calls on bases that the methods of ``module``'s classes make, on those lines."""
    out: list[tuple[CallSite, Ref]] = []
    path = str(module.path)
    for cls in module.refs():
        assert cls.node is not None
        for method in cls.node.methods:
            for site, receiver in function_calls(method, path, cls.name, wanted, lines):
                out += [(site, r) for r in receivers.classes(cls, module, receiver)]
    return out


def _function_sites(
    module: SourceModule, receivers: _Receivers, wanted: set[str], lines: list[int]
) -> list[tuple[CallSite, Ref]]:
    """The calls on bases that ``module``'s top-level functions with a parameter annotated as one make."""
    out: list[tuple[CallSite, Ref]] = []
    for function in module.functions:
        if function.annotated & receivers.names:
            for site, receiver in function_calls(function, str(module.path), "", wanted, lines):
                out += [(site, r) for r in receivers.classes(None, module, receiver)]
    return out


# -------------------------------------------------------------------------------------------- checking


def _named(method: Method | str | None) -> set[str]:
    if not isinstance(method, Method):
        return set()
    return {
        p.name for p in method.params if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    }


def _own_protocols(trees: _Trees, sites: list[tuple[CallSite, Ref]]) -> dict[tuple[int, str], CallSite]:
    """Overrides that a call in the trees uses in their own protocol: by keywords the method they override
    does not name (``forward_decode(..., mixed_qkv=...)`` on a linear-attention backend), or with arguments
    named as the override's parameters at positions where the overridden method has others."""
    evidence: dict[tuple[int, str], CallSite] = {}
    compared: dict[tuple[Ref, Ref, str], tuple[set[str], list[str], list[str]] | None] = {}

    def compare(owner: Ref, reference: Ref, name: str) -> tuple[set[str], list[str], list[str]] | None:
        """The override's own keywords, its positional names and the overridden method's (once per pair)."""
        key = (owner, reference, name)
        if key not in compared:
            method = source_method(owner, name)
            if not isinstance(method, Method):
                compared[key] = None
            else:
                overridden = source_method(reference, name)
                compared[key] = (
                    _named(method) - _named(overridden),
                    [p.name for p in method.params if p.kind in _POSITIONAL],
                    [p.name for p in overridden.params if p.kind in _POSITIONAL]
                    if isinstance(overridden, Method)
                    else [],
                )
        return compared[key]

    # what a site's class, name and ``super()`` decide (each override, what it overrides, their names), once
    plans: dict[tuple[Ref, str, bool], tuple[Ref | None, list[tuple[Ref, Ref, tuple]]]] = {}
    for site, receiver_class in sites:
        key = (receiver_class, site.name, site.via == "super")
        plan = plans.get(key)
        if plan is None:
            base = trees.resolve(receiver_class, site.name, receiver_class if site.via == "super" else None)
            entries = []
            for cls in (receiver_class, *trees.subclasses.get(receiver_class, ())):
                found = trees.resolve(cls, site.name)
                if found is None:
                    continue
                reference = base if found != base else trees.resolve(found, site.name, found)
                facts = compare(found, reference, site.name) if reference is not None else None
                if facts is not None:
                    entries.append((cls, found, facts))
            plan = plans[key] = (base, entries)
        base_owner, entries = plan
        if not site.keywords and sum(1 for name in site.arg_names if name) < 2:
            continue  # no keyword and fewer than two named arguments: no evidence either way
        for cls, owner, facts in entries:
            if (id(owner.node), site.name) in evidence:
                continue
            if site.via in ("attr", "param") and _other_branch(trees, cls, owner, base_owner, site):
                continue  # another protocol's call: no evidence on this one
            own, mine, theirs = facts
            placed = sum(
                1
                for i, name in enumerate(site.arg_names)
                if name and i < len(mine) and mine[i] == name and (i >= len(theirs) or theirs[i] != name)
            )
            if own & set(site.keywords) or placed >= 2:
                evidence[(id(owner.node), site.name)] = site
    return evidence


def _breaks(
    trees: _Trees, sites: list[tuple[CallSite, Ref]], within: set[Ref] | None
) -> tuple[list[Finding], list[Finding]]:
    """The breaks, and the findings on redesigned overrides (calls in the base's protocol), which are drift."""
    grouped: dict[tuple, tuple[Finding, list[str]]] = {}
    texts: dict[int, str] = {}  # each site's text, read back from its source once
    protocols = _own_protocols(trees, sites)
    bases: dict[tuple[Ref, str, bool], tuple[Ref | None, Method | None]] = {}
    plans: dict[tuple[Ref, str, str, str], list[tuple[Ref, Ref, Method]]] = {}
    for site, receiver_class in sites:
        # a self/super() call is made by the receiver's class itself; a composed call by no class of the hierarchy
        caller = receiver_class if site.via in ("self", "type", "super") else None
        after = receiver_class if site.via == "super" else None
        base_key = (receiver_class, site.name, after is not None)
        if base_key not in bases:
            base_owner = trees.resolve(receiver_class, site.name, after)
            base_found = source_method(base_owner, site.name) if base_owner is not None else None
            bases[base_key] = (base_owner, base_found if isinstance(base_found, Method) else None)
        base_owner, base_method = bases[base_key]
        if base_owner is None and site.via in ("attr", "param"):
            continue  # the annotated class has no such method: the caller means another class
        if base_method is not None and not _takes(trees, site, base_method):
            continue  # the receiver's own method rejects the call: the caller means another class, not this contract
        calling = site.caller.rpartition(".")[2]
        # which subclasses' overrides the call reaches depends on the class, the name, how and from where it is
        # made, not on its arguments: decided once (in the order a first such call decides it)
        plan_key = (receiver_class, site.name, site.via, calling)
        plan = plans.get(plan_key)
        if plan is None:
            plan = plans[plan_key] = _reached(trees, receiver_class, site.name, after, caller, calling, within)
        for sub, owner, found in plan:
            if caller is None and _other_branch(trees, sub, owner, base_owner, site):
                continue  # an annotation wider than the object: a class in between already rejects the call
            for issue in trees.issues(site, found, base_method):
                key = (id(owner.node), site.name, site.file, site.line, issue[0], issue[2])
                if key not in grouped:  # the first subclass's finding stands for the group: made once
                    if id(site) not in texts:
                        texts[id(site)] = _text(trees.index, site)
                    (finding,) = site_findings(shown(owner), site, found, receiver_class.label, [issue])
                    grouped[key] = (replace(finding, call=texts[id(site)]), [])
                grouped[key][1].append(shown(sub))
    breaks, redesigned = [], []
    for key, (finding, subs) in grouped.items():
        evidence = protocols.get((key[0], key[1]))
        if (
            evidence is not None
            and finding.kind in (REORDERED, MISSING, RENAMED)
            and evidence.line != finding.site_line
        ):
            text = f"{finding.message} (a redesign: {evidence.file_line} calls it by its own keywords)"
            redesigned.append(_with(replace(finding, message=text), DRIFT, subs))
        else:
            breaks.append(_with(finding, BREAK, subs))
    return breaks, redesigned


def _reached(
    trees: _Trees,
    receiver_class: Ref,
    name: str,
    after: Ref | None,
    caller: Ref | None,
    calling: str,
    within: set[Ref] | None,
) -> list[tuple[Ref, Ref, Method]]:
    """The subclasses a call of ``name`` on ``receiver_class`` reaches (``caller``'s ``calling`` method makes
    it, when the class calls itself), with the class defining the override each gets and the override."""
    out = []
    own = trees.mro_set(receiver_class)
    for sub in trees.subclasses.get(receiver_class, ()):
        if within is not None and sub not in within:
            continue
        owner = trees.resolve(sub, name, after)
        if owner is None or owner in own:
            continue  # the base's own method runs
        if caller is not None and not _reaches(trees, sub, caller, calling):
            continue  # the subclass replaced the method that makes the call
        if caller is not None and not _entered(trees, sub, calling):
            continue  # a private calling method that nothing in the trees enters on this subclass
        found = source_method(owner, name)
        if not isinstance(found, Method) or _ignored(trees, owner, found):
            continue
        out.append((sub, owner, found))
    return out


def _text(index: SourceIndex, site: CallSite) -> str:
    module = index.module(Path(site.file))
    return site_text(module, site) if module is not None else site.text


def _other_branch(trees: _Trees, sub: Ref, owner: Ref, base_owner: Ref | None, site: CallSite) -> bool:
    """Whether a composed call (``self.quant_method.apply(self, x, bias)`` on an attribute annotated with the
    root of several protocols) reaches ``sub`` only through a class between the override and the annotated
    class whose own definition, not a generic ``(*args, **kwargs)`` one, rejects the call already: that branch
    redesigned the method (a MoE method's ``apply`` under a linear layer's ``QuantizeMethodBase``), so the
    caller never holds such an object. Only a class of the contracts counts: a checked class that rejects the
    call is a break itself, and its subclasses' overrides are reported too."""
    order = trees.mro(sub)
    try:
        start = order.index(owner) + 1
        end = order.index(base_owner) if base_owner is not None else len(order)
    except ValueError:
        return False
    for ref in order[start:end]:
        if ref.node is None or ref.path in trees.target_files or site.name not in members(ref.node):
            continue  # a checked class in between that rejects the call is a break of its own, not a branch
        method = source_method(ref, site.name)
        if isinstance(method, Method) and not _generic(method) and not _takes(trees, site, method):
            return True
    return False


def _takes(trees: _Trees, site: CallSite, method: Method) -> bool:
    """Whether a method can take the call at all (unpacked arguments may fill anything)."""
    if site.star or site.starstar:
        return True
    return not trees.issues(site, method, None)


def _with(finding: Finding, tier: str, subclasses: list[str]) -> Finding:
    return replace(finding, tier=tier, subclasses=tuple(dict.fromkeys(subclasses)))


def _drift(trees: _Trees, within: set[Ref] | None, methods: Sequence[str] | None) -> list[Finding]:
    """Public overrides whose signature differs from the method they override, with no call to show it."""
    out: list[Finding] = []
    for ref in trees.targets:
        if ref.node is None or (within is not None and ref not in within):
            continue
        for name, member in members(ref.node).items():
            if isinstance(member, str) or name.startswith("_") or (methods is not None and name not in methods):
                continue
            if set(member.decorators) & NOT_METHODS:
                continue
            parent = trees.resolve(ref, name, ref)
            while parent is not None and not trees.local(parent):  # a library class in between: look past it
                parent = trees.resolve(ref, name, parent)
            if parent is None:
                continue
            base_method = source_method(parent, name)
            override = source_method(ref, name)
            if not isinstance(base_method, Method) or not isinstance(override, Method) or _generic(base_method):
                continue
            if _ignored(trees, ref, override):
                continue
            findings = signature_findings(shown(ref), name, base_method, override, parent.label)
            if findings:
                heirs = [shown(ref)] + [
                    shown(s) for s in trees.subclasses.get(ref, ()) if trees.resolve(s, name) == ref
                ]
                out += [_with(f, DRIFT, heirs) for f in findings]
    return out


def _package_of(index: SourceIndex, path: Path) -> Path:
    """The folder of the top-level package a file belongs to (the file itself when it is in none)."""
    dotted = index.dotted(path)
    if "." not in dotted and path.name != "__init__.py":
        return path
    return index.root_of(path) / dotted.partition(".")[0]


IGNORE = "check-contracts: ignore"
"""A comment on an override's ``def`` line or its class's line that leaves it out (a deliberate break)."""
_IGNORE_BYTES = IGNORE.encode()


def _ignored(trees: _Trees, owner: Ref, method: Method) -> bool:
    module = trees.index.module(owner.path) if owner.path is not None else None
    if module is None or owner.node is None or not module.holds(_IGNORE_BYTES):  # the file has no such comment
        return False
    return IGNORE in module.line(method.line or 0) or IGNORE in module.line(owner.node.lineno)


def _workbench_class(ref: Ref) -> bool:
    return ref.path is not None and ref.path.is_relative_to(WORKBENCH_ROOT)


def _on_workbench(trees: _Trees) -> bool:
    """Whether a target class derives from a class of the installed workbench that is not in the trees (a
    user's file on ``MetadataBackend``): then the workbench's classes are contracts, with the calls its
    runner makes on them, whatever bases the file adds."""
    parents = {parent for ref in trees.targets for parent in trees.mro(ref)[1:]}  # once each: a chain shares them
    return any(_workbench_class(parent) and not trees.local(parent) for parent in parents)


def _within(trees: _Trees, base: Ref) -> set[Ref]:
    return set(trees.subclasses.get(base, ()))


def _grouped_note(title: str, items: dict[str, list[str]]) -> str:
    ranked = sorted(items.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    shown = [f"{label} x{len(set(classes))}" for label, classes in ranked[:_MAX_NOTE_ITEMS]]
    more = f", and {len(ranked) - _MAX_NOTE_ITEMS} more" if len(ranked) > _MAX_NOTE_ITEMS else ""
    return f"{title}: {', '.join(shown)}{more}"


def check(
    target: Target | Sequence[Target],
    base: type | str | None = None,
    methods: Sequence[str] | None = None,
    *,
    search_path: Sequence[str | os.PathLike] = (),
    against: Iterable[str] = (),
    calls_from: Sequence[str | os.PathLike] = (),
) -> Report:
    """Check every subclass found in ``target`` against the calls made on it in the trees (breaks) and the
    signatures it overrides (drift).

    ``target``: a module object, a dotted module name (a package means all its files), a file or directory
    path, or a list of these; every file is read from source, none is imported. ``base``: a class,
    ``"pkg.mod:Class"``, a bare class name the targets import or define, or None: then every class that a
    target class derives from and that the trees define is a base. ``methods``: only these methods.
    ``search_path``: extra roots for resolving imports, whose classes are contracts too (an engine unpacked
    elsewhere). ``against``: installed packages (or their folders) whose classes are contracts and whose
    every file is read for the calls it makes: a plugin against the engine it extends. ``calls_from``:
    more folders or files read for calls only (the targets and the files of their bases always are).

    Raises :class:`ContractError` for a target that does not exist or parse, a base that cannot be found,
    and a base with no subclass in the targets. Hostile sources are bounded: a special file (a FIFO) is never
    opened, a file over ``MAX_FILE_BYTES`` or nested too deeply for Python's parser is not read (a note in a
    folder, this error when named), and a class deriving from over ``MAX_ANCESTORS`` classes is this error.
    """
    enabled = gc.isenabled()
    gc.disable()  # parsing makes millions of nodes, freed by reference counting: a collection finds nothing
    try:
        return _check(target, base, methods, search_path, list(against), calls_from)
    except HierarchyTooDeep as exc:
        ref = exc.ref
        where = f"{display_path(str(ref.path))}:{ref.node.lineno}" if ref.path and ref.node else ref.module
        raise ContractError(
            f"class {ref.qualname or ref.name} ({where}) derives from over {MAX_ANCESTORS} classes: an inheritance "
            "chain that long is refused (each class's resolution order holds every class above it)"
        ) from None
    except RecursionError:  # the last guard: whatever in the trees is nested too deeply, one line, no traceback
        raise ContractError(
            "the trees hold code nested too deeply to check (Python's recursion limit was reached)"
        ) from None
    finally:
        if enabled:
            gc.enable()


def _check(
    target: Target | Sequence[Target],
    base: type | str | None,
    methods: Sequence[str] | None,
    search_path: Sequence[str | os.PathLike],
    against: list[str],
    calls_from: Sequence[str | os.PathLike],
) -> Report:
    start = time.perf_counter()
    targets: list[Target] = list(target) if isinstance(target, (list, tuple)) else [target]  # type: ignore[list-item]
    roots = _search_roots(search_path)
    index = SourceIndex(roots)
    files, parsed, notes = _read_targets(targets, index)
    index.infer_roots(parsed)
    index.add_roots([m.root for m in parsed])  # a base named pkg.mod resolves as the targets import it
    packages = [_package_folder(name, index) for name in against]
    index.add_roots([p.parent for p in packages])  # the targets import the engine by its package name
    callers = [*packages, *_calls_from(calls_from)]
    trees = [*roots, *packages]
    trees += [_package_of(index, m.path) for m in parsed]
    base_ref = _base_ref(base, index, parsed) if base is not None else None
    within: set[Ref] | None = None
    if base_ref is not None:  # named explicitly: its package's classes, and its ancestors', are contracts
        state = _Trees(index, parsed, trees + _base_trees(index, base_ref))
        within = _within_base(state, base_ref, targets)
        label = base if isinstance(base, str) and ":" in base else base_ref.label
    else:
        state, label = _every_base(index, parsed, trees, notes)
        if state.outside:
            notes.append(_grouped_note("bases outside the trees, not checked (class count)", state.outside))
    bases = [b for b in state.subclasses if within is None or b in within or any(b in state.mro(w) for w in within)]
    wanted = _wanted(state, bases, methods)
    if any(_workbench_class(b) for b in bases):
        callers.append(WORKBENCH_ROOT)  # the runner, the zoo: where the workbench calls a backend
    for folder in dict.fromkeys(callers):  # read for the calls they make; their classes are not checked
        for path in python_files(folder) if folder.is_dir() else [folder]:
            index.module(path)
    sites = _sites(state, bases, wanted)
    report = Report(label)
    report.files = [str(p) for p in files]
    report.findings = _findings(state, sites, within, methods, notes)
    report.notes = list(dict.fromkeys(notes))
    report.contracts = _contracts(state, sites, [base_ref] if base_ref is not None else bases, base_ref, label, methods)
    report.classes = len(state.targets)
    report.seconds = time.perf_counter() - start
    return report


def _search_roots(search_path: Sequence[str | os.PathLike]) -> list[Path]:
    roots = [Path(p).resolve() for p in search_path]
    for root in roots:
        if not root.is_dir():
            raise ContractError(f"--search-path {display_path(str(root))} is not a folder")
    return roots


def _read_targets(targets: list[Target], index: SourceIndex) -> tuple[list[Path], list[SourceModule], list[str]]:
    """The targets' files, those that parsed, and notes on those that did not (or were not read): a folder's
    files may fail so, a file named on its own may not."""
    expanded = [(t, _expand(t, index)) for t in targets]
    files = list(dict.fromkeys(path for _, paths in expanded for path in paths))
    named = {paths[0] for t, paths in expanded if len(paths) == 1 and not Path(str(t)).is_dir()}
    modules = [index.module(path) for path in files]
    parsed = [m for m in modules if m is not None]
    unparsed = [p for p, m in zip(files, modules, strict=True) if m is None]
    unread = [p for p in unparsed if index.errors[p].startswith(NOT_READ)]  # special, too large, too deep
    broken = [f"{display_path(str(p))} ({index.errors[p]})" for p in unparsed if p not in unread]
    skipped = [f"{display_path(str(p))} ({index.errors[p].removeprefix(NOT_READ)})" for p in unread]
    if unparsed and (not parsed or named & set(unparsed)):  # a file named on its own must parse
        if skipped:
            raise ContractError(f"target file not read: {'; '.join(skipped + broken)}")
        raise ContractError(f"target file does not parse: {'; '.join(broken)}")
    notes: list[str] = []
    if broken:
        notes.append(f"{len(broken)} file(s) do not parse on this Python and were skipped: {'; '.join(broken[:3])}")
    if skipped:
        notes.append(f"{len(skipped)} file(s) were not read and were skipped: {'; '.join(skipped[:3])}")
    return files, parsed, notes


def _calls_from(calls_from: Sequence[str | os.PathLike]) -> list[Path]:
    """``--calls-from``: existing files or folders, nothing special (a FIFO) among them."""
    out = []
    for extra in calls_from:
        path = Path(extra).resolve()
        if not path.exists():
            raise ContractError(f"--calls-from {display_path(str(path))} does not exist")
        kind = special_file(path)
        if kind is not None and kind != "a folder":
            raise ContractError(f"--calls-from {display_path(str(path))} is {kind}, not a file or folder")
        out.append(path)
    return out


def _base_trees(index: SourceIndex, base_ref: Ref) -> list[Path]:
    """The packages of a named base and of its ancestors (the standard library's left out)."""
    stdlib = sysconfig.get_paths()["stdlib"] + os.sep
    return [
        _package_of(index, ref.path)
        for ref in index.mro(base_ref)
        if ref.path is not None and not str(ref.path).startswith(stdlib)
    ]


def _within_base(trees: _Trees, base_ref: Ref, targets: list[Target]) -> set[Ref]:
    """The named base's subclasses in the targets; :class:`NothingToCheck` when there is none."""
    within = _within(trees, base_ref)
    if not trees.subclasses.get(base_ref):
        where = ", ".join(display_path(str(t)) if not isinstance(t, ModuleType) else t.__name__ for t in targets)
        raise NothingToCheck(f"no subclass of {base_ref.label} found in {where}")
    return within


def _every_base(
    index: SourceIndex, parsed: list[SourceModule], trees: list[Path], notes: list[str]
) -> tuple[_Trees, str]:
    """No base named: every class in the trees a target derives from, and the installed workbench's classes
    when a target derives from one (a user's file on ``MetadataBackend``); the hierarchy and its label."""
    state = _Trees(index, parsed, trees)
    own = adds_bases = False  # checked against the workbench's classes; the targets define bases too
    if _on_workbench(state):  # a user's file on the workbench's own classes: check against those too
        adds_bases = bool(state.subclasses)
        state, own = _Trees(index, parsed, [*trees, WORKBENCH_ROOT]), True
        names = ", ".join(dict.fromkeys(ref.label for ref in state.subclasses if _workbench_class(ref)))
        if adds_bases:
            notes.append(
                f"the targets derive from the workbench's own {names}: checked against those too, with the "
                "calls the workbench's runner makes"
            )
        else:
            notes.append(f"no base class in the targets: checked against the workbench's own {names}")
    if not state.subclasses:
        hint = ""
        if state.outside:
            hint = "; their bases are outside the trees: " + ", ".join(list(state.outside)[:_MAX_NOTE_ITEMS])
        raise NothingToCheck(
            "no class in the targets derives from a class defined in the targets or on the search path"
            f"{hint}; pass the base's root with --search-path DIR, or --base pkg.mod:Class"
        )
    label = "every base class in the trees" if adds_bases or not own else "the workbench's own base classes"
    return state, label


def _wanted(trees: _Trees, bases: list[Ref], methods: Sequence[str] | None) -> set[str]:
    """The method names whose calls are checked: those overridden, only ``methods`` if given (each of which
    a base must define or some target override)."""
    wanted = _overridden_names(trees)
    if methods is None:
        return wanted
    known = wanted | {n for b in bases if b.node for n in members(b.node)}
    for name in methods:
        if name not in known:
            names = ", ".join(b.label for b in bases[:_MAX_NOTE_ITEMS])
            raise ContractError(f"--method {name!r}: no base class found ({names}) defines or calls it")
    return wanted & set(methods)


def _findings(
    trees: _Trees,
    sites: list[tuple[CallSite, Ref]],
    within: set[Ref] | None,
    methods: Sequence[str] | None,
    notes: list[str],
) -> list[Finding]:
    """The breaks, then the drift that no break already shows, each in file order; a note on the calls in a
    base's protocol that reach redesigned overrides (counted as drift)."""
    breaks, redesigned = _breaks(trees, sites, within)
    drift = redesigned + _drift(trees, within, methods)
    if redesigned:
        names = ", ".join(dict.fromkeys(f"{f.cls}.{f.method}" for f in redesigned))
        notes.append(
            f"{len(redesigned)} call(s) in a base's protocol reach overrides that redesign it and are called "
            f"by their own keywords elsewhere ({names}): counted as drift"
        )
    shown = {(f.file, f.line, f.method, f.message) for f in breaks}
    drift = [f for f in drift if (f.file, f.line, f.method, f.message) not in shown]
    return sorted(breaks, key=_order) + sorted(drift, key=_order)


def _contracts(
    trees: _Trees,
    sites: list[tuple[CallSite, Ref]],
    bases: list[Ref],
    base_ref: Ref | None,
    label: str,
    methods: Sequence[str] | None,
) -> list[Contract]:
    """One contract per base: its public methods, the calls made on it, its subclasses."""
    calls_by_base: dict[Ref, int] = defaultdict(int)
    for _, receiver in sites:
        calls_by_base[receiver] += 1
    return [
        Contract(
            label if b == base_ref else b.label,
            str(b.path),
            b.node.lineno if b.node else None,
            _public(trees, b, methods),
            calls_by_base.get(b, 0),
            tuple(dict.fromkeys(shown(s) for s in trees.subclasses.get(b, ()))),
        )
        for b in bases
    ]


def _public(trees: _Trees, base: Ref, methods: Sequence[str] | None) -> tuple[str, ...]:
    """The public methods a base defines or inherits from the trees (those ``methods`` names, if given)."""
    names: dict[str, None] = {}
    for ref in trees.mro(base):
        if ref.node is None or not trees.local(ref):
            continue
        for name, member in members(ref.node).items():
            if isinstance(member, str) or name.startswith("_") or (methods is not None and name not in methods):
                continue
            if not set(member.decorators) & NOT_METHODS:
                names.setdefault(name)
    return tuple(names)


def _order(f: Finding) -> tuple:
    return (f.file, f.line or 0, f.method, f.site_file, f.site_line or 0, f.kind)
