"""Tree drafts in traces (sglang's ``speculative_eagle_topk > 1``): the header's ``topk``, a verify row's
``tree``, a verify step's ``accept_index`` and ``last_correct_step_indices``.

Simulated tree traces replay clean for every layer and prefix cache; the state a tree verify commits is the
float64 chain recurrence over its accepted path's inputs (computed here from the token ids alone); each
tampering is named where it is: an accept_index off the tree and a tree swapped for a chain at the reader,
the depth committed as a node (sglang PR 27463) and a track node off the path (sglang PR 35821) at the replay.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from workbench import StatePool
from workbench.batch import Batch
from workbench.layers import FLOAT32_TOLERANCE, float64_reference, make_layer
from workbench.metadata import build_metadata
from workbench.profiles import get_profile
from workbench.traces import Trace, TraceHeader, TraceRow, TraceStep
from workbench.traces.cache_record import embed_tokens, embedding_table
from workbench.traces.config import SimConfig
from workbench.traces.format import TraceError, dumps_header, dumps_step, read_trace, write_trace
from workbench.traces.model import accepted_paths
from workbench.traces.replay import TraceInputError, TraceReplayer, replay_trace
from workbench.traces.simulate import _Scheduler, _Work, simulate
from workbench.traces.steps import SimulationError
from workbench.traces.strategies import Request

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/_cli_run.py
from _cli_run import run  # noqa: E402

D = 4
PROMPTS = {0: (11, 12, 13, 14, 15), 1: (21, 22, 23, 24, 25, 26)}
DRAFTS = {0: (31, 32, 33, 34), 1: (41, 42, 43, 44)}
TREES = {0: (-1, 0, 0, 1), 1: (-1, 0, 0, 2)}
PATHS = {0: (0, 1, 3), 1: (0, 2)}  # row 0 ends on node 3 at depth 2, row 1 on node 2 at depth 1
TRACK_SLOT = 4  # free: requests 0 and 1 run on slots 1 and 2
SMALL = (1, 2, 4, 8)  # captured buckets of the simulated traces: few captures, and eager steps above them


def hand_trace(layer: str = "gdn", metadata: dict | None = None, trees: dict | None = None) -> Trace:
    """Two requests prefill, then verify D = 4 tokens each as the trees of ``TREES``, accepting ``PATHS``;
    ``metadata``: more keys of the verify step (the accept_index is always there)."""
    trees = TREES if trees is None else trees
    header = TraceHeader(
        "sglang", layer, 8, {"decode": [1, 2], "target_verify": [1, 2]}, D, None, zero_on_alloc=True, topk=2
    )
    prefill = tuple(TraceRow(rid, rid + 1, rid + 1, len(ids), len(ids), 0, tokens=ids) for rid, ids in PROMPTS.items())
    verify = tuple(
        TraceRow(
            rid, rid + 1, rid + 1, len(ids) + D, D, len(ids), accepted=len(PATHS[rid]), tokens=DRAFTS[rid],
            tree=trees[rid],
        )
        for rid, ids in PROMPTS.items()
    )  # fmt: skip
    index = [[b * D + n for n in PATHS[rid]] + [-1] * (D - len(PATHS[rid])) for b, rid in enumerate(PROMPTS)]
    md = {"accept_index": index, **(metadata or {})}
    return Trace(
        header, [TraceStep(0, "extend", prefill, admit=(0, 1)), TraceStep(1, "target_verify", verify, metadata=md)]
    )


def reread(trace: Trace) -> Trace:
    """The trace through the file format (every line written and read back)."""
    return read_trace([dumps_header(trace.header), *(dumps_step(s) for s in trace.steps)])


def float64_state(layer_name: str, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 conv window and recurrent state after ``ids`` from zeros: the chain recurrence (one
    prefill over the ids' inputs, the replay's fixed embedding), with no tree anywhere."""
    layer = make_layer(layer_name, state_layout=get_profile("sglang").state_layout)
    ref = float64_reference(layer)
    x = embed_tokens(embedding_table(layer.config.hidden_size, layer.dtype), ids).double()
    pool = StatePool(2, "sglang")
    row = int(pool.alloc(1)[0])
    state = ref.new_state(2, dtype=torch.float64)
    ref.forward(x, build_metadata(Batch.extend([row], [len(ids)], [0]), pool, bucket=None), state, None)
    slot = pool.slots_of(row)[0]
    return state.conv[slot], state.ssm[slot]


# -- simulated traces ------------------------------------------------------------------------------------
def branched(trace: Trace) -> int:
    """Verify rows whose accepted path is not the chain's (node t at depth t): the tree mattered."""
    return sum(
        path != tuple(range(len(path)))
        for s in trace.steps
        if s.mode == "target_verify"
        for path in accepted_paths(s, trace.header).values()
    )


@pytest.mark.parametrize(
    ("profile", "layer"), [("sglang", "gdn"), ("sglang", "mamba2"), ("sglang", "kda"), ("sglang-ascend", "gdn")]
)
def test_simulated_tree_traces_replay_clean(profile, layer):
    trace = simulate(profile, layer, steps=30, spec=3, topk=2, seed=1, buckets=SMALL)
    assert trace.header.topk == 2 and branched(trace) > 0
    verify = [s for s in trace.steps if s.mode == "target_verify"]
    assert verify and all(r.tree is not None for s in verify for r in s.rows)
    assert all("accept_index" in (s.metadata or {}) for s in verify)
    result = replay_trace(trace)
    assert result.ok, str(result)
    assert result.graph_steps > 0


@pytest.mark.parametrize("cache", ["no_buffer", "extra_buffer"])
def test_simulated_tree_traces_with_a_prefix_cache_replay_clean(cache):
    trace = simulate("sglang", "gdn", steps=40, spec=3, topk=2, seed=0, prefix_cache=cache, buckets=SMALL)
    result = replay_trace(trace)
    assert result.ok, str(result)
    assert result.verified > 0 and branched(trace) > 0
    if cache == "extra_buffer":  # some verify tracks a node that is not its depth: the path's node was read
        off_depth = [
            (s.step, node)
            for s in trace.steps
            if s.mode == "target_verify" and "mamba_steps_to_track" in (s.metadata or {})
            for row, node in zip(s.rows, s.metadata["mamba_steps_to_track"], strict=True)
            if node >= 0 and accepted_paths(s, trace.header)[row.id].index(node) != node
        ]
        assert off_depth


def test_topk_one_draws_what_it_always_drew():
    chain = simulate("sglang", "gdn", steps=40, spec=3, seed=2)
    assert chain == simulate(SimConfig("sglang", steps=40, spec=3, seed=2, topk=1))
    assert all(r.tree is None for s in chain.steps for r in s.rows)
    assert '"topk"' not in dumps_header(chain.header)
    assert simulate("sglang", "gdn", steps=40, spec=3, topk=2, seed=2) == simulate(
        "sglang", "gdn", steps=40, spec=3, topk=2, seed=2
    )  # deterministic per seed


# -- what a tree verify commits --------------------------------------------------------------------------
@pytest.mark.parametrize("layer", ["gdn", "mamba2", "kda"])
def test_the_committed_state_is_the_chain_recurrence_over_the_accepted_path(layer):
    trace = reread(hand_trace(layer))
    replayer = TraceReplayer(trace)
    for step in trace.steps:
        assert replayer.step(step) == []
    tol = FLOAT32_TOLERANCE
    for rid, prompt in PROMPTS.items():
        ids = [*prompt, *(DRAFTS[rid][n] for n in PATHS[rid])]
        conv, ssm = float64_state(layer, ids)
        slot = rid + 1
        for got, want in ((replayer.runner.state.conv[slot], conv), (replayer.runner.state.ssm[slot], ssm)):
            torch.testing.assert_close(got.double(), want, atol=tol.atol, rtol=tol.rtol)
        # and not the chain over the first kept drafts (the tree made a difference)
        chain = float64_state(layer, [*prompt, *DRAFTS[rid][: len(PATHS[rid])]])[1]
        assert not torch.allclose(replayer.runner.state.ssm[slot].double(), chain, atol=1e-3)


def test_the_engines_commit_node_when_right_replays_clean():
    result = replay_trace(reread(hand_trace(metadata={"last_correct_step_indices": [3, 2]})))
    assert result.ok, str(result)


def test_the_depth_committed_as_the_node_is_named_pr_27463():
    result = replay_trace(reread(hand_trace(metadata={"last_correct_step_indices": [2, 1]})))
    first = result.first
    assert first is not None and (first.step, first.kind, first.field, first.row) == (1, "metadata", "accept", 0)
    assert first.detail == (
        "row 0: last_correct_step_indices = 2, but its accepted path [0, 1, 3] ends at node 3 (the depth read as "
        "a node: sglang PR 27463)"
    )
    assert (first.expected, first.got) == (3, 2)
    assert any(d.kind == "state" and d.field == "accept" for d in result.divergences)  # and what it did


# -- tracking at commit ----------------------------------------------------------------------------------
def tracked(node: int, tokens: int = 8) -> dict:
    """Row 0 tracks ``node`` into the free slot TRACK_SLOT at commit, which is then published as its first
    ``tokens`` tokens (5 prompt tokens and its 3 path tokens: node 3's state)."""
    return {
        "mamba_track_indices": [TRACK_SLOT, -1],
        "mamba_steps_to_track": [node, -1],
        "checkpoints": [{"request": 0, "tokens": tokens, "slot": TRACK_SLOT}],
    }


def test_a_tracked_node_on_the_path_holds_exactly_its_prefix():
    result = replay_trace(reread(hand_trace(metadata=tracked(3))))
    assert result.ok and result.verified == 1, str(result)
    # node 1, on the path at depth 1: the state of 5 + 2 tokens, published as such
    assert replay_trace(reread(hand_trace(metadata=tracked(1, tokens=7)))).ok


def test_a_track_node_off_the_path_is_named_pr_35821():
    result = replay_trace(reread(hand_trace(metadata=tracked(2))))
    first = result.first
    assert first is not None and (first.kind, first.field, first.request, first.slot) == ("prefix", "track", 0, 4)
    assert "node 2 is not on the accepted path [0, 1, 3]" in first.detail and "PR 35821" in first.detail
    # the slot got node 2's state (the path 0 -> 2): its checkpoint of 8 tokens is off too
    assert any(d.field == "checkpoint" for d in result.divergences)


def test_a_track_node_read_from_the_padding_is_named():
    md = {"mamba_track_indices": [-1, TRACK_SLOT], "mamba_steps_to_track": [-1, -1 - 1 * D]}  # b = 1: -1 - b * D
    result = replay_trace(reread(hand_trace(metadata=md)))
    first = result.first
    assert first is not None and (first.kind, first.field, first.request) == ("prefix", "track", 1)
    assert "mamba_steps_to_track[1] = -5" in first.detail and "[0, 2]" in first.detail and "PR 35821" in first.detail


# -- the reader ------------------------------------------------------------------------------------------
def lines_of(trace: Trace) -> list[str]:
    return [dumps_header(trace.header), *(dumps_step(s) for s in trace.steps)]


def refused(lines: list[str]) -> str:
    with pytest.raises(TraceError) as e:
        read_trace(lines)
    return str(e.value)


def edit(lines: list[str], index: int, change) -> list[str]:
    obj = json.loads(lines[index])
    change(obj)
    return [*lines[:index], json.dumps(obj), *lines[index + 1 :]]


def test_a_tree_trace_round_trips_through_the_file(tmp_path):
    trace = simulate("sglang", "gdn", steps=30, spec=3, topk=2, seed=1)
    path = tmp_path / "t.jsonl"
    write_trace(trace, path)
    assert read_trace(path) == trace
    first = path.read_text().splitlines()
    assert json.loads(first[0])["topk"] == 2 and '"tree":[-1,0,' in path.read_text()


def test_an_accept_index_off_the_tree_is_refused():
    lines = lines_of(hand_trace())

    def off(obj):
        obj["metadata"]["accept_index"][0] = [0, 2, 3, -1]  # 3's parent is 1

    assert refused(edit(lines, 2, off)) == (
        "line 3: metadata.accept_index[0][2]: expected a child of node 2 in verify row 0's tree "
        "(0 * D + node: none: it is a leaf, the path ends there (-1)), got 3"
    )

    def other_row(obj):
        obj["metadata"]["accept_index"][1] = [0, 2, -1, -1]  # row 0's ids in row 1's entry

    assert "metadata.accept_index[1][0]: expected 4 (the root of verify row 1: 1 * D + 0), got 0" in refused(
        edit(lines, 2, other_row)
    )
    bad = replace(hand_trace(), steps=[hand_trace().steps[0], replace(hand_trace().steps[1], metadata={})])
    with pytest.raises(TraceInputError, match=r"step 1: metadata.accept_index: expected one accepted path"):
        replay_trace(bad)  # a trace built in Python is held to the same rules


def test_a_tree_swapped_for_a_chain_in_the_rows_is_refused():
    lines = lines_of(hand_trace())

    def chain(obj):
        obj["rows"][0]["tree"] = None  # the chain: node 3 follows node 2

    assert "metadata.accept_index[0][2]: expected a child of node 1 in verify row 0's tree (0 * D + node: 2)" in (
        refused(edit(lines, 2, chain))
    )
    sim = simulate("sglang", "gdn", steps=30, spec=3, topk=2, seed=1, buckets=SMALL)
    swapped = replace(sim, steps=[replace(s, rows=tuple(replace(r, tree=None) for r in s.rows)) for s in sim.steps])
    with pytest.raises(TraceError, match=r"metadata\.accept_index\[\d+\]\[\d+\]: expected a child"):
        read_trace(lines_of(swapped))
    with pytest.raises(TraceInputError, match="accept_index"):
        replay_trace(swapped)


@pytest.mark.parametrize(
    ("index", "change", "expected"),
    [
        (2, lambda o: o["rows"][0].update(tree=[-1, 0, 2, 1]), "rows[0].tree[2]: expected a parent in 0..1"),
        (2, lambda o: o["rows"][0].update(tree=[-1, 0, 0]), "rows[0].tree: expected 4 parents"),
        (2, lambda o: o["rows"][0].update(tree=[-1, 0, 0, 0]), "at most topk = 2 children per node (node 0 has 3)"),
        (2, lambda o: o["rows"][0].update(accepted=2), "metadata.accept_index[0]: expected 2 node ids"),
        (2, lambda o: o["metadata"].update(accept_index=[[0, 1, 3, -1]]), "expected a list of 2 entries"),
        (2, lambda o: o["metadata"].update(accept_index=[[0, -1, 1, -1], [4, 6]]), "[0][2]: expected -1"),
        (2, lambda o: o.pop("metadata"), "metadata.accept_index: expected one accepted path per verify row"),
        (2, lambda o: o["metadata"].update(last_correct_step_indices=[3, 4]), "last_correct_step_indices[1]"),
        (1, lambda o: o["rows"][0].update(tree=[-1, 0, 1, 2, 3]), "rows[0].tree: expected null (only verify rows"),
        (0, lambda o: o.update(topk=1), "rows[0].tree: expected null or the chain (the header's topk is 1"),
        (0, lambda o: o.update(topk=0), "line 1: topk: expected an int >= 1, got 0"),
    ],
)
def test_the_reader_refuses(index, change, expected):
    assert expected in refused(edit(lines_of(hand_trace()), index, change))


def test_vllm_refuses_tree_drafts():
    lines = lines_of(hand_trace())
    message = refused(edit(lines, 0, lambda o: o.update(profile="vllm")))
    assert message.startswith('line 1: topk: expected 1 (profile "vllm" has no tree drafts: vLLM removed them')
    with pytest.raises(SimulationError, match=r"topk = 2: profile 'vllm' verifies chains only \(vLLM removed tree"):
        SimConfig("vllm", spec=3, topk=2)
    with pytest.raises(SimulationError, match="topk = 2: draft trees are verify rows; give spec"):
        SimConfig("sglang", topk=2)
    with pytest.raises(SimulationError, match="topk = 0: must be an int in"):
        SimConfig("sglang", spec=3, topk=0)
    assert (
        SimConfig("sglang", spec=3, topk=2)
        .summary()
        .startswith("sglang gdn: 200 steps, seed 0, spec 3 (draft trees, topk 2);")
    )


def test_the_schema_takes_tree_lines_and_refuses_vllms_topk():
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed: the schema is not checked")
    schema = json.loads((Path(__file__).resolve().parents[2] / "docs" / "trace.schema.json").read_text())
    check = jsonschema.Draft202012Validator(schema)
    lines = [json.loads(x) for x in lines_of(hand_trace(metadata={"last_correct_step_indices": [3, 2]}))]
    for obj in lines:
        check.validate(obj)
    assert not check.is_valid({**lines[0], "profile": "vllm"})
    extend = json.loads(json.dumps(lines[1]))
    extend["rows"][0]["tree"] = [-1, 0, 1, 2, 3]
    assert not check.is_valid(extend)


@pytest.mark.slow  # a tree trace run and checked through the CLI
def test_trace_run_with_topk_writes_a_trace_that_checks(tmp_path):
    out = tmp_path / "t.jsonl"
    argv = ["trace", "run", "--profile", "sglang", "--spec", "3", "--topk", "2", "--steps", "20", "--out", str(out)]
    code, text, err = run(argv)
    assert code == 0 and text.startswith("OK: sglang gdn: 20 steps"), (text, err)
    code, text, err = run(["trace", "check", str(out)])
    assert code == 0 and text.startswith("OK"), (text, err)
    assert read_trace(out).header.topk == 2
    code, _, err = run(["trace", "run", "--profile", "vllm", "--spec", "3", "--topk", "2"])
    assert code == 2 and "topk = 2: profile 'vllm' verifies chains only (vLLM removed tree drafts)" in err
    code, _, err = run(["trace", "run", "--scheduler", "sglang", "--spec", "3", "--topk", "2"])
    assert code == 2 and "--topk 2: the sglang scheduler's driver records chains" in err
    code, _, err = run(["trace", "run", "--topk", "0"])
    assert code == 2 and "--topk" in err


def test_a_simulated_request_keeps_the_ids_of_its_path():
    """What the simulator's prefix cache learns of a request (its kept ids: later hits and next turns are made
    of them) is the ids of its accepted path's nodes, not its first kept drafts."""
    config = SimConfig("sglang", spec=D, topk=2, prefix_cache="no_buffer", seed=0)
    plan = config.plan
    pool = StatePool(plan.num_slots, plan.profile)
    rng = random.Random(0)
    assert plan.strategy is not None and plan.cache is not None
    sched = _Scheduler(pool, rng, plan.strategy.create(pool, rng, plan.cache), config)
    req = Request(0, prompt_len=2, output_len=9, cached=2, sampled=1, fed=[5, 6], pending=7)
    work = _Work(decoders=[req], accepted=[3], fed_decoders=[(7, 100, 101, 102)])
    work.trees, work.paths = [(-1, 0, 0, 2)], [(0, 2, 3)]
    sched._advance(work)
    assert req.fed == [5, 6, 7, 101, 102] and req.cached == 5 and req.path == (0, 2, 3)
