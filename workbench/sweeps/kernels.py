"""Each decode kernel at a preset's shapes, with its bytes and FLOPs, against a copy floor (``workbench
bench kernels``, the report's roofline and the timing dashboard all run this sweep).

A case is :func:`kernels.testing.make_case` at batch size ``bs``: ``bs`` live rows on shuffled slots of a
pool that also holds the reserved slot 0, no padded rows, no guard band, activations in ``dtype`` (states
and gates float32, as engines keep them). Its cost (``Case.cost``, from ``kernels/*/cost.py``) gives each
record's ``bytes`` and ``flops``, so :class:`workbench.measure.ceilings.Ceilings` can say what fraction of
copy bandwidth it reaches.

Decode is memory-bound: every row reads and writes its whole recurrent state once per step. With
``floors=True`` each kernel record gets a twin, ``mode="copy-floor"``, ``impl="copy"``, same ``what`` and
``shape``: the time to copy the live rows' state (``dst.copy_(src)`` preallocated; ``bytes`` is
``Case.state_bytes``, read + write). ``ratio(res.filter(mode="kernel"), res.filter(mode="copy-floor"))``
is then how far each op is from moving its state at copy speed. Measured back to back, the ratios are
steadier than absolute times on a shared CPU.

Devices: on the CPU the kernels run their torch references (the kernels' "auto" rule); on a GPU their
Triton implementations, timed with CUDA events against a device copy floor. The timings check nothing:
``benchmarks/gpu_kernels.py`` checks each Triton kernel against its float64 reference on the device first.

    >>> res = sweep([1], ops=["causal_conv1d.update"], preset="small", min_run_time=0.01, progress=False,
    ...             floors=True)
    >>> [(r.what, r.mode, r.shape["bs"], r.bytes > 0) for r in res]
    [('causal_conv1d.update', 'kernel', 1, True), ('causal_conv1d.update', 'copy-floor', 1, True)]

Ops are the names of :data:`kernels.testing.OPS`; ``"op[variant]"`` times another variant than the op's
decode (or only) one, e.g. ``"gated_delta_rule.recurrent[verify]"``, and is the record's ``what``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch

from kernels.dispatch import IMPLS
from kernels.testing import OPS, SHAPES, make_case
from workbench.measure.timing import Results, TimingError, environment, time_fn
from workbench.sweeps.common import PRESET_NAMES, check_choice, recorded_impl

assert tuple(SHAPES) == PRESET_NAMES  # one vocabulary: kernels.testing's presets are the sweeps' presets
DECODE_OPS = tuple(name for name, spec in OPS.items() if "decode" in spec.variants)
FLOOR_MODE = "copy-floor"
DTYPE = torch.bfloat16  # activations and outputs; states and gates float32, as engines keep them


def default_variant(op: str) -> str:
    """The variant a bare op name times: decode where the op has one, else its only (first) variant."""
    variants = OPS[op].variants
    return "decode" if "decode" in variants else variants[0]


def parse_op(entry: str) -> tuple[str, str]:
    """``"op"`` or ``"op[variant]"`` -> (op, variant); TimingError names a bad one and the choices."""
    op, _, rest = entry.partition("[")
    if op not in OPS:
        raise TimingError(f"ops: unknown [{entry!r}], known {list(OPS)}")
    if not rest:
        return op, default_variant(op)
    variant = rest.removesuffix("]")
    if not rest.endswith("]") or variant not in OPS[op].variants:
        raise TimingError(f"ops: {entry!r}: {op} has variants {list(OPS[op].variants)}")
    return op, variant


def record_name(op: str, variant: str) -> str:
    """What a record of ``op``'s ``variant`` is called: the op's name for its default variant."""
    return op if variant == default_variant(op) else f"{op}[{variant}]"


def _floor(state_bytes: int, device: str) -> Callable[[], Any]:
    """A copy of ``state_bytes // 2`` bytes (read + write = ``state_bytes``) into memory allocated once: the
    floor of a step that must move its state."""
    src = torch.empty(max(1, state_bytes // 8), dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    return partial(dst.copy_, src)


def sweep(
    batch_sizes: Sequence[int],
    *,
    ops: Sequence[str] | None = None,
    preset: str = "engine",
    device: str = "cpu",
    impl: str = "auto",
    dtype: torch.dtype = DTYPE,
    progress: bool = True,
    min_run_time: float = 0.1,
    threads: int | None = None,
    floors: bool = False,
) -> Results:
    """Time every op in ``ops`` (default: the decode ops, :data:`DECODE_OPS`) at each batch size.

    Records: ``what`` the op (:func:`record_name`), ``shape={"bs": bs}``, ``impl`` (``recorded_impl``:
    "auto" is the reference on the CPU, Triton on a GPU), ``mode="kernel"``, ``bytes``/``flops`` from
    ``Case.cost``; with ``floors`` a ``mode="copy-floor"`` record of the same op and shape follows each
    (see the module docstring). ``preset``: "small" | "quarter" | "engine" (``kernels.testing.SHAPES``).
    An op that fails is listed in ``meta["errors"]`` (what -> "Type: message") and the others go on.
    """
    names = list(DECODE_OPS if ops is None else ops)
    bad = [o for o in names if o.partition("[")[0] not in OPS]
    if bad:
        raise TimingError(f"ops: unknown {bad}, known {list(OPS)}")
    todo_ops = [parse_op(o) for o in names]
    check_choice("preset", preset, PRESET_NAMES)
    check_choice("impl", impl, IMPLS)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TimingError(f"dtype: expected a floating torch.dtype, got {dtype!r}")
    sizes = list(batch_sizes)
    if not sizes or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in sizes):
        raise TimingError(f"batch_sizes: expected ints >= 1, got {sizes!r}")
    from tqdm.auto import tqdm

    variants = {record_name(op, v): v for op, v in todo_ops}
    res = Results(meta={"benchmark": "kernels", "preset": preset, "shapes": dict(SHAPES[preset]),
                        "dtype": str(dtype).removeprefix("torch."), "variants": variants, "errors": {}})  # fmt: skip
    if floors:
        res.meta["floor"] = "dst.copy_(src) of the live rows' state bytes, preallocated; bytes = read + write"
    timed = partial(time_fn, device=device, min_run_time=min_run_time, threads=threads)
    ran = recorded_impl(impl, device)
    todo = [(op, v, bs) for op, v in todo_ops for bs in sizes]
    # None: tqdm keeps quiet where stderr is no terminal (logs, CI); a notebook still shows its bar
    for op, variant, bs in tqdm(todo, desc=f"kernel sweep ({device})", disable=None if progress else True):
        what = record_name(op, variant)
        if what in res.meta["errors"]:
            continue
        try:
            # bs live rows on the pool's bs usable slots (slot 0 reserved): the state a step moves, nothing more
            case = make_case(op, variant, rows=bs, padded=0, shapes=preset, seed=0, device=device, dtype=dtype,
                             guard=0, tail=0, num_slots=bs + 1)  # fmt: skip
            step = partial(case.fn, **case.args, impl=impl)
            rec = timed(step, what=what, shape={"bs": bs}, impl=ran, mode="kernel", bytes=case.cost.bytes,
                        flops=case.cost.flops)  # fmt: skip
            state_bytes = case.state_bytes
            del step, case  # the op's pool goes before the floor's buffers arrive
            floor = None
            if floors:
                floor = timed(_floor(state_bytes, device), what=what, shape={"bs": bs}, impl="copy", mode=FLOOR_MODE,
                              bytes=state_bytes)  # fmt: skip
        except Exception as exc:  # one broken op must not hide the others; the error is reported, not lost
            res.meta["errors"][what] = f"{type(exc).__name__}: {exc}"
            continue
        res.append(rec)
        if floor is not None:
            res.append(floor)
    res.meta["environment"] = environment(device)
    return res
