"""Our npu backend against the real torch_npu, without importing it.

The torch_npu wheel matching the installed torch is downloaded once (``pip download --no-deps``) into
``~/.cache/linattn-workbench/wheels`` and read as a zip: every ``torch.npu`` name that
workbench/graphs/npu.py uses -- read off npu.py's own syntax tree, with the positional count and the
keywords of each call -- must exist there with a signature that accepts that call, and so must the methods
listed in ``npu.TORCH_NPU_METHODS``. Skips only when the registry cannot be reached.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from workbench.graphs import npu as npu_mod

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "linattn-workbench" / "wheels"
# torch_npu's Python files are the same in every platform's wheel; these are the ones published.
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux2014_x86_64", "manylinux_2_28_aarch64", "manylinux2014_aarch64")
NETWORK_ERRORS = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "Network is unreachable",
    "No route to host",
    "Connection refused",
    "ProxyError",
    "Max retries exceeded",
)
NPU_ALIAS = "npu"  # the local name npu.py gives torch.npu


def _torch_release() -> tuple[str, str]:
    """("2.13.0", "2.13") for torch 2.13.0+cpu."""
    release = re.match(r"\d+\.\d+\.\d+", torch.__version__)
    assert release, torch.__version__
    return release.group(0), release.group(0).rsplit(".", 1)[0]


def _cached(pattern: str) -> Path | None:
    found = sorted(CACHE.glob(pattern))
    return found[-1] if found else None


def _download(spec: str) -> tuple[bool, str]:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check"]
    cmd += [
        "--retries",
        "2",
        "--timeout",
        "30",
        "-d",
        str(CACHE),
        "--python-version",
        f"{sys.version_info[0]}{sys.version_info[1]}",
    ]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    done = subprocess.run([*cmd, spec], capture_output=True, text=True, timeout=900)
    return done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def wheel() -> zipfile.ZipFile:
    """The torch_npu wheel for this torch: the same release, else the newest of the same minor."""
    exact, minor = _torch_release()
    CACHE.mkdir(parents=True, exist_ok=True)
    path = _cached(f"torch_npu-{exact}-*.whl") or _cached(f"torch_npu-{exact}.post*-*.whl")
    logs = []
    for spec in (f"torch_npu=={exact}", f"torch_npu=={minor}.*"):
        if path is not None:
            break
        ok, log = _download(spec)
        path = _cached(f"torch_npu-{exact}*-*.whl") or _cached(f"torch_npu-{minor}.*-*.whl")
        if ok and path is not None:
            break
        network = [line.strip() for line in log.splitlines() if any(m in line for m in NETWORK_ERRORS)]
        if network:
            pytest.skip(f"the package registry cannot be reached (pip download {spec}): {network[0][:300]}")
        logs.append(f"$ pip download {spec}\n{log}")
    if path is None:
        pytest.fail(f"no torch_npu wheel for torch {torch.__version__}:\n" + "\n".join(logs))
    return zipfile.ZipFile(path)


# --- what npu.py uses ----------------------------------------------------------------------------------


@dataclass
class Use:
    """One use of ``torch.npu.<name>`` in npu.py."""

    name: str
    line: int
    positional: int | None = None  # None: referenced, not called
    keywords: tuple[str, ...] = ()
    as_context: bool = False


@dataclass
class Uses:
    names: list[Use] = field(default_factory=list)
    method_calls: set[str] = field(default_factory=set)


def _npu_uses() -> Uses:
    tree = ast.parse(Path(npu_mod.__file__).read_text())
    with_calls = {id(item.context_expr) for node in ast.walk(tree) if isinstance(node, ast.With) for item in node.items}
    uses = Uses()
    called: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        f = node.func
        if isinstance(f.value, ast.Name) and f.value.id == NPU_ALIAS:
            assert not any(isinstance(a, ast.Starred) for a in node.args), f"npu.py:{node.lineno}: *args hide the call"
            assert all(k.arg is not None for k in node.keywords), f"npu.py:{node.lineno}: **kwargs hide the call"
            kws = tuple(k.arg for k in node.keywords if k.arg is not None)
            uses.names.append(Use(f.attr, node.lineno, len(node.args), kws, id(node) in with_calls))
            called.add(id(f))
        else:
            uses.method_calls.add(f.attr)
    for node in ast.walk(tree):
        is_ref = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == NPU_ALIAS
        if is_ref and id(node) not in called:
            uses.names.append(Use(node.attr, node.lineno))
    return uses


def test_npu_uses_are_read_off_the_source() -> None:
    names = {u.name for u in _npu_uses().names}
    # If these vanish, npu.py stopped going through the alias and the check below would prove nothing.
    assert {"NPUGraph", "graph", "graph_pool_handle", "Stream", "is_available"} <= names


# --- reading the wheel ----------------------------------------------------------------------------------


def _top_level(stmts: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements, looking into if/try/with blocks (not into functions or classes)."""
    for s in stmts:
        yield s
        if isinstance(s, ast.If | ast.With):
            yield from _top_level(s.body)
            yield from _top_level(getattr(s, "orelse", []))
        elif isinstance(s, ast.Try):
            for block in (s.body, s.orelse, s.finalbody, *[h.body for h in s.handlers]):
                yield from _top_level(block)


class WheelSource:
    """Python modules of a wheel, parsed on demand, and where a name they export is defined."""

    def __init__(self, wheel: zipfile.ZipFile) -> None:
        self.wheel = wheel
        self.files = set(wheel.namelist())
        self._trees: dict[str, ast.Module] = {}

    def file(self, module: str) -> str | None:
        base = module.replace(".", "/")
        for cand in (base + ".py", base + "/__init__.py"):
            if cand in self.files:
                return cand
        return None

    def tree(self, module: str) -> ast.Module:
        if module not in self._trees:
            self._trees[module] = ast.parse(self.wheel.read(self.file(module)).decode())
        return self._trees[module]

    def _absolute(self, module: str, target: str | None, level: int) -> str:
        if level == 0:
            return target or ""
        package = module if (self.file(module) or "").endswith("__init__.py") else module.rsplit(".", 1)[0]
        for _ in range(level - 1):
            package = package.rsplit(".", 1)[0]
        return f"{package}.{target}" if target else package

    def resolve(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.AST] | None:
        """(module, defining node) of ``module.name``: a def, a class or an assignment, following imports."""
        if depth > 8 or self.file(module) is None:
            return None
        stars = []
        for s in _top_level(self.tree(module).body):
            if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and s.name == name:
                return module, s
            if isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in s.targets):
                return module, s
            if isinstance(s, ast.ImportFrom):
                src = self._absolute(module, s.module, s.level)
                for alias in s.names:
                    if alias.name == "*":
                        stars.append(src)
                    elif (alias.asname or alias.name) == name:
                        return self.resolve(src, alias.name, depth + 1) or (
                            (f"{src}.{alias.name}", s) if self.file(f"{src}.{alias.name}") else None
                        )
        for src in stars:
            found = self.resolve(src, name, depth + 1)
            if found:
                return found
        return None


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == name), None)


def _accepts(fn: ast.FunctionDef, positional: int, keywords: tuple[str, ...], bound: bool) -> str | None:
    """Why a call with ``positional`` args and ``keywords`` does not bind to ``fn`` (None if it does)."""
    a = fn.args
    pos = [x.arg for x in a.posonlyargs + a.args]
    n_posonly = len(a.posonlyargs)
    defaults = len(a.defaults)
    if bound:  # self / cls
        pos, n_posonly = pos[1:], max(n_posonly - 1, 0)
    if positional > len(pos) and a.vararg is None:
        return f"takes {len(pos)} positional arguments, we pass {positional}"
    kw_ok = set(pos[n_posonly:]) | {x.arg for x in a.kwonlyargs}
    for kw in keywords:
        if kw not in kw_ok and a.kwarg is None:
            return f"has no keyword argument {kw!r} (it takes {sorted(kw_ok)})"
        if kw in pos[:positional]:
            return f"gets {kw!r} twice"
    required = pos[: len(pos) - defaults] if defaults else pos
    missing = [p for p in required[positional:] if p not in keywords]
    missing += [x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is None and x.arg not in keywords]
    return f"needs {missing}" if missing else None


def _check_call(node: ast.AST, use: Use) -> list[str]:
    if use.positional is None:
        return []
    if isinstance(node, ast.FunctionDef):
        targets = [(node, False)]
    elif isinstance(node, ast.ClassDef):
        targets = [(m, True) for m in (_method(node, "__new__"), _method(node, "__init__")) if m is not None]
        if not targets:
            return [f"class {node.name} defines neither __new__ nor __init__ in Python: cannot check the call"]
        if use.as_context and not (_method(node, "__enter__") and _method(node, "__exit__")):
            return [f"class {node.name} is used in `with` but is no context manager"]
    else:
        return [f"defined as {type(node).__name__}, not a def or class: cannot check the call"]
    errors = []
    for fn, bound in targets:
        why = _accepts(fn, use.positional, use.keywords, bound)
        if why:
            errors.append(f"{fn.name} {why}")
    return errors


@pytest.mark.network  # downloads the torch_npu wheel (skipped, saying so, when offline)
def test_wheel_registers_torch_npu_as_torch_npu_module(wheel: zipfile.ZipFile) -> None:
    pattern = re.compile(r"_register_device_module\(\s*[\"']npu[\"']\s*,\s*torch_npu\.npu\s*\)")
    hits = [n for n in wheel.namelist() if n.endswith(".py") and pattern.search(wheel.read(n).decode(errors="replace"))]
    assert hits, "torch_npu no longer registers torch_npu.npu as torch.npu"


@pytest.mark.network  # downloads the torch_npu wheel (skipped, saying so, when offline)
def test_every_torch_npu_name_we_use_exists_with_a_compatible_signature(wheel: zipfile.ZipFile) -> None:
    src = WheelSource(wheel)
    problems = []
    for use in _npu_uses().names:
        found = src.resolve("torch_npu.npu", use.name)
        if found is None:
            problems.append(f"npu.py:{use.line}: torch.npu.{use.name} does not exist in {wheel.filename}")
            continue
        module, node = found
        problems += [f"npu.py:{use.line}: torch.npu.{use.name} ({module}): {e}" for e in _check_call(node, use)]
    assert not problems, "\n".join(problems)


@pytest.mark.network  # downloads the torch_npu wheel (skipped, saying so, when offline)
def test_every_method_we_call_exists(wheel: zipfile.ZipFile) -> None:
    src = WheelSource(wheel)
    method_calls = _npu_uses().method_calls
    problems = []
    for cls_name, methods in npu_mod.TORCH_NPU_METHODS.items():
        found = src.resolve("torch_npu.npu", cls_name)
        if found is None or not isinstance(found[1], ast.ClassDef):
            problems.append(f"torch.npu.{cls_name} is no class in {wheel.filename}")
            continue
        for meth, n_pos in methods.items():
            assert meth in method_calls, f"TORCH_NPU_METHODS lists {cls_name}.{meth}, which npu.py never calls"
            fn = _method(found[1], meth)
            if fn is None:
                problems.append(f"torch.npu.{cls_name}.{meth} is not defined ({found[0]})")
            elif why := _accepts(fn, n_pos, (), bound=True):
                problems.append(f"torch.npu.{cls_name}.{meth} {why}")
    assert not problems, "\n".join(problems)


@pytest.mark.network  # downloads the torch_npu wheel (skipped, saying so, when offline)
def test_wheel_version_matches_torch(wheel: zipfile.ZipFile) -> None:
    exact, minor = _torch_release()
    version = Path(wheel.filename).name.split("-")[1]
    assert version.startswith(minor), f"torch {torch.__version__} but torch_npu {version}"


def test_host_input_update_needs_auto_dispatch_capture(wheel: zipfile.ZipFile) -> None:
    """What workbench/graphs/npu.py and backends/npu.py say they do not use exists as they describe it:
    ``NPUGraph.update(cpu_update_input)`` works only for a capture with ``graph(auto_dispatch_capture=True)``
    (and refuses otherwise). If torch_npu changes this, those docstrings must change too."""
    src = WheelSource(wheel)
    graph_cls = src.resolve("torch_npu.npu", "NPUGraph")
    ctx_cls = src.resolve("torch_npu.npu", "graph")
    assert graph_cls and isinstance(graph_cls[1], ast.ClassDef) and ctx_cls and isinstance(ctx_cls[1], ast.ClassDef)
    update = _method(graph_cls[1], "update")
    assert update is not None and _accepts(update, 1, (), bound=True) is None
    assert [a.arg for a in update.args.args][1:] == ["cpu_update_input"]
    refuses = [
        n
        for n in ast.walk(update)
        if isinstance(n, ast.If) and "auto_dispatch_capture" in ast.unparse(n.test) and "not" in ast.unparse(n.test)
    ]
    assert refuses, "NPUGraph.update no longer checks auto_dispatch_capture"
    init = _method(ctx_cls[1], "__init__")
    assert init is not None and _accepts(init, 1, ("auto_dispatch_capture",), bound=True) is None
    # and npu.py indeed captures without it, and never calls update
    uses = _npu_uses()
    assert all("auto_dispatch_capture" not in u.keywords for u in uses.names)
    assert "update" not in uses.method_calls
