"""``engine_check``: a backend class of an installed engine, as oracle and as subject, in one result.

1. The oracle: random batches of each mode through the engine's code and the workbench's profile
   (:func:`~workbench.engines.oracle.compare`).
2. The subject: :class:`~workbench.runner.GraphRunner` with the engine's backend class behind its hooks
   (:func:`~workbench.engines.subject.engine_backend`) captures every bucket on the CPU recorder (the
   engine's ``in_capture=True`` path) and replays random batches (its replay path), each compared with the
   same padded step run eagerly and with the float64 reference, integrity included.

3. vLLM only: a second KV-cache group of the layer on random batches (decode, target_verify, extend; eager
   and replay), its state indices as the runner makes them (``update_block_table`` where the runner calls
   it) against ``build()`` on the group's own block table (:func:`~workbench.engines.oracle.compare_groups`).

4. ``topk`` K > 1 (sglang): the verify batches of all three carry random draft trees (``DraftTree.random``,
   from the check's seed), compared with the profile's tree fields; and where the adapter drives the class's
   verify forward (``verify_forward``: the Ascend classes), :func:`~workbench.engines.tree_check.tree_as_chain`
   says whether the trees reach its kernels. An engine without tree verify (vLLM) refuses K > 1 by name.

An engine error (a ``TypeError`` from the engine's call of an override: the seed) is the finding, with the
call and the batch; it is never swallowed into "OK". ``runner`` picks vLLM's model runner (``"v2"``, its
default, or ``"v1"``); sglang has none and refuses one.
"""

from __future__ import annotations

import random
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench import html
from workbench.batch import Batch
from workbench.engines.base import EngineAdapter, EngineError, check_topk, probe_pool
from workbench.engines.oracle import ORACLE_MODES, Divergence, OracleResult, compare, compare_groups, random_batch
from workbench.engines.subject import EngineBackend, engine_backend
from workbench.engines.tree_check import TreeAsChain, tree_as_chain
from workbench.layer_names import DEFAULT_LAYER
from workbench.layers import LayerError, make_layer
from workbench.pool import StatePool
from workbench.profiles import get_profile
from workbench.runner import GraphRunner

DEFAULT_BUCKETS = (1, 2, 4, 8)
CAPTURED = ("decode", "target_verify")
CHAIN_DRAFT_TOKENS = 2


def draft_tokens_for(topk: int) -> int:
    """The D a check verifies with by default: 2 for chains; ``2 * topk`` for trees (room for the root's
    ``topk`` children and a level below them)."""
    return CHAIN_DRAFT_TOKENS if topk < 2 else 2 * topk


@dataclass
class EngineFailure:
    """An error the engine's code raised: where (capture, replay, eager, oracle), the call, the message."""

    stage: str
    error: str  # "TypeError: ... got an unexpected keyword argument 'in_capture'"
    call: str  # the innermost frame of the engine's code that raised, file:line in function
    batch: str = ""

    def __str__(self) -> str:
        where = f" ({self.batch})" if self.batch else ""
        return f"{self.stage}{where}: {self.error}\n    at {self.call}"


@dataclass
class EngineCheck:
    """The outcome of :func:`engine_check`."""

    label: str
    profile: str
    oracle: OracleResult | None = None
    runner: str | None = None  # vLLM's model runner the adapter emulated; None: the engine has no choice
    topk: int = 1  # the drafts' branching factor: 1 chains, K > 1 random trees
    draft_tokens: int = CHAIN_DRAFT_TOKENS
    groups: OracleResult | None = None  # the second KV-cache group (vLLM)
    captured: list[tuple[str, int]] = field(default_factory=list)
    replays: int = 0
    replay_failures: list[str] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)
    tree_findings: list[TreeAsChain] = field(default_factory=list)
    failure: EngineFailure | None = None
    seconds: float = 0.0

    @property
    def drafts(self) -> str:
        """``"chains (topk 1), D 2"`` / ``"random trees (topk 2), D 4"``: what the verify batches drafted."""
        kind = "chains" if self.topk < 2 else "random trees"
        return f"{kind} (topk {self.topk}), D {self.draft_tokens}"

    @property
    def ok(self) -> bool:
        """Capture and replay ran, agree with the profile, and lost nothing; no engine error; a tree reaches
        the verify kernels (``topk`` > 1)."""
        oracle_ok = (self.oracle is None or self.oracle.ok) and (self.groups is None or self.groups.ok)
        clean = not self.replay_failures and not self.divergences and not self.tree_findings
        return self.failure is None and oracle_ok and clean

    def summary(self) -> str:
        if self.failure is not None:
            return f"FAIL: {self.label}: the engine raised at {self.failure.stage}"
        if self.ok:
            return (
                f"OK: {self.label}: captured {len(self.captured)} graphs, {self.replays} replays clean and equal to "
                f"the profile {self.profile!r}"
            )
        return f"FAIL: {self.label}: differs from the profile {self.profile!r} or lost state"

    def __str__(self) -> str:
        lines = []
        if self.oracle is not None:
            lines.append(f"oracle: {self.oracle}")
        if self.groups is not None:
            lines.append(f"second KV-cache group ({self.runner}): {self.groups}")
        if self.captured:
            lines.append("captured: " + ", ".join(f"{m} {b}" for m, b in self.captured))
        lines.append(f"drafts: {self.drafts}")
        lines += [f"replay: {text}" for text in self.replay_failures]
        lines += [f"differs: {d}" for d in self.divergences[:10]]
        lines += [f"tree: {finding}" for finding in self.tree_findings]
        if self.failure is not None:
            lines.append(f"engine error at {self.failure}")
        lines.append(self.summary())
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "engine": self.label,
            "profile": self.profile,
            "runner": self.runner,
            "topk": self.topk,
            "draft_tokens": self.draft_tokens,
            "oracle": self.oracle.to_dict() if self.oracle else None,
            "second_group": self.groups.to_dict() if self.groups else None,
            "captured": [list(c) for c in self.captured],
            "replays": self.replays,
            "replay_failures": list(self.replay_failures),
            "divergences": [str(d) for d in self.divergences],
            "tree_findings": [f.to_dict() for f in self.tree_findings],
            "failure": None if self.failure is None else self.failure.__dict__,
            "seconds": round(self.seconds, 3),
        }

    def _repr_html_(self) -> str:
        parts = [html.badge(self.ok, self.summary())]
        if self.failure is not None:
            parts.append(html.note(str(self.failure)))
        if self.oracle is not None:
            parts.append(self.oracle._repr_html_())
        if self.groups is not None:
            parts.append(self.groups._repr_html_())
        parts += [html.note(text) for text in self.replay_failures]
        parts += [html.note(str(f), fail=True) for f in self.tree_findings]
        return html.block(*parts, title="Engine check")


def _engine_frame(exc: BaseException) -> str:
    """The innermost frame of the traceback outside the workbench: the engine's call that raised."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/workbench/" not in f.filename]
    frame = frames[-1] if frames else traceback.extract_tb(exc.__traceback__)[-1]
    return f"{frame.filename}:{frame.lineno} in {frame.name}"


def _layer(name: str, profile: str) -> Any:
    """The small ``name`` layer (seed 0), as a trace replays, its state in ``profile``'s layout; an unknown
    name is an ``EngineError``."""
    try:
        return make_layer(name, state_layout=get_profile(profile).state_layout)
    except LayerError as e:
        raise EngineError(str(e)) from None


def engine_check(
    adapter_class: type[EngineAdapter],
    *,
    backend_class: type | None = None,
    layer: str = DEFAULT_LAYER,
    modes: Sequence[str] = ORACLE_MODES,
    batches: int = 200,
    replays: int = 8,
    buckets: Sequence[int] = DEFAULT_BUCKETS,
    draft_tokens: int | None = None,
    seed: int = 0,
    runner: str | None = None,
    topk: int = 1,
) -> EngineCheck:
    """Check the engine's ``layer`` backend (or ``backend_class``) as oracle and subject; see the module.
    ``runner``: vLLM's model runner to emulate (None: the adapter's default, ``"v2"``). ``topk``: 1 verifies
    chains; K > 1 random trees (an engine with tree verify: sglang). ``draft_tokens``: D (default
    :func:`draft_tokens_for` ``topk``)."""
    for mode in modes:
        if mode not in ORACLE_MODES:
            raise EngineError(f"modes: {mode!r} is not one of {ORACLE_MODES}")
    d = draft_tokens_for(topk) if draft_tokens is None else draft_tokens
    check_topk(adapter_class, topk, d)
    adapter_class = _with_runner(adapter_class, runner)
    start = time.perf_counter()
    kw: dict[str, Any] = {"layer": layer, "backend_class": backend_class, "topk": topk}
    probe = adapter_class(probe_pool(adapter_class, d), buckets, d, **kw)
    profile = probe.profile
    pool = StatePool(64, profile, slots_per_request=get_profile(profile).slots_per_request(d))
    pool.alloc(min(pool.capacity, 2 * max(buckets)))
    result = EngineCheck(probe.label, profile, runner=getattr(probe, "runner", None), topk=topk, draft_tokens=d)
    stage = "oracle"
    try:
        _subject(result, adapter_class, backend_class, layer, modes, replays, buckets, d, profile, seed, topk)
        if result.failure is None:  # the oracle after: a capture that raises is the finding, as in the engine
            adapter = adapter_class(pool, buckets, d, **kw)
            result.oracle = compare(adapter, modes=modes, batches=batches, seed=seed)
            if hasattr(adapter, "second_group"):
                stage = "second_group"
                group_modes = [m for m in modes if m != "idle" and (m != "target_verify" or d >= 2)]
                result.groups = compare_groups(adapter, modes=group_modes, batches=batches, seed=seed)
    except EngineError:
        raise
    except Exception as exc:  # noqa: BLE001 - the engine's own error is the finding
        result.failure = EngineFailure(stage, f"{type(exc).__name__}: {exc}", _engine_frame(exc))
    if topk > 1 and "target_verify" in modes:
        _tree_forward(result, adapter_class(pool, buckets, d, **kw), seed)
    result.seconds = time.perf_counter() - start
    return result


def _tree_forward(result: EngineCheck, adapter: EngineAdapter, seed: int) -> None:
    """Whether the trees reach the class's verify kernels (:func:`tree_as_chain`), run even after a failure
    elsewhere: it drives the eager forward, a path of its own. Its own engine error is the failure when there
    is none yet (the first error is the finding)."""
    try:
        finding = tree_as_chain(adapter, seed=seed)
    except EngineError:
        raise
    except Exception as exc:  # noqa: BLE001
        if result.failure is None:
            result.failure = EngineFailure("tree_forward", f"{type(exc).__name__}: {exc}", _engine_frame(exc))
        return
    if finding is not None:
        result.tree_findings.append(finding)


def _with_runner(adapter_class: type[EngineAdapter], runner: str | None) -> type[EngineAdapter]:
    """``adapter_class`` whose instances emulate ``runner`` (vLLM's model runner); refused, by name, for an
    engine without runners to choose (sglang)."""
    if runner is None:
        return adapter_class
    runners = getattr(adapter_class, "RUNNERS", None)
    if runners is None:
        raise EngineError(f"runner: {adapter_class.engine} has no model runner to choose (got {runner!r})")
    if runner not in runners:
        raise EngineError(f"runner: {runner!r} is not one of {tuple(runners)}")
    base: Any = adapter_class

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("runner", runner)
        base.__init__(self, *args, **kwargs)

    attrs = {"__init__": __init__, "__module__": adapter_class.__module__, "__doc__": adapter_class.__doc__}
    return type(adapter_class.__name__, (adapter_class,), attrs)


def _subject(
    result: EngineCheck,
    adapter_class: type[EngineAdapter],
    backend_class: type | None,
    layer: str,
    modes: Sequence[str],
    replays: int,
    buckets: Sequence[int],
    draft_tokens: int,
    profile: str,
    seed: int,
    topk: int = 1,
) -> None:
    """Capture every bucket through the engine's backend, then replay random batches, each compared."""
    graph_modes = [m for m in CAPTURED if m in modes] or ["decode"]
    runner = GraphRunner(
        _layer(layer, profile),
        StatePool(64, profile, slots_per_request=get_profile(profile).slots_per_request(draft_tokens)),
        buckets=list(buckets),
        modes=graph_modes,
        backend="cpu",
        metadata_backend=engine_backend(adapter_class, layer=layer, backend_class=backend_class, topk=topk),
        draft_tokens=draft_tokens,
        state_seed=1,
        tree=topk > 1,
    )
    graph_modes = list(runner.modes)  # the layer's own graph modes
    runner.pool.alloc(min(runner.pool.capacity, 2 * max(buckets)))
    try:
        runner.capture(progress=False)
    except EngineError:
        raise
    except Exception as exc:  # noqa: BLE001 - the seed: the engine's capture call raises
        result.failure = EngineFailure("capture", f"{type(exc).__name__}: {exc}", _engine_frame(exc))
        return
    result.captured = list(runner.captured)
    rng = random.Random(seed + 1)
    backend: EngineBackend = runner.meta_backend  # type: ignore[assignment]
    for i in range(replays):
        mode = graph_modes[i % len(graph_modes)]
        batch = random_batch(backend.adapter, mode, rng, max(buckets))
        try:
            comparison = runner.compare(batch, _inputs(runner, batch, seed + i))
        except EngineError:
            raise
        except Exception as exc:  # noqa: BLE001
            result.failure = EngineFailure("replay", f"{type(exc).__name__}: {exc}", _engine_frame(exc), str(batch))
            return
        result.replays += 1
        if not comparison.ok:
            problems = comparison.integrity.problems()[:2]
            what = "; ".join(" ".join(str(x) for x in p[:3]) for p in problems) if problems else ""
            what = what or "replay != the profile's padded step run eagerly (bitwise)"
            result.replay_failures.append(f"{mode} bs={batch.raw_batch_size}: {what}")
    result.divergences = list(backend.divergences)


def _inputs(runner: GraphRunner, batch: Batch, seed: int) -> Any:
    import torch

    n = batch.raw_batch_size * (runner.draft_tokens if batch.mode == "target_verify" else 1)
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, runner.layer.config.hidden_size, generator=g).to(runner.layer.dtype)
