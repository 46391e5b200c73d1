"""``workbench trace run --scheduler vllm|sglang``: the engine's own scheduler as the trace source. Without
the engines (``make test``) the options a real scheduler cannot take are refused, exit 2, naming the flag,
before any engine is imported; ``tests/engines/test_vllm_scheduler.py`` runs the drivers themselves."""

from __future__ import annotations

import importlib.util

import pytest

from workbench import cli


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--scheduler", "vllm", "--profile", "sglang"], "--profile sglang"),
        (["--scheduler", "sglang", "--profile", "vllm"], "--profile vllm"),
        (["--scheduler", "vllm", "--mixed"], "--mixed"),
        (["--scheduler", "vllm", "--dp-dummies"], "--dp-dummies"),
        (["--scheduler", "sglang", "--dp-dummies"], "--dp-dummies"),
    ],
)
def test_an_option_a_real_scheduler_cannot_take_is_refused_naming_it(capsys, argv, named):
    assert cli.main(["trace", "run", *argv, "--steps", "3"]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_without_vllm_the_vllm_scheduler_says_how_to_get_it(capsys):
    assert cli.main(["trace", "run", "--scheduler", "vllm", "--steps", "3"]) == 2
    err = capsys.readouterr().err
    assert "vllm is not installed" in err and "make engines" in err


def test_an_unknown_scheduler_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["trace", "run", "--scheduler", "fla"])
    assert exc.value.code == 2
    assert "--scheduler" in capsys.readouterr().err


def test_engine_code_that_exits_is_an_error_not_a_clean_run(capsys, monkeypatch):
    """A driver whose engine calls ``sys.exit(0)`` mid-run: exit 2 naming the scheduler, not exit 0."""
    import sys
    import types

    from workbench.traces import cli as trace_cli

    fake = types.ModuleType("fake_exiting_scheduler")

    def run(**_: object) -> None:
        sys.exit(0)

    fake.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_exiting_scheduler", fake)
    monkeypatch.setitem(trace_cli.SCHEDULERS, "vllm", ("fake_exiting_scheduler", "run", "vllm"))
    assert cli.main(["trace", "run", "--scheduler", "vllm", "--steps", "3"]) == 2
    err = capsys.readouterr().err
    assert "--scheduler vllm" in err and "SystemExit(0)" in err
