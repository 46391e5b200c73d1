"""``MetadataError.field`` and ``.row`` outside the metadata core: a sample of raise sites of each package
(the command line, the runner, the layers, the engines, the profiles, the backends, the widgets), each with
its message unchanged; ``tests/test_metadata_errors.py`` holds every ``MetadataError(...)`` of ``workbench/``
to ``field=``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch

from workbench import Batch, MetadataError, StatePool, build_metadata
from workbench.backends.cpu import CpuMetadataBackend
from workbench.cli import build_parser, check_metadata_args
from workbench.engines.registry import get_adapter
from workbench.layers import make_layer
from workbench.profiles import PROFILES, get_profile
from workbench.runner import GraphRunner
from workbench.widgets.explorer_model import parse_int_list
from workbench.widgets.lab_plan import Refusal, layer_config, parse_buckets


def cli(*argv: str) -> None:
    check_metadata_args(build_parser().parse_args(["metadata", *argv]))


def _verify_meta(r: int = 2, d: int = 3) -> tuple[Any, Any, Any, Any]:
    """A sglang target_verify step of ``r`` rows: (layer, state, intermediate, metadata)."""
    layer = make_layer("gdn")
    pool = StatePool(8, "sglang")
    rows = pool.alloc(r)
    meta = build_metadata(Batch.target_verify(rows, [5] * r, draft_tokens=d), pool, bucket=None)
    return layer, layer.new_state(pool.num_slots), layer.new_intermediate(r, d), meta


def _forward_in_mode(mode: str) -> None:
    layer, state, _, meta = _verify_meta()
    x = torch.zeros(6, layer.config.hidden_size, dtype=layer.dtype)
    layer.forward(x, dataclasses.replace(meta, forward_mode=mode), state, None)


def _accept(num_accepted: list[int]) -> None:
    layer, state, inter, meta = _verify_meta()
    layer.accept(state, inter, meta, torch.tensor(num_accepted, dtype=torch.int32))


# (id, call, message, field, row)
CASES: list[tuple[str, Callable[[], Any], str, str, int | None]] = [
    # the command line: the flag as typed
    ("cli required", lambda: cli("--mode", "decode"), "--seq-lens is required for --mode decode", "--seq-lens", None),
    (
        "cli not for mode",
        lambda: cli("--seq-lens", "3", "--extend-lens", "3"),
        "--extend-lens does not apply to --mode decode (it reads --seq-lens)",
        "--extend-lens",
        None,
    ),
    (
        "cli buckets order",
        lambda: cli("--seq-lens", "3", "--buckets", "4,2"),
        "--buckets must be strictly increasing: 2 (item 1) after 4",
        "--buckets",
        1,
    ),
    (
        "cli sequence length",
        lambda: cli("--mode", "extend", "--extend-lens", "3,4", "--prefix-lens", "0,2147483645"),
        "--prefix-lens + --extend-lens = 2,147,483,649 (item 1): a sequence length must fit int32 (2,147,483,647)",
        "--extend-lens",
        1,
    ),
    (
        "cli bucket too small",
        lambda: cli("--seq-lens", "3,3,3", "--bucket", "2", "--buckets", "1,2"),
        "--bucket 2 is smaller than the batch of 3 requests; a batch is never truncated",
        "--bucket",
        None,
    ),
    (
        "cli num slots",
        lambda: cli("--seq-lens", "3,3,3", "--num-slots", "3"),
        "--num-slots 3 is too small for 3 request(s): they need 4 slots with the reserved dummy slot; "
        "pass --num-slots 4 or more",
        "--num-slots",
        None,
    ),
    # the runner: its arguments
    (
        "runner layer",
        lambda: GraphRunner(object(), StatePool(8, "sglang")),  # type: ignore[arg-type]
        "layer: object is not a workbench layer (it lacks forward, new_state, config, dtype, supported_modes)",
        "layer",
        None,
    ),
    (
        "runner pool",
        lambda: GraphRunner(make_layer("gdn"), "sglang"),  # type: ignore[arg-type]
        "pool must be a workbench.StatePool, got str",
        "pool",
        None,
    ),
    (
        "runner modes",
        lambda: GraphRunner(make_layer("gdn"), StatePool(8, "sglang"), modes=["decode", "extend"]),
        "modes[1] = 'extend': graphs are captured for ('decode', 'target_verify')",
        "modes",
        1,
    ),
    (
        "runner profile",
        lambda: GraphRunner(make_layer("gdn"), StatePool(8, "sglang"), "vllm", backend="cpu"),
        "profile: 'vllm' given, but the pool follows 'sglang'",
        "profile",
        None,
    ),
    # the layers: the step's inputs
    (
        "layer mode",
        lambda: _forward_in_mode("prefill"),
        "forward_mode: 'prefill' not supported by GatedDeltaNetLayer",
        "forward_mode",
        None,
    ),
    ("layer accept shape", lambda: _accept([1]), "num_accepted: expected shape (2,), got (1,)", "num_accepted", None),
    ("layer accept row", lambda: _accept([1, 4]), "num_accepted[1] = 4: must be in 1..D=3", "num_accepted", 1),
    # the engines (the adapter refuses before it imports its engine: no engine needed)
    (
        "engine buckets",
        lambda: get_adapter("sglang")(StatePool(8, "sglang"), []),
        "buckets: empty list; capture at least one batch size",
        "buckets",
        None,
    ),
    # the profiles
    (
        "profile name",
        lambda: get_profile("tgi"),
        "profile: unknown profile 'tgi'; choose one of ['sglang', 'sglang-ascend', 'vllm']",
        "profile",
        None,
    ),
    (
        "profile draft tokens",
        lambda: PROFILES["vllm"].slots_per_request(0),
        "draft_tokens must be an int >= 1, got 0",
        "draft_tokens",
        None,
    ),
    # the backends
    (
        "backend modes",
        lambda: CpuMetadataBackend(StatePool(8, "sglang"), [1, 2], modes=("decode", "extend")),
        "modes: 'extend' is not a graph mode; graphs exist for ('decode', 'target_verify')",
        "modes",
        None,
    ),
    (
        "backend mode not captured",
        lambda: CpuMetadataBackend(StatePool(8, "sglang"), [1, 2], modes=("decode",)).graph_mode_of(
            Batch.target_verify([1], [5], draft_tokens=2)
        ),
        "forward_mode: 'target_verify' is not captured; graphs exist for ('decode',)",
        "forward_mode",
        None,
    ),
    # the widgets: the control's field
    (
        "explorer int list",
        lambda: parse_int_list("seq_lens", "3, x, 4"),
        "seq_lens: item 1 is 'x', not an integer",
        "seq_lens",
        1,
    ),
    (
        "lab layer",
        lambda: layer_config("rwkv", "small"),
        "layer: 'rwkv' is not one of ['gdn', 'mamba2', 'kda']",
        "layer",
        None,
    ),
    (
        "lab buckets order",
        lambda: parse_buckets("4, 2"),
        "buckets must be strictly increasing: buckets[1] = 2 after 4",
        "buckets",
        1,
    ),
    ("lab buckets text", lambda: parse_buckets("1, y"), "buckets: item 1 is 'y', not an integer", "buckets", 1),
]


@pytest.mark.parametrize(("call", "message", "field", "row"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_errors_carry_their_field_and_row_and_keep_their_message(call, message, field, row):
    with pytest.raises(MetadataError) as info:
        call()
    e = info.value
    assert (str(e), e.field, e.row) == (message, field, row)


def test_a_lab_refusal_names_its_control_and_its_field():
    r = Refusal("general", "num_slots: expected ...", field="num_slots")
    assert (r.control, r.field, r.row) == ("general", "num_slots", None)
    assert (Refusal("buckets", "buckets: ...", row=2).field, Refusal("buckets", "x", row=2).row) == ("buckets", 2)
