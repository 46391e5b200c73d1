"""workbench.contracts on the shapes of the engines' real trees: namespace packages, hidden folders, composed
calls, ``**kwargs`` that swallow a rename, classes built in functions, two tiers (break and drift).

Each tree is written into ``tmp_path`` in the layout of sglang 0.5.23 (``srt/`` without ``__init__.py``) or
of a plain package, small enough to read in the test; the measurements on the real wheels are in
``benchmarks/contracts_real_trees.py``.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from workbench.contracts import SWALLOWED, ContractError, check, main

BASE_SRC = """\
    from typing import List, Optional


    class AttentionBackend:
        def forward(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
            if forward_batch.is_decode:
                return self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kwargs)
            return self.forward_extend(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kwargs)

        def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
            raise NotImplementedError

        def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
            raise NotImplementedError

        def init_cuda_graph_state(self, max_bs, max_num_tokens):
            pass

        def dispatch(self, *args, **kwargs):
            raise NotImplementedError


    class MambaAttnBackendBase(AttentionBackend):
        def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
            return self._replay_metadata(
                forward_batch.batch_size,
                forward_batch.req_pool_indices,
                num_padding=forward_batch.num_padding,
                in_capture=in_capture,
            )

        def _replay_metadata(self, bs, req_pool_indices, num_padding=None, in_capture=False):
            return bs, num_padding, in_capture


    class HybridLinearAttnBackend(AttentionBackend):
        full_attn_backend: AttentionBackend

        def __init__(self, full_attn_backend, linear_attn_backend: MambaAttnBackendBase,
                     others: List[AttentionBackend]):
            self.full_attn_backend = full_attn_backend
            self.linear_attn_backend = linear_attn_backend
            self.attn_backends: List[AttentionBackend] = others

        def init_cuda_graph_state(self, max_bs, max_num_tokens):
            for backend in self.attn_backends:
                backend.init_cuda_graph_state(max_bs, max_num_tokens)
            self.attn_backends[0].init_cuda_graph_state(max_bs, max_num_tokens=max_num_tokens)

        def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
            return self.linear_attn_backend.forward_decode(q=q, k=k, v=v, layer=layer, forward_batch=forward_batch,
                                                           mixed_qkv=kwargs["mixed_qkv"])

        def capture(self, fb):
            return self.linear_attn_backend.init_forward_metadata_out_graph(fb, in_capture=True)


    def warm_up(backend: Optional[AttentionBackend], bs: int):
        return backend.init_cuda_graph_state(bs, bs)
"""

NPU_SRC = """\
    import torch_npu  # Ascend only: never imported by the checker
    from sglang.srt.layers.attention.base import AttentionBackend, MambaAttnBackendBase


    class AscendMambaBackend(MambaAttnBackendBase):
        def _replay_metadata(self, bs, req_pool_indices, num_padding=None):
            return bs


    class AscendMamba2Backend(AscendMambaBackend):
        pass


    class AscendGraphState(AttentionBackend):
        def init_cuda_graph_state(self, max_bs):
            return max_bs


    class AscendOwnForward(MambaAttnBackendBase):
        def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
            return None  # replaces the calling method without super(): the base's call never reaches _replay_metadata

        def _replay_metadata(self, bs):
            return bs


    class AscendDispatch(AttentionBackend):
        def dispatch(self, x):
            return x  # narrows a generic (*args, **kwargs) hook: by design, not drift


    class AscendDrift(AttentionBackend):
        def forward_extend(self, q, k, v, layer, forward_batch):
            return q  # drops save_kv_cache and **kwargs: the base's forward passes **kwargs, no finding that raises
"""

LINEAR_SRC = """\
    from sglang.srt.layers.attention.base import MambaAttnBackendBase


    class GDNAttnBackend(MambaAttnBackendBase):
        def forward_decode(self, layer, forward_batch, mixed_qkv, **kwargs):
            return mixed_qkv  # a redesign: the hybrid backend calls it by its own keywords
"""


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


@pytest.fixture
def sglang_like(tmp_path: Path) -> Path:
    """``site/sglang/srt/...`` with no ``__init__.py`` under ``srt/``, as the 0.5.23 wheel ships it."""
    site = tmp_path / ".venv" / "lib" / "site-packages"  # a hidden folder above the targets, as in a venv
    write(site, {"sglang/__init__.py": "", "sglang/srt/layers/attention/base.py": BASE_SRC,
                 "sglang/srt/hardware_backend/npu/attention/ascend_backend.py": NPU_SRC,
                 "sglang/srt/layers/attention/linear/gdn_backend.py": LINEAR_SRC})  # fmt: skip
    return site / "sglang" / "srt"


def breaks(report) -> list[tuple[str, str, int]]:
    return [(f.cls, f.method, f.site_line) for f in report.breaks]


def line_of(path: Path, text: str) -> int:
    (line,) = [i for i, row in enumerate(path.read_text().splitlines(), 1) if text in row]
    return line


def test_namespace_tree_under_a_hidden_folder_is_checked_without_search_path(sglang_like: Path) -> None:
    """The per-file hook on the changed Ascend file finds the seed: roots come from its own imports, and the
    ``.venv`` above the target does not hide it."""
    npu = sglang_like / "hardware_backend" / "npu" / "attention" / "ascend_backend.py"
    base = sglang_like / "layers" / "attention" / "base.py"
    report = check(npu)
    seed = next(f for f in report.breaks if f.method == "_replay_metadata")
    assert (seed.cls, seed.subclasses) == ("AscendMambaBackend", ("AscendMambaBackend", "AscendMamba2Backend"))
    assert seed.message == (
        "TypeError: AscendMambaBackend._replay_metadata() got an unexpected keyword argument 'in_capture'"
    )
    assert seed.site_file == str(base) and seed.site_line == line_of(base, "return self._replay_metadata(")
    assert seed.caller == "MambaAttnBackendBase.init_forward_metadata_out_graph"
    assert seed.base == "sglang.srt.layers.attention.base:MambaAttnBackendBase"  # the dotted name, not the file's
    assert "AscendOwnForward" not in {f.cls for f in report.breaks}  # its replaced caller never reaches the hook


def test_composed_calls_reach_the_subclasses_of_an_annotated_attribute_or_parameter(sglang_like: Path) -> None:
    base = sglang_like / "layers" / "attention" / "base.py"
    report = check(sglang_like)
    graph_state = sorted(f.site_line for f in report.breaks if f.cls == "AscendGraphState")
    assert graph_state == sorted(
        [
            line_of(base, "backend.init_cuda_graph_state(max_bs, max_num_tokens)"),  # for backend in self.attn_backends
            line_of(base, "self.attn_backends[0].init_cuda_graph_state("),  # an item of a List[...] attribute
            line_of(base, "return backend.init_cuda_graph_state(bs, bs)"),  # an Optional[...] parameter
        ]
    )
    # through an attribute assigned from an annotated __init__ parameter: the seed, called by the hybrid backend
    capture = line_of(base, "return self.linear_attn_backend.init_forward_metadata_out_graph(")
    seeds = {f.site_line for f in report.breaks if f.method == "_replay_metadata"}
    assert (
        seeds == {line_of(base, "return self._replay_metadata(")} and capture not in seeds
    )  # the hook, not the caller
    # the override that redesigns forward_decode is called by its own keywords: the base-protocol call is drift
    assert "GDNAttnBackend" not in {f.cls for f in report.breaks}
    redesign = [f for f in report.drift if f.cls == "GDNAttnBackend"]
    assert any("a redesign:" in f.message for f in redesign)


def test_two_tiers_drift_is_counted_and_generic_hooks_are_no_drift(sglang_like: Path, capsys) -> None:
    report = check(sglang_like)
    drift = {(f.cls, f.method) for f in report.drift}
    assert ("AscendDrift", "forward_extend") in drift
    assert not any(f.cls == "AscendDispatch" for f in report.findings)  # (self, *args, **kwargs) promises nothing
    assert all(f.tier == "break" for f in report.breaks) and report.ok is False
    assert main([str(sglang_like)]) == 1
    out = capsys.readouterr().out
    assert "drift in" not in out and f"; {len(report.drift)} drift (" in out.splitlines()[-1]
    assert main([str(sglang_like), "--drift"]) == 1
    assert "drift in AscendDrift" in capsys.readouterr().out
    assert main([str(sglang_like), "--format", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert {f["tier"] for f in data["findings"]} == {"break", "drift"} and data["breaks"] == len(report.breaks)
    assert all(isinstance(f["subclasses"], list) for f in data["findings"])


def test_base_option_includes_an_intermediate_base_calls(sglang_like: Path) -> None:
    """``--base`` of the root class still sees the call an intermediate base makes (the seed's)."""
    npu = sglang_like / "hardware_backend" / "npu" / "attention" / "ascend_backend.py"
    report = check(npu, "sglang.srt.layers.attention.base:AttentionBackend")
    assert "_replay_metadata" in {f.method for f in report.breaks}
    narrow = check(npu, "sglang.srt.layers.attention.base:MambaAttnBackendBase")
    assert {f.cls for f in narrow.breaks} == {"AscendMambaBackend"}  # AscendGraphState is not a subclass of it


def test_a_rename_that_kwargs_swallow_is_a_break(tmp_path: Path) -> None:
    """The shape the PR 29598 fix introduced: ``*args, **kwargs`` on the override; a later rename of
    ``num_padding`` at the base passes silently unless the body's read of the old name is matched to it."""
    write(tmp_path, {"pkg/__init__.py": "", "pkg/base.py": """\
        class Base:
            def step(self, fb):
                return self._hook(fb.bs, num_pad=fb.pad, in_capture=False)

            def _hook(self, bs, num_pad=None, in_capture=False):
                return bs


        class ReadsKwargs(Base):
            def _hook(self, bs, *args, **kwargs):
                return bs - kwargs.get("num_padding", 0)


        class ReadsOldName(Base):
            def _hook(self, bs, num_padding=None, **kwargs):
                return bs - (num_padding or 0)


        class ForwardsAll(Base):
            def _hook(self, bs, *args, **kwargs):
                return super()._hook(bs, *args, **kwargs)
        """})  # fmt: skip
    report = check(tmp_path / "pkg")
    found = {f.cls: f for f in report.breaks}
    assert set(found) == {"ReadsKwargs", "ReadsOldName"}  # forwarding everything is fine
    assert {f.kind for f in found.values()} == {SWALLOWED}
    assert found["ReadsKwargs"].message == (
        "no exception, but **kwargs swallows 'num_pad', 'in_capture' while the body reads kwargs['num_padding'], "
        "which this call does not pass"
    )
    assert "reads 'num_padding', which the base no longer has" in found["ReadsOldName"].message


def test_a_class_built_inside_a_function_is_checked_with_the_function_imports(sglang_like: Path) -> None:
    write(sglang_like, {"hardware_backend/npu/attention/kda.py": """\
        class AscendKDAHybrid:
            def __new__(cls, *args, **kwargs):
                from sglang.srt.layers.attention.base import MambaAttnBackendBase as _Base

                class _AscendKDA(_Base):
                    def _replay_metadata(self, bs, req_pool_indices):
                        return bs

                return _AscendKDA(*args, **kwargs)
        """})  # fmt: skip
    report = check(sglang_like / "hardware_backend" / "npu" / "attention" / "kda.py")
    (found,) = report.breaks
    assert found.cls == "AscendKDAHybrid.__new__.<locals>._AscendKDA" and found.method == "_replay_metadata"
    assert "unexpected keyword argument 'num_padding'" in found.message


def test_outside_bases_star_reexports_and_unparsable_files_do_not_refuse_the_run(tmp_path: Path) -> None:
    abstract = "class Pooler:\n    def pool(self, x, scale=1.0):\n        return x\n\n    def run(self, x):\n"
    abstract += "        return self.pool(x)\n"
    mean = "import enum\nfrom openai.types import Message\nfrom eng.layers import Pooler\n\n\n"
    mean += "class Kind(enum.Enum):\n    A = 1\n\n\nclass Msg(Message):\n    pass\n\n\n"
    mean += "class MeanPooler(Pooler):\n    def pool(self, x, scale=2.0):\n        return x\n"
    write(tmp_path, {"eng/__init__.py": "", "eng/layers/__init__.py": "from .abstract import *\n",
                     "eng/layers/abstract.py": abstract, "eng/models/__init__.py": "", "eng/models/mean.py": mean,
                     "eng/models/newer.py": "type Alias = int\n"})  # fmt: skip
    report = check(tmp_path / "eng")  # exit 1, not 2: the star re-export is followed, the rest is noted
    (found,) = report.breaks
    assert (found.cls, found.method, found.kind) == ("MeanPooler", "pool", "changed-default")
    notes = "\n".join(report.notes)
    assert "openai.types:Message (not found) x1" in notes and "enum:Enum (in " in notes
    assert "1 file(s) do not parse on this Python and were skipped" in notes


def test_ignore_comment_leaves_a_deliberate_break_out(tmp_path: Path) -> None:
    source = (
        "class Base:\n    def run(self):\n        return self.hook(1, flag=True)\n\n"
        "    def hook(self, x, flag=False):\n        return x\n\n\n"
        "class Bug(Base):\n    def hook(self, x):{}\n        return x\n"
    )
    (tmp_path / "m.py").write_text(source.format(""))
    assert [f.cls for f in check(tmp_path / "m.py").breaks] == ["Bug"]
    (tmp_path / "m.py").write_text(source.format("  # check-contracts: ignore (a zoo case)"))
    assert check(tmp_path / "m.py").breaks == []


def test_a_plugin_against_the_engine_it_extends(sglang_like: Path, tmp_path: Path, capsys) -> None:
    """A device plugin outside the engine's tree, against the engine unpacked elsewhere (``--search-path``) or
    named as a package (``--against``, whose files are all read for the calls they make)."""
    site = sglang_like.parents[1]
    plugin = tmp_path / "my_plugin"
    write(plugin, {"backend.py": """\
        from sglang.srt.layers.attention.base import MambaAttnBackendBase


        class PluginBackend(MambaAttnBackendBase):
            def _replay_metadata(self, bs, req_pool_indices, num_padding=None):
                return bs
        """})  # fmt: skip
    with pytest.raises(ContractError, match="their bases are outside the trees"):
        check(plugin)
    for report in (check(plugin, search_path=[site]), check(plugin, against=[str(site / "sglang")])):
        assert [(f.cls, f.method) for f in report.breaks] == [("PluginBackend", "_replay_metadata")]
    assert main([str(plugin), "--search-path", str(site)]) == 1
    assert "PluginBackend._replay_metadata [missing-parameter]" in capsys.readouterr().out
    with pytest.raises(ContractError, match="--against 'no_such_engine_pkg': no such package"):
        check(plugin, against=["no_such_engine_pkg"])


def test_what_the_engines_trees_showed_is_not_a_break(tmp_path: Path) -> None:
    """Three shapes from the released trees that are not breaks: a keyword the body reads from ``**kwargs``
    (vLLM's Mamba2 builder), a call under ``isinstance()`` that only one subclass can reach (vLLM's weight
    loaders), and a hook whose private calling method only a replaced entry point calls (sglang's EAGLE draft
    runners replace ``execute``, the only caller of ``load_batch`` in the trees; ``load_batch`` is public, so
    the engine may enter it from elsewhere: ``test_contracts_public_hooks.py`` has that shape, a break)."""
    write(tmp_path, {"pkg/__init__.py": "", "pkg/mod.py": """\
        class Builder:
            def capture(self, m):
                return self.build(0, m, num_accepted_tokens=None)

            def build(self, prefix, m, *, num_accepted_tokens=None, num_draft=None, **kwargs):
                return prefix


        class Mamba2Builder(Builder):
            def build(self, prefix, m, **kwargs):
                return kwargs.get("num_accepted_tokens"), kwargs.get("num_draft")


        class Param:
            def load(self, w, **kwargs):
                return w


        class Scale(Param):
            pass


        class Column(Param):
            def load(self, w):
                return w


        class Layer:
            def loader(self, param: Param, w):
                if isinstance(param, Scale):
                    param.load(w, shard_id=0)
                return param.load(w, shard_id=1)


        class GraphRunner:
            def execute(self, batch):
                return self._load_batch(batch)

            def _load_batch(self, batch):
                return self._make_key(batch, 1, 2)

            def _make_key(self, size, stream=None, variant=None):
                return size


        class DraftRunner(GraphRunner):
            def execute(self, batch):
                return batch  # its own replay: _load_batch never runs here

            def _make_key(self, size, stream=None):
                return size


        class DraftExtendRunner(GraphRunner):
            def _make_key(self, size, stream=None):
                return size  # inherits execute: the call reaches it
        """})  # fmt: skip
    mod = tmp_path / "pkg" / "mod.py"
    report = check(tmp_path / "pkg")
    assert breaks(report) == [
        ("Column", "load", line_of(mod, "return param.load(w, shard_id=1)")),
        ("DraftExtendRunner", "_make_key", line_of(mod, "return self._make_key(batch, 1, 2)")),
    ]
