"""The widgets' models: all logic, plain Python, no ipywidgets import (tests drive these directly)."""

from workbench.kernelcheck import KernelCheck, check_kernel  # the harness's home; re-exported for old imports
from workbench.widgets.explorer_model import ExplorerModel, ExplorerParams, ExplorerState
from workbench.widgets.lab_model import LabModel, StepReport
from workbench.widgets.playground_model import PlaygroundModel
from workbench.widgets.timeline_model import TimelineModel
from workbench.widgets.timing_model import TimingModel
from workbench.widgets.zoo_model import ZooModel

__all__ = [
    "ExplorerModel",
    "ExplorerParams",
    "ExplorerState",
    "KernelCheck",
    "LabModel",
    "PlaygroundModel",
    "StepReport",
    "TimelineModel",
    "TimingModel",
    "ZooModel",
    "check_kernel",
]
