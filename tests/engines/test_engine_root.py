"""The engines as their developers run them (issue 30): a clone of the engine's repository after its last
release, imported with ``--engine-root``, runs as "unverified: probes passed" with its version and commit and
agrees with the profiles; a clone whose hook lost a parameter is refused by the probe that names it.

The clone is made here: sglang's repository layout (``python/sglang``), every file a link to the installed
release's but the ones a test changes, under git with the release tag and commits after it. Each check runs in
a fresh process (a process imports one copy of an engine). Needs the installed engines (``make engines``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.engines.identity import identify_installed
from workbench.engines.registry import get_adapter
from workbench.engines.versions import EngineError

pytestmark = pytest.mark.engines

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def _installed(engine: str) -> Path:
    try:
        ident = identify_installed(engine)
    except EngineError as e:
        pytest.skip(str(e))
    if ident.version != get_adapter(engine).version or ident.package is None:
        pytest.skip(f"{engine} {get_adapter(engine).version} is not installed (found {ident.version})")
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    return Path(ident.package)


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True, env={**os.environ, **GIT_ENV}
    )
    return done.stdout.strip()


def _link_tree(src: Path, dst: Path, changed: dict[str, str]) -> None:
    """``dst`` mirrors ``src`` with links, but real folders down to each file of ``changed`` (path relative to
    ``src`` -> its new text), which is written there; ``_version.py`` (an install's generated file) left out."""
    dst.mkdir(parents=True)
    inner = {Path(p).parts[0]: p for p in changed}
    for entry in src.iterdir():
        if entry.name in ("_version.py", "__pycache__"):
            continue
        target = dst / entry.name
        if entry.name in inner and entry.is_dir():
            sub = {
                str(Path(p).relative_to(entry.name)): t for p, t in changed.items() if Path(p).parts[0] == entry.name
            }
            _link_tree(entry, target, sub)
        elif entry.name in changed:
            target.write_text(changed[entry.name])
        else:
            target.symlink_to(entry)


def _clone(tmp_path: Path, engine: str, layout: str, changed: dict[str, str] | None = None, after: int = 12) -> Path:
    """A git clone of ``engine`` ``after`` commits past the installed release's tag."""
    package = _installed(engine)
    root = tmp_path / f"{engine}-clone"
    _link_tree(package, root / layout, changed or {})
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "release")
    _git(root, "tag", f"v{get_adapter(engine).version}")
    for i in range(after):
        (root / "CHANGES").write_text(str(i))
        _git(root, "add", "CHANGES")
        _git(root, "commit", "-qm", f"change {i}")
    return root


def _engine_check(engine: str, root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "workbench", "engine-check", engine, "--engine-root", str(root), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.parametrize(("engine", "layout"), [("sglang", "python/sglang"), ("vllm", "vllm")])
def test_a_clone_after_the_release_runs_unverified_with_its_commit_and_agrees(tmp_path, engine, layout):
    root = _clone(tmp_path, engine, layout)
    head = _git(root, "rev-parse", "HEAD")
    done = _engine_check(engine, root, "--batches", "20", "--json")
    assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]
    out = json.loads(done.stdout)
    ident = out["engine"]
    release = get_adapter(engine).version
    major, minor, patch = release.split(".")
    assert ident["version"] == f"{major}.{minor}.{int(patch) + 1}.dev12+g{head[:7]}"
    assert ident["commit"] == head and ident["root"] == str(root.resolve())
    assert ident["package"] == str((root / layout).resolve())
    assert (ident["verified"], ident["status"], ident["adapter"]) == (False, "unverified: probes passed", release)
    assert out["ok"] and out["oracle"]["ok"] and out["behaviour_changed"] is None
    assert out["label"].startswith(f"{engine} {ident['version']} ")


def test_a_clone_whose_hook_lost_in_capture_is_refused_by_the_probe_that_names_it(tmp_path):
    package = _installed("sglang")
    rel = "srt/layers/attention/linear/gdn_backend.py"
    text = (package / rel).read_text()
    hook = (
        "def init_forward_metadata_out_graph(\n        self,\n        forward_batch: ForwardBatch,\n        in_capture:"
    )
    assert text.count(hook) == 1
    broken = text.replace(hook, hook.replace("in_capture:", "capture:"))  # the seed's shape: the keyword renamed
    root = _clone(tmp_path, "sglang", "python/sglang", {rel: broken}, after=3)
    done = _engine_check("sglang", root, "--batches", "5")
    assert done.returncode == 2, done.stdout[-2000:]
    err = next(line for line in done.stderr.splitlines() if "probe" in line)
    assert "probe 'GDNAttnBackend.init_forward_metadata_out_graph(forward_batch, in_capture)' failed" in err
    assert "has no parameter in_capture" in err and "0.5.24.dev3+g" in err


def test_a_clone_whose_behaviour_changed_names_the_field_and_says_so(tmp_path):
    """The oracle is the compatibility test: a clone that passes the probes but computes a decode step's
    ``query_start_loc`` one token off diverges, and the check says the engine's behaviour changed."""
    package = _installed("sglang")
    rel = "srt/layers/attention/hybrid_linear_attn_backend.py"
    text = (package / rel).read_text()
    eager = "            query_start_loc = torch.arange(\n                0, bs + 1, dtype=torch.int32"
    assert text.count(eager) == 1
    moved = text.replace(eager, eager.replace("0, bs + 1", "1, bs + 2"))
    root = _clone(tmp_path, "sglang", "python/sglang", {rel: moved}, after=1)
    done = _engine_check("sglang", root, "--batches", "10", "--modes", "decode", "--json")
    assert done.returncode == 1, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert not out["ok"] and out["engine"]["status"] == "unverified: probes passed"
    assert "query_start_loc" in json.dumps(out["oracle"])
    assert out["behaviour_changed"].startswith(f"sglang {out['engine']['version']} is not a verified release")
    assert "behaviour changed since sglang 0.5.23" in out["behaviour_changed"]


def test_the_verified_commit_files_name_the_newest_releases():
    """``.ci/<engine>-verified.commit``: what ``make test-engines CHECKOUT=1`` checks out in a clone: the
    newest release's commit where its wheel carries one (vLLM), else its tag (sglang's wheels carry none)."""
    ci = Path(__file__).resolve().parents[2] / ".ci"
    for engine in ("sglang", "vllm"):
        _installed(engine)
        ident = identify_installed(engine)
        ref = (ci / f"{engine}-verified.commit").read_text().strip()
        assert ref == (ident.commit.removeprefix("g") if ident.commit else f"v{ident.version}")


@pytest.mark.slow  # a fresh interpreter running engine-check
def test_a_tree_of_another_engine_layout_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    done = _engine_check("vllm", tmp_path / "empty")
    assert done.returncode == 2 and "--engine-root: no vllm package in" in done.stderr
