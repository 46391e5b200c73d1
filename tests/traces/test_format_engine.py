"""The trace header's optional ``engine`` (``{name, version, commit}``): read, checked, written back only when
present, in the JSON Schema, and ``engine_note`` for a release the workbench has not verified."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from workbench.engine_versions import ENGINE_NAMES, VERIFIED
from workbench.profiles import PROFILES
from workbench.traces.format import (
    TraceError,
    dumps_header,
    header_dict,
    parse_header,
    read_header,
    read_trace,
    write_trace,
)
from workbench.traces.model import TraceEngine, TraceHeader, engine_note

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "docs" / "trace.schema.json"

# Compact, in the writer's key order: what `write_trace` writes, byte for byte.
PLAIN = (
    '{"format":"linattn-trace","version":1,"profile":"sglang","layer":"gdn","num_slots":9,'
    '"buckets":{"decode":[1,2,4,8]},"draft_tokens":2,"seed":0}'
)
STEP = (
    '{"step":0,"mode":"extend","rows":[{"id":0,"slot":1,"req_pool_index":1,"seq_len":5,"new_tokens":5,'
    '"cached_tokens":0,"accepted":null}],"admit":[0],"finish":[],"metadata":null}'
)
ENGINE = {"name": "sglang", "version": "0.5.21", "commit": "4f2a9c1"}


def header(**changes: Any) -> dict[str, Any]:
    out = json.loads(PLAIN)
    out.update(changes)
    return out


def refusal(obj: dict[str, Any]) -> TraceError:
    with pytest.raises(TraceError) as info:
        read_header([json.dumps(obj)])
    assert "\n" not in str(info.value)
    return info.value


# -- round trip --------------------------------------------------------------------------------------------
def test_a_header_without_engine_round_trips_byte_for_byte(tmp_path):
    h = parse_header(json.loads(PLAIN))
    assert h.engine is None and dumps_header(h) == PLAIN and "engine" not in header_dict(h)
    path = tmp_path / "t.jsonl"
    write_trace(read_trace([PLAIN, STEP]), path)
    assert path.read_text() == f"{PLAIN}\n{STEP}\n"


@pytest.mark.parametrize(
    "engine",
    [ENGINE, {"name": "sglang", "version": "0.5.23"}, {"name": "sglang", "version": "v0.5.23.post1+cu12"}],
    ids=["with commit", "without commit", "a local version"],
)
def test_a_header_with_engine_round_trips_byte_for_byte(tmp_path, engine):
    text = PLAIN[:-1] + ',"engine":' + json.dumps(engine, separators=(",", ":")) + "}"
    h = parse_header(json.loads(text))
    assert h.engine == TraceEngine(engine["name"], engine["version"], engine.get("commit"))
    assert dumps_header(h) == text
    path = tmp_path / "t.jsonl"
    write_trace(read_trace([text, STEP]), path)
    assert path.read_text() == f"{text}\n{STEP}\n"
    assert read_trace(path).header == h


def test_a_null_commit_reads_as_none_and_is_not_written():
    h = parse_header(header(engine={"name": "vllm", "version": "0.33.0", "commit": None}, profile="vllm"))
    assert h.engine == TraceEngine("vllm", "0.33.0", None)
    assert json.loads(dumps_header(h))["engine"] == {"name": "vllm", "version": "0.33.0"}


def test_the_engine_is_the_headers_last_key_and_the_header_equality_sees_it():
    with_engine = parse_header(header(engine=ENGINE))
    assert list(header_dict(with_engine)) == [*json.loads(PLAIN), "engine"]
    assert with_engine != parse_header(json.loads(PLAIN))  # a header that names a release is another header


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_each_profile_takes_its_own_engine(profile):
    name = PROFILES[profile].engine
    assert name in ENGINE_NAMES
    assert parse_header(header(profile=profile, engine={"name": name, "version": "1"})).engine == TraceEngine(name, "1")


# -- refusals ----------------------------------------------------------------------------------------------
RELEASE = "a string of 1 to 100 ASCII letters, digits or punctuation"
REFUSALS = [
    ("sglang", "engine", 'line 1: engine: expected an object (engine), got "sglang"'),
    (None, "engine", "line 1: engine: expected an object (engine), got null"),
    (
        {**ENGINE, "branch": "main"},
        "engine.branch",
        "line 1: engine.branch: unknown engine field (known: name, version, commit)",
    ),
    ({"version": "0.5.23"}, "engine.name", 'line 1: engine.name: expected one of "sglang", "vllm", got nothing'),
    ({**ENGINE, "name": "tgi"}, "engine.name", 'line 1: engine.name: expected one of "sglang", "vllm", got "tgi"'),
    ({**ENGINE, "name": 1}, "engine.name", 'line 1: engine.name: expected one of "sglang", "vllm", got 1'),
    (
        {"name": "sglang"},
        "engine.version",
        f'line 1: engine.version: expected {RELEASE} (the release, like "0.5.23"), got nothing',
    ),
    (
        {**ENGINE, "version": 0.5},
        "engine.version",
        f'line 1: engine.version: expected {RELEASE} (the release, like "0.5.23"), got 0.5',
    ),
    (
        {**ENGINE, "version": ""},
        "engine.version",
        f'line 1: engine.version: expected {RELEASE} (the release, like "0.5.23"), got ""',
    ),
    (
        {**ENGINE, "version": "0.5.21\nok"},
        "engine.version",
        f'line 1: engine.version: expected {RELEASE} (the release, like "0.5.23"), got "0.5.21\\nok"',
    ),
    (
        {**ENGINE, "version": "0.5 .21"},
        "engine.version",
        f'line 1: engine.version: expected {RELEASE} (the release, like "0.5.23"), got "0.5 .21"',
    ),
    (
        {**ENGINE, "version": "0" * 101},
        "engine.version",
        f'line 1: engine.version: expected {RELEASE} (the release, like "0.5.23"), got "{"0" * 56}...',
    ),
    (
        {**ENGINE, "commit": 4},
        "engine.commit",
        f"line 1: engine.commit: expected {RELEASE} (the source commit, or null), got 4",
    ),
    (
        {**ENGINE, "commit": ""},
        "engine.commit",
        f'line 1: engine.commit: expected {RELEASE} (the source commit, or null), got ""',
    ),
]


@pytest.mark.parametrize(("engine", "field", "expected"), REFUSALS, ids=[f"{r[1]}={r[0]!r}"[:40] for r in REFUSALS])
def test_a_bad_engine_is_refused_naming_its_field(engine, field, expected):
    e = refusal(header(engine=engine))
    assert (str(e), e.field, e.line) == (expected, field, 1)


@pytest.mark.parametrize(
    ("profile", "name"), [("sglang", "vllm"), ("sglang-ascend", "vllm"), ("vllm", "sglang")], ids=str
)
def test_an_engine_of_another_profile_is_refused_naming_the_profile(profile, name):
    e = refusal(header(profile=profile, engine={"name": name, "version": "1.0"}))
    own = PROFILES[profile].engine
    assert str(e) == f'line 1: engine.name: expected "{own}" (the engine of profile "{profile}"), got "{name}"'
    assert e.field == "engine.name"


def test_the_writer_refuses_what_the_reader_refuses(tmp_path):
    """``write_trace`` reads its lines back: a header whose engine disagrees with its profile is not written."""
    bad = TraceHeader("vllm", "gdn", 9, {"decode": [1]}, engine=TraceEngine("sglang", "0.5.23"))
    trace = read_trace([PLAIN, STEP])
    trace.header = bad
    with pytest.raises(TraceError, match=r'^line 1: engine\.name: expected "vllm"'):
        write_trace(trace, tmp_path / "t.jsonl")
    assert not (tmp_path / "t.jsonl").exists()


# -- the schema --------------------------------------------------------------------------------------------
def _header_validator():
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed: the schema is not checked")
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(
        {"$schema": schema["$schema"], "$defs": schema["$defs"], "$ref": "#/$defs/header"}
    ), schema


def test_the_schema_takes_what_the_reader_takes_and_refuses_what_it_refuses():
    validator, _ = _header_validator()
    assert validator.is_valid(header(engine=ENGINE)) and validator.is_valid(header(engine={**ENGINE, "commit": None}))
    assert validator.is_valid(json.loads(PLAIN))
    for engine, _, _ in REFUSALS:
        assert not validator.is_valid(header(engine=engine)), engine
    for profile, name in [("sglang", "vllm"), ("sglang-ascend", "vllm"), ("vllm", "sglang")]:
        assert not validator.is_valid(header(profile=profile, engine={"name": name, "version": "1"}))


def test_the_schema_names_the_registrys_engines_and_each_profiles_engine():
    _, schema = _header_validator()
    h = schema["$defs"]["header"]
    assert h["properties"]["engine"]["properties"]["name"]["enum"] == list(ENGINE_NAMES)
    said: dict[str, str] = {}
    for rule in h["allOf"]:
        if "engine" not in rule["then"]["properties"]:
            continue  # a rule of another field (vllm's topk)
        profiles = rule["if"]["properties"]["profile"]
        name = rule["then"]["properties"]["engine"]["properties"]["name"]["const"]
        said.update(dict.fromkeys(profiles.get("enum", [profiles.get("const")]), name))
    assert said == {p: profile.engine for p, profile in PROFILES.items()}


# -- engine_note -------------------------------------------------------------------------------------------
def _with(engine: TraceEngine | None, profile: str = "sglang") -> TraceHeader:
    return TraceHeader(profile, "gdn", 9, {"decode": [1]}, engine=engine)


def test_no_note_without_an_engine_or_for_a_verified_release():
    assert engine_note(_with(None)) is None
    for name, versions in VERIFIED.items():
        profile = next(p for p, prof in PROFILES.items() if prof.engine == name)
        for version in versions:
            assert engine_note(_with(TraceEngine(name, version, "abc"), profile)) is None


def test_a_release_not_verified_is_noted_in_one_line():
    note = engine_note(_with(TraceEngine("sglang", "0.5.24.dev3+gabc", "abc"), "sglang-ascend"))
    assert note == (
        "trace from sglang 0.5.24.dev3+gabc (commit abc): judged by the rules of profile 'sglang-ascend', "
        f"verified on sglang {', '.join(VERIFIED['sglang'])}"
    )
    assert engine_note(_with(TraceEngine("vllm", "0.34.0"), "vllm")) == (
        f"trace from vllm 0.34.0: judged by the rules of profile 'vllm', verified on vllm {', '.join(VERIFIED['vllm'])}"
    )


def test_the_note_reads_the_table_it_is_given():
    h = _with(TraceEngine("sglang", "0.5.21"))
    assert engine_note(h, {"sglang": ("0.5.21",)}) is None
    assert engine_note(h, {"sglang": ("0.5.22", "0.5.23")}) == (
        "trace from sglang 0.5.21: judged by the rules of profile 'sglang', verified on sglang 0.5.22, 0.5.23"
    )
    assert (
        engine_note(h, {})
        == "trace from sglang 0.5.21: judged by the rules of profile 'sglang', no sglang release verified"
    )


def test_the_replays_summary_says_when_a_trace_comes_from_a_release_not_verified():
    from dataclasses import replace

    from workbench.traces.replay import replay_trace
    from workbench.traces.simulate import simulate

    trace = simulate("sglang", steps=6, seed=3)
    verified = VERIFIED["sglang"][-1]
    plain = replay_trace(replace(trace, header=replace(trace.header, engine=TraceEngine("sglang", verified))))
    assert plain.ok and "judged by the rules" not in plain.summary()
    other = replay_trace(replace(trace, header=replace(trace.header, engine=TraceEngine("sglang", "0.0.1", "abc"))))
    assert other.ok
    assert "trace from sglang 0.0.1 (commit abc): judged by the rules of profile 'sglang'" in other.summary()
