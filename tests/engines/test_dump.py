"""``workbench.engines.dump`` (issue 29): the dumper installed into vLLM's own ``Scheduler`` writes, step by
step, the trace the CPU driver records for the same run; ``vllm_plugin`` patches ``Scheduler.__init__`` only
when ``LINATTN_TRACE`` is set. Needs vLLM 0.33.0 (``make engines``); skipped, with the reason, without it."""

from __future__ import annotations

import pytest

from workbench.engines.versions import EngineError, check_supported

try:
    check_supported("vllm")
except EngineError as e:
    pytest.skip(f"vllm is not importable here: {e}", allow_module_level=True)

from workbench.engines import dump  # noqa: E402
from workbench.engines.vllm_recorder import Deployment  # noqa: E402
from workbench.engines.vllm_scheduler import _Driver, drive, load, run_vllm_scheduler  # noqa: E402
from workbench.traces.format import read_trace  # noqa: E402
from workbench.traces.replay import replay_trace  # noqa: E402

pytestmark = pytest.mark.engines


def _driver(seed: int, spec: int, num_blocks: int = 1200) -> _Driver:
    d = Deployment(max(spec - 1, 0), 16, num_blocks, 16, 256, 4096)
    return _Driver(load(), d, seed, None, 0.6, record=False)


@pytest.mark.parametrize(("steps", "seed", "spec", "num_blocks"), [(120, 0, 2, 1200), (150, 0, 2, 90)])
def test_the_dump_of_the_real_scheduler_is_the_drivers_trace(tmp_path, steps, seed, spec, num_blocks):
    path = tmp_path / "dump.jsonl"
    driver = _driver(seed, spec, num_blocks)
    dumper = dump.install(driver.sched, path, spec=spec, seed=seed, strict=True)
    assert path.read_text().count("\n") == 1  # the header, before any step
    drive(driver, steps)
    assert dumper.lines > 0 and path.read_text().count("\n") == 1 + dumper.lines  # written as it ran
    dump.uninstall()
    assert "schedule" not in vars(driver.sched)  # detached
    recorded = run_vllm_scheduler(steps=steps, seed=seed, spec=spec, num_blocks=num_blocks)
    lines = path.read_text().splitlines()
    assert lines == list(recorded.lines())
    assert read_trace(lines) == read_trace(recorded.lines())


def test_the_dump_replays_clean(tmp_path):
    path = tmp_path / "dump.jsonl"
    driver = _driver(1, 3)
    dump.install(driver.sched, path, strict=True)
    drive(driver, 60)
    dump.uninstall()
    replay_trace(read_trace(path.read_text().splitlines()))


def test_a_wrong_spec_is_refused_by_name(tmp_path):
    with pytest.raises(EngineError, match="speculative tokens"):
        dump.install(_driver(0, 2).sched, tmp_path / "x.jsonl", spec=3)


def test_the_plugin_patches_the_scheduler_only_with_the_env_var(monkeypatch, tmp_path):
    load()
    cls = dump.importlib.import_module("vllm.v1.core.sched.scheduler").Scheduler
    before = cls.__init__
    monkeypatch.delenv(dump.ENV, raising=False)
    dump.vllm_plugin()
    assert cls.__init__ is before
    monkeypatch.setenv(dump.ENV, str(tmp_path / "t{pid}.jsonl"))
    try:
        dump.vllm_plugin()
        patched = cls.__init__
        assert patched is not before and patched._linattn_dump
        dump.vllm_plugin()  # idempotent
        assert cls.__init__ is patched
        driver = _driver(0, 2)  # a new Scheduler: recorded
        assert driver.sched._linattn_dumper.path == str(tmp_path / f"t{dump.os.getpid()}.jsonl")
        drive(driver, 10)
    finally:
        dump.vllm_unplug()
        dump.uninstall()
    assert cls.__init__ is before
    assert len(list((tmp_path).glob("t*.jsonl"))) == 1


def test_an_error_while_recording_stops_the_dump_and_not_the_engine(tmp_path, monkeypatch):
    path = tmp_path / "dump.jsonl"
    driver = _driver(0, 2)
    dumper = dump.install(driver.sched, path)
    drive(driver, 30)
    written = dumper.lines

    def broken(rows):
        raise RuntimeError("builder broke")

    monkeypatch.setattr(dumper, "metadata", broken)
    drive(driver, 10)  # the engine runs on
    assert dumper.error == "RuntimeError: builder broke" and dumper.file.closed
    assert "schedule" not in vars(driver.sched) and "_insert_block_hash" not in vars(
        driver.sched.kv_cache_manager.block_pool
    )
    lines = path.read_text().splitlines()
    assert len(lines) == 1 + dumper.lines and dumper.lines >= written
    read_trace(lines)  # whole steps only
    dump.uninstall()


def test_pyproject_declares_the_vllm_plugin():
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["vllm.general_plugins"] == {"linattn_trace": "workbench.engines.dump:vllm_plugin"}
