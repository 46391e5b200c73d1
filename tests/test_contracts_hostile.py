"""``workbench check-contracts`` on hostile sources: bounded, and one line each, never a traceback or a hang.

Expressions nested thousands deep, special files (a FIFO blocks whoever opens it), an inheritance chain of
hundreds of classes, a file of many megabytes. In a folder such a file is skipped with a note and the rest
is checked; named on its own it is refused: exit 2, one line. The runs that could hang run in a subprocess
with a timeout, so that a regression fails instead of stalling the suite.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _cli_run import run

from workbench.contracts.source import MAX_ANCESTORS, MAX_FILE_BYTES

# A subclass that breaks its base's call: the file every hostile tree below holds beside the hostile one.
CLEAN = """\
class Base:
    def hook(self, x): ...
    def run(self): self.hook(1)


class Sub(Base):
    def hook(self): ...
"""
ERROR = "workbench check-contracts: error: "


def _cli(*argv: str | Path) -> tuple[int, str, str]:
    code, out, err = run(["check-contracts", *map(str, argv)])
    assert "Traceback" not in out + err
    return code, out, err


def _subprocess(*argv: str | Path, timeout: float = 60) -> tuple[int, str, str, float]:
    """The command in a child process, killed after ``timeout`` seconds (the test then fails, not hangs)."""
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "workbench", "check-contracts", *map(str, argv)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"check-contracts {' '.join(map(str, argv))} ran past {timeout} s")
    assert "Traceback" not in done.stdout + done.stderr
    return done.returncode, done.stdout, done.stderr, time.perf_counter() - start


def _one_line_error(code: int, out: str, err: str, *parts: str) -> None:
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith(ERROR), err
    for part in parts:
        assert part in err, (part, err)


def _notes(tree: Path) -> list[str]:
    code, out, _ = _cli(tree, "--format", "json")
    assert code == 1  # the clean file's break is still found
    data = json.loads(out)
    assert data["breaks"] == 1
    return data["notes"]


def _tree(tmp_path: Path, name: str, text: str) -> Path:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "clean.py").write_text(CLEAN)
    (tree / name).write_text(text)
    return tree / name


def test_an_expression_too_deep_for_the_parser_is_skipped_in_a_tree_and_refused_alone(tmp_path: Path) -> None:
    # a+a+...+a: Python's own parser gives up with a RecursionError (a traceback before)
    deep = _tree(tmp_path, "deep.py", "x = " + "+".join(["a"] * 3000) + "\n")
    (deep.parent / "parens.py").write_text("x = " + "(" * 3000 + "1" + ")" * 3000 + "\n")  # a SyntaxError
    notes = _notes(deep.parent)
    assert any(note.startswith("1 file(s) do not parse") and "parens.py" in note for note in notes), notes
    assert any(
        note.startswith("1 file(s) were not read and were skipped:") and "deep.py (nested too deeply to parse" in note
        for note in notes
    ), notes
    _one_line_error(*_cli(deep), f"target file not read: {deep} (nested too deeply to parse")


@pytest.mark.parametrize(
    "source",
    [
        # an argument of a checked call: its text is shown (ast.unparse recursed per level)
        "class A:\n    def hook(self, x): ...\n    def run(self, a): self.hook({deep})\n",
        # a default value: literal_eval gives up, and its text is kept
        "class A:\n    def hook(self, x): ...\n    def run(self): self.hook(1)\n"
        "class B(A):\n    def hook(self, y, x={deep}): ...\n",
        # a base class subscripted thousands deep
        "class A:\n    def hook(self, x): ...\n    def run(self): self.hook(1)\nclass B(A{subscripts}):\n    pass\n",
        # a string annotation that is too deep to parse
        "class A:\n    def hook(self, x): ...\ndef use(b: 'A|{deeper}'):\n    b.hook(1)\n",
        # private methods calling one another 1500 deep, the last one public
        "class A:\n    def hook(self, x): ...\n    def _m0(self): self.hook(1)\n{chain}"
        "    def run(self): self._m1499()\n",
    ],
    ids=["call-argument", "default", "base", "string-annotation", "private-call-chain"],
)
def test_code_nested_deep_but_parsing_is_checked(tmp_path: Path, source: str) -> None:
    text = source.format(
        deep="+".join(["a"] * 1500),
        deeper="+".join(["a"] * 5000),
        subscripts="[0]" * 1500,
        chain="".join(f"    def _m{i}(self): self._m{i - 1}()\n" for i in range(1, 1500)),
    )
    target = _tree(tmp_path, "deep.py", text + "class Sub2(A):\n    def hook(self): ...\n")
    code, out, err = _cli(target)
    assert code in (0, 1) and err == "", err
    assert out.rstrip().splitlines()[-1].endswith("--drift lists them)")


def test_the_last_guard_turns_a_recursion_error_into_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def recurse(*args: object) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(importlib.import_module("workbench.contracts.check"), "_check", recurse)
    _one_line_error(*_cli("anything.py"), "nested too deeply to check")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_never_opened(tmp_path: Path) -> None:
    fifo = _tree(tmp_path, "clean2.py", "")
    fifo.unlink()
    os.mkfifo(fifo)  # opening it for reading blocks until a writer comes: forever
    code, out, err, _ = _subprocess(fifo.parent, "--format", "json", timeout=60)
    assert code == 1 and err == ""
    notes = json.loads(out)["notes"]
    assert any("were not read" in note and "clean2.py (a FIFO, not a regular file)" in note for note in notes), notes
    code, out, err, _ = _subprocess(fifo, timeout=60)
    _one_line_error(code, out, err, f"target file not read: {fifo} (a FIFO, not a regular file)")
    code, out, err, _ = _subprocess(fifo.parent / "clean.py", "--calls-from", fifo, timeout=60)
    _one_line_error(code, out, err, f"--calls-from {fifo} is a FIFO, not a file or folder")


def test_a_file_over_the_size_limit_is_not_read(tmp_path: Path) -> None:
    line = b"y = 1  # " + b"x" * 90 + b"\n"
    big = _tree(tmp_path, "big.py", "")
    big.write_bytes(CLEAN.encode() + line * (MAX_FILE_BYTES // len(line) + 1))
    size = f"{big.stat().st_size / 1e6:.1f} MB, over the {MAX_FILE_BYTES / 1e6:g} MB limit for a source file"
    notes = _notes(big.parent)
    assert any(note.startswith("1 file(s) were not read") and f"big.py ({size})" in note for note in notes), notes
    _one_line_error(*_cli(big), f"target file not read: {big} ({size})")


def _chain(count: int) -> str:
    """C0 <- C1 <- ... <- C{count} <- Bad, whose override breaks C0's call: Bad derives from count + 1 classes."""
    lines = ["class C0:", "    def hook(self, x): ...", "    def run(self): self.hook(1)"]
    for i in range(1, count + 1):
        lines += [f"class C{i}(C{i - 1}):", "    pass"]
    lines += [f"class Bad(C{count}):", "    def hook(self): ..."]
    return "\n".join(lines) + "\n"


def test_a_long_inheritance_chain_is_read_in_seconds(tmp_path: Path) -> None:
    chain = tmp_path / "chain.py"
    chain.write_text(_chain(MAX_ANCESTORS - 1))  # minutes before: each resolution order was merged in cubic time
    code, out, err, seconds = _subprocess(chain, timeout=30)  # some 2 s now
    assert code == 1 and err == "", err
    assert f"checked {MAX_ANCESTORS + 1} classes in 1 files" in out and "break in Bad" in out
    assert out.rstrip().splitlines()[-1].startswith("1 break;")


def test_a_chain_longer_than_the_limit_is_refused_in_one_line(tmp_path: Path) -> None:
    chain = tmp_path / "chain.py"
    chain.write_text(_chain(MAX_ANCESTORS + 100))
    code, out, err, _ = _subprocess(chain, timeout=30)
    first = MAX_ANCESTORS + 1  # the first class past the limit, named with its line
    _one_line_error(code, out, err, f"class C{first} ({chain}:{2 * first + 2}) derives from over {MAX_ANCESTORS}")
