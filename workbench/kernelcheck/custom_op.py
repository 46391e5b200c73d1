"""Register your kernel as one ``torch.library.custom_op`` with a public op's signature, so a graph (and the
CPU recorder) holds it as a single op, as it holds the workbench's own kernels.

Under the Triton interpreter a raw launch swaps tensor storages, which the recorder refuses (a device graph
has its own traps with raw launches); behind a custom op that mutates its outputs and pools in place, the
launch is one opaque call. The registration is :func:`kernels.dispatch.inplace_custom_op`, the one every
public op goes through (a fake kernel that does nothing: the op returns None).

>>> import kernels.causal_conv1d as conv
>>> def my_update(**kw):
...     conv.update(**kw, impl="reference")
>>> op = as_custom_op(my_update, op="causal_conv1d.update", name="kernelcheck_doc::my_update")
>>> op.custom_op_name, op.mutates_args
('kernelcheck_doc::my_update', ('conv_state', 'intermediate_conv_windows', 'out'))
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kernels.dispatch import inplace_custom_op
from kernels.testing import OpSpec, make_case
from workbench.kernelcheck.choices import KernelCheckError, resolve_op
from workbench.kernelcheck.names import candidate_name


def op_signature(spec: OpSpec) -> inspect.Signature:
    """The public op's signature without ``impl``, annotations resolved (what the schema is inferred from)."""
    fn = spec.fn
    hints = typing.get_type_hints(fn)
    params = [p.replace(annotation=hints[p.name]) for p in inspect.signature(fn).parameters.values()]
    return inspect.Signature([p for p in params if p.name != "impl"], return_annotation=None)


def mutated_args(op: str) -> tuple[str, ...]:
    """The tensors ``op`` writes in any variant: its pools and outputs (as ``kernels.testing`` draws them),
    in signature order."""
    spec = resolve_op(op)
    written: set[str] = set()
    for variant in spec.variants:
        case = make_case(op, variant, rows=1, padded=0)
        written |= {*case.storage, *case.outputs}
    return tuple(p for p in op_signature(spec).parameters if p in written)


def _accepted(fn: Callable[..., Any], arguments: dict[str, Any], sig: inspect.Signature) -> dict[str, Any]:
    """``arguments`` less those ``fn`` does not take and that hold the op's default (a kernel written for
    the arguments it uses); a non-default value is always passed, so a missing parameter still says so."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return arguments
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return arguments

    def default(k: str, v: Any) -> bool:
        d = sig.parameters[k].default
        return v is d or (not isinstance(v, torch.Tensor) and not isinstance(d, torch.Tensor) and v == d)

    return {k: v for k, v in arguments.items() if k in params or not default(k, v)}


@dataclass
class _Registration:
    op: str
    mutates: tuple[str, ...]
    fn: Callable[..., Any]  # swapped when the same name is registered again (a re-run notebook cell)
    custom_op: Any


_REGISTERED: dict[str, _Registration] = {}


def as_custom_op(
    fn: Callable[..., Any],
    op: str,
    *,
    name: str,
    mutates_args: Sequence[str] | None = None,
) -> Callable[..., Any]:
    """Register ``fn`` (``op``'s signature, ``impl`` excluded) as the custom op ``name``
    (``"namespace::op_name"``) and return a function with ``op``'s signature that calls it.

    The custom op mutates ``mutates_args`` (default: what ``op`` writes, :func:`mutated_args`) and returns
    nothing; the returned function allocates ``out`` when it is None (like ``v``, else like ``x``) and
    returns it, as the public op does. Registering the same ``name`` again for the same op (a re-run
    notebook cell) keeps the registered op and swaps the function behind it; for another op, or other
    mutated arguments, it raises :class:`KernelCheckError`. Arguments ``fn`` does not take are left out
    when they hold the op's default.
    """
    spec = resolve_op(op)
    if not isinstance(name, str) or name.count("::") != 1 or not all(name.split("::")):
        raise KernelCheckError(f"name: a custom op is named 'namespace::op_name', got {name!r}")
    if not callable(fn):
        raise KernelCheckError(f"fn: a function with {op}'s signature, got {fn!r}")
    sig = op_signature(spec)
    mutates = tuple(mutates_args) if mutates_args is not None else mutated_args(op)
    unknown = [m for m in mutates if m not in sig.parameters]
    if unknown:
        raise KernelCheckError(
            f"mutates_args: {op} has no argument(s) {unknown}; its arguments: {list(sig.parameters)}"
        )
    reg = _REGISTERED.get(name)
    if reg is None:
        reg = _register(name, spec.name, sig, mutates, fn)
    elif (reg.op, reg.mutates) != (spec.name, mutates):
        raise KernelCheckError(
            f"name: {name!r} is already registered for {reg.op} mutating {list(reg.mutates)}; choose another name"
        )
    reg.fn = fn
    return _caller(name, reg, sig, fn)


def _register(
    name: str, op: str, sig: inspect.Signature, mutates: tuple[str, ...], fn: Callable[..., Any]
) -> _Registration:
    reg = _Registration(op, mutates, fn, None)
    # torch's custom ops take no keyword-only tensors: every argument positional, no defaults (the caller
    # applies the public op's)
    plain = [p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD, default=inspect.Parameter.empty)
             for p in sig.parameters.values()]  # fmt: skip
    schema_sig = sig.replace(parameters=plain)

    def kernel(*args: Any, **kwargs: Any) -> None:
        bound = schema_sig.bind(*args, **kwargs)
        reg.fn(**_accepted(reg.fn, dict(bound.arguments), sig))

    kernel.__signature__ = schema_sig  # type: ignore[attr-defined]  # what torch infers the schema from
    kernel.__name__ = kernel.__qualname__ = name.split("::")[1]
    reg.custom_op = inplace_custom_op(name, mutates)(kernel)
    _REGISTERED[name] = reg
    return reg


def _caller(name: str, reg: _Registration, sig: inspect.Signature, fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> torch.Tensor | None:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        if "out" in a and a["out"] is None:
            a["out"] = torch.empty_like(a["v"] if "v" in a else a["x"])
        reg.custom_op(**a)
        return a.get("out")

    call.__signature__ = sig.replace(return_annotation=torch.Tensor | None)  # type: ignore[attr-defined]
    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"{candidate_name(fn)} as the custom op {name} ({reg.op}'s signature; mutates {list(reg.mutates)})"
    call.custom_op = reg.custom_op  # type: ignore[attr-defined]
    call.custom_op_name = name  # type: ignore[attr-defined]
    call.mutates_args = reg.mutates  # type: ignore[attr-defined]
    return call
