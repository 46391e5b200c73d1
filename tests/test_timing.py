"""measure.timing and measure.ceilings: one timer per device, one record schema, compare, ceilings."""

import json
import math
import time

import pytest
import torch

from workbench.measure.ceilings import Ceilings, measure_ceilings
from workbench.measure.timing import (
    Results,
    TimingError,
    TimingRecord,
    compare,
    resolve_device,
    time_fn,
)


def _rec(median: float, **kw) -> TimingRecord:
    base = dict(what="op", device="cpu", shape={"bs": 4}, impl="reference", mode="eager", median_us=median)
    base.update(iqr_us=median / 10, n=7, threads=1, bytes=4096, flops=8192, env={"torch": torch.__version__})
    base.update(kw)
    return TimingRecord(**base)


def test_cpu_timer_measures_a_sleep_of_known_length():
    rec = time_fn(lambda: time.sleep(0.005), what="sleep", device="cpu", min_run_time=0.1)
    # sleep never returns early; a loaded machine may overshoot, but not by 3 ms on the median
    assert 5000 <= rec.median_us < 8000, rec
    assert rec.n >= 5 and rec.iqr_us >= 0 and rec.device == "cpu"
    assert rec.measurement is not None and math.isclose(rec.measurement.median * 1e6, rec.median_us)


@pytest.mark.parametrize("threads", [1, 2])
def test_cpu_timer_records_the_threads_it_really_used(threads):
    before = torch.get_num_threads()
    seen = []
    rec = time_fn(lambda: seen.append(torch.get_num_threads()), what="probe", threads=threads, min_run_time=0.01)
    assert rec.threads == threads and set(seen) == {threads}  # the timed code ran with what the record says
    assert torch.get_num_threads() == before  # and the caller's setting is back


def test_records_round_trip_through_json(tmp_path):
    live = time_fn(lambda: sum(range(50)), what="sum", shape={"bs": 2}, impl="py", mode="eager", min_run_time=0.01)
    res = Results([live, _rec(12.5), _rec(30.0, mode="replay", bytes=None, flops=None)], {"benchmark": "t"})
    path = res.save(tmp_path / "r_cpu.json")
    text = path.read_text()
    assert "measurement" not in text  # the torch Measurement stays in memory only
    back = Results.load(path)
    assert back.meta == res.meta and len(back) == 3
    for a, b in zip(res, back, strict=True):
        assert a.to_dict() == b.to_dict() and a == b
    assert back[0].measurement is None


def test_load_rejects_other_schemas_with_a_line(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"benchmark": "replay", "results": []}))
    with pytest.raises(TimingError, match="schema: expected 'workbench.timing/1', got None"):
        Results.load(old)
    with pytest.raises(TimingError, match="path: no results file"):
        Results.load(tmp_path / "missing.json")
    with pytest.raises(TimingError, match="missing fields \\['median_us'\\]"):
        TimingRecord.from_dict({k: v for k, v in _rec(1.0).to_dict().items() if k != "median_us"})


def test_save_never_creates_folders(tmp_path):
    with pytest.raises(TimingError, match="does not exist"):
        Results([_rec(1.0)]).save(tmp_path / "no" / "such" / "r.json")
    assert not (tmp_path / "no").exists()


def test_compare_with_itself_is_one_and_pairs_by_key():
    a = Results([_rec(10.0, shape={"bs": b}) for b in (1, 2, 4)])
    assert compare(a[0], a[0]) == 1.0
    assert compare(a, a).values() == [1.0, 1.0, 1.0]
    # two impls: pairs by shape and mode, ratio a/b
    fast = Results([_rec(5.0, shape={"bs": b}, impl="triton") for b in (1, 2, 4)])
    r = compare(a, fast)
    assert r.fields == ("what", "device", "shape", "mode") and r.values() == [2.0, 2.0, 2.0]
    # eager vs replay of one run
    run = Results([_rec(9.0, shape={"bs": 1}), _rec(3.0, shape={"bs": 1}, mode="replay"), _rec(8.0, shape={"bs": 2})])
    sp = compare(run.filter(mode="eager"), run.filter(mode="replay"))
    assert [(k["shape"], v) for k, v in sp.rows] == [({"bs": 1}, 3.0)]  # bs=2 has no replay: not paired
    assert "3.000" in sp._repr_html_()


def test_to_frame_has_one_row_per_record_with_shape_columns():
    pytest.importorskip("pandas")
    res = Results([_rec(10.0, shape={"bs": 1}), _rec(20.0, shape={"bs": 2})])
    df = res.to_frame()
    assert list(df["bs"]) == [1, 2] and list(df["median_us"]) == [10.0, 20.0]
    assert list(df["gbps"]) == [4096 / 10e3, 4096 / 20e3]


def test_repr_and_html_show_the_numbers():
    rec = _rec(1500.0, iqr_us=900.0)
    assert "op [bs=4] reference/eager on cpu: 1.50 ms median" in repr(rec)
    page = Results([rec], {"benchmark": "demo"})._repr_html_()
    assert "<table" in page and "1.50 ms" in page and "background:#fde9d9" in page  # noisy IQR shaded


def test_bad_inputs_get_a_line():
    with pytest.raises(TimingError, match="min_run_time: expected seconds > 0, got -1"):
        time_fn(lambda: None, what="x", min_run_time=-1)
    with pytest.raises(TimingError, match="fn: expected a callable, got int"):
        time_fn(3, what="x")  # type: ignore[arg-type]
    with pytest.raises(TimingError, match="device: expected cpu, cuda or npu, got 'meta'"):
        time_fn(lambda: None, what="x", device="meta")
    with pytest.raises(TimingError, match="device: expected cpu, cuda or npu, got 'tpu:0'"):
        time_fn(lambda: None, what="x", device="tpu:0")  # not a torch device type at all: still one line
    if not torch.cuda.is_available():
        with pytest.raises(TimingError, match="device: 'cuda' is not available here \\(no CUDA device\\)"):
            time_fn(lambda: None, what="x", device="cuda")
    with pytest.raises(
        TimingError, match=r"--device: expected auto, cpu, cuda or npu \(with an optional index: cuda:1\), got 'tpu'"
    ):
        resolve_device("tpu")


def test_ceilings_and_fractions():
    ceil = measure_ceilings("cpu", copy_bytes=2**22, matmul_n=128, min_run_time=0.02, threads=1)
    assert ceil.copy_gbps > 0 and ceil.matmul_tflops > 0 and ceil.device == "cpu"
    assert Ceilings.from_dict(ceil.to_dict()) == ceil
    known = Ceilings(copy_gbps=2.0, matmul_tflops=0.5)
    rec = _rec(1.0, bytes=1000, flops=250_000)  # 1 GB/s and 0.25 TFLOP/s
    assert known.fraction_of_copy(rec) == pytest.approx(0.5) and known.fraction_of_matmul(rec) == pytest.approx(0.5)
    assert known.fraction_of_copy(_rec(1.0, bytes=None)) is None


def test_cuda_timer_uses_events():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here: the CUDA-event timer runs where one is lent")
    x = torch.randn(1 << 20, device="cuda")
    rec = time_fn(lambda: x.mul_(1.0), what="mul", device="cuda", min_run_time=0.05)
    assert rec.device == "cuda" and rec.n >= 10 and rec.median_us > 0 and len(rec.measurement) == rec.n
    ceil = measure_ceilings("cuda", copy_bytes=2**28, matmul_n=4096, min_run_time=0.05)
    assert ceil.copy_gbps > 100 and ceil.matmul_tflops > 1


def test_npu_timer_uses_npu_events():
    if getattr(torch, "npu", None) is None or not torch.npu.is_available():
        pytest.skip("no Ascend NPU here (torch_npu is never installed in this environment)")
    x = torch.randn(1 << 20, device="npu")
    rec = time_fn(lambda: x.mul_(1.0), what="mul", device="npu", min_run_time=0.05)
    assert rec.device == "npu" and rec.n >= 10 and rec.median_us > 0


def test_kernel_sweep_records_the_cost_functions_bytes_and_flops():
    from kernels.causal_conv1d.cost import update_cost
    from kernels.gated_delta_rule.cost import recurrent_cost
    from workbench.bench import kernels as kernel_sweep

    res = kernel_sweep.sweep(
        [2], ops=["gdn_recurrent", "causal_conv1d_update"], preset="small", min_run_time=0.01, progress=False, threads=1
    )
    assert not res.meta["errors"] and [r.what for r in res] == ["gdn_recurrent", "causal_conv1d_update"]
    p = kernel_sweep.PRESETS["small"]
    gdn = recurrent_cost(2, 2, p["H"], p["HV"], p["K"], p["V"], torch.bfloat16, use_qk_l2norm=True)
    conv = update_cost(2, 1, p["dim"], 4, torch.bfloat16, has_bias=False)
    assert (res[0].bytes, res[0].flops) == (gdn.bytes, gdn.flops) and (res[1].bytes, res[1].flops) == (
        conv.bytes,
        conv.flops,
    )
    assert all(r.impl == "reference" and r.mode == "kernel" and r.threads == 1 for r in res)  # "auto" on the CPU
    with pytest.raises(ValueError, match="ops: unknown \\['nope'\\]"):
        kernel_sweep.sweep([1], ops=["nope"])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"layer": "rwkv"}, "layer: expected one of \\['gdn', 'mamba2'\\], got 'rwkv'"),
        ({"preset": "huge"}, "preset: expected one of \\['small', 'bench', 'engine'\\], got 'huge'"),
        ({"modes": ("eager", "graph")}, "modes: expected one of \\['eager', 'replay'\\], got 'graph'"),
        ({"batch_sizes": [0, 2]}, "batch_sizes: expected ints >= 1, got \\[0, 2\\]"),
    ],
)
def test_replay_sweep_refuses_bad_arguments(kwargs, message):
    from workbench.bench.replay import sweep

    args = {"batch_sizes": [1], **kwargs}
    with pytest.raises(ValueError, match=message):
        sweep(args.pop("batch_sizes"), progress=False, **args)


def test_replay_sweep_mamba2_eager_only():
    from workbench.bench.replay import sweep

    res = sweep([1, 3], layer="mamba2", modes=("eager",), min_run_time=0.01, progress=False, threads=1)
    assert [(r.what, r.shape["bs"], r.mode) for r in res] == [
        ("mamba2_decode_step", 1, "eager"),
        ("mamba2_decode_step", 3, "eager"),
    ]
    assert res.meta["config"]["hidden_size"] == 32 and res.meta["environment"]["torch"] == torch.__version__
