"""Capability probes (``workbench.engines.probes``, issue 30) on a small engine written here: each probe holds
on what the adapter needs and names what is missing when the engine moved. No engine needed."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import textwrap
from pathlib import Path

import pytest

from workbench.engines.probes import (
    Probe,
    config_leaves,
    config_reads,
    fields,
    has,
    required_fields,
    run_probes,
    takes,
)
from workbench.engines.versions import EngineError

ENGINE = """
def get_exec():
    raise RuntimeError("the stand-in answers")

def get_memory():
    raise RuntimeError("the stand-in answers")

def _helper():
    return get_exec().mamba.track_interval

def server_default():
    return get_memory().page_major  # never reached from the backend's hooks

class Base:
    def __init__(self, model_runner):
        self.unified = get_memory().unified

    def init_forward_metadata(self, forward_batch):
        self._build(forward_batch)

    def _build(self, forward_batch):
        return _helper()

class Backend(Base):
    def __init__(self, model_runner):
        super().__init__(model_runner)
        self.topk = get_exec().spec.topk

    def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
        return in_capture
"""


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    package = tmp_path / "toyengine"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "backend.py").write_text(textwrap.dedent(ENGINE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module("toyengine.backend")
    for name in [n for n in sys.modules if n.startswith("toyengine")]:
        del sys.modules[name]


def test_the_config_read_by_the_code_the_adapter_drives_is_found_and_no_more(engine) -> None:
    reads = config_reads([(engine.Backend, ("__init__", "init_forward_metadata"))], ("get_exec", "get_memory"), "toy")
    assert set(reads) == {
        ("get_memory", "unified"),  # Base.__init__, through super()
        ("get_exec", "spec", "topk"),
        ("get_exec", "mamba", "track_interval"),  # self._build -> _helper
    }
    assert reads[("get_exec", "mamba", "track_interval")] == "toyengine.backend._helper"
    # server_default reads get_memory().page_major, but nothing the adapter calls reaches it


def test_a_config_leaf_the_stand_in_lacks_is_named_with_the_function_that_reads_it(engine) -> None:
    roots = [(engine.Backend, ("__init__", "init_forward_metadata"))]
    leaves = {"get_exec()": {"spec": {"topk": None}, "mamba": {"track_interval": 64}}, "get_memory()": {"unified": 0}}
    assert config_leaves(roots, ("get_exec", "get_memory"), leaves, "toy")() is None
    del leaves["get_exec()"]["mamba"]
    missing = config_leaves(roots, ("get_exec", "get_memory"), leaves, "toy")()
    assert missing == (
        "the backend reads config leaves the adapter does not stand in: get_exec().mamba.track_interval "
        "(in toyengine.backend._helper)"
    )


def test_a_hook_that_lost_a_keyword_is_named_with_what_it_takes(engine) -> None:
    assert takes(engine.Backend.init_forward_metadata_out_graph, "forward_batch", "in_capture")() is None
    assert takes(engine.Backend, "model_runner")() is None  # a class: its constructor

    def renamed(self, forward_batch, capture=False, **kwargs): ...

    assert takes(renamed, "forward_batch", "in_capture")() == (
        "test_a_hook_that_lost_a_keyword_is_named_with_what_it_takes.<locals>.renamed(self, forward_batch, capture) "
        "has no parameter in_capture"
    )


def test_attributes_and_dataclass_fields_are_named_when_missing(engine) -> None:
    @dataclasses.dataclass
    class Meta:
        state_indices: list
        query_start_loc: list
        extra: int = 0

    assert has(engine.Backend, "init_forward_metadata", "init_forward_metadata_out_graph")() is None
    assert has(engine, "Backend", "GoneBackend")() == "toyengine.backend has no GoneBackend"
    assert fields(Meta, "state_indices")() is None
    assert fields(Meta, "state_indices", "checkpoint")() == (
        "no field checkpoint (has state_indices, query_start_loc, extra)"
    )
    assert fields(engine.Backend, "x")() == "Backend is not a dataclass"
    assert required_fields(Meta, ["state_indices", "query_start_loc"])() is None
    assert (
        required_fields(Meta, ["state_indices"])() == "Meta requires query_start_loc, which the adapter does not pass"
    )


def test_run_probes_stops_at_the_first_failure_in_one_line() -> None:
    ran: list[str] = []

    def ok(name: str):
        def check() -> None:
            ran.append(name)

        return check

    def boom() -> str:
        raise AttributeError("module has no attribute 'LinearAttnBackends'")

    assert run_probes("eng 1", [Probe("a", ok("a")), Probe("b", ok("b"))]) == 2
    with pytest.raises(EngineError) as e:
        run_probes("eng 2.dev1+gabc", [Probe("a", ok("c")), Probe("tables", boom), Probe("d", ok("d"))])
    assert str(e.value) == (
        "eng 2.dev1+gabc: probe 'tables' failed: AttributeError: module has no attribute 'LinearAttnBackends'"
    )
    assert ran == ["a", "b", "c"]  # d never ran
