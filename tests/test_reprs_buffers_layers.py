"""``MetadataBuffers`` and the layers show themselves: a one-line repr, and an HTML view built on
``workbench.html`` (parsed here, not string-matched)."""

from html.parser import HTMLParser

import pytest
import torch

from workbench import Batch, MetadataBuffers, StatePool
from workbench.layers import GatedDeltaNetLayer, GDNConfig, KDAConfig, KDALayer, Mamba2Config, Mamba2Layer


class _Tables(HTMLParser):
    """Each table as a list of rows of cell texts (header row first)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def test_buffers_repr_is_one_line_with_profile_mode_buckets_d_and_device():
    pool = StatePool(300, "vllm", slots_per_request=3)
    bufs = MetadataBuffers(pool, "target_verify", draft_tokens=3)
    text = repr(bufs)
    shown = f"[1, 2, 4, ..., {bufs.buckets[-1]}] ({len(bufs.buckets)})"
    assert text == f"MetadataBuffers(vllm target_verify, buckets={shown}, D=3, device=cpu)"
    small = MetadataBuffers(StatePool(8), "decode", buckets=[2, 4])
    assert repr(small) == "MetadataBuffers(sglang decode, buckets=[2, 4] (2), D=1, device=cpu)"


def test_buffers_html_has_a_row_per_bucket_showing_the_latest_step():
    pool = StatePool(16, "sglang")
    bufs = MetadataBuffers(pool, "decode", buckets=[2, 4, 8])
    bufs.update(Batch.decode(pool.alloc(3), [5, 6, 7]))
    (table,) = _Tables(bufs._repr_html_()).tables
    assert table[0] == ["bucket", "raw_bs", "padding", "state_indices"]
    assert table[1:] == [["2", "2", "0", "2"], ["4", "3", "1", "4"], ["8", "8", "0", "8"]]
    assert "MetadataBuffers" in bufs._repr_html_() and "<b>mode</b>=decode" in bufs._repr_html_()


def test_buffers_html_elides_a_long_bucket_list():
    bufs = MetadataBuffers(StatePool(600, "sglang"), "decode")
    (table,) = _Tables(bufs._repr_html_()).tables
    assert len(table) < 20 and table[-1][0] == str(bufs.buckets[-1])
    assert any("more rows" in cells[0] for cells in table)


@pytest.mark.parametrize(
    ("layer", "summary"),
    [
        (GatedDeltaNetLayer(GDNConfig.small()), "hidden=32, heads k=2 v=4, head dims k=8 v=12, conv W=4"),
        (Mamba2Layer(Mamba2Config.small()), "hidden=32, heads=4 x 8, groups=2, state=8, conv W=4"),
        (KDALayer(KDAConfig.small()), "hidden=32, heads k=2 v=4, head dims k=8 v=12, conv W=4, per-channel gate"),
    ],
    ids=["gdn", "mamba2", "kda"],
)
def test_layer_repr_is_one_line_with_shapes_impl_dtype_and_device(layer, summary):
    name = type(layer).__name__
    assert repr(layer) == f"{name}({summary}, impl='auto', float32, device=cpu)"
    ref = layer.to(torch.float64, impl="reference")
    assert repr(ref) == f"{name}({summary}, impl='reference', float64, device=cpu)"


@pytest.mark.parametrize(
    "layer", [GatedDeltaNetLayer(GDNConfig.small()), Mamba2Layer(Mamba2Config.small()), KDALayer(KDAConfig.small())]
)
def test_layer_html_tables_its_config_and_weights(layer):
    text = layer._repr_html_()
    config, weights = _Tables(text).tables
    assert config[0] == ["config", "value"] and weights[0] == ["weight", "shape"]
    values = dict(config[1:])
    assert values["hidden_size"] == "32" and values["conv_dim"] == str(layer.config.conv_dim)
    shapes = dict(weights[1:])
    assert shapes == {k: "x".join(map(str, w.shape)) for k, w in layer.weights.items()}
    assert "<b>impl</b>=auto" in text and type(layer).__name__ in text
