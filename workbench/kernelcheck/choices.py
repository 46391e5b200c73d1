"""What a check takes, and the error that names a bad choice.

The choices live in ``kernels``: ops and variants in :data:`kernels.testing.OPS`, shape presets in
:data:`kernels.testing.SHAPES`, conventions in :data:`kernels.conventions.CONVENTIONS`; ``make_case`` and
``get_convention`` validate them. Here their ``ValueError`` becomes a :class:`KernelCheckError` (a
``WorkbenchError``, still a ``ValueError``) that names the argument, the value and the choices.

>>> draw_case("causal_conv1d.update", "extend", convention="vllm").name
Traceback (most recent call last):
...
workbench.kernelcheck.choices.KernelCheckError: variant: causal_conv1d.update has no variant 'extend'; choose one of ['decode', 'verify']
"""  # noqa: E501

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kernels.conventions import CONVENTIONS, Convention, get_convention
from kernels.testing import Case, OpSpec, get_op, make_case
from workbench.errors import WorkbenchError

Shapes = str | Mapping[str, int]  # a preset name of kernels.testing.SHAPES, or sizes overriding "small"'s


class KernelCheckError(WorkbenchError):
    """A bad argument of the kernel-conformance harness: names the argument, the value and the choices."""


def resolve_op(op: str) -> OpSpec:
    """The spec of ``op`` in :data:`kernels.testing.OPS`."""
    try:
        return get_op(op)
    except ValueError as e:
        raise KernelCheckError(str(e)) from None


def resolve_conventions(conventions: str | Convention | Sequence[str | Convention]) -> list[Convention]:
    """The conventions named: one name or Convention, or a sequence of them (at least one)."""
    items = [conventions] if isinstance(conventions, str | Convention) else list(conventions)
    if not items:
        raise KernelCheckError(f"conventions: name at least one of {list(CONVENTIONS)}")
    out = []
    for c in items:
        try:
            out.append(get_convention(c))
        except ValueError:
            raise KernelCheckError(f"conventions: unknown convention {c!r}; choose from {list(CONVENTIONS)}") from None
    return out


def draw_case(
    op: str,
    variant: str | None,
    *,
    convention: str | Convention,
    shapes: Shapes = "small",
    rows: int = 3,
    padded: int = 2,
    seed: int = 0,
    padded_tokens: bool = False,
) -> Case:
    """:func:`kernels.testing.make_case` (float32, on the CPU, a guard slot each side of every pool);
    its refusals as :class:`KernelCheckError`."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise KernelCheckError(f"seed: must be an int, got {seed!r}")
    if not isinstance(shapes, str | Mapping):
        raise KernelCheckError(
            f"shapes: a preset name or a mapping of sizes (see kernels.testing.SHAPES), got {shapes!r}"
        )
    try:
        return make_case(
            op, variant, convention=convention, shapes=shapes, rows=rows, padded=padded, seed=seed,
            padded_tokens=padded_tokens,
        )  # fmt: skip
    except ValueError as e:
        raise KernelCheckError(str(e)) from None
