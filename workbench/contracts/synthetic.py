"""A synthetic engine tree for timing the checker: one base backend, thousands of device subclass files.

Every file imports engine modules and device libraries that do not exist here, as a real engine's do. One
backend file in ``BROKEN_EVERY`` overrides the base's private hook without ``in_capture``: each is one finding.
"""

from __future__ import annotations

import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from workbench.contracts.check import ContractError

BROKEN_EVERY = 20
GROUP = 100
MIN_FILES = 6
"""The fixed files (package, base module, folders) and at least one backend."""
MAX_FILES = 100_000
"""About 400 MB of temporary files; a bigger tree says nothing the rate at this size does not."""

_BASE = '''\
"""Synthetic base backend."""

from synth_engine.model_executor.forward_batch_info import ForwardBatch, ForwardMode  # not in the tree


class HybridBackendBase:
    def init_forward_metadata(self, forward_batch):
        return self._prepare(forward_batch)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
        bs = forward_batch.batch_size
        return self._replay_metadata(
            bs, forward_batch.req_pool_indices, forward_batch.forward_mode, None, None,
            num_padding=0, in_capture=in_capture, mamba_track_indices=None,
        )

    def _prepare(self, forward_batch, use_cache=True):
        return forward_batch, use_cache

    def _replay_metadata(self, bs, req_pool_indices, forward_mode, spec_info, seq_lens_cpu,
                         num_padding=None, in_capture=False, mamba_track_indices=None):
        return bs
'''

_BACKEND = '''\
"""Synthetic device backend {i}."""

import sgl_kernel_npu_{i}  # a device library that is not installed
from synth_engine.layers.base_backend import HybridBackendBase
from synth_engine.utils import helper_{i}


def _pad(values, size):
    return list(values) + [-1] * (size - len(values))


class Helper{i}:
    def run(self, x):
        return helper_{i}(x)


class Backend{i}(HybridBackendBase):
    def init_forward_metadata(self, forward_batch):
        return super().init_forward_metadata(forward_batch)

    def _replay_metadata(self, bs, req_pool_indices, forward_mode, spec_info, seq_lens_cpu,
                         num_padding=None{extra}):
        return _pad(req_pool_indices, bs)
'''


def make_tree(root: Path, files: int) -> int:
    """Write an engine-shaped package of exactly ``files`` Python files under ``root``; returns the broken count."""
    if isinstance(files, bool) or not isinstance(files, int) or not MIN_FILES <= files <= MAX_FILES:
        raise ContractError(f"files = {files!r}: a synthetic tree has {MIN_FILES} to {MAX_FILES:,} files")
    pkg = root / "synth_engine"
    fixed = {
        pkg / "__init__.py": '"""Synthetic engine."""\n',
        pkg / "layers" / "__init__.py": "",
        pkg / "layers" / "base_backend.py": _BASE,
        pkg / "hardware" / "__init__.py": "",
    }
    for path, text in fixed.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    written, broken, i = len(fixed), 0, 0
    while written < files:
        folder = pkg / "hardware" / f"g{i // GROUP}"
        if not folder.exists():
            folder.mkdir()
            (folder / "__init__.py").write_text("")
            written += 1
            continue
        is_broken = i % BROKEN_EVERY == BROKEN_EVERY - 1
        extra = "" if is_broken else ", in_capture=False, **kwargs"
        (folder / f"backend_{i}.py").write_text(textwrap.dedent(_BACKEND).format(i=i, extra=extra))
        broken += is_broken
        written += 1
        i += 1
    return broken


def bench(files: int = 2000, root: Path | None = None) -> dict[str, Any]:
    """Check a synthetic tree of ``files`` files (discovery mode, no ``--base``); figures and a text line."""
    from workbench.contracts.check import check

    with tempfile.TemporaryDirectory(prefix="contracts-bench-") as tmp:
        where = Path(root) if root is not None else Path(tmp)
        broken = make_tree(where, files)
        start = time.perf_counter()
        report = check(where / "synth_engine")
        seconds = time.perf_counter() - start
    result: dict[str, Any] = {
        "files": len(report.files),
        "subclasses": len(report.checked),
        "planted": broken,
        "findings": len(report.findings),
        "seconds": round(seconds, 3),
        "files_per_second": round(len(report.files) / seconds, 1),
    }
    result["text"] = (
        f"check-contracts on a synthetic tree: {result['files']} files, {result['subclasses']} subclasses, "
        f"{result['findings']} findings ({broken} planted) in {seconds:.2f} s: {result['files_per_second']} files/s"
    )
    return result
