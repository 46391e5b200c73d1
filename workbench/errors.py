"""The workbench's exceptions. Every message names the field, the row (where there is one) and the value.

Every one is a ``ValueError`` (through :class:`WorkbenchError`): the workbench raises them for input it
refuses. The two that are also about the machine (a capture a device graph cannot hold, a device or
backend that cannot run here) are ``RuntimeError`` as well, so code that catches torch's own
``RuntimeError`` for a missing device or a failed capture keeps catching them.
"""

from __future__ import annotations


class WorkbenchError(ValueError):
    """Base of every error the workbench raises on purpose."""


class MetadataError(WorkbenchError):
    """Bad batch, pool or metadata input: names the field, the row and the value.

    The message is the one line a person reads; ``field`` and ``row`` are what it names, for code that
    acts on the error (a trace replay's divergence, a widget marking a control), so nothing re-reads them
    from the text. Every ``MetadataError`` the workbench raises sets ``field``; ``MetadataError("text")``
    alone still works, with ``field=""`` and ``row=None``.

    Attributes:
        field: the argument or metadata field at fault (``"state_indices"``, ``"num_slots"``), without its
            index: the message's ``state_indices[3]: ...`` or ``num_slots=10: ...``.
        row: the index into ``field`` the message names (3 for ``state_indices[3]``, ``slots[3]=5``), or
            None where it names none. An index, never a value: ``req_pool_indices: row 5 is not allocated``
            has row None.

    >>> e = MetadataError("state_indices[3]: padded row holds [1]", field="state_indices", row=3)
    >>> e.field, e.row, str(e)
    ('state_indices', 3, 'state_indices[3]: padded row holds [1]')
    """

    def __init__(self, *args: object, field: str = "", row: int | None = None) -> None:
        super().__init__(*args)
        self.field = field
        self.row = row


class CaptureError(WorkbenchError, RuntimeError):
    """Something a device graph cannot hold happened during capture (a host sync, a dynamic shape...)."""


class DeviceUnavailable(WorkbenchError, RuntimeError):
    """A graph backend or device stack was asked for but cannot run here, or a device name torch cannot
    allocate on (``device="nope"``); the message says why."""


class MissingExtra(WorkbenchError, ImportError):
    """An optional package a function needs is not installed; the message names the extra that installs it
    (``workbench.extras.require`` raises it). Also an ``ImportError``, for code that catches a failed import."""
