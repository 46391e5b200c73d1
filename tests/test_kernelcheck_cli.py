"""``workbench check-kernel``: an unguarded kernel fails under sglang's convention naming the guard band or
the slot (exit 1), a guarded one passes (exit 0), bad input is one line and exit 2; any argv exits 0, 1 or
2 without a traceback."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _cli_run import run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# Plain linear attention in torch, one row at a time: ``state[slot]`` with no padding guard. Under sglang
# the sentinel -1 indexes the pool's last slot (Python's negative index), a live row's.
KERNELS = textwrap.dedent(
    '''
    from kernels.linear_attn.triton_recurrent import recurrent_triton
    from workbench.kernelcheck import as_custom_op


    def _rows(q, k, v, state, state_indices, cu_seqlens, scale, out, live):
        out.zero_()
        group = v.shape[1] // q.shape[1]
        bounds = cu_seqlens.tolist()
        for n, slot in enumerate(state_indices.tolist()):
            if not live(slot):
                continue
            S = state[slot].clone()
            for t in range(bounds[n], bounds[n + 1]):
                S = S + k[t].repeat_interleave(group, 0).unsqueeze(-1) * v[t].unsqueeze(-2)
                out[t] = (S * (scale * q[t].repeat_interleave(group, 0)).unsqueeze(-1)).sum(1)
            state[slot] = S


    def unguarded(q, k, v, *, state, state_indices, cu_seqlens, scale=None, pad_slot_id=-1, out=None):
        _rows(q, k, v, state, state_indices, cu_seqlens, scale, out, lambda slot: True)


    def guarded(q, k, v, *, state, state_indices, cu_seqlens, scale=None, pad_slot_id=-1, out=None):
        _rows(q, k, v, state, state_indices, cu_seqlens, scale, out,
              lambda slot: pad_slot_id is None or slot > pad_slot_id)


    def unguarded_triton(q, k, v, *, state, state_indices, cu_seqlens, scale=None, pad_slot_id=-1, out=None):
        """The built-in Triton launcher with its guard dropped: -1 addresses the slot before the pool."""
        recurrent_triton(q=q, k=k, v=v, state=state, state_indices=state_indices, cu_seqlens=cu_seqlens,
                         scale=scale, pad_slot_id=None, out=out)


    # a graph cannot hold the host reads above (cu_seqlens.tolist()): one custom op can
    guarded_op = as_custom_op(guarded, op="linear_attn.recurrent", name="kernelcheck_cli_test::guarded")
    NOT_A_FUNCTION = 3
    '''
)


@pytest.fixture
def kernels_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_kernels.py"
    path.write_text(KERNELS)
    return path


# Linear attention in Triton as kernels are often written: one program per (row, value head) holding the
# whole [K, V] state, tl.arange(0, K) and tl.arange(0, V) unmasked, so K and V must be powers of two (the
# "small" shapes' K=12, V=20 are not, on purpose). Program N writes zeros into the tokens past cu_seqlens[N].
# `unguarded` is its twin without the padded-row skip: sglang's -1 addresses the slot before the pool.
POW2_KERNELS = textwrap.dedent(
    """
    import triton
    import triton.language as tl

    from workbench.kernelcheck import as_custom_op


    @triton.jit
    def _attn(q, k, v, state, idx, cu, out, N, T, G, scale, pad, H: tl.constexpr, HV: tl.constexpr,
              K: tl.constexpr, V: tl.constexpr, GUARDED: tl.constexpr):
        n = tl.program_id(0)
        hv = tl.program_id(1)
        rk = tl.arange(0, K)
        rv = tl.arange(0, V)
        bos = tl.load(cu + n).to(tl.int64)
        eos = tl.load(cu + n + 1, mask=n < N, other=T).to(tl.int64)
        slot = tl.load(idx + n, mask=n < N, other=0).to(tl.int64)
        live = (n + 0 * rv) < N
        if GUARDED:
            live = live & ((slot + 0 * rv) > pad)
        tile = state + ((slot * HV + hv) * K + rk[:, None]) * V + rv[None, :]
        m = (rk[:, None] >= 0) & live[None, :]
        S = tl.load(tile, mask=m, other=0.0)
        for t in range(bos, eos):
            qt = tl.load(q + (t * H + hv // G) * K + rk)
            kt = tl.load(k + (t * H + hv // G) * K + rk)
            vt = tl.load(v + (t * HV + hv) * V + rv)
            S += kt[:, None] * vt[None, :]
            o = tl.sum(S * (scale * qt)[:, None], axis=0)
            tl.store(out + (t * HV + hv) * V + rv, tl.where(live, o, 0.0))
        tl.store(tile, S, mask=m)


    def _launch(q, k, v, state, state_indices, cu_seqlens, scale, pad_slot_id, out, guarded):
        T, H, K = q.shape
        HV, V = v.shape[1], v.shape[2]
        N = state_indices.shape[0]
        _attn[(N + 1, HV)](q, k, v, state, state_indices, cu_seqlens, out, N, T, HV // H, float(scale),
                           0 if pad_slot_id is None else pad_slot_id, H=H, HV=HV, K=K, V=V,
                           GUARDED=guarded and pad_slot_id is not None)


    def pow2(q, k, v, *, state, state_indices, cu_seqlens, scale=None, pad_slot_id=-1, out=None):
        _launch(q, k, v, state, state_indices, cu_seqlens, scale, pad_slot_id, out, True)


    def unguarded(q, k, v, *, state, state_indices, cu_seqlens, scale=None, pad_slot_id=-1, out=None):
        _launch(q, k, v, state, state_indices, cu_seqlens, scale, pad_slot_id, out, False)


    # a raw Triton launch in the interpreter swaps storages: a graph holds it as one custom op
    pow2_op = as_custom_op(pow2, op="linear_attn.recurrent", name="kernelcheck_cli_test::pow2")
    unguarded_op = as_custom_op(unguarded, op="linear_attn.recurrent", name="kernelcheck_cli_test::unguarded")
    """
)

# A causal conv1d update that zeros its intermediate windows first (an engine's memset), then writes the live
# rows': the padded rows' windows, which the reference leaves unwritten and nobody reads, hold zeros.
# `scribbles` writes values there instead, `forgets` leaves a live row's windows unwritten.
CONV_KERNELS = textwrap.dedent(
    """
    from kernels.causal_conv1d import update


    def zeroing(x, conv_state, weight, bias=None, *, state_indices, activation=None, intermediate_conv_windows=None,
                disable_state_update=False, pad_slot_id=-1, out=None, fill=0.0, live_fill=None,
                retrieve_parent_token=None):
        if intermediate_conv_windows is not None:
            intermediate_conv_windows.fill_(fill)
        update(x, conv_state, weight, bias, state_indices=state_indices, activation=activation,
               intermediate_conv_windows=intermediate_conv_windows, disable_state_update=disable_state_update,
               pad_slot_id=pad_slot_id, out=out, retrieve_parent_token=retrieve_parent_token, impl="reference")
        if intermediate_conv_windows is not None and live_fill is not None:
            intermediate_conv_windows[0] = live_fill


    def scribbles(x, conv_state, weight, bias=None, *, state_indices, activation=None,
                  intermediate_conv_windows=None, disable_state_update=False, pad_slot_id=-1, out=None):
        zeroing(x, conv_state, weight, bias, state_indices=state_indices, activation=activation,
                intermediate_conv_windows=intermediate_conv_windows, disable_state_update=disable_state_update,
                pad_slot_id=pad_slot_id, out=out, fill=0.25)


    def forgets(x, conv_state, weight, bias=None, *, state_indices, activation=None,
                intermediate_conv_windows=None, disable_state_update=False, pad_slot_id=-1, out=None):
        zeroing(x, conv_state, weight, bias, state_indices=state_indices, activation=activation,
                intermediate_conv_windows=intermediate_conv_windows, disable_state_update=disable_state_update,
                pad_slot_id=pad_slot_id, out=out, live_fill=float("nan"))
    """
)


@pytest.fixture
def pow2_file(tmp_path: Path) -> Path:
    path = tmp_path / "pow2_kernels.py"
    path.write_text(POW2_KERNELS)
    return path


def test_a_conv_update_that_zeros_the_padded_rows_intermediate_windows_passes(tmp_path: Path) -> None:
    """The issue's false FAIL: the reference leaves the padded rows' intermediate windows unwritten (NaN), the
    kernel zeroed them, and the message said the kernel left NaN. Zero or unwritten are accepted there."""
    path = tmp_path / "conv_kernels.py"
    path.write_text(CONV_KERNELS)
    argv = ["check-kernel", "--op", "causal_conv1d.update", "--no-capture"]
    code, out, err = run([*argv, f"{path}:zeroing"])
    assert code == 0 and not err, out
    assert out.splitlines()[-1] == "causal_conv1d.update [zeroing]: OK, 9 checks passed (decode, verify, tree)"
    code, out, _ = run([*argv, f"{path}:scribbles", "--variant", "verify"])
    fails = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert code == 1 and len(fails) == 2, out  # sglang and vllm skip the padded rows; Ascend processes them
    assert all("the kernel wrote non-zero values (e.g. 0.25) into intermediate_conv_windows rows 3-4, which the "
               "reference leaves unwritten (NaN)" in line for line in fails)  # fmt: skip
    code, out, _ = run([*argv, f"{path}:forgets", "--variant", "verify", "--convention", "vllm"])
    line = out.splitlines()[0]
    assert code == 1 and line.startswith("FAIL causal_conv1d.update[verify] vllm: 360 output value(s) never "
                                         "written: the kernel left NaN where the reference is finite "
                                         "(intermediate_conv_windows row 0); live rows 0-2")  # fmt: skip


# Causal conv1d updates that compute the right values with the reference op, then do to an argument what a
# kernel must not: resize or replace a tensor it was given (the caller reads the tensor it passed, not the
# kernel's new one), or write the metadata it must only read. `swaps_out` writes correct values, into a
# storage the caller never sees: judged on `out` as it is after the call, it would pass.
MISUSE_KERNELS = textwrap.dedent(
    """
    import torch

    from kernels.causal_conv1d import update


    def _update(x, conv_state, weight, bias, state_indices, activation, pad_slot_id, out, kw):
        update(x, conv_state, weight, bias, state_indices=state_indices, activation=activation,
               pad_slot_id=pad_slot_id, out=out, impl="reference", **kw)


    def shrinks_out(x, conv_state, weight, bias=None, *, state_indices, activation=None, pad_slot_id=-1, out=None,
                    **kw):
        _update(x, conv_state, weight, bias, state_indices, activation, pad_slot_id, out, kw)
        out.resize_(0)


    def grows_out(x, conv_state, weight, bias=None, *, state_indices, activation=None, pad_slot_id=-1, out=None,
                  **kw):
        _update(x, conv_state, weight, bias, state_indices, activation, pad_slot_id, out, kw)
        out.resize_(10**6)


    def shrinks_pool(x, conv_state, weight, bias=None, *, state_indices, activation=None, pad_slot_id=-1,
                     out=None, **kw):
        _update(x, conv_state, weight, bias, state_indices, activation, pad_slot_id, out, kw)
        conv_state.resize_(1)


    def swaps_out(x, conv_state, weight, bias=None, *, state_indices, activation=None, pad_slot_id=-1, out=None,
                  **kw):
        out.set_(torch.empty_like(out))
        _update(x, conv_state, weight, bias, state_indices, activation, pad_slot_id, out, kw)


    def shrinks_windows(x, conv_state, weight, bias=None, *, state_indices, activation=None, pad_slot_id=-1,
                        out=None, **kw):
        _update(x, conv_state, weight, bias, state_indices, activation, pad_slot_id, out, kw)
        kw["intermediate_conv_windows"].resize_(2)


    def rewrites_indices(x, conv_state, weight, bias=None, *, state_indices, activation=None, pad_slot_id=-1,
                         out=None, **kw):
        _update(x, conv_state, weight, bias, state_indices, activation, pad_slot_id, out, kw)
        state_indices[0] = pad_slot_id
    """
)
IN_PLACE = "a kernel must write its arguments in place, never resize or replace them"


@pytest.mark.parametrize(
    "name, variant, what",
    [
        ("shrinks_out", "decode", f"the kernel resized `out` from [5, 1, 40] to [0]: {IN_PLACE}"),
        ("grows_out", "decode", f"the kernel resized `out` from [5, 1, 40] to [1000000]: {IN_PLACE}"),
        ("shrinks_pool", "decode", f"the kernel resized `conv_state` from [6, 40, 3] to [1]: {IN_PLACE}"),
        ("swaps_out", "decode",
         f"the kernel replaced the storage of `out` (set_ or .data =): the caller reads the old one: {IN_PLACE}"),
        ("shrinks_windows", "verify",
         f"the kernel resized `intermediate_conv_windows` from [5, 3, 40, 3] to [2]: {IN_PLACE}"),
        ("rewrites_indices", "decode", "the kernel wrote into `state_indices` (element 0: 4 became -1): a kernel "
         "must only read the step's metadata (every layer reads the same tensors)"),
    ],
)  # fmt: skip
def test_a_kernel_that_resizes_or_replaces_an_argument_fails_in_one_line_naming_it(
    tmp_path: Path, name: str, variant: str, what: str
) -> None:
    """Before, these raised out of the check (a comparison of tensors of other shapes, a slot past a resized
    pool) or passed on a storage the caller never reads; now each check, convention and capture, fails in
    one line saying what the kernel did to which argument."""
    path = tmp_path / "misuse_kernels.py"
    path.write_text(MISUSE_KERNELS)
    code, out, err = run(["check-kernel", f"{path}:{name}", "--op", "causal_conv1d.update", "--variant", variant,
                          "--convention", "sglang"])  # fmt: skip
    assert code == 1 and not err and "Traceback" not in out, out + err
    op = f"causal_conv1d.update[{variant}]"
    assert out.splitlines() == [
        f"FAIL {op} sglang: {what}",
        f"FAIL {op} capture (sglang): {what}",  # the warm-up did it before the recorder saw the call
        f"causal_conv1d.update [{name}]: FAILED, 2 of 2 checks ({variant}: sglang, {variant}: capture)",
    ]


@pytest.mark.slow  # every check of an op, twice, with capture
def test_a_power_of_two_kernel_fails_in_one_line_on_small_shapes_and_passes_on_powers_of_two(pow2_file: Path) -> None:
    """The "small" shapes (K=12, V=20) make every check raise the interpreter's arange error: one line says so
    and which --shape to try; on K=16, V=16 the kernel passes, captured, and its unguarded twin fails."""
    argv = ["check-kernel", "--op", "linear_attn.recurrent"]
    code, out, err = run([*argv, f"{pow2_file}:pow2_op"])
    assert code == 1 and not err, err
    assert out.splitlines() == [
        "FAIL linear_attn.recurrent: every check (12) raised InterpreterError: ValueError(\"arange's range must be "
        'a power of 2"); the kernel may support only power-of-two sizes (K=12, V=20 here): try --shape quarter or '
        "--shape K=16,V=32",
        "linear_attn.recurrent [kernelcheck_cli_test::pow2]: FAILED, 12 of 12 checks (the same error)",
    ]
    code, out, err = run([*argv, f"{pow2_file}:pow2_op", "--shape", "K=16,V=16"])
    assert code == 0 and not err, out
    assert (
        out.splitlines()[-1]
        == "linear_attn.recurrent [kernelcheck_cli_test::pow2]: OK, 12 checks passed (decode, extend)"
    )
    code, out, err = run(
        [*argv, f"{pow2_file}:unguarded", "--shape", "K=16,V=16", "--variant", "decode", "--no-capture"]
    )
    assert code == 1 and not err, err
    sglang = next(line for line in out.splitlines() if "[decode] sglang (padded rows with tokens)" in line)
    assert sglang.startswith("FAIL") and "guard band before state" in sglang


@pytest.mark.slow  # the quarter preset (K=V=128, 8 value heads) in the Triton interpreter: about 30 seconds
def test_the_power_of_two_kernel_passes_on_the_quarter_shapes_and_its_unguarded_twin_fails(pow2_file: Path) -> None:
    argv = ["check-kernel", "--op", "linear_attn.recurrent", "--shape", "quarter"]
    code, out, err = run([*argv, f"{pow2_file}:pow2_op"])
    assert code == 0 and not err, out
    assert (
        out.splitlines()[-1]
        == "linear_attn.recurrent [kernelcheck_cli_test::pow2]: OK, 12 checks passed (decode, extend)"
    )
    code, out, err = run([*argv, f"{pow2_file}:unguarded_op"])
    assert code == 1 and not err, err
    assert out.splitlines()[-1].startswith("linear_attn.recurrent [kernelcheck_cli_test::unguarded]: FAILED, 4 of 12")
    assert "guard band before state" in out and "slot(s) [0] of state changed" in out


@pytest.mark.parametrize(
    "shape, words",
    [
        ("Q=3", "--shape 'Q=3': unknown size 'Q' (Q=3); the sizes these variants use: H, HV, K, V"),
        ("K=abc", "--shape 'K=abc': K must be an int >= 1, got 'abc'"),
        ("K=0", "--shape 'K=0': K must be an int >= 1, got '0'"),
        ("K=1_6", "--shape 'K=1_6': K must be an int >= 1, got '1_6'"),
        ("dim=16", "--shape 'dim=16': these variants draw no dim; the sizes they use: H, HV, K, V"),
        ("K=16,K=32", "--shape 'K=16,K=32': K given twice"),
        ("K=16,,V=32", "--shape 'K=16,,V=32': '' is not NAME=INT"),
        ("huge", "--shape 'huge': not a preset (small, quarter, engine) nor NAME=INT sizes such as K=16,V=32"),
        ("H=3", "--shape 'H=3': linear_attn.recurrent[decode] refuses them: "),
        ("K=100000,V=100000", "--shape 'K=100000,V=100000' needs 2.9 TiB for a check of linear_attn.recurrent"),
    ],
)
def test_a_bad_shape_exits_2_in_one_line_naming_the_size(
    kernels_file: Path, shape: str, words: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workbench import limits

    monkeypatch.setattr(limits, "host_memory_bytes", lambda: 16 * 2**30)
    code, out, err = run(["check-kernel", f"{kernels_file}:guarded", "--op", "linear_attn.recurrent",
                          "--variant", "decode", "--shape", shape])  # fmt: skip
    assert code == 2 and not out, out
    assert err.startswith("workbench check-kernel: error: ") and words in err and len(err.splitlines()) == 1, err


def test_an_unguarded_kernel_fails_under_sglang_naming_the_slot_and_the_rows(kernels_file: Path) -> None:
    argv = ["check-kernel", f"{kernels_file}:unguarded", "--op", "linear_attn.recurrent", "--no-capture"]
    code, out, err = run(argv)
    assert code == 1 and not err, err
    fails = [line for line in out.splitlines() if line.startswith("FAIL")]
    # zero-length padded rows hide it (the same bytes go back); padded rows with tokens do not
    assert "ok   linear_attn.recurrent[decode] sglang (zero-length padded rows)" in out
    sglang = next(line for line in fails if "[decode] sglang (padded rows with tokens)" in line)
    assert re.search(r"live slot\(s\) \[\d+\] off the reference", sglang)
    assert "live rows 0-2 on slot(s) [" in sglang and "padded rows 3-4 hold -1 (with tokens)" in sglang
    assert any("[extend] vllm (padded rows with tokens)" in line and "slot(s) [0] of state changed" in line
               for line in fails)  # fmt: skip
    assert not any("sglang-ascend" in line for line in fails)  # Ascend processes padded rows on purpose
    assert out.splitlines()[-1].startswith("linear_attn.recurrent [unguarded]: FAILED, 4 of 10 checks")


def test_an_unguarded_triton_launch_writes_the_guard_band_under_sglang(kernels_file: Path) -> None:
    argv = ["check-kernel", f"{kernels_file}:unguarded_triton", "--op", "linear_attn.recurrent",
            "--variant", "decode", "--convention", "sglang", "--no-capture"]  # fmt: skip
    code, out, err = run(argv)
    assert code == 1 and not err, err
    line = next(line for line in out.splitlines() if line.startswith("FAIL"))
    assert line.startswith("FAIL linear_attn.recurrent[decode] sglang (padded rows with tokens): memory outside")
    assert "guard band before state" in line and "hold -1" in line
    assert len(out.splitlines()) == 3  # two checks (both forms of padded rows) and the verdict


def test_a_guarded_kernel_passes_and_json_says_so(kernels_file: Path) -> None:
    code, out, err = run(["check-kernel", f"{kernels_file}:guarded_op", "--op", "linear_attn.recurrent"])
    assert code == 0 and not err, err
    assert not any(line.startswith("FAIL") for line in out.splitlines())
    assert "ok   linear_attn.recurrent[extend] capture (sglang): 1 recorded op(s); replay on new values" in out
    last = "linear_attn.recurrent [kernelcheck_cli_test::guarded]: OK, 12 checks passed (decode, extend)"
    assert out.splitlines()[-1] == last
    # the plain function passes every convention; its host read fails the capture, and so the command
    code, out, _ = run(["check-kernel", f"{kernels_file}:guarded", "--op", "linear_attn.recurrent"])
    fails = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert code == 1 and len(fails) == 2 and all("capture (sglang): capture refused: host sync" in f for f in fails)
    code, out, _ = run(["check-kernel", f"{kernels_file}:guarded", "--op", "linear_attn.recurrent", "--json",
                        "--convention", "vllm", "--convention", "sglang", "--no-capture"])  # fmt: skip
    doc = json.loads(out)
    assert code == 0 and doc["ok"] is True and [v["variant"] for v in doc["variants"]] == ["decode", "extend"]
    conventions = [(c["convention"], c["padded_rows"]) for c in doc["variants"][0]["conventions"]]
    assert conventions == [("vllm", "zero-length"), ("vllm", "with tokens"), ("sglang", "zero-length"),
                           ("sglang", "with tokens")]  # fmt: skip
    code, out, _ = run(["check-kernel", f"{kernels_file}:unguarded", "--op", "linear_attn.recurrent", "--json"])
    assert code == 1 and json.loads(out)["ok"] is False


def test_the_public_op_by_module_name_passes() -> None:
    code, out, _ = run(["check-kernel", "kernels.causal_conv1d:update", "--op", "causal_conv1d.update"])
    assert code == 0, out
    assert "causal_conv1d.update[verify] vllm: max error" in out  # every row has inputs: one form only


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--op", "gdn"], "op: unknown op 'gdn'; choose one of ['gated_delta_rule.recurrent'"),
        (["--op", "linear_attn.recurrent", "--variant", "verify"],
         "variants: linear_attn.recurrent has no variant 'verify'; choose one of ['decode', 'extend']"),
        (["--op", "linear_attn.recurrent", "--convention", "trtllm"], "argument --convention: invalid choice"),
        (["--variant", "decode"], "the following arguments are required: --op"),
    ],
)  # fmt: skip
def test_bad_op_variant_or_convention_exits_2_in_one_line(kernels_file: Path, argv: list[str], words: str) -> None:
    code, out, err = run(["check-kernel", f"{kernels_file}:guarded", *argv])
    assert code == 2 and not out
    assert err.startswith("workbench check-kernel: error: ") and words in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "spec, words",
    [
        ("{file}:NOT_A_FUNCTION", "'{file}:NOT_A_FUNCTION': not callable (a int object); name a function with"),
        ("{file}:missing", "defines no 'missing'"),
        ("{dir}/nope.py:f", "no file"),
        ("{file}", "expected MODULE:NAME or path/to/file.py:NAME"),
        ("no_such_module_kc:f", "importing 'no_such_module_kc' raised ModuleNotFoundError"),
        ("{broken}:f", "raised RuntimeError: boom at import"),
    ],
)
def test_a_spec_that_does_not_load_exits_2_in_one_line(kernels_file: Path, spec: str, words: str) -> None:
    broken = kernels_file.parent / "broken_kernels.py"
    broken.write_text("raise RuntimeError('boom at import')\n")
    fill = {"file": kernels_file, "dir": kernels_file.parent, "broken": broken}
    code, out, err = run(["check-kernel", spec.format(**fill), "--op", "linear_attn.recurrent"])
    assert code == 2 and not out
    assert err.startswith("workbench check-kernel: error: ") and words.format(**fill) in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_help_and_bad_input_never_import_torch() -> None:
    code = (
        "import sys, contextlib, io\n"
        "import workbench.cli as cli\n"
        "for argv in (['check-kernel', '--help'], ['check-kernel', 'x:y', '--convention', 'nope', '--op', 'z']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "        try:\n"
        "            cli.main(argv)\n"
        "        except SystemExit:\n"
        "            pass\n"
        "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]"


SPECS = st.sampled_from(["{file}:guarded", "{file}:unguarded", "kernels.linear_attn:recurrent"]) | st.sampled_from(
    ["{file}:NOT_A_FUNCTION", "{file}:nope", "{file}", "nope_kc:f", "", ":", "{file}:1x"]
)
OPS = st.just("linear_attn.recurrent") | st.sampled_from([None, "causal_conv1d.update", "linear_attn", "", "-1"])
VALUES = ["decode", "extend", "verify", "sglang", "vllm", "trtllm", "", "--json", "\u00e9", "-", "K=16,V=32", "K=0",
          "quarter", "dim=8", "Q=1", "K=2**40"]  # fmt: skip
FLAGS = ["--variant", "--convention", "--op", "--shape"]
GROUPS = st.sampled_from(
    [["--variant", "decode"], ["--variant", "extend"], ["--convention", "sglang"], ["--convention", "vllm"],
     ["--json"], ["--bogus"], ["extra"], ["--shape", "K=16,V=32"], ["--shape", "small"]]
) | st.tuples(st.sampled_from(FLAGS), st.sampled_from(VALUES)).map(list)  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    spec=SPECS,
    op=OPS,
    groups=st.lists(GROUPS, max_size=3),
    shuffle=st.randoms(use_true_random=False),
)
def test_any_argv_exits_0_1_or_2_and_an_error_is_one_line(kernels_file, spec, op, groups, shuffle) -> None:
    """A mostly valid command (the spec, --op and 0-3 options with their kind of value, a stray word), in
    any order: 0, 1 or 2, never a traceback; an error is one line."""
    parts = [[spec.format(file=kernels_file)], *([["--op", op]] if op is not None else []), *groups]
    shuffle.shuffle(parts)
    argv = [word for part in parts for word in part]
    code, out, err = run(["check-kernel", *argv, "--no-capture"])
    assert code in (0, 1, 2) and "Traceback" not in err, (argv, code, err)
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(("workbench check-kernel: error: ", "workbench: error: "))
    elif "--json" in argv:
        assert not err and json.loads(out)["ok"] is (code == 0), out
    else:
        assert not err and out.splitlines()[-1].split(": ")[1].startswith("OK" if code == 0 else "FAILED"), out
