"""The state-slot pool: which request-pool row owns which state slot(s).

An engine keeps each request's recurrent state in a slot of a preallocated pool (``[num_slots, ...]``) and a
mapping ``request-pool row -> slot``. This module is that bookkeeping; the state tensors themselves live
with the layer. Slot ``profile.dummy_slot`` is never handed out (every profile reserves slot 0: sglang's
dummy written at capture, vLLM's null block), nor is request-pool row ``profile.reserved_request_row``
(0), which padded rows point at and which maps to the dummy slot.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

import torch

from workbench import html
from workbench.devices import canonical_device
from workbench.errors import MetadataError
from workbench.limits import check_memory
from workbench.profiles import Profile, get_profile

_NOT_FREE = "not free (owned by a request, held, reserved or past the pool)"


def _as_int(name: str, value: object, minimum: int, *, row: int | None = None) -> int:
    """``value`` as an int ``>= minimum``, or a MetadataError naming ``name`` (``name[row]`` when ``row`` is given)."""
    where = name if row is None else f"{name}[{row}]"
    if isinstance(value, bool) or not isinstance(value, int):
        raise MetadataError(f"{where} must be an int, got {value!r}", field=name, row=row)
    if value < minimum:
        raise MetadataError(f"{where} must be >= {minimum}, got {value}", field=name, row=row)
    return value


class LowestFirst:
    """The free members of ``range(n)`` minus one reserved value, handed out lowest first.

    Never-used members are a counter, returned ones a heap, so a pool of 10^8 slots costs no Python list.
    Every returned member is below the counter (it was handed out before), so the heap comes first.
    """

    def __init__(self, n: int, reserved: int) -> None:
        self.n, self.reserved = n, reserved
        self.fresh = 0  # lowest never-handed-out member
        self.returned: list[int] = []

    def __len__(self) -> int:
        untouched = self.n - self.fresh - (1 if self.fresh <= self.reserved < self.n else 0)
        return len(self.returned) + untouched

    def take(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            if self.returned:
                out.append(heapq.heappop(self.returned))
                continue
            if self.fresh == self.reserved:
                self.fresh += 1
            out.append(self.fresh)
            self.fresh += 1
        return out

    def take_member(self, m: int) -> bool:
        """Take the free member ``m`` (a trace, or an engine, chose it); False when it is not free."""
        if m in self.returned:
            self.returned.remove(m)
            heapq.heapify(self.returned)
            return True
        if not self.fresh <= m < self.n or m == self.reserved:
            return False
        for skipped in range(self.fresh, m):  # free, never handed out: below the counter from now on
            if skipped != self.reserved:
                heapq.heappush(self.returned, skipped)
        self.fresh = m + 1
        return True

    def give(self, members: Iterable[int]) -> None:
        for m in members:
            heapq.heappush(self.returned, m)

    def sorted(self) -> list[int]:
        return sorted(self.returned) + [m for m in range(self.fresh, self.n) if m != self.reserved]


class StatePool:
    """Slots of a linear-attention state pool and the request rows that own them.

    Args:
        num_slots: slots in the pool, the reserved dummy slot included (state tensors are ``[num_slots, ...]``).
        profile: engine conventions ("sglang", "sglang-ascend", "vllm").
        slots_per_request: slots each request owns (vLLM spec decode keeps one per draft position, ``D``).
        max_requests: request-pool rows handed out at most; default: as many as the slots allow.
        device: where ``mapping`` lives (the metadata is built there).

    ``mapping`` is int32 ``[num_rows, slots_per_request]``; rows not allocated map to the dummy slot, as in
    sglang, which is why capture (run on all-zero request indices) writes only the dummy slot.
    """

    def __init__(
        self,
        num_slots: int,
        profile: str | Profile = "sglang",
        *,
        slots_per_request: int = 1,
        max_requests: int | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        self.profile = get_profile(profile)
        self.num_slots = _as_int("num_slots", num_slots, 2)
        self.slots_per_request = _as_int("slots_per_request", slots_per_request, 1)
        usable = (self.num_slots - 1) // self.slots_per_request
        if usable < 1:
            raise MetadataError(
                f"num_slots={num_slots} leaves no room for one request of {slots_per_request} slots "
                f"beside the reserved dummy slot {self.profile.dummy_slot}",
                field="num_slots",
            )
        self.max_requests = usable if max_requests is None else _as_int("max_requests", max_requests, 1)
        self.device = canonical_device(device)
        num_rows = self.max_requests + 1  # + the reserved row
        field = "num_slots" if max_requests is None else "max_requests"
        culprit = f"{field}={num_slots if max_requests is None else max_requests}"
        row_bytes = 4 * self.slots_per_request  # one int32 per slot a request owns
        what = f"a slot mapping of {num_rows:,} rows of {row_bytes} B"
        check_memory(culprit, num_rows * row_bytes, what, self.device, field=field)
        self.mapping = torch.full(
            (num_rows, self.slots_per_request), self.profile.dummy_slot, dtype=torch.int32, device=self.device
        )
        self._free_slots = LowestFirst(self.num_slots, self.profile.dummy_slot)
        self._free_rows = LowestFirst(num_rows, self.profile.reserved_request_row)
        self._slots_of: dict[int, list[int]] = {}
        self._held: set[int] = set()  # slots a prefix cache keeps (a checkpoint's state), no request row

    # -- queries --------------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Requests that can be live at once."""
        return min(self.max_requests, (self.num_slots - 1) // self.slots_per_request)

    @property
    def num_free(self) -> int:
        """Requests that can still be allocated."""
        return min(len(self._free_rows), len(self._free_slots) // self.slots_per_request)

    @property
    def live_rows(self) -> list[int]:
        return sorted(self._slots_of)

    def is_allocated(self, row: int) -> bool:
        return row in self._slots_of

    def slots_of(self, row: int) -> list[int]:
        """The slots request-pool row ``row`` owns."""
        if row not in self._slots_of:
            raise MetadataError(f"req_pool_indices: row {row} is not allocated", field="req_pool_indices")
        return list(self._slots_of[row])

    def owned_slots(self) -> set[int]:
        """Every slot some live request owns."""
        return {s for slots in self._slots_of.values() for s in slots}

    def free_slots(self) -> list[int]:
        return self._free_slots.sorted()

    @property
    def held_slots(self) -> set[int]:
        """Slots a prefix cache holds (:meth:`hold`): a checkpoint's state, owned by no request row."""
        return set(self._held)

    # -- slots held by a prefix cache -----------------------------------------------------------------
    def hold(self, slot: int | None = None) -> int:
        """Take one slot for a prefix cache, without a request row: the lowest free one, or ``slot`` (as a
        recorded trace placed it); refused (naming the value) when it is not free. Returns the slot."""
        if slot is None:
            if len(self._free_slots) == 0:
                raise MetadataError(f"pool exhausted: no free slot to hold ({self.num_slots} slots)", field="slot")
            (taken,) = self._free_slots.take(1)
        else:
            taken = _as_int("slot", slot, 0)
            if taken == self.profile.dummy_slot or not self._free_slots.take_member(taken):
                raise MetadataError(f"slot={slot}: {_NOT_FREE}", field="slot")
        self._held.add(taken)
        return taken

    def release(self, slot: int) -> None:
        """Give back a slot :meth:`hold` took (an evicted checkpoint)."""
        if slot not in self._held:
            raise MetadataError(f"release: slot {slot} is not held by a prefix cache", field="slot")
        self._held.discard(slot)
        self._free_slots.give([slot])

    def move(self, row: int, slot: int) -> int:
        """Give request-pool row ``row`` (one slot per request) the free slot ``slot`` instead of its own, as
        vLLM's align mode moves a request's running state into the block of its position; the old slot is
        freed (a prefix cache may then hold it). Returns the old slot; refused, naming the value, when
        ``slot`` is not free."""
        if self.slots_per_request != 1:
            raise MetadataError(
                f"move: a request owns {self.slots_per_request} slots here; one can be moved", field="slots_per_request"
            )
        (old,) = self.slots_of(row)
        slot = _as_int("slot", slot, 0)
        if slot == self.profile.dummy_slot or not self._free_slots.take_member(slot):
            raise MetadataError(f"slot={slot}: {_NOT_FREE}", field="slot")
        self._free_slots.give([slot])  # taken again by remap, with the rest of the bookkeeping
        (dropped,) = self.remap(row, [slot])
        return dropped

    def remap(self, row: int, slots: Sequence[int]) -> list[int]:
        """Give request-pool row ``row`` the slots ``slots`` (``slots_per_request`` of them, in column order),
        as vLLM's align mode with speculation slides a request's window of blocks: each slot is the row's
        already or free. The row's slots left out are freed (a prefix cache may then hold them) and returned;
        refused, naming the value, before anything changes."""
        have = self.slots_of(row)
        if len(slots) != self.slots_per_request:
            raise MetadataError(
                f"slots: {len(slots)} given, the pool keeps {self.slots_per_request} per request", field="slots"
            )
        new = [_as_int("slots", s, 0, row=i) for i, s in enumerate(slots)]
        taken: list[int] = []
        for i, slot in enumerate(new):
            problem = "given twice" if slot in new[:i] else None
            if problem is None and slot not in have:
                if slot != self.profile.dummy_slot and self._free_slots.take_member(slot):
                    taken.append(slot)
                else:
                    problem = _NOT_FREE
            if problem is not None:
                self._free_slots.give(taken)
                raise MetadataError(f"slots[{i}]={slot}: {problem}", field="slots", row=i)
        dropped = [s for s in have if s not in new]
        self._slots_of[row] = new
        self.mapping[row] = torch.tensor(new, dtype=torch.int32, device=self.device)
        self._free_slots.give(dropped)
        return dropped

    def donate(self, row: int) -> int:
        """Free request-pool row ``row`` but keep its (one) slot held by a prefix cache, as a finishing request
        gives its state to the tree without a copy; returns the slot."""
        if self.slots_per_request != 1:
            raise MetadataError(
                f"donate: a request owns {self.slots_per_request} slots here; one can be donated",
                field="slots_per_request",
            )
        (slot,) = self.slots_of(row)
        self._slots_of.pop(row)
        self._free_rows.give([row])
        self.mapping[row] = self.profile.dummy_slot
        self._held.add(slot)
        return slot

    # -- alloc / free ---------------------------------------------------------------------------------
    def alloc(self, n: int) -> torch.Tensor:
        """Allocate ``n`` requests; returns their request-pool rows (int64 ``[n]`` on ``device``).

        Slots are handed out lowest-first, so a pool that has seen frees gives scattered slots.
        """
        n = _as_int("n", n, 0)
        if n > self.num_free:
            raise MetadataError(
                f"pool exhausted: asked for {n} requests, {self.num_free} free "
                f"({len(self._free_slots)} free slots, {self.slots_per_request} per request)",
                field="n",
            )
        rows = self._free_rows.take(n)
        for row in rows:
            slots = self._free_slots.take(self.slots_per_request)
            self._slots_of[row] = slots
            self.mapping[row] = torch.tensor(slots, dtype=torch.int32, device=self.device)
        return torch.tensor(rows, dtype=torch.int64, device=self.device)

    def alloc_at(self, row: int, slots: Sequence[int]) -> None:
        """Allocate request-pool row ``row`` with exactly ``slots`` (``slots_per_request`` of them), as a
        recorded trace or an engine placed them; refused (naming the value) when any is taken or reserved."""
        row = _as_int("row", row, 0)
        if len(slots) != self.slots_per_request:
            raise MetadataError(
                f"slots: {len(slots)} given, the pool keeps {self.slots_per_request} per request", field="slots"
            )
        if row in self._slots_of or row >= self.mapping.shape[0] or row == self.profile.reserved_request_row:
            raise MetadataError(
                f"row={row}: not a free request-pool row (live, reserved or past the pool)", field="row"
            )
        for i, slot in enumerate(slots):
            if slot == self.profile.dummy_slot or not 0 <= slot < self.num_slots or slot in slots[:i]:
                raise MetadataError(
                    f"slots[{i}]={slot}: the dummy slot, out of range or given twice", field="slots", row=i
                )
        if not self._free_rows.take_member(row):
            raise MetadataError(f"row={row}: not a free request-pool row", field="row")
        taken: list[int] = []
        for i, slot in enumerate(slots):
            if not self._free_slots.take_member(int(slot)):
                self._free_slots.give(taken)
                self._free_rows.give([row])
                whose = "held by a prefix cache (a checkpoint)" if slot in self._held else "owned by another request"
                raise MetadataError(f"slots[{i}]={slot}: {whose}", field="slots", row=i)
            taken.append(int(slot))
        self._slots_of[row] = taken
        self.mapping[row] = torch.tensor(taken, dtype=torch.int32, device=self.device)

    def free(self, rows: Iterable[int] | torch.Tensor) -> None:
        """Release requests; their slots return to the pool and their rows map to the dummy slot again."""
        rows = [int(r) for r in (rows.tolist() if isinstance(rows, torch.Tensor) else rows)]
        seen: set[int] = set()
        for i, row in enumerate(rows):
            if row in seen:
                raise MetadataError(f"free: rows[{i}]={row} appears twice in one call", field="rows", row=i)
            if row not in self._slots_of:
                raise MetadataError(
                    f"free: rows[{i}]={row} is not allocated (freed twice, or never allocated)", field="rows", row=i
                )
            seen.add(row)
        for row in rows:
            self._free_slots.give(self._slots_of.pop(row))
            self._free_rows.give([row])
            self.mapping[row] = self.profile.dummy_slot

    def __repr__(self) -> str:
        return (
            f"StatePool(num_slots={self.num_slots}, profile={self.profile.name!r}, live={len(self._slots_of)}, "
            f"free={self.num_free}, slots_per_request={self.slots_per_request})"
        )

    def _repr_html_(self) -> str:
        head = {
            "profile": self.profile.name,
            "num_slots": self.num_slots,
            "live": len(self._slots_of),
            "free": self.num_free,
            "dummy_slot": self.profile.dummy_slot,
        }
        rows = [[row, ", ".join(map(str, self._slots_of[row]))] for row in self.live_rows]
        table = html.table(["request row", "slots"], rows, max_rows=40) if rows else html.note("no live request")
        return html.block(html.facts(head), table, title="StatePool")
