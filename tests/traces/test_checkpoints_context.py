"""The replay's checkers on their own (issue 28): the step context they read, the record they share, the one
float32 tolerance; no replayer anywhere (a small pool and a layer's states, built here)."""

from __future__ import annotations

import ast
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest
import torch

from workbench.layers import FLOAT32_TOLERANCE, make_layer
from workbench.measure.integrity import DEFAULT_ATOL, DEFAULT_RTOL
from workbench.pool import StatePool
from workbench.traces.cache_record import CacheRecord, Checkpoint
from workbench.traces.context import StepContext, VerifiedIntermediates
from workbench.traces.model import TraceStep

ROOT = Path(__file__).resolve().parents[2]
CHECKERS = ("checkpoints", "tracking", "cache_record", "context", "divergence")


@pytest.fixture
def world():
    layer = make_layer("gdn")
    pool = StatePool(6, "sglang")
    rows = [int(r) for r in pool.alloc(2)]  # requests 7 and 8
    state = layer.new_state(6)
    ctx = StepContext(
        step=TraceStep(0, "decode", (), (), ()),
        pool=pool,
        state=state,
        shadow=state.to(torch.float64),
        layer=layer,
        reference=layer.to(torch.float64),
        draft_tokens=1,
        live={7: rows[0], 8: rows[1]},
        accepted={},
    )
    return ctx, CacheRecord(layer, ctx.reference, pool.profile)


def test_the_context_answers_who_owns_a_slot_and_is_frozen(world):
    ctx, _ = world
    (a,), (b,) = ctx.slots_of(7), ctx.slots_of(8)
    assert ctx.owner(a) == 7 and ctx.owner(b) == 8 and ctx.owner(5) is None
    assert ctx.dummy_slot == 0 and not ctx.in_pool(0) and not ctx.in_pool(6) and not ctx.in_pool(-1)
    assert ctx.in_pool(a)
    with pytest.raises(FrozenInstanceError):
        ctx.step = TraceStep(1, "idle", (), (), ())
    ctx.reset_accepted(7)
    assert ctx.accepted == {7: 1}  # the replay's own mapping: it sees the reset


def test_after_the_forward_the_context_holds_what_it_ran_on(world):
    ctx, _ = world
    assert (ctx.batch, ctx.inputs, ctx.before, ctx.verified, dict(ctx.read_columns)) == (None, None, None, None, {})
    columns = {7: 0}
    inter = make_layer("gdn").new_intermediate(1, 2)
    after = ctx.after_forward(
        batch=None,
        inputs=torch.zeros(1, 4),
        before=(ctx.state, ctx.shadow),
        read_columns=columns,
        verified=VerifiedIntermediates([1], inter, inter),
    )
    columns[7] = 1  # the replayer's next step: not this one's
    assert after.read_columns == {7: 0} and after.verified is not None and after.verified.rows == [1]
    assert after.step is ctx.step and after.live is ctx.live and ctx.inputs is None


def test_the_record_labels_slots_and_says_which_may_not_be_written(world):
    ctx, rec = world
    (a,) = ctx.slots_of(7)
    rec.label(4, (1, 2))
    rec.label(3, None)
    assert rec.labels == {4: (1, 2)}
    rec.label(4, None)
    assert rec.labels == {}
    rec.history[7], rec.from_zeros[7] = [5, 6], True
    rec.history[8], rec.from_zeros[8] = [5, 6], False
    assert rec.known_ids(7) == [5, 6] and rec.known_ids(8) is None and rec.known_ids(9) is None
    rec.live[4] = Checkpoint(7, (5,), 4, 0)
    assert rec.kept_slot(ctx, 4, after=False) == "overwrites the live checkpoint in slot 4 (request 7, 1 tokens)"
    assert rec.kept_slot(ctx, a, after=False) is None
    assert (
        rec.kept_slot(ctx, a, after=True)
        == "writes the running slot of request 7, replacing the state its step computed"
    )


def test_prefix_states_are_recomputed_once_and_compared_at_the_one_tolerance(world):
    ctx, rec = world
    conv, ssm = rec.prefix_state((1, 2, 3))
    assert conv.dtype == ssm.dtype == torch.float64 and ssm.abs().sum() > 0
    assert rec.has_prefix((1, 2, 3)) and rec.prefix_state((1, 2, 3))[1] is ssm  # cached
    rec.set_shadow(ctx.shadow, 5, (1, 2, 3))
    ctx.state.conv[5], ctx.state.ssm[5] = conv.float(), ssm.float()
    assert rec.compare(ctx.state, 5, (1, 2, 3)) is None
    ctx.state.ssm[5].view(-1)[0] += 3 * FLOAT32_TOLERANCE.atol + FLOAT32_TOLERANCE.rtol * float(ssm.view(-1)[0].abs())
    name, err = rec.compare(ctx.state, 5, (1, 2, 3))
    assert name == "recurrent state" and err > FLOAT32_TOLERANCE.atol
    rec.forget_prefixes()
    assert not rec.has_prefix((1, 2, 3))


def test_one_float32_tolerance_for_the_replay_and_the_integrity_check():
    assert (DEFAULT_ATOL[torch.float32], DEFAULT_RTOL[torch.float32]) == FLOAT32_TOLERANCE
    for name in ("replay", "checkpoints", "cache_record"):
        text = (ROOT / "workbench" / "traces" / f"{name}.py").read_text()
        assert "e-4" not in text and "e-3" not in text  # no tolerance of their own


@pytest.mark.parametrize("name", CHECKERS)
def test_the_checkers_never_import_the_replay(name):
    tree = ast.parse((ROOT / "workbench" / "traces" / f"{name}.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "workbench.traces.replay" not in imported


@pytest.mark.parametrize("name", ("replay", "checkpoints", "tracking", "cache_record", "budget"))
def test_no_engine_name_is_compared_in_the_replay(name):
    text = (ROOT / "workbench" / "traces" / f"{name}.py").read_text()
    assert not any(f'{op} "{engine}"' in text for op in ("==", "!=") for engine in ("vllm", "sglang"))
