"""A step's batch, as the scheduler hands it to the model runner (live requests only, before padding)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from workbench import html
from workbench.devices import canonical_device
from workbench.errors import MetadataError
from workbench.limits import INT32_MAX, as_device, check_fits, check_int, check_memory

MODES = ("decode", "target_verify", "extend", "idle")
IntsLike = Sequence[int] | torch.Tensor


def _ints(name: str, values: IntsLike, dtype: torch.dtype, device: torch.device | str | None) -> torch.Tensor:
    """Lists become tensors; tensors must hold integers and be 1-D. Values are checked by the caller."""
    device = as_device(device)
    if isinstance(values, torch.Tensor):
        if values.dtype.is_floating_point or values.dtype.is_complex or values.dtype == torch.bool:
            raise MetadataError(f"{name}: expected an integer tensor, got dtype {values.dtype}", field=name)
        if values.dim() != 1:
            raise MetadataError(f"{name}: expected a 1-D tensor, got shape {tuple(values.shape)}", field=name)
        if device is not None and values.device != canonical_device(device):
            raise MetadataError(f"{name}: on device {values.device}, expected {device}", field=name)
        if values.device.type == "cpu" and values.numel() and values.dtype.itemsize > dtype.itemsize:
            info = torch.iinfo(dtype)  # .to() would wrap silently: 2**32 + 5 becomes 5
            bad = ((values < info.min) | (values > info.max)).nonzero()
            if bad.numel():
                i = int(bad[0, 0])
                check_fits(f"{name}[{i}]", [int(values[i])], _DTYPE_NAMES[dtype], field=name, row=i)
        return values.to(dtype)
    try:
        if isinstance(values, str | bytes):
            raise TypeError
        values = list(values)
    except TypeError:
        raise MetadataError(
            f"{name}: expected a list of ints or a 1-D integer tensor, got {values!r}", field=name
        ) from None
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int):
            raise MetadataError(f"{name}[{i}]: expected an int, got {v!r}", field=name, row=i)
    check_fits(name, values, _DTYPE_NAMES[dtype], field=name)
    return torch.tensor(values, dtype=dtype, device=device)


_DTYPE_NAMES = {torch.int32: "int32", torch.int64: "int64"}


def _check_total(name: str, t: torch.Tensor) -> None:
    """Token counts are summed into int32 ``query_start_loc``: the sum must fit too (CPU only, as above)."""
    total = int(t.sum(dtype=torch.int64)) if t.device.type == "cpu" and t.numel() else 0
    if total > INT32_MAX:
        raise MetadataError(
            f"{name}: {total:,} tokens in one step; the total must fit int32 (max {INT32_MAX:,})", field=name
        )


def _check_min(name: str, t: torch.Tensor, minimum: int) -> None:
    # Value checks read the host copy; on an accelerator that would be a sync, so they run on CPU only.
    if t.device.type != "cpu":
        return
    bad = (t < minimum).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise MetadataError(f"{name}[{i}] = {int(t[i])}: must be >= {minimum}", field=name, row=i)


@runtime_checkable
class DraftTreeLike(Protocol):
    """What a batch reads of its draft trees. ``workbench.metadata.DraftTree`` is the one implementation: it
    lives a layer up, beside the metadata it fills, so the batch names it by what it offers (the builders
    check the class itself)."""

    @property
    def num_requests(self) -> int: ...

    @property
    def draft_tokens(self) -> int: ...

    @property
    def parents(self) -> torch.Tensor: ...

    @property
    def next_token(self) -> torch.Tensor: ...

    @property
    def next_sibling(self) -> torch.Tensor: ...


@dataclass
class Batch:
    """The live requests of one forward step.

    Attributes:
        mode: "decode", "target_verify", "extend" or "idle".
        req_pool_indices: int64 ``[r]``, request-pool rows of the live requests (unique).
        seq_lens: int32 ``[r]``, tokens of each request after this step.
        draft_tokens: tokens per request in this step (1 for decode, D for verify, 0 for extend/idle).
        extend_lens: int32 ``[r]`` new tokens per request (extend only).
        prefix_lens: int32 ``[r]`` cached tokens before this step (extend only; 0: no initial state).
        num_accepted_tokens: int32 ``[r]`` tokens accepted at the previous verify (vLLM spec decode).
        tree: the draft tree of each request (``workbench.metadata.DraftTree``, target_verify only; None: chains).
    """

    mode: str
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    draft_tokens: int = 1
    extend_lens: torch.Tensor | None = None
    prefix_lens: torch.Tensor | None = None
    num_accepted_tokens: torch.Tensor | None = None
    tree: DraftTreeLike | None = None

    # -- constructors ---------------------------------------------------------------------------------
    @classmethod
    def decode(
        cls, req_pool_indices: IntsLike, seq_lens: IntsLike, *, device: torch.device | str | None = None
    ) -> Batch:
        """One new token per request; ``seq_lens`` count it."""
        rpi, sl = cls._common(req_pool_indices, seq_lens, device)
        return cls("decode", rpi, sl, draft_tokens=1)

    @classmethod
    def target_verify(
        cls,
        req_pool_indices: IntsLike,
        seq_lens: IntsLike,
        draft_tokens: int,
        *,
        num_accepted_tokens: IntsLike | None = None,
        tree: DraftTreeLike | None = None,
        device: torch.device | str | None = None,
    ) -> Batch:
        """Speculative verify: ``draft_tokens`` (D) tokens per request.

        ``tree``: a ``workbench.metadata.DraftTree`` of one tree per request of D nodes (sglang with
        ``topk > 1``); None: each row's drafts are a chain. A tree of D = 1 is its root alone, a chain.
        """
        if isinstance(draft_tokens, bool) or not isinstance(draft_tokens, int) or draft_tokens < 1:
            raise MetadataError(f"draft_tokens must be an int >= 1, got {draft_tokens!r}", field="draft_tokens")
        rpi, sl = cls._common(req_pool_indices, seq_lens, device)
        if max(1, rpi.numel()) * draft_tokens > INT32_MAX:
            raise MetadataError(
                f"draft_tokens={draft_tokens}: {rpi.numel()} requests x {draft_tokens} tokens = "
                f"{rpi.numel() * draft_tokens:,} tokens in one step; the total must fit int32 (max {INT32_MAX:,})",
                field="draft_tokens",
            )
        acc = None
        if num_accepted_tokens is not None:
            acc = _ints("num_accepted_tokens", num_accepted_tokens, torch.int32, rpi.device)
            if acc.numel() != rpi.numel():
                raise MetadataError(
                    f"num_accepted_tokens: {acc.numel()} values for {rpi.numel()} requests", field="num_accepted_tokens"
                )
            _check_min("num_accepted_tokens", acc, 1)
            if acc.device.type == "cpu" and acc.numel() and int(acc.max()) > draft_tokens:
                i = int(acc.argmax())
                raise MetadataError(
                    f"num_accepted_tokens[{i}] = {int(acc[i])}: more than draft_tokens={draft_tokens}",
                    field="num_accepted_tokens",
                    row=i,
                )
        cls._check_tree(tree, rpi.numel(), draft_tokens)
        return cls("target_verify", rpi, sl, draft_tokens=draft_tokens, num_accepted_tokens=acc, tree=tree)

    @classmethod
    def extend(
        cls,
        req_pool_indices: IntsLike,
        extend_lens: IntsLike,
        prefix_lens: IntsLike | None = None,
        *,
        device: torch.device | str | None = None,
    ) -> Batch:
        """Prefill / extend: ``extend_lens`` new tokens after ``prefix_lens`` cached ones (0: no initial state)."""
        rpi = _ints("req_pool_indices", req_pool_indices, torch.int64, device)
        ext = _ints("extend_lens", extend_lens, torch.int32, rpi.device)
        pre = (
            torch.zeros_like(ext) if prefix_lens is None else _ints("prefix_lens", prefix_lens, torch.int32, rpi.device)
        )
        for name, t in (("extend_lens", ext), ("prefix_lens", pre)):
            if t.numel() != rpi.numel():
                raise MetadataError(f"{name}: {t.numel()} values for {rpi.numel()} requests", field=name)
        _check_min("extend_lens", ext, 1)
        _check_min("prefix_lens", pre, 0)
        _check_total("extend_lens", ext)
        if ext.device.type == "cpu" and ext.numel():
            total = pre.to(torch.int64) + ext.to(torch.int64)
            i = int(total.argmax())
            if int(total[i]) > INT32_MAX:
                raise MetadataError(
                    f"prefix_lens[{i}] + extend_lens[{i}] = {int(total[i]):,}: a sequence length must fit int32 "
                    f"(max {INT32_MAX:,})",
                    field="prefix_lens",
                    row=i,
                )
        cls._check_rows(rpi)
        return cls("extend", rpi, pre + ext, draft_tokens=0, extend_lens=ext, prefix_lens=pre)

    @classmethod
    def idle(cls, *, device: torch.device | str | None = None) -> Batch:
        """No live request (a data-parallel rank with nothing to do still runs the captured graph)."""
        empty = torch.zeros(0, dtype=torch.int64, device=as_device(device))
        return cls("idle", empty, empty.to(torch.int32), draft_tokens=0)

    @classmethod
    def for_capture(
        cls, mode: str, batch_size: int, draft_tokens: int = 1, *, device: torch.device | str | None = None
    ) -> Batch:
        """The batch a graph is captured with: ``batch_size`` rows, every one request row 0.

        Rows repeat on purpose (no duplicate check): as in sglang, the capture inputs are all zeros, so
        every row maps to the dummy slot and capture writes only there.
        """
        if mode not in ("decode", "target_verify"):
            raise MetadataError(f"mode: graphs are captured for decode and target_verify, got {mode!r}", field="mode")
        check_int("batch_size", batch_size, 1, INT32_MAX)
        check_int("draft_tokens", draft_tokens, 1, INT32_MAX)
        device = as_device(device)
        check_memory(
            f"batch_size={batch_size}",
            12 * batch_size,
            f"{batch_size:,} capture rows of 12 B",
            device or "cpu",
            field="batch_size",
        )
        rpi = torch.zeros(batch_size, dtype=torch.int64, device=device)
        d = draft_tokens if mode == "target_verify" else 1
        return cls(mode, rpi, torch.ones(batch_size, dtype=torch.int32, device=device), draft_tokens=d)

    @classmethod
    def _common(
        cls, req_pool_indices: IntsLike, seq_lens: IntsLike, device: torch.device | str | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rpi = _ints("req_pool_indices", req_pool_indices, torch.int64, device)
        sl = _ints("seq_lens", seq_lens, torch.int32, rpi.device)
        if sl.numel() != rpi.numel():
            raise MetadataError(f"seq_lens: {sl.numel()} values for {rpi.numel()} requests", field="seq_lens")
        _check_min("seq_lens", sl, 1)
        cls._check_rows(rpi)
        return rpi, sl

    @staticmethod
    def _check_tree(tree: object, r: int, draft_tokens: int) -> None:
        if tree is None:
            return
        if not isinstance(tree, DraftTreeLike):
            raise MetadataError(
                f"tree: expected a workbench.metadata.DraftTree or None, got {type(tree).__name__}", field="tree"
            )
        if tree.num_requests != r or tree.draft_tokens != draft_tokens:
            raise MetadataError(
                f"tree: trees of {tree.num_requests} requests x {tree.draft_tokens} nodes, the batch has {r} requests "
                f"x draft_tokens={draft_tokens}",
                field="tree",
            )

    @staticmethod
    def _check_rows(rpi: torch.Tensor) -> None:
        _check_min("req_pool_indices", rpi, 0)
        if rpi.device.type == "cpu" and rpi.numel() > 1:
            seen: dict[int, int] = {}
            for i, row in enumerate(rpi.tolist()):
                if row in seen:
                    raise MetadataError(
                        f"req_pool_indices[{i}] = {row}: duplicate of row {seen[row]} (a request runs once a step)",
                        field="req_pool_indices",
                        row=i,
                    )
                seen[row] = i

    # -- facts ----------------------------------------------------------------------------------------
    @property
    def raw_batch_size(self) -> int:
        return self.req_pool_indices.numel()

    @property
    def device(self) -> torch.device:
        return self.req_pool_indices.device

    @property
    def num_tokens(self) -> int:
        """Live tokens of the step (host arithmetic; extend reads ``extend_lens``)."""
        if self.mode == "extend" and self.extend_lens is not None:
            return int(self.extend_lens.sum())
        return self.raw_batch_size * self.draft_tokens

    def __repr__(self) -> str:
        extra = f", D={self.draft_tokens}" if self.mode == "target_verify" else ""
        extra += ", tree" if self.tree is not None else ""
        return f"Batch.{self.mode}(raw_bs={self.raw_batch_size}{extra})"

    def _repr_html_(self) -> str:
        cols = {"req_pool_index": self.req_pool_indices, "seq_len": self.seq_lens}
        for name in ("extend_lens", "prefix_lens", "num_accepted_tokens"):
            t = getattr(self, name)
            if t is not None:
                cols[name] = t
        values = {name: t.tolist() for name, t in cols.items()}
        if self.tree is not None:  # each row's draft tree, as its parents (node 0 the verified root)
            cols["tree_parents"] = self.tree.parents
            values["tree_parents"] = [html.short_list(p, limit=16) for p in self.tree.parents.tolist()]
        rows = [[i, *(values[c][i] for c in cols)] for i in range(self.raw_batch_size)]
        head: dict[str, object] = {"mode": self.mode, "raw_bs": self.raw_batch_size, "tokens": self.num_tokens}
        if self.mode == "target_verify":
            head["D"] = self.draft_tokens
            head["drafts"] = "chain" if self.tree is None else "tree"
        return html.block(html.facts(head), html.table(["row", *cols], rows, max_rows=40), title="Batch")
