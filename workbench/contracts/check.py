"""Checking subclasses against their base: the base's public signatures and the calls it makes on itself.

A base class is a contract twice over. Callers outside it (a scheduler, a graph runner) call its public
methods the base's way; and the base's own methods call hooks on ``self`` (``self._replay_metadata(...,
in_capture=in_capture)``), private ones included, that a subclass may override. When an override cannot
take such a call, nothing fails until the device that picks the subclass runs it.

:func:`check` reads the targets from source (each file parsed once, nothing imported), finds every
subclass of the base (or, without a base, of every class the targets or search roots define), and reports
each break once per (class, method, call site), with the ``TypeError`` the call would raise.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from workbench.contracts.results import Contract, Finding, Report, display_path
from workbench.contracts.signatures import CallSite, Method, call_site_findings, signature_findings
from workbench.contracts.source import (
    NOT_METHODS,
    Ref,
    SourceIndex,
    SourceModule,
    _class_member,
    call_sites,
    calls_up,
    decorator_name,
    dotted_name,
    source_method,
)
from workbench.errors import WorkbenchError

DEFAULT_BASE = "workbench.backends:MetadataBackend"
"""The base the CLI checks against when neither ``--base`` nor a target is given."""
DEFAULT_TARGETS = ("workbench",)
"""What the CLI checks when no module or path is given: the whole workbench package."""

WORKBENCH_ROOT = Path(__file__).resolve().parents[1]
"""The installed ``workbench`` package: where bases of a user's file are looked up when the targets define none."""

Target = ModuleType | str | os.PathLike


class ContractError(WorkbenchError, ValueError):
    """A target or base class could not be found or read, or no subclass of the base was found."""


class NothingToCheck(ContractError):
    """The targets hold no subclass of the base (or, without a base, of any class they can reach)."""


# ----------------------------------------------------------------------------------------- the targets


def python_files(folder: Path) -> list[Path]:
    """The folder's modules; ``__main__.py`` and hidden or cache folders are left out."""
    files = (p.resolve() for p in folder.rglob("*.py") if p.name != "__main__.py")
    return sorted(p for p in files if not any(part.startswith((".", "__pycache__")) for part in p.parts))


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


# -------------------------------------------------------------------------------------------- the base


@dataclass
class _Contract:
    """A base class read from source: its resolution order, public methods and the calls it makes."""

    ref: Ref
    order: list[Ref]
    methods: dict[str, Method]
    sites: list[CallSite]
    site_methods: dict[tuple[str, str], Method | None]
    subclasses: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.ref.label

    def defines(self, ref: Ref) -> bool:
        """Whether ``ref`` is the base or one of its own ancestors (a method there is not an override)."""
        return ref in self.own

    def __post_init__(self) -> None:
        self.own = set(self.order)


def _first_definition(mro: list[Ref], name: str) -> tuple[Ref | None, Method | str | None]:
    for ref in mro:
        found = source_method(ref, name) if ref.node is not None else None
        if found is not None:
            return ref, found
    return None, None


def _public_methods(mro: list[Ref]) -> list[str]:
    names: list[str] = []
    for ref in mro:
        for statement in ref.node.body if ref.node is not None and ref.module != "builtins" else []:
            if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) or statement.name.startswith("_"):
                continue
            if not {decorator_name(d) for d in statement.decorator_list} & NOT_METHODS:
                names += [statement.name] if statement.name not in names else []
    return names


def _contract(ref: Ref, index: SourceIndex, methods: Sequence[str] | None, strict: bool) -> _Contract:
    mro = index.mro(ref)
    wanted = list(methods) if methods is not None else _public_methods(mro)
    sites = [s for s in call_sites(ref) if methods is None or s.name in methods]
    signatures: dict[str, Method] = {}
    for name in wanted:
        _, found = _first_definition(mro, name)
        if isinstance(found, Method):
            signatures[name] = found
        elif strict and not (methods is not None and any(s.name == name for s in sites)):
            raise ContractError(found or f"{ref.label} has no method {name!r}")
    site_methods: dict[tuple[str, str], Method | None] = {}
    for site in sites:
        key = (site.name, site.via)
        if key not in site_methods:
            _, found = _first_definition(mro[1:] if site.via == "super" else mro, site.name)
            site_methods[key] = found if isinstance(found, Method) else None
    return _Contract(ref, mro, signatures, sites, site_methods)


def _base_ref(base: type | str, index: SourceIndex, modules: list[SourceModule]) -> Ref:
    """The base's ``ClassDef``: from a class object's file, a ``pkg.mod:Class`` name, or a bare name."""
    if isinstance(base, type):
        label = f"{base.__module__}:{base.__qualname__}"
        file = None
        with suppress(TypeError):
            file = inspect.getsourcefile(base)
        ref = index.find_class(Path(file), base.__qualname__) if file else None
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


# ------------------------------------------------------------------------------------------- checking


def _reaches(mro: list[Ref], contract: _Contract, method: str) -> bool:
    """Whether the base's ``method`` still runs on this subclass: not overridden, or overrides call up."""
    for ref in mro:
        if ref.node is None:
            continue
        member = _class_member(ref.node, method)
        if member is None:
            continue
        if contract.defines(ref) or isinstance(member, str):
            return True
        if not calls_up(member, method):
            return False
    return True


def _check_class(ref: Ref, mro: list[Ref], at: int, contract: _Contract, report: Report) -> list[Finding]:
    findings: list[Finding] = []
    label = contract.label
    unknown = [r.name for r in mro[:at] if r.node is None and r.module != "builtins"]
    if unknown:
        report.notes.append(f"{ref.name}: cannot read {', '.join(unknown)}; methods defined there not checked")
    for name, signature in contract.methods.items():
        owner, found = _first_definition(mro[:at], name)
        if isinstance(found, str):
            report.notes.append(found)
        elif found is not None:
            findings += signature_findings(ref.name, name, signature, found, label)
    for site in contract.sites:
        search = mro[at + 1 :] if site.via == "super" else mro
        owner, found = _first_definition(search, site.name)
        if owner is None or contract.defines(owner):
            continue  # the base's own method runs
        if not _reaches(mro, contract, site.caller.rpartition(".")[2]):
            continue  # the subclass replaced the method that makes the call
        if isinstance(found, str):
            if "property" in found:
                report.notes.append(found)  # an assigned attribute (a class, a function) is no method to check
        elif found is not None:
            base_method = contract.site_methods[(site.name, site.via)]
            findings += call_site_findings(ref.name, site, found, base_method, label)
    # a signature finding that a call the base makes already shows (same method, same error) says less
    shown = {(f.method, f.message) for f in findings if f.site_file}
    return [f for f in findings if f.site_file or (f.method, f.message) not in shown]


def _discover(
    modules: list[SourceModule], index: SourceIndex, roots: list[Path]
) -> tuple[list[Ref], list[str], list[str]]:
    """Every class that a target class derives from and that the targets, their own packages or the search
    roots define (a library's classes on ``sys.path`` are not contracts here).

    Returns the bases, the bases found elsewhere or nowhere (``Class(module:Base ...)``, for the error
    message) and notes. A base missing from the targets' own package (the file is gone) is an error.
    """
    target_files = {m.path for m in modules}
    packages = {(m.dotted.partition(".")[0], dotted_name(m.path)[1]) for m in modules if "." in m.dotted}
    packages |= {(m.dotted, dotted_name(m.path)[1]) for m in modules if m.path.name == "__init__.py"}
    own_tops = {top for top, _ in packages}

    def local(path: Path | None) -> bool:
        if path is None:
            return False
        if path in target_files or any(path.is_relative_to(r) for r in roots):
            return True
        dotted, root = dotted_name(path)
        return (dotted.partition(".")[0], root) in packages

    bases: dict[Ref, None] = {}
    elsewhere: list[str] = []
    notes: list[str] = []
    for module in modules:
        for node in module.classes:
            ref = Ref(node.name, module.dotted, module.path, node)
            for parent in index.mro(ref)[1:]:
                if parent.node is not None and local(parent.path):
                    bases.setdefault(parent)
                    continue
                if parent.module == "builtins":
                    continue
                label = parent.label.replace("?:", "")
                if parent.path is not None:
                    elsewhere.append(f"{node.name}({label} in {display_path(str(parent.path))})")
                    continue
                elsewhere.append(f"{node.name}({label} not found)")
                if parent.module.startswith(".") or parent.module.partition(".")[0] in own_tops:
                    raise ContractError(
                        f"base class {label} of {node.name} ({display_path(str(module.path))}:{node.lineno}) not found"
                    )
                notes.append(f"{node.name}: base {label} not found (pass its root with --search-path); not checked")
    return list(bases), elsewhere, notes


def check(
    target: Target | Sequence[Target],
    base: type | str | None = None,
    methods: Sequence[str] | None = None,
    *,
    search_path: Sequence[str | os.PathLike] = (),
) -> Report:
    """Check every subclass of ``base`` found in ``target`` against what the base promises and calls.

    ``target``: a module object, a dotted module name (a package means all its files), a file or directory
    path, or a list of these; every file is read from source, none is imported. ``base``: a class,
    ``"pkg.mod:Class"``, a bare class name the targets import or define, or None: then every class that a
    target class derives from and that the targets or ``search_path`` define is a base. ``methods``: the
    methods to check (default: every public method of the base, and every method the base calls on
    itself, private ones included). ``search_path``: extra roots for resolving imports.

    Raises :class:`ContractError` for a target that does not exist or parse, a base that cannot be found,
    and a base with no subclass in the targets.
    """
    start = time.perf_counter()
    targets: list[Target] = list(target) if isinstance(target, (list, tuple)) else [target]  # type: ignore[list-item]
    roots = [Path(p).resolve() for p in search_path]
    for root in roots:
        if not root.is_dir():
            raise ContractError(f"--search-path {display_path(str(root))} is not a folder")
    index = SourceIndex(roots)
    files = list(dict.fromkeys(path for t in targets for path in _expand(t, index)))
    index.add_roots([dotted_name(p)[1] for p in files])  # a base named pkg.mod resolves as the targets import
    modules = [index.module(path) for path in files]
    broken = [f"{display_path(str(p))} ({index.errors[p]})" for p, m in zip(files, modules, strict=True) if m is None]
    if broken:
        raise ContractError(f"target file does not parse: {'; '.join(broken)}")
    parsed = [m for m in modules if m is not None]
    own = False  # the bases are the installed workbench's, not the targets'
    if base is not None:
        bases = [_base_ref(base, index, parsed)]
    else:
        bases, elsewhere, discovery_notes = _discover(parsed, index, roots)
        if not bases:  # a user's file on the workbench's own classes: check against those
            bases, _, discovery_notes = _discover(parsed, index, [*roots, WORKBENCH_ROOT])
            own = bool(bases)
            if bases:
                names = ", ".join(dict.fromkeys(ref.label for ref in bases))
                discovery_notes.append(f"no base class in the targets: checked against the workbench's own {names}")
        if not bases:
            hint = f"; found elsewhere or not at all: {', '.join(dict.fromkeys(elsewhere))}" if elsewhere else ""
            raise NothingToCheck(
                "no class in the targets derives from a class defined in the targets or on the search path"
                f"{hint}; pass the base's root with --search-path DIR, or --base pkg.mod:Class"
            )
    contracts = [_contract(ref, index, methods, strict=base is not None) for ref in bases]
    if base is None and methods is not None:  # with --base, _contract already refused a name the base lacks
        for name in methods:
            if not any(name in c.methods or any(s.name == name for s in c.sites) for c in contracts):
                names = ", ".join(c.label for c in contracts)
                raise ContractError(f"--method {name!r}: no base class found ({names}) defines or calls it")
    if base is None:
        label = "the workbench's own base classes" if own else "every base class in the targets"
    else:
        label = base if isinstance(base, str) and ":" in base else contracts[0].label
    report = Report(label)
    report.files = [str(p) for p in files]
    report.notes += discovery_notes if base is None else []
    seen: set[tuple[str | int | None, ...]] = set()
    for module in parsed:
        for node in module.classes:
            ref = Ref(node.name, module.dotted, module.path, node)
            mro = index.mro(ref)
            for contract in contracts:
                at = next((i for i, r in enumerate(mro) if r == contract.ref), None)
                if not at:
                    continue
                contract.subclasses.append(ref.name)
                for finding in _check_class(ref, mro, at, contract, report):
                    key: tuple[str | int | None, ...] = (finding.file, finding.cls, finding.method)
                    key += (finding.site_file, finding.site_line, finding.kind, finding.param, finding.message)
                    if key not in seen:
                        seen.add(key)
                        report.findings.append(finding)
    if base is not None and not contracts[0].subclasses:
        where = ", ".join(display_path(str(t)) if not isinstance(t, ModuleType) else t.__name__ for t in targets)
        raise NothingToCheck(f"no subclass of {contracts[0].label} found in {where}")
    report.notes = list(dict.fromkeys(report.notes))
    report.contracts = [
        Contract(
            c.label,
            str(c.ref.path),
            c.ref.node.lineno if c.ref.node else None,
            tuple(c.methods),
            len(c.sites),
            tuple(c.subclasses),
        )  # fmt: skip
        for c in contracts
        if c.subclasses and (base is not None or c.methods or c.sites)
    ]
    report.seconds = time.perf_counter() - start
    return report
