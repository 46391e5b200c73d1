"""The model behind ``MetadataExplorer``: all logic in plain Python (no ipywidgets), so tests drive it.

The user sets parameters (profile or all three, mode, raw batch size, seq lens typed or random, draft
tokens, draft topk, bucket list typed or the engine's, pool size and fragmentation); :meth:`ExplorerModel.update`
rebuilds the metadata and returns an :class:`ExplorerState` with the metadata, their pools and, instead of
raising, the validator's errors in words keyed by the control that caused them. A verify step also carries
its rows' draft trees (random ones drawn from ``seed`` when ``topk > 1``, which only sglang verifies; chains
otherwise) and one accepted path per row, which :meth:`ExplorerModel.tree_view` hands to the tree figure.

Sizes are checked before any work (``LIMITS``, through ``workbench.limits``): the figures draw every row and
every slot, so a batch of 100,000 or a pool of millions is refused in one line beside its control, not
drawn for minutes. When the current inputs are refused, :attr:`ExplorerModel.stale` says in one line that
what is on screen is the last accepted step (``ExplorerModel.shown``), not these inputs. ``SLIDERS`` are the
view's slider ranges: a value at a slider's end may have been cut to it by the browser, and
:meth:`ExplorerModel.notes` says so beside the control.

Any value comes back in words, never as an exception. A value a control can hold (an int, a text) that is
out of range is taken and refused beside its control until it changes, as the control shows it. A value
no control holds (``KINDS``: None, a list, a float or a bool for an int, a number for a text) or a name
that is no control refuses the whole call: nothing of it is taken, so the next call works as before it.
"""

from __future__ import annotations

import random
import reprlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from workbench.batch import Batch
from workbench.buckets import check_buckets
from workbench.errors import MetadataError, WorkbenchError
from workbench.limits import check_int
from workbench.metadata import DraftTree, Metadata, build_metadata, validate
from workbench.pool import StatePool
from workbench.profiles import get_profile

PROFILE_NAMES = ("sglang", "sglang-ascend", "vllm")
PROFILE_CHOICES = (*PROFILE_NAMES, "all")
MODES = ("decode", "target_verify", "extend", "idle")
# the controls an error can be shown beside; "general" for anything else
CONTROLS = (
    "profile",
    "mode",
    "raw_batch_size",
    "seq_lens",
    "draft_tokens",
    "topk",
    "buckets",
    "pool_size",
    "fragmentation",
)
# what the explorer draws at most: every row of a step is a bar and every slot a point, and a step at these
# sizes answers a control change in about half a second on a 2-core CPU (`workbench bench widgets`)
MAX_ROWS = 1024
MAX_POOL = 4096
MAX_DRAFT = 64
LIMITS: dict[str, tuple[int, int, str]] = {
    "raw_batch_size": (0, MAX_ROWS, "the explorer draws every row; `workbench metadata` prints larger steps"),
    "pool_size": (2, MAX_POOL, "the slot map draws every slot; `workbench metadata --num-slots` takes more"),
    "draft_tokens": (1, MAX_DRAFT, "engines draft a few tokens per request"),
    "topk": (1, MAX_DRAFT, "sglang drafts a few candidates per node"),
}
# the kind of value each control holds; a value of another kind is refused and not taken
KINDS: dict[str, str] = {
    "profile": "text",
    "mode": "text",
    "raw_batch_size": "int",
    "seq_lens": "text",
    "draft_tokens": "int",
    "topk": "int",
    "buckets": "text",
    "pool_size": "int",
    "fragmentation": "number",
    "seed": "int",
}
# what a text box holds, for the refusal of another kind of value
TEXTS = {
    "profile": f"one of {list(PROFILE_CHOICES)}",
    "mode": f"one of {list(MODES)}",
    "seq_lens": "comma-separated lengths, or '' for random ones",
    "buckets": "comma-separated batch sizes, or '' for the engine's list",
}
# the view's slider ranges (min, max): the browser cuts a typed value to them without a word
SLIDERS: dict[str, tuple[float, float]] = {
    "raw_batch_size": (0, 256),
    "draft_tokens": (1, 8),
    "topk": (1, 4),
    "pool_size": (2, 1024),
    "fragmentation": (0.0, 1.0),
}


@dataclass(frozen=True)
class ExplorerParams:
    """What the explorer's controls hold.

    Attributes:
        profile: one of ``PROFILE_CHOICES`` ("all": the three engines side by side).
        mode: decode | target_verify | extend | idle.
        raw_batch_size: live requests (ignored when ``seq_lens`` is typed: the list decides).
        seq_lens: typed comma-separated lengths (decode/verify: seq lens; extend: new tokens per request),
            or "" for random ones drawn from ``seed``.
        draft_tokens: D of target_verify.
        topk: target_verify's draft trees (sglang's ``speculative_eagle_topk``): 1 chains; above, each request
            drafts a random tree of D nodes drawn from ``seed``, each node with at most ``topk`` children
            (sglang only: vLLM verifies chains, and says so beside this control).
        buckets: typed comma-separated captured batch sizes, or "" for the engine default.
        pool_size: state slots in the pool, the dummy slot included.
        fragmentation: 0..1, the share of earlier requests freed before the batch is allocated (holes).
        seed: of the random lengths and of which earlier requests are freed.
    """

    profile: str = "all"
    mode: str = "decode"
    raw_batch_size: int = 5
    seq_lens: str = ""
    draft_tokens: int = 3
    topk: int = 1
    buckets: str = ""
    pool_size: int = 64
    fragmentation: float = 0.5
    seed: int = 0


@dataclass
class ExplorerState:
    """The result of one update: steps (one per profile shown), their pools, errors by control.

    A target_verify step also has ``tree``, its rows' draft trees (the batch's when ``topk > 1``, else the
    chains every profile verifies), and ``accept_index``, int64 ``[r, depth + 1]``: one random accepted
    root-first path per row (sglang's global node ids, -1 after the path), drawn from ``seed``."""

    params: ExplorerParams
    metas: list[Metadata] = field(default_factory=list)
    pools: list[StatePool] = field(default_factory=list)
    batches: list[Batch] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    raw_batch_size: int = 0
    tree: DraftTree | None = None
    accept_index: torch.Tensor | None = None

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass(frozen=True)
class TreeView:
    """What the tree figure draws: ``tree`` and its ``row`` (None: nothing to draw), ``accept_index`` (the
    accepted paths), and ``note``, one line of words (why nothing is drawn, or what is)."""

    tree: DraftTree | None
    row: int
    accept_index: torch.Tensor | None
    note: str


def parse_int_list(field_name: str, text: str) -> list[int]:
    """Parse "1, 2,3" into ints; raise ``WorkbenchError`` naming the field, the position and the text."""
    out = []
    for i, part in enumerate(p.strip() for p in str(text).replace(";", ",").split(",")):
        if not part:
            continue
        try:
            out.append(int(part))
        except ValueError:
            raise MetadataError(
                f"{field_name}: item {i} is {part!r}, not an integer", field=field_name, row=i
            ) from None
    return out


def shown(value: object) -> str:
    """``repr(value)``, cut short: a refusal stays one line whatever was passed."""
    return reprlib.repr(value)


def kind_error(name: str, kind: str, value: object, text: str = "") -> str | None:
    """Why ``value`` cannot be the value of control ``name`` holding ``kind`` ("int" | "text" | "number" in
    [0, 1] | "bool"), or None: a bool is no int and no number, NaN is a number (refused by its range).
    ``text``: what the text box holds, said in the refusal."""
    if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        return f"{name} must be an int, got {shown(value)}"
    if kind == "number" and (isinstance(value, bool) or not isinstance(value, int | float)):
        return f"{name}: {shown(value)} is not a number in [0, 1]"
    if kind == "text" and not isinstance(value, str):
        return f"{name} must be text{f' ({text})' if text else ''}, got {shown(value)}"
    if kind == "bool" and not isinstance(value, bool):
        return f"{name} must be True or False, got {shown(value)}"
    return None


def control_of(message: str) -> str:
    """Which control an error message is about (its leading field name), "general" when none matches."""
    head = message.split(":")[0].split("[")[0].split(" ")[0]
    table = {
        "seq_lens": "seq_lens",
        "extend_lens": "seq_lens",
        "prefix_lens": "seq_lens",
        "draft_tokens": "draft_tokens",
        "slots_per_request": "draft_tokens",
        "topk": "topk",
        "tree": "topk",
        "depth": "topk",
        "buckets": "buckets",
        "bucket": "buckets",
        "num_slots": "pool_size",
        "pool_size": "pool_size",
        "pool": "pool_size",
        "max_requests": "pool_size",
        "fragmentation": "fragmentation",
        "raw_batch_size": "raw_batch_size",
        "profile": "profile",
        "mode": "mode",
    }
    return table.get(head, "general")


def describe(st: ExplorerState) -> str:
    """A step in a few words: ``sglang decode 5->8, pool 64`` (each profile shown, its raw and padded size)."""
    steps = ", ".join(f"{m.profile.name} {st.params.mode} {m.raw_batch_size}->{m.batch_size}" for m in st.metas)
    return f"{steps}, pool {st.params.pool_size}"


class ExplorerModel:
    """Builds the metadata the explorer shows. ``update(**changes)`` never raises on bad input: the
    errors come back in ``ExplorerState.errors`` (control name -> message).

    Attributes: ``params``, ``state`` (of the current params), ``shown`` (the last state that built a step:
    what the figures draw; None before any).
    """

    def __init__(self, **params: Any) -> None:
        self.params = ExplorerParams()
        self.shown: ExplorerState | None = None
        self.state = self.update(**params)  # refused in words, as any update: the defaults stay

    @property
    def stale(self) -> str | None:
        """None when the figures show the current inputs; else one line saying what they show instead."""
        if self.state.metas or not self.state.errors:
            return None
        if self.shown is None:
            return "nothing built: these inputs were refused (the line beside the control says why)"
        return (
            f"stale: the figures and table show the last accepted inputs ({describe(self.shown)}), not these, "
            "which were refused (the line beside the control says why)"
        )

    def notes(self) -> dict[str, str]:
        """Control -> a line beside it: for a slider at its end, that a larger value typed in its box was cut to
        it; for ``profile``, the state layout of each profile shown (:meth:`layout_note`)."""
        out = {"profile": self.layout_note()}
        for name, (_, top) in SLIDERS.items():
            value = getattr(self.params, name)
            limit = LIMITS.get(name, (0, top, ""))[1]
            if value == top and limit > top:
                out[name] = (
                    f"{value:g} is this slider's end: a larger value typed in its box is cut to it; "
                    f"up to {limit:,} through set({name}=...)"
                    + (" or typed seq lens" if name == "raw_batch_size" else "")
                )
        return out

    def layout_note(self) -> str:
        """The recurrent-state layout (``Profile.state_layout``) of each profile the explorer shows, e.g.
        ``state layout: vllm v_first [slots, HV, V, K]``; an unknown profile choice shows all three."""
        names = (self.params.profile,) if self.params.profile in PROFILE_NAMES else PROFILE_NAMES
        dims = {"k_first": "[slots, HV, K, V]", "v_first": "[slots, HV, V, K]"}
        parts = []
        for name in names:
            layout = get_profile(name).state_layout
            parts.append(f"{name} {layout} {dims.get(layout, '')}".rstrip())
        return "state layout: " + ", ".join(parts)

    def update(self, **changes: Any) -> ExplorerState:
        """Apply ``changes`` to the parameters and rebuild; returns (and keeps) the new state.

        A name that is no control, or a value of a kind its control cannot hold, refuses the whole call in
        words (``errors``) and takes none of it: the parameters stay as they were."""
        refused = self._refusals(changes)
        if refused:
            self.state = ExplorerState(params=self.params, errors=refused, raw_batch_size=self.params.raw_batch_size)
            return self.state
        self.params = replace(self.params, **changes)
        self.state = self._build(self.params)
        if self.state.metas:
            self.shown = self.state
        return self.state

    def _refusals(self, changes: dict[str, Any]) -> dict[str, str]:
        """Control -> why ``changes`` cannot be taken at all (unknown names, values of the wrong kind)."""
        unknown = sorted(set(changes) - set(KINDS))
        if unknown:
            return {"general": f"update: {unknown} are not explorer controls; controls are {list(KINDS)}"}
        out = {}
        for name, value in changes.items():
            why = kind_error(name, KINDS[name], value, TEXTS.get(name, ""))
            if why is not None:
                out[name] = f"{why}; not taken, still {shown(getattr(self.params, name))}"
        return out

    # -- building -------------------------------------------------------------------------------------
    def _build(self, p: ExplorerParams) -> ExplorerState:
        st = ExplorerState(params=p, raw_batch_size=p.raw_batch_size)
        errors = st.errors
        errors.update(_choice_errors(p))
        lens = _parsed(errors, "seq_lens", lambda: _typed_list("seq_lens", p.seq_lens))
        if lens is not None and len(lens) > MAX_ROWS:  # refused, yet typed: the batch size is not read
            errors["seq_lens"] = _too_many_lens(lens)
        buckets = _parsed(errors, "buckets", lambda: _buckets(p))
        errors.update(_size_errors(p, lens))  # sizes before any work: only those the step reads
        if errors:
            return st
        r = 0 if p.mode == "idle" else (len(lens) if lens is not None else p.raw_batch_size)
        st.raw_batch_size = r
        if lens is None:
            rng = random.Random(p.seed)
            lens = [rng.randint(1, 64 if p.mode == "extend" else 512) for _ in range(r)]
        if p.mode == "target_verify":
            try:
                st.tree, st.accept_index = _drafts(p, r)
            except WorkbenchError as e:
                errors["topk"] = str(e)
                return st
        batch_tree = st.tree if p.mode == "target_verify" and p.topk > 1 else None
        profiles = PROFILE_NAMES if p.profile == "all" else (p.profile,)
        for name in profiles:
            try:
                meta, pool, batch = self._one(name, p, r, lens, buckets, batch_tree)
            except (WorkbenchError, ValueError, TypeError) as e:
                errors.setdefault(control_of(str(e)), f"{name}: {e}")
                continue
            st.metas.append(meta)
            st.pools.append(pool)
            st.batches.append(batch)
        return st

    @staticmethod
    def _one(
        name: str, p: ExplorerParams, r: int, lens: list[int], buckets: list[int] | None, tree: DraftTree | None
    ) -> tuple[Metadata, StatePool, Batch]:
        d = p.draft_tokens if p.mode == "target_verify" else 1
        if tree is not None and not get_profile(name).tree_verify:
            raise MetadataError(
                f"topk: {p.topk} drafts a tree per request, and {name} verifies chains only (topk 1); "
                "draft trees are sglang's",
                field="topk",
            )
        spr = get_profile(name).slots_per_request(d)
        pool = StatePool(p.pool_size, name, slots_per_request=spr)
        if r > pool.capacity:
            raise MetadataError(
                f"pool_size: {p.pool_size} slots hold {pool.capacity} requests of {spr} slot(s) beside the dummy "
                f"slot, fewer than the {r} live requests",
                field="pool_size",
            )
        # earlier requests, some freed again: the batch lands in the holes, as in a busy server
        earlier = min(pool.capacity - r, 2 * max(r, 1))
        rng = random.Random(p.seed * 7919 + 17)  # independent of the lengths drawn from seed
        scratch = pool.alloc(earlier).tolist()
        freed = rng.sample(scratch, round(p.fragmentation * earlier)) if earlier else []
        pool.free(freed)
        rows = pool.alloc(r)
        if p.mode == "decode":
            batch = Batch.decode(rows, lens)
        elif p.mode == "target_verify":
            batch = Batch.target_verify(rows, lens, draft_tokens=d, tree=tree)
        elif p.mode == "extend":
            # every other request continues from a cached prefix (has an initial state), the rest are new
            prefix = [0 if i % 2 else 16 * (i + 1) for i in range(r)]
            batch = Batch.extend(rows, lens, prefix)
        else:
            batch = Batch.idle()
        bucket: str | None = None if p.mode == "extend" else "auto"
        meta = build_metadata(batch, pool, bucket=bucket, buckets=buckets)
        validate(meta, pool)
        return meta, pool, batch

    def tree_view(self, row: int) -> TreeView:
        """The draft tree of live row ``row`` of the step shown (``shown``: the last accepted inputs), with the
        rows' accepted paths, or why there is none, in words (never an exception)."""
        st = self.shown
        why = kind_error("row", "int", row)
        if st is None or st.tree is None:
            mode = st.params.mode if st is not None else self.params.mode
            note = f"{mode}: no draft tokens to draw; the draft tree is a target_verify step's"
            return TreeView(None, 0, None, note if st is not None else "nothing built yet")
        r = st.tree.num_requests
        if why is None and not 0 <= row < r:
            why = f"row: {row} is not a live row of this step (0..{r - 1})" if r else "row: the step has no live row"
        if why is not None:
            return TreeView(None, 0, None, why)
        kind = f"topk {st.params.topk}, drawn from seed {st.params.seed}" if st.params.topk > 1 else "a chain (topk 1)"
        return TreeView(st.tree, row, st.accept_index, f"row {row} of {r}: {kind}; orange: a random accepted path")

    def engine_rows(self, engine: str) -> list[tuple[str, str, str, str, bool]]:
        """The installed ``engine``'s own metadata beside the profile's, for the steps shown whose profile it
        implements: (profile, field, profile's value, engine's value, equal) per field the engine computes.

        The engine runs the same batch on the same pool: its replay path when the step is padded for a
        bucket, else its eager path. An engine error propagates (it is the finding)."""
        import workbench.engines as engines  # the engine is imported only when asked

        adapter_cls = engines.adapter_class(engine)
        rows = []
        st = self.state
        for meta, pool, batch in zip(st.metas, st.pools, st.batches, strict=True):
            d = batch.draft_tokens if batch.mode == "target_verify" else self.params.draft_tokens
            adapter = adapter_cls(pool, [meta.bucket or max(1, batch.raw_batch_size)], d)
            if adapter.profile != meta.profile.name:
                continue
            got = adapter.replay(batch, meta.bucket) if meta.bucket else adapter.eager(batch)
            for name in adapter.compared_fields(batch.mode):
                want, have = getattr(meta, name), getattr(got, name)
                same = want is not None and have is not None and want.shape == have.shape and bool((want == have).all())
                rows.append((meta.profile.name, name, _values(want), _values(have), same))
        return rows


def _drafts(p: ExplorerParams, r: int) -> tuple[DraftTree, torch.Tensor]:
    """The verify's draft trees (random, from ``seed``, when ``topk > 1``; else chains) and one random accepted
    root-first path per row, as sglang's ``accept_index`` (raises ``WorkbenchError`` naming ``topk``)."""
    d = p.draft_tokens
    tree = DraftTree.random(r, d, p.topk, seed=p.seed) if p.topk > 1 else DraftTree.chain(r, d)
    rng = random.Random(p.seed * 104729 + 3)  # independent of the trees and the lengths
    last = [rng.randrange(d) for _ in range(r)]
    return tree, tree.accept_index(last)


def _choice_errors(p: ExplorerParams) -> dict[str, str]:
    """Control -> why its choice is none the explorer offers (profile, mode, fragmentation)."""
    errors = {}
    if p.profile not in PROFILE_CHOICES:
        errors["profile"] = f"profile: {p.profile!r} is not one of {list(PROFILE_CHOICES)}"
    if p.mode not in MODES:
        errors["mode"] = f"mode: {p.mode!r} is not one of {list(MODES)}"
    if isinstance(p.fragmentation, bool) or not isinstance(p.fragmentation, int | float):
        errors["fragmentation"] = f"fragmentation: {p.fragmentation!r} is not a number in [0, 1]"
    elif not 0.0 <= p.fragmentation <= 1.0:
        errors["fragmentation"] = f"fragmentation: {p.fragmentation} is not in [0, 1]"
    return errors


def _parsed(errors: dict[str, str], control: str, parse: Callable[[], list[int] | None]) -> list[int] | None:
    """``parse()``, or None with its refusal in words under ``control``."""
    try:
        return parse()
    except WorkbenchError as e:
        errors[control] = str(e)
        return None


def _typed_list(control: str, text: str) -> list[int] | None:
    """The integers typed in a text box; None for an empty box (random lengths, the engine's buckets)."""
    return parse_int_list(control, text) if text.strip() else None


def _too_many_lens(lens: list[int]) -> str:
    return (
        f"seq_lens: {len(lens):,} lengths typed, one request each; the explorer draws at most "
        f"{MAX_ROWS:,} rows ({LIMITS['raw_batch_size'][2]})"
    )


def _buckets(p: ExplorerParams) -> list[int] | None:
    """The typed bucket list (None: the engine's), each bucket at most ``MAX_ROWS``."""
    buckets = _typed_list("buckets", p.buckets)
    if buckets is None:
        return None
    if not buckets:
        raise MetadataError("buckets: no batch size typed; clear the box for the engine default", field="buckets")
    check_buckets(buckets)  # checked here, whatever the mode: extend pads nothing, yet the list is wrong
    for i, b in enumerate(buckets):
        if b > MAX_ROWS:  # a padded step is as tall as its bucket
            raise MetadataError(
                f"buckets[{i}] = {b:,}: the explorer draws every padded row, at most {MAX_ROWS:,}",
                field="buckets",
                row=i,
            )
    return buckets


def _size_errors(p: ExplorerParams, lens: list[int] | None) -> dict[str, str]:
    """Control -> why its size is out of ``LIMITS``: only the sizes the step reads (a typed list of lengths
    decides the batch size)."""
    used = {"pool_size": True, "raw_batch_size": lens is None and p.mode != "idle"}
    used["draft_tokens"] = used["topk"] = p.mode == "target_verify"
    errors = {}
    for name, (lo, hi, why) in LIMITS.items():
        if used[name]:
            try:
                check_int(name, getattr(p, name), lo, hi)
            except MetadataError as e:
                errors[name] = f"{e} ({why})"
    return errors


def _values(t: Any) -> str:
    return "-" if t is None else str(t.tolist())
