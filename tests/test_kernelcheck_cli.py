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
VALUES = ["decode", "extend", "verify", "sglang", "vllm", "trtllm", "", "--json", "\u00e9", "-"]
GROUPS = st.sampled_from(
    [["--variant", "decode"], ["--variant", "extend"], ["--convention", "sglang"], ["--convention", "vllm"],
     ["--json"], ["--bogus"], ["extra"]]
) | st.tuples(st.sampled_from(["--variant", "--convention", "--op"]), st.sampled_from(VALUES)).map(list)  # fmt: skip


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
