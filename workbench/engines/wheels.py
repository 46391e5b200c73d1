"""Released engines side by side without installing them: each release's wheel downloaded once and unpacked
into a tree that ``engine-check --engine-root`` imports (``make test-engines-matrix``).

    tree = release_tree("sglang", "0.5.22")       # ~/.cache/linattn-workbench/trees/sglang-0.5.22
    # workbench engine-check sglang --engine-root <tree>

The wheel comes through pip (``pip download --no-deps --only-binary :all:``), so it follows pip's own index
configuration; the cache is ``$LINATTN_WHEEL_CACHE`` or ``~/.cache/linattn-workbench``. A tree holds the
engine's package and its ``.dist-info`` only: the engine's dependencies are the environment's (``make
engines`` installs what the newest release needs; the older ones import with it, checked by the matrix).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from workbench.engine_versions import ENGINE_NAMES
from workbench.engines.errors import EngineError

CACHE_ENV = "LINATTN_WHEEL_CACHE"


def cache_dir() -> Path:
    """``$LINATTN_WHEEL_CACHE``, else ``~/.cache/linattn-workbench``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "linattn-workbench").expanduser()


def wheel(engine: str, version: str, cache: Path | None = None) -> Path:
    """The release's wheel in ``cache/wheels`` (downloaded when missing), or :class:`EngineError` with pip's
    last line."""
    if engine not in ENGINE_NAMES:
        raise EngineError(f"engine: {engine!r} is not one of {ENGINE_NAMES}")
    folder = (cache or cache_dir()) / "wheels"
    prefix = f"{engine.replace('-', '_')}-{version}-"
    found = sorted(folder.glob(f"{prefix}*.whl")) if folder.is_dir() else []
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", str(folder)]
    done = subprocess.run([*cmd, f"{engine}=={version}"], capture_output=True, text=True, check=False)
    found = sorted(folder.glob(f"{prefix}*.whl"))
    if done.returncode != 0 or not found:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise EngineError(f"{engine} {version}: pip download failed: {last[0]}")
    return found[0]


def release_tree(engine: str, version: str, cache: Path | None = None) -> Path:
    """The release unpacked into ``cache/trees/<engine>-<version>`` (its package and ``.dist-info``), made once:
    a tree ``--engine-root`` takes."""
    root = (cache or cache_dir()) / "trees" / f"{engine}-{version}"
    done = root / ".unpacked"
    if done.is_file():
        return root
    whl = wheel(engine, version, cache)
    with zipfile.ZipFile(whl) as z:
        members = [n for n in z.namelist() if n.split("/", 1)[0] in (engine, f"{engine}-{version}.dist-info")]
        z.extractall(root, members)
    done.write_text(whl.name)
    return root


__all__ = ["CACHE_ENV", "cache_dir", "release_tree", "wheel"]
