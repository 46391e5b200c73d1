"""workbench.report: the quick report is generated and parsed; `report`, `demo --out` and `bench` write where asked."""

import json
import re
from html.parser import HTMLParser

import pytest

from workbench.cli import main
from workbench.measure.timing import SCHEMA, Results
from workbench.report import SECTIONS, build_report

pytest.importorskip("plotly")


class _Scan(HTMLParser):
    """Collects section ids, <script> attributes and bodies, and the visible text."""

    def __init__(self):
        super().__init__()
        self.sections, self.scripts, self.text = [], [], []
        self._in_script = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.sections.append(a.get("id"))
        if tag == "script":
            self._in_script = {"attrs": a, "body": ""}

    def handle_endtag(self, tag):
        if tag == "script" and self._in_script is not None:
            self.scripts.append(self._in_script)
            self._in_script = None

    def handle_data(self, data):
        if self._in_script is not None:
            self._in_script["body"] += data
        else:
            self.text.append(data)


@pytest.fixture(scope="module")
def report_html():
    return build_report(device="cpu", quick=True)


def test_report_has_every_section_and_loads_offline(report_html):
    scan = _Scan()
    scan.feed(report_html)
    assert scan.sections == list(SECTIONS)
    assert not [s for s in scan.scripts if "src" in s["attrs"]]  # nothing fetched: no <script src=...> at all
    assert not re.search(r"<script[^>]+src\s*=\s*['\"]?https?:", report_html)
    plotly_js = [s for s in scan.scripts if "Plotly" in s["body"] and len(s["body"]) > 1_000_000]
    assert len(plotly_js) == 1  # plotly's JavaScript embedded exactly once
    figures = [json.loads(s["body"]) for s in scan.scripts if s["attrs"].get("class") == "figure-data"]
    assert len(figures) >= 4  # padding, latency, roofline, bucket waste
    for fig in figures:
        assert fig["data"], fig.get("layout", {}).get("title")
    ids = re.findall(r"data-target='(figure-\d+)'", report_html)
    assert all(f"id='{i}'" in report_html for i in ids)  # every figure's JSON has its div


def test_report_has_no_nan_and_says_what_ran(report_html):
    scan = _Scan()
    scan.feed(report_html)
    visible = " ".join(scan.text)
    figures = " ".join(s["body"] for s in scan.scripts if s["attrs"].get("class") == "figure-data")
    # the zoo's evidence may say "NaN in row(s) ..." on purpose (uninit_pad): scan numbers, not that prose
    numbers = re.sub(r"NaN in row\(s\)", "", visible)
    for part in (numbers, figures):
        assert not re.search(r"\bnan\b", part, flags=re.IGNORECASE)
        assert "Infinity" not in part
    assert "clean" in visible and "PROBLEMS" not in visible  # the capture/replay check passed, every profile
    assert visible.count("sglang-ascend") >= 2 and "vllm" in visible
    assert "Ceilings measured in this run: copy" in visible
    assert ("bug zoo (workbench.zoo) is not installed" in visible) or ("cases, each run broken and fixed" in visible)
    assert "torch_npu" in visible  # the environment says why the NPU is not usable


def test_report_and_demo_write_where_asked(tmp_path, capsys, monkeypatch):
    import workbench.report as report

    monkeypatch.setattr(report, "build_report", lambda **kw: f"<html>{sorted(kw.items())}</html>")
    out = tmp_path / "r.html"
    assert main(["report", "--quick", "--out", str(out), "--device", "cpu"]) == 0
    assert out.read_text().startswith("<html>[('device', 'cpu'), ('progress', True), ('quick', True)]")
    demo = tmp_path / "demo.html"
    assert main(["demo", "--quick", "--out", str(demo)]) == 0
    printed = capsys.readouterr().out
    assert demo.is_file() and f"report: {demo.resolve()}" in printed and printed.count("profile=") == 6
    assert main(["demo", "--out", str(tmp_path / "nowhere" / "d.html")]) == 2
    assert "--out: folder" in capsys.readouterr().err and not (tmp_path / "nowhere").exists()


@pytest.fixture
def one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the small steps of a quick bench: threads only spin against each other
    yield
    torch.set_num_threads(before)


def test_bench_writes_device_named_results_and_redraws(tmp_path, capsys, monkeypatch, one_thread):
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "replay", "--quick", "--device", "cpu", "--plot", "replay.html"]) == 0
    path = tmp_path / "bench-results" / "replay_cpu.json"
    data = json.loads(path.read_text())
    assert data["schema"] == SCHEMA and data["meta"]["benchmark"] == "replay"
    res = Results.load(path)
    assert {r.mode for r in res} == {"eager", "replay"} and all(r.median_us > 0 and r.n >= 5 for r in res)
    assert (tmp_path / "replay.html").read_text().count("class='figure-data'") == 1
    redraw = tmp_path / "again.html"
    assert main(["bench", "replay", "--from", str(path), "--plot", str(redraw)]) == 0
    assert "figure-data" in redraw.read_text()
    capsys.readouterr()


def test_bench_metadata_json_where_asked(tmp_path, capsys):
    path = tmp_path / "m_cpu.json"
    assert main(["bench", "metadata", "--quick", "--device", "cpu", "--json", str(path)]) == 0
    res = Results.load(path)
    assert {r.impl for r in res} == {"in_place", "engine_style"} and {r.shape["bs"] for r in res} == {1, 8, 64, 512}
    assert f"wrote {path}" in capsys.readouterr().out


@pytest.fixture
def tiny_kernels(monkeypatch):
    """`bench kernels --quick` on the small preset at bs 1 and 2: the schema, not the figures, is under test."""
    from workbench.bench import kernels

    monkeypatch.setattr(kernels, "QUICK_BATCHES", (1, 2))
    monkeypatch.setattr(kernels, "QUICK_PRESET", "small")
    return kernels


@pytest.mark.slow  # measured ceilings and a sweep; tests/test_cli_bench.py checks the output fast
def test_bench_kernels_writes_results_with_bytes_floors_and_ceilings(tmp_path, capsys, tiny_kernels, one_thread):
    from workbench.measure.timing import ratio

    path = tmp_path / "k_cpu.json"
    html = tmp_path / "k.html"
    assert main(["bench", "kernels", "--quick", "--device", "cpu", "--json", str(path), "--plot", str(html)]) == 0
    data = json.loads(path.read_text())
    res = Results.load(path)
    assert Results.from_dict(res.to_dict()).to_dict() == res.to_dict() == data  # JSON round trip, nothing lost
    assert data["meta"]["benchmark"] == "kernels" and not data["meta"]["errors"]
    from workbench.sweeps.kernels import DECODE_OPS

    ops = set(DECODE_OPS)
    kernels, floors = res.filter(mode="kernel"), res.filter(mode="copy-floor")
    assert {(r.what, r.shape["bs"]) for r in kernels} == {(op, bs) for op in ops for bs in (1, 2)}
    assert {(r.what, r.shape["bs"]) for r in floors} == {(r.what, r.shape["bs"]) for r in kernels}
    assert all(r.bytes and r.bytes > 0 and r.median_us > 0 and r.n >= 5 for r in res)  # bytes on every record
    assert all(r.flops and r.impl == "reference" for r in kernels) and all(r.impl == "copy" for r in floors)
    # a floor copies (read + write) the live rows' float32 state: gdn and linear attention keep the same one
    from kernels.testing import SHAPES

    by = {(r.what, r.shape["bs"]): r.bytes for r in floors}
    p = SHAPES["small"]
    gdn = by[("gated_delta_rule.recurrent", 2)]
    assert gdn == 2 * 2 * p["HV"] * p["K"] * p["V"] * 4 == by[("linear_attn.recurrent", 2)]
    assert by[("causal_conv1d.update", 1)] == 2 * p["dim"] * (p["width"] - 1) * 4
    ratios = ratio(kernels, floors)
    assert ratios.fields == ("what", "device", "shape") and len(ratios) == len(kernels)
    assert all(r > 0 for r in ratios.values())
    ceil = data["meta"]["ceilings"]
    assert ceil["device"] == "cpu" and ceil["copy_gbps"] > 0 and ceil["matmul_tflops"] > 0
    out = capsys.readouterr().out
    assert "of copy" in out and f"wrote {path}" in out
    page = html.read_text()
    assert page.count("class='figure-data'") == 2 and "Roofline" in page  # latency and roofline
    redraw = tmp_path / "again.html"
    assert main(["bench", "kernels", "--from", str(path), "--plot", str(redraw)]) == 0
    assert redraw.read_text().count("class='figure-data'") == 2


def test_bench_kernels_reports_a_broken_op_and_keeps_the_others(tmp_path, capsys, monkeypatch, tiny_kernels):
    from workbench.sweeps import kernels as kernel_sweep

    real = kernel_sweep.make_case

    def make_case(op, *args, **kwargs):
        if op == "gated_delta_rule.recurrent":
            raise RuntimeError("no such kernel")
        return real(op, *args, **kwargs)

    monkeypatch.setattr(tiny_kernels, "QUICK_BATCHES", (1,))
    monkeypatch.setattr(kernel_sweep, "DECODE_OPS", ("gated_delta_rule.recurrent", "causal_conv1d.update"))
    monkeypatch.setattr(kernel_sweep, "make_case", make_case)
    path = tmp_path / "k_cpu.json"
    assert main(["bench", "kernels", "--quick", "--device", "cpu", "--json", str(path)]) == 1
    res = Results.load(path)
    assert res.meta["errors"] == {"gated_delta_rule.recurrent": "RuntimeError: no such kernel"}
    assert {r.what for r in res} == {"causal_conv1d.update"} and len(res) == 2
    assert "bench kernels: failed: gated_delta_rule.recurrent" in capsys.readouterr().err


def test_bench_kernels_on_cuda_times_the_triton_kernels(tmp_path, tiny_kernels):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here: `bench kernels --device cuda` times the Triton kernels on one")
    res = tiny_kernels.run(quick=True, json_path=str(tmp_path / "k_cuda.json"), device="cuda", progress=False)
    assert not res.meta["errors"] and res.meta["ceilings"]["device"] == "cuda"
    assert {r.impl for r in res.filter(mode="kernel")} == {"triton"} and {r.device for r in res} == {"cuda"}
    assert all(r.bytes and r.median_us > 0 for r in res)


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["bench", "metadata", "--device", "cpu", "--json", "no/such/dir/m.json"],
            "--json: folder 'no/such/dir' does not exist",
        ),
        (
            ["bench", "metadata", "--device", "cpu", "--json", "metadata_cuda.json"],
            "names device 'cuda' but this run is on 'cpu'",
        ),
        (["bench", "replay", "--from", "x.json"], "--from: redraws figures, so it needs --plot FILE.html"),
        (["bench", "replay", "--device", "cpu", "--plot", "no/dir/p.html"], "--plot: folder 'no/dir' does not exist"),
        (["bench", "replay", "--from", "x.json", "--plot", "p.html"], "--from 'x.json': no results file at 'x.json'"),
        (
            ["bench", "replay", "--device", "tpu"],
            "--device: expected auto, cpu, cuda or npu (with an optional index: cuda:1), got 'tpu'",
        ),
    ],
)
def test_bench_refuses_with_one_line(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "no").exists() and not (tmp_path / "bench-results").exists()


def test_bench_refuses_a_gpu_device_it_cannot_use(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: `--device cuda` is usable")
    assert main(["bench", "replay", "--device", "cuda"]) == 2
    assert "--device: cuda is not usable here" in capsys.readouterr().err


def test_speedup_rows_flag_noisy_ratios_in_words():
    from workbench.measure.timing import Results, TimingRecord
    from workbench.report.sections import speedup_rows

    def rec(bs, mode, med, iqr, n):
        return TimingRecord("layer_step", "cpu", {"bs": bs}, "reference", mode, med, iqr, n, 1)

    res = Results([rec(1, "eager", 100.0, 10.0, 9), rec(1, "replay", 50.0, 5.0, 7),  # quiet: 2x
                   rec(2, "eager", 100.0, 90.0, 5), rec(2, "replay", 80.0, 4.0, 5)])  # fmt: skip
    rows, classes = speedup_rows(res)
    quiet, noisy = sorted(rows, key=lambda r: r[0])
    assert quiet[:4] == [1, "reference", "2.00x", "9/7"] and quiet[4] == ""
    assert noisy[2] == "1.25x" and noisy[4].startswith("noisy: eager IQR over 25%")
    assert sorted(c[2] for c in classes) == ["", "bad"]


@pytest.mark.parametrize("command", [["report"], ["demo"]])
def test_report_and_demo_say_when_they_replace_a_file(command, tmp_path, monkeypatch, capsys):
    """Both write report.html by default: the second one says it replaced the first's file."""
    import workbench.demo
    import workbench.report

    monkeypatch.setattr(workbench.report, "build_report", lambda **kw: "<html>tiny</html>")
    monkeypatch.setattr(workbench.demo, "run_demo", lambda: 0)
    out = tmp_path / "report.html"
    assert main([*command, "--quick", "--out", str(out)]) == 0
    assert "replaced" not in capsys.readouterr().out
    assert main([*command, "--quick", "--out", str(out)]) == 0
    assert "replaced the file that was there" in capsys.readouterr().out and out.read_text() == "<html>tiny</html>"
