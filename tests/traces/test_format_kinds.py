"""What issue 29 added to the trace file (``workbench.traces.format``): the header's ``accepted`` unit and
``zero_on_alloc``, a row's ``kind``, mixed steps of any mix of decode, verify and extend rows, vLLM's split
metadata keys; each bad value one ``TraceError`` naming its line and field; files written before any of it
read and write back byte for byte; the JSON Schema says the same."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from workbench.traces.format import TraceError, read_trace, write_trace
from workbench.traces.model import (
    TraceHeader,
    TraceRow,
    TraceStep,
    tokens_after,
    tokens_kept,
)

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "docs" / "trace.schema.json"

HEADER: dict[str, Any] = {
    "format": "linattn-trace",
    "version": 1,
    "profile": "vllm",
    "layer": "gdn",
    "num_slots": 16,
    "buckets": {"decode": [1, 2, 4], "target_verify": [1, 2]},
    "draft_tokens": 3,
    "seed": None,
}


def row(i: int, slot: int, rpi: int, cached: int, new: int, accepted=None, kind=None, seq=None) -> dict[str, Any]:
    out = {
        "id": i,
        "slot": slot,
        "req_pool_index": rpi,
        "seq_len": cached + new if seq is None else seq,
        "new_tokens": new,
        "cached_tokens": cached,
        "accepted": accepted,
    }
    if kind is not None:
        out["kind"] = kind
    return out


SPLIT_MD = {
    "bucket": None,
    "query_start_loc": [0, 3, 4, 6],
    "spec_state_indices_tensor": [[1, 2, 3]],
    "non_spec_state_indices_tensor": [4, 7],
    "spec_query_start_loc": [0, 3],
    "non_spec_query_start_loc": [0, 1, 3],
    "num_accepted_tokens": [1],
    "num_spec_decodes": 1,
    "num_decodes": 1,
    "num_prefills": 1,
    "spec_sequence_masks": [True, False, False],  # another key of vLLM's: kept as it is
}


def body() -> list[dict[str, Any]]:
    """Three requests prefill; then a mixed step of a verify, a decode and an extend row (vLLM's order: verify
    rows first), with vLLM's split keys; then a pure verify step."""
    return [
        {"step": 0, "mode": "extend", "rows": [row(0, 1, 1, 0, 5), row(1, 4, 2, 0, 4), row(2, 7, 3, 0, 2)],
         "admit": [0, 1, 2]},
        {"step": 1, "mode": "mixed", "metadata": dict(SPLIT_MD),
         "rows": [row(0, 1, 1, 5, 3, 2, "verify"), row(1, 4, 2, 4, 1, None, "decode"), row(2, 7, 3, 2, 2, None, "extend")]},  # noqa: E501
        {"step": 2, "mode": "target_verify", "rows": [row(0, 1, 1, 7, 3, 3), row(2, 7, 3, 4, 3, None, "verify")],
         "metadata": {"bucket": 2, "spec_state_indices_tensor": [[1, 2, 3], [7, 8, 9]], "num_accepted_tokens": [2, 1],
                      "non_spec_state_indices_tensor": None}},
    ]  # fmt: skip


def lines(header: dict[str, Any] | None = None, steps: list[dict[str, Any]] | None = None) -> list[str]:
    return [json.dumps(header or HEADER)] + [json.dumps(s) for s in (body() if steps is None else steps)]


def message(text: list[str]) -> str:
    with pytest.raises(TraceError) as e:
        read_trace(text)
    assert len(str(e.value).splitlines()) == 1 and str(e.value).startswith(f"line {e.value.line}: ")
    return str(e.value)


def changed(index: int, path: str, value: Any, header: dict[str, Any] | None = None) -> list[str]:
    """body() with one field set (``rows.0.kind``); ``...`` removes it."""
    steps = body()
    target: Any = steps[index]
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
    last: Any = int(keys[-1]) if isinstance(target, list) else keys[-1]
    if value is ...:
        del target[last]
    else:
        target[last] = value
    return lines(header, steps)


# -- what is read ------------------------------------------------------------------------------------------
def test_kinds_mixed_verify_rows_and_split_keys_read_and_write_back_exactly(tmp_path):
    trace = read_trace(lines())
    mixed = trace.steps[1]
    assert mixed.kinds == ("verify", "decode", "extend") and mixed.splits
    assert [r.kind for r in mixed.rows] == ["verify", "decode", "extend"] and mixed.rows[0].accepted == 2
    assert trace.steps[2].rows[0].kind is None and trace.steps[2].kinds == ("verify", "verify")
    assert not trace.steps[2].splits and not trace.steps[0].splits
    assert mixed.metadata == SPLIT_MD
    assert trace.header.accepted == "tokens" and trace.header.zero_on_alloc is False
    path = tmp_path / "t.jsonl"
    write_trace(trace, path)
    written = path.read_text().splitlines()
    assert read_trace(path) == trace
    assert written[2].count('"kind":') == 3 and '"kind"' not in written[1]  # only where a row has one
    assert '"accepted":"' not in written[0] and "zero_on_alloc" not in written[0]  # defaults are not written


def test_the_header_unit_and_zeroing_are_read_written_only_when_not_the_default(tmp_path):
    header = dict(HEADER, accepted="drafts", zero_on_alloc=True)
    steps = body()
    steps[1]["rows"][0]["accepted"] = 0  # no draft accepted: the token always kept
    steps[2]["rows"][0]["accepted"] = 2  # both drafts: 3 tokens
    trace = read_trace(lines(header, steps))
    assert trace.header.accepted == "drafts" and trace.header.zero_on_alloc is True
    assert [tokens_kept(r, trace.header) for r in trace.steps[2].rows] == [3, 1]
    assert tokens_kept(trace.steps[1].rows[0], trace.header) == 1
    path = tmp_path / "t.jsonl"
    write_trace(trace, path)
    first = json.loads(path.read_text().splitlines()[0])
    assert first["accepted"] == "drafts" and first["zero_on_alloc"] is True and read_trace(path) == trace
    explicit = read_trace(lines(dict(HEADER, accepted="tokens", zero_on_alloc=False)))
    assert explicit.header == read_trace(lines()).header


def test_kept_and_held_follow_the_unit():
    verify = TraceRow(0, 1, 1, 9, 3, 6, accepted=2)
    assert (verify.kept(), verify.kept("drafts"), replace_accepted(verify, None).kept("drafts")) == (2, 3, 1)
    drafts = TraceHeader("sglang", "gdn", 4, {"decode": [1]}, 3, accepted="drafts")
    assert tokens_after(verify, "verify", drafts) == 9 and tokens_after(verify, "target_verify") == 8
    assert tokens_after(verify, "extend", drafts) == 9 and tokens_after(replace_accepted(verify, 0), "verify") == 7


def replace_accepted(r: TraceRow, accepted: int | None) -> TraceRow:
    from dataclasses import replace

    return replace(r, accepted=accepted)


def test_a_mixed_step_written_before_rows_had_kinds_reads_and_writes_back_byte_for_byte(tmp_path):
    """A file as the writer wrote it before issue 29 (a mixed step of extend rows and one-token decodes, no
    kind anywhere): every line reads and is written back as it was; its rows' kinds follow from their
    lengths, and they run as extend rows as they always did."""
    old = [
        '{"format":"linattn-trace","version":1,"profile":"sglang","layer":"gdn","num_slots":9,"buckets":{"decode":[1,2,4,8],"target_verify":[1,2,4]},"draft_tokens":3,"seed":0}',  # noqa: E501
        '{"step":0,"mode":"extend","rows":[{"id":0,"slot":1,"req_pool_index":1,"seq_len":5,"new_tokens":5,"cached_tokens":0,"accepted":null}],"admit":[0],"finish":[],"metadata":null}',  # noqa: E501
        '{"step":1,"mode":"mixed","rows":[{"id":1,"slot":2,"req_pool_index":2,"seq_len":4,"new_tokens":4,"cached_tokens":0,"accepted":null},{"id":0,"slot":1,"req_pool_index":1,"seq_len":6,"new_tokens":1,"cached_tokens":5,"accepted":null}],"admit":[1],"finish":[],"metadata":{"bucket":null,"state_indices":[2,1],"query_start_loc":[0,4,5]}}',  # noqa: E501
        '{"step":2,"mode":"target_verify","rows":[{"id":0,"slot":1,"req_pool_index":1,"seq_len":9,"new_tokens":3,"cached_tokens":6,"accepted":2,"tokens":[1,2,3]}],"admit":[],"finish":[0],"metadata":{"bucket":1,"state_indices":[1],"query_start_loc":[0,3],"num_accepted_tokens":[1],"custom":[1]}}',  # noqa: E501
    ]  # fmt: skip
    path = tmp_path / "old.jsonl"
    path.write_text("".join(line + "\n" for line in old))
    trace = read_trace(path)
    assert trace.steps[1].kinds == ("extend", "decode") and not trace.steps[1].splits
    again = tmp_path / "again.jsonl"
    write_trace(trace, again)
    assert again.read_bytes() == path.read_bytes()


# -- refusals, one line each, naming the line and the field --------------------------------------------------
KINDS = '"decode", "verify", "extend"'

REFUSALS = [
    (changed(1, "rows.0.kind", "prefill"), f'line 3: rows[0].kind: expected one of {KINDS}, got "prefill"'),
    (changed(1, "rows.0.kind", 1), f"line 3: rows[0].kind: expected one of {KINDS}, got 1"),
    (changed(2, "rows.1.kind", "extend"),
     'line 4: rows[1].kind: expected "verify" in a target_verify step (or no kind), got "extend"'),
    (changed(0, "rows.0.kind", "decode"), 'line 2: rows[0].kind: expected "extend" in an extend step (or no kind), got "decode"'),  # noqa: E501
    (changed(1, "rows.1.kind", ...),
     f"line 3: rows[1].kind: expected one of {KINDS} (every row of a mixed step has its kind once one has: rows[0] has), "  # noqa: E501
     "got nothing"),
    (changed(1, "rows.1.new_tokens", 2), "line 3: rows[1].new_tokens: expected 1 in a decode row, got 2"),
    (changed(1, "rows.0.new_tokens", 2), "line 3: rows[0].new_tokens: expected 3 (draft_tokens) in a verify row, got 2"),  # noqa: E501
    (changed(1, "rows.0.seq_len", 9), "line 3: rows[0].seq_len: expected 8 (cached_tokens 5 + new_tokens 3), got 9"),
    (changed(1, "rows.2.accepted", 1),
     "line 3: rows[2].accepted: expected null in an extend row (only verify rows accept), got 1"),
    (changed(1, "rows.1.accepted", 1),
     "line 3: rows[1].accepted: expected null in a decode row (only verify rows accept), got 1"),
    (changed(1, "rows.0.accepted", 0),
     'line 3: rows[0].accepted: expected null or an int in 1..3 (tokens kept, the bonus token included: the '
     'header\'s accepted is "tokens"), got 0'),
    (changed(1, "rows.0.accepted", 3, dict(HEADER, accepted="drafts")),
     "line 3: rows[0].accepted: expected null or an int in 0..2 (draft tokens accepted: the header's accepted is "
     '"drafts"), got 3'),
    (changed(1, "rows.0.kind", "verify", dict(HEADER, buckets={"decode": [1, 2, 4]})),
     'line 3: rows[0].kind: expected a kind the header has buckets for (no buckets.target_verify), got "verify"'),
    (lines(dict(HEADER, accepted="kept")),
     'line 1: accepted: expected "tokens" or "drafts" (what a verify row\'s accepted counts), got "kept"'),
    (lines(dict(HEADER, accepted=None)),
     'line 1: accepted: expected "tokens" or "drafts" (what a verify row\'s accepted counts), got null'),
    (lines(dict(HEADER, zero_on_alloc=1)), "line 1: zero_on_alloc: expected true or false, got 1"),
    (lines(dict(HEADER, zero_on_alloc="true")), 'line 1: zero_on_alloc: expected true or false, got "true"'),
    (changed(1, "metadata.state_indices", [1, 4, 7]),
     "line 3: metadata.state_indices: expected no state_indices in a mixed step with verify rows (its indices are "
     "spec_state_indices_tensor and non_spec_state_indices_tensor), got [1, 4, 7]"),
    (changed(1, "metadata.spec_state_indices_tensor", [[1, 2, 3], [4, 5, 6]]),
     "line 3: metadata.spec_state_indices_tensor: expected 1 entries (the step's verify rows, or the bucket), got 2"),
    (changed(1, "metadata.non_spec_state_indices_tensor", [4]),
     "line 3: metadata.non_spec_state_indices_tensor: expected 2 entries (the step's rows other than verify rows, or "
     "the bucket), got 1"),
    (changed(2, "metadata.spec_state_indices_tensor", [[1, 2, 3], 7]),
     "line 4: metadata.spec_state_indices_tensor[1]: expected a list of 3 ints like "
     "metadata.spec_state_indices_tensor[0], got 7"),
    (changed(1, "metadata.spec_query_start_loc", [1, 3]),
     "line 3: metadata.spec_query_start_loc[0]: expected 0, got 1"),
    (changed(1, "metadata.non_spec_query_start_loc", [0, 2, 1]),
     "line 3: metadata.non_spec_query_start_loc[2]: expected an int >= 2 (non-decreasing), got 1"),
    (changed(1, "metadata.num_accepted_tokens", [0]),
     "line 3: metadata.num_accepted_tokens[0]: expected an int in 1..3 (tokens the row's last verify kept), got 0"),
    (changed(1, "metadata.num_accepted_tokens", [4]),
     "line 3: metadata.num_accepted_tokens[0]: expected an int in 1..3 (tokens the row's last verify kept), got 4"),
    (changed(1, "metadata.num_accepted_tokens", [1, 1]),
     "line 3: metadata.num_accepted_tokens: expected 1 counts (the step's verify rows, or the bucket), got 2"),
    (changed(1, "metadata.num_accepted_tokens", 1), "line 3: metadata.num_accepted_tokens: expected a list of counts, got 1"),  # noqa: E501
    (changed(1, "metadata.num_decodes", -1), "line 3: metadata.num_decodes: expected an int >= 0 (rows of the step), got -1"),  # noqa: E501
    (changed(1, "metadata.num_prefills", None), "line 3: metadata.num_prefills: expected an int >= 0 (rows of the step), got null"),  # noqa: E501
    (changed(0, "metadata", {"spec_state_indices_tensor": [[1, 2, 3]]}),
     "line 2: metadata.spec_state_indices_tensor: expected null (the step has no verify rows), got [[1, 2, 3]]"),
    (changed(0, "metadata", {"num_accepted_tokens": [1, 1, 1]}),
     "line 2: metadata.num_accepted_tokens: expected null (the step has no verify rows), got [1, 1, 1]"),
    (changed(2, "metadata.non_spec_query_start_loc", [0, 3]),
     "line 4: metadata.non_spec_query_start_loc: expected null (the step has no rows other than verify rows), got [0, 3]"),  # noqa: E501
    (changed(2, "metadata.spec_state_indices_tensor", [[1, 2, 3]]),
     "line 4: metadata.spec_state_indices_tensor: expected 2 entries (the step's verify rows, or the bucket), got 1"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), REFUSALS, ids=[m.split(": expected")[0] for _, m in REFUSALS])
def test_each_bad_value_is_one_trace_error_naming_its_line_and_field(text, expected):
    assert message(text) == expected


def test_a_pure_verify_step_may_record_its_spec_keys_padded_to_the_bucket():
    steps = body()
    steps[2]["rows"] = steps[2]["rows"][:1]
    steps[2]["metadata"].update(spec_state_indices_tensor=[[1, 2, 3], [0, 0, 0]], num_accepted_tokens=[2, 1])
    assert read_trace(lines(steps=steps)).steps[2].metadata["spec_state_indices_tensor"][1] == [0, 0, 0]


def test_a_mixed_step_of_verify_rows_only_has_no_non_spec_keys():
    steps = body()
    steps[1]["rows"] = steps[1]["rows"][:1]
    steps[1]["metadata"] = {"spec_state_indices_tensor": [[1, 2, 3]], "non_spec_state_indices_tensor": None}
    assert read_trace(lines(steps=steps)).steps[1].kinds == ("verify",)
    steps[1]["metadata"]["non_spec_state_indices_tensor"] = []
    assert message(lines(steps=steps)) == (
        "line 3: metadata.non_spec_state_indices_tensor: expected null (the step has no rows other than verify rows), "
        "got []"
    )


def test_a_row_kind_that_agrees_with_the_mode_is_kept_and_written_back():
    step = read_trace(lines()).steps[2]
    assert step.rows[1].kind == "verify"
    assert TraceStep(0, "mixed", (TraceRow(0, 1, 1, 1, 1, 0),)).kinds == ("decode",)  # legacy: one token


# -- the schema says the same --------------------------------------------------------------------------------
def validators():
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed: the schema is not checked")
    schema = json.loads(SCHEMA_PATH.read_text())
    make = jsonschema.Draft202012Validator
    make.check_schema(schema)

    def sub(name):
        return make({"$schema": schema["$schema"], "$defs": schema["$defs"], "$ref": f"#/$defs/{name}"})

    return sub("header"), sub("step")


def test_the_schema_takes_what_the_writer_writes(tmp_path):
    header_v, step_v = validators()
    for header in (HEADER, dict(HEADER, accepted="drafts", zero_on_alloc=True)):
        steps = body()
        if header.get("accepted") == "drafts":
            steps[1]["rows"][0]["accepted"] = 0
            steps[2]["rows"][0]["accepted"] = 2
        path = tmp_path / "t.jsonl"
        write_trace(read_trace(lines(header, steps)), path)
        written = [json.loads(x) for x in path.read_text().splitlines()]
        header_v.validate(written[0])
        for obj in written[1:]:
            step_v.validate(obj)


SCHEMA_REFUSES = [
    (1, "rows.0.kind", "prefill"),
    (2, "rows.1.kind", "extend"),
    (0, "rows.0.kind", "decode"),
    (1, "rows.1.kind", ...),  # a mixed step: every row has its kind, or none
    (1, "rows.1.new_tokens", 2),  # a decode row feeds one token
    (1, "rows.2.accepted", 1),  # only verify rows accept
    (1, "rows.1.accepted", 1),
    (1, "metadata.num_decodes", -1),
    (1, "metadata.num_accepted_tokens", [0]),
    (1, "metadata.spec_query_start_loc", [1, 3]),
]


@pytest.mark.parametrize("change", SCHEMA_REFUSES, ids=[f"{c[1]}={c[2]}" for c in SCHEMA_REFUSES])
def test_the_schema_refuses_what_the_reader_refuses_on_one_line(change):
    _, step_v = validators()
    text = changed(*change)
    assert not step_v.is_valid(json.loads(text[change[0] + 1]))
    with pytest.raises(TraceError):
        read_trace(text)


@pytest.mark.parametrize("bad", [{"accepted": "kept"}, {"accepted": None}, {"zero_on_alloc": 1}])
def test_the_schema_refuses_bad_header_values(bad):
    header_v, _ = validators()
    assert not header_v.is_valid(dict(HEADER, **bad))
    with pytest.raises(TraceError):
        read_trace(lines(dict(HEADER, **bad)))
