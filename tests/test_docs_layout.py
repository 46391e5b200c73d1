"""The docs stay a map that fits (issue 28): the README's layout names every package and module of
``workbench/`` and ``kernels/``, the README and the architecture page stay within 12 KB with short lines,
every relative link in the docs points at a file that exists, and the architecture page links every folder
page (a README.md inside ``workbench/`` or ``kernels/``)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 12 * 1024  # bytes: issue 28's ceiling for the README and docs/architecture.md
LONGEST_LINE = 250  # characters: a table row longer than this is a paragraph in disguise
SIZED = ("README.md", "docs/architecture.md")
CODE_ROOTS = ("workbench", "kernels")


def folder_pages() -> list[Path]:
    """Every per-folder page: a README.md inside ``workbench/`` or ``kernels/``."""
    return sorted(p for root in CODE_ROOTS for p in (ROOT / root).rglob("README.md") if "__pycache__" not in p.parts)


def linked_docs() -> list[Path]:
    """The pages whose relative links must resolve: the README, the changelog, docs/, the folder pages."""
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md")), *folder_pages()]


def layout_block(readme: str) -> str:
    """The first fenced block under the README's ``## Layout`` heading."""
    section = readme.split("\n## Layout", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```[^\n]*\n(.*?)```", section, re.S)
    assert match, "README.md's Layout section has no code block"
    return match.group(1)


def code_units(root: Path) -> tuple[list[str], list[str]]:
    """(subpackages, top-level modules) of ``root``: every folder holding .py files, every public module."""
    packages = sorted(d.name for d in root.iterdir() if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py")))
    modules = sorted(p.stem for p in root.glob("*.py") if not p.name.startswith("_"))
    return packages, modules


def missing_from_layout(block: str, root: Path) -> list[str]:
    """What of ``root`` the layout block does not name: a package as ``name/``, a module as a word."""
    packages, modules = code_units(root)
    missing = [f"{root.name}/{p}/" for p in packages if not re.search(rf"(?<![\w/]){re.escape(p)}/", block)]
    missing += [f"{root.name}/{m}.py" for m in modules if not re.search(rf"(?<![\w/.]){re.escape(m)}(?![\w/])", block)]
    return missing


def relative_links(text: str) -> list[str]:
    """The targets of markdown links outside fenced code, without anchors; web and mail links left out."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    targets = re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", prose)
    return [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


@pytest.mark.parametrize("root", CODE_ROOTS)
def test_the_readme_layout_names_every_package_and_module(root):
    block = layout_block((ROOT / "README.md").read_text())
    missing = missing_from_layout(block, ROOT / root)
    assert not missing, f"README.md's Layout block misses {missing}"


def test_the_layout_check_catches_a_missing_package(tmp_path):
    pkg = tmp_path / "workbench"
    for name in ("zoo", "traces", "__pycache__"):
        (pkg / name).mkdir(parents=True)
        (pkg / name / "__init__.py").write_text("")
    (pkg / "layers.py").write_text("")
    (pkg / "_private.py").write_text("")
    assert missing_from_layout("workbench/\n  zoo/  bug zoo\n  layers\n", pkg) == ["workbench/traces/"]
    assert missing_from_layout("  zoo/ traces/\n  layer_names\n", pkg) == ["workbench/layers.py"]


@pytest.mark.parametrize("name", SIZED)
def test_the_page_fits_in_12_kb_with_short_lines(name):
    data = (ROOT / name).read_bytes()
    assert len(data) <= LIMIT, f"{name} is {len(data):,} bytes; at most {LIMIT:,}: move detail to a folder page"
    long = [i for i, line in enumerate(data.decode().splitlines(), 1) if len(line) > LONGEST_LINE]
    assert not long, f"{name}: lines {long} are over {LONGEST_LINE} characters"


@pytest.mark.parametrize("page", linked_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files_that_exist(page):
    broken = [t for t in relative_links(page.read_text()) if not (page.parent / t).exists()]
    assert not broken, f"{page.relative_to(ROOT)} links to missing {broken}"


def test_relative_links_reads_markdown_links_only():
    text = "[a](x.md) [b](https://example.org) [c](#top) [d](../y.md#part)\n```\n[e](z.md)\n```\n"
    assert relative_links(text) == ["x.md", "../y.md"]


def test_the_architecture_page_links_every_folder_page():
    architecture = ROOT / "docs" / "architecture.md"
    linked = {(architecture.parent / t).resolve() for t in relative_links(architecture.read_text())}
    unlinked = [str(p.relative_to(ROOT)) for p in folder_pages() if p.resolve() not in linked]
    assert not unlinked, f"docs/architecture.md's map of maps does not link {unlinked}"
