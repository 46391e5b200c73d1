"""A public hook is entered from outside the trees: the engine's runner calls it, whatever the trees show.

The seed of issue 26: a base routes its public ``init_forward_metadata_out_graph`` through a private
``_replay_metadata`` that delegates upward with ``super()``, and the subclass's ``_replay_metadata`` lacks
``in_capture``. The only call of the public hook in the trees is that ``super()`` call, from a method the
subclass replaced; the checker once concluded that nothing enters the hook and said "OK". Each variant is
checked through the CLI (exit 1, CPython's own ``TypeError`` text, taken from really calling the class) and its
fixed twin (``in_capture: bool = False`` on the override) must exit 0.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest
from test_contracts_cli import runner_capture_caller

from workbench.contracts import check, main

ENGINE_BASE = """\
    class MetadataBackend:
        def init_forward_metadata(self, batch):
            raise NotImplementedError

        def init_forward_metadata_out_graph(self, batch, in_capture: bool = False):
            return batch

        def init_forward_metadata_in_graph(self, batch):
            return batch
"""

# where MetadataBackend comes from: the file itself (an engine-shaped base in the trees), an engine package on
# the search path, or the workbench's own classes
HEADERS = {
    "engine-in-file": ENGINE_BASE,
    "engine-package": "from eng.layers.base import MetadataBackend\n",
    "workbench": "from workbench.backends import MetadataBackend\n",
    "workbench-npu": "from workbench.backends import NpuMetadataBackend as MetadataBackend\n",
}

SEED = """\
    class MyBase(MetadataBackend):
        def init_forward_metadata_out_graph(self, batch, in_capture: bool = False):
            return self._replay_metadata(batch, in_capture=in_capture)

        def _replay_metadata(self, batch, in_capture: bool = False):
            return super().init_forward_metadata_out_graph(batch, in_capture=in_capture)


    class AscendBackend(MyBase):
        def _replay_metadata(self, batch):  # lacks in_capture: TypeError at the first capture
            return batch
"""

MIXIN = """\
    class ReplayMixin:
        def init_forward_metadata_out_graph(self, batch, in_capture: bool = False):
            return self._replay_metadata(batch, in_capture=in_capture)

        def _replay_metadata(self, batch, in_capture: bool = False):
            return super().init_forward_metadata_out_graph(batch, in_capture=in_capture)


    class MyBase(ReplayMixin, MetadataBackend):
        pass


    class AscendBackend(MyBase):
        def _replay_metadata(self, batch):
            return batch
"""

TWO_LEVELS = """\
    class MyBase(MetadataBackend):
        def init_forward_metadata_out_graph(self, batch, in_capture: bool = False):
            return self._prepare(batch, in_capture=in_capture)

        def _prepare(self, batch, in_capture: bool = False):
            return self._replay_metadata(batch, in_capture=in_capture)

        def _replay_metadata(self, batch, in_capture: bool = False):
            return super().init_forward_metadata_out_graph(batch, in_capture=in_capture)


    class AscendBackend(MyBase):
        def _replay_metadata(self, batch):
            return batch
"""

INTERMEDIATE_BASE = """\
    class Intermediate(MetadataBackend):
        def init_forward_metadata_out_graph(self, batch, in_capture: bool = False):
            return super().init_forward_metadata_out_graph(batch, in_capture=in_capture)


    class MyBase(Intermediate):
        def init_forward_metadata_out_graph(self, batch, in_capture: bool = False):
            return self._replay_metadata(batch, in_capture=in_capture)

        def _replay_metadata(self, batch, in_capture: bool = False):
            return super().init_forward_metadata_out_graph(batch, in_capture=in_capture)


    class AscendBackend(MyBase):
        def _replay_metadata(self, batch):
            return batch
"""

SUPER_THROUGH_MIDDLE = """\
    class MyBase(MetadataBackend):
        def init_forward_metadata_out_graph(self, batch, in_capture: bool = False):
            return self._replay_metadata(batch, in_capture=in_capture)

        def _replay_metadata(self, batch, in_capture: bool = False):
            return super().init_forward_metadata_out_graph(batch, in_capture=in_capture)


    class Middle(MyBase):
        def _replay_metadata(self, batch, in_capture: bool = False):
            return super()._replay_metadata(batch, in_capture=in_capture)


    class AscendBackend(Middle):
        def _replay_metadata(self, batch):
            return batch
"""

VARIANTS = {
    "seed": SEED,
    "mixin": MIXIN,
    "two-private-levels": TWO_LEVELS,
    "intermediate-base": INTERMEDIATE_BASE,
    "super-through-middle": SUPER_THROUGH_MIDDLE,
}
BROKEN = "def _replay_metadata(self, batch):"
FIXED = "def _replay_metadata(self, batch, in_capture: bool = False):"
PUBLIC_BROKEN = "def init_forward_metadata_out_graph(self, batch):"
PUBLIC_FIXED = "def init_forward_metadata_out_graph(self, batch, in_capture: bool = False):"


def write_plugin(tmp_path: Path, header: str, body: str, name: str = "plugin") -> tuple[Path, list[str]]:
    """The plugin file (and the engine package it imports, where it does); the CLI's arguments for it."""
    site = tmp_path / "site"
    (site / "eng" / "layers").mkdir(parents=True, exist_ok=True)
    (site / "eng" / "__init__.py").write_text("")
    (site / "eng" / "layers" / "__init__.py").write_text("")
    (site / "eng" / "layers" / "base.py").write_text(textwrap.dedent(ENGINE_BASE))
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(header) + "\n\n" + textwrap.dedent(body))
    extra = ["--search-path", str(site)] if header.startswith("from eng.") else []
    return path, [str(path), *extra]


def runtime_error(path: Path, cls: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """What CPython raises when the runner's capture call reaches ``cls``: the text a break must quote."""
    monkeypatch.syspath_prepend(str(path.parent / "site"))
    name = f"_public_hooks_{path.stem}_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    klass = getattr(module, cls)
    backend = object.__new__(klass)  # no pool needed: the call fails on its signature, before any state
    with pytest.raises(TypeError) as raised:
        klass.init_forward_metadata_out_graph(backend, object(), in_capture=True)
    return f"TypeError: {raised.value}"


@pytest.mark.parametrize("header", list(HEADERS), ids=list(HEADERS))
@pytest.mark.parametrize("variant", list(VARIANTS), ids=list(VARIANTS))
def test_a_private_hook_behind_a_public_one_is_a_break(
    tmp_path: Path, header: str, variant: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    path, argv = write_plugin(tmp_path, HEADERS[header], VARIANTS[variant])
    message = runtime_error(path, "AscendBackend", monkeypatch)
    assert message == "TypeError: AscendBackend._replay_metadata() got an unexpected keyword argument 'in_capture'"
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "AscendBackend._replay_metadata [missing-parameter]" in out
    assert f"result:    {message}" in out
    found = [f for f in check(str(path), search_path=argv[2:3]).breaks if f.cls == "AscendBackend"]
    assert [(f.method, f.message) for f in found] == [("_replay_metadata", message)]
    assert found[0].site_line is not None
    assert "in_capture=in_capture" in path.read_text().splitlines()[found[0].site_line - 1]


@pytest.mark.parametrize("header", list(HEADERS), ids=list(HEADERS))
@pytest.mark.parametrize("variant", list(VARIANTS), ids=list(VARIANTS))
def test_the_fixed_twin_is_no_break(tmp_path: Path, header: str, variant: str, capsys: pytest.CaptureFixture) -> None:
    body = VARIANTS[variant]
    assert BROKEN in body
    _, argv = write_plugin(tmp_path, HEADERS[header], body.replace(BROKEN, FIXED))
    assert main(argv) == 0, capsys.readouterr().out
    assert "OK: no breaks" in capsys.readouterr().out


WORKBENCH_FILE = """\
    from workbench.backends import NpuMetadataBackend


    class MyBase(NpuMetadataBackend):
        def init_forward_metadata_out_graph(self, batch, in_capture: bool = False):
            return self._replay_metadata(batch, in_capture=in_capture)

        def _replay_metadata(self, batch, in_capture: bool = False):
            return super().init_forward_metadata_out_graph(batch, in_capture=in_capture)


    class AscendBackend(MyBase):
        def _replay_metadata(self, batch):
            return batch


    class Plain(NpuMetadataBackend):
        def init_forward_metadata_out_graph(self, batch):  # the runner passes in_capture=True at capture
            return batch
"""


def test_a_file_on_workbench_classes_is_checked_with_the_runners_calls_whatever_bases_it_adds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The file defines a base of its own (``MyBase``); ``Plain`` overrides the workbench's public hook without
    ``in_capture``: the workbench's ``GraphRunner`` calls it with ``in_capture=True``."""
    path, argv = write_plugin(tmp_path, "", WORKBENCH_FILE, name="wb_plugin")
    plain = runtime_error(path, "Plain", monkeypatch)
    assert plain == "TypeError: Plain.init_forward_metadata_out_graph() got an unexpected keyword argument 'in_capture'"
    ascend = runtime_error(path, "AscendBackend", monkeypatch)
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "the targets derive from the workbench's own workbench.backends.npu:NpuMetadataBackend" in out
    report = check(str(path))
    found = sorted((f.cls, f.method, f.message, f.caller) for f in report.breaks)
    assert found == [
        ("AscendBackend", "_replay_metadata", ascend, "MyBase.init_forward_metadata_out_graph"),
        ("Plain", "init_forward_metadata_out_graph", plain, runner_capture_caller()),
    ]
    (runner_call,) = [f for f in report.breaks if f.cls == "Plain"]
    assert runner_call.site_file is not None and runner_call.site_file.endswith("runner.py")
    labels = {c.base.rpartition(":")[2] for c in report.contracts}
    assert {"MyBase", "NpuMetadataBackend", "MetadataBackend"} <= labels
    assert report.base == "every base class in the trees"
    # the fixed twin: both overrides take in_capture
    fixed = WORKBENCH_FILE.replace(BROKEN, FIXED).replace(PUBLIC_BROKEN, PUBLIC_FIXED)
    _, argv = write_plugin(tmp_path, "", fixed, name="wb_plugin_fixed")
    assert main(argv) == 0
    assert "OK: no breaks" in capsys.readouterr().out


def test_a_public_method_is_entered_even_when_its_only_caller_in_the_trees_is_replaced(tmp_path: Path) -> None:
    """sglang's EAGLE draft runners replace ``execute``, the only caller of ``load_batch`` in the trees, but
    inherit the public ``load_batch``, which the engine calls on a decode runner from elsewhere
    (``model_runner.decode_cuda_graph_runner.load_batch(...)``): their narrower ``_make_key`` is a latent break.
    A private ``_load_batch`` called only from the replaced ``execute`` is not entered: no break."""
    source = """\
        class GraphRunner:
            def execute(self, batch):
                return self.{name}(batch)

            def {name}(self, batch):
                return self._make_key(batch, 1, 2)

            def _make_key(self, size, stream=None, variant=None):
                return size


        class DraftRunner(GraphRunner):
            def execute(self, batch):
                return batch  # its own replay

            def _make_key(self, size, stream=None):
                return size
    """
    public = tmp_path / "public.py"
    public.write_text(textwrap.dedent(source).format(name="load_batch"))
    (finding,) = check(str(public)).breaks
    assert (finding.cls, finding.method, finding.caller) == ("DraftRunner", "_make_key", "GraphRunner.load_batch")
    namespace: dict = {}
    exec(public.read_text(), namespace)
    with pytest.raises(TypeError) as raised:
        namespace["DraftRunner"]().load_batch(8)
    assert finding.message == f"TypeError: {raised.value}"
    assert "DraftRunner._make_key() takes from 2 to 3 positional arguments but 4 were given" in finding.message
    private = tmp_path / "private.py"
    private.write_text(textwrap.dedent(source).format(name="_load_batch"))
    assert check(str(private)).breaks == []
