"""check-contracts on the engines' released trees: speed against a plain parse, breaks as shipped, planted breaks.

    .venv/bin/python benchmarks/contracts_real_trees.py [--quick] [--repeat N] [--only TREE] [--skip-plants]
        [--wheels DIR | --cache DIR] [--json PATH]

A ``network`` benchmark (not run by ``make test``): it fetches the wheels ``sglang==0.5.23`` and ``vllm==0.33.0``
with ``pip download --no-deps --only-binary :all:`` into ``--cache`` (default ``~/.cache/linattn-workbench/wheels``;
skipped when the wheel is there) or takes them from ``--wheels DIR``, and unpacks only their ``*.py`` members
(skipped when already unpacked). Nothing is imported from the engines.

What it measures:

1. Per tree (sglang ``srt/layers/attention`` + ``srt/hardware_backend`` as shipped, vLLM ``v1/attention``; without
   ``--quick`` also the whole ``sglang/srt`` and the whole ``vllm``): the checker against one plain parse pass over the
   same files (read the bytes, ``ast.parse``, drop the tree; Python's defaults, gc on), each in a fresh subprocess of
   this interpreter, the parse first, ``--repeat`` times (default 3) in turns (parse, check, parse, check, ...), so a
   pair shares the machine's load. Each run reports the CPU seconds (``time.process_time``) and wall seconds of the
   work itself (not the interpreter's start or imports, the same in both: ``workbench.contracts``) and the peak
   memory of its process (``ru_maxrss``: the maximum resident set, what ``/usr/bin/time -v`` reports); the table
   and the JSON give the median, min and max of each, and of the ratio checker / parse per pair (CPU and wall):
   what the checker costs above reading the source at all. Files, breaks and drift come from the checker's runs
   (they must agree); the breaks of the unmodified attention trees are printed for a person to judge.
2. Plants: breaks written into a copy of the sglang tree by exact text replacement (a replacement whose original
   text is not found fails loudly, so an engine change shows). Each plant is checked on the sglang attention trees
   (plus the caller's folder where the call is elsewhere) and reported found when a break names the expected call
   site (file and line); false breaks are breaks of the planted tree that the unmodified tree does not have and that
   are not the plant. The last plant is a non-break that must not be reported.
3. Beside it (skipped with a line when not installed; ``--quick`` skips them): pylint W0221/W0222/W0237 and mypy
   ``[override]`` on the same attention trees, unmodified and with the seed plant: counts, seconds, whether they
   flag the seed's override.

Writes ``benchmarks/results/contracts_real_trees.json`` (``--json`` to choose) and prints a compact table.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LISTED = 20  # breaks listed per tree in the JSON
sys.path.insert(0, str(ROOT))

from workbench.contracts import ContractError, Finding, Report, check  # noqa: E402

WHEELS = {"sglang": "0.5.23", "vllm": "0.33.0"}
DEFAULT_CACHE = Path.home() / ".cache" / "linattn-workbench" / "wheels"
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "contracts_real_trees.json"
SG_ATTENTION = ("srt/layers/attention", "srt/hardware_backend")
VL_ATTENTION = ("v1/attention",)
ASCEND_HYBRID = "srt/hardware_backend/npu/attention/ascend_hybrid_linear_attn_backend.py"
HYBRID = "srt/layers/attention/hybrid_linear_attn_backend.py"


# --------------------------------------------------------------------------------------------------- the trees
def fetch_wheel(name: str, cache: Path, wheels: Path | None) -> Path:
    """The wheel of ``name`` at its pinned version: from ``wheels``, else the cache, else downloaded into it."""
    folder = wheels or cache
    pattern = f"{name}-{WHEELS[name]}-*.whl"
    found = sorted(folder.glob(pattern))
    if not found and wheels is None:
        folder.mkdir(parents=True, exist_ok=True)
        spec = f"{name}=={WHEELS[name]}"
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", spec, "-d", str(folder)]
        subprocess.run(argv, check=True)
        found = sorted(folder.glob(pattern))
    if not found:
        raise SystemExit(f"no {pattern} in {folder}")
    return found[-1]


def unpack(wheel: Path, cache: Path) -> Path:
    """The wheel's ``*.py`` members under ``cache/trees/<wheel name>/``, unpacked once; returns the package folder."""
    dest = cache / "trees" / wheel.name.removesuffix(".whl")
    marker = dest / ".unpacked"
    if not marker.exists():
        with zipfile.ZipFile(wheel) as archive:
            members = [m for m in archive.namelist() if m.endswith(".py")]
            archive.extractall(dest, members)
        marker.write_text(f"{len(members)} files\n")
    return dest / wheel.name.split("-")[0]


# ------------------------------------------------------------------------------------------- checker and parse
@dataclass
class Run:
    """One checker run over some targets (in process: the plants' runs)."""

    label: str
    targets: list[Path]
    report: Report | None = None
    error: str | None = None
    seconds: float = 0.0
    files: list[Path] = field(default_factory=list)


def run_check(label: str, targets: list[Path]) -> Run:
    run = Run(label, targets)
    start = time.perf_counter()
    try:
        run.report = check([str(t) for t in targets])
    except ContractError as exc:
        run.error = f"{type(exc).__name__}: {exc}"
    run.seconds = time.perf_counter() - start
    if run.report is not None:
        run.files = [Path(f) for f in run.report.files]
    else:
        run.files = sorted(p for t in targets for p in t.rglob("*.py"))
    return run


def parse_pass(files: Iterable[Path]) -> None:
    """Read and ``ast.parse`` every file once, each tree dropped at once (gc as Python leaves it)."""
    for path in files:
        with suppress(SyntaxError):
            ast.parse(path.read_bytes(), filename=str(path))


def measure(what: str, targets: list[Path]) -> dict[str, Any]:
    """One measurement in this (fresh) process: ``parse`` the files the checker reads for ``targets``, or
    ``check`` them; CPU and wall seconds of the work, the process's peak memory, and the checker's findings."""
    from workbench.contracts.check import python_files

    files = sorted({p for t in targets for p in (python_files(t) if t.is_dir() else [t.resolve()])})
    out: dict[str, Any] = {"files": len(files)}
    cpu, wall = time.process_time(), time.perf_counter()
    if what == "parse":
        parse_pass(files)
    else:
        try:
            report = check([str(t) for t in targets])
        except ContractError as exc:
            report, out["error"] = None, f"{type(exc).__name__}: {exc}"
        if report is not None:
            out |= {"files": len(report.files), "breaks": len(report.breaks), "drift": len(report.drift)}
            out["break_findings"] = [
                [f.cls, f.method, f.kind, f.site_file, f.site_line, f.caller, f.message] for f in report.breaks
            ]
    out["cpu_s"] = time.process_time() - cpu
    out["wall_s"] = time.perf_counter() - wall
    out["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return out


def measured(what: str, targets: list[Path]) -> dict[str, Any]:
    """:func:`measure` in a fresh subprocess of this interpreter."""
    argv = [sys.executable, __file__, "--measure", what, *map(str, targets)]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def spread(values: list[float], digits: int = 2) -> dict[str, float]:
    return {k: round(f(values), digits) for k, f in (("median", statistics.median), ("min", min), ("max", max))}


def tree_row(label: str, targets: list[Path], root: Path, repeat: int) -> dict[str, Any]:
    """The checker against a fresh parse pass on ``targets``, ``repeat`` pairs in turns (the parse first)."""
    pairs = []
    for i in range(repeat):
        parse, checked = measured("parse", targets), measured("check", targets)
        pairs.append((parse, checked))
        print(f"  {label} run {i + 1}/{repeat}: parse {parse['cpu_s']:.2f} CPU-s, check {checked['cpu_s']:.2f} CPU-s")
    first = pairs[0][1]
    row: dict[str, Any] = {"tree": label, "targets": [rel(str(t), root) for t in targets], "files": first["files"]}
    row["repeat"] = repeat
    for side, at in (("check", 1), ("parse", 0)):
        for key, digits in (("cpu_s", 2), ("wall_s", 2), ("peak_mib", 0)):
            row[f"{side}_{key}"] = spread([pair[at][key] for pair in pairs], digits)
    row["ratio_cpu"] = spread([c["cpu_s"] / p["cpu_s"] for p, c in pairs])
    row["ratio_wall"] = spread([c["wall_s"] / p["wall_s"] for p, c in pairs])
    row["files_per_s"] = round(first["files"] / row["check_wall_s"]["median"], 1)
    if "error" in first:
        return row | {"error": first["error"], "breaks": None, "drift": None}
    if any(c.get("break_findings") != first["break_findings"] for _, c in pairs):
        raise SystemExit(f"{label}: the checker's runs disagree on the breaks")
    row |= {"breaks": first["breaks"], "drift": first["drift"], "error": None}
    breaks = [describe_fields(f, root) for f in first["break_findings"]]
    row["break_list"] = breaks[:LISTED]  # a whole package's hundreds would bury the file: its count says enough
    row["break_list_truncated"] = len(breaks) > LISTED
    return row


def rel(path: str, root: Path) -> str:
    """``path`` relative to the folder above the package (``sglang/srt/...``), else as it is."""
    try:
        return str(Path(path).resolve().relative_to(root.parent.resolve()))
    except ValueError:
        return path


def describe(finding: Finding, root: Path) -> str:
    fields = [finding.cls, finding.method, finding.kind, finding.site_file, finding.site_line, finding.caller]
    return describe_fields([*fields, finding.message], root)


def describe_fields(fields: list[Any], root: Path) -> str:
    """A break as one line, from a finding's fields: class, method, kind, site file and line, caller, message."""
    cls, method, kind, site_file, site_line, caller, message = fields
    return f"{cls}.{method} [{kind}] at {rel(site_file, root)}:{site_line} in {caller}: {message}"


def key(finding: Finding, root: Path) -> tuple[str, ...]:
    """A break's identity across trees whose line numbers a plant moved."""
    site = rel(finding.site_file, root)
    return (finding.cls, finding.method, finding.kind, site, finding.caller, finding.message)


# ------------------------------------------------------------------------------------------------------ plants
@dataclass
class Patch:
    """Replace ``old`` by ``new`` in ``path`` (relative to the package), exactly ``count`` times."""

    path: str
    old: str
    new: str
    count: int = 1


@dataclass
class Site:
    """The expected call: the ``occurrence``-th line (1-based) of the patched ``path`` that contains ``marker``."""

    path: str
    marker: str
    occurrence: int = 1


@dataclass
class Plant:
    name: str
    what: str
    method: str
    patches: list[Patch]
    sites: list[Site]
    extra_targets: tuple[str, ...] = ()
    breaks: bool = True  # False: a non-break that must not be reported
    cls: str = ""  # for a non-break: the class whose hook is incompatible


SEED_OLD = """        num_padding: Optional[int] = None,
        in_capture: bool = False,
        mamba_track_indices: Optional[torch.Tensor] = None,
        *args,
        **kwargs,
    ):
        # out_graph passes seq_lens_cpu=None at capture; mirror the base guard."""
SEED_NEW = """        num_padding: Optional[int] = None,
        mamba_track_indices: Optional[torch.Tensor] = None,
    ):
        # out_graph passes seq_lens_cpu=None at capture; mirror the base guard."""
RENAME_OVERRIDE_OLD = """        seq_lens_cpu: Optional[torch.Tensor],
        num_padding: Optional[int] = None,
        in_capture: bool = False,
        mamba_track_indices: Optional[torch.Tensor] = None,
        *args,
        **kwargs,
    ):
        # out_graph passes seq_lens_cpu=None at capture; mirror the base guard.
        if seq_lens_cpu is None:"""
RENAME_OVERRIDE_NEW = """        seq_lens_cpu: Optional[torch.Tensor],
        *args,
        **kwargs,
    ):
        num_padding = kwargs.get("num_padding")
        mamba_track_indices = kwargs.get("mamba_track_indices")
        # out_graph passes seq_lens_cpu=None at capture; mirror the base guard.
        if num_padding is not None:
            num_padding = int(num_padding)
        elif seq_lens_cpu is None:"""
RENAME_CALL_OLD = """            num_padding=(
                0 if in_capture else getattr(forward_batch, "num_padding", None)
            ),"""
RENAME_CALL_NEW = """            num_pad=(
                0 if in_capture else getattr(forward_batch, "num_padding", None)
            ),"""
RENAME_BASE_OLD = """        num_padding: Optional[int] = None,
        in_capture: bool = False,
        mamba_track_indices: Optional[torch.Tensor] = None,
    ):
        if num_padding is None:"""
RENAME_BASE_NEW = """        num_pad: Optional[int] = None,
        in_capture: bool = False,
        mamba_track_indices: Optional[torch.Tensor] = None,
    ):
        num_padding = num_pad
        if num_padding is None:"""
CAPTURE_OLD = """        forward_mode: ForwardMode,
        spec_info: Optional[Union[EagleDraftInput, EagleVerifyInput]],
    ):
        mamba_indices = self.req_to_token_pool.get_mamba_indices(req_pool_indices)"""
CAPTURE_NEW = """        spec_info: Optional[Union[EagleDraftInput, EagleVerifyInput]],
        forward_mode: ForwardMode,
    ):
        mamba_indices = self.req_to_token_pool.get_mamba_indices(req_pool_indices)"""
NON_BREAK_OLD = """class AscendMamba2AttnBackend(AscendMambaAttnBackendBase):
    pass
"""
NON_BREAK_NEW = """class AscendMamba2AttnBackend(AscendMambaAttnBackendBase):
    def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
        # its own replay path, no super(): the base's call with in_capture= never runs on this class
        self.forward_metadata = self._replay_metadata(
            forward_batch.batch_size,
            forward_batch.req_pool_indices,
            forward_batch.forward_mode,
            forward_batch.spec_info,
            forward_batch.seq_lens_cpu,
        )

    def _replay_metadata(self, bs, req_pool_indices, forward_mode, spec_info, seq_lens_cpu):
        return super()._replay_metadata(bs, req_pool_indices, forward_mode, spec_info, seq_lens_cpu)
"""
CUTEDSL = "srt/layers/attention/cutedsl_mla_backend.py"
TRTLLM_MLA = "srt/layers/attention/trtllm_mla_backend.py"
ASCEND_KDA = "srt/hardware_backend/npu/attention/ascend_kda_backend.py"
KDA = "srt/layers/attention/linear/kda_backend.py"
TRTLLM_SITES = [Site(TRTLLM_MLA, "= self._run_decode_kernel(", n) for n in (1, 2, 3, 4)]

PLANTS = [
    Plant(
        "a seed (PR 29598)",
        "Ascend _replay_metadata loses in_capture, *args, **kwargs; the base passes in_capture=",
        "_replay_metadata",
        [Patch(ASCEND_HYBRID, SEED_OLD, SEED_NEW)],
        [Site(HYBRID, "self.forward_metadata = self._replay_metadata(")],
    ),
    Plant(
        "b keyword dropped",
        "CuteDslMLABackend._run_decode_kernel loses max_seq_len; TRTLLMMLABackend passes max_seq_len=",
        "_run_decode_kernel",
        [
            Patch(
                CUTEDSL,
                "        max_seq_len: int,\n        layer: RadixAttention,\n        *,\n",
                "        layer: RadixAttention,\n        *,\n",
            )
        ],
        TRTLLM_SITES,
    ),
    Plant(
        "c positional swap",
        "Ascend _capture_metadata takes (bs, req_pool_indices, spec_info, forward_mode); "
        "MambaAttnBackendBase passes (bs, req_pool_indices, forward_mode, spec_info) by position",
        "_capture_metadata",
        [Patch(ASCEND_HYBRID, CAPTURE_OLD, CAPTURE_NEW)],
        [Site(HYBRID, "self.forward_metadata = self._capture_metadata(")],
    ),
    Plant(
        "d default flipped",
        "CuteDslMLABackend._run_decode_kernel return_lse=True; TRTLLMMLABackend.forward_decode omits return_lse",
        "_run_decode_kernel",
        [Patch(CUTEDSL, "        return_lse: bool = False,\n", "        return_lse: bool = True,\n")],
        TRTLLM_SITES,
    ),
    Plant(
        "e rename in **kwargs",
        "Ascend _replay_metadata(..., seq_lens_cpu, *args, **kwargs) reads kwargs.get('num_padding'); "
        "the base call and def say num_pad=",
        "_replay_metadata",
        [
            Patch(ASCEND_HYBRID, RENAME_OVERRIDE_OLD, RENAME_OVERRIDE_NEW),
            Patch(HYBRID, RENAME_CALL_OLD, RENAME_CALL_NEW, count=2),
            Patch(HYBRID, RENAME_BASE_OLD, RENAME_BASE_NEW),
        ],
        [Site(HYBRID, "self.forward_metadata = self._replay_metadata(")],
    ),
    Plant(
        "f class in a function",
        "_AscendKDAHybrid (built in AscendKDAHybridLinearAttnBackend.__new__) overrides _is_full_attn without "
        "layer_id; HybridLinearAttnBackend calls self._is_full_attn(layer, kwargs.get('layer_id'))",
        "_is_full_attn",
        [
            Patch(
                ASCEND_KDA,
                "        class _AscendKDAHybrid(_Base):\n",
                "        class _AscendKDAHybrid(_Base):\n"
                "            def _is_full_attn(self, layer):\n"
                "                return layer is not None\n\n",
            )
        ],
        [Site(HYBRID, 'if self._is_full_attn(layer, kwargs.get("layer_id")):', n) for n in (1, 2)]
        + [Site(HYBRID, 'is_linear_attn = not self._is_full_attn(layer, kwargs.get("layer_id"))')],
    ),
    Plant(
        "g composed call",
        "KDAAttnBackend.refresh_prefill_graph_metadata loses forward_batch; HybridLinearAttnBackend calls "
        "self.linear_attn_backend.refresh_prefill_graph_metadata(capture_metadata, forward_batch)",
        "refresh_prefill_graph_metadata",
        [
            Patch(
                KDA,
                "        self, meta: KDAPrefillGraphMetadata, forward_batch: ForwardBatch\n    ) -> None:",
                "        self, meta: KDAPrefillGraphMetadata\n    ) -> None:",
            )
        ],
        [Site(HYBRID, "self.linear_attn_backend.refresh_prefill_graph_metadata(")],
    ),
    Plant(
        "h2 swap, base unreached",
        "AscendKDAAttnBackend._forward_target_verify takes (..., b, a): KDAAttnBackend's positional call "
        "(kda_backend.py ~1055) never reaches it (AscendKDAAttnBackend.forward_extend has no super()); its own "
        "call passes (..., a, b), a swap only names could tell",
        "_forward_target_verify",
        [
            Patch(
                ASCEND_KDA,
                "        a: torch.Tensor,\n        b: torch.Tensor,\n    ) -> torch.Tensor:\n"
                '        """Run fixed-width DSpark verify',
                "        b: torch.Tensor,\n        a: torch.Tensor,\n    ) -> torch.Tensor:\n"
                '        """Run fixed-width DSpark verify',
            )
        ],
        [],
        breaks=False,
        cls="AscendKDAAttnBackend",
    ),
    Plant(
        "h non-break",
        "AscendMamba2AttnBackend overrides init_forward_metadata_out_graph without super() and has a "
        "_replay_metadata without in_capture: the base's call never reaches it",
        "_replay_metadata",
        [Patch(ASCEND_HYBRID, NON_BREAK_OLD, NON_BREAK_NEW)],
        [],
        breaks=False,
        cls="AscendMamba2AttnBackend",
    ),
]


@contextmanager
def planted(root: Path, patches: list[Patch]) -> Iterator[None]:
    """Apply ``patches`` to the tree at ``root``; the original files come back afterwards."""
    originals: dict[Path, str] = {}
    try:
        for patch in patches:
            path = root / patch.path
            text = path.read_text()
            originals.setdefault(path, text)
            found = text.count(patch.old)
            if found != patch.count:
                raise SystemExit(f"plant text found {found}x (want {patch.count}) in {patch.path}: {patch.old[:80]!r}")
            path.write_text(text.replace(patch.old, patch.new))
        yield
    finally:
        for path, text in originals.items():
            path.write_text(text)


def site_lines(root: Path, sites: list[Site]) -> set[tuple[str, int]]:
    found = set()
    for site in sites:
        lines = [n for n, text in enumerate((root / site.path).read_text().splitlines(), 1) if site.marker in text]
        if len(lines) < site.occurrence:
            raise SystemExit(f"expected call {site.marker!r} not found in {site.path}")
        found.add((f"{root.name}/{site.path}", lines[site.occurrence - 1]))
    return found


def run_plant(plant: Plant, root: Path, baseline: dict[tuple[str, ...], Finding]) -> dict[str, Any]:
    targets = [root / t for t in (*SG_ATTENTION, *plant.extra_targets)]
    with planted(root, plant.patches):
        expected = site_lines(root, plant.sites)
        run = run_check(plant.name, targets)
    row: dict[str, Any] = {"plant": plant.name, "what": plant.what, "seconds": round(run.seconds, 3)}
    row["want"] = "break" if plant.breaks else "none"
    row["expected_sites"] = sorted(f"{path}:{line}" for path, line in expected)
    if run.report is None:
        return row | {"error": run.error, "found": False}
    own_baseline = baseline if not plant.extra_targets else baseline_of(targets, root)
    new = [f for f in run.report.breaks if key(f, root) not in own_baseline]
    if plant.breaks:
        hits = [f for f in new if f.method == plant.method and (rel(f.site_file, root), f.site_line) in expected]
    else:
        hits = [f for f in run.report.breaks if f.method == plant.method and plant.cls in (f.cls, *f.subclasses)]
    false = [f for f in new if f not in hits] if plant.breaks else new
    others = [f for f in run.report.findings if f.method == plant.method and f not in hits]
    row |= {"error": None, "want": "break" if plant.breaks else "none", "found": bool(hits)}
    row["ok"] = bool(hits) == plant.breaks and not false
    row["kind"] = hits[0].kind if hits else None
    row["message"] = hits[0].message if hits else None
    row["reported"] = [describe(f, root) for f in hits]
    row["false_breaks"] = [describe(f, root) for f in false]
    row["other_findings_on_method"] = [f"{f.tier}: {f.cls}.{f.method} [{f.kind}] {f.message}" for f in others[:5]]
    return row


_BASELINES: dict[tuple[str, ...], dict[tuple[str, ...], Finding]] = {}


def baseline_of(targets: list[Path], root: Path) -> dict[tuple[str, ...], Finding]:
    """The breaks of the unmodified tree for these targets (cached per target list)."""
    names = tuple(str(t) for t in targets)
    if names not in _BASELINES:
        run = run_check("baseline", targets)
        findings = run.report.breaks if run.report else []
        _BASELINES[names] = {key(f, root): f for f in findings}
    return _BASELINES[names]


# ----------------------------------------------------------------------------------------------------- linters
def tool(name: str) -> str | None:
    local = Path(sys.executable).with_name(name)
    return str(local) if local.exists() else shutil.which(name)


def py_files(root: Path, folders: Iterable[str]) -> list[str]:
    return sorted(str(p.relative_to(root.parent)) for f in folders for p in (root / f).rglob("*.py"))


def run_pylint(root: Path, folders: Iterable[str]) -> dict[str, Any] | None:
    exe = tool("pylint")
    if exe is None:
        return None
    template = "{path}:{line}:{obj}:{msg_id}: {msg}"
    argv = [exe, "--disable=all", "--enable=W0221,W0222,W0237", f"--msg-template={template}", "-sn", "-j", "0"]
    env = {**os.environ, "PYTHONPATH": str(root.parent)}
    start = time.perf_counter()
    done = subprocess.run([*argv, *py_files(root, folders)], cwd=root.parent, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    reports = [line for line in done.stdout.splitlines() if re.match(r"[^:]+:\d+:[^:]*:W0", line)]
    seed = [r for r in reports if ASCEND_HYBRID in r and "_replay_metadata" in r]
    return {"count": len(reports), "seconds": round(seconds, 2), "flags_seed_override": bool(seed), "seed": seed}


def run_mypy(root: Path, folders: Iterable[str]) -> dict[str, Any] | None:
    exe = tool("mypy")
    if exe is None:
        return None
    with tempfile.TemporaryDirectory() as cache:
        argv = [exe, "--ignore-missing-imports", "--follow-imports=silent", "--namespace-packages"]
        argv += ["--explicit-package-bases", "--show-error-codes", "--no-error-summary", f"--cache-dir={cache}"]
        env = {**os.environ, "MYPYPATH": str(root.parent)}
        start = time.perf_counter()
        done = subprocess.run(
            [*argv, *py_files(root, folders)], cwd=root.parent, env=env, capture_output=True, text=True
        )
        seconds = time.perf_counter() - start
    lines = done.stdout.splitlines()
    reports = [line for line in lines if ": error:" in line and "[override]" in line]
    seed = [r for r in reports if ASCEND_HYBRID in r and "_replay_metadata" in r]
    crashed = done.returncode not in (0, 1) or (done.returncode == 1 and not any(": error:" in x for x in lines))
    row = {"count": len(reports), "seconds": round(seconds, 2), "flags_seed_override": bool(seed), "seed": seed}
    return row | ({"error": (done.stderr or done.stdout)[-500:]} if crashed else {})


def linter_rows(sg_copy: Path, vl: Path) -> list[dict[str, Any]]:
    cases = [("sglang attention", sg_copy, SG_ATTENTION, []), ("sglang attention + seed", sg_copy, SG_ATTENTION, None)]
    cases.append(("vllm v1/attention", vl, VL_ATTENTION, []))
    rows = []
    for label, root, folders, patches in cases:
        with planted(root, PLANTS[0].patches if patches is None else patches):
            for name, runner in (("pylint W0221/2/37", run_pylint), ("mypy [override]", run_mypy)):
                result = runner(root, folders)
                if result is None:
                    print(f"{name}: not installed (pip install pylint mypy), skipped")
                rows.append({"tree": label, "tool": name, **(result or {"skipped": "not installed"})})
    return rows


# ------------------------------------------------------------------------------------------------------ output
def print_trees(rows: list[dict[str, Any]]) -> None:
    """Medians, with [min-max] for the ratios: CPU seconds, wall seconds, peak memory (MiB) of each side."""
    head = f"{'tree':<22}{'files':>6}{'breaks':>7}{'drift':>6}{'check CPU-s':>12}{'parse CPU-s':>12}"
    print(head + f"{'x parse CPU':>18}{'x parse wall':>18}{'check MiB':>10}{'parse MiB':>10}")
    for r in rows:
        ratio, wall = r["ratio_cpu"], r["ratio_wall"]
        cells = f"{r['tree']:<22}{r['files']:>6}{r['breaks'] if r['breaks'] is not None else '-':>7}"
        cells += f"{r['drift'] if r['drift'] is not None else '-':>6}"
        cells += f"{r['check_cpu_s']['median']:>12}{r['parse_cpu_s']['median']:>12}"
        cells += f"{ratio['median']:>7} [{ratio['min']}-{ratio['max']}]".rjust(18)
        cells += f"{wall['median']:>7} [{wall['min']}-{wall['max']}]".rjust(18)
        cells += f"{r['check_peak_mib']['median']:>10.0f}{r['parse_peak_mib']['median']:>10.0f}"
        print(cells + (f"  REFUSED: {r['error'][:150]}" if r.get("error") else ""))


def print_breaks(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        if r.get("break_list") is not None and r["tree"] in {"sglang attention", "vllm v1/attention"}:
            print(f"\nBreaks on the unmodified {r['tree']} ({len(r['break_list'])}):")
            for text in r["break_list"]:
                print(f"  {text}")


def print_plants(rows: list[dict[str, Any]]) -> None:
    print(f"\n{'plant':<26}{'want':<7}{'verdict':<13}{'kind':<20}{'false':>6}  {'other findings':<16}expected site")
    for r in rows:
        if r.get("error"):
            verdict = "ERROR"
        elif r["want"] == "break":
            verdict = "found" if r["found"] else "MISSED"
        else:
            verdict = "FALSE ALARM" if r["found"] else "not reported"
        false = len(r.get("false_breaks") or [])
        other = ",".join(sorted({t.split(":")[0] for t in r.get("other_findings_on_method") or []})) or "-"
        sites = ", ".join(site.rsplit("/", 1)[-1] for site in r["expected_sites"])
        print(f"{r['plant']:<26}{r['want']:<7}{verdict:<13}{r.get('kind') or '-':<20}{false:>6}  {other:<16}{sites}")
    for r in rows:
        print(f"\n{r['plant']}: {r['what']}")
        for text in r.get("reported") or []:
            print(f"  break: {text}")
        for text in r.get("false_breaks") or []:
            print(f"  FALSE: {text}")
        if not r.get("reported") and not r.get("false_breaks"):
            print(f"  (no break){'; error: ' + r['error'] if r.get('error') else ''}")
            for text in r.get("other_findings_on_method") or []:
                print(f"  other: {text}")


def print_linters(rows: list[dict[str, Any]]) -> None:
    print(f"\n{'tree':<26}{'tool':<20}{'count':>7}{'seconds':>9}  flags the seed override")
    for r in rows:
        if "skipped" in r:
            print(f"{r['tree']:<26}{r['tool']:<20}  not installed")
            continue
        extra = f"  error: {r['error'][-120:]!r}" if r.get("error") else ""
        print(f"{r['tree']:<26}{r['tool']:<20}{r['count']:>7}{r['seconds']:>9}  {r['flags_seed_override']}{extra}")
        for line in r["seed"][:2]:
            print(f"    {line[:200]}")


def environment() -> dict[str, Any]:
    return {
        "machine": platform.machine(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="attention trees only: no whole packages, no linters")
    parser.add_argument("--repeat", type=int, default=3, help="pairs (parse, check) per tree (default: 3)")
    parser.add_argument(
        "--only", action="append", default=[], metavar="TREE", help="only the trees whose label holds this"
    )
    parser.add_argument("--skip-plants", action="store_true", help="the speed table only: no plants, no linters")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="wheel cache and unpacked trees")
    parser.add_argument("--wheels", type=Path, default=None, help="use the wheels in this folder, download none")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="write the results here")
    parser.add_argument("--measure", choices=("parse", "check"), help=argparse.SUPPRESS)  # one run, in a subprocess
    args, rest = parser.parse_known_args()
    if args.measure:
        print(json.dumps(measure(args.measure, [Path(t) for t in rest])))
        return
    if rest or args.repeat < 1:
        parser.error(f"unrecognized arguments: {' '.join(rest)}" if rest else "--repeat must be at least 1")
    cache = args.cache.expanduser()
    sg = unpack(fetch_wheel("sglang", cache, args.wheels), cache)
    vl = unpack(fetch_wheel("vllm", cache, args.wheels), cache)

    trees = [
        ("sglang attention", [sg / t for t in SG_ATTENTION], sg),
        ("vllm v1/attention", [vl / t for t in VL_ATTENTION], vl),
    ]
    if not args.quick:
        trees += [("sglang srt (whole)", [sg / "srt"], sg), ("vllm (whole)", [vl], vl)]
    trees = [t for t in trees if not args.only or any(o in t[0] for o in args.only)]
    tree_rows = [tree_row(label, targets, root, args.repeat) for label, targets, root in trees]
    print_trees(tree_rows)
    print_breaks(tree_rows)

    plant_rows: list[dict[str, Any]] = []
    linters: list[dict[str, Any]] = []
    if not args.skip_plants:
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / sg.name
            shutil.copytree(sg, copy)
            baseline = baseline_of([copy / t for t in SG_ATTENTION], copy)
            plant_rows = [run_plant(plant, copy, baseline) for plant in PLANTS]
            print_plants(plant_rows)
            linters = [] if args.quick else linter_rows(copy, vl)
        if linters:
            print_linters(linters)

    data = {"environment": environment(), "wheels": WHEELS, "quick": args.quick, "repeat": args.repeat}
    data |= {"command": " ".join(["python", "benchmarks/contracts_real_trees.py", *sys.argv[1:]])}
    data |= {"trees": tree_rows, "plants": plant_rows, "linters": linters}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(data, indent=2) + "\n")
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
