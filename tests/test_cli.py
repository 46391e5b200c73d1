"""The `workbench` command line: tables and JSON for every profile and mode, errors, doctor."""

import json
import subprocess
import sys

import pytest

from workbench.cli import main

PROFILES = ["sglang", "sglang-ascend", "vllm"]


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize(
    "mode,extra,qsl",
    [
        ("decode", ["--seq-lens", "7,3,9"], [0, 1, 2, 3, 3]),
        ("target_verify", ["--seq-lens", "7,3,9", "-D", "2", "--buckets", "2,4"], [0, 2, 4, 6, 6]),
        ("extend", ["--extend-lens", "4,1,6", "--prefix-lens", "0,3,2"], [0, 4, 5, 11, 11]),
        ("idle", [], [0, 0]),
    ],
)
def test_metadata_json_all_profiles_modes(profile, mode, extra, qsl, capsys):
    assert main(["metadata", "--profile", profile, "--mode", mode, *extra, "--bucket", "auto", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["profile"] == profile and out["forward_mode"] == mode
    assert out["query_start_loc"] == qsl
    r = out["raw_batch_size"]
    pads = out["state_indices"][r:]
    sentinel = {"sglang": -1, "sglang-ascend": 0, "vllm": 0}[profile]
    flat = [v for row in pads for v in (row if isinstance(row, list) else [row])]
    assert flat and all(v == sentinel for v in flat)
    assert out["num_padding"] == out["batch_size"] - r


def test_metadata_table_text(capsys):
    assert main(["metadata", "--profile", "sglang", "--mode", "decode", "--seq-lens", "7,3,9"]) == 0
    out = capsys.readouterr().out
    assert "raw_bs=3  bs=4  padding=1" in out
    assert out.splitlines()[-2].split()[:4] == ["3", "pad", "0", "-1"]
    assert "query_start_loc = [0, 1, 2, 3, 3]" in out


def test_metadata_errors_are_clear(capsys):
    assert main(["metadata", "--mode", "decode", "--seq-lens", "3,0"]) == 2
    assert "seq_lens[1] = 0" in capsys.readouterr().err
    assert main(["metadata", "--mode", "decode"]) == 2
    assert "--seq-lens is required" in capsys.readouterr().err
    assert main(["metadata", "--seq-lens", "1,2,3", "--bucket", "2", "--buckets", "1,2"]) == 2
    assert "larger than bucket 2" in capsys.readouterr().err


@pytest.mark.slow  # a fresh interpreter (subprocess)
def test_console_entry_point_runs():
    res = subprocess.run(
        [sys.executable, "-m", "workbench", "metadata", "--seq-lens", "5,6", "--profile", "vllm"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "profile=vllm" in res.stdout


def test_doctor_reports_every_device(capsys):
    assert main(["doctor", "--no-npu-probe"]) == 0
    out = capsys.readouterr().out
    for name in ("cpu", "cuda", "npu", "triton"):
        assert any(line.startswith(name) for line in out.splitlines())


def test_devices_explains_npu():
    from workbench.devices import devices

    npu = {d.name: d for d in devices()}["npu"]
    assert not npu.usable and "torch_npu" in npu.detail


def test_demo_prints_tour(capsys):
    from workbench.demo import run_demo

    assert run_demo(out=None) == 0
    out = capsys.readouterr().out
    assert out.count("profile=") == 6
