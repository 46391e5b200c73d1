"""Helpers shared by the kernel tests: the conformance matrix over ``kernels.testing``, a direct Triton launch,
an op recorder and a custom-op schema check.

Inputs, padding conventions, tolerances and the check against the float64 reference are not written here:
they are ``kernels.testing`` (``make_case``, ``Case.check``, ``tolerance``, ``cu_seqlens``, ``rel_err``) and
``kernels.conventions.CONVENTIONS``.

A plain module beside the tests (``tests`` is not a package), imported as ``_kernel_helpers``: this
folder is on ``sys.path`` under pytest's default import mode, and ``conftest.py`` puts it there otherwise.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernels.conventions import CONVENTIONS
from kernels.dispatch import implementation
from kernels.testing import OPS, Call, Case, make_case

IMPLS = ("reference", "triton")

# Batch of the conformance matrix: two live rows (make_case puts them on the lowest and the highest usable
# slot) and one padded row. "small" shapes cut to what the padding rule needs: one value head (mamba2: two
# heads sharing one group), K = 12 and V = 10 (one value block, neither a power of two, K != V so that a
# state read in the wrong layout has the wrong shape), 2 draft tokens per verify row, extend rows of 3 and
# 1 tokens. The interpreter costs 10-25 ms per program and token: these keep the matrix
# (every op, variant, convention, implementation) to a few seconds. Each file's own tests cover what this
# leaves out, with "small" shapes or more: grouped value heads and head strides, long rows and chunk
# boundaries, V split across programs.
ROWS, PADDED = 2, 1
SHAPES = {"HV": 1, "K": 12, "V": 10, "D": 2, "extend": 3, "nheads": 2, "ngroups": 1}

# (impl, dtype, padded_tokens) of each conformance run, under every convention. fp32: the reference and
# Triton on the engines' layout (padded rows of varlen ops carry no tokens). fp16: Triton with padded rows
# that carry as many tokens as a live row, so that a kernel must skip them by their slot, not by their
# length (under Ascend they really run on the dummy slot). Row-indexed ops have no token counts, and fp16
# changes only the kernels' loads and stores, not their padding logic: there the fp16 run is made under
# FP16_CONVENTION alone.
RUNS = (
    ("reference", torch.float32, False),
    ("triton", torch.float32, False),
    ("triton", torch.float16, True),
)
FP16_CONVENTION = "vllm"

# Ops with a K x V state (OpSpec.state_layouts) run every cell of the matrix in each layout: their Triton
# kernels read the pool through strides, so a layout is one more stride pattern to get right everywhere.


@functools.cache
def is_varlen(op: str) -> bool:
    """Whether ``op`` takes packed tokens (``cu_seqlens``) rather than one fixed-size batch row per index."""
    return "cu_seqlens" in make_case(op, rows=1, padded=0).args


@functools.cache
def conformance_case(
    op: str, variant: str, convention: str, dtype: torch.dtype, padded_tokens: bool, state_layout: str | None = None
) -> Case:
    """The matrix's case, built once: the implementations that share it share its float64 reference.
    Callers must not change it (``Case.run`` and ``Case.fresh`` work on copies)."""
    return make_case(
        op, variant, convention=convention, rows=ROWS, padded=PADDED, shapes=SHAPES, dtype=dtype,
        padded_tokens=padded_tokens, state_layout=state_layout,
    )  # fmt: skip


def dummy_slot_written(case: Case, call: Call) -> bool:
    """Whether the call changed the dummy slot of any pool."""
    d = case.convention.dummy_slot
    return any(not torch.equal(call.args[pool][d], case.args[pool][d]) for pool in case.pools)


@dataclass(frozen=True)
class Conformance:
    """One cell of the conformance matrix: an op's variant under one convention, one implementation, one
    dtype. :meth:`check` runs it and asserts :meth:`kernels.testing.Case.check` passes."""

    op: str
    variant: str
    convention: str
    impl: str
    dtype: torch.dtype
    padded_tokens: bool
    state_layout: str | None = None

    def __str__(self) -> str:
        tokens = "-padded_tokens" if self.padded_tokens else ""
        dtype = str(self.dtype).removeprefix("torch.")
        layout = f"-{self.state_layout}" if self.state_layout else ""
        return f"{self.op.split('.')[-1]}[{self.variant}]-{self.convention}-{self.impl}-{dtype}{tokens}{layout}"

    @property
    def case(self) -> Case:
        return conformance_case(
            self.op, self.variant, self.convention, self.dtype, self.padded_tokens, self.state_layout
        )

    def check(self) -> Call:
        case = self.case
        call = case.run(impl=self.impl)
        res = case.check(call)
        assert res.ok, f"{res.summary()} (state_layout={self.state_layout})"
        # Under Ascend padded rows are processed, not skipped: the dummy slot must show it wherever a padded
        # row writes state (the check itself leaves the dummy slot out: several rows race on it).
        writes = not case.args.get("disable_state_update", False) and (self.padded_tokens or not is_varlen(self.op))
        if case.convention.processes_padding and case.padded and writes:
            assert dummy_slot_written(case, call), f"{case.name} {self.convention}: padded rows were not processed"
        return call


def conformance(*ops: str) -> list[Conformance]:
    """Every variant of each op under every convention, for each of :data:`RUNS` (see there for fp16), in each
    of the op's state layouts (``OpSpec.state_layouts``; none: the op's only one)."""
    return [
        Conformance(op, variant, convention, impl, dtype, padded_tokens and is_varlen(op), layout)
        for op in ops
        for variant in OPS[op].variants
        for convention in CONVENTIONS
        for impl, dtype, padded_tokens in RUNS
        if is_varlen(op) or dtype != torch.float16 or convention == FP16_CONVENTION
        for layout in OPS[op].state_layouts or (None,)
    ]


def launch_triton(case: Case, args: dict[str, Any], **overrides: Any) -> Any:
    """Call ``case``'s Triton launcher (``OpSpec.launcher``) directly on the public op's arguments ``args``
    (its defaults filled in): no argument checks, and ``overrides`` (``block_v=16``, ...) reach the launcher."""
    bound = inspect.signature(case.fn).bind(**args)
    bound.apply_defaults()
    launcher = implementation("triton", reference=lambda **_: None, triton=case.spec.launcher)
    params = inspect.signature(launcher).parameters
    return launcher(**{k: v for k, v in bound.arguments.items() if k in params}, **overrides)


class OpLog(TorchDispatchMode):
    """Records the name of every op dispatched while active (``with OpLog() as log: ...; log.ops``)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def opcheck_mutations(op, args) -> None:
    """torch.library.opcheck of a custom op's schema (declared mutations) and fake kernel."""
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))
