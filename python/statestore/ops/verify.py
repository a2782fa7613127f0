"""Check that a store holds exactly what its changelog says it should.

The expected state is rebuilt from the changelog by the restore engine in
replay mode (into a scratch directory) up to the offset the store claims -- a
different code path from the bulk mode that fills empty stores, so the two
check each other -- and the two
stores are compared in Rust: a digest of each and, on mismatch, the first key
at which they differ with both values. Nothing per record runs in Python.

A store whose files RocksDB cannot read (a damaged table file, MANIFEST or
offsets entry) is reported as damaged with RocksDB's reason, and the other
stores are still verified. A store recording Kafka Streams' ``OFFSET_UNKNOWN``
(-4: its task committed no changelog record yet) claims no offset: it is
reported as having none yet, never as a mismatch. A store that records no
offset is verified at the offset its task's ``.checkpoint`` records (the
layout of Kafka Streams 3.6 - 4.2).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from statestore import _native
from statestore.changelog.protocol import Changelog
from statestore.changelog.segment_log import SegmentLog
from statestore.errors import StateStoreError, StoreCorruptedError, StoreError
from statestore.ids import SENTINEL_OFFSETS, committed_offset
from statestore.ops.inspection import LocalStore, local_stores
from statestore.restore.engine import LogLike, restore_store
from statestore.state.checkpoint import CHECKPOINT_FILE_NAME, OffsetCheckpoint


@dataclass(frozen=True)
class VerifyResult:
    """The verdict for one store."""

    store: LocalStore
    #: Offset the store claims (None: it claims none, so it should be empty).
    offset: int | None
    expected_digest: str
    actual_digest: str
    expected_entries: int
    actual_entries: int
    #: ``(key, expected value, actual value)`` at the first difference; None if equal.
    first_difference: tuple[bytes, bytes | None, bytes | None] | None
    #: Offset the rebuilt store records (equal to ``offset`` when the log has that record).
    expected_offset: int | None
    #: ``"plain"``, ``"timestamped"`` or ``"timestamped-headers"`` (as found on disk); None when the store could not
    #: be read.
    format: str | None = None
    #: Why the store could not be verified (a type statestore does not know, a store RocksDB cannot open).
    problem: str | None = None
    #: The store's files are damaged (RocksDB's ``Corruption``; ``problem`` holds its reason).
    damaged: bool = False
    #: What a sentinel the store records in place of an offset means (``"no offset yet"``: Kafka
    #: Streams' ``OFFSET_UNKNOWN``, its task committed no changelog record); ``offset`` is None then.
    #: Kafka Streams restores such a store from its changelog's start, so nothing is a mismatch.
    offset_note: str | None = None

    @property
    def ok(self) -> bool:
        """True when data and offset match, or the store has no offset yet (nothing to match)."""
        if self.problem is not None:
            return False
        if self.offset_note is not None:
            return True
        return self.first_difference is None and self.expected_offset == self.offset


def verify_store(store: LocalStore, log: LogLike, scratch: Path) -> VerifyResult:
    """Rebuild ``store`` from ``log`` into ``scratch`` in the store's own format and compare.

    ``log`` is a segment log (a directory or :class:`SegmentLog`) or a changelog
    object such as :class:`~statestore.changelog.kafka.KafkaChangelog`. A store that
    cannot be read (a type statestore does not know, RocksDB's refusal) gives
    a result with ``problem`` set; it is only ever opened read-only.
    """
    try:
        fmt = _native.store_format(store.path) or "plain"
        offsets = _native.store_info(store.path).offsets
    except StateStoreError as e:
        return _unreadable(store, None, None, e)
    recorded = offsets.get(str(store.changelog))
    if recorded is None:
        # The .checkpoint layout (Kafka Streams 3.6 - 4.2): the task's file records the offset; Kafka
        # Streams 4.3+ too reads it there when the store records none.
        try:
            checkpoint = OffsetCheckpoint(store.path.parent.parent / CHECKPOINT_FILE_NAME).read()
        except StateStoreError as e:
            return _unreadable(store, None, fmt, e)
        recorded = checkpoint.get(store.changelog)
    offset = committed_offset(recorded)
    note = SENTINEL_OFFSETS.get(recorded) if recorded is not None else None
    expected = scratch / f"{store.task_id}-{store.store}"
    expected_offset = None
    try:
        if offset is None:
            _native.store_create(expected, fmt)
        else:
            result = restore_store(
                expected, log, store.changelog, end_offset=offset + 1, mode="replay", format=fmt
            )
            expected_offset = result.offset
        try:
            # The rebuilt store was just written: a store error here is the local store's (a damaged block).
            c = _native.store_compare(expected, store.path)
        except StoreError as e:
            return _unreadable(store, offset, fmt, e)
    finally:
        shutil.rmtree(expected, ignore_errors=True)
    return VerifyResult(
        store,
        offset,
        c.expected_digest,
        c.actual_digest,
        c.expected_entries,
        c.actual_entries,
        c.first_difference,
        expected_offset,
        fmt,
        offset_note=note,
    )


def _unreadable(store: LocalStore, offset: int | None, fmt: str | None, e: StateStoreError) -> VerifyResult:
    return VerifyResult(
        store, offset, "", "", 0, 0, None, None, fmt, str(e), damaged=isinstance(e, StoreCorruptedError)
    )


def verify_app(
    state_dir: str | Path,
    application_id: str,
    log_dir: str | Path | None = None,
    stores: list[str] | None = None,
    *,
    changelog: Changelog | None = None,
) -> list[VerifyResult]:
    """Verify every store of the application (or those named) against the segment log in
    ``log_dir`` or against ``changelog`` (e.g. a :class:`~statestore.changelog.kafka.KafkaChangelog`)."""
    if (log_dir is None) == (changelog is None):
        raise ValueError("verify_app: give either log_dir or changelog")
    log: LogLike = SegmentLog(log_dir) if log_dir is not None else cast(LogLike, changelog)
    with tempfile.TemporaryDirectory(prefix="statestore-verify-") as tmp:
        return [verify_store(s, log, Path(tmp)) for s in local_stores(state_dir, application_id, stores)]


__all__ = ["VerifyResult", "verify_app", "verify_store"]
