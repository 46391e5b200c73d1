"""workbench.engines against a fake engine (tests/engines/fake_engine.py): the oracle, the subject behind the
graph runner, and ``workbench engine-check``, in ``make test`` (no engine installed). The real wheels are
tested by test_sglang_engine.py and test_vllm_engine.py (``make test-engines``)."""

from __future__ import annotations

import json

import pytest
from fake_engine import FakeAdapter, FakeAscendReverted, FakeOffByOne

import workbench.engines as engines
from workbench.cli import main
from workbench.engines import EngineError, check_supported, identity
from workbench.engines.check import engine_check
from workbench.engines.identity import EngineIdentity
from workbench.engines.oracle import compare
from workbench.engines.registry import get_adapter
from workbench.engines.subject import engine_backend
from workbench.pool import StatePool

FAKE_IDENTITY = EngineIdentity("fake", "1.0", verified=True, adapter="1.0", probes="passed")


def shuffled_pool(seed: int = 0) -> StatePool:
    """A pool whose request rows map to slots out of order: allocate, free some, allocate again."""
    pool = StatePool(48, "sglang")
    rows = pool.alloc(20).tolist()
    pool.free(rows[seed % 3 :: 3])
    pool.alloc(6)
    return pool


def test_the_oracle_agrees_with_an_independent_engine_bitwise_and_reports_a_wrong_one() -> None:
    pool = shuffled_pool()
    good = compare(FakeAdapter(pool, (1, 2, 4, 8), 2), batches=150, seed=3)
    assert good.ok, str(good)
    assert good.batches == {
        "decode/eager": 150, "decode/replay": 150, "target_verify/eager": 150, "target_verify/replay": 150,
        "extend/eager": 150, "idle/eager": 150,
    }  # fmt: skip
    bad = compare(FakeAdapter(pool, (1, 2, 4, 8), 2, backend_class=FakeOffByOne), batches=150, seed=3)
    assert not bad.ok
    first = {(d.mode, d.path): d for d in bad.divergences}
    decode = first[("decode", "replay")]
    assert decode.field == "query_start_loc" and decode.bucket is not None
    assert set(bad.mismatched) == {"decode/replay", "target_verify/replay"}  # only padded replays differ
    assert "profile" in str(decode) and "engine" in str(decode) and "<table" in bad._repr_html_()


@pytest.mark.slow  # 40 batches and a capture
def test_the_subject_captures_and_replays_through_the_engine_and_the_seed_fails_at_capture() -> None:
    check = engine_check(FakeAdapter, batches=40, replays=6)
    assert check.ok, str(check)
    assert check.captured and check.replays == 6 and check.summary().startswith("OK: fake 1.0 FakeMambaBackend")
    seed = engine_check(FakeAdapter, backend_class=FakeAscendReverted, batches=10)
    assert not seed.ok and seed.failure is not None and seed.failure.stage == "capture"
    assert seed.failure.error == (
        "TypeError: FakeAscendReverted._replay_metadata() got an unexpected keyword argument 'in_capture'"
    )
    assert "fake_engine.py" in seed.failure.call and "init_forward_metadata_out_graph" in seed.failure.call


def test_the_subject_writes_the_engine_values_into_the_graph_buffers() -> None:
    from workbench.batch import Batch

    pool = shuffled_pool()
    cls = engine_backend(FakeAdapter, backend_class=FakeOffByOne)
    backend = cls(pool, [1, 2, 4], 2, modes=("decode",))
    rows = pool.live_rows[:3]
    meta = backend.init_forward_metadata_out_graph(Batch.decode(rows, [5, 6, 7]))
    assert meta is backend.buffers["decode"].static[4]  # the bucket's static buffer, which the graph reads
    assert meta.query_start_loc.tolist() == [0, 1, 2, 3, 4]  # the engine's (wrong) value, not the profile's
    (div,) = backend.divergences
    assert (div.field, div.row, div.expected, div.got) == ("query_start_loc", 4, 3, 4)


def test_engine_check_command_exit_codes(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(engines, "adapter_class", lambda name: FakeAdapter)
    monkeypatch.setattr(engines, "engine_identity", lambda adapter: FAKE_IDENTITY)
    assert main(["engine-check", "sglang", "--batches", "20", "--modes", "decode,extend"]) == 0
    assert capsys.readouterr().out.rstrip().splitlines()[-1].startswith("OK: fake 1.0 FakeMambaBackend")
    spec = f"{FakeAscendReverted.__module__}:FakeAscendReverted"
    assert main(["engine-check", "sglang", "--backend", spec, "--batches", "5", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False and data["failure"]["stage"] == "capture" and "'in_capture'" in data["failure"]["error"]
    assert main(["engine-check", "sglang", "--modes", "decode,prefill"]) == 2
    assert "error: --modes: prefill not among decode, target_verify, extend, idle" in capsys.readouterr().err
    assert main(["engine-check", "sglang", "--backend", "fake_engine:nope"]) == 2
    assert "defines no 'nope'" in capsys.readouterr().err


def test_an_engine_that_is_missing_is_one_line_and_another_version_is_judged_by_probes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(identity.importlib.metadata, "version", _not_found)
    with pytest.raises(EngineError, match=r"^sglang is not installed \(make engines installs .*--engine-root DIR"):
        check_supported("sglang")
    monkeypatch.setattr(identity.importlib.metadata, "version", lambda name: "0.5.24.dev3+gabc1234")
    monkeypatch.setattr(identity, "_package_dir", lambda name: None)
    assert check_supported("sglang") == "0.5.24.dev3+gabc1234"  # no refusal: the adapter's probes judge it
    ident = identity.identify("sglang")
    assert not ident.verified and ident.status == "unverified"
    assert engines.adapter_class("sglang") is get_adapter("sglang")  # the newest adapter
    with pytest.raises(EngineError, match="engine: 'trt' is not one of"):
        check_supported("trt")


def _not_found(name: str) -> str:
    raise identity.importlib.metadata.PackageNotFoundError(name)


def test_the_lab_captures_and_replays_with_an_engine_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """The widget path: the lab's ``metadata`` control offers the installed engines; the runner then runs the
    engine's own backend (here the fake one) and says so."""
    from workbench.widgets import lab as lab_view
    from workbench.widgets.lab_model import LabModel

    monkeypatch.setattr(engines, "adapter_class", lambda name: FakeAdapter)
    lab = LabModel(metadata="sglang")
    assert lab.capture(), lab.error
    assert lab.capture_text().startswith("captured 8 graphs with fake 1.0 FakeMambaBackend (real code)")
    report = lab.step(3, "decode", seed=1, time_it=False)
    assert report is not None and report.comparison.ok, lab.error
    refused = LabModel(profile="vllm", metadata="sglang")
    assert not refused.capture() and refused.error_control == "metadata"
    assert "implements the 'sglang' profile; choose it (profile is 'vllm')" in refused.error
    monkeypatch.setattr(engines, "installed_engines", lambda: ["sglang"])
    view = lab_view.CaptureReplayLab()
    assert view.metadata.options == (("workbench profile", "profile"), ("sglang (real code)", "sglang"))


def test_the_explorer_shows_the_engine_metadata_beside_the_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.widgets.explorer import MetadataExplorer
    from workbench.widgets.explorer_model import ExplorerModel

    monkeypatch.setattr(engines, "adapter_class", lambda name: FakeAdapter)
    model = ExplorerModel(profile="sglang", raw_batch_size=5, buckets="8")
    rows = model.engine_rows("sglang")
    assert [(r[1], r[4]) for r in rows] == [("state_indices", True), ("query_start_loc", True)]
    assert rows[1][2] == rows[1][3] == "[0, 1, 2, 3, 4, 5, 5, 5, 5]"
    assert ExplorerModel(profile="vllm", raw_batch_size=5).engine_rows("sglang") == []  # another profile's step
    monkeypatch.setattr(engines, "installed_engines", lambda: ["sglang"])
    view = MetadataExplorer(profile="sglang", raw_batch_size=5, buckets="8")
    view.engine.value = "sglang"
    assert "profile&#x27;s value" in view.engine_table.value or "profile's value" in view.engine_table.value
    assert "NO" not in view.engine_table.value
    monkeypatch.setattr(engines, "adapter_class", lambda name: _off_by_one)
    view.engine.value = ""
    view.engine.value = "sglang"
    assert "NO" in view.engine_table.value  # a wrong engine shows as a failing row


def _off_by_one(*args, **kwargs):
    return FakeAdapter(*args, **{**kwargs, "backend_class": FakeOffByOne})
