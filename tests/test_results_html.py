"""Result objects show themselves: a short repr, and an HTML table whose padded rows and failures are
coloured (parsed here, not string-matched), with every value escaped."""

from html.parser import HTMLParser

import pytest
import torch

from workbench import Batch, MetadataBuffers, StatePool, build_metadata, get_profile, html
from workbench.layers import GatedDeltaNetLayer, GDNConfig
from workbench.measure.integrity import IntegrityReport, check
from workbench.runner import Comparison, GraphRunner, StepResult
from workbench.viz import palette


class _Rows(HTMLParser):
    """Table rows as (class, style, [cell texts]); and every class seen anywhere."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.rows: list[tuple[str, str, list[str]]] = []
        self.classes: list[str] = []
        self.tags: list[str] = []
        self._cell: list[str] | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if a.get("class"):
            self.classes.append(a["class"])
        if tag == "tr":
            self.rows.append((a.get("class") or "", a.get("style") or "", []))
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1][2].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _body(parsed: _Rows) -> list[tuple[str, str, list[str]]]:
    return [r for r in parsed.rows if r[0]]  # header rows carry no class


@pytest.mark.parametrize("profile", ["sglang", "sglang-ascend", "vllm"])
def test_metadata_html_marks_exactly_the_padded_rows(profile):
    pool = StatePool(32, profile, slots_per_request=get_profile(profile).slots_per_request(2))
    pool.free(pool.alloc(4)[::2])  # holes: live slots are not 1..n
    meta = build_metadata(Batch.target_verify(pool.alloc(3), [7, 3, 9], 2), pool, bucket="auto", buckets=[1, 2, 8])
    parsed = _Rows(meta._repr_html_())
    rows = _body(parsed)
    assert len(rows) == meta.batch_size == 8
    header = parsed.rows[0][2]
    state_col = header.index("state_index")
    sentinel = str(get_profile(profile).sentinel)
    for i, (cls, style, cells) in enumerate(rows):
        padded = i >= meta.raw_batch_size
        assert cls == ("wb-pad" if padded else "wb-live"), (i, cls)
        assert (f"background-color:{html.PAD}" in style) == padded, (i, style)
        assert cells[header.index("kind")] == ("pad" if padded else "live")
        if padded:
            assert sentinel in cells[state_col]  # vLLM's [bs, D] rows read "[0, 0]"
        else:
            assert cells[state_col] == str(meta.state_indices[i].tolist())


def test_metadata_html_elides_the_middle_of_a_large_batch_but_keeps_the_padded_tail():
    pool = StatePool(128, "sglang")
    meta = build_metadata(Batch.decode(pool.alloc(97), [5] * 97), pool, bucket="auto")  # bucket 104
    rows = _body(_Rows(meta._repr_html_()))
    kinds = [cls for cls, _, _ in rows]
    assert "wb-more" in kinds and kinds[-1] == "wb-pad" and kinds.count("wb-pad") == 4
    assert len(rows) < 50


def test_metadata_repr_is_one_short_line():
    pool = StatePool(600, "sglang")
    meta = build_metadata(Batch.decode(pool.alloc(300), [5] * 300), pool, bucket="auto")
    text = repr(meta)
    assert "\n" not in text and len(text) < 300
    assert text.startswith("Metadata(sglang decode, raw_bs=300 -> bs=304 (bucket)")
    assert "299, 300, -1, -1, -1, -1]" in text  # the padded tail stays visible


def test_metadata_on_the_meta_device_still_shows_itself():
    pool = StatePool(8, "sglang", device="meta")
    meta = MetadataBuffers(pool, "decode", buckets=[4]).static[4]
    assert repr(meta) == "Metadata(sglang decode, raw_bs=4 -> bs=4 (bucket), on the meta device)"
    assert "shapes only" in meta._repr_html_()


def _failing_report() -> IntegrityReport:
    before = {"ssm": torch.randn(6, 2, 3)}
    after = {"ssm": before["ssm"].clone()}
    after["ssm"][4] += 1.0  # a slot nobody owns
    out = torch.randn(3, 4)
    pad = torch.zeros(2, 4)
    pad[1, 0] = float("nan")
    return check(
        before,
        after,
        allowed_slots=[0, 2],
        live_slots=[2],
        reference_state={"ssm": before["ssm"].double()},
        live_outputs=out,
        reference_outputs=out.double(),
        padded_outputs=pad,
        padded_offset=3,
    )


def test_failing_integrity_report_shows_each_failure_in_the_failure_colour():
    rep = _failing_report()
    assert not rep.ok
    parsed = _Rows(rep._repr_html_())
    rows = _body(parsed)
    assert [cls for cls, _, _ in rows] == ["wb-fail", "wb-fail"]
    assert all(f"border-left:4px solid {html.FAIL}" in style for _, style, _ in rows)
    assert rows[0][2][:3] == ["foreign slot changed", "ssm", "slot 4"]
    assert rows[1][2][:3] == ["padded output not zero", "output", "token 4"]
    assert "wb-fail" in parsed.classes and "wb-ok" not in parsed.classes
    assert repr(rep) == "IntegrityReport(FAIL: changed_slots=1, nonzero_padded_outputs=1)"


def test_clean_integrity_report_says_so_in_the_ok_colour():
    out = torch.randn(2, 3)
    s = {"ssm": torch.randn(4, 2)}
    rep = check(
        s, s, allowed_slots=[1], live_slots=[1], reference_state={"ssm": s["ssm"].double()},
        live_outputs=out, reference_outputs=out.double(),
    )  # fmt: skip
    parsed = _Rows(rep._repr_html_())
    assert rep.ok and "wb-ok" in parsed.classes and "wb-fail" not in parsed.classes
    assert "table" not in parsed.tags
    assert repr(rep).startswith("IntegrityReport(ok")


def test_comparison_html_from_a_real_replay():
    pool = StatePool(12, "sglang")
    layer = GatedDeltaNetLayer(GDNConfig.small(), seed=2, impl="reference")
    runner = GraphRunner(layer, pool, buckets=[4], modes=["decode"], backend="cpu", state_seed=3)
    runner.capture(progress=False)
    cmp = runner.compare(Batch.decode(pool.alloc(3), [4, 5, 6]), torch.randn(3, layer.config.hidden_size))
    assert cmp.ok
    parsed = _Rows(cmp._repr_html_())
    assert {cls for cls, _, _ in _body(parsed)} == {"wb-ok"}
    assert "wb-fail" not in parsed.classes
    assert repr(cmp) == "Comparison(ok: decode raw_bs=3, replayed bucket 4, bitwise equal, integrity ok)"
    # a runner's step result shows itself too
    res = runner.replay(Batch.decode(pool.alloc(1), [2]), torch.randn(1, layer.config.hidden_size))
    assert repr(res) == "StepResult(decode raw_bs=1, replayed bucket 4, output [1, 32] float32)"
    assert "replayed" in res._repr_html_()


def test_failing_comparison_colours_its_failing_checks_and_embeds_the_report():
    cmp = Comparison(
        bucket=None,
        replayed=False,
        bitwise_equal=False,
        max_output_diff=0.5,
        max_state_diff=0.0,
        integrity=_failing_report(),
        raw_batch_size=9,
        mode="decode",
        reason="raw batch 9 is above the largest captured bucket 8 <b>",
    )
    text = cmp._repr_html_()
    parsed = _Rows(text)
    by_check = {cells[0]: cls for cls, _, cells in _body(parsed) if cells}
    assert by_check["bitwise equal to padded eager"] == "wb-fail"
    assert by_check["integrity vs float64 reference"] == "wb-fail"
    assert by_check["replayed"] == "wb-ok"
    assert "foreign slot changed" in [cells[0] for _, _, cells in _body(parsed) if cells]  # the embedded report
    assert "bucket 8 &lt;b&gt;" in text and "bucket 8 <b>" not in text  # the reason is escaped, not rendered
    assert repr(cmp).startswith("Comparison(FAIL: decode raw_bs=9, eager (no bucket), NOT bitwise equal")


def test_step_result_repr_says_why_it_ran_eagerly():
    res = StepResult(torch.zeros(9, 4), "decode", 9, None, False, reason="raw batch 9 is above the largest bucket 8")
    assert repr(res) == (
        "StepResult(decode raw_bs=9, eager, output [9, 4] float32, reason='raw batch 9 is above the largest bucket 8')"
    )


def test_batch_and_pool_render_their_rows():
    pool = StatePool(8, "sglang")
    batch = Batch.extend(pool.alloc(2), [3, 4], [0, 5])
    rows = _body(_Rows(batch._repr_html_()))
    assert [cells for _, _, cells in rows] == [["0", "1", "3", "3", "0"], ["1", "2", "9", "4", "5"]]
    pool_rows = _body(_Rows(pool._repr_html_()))
    assert [cells for _, _, cells in pool_rows] == [["1", "1"], ["2", "2"]]


def test_table_escapes_every_value_and_refuses_unknown_row_kinds():
    text = html.table(["<col>"], [["<script>alert(1)</script>"], ['"&']], row_kinds=["live", "fail"])
    assert "<script>" not in text and "&lt;script&gt;" in text and "&quot;&amp;" in text and "&lt;col&gt;" in text
    with pytest.raises(ValueError, match="row_kinds\\[0\\]: 'bad'"):
        html.table(["a"], [[1]], row_kinds=["bad"])
    with pytest.raises(ValueError, match="1 kinds for 2 rows"):
        html.table(["a"], [[1], [2]], row_kinds=["live"])


def test_html_colours_are_the_palette_colours():
    """html sits below viz, so it holds its own copy of the colours; they must not drift apart."""
    assert html.LIVE == palette.BLUE
    assert html.PAD == palette.LIGHT_GREY
    assert html.FAIL == palette.VERMILLION
    assert html.OK == palette.GREEN
    assert html.WARN == palette.ORANGE


def test_table_caption_cell_kinds_and_left_columns():
    text = html.table(
        ["case", "state"],
        [["a<b", html.Cell("broken", "fail")], ["c", html.Cell("clean", "ok")], ["d", "plain"]],
        row_kinds=["live", "live", "warn"],
        caption="zoo <1>",
        left=["case"],
    )
    parsed = _Rows(text)
    assert parsed.tags[:2] == ["table", "caption"] and "zoo &lt;1&gt;" in text
    assert [r[2] for r in _body(parsed)] == [["a<b", "broken"], ["c", "clean"], ["d", "plain"]]
    assert "wb-fail" in parsed.classes and "wb-ok" in parsed.classes  # the two verdict cells
    assert f"color:{html.FAIL};font-weight:bold" in text and f"border-left:4px solid {html.WARN}" in text
    assert text.count('#ddd;text-align:left"') == 4  # the case column: its header and its three cells
    with pytest.raises(ValueError, match="Cell.kind: 'red'"):
        html.Cell("x", "red")
    with pytest.raises(ValueError, match=r"left: \['nope'\] are not columns"):
        html.table(["a"], [[1]], left=["nope"])
    with pytest.raises(ValueError, match="a row of 2 cells under 1 columns"):
        html.table(["a"], [[1, 2]])


def test_the_explorer_shows_the_records_own_table_and_what_the_kernel_does_with_padding():
    from workbench.widgets.html import metadata_html, records_html

    for profile, fate in (("sglang-ascend", "processed on the dummy slot"), ("sglang", "skipped by the kernel")):
        pool = StatePool(16, profile)
        meta = build_metadata(Batch.decode(pool.alloc(3), [4, 5, 6]), pool, bucket="auto")  # bucket 4: row 3 padded
        shown = metadata_html(meta)
        assert shown.startswith(meta._repr_html_())  # one rendering, the record's own
        assert f"padded row 3: {fate}" in shown
    assert "(no rows)" in records_html([])
    rows = _body(_Rows(records_html([{"a": 1, "b": "<x>"}, {"a": 2}], row_kinds=["live", "fail"])))
    assert rows == [("wb-live", "", ["1", "<x>"]), ("wb-fail", rows[1][1], ["2", ""])]


NOTEBOOK_CELLS = [
    """import torch
from workbench import Batch, StatePool, build_metadata
from workbench.layers import GatedDeltaNetLayer, GDNConfig
from workbench.runner import GraphRunner
pool = StatePool(12, "sglang")
runner = GraphRunner(GatedDeltaNetLayer(GDNConfig.small(), seed=1, impl="reference"), pool, buckets=[4],
                     modes=["decode"], backend="cpu", state_seed=2)
runner.capture(progress=False)
batch = Batch.decode(pool.alloc(3), [4, 5, 6])""",
    "build_metadata(batch, pool)",
    "cmp = runner.compare(batch, torch.randn(3, 32))\ncmp",
    "cmp.integrity",
    "runner.replay(batch, torch.randn(3, 32))",
    "batch",
    "pool",
]


@pytest.mark.notebook
def test_a_cell_ending_in_a_result_displays_its_html_in_a_real_kernel(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in NOTEBOOK_CELLS])
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    errors = [o for c in nb.cells for o in c.outputs if o.output_type == "error"]
    assert not errors, errors[0].get("evalue")
    shown = [c.outputs[-1]["data"] for c in nb.cells[1:]]
    assert all("text/html" in d and "text/plain" in d for d in shown)
    titles = ["Metadata", "Comparison", "IntegrityReport", "StepResult", "Batch", "StatePool"]
    for data, title in zip(shown, titles, strict=True):
        assert f">{title}" in data["text/html"], title
    meta_rows = _body(_Rows(shown[0]["text/html"]))
    assert [cls for cls, _, _ in meta_rows] == ["wb-live"] * 3 + ["wb-pad"]
    assert shown[1]["text/plain"].startswith("Comparison(ok: decode raw_bs=3, replayed bucket 4")
