"""Check a kernel the way the workbench checks its own: against the float64 reference, every variant of the
op, under every padding convention, and through the CPU graph recorder.

A candidate is a function with the public op's signature (keyword arguments as ``kernels.<op>`` takes them,
``pad_slot_id`` and ``out`` among them, ``impl`` not): ``partial(kernels.gated_delta_rule.recurrent,
impl="triton")`` (the interpreter on the CPU), ``"triton"`` or ``"reference"`` for the op's built-in
implementation, or your own. Everything about the inputs and the verdict is ``kernels.testing``'s: each
convention draws a seeded :func:`~kernels.testing.make_case` (live rows on shuffled slots, padded rows with
the convention's sentinel, NaN-poisoned outputs, a guard band of finite ``GUARD_VALUE`` slots around every
pool) and judges the call with :meth:`~kernels.testing.Case.check`.

Where a convention skips padded rows and the op packs tokens (``cu_seqlens``), the case runs twice: with
zero-length padded rows, as engines pad, and with padded rows carrying tokens. A kernel that forgets the
guard reads a slot of zero-length rows and writes the same bytes back, which no check can see; given
tokens, it writes its result there (the guard band before the pool under sglang's -1, the null slot 0
under vLLM's). A kernel must skip padded rows by their index, not by their length.

A kernel writes its arguments in place. One that resizes or replaces a tensor it is given (``out.resize_``,
``out.set_``, ``.data =`` on ``out``, a pool, an intermediate buffer) or writes a metadata tensor it must only
read (``state_indices``, ``cu_seqlens``, ...) fails in one line naming the argument and what changed, and
nothing else is judged: the caller reads the tensors it passed, not the kernel's new ones.

>>> res = check_kernel("reference", "causal_conv1d.update", capture=False)
>>> res.ok, res.names, [c.name for c in res["verify"].conventions]
(True, ['decode', 'verify', 'tree'], ['sglang', 'sglang-ascend', 'vllm'])
>>> [c.key for c in check_kernel("reference", "linear_attn.recurrent", "decode", capture=False).results]
['sglang', 'sglang+tokens', 'sglang-ascend', 'vllm', 'vllm+tokens']
>>> res.candidate
'causal_conv1d.update (impl="reference")'
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from kernels.conventions import CONVENTIONS, Convention, get_convention
from kernels.testing import Call, Case
from workbench.errors import CaptureError
from workbench.kernelcheck.choices import (
    KernelCheckError,
    Shapes,
    draw_case,
    resolve_conventions,
    resolve_op,
    resolve_sizes,
)
from workbench.kernelcheck.names import builtin, candidate_name
from workbench.kernelcheck.results import CaptureResult, ConventionResult, KernelCheck, VariantCheck

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


_IN_PLACE = "a kernel must write its arguments in place, never resize or replace them"


@dataclass(frozen=True)
class _Layout:
    """What a kernel must leave as it found it in a tensor argument: it writes the values, in place."""

    dtype: torch.dtype
    device: torch.device
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage: int  # which storage (torch's StorageImpl: set_ swaps it, a resize of the storage keeps it)
    address: int  # where its memory is
    nbytes: int  # its size
    offset: int

    @classmethod
    def of(cls, t: torch.Tensor) -> _Layout:
        s = t.untyped_storage()
        return cls(
            t.dtype, t.device, tuple(t.shape), t.stride(), s._cdata, s.data_ptr(), s.nbytes(), int(t.storage_offset())
        )

    def change(self, name: str, now: _Layout) -> str | None:
        """How ``now`` differs from this layout of ``name``, in words (None: it does not)."""
        if now.dtype != self.dtype:
            return f"changed the dtype of `{name}` from {self.dtype} to {now.dtype}"
        if now.device != self.device:
            return f"moved `{name}` from {self.device} to {now.device}"
        if now.shape != self.shape:
            return f"resized `{name}` from {list(self.shape)} to {list(now.shape)}"
        if now.storage != self.storage:
            return f"replaced the storage of `{name}` (set_ or .data =): the caller reads the old one"
        if now.nbytes != self.nbytes:
            return f"resized the storage of `{name}` from {self.nbytes} to {now.nbytes} bytes"
        if now.address != self.address:
            return f"moved the storage of `{name}`: the caller reads the old memory"
        if now.offset != self.offset:
            return f"moved `{name}` within its storage (offset {self.offset} to {now.offset})"
        if now.stride != self.stride:
            return f"changed the strides of `{name}` from {list(self.stride)} to {list(now.stride)}"
        return None


@dataclass
class _Before:
    """Each tensor argument's layout before a call, and a copy of each metadata tensor (indices, lengths,
    flags: the non-floating ones, which the kernel only reads)."""

    layouts: dict[str, _Layout]
    metadata: dict[str, torch.Tensor]

    @classmethod
    def of(cls, call: Call) -> _Before:
        tensors = {k: v for k, v in call.args.items() if isinstance(v, torch.Tensor)}
        return cls({k: _Layout.of(v) for k, v in tensors.items()},
                   {k: v.clone() for k, v in tensors.items() if not v.is_floating_point()})  # fmt: skip

    def misuse(self, call: Call) -> str | None:
        """What the kernel did to ``call``'s arguments beyond writing values in place, in one line naming
        them: resized or replaced a tensor (then its values are not where the caller reads them; a check of
        them would compare tensors of other shapes, or a guard band of a storage that moved), or wrote a
        metadata tensor. None when nothing."""
        moved = [m for k, was in self.layouts.items() if (m := was.change(k, _Layout.of(call.args[k]))) is not None]
        if moved:
            return f"the kernel {'; '.join(moved)}: {_IN_PLACE}"
        written = [
            _written(k, was, call.args[k]) for k, was in self.metadata.items() if not torch.equal(was, call.args[k])
        ]
        if written:
            return (f"the kernel wrote into {'; '.join(written)}: a kernel must only read the step's metadata "
                    "(every layer reads the same tensors)")  # fmt: skip
        return None


def _written(name: str, was: torch.Tensor, now: torch.Tensor) -> str:
    """The first element of ``name`` the kernel changed, in words: ``"`state_indices` (element 3: -1 became 0)"``."""
    diff = (was != now).reshape(-1).nonzero().flatten().tolist()
    i = diff[0]
    at = [int(j) for j in torch.unravel_index(torch.tensor(i), tuple(was.shape))]
    where = ", ".join(map(str, at))
    more = f"{len(diff)} elements, e.g. " if len(diff) > 1 else ""
    return f"`{name}` ({more}element {where}: {was.reshape(-1)[i].item()} became {now.reshape(-1)[i].item()})"


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

    The candidate may raise anything: that is reported (``error``), never raised; a candidate that resizes
    or replaces an argument, or writes a metadata tensor, fails naming it (``misuse``), unjudged. A bad op,
    variant, convention or shape raises :class:`KernelCheckError`.
    """
    f = _candidate(fn, op)
    case = draw_case(op, variant, convention=convention, shapes=shapes, rows=rows, padded=padded, seed=seed,
                     padded_tokens=padded_tokens)  # fmt: skip
    _reference(case)
    call = case.fresh()
    before = _Before.of(call)
    try:
        returned = f(**call.args)
    except Exception as e:  # the user's kernel may raise anything: report it, never into the notebook
        return ConventionResult(case.convention, case, call, error=f"{type(e).__name__}: {e}")
    misuse = before.misuse(call)
    if misuse is not None:  # nothing to judge: the values are not where the caller reads them
        return ConventionResult(case.convention, case, call, misuse=misuse)
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
    when ``fn`` raises, when its warm-up, capture or replay resizes or replaces an argument or writes a
    metadata tensor (said before what the recorder or the kernel made of it), or when the replay is off
    (e.g. it froze a capture-time value). Arguments as :func:`check_convention`.
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
    before = _Before.of(call)
    try:
        graph = get_backend("cpu").capture(lambda: f(**call.args), warmup=1)
    except Exception as e:  # the user's kernel may raise anything during warm-up or capture
        # what the warm-up did to the arguments first: the capture's call fails on the tensors it resized
        misuse = before.misuse(call)
        if misuse is not None:
            return CaptureResult(name, False, misuse)
        if isinstance(e, CaptureError):
            return CaptureResult(name, False, f"capture refused: {e}")
        error = f"{type(e).__name__}: {e}"
        return CaptureResult(name, False, f"capture raised {error}", error=error)
    misuse = before.misuse(call)
    if misuse is not None:
        return CaptureResult(name, False, misuse)
    ops = [r.name for r in graph.ops or []]
    new = target.fresh()
    for k, v in call.args.items():
        if isinstance(v, torch.Tensor) and k not in call.storage:
            _write_into(v, new.args[k])
    for k, s in call.storage.items():  # the pools are views of these: guard band included
        s.copy_(new.storage[k])
    before = _Before.of(call)
    try:
        graph.replay()
    except Exception as e:  # reported in words, like the capture's
        error = f"{type(e).__name__}: {e}"
        return CaptureResult(name, False, f"replay raised {error}", ops, error=error)
    misuse = before.misuse(call)
    if misuse is not None:
        return CaptureResult(name, False, f"replay: {misuse}", ops)
    check = target.check(call)
    what = f"{len(ops)} recorded op(s); replay on new values"
    if check.ok:
        return CaptureResult(name, True, f"{what} matches the float64 reference (max error {check.max_err:.2e})",
                             ops, check)  # fmt: skip
    return CaptureResult(name, False, f"{what}: " + "; ".join(check.problems()), ops, check)


def unfit(fn: Callable[..., Any], case: Case) -> str | None:
    """Why ``fn`` cannot take ``case``'s call, in words naming the arguments (None when its signature takes
    them, or has none to read): what it lacks (a kernel without the gating inputs ``a=`` ...) and what it
    requires that the variant does not pass."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or an object without a signature: let the call decide
        return None
    P = inspect.Parameter
    by_keyword = {p.name for p in params if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)}
    takes_any = any(p.kind is P.VAR_KEYWORD for p in params)
    lacks = [] if takes_any else [k for k in case.args if k not in by_keyword]
    required = [p.name for p in params if p.default is P.empty and p.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD)]
    needs = [k for k in required if k not in case.args]
    parts = []
    if lacks:
        them = "it" if len(lacks) == 1 else "them"
        parts.append(f"takes no {', '.join(k + '=' for k in lacks)} (the {case.variant} variant passes {them})")
    if needs:
        parts.append(f"requires {', '.join(needs)}, which the {case.variant} variant does not pass")
    return f"the kernel {' and '.join(parts)}" if parts else None


def padding_forms(convention: str | Convention, case: Case, padded_tokens: bool | None = None) -> list[bool]:
    """The ``padded_tokens`` values to run ``case``'s op under ``convention``: both (False first) where the
    convention skips padded rows and the op packs tokens (``cu_seqlens``), else zero-length only;
    ``padded_tokens`` True or False asks for that one form."""
    if padded_tokens is not None:
        return [padded_tokens]
    skips = not get_convention(convention).processes_padding
    return [False, True] if skips and case.padded and "cu_seqlens" in case.args else [False]


def check_variant(
    fn: Candidate,
    op: str = "gated_delta_rule.recurrent",
    variant: str | None = None,
    *,
    conventions: str | Convention | Sequence[str | Convention] = tuple(CONVENTIONS),
    shapes: Shapes = "small",
    capture: bool = True,
    seed: int = 0,
    rows: int = 3,
    padded: int = 2,
    padded_tokens: bool | None = None,
) -> VariantCheck:
    """Check ``fn`` on one variant of ``op``: under each of ``conventions`` in every form of padded rows
    (:func:`padding_forms`), then, with ``capture``, through the CPU recorder under the first convention
    (padded rows as engines pad them). A kernel whose signature cannot take the variant's call is not run:
    :attr:`VariantCheck.unfit` says which arguments. Other arguments as :func:`check_convention`."""
    f = _candidate(fn, op)
    convs = resolve_conventions(conventions)
    kw: dict[str, Any] = dict(shapes=shapes, rows=rows, padded=padded, seed=seed)
    first = draw_case(op, variant, convention=convs[0], **kw)  # refuses bad arguments before anything runs
    why = unfit(f, first)
    if why is not None:
        return VariantCheck(first.op, first.variant, [], None, unfit=why)
    results = []
    for c in convs:
        forms = padding_forms(c, first, padded_tokens)
        for tokens in forms:
            res = check_convention(f, op, first.variant, c, padded_tokens=tokens, **kw)
            res.padded_tokens, res.paired = tokens, len(forms) > 1
            results.append(res)
    cap = check_capture(f, op, first.variant, convs[0], padded_tokens=padded_tokens is True, **kw) if capture else None
    return VariantCheck(first.op, first.variant, results, cap)


def resolve_variants(op: str, variants: str | Sequence[str] | None) -> list[str]:
    """The variants of ``op`` named (None: every one, in the op's order)."""
    spec = resolve_op(op)
    if variants is None:
        return list(spec.variants)
    items = [variants] if isinstance(variants, str) else list(variants)
    if not items:
        raise KernelCheckError(f"variants: name at least one of {list(spec.variants)}")
    for v in items:
        if v not in spec.variants:
            raise KernelCheckError(f"variants: {op} has no variant {v!r}; choose one of {list(spec.variants)}")
    return list(dict.fromkeys(items))


def check_kernel(
    fn: Candidate,
    op: str = "gated_delta_rule.recurrent",
    variants: str | Sequence[str] | None = None,
    *,
    conventions: str | Convention | Sequence[str | Convention] = tuple(CONVENTIONS),
    shapes: Shapes = "small",
    capture: bool = True,
    seed: int = 0,
    name: str | None = None,
    rows: int = 3,
    padded: int = 2,
    padded_tokens: bool | None = None,
) -> KernelCheck:
    """Check ``fn`` (``op``'s signature) on every variant of ``op`` (``variants``: one name or a few), each
    as :func:`check_variant` does: every convention of ``conventions``, zero-length padded rows and padded
    rows with tokens where the convention skips them, then a capture. ``name``: how the result names the
    candidate (default :func:`~workbench.kernelcheck.names.candidate_name`); ``padded_tokens`` True or
    False: that form of padded rows only. Other arguments as :func:`check_convention`.

    Raises :class:`KernelCheckError` for a bad op, variant, convention or shape before anything runs.
    """
    f = _candidate(fn, op)
    names = resolve_variants(op, variants)
    convs = resolve_conventions(conventions)
    kw: dict[str, Any] = dict(shapes=shapes, rows=rows, padded=padded, seed=seed)
    for v in names:
        draw_case(op, v, convention=convs[0], **kw)  # refuses bad arguments before anything runs
    checks = [check_variant(f, op, v, conventions=convs, capture=capture, padded_tokens=padded_tokens, **kw)
              for v in names]  # fmt: skip
    return KernelCheck(
        op=checks[0].op,
        candidate=name or candidate_name(f),
        variants=checks,
        shapes=_shapes_text(shapes),
        sizes=resolve_sizes(shapes),
        rows=rows,
        padded=padded,
        seed=seed,
    )
