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

A window or session store is rebuilt the same way into a directory of
segments, with its format and retention (and segment interval), and
compared segment by segment: the segments are named by their start, so a
segment that only one side holds data in is a difference. Its format comes
from its bytes where they tell it (timestamped segments), else from
``formats``; its retention from ``retentions`` (neither its bytes nor its
changelog tell it): without them the store is reported as not verifiable,
saying which flag is missing, never guessed.

A versioned store's bytes look like a plain store's, so it is verified as one
only when its format is given (``formats``, ``--store-format NAME=versioned``)
or its changelog's configs say so (``--kafka``), with its history retention:
it is then rebuilt by replaying Kafka Streams' put logic record by record,
which gives exactly the rows a store statestore restored holds, and those of
a store Kafka Streams wrote while processing without a restart. A store Kafka
Streams restored in large batches, or kept writing after a restart, may
differ in expired history or in segments it no longer tracks (see
docs/kafka-streams.md), which such a rebuild reports as a mismatch.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from statestore import _native
from statestore.changelog.protocol import Changelog
from statestore.changelog.segment_log import SegmentLog
from statestore.errors import StateStoreError, StoreCorruptedError, StoreError
from statestore.ids import SENTINEL_OFFSETS, committed_offset
from statestore.ops.inspection import LocalStore, local_stores, versioned_by_changelog
from statestore.restore.engine import LogLike, restore_store
from statestore.state.checkpoint import CHECKPOINT_FILE_NAME, OffsetCheckpoint
from statestore.state.segmented import read_segmented
from statestore.state.store import check_store_format


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
    #: ``"plain"``, ``"timestamped"`` or ``"timestamped-headers"`` (as found on disk), a window or
    #: session format, or ``"versioned"`` (as given or as its changelog says); None when the store
    #: could not be read.
    format: str | None = None
    #: Why the store could not be verified (a type statestore does not know, a store RocksDB cannot open).
    problem: str | None = None
    #: The store's files are damaged (RocksDB's ``Corruption``; ``problem`` holds its reason).
    damaged: bool = False
    #: What a sentinel the store records in place of an offset means (``"no offset yet"``: Kafka
    #: Streams' ``OFFSET_UNKNOWN``, its task committed no changelog record); ``offset`` is None then.
    #: Kafka Streams restores such a store from its changelog's start, so nothing is a mismatch.
    offset_note: str | None = None
    #: A window or session store: the segment (its directory name) holding ``first_difference``.
    segment: str | None = None
    #: A window or session store: how many segments were compared (those holding data on either side).
    segments: int | None = None
    #: Not verified for want of what the store's bytes do not tell (its retention, window or session):
    #: ``problem`` names the flag; nothing is known to be wrong with the store.
    unverified: bool = False

    @property
    def ok(self) -> bool:
        """True when data and offset match, or the store has no offset yet (nothing to match)."""
        if self.problem is not None:
            return False
        if self.offset_note is not None:
            return True
        return self.first_difference is None and self.expected_offset == self.offset


def verify_store(
    store: LocalStore,
    log: LogLike,
    scratch: Path,
    *,
    format: str | None = None,
    retention_ms: int | None = None,
    segment_interval_ms: int | None = None,
) -> VerifyResult:
    """Rebuild ``store`` from ``log`` into ``scratch`` in the store's own format and compare.

    ``log`` is a segment log (a directory or :class:`SegmentLog`) or a changelog
    object such as :class:`~statestore.changelog.kafka.KafkaChangelog`. A store that
    cannot be read (a type statestore does not know, RocksDB's refusal) gives
    a result with ``problem`` set; it is only ever opened read-only. A window
    or session store needs ``retention_ms`` (and ``segment_interval_ms``
    unless the DSL's), and ``format`` when its bytes do not tell it.
    ``format`` also names a versioned store (``"versioned"``, with its history
    retention in ``retention_ms``), which its bytes cannot tell from a plain
    one; by default a key-value store's format is the one found on disk.
    """
    if store.segmented:
        return _verify_segmented(store, log, scratch, format, retention_ms, segment_interval_ms)
    try:
        fmt = _native.store_format(store.path) or "plain"
        offsets = _native.store_info(store.path).offsets
        if format is not None:
            check_store_format(store.path, format)
            fmt = format
            if fmt in _native.VERSIONED_STORE_FORMATS and retention_ms is None:
                raise StateStoreError(
                    f"{store.path} is a {fmt} store: give its history retention to verify it "
                    f"(--retention {store.store}=MS)"
                )
    except StateStoreError as e:
        return _unreadable(store, None, None if format is None else format, e)
    recorded = offsets.get(str(store.changelog))
    if recorded is None:
        # The .checkpoint layout (Kafka Streams 3.6 - 4.2): the task's file records the offset; Kafka
        # Streams 4.3+ too reads it there when the store records none.
        try:
            recorded = _checkpointed(store)
        except StateStoreError as e:
            return _unreadable(store, None, fmt, e)
    offset = committed_offset(recorded)
    note = SENTINEL_OFFSETS.get(recorded) if recorded is not None else None
    expected = scratch / f"{store.task_id}-{store.store}"
    expected_offset = None
    try:
        if offset is None:
            _native.store_create(expected, fmt)
        else:
            result = restore_store(
                expected,
                log,
                store.changelog,
                end_offset=offset + 1,
                mode="replay",
                format=fmt,
                retention_ms=retention_ms if fmt in _native.VERSIONED_STORE_FORMATS else None,
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


def _checkpointed(store: LocalStore) -> int | None:
    """What the store's task ``.checkpoint`` records for its changelog partition."""
    return OffsetCheckpoint(store.task_dir / CHECKPOINT_FILE_NAME).read().get(store.changelog)


def _unreadable(
    store: LocalStore,
    offset: int | None,
    fmt: str | None,
    e: StateStoreError | str,
    *,
    unverified: bool = False,
) -> VerifyResult:
    return VerifyResult(
        store,
        offset,
        "",
        "",
        0,
        0,
        None,
        None,
        fmt,
        str(e),
        damaged=isinstance(e, StoreCorruptedError),
        unverified=unverified,
    )


def _verify_segmented(
    store: LocalStore,
    log: LogLike,
    scratch: Path,
    format: str | None,
    retention_ms: int | None,
    segment_interval_ms: int | None,
) -> VerifyResult:
    """:func:`verify_store` of a window or session store: rebuilt into ``scratch/<task>/<store>`` (a
    segmented store's segments are named after its directory) and compared segment by segment."""
    try:
        view = read_segmented(store.path)
    except StateStoreError as e:
        return _unreadable(store, None, None, e)
    try:
        fmt = view.format_for(format, store.store)
    except ValueError as e:
        return _unreadable(
            store, None, None, f"cannot tell how to rebuild it: {e}", unverified=format is None
        )
    if retention_ms is None:
        return _unreadable(
            store,
            None,
            fmt,
            f"a {fmt} store, whose retention neither its bytes nor its changelog tell: give --retention "
            f"{store.store}=MS to verify it",
            unverified=True,
        )
    try:
        _native.segments_check(store.path, retention_ms, segment_interval_ms)
        recorded = view.info.offsets.get(str(store.changelog))
        if recorded is None:  # the .checkpoint layout (Kafka Streams 3.6 - 4.2)
            recorded = _checkpointed(store)
    except StateStoreError as e:
        return _unreadable(store, None, fmt, e)
    offset = committed_offset(recorded)
    note = SENTINEL_OFFSETS.get(recorded) if recorded is not None else None
    expected = scratch / str(store.task_id) / store.store
    expected.parent.mkdir(parents=True, exist_ok=True)
    empty = scratch / f"{store.task_id}-{store.store}-empty"
    expected_offset = None
    try:
        if offset is not None:
            result = restore_store(
                expected,
                log,
                store.changelog,
                end_offset=offset + 1,
                mode="replay",
                format=fmt,
                retention_ms=retention_ms,
                segment_interval_ms=segment_interval_ms,
            )
            expected_offset = result.offset
        ours = {Path(s.path).name: Path(s.path) for s in view.info.segments}
        theirs = {p.name: p for p in expected.iterdir()} if expected.is_dir() else {}
        _native.store_create(empty, "timestamped" if view.info.segment_format == "timestamped" else "plain")
        digest_e, digest_a = hashlib.sha256(), hashlib.sha256()
        n_e = n_a = compared = 0
        first: tuple[bytes, bytes | None, bytes | None] | None = None
        where = None
        for name in sorted(set(ours) | set(theirs), key=lambda n: int(n.rsplit(".", 1)[1])):
            try:
                c = _native.store_compare(theirs.get(name, empty), ours.get(name, empty))
            except StoreError as e:
                return _unreadable(store, offset, fmt, e)
            if c.expected_entries == 0 and c.actual_entries == 0:
                continue  # a segment without data on either side (a tombstone's) holds nothing to compare
            compared += 1
            n_e, n_a = n_e + c.expected_entries, n_a + c.actual_entries
            if c.expected_entries:
                digest_e.update(f"{name} {c.expected_digest}\n".encode())
            if c.actual_entries:
                digest_a.update(f"{name} {c.actual_digest}\n".encode())
            if first is None and c.first_difference is not None:
                first, where = c.first_difference, name
    finally:
        shutil.rmtree(scratch / str(store.task_id), ignore_errors=True)
        shutil.rmtree(empty, ignore_errors=True)
    return VerifyResult(
        store,
        offset,
        digest_e.hexdigest(),
        digest_a.hexdigest(),
        n_e,
        n_a,
        first,
        expected_offset,
        fmt,
        offset_note=note,
        segment=where,
        segments=compared,
    )


def verify_app(
    state_dir: str | Path,
    application_id: str,
    log_dir: str | Path | None = None,
    stores: list[str] | None = None,
    *,
    changelog: Changelog | None = None,
    formats: Mapping[str, str] | None = None,
    retentions: Mapping[str, int] | None = None,
    segment_intervals: Mapping[str, int] | None = None,
) -> list[VerifyResult]:
    """Verify every store of the application (or those named) against the segment log in
    ``log_dir`` or against ``changelog`` (e.g. a :class:`~statestore.changelog.kafka.KafkaChangelog`).

    ``formats``, ``retentions`` and ``segment_intervals`` (store name -> format, ms) are what a
    window, session or versioned store's bytes do not tell (see :func:`verify_store`); a changelog
    that reports topic configs (Kafka) tells a versioned store and its history retention itself
    (``min.compaction.lag.ms`` less a day)."""
    if (log_dir is None) == (changelog is None):
        raise ValueError("verify_app: give either log_dir or changelog")
    log: LogLike = SegmentLog(log_dir) if log_dir is not None else cast(LogLike, changelog)
    found = local_stores(state_dir, application_id, stores)
    fmts, rets, intervals = dict(formats or {}), dict(retentions or {}), dict(segment_intervals or {})
    for name, history in versioned_by_changelog(changelog, [s for s in found if not s.segmented]).items():
        fmts.setdefault(name, _native.VERSIONED_STORE_FORMATS[0])
        if history is not None:
            rets.setdefault(name, history)
    with tempfile.TemporaryDirectory(prefix="statestore-verify-") as tmp:
        return [
            verify_store(
                s,
                log,
                Path(tmp),
                format=fmts.get(s.store),
                retention_ms=rets.get(s.store),
                segment_interval_ms=intervals.get(s.store),
            )
            for s in found
        ]


__all__ = ["VerifyResult", "verify_app", "verify_store"]
