"""``workbench.engines.sglang_dump`` (issue 29): the dumper installed into sglang's own ``Scheduler`` writes, step
by step, the trace the CPU driver records for the same run, with the GDN backend's metadata
(``state_indices``, ``query_start_loc``) as it built it, which ``trace check`` compares with the profile's;
bad settings are refused by name, and an error while recording stops the dump, not the engine. Needs sglang
0.5.23 (``make engines``); skipped, with the reason, without it."""

from __future__ import annotations

import contextlib
import importlib
import json
import warnings
from collections.abc import Iterator

import pytest

from workbench.engines.versions import EngineError, check_supported

try:
    check_supported("sglang")
except EngineError as e:
    pytest.skip(f"sglang is not importable here: {e}", allow_module_level=True)

from workbench.engines import dump, sglang_dump  # noqa: E402
from workbench.engines.scheduler_base import WorkloadSettings  # noqa: E402
from workbench.engines.sglang_scheduler import (  # noqa: E402
    Deployment,
    _Driver,
    _engine,
    drive,
    load,
    run_sglang_scheduler,
)
from workbench.traces.format import read_trace  # noqa: E402
from workbench.traces.replay import replay_trace  # noqa: E402

pytestmark = pytest.mark.engines


@contextlib.contextmanager
def _driver(seed: int, spec: int, prefix_cache: str) -> Iterator[_Driver]:
    """A driver of the run ``run_sglang_scheduler(seed=, spec=, prefix_cache=)`` makes, without its recorder."""
    sg = load()
    d = Deployment(prefix_cache, spec, False, 8, 40, 16384, 256, None, 4096, WorkloadSettings().vocab)
    with warnings.catch_warnings(record=True), _engine(sg, d) as parts:
        warnings.simplefilter("always")
        yield _Driver(sg, d, parts, seed, WorkloadSettings(), 0.6, record=False)


@pytest.mark.parametrize(
    ("prefix_cache", "spec", "seed"),
    [("extra_buffer", 2, 0), ("no_buffer", 2, 1), ("extra_buffer", 0, 2), ("no_buffer", 0, 3)],
)
def test_the_dump_of_the_real_scheduler_is_the_drivers_trace(tmp_path, prefix_cache, spec, seed):
    path, steps = tmp_path / "dump.jsonl", 50
    with _driver(seed, spec, prefix_cache) as driver:
        dumper = sglang_dump.install(driver.sched, path, seed=seed, strict=True)
        assert path.read_text().count("\n") == 1  # the header, before any step
        drive(driver, steps)
        assert dumper.lines > 0 and path.read_text().count("\n") == 1 + dumper.lines  # written as it ran
        sglang_dump.uninstall()
        assert "get_next_batch_to_run" not in vars(driver.sched)  # detached
        assert "init_forward_metadata" not in vars(driver.backend)
    recorded = run_sglang_scheduler(steps=steps, seed=seed, spec=spec, prefix_cache=prefix_cache)
    lines = path.read_text().splitlines()
    assert lines == list(recorded.lines())
    assert any("state_indices" in (json.loads(x)["metadata"] or {}) for x in lines[1:])


def test_the_dump_replays_clean(tmp_path):
    path = tmp_path / "dump.jsonl"
    with _driver(4, 3, "extra_buffer") as driver:
        sglang_dump.install(driver.sched, path, strict=True)
        drive(driver, 40)
        sglang_dump.uninstall()
    result = replay_trace(read_trace(path.read_text().splitlines()))
    assert result.ok, result.divergences[:1]


def test_the_recorded_metadata_is_the_profiles_and_a_corrupted_value_is_caught():
    run = run_sglang_scheduler(steps=30, seed=0, spec=2, prefix_cache="extra_buffer")
    lines = list(run.lines())
    assert replay_trace(read_trace(lines)).ok  # the backend's metadata compared, equal
    for key, mode in (("state_indices", "target_verify"), ("query_start_loc", "extend")):
        bad = list(lines)
        i = next(
            i for i, x in enumerate(bad[1:], 1) if json.loads(x)["mode"] == mode and len(json.loads(x)["rows"]) > 1
        )
        step = json.loads(bad[i])
        step["metadata"][key][1] += 1
        bad[i] = json.dumps(step)
        result = replay_trace(read_trace(bad))
        assert not result.ok and result.divergences[0].field == key and result.divergences[0].step == step["step"]


def test_the_overlap_scheduler_is_refused_by_name(tmp_path):
    with _driver(0, 2, "extra_buffer") as driver:
        driver.sched.enable_overlap = True
        with pytest.raises(EngineError, match="disable_overlap_schedule = False"):
            sglang_dump.install(driver.sched, tmp_path / "x.jsonl")
    assert sglang_dump.main(["--trace", "x.jsonl", "--", "--model-path", "m"]) == 2


def test_an_error_while_recording_stops_the_dump_and_not_the_engine(tmp_path, monkeypatch):
    path = tmp_path / "dump.jsonl"
    with _driver(0, 2, "extra_buffer") as driver:
        dumper = sglang_dump.install(driver.sched, path)
        drive(driver, 20)
        written = dumper.lines

        def broken(bucket):
            raise RuntimeError("backend broke")

        monkeypatch.setattr(dumper, "forward_metadata", broken)
        drive(driver, 10)  # the engine runs on
        assert dumper.error == "RuntimeError: backend broke" and dumper.file.closed
        assert "get_next_batch_to_run" not in vars(driver.sched)
        assert driver.sched.run_batch == driver.run_batch  # the driver's own stand-ins are back
        assert driver.sched.model_worker.verify == driver.verify
        sglang_dump.uninstall()
    lines = path.read_text().splitlines()
    assert len(lines) == 1 + dumper.lines and dumper.lines >= written
    read_trace(lines)  # whole steps only


def test_the_plugin_patches_the_scheduler_only_with_the_env_var(monkeypatch, tmp_path):
    load()
    cls = sglang_dump.importlib.import_module("sglang.srt.managers.scheduler").Scheduler
    before = cls.__init__
    assert sglang_dump.ENV == dump.ENV == "LINATTN_TRACE"
    monkeypatch.delenv(dump.ENV, raising=False)
    sglang_dump.sglang_plugin()
    assert cls.__init__ is before
    monkeypatch.setenv(dump.ENV, str(tmp_path / "t{pid}.jsonl"))
    try:
        sglang_dump.sglang_plugin()
        patched = cls.__init__
        assert patched is not before and patched._linattn_dump
        sglang_dump.sglang_plugin()  # idempotent
        assert cls.__init__ is patched
    finally:
        sglang_dump.sglang_unplug()
    assert cls.__init__ is before


def test_pyproject_declares_the_sglang_plugin_in_the_group_sglang_loads():
    import tomllib
    from pathlib import Path

    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    entry = project["entry-points"][GENERAL_PLUGINS_GROUP]
    assert entry == {"linattn_trace": "workbench.engines.sglang_dump:sglang_plugin"}
    module, name = entry["linattn_trace"].split(":")
    assert callable(getattr(importlib.import_module(module), name))
