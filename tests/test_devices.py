"""A device given with an index ("cpu:0", as "cuda" becomes "cuda:0" on a GPU) works everywhere.

Tensors report their device as torch normalises it (``cpu``, ``cuda:0``), and ``torch.device("cuda") !=
torch.device("cuda:0")``: a pool kept as given made every device check of batch, metadata and runner fail
on the first GPU step. ``"cpu:0"`` reproduces that here: it is not equal to ``cpu``, which is what CPU
tensors report.
"""

from __future__ import annotations

import json

import pytest
import torch

from workbench import Batch, StatePool
from workbench.cli import main
from workbench.devices import canonical_device
from workbench.errors import DeviceUnavailable
from workbench.layers import GatedDeltaNetLayer, GDNConfig, Mamba2Config, Mamba2Layer
from workbench.measure.integrity import changed_slots, snapshot
from workbench.runner import GraphRunner

DEV = "cpu:0"
assert torch.device(DEV) != torch.device("cpu")  # the premise of this file


def test_canonical_device_is_what_tensors_report():
    for given in ("cpu", "cpu:0", torch.device("cpu", 0), torch.device("cpu")):
        assert canonical_device(given) == torch.empty(0, device=given).device == torch.device("cpu")
    with pytest.raises(DeviceUnavailable, match="device 'nodevice'"):
        canonical_device("nodevice")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceUnavailable, match="device 'cuda'"):
            canonical_device("cuda")


def test_graph_backend_on_cpu0():
    from workbench.graphs import get_backend

    assert get_backend("cpu", device=DEV).device == torch.device("cpu")
    assert get_backend("auto", device=DEV).name == "cpu"


def test_pool_batch_and_layer_keep_the_canonical_device():
    pool = StatePool(8, "sglang", device=DEV)
    assert pool.device == torch.device("cpu") and pool.mapping.device == pool.device
    rows = pool.alloc(2)
    # a tensor batch and a list batch, both named "cpu:0": compared with the pool's tensors, not the string
    for batch in (Batch.decode(rows, [3, 4], device=DEV), Batch.decode(rows.tolist(), [3, 4], device=DEV)):
        assert batch.device == pool.device
    ver = Batch.target_verify(rows, [3, 4], 2, num_accepted_tokens=torch.tensor([1, 2]), device=DEV)
    assert ver.device == pool.device
    ext = Batch.extend(rows, [2, 3], device=DEV)
    assert ext.device == pool.device
    for layer in (GatedDeltaNetLayer(GDNConfig.small(), device=DEV), Mamba2Layer(Mamba2Config.small(), device=DEV)):
        assert layer.device == torch.device("cpu")
        assert all(w.device == layer.device for w in layer.weights.values())


@pytest.mark.parametrize("profile", ["sglang", "sglang-ascend", "vllm"])
def test_whole_runner_on_cpu0(profile: str):
    """Capture, replay, eager, compare and accept with every device named "cpu:0"."""
    D = 2
    spr = D if profile == "vllm" else 1
    pool = StatePool(16, profile, slots_per_request=spr, device=DEV)
    layer = GatedDeltaNetLayer(GDNConfig.small(), seed=2, device=DEV, impl="reference")
    state = layer.new_state(16, seed=3)  # random, never zeros
    runner = GraphRunner(layer, pool, buckets=[1, 2, 4], draft_tokens=D, backend="auto", state=state)
    assert runner.graph_backend.name == "cpu" and runner.graph_backend.device == torch.device("cpu")
    runner.capture(progress=False)
    rows = pool.alloc(3)
    hidden = layer.config.hidden_size

    before = snapshot(runner.state.tensors())
    x = torch.randn(3, hidden, device=DEV)
    res = runner.replay(Batch.decode(rows, [5, 6, 7], device=DEV), x)
    assert res.replayed and res.output.shape == (3, hidden) and not res.output.isnan().any()
    owned = {int(s) for s in pool.mapping[rows].flatten()}
    changed = changed_slots(before, runner.state.tensors())
    assert changed and {slot for _, slot in changed} <= owned  # only live slots moved

    eager = runner.eager(Batch.decode(rows, [6, 7, 8], device=DEV), torch.randn(3, hidden, device=DEV))
    assert not eager.replayed and eager.output.shape == (3, hidden)

    cmp = runner.compare(Batch.decode(rows[:2], [7, 8], device=DEV), torch.randn(2, hidden, device=DEV))
    assert cmp.ok, (cmp.bitwise_equal, str(cmp.integrity))

    acc = torch.tensor([1, 2, 2], device=DEV)
    verify = Batch.target_verify(
        rows, [8, 9, 10], D, num_accepted_tokens=acc if profile == "vllm" else None, device=DEV
    )
    out = runner.replay(verify, torch.randn(3 * D, hidden, device=DEV))
    assert out.replayed and not out.output.isnan().any()
    if profile != "vllm":  # vLLM keeps one slot per draft position: no accept step
        runner.accept(acc)


def test_cli_bench_names_results_by_device_type(tmp_path, monkeypatch, capsys):
    """`workbench bench --device cpu:0` runs on the canonical device and never names a result by the string."""
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "metadata", "--quick", "--device", DEV]) == 0
    data = json.loads((tmp_path / "bench-results" / "metadata_cpu.json").read_text())
    assert data["records"] and {r["device"] for r in data["records"]} == {"cpu"}
    capsys.readouterr()
    assert main(["bench", "kernels", "--quick", "--device", "meta"]) == 2  # no graph device of that name
    assert main(["bench", "replay", "--device", "nodevice"]) == 2  # a clear error, no traceback
    assert "'nodevice'" in capsys.readouterr().err


@pytest.mark.slow  # a timing sweep
def test_widget_models_take_cpu0():
    """The widgets' models (no ipywidgets): the timing dashboard sweeps and measures on "cpu:0"; the lab's
    model takes a backend name, so "cpu:0" there is one clear refusal naming the choices, not a crash."""
    from workbench.widgets.models import LabModel, TimingModel

    m = TimingModel(batch_sizes="1, 2", modes=("eager", "replay"), device=DEV, min_run_time=0.01)
    res = m.sweep()
    assert res is not None, m.error
    assert {(r.shape["bs"], r.mode) for r in res} == {(1, "eager"), (1, "replay"), (2, "eager"), (2, "replay")}
    assert {r.device for r in res} == {"cpu"} and all(r.median_us > 0 for r in res)
    kernels = m.roofline_run(ops=["causal_conv1d.update"])
    assert kernels is not None, m.error
    assert {r.device for r in kernels} == {"cpu"} and all(r.median_us > 0 for r in kernels)

    lab = LabModel(backend=DEV, buckets="1, 2")
    assert not lab.capture() and lab.error is not None and lab.error.startswith("backend: 'cpu:0' is not one of ")
    lab = LabModel(backend="cpu", buckets="1, 2")
    assert lab.capture(), lab.error
    rep = lab.step(2, "decode", time_it=False)
    assert rep is not None and rep.clean and str(lab.runner.pool.device) == "cpu"
