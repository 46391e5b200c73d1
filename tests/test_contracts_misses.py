"""workbench.contracts: the misses issue 30 closed, each on a small tree written into ``tmp_path``.

A rename that ``**kwargs`` swallows at the seed's own call sites (the hybrid backend's loop over its backends, a
keyword passed through ``**{...}``); a dropped keyword in a class built inside a function (a factory called with
its base, ``type(...)``, ``__new__``) and in its module-level twin; a plugin's composed calls that an annotation
wider than the object sends to another protocol's overrides; and the pre-commit hook run as pre-commit runs it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

from workbench.contracts import MISSING, SWALLOWED, check, main

ROOT = Path(__file__).resolve().parents[1]


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def line_of(path: Path, text: str) -> int:
    (line,) = [i for i, row in enumerate(path.read_text().splitlines(), 1) if text in row]
    return line


def breaks(report) -> list[tuple[str, str, str, int | None]]:
    return sorted((f.cls, f.method, f.kind, f.site_line) for f in report.breaks)


# -- a rename swallowed by **kwargs at the seed's call sites ----------------------------------------------

HYBRID = """\
    class AttentionBackend:
        def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
            raise NotImplementedError


    class MambaAttnBackendBase(AttentionBackend):
        def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
            return forward_batch, in_capture


    class HybridLinearAttnBackend(AttentionBackend):
        def __init__(self, full_attn_backend: AttentionBackend, linear_attn_backend: MambaAttnBackendBase):
            self.attn_backend_list = [full_attn_backend, linear_attn_backend]

        def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
            for attn_backend in self.attn_backend_list:
                attn_backend.init_forward_metadata_out_graph(forward_batch, in_capture=in_capture)
    """


def test_a_rename_swallowed_at_the_hybrid_loop_over_its_backends_is_a_break(tmp_path: Path) -> None:
    """The hybrid backend stores its two annotated backends in a list and calls the hook on each with
    ``in_capture=``: an override that renamed the keyword behind ``**kwargs`` keeps ``capture=False``."""
    write(tmp_path, {"eng/__init__.py": "", "eng/base.py": HYBRID, "eng/npu.py": """\
        from eng.base import MambaAttnBackendBase


        class AscendLinearBackend(MambaAttnBackendBase):
            def init_forward_metadata_out_graph(self, forward_batch, capture=False, **kwargs):
                return forward_batch if capture else None


        class AscendFixedBackend(MambaAttnBackendBase):
            def init_forward_metadata_out_graph(self, forward_batch, in_capture=False, **kwargs):
                return forward_batch if in_capture else None
        """})  # fmt: skip
    base = tmp_path / "eng" / "base.py"
    report = check(tmp_path / "eng" / "npu.py")
    site = line_of(base, "attn_backend.init_forward_metadata_out_graph(forward_batch, in_capture=in_capture)")
    assert breaks(report) == [("AscendLinearBackend", "init_forward_metadata_out_graph", SWALLOWED, site)]
    (found,) = report.breaks
    assert found.caller == "HybridLinearAttnBackend.init_forward_metadata_out_graph"
    assert found.message == (
        "no exception, but **kwargs swallows 'in_capture' while the body reads 'capture', which the base no longer "
        "has and this call does not pass: it keeps its default"
    )


def test_a_keyword_passed_through_a_dict_literal_is_read_as_a_keyword(tmp_path: Path) -> None:
    """``**{"in_capture": ...}`` and ``**extra`` where ``extra`` is a dict literal bound once pass the keyword as
    surely as ``in_capture=``; a dict changed after it is built may hold anything (no finding)."""
    write(tmp_path, {"pkg/__init__.py": "", "pkg/base.py": """\
        class Base:
            def out_graph(self, fb, in_capture=False):
                return self._replay_metadata(fb.bs, **{"in_capture": in_capture})

            def warm(self, fb, in_capture=False):
                extra = {"in_capture": in_capture}
                return self._replay_metadata(fb.bs, **extra)

            def changed(self, fb, in_capture=False):
                extra = {"in_capture": in_capture}
                extra.update(fb.more)
                return self._replay_metadata(fb.bs, **extra)

            def _replay_metadata(self, bs, in_capture=False):
                return bs


        class Renamed(Base):
            def _replay_metadata(self, bs, capture=False, **kwargs):
                return bs if capture else 0


        class Dropped(Base):
            def _replay_metadata(self, bs):
                return bs
        """})  # fmt: skip
    base = tmp_path / "pkg" / "base.py"
    literal = line_of(base, "return self._replay_metadata(fb.bs, **{")
    bound = [i for i, row in enumerate(base.read_text().splitlines(), 1) if "**extra)" in row][0]  # not `changed`
    assert breaks(check(tmp_path / "pkg")) == [
        ("Dropped", "_replay_metadata", MISSING, literal),
        ("Dropped", "_replay_metadata", MISSING, bound),
        ("Renamed", "_replay_metadata", SWALLOWED, literal),
        ("Renamed", "_replay_metadata", SWALLOWED, bound),
    ]


# -- a class built inside a function, and its module-level twin -------------------------------------------


def test_classes_built_in_functions_and_their_module_level_twin_are_each_reported_once(tmp_path: Path) -> None:
    write(tmp_path, {"pkg/__init__.py": "", "pkg/base.py": """\
        class Base:
            def step(self, fb):
                return self._hook(fb.bs, in_capture=True)

            def _hook(self, bs, in_capture=False):
                return bs
        """, "pkg/variants.py": """\
        from pkg.base import Base


        def make_backend(base):
            class Backend(base):
                def _hook(self, bs):
                    return bs

            return Backend


        AscendBackend = make_backend(Base)


        class Backend(Base):
            def _hook(self, bs):
                return bs


        class Hybrid:
            def __new__(cls, *args, **kwargs):
                class Backend(Base):
                    def _hook(self, bs):
                        return bs

                return Backend(*args, **kwargs)


        def _typed_hook(self, bs):
            return bs


        TypeBuilt = type("TypeBuilt", (Base,), {"_hook": _typed_hook, "label": "npu"})
        """})  # fmt: skip
    variants = tmp_path / "pkg" / "variants.py"
    defs = [i for i, row in enumerate(variants.read_text().splitlines(), 1) if "def _hook(self, bs):" in row]
    report = check(variants)
    found = sorted((f.cls, f.line, f.kind) for f in report.breaks)
    assert found == sorted(
        [
            ("make_backend.<locals>.Backend", defs[0], MISSING),  # the factory's base is what its call passes
            ("Backend", defs[1], MISSING),  # the module-level twin
            ("Hybrid.__new__.<locals>.Backend", defs[2], MISSING),
            ("TypeBuilt", line_of(variants, "def _typed_hook(self, bs):"), MISSING),  # the function type() takes
        ]
    )
    assert all(f.message.endswith("got an unexpected keyword argument 'in_capture'") for f in report.breaks)
    text = report.text()
    assert text.count("break in Backend (") == 1 and "break in make_backend.<locals>.Backend (" in text


# -- a plugin's composed calls through an annotation wider than the object -------------------------------

QUANT = """\
    class QuantizeMethodBase:
        def apply(self, layer, *args, **kwargs):
            raise NotImplementedError


    class LinearMethodBase(QuantizeMethodBase):
        def apply(self, layer, x, bias=None):
            raise NotImplementedError


    class FusedMoEMethodBase(QuantizeMethodBase):
        def apply(self, layer, x, topk_weights, topk_ids):
            raise NotImplementedError


    class LinearLayer:
        def __init__(self, quant_method: QuantizeMethodBase):
            self.quant_method = quant_method

        def forward(self, x, bias):
            return self.quant_method.apply(self, x, bias)


    class RoutedExperts:
        def __init__(self, quant_method: QuantizeMethodBase):
            self.quant_method = quant_method

        def forward(self, x, w, ids):
            return self.quant_method.apply(layer=self, x=x, topk_weights=w, topk_ids=ids)
    """


def test_a_composed_call_skips_overrides_under_a_base_that_rejects_it(tmp_path: Path) -> None:
    """A linear layer's ``self.quant_method.apply(self, x, bias)`` is annotated with the root of the linear and
    the MoE protocols: the engine's MoE base already rejects it, so a plugin's MoE method is never its receiver.
    The MoE layer's own call still reaches it; and a plugin's own class in between that rejects the call is a
    break of its own, which hides nothing below it."""
    write(tmp_path, {"eng/__init__.py": "", "eng/layers.py": QUANT, "plugin/__init__.py": "", "plugin/moe.py": """\
        from eng.layers import FusedMoEMethodBase, LinearMethodBase


        class AscendMoEMethod(FusedMoEMethodBase):
            def apply(self, layer, x, router_logits, top_k):
                return x


        class AscendLinearBase(LinearMethodBase):
            def apply(self, layer, x):
                return x


        class AscendLinearW8(AscendLinearBase):
            def apply(self, layer):
                return x
        """})  # fmt: skip
    layers = tmp_path / "eng" / "layers.py"
    report = check(tmp_path / "plugin", against=[str(tmp_path / "eng")])
    linear = line_of(layers, "return self.quant_method.apply(self, x, bias)")
    moe = line_of(layers, "return self.quant_method.apply(layer=self, x=x, topk_weights=w, topk_ids=ids)")
    assert [(c, s) for c, _, _, s in breaks(report)] == [
        ("AscendLinearBase", linear),
        ("AscendLinearW8", linear),
        ("AscendMoEMethod", moe),
    ]


# -- the pre-commit hook, run as pre-commit runs it -------------------------------------------------------

ENGINE = {
    "python/sglang/__init__.py": "",
    "python/sglang/srt/layers/attention/hybrid_linear_attn_backend.py": """\
        from sglang.srt.layers.attention.base_attn_backend import AttentionBackend


        class MambaAttnBackendBase(AttentionBackend):
            def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
                return self._replay_metadata(forward_batch.batch_size, num_padding=None, in_capture=in_capture)

            def _replay_metadata(self, bs, num_padding=None, in_capture=False):
                return bs
        """,
    "python/sglang/srt/layers/attention/base_attn_backend.py": """\
        class AttentionBackend:
            def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
                raise NotImplementedError
        """,
    "python/sglang/srt/hardware_backend/npu/attention/ascend_hybrid_linear_attn_backend.py": """\
        import torch_npu  # not installed: never imported

        from sglang.srt.layers.attention.hybrid_linear_attn_backend import MambaAttnBackendBase


        class AscendMambaAttnBackendBase(MambaAttnBackendBase):
            def _replay_metadata(self, bs, num_padding=None):
                return bs


        class AscendMamba2AttnBackend(AscendMambaAttnBackendBase):
            pass
        """,
    "python/sglang/srt/utils.py": "def helper():\n    return 1\n",
}


def test_the_pre_commit_hook_script_on_a_changed_file_of_an_engine_clone(tmp_path: Path) -> None:
    """The hook as ``.pre-commit-hooks.yaml`` declares it: its entry run from the clone's root with the changed
    files, by a bare interpreter (no package installed). The changed Ascend file's seed is the one break; a
    changed file with no subclass passes."""
    (hook,) = [h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text()) if h["id"] == "check-contracts"]
    assert hook["language"] == "script" and hook["types"] == ["python"] and "pass_filenames" not in hook
    entry = ROOT / hook["entry"]
    assert entry.is_file() and entry.stat().st_mode & 0o111, "the script must be executable"
    write(tmp_path, ENGINE)
    changed = "python/sglang/srt/hardware_backend/npu/attention/ascend_hybrid_linear_attn_backend.py"
    env = {"PATH": str(Path(sys.executable).parent), "PYTHONSAFEPATH": "1"}
    run = subprocess.run(
        [str(entry), changed], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stdout.count("\nbreak in ") == 1 and "1 break;" in run.stdout
    assert "AscendMambaAttnBackendBase._replay_metadata [missing-parameter]" in run.stdout
    site = line_of(
        tmp_path / "python/sglang/srt/layers/attention/hybrid_linear_attn_backend.py", "self._replay_metadata("
    )
    assert (
        f"python/sglang/srt/layers/attention/hybrid_linear_attn_backend.py:{site} in MambaAttnBackendBase."
        in run.stdout
    )
    quiet = subprocess.run(
        [str(entry), "python/sglang/srt/utils.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert quiet.returncode == 0 and quiet.stdout.startswith("check-contracts: nothing to check:")
    assert main(["--allow-nothing", str(tmp_path / changed)]) == 1  # the same through the command line
