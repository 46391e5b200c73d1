"""measure.timing and measure.ceilings: one timer per device, one record schema, ratio, ceilings."""

import contextlib
import itertools
import json
import math
import statistics
import time
import types
from collections.abc import Iterator

import pytest
import torch

from workbench.measure.ceilings import Ceilings, measure_ceilings
from workbench.measure.timing import (
    GraphCaptureError,
    Results,
    TimingError,
    TimingRecord,
    json_safe,
    l2_cache_bytes,
    ratio,
    resolve_device,
    time_fn,
)


def _rec(median: float, **kw) -> TimingRecord:
    base = dict(what="op", device="cpu", shape={"bs": 4}, impl="reference", mode="eager", median_us=median)
    base.update(iqr_us=median / 10, n=7, threads=1, bytes=4096, flops=8192, env={"torch": torch.__version__})
    base.update(kw)
    return TimingRecord(**base)


def test_cpu_timer_records_what_it_measured_of_a_sleep():
    calls = []

    def nap():
        calls.append(None)
        time.sleep(0.005)

    rec = time_fn(nap, what="sleep", device="cpu", warmup=2, min_run_time=0.1)
    m = rec.measurement
    assert m is not None and rec.n == len(m.times) >= 5 and rec.device == "cpu"
    # every timed call ran (and the warm-up before them): the record counts no call that did not happen
    assert len(calls) >= 2 + rec.n * m.number_per_run
    # per-call times; sleep never returns early, so each is at least 5 ms (a busy machine only adds to it)
    assert min(m.times) >= 0.005, m.times
    # the record is the measurement's median and IQR, in us, and the median lies among the times
    assert math.isclose(m.median * 1e6, rec.median_us) and math.isclose(m.iqr * 1e6, rec.iqr_us)
    assert min(m.times) <= m.median <= max(m.times) and rec.iqr_us >= 0


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
    assert ratio(a[0], a[0]) == 1.0
    assert ratio(a, a).values() == [1.0, 1.0, 1.0]
    # two impls: pairs by shape and mode, ratio a/b
    fast = Results([_rec(5.0, shape={"bs": b}, impl="triton") for b in (1, 2, 4)])
    r = ratio(a, fast)
    assert r.fields == ("what", "device", "shape", "mode") and r.values() == [2.0, 2.0, 2.0]
    # eager vs replay of one run
    run = Results([_rec(9.0, shape={"bs": 1}), _rec(3.0, shape={"bs": 1}, mode="replay"), _rec(8.0, shape={"bs": 2})])
    sp = ratio(run.filter(mode="eager"), run.filter(mode="replay"))
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
    quiet = _rec(1500.0, iqr_us=100.0, what="quiet <op>")
    page = Results([rec, quiet], {"benchmark": "demo"})._repr_html_()
    assert "<table" in page and "1.50 ms" in page and ">demo: 2 records" in page
    # the noisy IQR (over a quarter of the median) is shaded as a warning, the quiet one not; values escaped
    assert page.count('<tr class="wb-warn"') == 1 and page.count('<tr class="wb-live"') == 1
    assert "quiet &lt;op&gt;" in page and "<op>" not in page


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
    page = known._repr_html_()
    assert ">2.0</td>" in page and ">0.500</td>" in page and 'class="wb-table"' in page  # through workbench.html


def test_ceilings_are_medians_of_repeats_with_their_spread_kept_and_shown():
    ceil = measure_ceilings("cpu", copy_bytes=2**22, matmul_n=64, min_run_time=0.01, threads=1, repeats=3)
    assert len(ceil.copy_runs) == len(ceil.matmul_runs) == 3
    assert ceil.copy_gbps == statistics.median(ceil.copy_runs)
    assert ceil.matmul_tflops == statistics.median(ceil.matmul_runs)
    lo, hi = ceil.copy_spread
    assert lo == min(ceil.copy_runs) <= ceil.copy_gbps <= hi == max(ceil.copy_runs)
    assert Ceilings.from_dict(json.loads(json.dumps(ceil.to_dict()))) == ceil  # through JSON: lists to tuples
    known = Ceilings(copy_gbps=14.1, matmul_tflops=0.1, copy_runs=(8.5, 14.1, 32.4, 42.0), copy_bytes=2**26)
    assert "copy 14.1 GB/s (median of 4: 8.5-42.0)" in repr(known)
    page = known._repr_html_()
    assert ">8.5 - 42.0</td>" in page and 'class="wb-warn"' in page  # a wide spread is flagged
    assert "median of 4 repeat(s)" in page and "its size not recorded" in page
    narrow = Ceilings(
        copy_gbps=14.1, matmul_tflops=0.1, copy_runs=(13.9, 14.1, 14.4), cache_bytes=2**25, cache_name="L3"
    )
    assert 'class="wb-warn"' not in narrow._repr_html_() and "fit the L3 32 MiB" in narrow._repr_html_()
    old = Ceilings.from_dict({"copy_gbps": 2.0, "matmul_tflops": 0.5})  # a file written before repeats
    assert old.copy_spread is None and "(1 run: spread unknown)" in repr(old)
    with pytest.raises(TimingError, match=r"ceilings: unknown fields \['copy_gbs'\]"):
        Ceilings.from_dict({"copy_gbs": 2.0, "matmul_tflops": 0.5})
    with pytest.raises(TimingError, match="repeats: expected an int >= 1, got 0"):
        measure_ceilings("cpu", repeats=0)


def test_last_level_cache_from_sysfs_or_a_stated_default(tmp_path):
    from workbench.measure.ceilings import DEFAULT_CACHE_BYTES, cpu_last_level_cache

    for i, (level, kind, size) in enumerate([(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "1M"),
                                              (3, "Unified", "32768K")]):  # fmt: skip
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    assert cpu_last_level_cache(tmp_path) == (32 * 2**20, "L3")
    size, name = cpu_last_level_cache(tmp_path / "missing")
    assert size == DEFAULT_CACHE_BYTES and name.startswith("L3 (assumed")
    ceil = Ceilings(copy_gbps=10.0, matmul_tflops=1.0, copy_bytes=2**24, cache_bytes=2**25, cache_name="L3")
    assert ceil.fits_cache(_rec(1.0, bytes=2**25)) and not ceil.fits_cache(_rec(1.0, bytes=2**25 + 1))
    assert ceil.fits_cache(_rec(1.0, bytes=None)) is None
    assert ceil.copy_in_cache  # a 16 MiB copy (32 MiB with its destination) measured the cache
    assert measure_ceilings("cpu", copy_bytes=2**20, matmul_n=32, min_run_time=0.01, repeats=1).cache_bytes


def test_noisy_iqr_has_one_home_below_the_report_and_the_bench_tables():
    import workbench.measure.legend as legend
    import workbench.report.sections as sections
    from workbench.measure import timing

    assert sections.NOISY_IQR is timing.NOISY_IQR is legend.NOISY_IQR
    assert not timing.is_noisy(_rec(100.0, iqr_us=25.0)) and timing.is_noisy(_rec(100.0, iqr_us=25.1))


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
    from kernels.testing import SHAPES
    from workbench.sweeps import kernels as kernel_sweep

    ops = ["gated_delta_rule.recurrent", "causal_conv1d.update", "gated_delta_rule.recurrent[verify]"]
    res = kernel_sweep.sweep([2], ops=ops, preset="small", min_run_time=0.01, progress=False, threads=1)
    assert not res.meta["errors"] and [r.what for r in res] == ops  # records named by kernels.testing.OPS
    assert res.meta["variants"] == dict(zip(ops, ["decode", "decode", "verify"], strict=True))
    p, bf16 = SHAPES["small"], torch.bfloat16
    gdn = recurrent_cost(2, 2, p["H"], p["HV"], p["K"], p["V"], bf16, use_qk_l2norm=True)
    conv = update_cost(2, 1, p["dim"], p["width"], bf16, state_dtype=torch.float32)
    assert (res[0].bytes, res[0].flops) == (gdn.bytes, gdn.flops)
    assert (res[1].bytes, res[1].flops) == (conv.bytes, conv.flops)
    assert all(r.impl == "reference" and r.mode == "kernel" and r.threads == 1 for r in res)  # "auto" on the CPU
    with pytest.raises(ValueError, match="ops: unknown \\['nope'\\]"):
        kernel_sweep.sweep([1], ops=["nope"])
    with pytest.raises(ValueError, match="ops: 'causal_conv1d.update\\[extend\\]': causal_conv1d.update has variants"):
        kernel_sweep.sweep([1], ops=["causal_conv1d.update[extend]"])
    with pytest.raises(ValueError, match="preset: expected one of \\['small', 'quarter', 'engine'\\], got 'bench'"):
        kernel_sweep.sweep([1], preset="bench")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"layer": "rwkv"}, "layer: expected one of \\['gdn', 'mamba2', 'kda'\\], got 'rwkv'"),
        ({"preset": "huge"}, "preset: expected one of \\['small', 'quarter', 'engine'\\], got 'huge'"),
        ({"modes": ("eager", "graph")}, "modes: expected one of \\['eager', 'replay'\\], got 'graph'"),
        ({"batch_sizes": [0, 2]}, "batch_sizes: expected ints >= 1, got \\[0, 2\\]"),
    ],
)
def test_replay_sweep_refuses_bad_arguments(kwargs, message):
    from workbench.sweeps.replay import sweep

    args = {"batch_sizes": [1], **kwargs}
    with pytest.raises(ValueError, match=message):
        sweep(args.pop("batch_sizes"), progress=False, **args)


def test_replay_sweep_mamba2_eager_only():
    from workbench.sweeps.replay import sweep

    res = sweep([1, 3], layer="mamba2", modes=("eager",), min_run_time=0.01, progress=False, threads=1)
    assert [(r.what, r.shape["bs"], r.mode) for r in res] == [
        ("mamba2_decode_step", 1, "eager"),
        ("mamba2_decode_step", 3, "eager"),
    ]
    assert res.meta["config"]["hidden_size"] == 32 and res.meta["environment"]["torch"] == torch.__version__


# -- graph_calls and flush_l2: refused where they cannot mean anything, arithmetic on a stubbed device -------
def test_graph_calls_are_refused_off_cuda_with_a_line():
    with pytest.raises(TimingError, match=r"graph_calls: CUDA graphs \(torch.cuda.CUDAGraph\) need a CUDA device, "
                                          r"got device 'cpu'; time without graph_calls here"):  # fmt: skip
        time_fn(lambda: None, what="x", device="cpu", graph_calls=4)
    with pytest.raises(TimingError, match="graph_calls: .* got device 'npu:0'"):
        time_fn(lambda: None, what="x", device="npu:0", graph_calls=4)  # refused before any NPU is looked for
    for bad in (0, -1, 2.0, True):
        with pytest.raises(TimingError, match=f"graph_calls: expected an int >= 1 or None, got {bad!r}"):
            time_fn(lambda: None, what="x", graph_calls=bad)  # type: ignore[arg-type]
    with pytest.raises(TimingError, match="flush_l2: with graph_calls=4 only the first call of each replay"):
        time_fn(lambda: None, what="x", device="cuda", graph_calls=4, flush_l2=True)  # on any machine


def test_l2_flush_is_not_done_on_the_cpu_and_the_record_says_so():
    calls = []
    rec = time_fn(lambda: calls.append(1), what="x", flush_l2=True, min_run_time=0.01)
    assert rec.l2 == "not flushed (cpu)" and rec.graph_calls is None and calls  # timed, and said unflushed
    assert time_fn(lambda: None, what="x", min_run_time=0.01).l2 == "warm"
    assert l2_cache_bytes("cpu") is None
    with pytest.raises(TimingError, match="flush_l2: expected True or False, got 1"):
        time_fn(lambda: None, what="x", flush_l2=1)  # type: ignore[arg-type]


class _FakeCuda:
    """torch.cuda's event, stream and graph surface over a fake device clock (us), for the timer's arithmetic:
    a kernel advances the clock by its duration, an event reads it, a replay runs the captured kernels plus
    a per-replay launch gap from ``gaps`` (cycled). Nothing here claims anything about a real GPU."""

    def __init__(self, gaps: list[float]) -> None:
        self.clock, self.gaps, self.replays = 0.0, itertools.cycle(gaps), []
        self.capturing: list[float] | None = None
        self.on_side, self.side_kernels, self.graphs = False, 0, []

    def kernel(self, us: float) -> None:
        if self.capturing is not None:
            self.capturing.append(us)
            return
        self.side_kernels += self.on_side
        self.clock += us

    # -- the torch.cuda names the timer calls
    def is_available(self) -> bool:
        return True

    def device(self, dev: torch.device) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def synchronize(self) -> None:
        pass

    def Stream(self) -> types.SimpleNamespace:  # noqa: N802 (torch's name)
        return types.SimpleNamespace(wait_stream=lambda other: None)

    def current_stream(self) -> types.SimpleNamespace:
        return self.Stream()

    @contextlib.contextmanager
    def stream(self, s: object) -> Iterator[None]:
        self.on_side = True
        yield
        self.on_side = False

    def CUDAGraph(self) -> types.SimpleNamespace:  # noqa: N802
        g = types.SimpleNamespace(kernels=[])

        def replay() -> None:
            took = next(self.gaps) + sum(g.kernels)
            self.replays.append(took)
            self.clock += took

        g.replay = replay
        self.graphs.append(g)
        return g

    @contextlib.contextmanager
    def graph(self, g: types.SimpleNamespace) -> Iterator[None]:
        self.capturing = g.kernels
        yield
        self.capturing = None

    def Event(self, enable_timing: bool = False) -> types.SimpleNamespace:  # noqa: N802
        ev = types.SimpleNamespace(t=None)
        ev.record = lambda: setattr(ev, "t", self.clock)
        ev.elapsed_time = lambda end: (end.t - ev.t) / 1e3  # ms, as torch.cuda.Event.elapsed_time
        return ev


def test_graph_calls_time_one_replay_of_n_captured_calls_per_repetition(monkeypatch):
    import workbench.measure.timing as timing

    fake = _FakeCuda(gaps=[0.0, 4.0, 8.0, 12.0])
    monkeypatch.setattr(timing, "_accelerator", lambda kind, device: fake)
    rec = time_fn(lambda: fake.kernel(5.0), what="k", device="cuda", graph_calls=4, min_run_time=1e-9)
    assert len(fake.graphs) == 1 and fake.graphs[0].kernels == [5.0] * 4  # four calls captured, once
    assert fake.side_kernels >= 1  # warmed up on a side stream before capture
    timed = fake.replays[-rec.n :]  # the repetitions: one replay each, four calls of 5 us plus its gap
    assert rec.n == 10 and rec.measurement == [t / 4 for t in timed] and set(rec.measurement) <= {5, 6, 7, 8}
    assert rec.median_us == statistics.median(rec.measurement)
    q = statistics.quantiles(rec.measurement, n=4, method="inclusive")
    assert rec.iqr_us == q[2] - q[0] and rec.graph_calls == 4 and rec.l2 == "warm" and rec.device == "cuda"
    # without graph_calls: events around each call (host gaps not modelled): the kernel's own 5 us
    plain = time_fn(lambda: fake.kernel(5.0), what="k", device="cuda", min_run_time=1e-9)
    assert plain.median_us == 5.0 and plain.iqr_us == 0.0 and plain.graph_calls is None


def test_l2_flush_runs_before_every_repetition_outside_the_timed_span(monkeypatch):
    import workbench.measure.timing as timing

    fake, flushes = _FakeCuda(gaps=[2.0]), []

    def flusher(device):
        return lambda: (flushes.append(1), fake.kernel(1000.0))  # a slow flush on the same clock

    monkeypatch.setattr(timing, "_accelerator", lambda kind, device: fake)
    monkeypatch.setattr(timing, "_l2_flush", flusher)
    rec = time_fn(lambda: fake.kernel(5.0), what="k", device="cuda", graph_calls=1, flush_l2=True, min_run_time=1e-9)
    # one flush before each timed repetition, and one in the pass that sizes them
    assert rec.l2 == "flushed" and len(flushes) == rec.n + 1
    assert rec.median_us == 7.0 and rec.iqr_us == 0.0  # the call and its replay gap; the flush is not in it


def test_graph_capture_refusal_names_its_cause(monkeypatch):
    import workbench.measure.timing as timing

    fake = _FakeCuda(gaps=[0.0])

    def host_sync() -> None:
        if fake.capturing is not None:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")

    monkeypatch.setattr(timing, "_accelerator", lambda kind, device: fake)
    with pytest.raises(GraphCaptureError, match=r"graph_calls: capture refused \(RuntimeError: CUDA error: "
                                                r"operation not permitted when stream is capturing\)$"):  # fmt: skip
        time_fn(host_sync, what="k", device="cuda", graph_calls=2, min_run_time=1e-9)


def test_new_record_fields_round_trip_and_old_files_load(tmp_path):
    rec = _rec(5.0, l2="flushed", graph_calls=10, extra={"check": {"ok": True}, "n_regs": None})
    back = Results.load(Results([rec]).save(tmp_path / "r.json"))[0]
    assert back == rec and back.extra == {"check": {"ok": True}, "n_regs": None} and back.graph_calls == 10
    old = {k: v for k, v in rec.to_dict().items() if k not in ("l2", "graph_calls", "extra")}
    assert TimingRecord.from_dict(old).l2 == "warm" and TimingRecord.from_dict(old).extra == {}
    assert "graph x10, L2 flushed" in repr(rec)
    with pytest.raises(TimingError, match="extra must be a dict, got list"):
        TimingRecord.from_dict({**rec.to_dict(), "extra": []})
    with pytest.raises(TimingError, match=r"results: not strict JSON \(Out of range float .*\); pass meta and extra"):
        Results([_rec(1.0, extra={"err": float("inf")})]).save(tmp_path / "bad.json")
    ok = Results([_rec(1.0, extra=json_safe({"err": float("inf"), "slots": (1, 2)}))]).save(tmp_path / "ok.json")
    assert Results.load(ok)[0].extra == {"err": "inf", "slots": [1, 2]}


def test_compare_pairs_warm_with_warm_and_adds_no_l2_column_otherwise():
    warm = [_rec(10.0, shape={"bs": b}) for b in (1, 2)]
    cold = [_rec(30.0, shape={"bs": b}, l2="flushed") for b in (1, 2)]
    floors = [_rec(5.0, shape={"bs": b}, mode="floor", l2=l2) for b in (1, 2) for l2 in ("warm", "flushed")]
    r = ratio(Results(warm + cold), Results(floors))
    assert r.fields == ("what", "device", "shape", "impl", "l2") and sorted(r.values()) == [2.0, 2.0, 6.0, 6.0]
    assert ratio(Results(warm), Results(floors[::2])).fields == ("what", "device", "shape", "impl")
    assert ratio(Results(cold), Results(warm)).fields == ("what", "device", "shape", "impl", "mode")


def test_cuda_graph_calls_and_l2_flush_on_a_real_gpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here: graph replay and the L2 flush run where one is lent")
    x = torch.randn(1 << 20, device="cuda")
    warm = time_fn(lambda: x.mul_(1.0), what="mul", device="cuda", graph_calls=10, min_run_time=0.05)
    cold = time_fn(lambda: x.mul_(1.0), what="mul", device="cuda", graph_calls=1, flush_l2=True, min_run_time=0.05)
    assert (warm.graph_calls, warm.l2, cold.graph_calls, cold.l2) == (10, "warm", 1, "flushed")
    assert warm.median_us > 0 and cold.median_us > 0 and (l2_cache_bytes("cuda") or 0) > 0
    with pytest.raises(GraphCaptureError, match="graph_calls: capture refused"):
        time_fn(lambda: x.sum().item(), what="sync", device="cuda", graph_calls=2, min_run_time=0.05)
    after = time_fn(lambda: x.mul_(1.0), what="mul", device="cuda", min_run_time=0.05)  # the device still works
    assert after.median_us > 0
