"""The kernel-conformance harness (``workbench.kernelcheck``): built-in kernels pass, broken ones fail
naming what they broke, bad arguments are refused in words, results render themselves."""

from functools import partial
from html.parser import HTMLParser

import pytest
import torch

import kernels.causal_conv1d as conv
import kernels.gated_delta_rule as gdn
import kernels.linear_attn as la
import kernels.mamba2 as mamba2
from kernels.conventions import CONVENTIONS
from kernels.testing import OPS
from workbench.errors import WorkbenchError
from workbench.kernelcheck import (
    KernelCheckError,
    as_custom_op,
    builtin,
    candidate_name,
    check_capture,
    check_convention,
    check_kernel,
    mutated_args,
)

ALL = [(op, variant) for op, spec in OPS.items() for variant in spec.variants]


# -- the built-in kernels --------------------------------------------------------------------------
@pytest.mark.parametrize("op, variant", ALL, ids=[f"{o}[{v}]" for o, v in ALL])
def test_the_reference_passes_every_op_and_variant_under_every_convention(op, variant):
    res = check_kernel("reference", op, variant, capture=False)
    assert res.ok, res.summary()
    assert res.names == [variant] and list(dict.fromkeys(c.name for c in res.results)) == list(CONVENTIONS)
    varlen = "cu_seqlens" in res.results[0].case.args
    tokens = [c.key for c in res.results if c.padded_tokens]
    assert tokens == (["sglang+tokens", "vllm+tokens"] if varlen else [])  # where padded rows may be zero-length


@pytest.mark.slow  # every op in the Triton interpreter, captured: tens of seconds
@pytest.mark.parametrize("op, variant", ALL, ids=[f"{o}[{v}]" for o, v in ALL])
def test_triton_passes_every_op_and_variant_and_captures_as_one_op(op, variant):
    res = check_kernel(builtin(op, "triton"), op, variant)
    assert res.ok, res.summary()
    assert res.candidate == f'{op} (impl="triton")'
    cap = res[variant].capture
    assert cap is not None
    assert sum(o.startswith("linattn.") for o in cap.ops) == 1, cap.ops  # one op per call


# -- broken kernels fail, naming what they broke -----------------------------------------------------
def test_a_kernel_writing_a_slot_no_row_owns_fails_under_every_convention_naming_the_slot():
    written = []

    def writes_a_free_slot(**kw):
        gdn.recurrent(**kw, impl="reference")
        owned = set(kw["state_indices"].tolist())
        free = next(s for s in range(1, kw["state"].shape[0]) if s not in owned)
        kw["state"][free] += 1.0
        written.append(free)

    res = check_kernel(writes_a_free_slot, variants="decode", capture=False)
    keys = ["sglang", "sglang+tokens", "sglang-ascend", "vllm", "vllm+tokens"]
    assert not res.ok and res.failures == [f"decode: {k}" for k in keys]
    for c, slot in zip(res.results, written, strict=True):
        assert f"slot(s) [{slot}] of state changed but no processed row owns them" in c.summary()


def test_a_kernel_that_never_writes_padded_outputs_fails_under_sglang_and_vllm():
    def leaves_skipped_rows(**kw):
        out = kw["out"]
        poisoned = out.clone()
        conv.update(**kw, impl="reference")
        if kw["pad_slot_id"] is not None:  # "skips" padded rows entirely: their outputs stay unwritten
            skipped = kw["state_indices"] <= kw["pad_slot_id"]
            out[skipped] = poisoned[skipped]

    res = check_kernel(leaves_skipped_rows, "causal_conv1d.update", "decode", capture=False)
    assert res.failures == ["decode: sglang", "decode: vllm"]  # no cu_seqlens: padded rows carry inputs, one form
    for name in ("sglang", "vllm"):  # the kernel's NaN, where the reference wrote zeros: said once, that way
        assert res[name].problems() == [
            "80 output value(s) never written: the kernel left NaN where the reference is finite (out rows 3-4); "
            "the reference writes zeros for skipped padding"
        ]
    assert res["sglang-ascend"].ok  # Ascend processes padded rows: the kernel writes them


VERIFY = [
    ("causal_conv1d.update", conv.update, "intermediate_conv_windows"),
    ("gated_delta_rule.recurrent", gdn.recurrent, "intermediate_states"),
    ("mamba2.selective_state_update", mamba2.selective_state_update, "intermediate_states"),
]


def _then(fn, scratch, rows, value):
    """The reference op, then ``value`` written into rows ``rows(kw)`` (a bool mask of batch rows) of the
    intermediate buffer ``scratch``."""

    def kernel(**kw):
        fn(**kw, impl="reference")
        kw[scratch][rows(kw)] = value

    return kernel


def _skipped(kw):
    return kw["state_indices"] <= kw["pad_slot_id"]


@pytest.mark.parametrize("op, fn, scratch", VERIFY, ids=[op for op, _, _ in VERIFY])
def test_padded_rows_of_intermediate_buffers_may_be_left_unwritten_or_zeroed_but_nothing_else(op, fn, scratch):
    """The reference leaves the intermediate rows of skipped padded rows unwritten (NaN): nobody reads them.
    An engine's kernel that zeros them (a memset) is right; one that writes values there is not, nor one that
    leaves a live row's unwritten. Each message says which side held what."""
    zeroed = check_convention(_then(fn, scratch, _skipped, 0.0), op, "verify", "vllm")
    assert zeroed.ok, zeroed.summary()
    garbage = check_convention(_then(fn, scratch, _skipped, 0.5), op, "verify", "vllm")
    assert not garbage.ok and garbage.problems() == [
        f"the kernel wrote non-zero values (e.g. 0.5) into {scratch} rows 3-4, which the reference leaves "
        "unwritten (NaN): scratch nobody reads may stay unwritten or be zero, nothing else"
    ]
    first = _then(fn, scratch, lambda kw: torch.arange(len(kw["state_indices"])) == 0, float("nan"))
    unwritten = check_convention(first, op, "verify", "vllm")
    (problem,) = unwritten.problems()
    assert problem.endswith(f"output value(s) never written: the kernel left NaN where the reference is finite "
                            f"({scratch} row 0)")  # fmt: skip
    assert not unwritten.ok and unwritten.check is not None and unwritten.check.unwritten_rows == [(scratch, 0)]


def test_the_error_map_judges_scratch_as_the_check_does():
    res = check_convention(_then(conv.update, "intermediate_conv_windows", _skipped, 0.0), "causal_conv1d.update",
                           "verify", "sglang")  # fmt: skip
    _, _, err = res.error_map("intermediate_conv_windows")
    assert res.ok and max(max(row) for row in err) < 1e-4


def test_an_unguarded_varlen_kernel_fails_under_sglang_naming_the_guard_band():
    triton_varlen = builtin("causal_conv1d.varlen", "triton")

    def unguarded(**kw):
        kw["pad_slot_id"] = None  # processes padded rows: sglang's -1 addresses the slot before the pool
        triton_varlen(**kw)

    res = check_convention(unguarded, "causal_conv1d.varlen", convention="sglang", padded_tokens=True)
    assert not res.ok
    assert "memory outside the pool written (guard band before conv_state)" in res.problems()[0]
    # zero-length padded rows hide it: why padded_tokens exists
    assert check_convention(unguarded, "causal_conv1d.varlen", convention="sglang").ok


def _unguarded_gdn(**kw):
    """The built-in Triton launcher behind no public op (nothing checks ``state_indices``), skipping no row:
    its None still skips negative slots, -2 does not, so sglang's -1 addresses the slot before the pool."""
    from kernels.gated_delta_rule.triton_recurrent import launch_recurrent

    defaults = {"has_initial_state": None, "intermediate_states": None, "disable_state_update": False}
    launch_recurrent(**{**defaults, **kw, "pad_slot_id": -2})


def test_the_default_check_catches_an_unguarded_recurrent_kernel_by_giving_padded_rows_tokens():
    """Zero-length padded rows read a slot and write the same bytes back: the issue's false OK. Given tokens,
    sglang's -1 writes the slot before the pool (the guard band), vLLM's 0 the null slot."""
    res = check_kernel(_unguarded_gdn, variants="decode", capture=False)
    assert res.failures == ["decode: sglang+tokens", "decode: vllm+tokens"], res.summary()
    assert res["sglang"].ok and res["vllm"].ok and res["sglang-ascend"].ok  # as engines pad, it hides
    sglang = res["sglang+tokens"]
    assert sglang.label == "sglang (padded rows with tokens)" and sglang.padding == "with tokens"
    assert "memory outside the pool written (guard band before state)" in sglang.summary()
    assert "slot(s) [0] of state changed but no processed row owns them" in res["vllm+tokens"].summary()
    assert sglang.rows_text().endswith("padded rows 3-4 hold -1 (with tokens)")
    # asking for one form only: zero-length padded rows pass, as before this check ran both
    assert check_kernel(_unguarded_gdn, variants="decode", capture=False, padded_tokens=False).ok


def test_every_variant_is_checked_by_default_and_each_is_reported_by_name():
    def ignores_disable_state_update(**kw):  # verify must leave the pool alone: this one updates it
        gdn.recurrent(**{**kw, "disable_state_update": False}, impl="reference")

    res = check_kernel(ignores_disable_state_update, capture=False)
    variants = ["decode", "gating", "verify", "tree", "extend"]
    assert res.names == list(OPS["gated_delta_rule.recurrent"].variants) == variants
    assert {f.split(":")[0] for f in res.failures} == {"verify", "tree"}  # a tree refuses a state update outright
    assert all(v.ok for v in res.variants if v.variant not in ("verify", "tree"))
    assert "live slot(s)" in res["verify"]["sglang"].summary()
    assert "a tree verify needs disable_state_update=True" in res["tree"]["sglang"].summary()
    summary = res.summary().splitlines()
    assert summary[0].endswith(": PROBLEMS (5 variants: decode, gating, verify, tree, extend)")
    assert "  verify: PROBLEMS" in summary and "  decode: OK" in summary
    assert check_kernel("reference", variants=["extend", "decode"], capture=False).names == ["extend", "decode"]


def test_a_kernel_without_an_argument_of_a_variant_fails_that_variant_naming_it():
    def no_gating(q, k, v, g, beta, *, state, state_indices, cu_seqlens, scale=None, use_qk_l2norm=False,
                  pad_slot_id=-1, out=None, intermediate_states=None, disable_state_update=False,
                  has_initial_state=None):  # fmt: skip
        gdn.recurrent(q, k, v, g, beta, state=state, state_indices=state_indices, cu_seqlens=cu_seqlens,
                      scale=scale, use_qk_l2norm=use_qk_l2norm, pad_slot_id=pad_slot_id, out=out,
                      intermediate_states=intermediate_states, disable_state_update=disable_state_update,
                      has_initial_state=has_initial_state, impl="reference")  # fmt: skip

    res = check_kernel(no_gating)
    assert res.failures == ["gating: signature", "tree: signature"]  # the tree variant gates in the kernel too
    gating = res["gating"]
    assert gating.conventions == [] and gating.capture is None
    assert gating.unfit == (
        "the kernel takes no a=, b=, A_log=, dt_bias= (the gating variant passes them) "
        "and requires g, beta, which the gating variant does not pass"
    )
    assert gating.lines() == [f"FAIL gated_delta_rule.recurrent[gating]: {gating.unfit}"]
    assert "not run: the kernel takes no a=" in res.summary() and "not run: the kernel takes no a=" in res._repr_html_()

    def no_verify(q, k, v, g, beta, *, state, state_indices, cu_seqlens, scale=None, use_qk_l2norm=False,
                  pad_slot_id=-1, out=None):  # fmt: skip
        gdn.recurrent(
            q,
            k,
            v,
            g,
            beta,
            state=state,
            state_indices=state_indices,
            cu_seqlens=cu_seqlens,
            scale=scale,
            use_qk_l2norm=use_qk_l2norm,
            pad_slot_id=pad_slot_id,
            out=out,
            impl="reference",
        )

    res = check_kernel(no_verify, variants=("decode", "verify"), capture=False)
    assert res["decode"].ok and res["verify"].unfit == (
        "the kernel takes no intermediate_states=, disable_state_update= (the verify variant passes them)"
    )


def test_results_as_json_name_every_check():
    res = check_kernel("reference", "linear_attn.recurrent", "decode", conventions=("vllm",))
    doc = res.to_dict()
    assert doc["ok"] is True and doc["op"] == "linear_attn.recurrent" and doc["variants"][0]["variant"] == "decode"
    runs = doc["variants"][0]["conventions"]
    assert [(r["convention"], r["padded_rows"], r["ok"]) for r in runs] == [("vllm", "zero-length", True),
                                                                           ("vllm", "with tokens", True)]  # fmt: skip
    assert runs[0]["sentinel"] == 0 and doc["variants"][0]["capture"]["ok"] is True


def test_a_kernel_that_raises_is_reported_not_raised():
    def explodes(**kw):
        raise RuntimeError("boom")

    res = check_kernel(explodes, "mamba2.selective_state_update", variants=["decode"])
    assert not res.ok and all(c.error == "RuntimeError: boom" for c in res.results) and len(res.results) == 3
    cap = res["decode"].capture
    assert cap is not None and "capture raised RuntimeError: boom" in cap.detail
    assert res["vllm"].error_map() is None and res["vllm"].summary() == "vllm: raised RuntimeError: boom"


def test_one_error_raised_by_every_check_is_one_line_with_a_shape_to_try():
    def power_of_two_only(**kw):  # Triton's tl.arange(0, K) on K=12, as the interpreter words it
        raise ValueError("arange's range must be a power of 2")

    res = check_kernel(power_of_two_only, "linear_attn.recurrent")
    assert res.raised == "ValueError: arange's range must be a power of 2" and (res.num_checks, res.num_failed) == (
        12,
        12,
    )
    assert res.lines() == [
        "FAIL linear_attn.recurrent: every check (12) raised ValueError: arange's range must be a power of 2; the "
        "kernel may support only power-of-two sizes (K=12, V=20 here): try --shape quarter or --shape K=16,V=32"
    ]
    two = check_kernel(power_of_two_only, "linear_attn.recurrent", shapes={"K": 16, "V": 32}, capture=False)
    assert two.sizes["K"] == 16 and two.lines() == [f"FAIL linear_attn.recurrent: every check (10) raised {two.raised}"]
    one = check_kernel(power_of_two_only, "linear_attn.recurrent", "decode", conventions="sglang-ascend", capture=False)
    assert one.lines()[0].startswith("FAIL linear_attn.recurrent[decode] sglang-ascend: raised ValueError: ")
    assert one.lines()[0].endswith("try --shape quarter or --shape K=16,V=32") and len(one.lines()) == 1

    def raises_on_verify(**kw):
        if kw.get("intermediate_conv_windows") is not None:
            raise ValueError("arange's range must be a power of 2")
        conv.update(**kw, impl="reference")

    mixed = check_kernel(raises_on_verify, "causal_conv1d.update", capture=False)  # verify and tree raise
    assert mixed.raised is None and len(mixed.lines()) == 9 and (mixed.num_checks, mixed.num_failed) == (9, 6)


def test_a_kernel_returning_a_new_tensor_is_told_to_write_out():
    def returns_instead(**kw):
        out = kw.pop("out")
        return conv.update(**kw, out=torch.empty_like(out), impl="reference")

    res = check_convention(returns_instead, "causal_conv1d.update")
    assert not res.ok and "instead of writing out=" in res.summary()


def test_a_kernel_that_writes_cu_seqlens_or_reshapes_out_fails_naming_it_and_nothing_is_judged():
    def bumps_cu_seqlens(**kw):
        la.recurrent(**kw, impl="reference")
        kw["cu_seqlens"][-1] += 1

    res = check_convention(bumps_cu_seqlens, "linear_attn.recurrent", "extend", "vllm")
    assert not res.ok and res.check is None and res.error is None and res.error_map() is None
    assert res.summary() == (
        "vllm: the kernel wrote into `cu_seqlens` (element 5: 12 became 13): a kernel must only read the step's "
        "metadata (every layer reads the same tensors)"
    )
    assert res.to_dict()["problems"] == [res.misuse] and "cu_seqlens" in res._repr_html_()

    def views_out_as_one_row_less(**kw):  # the values are right; the caller's out is not what it now views
        la.recurrent(**kw, impl="reference")
        out = kw["out"]
        out.as_strided_((out.shape[0] - 1, *out.shape[1:]), out.stride(), out.stride(0))

    cap = check_capture(views_out_as_one_row_less, "linear_attn.recurrent", "decode", "sglang")
    assert not cap.ok and cap.check is None and cap.error is None
    assert cap.detail.startswith("the kernel resized `out` from [5, 2, 20] to [4, 2, 20]: a kernel must write")


def test_capture_refuses_a_host_read_and_catches_a_frozen_value():
    def syncs(**kw):
        int(kw["cu_seqlens"][-1])  # a host read: a device graph cannot hold it
        gdn.recurrent(**kw, impl="reference")

    res = check_kernel(syncs, variants="decode", conventions="sglang")
    assert res.results[0].ok and res["decode"].capture is not None and not res["decode"].capture.ok
    assert res["decode"].capture.detail.startswith("capture refused") and res.failures == ["decode: capture"]

    cache = {}

    def freezes_the_weights(**kw):  # keeps the first call's weights: a replay on new values is off
        kw["weight"] = cache.setdefault("w", kw["weight"].clone())
        conv.update(**kw, impl="reference")

    cap = check_capture(freezes_the_weights, "causal_conv1d.update")
    assert not cap.ok and "replay on new values" in cap.detail and "off the float64 reference" in cap.detail


# -- bad arguments ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"op": "gdn_recurrent"}, "op: unknown op 'gdn_recurrent'; choose one of \\['gated_delta_rule.recurrent'"),
        ({"variants": "prefill"}, "variants: gated_delta_rule.recurrent has no variant 'prefill'; choose one of"),
        ({"variants": ["decode", "medusa"]}, "variants: gated_delta_rule.recurrent has no variant 'medusa'"),
        ({"variants": []}, "variants: name at least one of \\['decode', 'gating', 'verify', 'tree', 'extend'\\]"),
        ({"conventions": ("sglang", "trtllm")}, "conventions: unknown convention 'trtllm'; choose from \\['sglang'"),
        ({"conventions": ()}, "conventions: name at least one of"),
        ({"shapes": "huge"}, "shapes: unknown preset 'huge'; choose one of \\['small', 'quarter', 'engine'\\]"),
        ({"shapes": {"Q": 3}}, "shapes: unknown size\\(s\\) \\['Q'\\]"),
        ({"shapes": {"K": 0}}, "shapes\\['K'\\]: must be an int >= 1, got 0"),
        ({"shapes": {"H": 2, "HV": 3}}, "shapes: gated_delta_rule.recurrent\\[decode\\] refuses them: .*HV=3"),
        ({"shapes": 7}, "shapes: a preset name or a mapping"),
        ({"rows": 0}, "rows: must be an int >= 1, got 0"),
        ({"seed": "x"}, "seed: must be an int, got 'x'"),
    ],
)
def test_bad_arguments_raise_a_kernelcheck_error_naming_the_value(kwargs, message):
    with pytest.raises(KernelCheckError, match=message) as err:
        check_kernel("reference", **kwargs)
    assert isinstance(err.value, WorkbenchError) and isinstance(err.value, ValueError)


def test_a_bad_impl_or_candidate_is_refused():
    with pytest.raises(KernelCheckError, match="impl: unknown implementation 'cuda'; choose one of"):
        check_kernel("cuda")
    with pytest.raises(KernelCheckError, match="fn: a function with the op's signature"):
        check_kernel(42)  # type: ignore[arg-type]


# -- results -----------------------------------------------------------------------------------------
class _Tags(HTMLParser):
    """Parses an HTML fragment, checking that every tag opened is closed in order."""

    VOID = {"br", "hr", "img", "input", "meta"}

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.rows: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.stack.append(tag)
        if tag == "tr":
            self.rows.append(dict(attrs).get("class") or "")

    def handle_endtag(self, tag):
        assert self.stack and self.stack.pop() == tag, f"</{tag}> closes nothing open"


def _parse(page: str) -> _Tags:
    p = _Tags()
    p.feed(page)
    p.close()
    assert not p.stack, f"unclosed tags {p.stack}"
    return p


def test_html_shows_one_row_per_convention_failures_vermillion_passes_green():
    def unguarded(**kw):
        kw["pad_slot_id"] = None
        conv.update(**kw, impl="reference")

    res = check_kernel(unguarded, "causal_conv1d.update", capture=False)
    page = res._repr_html_()
    tags = _parse(page)
    body_rows = tags.rows[1:]  # the header row first
    assert body_rows == ["wb-fail" if not c.ok else "wb-ok" for c in res.results] and len(body_rows) == 9
    assert "#D55E00" in page and "#009E73" in page  # vermillion failures, a green pass (Ascend)
    assert "unguarded" in page and "slot(s) [0] of conv_state changed" in page
    assert "FAIL: decode: sglang, decode: vllm, verify: sglang, verify: vllm, tree: sglang, tree: vllm" in page
    _parse(res["verify"]["vllm"]._repr_html_())
    good = check_kernel("reference", "causal_conv1d.update")
    assert "#D55E00" not in good._repr_html_() and _parse(good._repr_html_()).rows.count("wb-ok") == 9
    cap = good["verify"].capture
    assert cap is not None and "#009E73" in cap._repr_html_() and "verify capture: ok" in good._repr_html_()


def test_results_read_in_words():
    res = check_kernel(partial(gdn.recurrent, impl="reference"), "gated_delta_rule.recurrent", "verify")
    lines = repr(res).splitlines()
    assert lines[0] == 'gated_delta_rule.recurrent[verify] [gated_delta_rule.recurrent (impl="reference")]: OK'
    assert lines[1].startswith("  sglang (zero-length padded rows): ok (max error")
    assert lines[2].startswith("  sglang (padded rows with tokens): ok") and lines[-1].startswith("  capture: ok: ")
    assert repr(res["vllm"]).startswith("ConventionResult(vllm (zero-length padded rows): ok") and res.failures == []
    assert res["vllm+tokens"].padded_tokens and res["verify"]["vllm+tokens"] is res["vllm+tokens"]
    with pytest.raises(KeyError, match="'trtllm' was not checked"):
        res["trtllm"]
    with pytest.raises(KeyError, match="variant: 'vllm' was not checked; checked \\['decode', 'extend'\\]"):
        check_kernel("reference", "linear_attn.recurrent", capture=False)["vllm"]
    rows, heads, err = res["sglang"].error_map()
    assert len(rows) == len(err) == 3 + 2 + 1 and rows[-1] == "padding tokens"  # rows, padded rows, the tail
    assert heads[0] == "value head 0" and len(err[0]) == len(heads) == 2
    assert check_kernel("reference", "gated_delta_rule.scatter_accepted", "accept")["sglang"].error_map() is None


def test_candidate_names_are_readable():
    def my_kernel(**kw): ...

    class Kernel:
        def __call__(self, **kw): ...

    assert candidate_name(partial(gdn.recurrent, impl="triton")) == 'gated_delta_rule.recurrent (impl="triton")'
    assert candidate_name(gdn.recurrent) == "gated_delta_rule.recurrent"
    assert candidate_name(my_kernel).endswith("my_kernel") and "<function" not in candidate_name(my_kernel)
    assert candidate_name(Kernel()) == "test_candidate_names_are_readable.<locals>.Kernel"
    assert check_kernel("reference", capture=False, name="mine").candidate == "mine"


# -- the custom-op wrapper -----------------------------------------------------------------------------
def test_as_custom_op_registers_one_op_a_graph_holds():
    calls = []

    def my_update(x, conv_state, weight, bias=None, *, state_indices, activation=None, pad_slot_id=-1, out=None,
                  intermediate_conv_windows=None, disable_state_update=False):  # fmt: skip
        calls.append(pad_slot_id)
        conv.update(x, conv_state, weight, bias, state_indices=state_indices, activation=activation,
                    pad_slot_id=pad_slot_id, out=out, intermediate_conv_windows=intermediate_conv_windows,
                    disable_state_update=disable_state_update, impl="reference")  # fmt: skip

    op = as_custom_op(my_update, op="causal_conv1d.update", name="kernelcheck_test::update")
    assert op.mutates_args == mutated_args("causal_conv1d.update") == ("conv_state", "intermediate_conv_windows", "out")
    schema = str(torch.ops.kernelcheck_test.update.default._schema)
    assert "Tensor(a1!) conv_state" in schema and "Tensor(a9!)? out" in schema
    res = check_kernel(op, "causal_conv1d.update", "verify")
    assert res.ok, res.summary()
    assert res.candidate == "kernelcheck_test::update" and calls
    cap = res["verify"].capture
    assert cap is not None and [o for o in cap.ops if "kernelcheck_test" in o] == ["kernelcheck_test.update.default"]
    # out allocated and returned when not given, as the public op does
    call = res["sglang"].case.fresh()
    args = {k: v for k, v in call.args.items() if k != "out"}
    assert torch.equal(op(**args), conv.update(**res["sglang"].case.fresh().args, impl="reference"))


def test_as_custom_op_swaps_the_function_of_a_name_and_refuses_another_op():
    def first(**kw):
        conv.update(**kw, impl="reference")

    def second(**kw):
        kw["out"].zero_()

    name = "kernelcheck_test::swap"
    assert check_kernel(as_custom_op(first, op="causal_conv1d.update", name=name), "causal_conv1d.update").ok
    again = as_custom_op(second, op="causal_conv1d.update", name=name)  # a re-run notebook cell
    assert not check_kernel(again, "causal_conv1d.update", capture=False).ok
    with pytest.raises(KernelCheckError, match="name: 'kernelcheck_test::swap' is already registered for causal"):
        as_custom_op(first, op="mamba2.selective_state_update", name=name)
    with pytest.raises(KernelCheckError, match="name: a custom op is named 'namespace::op_name', got 'swap'"):
        as_custom_op(first, op="causal_conv1d.update", name="swap")
    with pytest.raises(KernelCheckError, match="mutates_args: causal_conv1d.update has no argument\\(s\\) \\['y'\\]"):
        as_custom_op(first, op="causal_conv1d.update", name="kernelcheck_test::other", mutates_args=("y",))
    with pytest.raises(KernelCheckError, match="op: unknown op 'conv'"):
        as_custom_op(first, op="conv", name="kernelcheck_test::other")
