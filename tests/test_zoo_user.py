"""The zoo against the user's code: ``zoo.check_backend`` / ``check_kernel`` / ``ZooCase.run_with`` and
``workbench zoo --metadata-backend / --kernel``: each bug named by its own case and PR, a correct backend
clean, a case that cannot apply saying why, and a failing case exported as a standalone pytest file."""

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernels import causal_conv1d, gated_delta_rule
from workbench import zoo
from workbench.backends import MetadataBackend, NpuMetadataBackend
from workbench.cli import main
from workbench.zoo import ZooCase
from workbench.zoo.export import to_pytest, write_pytest
from workbench.zoo.result import Interrupted, NotApplicable, RaisedError, ZooError
from workbench.zoo.uninit_pad import skips_padded_outputs

USER = Path(__file__).parent / "fixtures" / "user_backends"
BACKEND_CASES = [
    "in_capture",
    "contract_drift",
    "stale_rows",
    "verify_alias",
    "host_value",
    "tail_slice",
    "rebuilt_tensors",
    "fill_count",
    "slot_reuse",
    "dp_dummy_rows",
    "chunk_initial_state",
]


def test_every_case_says_what_it_exercises():
    by = {c.name: c.subject for c in zoo.cases()}
    assert [n for n, s in by.items() if s == "metadata_backend"] == BACKEND_CASES
    assert [n for n, s in by.items() if s == "kernel"] == ["uninit_pad"]
    for case in zoo.cases():
        if case.subject is None:
            assert case.why_not and case.run_fn is not None
        else:
            assert case.mechanism and len(case.steps.split()) > 15


# -- the case's own scenario, shared -------------------------------------------------------------------------
@pytest.mark.parametrize("name", [*BACKEND_CASES, "uninit_pad"])
def test_own_variants_through_run_with_reproduce_and_clean(name):
    """The unfixed and fixed runs are the scenario with the case's own subjects: through ``run_with`` the
    broken one reproduces (by this case's mechanism, not some other failure) and the fixed one is clean."""
    case = zoo.get(name)
    broken = case.run_with(case.variant(False), profile=case.profile)
    fixed = case.run_with(case.variant(True), profile=case.profile)
    assert broken.status == "reproduced", broken
    assert fixed.status == "clean", fixed
    assert [type(e) for e in broken.evidence] == [type(e) for e in case.run(False).evidence]


# -- the command line: three bugs named, correct backends clean ----------------------------------------------
@pytest.mark.parametrize(
    ("spec", "case", "issue"),
    [
        ("in_capture_bug.py:AscendBackend", "in_capture", "sglang PR 29598"),
        ("rebuilt_tensors_bug.py:FreshTensorsBackend", "rebuilt_tensors", "sglang issue 26019"),
        ("host_read_bug.py:MaxLenBackend", "host_value", "sglang PR 16186"),
    ],
    ids=["in_capture", "rebuilt_tensors", "host_read"],
)
def test_cli_names_the_bug_a_user_backend_carries(spec, case, issue, capsys):
    assert main(["zoo", "--metadata-backend", str(USER / spec)]) == 1
    out = capsys.readouterr().out.splitlines()
    named = [line for line in out if "REPRODUCED" in line]
    assert len(named) == 1, out  # this bug's case, and no other, says it reproduced
    assert named[0].startswith(case) and issue in named[0]
    assert f"1 reproduced ({case}: {issue})" in out[-1]
    assert not any(line.split()[-1] == "clean" for line in out if "OTHER FAILURE" in line)


def test_cli_evidence_of_each_bug(capsys):
    main(["zoo", "--metadata-backend", str(USER / "host_read_bug.py:MaxLenBackend"), "host_value", "in_capture"])
    host, cap, verdict = capsys.readouterr().out.splitlines()
    assert (
        "recorder refused aten._local_scalar_dense.default at host_read_bug.py:12 in init_forward_metadata_in_graph"
        in host
    )
    # capture died on the host read: in_capture could not look, and says so instead of "clean"
    assert "OTHER FAILURE (not this case's bug): stopped by CaptureError: host sync during capture" in cap
    assert "1 reproduced (host_value: sglang PR 16186), 1 other failure(s), 0 clean, 0 not applicable" in verdict
    main(["zoo", "--metadata-backend", str(USER / "rebuilt_tensors_bug.py:FreshTensorsBackend"), "rebuilt_tensors"])
    line = capsys.readouterr().out.splitlines()[0]
    assert "REPRODUCED: state_indices: written at 0x" in line and "the graph reads 0x" in line


@pytest.mark.parametrize(
    "spec",
    [
        f"{USER}/correct.py:AscendBackend",
        f"{USER}/correct.py:FreshTensorsBackend",
        f"{USER}/correct.py:MaxLenBackend",
        f"{USER}/correct.py:PlainBackend",
    ],
    ids=["ascend", "in-place", "device-max", "plain"],
)
def test_cli_a_correct_backend_is_clean(spec, capsys):
    assert main(["zoo", "--metadata-backend", spec]) == 0
    out = capsys.readouterr().out.splitlines()
    assert not [line for line in out if "REPRODUCED" in line or "OTHER FAILURE" in line]
    assert sum(line.endswith("  clean") for line in out) == 9  # two cases do not apply to either family
    assert ", 0 other failure(s), 9 clean, 2 not applicable" in out[-1]


def test_cli_json(capsys):
    spec = str(USER / "in_capture_bug.py:AscendBackend")
    assert main(["zoo", "--metadata-backend", spec, "in_capture", "fill_count", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False and data["exported"] == []
    (check,) = data["checks"]
    assert check["kind"] == "metadata_backend" and check["subject"].endswith("in_capture_bug.py:AscendBackend")
    cap, fill = check["cases"]
    assert (cap["status"], cap["profile"], cap["evidence"][0]["kind"]) == ("reproduced", "sglang-ascend", "RaisedError")
    assert fill["status"] == "not applicable" and "padded seq_lens hold 0" in fill["not_applicable"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--metadata-backend", "nope.py:X"], "'nope.py:X': no file 'nope.py'"),
        (["--metadata-backend", f"{USER}/correct.py:Nope"], "defines no 'Nope'"),
        (["--metadata-backend", "workbench.batch:Batch"], "metadata_backend: Batch is not a subclass of"),
        (["--metadata-backend", "workbench.backends"], "expected MODULE:NAME or path/to/file.py:NAME"),
        (["--metadata-backend", "workbench.backends:MetadataBackend", "nope"], "unknown case 'nope'"),
        (["--kernel", "workbench.backends:MetadataBackend"], "kernel: expected a function"),
        (["--metadata-backend", "workbench.backends:MetadataBackend", "--export", __file__], "is a file, not a folder"),
        (["--profile", "vllm"], "--profile needs --metadata-backend"),
    ],
    ids=[
        "no-file",
        "no-name",
        "not-a-backend",
        "no-colon",
        "unknown-case",
        "class-as-kernel",
        "file-dir",
        "no-subject",
    ],
)
def test_cli_bad_input_is_one_line_exit_2(argv, message, capsys):
    assert main(["zoo", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith("workbench zoo: error: ") and message in captured.err


# -- a backend whose hooks route through its own base ---------------------------------------------------
ROUTED = textwrap.dedent(
    """
    from workbench.backends import MetadataBackend


    class MyBase(MetadataBackend):
        def init_forward_metadata_out_graph(self, batch, in_capture: bool = False):
            return self._replay_metadata(batch, in_capture=in_capture)

        def _replay_metadata(self, batch, in_capture: bool = False):
            return super().init_forward_metadata_out_graph(batch, in_capture=in_capture)


    class MyBackend(MyBase):
        def _replay_metadata(self, batch, in_capture: bool = False):
            return super()._replay_metadata(batch, in_capture=in_capture)


    class NoInCapture(MyBase):  # the in_capture bug, behind its own base
        def _replay_metadata(self, batch):
            return super()._replay_metadata(batch)


    class HostRead(MyBackend):  # the host_value bug, behind its own base
        def init_forward_metadata_in_graph(self, batch):
            self.max_seq_len = int(self.forward_metadata.seq_lens.max().item())
    """
)


@pytest.fixture(scope="module")
def routed(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("engine") / "routed.py"
    path.write_text(ROUTED)
    return path


def test_cli_a_correct_backend_routed_through_its_own_base_exits_0(routed, capsys):
    """contract_drift stacks its base under the user's class; under a class whose own base routes the hook
    through ``_replay_metadata`` the two would call each other forever: the case cannot apply, and says so
    (it was "OTHER FAILURE: RecursionError", failing a correct class)."""
    assert main(["zoo", "--metadata-backend", f"{routed}:MyBackend"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert not [line for line in out if "REPRODUCED" in line or "OTHER FAILURE" in line], out
    (drift,) = [line for line in out if line.startswith("contract_drift")]
    assert "not applicable: MyBase.init_forward_metadata_out_graph calls _replay_metadata itself" in drift
    assert ", 0 other failure(s), 9 clean, 2 not applicable" in out[-1]


@pytest.mark.parametrize(
    ("cls", "cases"),
    [("NoInCapture", ["in_capture", "contract_drift"]), ("HostRead", ["host_value"])],
    ids=["no-in-capture", "host-read"],
)
def test_cli_a_buggy_twin_routed_through_its_own_base_still_reproduces(routed, cls, cases, capsys):
    assert main(["zoo", "--metadata-backend", f"{routed}:{cls}", "in_capture", "contract_drift", "host_value"]) == 1
    out = capsys.readouterr().out.splitlines()
    reproduced = [line.split()[0] for line in out if "REPRODUCED" in line]
    assert reproduced == cases, out


def test_contract_drift_tells_a_base_it_cannot_stack_from_a_bug():
    """The case puts its base under a class of the user's: a class whose public hook reaches that base still
    shows the one-keyword bug; one whose public hook answers without it cannot be checked, and says why."""
    case = zoo.get("contract_drift")

    class OneKeyword(NpuMetadataBackend):  # overrides the private hook only: the case's own broken shape
        def _replay_metadata(self, batch, in_capture: bool = False):
            return super()._replay_metadata(batch, in_capture=in_capture)

    class PublicThenSuper(OneKeyword):  # its own public hook calls the base's: the base is reached
        def init_forward_metadata_out_graph(self, batch, in_capture: bool = False):
            return super().init_forward_metadata_out_graph(batch, in_capture=in_capture)

    class Shadowing(NpuMetadataBackend):  # its own public hook never reaches the base's
        def init_forward_metadata_out_graph(self, batch, in_capture: bool = False):
            return self._replay_metadata(batch, in_capture=in_capture)

        def _replay_metadata(self, batch, in_capture: bool = False):
            return NpuMetadataBackend.init_forward_metadata_out_graph(self, batch, in_capture=in_capture)

    for cls in (OneKeyword, PublicThenSuper):
        res = case.run_with(cls)
        assert res.status == "reproduced" and "'mamba_track_indices'" in res.summary, res
    res = case.run_with(Shadowing)
    assert res.status == "not applicable" and res.evidence == ()
    assert "prepares the metadata without calling the base's" in res.not_applicable
    assert "workbench check-contracts FILE" in res.not_applicable
    assert zoo.check_backend(Shadowing, ["contract_drift"]).ok


def test_a_scenario_that_finds_it_cannot_apply_says_not_applicable():
    """``NotApplicable`` raised by a scenario once it runs: "not applicable" with its words, not a failure."""

    def scenario(cls, profile, backend):
        raise NotApplicable("the class answers the hook itself")

    case = ZooCase(
        name="t", title="t", issue="i", profile="sglang", explanation="e", subject="metadata_backend",
        scenario=scenario, variant=lambda fixed: MetadataBackend, mechanism=(RaisedError,),
    )  # fmt: skip
    res = case.run_with(MetadataBackend)
    assert (res.status, res.not_applicable, res.evidence) == ("not applicable", "the class answers the hook itself", ())


# -- --export DIR ----------------------------------------------------------------------------------------
def test_cli_export_makes_a_missing_folder_parents_too(tmp_path, capsys):
    out = tmp_path / "reports" / "zoo"
    argv = ["zoo", "--metadata-backend", f"{USER}/in_capture_bug.py:AscendBackend", "in_capture", "--export", str(out)]
    assert main(argv) == 1
    assert capsys.readouterr().out.splitlines()[-1] == f"exported {out / 'test_in_capture.py'}"
    assert [p.name for p in out.iterdir()] == ["test_in_capture.py"]
    # a clean run exports nothing, and still makes the folder it was given
    clean = tmp_path / "clean" / "zoo"
    spec = f"{USER}/correct.py:AscendBackend"
    assert main(["zoo", "--metadata-backend", spec, "in_capture", "--export", str(clean)]) == 0
    assert clean.is_dir() and list(clean.iterdir()) == []


@pytest.mark.parametrize("bad", ["file", "under-a-file", "read-only"])
def test_cli_export_refuses_a_bad_folder_before_any_case_runs(bad, tmp_path, monkeypatch, capsys):
    from workbench.zoo import cli as zoo_cli
    from workbench.zoo import export

    def ran(*args, **kwargs):
        raise AssertionError("a case ran before --export was checked")

    monkeypatch.setattr(zoo_cli, "check_backend", ran)
    afile = tmp_path / "afile"
    afile.write_text("")
    folder, words = {
        "file": (afile, "is a file, not a folder"),
        "under-a-file": (afile / "zoo", f"{str(afile)!r} on its way is a file"),
        "read-only": (tmp_path / "ro" / "zoo", f"cannot write into the folder {str(tmp_path)!r}"),
    }[bad]
    if bad == "read-only":  # root writes anywhere: the check's own question, answered no
        monkeypatch.setattr(export.os, "access", lambda path, mode: False)
    argv = ["zoo", "--metadata-backend", f"{USER}/in_capture_bug.py:AscendBackend", "--export", str(folder)]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith("workbench zoo: error: --export: ") and words in captured.err
    assert not (tmp_path / "ro").exists()


def test_write_pytest_makes_its_folder(tmp_path):
    (res,) = zoo.check_backend(f"{USER}/in_capture_bug.py:AscendBackend", ["in_capture"])
    path = write_pytest(res, tmp_path / "a" / "b")
    assert path == tmp_path / "a" / "b" / "test_in_capture.py" and "sglang PR 29598" in path.read_text()


# -- Python: applicability, failures that are not the bug ------------------------------------------------
def test_a_case_that_cannot_apply_says_why_never_clean():
    checks = zoo.check_backend(MetadataBackend, ["verify_alias", "dummy_slot", "uninit_pad"])
    status = {r.case: r.status for r in checks}
    assert status == {n: "not applicable" for n in ("verify_alias", "dummy_slot", "uninit_pad")}
    why = {r.case: r.not_applicable for r in checks}
    assert "skip padded rows" in why["verify_alias"] and "state pool's allocator" in why["dummy_slot"]
    assert "exercises a kernel (causal_conv1d.update)" in why["uninit_pad"]
    assert checks.ok and "no case applies, nothing was checked" in checks.verdict()
    # the same case applies once the profile processes padding
    assert zoo.get("verify_alias").run_with(MetadataBackend, profile="sglang-ascend").status == "clean"
    assert zoo.get("fill_count").run_with(NpuMetadataBackend).not_applicable is not None  # ascend's fill is 0


def test_a_scenario_stopped_by_another_error_is_not_clean():
    class Unbuildable(MetadataBackend):
        def __init__(self, *args, **kwargs):
            raise RuntimeError("needs a scheduler")

    res = zoo.get("fill_count").run_with(Unbuildable)
    assert res.status == "other failure" and not res.reproduced
    (stop,) = res.evidence
    assert isinstance(stop, Interrupted) and stop.message == "needs a scheduler" and "__init__" in stop.where
    checks = zoo.check_backend(Unbuildable, ["fill_count"])
    assert not checks.ok and checks.exit_code == 1


def test_check_backend_refuses_what_is_not_a_backend():
    with pytest.raises(ZooError, match="metadata_backend: int is not a subclass"):
        zoo.check_backend(int)  # type: ignore[arg-type]
    with pytest.raises(ZooError, match="names: expected a list"):
        zoo.check_backend(MetadataBackend, "fill_count")
    with pytest.raises(ZooError, match="backend: 'tpu'"):
        zoo.get("fill_count").run_with(MetadataBackend, backend="tpu")


def test_results_render_their_status():
    checks = zoo.check_backend(f"{USER}/in_capture_bug.py:AscendBackend", ["in_capture", "fill_count"])
    text = checks._repr_html_()
    assert "wb-fail" in text and "reproduced" in text and "not applicable" in text
    assert "REPRODUCED" in repr(checks)
    assert "REPRODUCED" in repr(checks[0]) and "against" in repr(checks[0])
    assert "wb-na" in checks[1]._repr_html_() and "wb-ok" not in checks[1]._repr_html_()


# -- kernels ------------------------------------------------------------------------------------------------
def test_check_kernel_uninit_pad():
    (bad,) = zoo.check_kernel(skips_padded_outputs)
    assert bad.status == "reproduced" and bad.summary.startswith("NaN in row(s) [3]: conv output")
    (good,) = zoo.check_kernel(causal_conv1d.update)
    assert good.status == "clean"
    (skipped,) = zoo.check_kernel(causal_conv1d.update, profile="sglang-ascend")
    assert skipped.status == "not applicable" and "processed on the dummy slot" in skipped.not_applicable
    (wrong,) = zoo.check_kernel(gated_delta_rule.recurrent)  # not a conv update: it cannot run the scenario
    assert wrong.status == "other failure" and "stopped by TypeError" in wrong.summary
    (guard,) = zoo.check_kernel(causal_conv1d.update, ["sentinel_guard"])
    assert guard.status == "not applicable" and "workbench check-kernel" in guard.not_applicable


def test_cli_kernel(capsys):
    assert main(["zoo", "--kernel", "workbench.zoo.uninit_pad:skips_padded_outputs"]) == 1
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("uninit_pad") and "sglang PR 30974" in line and "REPRODUCED: NaN in row(s) [3]" in line
    assert main(["zoo", "--kernel", "kernels.causal_conv1d:update"]) == 0


# -- export ------------------------------------------------------------------------------------------------
def _pytest(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path)],
        cwd=path.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow  # two pytest subprocesses, each importing torch
def test_export_fails_while_the_bug_is_there_and_passes_once_fixed(tmp_path, capsys):
    engine = tmp_path / "engine"
    engine.mkdir()
    out = tmp_path / "exported"
    out.mkdir()
    backend = engine / "npu_backend.py"
    shutil.copy(USER / "in_capture_bug.py", backend)
    argv = ["zoo", "--metadata-backend", f"{backend}:AscendBackend", "in_capture", "fill_count", "--export", str(out)]
    assert main(argv) == 1
    assert capsys.readouterr().out.splitlines()[-1] == f"exported {out / 'test_in_capture.py'}"
    assert sorted(p.name for p in out.iterdir()) == ["test_in_capture.py"]  # not-applicable cases are not exported
    test = out / "test_in_capture.py"
    text = test.read_text()
    assert "sglang PR 29598" in text and "unexpected keyword argument 'in_capture'" in text  # what it saw
    assert "STEPS = " in text and "PROFILE = 'sglang-ascend'" in text
    failing = _pytest(test)
    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert "in_capture (sglang PR 29598): reproduced" in failing.stdout
    # the engine PR fixes the backend in place: the same test now passes
    backend.write_text((USER / "correct.py").read_text())
    passing = _pytest(test)
    assert passing.returncode == 0, passing.stdout + passing.stderr


def test_to_pytest_refuses_what_it_cannot_export():
    with pytest.raises(ZooError, match="the zoo's own variant"):
        to_pytest(zoo.get("fill_count").run(False))
    with pytest.raises(ZooError, match="does not apply"):
        to_pytest(zoo.get("verify_alias").run_with(MetadataBackend))

    class Local(MetadataBackend):
        pass

    with pytest.raises(ZooError, match="cannot be loaded by a standalone test"):
        to_pytest(zoo.get("fill_count").run_with(Local))
    with pytest.raises(ZooError, match="is a file, not a folder"):
        write_pytest(zoo.check_backend(f"{USER}/in_capture_bug.py:AscendBackend", ["in_capture"])[0], __file__)
