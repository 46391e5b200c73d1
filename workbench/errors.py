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
    """Bad batch, pool or metadata input: names the field, the row and the value."""


class CaptureError(WorkbenchError, RuntimeError):
    """Something a device graph cannot hold happened during capture (a host sync, a dynamic shape...)."""


class DeviceUnavailable(WorkbenchError, RuntimeError):
    """A graph backend or device stack was asked for but cannot run here, or a device name torch cannot
    allocate on (``device="nope"``); the message says why."""


class MissingExtra(WorkbenchError, ImportError):
    """An optional package a function needs is not installed; the message names the extra that installs it
    (``workbench.extras.require`` raises it). Also an ``ImportError``, for code that catches a failed import."""
