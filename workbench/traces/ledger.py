"""Each live request's token count across steps: a row's ``cached_tokens`` and ``seq_len`` must follow from
its request's history.

The replay's float64 shadow advances from the trace's own rows, so a trace that throws a request's state
away (``cached_tokens: 0`` after 5 tokens: vLLM PR 22034's chunk read without its initial state), keeps only
part of it, or lets a decode jump ahead would be followed by the shadow and replay clean. The ledger holds
what the state of every live request must contain and names the first row that disagrees.

The accounting is the simulator's (``workbench.traces.simulate``, "Token accounting"): a request enters with
the ``cached_tokens`` of its admitting row (0, a prefix hit's length, or a prompt prefilled elsewhere); a row
feeds ``new_tokens`` and its ``seq_len`` is ``cached_tokens + new_tokens`` in every mode; afterwards its state
holds ``seq_len`` tokens, except after a verify row (of a target_verify step, or of kind ``verify`` in a mixed
step), which keeps ``cached_tokens`` plus the tokens it kept: its ``accepted`` read through the header's unit
(:meth:`~workbench.traces.model.TraceRow.kept`: ``"tokens"`` as it is, ``"drafts"`` plus one; null keeps the one
token always kept).
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.traces.model import TraceHeader, TraceStep, tokens_after


@dataclass(frozen=True)
class TokenMismatch:
    """A row whose counts do not follow from its request's history: ``field`` is ``"cached_tokens"`` or
    ``"seq_len"``; ``row`` its index in the step."""

    row: int
    request: int
    field: str
    expected: int
    got: int
    detail: str


class TokenLedger:
    """Request id -> tokens its state holds. :meth:`check` a step before it runs, :meth:`advance` after.
    ``header``: the trace's header, or its ``accepted`` unit (what a verify row's ``accepted`` counts)."""

    def __init__(self, header: TraceHeader | str = "tokens") -> None:
        self.tokens: dict[int, int] = {}
        self.unit = header if isinstance(header, str) else header.accepted

    def check(self, step: TraceStep) -> list[TokenMismatch]:
        """Every row of ``step`` against the counts its request's history gives (an admitted request's first
        row sets its count). One mismatch per row at most, ``cached_tokens`` first."""
        out: list[TokenMismatch] = []
        admitted = set(step.admit)
        for i, row in enumerate(step.rows):
            held = self.tokens.get(row.id)
            if row.id not in admitted and held is not None and row.cached_tokens != held:
                what = "its state was thrown away" if row.cached_tokens == 0 else "the row does not continue it"
                detail = f"request {row.id}'s state holds {held} tokens after its last step, {what}"
                out.append(TokenMismatch(i, row.id, "cached_tokens", held, row.cached_tokens, detail))
                continue
            if row.seq_len != row.cached_tokens + row.new_tokens:
                want = row.cached_tokens + row.new_tokens
                detail = f"seq_len must be cached_tokens {row.cached_tokens} + new_tokens {row.new_tokens}"
                out.append(TokenMismatch(i, row.id, "seq_len", want, row.seq_len, detail))
        return out

    def advance(self, step: TraceStep) -> None:
        """The step has run: each row's request holds :func:`tokens_after`; finished requests leave."""
        for row in step.rows:
            self.tokens[row.id] = tokens_after(row, step.kind_of(row), self.unit)
        for rid in step.finish:
            self.tokens.pop(rid, None)


__all__ = ["TokenLedger", "TokenMismatch", "tokens_after"]
