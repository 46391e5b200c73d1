"""The workbench's exceptions. Every message names the field, the row (where there is one) and the value."""

from __future__ import annotations


class WorkbenchError(Exception):
    """Base of every error the workbench raises on purpose."""


class MetadataError(WorkbenchError, ValueError):
    """Bad batch, pool or metadata input: names the field, the row and the value."""


class CaptureError(WorkbenchError, RuntimeError):
    """Something a device graph cannot hold happened during capture (a host sync, a dynamic shape...)."""


class DeviceUnavailable(WorkbenchError, RuntimeError):
    """A graph backend or device stack was asked for but cannot run here; the message says why."""
