"""The commands that compute run torch at one thread unless told otherwise (issue 33): `bench --threads N`,
else LINATTN_THREADS, else one; a bad LINATTN_THREADS is one line naming it and exit 2; the caller's count
comes back after an in-process run; the commands that only build a table or read source are left alone."""

from __future__ import annotations

import argparse

import pytest
import torch
from _cli_run import run

from workbench import cli, threads
from workbench.measure.timing import Results

# a minimal command line per subcommand; its command function is replaced, so nothing runs
ARGV = {
    "bench": ["bench", "metadata", "--device", "cpu"],
    "trace": ["trace", "check", "trace.jsonl"],
    "check-kernel": ["check-kernel", "mine.py:attn", "--op", "linear_attn.recurrent"],
    "zoo": ["zoo"],
    "engine-check": ["engine-check", "sglang"],
    "report": ["report"],
    "demo": ["demo"],
    "metadata": ["metadata", "--seq-lens", "3"],
    "doctor": ["doctor"],
    "check-contracts": ["check-contracts", "mine.py"],
}


@pytest.fixture
def two_threads(monkeypatch):
    """The caller runs at two threads (not the suite's one), LINATTN_THREADS unset; restored after."""
    before = torch.get_num_threads()
    monkeypatch.delenv(threads.ENV, raising=False)
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def seen(monkeypatch) -> list[int]:
    """Every command's function replaced by one that records torch's thread count while it runs."""
    counts: list[int] = []
    real = cli._parse

    def parse(argv):
        args = real(argv)
        args.fn = lambda a: counts.append(torch.get_num_threads()) or 0
        return args

    monkeypatch.setattr(cli, "_parse", parse)
    return counts


def test_every_subcommand_says_whether_it_computes():
    names = set(cli.build_parser().parse_args(["doctor"])._subparsers)
    assert cli.COMPUTE_COMMANDS | cli.NO_COMPUTE_COMMANDS == names == set(ARGV)
    assert not cli.COMPUTE_COMMANDS & cli.NO_COMPUTE_COMMANDS
    assert cli.THREADS_ENV == threads.ENV


@pytest.mark.parametrize("command", sorted(cli.COMPUTE_COMMANDS))
def test_a_computing_command_runs_at_one_thread_by_default_and_gives_the_count_back(command, two_threads, seen):
    assert run(ARGV[command])[0] == 0
    assert seen == [1] and torch.get_num_threads() == 2


@pytest.mark.parametrize("command", sorted(cli.COMPUTE_COMMANDS))
def test_linattn_threads_sets_the_count(command, two_threads, seen, monkeypatch):
    torch.set_num_threads(1)
    monkeypatch.setenv(threads.ENV, "2")
    assert run(ARGV[command])[0] == 0
    assert seen == [2] and torch.get_num_threads() == 1


@pytest.mark.parametrize("command", sorted(cli.NO_COMPUTE_COMMANDS))
def test_the_other_commands_keep_the_count_and_ignore_the_variable(command, two_threads, seen, monkeypatch):
    monkeypatch.setenv(threads.ENV, "nope")
    assert run(ARGV[command])[0] == 0
    assert seen == [2]


@pytest.mark.parametrize("value", ["abc", "0", "-1", "1.5"])
@pytest.mark.parametrize("command", ["bench", "trace", "zoo"])
def test_a_bad_linattn_threads_is_refused_naming_the_variable(command, value, two_threads, seen, monkeypatch):
    monkeypatch.setenv(threads.ENV, value)
    code, out, err = run(ARGV[command])
    assert (code, out, seen) == (2, "", [])  # refused before the command ran
    assert err == f"workbench {command}: error: {threads.ENV}={value!r}: expected an int >= 1 or 'default'\n"
    assert torch.get_num_threads() == 2


def test_bench_threads_wins_over_the_variable(two_threads, seen, monkeypatch):
    monkeypatch.setenv(threads.ENV, "2")
    assert run([*ARGV["bench"], "--threads", "1"])[0] == 0
    assert seen == [1]
    monkeypatch.setenv(threads.ENV, "bad")  # --threads given: the variable is not read
    assert run([*ARGV["bench"], "--threads", "1"])[0] == 0


def test_default_keeps_torchs_own_count(two_threads, seen, monkeypatch):
    monkeypatch.setenv(threads.ENV, "default")
    assert run(ARGV["zoo"])[0] == 0
    assert seen == [2]


@pytest.mark.parametrize("env, expected", [(None, "1 torch thread"), ("2", "2 torch threads")])
def test_the_bench_header_names_the_count_the_run_used(env, expected, two_threads, monkeypatch, tmp_path):
    """`workbench bench` prints its header line first, with the count its figures were measured at."""
    if env:
        monkeypatch.setenv(threads.ENV, env)
    used: list[int] = []

    def fake(quick: bool, json_path: str, device: str) -> Results:
        used.append(torch.get_num_threads())
        print("figures")
        return Results(meta={"benchmark": "metadata"})

    monkeypatch.setattr(cli, "_benchmark", lambda what: fake)
    code, out, _ = run(["bench", "metadata", "--quick", "--device", "cpu", "--json", str(tmp_path / "m_cpu.json")])
    assert code == 0 and used == [int(expected[0])]
    assert out.splitlines()[:2] == [f"bench metadata on cpu, {expected}, quick", "figures"]


def test_the_help_of_bench_threads_says_the_default():
    text = cli.build_parser().parse_args(["doctor"])._subparsers["bench"].format_help()
    assert "LINATTN_THREADS when set, else 1" in " ".join(text.split())


def test_run_bench_still_takes_a_hand_built_namespace(tmp_path, two_threads):
    """`run_bench` outside `main` (a notebook): its own --threads still applies; torch's count stays as set."""
    from workbench.bench.cli import run_bench

    args = argparse.Namespace(
        what="metadata", quick=True, device="cpu", json=str(tmp_path / "m_cpu.json"), threads=1, plot=None,
        from_json=None,
    )  # fmt: skip
    seen: list[int] = []
    assert run_bench(args, lambda **kw: seen.append(torch.get_num_threads()) or Results()) == 0
    assert seen == [1]


@pytest.mark.slow  # a fresh interpreter importing torch; the in-process tests above cover the rules
def test_a_fresh_process_runs_a_bench_at_one_thread(tmp_path):
    """The whole path in a real process, where torch starts at its own count (one per core); the benchmark
    itself is a stand-in that says the count it ran at (a real one: test_bench_* in tests/test_report.py)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != threads.ENV}
    script = (
        "import sys; from workbench import cli\n"
        "def fake(**kw):\n"
        "    import torch; from workbench.measure.timing import Results\n"
        "    print('ran at', torch.get_num_threads()); return Results()\n"
        "cli._benchmark = lambda what: fake\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    argv = [
        sys.executable,
        "-c",
        script,
        "bench",
        "metadata",
        "--device",
        "cpu",
        "--json",
        str(tmp_path / "m_cpu.json"),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["bench metadata on cpu, 1 torch thread", "ran at 1"]
    bad = subprocess.run(argv, capture_output=True, text=True, timeout=300, env={**env, threads.ENV: "many"})
    assert (bad.returncode, bad.stdout) == (2, "")  # refused before torch's import: no cost
    assert bad.stderr == f"workbench bench: error: {threads.ENV}='many': expected an int >= 1 or 'default'\n"


@pytest.mark.parametrize("env, expected", [(None, 1), ("2", 2), ("default", 2)])
def test_build_report_runs_at_the_configured_count_and_gives_it_back(env, expected, two_threads, monkeypatch):
    """`build_report` called from Python (a notebook) honours LINATTN_THREADS as the commands do."""
    from workbench import report

    if env:
        monkeypatch.setenv(threads.ENV, env)
    torch.set_num_threads(2)
    used: list[int] = []
    monkeypatch.setattr(report, "_build", lambda dev, quick, progress: used.append(torch.get_num_threads()) or "")
    report.build_report(device="cpu")
    assert used == [expected] and torch.get_num_threads() == 2


@pytest.mark.parametrize(
    "env, says",
    [
        (None, "run at 1 (LINATTN_THREADS)"),
        ("3", "run at 3 (LINATTN_THREADS)"),
        ("default", "run at torch's own 2 (LINATTN_THREADS)"),
        ("x", "refuse to run: LINATTN_THREADS='x': expected an int >= 1 or 'default'"),
    ],
)
def test_doctor_says_the_count_the_commands_run_at(env, says, two_threads, monkeypatch):
    if env:
        monkeypatch.setenv(threads.ENV, env)
    code, out, _ = run(["doctor", "--no-npu-probe"])
    line = out.splitlines()[-1]
    assert code == 0 and line.startswith("torch threads: 2 by torch's default; the computing commands")
    assert line.endswith(says) and torch.get_num_threads() == 2
