"""Stand-in modules for the device-only packages an engine imports on its way to the metadata code.

sglang imports ``triton`` and ``sgl_kernel_npu`` at module level, vLLM the OpenAI tool server; none of it
runs when the metadata is computed on a CPU. A stand-in is a permissive module: any attribute is a
placeholder that can be called, subscripted, used as a decorator (the function comes back unchanged) or
as a base class; ``CamelCase`` names are real classes, so ``isinstance`` and subclassing work. Each
attribute read is recorded (:data:`ACCESSED`), so an adapter can say exactly what the engine touched.

Only what an adapter names is stood in, and only while :func:`installed` is active for the import:
availability probes (``importlib.util.find_spec``, as torch's ``has_triton()`` uses) never see a stand-in,
so no library starts using one as the real package.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

ACCESSED: dict[str, set[str]] = defaultdict(set)
"""Top-level stand-in -> every ``module.attribute`` the engine read from it."""


class NoActiveDriver:
    """``triton.runtime.driver`` without a GPU: ``.active`` raises as real triton does, so the engine's
    device probe falls back to the CPU."""

    @property
    def active(self) -> Any:
        raise RuntimeError("0 active drivers ([]). There should only be one.")


class Placeholder:
    """Any attribute of a stand-in module: callable, subscriptable, a decorator, falsy."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return f"<stand-in {self._name}>"

    def __getattr__(self, item: str) -> Placeholder:
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        ACCESSED[self._name.split(".")[0]].add(f"{self._name}.{item}")
        return Placeholder(f"{self._name}.{item}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], Placeholder):
            return args[0]  # @decorator
        return Placeholder(f"{self._name}()")  # @decorator(...) or a call

    def __getitem__(self, item: Any) -> Placeholder:
        return Placeholder(f"{self._name}[]")

    def __mro_entries__(self, bases: tuple) -> tuple[type, ...]:
        return (object,)

    def __bool__(self) -> bool:
        return False

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __index__(self) -> int:
        return 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Placeholder) and other._name == self._name

    def __hash__(self) -> int:
        return hash(self._name)

    def __lt__(self, other: object) -> bool:
        return False

    __le__ = __gt__ = __ge__ = __lt__


class _PlaceholderType(type):
    """The metaclass of stand-in classes: ``InterpolationMode.BICUBIC`` is a placeholder too."""

    def __getattr__(cls, item: str) -> Placeholder:
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        name = f"{cls.__module__}.{cls.__name__}"
        ACCESSED[name.split(".")[0]].add(f"{name}.{item}")
        return Placeholder(f"{name}.{item}")


class StandinModule(types.ModuleType):
    """A permissive module; ``explicit`` values and ``submodules`` are given by the adapter."""

    explicit: Mapping[str, Any] = {}
    submodules: frozenset[str] = frozenset()

    def __getattr__(self, item: str) -> Any:
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        ACCESSED[self.__name__.split(".")[0]].add(f"{self.__name__}.{item}")
        if item in self.submodules:
            return importlib.import_module(f"{self.__name__}.{item}")
        if item[:1].isupper() and not item.isupper():
            value: Any = _PlaceholderType(item, (), {"__module__": self.__name__, "__init__": _ignore})
        else:
            value = Placeholder(f"{self.__name__}.{item}")
        setattr(self, item, value)
        return value


def _ignore(self: object, *args: Any, **kwargs: Any) -> None:
    return None


class StandinFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves stand-ins for the named top-level packages (and any module below them).

    ``explicit``: module name -> attributes with real values (``{"triton": {"__version__": "3.6.0"}}``);
    ``submodules``: module name -> attribute names that are submodules.
    """

    def __init__(
        self,
        packages: tuple[str, ...],
        explicit: Mapping[str, Mapping[str, Any]] | None = None,
        submodules: Mapping[str, set[str]] | None = None,
    ) -> None:
        self.packages = packages
        self.explicit = dict(explicit or {})
        self.submodules = {k: frozenset(v) for k, v in (submodules or {}).items()}

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        # The first frame above the import machinery: importlib.util.find_spec (frozen as
        # "<frozen importlib.util>" on Python 3.11+) is an availability probe; anything else is an import.
        frame: types.FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename == "<frozen importlib._bootstrap>":
            frame = frame.f_back
        caller = frame.f_code.co_filename if frame is not None else ""
        if caller.endswith(("importlib/util.py", "importlib\\util.py", "<frozen importlib.util>")):
            return None  # an availability probe: the package is absent, as it really is
        if fullname.split(".")[0] in self.packages:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StandinModule(spec.name)
        module.__path__ = []  # a package: its submodules come from here too
        module.explicit = self.explicit.get(spec.name, {})
        module.submodules = self.submodules.get(spec.name, frozenset())
        for name, value in module.explicit.items():
            setattr(module, name, value)
        ACCESSED[spec.name.split(".")[0]].add(f"import {spec.name}")
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


@contextmanager
def installed(finder: StandinFinder) -> Iterator[StandinFinder]:
    """Serve the finder's stand-ins while the engine imports; modules already imported stay imported."""
    sys.meta_path.insert(0, finder)
    try:
        yield finder
    finally:
        sys.meta_path.remove(finder)


def module(name: str, **attributes: Any) -> types.ModuleType:
    """A plain stand-in module with exactly these attributes (for an engine module too heavy to import
    whose names are only annotations), registered in ``sys.modules``."""
    stand_in = types.ModuleType(name)
    stand_in.__dict__.update(attributes)
    stand_in.__file__ = f"<stand-in {name}>"
    sys.modules[name] = stand_in
    return stand_in


def accessed() -> dict[str, list[str]]:
    """What the engine read from each stand-in, sorted."""
    return {name: sorted(items) for name, items in ACCESSED.items()}


def install(finder: StandinFinder) -> StandinFinder:
    """Serve the finder's stand-ins for the rest of the process (an engine imports some modules late, at its
    first call); installing an equal finder twice is a no-op."""
    for present in sys.meta_path:
        if isinstance(present, StandinFinder) and present.packages == finder.packages:
            return present
    sys.meta_path.insert(0, finder)
    return finder
