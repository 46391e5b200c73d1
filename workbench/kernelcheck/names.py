"""A readable name for a candidate kernel, and the built-in implementations by name.

>>> from functools import partial
>>> from kernels.gated_delta_rule import recurrent
>>> candidate_name(partial(recurrent, impl="triton"))
'gated_delta_rule.recurrent (impl="triton")'
>>> candidate_name(builtin("causal_conv1d.update", "reference"))
'causal_conv1d.update (impl="reference")'
>>> def my_kernel(**kw): ...
>>> candidate_name(my_kernel)
'my_kernel'
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from kernels.dispatch import IMPLS
from kernels.testing import OPS
from workbench.kernelcheck.choices import KernelCheckError, resolve_op


def _public_op_name(fn: object) -> str | None:
    """The OPS name of ``fn`` when it is one of the public ops."""
    for name, spec in OPS.items():
        try:
            if fn is spec.fn:
                return name
        except (ImportError, AttributeError):  # an op whose module cannot import here is not this function
            continue
    return None


def _value(v: object) -> str:
    return f'"{v}"' if isinstance(v, str) else repr(v)


def candidate_name(fn: Callable[..., Any]) -> str:
    """A public op by its OPS name, a ``functools.partial`` as its function and keywords, a user function by
    its ``__qualname__`` (a callable object by its class)."""
    if isinstance(fn, partial):
        inner = candidate_name(fn.func)
        bound = [_value(a) for a in fn.args] + [f"{k}={_value(v)}" for k, v in fn.keywords.items()]
        return f"{inner} ({', '.join(bound)})" if bound else inner
    op = _public_op_name(fn)
    if op is not None:
        return op
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return str(name) if name else type(fn).__qualname__


def builtin(op: str, impl: str = "triton") -> Callable[..., Any]:
    """The public op ``op`` with ``impl`` bound ("triton": the interpreter on the CPU; "reference"; "auto")."""
    spec = resolve_op(op)
    if impl not in IMPLS:
        raise KernelCheckError(f"impl: unknown implementation {impl!r}; choose one of {list(IMPLS)}")
    return partial(spec.fn, impl=impl)
