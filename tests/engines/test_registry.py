"""The engine releases in one table (``workbench.engine_versions.VERIFIED``) and their adapters in one registry
(``workbench.engines.registry.ADAPTERS``): what reads them (``adapter_class``, ``check_supported``,
``engine-check``, the profiles' text), and that no product file spells a release elsewhere. No engine needed."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import workbench.engines as engines
from workbench.engine_versions import ENGINE_NAMES, VERIFIED, releases, verified_versions
from workbench.engines import EngineError, adapter_class, check_supported, installed_engines
from workbench.engines.base import EngineAdapter
from workbench.engines.registry import ADAPTERS, build_registry, get_adapter
from workbench.profiles import PROFILES

ROOT = Path(__file__).resolve().parents[2]


def test_every_verified_release_has_its_adapter_and_nothing_else_does():
    assert list(ADAPTERS) == list(VERIFIED) == list(ENGINE_NAMES)
    for engine, by_version in ADAPTERS.items():
        assert tuple(by_version) == VERIFIED[engine] == verified_versions(engine)
        for version, cls in by_version.items():
            assert issubclass(cls, EngineAdapter) and (cls.engine, cls.version) == (engine, version)
    assert engines.SUPPORTED is VERIFIED  # the versions module's name for the same table


def test_get_adapter_takes_the_newest_release_unless_told():
    for engine, versions in VERIFIED.items():
        assert get_adapter(engine) is ADAPTERS[engine][versions[-1]]
        for version in versions:
            assert get_adapter(engine, version).version == version
    with pytest.raises(EngineError, match=r"^engine: 'tgi' is not one of \('sglang', 'vllm'\)$"):
        get_adapter("tgi")
    with pytest.raises(EngineError, match=r"^sglang 0\.5\.20 has no adapter; verified: sglang 0\.5\.21, 0\.5\.22, "):
        get_adapter("sglang", "0.5.20")


def test_an_older_release_is_a_table_over_the_newest_adapter_not_a_copy():
    from workbench.engines.releases import CLASSES, RELEASES

    assert len(CLASSES) == len(RELEASES) == sum(len(v) - 1 for v in VERIFIED.values())
    for release, cls in zip(RELEASES, CLASSES, strict=True):
        newest = get_adapter(release.engine)
        assert ADAPTERS[release.engine][release.version] is cls and cls.__bases__ == (newest,)
        assert (
            set(vars(cls)) - {"__module__", "__doc__", "__abstractmethods__", "_abc_impl"}
            == {
                "version",
                "release_notes",
            }
            and cls.release_notes
        )


def test_the_registry_is_ready_for_more_releases_and_refuses_a_mismatch():
    sglang, vllm = get_adapter("sglang"), get_adapter("vllm")
    newer = type("Adapter", (sglang,), {"version": "0.5.24"})  # issue 30's shape: a subclass, its own version
    table = build_registry([vllm, newer, sglang], {"sglang": ("0.5.23", "0.5.24"), "vllm": (vllm.version,)})
    assert table == {"sglang": {"0.5.23": sglang, "0.5.24": newer}, "vllm": {vllm.version: vllm}}
    assert list(table["sglang"]) == ["0.5.23", "0.5.24"]  # the table's order, not the classes'
    with pytest.raises(RuntimeError, match=r"^sglang 0\.5\.24: .* is for a release VERIFIED does not name$"):
        build_registry([sglang, newer, vllm])
    with pytest.raises(RuntimeError, match=r"^sglang 0\.5\.23: verified, but no adapter class is registered$"):
        build_registry([vllm], {"sglang": ("0.5.23",), "vllm": (vllm.version,)})
    with pytest.raises(RuntimeError, match=r"^sglang 0\.5\.23: two adapters"):
        build_registry([sglang, type("Again", (sglang,), {}), vllm])


def _installed(monkeypatch: pytest.MonkeyPatch, version: str | None) -> None:
    """The installed engines all report ``version`` (None: none installed)."""
    from workbench.engines import identity
    from workbench.engines.identity import EngineIdentity

    def installed(engine: str) -> EngineIdentity:
        if version is None:
            raise EngineError(f"{engine} is not installed")
        return EngineIdentity(engine, version, verified=version in VERIFIED[engine])

    monkeypatch.setattr(identity, "identify_installed", installed)
    monkeypatch.setattr(engines, "installed_version", lambda name: version)


def test_with_two_releases_the_newest_is_the_default_and_the_installed_one_is_loaded(monkeypatch):
    from workbench.engines import registry

    sglang, vllm = get_adapter("sglang"), get_adapter("vllm")
    newer = type("Adapter", (sglang,), {"version": "0.5.24"})
    table = build_registry([sglang, newer, vllm], {"sglang": ("0.5.23", "0.5.24"), "vllm": (vllm.version,)})
    monkeypatch.setattr(registry, "ADAPTERS", table)
    assert get_adapter("sglang") is newer and get_adapter("sglang", "0.5.23") is sglang
    _installed(monkeypatch, "0.5.23")
    assert adapter_class("sglang") is sglang  # the installed release's, not the newest


def test_adapter_class_is_the_registrys_class_of_the_installed_release(monkeypatch: pytest.MonkeyPatch):
    for engine, versions in VERIFIED.items():
        for version in versions:
            _installed(monkeypatch, version)
            assert check_supported(engine) == version
            assert adapter_class(engine) is ADAPTERS[engine][version]
    _installed(monkeypatch, "0.0.1.dev3+gabc")  # not verified: the newest adapter, whose probes judge it
    assert adapter_class("sglang") is get_adapter("sglang") and check_supported("vllm") == "0.0.1.dev3+gabc"
    assert installed_engines() == []
    _installed(monkeypatch, None)
    with pytest.raises(EngineError, match=r"^sglang is not installed"):
        adapter_class("sglang")
    monkeypatch.setattr(engines, "installed_version", lambda name: VERIFIED[name][-1] if name == "vllm" else None)
    assert installed_engines() == ["vllm"]


def test_the_profiles_text_and_engine_check_read_the_table():
    for profile in PROFILES.values():
        assert profile.engine in ENGINE_NAMES
        assert profile.checked_against.lower().startswith(releases(profile.engine).lower() + ":")
    import argparse

    from workbench.engines.cli import configure

    parser = configure(argparse.ArgumentParser())
    (engine,) = [a for a in parser._actions if a.dest == "engine"]
    assert tuple(engine.choices or ()) == ENGINE_NAMES
    assert all(releases(name) in (engine.help or "") for name in ENGINE_NAMES)


def test_the_table_and_engine_check_help_import_no_torch():
    code = (
        "import sys\n"
        "import workbench.engine_versions, workbench.engines, workbench.traces.model, workbench.traces.format\n"
        "from workbench.engines.cli import configure\n"
        "import argparse; configure(argparse.ArgumentParser())\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert 'workbench.engines.registry' not in sys.modules, 'the registry imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


def _version_literals(path: Path) -> list[int]:
    versions = {v for vs in VERIFIED.values() for v in vs}
    tree = ast.parse(path.read_text())
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in versions
    ]


@pytest.mark.slow  # scans every source file
def test_no_product_file_but_the_table_and_the_adapters_spells_a_release():
    """A release as a string constant (``"0.5.23"``, not in a longer text) lives in ``engine_versions`` and in
    its own adapter module (the class's ``version``), nowhere else: not a second registry."""
    allowed = {Path("workbench/engine_versions.py")} | {
        Path(sys.modules[cls.__module__].__file__ or "").relative_to(ROOT)
        for by_version in ADAPTERS.values()
        for cls in by_version.values()
    }
    found = {
        str(path.relative_to(ROOT)): lines
        for path in sorted((ROOT / "workbench").rglob("*.py"))
        if path.relative_to(ROOT) not in allowed and (lines := _version_literals(path))
    }
    assert not found, f"a release spelled outside workbench/engine_versions.py: {found}"


def test_the_literal_search_finds_a_release(tmp_path):
    path = tmp_path / "x.py"
    path.write_text(f'SUPPORTED = {{"sglang": ("{VERIFIED["sglang"][0]}",)}}\nTEXT = "sglang 0.5.23 is fine"\n')
    assert _version_literals(path) == [1]
