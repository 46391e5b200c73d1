"""``workbench check-kernel MODULE_OR_FILE:FUNCTION --op OP``: your kernel through :func:`check_kernel`.

Every variant of the op (or those ``--variant`` names), under every padding convention (or those
``--convention`` names), with zero-length padded rows and with padded rows carrying tokens where the
convention skips them, then a capture through the CPU recorder (``--no-capture``: none). One line per
check; a failure names the variant, the convention, the live rows' slots and what the padded rows held.
When every check raised the same error (a kernel that takes only power-of-two sizes, on the "small" shapes'
K=12), one line says so and which ``--shape`` to try. ``--shape``: a preset of ``kernels.testing.SHAPES``
or sizes over "small"'s (``K=16,V=32``); a size the checked variants do not draw with is refused, and so are
sizes whose cases would not fit this machine's free memory.

Exit codes: 0 every check passed, 1 any failed, 2 bad input (an unknown op or variant, a spec that does not
load, an object that is not callable). The cases are CPU tensors: a Triton kernel runs in Triton's
interpreter, so ``TRITON_INTERPRET=1`` is set (unless already set) before torch and your module load.

Importing this module costs no torch: ``workbench check-kernel --help`` is instant.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from kernels.conventions import CONVENTIONS

SUMMARY = "check your kernel against the float64 reference: every variant, every padding convention, a capture"
EXAMPLE = "workbench check-kernel my_kernels.py:my_attn --op linear_attn.recurrent"
DESCRIPTION = (
    f"{SUMMARY}.\n"
    "FUNCTION takes the public op's keyword arguments (as kernels.<op> takes them, pad_slot_id and out among them, "
    "impl not). Where a convention skips padded rows and the op packs tokens, the case runs twice: zero-length "
    "padded rows (as engines pad) and padded rows with tokens (a kernel must skip by index, not by length).\n"
    "Exit 0: every check passed; 1: a check failed (one line each, naming the variant, the convention, the rows "
    "and the slots; one line in all when every check raised the same error); 2: bad input."
)


def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the check-kernel arguments to ``parser``."""
    parser.description = DESCRIPTION
    parser.add_argument(
        "spec", metavar="MODULE_OR_FILE:FUNCTION", help="your kernel: a module and name, or a .py file and name"
    )
    parser.add_argument(
        "--op",
        required=True,
        metavar="OP",
        help="the op it implements, e.g. gated_delta_rule.recurrent (an unknown name lists the ops)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        dest="variants",
        metavar="V",
        help="check only this variant (repeatable; default: every variant of the op)",
    )
    parser.add_argument(
        "--convention",
        action="append",
        dest="conventions",
        choices=list(CONVENTIONS),
        help="check only under this padding convention (repeatable; default: every one)",
    )
    parser.add_argument(
        "--shape",
        default="small",
        metavar="PRESET|NAME=INT,...",
        help="the sizes of the cases: a preset of kernels.testing.SHAPES (small: K=12, V=20, dim=40, awkward on "
        "purpose; quarter, engine: powers of two), or sizes over small's, e.g. K=16,V=32 (default: small)",
    )
    parser.add_argument("--no-capture", action="store_true", help="skip the capture through the CPU recorder")
    parser.add_argument("--json", action="store_true", help="print JSON instead of lines")
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the check ``args`` asks for; print it; 0 when every check passed, else 1. Bad input raises a
    ``WorkbenchError`` (the dispatcher prints it as one line and exits 2)."""
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before torch and the user's @triton.jit load
    from workbench.kernelcheck.check import check_kernel, resolve_variants
    from workbench.kernelcheck.choices import KernelCheckError, parse_shape, resolve_sizes
    from workbench.kernelcheck.sizing import check_bytes, sizes_used
    from workbench.limits import check_memory
    from workbench.loading import load_object

    variants = resolve_variants(args.op, args.variants)  # an unknown op or variant before the user's code runs
    shapes = parse_shape(args.shape, sizes_used(args.op, variants))
    sizes, tail = resolve_sizes(shapes), 0 if shapes in ("quarter", "engine") else 2
    need = max(check_bytes(args.op, v, sizes, rows=3, padded=2, tail=tail) for v in variants)
    check_memory(f"--shape {args.shape!r}", need, f"a check of {args.op} at these sizes")
    fn: Any = load_object(args.spec)
    if not callable(fn):
        raise KernelCheckError(
            f"{args.spec!r}: not callable (a {type(fn).__name__} object); name a function with {args.op}'s signature"
        )
    try:
        res = check_kernel(
            fn,
            args.op,
            variants,
            conventions=args.conventions or tuple(CONVENTIONS),
            shapes=shapes,
            capture=not args.no_capture,
        )
    except KernelCheckError as e:  # the op refuses these sizes together (HV not a multiple of H, ...)
        if str(e).startswith("shapes: "):
            raise KernelCheckError(f"--shape {args.shape!r}: {str(e).removeprefix('shapes: ')}") from None
        raise
    if args.json:
        print(json.dumps(res.to_dict(), indent=2))
        return 0 if res.ok else 1
    print("\n".join(res.lines()))
    if res.ok:
        print(f"{res.op} [{res.candidate}]: OK, {res.num_checks} checks passed ({', '.join(res.names)})")
        return 0
    what = "the same error" if res.raised is not None else ", ".join(res.failures)
    print(f"{res.op} [{res.candidate}]: FAILED, {res.num_failed} of {res.num_checks} checks ({what})")
    return 1
