"""How much a check would allocate, from the sizes alone, before anything is drawn: what the playground
refuses in well under a second instead of blocking the kernel on a huge request.

:func:`case_bytes` is an upper bound of the tensors one :func:`kernels.testing.make_case` draws (float32,
padded rows given tokens: the larger of the two forms a check runs). A check holds the case, the copy the
kernel writes, the float64 reference (twice the bytes) and the kernel's temporaries at once:
:func:`check_bytes` is :data:`CHECK_FACTOR` cases. The shapes follow ``kernels/testing.py``'s builders;
``tests/test_kernelcheck_sizing.py`` holds the bound against what every builder really allocates.

>>> case_bytes("causal_conv1d.update", "decode", {"dim": 40, "width": 4, "D": 3}, rows=3, padded=2)  # drawn: 6260
6336
>>> from workbench.limits import gib
>>> gib(check_bytes("gated_delta_rule.recurrent", "decode", {"H": 16, "HV": 32, "K": 128, "V": 128}, 64, 0))
'1006 MiB'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kernels.conventions import CONVENTIONS
from kernels.testing import SHAPES, scan_chunk_size

CHECK_FACTOR = 5  # the case, the kernel's copy, the float64 reference (x2), temporaries
FLOAT = 4  # bytes: activations, states and outputs are float32 in a check's case


_GDN, _CONV, _SSM = ("H", "HV", "K", "V"), ("dim", "width"), ("nheads", "headdim", "dstate", "ngroups")
# The sizes of kernels.testing.SHAPES that each op's builder reads, per variant (D: a verify's draft tokens,
# extend: the longest extend row); tests/test_kernelcheck_sizing.py holds it against the builders.
SIZES_USED: dict[str, dict[str, tuple[str, ...]]] = {
    "gated_delta_rule.recurrent": {"decode": _GDN, "gating": _GDN, "verify": (*_GDN, "D"), "tree": (*_GDN, "D"),
                                   "extend": (*_GDN, "extend")},
    "gated_delta_rule.chunked": {"extend": (*_GDN, "extend")},
    "gated_delta_rule.scatter_accepted": {"accept": ("HV", "K", "V", "D"), "accepted_steps": ("HV", "K", "V", "D")},
    "causal_conv1d.update": {"decode": _CONV, "verify": (*_CONV, "D"), "tree": (*_CONV, "D")},
    "causal_conv1d.varlen": {"extend": (*_CONV, "extend")},
    "mamba2.selective_state_update": {"decode": _SSM, "verify": (*_SSM, "D"), "tree": (*_SSM, "D")},
    "mamba2.chunk_scan": {"extend": (*_SSM, "extend")},
    "linear_attn.recurrent": {"decode": _GDN, "extend": (*_GDN, "extend")},
}  # fmt: skip


def sizes_used(op: str, variants: Sequence[str]) -> list[str]:
    """The sizes (keys of ``kernels.testing.SHAPES``) that a check of ``op``'s ``variants`` draws with, in
    the presets' order: what ``--shape`` may set.

    >>> sizes_used("causal_conv1d.update", ["decode", "verify"])
    ['D', 'dim', 'width']
    """
    used = {k for v in variants for k in SIZES_USED[op][v]}
    return [k for k in SHAPES["small"] if k in used]


def _slots(rows: int) -> int:
    """Pool slots of a case, with a guard slot before and after (``kernels.testing._slots``, guard=1)."""
    first = max(c.first_live_slot for c in CONVENTIONS.values())
    return rows + first + max(2, rows // 2) + 2


def _size(sizes: Mapping[str, int], key: str) -> int:
    return int(sizes.get(key, 1))


def case_bytes(op: str, variant: str, sizes: Mapping[str, int], rows: int, padded: int, *, tail: int = 2) -> int:
    """An upper bound of the bytes of one drawn case of ``op``'s ``variant`` (see the module docstring).

    Args:
        sizes: the sizes of ``kernels.testing.SHAPES`` (a preset's, or "small"'s with overrides).
        rows, padded: live and padded batch rows; tail: tokens past ``cu_seqlens[-1]`` (2 for "small").
    """
    s = {k: _size(sizes, k) for k in ("H", "HV", "K", "V", "D", "extend", "dim", "width", "nheads", "headdim",
                                       "dstate", "ngroups")}  # fmt: skip
    n, slots = rows + padded, _slots(rows)
    H, HV, K, V, D, E = s["H"], s["HV"], s["K"], s["V"], s["D"], s["extend"]
    verify = variant in ("verify", "tree")  # a tree verify is a verify plus its [n, D] int32 parents
    elems = n * D if variant == "tree" else 0
    if op in ("gated_delta_rule.recurrent", "gated_delta_rule.chunked"):
        per_row = {"decode": 1, "gating": 1}.get(variant, D if verify else E)
        T = n * per_row + tail
        elems += T * (2 * H * K + 2 * HV * V + 2 * HV) + 2 * HV + slots * HV * K * V
        elems += n * D * HV * K * V if verify else 0
    elif op == "gated_delta_rule.scatter_accepted":
        elems = slots * HV * K * V + n * D * HV * K * V
    elif op == "causal_conv1d.update":
        dim, W = s["dim"], s["width"]
        L = D if verify else 1
        elems += 2 * n * L * dim + slots * dim * (W - 1) + dim * (W + 1)
        elems += n * L * dim * (W - 1) if verify else 0
    elif op == "causal_conv1d.varlen":
        dim, W = s["dim"], s["width"]
        elems = 2 * (n * E + tail) * dim + slots * dim * (W - 1) + dim * (W + 1)
    elif op == "mamba2.selective_state_update":
        nh, hd, ds, ng = s["nheads"], s["headdim"], s["dstate"], s["ngroups"]
        L = D if verify else 1
        elems += slots * nh * hd * ds + n * L * (3 * nh * hd + 2 * ng * ds + nh) + 3 * nh
        elems += n * L * nh * hd * ds if verify else 0
    elif op == "mamba2.chunk_scan":
        nh, hd, ds, ng = s["nheads"], s["headdim"], s["dstate"], s["ngroups"]
        T = n * E + tail
        grid = -(-T // scan_chunk_size(E))
        elems = T * (3 * nh * hd + nh + 2 * ng * ds) + (grid + slots) * nh * hd * ds + 3 * nh
    elif op == "linear_attn.recurrent":
        T = n * (1 if variant == "decode" else min(E, 8)) + tail
        elems = T * (2 * H * K + 2 * HV * V) + slots * HV * K * V
    else:
        raise ValueError(f"op: no size model for {op!r}")
    return FLOAT * elems + 16 * (n + 1)  # + the int64 indices, lengths and flags


def check_bytes(op: str, variant: str, sizes: Mapping[str, int], rows: int, padded: int, *, tail: int = 2) -> int:
    """What one check (one convention, one form of padded rows) holds at once: :data:`CHECK_FACTOR` cases."""
    return CHECK_FACTOR * case_bytes(op, variant, sizes, rows, padded, tail=tail)
