"""One memory budget for a whole replay (workbench.traces.budget): the parts add up from the header and the
steps, the refusal names the field that weighs most before anything is allocated, and the CLI says it on one
line with exit 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _cli_run import run  # noqa: E402

from workbench import limits  # noqa: E402
from workbench.errors import MetadataError  # noqa: E402
from workbench.traces import Trace  # noqa: E402
from workbench.traces.budget import POOL_COPIES, TOKEN_BYTES_PER_HIDDEN, replay_budget, slot_bytes  # noqa: E402
from workbench.traces.model import TraceHeader, TraceRow, TraceStep  # noqa: E402
from workbench.traces.replay import TraceReplayer, make_layer  # noqa: E402

FREE = 8 * 2**30


@pytest.fixture(autouse=True)
def _machine_of_8_gib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "host_memory_bytes", lambda: FREE)


def trace(num_slots: int = 9, buckets: dict | None = None, draft_tokens: int = 2, tokens: int = 5) -> Trace:
    header = TraceHeader("sglang", "gdn", num_slots, buckets or {"decode": [1, 2, 4]}, draft_tokens)
    row = TraceRow(id=0, req_pool_index=1, slot=1, seq_len=tokens, new_tokens=tokens, cached_tokens=0)
    return Trace(header, [TraceStep(0, "extend", (row,), admit=(0,))])


def test_the_parts_add_up_from_the_header_and_the_steps() -> None:
    layer = make_layer("gdn")
    per_token = TOKEN_BYTES_PER_HIDDEN * layer.config.hidden_size
    b = replay_budget(trace(num_slots=100, buckets={"decode": [1, 8], "target_verify": [2, 4]}, tokens=50), layer)
    assert b.parts["state pool, shadow and copies"] == POOL_COPIES * 100 * slot_bytes(layer)
    assert b.parts["captured graphs"] == (1 + 8 + (2 + 4) * 2) * per_token
    assert b.parts["the largest step's tokens"] == 50 * per_token
    assert b.parts["verify buffers"] == 4 * 2 * slot_bytes(layer)  # no verify step: the runner's buffer only
    assert b.total == sum(b.parts.values()) and b.describe().startswith(limits.gib(b.total))


def test_the_verify_rows_of_a_mixed_step_count_in_the_verify_buffers() -> None:
    """A mixed step with 3 verify rows (vLLM's spec rows beside a prefill chunk) holds their D states each, in
    float32 and float64, as a verify step of 3 rows does."""
    layer = make_layer("gdn")
    header = TraceHeader("vllm", "gdn", 20, {"decode": [1, 2], "target_verify": [1, 2]}, 2)
    verify = [TraceRow(i, i + 1, 2 * i + 1, 7, 2, 5, accepted=1, kind="verify") for i in range(3)]
    extend = TraceRow(3, 4, 7, 9, 9, 0, kind="extend")
    mixed = Trace(header, [TraceStep(0, "mixed", (*verify, extend))])
    plain = Trace(header, [TraceStep(0, "target_verify", tuple(verify))])
    assert replay_budget(mixed, layer).parts["verify buffers"] == (2 + 3 * 3) * 2 * slot_bytes(layer)
    assert replay_budget(mixed, layer).parts["verify buffers"] == replay_budget(plain, layer).parts["verify buffers"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_slots": 2_000_000}, "num_slots=2000000"),
        ({"buckets": {"decode": [1, 2_000_000]}}, "buckets.decode up to 2000000"),
        (
            {"buckets": {"decode": [1], "target_verify": [1, 64]}, "draft_tokens": 20_000},
            "draft_tokens=20000 with buckets.target_verify up to 64",
        ),
        ({"tokens": 2_000_000}, "a step of 2,000,000 tokens"),
    ],
)
def test_a_replay_past_the_free_memory_is_refused_naming_its_heaviest_field(kwargs: dict, field: str) -> None:
    with pytest.raises(MetadataError) as e:
        TraceReplayer(trace(**kwargs))
    text = str(e.value)
    assert text.startswith(f"{field} needs ") and "for a replay of this trace" in text
    assert text.endswith(f"this machine has {limits.gib(FREE)} free") and "\n" not in text


def test_each_part_alone_fits_but_their_sum_does_not() -> None:
    """What checking allocations one by one missed: slots and buckets each under the free memory, not together."""
    layer = make_layer("gdn")
    per_token = TOKEN_BYTES_PER_HIDDEN * layer.config.hidden_size
    slots = int(0.6 * FREE) // (POOL_COPIES * slot_bytes(layer))
    bucket = int(0.6 * FREE) // per_token
    b = replay_budget(trace(num_slots=slots, buckets={"decode": [1, bucket]}), layer)
    assert max(b.parts.values()) < FREE < b.total
    with pytest.raises(MetadataError):
        b.check()


def test_a_trace_that_fits_replays_and_reports_its_budget(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    from workbench.traces.format import write_trace

    write_trace(trace(), path)
    code, out, _ = run(["trace", "check", str(path), "--json"])
    assert code == 0
    assert json.loads(out)["memory_budget_bytes"] == replay_budget(trace(), make_layer("gdn")).total


def test_trace_check_refuses_a_10m_bucket_on_one_line_before_allocating(tmp_path: Path) -> None:
    path = tmp_path / "huge.jsonl"
    from workbench.traces.format import write_trace

    write_trace(trace(buckets={"decode": [1, 10_000_000]}), path)
    code, out, err = run(["trace", "check", str(path)])
    assert code == 2 and out == ""
    assert err.startswith("workbench trace: error: buckets.decode up to 10000000 needs ") and err.count("\n") == 1
