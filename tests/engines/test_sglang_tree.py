"""``engine-check sglang --topk K``: sglang 0.5.23's own backends verifying random draft trees on the CPU.

The adapter publishes ``speculative_eagle_topk`` K, hands each verify its tree as the EAGLE worker does (a real
``EagleVerifyInput``, int64 links) and reads back the links the backend passes through (eager) or copies into
its per-bucket buffers (replay), and the parents sglang's own conv kernel derives from them. Two planted faults
are caught, and sglang's Ascend GDN class is reported: its verify forward gives the NPU kernels nothing of the
tree. Needs the released engine (``make engines``); skipped visibly without it.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from workbench import Batch, StatePool, build_metadata
from workbench.cli import main
from workbench.engines import EngineError
from workbench.engines.check import engine_check
from workbench.engines.oracle import first_difference
from workbench.engines.registry import get_adapter
from workbench.engines.tree_check import tree_as_chain
from workbench.engines.versions import installed_version
from workbench.metadata import DraftTree, parents_from_links

ADAPTER = get_adapter("sglang")
pytestmark = [
    pytest.mark.engines,
    pytest.mark.skipif(
        installed_version("sglang") != ADAPTER.version,
        reason=f"sglang {ADAPTER.version} is not installed (found {installed_version('sglang')}); make engines",
    ),
]

BUCKETS = (1, 2, 4, 8)
TREE_FIELDS = ("retrieve_next_token", "retrieve_next_sibling", "retrieve_parent_token")
ASCEND = "sglang.srt.hardware_backend.npu.attention"
ASCEND_GDN = f"{ASCEND}.ascend_gdn_backend:AscendGDNAttnBackend"
EXAMPLE = [[-1, 0, 0, 1], [-1, 0, 1, 1]]  # two rows that branch: at the root, then below node 1


@pytest.fixture(scope="module")
def sg():
    """The adapter's module, its engine imported (the planted faults subclass its backend classes)."""
    module = sys.modules[ADAPTER.__module__]
    module.load()
    return module


def live_pool(profile: str = "sglang", n: int = 16) -> StatePool:
    pool = StatePool(64, profile)
    pool.alloc(n)
    return pool


# -- the engine's tree metadata ---------------------------------------------------------------------------


@pytest.mark.parametrize("layer", ["gdn", "mamba2", "kda"])
def test_eager_and_replay_carry_the_tree_and_the_parents_sglangs_kernel_derives(sg, layer):
    pool = live_pool()
    adapter = ADAPTER(pool, BUCKETS, 4, layer=layer, topk=2)
    assert adapter.backend.topk == 2  # read from the published config, as a server with topk 2 sets it
    assert set(TREE_FIELDS) <= set(adapter.compared_fields("target_verify"))
    tree = DraftTree.from_parents(EXAMPLE)
    rows = pool.live_rows[:2]
    batch = Batch.target_verify(rows, [40, 90], 4, tree=tree)
    eager = adapter.eager(batch)
    assert eager.retrieve_next_token.tolist() == tree.next_token.tolist()
    assert eager.retrieve_next_sibling.tolist() == tree.next_sibling.tolist()
    assert eager.retrieve_parent_token.tolist() == [[0, 0, 0, 1], [0, 0, 1, 1]]  # the kernel's, root entry 0
    assert first_difference(build_metadata(batch, pool), eager, adapter.compared_fields("target_verify")) is None
    replay = adapter.replay(batch, 4)
    assert replay.retrieve_next_token.dtype == torch.int32 and tuple(replay.retrieve_next_token.shape) == (4, 4)
    assert replay.retrieve_next_token[:2].tolist() == tree.next_token.tolist()
    assert replay.retrieve_next_token[2:].tolist() == [[0] * 4] * 2  # never written: the buffer's zeros
    assert replay.retrieve_parent_token[:2].tolist() == [[0, 0, 0, 1], [0, 0, 1, 1]]


def test_padded_rows_keep_the_links_of_the_last_replay_of_their_bucket(sg):
    pool = live_pool()
    adapter = ADAPTER(pool, BUCKETS, 4, topk=2)
    rows = pool.live_rows
    wide = DraftTree.random(4, 4, 2, seed=3)
    adapter.replay(Batch.target_verify(rows[:4], [50] * 4, 4, tree=wide), 4)
    narrow = adapter.replay(Batch.target_verify(rows[4:5], [50], 4, tree=DraftTree.chain(1, 4)), 4)
    assert narrow.retrieve_next_token[1:].tolist() == wide.next_token[1:].tolist()  # stale, as sglang leaves them
    assert (
        narrow.retrieve_parent_token[1:].tolist() == parents_from_links(wide.next_token, wide.next_sibling)[1:].tolist()
    )  # the kernel skips the padded rows (state -1): their parents are the old tree's


def test_the_parent_derivation_is_sglangs_kernel_and_skips_the_pad_slot(sg):
    tree_engine = sg.load_tree()
    tree = DraftTree.from_parents(EXAMPLE)
    parent = torch.full((3, 4), 7, dtype=torch.int64)
    nt = torch.cat([tree.next_token, torch.zeros(1, 4, dtype=torch.int64)])
    ns = torch.cat([tree.next_sibling, torch.zeros(1, 4, dtype=torch.int64)])
    state = torch.tensor([3, 5, -1], dtype=torch.int32)  # the third row on the pad slot
    sg.sglang_tree.derive_parents(tree_engine.conv, state, nt, ns, parent, num_slots=8)
    assert parent.tolist() == [[0, 0, 0, 1], [0, 0, 1, 1], [7, 7, 7, 7]]


def test_the_interpreter_splat_standin_is_still_needed(sg):
    """``TREE_STANDINS``' reason: without the fix, Triton's interpreter refuses the kernel's block mask (when
    this fails, Triton fixed it and the stand-in can go)."""
    conv = sg.load_tree().conv
    nt = torch.tensor([[1, -1]])
    with pytest.raises(Exception, match="mask has unsupported dtype"):
        conv.causal_conv1d_update(
            torch.zeros(1, 1, 2),
            torch.zeros(4, 1, 3),
            torch.zeros(1, 4),
            None,
            "silu",
            conv_state_indices=torch.tensor([1], dtype=torch.int32),
            retrieve_next_token=nt,
            retrieve_next_sibling=torch.full_like(nt, -1),
            retrieve_parent_token=torch.zeros_like(nt),
        )


# -- engine-check --topk 2 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("layer", ["gdn", "mamba2", "kda"])
def test_engine_check_topk_2_agrees(layer):
    result = engine_check(ADAPTER, layer=layer, topk=2, batches=4, replays=4)
    assert result.ok, str(result)
    assert (result.topk, result.draft_tokens) == (2, 4) and not result.tree_findings
    assert result.oracle is not None and result.oracle.batches["target_verify/replay"] == 4
    assert "drafts: random trees (topk 2), D 4" in str(result)


def test_engine_check_command_topk_2_json(capsys):
    assert main(["engine-check", "sglang", "--topk", "2", "--batches", "3", "--modes", "target_verify", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["topk"] == 2 and out["draft_tokens"] == 4 and out["tree_findings"] == []


def _replay_pads_links(base: type) -> type:
    class PadsLinksToBucket(base):
        """Copies links for every row of the bucket: the live rows', then -1 (a leaf) in each padded row."""

        def _replay_metadata(self, bs, req_pool_indices, forward_mode, spec_info, seq_lens_cpu, *args, **kwargs):
            meta = super()._replay_metadata(
                bs, req_pool_indices, forward_mode, spec_info, seq_lens_cpu, *args, **kwargs
            )
            links = getattr(spec_info, "retrieve_next_token", None)
            if forward_mode.is_target_verify() and links is not None:
                r = links.shape[0]
                self.retrieve_next_token_list[bs - 1][r:].fill_(-1)
                self.retrieve_next_sibling_list[bs - 1][r:].fill_(-1)
            return meta

    return PadsLinksToBucket


def _eager_drops_siblings(base: type) -> type:
    class DropsSiblings(base):
        """Passes the first-child links through and drops the sibling links (all -1)."""

        def init_forward_metadata(self, forward_batch):
            super().init_forward_metadata(forward_batch)
            sib = self.forward_metadata.retrieve_next_sibling
            if sib is not None:
                self.forward_metadata.retrieve_next_sibling = torch.full_like(sib, -1)

    return DropsSiblings


def test_a_replay_that_overwrites_the_padded_rows_links_is_caught(sg):
    result = engine_check(ADAPTER, backend_class=_replay_pads_links(sg.load().gdn), topk=2, batches=6, replays=2)
    assert not result.ok and result.oracle is not None
    found = [d for d in result.oracle.divergences if (d.mode, d.path) == ("target_verify", "replay")]
    assert found and found[0].field == "retrieve_next_token", str(result)
    d = found[0]
    assert d.row is not None and d.bucket is not None and d.got == [-1] * 4  # a padded row, the profile's stale
    assert "target_verify/eager" not in result.oracle.mismatched


def test_dropped_sibling_links_are_caught_with_the_wrong_parents(sg):
    adapter = ADAPTER(live_pool(), BUCKETS, 4, topk=2, backend_class=_eager_drops_siblings(sg.load().gdn))
    tree = DraftTree.from_parents(EXAMPLE)
    batch = Batch.target_verify(adapter.pool.live_rows[:2], [40, 90], 4, tree=tree)
    got = adapter.eager(batch)
    assert got.retrieve_parent_token.tolist() == [
        [0, 0, 0, 1],
        [0, 0, 1, 0],
    ]  # row 1's node 3 is node 2's sibling: its parent lost
    diff = first_difference(build_metadata(batch, adapter.pool), got, adapter.compared_fields("target_verify"))
    assert diff is not None and diff[:2] == ("retrieve_next_sibling", 0)
    result = engine_check(ADAPTER, backend_class=_eager_drops_siblings(sg.load().gdn), topk=2, batches=3, replays=2)
    assert not result.ok and result.oracle is not None
    assert result.oracle.mismatched.get("target_verify/eager") == 3, str(result)


# -- sglang's Ascend classes -----------------------------------------------------------------------------


def test_ascend_gdn_verifies_a_tree_as_a_chain(capsys):
    argv = ["engine-check", "sglang", "--topk", "2", "--batches", "2", "--backend", ASCEND_GDN, "--json"]
    assert main(argv) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["profile"] == "sglang-ascend" and out["topk"] == 2
    (finding,) = out["tree_findings"]
    assert finding["text"].startswith(
        "sglang-ascend: AscendGDNAttnBackend.forward_extend (target_verify) passes none of "
        "retrieve_next_token/retrieve_next_sibling/retrieve_parent_token to torch.ops.npu.causal_conv1d"
    )
    assert "torch.ops.npu.recurrent_gated_delta_rule" in finding["kernels"]
    assert finding["text"].endswith(
        "is verified as a chain (every kernel argument equals the one for a chain of the same rows)"
    )
    assert finding["parents"] != list(range(-1, 3))  # the row shown branches
    # the graph path raises first: Ascend's _replay_metadata reads spec_info.retrive_next_token (sic)
    failure = out["failure"]
    assert (
        failure["stage"] == "capture"
        and "'EagleVerifyInput' object has no attribute 'retrive_next_token'" in (failure["error"])
    )
    assert failure["call"].endswith("_replay_metadata") and "ascend_hybrid_linear_attn_backend.py:" in failure["call"]


def _ascend_gdn_passing_the_tree(tmp_path: Path):
    """A copy of sglang's Ascend GDN file whose verify conv gets the tree's parents (not a fix: enough to change
    what its kernels receive)."""
    installed = sys.modules[f"{ASCEND}.ascend_gdn_backend"]
    assert installed.__file__ is not None
    text = Path(installed.__file__).read_text()
    call = "                num_accepted_tokens=num_accepted_tokens,\n"
    assert text.count(call) == 1, "the verify conv call is not in the installed Ascend GDN file"
    path = tmp_path / "ascend_gdn_passing_the_tree.py"
    path.write_text(text.replace(call, call + "                retrieve_parent_token=retrieve_parent_token,\n"))
    spec = importlib.util.spec_from_file_location(f"ascend_gdn_tree_{id(tmp_path)}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.AscendGDNAttnBackend


def test_the_ascend_finding_is_computed_from_what_the_kernels_get(sg, tmp_path):
    released = sg.load_ascend()[1]
    pool = live_pool("sglang-ascend")
    finding = tree_as_chain(ADAPTER(pool, BUCKETS, 4, backend_class=released, topk=2), seed=5)
    assert finding is not None and finding.method == "AscendGDNAttnBackend.forward_extend"
    assert finding.kernels[0] == "torch.ops.npu.causal_conv1d"
    passing = _ascend_gdn_passing_the_tree(tmp_path)
    assert tree_as_chain(ADAPTER(pool, BUCKETS, 4, backend_class=passing, topk=2), seed=5) is None
    mamba2 = sg.load_ascend()[0]  # no verify forward of its own: nothing to drive
    assert tree_as_chain(ADAPTER(pool, BUCKETS, 4, backend_class=mamba2, layer="mamba2", topk=2), seed=5) is None


def test_ascend_mamba2_capture_raises_the_engines_own_error_under_topk_2(sg):
    result = engine_check(ADAPTER, backend_class=sg.load_ascend()[0], layer="mamba2", topk=2, batches=2)
    assert not result.ok and result.failure is not None and not result.tree_findings
    assert result.failure.error == "AttributeError: 'EagleVerifyInput' object has no attribute 'retrive_next_token'"


# -- refusals ------------------------------------------------------------------------------------------------


def test_vllm_and_bad_topk_are_refused_by_name():
    with pytest.raises(EngineError, match=r"topk: vllm verifies chains of drafts only \(vLLM removed tree attention"):
        engine_check(get_adapter("vllm"), topk=2)
    with pytest.raises(
        EngineError, match=r"draft_tokens: a tree \(topk 2\) needs D >= 3 draft tokens to branch, got 2"
    ):
        engine_check(ADAPTER, topk=2, draft_tokens=2)
    with pytest.raises(EngineError, match=r"topk: expected an int >= 1, got 0"):
        engine_check(ADAPTER, topk=0)
    with pytest.raises(SystemExit) as argparse_exit:
        main(["engine-check", "sglang", "--topk", "9"])
    assert argparse_exit.value.code == 2


def test_chains_stay_as_they_were(sg):
    """topk 1 publishes no topk and hands the chain's attribute bag: the released chain checks, unchanged."""
    adapter = ADAPTER(live_pool(), BUCKETS, 2)
    assert adapter.backend.topk == 0 and adapter.compared_fields("target_verify")[-1] != "retrieve_parent_token"
    got = adapter.eager(Batch.target_verify(adapter.pool.live_rows[:3], [9, 9, 9], 2))
    assert got.retrieve_next_token is None and got.retrieve_parent_token is None
