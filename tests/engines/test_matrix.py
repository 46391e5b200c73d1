"""Every verified release passes ``engine-check`` (issue 30): sglang 0.5.21 to 0.5.23 and vLLM 0.31.0 to
0.33.0, each from its own wheel (downloaded once into the cache, ``workbench.engines.wheels``), imported with
``--engine-root`` in a fresh process, both layers. ``make test-engines-matrix`` runs it (markers ``engines``
and ``network``); ``make test-engines`` leaves it out."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from workbench.engine_versions import VERIFIED
from workbench.engines.versions import EngineError, installed_version
from workbench.engines.wheels import release_tree

pytestmark = [pytest.mark.engines, pytest.mark.network]

LAYERS = {"sglang": ("gdn", "mamba2", "kda"), "vllm": ("gdn", "mamba2")}  # vLLM's KDA builder is model-local
RELEASES = [(e, v, layer) for e, versions in VERIFIED.items() for v in versions for layer in LAYERS[e]]


@pytest.mark.parametrize(("engine", "version", "layer"), RELEASES)
def test_each_verified_release_passes_engine_check_from_its_own_wheel(engine: str, version: str, layer: str):
    if installed_version(engine) is None:
        pytest.skip(f"{engine} is not installed: its dependencies come from make engines")
    try:
        tree = release_tree(engine, version)
    except EngineError as e:
        pytest.skip(str(e))  # no index reachable
    cmd = [sys.executable, "-m", "workbench", "engine-check", engine, "--engine-root", str(tree)]
    done = subprocess.run(
        [*cmd, "--layer", layer, "--batches", "40", "--json"], capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    out = json.loads(done.stdout)
    assert out["ok"] and out["oracle"]["ok"] and out["replays"] > 0
    ident = out["engine"]
    assert (ident["name"], ident["version"], ident["verified"], ident["status"]) == (engine, version, True, "verified")
    assert ident["adapter"] == version and ident["root"] == str(tree.resolve())
