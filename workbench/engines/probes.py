"""Capability probes: what an adapter needs of the engine, checked on the imported engine before it is used.

An engine is judged by what it can do, not by its version string (a clone of main reports
``0.5.24.dev12+g1a2b3c4``; a nightly ``0.26.1rc1.dev693+g7f7a32cfe``). Each adapter lists its
:class:`Probe` objects: a hook's parameters (:func:`takes`), a class's attributes (:func:`has`), the fields a
metadata dataclass must have (:func:`fields`), a function a module must offer, the runtime-config leaves the
imported backend files read (:func:`config_leaves`). :func:`run_probes` runs them in order and raises
:class:`~workbench.engines.versions.EngineError` in one line naming the first one that fails and what is missing,
so a checkout the adapter cannot drive says why before any batch runs.

    >>> import dataclasses
    >>> @dataclasses.dataclass
    ... class Meta:
    ...     state_indices: list
    >>> def hook(forward_batch, in_capture=False): ...
    >>> run_probes("engine 1.0", [Probe("hook takes in_capture", takes(hook, "in_capture")),
    ...                           Probe("Meta fields", fields(Meta, "state_indices"))])
    2
    >>> try:
    ...     run_probes("engine 1.1", [Probe("Meta fields", fields(Meta, "state_indices", "query_start_loc"))])
    ... except EngineError as e:
    ...     print(e)
    engine 1.1: probe 'Meta fields' failed: no field query_start_loc (has state_indices)

Nothing here imports torch or an engine: the adapters hand in what they imported.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from workbench.engines.errors import EngineError

Check = Callable[[], "str | None"]
"""A probe's test: None when it holds, else one phrase saying what is missing."""


@dataclass(frozen=True)
class Probe:
    """One capability an adapter needs: ``name`` says it (``"GDNAttnBackend.init_forward_metadata_out_graph
    takes in_capture"``), ``check`` tests it."""

    name: str
    check: Check


def _name(obj: Any) -> str:
    """A class's or module's name; a function's qualified name (``GDNAttnBackend.init_forward_metadata``)."""
    if isinstance(obj, type | types.ModuleType):
        return obj.__name__
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__name__


def takes(func: Any, *params: str) -> Check:
    """``func`` (a function, method or class: its ``__init__``) accepts each of ``params`` by name."""

    def check() -> str | None:
        try:
            sig = inspect.signature(func)
        except (TypeError, ValueError) as e:
            return f"{_name(func)} has no signature ({e})"
        names = [p.name for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        missing = [p for p in params if p not in names]
        if missing:
            return f"{_name(func)}({', '.join(names)}) has no parameter {', '.join(missing)}"
        return None

    return check


def has(obj: Any, *names: str) -> Check:
    """``obj`` (a class or module) has each attribute of ``names``."""

    def check() -> str | None:
        missing = [n for n in names if not hasattr(obj, n)]
        return f"{_name(obj)} has no {', '.join(missing)}" if missing else None

    return check


def fields(cls: type, *names: str) -> Check:
    """``cls`` is a dataclass with each field of ``names``."""

    def check() -> str | None:
        if not dataclasses.is_dataclass(cls):
            return f"{_name(cls)} is not a dataclass"
        have = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in have]
        if missing:
            shown = ", ".join(have) if len(have) <= 6 else f"{len(have)} others"
            return f"no field {', '.join(missing)} (has {shown})"
        return None

    return check


def required_fields(cls: type, given: Iterable[str]) -> Check:
    """Every field of dataclass ``cls`` without a default is among ``given`` (what the adapter passes)."""

    def check() -> str | None:
        if not dataclasses.is_dataclass(cls):
            return f"{_name(cls)} is not a dataclass"
        none = dataclasses.MISSING
        need = [f.name for f in dataclasses.fields(cls) if f.default is none and f.default_factory is none]
        missing = [n for n in need if n not in set(given)]
        return f"{_name(cls)} requires {', '.join(missing)}, which the adapter does not pass" if missing else None

    return check


def _chains(tree: ast.AST, getters: set[str]) -> set[tuple[str, ...]]:
    """The attribute chains read off a call of one of ``getters`` in ``tree``, longest only:
    ``get_exec().mamba.mamba_track_interval`` is ``("get_exec", "mamba", "mamba_track_interval")``."""
    chains: set[tuple[str, ...]] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        path: list[str] = []
        cur: ast.expr = node
        while isinstance(cur, ast.Attribute):
            path.append(cur.attr)
            cur = cur.value
        if isinstance(cur, ast.Call) and isinstance(cur.func, ast.Name) and cur.func.id in getters:
            chains.add((cur.func.id, *reversed(path)))
    return {c for c in chains if not any(o != c and o[: len(c)] == c for o in chains)}


def _callees(tree: ast.AST) -> tuple[set[str], set[str]]:
    """The names ``tree`` calls as ``self.name(...)`` / ``super().name(...)`` and as bare ``name(...)``."""
    methods, plain = set(), set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name):
            plain.add(f.id)
        elif isinstance(f, ast.Attribute) and (
            (isinstance(f.value, ast.Name) and f.value.id in ("self", "cls"))
            or (isinstance(f.value, ast.Call) and isinstance(f.value.func, ast.Name) and f.value.func.id == "super")
        ):
            methods.add(f.attr)
    return methods, plain


def _source_tree(func: Any) -> ast.AST | None:
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return None


def config_reads(
    roots: Iterable[tuple[type, Iterable[str]]], getters: Iterable[str], package: str
) -> dict[tuple[str, ...], str]:
    """The runtime-config chains the code reached from ``roots`` reads (chain -> the function that reads it):
    each ``(class, method names)``'s methods as the class resolves them, then what they call, followed through
    ``self.x()`` / ``super().x()`` (every definition in the class's MRO) and bare calls of functions of
    ``package``'s modules. Only code the adapter drives counts: a config read in a path it never enters (a
    server-args default, a kernel choice) is no capability it needs."""
    wanted = set(getters)
    found: dict[tuple[str, ...], str] = {}
    seen: set[Any] = set()
    queue: list[tuple[type, Any]] = []
    classes = []
    for cls, names in roots:
        classes.append(cls)
        queue += [(cls, getattr(cls, n)) for n in names if callable(getattr(cls, n, None))]
    while queue:
        cls, func = queue.pop()
        func = getattr(func, "__func__", func)
        code = getattr(func, "__code__", None)
        if code is None or code in seen or not str(getattr(func, "__module__", "")).startswith(package):
            continue
        seen.add(code)
        tree = _source_tree(func)
        if tree is None:
            continue
        for chain in _chains(tree, wanted):
            found.setdefault(chain, f"{func.__module__}.{func.__qualname__}")
        methods, plain = _callees(tree)
        for name in methods:
            queue += [(cls, vars(k)[name]) for k in cls.__mro__ if name in vars(k)]
        glob = getattr(func, "__globals__", {})
        queue += [(cls, glob[name]) for name in plain if inspect.isfunction(glob.get(name))]
    return found


def config_leaves(
    roots: Iterable[tuple[type, Iterable[str]]], getters: Iterable[str], leaves: Mapping[str, Any], package: str
) -> Check:
    """Every runtime-config chain the code reached from ``roots`` reads (:func:`config_reads`) resolves in
    ``leaves`` (``{"get_exec()": {"mamba": {...}}}``: what the adapter's stand-in config answers)."""
    roots, names = list(roots), tuple(getters)

    def check() -> str | None:
        missing = []
        for chain, where in sorted(config_reads(roots, names, package).items()):
            node: Any = leaves.get(f"{chain[0]}()")
            for part in chain[1:]:
                if not isinstance(node, Mapping) or part not in node:
                    missing.append(f"{chain[0]}().{'.'.join(chain[1:])} (in {where})")
                    break
                node = node[part]
        return (
            f"the backend reads config leaves the adapter does not stand in: {', '.join(missing)}" if missing else None
        )

    return check


def run_probes(label: str, probes: Iterable[Probe]) -> int:
    """Run ``probes`` in order; the number run, or :class:`EngineError` ``"<label>: probe '<name>' failed:
    <what>"`` at the first that fails (``label``: the engine and its version)."""
    n = 0
    for probe in probes:
        try:
            missing = probe.check()
        except Exception as e:  # noqa: BLE001 -- a probe that cannot even look is a failed probe
            missing = f"{type(e).__name__}: {e}"
        if missing:
            raise EngineError(f"{label}: probe {probe.name!r} failed: {missing}")
        n += 1
    return n


__all__ = [
    "Check",
    "Probe",
    "config_leaves",
    "config_reads",
    "fields",
    "has",
    "required_fields",
    "run_probes",
    "takes",
]
