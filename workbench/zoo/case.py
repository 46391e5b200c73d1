"""A zoo case: a known production bug, runnable unfixed and fixed on the workbench's own machinery, and,
where its scenario exercises a metadata backend or a kernel, against the user's own one.

A case with a ``subject`` is written once, as a ``scenario(subject, profile, graph_backend)``: the unfixed and
fixed runs are that scenario with the case's own broken and fixed subject (``variant(fixed)``), and
:meth:`ZooCase.run_with` is the same scenario with the user's class or function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.backends import MetadataBackend
from workbench.profiles import Profile, get_profile
from workbench.zoo import _harness as h
from workbench.zoo.result import Evidence, Interrupted, NotApplicable, ZooError, ZooResult

RunFn = Callable[[bool, str], Sequence[Evidence]]
ScenarioFn = Callable[[Any, str, str], Sequence[Evidence]]
"""``(metadata backend class or kernel, profile name, graph backend name) -> evidence``."""
AppliesFn = Callable[[Any, Profile], str | None]
"""Why the scenario cannot apply to this subject under this profile (None: it applies)."""

SUBJECTS = ("metadata_backend", "kernel")


def subject_of(obj: object) -> str:
    """ "metadata_backend" for a ``MetadataBackend`` subclass, "kernel" for another callable; ``ZooError``
    for anything else."""
    if isinstance(obj, type):
        if issubclass(obj, MetadataBackend):
            return "metadata_backend"
        raise ZooError(f"metadata_backend: {obj.__qualname__} is not a subclass of workbench.backends.MetadataBackend")
    if callable(obj):
        return "kernel"
    raise ZooError(f"subject: expected a MetadataBackend subclass or a kernel function, got {obj!r}")


def label_of(obj: Any) -> str:
    """``module:qualname`` of a class or function (what a result names it by, unless given a spec)."""
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', repr(obj))}"


def family_profile(cls: type[MetadataBackend]) -> str:
    """The profile a metadata backend class serves: "sglang-ascend" for the NPU family
    (``NpuMetadataBackend`` or ``device_type == "npu"``), else "sglang" (the CPU and CUDA families)."""
    from workbench.backends import NpuMetadataBackend

    return "sglang-ascend" if issubclass(cls, NpuMetadataBackend) or cls.device_type == "npu" else "sglang"


@dataclass(frozen=True)
class ZooCase:
    """One bug of the zoo.

    Attributes:
        name: short id (``workbench zoo NAME``); title: one line; issue: the public reference.
        profile: the engine conventions the case's own runs use ("sglang", "sglang-ascend", "vllm").
        explanation: the mechanism, what the engine did, the fix (one paragraph).
        subject: what the scenario exercises: "metadata_backend", "kernel", or None (neither: ``run_fn``).
        scenario, variant: the scenario, and the case's own subject (``variant(False)`` broken, ``True`` fixed).
        mechanism: the evidence types that show this case's bug; a user's run whose only failures are of
            other types failed in another way ("other failure"), not by this bug. Empty: every type.
        applies: why the scenario cannot apply to a user's subject (a profile family it does not fit).
        steps: the scenario's inputs, in words (exported tests and the widget show them).
        why_not: for a case without a subject, why no user object can run it (and what to use instead).
        kernel_op: for a kernel case, the op whose signature the kernel must take.
    """

    name: str
    title: str
    issue: str
    profile: str
    explanation: str
    run_fn: RunFn | None = field(default=None, repr=False, compare=False)
    subject: str | None = None
    scenario: ScenarioFn | None = field(default=None, repr=False, compare=False)
    variant: Callable[[bool], Any] | None = field(default=None, repr=False, compare=False)
    mechanism: tuple[type, ...] = field(default=(), repr=False)
    applies: AppliesFn | None = field(default=None, repr=False, compare=False)
    steps: str = field(default="", repr=False)
    why_not: str = field(default="", repr=False)
    kernel_op: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if self.subject is None and self.run_fn is None:
            raise ZooError(f"case {self.name!r}: a case without a subject needs run_fn")
        if self.subject is not None and (self.subject not in SUBJECTS or self.scenario is None or self.variant is None):
            raise ZooError(f"case {self.name!r}: subject {self.subject!r} needs one of {SUBJECTS}, scenario, variant")

    def _result(self, fixed: bool | None, evidence: Sequence[Evidence], **extra: Any) -> ZooResult:
        if not evidence and extra.get("not_applicable") is None:
            raise ZooError(f"case {self.name!r} produced no evidence (a case must be able to fail)")
        kinds = tuple(t.__name__ for t in self.mechanism)
        return ZooResult(self.name, self.issue, fixed, tuple(evidence), self.explanation, mechanism=kinds, **extra)

    def run(self, fixed: bool, *, backend: str = "auto") -> ZooResult:
        """Run the unfixed (``fixed=False``) or the fixed variant and return what it produced.

        ``backend``: "auto" or "cpu" (the CPU recorder), "cuda" or "npu" (that device's graphs; not run on
        a device in this repository's tests).
        """
        if not isinstance(fixed, bool):
            raise ZooError(f"fixed: expected a bool, got {fixed!r}")
        if self.scenario is not None and self.variant is not None:
            evidence = self.scenario(self.variant(fixed), self.profile, backend)
        else:
            assert self.run_fn is not None  # __post_init__
            evidence = self.run_fn(fixed, backend)
        return self._result(fixed, tuple(evidence), profile=self.profile)

    def not_applicable_to(self, obj: Any, profile: Profile) -> str | None:
        """Why this case cannot run against ``obj`` under ``profile`` (None: it can)."""
        kind = subject_of(obj)
        if self.subject is None:
            return self.why_not or "the case exercises neither a metadata backend nor a kernel"
        if kind != self.subject:
            if self.subject == "kernel":
                return f"the case exercises a kernel ({self.kernel_op}), not a metadata backend: pass one with --kernel"
            return "the case exercises a metadata backend, not a kernel: pass one with --metadata-backend"
        return self.applies(obj, profile) if self.applies is not None else None

    def run_with(
        self, obj: Any, *, profile: str | None = None, backend: str = "auto", label: str | None = None
    ) -> ZooResult:
        """This case's scenario run against ``obj``: a ``MetadataBackend`` subclass, or a kernel function with
        the signature of ``kernel_op``.

        ``profile``: the conventions to run under (default: a backend's family, ``family_profile``; a
        kernel case's own). ``label``: how the result names ``obj`` (default ``module:qualname``; give the
        ``MODULE_OR_FILE:NAME`` spec to make :func:`workbench.zoo.export.to_pytest` able to load it again).

        The result's ``status`` is "not applicable" (with the reason) when the scenario cannot apply (``applies``
        says so, or the scenario raises :class:`~workbench.zoo.result.NotApplicable` once it runs),
        "reproduced" when evidence of this case's own mechanism broke, "other failure" when the scenario
        failed another way or stopped on an exception (``Interrupted``), and "clean" only when it ran to
        the end and every piece of evidence is clean.
        """
        kind = subject_of(obj)
        h.resolve_backend(backend)  # a bad graph backend is bad input, not a finding
        if profile is None:
            profile = family_profile(obj) if kind == "metadata_backend" else self.profile
        prof = get_profile(profile)
        extra: dict[str, Any] = {"subject": label or label_of(obj), "subject_kind": kind, "profile": prof.name}
        reason = self.not_applicable_to(obj, prof)
        if reason is not None:
            return self._result(None, (), not_applicable=reason, **extra)
        assert self.scenario is not None  # not_applicable_to returned a reason otherwise
        try:
            evidence = tuple(self.scenario(obj, prof.name, backend))
        except NotApplicable as exc:  # the scenario found it cannot be built around obj
            return self._result(None, (), not_applicable=str(exc), **extra)
        except Exception as exc:  # the user's code may raise anything: the case could not look
            evidence = (Interrupted.of(exc),)
        return self._result(None, evidence, **extra)
