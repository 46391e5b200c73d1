"""Engine conventions for padded rows, reserved slots and fill values (see DESIGN.md).

Each profile answers: what do padded rows of ``state_indices`` hold, which rows do kernels skip, which state
slot and request-pool row are reserved, what fills padded ``seq_lens``, and how spec-decode indices look.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import chain

from kernels.conventions import CONVENTIONS, Convention
from workbench.engine_versions import releases
from workbench.errors import MetadataError


def _clip(sizes: Iterable[int], max_bs: int) -> list[int]:
    """``sizes`` (increasing, the engine's ranges end to end) up to ``max_bs``, with ``max_bs`` appended.

    No set and no sort: at ``max_bs`` = 10^9 the list holds ~31M ints (about 1.1 GB as Python ints), and a
    set plus a sorted copy of it would triple that."""
    kept = [bs for bs in sizes if 1 <= bs <= max_bs]
    if not kept or kept[-1] != max_bs:
        kept.append(max_bs)  # engines always capture max_bs itself
    return kept


def sglang_buckets(max_bs: int, speculative: bool = False) -> list[int]:
    """sglang's default capture list, clipped to ``max_bs`` with ``max_bs`` appended."""
    if speculative:
        sizes = chain(range(1, 9), range(10, 33, 2), range(40, 65, 4), range(72, 257, 8), range(272, max_bs + 1, 16))
    else:
        sizes = chain((1, 2, 4, 8, 12), range(16, 257, 8), range(272, 512, 16), range(512, max_bs + 1, 32))
    return _clip(sizes, max_bs)


def vllm_buckets(max_bs: int, speculative: bool = False) -> list[int]:
    """vLLM's default cudagraph capture sizes (1, 2, 4, then every 8 to 256, then every 16), clipped."""
    return _clip(chain((1, 2, 4), range(8, 257, 8), range(272, max_bs + 1, 16)), max_bs)


BUCKET_BYTES = 36
"""Host bytes per entry of a default bucket list: a list slot (8 B) and an int object (28 B)."""


def default_bucket_bytes(max_bs: int) -> int:
    """Upper bound of the host memory of a default bucket list for ``max_bs`` (the densest, every 16)."""
    return BUCKET_BYTES * (max_bs // 16 + 64)


@dataclass(frozen=True)
class Profile:
    """One engine's padding conventions.

    The kernel-facing facts (sentinel, skip rule, dummy slot) are the profile's
    :class:`kernels.conventions.Convention`; ``sentinel``, ``kernel_pad_slot_id`` and ``dummy_slot`` read it.

    Attributes:
        name: profile name.
        convention: the padding convention the kernels follow for this engine.
        reserved_request_row: request-pool row never handed out; padded rows and capture point at it, and
            its mapping is the dummy slot (sglang's padding row; for vLLM, the zeroed block-table row).
        seq_len_fill: value of padded rows in the static ``seq_lens`` buffer.
        num_accepted_fill: value of padded rows in ``num_accepted_tokens`` (spec decode), or None when
            the engine has no such buffer.
        spec_indices_2d: spec-decode ``state_indices`` are ``[bs, D]`` (one slot per draft position).
        verify_intermediate_by_row: verify writes per-step states to an intermediate buffer indexed by batch row.
        buckets: the engine's default capture-bucket list.
        notes: one sentence for tables and figures.
        checked_against: the released engine whose own metadata code ``workbench.engines`` compared with this
            profile (``make test-engines``), and what differs.
        engine: the engine family ("sglang" for both sglang profiles, "vllm"), as the engine adapters and a
            trace header's ``engine`` name it.
        decodes_first: a mixed step lays its one-token (decode) rows before its extend rows (vLLM's
            reorder), else after them (sglang's MIXED batch).
        prefix_caches: the mamba prefix-cache strategies the engine has that the simulator models (sglang's
            radix cache: "no_buffer", "extra_buffer"; vLLM's ``mamba_cache_mode``: "align").
        zero_on_alloc: the engine clears a state slot it hands to a request before the request's first forward
            (sglang's ``mamba_needs_clear``; vLLM 0.33.0 does not zero mamba blocks); the simulator writes it into
            a trace's header and the replay follows it.
        state_layout: how the engine's pool lays out a gated-delta-rule state slot per value head: ``"v_first"``
            (``[V, K]``: sglang's ``MambaPool`` and vLLM's GDN pool, both released engines) or ``"k_first"``
            (``[K, V]``: fla's default). ``workbench.viz.layout`` draws what a read in the other one takes.
        tree_verify: the engine verifies draft trees (sglang's ``speculative_eagle_topk > 1``: per-row
            ``retrieve_next_token`` / ``retrieve_next_sibling`` / ``retrieve_parent_token`` buffers); False: chains
            only (vLLM), and a batch with a tree is refused.
    """

    name: str
    convention: Convention
    reserved_request_row: int
    seq_len_fill: int
    num_accepted_fill: int | None
    spec_indices_2d: bool
    verify_intermediate_by_row: bool
    buckets: Callable[[int, bool], list[int]]
    notes: str
    checked_against: str = ""
    engine: str = ""
    decodes_first: bool = False
    prefix_caches: tuple[str, ...] = ()
    zero_on_alloc: bool = False
    state_layout: str = "v_first"
    tree_verify: bool = False

    @property
    def sentinel(self) -> int:
        """The ``state_indices`` value of a padded row."""
        return self.convention.sentinel

    @property
    def kernel_pad_slot_id(self) -> int | None:
        """The kernels' skip rule (``kernels.padding``): rows with index ``<=`` this are skipped; None:
        padded rows are really processed (on the dummy slot)."""
        return self.convention.pad_slot_id

    @property
    def dummy_slot(self) -> int:
        """The state slot never handed to a request (capture and padded rows may write it)."""
        return self.convention.dummy_slot

    @property
    def guard(self) -> str:
        """The kernels' skip condition, as text."""
        return self.convention.guard

    def slots_per_request(self, draft_tokens: int = 1) -> int:
        """State slots each request owns in a pool that serves verify steps of ``draft_tokens`` (D) tokens:
        D where spec-decode indices are ``[bs, D]`` (vLLM), else 1. Without speculation pass 1.

        >>> PROFILES["vllm"].slots_per_request(3), PROFILES["sglang"].slots_per_request(3)
        (3, 1)
        """
        if isinstance(draft_tokens, bool) or not isinstance(draft_tokens, int) or draft_tokens < 1:
            raise MetadataError(f"draft_tokens must be an int >= 1, got {draft_tokens!r}", field="draft_tokens")
        return draft_tokens if self.spec_indices_2d else 1


PROFILES: dict[str, Profile] = {
    "sglang": Profile(
        name="sglang",
        convention=CONVENTIONS["sglang"],
        reserved_request_row=0,
        seq_len_fill=1,
        num_accepted_fill=None,
        spec_indices_2d=False,
        verify_intermediate_by_row=True,
        buckets=sglang_buckets,
        notes="padded rows -1, kernels skip negative indices; slot 0 reserved because capture writes it",
        checked_against=f"{releases('sglang')}: GDNAttnBackend and Mamba2AttnBackend equal bitwise in every mode, "
        "eager, replay and capture",
        engine="sglang",
        decodes_first=False,
        prefix_caches=("no_buffer", "extra_buffer"),
        zero_on_alloc=True,
        tree_verify=True,
    ),
    "sglang-ascend": Profile(
        name="sglang-ascend",
        convention=CONVENTIONS["sglang-ascend"],
        reserved_request_row=0,
        seq_len_fill=0,
        num_accepted_fill=None,
        spec_indices_2d=False,
        verify_intermediate_by_row=True,
        buckets=sglang_buckets,
        notes=(
            "padded rows point at dummy slot 0 and are processed there (the conv writes it; zero-length under "
            "the recurrence); seq-len fill 0"
        ),
        checked_against=f"{releases('sglang')}: AscendGDNAttnBackend and AscendMamba2AttnBackend equal bitwise in "
        "every mode, eager, replay and capture",
        engine="sglang",
        decodes_first=False,
        prefix_caches=("no_buffer", "extra_buffer"),
        zero_on_alloc=True,
        tree_verify=True,
    ),
    "vllm": Profile(
        name="vllm",
        convention=CONVENTIONS["vllm"],
        # vLLM zeroes the block-table rows of padded requests: row 0 here is that all-null row
        reserved_request_row=0,
        seq_len_fill=0,
        num_accepted_fill=1,
        spec_indices_2d=True,
        verify_intermediate_by_row=False,
        buckets=vllm_buckets,
        notes="padded rows 0 (the never-allocated null block), kernels guard idx <= 0",
        checked_against=f"{releases('vllm', 'vLLM')}: the GDN and Mamba2 metadata builders equal bitwise in every "
        "mode, eager, "
        "replay and capture, but an idle step: vLLM runs it as one dummy one-token request (query_start_loc "
        "[0, 1, 1, ...]), the workbench as no request",
        engine="vllm",
        decodes_first=True,
        prefix_caches=("align",),
    ),
}


def get_profile(profile: str | Profile) -> Profile:
    """Look a profile up by name (a Profile passes through)."""
    if isinstance(profile, Profile):
        return profile
    try:
        return PROFILES[profile]
    except (KeyError, TypeError):
        raise MetadataError(
            f"profile: unknown profile {profile!r}; choose one of {sorted(PROFILES)}", field="profile"
        ) from None
