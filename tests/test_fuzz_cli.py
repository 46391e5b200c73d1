"""Fuzz the command line: any argument list exits 0 or 2, never with a traceback, and an error is one line
that names the offending argument.

`metadata` and `doctor` run in full, in process (``workbench.cli.main``). `bench`, `check-contracts` and
`demo` are parsed only: a valid argument list would start a benchmark or the tour.
The machine's memory is patched down to 16 MiB so that a large number reaches the memory check instead of
allocating gigabytes.
"""

from __future__ import annotations

import contextlib
import io
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench import cli, limits

EDGE_INTS = [0, 1, 2, 3, 7, -1, -(2**31), 2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, -(2**63) - 1, 10**30]
ints = st.sampled_from(EDGE_INTS) | st.integers(-3, 70)
values = st.one_of(
    ints.map(str),
    st.lists(ints, min_size=1, max_size=4).map(lambda xs: ",".join(map(str, xs))),
    st.sampled_from(["", ",", "1,,2", "3,", " 4", "1_0", "\u0663", "\u00b2", "1e3", "nan", "auto", "none", "-", "--"]),
    st.text(max_size=6),
)

METADATA_FLAGS = [
    "--profile",
    "--mode",
    "--seq-lens",
    "--extend-lens",
    "--prefix-lens",
    "--draft-tokens",
    "-D",
    "--bucket",
    "--buckets",
    "--num-slots",
]
MODES = ["decode", "target_verify", "extend", "idle"]
PROFILES = ["sglang", "sglang-ascend", "vllm"]


small = st.integers(1, 9) | st.sampled_from([2**31 - 1, 2**31, 0, -1])


def csv(xs: list[int]) -> str:
    return ",".join(map(str, xs))


@st.composite
def metadata_argv(draw: st.DrawFn) -> list[str]:
    """A valid command (mode, profile, lengths, bucket, slots), then 0-2 mutations: a fuzzed value, a flag
    that does not apply, a dropped flag, a repeated flag, shuffled order, an unknown word."""
    mode = draw(st.sampled_from(MODES))
    n = draw(st.integers(1, 5))
    pairs: list[tuple[str, str]] = [("--mode", mode), ("--profile", draw(st.sampled_from(PROFILES)))]
    lens = csv(draw(st.lists(st.integers(1, 50) | small, min_size=n, max_size=n)))
    if mode in ("decode", "target_verify"):
        pairs.append(("--seq-lens", lens))
    if mode == "target_verify":
        pairs.append((draw(st.sampled_from(["-D", "--draft-tokens"])), str(draw(small))))
    if mode == "extend":
        pairs.append(("--extend-lens", lens))
        if draw(st.booleans()):
            pairs.append(("--prefix-lens", csv(draw(st.lists(st.integers(0, 9) | small, min_size=n, max_size=n)))))
    if draw(st.booleans()):
        pairs.append(("--bucket", draw(st.sampled_from(["auto", "none"]) | small.map(str))))
    if draw(st.booleans()):
        pairs.append(
            ("--buckets", csv(sorted(set(draw(st.lists(st.integers(1, 12) | small, min_size=1, max_size=4))))))
        )
    if draw(st.booleans()):
        pairs.append(("--num-slots", str(draw(st.integers(2, 80) | st.sampled_from(EDGE_INTS)))))
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(["value", "extra", "drop", "repeat"]))
        if kind == "value":
            i = draw(st.integers(0, len(pairs) - 1))
            pairs[i] = (pairs[i][0], draw(values))
        elif kind == "extra":
            pairs.append((draw(st.sampled_from(METADATA_FLAGS)), draw(values | small.map(str))))
        elif kind == "drop" and pairs:
            pairs.pop(draw(st.integers(0, len(pairs) - 1)))
        elif pairs:
            pairs.append(draw(st.sampled_from(pairs)))
    pairs = draw(st.permutations(pairs))
    argv = ["metadata", *(x for pair in pairs for x in pair)]
    if draw(st.booleans()):
        argv.append("--json")
    if draw(st.integers(0, 9)) == 0:
        argv.insert(draw(st.integers(0, len(argv))), draw(st.sampled_from(["--bogus", "extra", "-x", "--json"])))
    return argv


def run(argv: list[str]) -> tuple[int, str, str]:
    """``main(argv)`` in process: (exit status, stdout, stderr). Any exception but SystemExit propagates."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def option_names(command: str) -> set[str]:
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    parser = sub.choices[command]  # type: ignore[index]
    return {s for a in parser._actions for s in a.option_strings}


def assert_one_named_line(command: str, argv: list[str], code: int, err: str) -> None:
    assert code in (0, 2), (argv, code, err)
    if code == 0:
        return
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, (argv, err)
    line = lines[0]
    assert line.startswith(f"workbench {command}: error: ") or line.startswith("workbench: error: "), (argv, line)
    assert "Traceback" not in err
    # Names the argument: an option of the command, a positional by name, or the unknown word itself.
    named = {o for o in option_names(command) if re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", line)}
    assert named or "unrecognized arguments" in line or "argument what" in line or "invalid choice" in line, (
        argv,
        line,
    )


@pytest.fixture
def small_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "host_memory_bytes", lambda: 16 * 2**20)


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=metadata_argv())
def test_metadata_any_argv_exits_0_or_one_named_line(argv: list[str], small_machine: None) -> None:
    code, out, err = run(argv)
    assert_one_named_line("metadata", argv, code, err)
    if code == 0:
        assert "query_start_loc" in out


@settings(max_examples=25, deadline=None)
@given(extra=st.lists(st.sampled_from(["--no-npu-probe", "--json", "-D", "1", "\u00e9", "--no-npu"]), max_size=3))
def test_doctor_any_argv(extra: list[str]) -> None:
    argv = ["doctor", *extra]
    code, out, err = run(argv)
    assert_one_named_line("doctor", argv, code, err)
    if code == 0:
        assert out.splitlines()[0].startswith("device")


@settings(max_examples=60, deadline=None)
@given(
    command=st.sampled_from(["bench", "report", "demo", "check-contracts", "zoo", "nope", ""]),
    rest=st.lists(
        st.sampled_from(
            [
                "metadata",
                "replay",
                "kernels",
                "--quick",
                "--json",
                "--out",
                "x.json",
                "-h2",
                "--threads",
                "--device",
                "--plot",
            ]
        )
        | values,
        max_size=4,
    ),
)
def test_other_subcommands_parse_or_one_line(command: str, rest: list[str]) -> None:
    """Parse only (a valid list would run a benchmark): argparse's verdict is still one line, status 2."""
    argv = [command, *rest]
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            cli.build_parser().parse_args(argv)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
    if command in ("bench", "report", "demo", "check-contracts", "zoo"):
        assert_one_named_line(command, argv, code, err.getvalue())
    else:
        assert code == 2 and len(err.getvalue().strip().splitlines()) == 1
