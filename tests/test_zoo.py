"""The bug zoo: every case breaks unfixed and is clean fixed, and each shows the evidence its mechanism
predicts (the slot, the row, the keyword, the op and the line)."""

import inspect
import json
import math
import textwrap
from html.parser import HTMLParser

import pytest
import torch

from workbench import contracts, zoo
from workbench.cli import main
from workbench.measure.integrity import IntegrityReport
from workbench.zoo import contract_drift, host_value, in_capture
from workbench.zoo.result import (
    AddressMismatch,
    IntegrityEvidence,
    Propagation,
    RaisedError,
    RecorderError,
    RowsDiffer,
    Survived,
    TraceEvidence,
    ZooError,
    ZooResult,
)

NAMES = [
    "in_capture",
    "contract_drift",
    "dummy_slot",
    "stale_rows",
    "sentinel_guard",
    "verify_alias",
    "uninit_pad",
    "host_value",
    "tail_slice",
    "rebuilt_tensors",
    "fill_count",
    "slot_reuse",
    "dp_dummy_rows",
    "chunk_initial_state",
    "prefix_over_reuse",
    "publish_before_write",
    "unwritten_track_slot",
    "stale_track_mask",
    "mamba2_chunk_grid",
    "backward_post_copy",
    "running_block_publish",
    "transposed_state_read",
    "kda_sentinel_rows",
    "kda_frozen_accept_lists",
    "tree_as_chain",
    "tree_commit_depth",
    "tree_track_unclamped",
    "ghost_node_cow",
]


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[ZooResult, ZooResult]]:
    """Every case run once each way on the CPU recorder (shared by the tests below)."""
    return {b.case: (b, f) for b, f in zoo.run_all(backend="cpu")}


def one(evidence, kind):
    found = [e for e in evidence if isinstance(e, kind)]
    assert len(found) == 1, f"expected one {kind.__name__} in {evidence}"
    return found[0]


# -- every case -----------------------------------------------------------------------------------------
def test_registry_is_ordered_and_complete():
    assert zoo.names() == NAMES
    for case in zoo.cases():
        assert zoo.get(case.name) is case
        assert case.issue and case.title and case.profile in ("sglang", "sglang-ascend", "vllm")
        assert len(case.explanation.split()) > 60  # a paragraph: mechanism, engine, fix


@pytest.mark.parametrize("name", NAMES)
def test_unfixed_breaks_and_fixed_is_clean(runs, name):
    broken, fixed = runs[name]
    assert (broken.case, broken.fixed, fixed.fixed) == (name, False, True)
    assert broken.broken, broken
    assert not fixed.broken, fixed
    assert fixed.summary == "clean"
    assert any(e.broken for e in broken.evidence)
    assert not any(e.broken for e in fixed.evidence)
    # the fixed run did something checkable: an integrity report of a real step, or a whole trace replayed
    checked = [e for e in fixed.evidence if isinstance(e, IntegrityEvidence | TraceEvidence)]
    assert checked, fixed.evidence
    for e in checked:
        assert e.report.ok if isinstance(e, IntegrityEvidence) else (e.steps == e.total > 0)
    for r in (broken, fixed):
        json.dumps(r.to_dict())  # JSON-ready
        assert r.to_dict()["broken"] is r.broken
        assert name in repr(r) and r.issue in repr(r)


class _Shown(HTMLParser):
    """A rendered result: the verdict badge (class, text) and the evidence table's cells (class, text)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.badges: list[tuple[str, str]] = []
        self.rows: list[list[tuple[str, str]]] = []
        self._open: tuple[str, list[str]] | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        cls = dict(attrs).get("class") or ""
        if tag == "tr":
            self.rows.append([])
        if tag in ("td", "span"):
            self._open = (tag, [cls])

    def handle_data(self, data):
        if self._open is not None:
            self._open[1].append(data)

    def handle_endtag(self, tag):
        if self._open is not None and tag == self._open[0]:
            cls, *text = self._open[1]
            (self.rows[-1] if tag == "td" else self.badges).append((cls, "".join(text)))
            self._open = None


def test_html_shows_broken_in_red_and_clean_in_green(runs):
    broken, fixed = runs["stale_rows"]
    for res, verdict in ((broken, ("wb-fail", "broken")), (fixed, ("wb-ok", "clean"))):
        shown = _Shown(res._repr_html_())
        assert shown.badges[0] == verdict
        rows = [r for r in shown.rows if r]  # the header row has no td
        assert len(rows) == len(res.evidence)
        for (kind, state, what), e in zip(rows, res.evidence, strict=True):
            assert kind[1] == type(e).__name__ and what[1] == e.summary()
            assert state == (("wb-fail", "broken") if e.broken else ("wb-ok", "clean"))


def test_html_escapes_what_the_evidence_says():
    res = ZooResult("x<y>", "issue <1>", False, (RaisedError("TypeError", "got <script>"),), "mechanism & <fix>")
    text = res._repr_html_()
    assert "<script>" not in text and "<fix>" not in text and "<y>" not in text
    assert "got &lt;script&gt;" in text and "mechanism &amp; &lt;fix&gt;" in text
    assert [r for r in _Shown(text).rows if r][0][2] == ("", "TypeError: got <script>")  # the text, unescaped back


def test_broken_is_computed_from_the_evidence():
    clean = IntegrityEvidence("step", IntegrityReport())
    dirty = IntegrityEvidence("step", IntegrityReport(changed_slots=[("ssm", 3)]))
    assert not ZooResult("x", "i", True, (clean, Survived("ok")), "e").broken
    assert ZooResult("x", "i", True, (clean, dirty), "e").broken
    assert ZooResult("x", "i", False, (RaisedError("TypeError", "m"),), "e").broken
    assert (
        not RowsDiffer("state_indices", []).broken and RowsDiffer("state_indices", [2], got=[-1], expected=[3]).broken
    )
    assert not AddressMismatch("f", 1, 1).broken and AddressMismatch("f", 1, 2).broken


def test_bad_arguments_are_named():
    with pytest.raises(ZooError, match="no zoo case named 'nope'; choose from in_capture"):
        zoo.get("nope")
    with pytest.raises(ZooError, match="fixed: expected a bool"):
        zoo.get("fill_count").run("yes")  # type: ignore[arg-type]
    with pytest.raises(ZooError, match="backend: 'tpu'"):
        zoo.get("fill_count").run(True, backend="tpu")


def test_default_backend_runs_here():
    ((broken, fixed),) = zoo.run_all(["fill_count"])
    assert broken.broken and not fixed.broken


# -- the evidence each mechanism predicts -----------------------------------------------------------------
def test_in_capture_evidence(runs, tmp_path):
    broken, fixed = runs["in_capture"]
    err = one(broken.evidence, RaisedError)
    assert err.type == "TypeError" and "unexpected keyword argument 'in_capture'" in err.message
    assert "decode bucket 4, the first bucket" in err.where  # capture goes largest first and dies at once
    assert one(fixed.evidence, Survived).what == "captured 3 graphs"
    # what check-contracts says of the same override, from its source, without running it
    path = tmp_path / "ascend_backend.py"
    head = "from workbench.backends import NpuMetadataBackend\nfrom workbench.batch import Batch\n"
    head += "from workbench.metadata import Metadata\n\n"
    source = inspect.getsource(in_capture.backend_class(False))
    assert contracts.IGNORE in source  # the zoo's deliberate bug keeps the project's own check green
    path.write_text(head + textwrap.dedent(source.replace(f"  # {contracts.IGNORE} (the zoo's bug)", "")))
    (finding,) = contracts.check(str(path), "workbench.backends:MetadataBackend").findings
    assert finding.method == "init_forward_metadata_out_graph" and "'in_capture'" in finding.message
    fixed_path = tmp_path / "ascend_backend_fixed.py"  # another module name: the first one was imported
    fixed_path.write_text(head + textwrap.dedent(inspect.getsource(in_capture.backend_class(True))))
    assert contracts.check(str(fixed_path), "workbench.backends:MetadataBackend").ok


def test_contract_drift_evidence(runs, tmp_path):
    broken, fixed = runs["contract_drift"]
    survived, err = broken.evidence
    assert isinstance(survived, Survived) and survived.what.startswith("earlier base: captured")
    assert isinstance(err, RaisedError) and "unexpected keyword argument 'mamba_track_indices'" in err.message
    assert [e.what for e in fixed.evidence if isinstance(e, Survived)] == [
        "earlier base: captured 2 graphs",
        "later base: captured 2 graphs",
    ]
    # check-contracts follows the base's own call of the private hook: it finds the one-keyword
    # override and passes the **kwargs one
    path = tmp_path / "ascend_drift.py"
    src = "from typing import Any\nfrom workbench.zoo.contract_drift import LaterBase as base\n"
    src += "from workbench.batch import Batch\nfrom workbench.metadata import Metadata\n\n"
    for fixed_variant in (False, True):
        src += textwrap.dedent(inspect.getsource(contract_drift.backend_class(fixed_variant))) + "\n\n"
    path.write_text(src)
    rep = contracts.check(str(path), "workbench.zoo.contract_drift:LaterBase")  # the base's calls on self
    (finding,) = rep.findings
    assert finding.cls == "AscendOneKeywordFix" and finding.method == "_replay_metadata"
    assert "'mamba_track_indices'" in finding.message
    assert {"AscendOneKeywordFix", "AscendKwargsFix"} <= set(rep.checked)


def test_dummy_slot_evidence(runs):
    ev = one(runs["dummy_slot"][0].evidence, IntegrityEvidence)
    # capture wrote slot 0, which the first request (request row 1) owns: its state and output are off
    assert ev.slots == [0] and ev.owners == {0: 1}
    assert {s for _, s, _ in ev.report.state_mismatches} == {0}
    assert [t for t, _ in ev.report.output_mismatches] == [0]
    assert ev.report.changed_slots == []  # nothing outside the step's own slots


def test_stale_rows_evidence(runs):
    broken, _ = runs["stale_rows"]
    ev = one(broken.evidence, IntegrityEvidence)
    # the fourth request (row 4, slot 4) sat out the step; the padded row still named it
    assert sorted({s for _, s in ev.report.changed_slots}) == [4] and ev.owners == {4: 4}
    assert ev.report.output_mismatches == [] and ev.report.state_mismatches == []
    rpi, idx = [e for e in broken.evidence if isinstance(e, RowsDiffer)]
    assert (rpi.what, rpi.rows, rpi.got, rpi.expected) == ("req_pool_indices", [3], [4], [0])
    assert (idx.what, idx.rows, idx.got, idx.expected) == ("state_indices", [3], [4], [0])


def test_sentinel_guard_evidence(runs):
    ev = one(runs["sentinel_guard"][0].evidence, IntegrityEvidence)
    # padded row carries 0; the old guard processes it: slot 0 (request row 1, not in the step) changes
    assert sorted({s for _, s in ev.report.changed_slots}) == [0] and ev.owners == {0: 1}
    assert ev.report.output_mismatches == []


def test_verify_alias_evidence(runs):
    ev = one(runs["verify_alias"][0].evidence, IntegrityEvidence)
    # only request 0 (request row 1, slot 1) accepted a wrong state; its outputs were right
    assert ev.slots == [1] and ev.owners == {1: 1}
    assert ev.report.output_mismatches == [] and ev.report.changed_slots == []
    rows = one(runs["verify_alias"][0].evidence, RowsDiffer)  # the padded row's scratch index is request 0's
    assert (rows.what, rows.rows, rows.got, rows.expected) == ("intermediate_state_indices", [3], [0], [3])


def test_uninit_pad_evidence(runs):
    broken, fixed = runs["uninit_pad"]
    prop = one(broken.evidence, Propagation)
    assert prop.stages == (("conv output", (3,)), ("ssm output", (3,)), ("layer output", (3,)))
    ev = one(broken.evidence, IntegrityEvidence)
    assert ev.report.nonzero_padded_outputs == [3]
    assert ev.report.output_mismatches == [] and ev.report.state_mismatches == []  # live rows exact
    assert not one(fixed.evidence, Propagation).broken


def test_transposed_state_read_evidence(runs):
    broken, fixed = runs["transposed_state_read"]
    # at K == V the layout-blind kernel passes: its outputs are right on a pool it alone writes
    for run in (broken, fixed):
        control = one(run.evidence, RowsDiffer)
        assert control.rows == [] and control.what.startswith("K == V (8)")
    # at K != V (8, 12) the same kernel is refused: the V-first pool has the wrong shape for a K-first read
    err = one(broken.evidence, RaisedError)
    assert "state: [16, 4, 12, 8] is not [slots, HV=4, K=8, V=12] (state_layout='k_first')" in err.message
    assert err.where.startswith("GraphRunner.capture at decode bucket 4")
    ev = one(fixed.evidence, IntegrityEvidence)
    assert not ev.broken and ev.live and ev.report.ok


def test_transposed_state_read_is_wrong_at_k_equal_v_on_a_state_someone_else_wrote():
    """What "passes at K == V" leaves out: a pool a correct writer filled is read transposed (values only)."""
    from workbench.batch import Batch
    from workbench.metadata import build_metadata
    from workbench.pool import StatePool
    from workbench.zoo.transposed_state_read import SQUARE, LayoutBlindGDN, variant

    pool = StatePool(8, "vllm")
    meta = build_metadata(Batch.decode(pool.alloc(2), [4, 5]), pool, bucket=None)
    x = torch.randn(2, SQUARE.hidden_size, generator=torch.Generator().manual_seed(0))
    outs = []
    for fixed in (False, True):
        layer = LayoutBlindGDN(SQUARE, seed=0, state_layout="v_first", kernel=variant(fixed))
        outs.append(layer.forward(x, meta, layer.new_state(8, seed=3)))
    assert outs[0].shape == outs[1].shape and not torch.allclose(outs[0], outs[1], atol=1e-3)


def test_kda_sentinel_rows_evidence(runs):
    broken, fixed = runs["kda_sentinel_rows"]
    ev = one(broken.evidence, IntegrityEvidence)
    # the -1 row with a token wraps to the last slot (15), owned by request row 15, which sat the step out
    assert sorted({s for _, s in ev.report.changed_slots}) == [15] and ev.owners == {15: 15}
    assert ev.report.nonzero_padded_outputs == [3]  # the padded row's output is its state's, not zeros
    assert ev.report.state_mismatches == [] and ev.report.output_mismatches == []  # live rows exact
    assert one(fixed.evidence, IntegrityEvidence).report.ok


def test_kda_sentinel_rows_skip_rule_is_what_keeps_it_clean(monkeypatch):
    """The fixed run is clean because of the skip rule: with fla's rule in its place it breaks."""
    from workbench.zoo import kda_sentinel_rows

    monkeypatch.setattr(kda_sentinel_rows, "variant", lambda fixed: kda_sentinel_rows.skips_zero_length_only)
    assert kda_sentinel_rows.CASE.run(True).broken


def test_kda_frozen_accept_lists_evidence(runs):
    broken, fixed = runs["kda_frozen_accept_lists"]
    ev = one(broken.evidence, IntegrityEvidence)
    # the three requests (slots 1, 2, 3) were seeded from the dummy slot's first checkpoint: all off
    assert sorted({s for _, s, _ in ev.report.state_mismatches}) == [1, 2, 3] and ev.owners == {1: 1, 2: 2, 3: 3}
    assert ev.report.changed_slots == []  # their checkpoints landed on the dummy slot, which may be written
    nat, rows = [e for e in broken.evidence if isinstance(e, RowsDiffer)][:2]
    assert (nat.rows, nat.got, nat.expected) == ([0, 2], [1, 1], [2, 2])  # accepted 2, 1, 2: warm-up's 1s
    assert rows.got == [[0, 1]] * 3 and rows.expected == [[2, 3], [4, 5], [6, 7]]  # warm-up's dummy-slot rows
    assert not any(e.broken for e in fixed.evidence)


def test_kda_frozen_accept_lists_clearing_is_what_fixes_it(monkeypatch):
    """The fixed model is clean because its in-graph hook clears the lists: without the clearing it breaks."""
    from workbench.zoo import kda_frozen_accept_lists as case

    monkeypatch.setattr(case.LazyAcceptBackend, "init_forward_metadata_in_graph", lambda self: None)
    ev = case.model_run(True, "cpu")
    assert any(e.broken for e in ev) and not ev[0].report.ok


def test_host_value_evidence(runs):
    err = one(runs["host_value"][0].evidence, RecorderError)
    assert err.op.startswith("aten._local_scalar_dense")
    lines = inspect.getsource(host_value).splitlines()
    item_line = next(i for i, text in enumerate(lines, start=1) if ".item()" in text and "live =" in text)
    assert (err.file, err.line, err.function) == ("host_value.py", item_line, "init_forward_metadata_in_graph")
    assert ".item()" in err.code


def test_tail_slice_evidence(runs):
    ev = one(runs["tail_slice"][0].evidence, IntegrityEvidence)
    # buf[-4:] of an 8-slot buffer: the slots of the previous step's last four requests (rows 5..8)
    assert sorted({s for _, s in ev.report.changed_slots}) == [5, 6, 7, 8]
    assert {s: ev.owners[s] for s in (5, 6, 7, 8)} == {5: 5, 6: 6, 7: 7, 8: 8}
    # and the three live requests got no update and wrong outputs
    assert sorted({s for _, s, _ in ev.report.state_mismatches}) == [1, 2, 3]
    assert [t for t, _ in ev.report.output_mismatches] == [0, 1, 2]
    # the index the graph was handed: the buffer's tail, the previous step's last four slots
    rows = one(runs["tail_slice"][0].evidence, RowsDiffer)
    assert (rows.what, rows.rows, rows.got, rows.expected) == (
        "state_indices",
        [0, 1, 2, 3],
        [5, 6, 7, 8],
        [1, 2, 3, -1],
    )


def test_rebuilt_tensors_evidence(runs):
    broken, fixed = runs["rebuilt_tensors"]
    moved = [e for e in broken.evidence if isinstance(e, AddressMismatch)]
    # every tensor the eager builder made is new: state_indices first, each at another address
    assert moved[0].field_name == "state_indices" and all(e.recorded_ptr != e.written_ptr for e in moved)
    assert {e.field_name for e in moved} >= {"state_indices", "query_start_loc"}
    ev = one(broken.evidence, IntegrityEvidence)
    assert sorted({s for _, s, _ in ev.report.state_mismatches}) == [1, 2, 3]  # every live slot stale
    fixed_addr = one(fixed.evidence, AddressMismatch)
    assert fixed_addr.recorded_ptr == fixed_addr.written_ptr


def test_fill_count_evidence(runs):
    broken, _ = runs["fill_count"]
    # row 0 has the fill value's length, but the tail count drops the LAST live row (row 2, slot 3)
    rows = one(broken.evidence, RowsDiffer)
    assert (rows.what, rows.rows, rows.got, rows.expected) == ("state_indices (live rows)", [2], [-1], [3])
    ev = one(broken.evidence, IntegrityEvidence)
    assert [t for t, _ in ev.report.output_mismatches] == [2]
    assert {s for _, s, _ in ev.report.state_mismatches} == {3}
    assert ev.report.changed_slots == []


def test_recorder_error_parse_needs_op_and_line():
    assert RecorderError.parse(RuntimeError("no location here")) is None
    e = RecorderError.parse(RuntimeError("host sync: aten.equal.default reads. At f.py:12 in g: `x == y`."))
    assert e is not None and (e.op, e.file, e.line, e.function, e.code) == (
        "aten.equal.default",
        "f.py",
        12,
        "g",
        "x == y",
    )


def test_rows_differ_reports_non_finite_errors():
    assert "NaN/inf" in RowsDiffer("out", [1], errors=[math.inf]).summary()


# -- command line ---------------------------------------------------------------------------------------
def test_cli_list(capsys):
    assert main(["zoo", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == NAMES


def test_cli_unknown_name_exits_2_naming_it_and_the_choices(capsys):
    assert main(["zoo", "fill_count", "nope"]) == 2
    err = capsys.readouterr().err
    assert "'nope'" in err and "fill_count" in err and "in_capture" in err


def test_cli_runs_cases_side_by_side(capsys):
    assert main(["zoo", "stale_rows", "fill_count", "--backend", "cpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("stale_rows") and "broken: req_pool_indices: row 3: 4 (want 0)" in out[0]
    assert "second decode: foreign slot(s) [4]" in out[0]  # the integrity report follows the mechanism
    assert out[0].endswith("fixed: clean") and out[1].startswith("fill_count")
    assert out[-1] == "2/2 unfixed runs broke, 2/2 fixed runs clean"


def test_cli_json(capsys):
    assert main(["zoo", "fill_count", "--json", "--backend", "cpu"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True
    (pair,) = data["cases"]
    assert pair["broken"]["broken"] is True and pair["fixed"]["broken"] is False
    assert pair["broken"]["evidence"][0]["kind"] == "RowsDiffer"


def test_cli_exit_1_when_a_fixed_run_still_breaks(monkeypatch, capsys):
    from workbench.zoo import cli

    bad = ZooResult("fill_count", "i", True, (RaisedError("TypeError", "still"),), "e")
    good = ZooResult("fill_count", "i", False, (RaisedError("TypeError", "broke"),), "e")
    monkeypatch.setattr(cli, "run_all", lambda names, backend: [(good, bad)])
    assert main(["zoo", "fill_count"]) == 1
    assert "STILL BROKEN: TypeError: still" in capsys.readouterr().out
