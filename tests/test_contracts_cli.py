"""``workbench check-contracts``: options before or after paths, formats, exit codes 0 / 1 / 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench import cli
from workbench.contracts import check, main

FIXTURES = Path(__file__).parent / "fixtures" / "contracts"
ENG = FIXTURES / "eng"
BASE = "eng.layers.attention.mamba_backend:MambaAttnBackendBase"
OLD_BASE = "ctr_base:MetadataBackend"


@pytest.fixture(autouse=True)
def _in_fixtures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(FIXTURES)  # shown paths are relative to here


@pytest.mark.parametrize(
    "entry", [main, lambda argv: cli.main(["check-contracts", *argv])], ids=["module", "workbench"]
)
@pytest.mark.parametrize(
    "argv",
    [["--base", BASE, "eng/hardware"], ["eng/hardware", "--base", BASE], ["eng/hardware"]],
    ids=["options-first", "options-last", "discovered"],
)
def test_exit_one_on_findings_with_options_anywhere(entry, argv: list[str], capsys: pytest.CaptureFixture) -> None:
    assert entry(argv) == 1
    out = capsys.readouterr().out
    # each break once, under the class that defines the override, the call site first
    assert (
        "break in AscendMambaBackend (eng/hardware/npu/ascend_backend.py):\n"
        "  eng/layers/attention/mamba_backend.py:17 in MambaAttnBackendBase.init_forward_metadata_out_graph\n"
    ) in out
    assert (
        "override:  eng/hardware/npu/ascend_backend.py:12 AscendMambaBackend._replay_metadata [missing-parameter]"
        in out
    )
    assert "break in AscendOneKeywordBackend" in out and "inherited: AscendMTPBackend" in out
    assert out.rstrip().endswith(
        "6 breaks; 0 drift (signature differences no call in the trees shows; --drift lists them)"
    )


def test_exit_zero_when_clean_and_the_project_default(capsys: pytest.CaptureFixture, monkeypatch) -> None:
    assert main(["ctr_good.py", "--base", OLD_BASE, "--search-path", "."]) == 0
    assert capsys.readouterr().out.rstrip().endswith("OK: no breaks; 0 drift (signature differences no call in the "
                                                     "trees shows; --drift lists them)")  # fmt: skip
    monkeypatch.chdir(Path(__file__).parents[1])
    assert main(["--format", "json"]) == 0  # the project's own backends against their base
    (contract,) = json.loads(capsys.readouterr().out)["contracts"]
    assert contract["base"] == "workbench.backends:MetadataBackend"
    assert {"CpuMetadataBackend", "CudaMetadataBackend", "NpuMetadataBackend"} <= set(contract["subclasses"])
    assert main(["workbench"]) == 0  # every base class the workbench package defines


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["plugin"],
            "workbench check-contracts: error: no class in the targets derives from a class defined in the targets "
            "or on the search path; their bases are outside the trees: eng.layers.attention.mamba_backend:"
            "MambaAttnBackendBase (not found); pass the base's root with --search-path DIR, or --base pkg.mod:Class",
        ),
        (
            ["eng", "--base", "eng.nope:Base"],
            "workbench check-contracts: error: base class eng.nope:Base not found: eng.nope "
            "(no such module on the search path)",
        ),  # fmt: skip
        (
            ["eng/layers/attention/base_attn_backend.py", "--base", BASE],
            f"workbench check-contracts: error: no subclass of {BASE} found in "
            "eng/layers/attention/base_attn_backend.py",
        ),
        (
            ["no_such_module_for_contracts"],
            "workbench check-contracts: error: no module or path named 'no_such_module_for_contracts'",
        ),
    ],
    ids=["base-not-on-search-path", "base-not-found", "no-subclass", "no-target"],
)
def test_exit_two_with_one_clear_line(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err == message + "\n" and captured.out == ""


def test_exit_two_on_a_file_that_does_not_parse(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def broken(:\n")
    # in a tree, a file that does not parse is a note (an engine may hold files for a newer Python)
    assert main(["eng", str(tmp_path), "--format", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["breaks"] == 6 and data["notes"][0].startswith("1 file(s) do not parse on this Python and were skipped")
    # named on its own, it must parse
    assert main(["eng", str(bad), "--format", "json"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(
        f"workbench check-contracts: error: target file does not parse: {bad} (SyntaxError: "
    )
    assert json.loads(captured.out) == {
        "ok": False,
        "error": captured.err.removeprefix("workbench check-contracts: error: ").strip(),
    }
    assert main(["--no-such-flag"]) == 2


def test_usage_errors_and_help(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as raised:
        cli.main(["check-contracts", "--help"])
    assert raised.value.code == 0
    out = capsys.readouterr().out
    for option in ("--base", "--search-path", "--method", "--format {text,json,github}", "--bench"):
        assert option in out
    assert main(["--format", "xml"]) == 2


def test_json_format(capsys: pytest.CaptureFixture) -> None:
    assert main(["eng", "--format", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data == json.loads(json.dumps(check(ENG).to_dict())) | {"seconds": data["seconds"]}
    first = data["findings"][0]
    assert first["cls"] == "AscendMambaBackend" and first["method"] == "_replay_metadata"
    assert first["site_line"] == 17 and first["caller"] == "MambaAttnBackendBase.init_forward_metadata_out_graph"
    assert first["message"] == (
        "TypeError: AscendMambaBackend._replay_metadata() got an unexpected keyword argument 'in_capture'"
    )
    assert first["tier"] == "break" and first["subclasses"] == ["AscendMambaBackend"]
    inherited = next(f for f in data["findings"] if f["cls"] == "AscendOneKeywordBackend")
    assert inherited["subclasses"] == ["AscendOneKeywordBackend", "AscendMTPBackend"]
    assert data["ok"] is False and len(data["findings"]) == data["breaks"] == 6 and data["drift"] == 0
    for key in ("file", "line", "cls", "method", "kind", "message", "site_file", "site_line", "caller", "tier"):
        assert all(key in f for f in data["findings"]), key


def test_github_format(capsys: pytest.CaptureFixture) -> None:
    assert main(["eng", "--format", "github"]) == 1
    lines = capsys.readouterr().out.splitlines()
    errors = [line for line in lines if line.startswith("::error ")]
    assert (
        len(errors) == 6
        and lines[-1] == "6 breaks; 0 drift (signature differences no call in the trees shows; --drift lists them)"
    )
    assert errors[0] == (
        "::error file=eng/hardware/npu/ascend_backend.py,line=12,title=check-contracts break missing-parameter::"
        "AscendMambaBackend._replay_metadata: TypeError: AscendMambaBackend._replay_metadata() got an unexpected "
        "keyword argument 'in_capture' (call at eng/layers/attention/mamba_backend.py:17: "
        "self._replay_metadata(bs, ..., ..., forward_batch.spec_info, ..., num_padding=..., in_capture=in_capture, "
        "mamba_track_indices=...))"
    )
    argv = ["ctr_broken.py", "--base", OLD_BASE, "--format", "github", "--search-path", "."]
    assert main(argv) == 0  # drift only: shown as warnings with --drift, failing only with --strict
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith("::")]
    assert main([*argv, "--drift", "--strict"]) == 1
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("::warning ")]
    assert warnings[0] == (
        "::warning file=ctr_broken.py,line=7,title=check-contracts drift missing-parameter::MissingInCapture."
        "init_forward_metadata_out_graph: TypeError: MissingInCapture.init_forward_metadata_out_graph() got an "
        "unexpected keyword argument 'in_capture' (call: obj.init_forward_metadata_out_graph(batch, in_capture=...))"
    )


def test_bench_mode_prints_files_per_second(capsys: pytest.CaptureFixture) -> None:
    assert main(["--bench", "60", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["files"] == 60 and data["findings"] == data["planted"] == 2
    assert data["files_per_second"] > 0 and data["text"].endswith("files/s")


def test_hook_mode_allows_changed_files_without_subclasses(capsys: pytest.CaptureFixture) -> None:
    """pre-commit passes the changed files: one with no subclass is nothing to check, not an error."""
    target = "eng/layers/attention/base_attn_backend.py"
    assert main([target]) == 2
    capsys.readouterr()
    assert main([target, "--allow-nothing"]) == 0
    assert capsys.readouterr().out.startswith("check-contracts: nothing to check: no class in the targets derives")
    assert main(["eng/hardware/npu/variants.py", "--allow-nothing"]) == 1  # findings still fail the hook


def test_pre_commit_hook_entries_run_this_command() -> None:
    import yaml

    hooks = yaml.safe_load((Path(__file__).parents[1] / ".pre-commit-hooks.yaml").read_text())
    assert [hook["id"] for hook in hooks] == ["check-contracts", "check-contracts-system"]
    script, system = hooks
    assert system["entry"] == "workbench check-contracts --allow-nothing" and system["types"] == ["python"]
    assert main(system["entry"].split()[2:] + ["eng/hardware/npu/ascend_backend.py"]) == 1
    # the script hook installs nothing: it runs this checkout's check-contracts with --allow-nothing
    assert script["language"] == "script" and script["types"] == ["python"]
    assert "--allow-nothing" in (Path(__file__).parents[1] / script["entry"]).read_text()


# -- a user's file on the workbench's own bases: no --base needed ------------------------------------------
USER_BACKENDS = Path(__file__).parent / "fixtures" / "user_backends"


def test_a_user_file_on_workbench_bases_is_checked_without_base(capsys: pytest.CaptureFixture) -> None:
    assert main([str(USER_BACKENDS / "in_capture_bug.py")]) == 1
    out = capsys.readouterr().out
    assert "AscendBackend.init_forward_metadata_out_graph [missing-parameter]" in out
    assert "unexpected keyword argument 'in_capture'" in out
    # the call that breaks is the workbench runner's, read from the installed workbench
    assert "runner/runner.py" in out and f"in {runner_capture_caller()}" in out
    assert "checked against the workbench's own workbench.backends.npu:NpuMetadataBackend" in out
    assert main([str(USER_BACKENDS / "correct.py")]) == 0
    out = capsys.readouterr().out
    assert "checked 4 classes in 1 files" in out
    assert out.rstrip().endswith("OK: no breaks; 0 drift (signature differences no call in the trees shows; "
                                 "--drift lists them)")  # fmt: skip
    # the same as naming the base, which still works
    assert main([str(USER_BACKENDS / "in_capture_bug.py"), "--base", "workbench.backends:MetadataBackend"]) == 1
    assert "'in_capture'" in capsys.readouterr().out


def test_a_file_adding_its_own_base_is_checked_against_the_workbench_too(tmp_path: Path) -> None:
    # a file that defines its own base on the workbench's classes: its base and the workbench's are contracts
    (tmp_path / "own.py").write_text(
        "from workbench.backends import MetadataBackend\n\n"
        "class Mine(MetadataBackend):\n    def hook(self, x):\n        return self.step(x, flag=True)\n"
        "    def step(self, x, flag=False):\n        return x\n\n"
        "class Sub(Mine):\n    def step(self, x):\n        return x\n"
    )
    report = check(str(tmp_path / "own.py"))
    assert [c.base.rpartition(":")[2] for c in report.contracts] == ["MetadataBackend", "Mine"]
    (finding,) = report.findings
    assert (finding.cls, finding.method) == ("Sub", "step") and "'flag'" in finding.message
    assert report.base == "every base class in the trees"
    assert report.notes[0] == (
        "the targets derive from the workbench's own workbench.backends.base:MetadataBackend: checked against "
        "those too, with the calls the workbench's runner makes"
    )


def test_a_control_character_in_the_base_stays_on_one_escaped_line(capsys: pytest.CaptureFixture) -> None:
    """Found by the CLI fuzz: the hint repeated the value unescaped, and a carriage return split the line."""
    for base in ("\r0", "x:\r0", "a\nb"):
        assert main(["--base", base]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and ("\\r" in err or "\\n" in err), err


def runner_capture_caller() -> str:
    """The ``GraphRunner`` method that calls ``init_forward_metadata_out_graph(..., in_capture=True)``, read
    from the runner's source: the name the checker gives the call's caller, whatever the runner calls it."""
    import ast

    import workbench.runner.runner as runner_module

    tree = ast.parse(Path(runner_module.__file__).read_text())
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GraphRunner"):
        for method in (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(method):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                if node.func.attr == "init_forward_metadata_out_graph" and any(
                    k.arg == "in_capture" for k in node.keywords
                ):
                    return f"GraphRunner.{method.name}"
    raise AssertionError("no GraphRunner method calls init_forward_metadata_out_graph(..., in_capture=...)")
