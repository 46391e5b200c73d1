"""What a lab capture or step would cost, worked out before anything is allocated, and the lab's bounds.

The lab refuses a setting with one line naming the control and the value, in microseconds, instead of
blocking the notebook kernel for minutes (a bucket of 100,000 once captured for 40 s and grew the pool to
200,000 slots). Three kinds of bound:

- sizes: ``MAX_BUCKET`` (above every engine's default capture list, which stops at 512), ``MAX_BUCKETS``
  captures, ``MAX_DRAFT_TOKENS``, ``MAX_POOL_SLOTS`` (the heatmap draws one column per slot);
- memory, through :func:`workbench.limits.check_memory` as the CLI does: the pool and the copies the lab
  keeps of it (``STATE_COPIES``) and the verify buffers (``INTERMEDIATE_COPIES``), against what the device
  has free;
- CPU work, on the CPU recorder only (a device runs these sizes in milliseconds): an estimate in
  multiply-adds, ``passes x tokens x (the layer's multiply-adds per token + TOKEN_OVERHEAD)``, at most
  ``CPU_WORK_LIMIT``. Measured on the 2-core CI machine: 2 to 9 s per 1e9, so the limit is tens of seconds
  at worst (the engine preset's default capture, 4.6e9, takes about 6 s; an eager verify of 17 engine-sized
  requests, 9.3e9, took 43 s and is refused).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.errors import MetadataError
from workbench.layer_names import LAYER_NAMES
from workbench.layers import get_layer_spec
from workbench.limits import check_int, check_memory, gib
from workbench.metadata import tokens_per_row
from workbench.profiles import PROFILES, get_profile
from workbench.widgets.explorer_model import parse_int_list, shown

LAYERS = LAYER_NAMES  # the keys of workbench.layers.LAYERS
PRESETS = ("small", "engine")  # the names of workbench.sweeps.common
BACKENDS = ("auto", "cpu", "cuda", "npu")
DEFAULT_BUCKETS = [1, 2, 4, 8]

MAX_BUCKET = 1024
MAX_BUCKETS = 64
MAX_DRAFT_TOKENS = 8
MAX_POOL_SLOTS = 8192
STATE_COPIES = 10  # runner state, the lab's snapshots, compare's eager copy and float64 reference (2x)...
INTERMEDIATE_COPIES = 8  # the graphs' verify buffers, eager ones, the float64 references (2x each)
CPU_WORK_LIMIT = 8e9
TOKEN_OVERHEAD = 250_000  # per-token cost that is not arithmetic (recorder, reference loops), measured
CAPTURE_PASSES = 3  # two warm-up runs and the capture
STEP_PASSES = 8  # padded eager, float64 reference (about four passes' worth), replay, the timing runs
SEED_MAX = 2**32 - 1


class Refusal(MetadataError):
    """A setting the lab will not run: ``control`` names the control it shows beside; ``field`` (default: the
    control) and ``row`` are :class:`MetadataError`'s, the setting at fault."""

    def __init__(self, control: str, message: str, *, field: str | None = None, row: int | None = None) -> None:
        super().__init__(message, field=control if field is None else field, row=row)
        self.control = control


def layer_config(layer: str, preset: str) -> Any:
    """The shapes of ``layer`` at ``preset`` (no weights drawn: cheap): the registry's
    (``workbench.layers.LAYERS``)."""
    if not isinstance(layer, str) or layer not in LAYERS:
        raise Refusal("layer", f"layer: {shown(layer)} is not one of {list(LAYERS)}")
    if not isinstance(preset, str) or preset not in PRESETS:
        raise Refusal("preset", f"preset: {shown(preset)} is not one of {list(PRESETS)}")
    return get_layer_spec(layer).config(preset)


def layer_modes(layer: str) -> tuple[str, ...]:
    """The graph modes the lab captures for ``layer`` (what the runner keeps of decode and verify)."""
    return tuple(m for m in ("decode", "target_verify") if m in get_layer_spec(layer).supported_modes)


def slot_elements(layer: str, cfg: Any) -> int:
    """float32 elements of one state slot (conv window + SSM state): the layer's own ``state_shapes``."""
    return get_layer_spec(layer).slot_elements(cfg)


def token_macs(layer: str, cfg: Any) -> int:
    """Multiply-adds of one token through the layer: its projections, the conv and the recurrence."""
    return get_layer_spec(layer).token_macs(cfg)


def cpu_work(tokens: int, layer: str, cfg: Any, passes: int) -> float:
    """The CPU-work estimate of ``passes`` runs over ``tokens`` tokens (see the module docstring)."""
    return float(passes) * tokens * (token_macs(layer, cfg) + TOKEN_OVERHEAD)


@dataclass(frozen=True)
class Plan:
    """What a capture builds: checked sizes, the device it runs on, the pool it allocates."""

    layer: str
    preset: str
    profile: str
    buckets: list[int]
    draft_tokens: int
    modes: tuple[str, ...]
    device: str
    per_request: int
    num_slots: int
    config: Any

    @property
    def capacity(self) -> int:
        """Requests the pool holds (the largest batch a step can draw)."""
        return (self.num_slots - 1) // self.per_request

    def tokens(self, mode: str, rows: int) -> int:
        return rows * tokens_per_row(mode, self.draft_tokens)

    def check_step(self, batch_size: int, mode: str) -> None:
        """Refuse a step of ``batch_size`` requests that the pool cannot hold or the CPU bound forbids."""
        largest = self.buckets[-1]
        try:
            check_int("batch size", batch_size, 1, self.capacity)
        except MetadataError as e:
            raise Refusal(
                "batch_size", f"{e} (the pool's requests; buckets up to {largest}, above that a step runs eagerly)"
            ) from None
        if self.device != "cpu":
            return
        work = cpu_work(self.tokens(mode, batch_size), self.layer, self.config, STEP_PASSES)
        if work > CPU_WORK_LIMIT:
            per = STEP_PASSES * self.tokens(mode, 1) * (token_macs(self.layer, self.config) + TOKEN_OVERHEAD)
            raise Refusal(
                "batch_size",
                f"batch size = {batch_size}: a {mode} step of the {self.preset} {self.layer} layer on the CPU is "
                f"about {work:.1e} multiply-adds, above the lab's CPU bound {CPU_WORK_LIMIT:.0e}; "
                f"at most {int(CPU_WORK_LIMIT // per)} here",
            )


def choose_device(backend: str, reasons: dict[str, str | None]) -> str:
    """The device ``backend`` runs on: "auto" is the first device backend that runs here, else the CPU."""
    if backend not in BACKENDS:
        raise Refusal("backend", f"backend: {shown(backend)} is not one of {list(BACKENDS)}")
    if backend == "auto":
        return next((b for b in ("cuda", "npu") if reasons.get(b) is None), "cpu")
    why = reasons.get(backend, "unknown")
    if why is not None:
        raise Refusal("backend", f"backend: {backend} is unavailable here: {why}")
    return backend


def parse_buckets(text: str) -> list[int]:
    """The typed bucket list, each in ``[1, MAX_BUCKET]``, strictly increasing; "" is ``DEFAULT_BUCKETS``."""
    if not isinstance(text, str):
        raise Refusal("buckets", f"buckets must be text (comma-separated batch sizes), got {shown(text)}")
    try:
        buckets = parse_int_list("buckets", text) or list(DEFAULT_BUCKETS)
    except MetadataError as e:
        raise Refusal("buckets", str(e), row=e.row) from None
    if len(buckets) > MAX_BUCKETS:
        raise Refusal("buckets", f"buckets: {len(buckets)} sizes; the lab captures at most {MAX_BUCKETS} (one each)")
    for i, b in enumerate(buckets):
        try:
            check_int(f"buckets[{i}]", b, 1, MAX_BUCKET)
        except MetadataError as e:
            why = "engines' default lists stop at 512; larger blocks the notebook and grows the pool"
            raise Refusal("buckets", f"{e} ({why})", row=i) from None
        if i and b <= buckets[i - 1]:
            raise Refusal(
                "buckets", f"buckets must be strictly increasing: buckets[{i}] = {b} after {buckets[i - 1]}", row=i
            )
    return buckets


def make_plan(
    layer: str,
    preset: str,
    profile: str,
    backend: str,
    buckets_text: str,
    draft_tokens: int,
    num_slots: int | None,
    reasons: dict[str, str | None],
) -> Plan:
    """Every check of a capture, cheapest first; raises :class:`Refusal` naming the control."""
    cfg = layer_config(layer, preset)
    if not isinstance(profile, str) or profile not in PROFILES:
        raise Refusal("profile", f"profile: {shown(profile)} is not one of {list(PROFILES)}")
    try:
        check_int("D", draft_tokens, 1, MAX_DRAFT_TOKENS)
    except MetadataError as e:
        raise Refusal("draft_tokens", f"{e} (draft tokens per request in target_verify)") from None
    buckets = parse_buckets(buckets_text)
    modes = layer_modes(layer)
    per_request = get_profile(profile).slots_per_request(draft_tokens)
    need = (2 * buckets[-1] + 1) * per_request + 1  # twice the largest bucket, so a step can run eagerly
    if num_slots is None:
        if need > MAX_POOL_SLOTS:
            raise Refusal(
                "buckets",
                f"buckets: the largest, {buckets[-1]}, needs a pool of {need:,} slots ((2 x {buckets[-1]} + 1) "
                f"requests x {per_request} slots + the dummy); the lab draws one heatmap column per slot, "
                f"at most {MAX_POOL_SLOTS:,}",
            )
        num_slots = need
    else:
        try:
            check_int("num_slots", num_slots, buckets[-1] * per_request + 1, MAX_POOL_SLOTS)
        except MetadataError as e:
            raise Refusal(
                "general",
                f"{e} (the largest bucket's requests + the dummy slot, at most the heatmap's)",
                field="num_slots",
            ) from None
    device = choose_device(backend, reasons)
    plan = Plan(layer, preset, profile, buckets, draft_tokens, modes, device, per_request, num_slots, cfg)
    if device == "cpu":
        tokens = sum(plan.tokens(m, sum(buckets)) for m in modes)
        work = cpu_work(tokens, layer, cfg, CAPTURE_PASSES)
        if work > CPU_WORK_LIMIT:
            raise Refusal(
                "buckets",
                f"buckets: capturing {tokens:,} tokens (decode + verify at D={draft_tokens}) of the {preset} "
                f"{layer} layer on the CPU recorder is about {work:.1e} multiply-adds, above the lab's CPU bound "
                f"{CPU_WORK_LIMIT:.0e}; capture fewer or smaller buckets, or use a device backend",
            )
    slot_bytes = 4 * slot_elements(layer, cfg)
    inter_rows = (2 * buckets[-1] + 1) * draft_tokens if "target_verify" in modes else 0
    nbytes = slot_bytes * (STATE_COPIES * num_slots + INTERMEDIATE_COPIES * inter_rows)
    try:
        check_memory(
            f"buckets up to {buckets[-1]}",
            nbytes,
            f"a pool of {num_slots:,} slots of {gib(slot_bytes)} and the lab's copies of it",
            device,
        )
    except MetadataError as e:
        raise Refusal("buckets", str(e)) from None
    return plan
