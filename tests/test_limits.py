"""workbench.limits: the host-memory read is reused for a moment, and never where it decides a refusal."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from workbench import limits
from workbench.errors import MetadataError


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The machine as a list of MemAvailable values, one per read; the list records how many were read."""
    values = [8 * 2**30, 1 * 2**30, 64 * 2**20]
    done: list[int] = []

    def read() -> int:
        done.append(values[min(len(done), len(values) - 1)])
        return done[-1]

    monkeypatch.setattr(limits, "_read_host_memory", read)
    limits.forget_host_memory()
    yield done
    limits.forget_host_memory()


def test_a_recent_read_is_reused(reads: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    assert limits.host_memory_bytes() == limits.host_memory_bytes() == 8 * 2**30
    assert len(reads) == 1
    for _ in range(1000):  # what a trace does: small checks every step
        limits.check_memory("bucket=8", 300, "metadata of 8 padded rows")
    assert len(reads) == 1
    monkeypatch.setattr(limits, "HOST_MEMORY_MAX_AGE_S", 0.0)  # too old: read again
    assert limits.host_memory_bytes() == 1 * 2**30 and len(reads) == 2


def test_a_check_near_the_limit_reads_the_machine_again(reads: list[int]) -> None:
    assert limits.host_memory_bytes() == 8 * 2**30  # reused below unless the check comes near it
    limits.check_memory("a", 3 * 2**30, "x")  # under half of 8 GiB: decided on the reused read
    assert len(reads) == 1
    with pytest.raises(MetadataError) as info:  # 5 GiB fits the 8 GiB read before, not the 1 GiB free now
        limits.check_memory("num_slots=5", 5 * 2**30, "a state pool")
    assert len(reads) == 2
    assert str(info.value) == "num_slots=5 needs 5.0 GiB for a state pool; this machine has 1.0 GiB free"


def test_the_read_itself_says_available_memory() -> None:
    limits.forget_host_memory()
    free = limits.host_memory_bytes()
    assert free > 0 and limits._read_host_memory() > 0
