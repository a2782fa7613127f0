"""How far a store is behind its changelog, in records a restore would apply.

Aborted records and transaction markers occupy offsets, so the distance in
offsets overstates what is missing: a store holding every committed record
can sit offsets behind the log end when its changelog's last transaction was
aborted. :func:`store_lag` reports both, and the record count is the lag.
"""

from __future__ import annotations

from dataclasses import dataclass

from statestore.changelog.protocol import Changelog, changelog_argument
from statestore.ids import TopicPartition


@dataclass(frozen=True)
class Lag:
    """One store's lag behind its changelog partition."""

    log_start: int
    log_end: int
    records: int
    """Committed records past the store's offset, up to the last stable offset: what a restore would apply."""
    offsets: int
    """Offsets from the store's next offset to the log end (markers and aborted records included)."""


def store_lag(
    changelog: Changelog | None = None,
    tp: TopicPartition | None = None,
    offset: int | None = None,
    *,
    log: Changelog | None = None,
    bounds: tuple[int, int, int] | None = None,
) -> Lag:
    """The lag of a store whose last applied changelog offset is ``offset`` (None or negative: nothing applied).

    A store that is exactly up to date has ``records == 0`` even when aborted
    records, markers or an open transaction follow its offset. ``bounds`` are
    the partition's ``(start, end, last_stable)`` when the caller knows them
    as they are now (:attr:`RestoreResult.changelog_bounds
    <statestore.restore.engine.RestoreResult.changelog_bounds>`); else the
    changelog is asked. ``log=`` is the old name of ``changelog=`` (deprecated).
    """
    source: Changelog = changelog_argument(changelog, log, "store_lag")
    if tp is None:
        raise TypeError("store_lag: missing the changelog partition ('tp')")
    start, end, lso = bounds if bounds is not None else source.offsets(tp)
    first = offset + 1 if offset is not None and offset >= 0 else start
    first = max(first, start)
    return Lag(start, end, source.committed_records(tp, first, lso), max(0, end - first))


__all__ = ["Lag", "store_lag"]
