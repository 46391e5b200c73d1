"""The model behind ``KernelPlayground``: the choices of one kernel check, run by ``workbench.kernelcheck``.

Op and variant come from :data:`kernels.testing.OPS`, shape presets from :data:`kernels.testing.SHAPES`,
conventions from :data:`kernels.conventions.CONVENTIONS`; the candidate is the op's built-in ``triton``
(the interpreter on the CPU) or ``reference`` implementation, or your own kernel (:meth:`use_kernel`).
Cases, checks and the error map are the harness's; nothing is built here. Plain Python, no ipywidgets.

What runs here decides the default: the check's cases are CPU tensors, so the built-in Triton kernels run
only in Triton's interpreter, and only when ``TRITON_INTERPRET=1`` was set before the kernel modules were
imported (:func:`triton_problem`); elsewhere ``impl`` defaults to "reference" and choosing "triton" says
how to restart, beside the control, instead of failing under every convention.

Limits, checked before any work starts (:meth:`PlaygroundModel.plan`, microseconds): every size is clamped
into :data:`RANGES` (and says so), and a check that would hold more than :data:`MAX_BYTES` of tensors at
once (:func:`workbench.kernelcheck.sizing.check_bytes`) is refused in words. The bounds: 256 MiB for the
reference; 16 MiB for Triton in the interpreter, which runs each program in Python (on this workbench's
CPUs a check of a few MiB takes seconds per convention: 4 MiB of gated-delta-rule state, about 5 s).

Any value set on the model comes back in words: :meth:`PlaygroundModel.plan` refuses each choice the check
cannot take (an unknown op or variant, shapes that are no preset or mapping of known sizes, a size or row
count that is no int, ``padded_tokens`` not None/True/False, unknown conventions, ``capture`` not a bool, a
seed outside ``[0, 2**63 - 1]``, a user kernel that is not callable) beside its control, before any work;
nothing is kept from a refused run, and the next run of good choices runs as on a fresh model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernels.conventions import CONVENTIONS, Convention
from kernels.testing import OPS, SHAPES
from workbench.devices import TRITON_ON_CPU, triton_cpu_problem
from workbench.errors import WorkbenchError
from workbench.kernelcheck import KernelCheck, KernelCheckError, check_kernel
from workbench.kernelcheck.sizing import check_bytes
from workbench.limits import check_int, gib
from workbench.widgets.explorer_model import shown

IMPLS = ("triton", "reference")
TRITON_HINT = TRITON_ON_CPU
MAX_BYTES = {"reference": 256 * 2**20, "triton": 16 * 2**20}  # see the module docstring
MAX_SIZE = 8192
SEED_MAX = 2**63 - 1  # a non-negative int64: torch.Generator.manual_seed takes it on every platform
RANGES: dict[str, tuple[int, int]] = {"rows": (1, 64), "padded": (0, 64)} | {
    k: (2 if k == "width" else 1, MAX_SIZE) for k in SHAPES["small"]
}
PADDED_ROWS = {"both": None, "zero-length": False, "with tokens": True}  # the padded-rows choice -> padded_tokens
# the controls an error or a note is shown beside; "general" for anything else
CONTROLS = ("op", "variant", "impl", "shapes", "padded_rows", "general")


def triton_problem() -> str | None:
    """Why the built-in Triton kernels cannot run the playground's (CPU) cases here, or None
    (``workbench.devices.triton_cpu_problem``)."""
    return triton_cpu_problem()


def default_impl() -> str:
    """ "triton" where it runs the playground's cases (see :func:`triton_problem`), else "reference"."""
    return "triton" if triton_problem() is None else "reference"


def control_of(message: str) -> str:
    """The control a harness error belongs beside: the word before its first colon (``shapes['K']`` ->
    shapes, ``variants`` -> variant), "general" when it names none."""
    head = message.split(":", 1)[0].split("[", 1)[0].strip()
    head = {"variants": "variant", "rows": "shapes", "padded": "shapes", "fn": "general"}.get(head, head)
    return head if head in CONTROLS else "general"


@dataclass
class Plan:
    """What a run would do, decided before it starts: the sizes after clamping, the notes that say what was
    clamped (control -> words), the bytes a check would hold and the bound, and the refusals (control ->
    words; empty: it may run)."""

    sizes: dict[str, int]
    rows: int
    padded: int
    notes: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    nbytes: int = 0
    bound: int = 0

    @property
    def ok(self) -> bool:
        return not self.errors


class PlaygroundModel:
    """One kernel check's choices; :meth:`run` returns a :class:`~workbench.kernelcheck.KernelCheck`, or
    None with ``errors`` set (words keyed by control, never an exception).

    Args:
        op, variant: a name of ``kernels.testing.OPS`` and one of its variants (None: the first).
        impl: "triton" | "reference" (None: :func:`default_impl`), ignored while a user kernel is set.
        shapes: a preset of ``kernels.testing.SHAPES`` or sizes overriding "small"'s.
        rows, padded: live and padded batch rows; padded_tokens: padded rows of varlen ops carry tokens
            (None: both forms where the convention skips padded rows, as ``check_kernel`` does).
        conventions: the conventions checked; capture: capture through the CPU recorder too; seed.
    """

    def __init__(
        self,
        op: str = "gated_delta_rule.recurrent",
        variant: str | None = None,
        impl: str | None = None,
        *,
        shapes: str | Mapping[str, int] = "small",
        rows: int = 3,
        padded: int = 2,
        padded_tokens: bool | None = None,
        conventions: Sequence[str] = tuple(CONVENTIONS),
        capture: bool = True,
        seed: int = 0,
    ) -> None:
        self.op, self.variant = op, variant
        self.impl = default_impl() if impl is None else impl
        self.shapes, self.rows, self.padded, self.padded_tokens = shapes, rows, padded, padded_tokens
        # a sequence is kept as a tuple; anything else as given, refused in words by plan()
        self.conventions = tuple(conventions) if isinstance(conventions, list | tuple) else conventions
        self.capture, self.seed = capture, seed
        self.user_fn: Callable[..., Any] | None = None
        self.errors: dict[str, str] = {}
        self.notes: dict[str, str] = {}
        self.result: KernelCheck | None = None

    @property
    def error(self) -> str | None:
        """Every error of the last run in one line (None when it ran)."""
        return "; ".join(self.errors.values()) or None

    @staticmethod
    def ops() -> list[str]:
        return list(OPS)

    @staticmethod
    def variants(op: str) -> list[str]:
        """The variants of ``op`` (empty for an unknown op)."""
        return list(OPS[op].variants) if isinstance(op, str) and op in OPS else []

    @staticmethod
    def presets() -> list[str]:
        return list(SHAPES)

    def use_kernel(self, fn: Callable[..., Any] | None) -> None:
        """Check ``fn`` (the op's signature) instead of a built-in implementation; None goes back."""
        self.user_fn = fn

    def impl_problem(self) -> str | None:
        """Why the chosen built-in implementation cannot run here (None: it can, or a user kernel is set)."""
        if self.user_fn is not None:
            return None
        if self.impl not in IMPLS:
            return f"impl: unknown implementation {shown(self.impl)}; choose one of {list(IMPLS)}"
        return triton_problem() if self.impl == "triton" else None

    def candidate(self) -> Callable[..., Any] | str:
        """The user kernel, or the built-in implementation's name (``check_kernel`` binds it to the op)."""
        if self.user_fn is not None:
            return self.user_fn
        if self.impl not in IMPLS:
            raise KernelCheckError(f"impl: unknown implementation {self.impl!r}; choose one of {list(IMPLS)}")
        return self.impl

    def _clamp(self, name: str, value: object, notes: list[str]) -> int:
        lo, hi = RANGES[name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise KernelCheckError(f"{name}: must be an int, got {shown(value)}")
        clamped = min(max(value, lo), hi)
        if clamped != value:
            notes.append(f"{name}: {value:,} clamped to {clamped} (the playground takes {lo} to {hi})")
        return clamped

    def _refusals(self) -> dict[str, str]:
        """Control -> why a choice other than the sizes cannot be checked (see the module docstring)."""
        out: dict[str, str] = {}
        if not isinstance(self.op, str) or self.op not in OPS:
            out["op"] = f"op: unknown op {shown(self.op)}; choose one of {list(OPS)}"
        elif self.variant is not None and (
            not isinstance(self.variant, str) or self.variant not in self.variants(self.op)
        ):
            out["variant"] = (
                f"variants: {self.op} has no variant {shown(self.variant)}; choose one of {self.variants(self.op)}"
            )
        if self.padded_tokens is not None and not isinstance(self.padded_tokens, bool):
            out["padded_rows"] = (
                f"padded_tokens must be None (both forms), True or False, got {shown(self.padded_tokens)}"
            )
        general = []
        if self.user_fn is not None and not callable(self.user_fn):
            general.append(f"fn: {shown(self.user_fn)} is not a function; use_kernel takes your kernel, or None")
        conventions = self.conventions
        items = [conventions] if isinstance(conventions, str | Convention) else conventions
        if not isinstance(items, list | tuple) or not items:
            general.append(f"conventions: name at least one of {list(CONVENTIONS)}, got {shown(conventions)}")
        else:
            bad = [
                c for c in items if not isinstance(c, Convention) and (not isinstance(c, str) or c not in CONVENTIONS)
            ]
            if bad:
                general.append(f"conventions: unknown {shown(bad)}; choose from {list(CONVENTIONS)}")
        if not isinstance(self.capture, bool):
            general.append(f"capture must be True or False, got {shown(self.capture)}")
        try:
            check_int("seed", self.seed, 0, SEED_MAX)
        except WorkbenchError as e:
            general.append(str(e))
        if general:
            out["general"] = "; ".join(general)
        return out

    def _given_sizes(self) -> tuple[str, dict[str, Any]]:
        """The preset the sizes start from and every size asked for; KernelCheckError (shapes) when the shapes
        are no preset's name or no mapping of known sizes."""
        small = SHAPES["small"]
        if isinstance(self.shapes, str):
            if self.shapes not in SHAPES:
                raise KernelCheckError(f"shapes: unknown preset {shown(self.shapes)}; choose one of {list(SHAPES)}")
            return self.shapes, dict(SHAPES[self.shapes])
        if not isinstance(self.shapes, Mapping):
            raise KernelCheckError(
                f"shapes: a preset's name or a mapping of sizes, got {shown(self.shapes)}; presets {list(SHAPES)}"
            )
        unknown = [k for k in self.shapes if not isinstance(k, str) or k not in small]
        if unknown:
            raise KernelCheckError(f"shapes: unknown sizes {shown(unknown)}; sizes are {list(small)}")
        return "small", {**small, **self.shapes}

    def plan(self) -> Plan:
        """The run's sizes, clamped into :data:`RANGES`, and its refusals, in microseconds: nothing is drawn."""
        plan = Plan({}, self.rows, self.padded)
        plan.errors.update(self._refusals())
        notes: list[str] = []
        try:
            preset, given = self._given_sizes()
            plan.rows = self._clamp("rows", self.rows, notes)
            plan.padded = self._clamp("padded", self.padded, notes)
            plan.sizes = {k: (self._clamp(k, v, notes) if k in RANGES else v) for k, v in given.items()}
        except KernelCheckError as e:
            plan.errors["shapes"] = str(e)
            return plan
        if notes:
            plan.notes["shapes"] = "; ".join(notes)
        problem = self.impl_problem()
        if problem is not None:
            plan.errors["impl"] = problem
        if "op" in plan.errors or "variant" in plan.errors:
            return plan
        variant = self.variant if self.variant is not None else OPS[self.op].variants[0]
        tail = 2 if preset == "small" else 0
        plan.nbytes = check_bytes(self.op, variant, plan.sizes, plan.rows, plan.padded, tail=tail)
        impl = "triton" if self.user_fn is None and self.impl == "triton" else "reference"
        plan.bound = MAX_BYTES[impl]
        if plan.nbytes > plan.bound:
            where = "Triton's interpreter" if impl == "triton" else "the playground"
            plan.errors["shapes"] = (
                f"shapes: rows={plan.rows}, padded={plan.padded} and these sizes would hold {gib(plan.nbytes)} of "
                f"tensors at once; {where} runs at most {gib(plan.bound)}: lower a size or the rows"
            )
        return plan

    def _shapes_for(self, plan: Plan) -> str | dict[str, int]:
        """The preset's name while clamping changed nothing, else the clamped sizes that differ from "small"'s
        (how ``check_kernel`` takes and names them)."""
        if isinstance(self.shapes, str) and plan.sizes == SHAPES[self.shapes]:
            return self.shapes
        return {k: v for k, v in plan.sizes.items() if v != SHAPES["small"][k]}

    def run(self) -> KernelCheck | None:
        """Plan (clamp, refuse), then check; the previous result is gone either way."""
        self.errors, self.result = {}, None
        plan = self.plan()
        self.notes = dict(plan.notes)
        if not plan.ok:
            self.errors = dict(plan.errors)
            return None
        variant = self.variant if self.variant is not None or self.op not in OPS else OPS[self.op].variants[0]
        try:
            self.result = check_kernel(
                self.candidate(), self.op, variant, conventions=self.conventions, shapes=self._shapes_for(plan),
                capture=self.capture, seed=self.seed, rows=plan.rows, padded=plan.padded,
                padded_tokens=self.padded_tokens,
            )  # fmt: skip
        except (WorkbenchError, TypeError, RuntimeError, ValueError) as e:
            self.errors[control_of(str(e))] = str(e)
        return self.result
