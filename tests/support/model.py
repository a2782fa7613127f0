"""The reference model of a restored store, and what a store holds.

A store restored from its changelog must hold, for every key, the value of the
last committed record with that key below the restore's end (a tombstone
removes the key), and record the offset of the last record applied. The model
computes that in plain Python from the records a read_committed reader yields
-- never through the restore engine it checks. ``store_contents`` reads a
store the same way for every test.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from statestore import _native

Data = dict[bytes, bytes]


class _Rec(Protocol):
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...


def apply(data: Data, records: Iterable[tuple[bytes | None, bytes | None]]) -> Data:
    """Apply ``(key, value)`` changes in order: a ``None`` value deletes, a ``None`` key is skipped."""
    for k, v in records:
        if k is None:
            continue
        if v is None:
            data.pop(k, None)
        else:
            data[k] = v
    return data


def last_values(records: Iterable[_Rec]) -> Data:
    """Last value per key of ``records`` (objects with ``key`` and ``value``; tombstones remove)."""
    return apply({}, ((r.key, r.value) for r in records))


def expected_store(changelog: Any, tp: Any, end: int | None = None) -> tuple[Data, int | None]:
    """What a store restored from ``tp`` of ``changelog`` up to ``end`` (exclusive) must hold.

    Returns the data and the offset of the last committed record below
    ``end`` (``None`` when there is none). ``changelog`` is a
    :class:`~statestore.SegmentLog` or a :class:`~statestore.changelog.kafka.KafkaChangelog`.
    """
    data: Data = {}
    last = None
    for rec in changelog.read(tp):
        if end is not None and rec.offset >= end:
            break
        apply(data, [(rec.key, rec.value)])
        last = rec.offset
    return data, last


@dataclass(frozen=True)
class StoreContents:
    """Everything a store holds: its data, its offsets and its status marker."""

    data: Data
    #: ``"<topic>-<partition>"`` -> offset of the last applied record.
    offsets: dict[str, int]
    #: 1 open, 0 closed cleanly, ``None`` never written.
    status: int | None

    @property
    def entries(self) -> list[tuple[bytes, bytes]]:
        """The data in key order."""
        return sorted(self.data.items())


def store_contents(path: str | Path) -> StoreContents:
    """Read the whole store at ``path`` (read-only, no lock)."""
    d = _native.store_dump(str(path))
    return StoreContents({bytes(k): bytes(v) for k, v in d.entries}, dict(d.offsets), d.status)


def store_difference(expected: str | Path, actual: str | Path) -> str | None:
    """``None`` when the two stores hold the same data, else where they first differ (offsets are not compared)."""
    c = _native.store_compare(str(expected), str(actual))
    if c.expected_digest == c.actual_digest and c.expected_entries == c.actual_entries:
        return None
    return (
        f"{actual} differs from {expected}: {c.actual_entries} entries against {c.expected_entries}; "
        f"first difference (key, expected, actual): {c.first_difference}"
    )
