"""Token accounting across steps (workbench.traces.ledger): a row whose cached_tokens or seq_len does not follow
from its request's history is a divergence, not a clean replay behind a shadow that follows the trace; the CLI
refuses a path that is no trace file on one line, exit 2."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _cli_run import run  # noqa: E402

from workbench.traces import Trace, TraceStep  # noqa: E402
from workbench.traces.format import write_trace  # noqa: E402
from workbench.traces.ledger import TokenLedger, tokens_after  # noqa: E402
from workbench.traces.model import TraceRow  # noqa: E402
from workbench.traces.replay import replay_trace  # noqa: E402
from workbench.traces.script import scripted  # noqa: E402
from workbench.traces.simulate import simulate  # noqa: E402


def chunked() -> Trace:
    """Request 0 prefills 5 then 4 tokens and decodes twice; request 1 prefills beside its second chunk."""
    return scripted(
        "vllm",
        "gdn",
        [
            {"mode": "extend", "rows": {0: 5}},
            {"mode": "extend", "rows": {0: 4, 1: 3}},
            {"mode": "decode", "rows": [0, 1]},
            {"mode": "decode", "rows": [0]},
        ],
        num_slots=4,
        buckets={"decode": [1, 2, 4]},
    )


def with_row(trace: Trace, step: int, index: int, **changes: int) -> Trace:
    steps = list(trace.steps)
    rows = list(steps[step].rows)
    rows[index] = replace(rows[index], **changes)
    steps[step] = replace(steps[step], rows=tuple(rows))
    return replace(trace, steps=steps)


def test_the_scripted_trace_replays_clean() -> None:
    assert replay_trace(chunked()).ok


@pytest.mark.parametrize(
    ("step", "changes", "field", "expected", "got", "words"),
    [
        # vLLM PR 22034 as a dump shows it: the second chunk read without its initial state
        (1, {"cached_tokens": 0, "seq_len": 4}, "cached_tokens", 5, 0, "its state was thrown away"),
        (1, {"cached_tokens": 2, "seq_len": 6}, "cached_tokens", 5, 2, "does not continue it"),
        (3, {"cached_tokens": 599, "seq_len": 600}, "cached_tokens", 10, 599, "does not continue it"),
        (3, {"seq_len": 600}, "seq_len", 11, 600, "cached_tokens 10 + new_tokens 1"),
    ],
)
def test_a_row_off_its_history_is_a_tokens_divergence_at_its_step(step, changes, field, expected, got, words) -> None:
    result = replay_trace(with_row(chunked(), step, 0, **changes))
    assert not result.ok
    d = result.first
    assert d is not None
    assert (d.step, d.kind, d.field, d.request, d.row, d.expected, d.got) == (
        step,
        "tokens",
        field,
        0,
        0,
        expected,
        got,
    )
    assert words in d.detail and "FAIL" in result.summary()


def test_a_verify_keeps_cached_plus_accepted_tokens() -> None:
    row = TraceRow(id=3, req_pool_index=1, slot=1, seq_len=13, new_tokens=3, cached_tokens=10, accepted=2)
    assert tokens_after(row, "target_verify") == 12
    assert tokens_after(replace(row, accepted=None), "target_verify") == 11  # the always-kept token
    assert tokens_after(replace(row, accepted=0), "target_verify") == 11
    assert tokens_after(row, "decode") == 13


def test_a_request_sitting_out_a_step_keeps_its_count_and_leaves_at_finish() -> None:
    ledger = TokenLedger()
    admit = TraceStep(0, "extend", (TraceRow(0, 1, 1, 5, 5, 0), TraceRow(1, 2, 2, 3, 3, 0)), admit=(0, 1))
    ledger.advance(admit)
    only_one = TraceStep(1, "decode", (TraceRow(1, 2, 2, 4, 1, 3),), finish=(1,))
    assert ledger.check(only_one) == []
    ledger.advance(only_one)
    assert ledger.tokens == {0: 5}
    back = TraceStep(2, "decode", (TraceRow(0, 1, 1, 6, 1, 5),))
    assert ledger.check(back) == []
    # an id admitted again after it finished starts from its admitting row, whatever it held before
    again = TraceStep(3, "extend", (TraceRow(1, 2, 2, 7, 7, 0),), admit=(1,))
    assert ledger.check(again) == []


@pytest.mark.parametrize(
    "options",
    [
        {"profile": "vllm", "spec": 2},
        {"profile": "sglang", "mixed": True},
        {"profile": "sglang", "prefix_cache": "extra_buffer", "spec": 2},
    ],
)
def test_simulated_traces_follow_their_own_accounting(options: dict) -> None:
    """The simulator's accounting is the ledger's: no step of its traces is miscounted."""
    trace = simulate(steps=120, seed=5, buckets=[1, 2, 4, 8], max_running=8, **options)
    ledger = TokenLedger()
    for step in trace.steps:
        assert ledger.check(step) == [], step.step
        ledger.advance(step)


def test_trace_check_refuses_a_path_that_is_no_trace_file_with_one_line(tmp_path) -> None:
    for path in (tmp_path / "missing.jsonl", tmp_path):
        code, out, err = run(["trace", "check", str(path)])
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
        assert str(path) in err and "Traceback" not in err


def test_trace_check_reports_the_miscounted_dump_with_exit_1(tmp_path) -> None:
    path = tmp_path / "dump.jsonl"
    write_trace(with_row(chunked(), 1, 0, cached_tokens=0, seq_len=4), path)
    code, out, _ = run(["trace", "check", str(path)])
    assert code == 1 and "step 1: tokens: cached_tokens, request 0, row 0" in out
