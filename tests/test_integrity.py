"""measure.integrity: every kind of problem is reported (so a clean report means something)."""

import pytest
import torch

from workbench.measure.integrity import changed_slots, check


def _case():
    before = {"ssm": torch.randn(6, 2, 3)}
    after = {"ssm": before["ssm"].clone()}
    ref = {"ssm": before["ssm"].double()}
    out = torch.randn(4, 5)
    return before, after, ref, out


def test_clean_step_is_clean():
    before, after, ref, out = _case()
    rep = check(
        before,
        after,
        allowed_slots=[0, 2],
        live_slots=[2],
        reference_state=ref,
        live_outputs=out,
        reference_outputs=out.double(),
        padded_outputs=torch.zeros(2, 5),
    )
    assert rep.ok and "clean" in str(rep)


def test_each_problem_is_reported():
    before, after, ref, out = _case()
    after["ssm"][4, 1, 2] += 1.0  # a foreign slot
    after["ssm"][2, 0, 0] += 1.0  # a live slot off the reference
    pad = torch.zeros(3, 5)
    pad[1, 4] = float("nan")  # uninitialised memory reads as NaN
    got_inter, ref_inter = torch.randn(2, 3), torch.randn(2, 3).double()
    ref_out = out.double().clone()
    ref_out[3] += 1e-2
    rep = check(
        before,
        after,
        allowed_slots=[0, 2],
        live_slots=[2],
        reference_state=ref,
        live_outputs=out,
        reference_outputs=ref_out,
        padded_outputs=pad,
        padded_offset=4,
        intermediates={"intermediate.ssm": (got_inter, ref_inter)},
    )
    assert rep.changed_slots == [("ssm", 4)] and rep.changed_slots[0].slot == 4
    assert [(m.tensor, m.slot) for m in rep.state_mismatches] == [("ssm", 2)]
    assert abs(rep.state_mismatches[0].error - 1.0) < 1e-6  # the +1.0 written above, in float32
    # per-row buffers are reported by batch row, apart from the slots
    assert [(m.tensor, m.row) for m in rep.intermediate_mismatches] == [
        ("intermediate.ssm", 0),
        ("intermediate.ssm", 1),
    ]
    assert [m.token for m in rep.output_mismatches] == [3]
    assert rep.nonzero_padded_outputs == [5]
    assert not rep.ok and "slot 4 of ssm changed" in str(rep)


def test_changed_slots_is_bitwise():
    a = {"s": torch.zeros(3, 2)}
    b = {"s": a["s"].clone()}
    b["s"][1, 0] = -0.0  # equal as a number, different bits: a write happened
    b["s"][2, 1] = float("nan")
    assert changed_slots(a, b) == [("s", 1), ("s", 2)]


def test_a_nan_is_said_as_nan_not_as_a_number():
    """A NaN in a live slot or output is reported as NaN (it used to read "inf"), whatever order it comes in."""
    from workbench.measure.integrity import error_text, worst

    before, after, ref, out = _case()
    after["ssm"][2, 0, 0] = float("nan")
    bad_out = out.clone()
    bad_out[1, 3] = float("nan")
    rep = check(
        before,
        after,
        allowed_slots=[0, 2],
        live_slots=[2],
        reference_state=ref,
        live_outputs=bad_out,
        reference_outputs=out.double(),
    )
    assert not rep.ok and "differs from the float64 reference by NaN" in str(rep) and "inf" not in str(rep)
    assert error_text(worst([0.5, float("nan")])) == error_text(worst([float("nan"), 0.5])) == "NaN"
    assert error_text(worst([0.5, 0.25])) == "0.5"


def test_report_equals_the_row_by_row_comparison(monkeypatch):
    """The check compares all rows at once and measures only the rows found off: its report is the one a
    row-by-row comparison gives, rows in the order given (live slots unsorted, repeated), NaN and inf
    included, in chunks of rows too."""
    import workbench.measure.integrity as integrity

    def row_by_row(got, ref, rows):
        return [(i, err) for i in rows for bad, err in [integrity._max_err(got[i], ref[i], 2e-4, 2e-3)] if bad]

    gen = torch.Generator().manual_seed(0)
    for chunk in (1 << 22, 7):  # 7 values: chunks of a row or two
        monkeypatch.setattr(integrity, "_CHUNK_VALUES", chunk)
        before = {"ssm": torch.randn(9, 2, 3, generator=gen), "conv": torch.randn(9, 4, generator=gen)}
        after = {k: v.clone() for k, v in before.items()}
        ref = {k: v.double() for k, v in before.items()}
        after["ssm"][3, 1, 2] += 1e-2
        after["ssm"][7, 0, 0] = float("nan")
        after["conv"][5, 3] = float("inf")
        ref["conv"][6, 0] = float("inf")  # inf against inf: the difference is NaN, so off
        after["conv"][6, 0] = float("inf")
        out = torch.randn(6, 5, generator=gen)
        ref_out = out.double().clone()
        ref_out[[1, 4], [0, 2]] += torch.tensor([5e-3, -1.0], dtype=torch.float64)
        got_inter, ref_inter = torch.randn(4, 3, generator=gen), torch.randn(1, 3, generator=gen).double()
        live = [7, 3, 5, 1, 3, 6]
        rep = check(
            before, after, allowed_slots=live, live_slots=iter(live), reference_state=ref, live_outputs=out,
            reference_outputs=ref_out, intermediates={"i": (got_inter, ref_inter.expand(4, 3))},
        )  # fmt: skip
        want_state = [(n, live[i], e) for n in ref for i, e in row_by_row(after[n][live], ref[n][live], range(6))]
        got_state = [(m.tensor, m.slot, m.error) for m in rep.state_mismatches]
        assert [w[:2] for w in want_state] == [g[:2] for g in got_state] == [
            ("ssm", 7), ("ssm", 3), ("ssm", 3), ("conv", 5), ("conv", 6),
        ]  # fmt: skip
        assert str(rep).count("by NaN") == 2 and str(rep).count("by inf") == 1  # ssm[7], conv[6]; conv[5]
        for (_, _, e1), (_, _, e2) in zip(want_state, got_state, strict=True):
            assert e1 == e2 or (e1 != e1 and e2 != e2)
        assert [(m.token, m.error) for m in rep.output_mismatches] == row_by_row(out, ref_out, range(6))
        assert [m.token for m in rep.output_mismatches] == [1, 4]
        want_inter = row_by_row(got_inter, ref_inter.expand(4, 3), range(4))
        assert [(m.row, m.error) for m in rep.intermediate_mismatches] == want_inter and len(want_inter) == 4


# -- the pre-filter cannot pass what the row-by-row check calls off (issue 27) ---------------------------------
def _check(before, after, ref, out, ref_out, **kw):
    return check(
        before, after, allowed_slots=kw.pop("allowed", [0, 2, 3]), live_slots=kw.pop("live", [2, 3]),
        reference_state=ref, live_outputs=out, reference_outputs=ref_out, **kw,
    )  # fmt: skip


def test_sign_flipped_values_are_off_everywhere():
    """A sign flip keeps every sum of squares, norm and absolute value: the check compares values, so each
    flipped state, output and per-row buffer is reported, with the error 2 |value|."""
    before, after, ref, out = _case()
    after["ssm"][3] = -after["ssm"][3]  # a live slot's whole state flipped
    flipped = out.clone()
    flipped[2] = -flipped[2]
    inter = torch.randn(3, 4)
    got_inter = inter.clone()
    got_inter[1, 2] = -got_inter[1, 2]
    rep = _check(before, after, ref, flipped, out.double(), intermediates={"i": (got_inter, inter.double())})
    assert [(m.tensor, m.slot) for m in rep.state_mismatches] == [("ssm", 3)]
    assert rep.state_mismatches[0].error == pytest.approx(2 * float(before["ssm"][3].abs().max()), rel=1e-6)
    assert [m.token for m in rep.output_mismatches] == [2]
    assert rep.output_mismatches[0].error == pytest.approx(2 * float(out[2].abs().max()), rel=1e-6)
    assert [(m.tensor, m.row) for m in rep.intermediate_mismatches] == [("i", 1)]
    assert rep.intermediate_mismatches[0].error == pytest.approx(2 * abs(float(inter[1, 2])), rel=1e-6)
    assert not rep.ok and rep.changed_slots == []  # slot 3 is live: allowed to change


@pytest.mark.parametrize("chunk", [1 << 22, 4, 1], ids=["one chunk", "chunks of rows", "row by row"])
def test_the_pre_filter_finds_every_row_off_in_any_chunking(monkeypatch, chunk):
    """Off rows first, last and in between, a flip, a NaN and an inf: the pre-filter (in chunks of rows too)
    lets the report see each one, at its absolute row; rows within tolerance stay out."""
    import workbench.measure.integrity as integrity

    monkeypatch.setattr(integrity, "_CHUNK_VALUES", chunk)
    ref = torch.randn(7, 2, dtype=torch.float64) + 3.0  # no value near zero: a flip is always far off
    got = ref.float().clone()
    got[0, 1] = -got[0, 1]
    got[3, 0] += 1e-5  # within atol: not reported
    got[4, 0] = float("nan")
    got[6, 1] = float("inf")
    assert integrity._suspect_rows(got, ref, 2e-4, 2e-3) == [0, 4, 6]
    rep = _check(
        {"s": torch.zeros(4, 1)}, {"s": torch.zeros(4, 1)}, {"s": torch.zeros(4, 1).double()}, got, ref, live=[1]
    )
    assert [m.token for m in rep.output_mismatches] == [0, 4, 6]
    assert rep.output_mismatches[0].error == pytest.approx(2 * float(ref[0, 1]), rel=1e-6)
    assert str(rep).count("by NaN") == 1 and "output token 6 differs from the float64 reference by inf" in str(rep)


def test_tolerance_is_inclusive_and_zero_tolerance_means_bitwise_equal_values():
    out = torch.tensor([[1.0, -2.0], [0.5, 4.0]])
    ref = out.double()
    rep = _check({"s": torch.zeros(4, 1)}, {"s": torch.zeros(4, 1)}, {"s": torch.zeros(4, 1).double()}, out, ref,
                 live=[1], atol=0.0, rtol=0.0)  # fmt: skip
    assert rep.ok and (rep.atol, rep.rtol) == (0.0, 0.0)
    near = ref.clone()
    near[1, 1] += 0.25  # |error| = atol + rtol * |ref| exactly (binary fractions): still within
    rep = _check({"s": torch.zeros(4, 1)}, {"s": torch.zeros(4, 1)}, {"s": torch.zeros(4, 1).double()}, out, near,
                 live=[1], atol=0.125, rtol=0.125 / 4.25)  # fmt: skip
    assert abs(0.125 + 0.125 / 4.25 * 4.25 - 0.25) == 0.0 and rep.ok
    rep = _check({"s": torch.zeros(4, 1)}, {"s": torch.zeros(4, 1)}, {"s": torch.zeros(4, 1).double()}, out, near,
                 live=[1], atol=0.125, rtol=0.0)  # fmt: skip
    assert [(m.token, m.error) for m in rep.output_mismatches] == [(1, 0.25)]


def test_default_tolerances_follow_the_outputs_dtype_unless_given():
    from workbench.measure.integrity import DEFAULT_ATOL, DEFAULT_RTOL

    before, after, ref, out = _case()
    assert (_check(before, after, ref, out, out.double()).atol, _check(before, after, ref, out, out.double()).rtol) == (
        DEFAULT_ATOL[torch.float32],
        DEFAULT_RTOL[torch.float32],
    )
    half = _check(before, after, ref, out.half(), out.double())
    assert (half.atol, half.rtol) == (DEFAULT_ATOL[torch.float16], DEFAULT_RTOL[torch.float16])
    given = _check(before, after, ref, out, out.double(), atol=0.5, rtol=0.25)
    assert (given.atol, given.rtol) == (0.5, 0.25)
    odd = _check(before, after, ref, out.to(torch.int32), out.to(torch.int32).double())
    assert (odd.atol, odd.rtol) == (1e-4, 1e-3)  # a dtype without defaults


def test_empty_rows_and_zero_width_values_are_clean():
    before, after, ref, out = _case()
    rep = _check(
        before, after, ref, torch.zeros(3, 0), torch.zeros(3, 0, dtype=torch.float64),
        intermediates={"w": (torch.zeros(2, 0), torch.zeros(2, 1, 0, dtype=torch.float64))},  # broadcast, no values
        padded_outputs=torch.zeros(0, 5),
    )  # fmt: skip
    assert rep.ok and rep.nonzero_padded_outputs == []
    rep = _check(before, after, ref, out[:0], out[:0].double(), live=[])
    assert rep.ok and rep.state_mismatches == []


def test_only_the_live_slots_given_are_compared_with_the_reference():
    before, after, ref, out = _case()
    ref["ssm"][5] += 1.0  # a slot no live row owns: its reference is not looked at
    after["ssm"][2] += 1.0
    rep = _check(before, after, ref, out, out.double(), allowed=[2, 5], live=[])
    assert rep.ok  # no live slot: nothing compared; slot 2 may change
    rep = _check(before, after, ref, out, out.double(), allowed=[2, 5], live=[2])
    assert [m.slot for m in rep.state_mismatches] == [2]


def test_changed_slots_compares_tensors_of_any_layout():
    """Bitwise on contiguous tensors; a pool tensor that is a strided view is compared value by value."""
    base = torch.arange(12.0).reshape(3, 4)
    strided = base.t().contiguous().t()  # same values, column-major
    assert not strided.is_contiguous() and changed_slots({"s": base}, {"s": strided}) == []
    changed = strided.clone().t().contiguous().t()
    changed[2, 3] = 0.5
    assert changed_slots({"s": base}, {"s": changed}) == [("s", 2)]
    assert changed_slots({"s": changed}, {"s": base}) == [("s", 2)]
    wide = {"a": torch.zeros(2, 5, 3), "b": torch.zeros(4, 1)}
    after = {k: v.clone() for k, v in wide.items()}
    after["a"][1, 4, 2] = 1.0
    after["b"][3, 0] = 1.0
    assert changed_slots(wide, after) == [("a", 1), ("b", 3)]
    empty = {"none": torch.zeros(0, 4), "nothing_per_slot": torch.zeros(3, 0), "flat": torch.zeros(4)}
    after = {k: v.clone() for k, v in empty.items()}
    after["flat"][2] = -0.0
    assert changed_slots(empty, after) == [("flat", 2)]
    with pytest.raises(ValueError, match=r"flat is \(4,\) before and \(2, 2\) after"):
        changed_slots({"flat": torch.rand(4)}, {"flat": torch.rand(2, 2)})


def test_snapshot_keeps_the_values_of_the_moment():
    from workbench.measure.integrity import snapshot

    pool = {"ssm": torch.zeros(2, 3, requires_grad=True), "conv": torch.ones(2, 1)}
    snap = snapshot(pool)
    with torch.no_grad():
        pool["ssm"][0, 0] = 5.0
    pool["conv"][1] = 2.0
    assert set(snap) == {"ssm", "conv"} and float(snap["ssm"].abs().sum()) == 0.0 and snap["conv"].eq(1).all()
    assert not snap["ssm"].requires_grad


def test_padded_rows_are_reported_at_their_absolute_token_row():
    before, after, ref, out = _case()
    pad = torch.zeros(4, 2, 3)
    pad[0, 1, 2] = -0.0  # a negative zero is zero
    pad[3, 0, 0] = 1e-30
    rep = _check(before, after, ref, out, out.double(), padded_outputs=pad, padded_offset=10)
    assert rep.nonzero_padded_outputs == [13]
    assert _check(before, after, ref, out, out.double(), padded_outputs=pad[:3], padded_offset=10).ok


def test_the_report_says_every_problem_in_each_form():
    before, after, ref, out = _case()
    after["ssm"][4] += 1.0  # foreign
    after["ssm"][2, 0, 0] += 0.5  # live, off
    ref_out = out.double().clone()
    ref_out[1, 0] += 0.25
    pad = torch.zeros(2, 5)
    pad[1, 0] = 1.0
    got_i = torch.zeros(2, 3)
    ref_i = got_i.double().clone()
    ref_i[0, 0] = 0.125
    rep = _check(before, after, ref, out, ref_out, padded_outputs=pad, padded_offset=4,
                 intermediates={"inter": (got_i, ref_i)}, atol=1e-3, rtol=0.0)  # fmt: skip
    assert rep.problems() == [
        ("foreign slot changed", "ssm", "slot 4", None),
        ("state off reference", "ssm", "slot 2", pytest.approx(0.5)),
        ("row off reference", "inter", "row 0", 0.125),
        ("output off reference", "output", "token 1", pytest.approx(0.25)),
        ("padded output not zero", "output", "token 5", None),
    ]
    assert str(rep).splitlines() == [
        "integrity: PROBLEMS",
        "  slot 4 of ssm changed but no live row owns it",
        "  ssm[2] differs from the float64 reference by 0.5",
        "  inter row 0 differs from the float64 reference by 0.125",
        "  output token 1 differs from the float64 reference by 0.25",
        "  padded output rows not zero: [5]",
    ]
    assert repr(rep) == (
        "IntegrityReport(FAIL: changed_slots=1, state_mismatches=1, intermediate_mismatches=1, output_mismatches=1, "
        "nonzero_padded_outputs=1)"
    )
    d = rep.to_dict()
    assert d["ok"] is False and d["changed_slots"] == [["ssm", 4]] and d["nonzero_padded_outputs"] == [5]
    assert d["state_mismatches"] == [["ssm", 2, pytest.approx(0.5)]] and d["intermediate_mismatches"] == [
        ["inter", 0, 0.125]
    ]
    assert d["output_mismatches"] == [[1, pytest.approx(0.25)]] and (d["atol"], d["rtol"]) == (1e-3, 0.0)
    clean = _check(before, before, ref, out, out.double(), atol=1e-3, rtol=0.5)
    assert clean.ok and clean.problems() == [] and clean.to_dict()["ok"] is True
    assert repr(clean) == "IntegrityReport(ok, atol=0.001, rtol=0.5)"
    assert str(clean).startswith("integrity: clean")


@pytest.mark.parametrize(
    "field",
    ["changed_slots", "state_mismatches", "intermediate_mismatches", "output_mismatches", "nonzero_padded_outputs"],
)
def test_any_one_problem_makes_the_report_not_ok(field):
    from workbench.measure.integrity import IntegrityReport

    rep = IntegrityReport()
    assert rep.ok
    getattr(rep, field).append(0)
    assert not rep.ok and repr(rep).startswith(f"IntegrityReport(FAIL: {field}=1)")


def test_rows_of_other_shapes_are_compared_row_by_row_with_broadcasting():
    """``got[i]`` against ``ref[i]`` broadcast, whatever the whole tensors would do: [2, 2] against [2, 3, 1]
    does not broadcast as a whole, each row does ([2] against [3, 1])."""
    got = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    ref = torch.tensor([[[1.0], [1.0], [1.0]], [[3.0], [3.0], [3.0]]], dtype=torch.float64)
    before, after, state_ref, out = _case()
    rep = _check(before, after, state_ref, out, out.double(), intermediates={"b": (got, ref)}, atol=0.0, rtol=0.0)
    assert [(m.row, m.error) for m in rep.intermediate_mismatches] == [(0, 1.0), (1, 1.0)]


def test_padded_rows_count_from_zero_by_default():
    before, after, ref, out = _case()
    pad = torch.zeros(2, 5)
    pad[1, 0] = 1.0
    assert _check(before, after, ref, out, out.double(), padded_outputs=pad).nonzero_padded_outputs == [1]
