"""The trace file (workbench.traces.format): round trips, every refusal with its one-line message, streaming,
the JSON Schema against what the writer writes, and a fuzzed reader that never raises anything but TraceError."""

from __future__ import annotations

import fnmatch
import io
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.errors import WorkbenchError
from workbench.profiles import PROFILES
from workbench.traces import format as fmt
from workbench.traces.format import (
    TraceError,
    dumps_header,
    dumps_step,
    iter_steps,
    open_trace,
    parse_header,
    parse_step,
    read_header,
    read_trace,
    write_trace,
)
from workbench.traces.model import (
    ACCEPTED_UNITS,
    MODE_KINDS,
    ROW_KINDS,
    STEP_MODES,
    Trace,
    TraceHeader,
    TraceRow,
    TraceStep,
)

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "docs" / "trace.schema.json"

HEADER = {
    "format": "linattn-trace",
    "version": 1,
    "profile": "sglang",
    "layer": "gdn",
    "num_slots": 9,
    "buckets": {"decode": [1, 2, 4, 8], "target_verify": [1, 2, 4]},
    "draft_tokens": 3,
    "seed": 0,
}


def row(id: int = 0, slot: int = 1, rpi: int = 1, seq_len: int = 6, new: int = 1, cached: int = 5, accepted=None):
    return {
        "id": id,
        "slot": slot,
        "req_pool_index": rpi,
        "seq_len": seq_len,
        "new_tokens": new,
        "cached_tokens": cached,
        "accepted": accepted,
    }


def steps() -> list[dict[str, Any]]:
    """A small valid trace body: extend (admits 0, 1), mixed, verify, decode (finishes 0), idle, decode."""
    return [
        {"step": 0, "mode": "extend", "rows": [row(0, 1, 1, 5, 5, 0), row(1, 2, 2, 3, 3, 0)], "admit": [0, 1]},
        {
            "step": 1,
            "mode": "mixed",
            "rows": [row(2, 3, 3, 4, 4, 0), row(0, 1, 1, 6, 1, 5), row(1, 2, 2, 4, 1, 3)],
            "admit": [2],
            "metadata": {"bucket": None, "state_indices": [3, 1, 2], "query_start_loc": [0, 4, 5, 6]},
        },
        {
            "step": 2,
            "mode": "target_verify",
            "rows": [row(0, 1, 1, 9, 3, 6, 2), row(1, 2, 2, 7, 3, 4, None)],
            "metadata": {"bucket": 2, "state_indices": [1, 2], "query_start_loc": [0, 3, 6], "custom": {"a": [1]}},
        },
        {"step": 3, "mode": "decode", "rows": [row(0, 1, 1, 10, 1, 9)], "finish": [0]},
        {"step": 5, "mode": "idle", "metadata": {"bucket": 1, "query_start_loc": [0, 0]}},
        {"step": 6, "mode": "decode", "rows": [row(1, 2, 2, 8, 1, 7), row(2, 3, 3, 5, 1, 4)], "finish": [1, 2]},
    ]


def lines(header: dict[str, Any] | None = None, body: list[dict[str, Any]] | None = None) -> list[str]:
    return [json.dumps(header or HEADER)] + [json.dumps(s) for s in (steps() if body is None else body)]


def message(text_lines: list[str] | list[bytes]) -> str:
    with pytest.raises(TraceError) as e:
        read_trace(text_lines)
    text = str(e.value)
    assert "\n" not in text and len(text.splitlines()) == 1
    return text


# ------------------------------------------------------------------------------------------------- round trip


def test_reads_the_fields_and_the_round_trip_is_exact(tmp_path):
    trace = read_trace(lines())
    assert trace.header == TraceHeader("sglang", "gdn", 9, {"decode": [1, 2, 4, 8], "target_verify": [1, 2, 4]}, 3, 0)
    assert [s.mode for s in trace.steps] == ["extend", "mixed", "target_verify", "decode", "idle", "decode"]
    assert trace.steps[0].rows[1] == TraceRow(1, 2, 2, 3, 3, 0, None) and trace.steps[0].admit == (0, 1)
    assert trace.steps[2].rows[0].accepted == 2 and (trace.steps[2].metadata or {})["custom"] == {"a": [1]}
    assert trace.steps[4].rows == () and trace.steps[4].finish == ()
    path = tmp_path / "t.jsonl"
    write_trace(trace, path)
    assert read_trace(path) == trace and read_trace(str(path)) == trace
    written = path.read_text().splitlines()
    assert written[0] == dumps_header(trace.header) and written[1:] == [dumps_step(s) for s in trace.steps]
    assert read_trace(written) == trace
    assert all(" " not in line for line in written)  # compact
    buf = io.StringIO()
    write_trace(trace, buf)
    assert buf.getvalue() == path.read_text()


def test_dumps_parse_is_exact_per_line():
    trace = read_trace(lines())
    assert parse_header(json.loads(dumps_header(trace.header))) == trace.header
    for i, step in enumerate(trace.steps):
        assert parse_step(json.loads(dumps_step(step)), i + 2, trace.header) == step


def test_defaults_blank_lines_and_crlf():
    header = {k: v for k, v in HEADER.items() if k not in ("draft_tokens", "seed")}
    text = ["", json.dumps(header) + "\r\n", "  \n", json.dumps({"step": 0, "mode": "idle"}) + "\n"]
    trace = read_trace(text)
    assert trace.header.draft_tokens == 2 and trace.header.seed is None
    assert trace.steps == [TraceStep(0, "idle")]


def test_header_only_reads_as_a_trace_of_no_steps(tmp_path):
    trace = read_trace(lines(body=[]))
    assert isinstance(trace, Trace) and len(trace) == 0


def test_bytes_lines_and_non_text():
    assert len(read_trace([line.encode() for line in lines()])) == 6
    assert message([json.dumps(HEADER).encode(), b"\xff\n"]) == "line 2: expected UTF-8 text, got bytes that are not"
    assert message([json.dumps(HEADER), 3]) == "line 2: expected a line of text, got an int"  # type: ignore[arg-type]


def test_non_utf8_file_names_the_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(json.dumps(HEADER).encode() + b"\n\xc3\x28\n")
    with pytest.raises(TraceError, match=r"^line 2: expected UTF-8 text, got byte 0xc3$"):
        read_trace(path)


def test_trace_error_is_a_workbench_value_error():
    assert issubclass(TraceError, WorkbenchError) and issubclass(TraceError, ValueError)
    with pytest.raises(TraceError) as e:
        read_trace(lines(body=[{"step": 0, "mode": "decode", "rows": [row(seq_len=-3)]}]))
    assert (e.value.line, e.value.field) == (2, "rows[0].seq_len")


def test_graph_modes_copy_matches_the_metadata_module():
    from workbench.metadata import GRAPH_MODES

    assert fmt.GRAPH_MODES == GRAPH_MODES


# ----------------------------------------------------------------------------------------------------- streaming


def test_iter_steps_streams_and_closes_the_file(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(read_trace(lines()), path)
    it = iter_steps(path)
    assert next(it).step == 0
    it.close()  # no ResourceWarning (warnings are errors in this suite)
    assert [s.step for s in iter_steps(path)] == [0, 1, 2, 3, 5, 6]
    header, reader = open_trace(path)
    with reader:
        assert header.num_slots == 9 and next(reader).mode == "extend"
    assert read_header(path) == header


def test_streaming_reads_one_line_at_a_time():
    consumed: list[int] = []

    def source():
        for i, line in enumerate(lines()):
            consumed.append(i)
            yield line

    steps = iter_steps(source())
    next(steps)
    assert consumed == [0, 1]
    steps.close()


def test_streaming_refuses_at_the_bad_line_after_yielding_the_good_ones():
    body = steps()
    body[3]["rows"][0]["slot"] = 9
    got = []
    with pytest.raises(
        TraceError, match=r"^line 5: rows\[0\]\.slot: expected an int in 0\.\.8 \(num_slots = 9\), got 9$"
    ):
        for s in iter_steps(lines(body=body)):
            got.append(s.step)
    assert got == [0, 1, 2]


# ------------------------------------------------------------------------------------------------------ refusals


def header_with(**changes: Any) -> dict[str, Any]:
    out = dict(HEADER)
    for key, value in changes.items():
        if value is _DROP:
            out.pop(key)
        else:
            out[key] = value
    return out


_DROP = object()

HEADER_REFUSALS = [
    (header_with(format="other"), 'line 1: format: expected "linattn-trace", got "other"'),
    (header_with(format=_DROP), 'line 1: format: expected "linattn-trace", got nothing'),
    (header_with(version=2), "line 1: version 2: this workbench reads version 1"),
    (header_with(version=0), "line 1: version 0: this workbench reads version 1"),
    (header_with(version="1"), 'line 1: version: expected the int 1, got "1"'),
    (header_with(version=True), "line 1: version: expected the int 1, got true"),
    (header_with(profile="tgi"), 'line 1: profile: expected one of "sglang", "sglang-ascend", "vllm", got "tgi"'),
    (header_with(layer="rwkv"), 'line 1: layer: expected one of "gdn", "mamba2", "kda", got "rwkv"'),
    (header_with(layer=_DROP), 'line 1: layer: expected one of "gdn", "mamba2", "kda", got nothing'),
    (header_with(num_slots=1), "line 1: num_slots: expected an int >= 2, got 1"),
    (header_with(num_slots=True), "line 1: num_slots: expected an int >= 2, got true"),
    (header_with(num_slots=4.0), "line 1: num_slots: expected an int >= 2, got 4.0"),
    (header_with(num_slots=2**31), "line 1: num_slots: expected an int <= 2147483647 (int32), got 2147483648"),
    (header_with(buckets=[1, 2]), "line 1: buckets: expected an object (graph mode), got [1, 2]"),
    (
        header_with(buckets={"extend": [1]}),
        "line 1: buckets.extend: unknown graph mode field (known: decode, target_verify)",
    ),
    (
        header_with(buckets={"target_verify": [1]}),
        "line 1: buckets.decode: expected a list of bucket sizes (idle steps run the decode graph), got nothing",
    ),
    (
        header_with(buckets={"decode": []}),
        "line 1: buckets.decode: expected a non-empty list of increasing ints >= 1, got []",
    ),
    (header_with(buckets={"decode": [0, 1]}), "line 1: buckets.decode[0]: expected an int >= 1, got 0"),
    (
        header_with(buckets={"decode": [1, 4, 4]}),
        "line 1: buckets.decode[2]: expected an int > 4 (strictly increasing), got 4",
    ),
    (
        header_with(buckets={"decode": [2, 1]}),
        "line 1: buckets.decode[1]: expected an int > 2 (strictly increasing), got 1",
    ),
    (header_with(buckets={"decode": 8}), "line 1: buckets.decode: expected a list of increasing ints >= 1, got 8"),
    (header_with(draft_tokens=0), "line 1: draft_tokens: expected an int >= 1, got 0"),
    (header_with(seed=-1), "line 1: seed: expected an int >= 0 or null, got -1"),
    (header_with(seed="x"), 'line 1: seed: expected an int >= 0 or null, got "x"'),
    (
        header_with(max_bs=8),
        "line 1: max_bs: unknown header field (known: format, version, profile, layer, num_slots, buckets, "
        "draft_tokens, seed, engine, accepted, zero_on_alloc, topk)",
    ),
]


@pytest.mark.parametrize(("header", "expected"), HEADER_REFUSALS)
def test_header_refusals(header, expected):
    assert message(lines(header=header)) == expected


def test_missing_or_misplaced_header():
    assert message([]) == 'line 1: expected the header ({"format": "linattn-trace", ...}), got an empty file'
    assert message(["", "  "]) == 'line 1: expected the header ({"format": "linattn-trace", ...}), got an empty file'
    first_step = json.dumps(steps()[0])
    assert message([first_step]) == 'line 1: format: expected "linattn-trace" (the header comes first), got nothing'
    assert message(["", json.dumps(HEADER), json.dumps(HEADER)]).startswith("line 3: format: unknown step field")
    assert message(["[1, 2]"]) == "line 1: expected a JSON object, got [1, 2]"


def body_with(index: int, path: str, value: Any) -> list[dict[str, Any]]:
    """steps() with one field changed (``rows.0.seq_len``); ``_DROP`` removes it."""
    body = steps()
    target: Any = body[index]
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
    last: Any = int(keys[-1]) if isinstance(target, list) else keys[-1]
    if value is _DROP:
        del target[last]
    else:
        target[last] = value
    return body


SLOT = "expected a slot in [0, 8] (the header's num_slots is 9)"
TOKENS_KEPT = '(tokens kept, the bonus token included: the header\'s accepted is "tokens")'

STEP_REFUSALS = [
    # line numbers: the header is line 1, steps()[i] is line i + 2
    ((0, "rows.0.tokens", [1, 2]), "line 2: rows[0].tokens: expected 5 token ids (new_tokens), got 2"),
    ((0, "rows.0.tokens", [1, -2]), "line 2: rows[0].tokens: expected 5 token ids (new_tokens), got 2"),
    ((0, "rows.0.tokens", [1, 2, -3, 4, 5]), "line 2: rows[0].tokens[2]: expected a token id (an int >= 0), got -3"),
    ((0, "rows.0.tokens", 7), "line 2: rows[0].tokens: expected a list of token ids, got 7"),
    (
        (0, "rows.0.tokens", [1, 2, 3, True, 5]),
        "line 2: rows[0].tokens[3]: expected a token id (an int >= 0), got true",
    ),
    ((0, "rows.0.tokens", [1, 2, 3, 4, 2.0]), "line 2: rows[0].tokens[4]: expected a token id (an int >= 0), got 2.0"),
    (
        (0, "rows.0.tokens", [1, 2, 3, 4, 2**31]),
        "line 2: rows[0].tokens[4]: expected a token id (an int >= 0), got 2147483648",
    ),
    ((0, "rows.0.slots", [0, 9]), "line 2: rows[0].slots[1]: expected an int in 0..8 (num_slots = 9), got 9"),
    ((0, "rows.0.slot", 9), "line 2: rows[0].slot: expected an int in 0..8 (num_slots = 9), got 9"),
    (
        (0, "metadata", {"copies_before": [[1]]}),
        "line 2: metadata.copies_before[0]: expected a [src, dst] pair of slots, got [1]",
    ),
    (
        (0, "metadata", {"copies_after": [[1, -2]]}),
        "line 2: metadata.copies_after[0][1]: expected a slot in [0, 8] (the header's num_slots is 9), got -2",
    ),
    (
        (0, "metadata", {"evict": [True]}),
        "line 2: metadata.evict[0]: expected a slot in [0, 8] (the header's num_slots is 9), got true",
    ),
    (
        (0, "metadata", {"hits": [{"request": 1, "tokens": 4}]}),
        "line 2: metadata.hits[0].slot: expected a slot in [0, 8] (the header's num_slots is 9), got nothing",
    ),
    (
        (0, "metadata", {"moves": [{"request": 1, "to": 4}]}),
        "line 2: metadata.moves[0].to: unknown move field (known: request, slot, slots, keep)",
    ),
    (
        (0, "metadata", {"moves": [{"request": 1, "slot": 4, "slots": [4, 5]}]}),
        "line 2: metadata.moves[0]: expected a move with one of slot (one slot per request) or slots (its window), "
        'got {"request": 1, "slot": 4, "slots": [4, 5]}',
    ),
    (
        (0, "metadata", {"moves": [{"request": 1, "slots": [4, -5]}]}),
        "line 2: metadata.moves[0].slots[1]: expected a slot in [0, 8] (the header's num_slots is 9), got -5",
    ),
    ((0, "metadata", {"mamba_chunk_size": 0}), "line 2: metadata.mamba_chunk_size: expected an int >= 1, got 0"),
    (
        (0, "metadata", {"track_conv_indices": [[1, 2], 3]}),
        "line 2: metadata.track_conv_indices[1]: expected a list of ints, got 3",
    ),
    (
        (0, "metadata", {"mamba_track_mask": [True, "yes"]}),
        'line 2: metadata.mamba_track_mask[1]: expected true or false (or 1 or 0), got "yes"',
    ),
    (
        (0, "metadata", {"mamba_steps_to_track": [-2]}),
        "line 2: metadata.mamba_steps_to_track[0]: expected an int >= -1, got -2",
    ),
    (
        (0, "rows.0.slots", [2, 1]),
        "line 2: rows[0].slots: expected distinct slots, the first the row's slot 1, got [2, 1]",
    ),
    (
        (0, "rows.0.slots", [1, 1]),
        "line 2: rows[0].slots: expected distinct slots, the first the row's slot 1, got [1, 1]",
    ),
    (
        (0, "metadata", {"checkpoints": [{"request": 1, "tokens": 0, "slot": 2}]}),
        "line 2: metadata.checkpoints[0].tokens: expected an int >= 1, got 0",
    ),
    (
        (0, "metadata", {"checkpoints": [{"request": 1, "tokens": 3, "slot": 2, "at": 1}]}),
        "line 2: metadata.checkpoints[0].at: unknown checkpoint field (known: request, tokens, slot)",
    ),
    ((5, "rows.0.seq_len", -3), "line 7: rows[0].seq_len: expected an int >= 1, got -3"),
    ((5, "rows.1.seq_len", 0), "line 7: rows[1].seq_len: expected an int >= 1, got 0"),
    ((5, "rows.1.seq_len", True), "line 7: rows[1].seq_len: expected an int >= 1, got true"),
    ((5, "rows.1.seq_len", 2**31), "line 7: rows[1].seq_len: expected an int <= 2147483647 (int32), got 2147483648"),
    ((5, "rows.1.seq_len", "8"), 'line 7: rows[1].seq_len: expected an int >= 1, got "8"'),
    ((5, "rows.1.seq_len", _DROP), "line 7: rows[1].seq_len: expected an int >= 1, got nothing"),
    ((0, "step", -1), "line 2: step: expected an int >= 0, got -1"),
    ((0, "step", _DROP), "line 2: step: expected an int >= 0, got nothing"),
    ((1, "step", 0), "line 3: step: expected an int > 0 (the previous step), got 0"),
    ((4, "step", 3), "line 6: step: expected an int > 3 (the previous step), got 3"),
    (
        (0, "mode", "prefill"),
        'line 2: mode: expected one of "decode", "target_verify", "extend", "mixed", "idle", got "prefill"',
    ),
    ((0, "mode", None), 'line 2: mode: expected one of "decode", "target_verify", "extend", "mixed", "idle", got null'),
    ((0, "rows", {}), "line 2: rows: expected a list of row objects, got {}"),
    (
        (0, "rows", []),
        "line 2: rows: expected at least one row in an extend step (a step without rows is idle), got []",
    ),
    (
        (0, "rows", _DROP),
        "line 2: rows: expected at least one row in an extend step (a step without rows is idle), got []",
    ),
    (
        (4, "rows", [row()]),
        "line 6: rows: expected [] in an idle step, got 1 row",
    ),
    ((0, "rows.0", 5), "line 2: rows[0]: expected an object (row), got 5"),
    (
        (0, "rows.0.prefix", 1),
        "line 2: rows[0].prefix: unknown row field (known: id, slot, req_pool_index, seq_len, new_tokens, "
        "cached_tokens, accepted, tokens, slots, kind, tree)",
    ),
    ((0, "rows.0.id", -1), "line 2: rows[0].id: expected an int >= 0, got -1"),
    (
        (0, "rows.0.id", 2**63),
        "line 2: rows[0].id: expected an int <= 9223372036854775807 (int64), got 9223372036854775808",
    ),
    ((0, "rows.0.slot", -1), "line 2: rows[0].slot: expected an int in 0..8 (num_slots = 9), got -1"),
    ((0, "rows.0.slot", 9), "line 2: rows[0].slot: expected an int in 0..8 (num_slots = 9), got 9"),
    ((0, "rows.0.req_pool_index", -2), "line 2: rows[0].req_pool_index: expected an int >= 0, got -2"),
    ((0, "rows.0.new_tokens", 0), "line 2: rows[0].new_tokens: expected an int >= 1, got 0"),
    ((0, "rows.0.cached_tokens", -1), "line 2: rows[0].cached_tokens: expected an int >= 0, got -1"),
    ((0, "rows.0.seq_len", 6), "line 2: rows[0].seq_len: expected 5 (cached_tokens 0 + new_tokens 5), got 6"),
    ((1, "rows.1.cached_tokens", 4), "line 3: rows[1].seq_len: expected 5 (cached_tokens 4 + new_tokens 1), got 6"),
    ((3, "rows.0.new_tokens", 2), "line 5: rows[0].new_tokens: expected 1 in a decode step, got 2"),
    (
        (2, "rows.1.new_tokens", 2),
        "line 4: rows[1].new_tokens: expected 3 (draft_tokens) in a target_verify step, got 2",
    ),
    ((2, "rows.0.accepted", 4), f"line 4: rows[0].accepted: expected null or an int in 1..3 {TOKENS_KEPT}, got 4"),
    ((2, "rows.0.accepted", 0), f"line 4: rows[0].accepted: expected null or an int in 1..3 {TOKENS_KEPT}, got 0"),
    ((2, "rows.0.accepted", -1), f"line 4: rows[0].accepted: expected null or an int in 1..3 {TOKENS_KEPT}, got -1"),
    (
        (2, "rows.0.accepted", False),
        f"line 4: rows[0].accepted: expected null or an int in 1..3 {TOKENS_KEPT}, got false",
    ),
    (
        (3, "rows.0.accepted", 1),
        "line 5: rows[0].accepted: expected null in a decode step (only verify rows accept), got 1",
    ),
    ((0, "rows.1.id", 0), "line 2: rows[1].id: expected an id no other row of the step has (rows[0] has it), got 0"),
    (
        (0, "rows.1.slot", 1),
        "line 2: rows[1].slot: expected a slot no other row of the step has (rows[0] has it), got 1",
    ),
    (
        (1, "rows.2.req_pool_index", 3),
        "line 3: rows[2].req_pool_index: expected a req_pool_index no other row of the step has (rows[0] has it), "
        "got 3",
    ),
    ((0, "admit", 0), "line 2: admit: expected a list of request ids, got 0"),
    ((0, "admit", [0, 0]), "line 2: admit[1]: expected an id not already in admit, got 0"),
    ((0, "admit", [0, "1"]), 'line 2: admit[1]: expected a request id (an int >= 0), got "1"'),
    ((1, "admit", [2, 0]), "line 3: admit[1]: expected an id not live already (line 2 admitted it), got 0"),
    (
        (3, "finish", [7]),
        "line 5: finish[0]: expected an id in this step's rows or admitted and not finished yet, got 7",
    ),
    ((3, "finish", [True]), "line 5: finish[0]: expected a request id (an int >= 0), got true"),
    ((0, "metadata", []), "line 2: metadata: expected an object or null, got []"),
    ((2, "metadata.bucket", 1), "line 4: metadata.bucket: expected null or an int >= 2 (the step's rows), got 1"),
    ((2, "metadata.bucket", "2"), 'line 4: metadata.bucket: expected null or an int >= 2 (the step\'s rows), got "2"'),
    (
        (2, "metadata.state_indices", 1),
        "line 4: metadata.state_indices: expected a list of ints or a list of lists of ints, got 1",
    ),
    (
        (2, "metadata.state_indices", [1]),
        "line 4: metadata.state_indices: expected 2 entries (the step's rows, or the bucket), got 1",
    ),
    (
        (2, "metadata.state_indices", [1, True]),
        "line 4: metadata.state_indices[1]: expected an int >= -2147483648, got true",
    ),
    (
        (2, "metadata.state_indices", [1, 2**31]),
        "line 4: metadata.state_indices[1]: expected an int <= 2147483647 (int32), got 2147483648",
    ),
    (
        (2, "metadata.state_indices", [[1, 2], [3]]),
        "line 4: metadata.state_indices[1]: expected a list of 2 ints like metadata.state_indices[0], got [3]",
    ),
    (
        (2, "metadata.state_indices", [[1, 2], 3]),
        "line 4: metadata.state_indices[1]: expected a list of 2 ints like metadata.state_indices[0], got 3",
    ),
    ((2, "metadata.query_start_loc", [1, 3, 6]), "line 4: metadata.query_start_loc[0]: expected 0, got 1"),
    (
        (2, "metadata.query_start_loc", [0, 3, 2]),
        "line 4: metadata.query_start_loc[2]: expected an int >= 3 (non-decreasing), got 2",
    ),
    (
        (2, "metadata.query_start_loc", [0, 3]),
        "line 4: metadata.query_start_loc: expected 3 offsets (the step's rows, or the bucket), got 2",
    ),
    (
        (1, "metadata.query_start_loc", [0, 4]),
        "line 3: metadata.query_start_loc: expected 4 offsets (the step's rows, or the bucket), got 2",
    ),
    (
        (0, "metadata", {"bucket": 4, "query_start_loc": [0, 5, 8, 8]}),
        "line 2: metadata.query_start_loc: expected 3 or 5 offsets (the step's rows, or the bucket), got 4",
    ),
    ((0, "extra", 1), "line 2: extra: unknown step field (known: step, mode, rows, admit, finish, metadata)"),
    # every slot the prefix cache names is inside the pool (the replay would index past it)
    ((0, "metadata", {"evict": [9]}), f"line 2: metadata.evict[0]: {SLOT}, got 9"),
    (
        (0, "metadata", {"copies_before": [[1, 2**31 - 1]]}),
        f"line 2: metadata.copies_before[0][1]: {SLOT}, got 2147483647",
    ),
    (
        (0, "metadata", {"checkpoints": [{"request": 0, "tokens": 5, "slot": 2**31 - 1}]}),
        f"line 2: metadata.checkpoints[0].slot: {SLOT}, got 2147483647",
    ),
    ((0, "metadata", {"moves": [{"request": 1, "slot": 9}]}), f"line 2: metadata.moves[0].slot: {SLOT}, got 9"),
    (
        (0, "metadata", {"moves": [{"request": 1, "slots": [4], "keep": [12]}]}),
        f"line 2: metadata.moves[0].keep[0]: {SLOT}, got 12",
    ),
    (
        (0, "metadata", {"moves": [{"request": 1, "slots": []}]}),
        "line 2: metadata.moves[0].slots: expected a non-empty list of slots (the request's window), got []",
    ),
    (
        (0, "metadata", {"mamba_track_indices": [-1, 9]}),
        "line 2: metadata.mamba_track_indices[1]: expected a slot in [-1, 8] (the header's num_slots is 9), got 9",
    ),
    ((0, "metadata", {"track_ssm_final_dst": [100]}), f"line 2: metadata.track_ssm_final_dst[0]: {SLOT}, got 100"),
]


@pytest.mark.parametrize(("change", "expected"), STEP_REFUSALS, ids=[m for _, m in STEP_REFUSALS])
def test_step_refusals(change, expected):
    assert message(lines(body=body_with(*change))) == expected


def test_verify_needs_verify_buckets():
    header = header_with(buckets={"decode": [1, 2]})
    assert message(lines(header=header, body=steps()[:3])) == (
        'line 4: mode: expected a mode the header has buckets for (no buckets.target_verify), got "target_verify"'
    )


def test_finish_of_an_id_finished_before_is_refused():
    body = steps()
    body[4]["finish"] = [0]  # 0 finished at step 3 and is in no row of the idle step
    assert message(lines(body=body)) == (
        "line 6: finish[0]: expected an id in this step's rows or admitted and not finished yet, got 0"
    )


def test_an_id_admitted_and_finished_in_one_step_and_readmitted_later():
    body = [
        {"step": 0, "mode": "extend", "rows": [row(0, 1, 1, 5, 5, 0)], "admit": [0], "finish": [0]},
        {"step": 1, "mode": "extend", "rows": [row(0, 1, 1, 5, 5, 0)], "admit": [0]},
        {"step": 2, "mode": "idle", "finish": [0]},
    ]
    assert len(read_trace(lines(body=body))) == 3


def test_rows_not_admitted_in_the_file_are_fine():
    # a dump started mid-stream: requests admitted before it began decode and finish
    body = [{"step": 10, "mode": "decode", "rows": [row(4, 1, 1, 9, 1, 8)], "finish": [4]}]
    assert read_trace(lines(body=body)).steps[0].finish == (4,)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{", "line 2: expected a JSON object, got invalid JSON: * (column 2)"),
        ('{"step": 1,}', "line 2: expected a JSON object, got invalid JSON: * (column 1?)"),  # 3.13 words it anew
        ('{"step" 1}', "line 2: expected a JSON object, got invalid JSON: Expecting ':' delimiter (column 9)"),
        ("[]", "line 2: expected a JSON object, got []"),
        ('"step"', 'line 2: expected a JSON object, got "step"'),
        ("null", "line 2: expected a JSON object, got null"),
        ('{"step": 0, "step": 1}', "line 2: step: the field appears twice"),
        ('{"a\\nb": 0, "a\\nb": 1}', 'line 2: "a\\nb": the field appears twice'),
        ('{"step": 0, "mode": "idle", "": 1}', 'line 2: "": unknown step field (known: *)'),
        ('{"step": 0, "mode": "idle", "\\r": 1}', 'line 2: "\\r": unknown step field (known: *)'),
        ('{"step": NaN}', "line 2: expected finite JSON numbers, got NaN"),
        ('{"step": -Infinity}', "line 2: expected finite JSON numbers, got -Infinity"),
        ('{"step": 1e999}', "line 2: expected finite JSON numbers, got 1e999"),
        ('{"step": 1.0, "mode": "idle"}', "line 2: step: expected an int >= 0, got 1.0"),
        ("[" * 100_000, "line 2: expected a JSON object, got JSON nested too deeply"),
    ],
)
def test_malformed_lines(text, expected):
    got = message([json.dumps(HEADER), text])
    assert fnmatch.fnmatchcase(got, expected) if "*" in expected else got == expected


def test_huge_int_literal_is_refused_on_one_line():
    text = message([json.dumps(HEADER), '{"step": ' + "9" * 5000 + "}"])
    assert text.startswith("line 2: expected a JSON object, got invalid JSON: Exceeds the limit")


def test_long_values_are_cut_in_the_message():
    text = message(lines(body=[{"step": 0, "mode": "idle", "metadata": [list(range(1000))]}]))
    assert text.startswith("line 2: metadata: expected an object or null, got [[0, 1, 2") and text.endswith("...")
    assert len(text) < 120


def test_write_checks_what_it_writes(tmp_path):
    trace = read_trace(lines())
    bad = Trace(trace.header, [*trace.steps, TraceStep(6, "decode", (TraceRow(9, 1, 1, 1, 1, 0),))])
    with pytest.raises(TraceError, match=r"^line 8: step: expected an int > 6"):
        write_trace(bad, tmp_path / "t.jsonl")
    assert not (tmp_path / "t.jsonl").exists()


# ---------------------------------------------------------------------------------------------------- schema


def validators():
    """(line, header, step) validators of docs/trace.schema.json; skipped visibly without jsonschema."""
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed: the schema is not checked")
    schema = json.loads(SCHEMA_PATH.read_text())
    make = jsonschema.Draft202012Validator
    make.check_schema(schema)

    def sub(name):
        return make({"$schema": schema["$schema"], "$defs": schema["$defs"], "$ref": f"#/$defs/{name}"})

    return make(schema), sub("header"), sub("step")


def test_what_the_writer_writes_matches_the_schema(tmp_path):
    line_v, header_v, step_v = validators()
    path = tmp_path / "t.jsonl"
    write_trace(read_trace(lines()), path)
    written = [json.loads(x) for x in path.read_text().splitlines()]
    header_v.validate(written[0])
    for obj in written:
        line_v.validate(obj)
    for obj in written[1:]:
        step_v.validate(obj)


SCHEMA_REFUSES = [
    (0, "mode", "prefill"),
    (0, "rows.0.seq_len", 0),
    (0, "rows.0.seq_len", True),
    (0, "rows.0.new_tokens", 0),
    (0, "rows.0.prefix", 1),
    (0, "rows", []),
    (4, "rows", [row()]),
    (3, "rows.0.new_tokens", 2),
    (3, "rows.0.accepted", 1),
    (0, "admit", [0, 0]),
    (2, "metadata.query_start_loc", [1, 3, 6]),
    (2, "metadata.state_indices", [1, True]),
    (0, "extra", 1),
    (0, "rows.0.tokens", [1, -2, 3, 4, 5]),
    (0, "metadata", {"copies_before": [[1]]}),
    (0, "metadata", {"hits": [{"request": 1, "tokens": 4}]}),
    (0, "metadata", {"checkpoints": [{"request": 1, "tokens": 3, "slot": 2, "at": 1}]}),
]


@pytest.mark.parametrize("change", SCHEMA_REFUSES)
def test_the_schema_refuses_what_the_reader_refuses_on_one_line(change):
    line_v, _, step_v = validators()
    body = body_with(*change)
    index = change[0]
    assert not step_v.is_valid(body[index]) and not line_v.is_valid(body[index])
    with pytest.raises(TraceError):
        read_trace(lines(body=body))


@pytest.mark.parametrize(("header", "_"), HEADER_REFUSALS[:11] + HEADER_REFUSALS[13:19] + HEADER_REFUSALS[21:])
def test_the_schema_refuses_bad_headers(header, _):
    _, header_v, _ = validators()
    assert not header_v.is_valid(header)


# ------------------------------------------------------------------------------------------------------- fuzz

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=10,
)


@st.composite
def valid_traces(draw) -> Trace:
    profile = draw(st.sampled_from(sorted(PROFILES)))
    num_slots = draw(st.integers(2, 12))
    d = draw(st.integers(1, 4))
    buckets = {"decode": sorted(draw(st.sets(st.integers(1, 16), min_size=1, max_size=4)))}
    if draw(st.booleans()):
        buckets["target_verify"] = sorted(draw(st.sets(st.integers(1, 16), min_size=1, max_size=3)))
    seed = draw(st.none() | st.integers(0, 2**63 - 1))
    unit, zero = draw(st.sampled_from(ACCEPTED_UNITS)), draw(st.booleans())
    layer = draw(st.sampled_from(fmt.LAYERS))
    header = TraceHeader(profile, layer, num_slots, buckets, d, seed, accepted=unit, zero_on_alloc=zero)
    kinds = [k for k in ROW_KINDS if k != "verify" or "target_verify" in buckets]
    modes = [m for m in STEP_MODES if m != "target_verify" or "target_verify" in buckets]
    live: set[int] = set()
    number = draw(st.integers(0, 3))
    out = []
    for _ in range(draw(st.integers(0, 5))):
        number += draw(st.integers(1, 3))
        mode = draw(st.sampled_from(modes))
        rows: list[TraceRow] = []
        with_kinds = draw(st.booleans())  # kinds on every row, or (the mode says them; a mixed step's legacy) none
        if mode != "idle":
            n = draw(st.integers(1, min(4, num_slots)))
            ids = draw(st.lists(st.integers(0, 30), min_size=n, max_size=n, unique=True))
            slots = draw(st.lists(st.integers(0, num_slots - 1), min_size=n, max_size=n, unique=True))
            rpis = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n, unique=True))
            for rid, slot, rpi in zip(ids, slots, rpis, strict=True):
                cached = draw(st.integers(0, 50))
                accepted = None
                kind = MODE_KINDS.get(mode) or (draw(st.sampled_from(kinds)) if with_kinds else "extend")
                if kind == "decode":
                    new = 1
                elif kind == "verify":
                    new = d
                    accepted = draw(st.none() | (st.integers(1, d) if unit == "tokens" else st.integers(0, d - 1)))
                else:
                    new = draw(st.integers(1, 20))
                seq = cached + new if mode in ("extend", "mixed") else draw(st.integers(1, 80))
                row_kind = kind if with_kinds else None
                rows.append(TraceRow(rid, rpi, slot, seq, new, cached, accepted, kind=row_kind))
        row_ids = [r.id for r in rows]
        admit = tuple(draw(st.lists(st.sampled_from(row_ids), unique=True)) if row_ids else [])
        admit = tuple(i for i in admit if i not in live)
        live |= set(admit)
        finish = tuple(draw(st.lists(st.sampled_from(row_ids), unique=True)) if row_ids else [])
        live -= set(finish)
        metadata = None
        step = TraceStep(number, mode, tuple(rows), admit, finish)
        if step.splits:  # its metadata, if any, is vLLM's split keys (a state_indices there is refused)
            if draw(st.booleans()):
                metadata = {"bucket": None, "query_start_loc": [0, *itertools.accumulate(r.new_tokens for r in rows)]}
                metadata.update(split_keys(step, d, num_slots, draw))
        elif draw(st.booleans()):
            bucket = draw(st.none() | st.integers(max(len(rows), 1), 16))
            size = len(rows) if bucket is None else draw(st.sampled_from([len(rows), bucket]))
            offsets = [0]
            for i in range(size):
                offsets.append(offsets[-1] + (rows[i].new_tokens if i < len(rows) else 0))
            metadata = {
                "bucket": bucket,
                "state_indices": draw(st.lists(st.integers(-1, num_slots - 1), min_size=size, max_size=size)),
                "query_start_loc": offsets,
                "extra": draw(json_values),
            }
        out.append(TraceStep(number, mode, tuple(rows), admit, finish, metadata))
    return Trace(header, out)


def split_keys(step: TraceStep, d: int, num_slots: int, draw) -> dict[str, Any]:
    """vLLM's split keys of a mixed step with verify rows, of the right shapes (values drawn)."""
    verify = [r for r, k in zip(step.rows, step.kinds, strict=True) if k == "verify"]
    others = [r for r, k in zip(step.rows, step.kinds, strict=True) if k != "verify"]
    slot = st.integers(-1, num_slots - 1)
    return {
        "spec_state_indices_tensor": [draw(st.lists(slot, min_size=d, max_size=d)) for _ in verify],
        "non_spec_state_indices_tensor": [draw(slot) for _ in others] if others else None,
        "spec_query_start_loc": [0, *itertools.accumulate(r.new_tokens for r in verify)],
        "non_spec_query_start_loc": [0, *itertools.accumulate(r.new_tokens for r in others)] if others else None,
        "num_accepted_tokens": [draw(st.integers(1, d)) for _ in verify],
        "num_spec_decodes": len(verify),
        "num_decodes": draw(st.integers(0, 5)),
        "num_prefills": draw(st.integers(0, 5)),
    }


FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(valid_traces())
def test_valid_generated_traces_always_read_back(trace):
    buf = io.StringIO()
    write_trace(trace, buf)
    text = buf.getvalue().splitlines()
    assert read_trace(text) == trace
    assert [dumps_header(trace.header)] + [dumps_step(s) for s in read_trace(text).steps] == text


def _mutate(obj: Any, draw) -> Any:
    """Change one place in a JSON value: replace it with a random value, drop or add a key, or go deeper."""
    if isinstance(obj, dict) and obj:
        key = draw(st.sampled_from(sorted(obj)))
        choice = draw(st.integers(0, 3))
        out = dict(obj)
        if choice == 0:
            del out[key]
        elif choice == 1:
            out[draw(st.text(max_size=6))] = draw(json_values)
        elif choice == 2:
            out[key] = draw(json_values)
        else:
            out[key] = _mutate(obj[key], draw)
        return out
    if isinstance(obj, list) and obj:
        i = draw(st.integers(0, len(obj) - 1))
        out_list = list(obj)
        out_list[i] = _mutate(obj[i], draw) if draw(st.booleans()) else draw(json_values)
        return out_list
    return draw(json_values)


@FUZZ
@given(st.data())
def test_mutated_traces_raise_only_trace_error(data):
    trace = data.draw(valid_traces())
    objs = [fmt.header_dict(trace.header)] + [fmt.step_dict(s) for s in trace.steps]
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(objs) - 1))
        objs[i] = _mutate(objs[i], data.draw)
    text = [json.dumps(o) for o in objs]
    try:
        read_trace(text)
    except TraceError as e:
        assert len(str(e).splitlines()) == 1 and str(e).startswith(f"line {e.line}: ")


@FUZZ
@given(st.lists(st.text(max_size=40) | st.binary(max_size=40), max_size=6), st.booleans())
def test_garbage_raises_only_trace_error(garbage, with_header):
    text = ([json.dumps(HEADER)] if with_header else []) + garbage
    try:
        read_trace(text)
    except TraceError as e:
        assert len(str(e).splitlines()) == 1


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_files_raise_only_trace_error(tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("fuzz") / "t.jsonl"
    path.write_bytes(json.dumps(HEADER).encode() + b"\n" + raw)
    try:
        read_trace(path)
    except TraceError as e:
        assert len(str(e).splitlines()) == 1


def test_tokens_and_prefix_cache_keys_round_trip(tmp_path):
    body = steps()
    body[0]["rows"][0]["tokens"] = [5, 9, 2, 7, 1]
    body[0]["rows"][0]["slots"] = [body[0]["rows"][0]["slot"], 6]
    cache = {
        "evict": [4],
        "hits": [{"request": 1, "tokens": 2, "slot": 4}],
        "copies_before": [[4, 2]],
        "moves": [{"request": 0, "slot": 3}, {"request": 1, "slots": [2, 6], "keep": [7]}],
        "copies_after": [[1, 5]],
        "checkpoints": [{"request": 0, "tokens": 5, "slot": 5}],
    }
    body[0]["metadata"] = cache
    trace = read_trace(lines(body=body))
    assert trace.steps[0].rows[0].tokens == (5, 9, 2, 7, 1) and trace.steps[0].rows[1].tokens is None
    assert trace.steps[0].rows[0].slots == (body[0]["rows"][0]["slot"], 6) and trace.steps[0].rows[1].slots is None
    assert trace.steps[0].metadata == cache
    path = tmp_path / "t.jsonl"
    write_trace(trace, path)
    written = path.read_text().splitlines()
    assert '"tokens":[5,9,2,7,1]' in written[1] and written[1].count('"tokens":[') == 1  # absent where not given
    assert read_trace(path).steps == trace.steps
    line_v, _, step_v = validators()
    for obj in (json.loads(x) for x in written[1:]):
        step_v.validate(obj)


# ------------------------------------------------------------------------------------------- the path itself


@pytest.mark.parametrize("kind", ["missing", "folder", "fifo", "device"])
def test_a_path_that_is_no_regular_file_is_one_line_before_any_read(tmp_path, kind):
    """A FIFO would block forever and /dev/zero grow without end: refused from the file's type alone."""
    import os

    path = {
        "missing": tmp_path / "none.jsonl",
        "folder": tmp_path,
        "fifo": tmp_path / "f",
        "device": Path("/dev/zero"),
    }[kind]
    if kind == "fifo":
        os.mkfifo(path)
    words = {
        "missing": "no such file",
        "folder": "is a folder",
        "fifo": "not a regular file",
        "device": "not a regular file",
    }
    with pytest.raises(TraceError) as e:
        read_trace(path)
    assert str(e.value) == f"{path}: " + str(e.value).split(": ", 1)[1] and words[kind] in str(e.value)
    with pytest.raises(TraceError):
        read_header(str(path))
