"""Mutation benchmark: how many deliberate bugs do the focused tests of each core module catch?

    .venv/bin/python benchmarks/mutation.py [--module NAME] [--max-mutants N] [--seed S] [--json PATH] [--list]

For each target (a few source files and the fast test selection that is meant to guard them, both in
:data:`TARGETS`) it writes mutants with the ``ast`` module, one small change each:

- a comparison operator swapped (``<`` to ``<=`` and ``>=``, ``==`` to ``!=``, ``is`` to ``is not``, ``in``
  to ``not in``, ...);
- ``+`` and ``-`` swapped (also ``+=`` / ``-=``);
- an int constant off by one (``n`` to ``n + 1``);
- ``and`` / ``or`` swapped; ``True`` / ``False`` swapped;
- a condition negated (``if x`` to ``if not (x)``; ``while``, ``... if ... else ...``, comprehension filters);
- a statement deleted (``return``, ``raise``, a call such as ``xs.append(...)``, ``continue``, ``break``,
  ``+=``), replaced by ``pass``.

Docstrings, f-strings, annotations and ``_repr_html_`` (HTML rendering, tested elsewhere) are left alone.
Each mutant is applied in a private copy of the repository (``workbench/``, ``kernels/``, ``tests/``,
``conftest.py``, ``pyproject.toml``, ``docs/`` under a temporary folder; the shared tree is never written)
and the target's selection runs there with ``-x -q -p no:cacheprovider`` under a per-mutant timeout. The
first run of each selection, unmutated, is the baseline: it must pass, and it checks that the modules were
imported from the copy and not from the editable install. A mutant is *killed* when the selection fails
(or cannot import), *survives* when it passes, and *times out* past ``--timeout`` (default: four times the
baseline, at least 20 s); a run that ends otherwise than pass or fail (no test collected, a usage error) is an
*error*, left out of the rate. Kill rate = (killed + timeout) / (mutants - error).

By default a fork server runs the selections: the parent imports torch, numpy, pytest and hypothesis once
and each mutant's pytest runs in a forked child (``--no-fork``: a fresh ``python -m pytest`` per mutant,
a few seconds slower each). ``--max-mutants N`` samples N mutants per target, deterministically
(``--seed``); ``--match TEXT`` keeps the mutants whose ``FILE:LINE:COL:KIND:CHANGE`` contains it (to rerun
survivors); ``--tests NODE ...`` runs another selection against one ``--module``; ``--jobs N`` runs N mutants
at once, each in its own copy. Not part of ``make test``: a benchmark (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "workbench.mutation/1"
COPIED = ("workbench", "kernels", "tests", "docs", "conftest.py", "pyproject.toml")
IGNORED = ("__pycache__", "*.egg-info", ".hypothesis", ".pytest_cache", "screenshots", ".mypy_cache")
PYTEST_ARGS = ("-x", "-q", "-p", "no:cacheprovider", "--no-header", "-o", "addopts=", "--doctest-modules")
# the fork server imported hypothesis before pytest could mark its plugin module for rewriting
FORK_PYTEST_ARGS = ("-W", "ignore::pytest.PytestAssertRewriteWarning")
PROBE = "_mutation_probe"  # a pytest plugin written into the copy (PROBE_SOURCE)
PREIMPORT = ("torch", "numpy", "pytest", "_pytest.python", "hypothesis", "triton", "triton.language")
SKIP_FUNCTIONS = ("_repr_html_",)


@dataclass(frozen=True)
class Target:
    """Source files under test and the fast focused selection (pytest node ids or files) that guards them."""

    files: tuple[str, ...]
    tests: tuple[str, ...]
    what: str


TARGETS: dict[str, Target] = {
    "metadata": Target(
        files=("workbench/metadata/build.py", "workbench/metadata/padding.py", "workbench/metadata/invariants.py"),
        tests=(
            "tests/test_metadata_focused.py",
            "tests/test_padding_rule.py",
            "tests/test_metadata.py",
            "tests/test_metadata_properties.py",
            "workbench/metadata/padding.py",
        ),
        what="the eager build, the padding rule's writers, validate",
    ),
    "integrity": Target(
        files=("workbench/measure/integrity.py",),
        tests=("tests/test_integrity.py",),
        what='"nothing lost": changed slots, the pre-filter, the report',
    ),
    "padding-rule": Target(
        files=("kernels/padding.py", "kernels/conventions.py"),
        tests=(
            "tests/kernels/test_padding_conventions.py",
            "kernels/conventions.py",
            "tests/test_metadata.py::test_profile_conventions",
            "tests/kernels/test_linear_attn.py::test_out_of_pool_slot_is_an_index_error_in_the_reference",
            "tests/kernels/test_mamba2.py::test_out_of_pool_slot_is_an_index_error_in_the_reference",
        ),
        what="the kernels' skip rule and the engines' conventions",
    ),
    "replay": Target(
        files=("workbench/traces/replay.py",),
        tests=("tests/traces/test_replay_focused.py",),
        what="a trace's steps through the runner beside the float64 shadow; recorded metadata checked",
    ),
}


# -- mutants ------------------------------------------------------------------------------------------------
COMPARE_SWAPS: dict[type[ast.cmpop], tuple[type[ast.cmpop], ...]] = {
    ast.Lt: (ast.LtE, ast.GtE),
    ast.LtE: (ast.Lt, ast.Gt),
    ast.Gt: (ast.GtE, ast.LtE),
    ast.GtE: (ast.Gt, ast.Lt),
    ast.Eq: (ast.NotEq,),
    ast.NotEq: (ast.Eq,),
    ast.Is: (ast.IsNot,),
    ast.IsNot: (ast.Is,),
    ast.In: (ast.NotIn,),
    ast.NotIn: (ast.In,),
}
BIN_SWAPS: dict[type[ast.operator], type[ast.operator]] = {ast.Add: ast.Sub, ast.Sub: ast.Add}


@dataclass(frozen=True)
class Mutant:
    """One change to one file: the bytes ``[start, end)`` of the source replaced by ``text``."""

    target: str
    file: str
    line: int
    col: int
    kind: str
    change: str
    start: int
    end: int
    text: str

    @property
    def key(self) -> str:
        return f"{self.file}:{self.line}:{self.col}:{self.kind}:{self.change}"

    def apply(self, source: bytes) -> bytes:
        return source[: self.start] + self.text.encode() + source[self.end :]


def _short(code: str, limit: int = 70) -> str:
    code = " ".join(code.split())
    return code if len(code) <= limit else code[: limit - 3] + "..."


class _Sites:
    """Walks one module and yields (node, kind, replacement text, description) for every mutation."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.skip: set[int] = set()  # ids of nodes (and their subtrees) never mutated
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Module):
                body = node.body
                if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                    self._skip_tree(body[0])  # the docstring
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    if node.name in SKIP_FUNCTIONS:
                        self._skip_tree(node)
                    if node.returns is not None:
                        self._skip_tree(node.returns)
                    for dec in node.decorator_list:
                        self._skip_tree(dec)
            elif isinstance(node, ast.JoinedStr):  # f-strings: positions inside are not reliable (3.11)
                self._skip_tree(node)
            elif isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
                self._skip_tree(node.annotation)
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                self._skip_tree(node)

    def _skip_tree(self, node: ast.AST) -> None:
        self.skip.update(id(n) for n in ast.walk(node))

    def __iter__(self) -> Iterator[tuple[ast.AST, str, str, str]]:
        for node in ast.walk(self.tree):
            if id(node) in self.skip or not hasattr(node, "lineno"):
                continue
            yield from self._expression(node)
            yield from self._statement(node)

    def _expression(self, node: ast.AST) -> Iterator[tuple[ast.AST, str, str, str]]:
        before = ast.unparse(node)
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                for new in COMPARE_SWAPS.get(type(op), ()):
                    ops = [*node.ops]
                    ops[i] = new()
                    after = ast.unparse(ast.Compare(node.left, ops, node.comparators))
                    yield node, "compare", f"({after})", f"{_short(before)}  ->  {_short(after)}"
        elif isinstance(node, ast.BinOp) and type(node.op) in BIN_SWAPS and not _stringy(node):
            after = ast.unparse(ast.BinOp(node.left, BIN_SWAPS[type(node.op)](), node.right))
            yield node, "arith", f"({after})", f"{_short(before)}  ->  {_short(after)}"
        elif isinstance(node, ast.BoolOp):
            after = ast.unparse(ast.BoolOp(ast.Or() if isinstance(node.op, ast.And) else ast.And(), node.values))
            yield node, "boolop", f"({after})", f"{_short(before)}  ->  {_short(after)}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            yield node, "bool", repr(not node.value), f"{node.value}  ->  {not node.value}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, int):
            yield node, "constant", repr(node.value + 1), f"{node.value}  ->  {node.value + 1}"
        for test in _conditions(node):
            if id(test) in self.skip:
                continue
            text = ast.unparse(test)
            yield test, "negate", f"(not ({text}))", f"{_short(text)}  ->  not ({_short(text, 60)})"

    def _statement(self, node: ast.AST) -> Iterator[tuple[ast.AST, str, str, str]]:
        deletable = (
            isinstance(node, ast.Raise | ast.Continue | ast.Break | ast.AugAssign)
            or (isinstance(node, ast.Return) and node.value is not None)
            or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call))
        )
        if isinstance(node, ast.AugAssign) and type(node.op) in BIN_SWAPS:
            swapped = ast.unparse(ast.AugAssign(node.target, BIN_SWAPS[type(node.op)](), node.value))
            yield node, "arith", swapped, f"{_short(ast.unparse(node))}  ->  {_short(swapped)}"
        if deletable:
            yield node, "delete", "pass", f"{_short(ast.unparse(node))}  ->  pass"


def _is_type_checking(test: ast.expr) -> bool:
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"


def _stringy(node: ast.BinOp) -> bool:
    """String concatenation: a swap to ``-`` only raises TypeError; not a meaningful mutant."""
    sides = (node.left, node.right)
    return any(
        isinstance(s, ast.JoinedStr) or (isinstance(s, ast.Constant) and isinstance(s.value, str)) for s in sides
    )


def _conditions(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.If | ast.While | ast.IfExp):
        return [node.test]
    if isinstance(node, ast.comprehension):
        return list(node.ifs)
    return []


def _offsets(source: bytes) -> list[int]:
    """Byte offset of the start of each line (1-based line numbers index it directly)."""
    starts = [0, 0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def mutants_of(target: str, file: str, root: Path = ROOT) -> list[Mutant]:
    """Every mutant of ``file`` (relative to ``root``), in source order; ones that do not compile or change
    nothing are dropped, and two mutants giving the same module keep the first."""
    source = (root / file).read_bytes()
    tree = ast.parse(source, filename=file)
    original = ast.dump(tree)
    lines = _offsets(source)
    seen = {original}
    out: list[Mutant] = []
    for node, kind, text, change in _Sites(tree):
        start = lines[node.lineno] + node.col_offset  # type: ignore[attr-defined]
        end = lines[node.end_lineno] + node.end_col_offset  # type: ignore[attr-defined]
        m = Mutant(target, file, node.lineno, node.col_offset, kind, change, start, end, text)  # type: ignore[attr-defined]
        try:
            dumped = ast.dump(ast.parse(m.apply(source), filename=file))
        except SyntaxError:
            continue
        if dumped in seen:
            continue
        seen.add(dumped)
        out.append(m)
    out.sort(key=lambda m: (m.line, m.col, m.start))
    return out


def select(mutants: list[Mutant], max_mutants: int | None, seed: int) -> list[Mutant]:
    """All, or a deterministic sample of ``max_mutants`` (by ``seed``), kept in source order."""
    if max_mutants is None or len(mutants) <= max_mutants:
        return mutants
    keep = set(random.Random(seed).sample(range(len(mutants)), max_mutants))
    return [m for i, m in enumerate(mutants) if i in keep]


# -- running ------------------------------------------------------------------------------------------------
PROBE_SOURCE = '''"""Written by benchmarks/mutation.py into its private copy: where the target modules came from."""
import json
import os
import sys


def pytest_configure(config):
    try:
        import hypothesis

        hypothesis.settings.register_profile("mutation", derandomize=True, database=None)
        hypothesis.settings.load_profile("mutation")
    except ImportError:
        pass


def pytest_unconfigure(config):
    out = os.environ.get("MUTATION_PROBE_OUT")
    if not out:
        return
    names = json.loads(os.environ["MUTATION_PROBE_MODULES"])
    found = {n: getattr(sys.modules.get(n), "__file__", None) for n in names}
    with open(out, "w") as f:
        json.dump(found, f)
'''


def _module_name(file: str) -> str:
    return file.removesuffix(".py").replace("/", ".").removesuffix(".__init__")


class Sandbox:
    """A private copy of the repository: the only place mutants are ever written."""

    def __init__(self, base: Path, index: int) -> None:
        self.dir = (base / f"copy{index}").resolve()
        self.dir.mkdir(parents=True)
        for name in COPIED:
            src = ROOT / name
            if src.is_dir():
                shutil.copytree(src, self.dir / name, ignore=shutil.ignore_patterns(*IGNORED))
            elif src.is_file():
                shutil.copy2(src, self.dir / name)
        (self.dir / f"{PROBE}.py").write_text(PROBE_SOURCE)
        self._clock = 2_000_000_000 + index * 10_000_000  # unique fake mtimes: no .pyc can be stale

    def path(self, file: str) -> Path:
        p = (self.dir / file).resolve()
        if self.dir not in p.parents:  # never write outside the copy (the shared tree least of all)
            raise RuntimeError(f"refusing to write {p}: outside the private copy {self.dir}")
        return p

    def write(self, file: str, data: bytes) -> None:
        p = self.path(file)
        p.write_bytes(data)
        self._clock += 1
        os.utime(p, (self._clock, self._clock))
        for pyc in (p.parent / "__pycache__").glob(f"{p.stem}.*.pyc"):
            pyc.unlink()


class Job:
    """One pytest run in a sandbox: a forked child of the (pre-imported) parent, or a subprocess."""

    def __init__(self, box: Sandbox, tests: Sequence[str], log: Path, fork: bool, probe: dict | None) -> None:
        self.started = time.monotonic()
        self.log = log
        # the probe plugin: hypothesis derandomized, no example database (the same verdict on every run); in
        # the baseline run it also records where the target modules were imported from
        args = ["-p", PROBE, *PYTEST_ARGS, *(FORK_PYTEST_ARGS if fork else ()), *tests]
        env = {"TRITON_INTERPRET": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
        if probe is not None:
            env |= {"MUTATION_PROBE_OUT": str(probe["out"]), "MUTATION_PROBE_MODULES": json.dumps(probe["modules"])}
        self.proc: subprocess.Popen | None = None
        if not fork:
            full_env = {**os.environ, **env, "PYTHONPATH": str(box.dir)}
            with open(log, "wb") as out:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "pytest", *args],
                    cwd=box.dir,
                    env=full_env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self.pid = self.proc.pid
            return
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 3
            try:
                os.setsid()
                fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.chdir(box.dir)
                os.environ.update(env)
                sys.path.insert(0, str(box.dir))
                import pytest

                code = int(pytest.main(args))
            except BaseException as e:  # report and exit: a forked child must never run the parent's code
                print(f"mutation child: {type(e).__name__}: {e}", flush=True)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        self.pid = pid

    def poll(self) -> int | None:
        if self.proc is not None:
            return self.proc.poll()
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid == 0:
            return None
        return os.waitstatus_to_exitcode(status)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)  # the session this job's own child leads
        if self.proc is not None:
            self.proc.wait()
        else:
            os.waitpid(self.pid, 0)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass
class Outcome:
    mutant: Mutant
    status: str  # killed | survived | timeout | error
    seconds: float


@dataclass
class Report:
    target: str
    files: tuple[str, ...]
    tests: tuple[str, ...]
    total_mutants: int
    baseline_s: float = 0.0
    timeout_s: float = 0.0
    elapsed_s: float = 0.0
    outcomes: list[Outcome] = field(default_factory=list)
    problem: str | None = None

    def count(self, status: str) -> int:
        return sum(o.status == status for o in self.outcomes)

    @property
    def kill_rate(self) -> float | None:
        judged = len(self.outcomes) - self.count("error")
        return (self.count("killed") + self.count("timeout")) / judged if judged else None

    def to_dict(self) -> dict:
        return {
            "files": list(self.files),
            "tests": list(self.tests),
            "total_mutants": self.total_mutants,
            "mutants": len(self.outcomes),
            "killed": self.count("killed"),
            "survived": self.count("survived"),
            "timeout": self.count("timeout"),
            "error": self.count("error"),
            "kill_rate": None if self.kill_rate is None else round(self.kill_rate, 4),
            "baseline_s": round(self.baseline_s, 2),
            "timeout_s": round(self.timeout_s, 1),
            "elapsed_s": round(self.elapsed_s, 1),
            "problem": self.problem,
            "survivors": [_mutant_dict(o.mutant) for o in self.outcomes if o.status == "survived"],
            "results": [
                {**_mutant_dict(o.mutant), "status": o.status, "seconds": round(o.seconds, 2)} for o in self.outcomes
            ],
        }


def _mutant_dict(m: Mutant) -> dict:
    d = asdict(m)
    return {k: d[k] for k in ("file", "line", "col", "kind", "change")}


class Runner:
    def __init__(self, base: Path, jobs: int, fork: bool, timeout: float | None, verbose: bool) -> None:
        self.boxes = [Sandbox(base, i) for i in range(jobs)]
        self.logs = base / "logs"
        self.logs.mkdir()
        self.fork, self.timeout, self.verbose = fork, timeout, verbose
        self.originals: dict[str, bytes] = {}

    def baseline(self, name: str, target: Target) -> tuple[float, str | None]:
        """Seconds of the unmutated selection, or a problem: it fails, or a target came from the shared tree."""
        box = self.boxes[0]
        out = self.logs / f"{name}.probe.json"
        modules = [_module_name(f) for f in target.files]
        log = self.logs / f"{name}.baseline.log"
        job = Job(box, target.tests, log, self.fork, {"out": out, "modules": modules})
        while (code := job.poll()) is None:
            if job.elapsed > 900:
                job.kill()
                return job.elapsed, "the unmutated selection ran past 900 s"
            time.sleep(0.05)
        seconds = job.elapsed
        if code != 0:
            return seconds, f"the unmutated selection fails (exit {code}):\n{_tail(log)}"
        found = json.loads(out.read_text()) if out.is_file() else {}
        for module in modules:
            where = found.get(module)
            if where is None:
                return seconds, f"the selection never imports {module}: every mutant would survive"
            if Path(where).resolve() != (box.dir / (module.replace(".", "/") + ".py")).resolve():
                return seconds, f"{module} was imported from {where}, not from the private copy {box.dir}"
        return seconds, None

    def run(self, name: str, target: Target, mutants: list[Mutant], total: int) -> Report:
        rep = Report(name, target.files, target.tests, total)
        t0 = time.monotonic()
        rep.baseline_s, rep.problem = self.baseline(name, target)
        if rep.problem is not None:
            print(f"{name}: {rep.problem}", file=sys.stderr)
            return rep
        rep.timeout_s = self.timeout if self.timeout is not None else max(20.0, 4 * rep.baseline_s)
        for file in target.files:
            self.originals[file] = self.boxes[0].path(file).read_bytes()
        pending = list(mutants)
        running: dict[int, tuple[Job, Mutant]] = {}  # sandbox index -> its job
        done = 0
        try:
            while pending or running:
                for i, box in enumerate(self.boxes):
                    if i in running or not pending:
                        continue
                    m = pending.pop(0)
                    box.write(m.file, m.apply(self.originals[m.file]))
                    log = self.logs / f"{name}.{i}.log"
                    running[i] = (Job(box, target.tests, log, self.fork, None), m)
                for i, (job, m) in list(running.items()):
                    code = job.poll()
                    if code is None and job.elapsed <= rep.timeout_s:
                        continue
                    if code is None:
                        job.kill()
                        status = "timeout"
                    else:  # 1 tests failed, 2 collection (import) error, 3 internal error, < 0 the run crashed
                        status = "survived" if code == 0 else "killed" if code in (1, 2, 3) or code < 0 else "error"
                    if status == "error":
                        print(f"  error (exit {code}) on {m.key}:\n{_tail(job.log)}", file=sys.stderr)
                    rep.outcomes.append(Outcome(m, status, job.elapsed))
                    self.boxes[i].write(m.file, self.originals[m.file])
                    del running[i]
                    done += 1
                    if self.verbose or status != "killed":
                        print(f"  [{done}/{len(mutants)}] {status:8} {m.file}:{m.line}  {m.change}", flush=True)
                time.sleep(0.02)
        finally:
            for i, (job, m) in running.items():
                job.kill()
                self.boxes[i].write(m.file, self.originals[m.file])
        rep.outcomes.sort(key=lambda o: (o.mutant.file, o.mutant.line, o.mutant.col))
        rep.elapsed_s = time.monotonic() - t0
        return rep


# -- output -------------------------------------------------------------------------------------------------
def print_table(reports: Sequence[Report]) -> None:
    cols = ("mutants", "killed", "timeout", "survived", "error", "kill rate", "time")
    head = f"{'module':14} " + " ".join(f"{c:>9}" for c in cols)
    print(head)
    print("-" * len(head))
    for r in reports:
        rate = "-" if r.kill_rate is None else f"{100 * r.kill_rate:.0f}%"
        shown = f"{len(r.outcomes)}/{r.total_mutants}" if len(r.outcomes) < r.total_mutants else str(len(r.outcomes))
        cells = (shown, r.count("killed"), r.count("timeout"), r.count("survived"), r.count("error"), rate)
        print(f"{r.target:14} " + " ".join(f"{c:>9}" for c in cells) + f" {r.elapsed_s:>8.0f}s")
    for r in reports:
        if r.problem:
            print(f"\n{r.target}: not run: {r.problem}")
        survivors = [o.mutant for o in r.outcomes if o.status == "survived"]
        if survivors:
            print(f"\n{r.target}: {len(survivors)} surviving mutant(s)")
            for m in survivors:
                print(f"  {m.file}:{m.line}  [{m.kind}] {m.change}")
    print(
        "\nlegend: kill rate = (killed + timeout) / (mutants - error); mutants a/b: a sampled of b (--max-mutants); "
        "time: baseline run and mutants"
    )


def _preimport() -> None:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    import importlib

    for name in PREIMPORT:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    leaked = [n for n in sys.modules if n.split(".")[0] in ("workbench", "kernels")]
    if leaked:  # the children must import every project module from their copy
        raise RuntimeError(f"the fork server imported project modules: {leaked[:3]}")


def _plan(
    names: Sequence[str], root: Path, max_mutants: int | None, seed: int, match: Sequence[str] | None = None
) -> dict[str, tuple[list[Mutant], int]]:
    """Per target: the mutants to run (all, or a sample; those ``match`` names) and how many there are in all."""
    plan = {}
    for name in names:
        every = [m for f in TARGETS[name].files for m in mutants_of(name, f, root)]
        chosen = select(every, max_mutants, seed)
        if match:
            chosen = [m for m in chosen if any(text in m.key for text in match)]
        plan[name] = (chosen, len(every))
    return plan


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Mutation benchmark of the core modules' focused tests (dependency-free, ast mutants).",
        epilog="example: .venv/bin/python benchmarks/mutation.py --max-mutants 120 --json mutation.json",
    )
    p.add_argument("--module", action="append", choices=list(TARGETS), help="a target to run (repeatable; default all)")
    p.add_argument("--max-mutants", type=int, default=None, help="sample at most N mutants per target (deterministic)")
    p.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    p.add_argument(
        "--match", action="append", metavar="TEXT", help="only mutants whose FILE:LINE:COL:KIND:CHANGE contains TEXT"
    )
    p.add_argument("--timeout", type=float, default=None, help="seconds per mutant (default 4x baseline, >= 20)")
    p.add_argument("--jobs", type=int, default=1, help="mutants run at once, each in its own copy (default 1)")
    p.add_argument("--no-fork", action="store_true", help="a fresh `python -m pytest` per mutant, no fork server")
    p.add_argument(
        "--tests", nargs="+", metavar="NODE", help="run these tests instead of the target's selection (one --module)"
    )
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    p.add_argument("--list", action="store_true", help="list targets, their tests and mutants; run nothing")
    p.add_argument("--keep", action="store_true", help="keep the private copies and logs (their folder is printed)")
    p.add_argument("--verbose", action="store_true", help="print every mutant's outcome, not only the non-killed")
    args = p.parse_args(argv)
    if args.max_mutants is not None and args.max_mutants < 1:
        p.error(f"--max-mutants: must be >= 1, got {args.max_mutants}")
    if args.tests and len(args.module or ()) != 1:
        p.error("--tests: name exactly one --module whose selection it replaces")
    if args.jobs < 1:
        p.error(f"--jobs: must be >= 1, got {args.jobs}")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        p.error(f"--json: folder {Path(args.json).parent} does not exist")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    names = args.module or list(TARGETS)
    if args.tests:
        TARGETS[names[0]] = replace(TARGETS[names[0]], tests=tuple(args.tests))
    if args.list:
        plan = _plan(names, ROOT, args.max_mutants, args.seed, args.match)
        for name in names:
            t, (chosen, total) = TARGETS[name], plan[name]
            print(f"{name}: {t.what}\n  files: {', '.join(t.files)}\n  tests: {' '.join(t.tests)}")
            print(
                f"  mutants: {total}" + (f" ({len(chosen)} sampled, seed {args.seed})" if len(chosen) < total else "")
            )
            if args.module:
                for m in chosen:
                    print(f"    {m.file}:{m.line}:{m.col}  [{m.kind}] {m.change}")
        return 0
    fork = not args.no_fork and hasattr(os, "fork")
    if fork:
        _preimport()
    base = Path(tempfile.mkdtemp(prefix="linattn-mutation-"))
    t0 = time.monotonic()
    reports: list[Report] = []
    try:
        runner = Runner(base, args.jobs, fork, args.timeout, args.verbose)
        plan = _plan(names, runner.boxes[0].dir, args.max_mutants, args.seed, args.match)  # the copy's offsets
        for name in names:
            chosen, total = plan[name]
            print(f"{name}: {len(chosen)} of {total} mutants; tests: {' '.join(TARGETS[name].tests)}", flush=True)
            reports.append(runner.run(name, TARGETS[name], chosen, total))
            r = reports[-1]
            rate = "-" if r.kill_rate is None else f"{100 * r.kill_rate:.0f}%"
            print(f"{name}: kill rate {rate} in {r.elapsed_s:.0f} s (baseline {r.baseline_s:.1f} s)", flush=True)
    finally:
        if args.keep:
            print(f"copies and logs kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    print()
    print_table(reports)
    if args.json:
        doc = {
            "schema": SCHEMA,
            "meta": {
                "command": "benchmarks/mutation.py " + " ".join(sys.argv[1:] if argv is None else argv),
                "seed": args.seed,
                "max_mutants": args.max_mutants,
                "jobs": args.jobs,
                "fork": fork,
                "pytest_args": list(PYTEST_ARGS),
                "python": platform.python_version(),
                "elapsed_s": round(time.monotonic() - t0, 1),
                "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            },
            "modules": {r.target: r.to_dict() for r in reports},
        }
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 1 if any(r.problem for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
