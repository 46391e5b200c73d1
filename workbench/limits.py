"""Checks at the public boundaries: ints that must fit a dtype, and memory a request would need.

Every check raises :class:`MetadataError` with one line that names the argument, the value and the accepted
range. Limits that protect the machine come from the memory an argument would make the workbench allocate,
compared with what this machine (or the device) has, so the message says both numbers. Nothing here imports
torch: the command line runs these checks before torch is loaded.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

from workbench.errors import MetadataError

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
RANGES = {"int32": (-(2**31), INT32_MAX), "int64": (-(2**63), INT64_MAX)}


_NAME = re.compile(r"(-{0,2}[A-Za-z_][\w.\-]*)(?:\[(\d+)\])?")


def field_and_row(name: str) -> tuple[str, int | None]:
    """The field and row a check's ``name`` names (:attr:`MetadataError.field`, :attr:`MetadataError.row`):
    its leading identifier and the index right after it, if any; ``("", None)`` when it starts with none.

    >>> field_and_row("slots[3]"), field_and_row("num_slots=10"), field_and_row("buckets=[1, 2]")
    (('slots', 3), ('num_slots', None), ('buckets', None))
    """
    m = _NAME.match(name)
    if m is None:
        return "", None
    return m.group(1), None if m.group(2) is None else int(m.group(2))


def _error(message: str, name: str, field: str | None, row: int | None) -> MetadataError:
    """A MetadataError for a check of ``name``: ``field`` and ``row`` as given, else read from ``name``."""
    if field is None:
        field, parsed = field_and_row(name)
        row = parsed if row is None else row
    return MetadataError(message, field=field, row=row)


def check_int(
    name: str,
    value: object,
    minimum: int,
    maximum: int = INT64_MAX,
    *,
    field: str | None = None,
    row: int | None = None,
) -> int:
    """``value`` as an int in ``[minimum, maximum]`` (bools refused), or a MetadataError naming ``name``
    (its ``field`` and ``row``: as given, else :func:`field_and_row` of ``name``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _error(f"{name} must be an int, got {value!r}", name, field, row)
    if not minimum <= value <= maximum:
        raise _error(f"{name} = {value}: must be in [{minimum}, {maximum:,}]", name, field, row)
    return value


def check_fits(name: str, values: list[int], dtype: str, *, field: str | None = None, row: int | None = None) -> None:
    """Every value fits ``dtype`` ("int32" or "int64"); names the first that does not. ``name`` is a field
    (the error's row: the index of that value) or, for one value, already indexed (``"seq_lens[3]"``; the
    error's row: ``row``, else the index in ``name``)."""
    lo, hi = RANGES[dtype]
    for i, v in enumerate(values):
        if not lo <= v <= hi:
            indexed = len(values) == 1 and name.endswith("]")
            where = name if indexed else f"{name}[{i}]"
            message = f"{where} = {v}: does not fit {dtype} (range [{lo}, {hi}])"
            raise _error(message, where, field, row if indexed else i)


# host_memory_bytes() reuses a read this young: metadata is built (and checked) every step, and reading
# /proc/meminfo each time cost more than the step's other checks. check_memory reads afresh near the limit.
HOST_MEMORY_MAX_AGE_S = 1.0
_host_memory_read: tuple[float, int] | None = None  # (time.monotonic() of the read, bytes)


def host_memory_bytes() -> int:
    """Memory this machine can hand out now (``MemAvailable`` of ``/proc/meminfo``, else ``sysconf``'s
    available pages); 0 when unknown. Not the total: on a shared machine an allocation that fits the total
    but not what is free gets the process killed, not a clear error. A read younger than
    ``HOST_MEMORY_MAX_AGE_S`` is reused (:func:`forget_host_memory` drops it)."""
    global _host_memory_read
    now = time.monotonic()
    if _host_memory_read is not None and now - _host_memory_read[0] < HOST_MEMORY_MAX_AGE_S:
        return _host_memory_read[1]
    free = _read_host_memory()
    _host_memory_read = (now, free)
    return free


def forget_host_memory() -> None:
    """Make the next :func:`host_memory_bytes` read the machine again."""
    global _host_memory_read
    _host_memory_read = None


def _read_host_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        return 0


def as_device(device: object) -> Any:
    """``device`` through ``workbench.devices.canonical_device`` (None stays None); a bool is refused
    (torch would read True as CUDA ordinal 1)."""
    if device is None:
        return None
    if isinstance(device, bool):
        raise MetadataError(f"device must be a str, torch.device or CUDA ordinal, got {device!r}", field="device")
    from workbench.devices import canonical_device

    return canonical_device(device)  # type: ignore[arg-type]  # it names a bad device in DeviceUnavailable


def device_memory_bytes(device: object) -> tuple[int, str]:
    """(free bytes, a name for the message) of the memory tensors on ``device`` live in."""
    kind = getattr(device, "type", str(device).split(":")[0])
    if kind == "cuda":
        import torch

        try:
            index = getattr(device, "index", None)
            free, _ = torch.cuda.mem_get_info(0 if index is None else index)
            return int(free), f"cuda:{0 if index is None else index} has"
        except (RuntimeError, AssertionError, ValueError):
            return 0, ""
    if kind == "cpu":
        return host_memory_bytes(), "this machine has"
    return 0, ""  # npu and others: no check here; the device's own allocator reports


def gib(nbytes: float) -> str:
    """Bytes as a short readable size (``37.3 GiB``, ``512 MiB``)."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            value = nbytes / size
            return f"{value:.0f} {unit}" if value >= 10 else f"{value:.1f} {unit}"
    return f"{int(nbytes)} B"


def check_memory(
    name: str, nbytes: int, what: str, device: object = "cpu", *, field: str | None = None, row: int | None = None
) -> None:
    """Refuse an argument that would allocate more than the device has free.

    ``name`` names the argument and its value, ``what`` says what the bytes are for; the message reads
    ``num_slots=10000000000 needs 37 GiB for a slot mapping of 10,000,000,000 rows of 4 B; this machine
    has 24 GiB free``. Above that the allocation fails, or, on the host, the kernel kills the process.
    The error's ``field`` and ``row``: as given, else :func:`field_and_row` of ``name`` (``num_slots``).
    """
    free, whose = device_memory_bytes(device)
    if free and 2 * nbytes > free:  # within a factor 2 of the limit: decide on a fresh read, never a reused one
        forget_host_memory()
        free, whose = device_memory_bytes(device)
    if free and nbytes > free:
        raise _error(f"{name} needs {gib(nbytes)} for {what}; {whose} {gib(free)} free", name, field, row)
