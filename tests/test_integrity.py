"""measure.integrity: every kind of problem is reported (so a clean report means something)."""

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
