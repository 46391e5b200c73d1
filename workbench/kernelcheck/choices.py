"""What a check takes, and the error that names a bad choice.

The choices live in ``kernels``: ops and variants in :data:`kernels.testing.OPS`, shape presets in
:data:`kernels.testing.SHAPES`, conventions in :data:`kernels.conventions.CONVENTIONS`; ``make_case`` and
``get_convention`` validate them. Here their ``ValueError`` becomes a :class:`KernelCheckError` (a
``WorkbenchError``, still a ``ValueError``) that names the argument, the value and the choices.

>>> draw_case("causal_conv1d.update", "extend", convention="vllm").name
Traceback (most recent call last):
...
workbench.kernelcheck.choices.KernelCheckError: variant: causal_conv1d.update has no variant 'extend'; choose one of ['decode', 'verify', 'tree']
"""  # noqa: E501

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from kernels.conventions import CONVENTIONS, Convention, get_convention
from kernels.testing import SHAPES, Case, OpSpec, get_op, make_case
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


def resolve_sizes(shapes: Shapes) -> dict[str, int]:
    """Every size a check draws with: a preset's of :data:`kernels.testing.SHAPES`, or "small"'s with
    ``shapes`` over them (unchecked: :func:`draw_case` checks them)."""
    if isinstance(shapes, str):
        return dict(SHAPES.get(shapes, SHAPES["small"]))
    return {**SHAPES["small"], **shapes}


_SIZE = re.compile(r"([A-Za-z_]\w*)=(.*)")


def parse_shape(text: str, used: Sequence[str]) -> Shapes:
    """``--shape``'s value: a preset of :data:`kernels.testing.SHAPES` (``quarter``), or ``NAME=INT`` sizes
    joined by commas (``K=16,V=32``) over "small"'s; ``used``: the sizes the checked variants draw with
    (another is refused: it would change nothing). One-line :class:`KernelCheckError` naming the size and the
    value.

    >>> parse_shape("K=16,V=32", ["H", "HV", "K", "V"])
    {'K': 16, 'V': 32}
    >>> parse_shape("dim=16", ["H", "HV", "K", "V"])
    Traceback (most recent call last):
    ...
    workbench.kernelcheck.choices.KernelCheckError: --shape 'dim=16': these variants draw no dim; the sizes they use: H, HV, K, V
    """  # noqa: E501
    if text in SHAPES:
        return text
    presets = ", ".join(SHAPES)
    if "=" not in text:
        raise KernelCheckError(f"--shape {text!r}: not a preset ({presets}) nor NAME=INT sizes such as K=16,V=32")
    sizes: dict[str, int] = {}
    for part in text.split(","):
        m = _SIZE.fullmatch(part.strip())
        if m is None:
            raise KernelCheckError(f"--shape {text!r}: {part!r} is not NAME=INT (sizes such as K=16,V=32)")
        name, value = m.groups()
        if name not in SHAPES["small"]:
            raise KernelCheckError(
                f"--shape {text!r}: unknown size {name!r} ({part}); the sizes these variants use: {', '.join(used)}"
            )
        if name not in used:
            raise KernelCheckError(
                f"--shape {text!r}: these variants draw no {name}; the sizes they use: {', '.join(used)}"
            )
        low = 2 if name == "width" else 1
        if not re.fullmatch(r"[0-9]+", value.strip()) or int(value) < low:
            raise KernelCheckError(f"--shape {text!r}: {name} must be an int >= {low}, got {value!r}")
        if name in sizes:
            raise KernelCheckError(f"--shape {text!r}: {name} given twice")
        sizes[name] = int(value)
    return sizes
