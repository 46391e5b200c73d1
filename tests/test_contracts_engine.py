"""workbench.contracts on an engine-shaped tree: the calls the base makes on itself, private hooks included.

The fixtures under ``tests/fixtures/contracts/eng`` mimic sglang's layout: a base backend module that imports
engine modules missing here, Ascend subclass modules that import device libraries missing here, and the
base's private hook ``_replay_metadata`` called on ``self`` with ``in_capture=`` and ``mamba_track_indices=``.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import pytest

from workbench.contracts import CHANGED_DEFAULT, MISSING, ContractError, Report, check
from workbench.contracts.synthetic import BROKEN_EVERY, bench

FIXTURES = Path(__file__).parent / "fixtures" / "contracts"
ENG = FIXTURES / "eng"
NPU = ENG / "hardware" / "npu"
BASE_FILE = ENG / "layers" / "attention" / "mamba_backend.py"
BASE = "eng.layers.attention.mamba_backend:MambaAttnBackendBase"


def line_of(path: Path, text: str) -> int:
    lines = [i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    assert len(lines) == 1, (path, text, lines)
    return lines[0]


REPLAY_CALL = line_of(BASE_FILE, "self.forward_metadata = self._replay_metadata(")
PAD_CALL = line_of(BASE_FILE, "type(self)._pad_value(")
PREPARE_CALL = line_of(BASE_FILE, "self._prepare(forward_batch)")
CALL_TEXT = (
    "self._replay_metadata(bs, ..., ..., forward_batch.spec_info, ..., num_padding=..., in_capture=in_capture, "
    "mamba_track_indices=...)"
)


def unexpected(owner: str, method: str, name: str) -> str:
    return f"TypeError: {owner}.{method}() got an unexpected keyword argument '{name}'"


# (class, method, kind, owner, override file, override def line, base call line, message)
EXPECTED = [
    (
        "AscendMambaBackend",
        "_replay_metadata",
        MISSING,
        "AscendMambaBackend",
        NPU / "ascend_backend.py",
        line_of(NPU / "ascend_backend.py", "seq_lens_cpu, num_padding=None):"),
        REPLAY_CALL,
        unexpected("AscendMambaBackend", "_replay_metadata", "in_capture"),
    ),
    (
        "AscendOneKeywordBackend",
        "_replay_metadata",
        MISSING,
        "AscendOneKeywordBackend",
        NPU / "ascend_backend.py",
        line_of(NPU / "ascend_backend.py", "class AscendOneKeywordBackend") + 3,
        REPLAY_CALL,
        unexpected("AscendOneKeywordBackend", "_replay_metadata", "mamba_track_indices"),
    ),
    (
        "AscendMTPBackend",
        "_replay_metadata",
        MISSING,
        "AscendOneKeywordBackend",
        NPU / "ascend_backend.py",
        line_of(NPU / "ascend_backend.py", "class AscendOneKeywordBackend") + 3,
        REPLAY_CALL,
        unexpected("AscendOneKeywordBackend", "_replay_metadata", "mamba_track_indices"),
    ),
    (
        "AscendMixedBackend",
        "_replay_metadata",
        MISSING,
        "ReplayMixin",
        NPU / "variants.py",
        line_of(NPU / "variants.py", "def _replay_metadata(self, bs, *args, num_padding=None):"),
        REPLAY_CALL,
        unexpected("ReplayMixin", "_replay_metadata", "in_capture"),
    ),
    (
        "AscendTracedBackend",
        "_replay_metadata",
        MISSING,
        "AscendTracedBackend",
        NPU / "variants.py",
        line_of(NPU / "variants.py", "@traced") + 1,
        REPLAY_CALL,
        unexpected("AscendTracedBackend", "_replay_metadata", "in_capture"),
    ),
    (
        "AscendStaticHookBackend",
        "_pad_value",
        MISSING,
        "AscendStaticHookBackend",
        NPU / "variants.py",
        line_of(NPU / "variants.py", "def _pad_value(forward_mode):"),
        PAD_CALL,
        unexpected("AscendStaticHookBackend", "_pad_value", "fill"),
    ),
    (
        "AscendDefaultsBackend",
        "_prepare",
        CHANGED_DEFAULT,
        "AscendDefaultsBackend",
        NPU / "variants.py",
        line_of(NPU / "variants.py", "def _prepare(self, forward_batch, use_cache=False):"),
        PREPARE_CALL,
        "no exception, but silently changes meaning: the call omits 'use_cache', which gets False here, "
        "not the base's True",
    ),
]
CLEAN = ["AscendForwardingBackend", "AscendStaticFineBackend", "AscendOwnReplayBackend"]
GROUPED = sorted({row[3]: (row[3], *row[1:]) for row in EXPECTED}.values(), key=lambda row: (str(row[4]), row[5]))
"""Each break once, under the class that defines the override (the others inherit it)."""
HEIRS = {row[0]: [r[0] for r in EXPECTED if r[3] == row[0]] for row in GROUPED}


def summary(report: Report) -> list[tuple]:
    return [
        (f.cls, f.method, f.kind, f.cls, Path(f.file), f.line, f.site_line, f.message)
        for f in report.findings
        if f.site_file
    ]


@pytest.mark.parametrize("target", [ENG, NPU, ENG / "hardware"], ids=["package", "npu-folder", "hardware-folder"])
def test_default_run_finds_the_private_hook_breaks_and_names_the_base_call(target: Path) -> None:
    """No --base, no --method: the missing in_capture on the private hook is found, from any folder."""
    report = check(target)
    assert summary(report) == GROUPED
    assert {f.cls: list(f.subclasses) for f in report.findings} == HEIRS
    assert HEIRS["AscendOneKeywordBackend"] == ["AscendOneKeywordBackend", "AscendMTPBackend"]
    assert [f for f in report.findings if not f.site_file] == []  # no public signature is broken
    assert all(f.tier == "break" for f in report.findings)
    assert set(CLEAN) <= set(report.checked)
    assert all(Path(f.site_file) == BASE_FILE for f in report.findings)
    assert all(f.base == BASE for f in report.findings)


def test_finding_text_is_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    report = check(ENG / "hardware", BASE)
    first, one_keyword = report.findings[0], report.findings[1]
    assert first.params == ("in_capture", "mamba_track_indices")
    assert one_keyword.params == ("mamba_track_indices",)
    assert first.call == CALL_TEXT
    monkeypatch.chdir(FIXTURES)  # paths are shown relative to the working directory
    text = str(first)
    assert text == "\n".join(
        [
            f"eng/layers/attention/mamba_backend.py:{REPLAY_CALL} in "
            "MambaAttnBackendBase.init_forward_metadata_out_graph",
            f"    call:      {CALL_TEXT}",
            f"    override:  eng/hardware/npu/ascend_backend.py:{EXPECTED[0][5]} AscendMambaBackend._replay_metadata "
            "[missing-parameter]",
            f"    result:    {unexpected('AscendMambaBackend', '_replay_metadata', 'in_capture')}",
            "    not taken: in_capture, mamba_track_indices",
        ]
    )
    assert "    inherited: AscendMTPBackend\n" in str(one_keyword)


def test_explicit_base_and_method_filter() -> None:
    report = check(ENG / "hardware", BASE, methods=["_pad_value"])
    assert [(f.cls, f.method) for f in report.findings] == [("AscendStaticHookBackend", "_pad_value")]
    assert report.base == BASE
    assert report.contracts[0].call_sites == 1


# ------------------------------------------------------------------------- the same calls, for real


@pytest.fixture
def engine_importable(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The fixture engine importable: the missing engine modules and device libraries stubbed for one test."""
    monkeypatch.syspath_prepend(str(FIXTURES))
    for name in ("eng.distributed", "eng.model_executor", "eng.model_executor.forward_batch_info"):
        module = types.ModuleType(name)
        module.get_tensor_model_parallel_rank = lambda: 0
        module.ForwardBatch = object
        monkeypatch.setitem(sys.modules, name, module)
    for name in ("sgl_kernel_npu", "torch_npu"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    before = set(sys.modules)
    yield importlib.import_module("eng.hardware.npu.variants")
    for name in set(sys.modules) - before:
        if name.startswith("eng"):
            del sys.modules[name]


def forward_batch() -> types.SimpleNamespace:
    return types.SimpleNamespace(
        batch_size=4,
        req_pool_indices=[3, 1],
        forward_mode="decode",
        spec_info=None,
        seq_lens_cpu=[7, 9],
        real_batch_size=2,
        mamba_track_indices=None,
    )


def test_findings_are_what_the_calls_raise(engine_importable: types.ModuleType) -> None:
    """Run the base's methods on every subclass: each finding's TypeError is the one Python raises."""
    ascend = importlib.import_module("eng.hardware.npu.ascend_backend")
    classes = {**vars(ascend), **vars(engine_importable)}
    report = check(ENG)
    for name in [*(row[0] for row in EXPECTED), *CLEAN]:
        cls = classes[name]
        outcomes = {}
        for method, call in [
            ("_replay_metadata", lambda obj: obj.init_forward_metadata_out_graph(forward_batch(), in_capture=True)),
            ("_pad_value", lambda obj: type(obj).__init__(obj, types.SimpleNamespace(forward_mode="decode"))),
            ("_prepare", lambda obj: obj.init_forward_metadata(forward_batch())),
        ]:
            try:
                call(cls.__new__(cls))
            except TypeError as exc:
                outcomes[method] = f"TypeError: {exc}"
        expected = {f.method: f.message for f in report.findings if name in f.subclasses and f.breaks}
        assert outcomes == expected, name
    cls = classes["AscendDefaultsBackend"]
    obj = cls.__new__(cls)
    obj.init_forward_metadata(forward_batch())
    assert obj.forward_metadata[1] is False  # the base meant use_cache=True: the silent change is real


# ------------------------------------------------------------------------------ lookup errors: exit 2


def test_folder_without_its_base_is_an_error_not_ok() -> None:
    plugin = FIXTURES / "plugin"
    with pytest.raises(ContractError) as raised:
        check(plugin)
    assert str(raised.value) == (
        "no class in the targets derives from a class defined in the targets or on the search path; "
        "their bases are outside the trees: eng.layers.attention.mamba_backend:MambaAttnBackendBase "
        "(not found); pass the base's root with --search-path DIR, or --base pkg.mod:Class"
    )
    report = check(plugin, search_path=[FIXTURES])
    assert [(f.cls, f.message) for f in report.findings] == [
        ("PluginBackend", unexpected("PluginBackend", "_replay_metadata", "in_capture"))
    ]


def test_a_base_in_no_tree_is_one_grouped_note_never_a_refusal(tmp_path: Path) -> None:
    pkg = tmp_path / "eng2"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "npu.py").write_text("from eng2.gone import Base\n\n\nclass Npu(Base):\n    pass\n")
    with pytest.raises(ContractError, match=r"their bases are outside the trees: eng2.gone:Base \(not found\)"):
        check(pkg)  # nothing else to check: that is the one refusal
    # beside a real hierarchy, the missing base, a third-party and a stdlib base are one note, the rest is checked
    (pkg / "more.py").write_text(
        "import enum\nfrom openai.types import Thing\nfrom eng2.npu import Npu\n\n\n"
        "class A(enum.Enum):\n    X = 1\n\n\nclass B(Thing):\n    pass\n\n\n"
        "class Base2:\n    def run(self):\n        return self.hook(1, flag=True)\n\n"
        "    def hook(self, x, flag=False):\n        return x\n\n\n"
        "class Sub(Base2):\n    def hook(self, x):\n        return x\n"
    )
    report = check(pkg)
    ((finding,),) = [report.breaks]
    assert (finding.cls, finding.method) == ("Sub", "hook") and "'flag'" in finding.message
    (note,) = [n for n in report.notes if n.startswith("bases outside the trees")]
    assert "eng2.gone:Base (not found) x1" in note and "openai.types:Thing (not found) x1" in note
    assert "enum:Enum (in " in note


def test_unparsable_target_no_subclass_and_bad_search_path_are_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("class Broken(:\n    pass\n")
    with pytest.raises(ContractError, match=r"^target file does not parse: .*bad.py \(SyntaxError: .* \(line 1\)\)$"):
        check([NPU, bad])
    with pytest.raises(ContractError, match=f"^no subclass of {BASE} found in "):
        check(ENG / "layers" / "attention" / "base_attn_backend.py", BASE, search_path=[FIXTURES])
    with pytest.raises(ContractError, match="--search-path .* is not a folder"):
        check(NPU, search_path=[bad])


def test_super_call_in_the_base_reaches_a_mixin_after_it(tmp_path: Path) -> None:
    """``super().NAME(...)`` in the base runs the class after the base in the subclass's order: a mixin."""
    (tmp_path / "mixed.py").write_text(
        "class Base:\n"
        "    def step(self, batch):\n"
        "        return super().finish(batch, in_capture=True)\n"
        "\n\n"
        "class FinishMixin:\n"
        "    def finish(self, batch):\n"
        "        return batch\n"
        "\n\n"
        "class Sub(Base, FinishMixin):\n"
        "    pass\n"
        "\n\n"
        "class Other(FinishMixin, Base):\n"
        "    pass\n"
    )
    report = check(tmp_path / "mixed.py", "mixed:Base", search_path=[tmp_path])
    (finding,) = report.findings  # Other: FinishMixin comes before Base, so super() in Base does not reach it
    assert (finding.cls, finding.subclasses, finding.site_line) == ("FinishMixin", ("Sub",), 3)
    assert finding.message == unexpected("FinishMixin", "finish", "in_capture")


# ------------------------------------------------------------------------------------------ results


def test_report_and_finding_show_themselves() -> None:
    report = check(ENG / "hardware", BASE)
    assert repr(report) == (
        f"<Report {BASE}: {len(report.checked)} subclass(es) in {len(report.files)} file(s), 6 break(s), 0 drift>"
    )
    assert repr(report.findings[0]).startswith("<Finding AscendMambaBackend._replay_metadata [missing-parameter] at ")
    page = report._repr_html_()
    assert page.count('<tr class="wb-fail"') == 5  # calls that raise: failures
    assert page.count('<tr class="wb-warn"') == 1  # the silent change: a warning
    assert "6 breaks" in page and "&#x27;in_capture&#x27;" in page
    assert report.findings[0]._repr_html_().count('<tr class="wb-') == 1
    clean = check(NPU / "ascend_backend.py", BASE, search_path=[FIXTURES], methods=["_pad_value"])
    assert clean.ok and "OK: no breaks" in clean._repr_html_() and "<table" not in clean._repr_html_()
    data = report.to_dict()
    assert data["ok"] is False and len(data["findings"]) == 6
    assert data["findings"][0]["params"] == ["in_capture", "mamba_track_indices"]
    assert data["contracts"][0]["base"] == BASE


@pytest.mark.slow  # 2,000 generated files parsed; the discovery tests above cover the logic on the fixtures
def test_synthetic_two_thousand_file_tree() -> None:
    """A 2,000-file engine tree in one run (discovery, no --base): every planted break, nothing else.

    The speed figure lives in the benchmark (``workbench check-contracts --bench 2000``)."""
    result = bench(2000)
    assert result["files"] == 2000
    assert result["planted"] == (2000 - 4 - 20) // BROKEN_EVERY  # 4 package files, 20 group __init__.py
    assert result["findings"] == result["planted"]


def test_an_override_that_calls_up_keeps_the_base_call_alive(tmp_path: Path) -> None:
    """The base's call runs when the subclass's replacement calls up (super() or Base.method(self, ...))."""
    (tmp_path / "up.py").write_text(
        "class Base:\n"
        "    def step(self, batch):\n"
        "        return self._hook(batch, in_capture=True)\n"
        "\n"
        "    def _hook(self, batch, in_capture=False):\n"
        "        return batch\n"
        "\n\n"
        "class ViaSuper(Base):\n"
        "    def step(self, batch):\n"
        "        return super().step(batch)\n"
        "\n"
        "    def _hook(self, batch):\n"
        "        return batch\n"
        "\n\n"
        "class ViaBase(Base):\n"
        "    def step(self, batch):\n"
        "        return Base.step(self, batch)\n"
        "\n"
        "    def _hook(self, batch):\n"
        "        return batch\n"
        "\n\n"
        "class Replaced(Base):\n"
        "    def step(self, batch):\n"
        "        return self.helper.step(batch)\n"
        "\n"
        "    def _hook(self, batch):\n"
        "        return batch\n"
    )
    report = check(tmp_path / "up.py", "up:Base", search_path=[tmp_path])
    assert [(f.cls, f.site_line, f.message) for f in report.findings] == [
        ("ViaSuper", 3, unexpected("ViaSuper", "_hook", "in_capture")),
        ("ViaBase", 3, unexpected("ViaBase", "_hook", "in_capture")),
    ]
