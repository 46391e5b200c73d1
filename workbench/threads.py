"""How many CPU threads torch's intra-op pool runs with: one by default for the workbench's checks and benches.

The replay, the float64 shadow and the CPU kernels run many small ops (a state of a few KiB per row and
head). On a small shared machine torch's default pool (one thread per core) spends more on handing work
between threads than on the arithmetic: a measured trace replay used 3.4-4.2x less CPU with one thread
(issue 33). So the command line, the benches and the test suite set one thread unless told otherwise:
``--threads N`` where a command has it, else the environment variable :data:`ENV`. Every figure a bench
prints names the count it ran with (:func:`describe`).

Imports torch only inside the functions, so that ``import workbench`` stays cheap.
"""

from __future__ import annotations

import os

ENV = "LINATTN_THREADS"
"""Environment variable: torch's intra-op thread count for the workbench's commands (an int >= 1), or
``default`` to leave torch's own choice (one per core)."""

DEFAULT = 1


def requested(threads: int | None = None) -> int | None:
    """The thread count asked for: ``threads`` when given, else :data:`ENV`'s value, else :data:`DEFAULT`;
    None when :data:`ENV` says ``default`` (torch keeps its own). Raises ValueError naming the variable and
    its value when it is neither an int >= 1 nor ``default``."""
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads: expected an int >= 1, got {threads!r}")
        return threads
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return DEFAULT
    if raw == "default":
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{ENV}={raw!r}: expected an int >= 1 or 'default'")
    return value


def configure(threads: int | None = None) -> int:
    """Set torch's intra-op threads to :func:`requested` (``threads``, else :data:`ENV`, else one) and
    return the count torch now runs with."""
    import torch

    n = requested(threads)
    if n is not None and torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def describe() -> str:
    """``"1 torch thread"`` / ``"2 torch threads"``: the count torch runs with now, for a figure's caption."""
    import torch

    n = torch.get_num_threads()
    return f"{n} torch thread{'s' if n != 1 else ''}"


def status() -> str:
    """One line for ``workbench doctor``: torch's own intra-op count and the one the computing commands run at
    (a bad :data:`ENV` is said, not raised: the doctor is where a user looks for it)."""
    import torch

    own = torch.get_num_threads()
    try:
        asked = requested()
    except ValueError as exc:
        return f"torch threads: {own} by torch's default; the computing commands refuse to run: {exc}"
    at = f"torch's own {own}" if asked is None else str(asked)
    return f"torch threads: {own} by torch's default; the computing commands (trace, bench, ...) run at {at} ({ENV})"


__all__ = ["DEFAULT", "ENV", "configure", "describe", "requested", "status"]
