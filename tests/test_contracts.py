"""workbench.contracts: every subclass must still take the calls its base class promises."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench import contracts
from workbench.contracts import (
    CHANGED_DEFAULT,
    DROPPED_VARARGS,
    DROPPED_VARKW,
    KIND_CHANGED,
    MISSING,
    NEW_REQUIRED,
    RENAMED,
    REORDERED,
    ContractError,
    check,
    compare_signatures,
    main,
)

FIXTURES = Path(__file__).parent / "fixtures" / "contracts"
BASE = "ctr_base:MetadataBackend"
HOOKS = "ctr_base:StepHooks"
OUT_GRAPH = "init_forward_metadata_out_graph"


@pytest.fixture(autouse=True)
def _fixtures_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))


def line_of(file: str, text: str) -> int:
    """The 1-based line of the only line of ``file`` (under the fixtures) that contains ``text``."""
    lines = [i for i, line in enumerate((FIXTURES / file).read_text().splitlines(), 1) if text in line]
    assert len(lines) == 1, (file, text, lines)
    return lines[0]


def summary(report: contracts.Report) -> list[tuple[str, str, str, int | None]]:
    return [(f.cls, f.method, f.kind, f.line) for f in report.findings]


def drift_only(report: contracts.Report) -> bool:
    """No call in these fixtures reaches the overrides: every finding is drift, and the report is ok."""
    return report.ok and report.breaks == [] and all(f.tier == "drift" for f in report.findings)


class _AnyName(dict):
    """Evaluation namespace in which every unknown name is a fresh object (the call's arguments)."""

    def __missing__(self, key: str) -> object:
        return object()


def really_call(instance: object, call: str) -> str | None:
    """Make the finding's call on a real object: Python's TypeError message, or None if it is accepted."""
    try:
        eval(call.replace("=...", "=None"), {}, _AnyName(obj=instance))
    except TypeError as exc:
        return f"TypeError: {exc}"
    return None


# ------------------------------------------------------------------------------------------ fixtures


def test_good_subclasses_are_clean() -> None:
    report = check(FIXTURES / "ctr_good.py", BASE)
    assert report.ok and report.findings == []
    assert report.checked == ["GoodBackend", "KwargsBackend", "ExtraOptionalBackend"]
    assert report.read_from_source == [str(FIXTURES / "ctr_good.py")]
    assert report.methods == ("init_forward_metadata", OUT_GRAPH, "init_forward_metadata_in_graph")
    assert str(report).endswith(
        "OK: no breaks; 0 drift (signature differences no call in the trees shows; --drift lists them)"
    )
    assert check(FIXTURES / "ctr_good.py", HOOKS).ok


BROKEN = [
    (
        "MissingInCapture",
        OUT_GRAPH,
        MISSING,
        "def init_forward_metadata_out_graph(self, batch):",
        "TypeError: MissingInCapture.init_forward_metadata_out_graph() got an unexpected keyword argument 'in_capture'",
    ),
    (
        "RenamedPositional",
        "init_forward_metadata",
        RENAMED,
        "(self, forward_batch)",
        "TypeError: RenamedPositional.init_forward_metadata() got an unexpected keyword argument 'batch'",
    ),
    (
        "ReorderedParameters",
        OUT_GRAPH,
        REORDERED,
        "(self, in_capture=False, batch=None)",
        "no exception, but 'batch' lands in 'in_capture'; 'in_capture' lands in 'batch'",
    ),
    (
        "ChangedDefault",
        OUT_GRAPH,
        CHANGED_DEFAULT,
        "in_capture=True)",
        "no exception, but a call that omits 'in_capture' gets True, not False",
    ),
    (
        "DroppedDefault",
        OUT_GRAPH,
        CHANGED_DEFAULT,
        "(self, batch, in_capture):",
        "TypeError: DroppedDefault.init_forward_metadata_out_graph() missing 1 required positional argument: "
        "'in_capture'",
    ),
    (
        "KeywordOnlyBatch",
        "init_forward_metadata",
        KIND_CHANGED,
        "(self, *, batch)",
        "TypeError: KeywordOnlyBatch.init_forward_metadata() takes 1 positional argument but 2 were given",
    ),
    (
        "NewRequiredParameter",
        "init_forward_metadata_in_graph",
        NEW_REQUIRED,
        "(self, batch, stream)",
        "TypeError: NewRequiredParameter.init_forward_metadata_in_graph() missing 1 required positional "
        "argument: 'stream'",
    ),
]

BROKEN_HOOKS = [
    (
        "DroppedKwargs",
        "on_step",
        DROPPED_VARKW,
        "(self, batch, *args)",
        "TypeError: DroppedKwargs.on_step() got an unexpected keyword argument 'extra'",
    ),
    (
        "DroppedArgs",
        "on_step",
        DROPPED_VARARGS,
        "(self, batch, **kwargs)",
        "TypeError: DroppedArgs.on_step() takes 2 positional arguments but 3 were given",
    ),
]


@pytest.mark.parametrize(("base", "expected"), [(BASE, BROKEN), (HOOKS, BROKEN_HOOKS)], ids=["metadata", "hooks"])
def test_each_broken_subclass_gives_one_finding_of_its_kind(base: str, expected: list) -> None:
    report = check(FIXTURES / "ctr_broken.py", base)
    assert drift_only(report)  # the public signatures differ, and no call in the trees makes them: drift
    assert summary(report) == [
        (cls, method, kind, line_of("ctr_broken.py", text)) for cls, method, kind, text, _ in expected
    ]
    assert [f.message for f in report.findings] == [message for *_, message in expected]
    assert all(f.file == str(FIXTURES / "ctr_broken.py") for f in report.findings)


def test_in_capture_finding_is_what_python_raises() -> None:
    """The sglang NPU crash, reproduced on the CPU: the finding's message is Python's own."""
    broken = importlib.import_module("ctr_broken")
    (finding,) = [f for f in check(broken, BASE).findings if f.cls == "MissingInCapture"]
    assert finding.call == "obj.init_forward_metadata_out_graph(batch, in_capture=...)"
    with pytest.raises(TypeError) as raised:
        broken.MissingInCapture().init_forward_metadata_out_graph(object(), in_capture=True)
    assert finding.message == f"TypeError: {raised.value}"
    assert finding.param == "in_capture"
    assert "in_capture" in str(finding) and "ctr_broken.py:7" in str(finding)


@pytest.mark.parametrize(("file", "base"), [("ctr_broken.py", BASE), ("ctr_broken.py", HOOKS), ("ctr_chain.py", BASE)])
def test_every_finding_call_does_that_for_real(file: str, base: str) -> None:
    module = importlib.import_module(Path(file).stem)
    for finding in check(FIXTURES / file, base).findings:
        outcome = really_call(getattr(module, finding.cls)(), finding.call)
        assert outcome == (finding.message if finding.message.startswith("TypeError") else None), finding


def test_subclass_through_an_intermediate_inherits_its_broken_override() -> None:
    report = check(FIXTURES / "ctr_chain.py", BASE)
    line = line_of("ctr_chain.py", "def init_forward_metadata_out_graph(self, batch):")
    assert report.checked == ["MidBackend", "LeafBackend", "FixedLeafBackend"]
    assert summary(report) == [("MidBackend", OUT_GRAPH, MISSING, line)]  # once, under the class that defines it
    (mid,) = report.findings
    assert mid.subclasses == ("MidBackend", "LeafBackend") and mid.heirs == ["LeafBackend"]
    assert "inherited: LeafBackend" in str(mid)
    assert mid.message.startswith("TypeError: MidBackend.init_forward_metadata_out_graph() got an unexpected")


# ------------------------------------------------------------------------------ code that cannot import

NPU_EXPECTED = [
    (
        "NpuBackend",
        OUT_GRAPH,
        MISSING,
        line_of("ctr_npu.py", "def init_forward_metadata_out_graph(self, batch):"),
    ),
    (
        "NpuDeviceBackend",
        "init_forward_metadata",
        NEW_REQUIRED,
        line_of("ctr_npu.py", "(self, batch, device)"),
    ),
]


@pytest.mark.parametrize("base", ["MetadataBackend", BASE, "class"])
def test_unimportable_module_is_read_from_source(base: str) -> None:
    with pytest.raises(ImportError):
        importlib.import_module("ctr_npu")
    base_arg = importlib.import_module("ctr_base").MetadataBackend if base == "class" else base
    report = check(FIXTURES / "ctr_npu.py", base_arg)
    assert report.read_from_source == [str(FIXTURES / "ctr_npu.py")]
    assert report.checked == ["_NpuCommon", "NpuBackend", "NpuFromGood", "NpuDeviceBackend"]
    assert summary(report) == NPU_EXPECTED
    assert report.findings[0].message == (
        "TypeError: NpuBackend.init_forward_metadata_out_graph() got an unexpected keyword argument 'in_capture'"
    )


def test_source_read_messages_match_the_code_run_for_real() -> None:
    """Run the NPU fixture with its device import stubbed out: the calls raise what the report says."""
    source = (FIXTURES / "ctr_npu.py").read_text()
    namespace: dict = {}
    exec(compile(source.replace("import torch_npu_does_not_exist", "pass"), "ctr_npu", "exec"), namespace)
    for finding in check(FIXTURES / "ctr_npu.py", BASE).findings:
        assert really_call(namespace[finding.cls](), finding.call) == finding.message


def test_base_that_cannot_import_is_read_from_source_too() -> None:
    report = check(FIXTURES / "ctr_npu.py", "ctr_npu:_NpuCommon")
    assert report.read_from_source == [str(FIXTURES / "ctr_npu.py")]
    assert set(report.methods) == {"init_forward_metadata", OUT_GRAPH, "init_forward_metadata_in_graph"}
    assert report.checked == ["NpuBackend"]
    assert summary(report) == NPU_EXPECTED[:1]


def test_package_with_relative_import_and_a_dotted_target() -> None:
    report = check(FIXTURES / "ctr_pkg", BASE)
    assert report.read_from_source == [
        str(FIXTURES / "ctr_pkg" / name) for name in ("__init__.py", "common.py", "npu.py")
    ]
    assert report.checked == ["PkgCommon", "PkgNpuBackend"]
    line = line_of("ctr_pkg/npu.py", "*, stream)")
    assert summary(report) == [("PkgNpuBackend", OUT_GRAPH, NEW_REQUIRED, line)]
    assert report.findings[0].message.endswith("missing 1 required keyword-only argument: 'stream'")
    assert summary(check("ctr_pkg", BASE)) == summary(report)


def test_targets_as_module_object_dotted_name_directory_and_list() -> None:
    by_path = summary(check(FIXTURES / "ctr_broken.py", BASE))
    assert summary(check(importlib.import_module("ctr_broken"), BASE)) == by_path
    assert summary(check("ctr_broken", BASE)) == by_path
    assert summary(check("ctr_npu", "MetadataBackend")) == NPU_EXPECTED
    both = check([FIXTURES / "ctr_broken.py", str(FIXTURES / "ctr_npu.py")], BASE)
    assert summary(both) == by_path + NPU_EXPECTED
    everything = check(FIXTURES, BASE)
    assert len(everything.findings) == len(by_path) + 1 + 2 + 1  # broken, chain (once for two classes), npu, package
    assert len(everything.read_from_source) == len(list(FIXTURES.rglob("*.py")))


def test_methods_argument_and_private_methods() -> None:
    report = check(FIXTURES / "ctr_broken.py", BASE, methods=["init_forward_metadata"])
    assert report.methods == ("init_forward_metadata",)
    assert {f.cls for f in report.findings} == {"RenamedPositional", "KeywordOnlyBatch"}
    assert "_helper" not in check(FIXTURES / "ctr_good.py", BASE).methods
    with pytest.raises(ContractError, match="--method 'nope': no base class found"):
        check(FIXTURES / "ctr_good.py", BASE, methods=["nope"])


def test_unknown_target_or_base_is_an_error() -> None:
    with pytest.raises(ContractError, match="no module or path"):
        check("no_such_module_for_contracts", BASE)
    with pytest.raises(ContractError, match="base class no_such_module_for_contracts:Base not found"):
        check(FIXTURES / "ctr_good.py", "no_such_module_for_contracts:Base")
    with pytest.raises(ContractError, match="base class 'Nope' not found in the targets"):
        check(FIXTURES / "ctr_good.py", "Nope")


# ------------------------------------------------------------------------------------------------ CLI


def test_cli_exit_codes_and_output(capsys: pytest.CaptureFixture[str]) -> None:
    # signature differences that no call in the trees makes: drift, counted; listed with --drift; exit 1 with --strict
    assert main([str(FIXTURES / "ctr_broken.py"), "--base", BASE]) == 0
    out = capsys.readouterr().out
    assert "in_capture" not in out and out.rstrip().endswith("OK: no breaks; 7 drift (signature differences no call "
                                                             "in the trees shows; --drift lists them)")  # fmt: skip
    assert main([str(FIXTURES / "ctr_broken.py"), "--base", BASE, "--drift"]) == 0
    out = capsys.readouterr().out
    assert "got an unexpected keyword argument 'in_capture'" in out and "drift in MissingInCapture" in out
    assert main([str(FIXTURES / "ctr_broken.py"), "--base", BASE, "--strict"]) == 1
    capsys.readouterr()

    assert main([str(FIXTURES / "ctr_npu.py"), "--base", BASE, "--method", OUT_GRAPH, "--drift", "--strict"]) == 1
    out = capsys.readouterr().out
    assert "NpuBackend.init_forward_metadata_out_graph" in out

    assert main([str(FIXTURES / "ctr_good.py"), "--base", BASE, "--strict"]) == 0
    assert "OK: no breaks; 0 drift" in capsys.readouterr().out

    assert main(["no_such_module_for_contracts", "--base", BASE]) == 2
    assert "no module or path named" in capsys.readouterr().err
    assert main(["--no-such-flag"]) == 2
    assert main(["--help"]) == 0
    assert "--base" in capsys.readouterr().out
    assert contracts.DEFAULT_BASE == "workbench.backends:MetadataBackend"


# ---------------------------------------------------------------- properties, against real Python calls

NAMES = ["a", "b", "c", "d", "e"]


@st.composite
def signatures(draw: st.DrawFn) -> inspect.Signature:
    """A random valid method signature over a few names: ``self`` then every kind of parameter."""
    P = inspect.Parameter
    names = draw(st.permutations(NAMES))
    n_pos = draw(st.integers(0, 3))
    n_posonly = draw(st.integers(0, n_pos))
    n_default = draw(st.integers(0, n_pos))
    defaults = st.sampled_from([None, 0, 1])
    params = [P("self", P.POSITIONAL_ONLY if n_posonly else P.POSITIONAL_OR_KEYWORD)]
    for i, name in enumerate(names[:n_pos]):
        kind = P.POSITIONAL_ONLY if i < n_posonly else P.POSITIONAL_OR_KEYWORD
        default = draw(defaults) if i >= n_pos - n_default else P.empty
        params.append(P(name, kind, default=default))
    if draw(st.booleans()):
        params.append(P("args", P.VAR_POSITIONAL))
    for name in names[n_pos : n_pos + draw(st.integers(0, 2))]:
        params.append(P(name, P.KEYWORD_ONLY, default=draw(st.one_of(st.just(P.empty), defaults))))
    if draw(st.booleans()):
        params.append(P("kwargs", P.VAR_KEYWORD))
    return inspect.Signature(params)


def real_method(signature: inspect.Signature) -> object:
    """A real object whose method ``m`` has ``signature`` and returns its bound arguments."""
    namespace: dict = {}
    body = f"    def m{signature}:\n        return dict(locals())\n"
    exec(f"class Override:\n{body}", namespace)
    return namespace["Override"]()


def base_style_calls(signature: inspect.Signature) -> list[tuple[list[str], list[str]]]:
    """How the contract says callers call: required parameters positionally, optional ones by keyword."""
    P = inspect.Parameter
    params = list(signature.parameters.values())[1:]
    positional = [p.name for p in params if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    required = [
        p.name for p in params if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD) and p.default is P.empty
    ]
    kwonly = [p.name for p in params if p.kind is P.KEYWORD_ONLY and p.default is P.empty]
    calls = [(required, kwonly)]
    for p in params:
        if p.default is not P.empty and p.kind is P.POSITIONAL_ONLY:
            calls.append((positional[: positional.index(p.name) + 1], kwonly))
        elif p.default is not P.empty:
            calls.append((required, [*kwonly, p.name]))
    return calls


@settings(max_examples=150, deadline=None)
@given(signatures())
def test_identical_or_fully_variadic_override_is_clean(signature: inspect.Signature) -> None:
    assert compare_signatures(signature, signature, name="m") == []
    P = inspect.Parameter
    anything = inspect.Signature([P("self", P.POSITIONAL_ONLY), P("a", P.VAR_POSITIONAL), P("k", P.VAR_KEYWORD)])
    assert [f.kind for f in compare_signatures(signature, anything, name="m")] == []


@settings(max_examples=200, deadline=None)
@given(signatures(), signatures())
def test_findings_agree_with_real_calls(base: inspect.Signature, override: inspect.Signature) -> None:
    """Findings' TypeErrors are what Python raises; no findings means every base-style call works."""
    findings = compare_signatures(base, override, name="m")
    obj = real_method(override)
    for finding in findings:
        assert really_call(real_method(base), finding.call) is None, finding  # a call the base accepts
        if finding.message.startswith("TypeError"):
            assert really_call(obj, finding.call) == finding.message, finding
        else:  # a silent change must say what changed
            assert finding.message.startswith("no exception, but "), finding
    if findings:
        return
    P = inspect.Parameter
    base_params = list(base.parameters.values())
    for positional, keywords in base_style_calls(base):
        values = {name: object() for name in positional + keywords}
        bound = obj.m(*(values[n] for n in positional), **{n: values[n] for n in keywords})
        landed = {id(v): k for k, v in bound.items()}
        landed.update({id(v): "*" for v in bound.get("args", ())})
        landed.update({id(v): "**" for v in bound.get("kwargs", {}).values()})
        for name, value in values.items():
            posonly = base.parameters[name].kind is P.POSITIONAL_ONLY
            assert landed[id(value)] in (name, "*", "**") or posonly, (name, landed[id(value)])
        for p in base_params[1:]:  # what a call leaves out gets the base's default
            if (
                p.default is not P.empty
                and p.name not in values
                and p.name in bound
                and p.kind is not P.POSITIONAL_ONLY
            ):
                assert bound[p.name] == p.default and type(bound[p.name]) is type(p.default)
