"""Bad input the review found past the argument parser: each is one exact line and exit 2, before any work.

`bench --threads` past the cores, `check-contracts --bench` outside the synthetic tree's range, a mistyped
`--method` in discovery mode, `demo --out` into a missing folder, and a closed pipe on stdout.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from workbench import cli
from workbench.cli import MAX_THREADS, main
from workbench.contracts.check import ContractError, check
from workbench.contracts.synthetic import MAX_FILES, make_tree
from workbench.errors import CaptureError, DeviceUnavailable, MetadataError, WorkbenchError

ROOT = Path(__file__).parents[1]
ENG = ROOT / "tests" / "fixtures" / "contracts" / "eng"


def exit_and_err(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 2
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("threads", ["99999999999", "0", str(MAX_THREADS + 1)])
def test_bench_threads_is_checked_at_parse_time(threads, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = exit_and_err(["bench", "metadata", "--quick", "--threads", threads], capsys)
    assert code == 2 and out == ""
    assert err == (
        f"workbench bench: error: argument --threads: {int(threads)} is out of range: expected an int in "
        f"[1, {MAX_THREADS}] (see 'workbench bench --help')\n"
    )
    assert not (tmp_path / "bench-results").exists()  # refused before anything was written


@pytest.mark.parametrize("files", ["0", "5", "99999999999"])
def test_contracts_bench_size_is_checked_at_parse_time(files, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    code, out, err = exit_and_err(["check-contracts", "--bench", files], capsys)
    assert code == 2 and out == ""
    assert err == (
        f"workbench check-contracts: error: argument --bench: {int(files)} is out of range: expected an int in "
        f"[6, {MAX_FILES}] (see 'workbench check-contracts --help')\n"
    )
    assert list(tmp_path.iterdir()) == []  # no tree was started


def test_make_tree_refuses_with_a_contract_error(tmp_path):
    for files in (0, 5, MAX_FILES + 1, True):
        with pytest.raises(ContractError, match=rf"files = {files!r}: a synthetic tree has 6 to 100,000 files$"):
            make_tree(tmp_path, files)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("method", ["_replay_metadat", ""])
def test_a_mistyped_method_exits_2_in_discovery_mode(method, capsys, monkeypatch):
    monkeypatch.chdir(ENG.parent)
    code, out, err = exit_and_err(["check-contracts", "eng", "--method", method], capsys)
    assert code == 2 and out == ""
    assert err.startswith(f"workbench check-contracts: error: --method {method!r}: no base class found (")
    assert err.endswith(") defines or calls it\n") and err.count("\n") == 1
    # the real name still finds the broken hook
    assert main(["check-contracts", "eng", "--method", "_replay_metadata"]) == 1


def test_a_mistyped_method_is_a_contract_error_in_the_api():
    with pytest.raises(ContractError, match=r"--method 'nope': no base class found \(.*\) defines or calls it"):
        check(str(ENG), methods=["_replay_metadata", "nope"])


def test_demo_refuses_a_missing_folder_before_the_tour(capsys, tmp_path):
    missing = tmp_path / "nonexistent_dir" / "x.html"
    code, out, err = exit_and_err(["demo", "--out", str(missing)], capsys)
    assert code == 2 and out == ""  # the tour did not run: nothing was printed
    assert err == (f"workbench demo: error: --out: folder {str(missing.parent)!r} of {str(missing)!r} does not exist\n")


@pytest.mark.parametrize(
    "argv",
    [
        ["metadata", "--json", "--num-slots", "4000", "--seq-lens", ",".join(["7"] * 3000)],  # ~1 MB of JSON
        ["check-contracts", "--format", "json", str(ENG)],
    ],
    ids=["metadata", "check-contracts"],
)
def test_a_closed_pipe_is_no_traceback(argv):
    """`workbench ... | head -1`: the reader leaves after one line; no traceback, the command's exit code."""
    cmd = [sys.executable, "-m", "workbench", *argv]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # as `head -1` does after its line
    err = proc.stderr.read().decode()
    proc.stderr.close()
    proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert proc.returncode in (0, 1), (proc.returncode, err)  # 1: the closed pipe (or check-contracts' findings)


def test_broken_pipe_in_any_subcommand_exits_with_the_usual_code(monkeypatch, capsys):
    def closed(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "_cmd_doctor", closed)
    code, out, err = exit_and_err(["doctor"], capsys)
    assert (code, out, err) == (1, "", "")


def test_every_workbench_error_is_a_value_error():
    """User input is refused with ValueErrors; the two machine errors stay RuntimeErrors for old callers."""
    for error in (WorkbenchError, MetadataError, ContractError, CaptureError, DeviceUnavailable):
        assert issubclass(error, ValueError)
    assert issubclass(CaptureError, RuntimeError) and issubclass(DeviceUnavailable, RuntimeError)
    from workbench.devices import canonical_device

    with pytest.raises(ValueError, match="device 'nope': torch cannot allocate there"):
        canonical_device("nope")


def test_no_subcommand_prints_another_prefix(capsys):
    """check-contracts's lookup errors read as every other subcommand's."""
    code, _, err = exit_and_err(["check-contracts", "no_such_module_for_contracts"], capsys)
    assert code == 2
    assert err == "workbench check-contracts: error: no module or path named 'no_such_module_for_contracts'\n"


@pytest.mark.parametrize("command", ["metadata", "zoo", "bench metadata", "check-contracts", "doctor"])
def test_an_unknown_flag_is_refused_by_its_subcommand(command, capsys):
    """The subcommand's own prefix and --help, not the top-level parser's."""
    with pytest.raises(SystemExit) as e:
        main([*command.split(), "--no-such-flag"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    name = command.split()[0]
    assert err == f"workbench {name}: error: unrecognized arguments: --no-such-flag (see 'workbench {name} --help')"
