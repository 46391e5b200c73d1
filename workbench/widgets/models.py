"""The widgets' models: all logic, plain Python, no ipywidgets import (tests drive these directly)."""

from workbench.widgets.explorer_model import ExplorerModel, ExplorerParams, ExplorerState
from workbench.widgets.lab_model import LabModel, StepReport
from workbench.widgets.playground_model import KernelCheck, PlaygroundModel, Shapes, check_kernel

__all__ = [
    "ExplorerModel",
    "ExplorerParams",
    "ExplorerState",
    "KernelCheck",
    "LabModel",
    "PlaygroundModel",
    "Shapes",
    "StepReport",
    "check_kernel",
]
