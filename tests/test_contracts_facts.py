"""What ``workbench.contracts.facts`` keeps of a parsed file: the checks' facts, never the tree itself (a whole
engine's trees weigh 25 times its source), and a text scan that finds every ``.NAME(`` the calls hold."""

from __future__ import annotations

import ast
import gc
from pathlib import Path

from workbench.contracts import check
from workbench.contracts.facts import METHOD_CALL, scan_calls
from workbench.contracts.source import SourceIndex

FIXTURES = Path(__file__).parent / "fixtures" / "contracts"

ENGINE = """\
class Base:
    def hook(self, a, b=1, *, c=None):
        return a

    def run(self, x):
        for i in range(3):
            if i:
                self.hook(x, c=i)
        return super().__init__()


class Sub(Base):
    def hook(self, a):  # drops b and c: the call above passes c=
        def inner():
            return a
        return inner()
"""


def _alive(kinds: tuple[type, ...]) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) in kinds)  # type(): no proxy object is asked


def test_a_parsed_module_holds_its_facts_not_its_tree(tmp_path: Path) -> None:
    path = tmp_path / "engine.py"
    path.write_text(ENGINE * 20)  # many classes and functions: a kept tree would show in the counts
    kinds = (ast.Module, ast.FunctionDef, ast.ClassDef, ast.For, ast.Return)
    before = _alive(kinds)
    index = SourceIndex([tmp_path])
    module = index.module(path)
    assert module is not None
    infos = [info for info, _, _ in module.class_nodes]
    assert [i.name for i in infos[:2]] == ["Base", "Sub"]
    assert [m.name for m in infos[0].methods] == ["hook", "run"]
    run = infos[0].members["run"]
    assert not isinstance(run, str)
    assert [c.name for c in run.calls] == ["hook", "__init__"] and run.calls[0].keywords == ("c",)
    assert run.ups == frozenset({"__init__"})
    assert _alive(kinds) == before  # no node of a body, a def or the module outlives the parse


def test_the_check_still_finds_the_break_from_facts_alone(tmp_path: Path) -> None:
    (tmp_path / "engine.py").write_text(ENGINE)
    report = check([str(tmp_path)])
    assert [(f.cls, f.method, f.kind) for f in report.breaks] == [("Sub", "hook", "missing-parameter")]


def test_scan_calls_finds_every_method_call_as_the_plain_pattern_does() -> None:
    source = (
        b"x.alpha(1)\n"
        b"y . beta (2)\n"
        b"z.gamma\\\n(3)\n"  # a continuation between name and bracket
        b"w.delta  # a comment\n(4)\n"
        b"(v.eps)(5)\n"  # a bracket between
        b"u.\xc3\xa9t\xc3\xa9(6)\n"  # a name beyond ASCII
        b"# t.zeta( in a comment\n"
        b"s.eta\n"
    )
    calls, lines = scan_calls(source)
    plain: dict[str, list[int]] = {}
    for m in METHOD_CALL.finditer(source):
        plain.setdefault(m.group(1).decode(), []).append(source.count(b"\n", 0, m.start()) + 1)
    assert calls == plain  # by name, exactly what the checks' own scan finds
    assert calls["alpha"] == [1] and calls["beta"] == [2] and calls["zeta"] == [9]
    # every line where an attribute may be called, those written otherwise too; not s.eta (no call)
    assert lines == [1, 2, 3, 5, 7, 8, 9]
    assert "eta" not in calls


def test_the_fixture_engine_reads_the_same_with_facts(tmp_path: Path) -> None:
    report = check([str(FIXTURES / "eng")])
    assert report.files and report.breaks  # the fixture engine's planted breaks are found from facts
