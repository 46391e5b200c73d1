"""The model behind ``KernelPlayground``: the choices of one kernel check, run by ``workbench.kernelcheck``.

Op and variant come from :data:`kernels.testing.OPS`, shape presets from :data:`kernels.testing.SHAPES`,
conventions from :data:`kernels.conventions.CONVENTIONS`; the candidate is the op's built-in ``triton``
(the interpreter on the CPU) or ``reference`` implementation, or your own kernel (:meth:`use_kernel`).
Cases, checks and the error map are the harness's; nothing is built here. Plain Python, no ipywidgets.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kernels.conventions import CONVENTIONS
from kernels.testing import OPS, SHAPES
from workbench.errors import WorkbenchError
from workbench.kernelcheck import KernelCheck, KernelCheckError, check_kernel

IMPLS = ("triton", "reference")


class PlaygroundModel:
    """One kernel check's choices; :meth:`run` returns a :class:`~workbench.kernelcheck.KernelCheck`, or
    None with ``error`` set (words, never an exception).

    Args:
        op, variant: a name of ``kernels.testing.OPS`` and one of its variants (None: the first).
        impl: "triton" | "reference", ignored while a user kernel is set.
        shapes: a preset of ``kernels.testing.SHAPES`` or sizes overriding "small"'s.
        rows, padded: live and padded batch rows; padded_tokens: padded rows of varlen ops carry tokens.
        conventions: the conventions checked; capture: capture through the CPU recorder too; seed.
    """

    def __init__(
        self,
        op: str = "gated_delta_rule.recurrent",
        variant: str | None = None,
        impl: str = "triton",
        *,
        shapes: str | Mapping[str, int] = "small",
        rows: int = 3,
        padded: int = 2,
        padded_tokens: bool = False,
        conventions: Sequence[str] = tuple(CONVENTIONS),
        capture: bool = True,
        seed: int = 0,
    ) -> None:
        self.op, self.variant, self.impl = op, variant, impl
        self.shapes, self.rows, self.padded, self.padded_tokens = shapes, rows, padded, padded_tokens
        self.conventions, self.capture, self.seed = tuple(conventions), capture, seed
        self.user_fn: Callable[..., Any] | None = None
        self.error: str | None = None
        self.result: KernelCheck | None = None

    @staticmethod
    def ops() -> list[str]:
        return list(OPS)

    @staticmethod
    def variants(op: str) -> list[str]:
        """The variants of ``op`` (empty for an unknown op)."""
        return list(OPS[op].variants) if op in OPS else []

    @staticmethod
    def presets() -> list[str]:
        return list(SHAPES)

    def use_kernel(self, fn: Callable[..., Any] | None) -> None:
        """Check ``fn`` (the op's signature) instead of a built-in implementation; None goes back."""
        self.user_fn = fn

    def candidate(self) -> Callable[..., Any] | str:
        """The user kernel, or the built-in implementation's name (``check_kernel`` binds it to the op)."""
        if self.user_fn is not None:
            return self.user_fn
        if self.impl not in IMPLS:
            raise KernelCheckError(f"impl: unknown implementation {self.impl!r}; choose one of {list(IMPLS)}")
        return self.impl

    def run(self) -> KernelCheck | None:
        self.error, self.result = None, None
        try:
            self.result = check_kernel(
                self.candidate(), self.op, self.variant, conventions=self.conventions, shapes=self.shapes,
                capture=self.capture, seed=self.seed, rows=self.rows, padded=self.padded,
                padded_tokens=self.padded_tokens,
            )  # fmt: skip
        except (WorkbenchError, TypeError, RuntimeError, ValueError) as e:
            self.error = str(e)
        return self.result
