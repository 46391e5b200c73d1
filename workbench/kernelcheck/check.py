"""Check a kernel the way the workbench checks its own: against the float64 reference under every padding
convention, and through the CPU graph recorder.

A candidate is a function with the public op's signature (keyword arguments as ``kernels.<op>`` takes them,
``pad_slot_id`` and ``out`` among them, ``impl`` not): ``partial(kernels.gated_delta_rule.recurrent,
impl="triton")`` (the interpreter on the CPU), ``"triton"`` or ``"reference"`` for the op's built-in
implementation, or your own. Everything about the inputs and the verdict is ``kernels.testing``'s: each
convention draws a seeded :func:`~kernels.testing.make_case` (live rows on shuffled slots, padded rows with
the convention's sentinel, NaN-poisoned outputs, a NaN guard band around every pool) and judges the call
with :meth:`~kernels.testing.Case.check`.

>>> res = check_kernel("reference", "causal_conv1d.update", capture=False)
>>> res.ok, [c.name for c in res.conventions]
(True, ['sglang', 'sglang-ascend', 'vllm'])
>>> res.candidate
'causal_conv1d.update (impl="reference")'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from kernels.conventions import CONVENTIONS, Convention
from kernels.testing import Call, Case
from workbench.errors import CaptureError
from workbench.kernelcheck.choices import KernelCheckError, Shapes, draw_case, resolve_conventions
from workbench.kernelcheck.names import builtin, candidate_name
from workbench.kernelcheck.results import CaptureResult, ConventionResult, KernelCheck

Candidate = Callable[..., Any] | str  # a kernel with the op's signature, or "triton" / "reference" / "auto"


def _candidate(fn: Candidate, op: str) -> Callable[..., Any]:
    if isinstance(fn, str):
        return builtin(op, fn)
    if not callable(fn):
        raise KernelCheckError(f"fn: a function with the op's signature or an impl name, got {fn!r}")
    return fn


def _reference(case: Case) -> None:
    """Compute the float64 reference first: shapes the op refuses are the caller's error, not the kernel's."""
    try:
        case.reference()
    except ValueError as e:
        raise KernelCheckError(f"shapes: {case.name} refuses them: {e}") from None


def _shapes_text(shapes: Shapes) -> str:
    if isinstance(shapes, str):
        return shapes
    return ", ".join(["small", *(f"{k}={v}" for k, v in shapes.items())])


def _returned_instead(returned: object, call: Call) -> bool:
    """The candidate returned a tensor that is not ``out`` (and left ``out`` unwritten, presumably)."""
    out = call.args.get("out")
    if not isinstance(returned, torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    return returned.untyped_storage().data_ptr() != out.untyped_storage().data_ptr()


def check_convention(
    fn: Candidate,
    op: str = "gated_delta_rule.recurrent",
    variant: str | None = None,
    convention: str | Convention = "sglang",
    *,
    shapes: Shapes = "small",
    rows: int = 3,
    padded: int = 2,
    seed: int = 0,
    padded_tokens: bool = False,
) -> ConventionResult:
    """Run ``fn`` once on a drawn case of ``op`` under ``convention`` and judge it (see the module docstring).

    Args:
        fn: the candidate; op, variant: a name of ``kernels.testing.OPS`` and one of its variants (None: the
            first); convention: a name of ``kernels.conventions.CONVENTIONS``.
        shapes: a preset of ``kernels.testing.SHAPES`` or sizes overriding "small"'s; rows, padded: live and
            padded batch rows; seed: every input is drawn from it.
        padded_tokens: padded rows of varlen ops get tokens too (a kernel must still skip them).

    The candidate may raise anything: that is reported (``error``), never raised. A bad op, variant,
    convention or shape raises :class:`KernelCheckError`.
    """
    f = _candidate(fn, op)
    case = draw_case(op, variant, convention=convention, shapes=shapes, rows=rows, padded=padded, seed=seed,
                     padded_tokens=padded_tokens)  # fmt: skip
    _reference(case)
    call = case.fresh()
    try:
        returned = f(**call.args)
    except Exception as e:  # the user's kernel may raise anything: report it, never into the notebook
        return ConventionResult(case.convention, case, call, error=f"{type(e).__name__}: {e}")
    check = case.check(call)
    notes = []
    if check.unwritten and _returned_instead(returned, call):
        notes.append("it returned a new tensor instead of writing out= (the engines pass out and read it)")
    return ConventionResult(case.convention, case, call, check, notes=notes)


def _same_slots(static: Case, other: Case) -> Case:
    """``other``'s floating inputs and pools, with ``static``'s indices, lengths and flags: what a replay of
    a graph captured on ``static`` computes when ``other``'s values are written into its tensors."""
    args = {
        k: (static.args[k] if isinstance(v, torch.Tensor) and not v.is_floating_point() else v)
        for k, v in other.args.items()
    }
    return replace(other, args=args, live_slots=list(static.live_slots), _reference=None)


def _write_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)``, also where ``dst`` is expanded (stride 0: a per-head parameter): then the one
    stored element along each expanded dimension is written."""
    one = tuple(slice(0, 1) if st == 0 else slice(None) for st in dst.stride())
    dst[one].copy_(src[one])


def check_capture(
    fn: Candidate,
    op: str = "gated_delta_rule.recurrent",
    variant: str | None = None,
    convention: str | Convention = "sglang",
    *,
    shapes: Shapes = "small",
    rows: int = 3,
    padded: int = 2,
    seed: int = 0,
    padded_tokens: bool = False,
) -> CaptureResult:
    """Capture ``fn`` on a drawn case with the CPU recorder, write a second case's values (drawn from
    ``seed + 1``, same slots) into the captured tensors, replay, and judge the replay with ``Case.check``.

    Fails, in words, when the recorder refuses the capture (a host read, a storage swap: ``CaptureError``),
    when ``fn`` raises, or when the replay is off (e.g. it froze a capture-time value). Arguments as
    :func:`check_convention`.
    """
    from workbench.graphs import get_backend

    f = _candidate(fn, op)
    kw: dict[str, Any] = dict(convention=convention, shapes=shapes, rows=rows, padded=padded,
                              padded_tokens=padded_tokens)  # fmt: skip
    static = draw_case(op, variant, seed=seed, **kw)
    target = _same_slots(static, draw_case(op, variant, seed=seed + 1, **kw))
    _reference(target)
    name = static.convention.name
    call = static.fresh()
    try:
        graph = get_backend("cpu").capture(lambda: f(**call.args), warmup=1)
    except CaptureError as e:
        return CaptureResult(name, False, f"capture refused: {e}")
    except Exception as e:  # the user's kernel may raise anything during warm-up or capture
        return CaptureResult(name, False, f"capture raised {type(e).__name__}: {e}")
    ops = [r.name for r in graph.ops or []]
    new = target.fresh()
    for k, v in call.args.items():
        if isinstance(v, torch.Tensor) and k not in call.storage:
            _write_into(v, new.args[k])
    for k, s in call.storage.items():  # the pools are views of these: guard band included
        s.copy_(new.storage[k])
    try:
        graph.replay()
    except Exception as e:  # reported in words, like the capture's
        return CaptureResult(name, False, f"replay raised {type(e).__name__}: {e}", ops)
    check = target.check(call)
    what = f"{len(ops)} recorded op(s); replay on new values"
    if check.ok:
        return CaptureResult(name, True, f"{what} matches the float64 reference (max error {check.max_err:.2e})",
                             ops, check)  # fmt: skip
    return CaptureResult(name, False, f"{what}: " + "; ".join(check.problems()), ops, check)


def check_kernel(
    fn: Candidate,
    op: str = "gated_delta_rule.recurrent",
    variant: str | None = None,
    *,
    conventions: str | Convention | Sequence[str | Convention] = tuple(CONVENTIONS),
    shapes: Shapes = "small",
    capture: bool = True,
    seed: int = 0,
    name: str | None = None,
    rows: int = 3,
    padded: int = 2,
    padded_tokens: bool = False,
) -> KernelCheck:
    """Check ``fn`` (``op``'s signature) under each of ``conventions`` and, with ``capture``, through the CPU
    graph recorder under the first of them. ``name``: how the result names the candidate (default
    :func:`~workbench.kernelcheck.names.candidate_name`). Other arguments as :func:`check_convention`.

    Raises :class:`KernelCheckError` for a bad op, variant, convention or shape before anything runs.
    """
    f = _candidate(fn, op)
    convs = resolve_conventions(conventions)
    kw: dict[str, Any] = dict(shapes=shapes, rows=rows, padded=padded, seed=seed, padded_tokens=padded_tokens)
    first = draw_case(op, variant, convention=convs[0], **kw)  # refuses bad arguments before anything runs
    results = [check_convention(f, op, first.variant, c, **kw) for c in convs]
    cap = check_capture(f, op, first.variant, convs[0], **kw) if capture else None
    return KernelCheck(
        op=first.op,
        variant=first.variant,
        candidate=name or candidate_name(f),
        conventions=results,
        capture=cap,
        shapes=_shapes_text(shapes),
        rows=rows,
        padded=padded,
        seed=seed,
    )
