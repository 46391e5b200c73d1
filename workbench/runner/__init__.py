"""The graph runner and its replay-vs-eager check.

``runner``: :class:`GraphRunner` (capture per bucket, pad, update metadata in place, replay, eager fallback,
accept), :class:`StepResult`, the :class:`Layer` protocol. ``compare``: :func:`compare_replay` and its
:class:`Comparison` (replay vs the same padded step eagerly vs the float64 reference).
"""

from workbench.runner.compare import Comparison, compare_replay
from workbench.runner.runner import GraphRunner, Layer, StepResult

__all__ = ["Comparison", "GraphRunner", "Layer", "StepResult", "compare_replay"]
