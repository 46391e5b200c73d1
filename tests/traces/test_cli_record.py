"""``workbench trace run --out FILE`` writes each step's metadata as the step used it (issue 29: decode steps
no longer carry ``"metadata": null``), so a written trace is a complete example of a dump: ``workbench trace
check`` on it compares what was recorded with what the profile builds and passes; a value tampered with in
the file fails the check, naming its key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench import cli
from workbench.traces.format import read_trace, write_trace
from workbench.traces.replay import replay_trace

USED = {"bucket", "state_indices", "query_start_loc"}


def tamper(path: Path, mode: str, key: str) -> int:
    """Change the first entry of ``key`` in the first ``mode`` step that records it; returns its step."""
    lines = path.read_text().splitlines()
    for i, text in enumerate(lines[1:], 1):
        step = json.loads(text)
        md = step.get("metadata") or {}
        if step["mode"] == mode and md.get(key):
            value = md[key]
            if isinstance(value[0], list):
                value[0][0] += 1
            elif key == "num_accepted_tokens":
                value[0] = 2 if value[0] == 1 else 1  # still a count in 1..D: the reader takes it
            else:
                value[0] += 1
            lines[i] = json.dumps(step)
            path.write_text("\n".join(lines) + "\n")
            return int(step["step"])
    raise AssertionError(f"no {mode} step records {key}")


def check(path: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = cli.main(["trace", "check", str(path)])
    return code, capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "mode", "key"),
    [
        (["--profile", "sglang", "--steps", "12"], "decode", "state_indices"),
        (["--profile", "vllm", "--steps", "12", "--spec", "2"], "target_verify", "num_accepted_tokens"),
    ],
    ids=["sglang-decode", "vllm-verify"],
)
def test_a_written_trace_records_every_step_and_checks_clean_until_tampered_with(tmp_path, capsys, argv, mode, key):
    out = tmp_path / "t.jsonl"
    assert cli.main(["trace", "run", *argv, "--out", str(out)]) == 0, capsys.readouterr()
    trace = read_trace(out)
    assert all(s.metadata is not None and set(s.metadata) >= USED for s in trace.steps)
    graphs = [s for s in trace.steps if s.mode == mode]
    assert graphs and all(isinstance((s.metadata or {})["bucket"], int) for s in graphs)  # they replayed a graph
    if key == "num_accepted_tokens":
        assert all(len((s.metadata or {})[key]) == (s.metadata or {})["bucket"] for s in graphs)
    code, text = check(out, capsys)
    assert code == 0 and text.startswith("OK: "), text
    step = tamper(out, mode, key)
    code, text = check(out, capsys)
    assert code == 1 and f"step {step}: metadata: {key}" in text, text
    assert text.splitlines()[0].startswith(f"step {step}: ") and key in text.splitlines()[0]  # the first is it


def test_a_written_split_step_records_vllms_keys_and_a_tampered_one_is_named(tmp_path, capsys):
    """A mixed step with verify rows (written by hand, as ``test_replay_mixed`` lays it out): the file holds
    its ``spec_*`` / ``non_spec_*`` keys as each part used them; changing one fails the check by its name."""
    from test_replay_mixed import trace_of

    res = replay_trace(trace_of("vllm"), record=True)
    assert res.ok and res.recorded is not None
    out = tmp_path / "split.jsonl"
    write_trace(res.recorded, out)
    assert check(out, capsys)[0] == 0
    step = tamper(out, "mixed", "non_spec_state_indices_tensor")
    code, text = check(out, capsys)
    assert code == 1 and text.startswith(f"step {step}: invariant: non_spec_state_indices_tensor"), text
    assert f"step {step}: metadata: non_spec_state_indices_tensor" in text


def test_a_trace_the_replay_refuses_is_still_written_as_simulated(tmp_path, capsys, monkeypatch):
    import workbench.traces.replay as replay_module
    from workbench.traces.replay import TraceInputError

    def refuse(trace, progress=None, record=False):
        raise TraceInputError("step 0: refused")

    monkeypatch.setattr(replay_module, "replay_trace", refuse)
    out = tmp_path / "t.jsonl"
    assert cli.main(["trace", "run", "--steps", "3", "--out", str(out)]) == 2
    assert len(read_trace(out)) == 3


@pytest.mark.slow  # a trace run, written and checked
def test_a_step_an_engine_recorded_keeps_its_record_and_the_written_file_checks_clean():
    """A dumped step (an eager CPU run: no bucket, ``query_start_loc`` over its own rows) stays as it was
    recorded; the replay's captured bucket (padded rows) is not mixed into it, which would make a record no
    run used and fail ``trace check`` on the written file."""
    from dataclasses import replace

    from workbench.traces.model import Trace
    from workbench.traces.simulate import simulate

    trace = simulate("sglang", steps=40, seed=5)
    i, step = next((i, s) for i, s in enumerate(trace.steps) if s.mode == "decode" and len(s.rows) not in (1, 2, 4, 8))
    own = {"query_start_loc": list(range(len(step.rows) + 1))}  # unpadded: what an eager run used
    steps = list(trace.steps)
    steps[i] = replace(step, metadata=own)
    dumped = Trace(trace.header, steps)
    result = replay_trace(dumped, record=True)
    assert result.ok, result.summary()
    assert result.recorded is not None and result.recorded.steps[i].metadata == own
    assert replay_trace(result.recorded).ok
