"""The engine tests run on the installed engines, or on source trees: ``LINATTN_SGLANG_ROOT`` /
``LINATTN_VLLM_ROOT`` name a clone (``make test-engines SGLANG_ROOT=... VLLM_ROOT=...``), imported from there
for the whole session (``workbench.engines.identity.use_tree``) before any test imports the engine."""

from __future__ import annotations

import os

from workbench.engine_versions import ENGINE_NAMES
from workbench.engines.identity import use_tree

ROOT_ENV = {name: f"LINATTN_{name.upper()}_ROOT" for name in ENGINE_NAMES}
"""Engine -> the environment variable naming a tree to test instead of the installed engine."""

for _engine, _env in ROOT_ENV.items():
    if os.environ.get(_env):
        use_tree(_engine, os.environ[_env])
