"""The `workbench` command line: tables and JSON for every profile and mode, errors, doctor."""

import argparse
import json
import shlex
import subprocess
import sys

import pytest

from workbench.cli import main

PROFILES = ["sglang", "sglang-ascend", "vllm"]


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize(
    "mode,extra,qsl",
    [
        ("decode", ["--seq-lens", "7,3,9"], [0, 1, 2, 3, 3]),
        ("target_verify", ["--seq-lens", "7,3,9", "-D", "2", "--buckets", "2,4"], [0, 2, 4, 6, 6]),
        ("extend", ["--extend-lens", "4,1,6", "--prefix-lens", "0,3,2"], [0, 4, 5, 11, 11]),
        ("idle", [], [0, 0]),
    ],
)
def test_metadata_json_all_profiles_modes(profile, mode, extra, qsl, capsys):
    assert main(["metadata", "--profile", profile, "--mode", mode, *extra, "--bucket", "auto", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["profile"] == profile and out["forward_mode"] == mode
    assert out["query_start_loc"] == qsl
    r = out["raw_batch_size"]
    pads = out["state_indices"][r:]
    sentinel = {"sglang": -1, "sglang-ascend": 0, "vllm": 0}[profile]
    flat = [v for row in pads for v in (row if isinstance(row, list) else [row])]
    assert flat and all(v == sentinel for v in flat)
    assert out["num_padding"] == out["batch_size"] - r


def test_metadata_table_text(capsys):
    assert main(["metadata", "--profile", "sglang", "--mode", "decode", "--seq-lens", "7,3,9"]) == 0
    out = capsys.readouterr().out
    assert "raw_bs=3  bs=4  padding=1" in out
    assert out.splitlines()[-2].split()[:5] == ["3", "pad", "skipped", "0", "-1"]
    assert "query_start_loc = [0, 1, 2, 3, 3]" in out


def error_line(argv, capsys):
    """The one stderr line of a refused command (argparse exits 2 through SystemExit, commands return 2)."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    assert code == 2 and not captured.out
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


def test_metadata_errors_are_clear(capsys):
    assert error_line(["metadata", "--mode", "decode", "--seq-lens", "3,0"], capsys) == (
        "workbench metadata: error: argument --seq-lens: 0 (item 1) is out of range: expected ints in "
        "[1, 2147483647] (see 'workbench metadata --help')"
    )
    assert error_line(["metadata", "--mode", "decode"], capsys) == (
        "workbench metadata: error: --seq-lens is required for --mode decode"
    )
    assert error_line(["metadata", "--seq-lens", "1,2,3", "--bucket", "2", "--buckets", "1,2"], capsys) == (
        "workbench metadata: error: --bucket 2 is smaller than the batch of 3 requests; a batch is never truncated"
    )


@pytest.mark.slow  # a fresh interpreter (subprocess)
def test_console_entry_point_runs():
    res = subprocess.run(
        [sys.executable, "-m", "workbench", "metadata", "--seq-lens", "5,6", "--profile", "vllm"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "profile=vllm" in res.stdout


def test_doctor_reports_every_device(capsys):
    assert main(["doctor", "--no-npu-probe"]) == 0
    out = capsys.readouterr().out
    for name in ("cpu", "cuda", "npu", "triton"):
        assert any(line.startswith(name) for line in out.splitlines())


def test_devices_explains_npu():
    from workbench.devices import devices

    npu = {d.name: d for d in devices()}["npu"]
    assert not npu.usable and "torch_npu" in npu.detail


def test_demo_prints_tour(capsys):
    from workbench.demo import run_demo

    assert run_demo() == 0
    out = capsys.readouterr().out
    assert out.count("profile=") == 6


def test_bench_routes_each_benchmark_to_its_module():
    """`workbench bench widgets` lives with the widgets, the others in workbench.bench; each has a run()."""
    import inspect

    from workbench import cli

    assert cli.BENCHMARKS["widgets"] == "workbench.widgets.bench"
    for what in cli.BENCHMARKS:
        run = cli._benchmark(what)
        assert {"quick", "json_path", "device"} <= set(inspect.signature(run).parameters), what


# -- issue 12: every bad input is one line naming the argument, the value and the accepted range ----------------
@pytest.fixture
def machine_24gib(monkeypatch):
    from workbench import limits

    monkeypatch.setattr(limits, "host_memory_bytes", lambda: 24 * 2**30)


@pytest.mark.parametrize(
    "argv,line",
    [
        (
            ["--seq-lens", "99999999999,1"],
            "argument --seq-lens: 99999999999 (item 0) is out of range: expected ints in [1, 2147483647] "
            "(see 'workbench metadata --help')",
        ),
        (
            ["--seq-lens", "1", "--num-slots", "10000000000"],
            "argument --num-slots: 10000000000 needs 73 GiB for a slot mapping of 10,000,000,000 rows of 4 B and "
            "the default bucket list (21 GiB), with 25% headroom; this machine has 24 GiB free "
            "(see 'workbench metadata --help')",
        ),
        (["--mode", "target_verify", "--seq-lens", "7,3"], "--draft-tokens is required for --mode target_verify"),
        (
            ["--mode", "decode", "-D", "3", "--seq-lens", "7,3"],
            "--draft-tokens does not apply to --mode decode (it reads --seq-lens)",
        ),
        (
            ["--mode", "idle", "--seq-lens", "1,2"],
            "--seq-lens does not apply to --mode idle (it reads no per-request flag)",
        ),
        (
            ["--mode", "extend", "--extend-lens", "4,1", "--seq-lens", "5,5"],
            "--seq-lens does not apply to --mode extend (it reads --extend-lens, --prefix-lens)",
        ),
        (
            ["--num-slots", "2", "--seq-lens", "1,2,3"],
            "--num-slots 2 is too small for 3 request(s): they need 4 slots with the reserved dummy slot; "
            "pass --num-slots 4 or more",
        ),
        (
            ["--profile", "vllm", "--mode", "target_verify", "-D", "3", "--seq-lens", "1,2", "--num-slots", "6"],
            "--num-slots 6 is too small for 2 request(s) of 3 slots each (the profile keeps one per draft token): they "
            "need 7 slots with the reserved dummy slot; pass --num-slots 7 or more",
        ),
        (
            ["--mode", "extend", "--extend-lens", "2000000000,2000000000"],
            "--extend-lens sums to 4,000,000,000 tokens in one step; the total must fit int32 (2,147,483,647)",
        ),
        (
            ["--mode", "extend", "--extend-lens", "5,2000000000", "--prefix-lens", "0,2000000000"],
            "--prefix-lens + --extend-lens = 4,000,000,000 (item 1): a sequence length must fit int32 (2,147,483,647)",
        ),
        (
            ["--mode", "target_verify", "-D", "2000000000", "--seq-lens", "1,2"],
            "--draft-tokens 2000000000 x 2 request(s) = 4,000,000,000 tokens in one step; the total must fit "
            "int32 (2,147,483,647)",
        ),
        (
            ["--mode", "extend", "--extend-lens", "4,1", "--prefix-lens", "0"],
            "--prefix-lens has 1 values for 2 requests in --extend-lens",
        ),
        (
            ["--seq-lens", "1", "--bucket", "3"],
            "--bucket 3 is not a captured size; captured (the sglang list for --num-slots 64): "
            "[1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 63]",
        ),
        (
            ["--seq-lens", "1", "--bucket", "3", "--buckets", "1,2"],
            "--bucket 3 is not a captured size; captured (--buckets): [1, 2]",
        ),
        (
            ["--seq-lens", "1", "--buckets", "2000000000"],
            "--buckets 2000000000 needs 54 GiB for metadata of 2,000,000,000 padded rows; this machine has 24 GiB free",
        ),
        (
            ["--seq-lens", "1", "--bucket", "none", "--buckets", "1,2"],
            "--buckets does not apply with --bucket none (no padding, no captured sizes)",
        ),
        (
            ["--seq-lens", "1", "--buckets", "4,2"],
            "--buckets must be strictly increasing: 2 (item 1) after 4",
        ),
        (
            ["--seq-lens", "1,,2"],
            "argument --seq-lens: item 1 of '1,,2' is '': expected comma-separated ints "
            "(see 'workbench metadata --help')",
        ),
        (
            ["--seq-lens", "1", "-D", "x"],
            "argument --draft-tokens/-D: expected an int, got 'x' (see 'workbench metadata --help')",
        ),
    ],
)
def test_metadata_bad_input_is_one_exact_line(argv, line, capsys, machine_24gib):
    got = error_line(["metadata", *argv], capsys)
    prefix = "workbench metadata: error: "
    assert got == prefix + line


def test_large_pool_is_allowed(capsys, machine_24gib):
    """10^8 slots (400 MB of mapping) is allowed and builds no per-slot Python list (it took 33 s and 9 GB)."""
    assert main(["metadata", "--num-slots", "100000000", "--seq-lens", "3,4", "--bucket", "none", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["state_indices"] == [1, 2] and out["query_start_loc"] == [0, 1, 2]


def test_unknown_flag_is_one_line_under_its_subcommand(capsys):
    assert error_line(["metadata", "--seq-lens", "1", "--bogus"], capsys) == (
        "workbench metadata: error: unrecognized arguments: --bogus (see 'workbench metadata --help')"
    )


def subcommand_parsers():
    from workbench.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices


@pytest.mark.parametrize("name", ["metadata", "doctor", "bench", "report", "check-contracts", "zoo", "demo"])
def test_help_has_text_defaults_and_a_parsable_example(name):
    from workbench.cli import build_parser

    parser = subcommand_parsers()[name]
    formatter = parser._get_formatter()
    for action in parser._actions:
        assert action.help, f"{name} {action.option_strings or action.dest} has no help text"
        if action.default not in (None, False, argparse.SUPPRESS):
            shown = formatter._get_help_string(action)
            assert "default" in shown, f"{name} {action.option_strings or action.dest}: default not shown"
    example = parser.epilog.split("example:\n", 1)[1].strip()
    assert example.startswith(f"workbench {name}")
    build_parser().parse_args(shlex.split(example)[1:])  # the example itself is valid


def test_top_level_help_says_what_the_workbench_is_and_lists_every_command(capsys):
    """`workbench --help` is for the user: what the tool does and its commands, not a module's docstring."""
    from workbench.cli import SUBCOMMANDS

    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    intro = text.split("options:")[0]
    assert "linattn-workbench" in intro and "serving engines" in intro and "workbench demo" in intro
    for internal in ("``", "dispatcher", "lazily", "entry point", "imports"):
        assert internal not in text, f"internal wording {internal!r} in `workbench --help`:\n{text}"
    from workbench.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    summaries = {a.dest: a.help for a in sub._choices_actions}
    assert len(summaries) == len(SUBCOMMANDS)
    for name, summary in summaries.items():  # each command listed, with its summary
        assert f"\n    {name} " in text or f"\n    {name}\n" in text, name
        assert "".join(summary.split()) in "".join(text.split()), name


def test_help_and_argument_errors_never_import_torch():
    """`workbench X --help` and a bad argument must not pay for torch (1.5 s): it is imported after parsing."""
    code = (
        "import sys, contextlib, io\n"
        "import workbench.cli as cli\n"
        "for argv in (['metadata', '--help'], ['doctor', '--help'], ['bench', '--help'], ['demo', '--help'],\n"
        "             ['metadata', '--seq-lens', '99999999999'], ['metadata', '--mode', 'idle', '--seq-lens', '1']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "        try:\n"
        "            cli.main(argv)\n"
        "        except SystemExit:\n"
        "            pass\n"
        "print(sorted(m for m in ('torch', 'triton', 'numpy') if m in sys.modules))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]"


def test_package_names_load_lazily():
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, workbench; assert 'torch' not in sys.modules; from workbench import StatePool, devices; "
            "import workbench.devices; print(StatePool.__name__, callable(workbench.devices), 'torch' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert res.stdout.split() == ["StatePool", "True", "True"]
