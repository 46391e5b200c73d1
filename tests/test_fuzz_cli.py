"""Fuzz the command line: any argument list exits 0 or 2, never with a traceback, and an error is one line
that names the offending argument.

Every subcommand runs in full, in process (``workbench.cli.main``): `metadata` and `doctor` as they are,
`bench`, `report`, `demo`, `check-contracts` and `zoo` with their work (the benchmark, the report's
sections, the synthetic tree, the zoo's cases) patched to no-ops, so that every check after parsing runs.
The machine's memory is patched down to 16 MiB so that a large number reaches the memory check instead of
allocating gigabytes.
"""

from __future__ import annotations

import re
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from _cli_run import run
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


@pytest.mark.slow  # 400 hypothesis examples through main
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
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


FIXTURES = Path(__file__).parent / "fixtures" / "contracts"
PATHS = ["x.html", "x.json", "r_cpu.json", "r_cuda.json", "no/dir/x.html", ".", "", "results", "\u00e9.json"]
paths = st.sampled_from(PATHS) | st.sampled_from(PATHS).map(lambda p: f"results/{p}")
numbers = ints.map(str)
# Per subcommand: positionals (valid ones first), then each option and the values it is fuzzed with.
POSITIONALS = {
    "bench": ["metadata", "replay", "kernels", "widgets"],
    "report": [],
    "demo": [],
    "check-contracts": ["eng", "eng", "eng/layers", "plugin", "ctr_good.py", "no_such_module", "eng/missing.py"],
    "zoo": ["in_capture", "dummy_slot", "nope"],
}
OPTIONS: dict[str, dict[str, st.SearchStrategy[str] | None]] = {
    "bench": {
        "--quick": None,
        "--threads": numbers,
        "--device": st.sampled_from(["auto", "cpu", "cpu:0", "cuda", "npu", "tpu", "cuda:x"]),
        "--json": paths,
        "--plot": paths,
        "--from": paths,
    },
    "report": {"--out": paths, "--device": st.sampled_from(["auto", "cpu", "cuda", "tpu"]), "--quick": None},
    "demo": {"--out": paths, "--quick": None},
    "check-contracts": {
        "--base": st.sampled_from(
            ["eng.layers.attention.mamba_backend:MambaAttnBackendBase", "eng.nope:Base", "ctr_base:MetadataBackend"]
        ),
        "--method": st.sampled_from(["_replay_metadata", "_replay_metadat", "", "init_forward_metadata"]),
        "--search-path": st.sampled_from([".", "eng", "missing", "ctr_good.py", ""]),
        "--bench": numbers,
        "--format": st.sampled_from(["text", "json", "github", "xml"]),
        "--allow-nothing": None,
        "--drift": None,
        "--strict": None,
        "--against": st.sampled_from(["eng", "no_such_engine", "", "eng/layers"]),
        "--calls-from": st.sampled_from([".", "eng", "missing", ""]),
    },
    "zoo": {"--list": None, "--json": None, "--backend": st.sampled_from(["auto", "cpu", "cuda", "gpu"])},
}


MISTYPED = {"_replay_metadat", ""}


@st.composite
def other_argv(draw: st.DrawFn, command: str) -> list[str]:
    """A mostly valid command line (positionals, 0-3 options with their own kind of value), then 0-2
    mutations (a generic fuzzed value, a dropped word, an unknown word), in any order."""
    argv: list[str] = []
    if POSITIONALS[command]:
        k = 1 if command == "bench" else draw(st.integers(0, 2))
        argv += draw(st.lists(st.sampled_from(POSITIONALS[command]), min_size=k, max_size=k))
    for flag in draw(st.lists(st.sampled_from(list(OPTIONS[command])), max_size=3)):
        kind = OPTIONS[command][flag]
        argv += [flag] if kind is None else [flag, draw(kind | values if draw(st.integers(0, 4)) == 0 else kind)]
    for _ in range(draw(st.integers(0, 2)) if draw(st.booleans()) else 0):
        mutation = draw(st.sampled_from(["value", "drop", "word"]))
        if mutation == "value" and argv:
            argv[draw(st.integers(0, len(argv) - 1))] = draw(values)
        elif mutation == "drop" and argv:
            argv.pop(draw(st.integers(0, len(argv) - 1)))
        else:
            argv.insert(draw(st.integers(0, len(argv))), draw(st.sampled_from(["--bogus", "-x", "extra"])))
    return [command, *argv]


@dataclass
class _Pair:
    case: str = "case"
    issue: str = "issue"
    broken: bool = True
    summary: str = "s"

    def to_dict(self) -> dict[str, object]:
        return {"case": self.case}


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Every check before the work runs for real; the work itself (a benchmark, the report's sections, the
    synthetic tree, the zoo's cases) is a no-op. Paths are relative to a scratch copy of the fixtures."""
    import shutil

    import torch

    import workbench.bench.cli as bench_cli
    import workbench.contracts.cli as contracts_cli
    import workbench.contracts.synthetic as synthetic
    import workbench.report as report
    import workbench.zoo.cli as zoo_cli
    from workbench.measure.timing import Results

    for name in ("eng", "plugin", "ctr_base.py", "ctr_good.py"):
        src = FIXTURES / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    (tmp_path / "results").mkdir()
    monkeypatch.chdir(tmp_path)
    fake = types.SimpleNamespace(run=lambda quick, json_path, device: Results([], {"benchmark": "fuzz"}))
    monkeypatch.setattr(cli, "_benchmark", lambda what: fake.run)
    monkeypatch.setattr(bench_cli, "plot_results", lambda res, path: Path(path))
    monkeypatch.setattr(report, "build_report", lambda **kw: "<html></html>")
    real_bench = synthetic.bench

    def small_bench(files: int) -> dict[str, object]:
        # a real (small) tree where that is cheap; a larger count must have passed the parse-time range
        if files <= 40:
            return real_bench(files, root=tmp_path / "synthetic")
        assert files <= synthetic.MAX_FILES, f"--bench {files} reached the tree writer"
        return {"files": files, "text": f"{files} files"}

    monkeypatch.setattr(synthetic, "bench", small_bench)
    monkeypatch.setattr(zoo_cli, "run_all", lambda names, backend: [(_Pair(), _Pair(broken=False))])
    monkeypatch.setattr(contracts_cli, "DEFAULT_TARGETS", ("eng",))  # not the whole workbench per example
    monkeypatch.setattr(contracts_cli, "DEFAULT_BASE", "eng.layers.attention.mamba_backend:MambaAttnBackendBase")
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow  # 300 hypothesis examples through main
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=st.sampled_from(list(OPTIONS)).flatmap(other_argv))
def test_other_subcommands_run_in_full(argv: list[str], no_work: None) -> None:
    """`bench`, `report`, `demo`, `check-contracts` and `zoo` through ``main``: parsing and every check after
    it (--threads, --bench, --method, --search-path, output folders); exit 0 or 2 (check-contracts: 1 for
    breaks, or drift with --strict), never a traceback, an error is one line that names the argument or the value."""
    command = argv[0]
    code, out, err = run(argv)
    if command == "check-contracts" and code == 1:
        assert "Traceback" not in err and "break" in out, (argv, out, err)
        return
    if command == "check-contracts" and code == 0 and "--bench" not in argv and "nothing to check" not in out:
        methods = {argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "--method"}
        assert not methods & MISTYPED, (argv, out)  # a method no base has is never "OK: no findings"
    assert code in (0, 2), (argv, code, err)
    if code == 0:
        return
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, (argv, err)
    line = lines[0]
    prefixes = (f"workbench {command}: error: ", "workbench: error: unrecognized")
    assert line.startswith(prefixes), (argv, line)
    named = {o for o in option_names(command) if re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", line)}
    shown = {w for w in argv[1:] if repr(w) in line or (w.strip() and w in line.split())}
    assert named or shown or "unrecognized arguments" in line or "argument" in line or "invalid choice" in line, (
        argv,
        line,
    )


@settings(max_examples=25, deadline=None)
@given(rest=st.lists(st.sampled_from(["-h2", "--json", "x"]) | values, max_size=3))
def test_unknown_commands_are_one_line(rest: list[str]) -> None:
    for command in ("nope", ""):
        code, _, err = run([command, *rest])
        assert code == 2 and len(err.strip().splitlines()) == 1, (command, rest, err)
