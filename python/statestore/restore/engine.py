"""Restoring stores from their changelogs, in Rust, with the GIL released.

``restore_store`` brings one store up to date with one changelog partition of a
segment log or of a Kafka topic (:class:`~statestore.changelog.kafka.KafkaChangelog`); ``restore_many`` does that for many (store, partition) pairs on a
pool of native threads. Two modes do the work:

- **replay** applies the committed records in order, one large RocksDB
  ``WriteBatch`` per chunk of log (its share of ``memory_budget_bytes``, 64
  MiB at most; RocksDB's memtables get the other half of the budget) holding
  only the last operation of each key in the chunk,
  write-ahead log off, the offset of the last applied record written in the
  same batch; both column families are flushed together, so the store on disk
  is always a committed prefix with its offset.
- **bulk** keeps only the last value per key (tombstones remove), sorts, writes
  SST files and ingests them at once, then records the offset. Memory stays
  within ``memory_budget_bytes`` by spilling sorted runs beside the store.
  Nothing touches the store before the ingestion.

``mode="auto"`` (the default) uses bulk for a store without data and replay
otherwise. Restoring starts at the store's recorded offset + 1 (or the log's
start) and ends at ``end_offset`` or, by default, the last stable offset when
the restore starts. Records of aborted transactions, transaction markers and
records without a key are skipped and counted.

A listener with Kafka's ``StateRestoreListener`` shape is called from the
restoring thread at most once per ``progress_interval`` seconds, and once more when
the whole log is read: its batches then add up to every record restored, with the
offset before the end, before the restore writes the store (a bulk restore's sort
and SST files, a long replay's merge), which reports nothing until
``on_restore_end``. If it raises,
that restore stops with a :class:`~statestore.errors.RestoreError` (whose
``__cause__`` is the listener's exception) and the store keeps a committed
state with its offset.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol, runtime_checkable

from statestore import _native
from statestore.changelog.protocol import Changelog, FedChangelog, changelog_argument
from statestore.errors import RestoreError, StateStoreError
from statestore.ids import OFFSET_UNKNOWN, PartitionLike, TopicPartition, coerce_tp
from statestore.restore import topic_ids
from statestore.state.store import STORE_FORMATS, check_format

#: Default memory budget of a bulk restore (keys, values and merge buffers).
DEFAULT_MEMORY_BUDGET: int = _native.DEFAULT_MEMORY_BUDGET
#: Default least time, in seconds, between two progress calls of a listener.
DEFAULT_PROGRESS_INTERVAL: float = 0.1

#: The restore modes `restore_store` accepts.
MODES: tuple[str, ...] = tuple(_native.MODES)


@runtime_checkable
class RestoreListener(Protocol):
    """Progress of restores, with the shape of Kafka's ``StateRestoreListener``.

    Methods are called from the restoring (native) thread, never per record.
    """

    def on_restore_start(
        self, tp: TopicPartition, store_name: str, start_offset: int, end_offset: int
    ) -> None:
        """The restore of ``[start_offset, end_offset)`` begins."""

    def on_batch_restored(
        self, tp: TopicPartition, store_name: str, batch_end_offset: int, num_restored: int
    ) -> None:
        """Records up to ``batch_end_offset`` are applied (replay) or read (bulk);
        ``num_restored`` records since the previous call. Once the whole log is read,
        a last call says so with the offset before ``end_offset``."""

    def on_restore_end(self, tp: TopicPartition, store_name: str, total_restored: int) -> None:
        """The restore finished; ``total_restored`` records were applied."""


class HasLogDir(Protocol):
    """Anything that names a segment log directory, such as ``statestore.changelog.segment_log.SegmentLog``."""

    @property
    def log_dir(self) -> Path:
        """The directory holding ``<topic>-<partition>/`` segment folders."""
        ...


#: A segment log, the path of its directory, or a changelog the engine reads
#: through Python (:class:`~statestore.changelog.kafka.KafkaChangelog`). Any
#: :class:`~statestore.changelog.protocol.Changelog` is accepted if it is one of those.
LogLike = HasLogDir | str | os.PathLike[str] | FedChangelog | Changelog


def _check_log(log: LogLike) -> LogLike:
    """``log`` if the native engine can read it: a segment log directory, a segment log, or a fed changelog."""
    if isinstance(log, (str, os.PathLike, FedChangelog)) or getattr(log, "log_dir", None) is not None:
        return log
    raise TypeError(f"cannot restore from {log!r}: not a segment log, a log directory or a fed changelog")


@dataclass(frozen=True)
class SkippedRecords:
    """Records a restore stepped over, by reason."""

    #: Data records of aborted transactions.
    aborted: int = 0
    #: Control records (transaction markers).
    control: int = 0
    #: Committed records without a key.
    null_key: int = 0

    @property
    def total(self) -> int:
        """All skipped records."""
        return self.aborted + self.control + self.null_key


@dataclass(frozen=True)
class RestoreResult:
    """What one restore did, or, with ``error`` set, why it failed (``restore_many``)."""

    tp: TopicPartition
    store_path: Path
    #: ``"replay"`` or ``"bulk"`` (the mode asked for, when the restore failed early).
    mode: str
    #: First offset read (the store's recorded offset + 1, or the log's start).
    start_offset: int
    #: Exclusive end reached.
    end_offset: int
    records_applied: int
    records_skipped: SkippedRecords
    bytes_read: int
    seconds: float
    #: Offset the store records afterwards (``None``: no record applied yet).
    offset: int | None
    error: StateStoreError | None = None
    #: ``(start, end, last_stable)`` of the changelog partition as the restore left it, when the
    #: changelog could tell that nothing was written to it since the restore asked (a segment log
    #: whose files are unchanged); ``None``: ask the changelog. Spares reading its bounds again.
    changelog_bounds: tuple[int, int, int] | None = None
    #: Of ``seconds``, the merge a long replay ends with: a replay of tens of millions of offsets
    #: leaves RocksDB's compactions until its last batch and then merges the store once (0.0 without).
    merge_seconds: float = 0.0
    #: The Kafka topic id (a UUID string) the records were read under; ``None``: none read, or a
    #: changelog without topic ids (the segment log, a broker older than Kafka 2.8).
    topic_id: str | None = None

    @property
    def ok(self) -> bool:
        """True when the restore completed."""
        return self.error is None


@dataclass(frozen=True, init=False)
class RestoreSpec:
    """One restore for :func:`restore_many`; fields as the arguments of :func:`restore_store`.

    ``topic_id`` (Kafka only): the topic id the store's records were read under; a read going on
    from the store's offset that finds the topic under another id (deleted and recreated) is
    :class:`~statestore.errors.TaskCorruptedError`. ``None``: the one recorded beside the store
    (:mod:`statestore.restore.topic_ids`), if any.

    ``log=`` is the old name of ``changelog=`` and still accepted, with a
    ``DeprecationWarning``.
    """

    store_path: str | os.PathLike[str]
    changelog: LogLike
    tp: TopicPartition
    end_offset: int | None = None
    mode: str = "auto"
    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET
    listener: RestoreListener | None = None
    progress_interval: float = DEFAULT_PROGRESS_INTERVAL
    format: str = "plain"
    retention_ms: int | None = None
    segment_interval_ms: int | None = None
    topic_id: str | None = None

    def __init__(
        self,
        store_path: str | os.PathLike[str],
        changelog: LogLike | None = None,
        tp: PartitionLike | None = None,
        end_offset: int | None = None,
        mode: str = "auto",
        memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET,
        listener: RestoreListener | None = None,
        progress_interval: float = DEFAULT_PROGRESS_INTERVAL,
        format: str = "plain",
        *,
        retention_ms: int | None = None,
        segment_interval_ms: int | None = None,
        log: LogLike | None = None,
        topic_id: str | None = None,
    ) -> None:
        if tp is None:
            raise TypeError("RestoreSpec: missing the changelog partition to restore ('tp')")
        values = {
            "store_path": store_path,
            "changelog": changelog_argument(changelog, log, "RestoreSpec"),
            "tp": coerce_tp(tp),
            "end_offset": end_offset,
            "mode": mode,
            "memory_budget_bytes": memory_budget_bytes,
            "listener": listener,
            "progress_interval": progress_interval,
            "format": format,
            "retention_ms": retention_ms,
            "segment_interval_ms": segment_interval_ms,
            "topic_id": topic_id,
        }
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @property
    def log(self) -> LogLike:
        """Deprecated name of :attr:`changelog`."""
        warnings.warn(
            "RestoreSpec.log is deprecated, use RestoreSpec.changelog", DeprecationWarning, stacklevel=2
        )
        return self.changelog


def _result(tp: TopicPartition, store_path: Path, o: _native.RestoreOutcome) -> RestoreResult:
    return RestoreResult(
        tp=tp,
        store_path=store_path,
        mode=o.mode,
        start_offset=o.start_offset,
        end_offset=o.end_offset,
        records_applied=o.records_applied,
        records_skipped=SkippedRecords(o.skipped_aborted, o.skipped_control, o.skipped_null_key),
        bytes_read=o.bytes_read,
        seconds=o.seconds,
        offset=o.offset,
        changelog_bounds=o.log_bounds,
        merge_seconds=o.merge_seconds,
        topic_id=o.topic_id,
    )


def restore_store(
    store_path: str | os.PathLike[str],
    changelog: LogLike | None = None,
    tp: PartitionLike | None = None,
    *,
    end_offset: int | None = None,
    mode: str = "auto",
    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET,
    listener: RestoreListener | None = None,
    progress_interval: float = DEFAULT_PROGRESS_INTERVAL,
    read_ahead: bool = True,
    format: str = "plain",
    retention_ms: int | None = None,
    segment_interval_ms: int | None = None,
    log: LogLike | None = None,
    bulk_threads: int = 1,
    topic_id: str | None = None,
) -> RestoreResult:
    """Bring the store at ``store_path`` up to date with partition ``tp`` of ``changelog``.

    ``changelog`` is a segment log, its directory, or a Kafka changelog
    (``log=`` is its old name, still accepted with a ``DeprecationWarning``).

    With ``read_ahead`` (the default) the changelog is read and decoded on a second
    thread while this one applies, so one restore uses up to two cores; turn
    it off where each restore is granted one core, such as a Spark task with
    ``spark.task.cpus=1`` (:func:`restore_many` runs one thread per restore unless it
    has fewer restores than threads).
    A bulk restore from Kafka's native fetcher decodes on this thread either
    way: its fetch thread already receives and checks the responses, and a
    third busy thread beside it (and the broker, on a small machine) was slower.

    ``bulk_threads`` (1 by default) splits a bulk restore's last phase -- sorting,
    merging its spilled runs and writing SST files -- by key range across that
    many threads, all the files going into one ingestion: one huge partition
    on several cores, within the same ``memory_budget_bytes``.
    :func:`restore_many` does this by itself when it has fewer specs than threads.

    ``memory_budget_bytes`` bounds what the restore holds in memory: bulk
    spills sorted runs beyond it; a replay gives half of it to RocksDB's
    memtables (four of an eighth each, 1-64 MiB) and half to its batches: one
    covers at most a fifth of the budget in log bytes (64 MiB at most, 4 MiB
    at least), an eighth with ``read_ahead``, which gathers the next batch
    while one is written.

    ``format`` is how the store lays out its data (:data:`STORE_FORMATS`):
    ``"plain"`` (column family ``default``, the value as logged: Kafka
    Streams' ``Stores.persistentKeyValueStore``) or ``"timestamped"``
    (column family ``keyValueWithTimestamp``, each value preceded by its
    record's timestamp, 8 bytes big-endian: the store of Kafka Streams' DSL
    aggregations). Kafka Streams' window and session stores are
    ``"window"`` (``Stores.persistentWindowStore``, the stores of a
    stream-stream join, duplicates included), ``"timestamped-window"``
    (``windowedBy(...).count()`` and the DSL's other windowed aggregations)
    and ``"session"`` (session-windowed aggregations): ``store_path`` is then
    the store's directory in its task directory (``<task>/<store>``, not
    under ``rocksdb/``), holding one RocksDB per live time segment,
    ``<store>.<segment start>``, and ``retention_ms`` (the store's retention:
    the window size plus the grace period for a DSL windowed aggregation,
    the inactivity gap plus grace for a session one, unless ``Materialized``
    sets more) is required; ``segment_interval_ms`` defaults to the DSL's,
    ``max(retention / 2, 60 s)`` (:func:`statestore._native.dsl_segment_interval`).
    ``"versioned"`` is Kafka Streams' versioned key-value store
    (``Stores.persistentVersionedKeyValueStore``; ``store_path`` is
    ``<task>/rocksdb/<store>``): ``retention_ms`` is its history retention
    (required; its changelog's ``min.compaction.lag.ms`` less a day) and
    ``segment_interval_ms`` defaults to Kafka's for it
    (:func:`statestore._native.versioned_segment_interval`); every record is
    replayed through Kafka Streams' put logic, so ``mode="bulk"`` replays too.
    An existing store of another format, or of a type statestore does not
    know, is refused untouched (``StoreError``).

    From Kafka (the native fetcher), ``topic_id`` is the topic id the store's
    records were read under (default: the one recorded beside the store,
    ``.<store>.topic-id``, see :mod:`statestore.restore.topic_ids`): a read
    going on from the store's offset that finds the topic under another id
    (deleted and recreated) is :class:`~statestore.errors.TaskCorruptedError`.
    The id read under is recorded beside the store afterwards.

    The store is created if missing (its parent directory must exist). Raises
    :class:`~statestore.errors.RestoreError` (bad range, listener raised),
    :class:`~statestore.errors.StoreError`, or a
    :class:`~statestore.errors.LogError` subclass; in every case the store
    keeps a committed state with its offset (bulk: its previous state).
    """
    source: LogLike = changelog_argument(changelog, log, "restore_store")
    if tp is None:
        raise TypeError("restore_store: missing the changelog partition to restore ('tp')")
    tp = coerce_tp(tp)
    if bulk_threads < 1:
        raise ValueError(f"bulk_threads must be >= 1, got {bulk_threads}")
    path = Path(store_path)
    recorded = topic_ids.held_topic_id(source, tp, path)
    out = _native.restore_store(
        path,
        _check_log(source),
        tp,
        end_offset,
        mode,
        memory_budget_bytes,
        listener,
        progress_interval,
        read_ahead=read_ahead,
        format=check_format(format),
        retention_ms=retention_ms,
        segment_interval_ms=segment_interval_ms,
        bulk_threads=bulk_threads,
        topic_id=recorded if topic_id is None else topic_id,
    )
    topic_ids.record(path, tp, recorded, out.topic_id)
    return _result(tp, path, out)


#: Stores kept open between restores of them (the state updater's rounds): ``restore_many(...,
#: open_stores=)`` takes each store from there if it is open and keeps it there afterwards.
OpenStores = _native.OpenStores


def _store_identity(path: Path) -> tuple[object, ...]:
    """What tells stores apart however their paths are spelled (symbolic links, ``..``): an existing
    store's file identity, a new one's parent directory's and its name. One or two ``stat`` calls:
    the state updater asks it for every store of every round, where resolving every component of
    each path took 3-4 ms of a round of 100 standby stores (~0.5 ms this way)."""
    try:
        st = os.stat(path)
        return (st.st_dev, st.st_ino)
    except OSError:
        pass
    try:
        st = os.stat(path.parent)
        return (st.st_dev, st.st_ino, path.name)
    except OSError:
        return (os.path.abspath(path),)


def restore_many(
    specs: Sequence[RestoreSpec], *, threads: int | None = None, open_stores: OpenStores | None = None
) -> list[RestoreResult]:
    """Run many restores on ``threads`` native threads (default: one per core, at most one per spec).

    Each restore runs on one thread (a lone :func:`restore_store` also decodes
    ahead on a second one). With fewer specs than threads, each restore gets its
    share of them, ``threads // len(specs)`` when that is two or more: it reads
    ahead, and a bulk restore splits its sort, merge and SST writing by key range
    across them (``bulk_threads`` of :func:`restore_store`), so one huge partition
    uses every thread of the job. A restore from Kafka's native fetcher also
    receives and checks its fetch responses on a fetch thread of its own, as a
    Kafka client's network thread does, so ``threads`` counts restore threads:
    with the segment log it is the number of cores used, from Kafka somewhat
    more. When they leave a core free, one more thread prepares the next
    restore while they work (opens or creates its store, asks for its
    offsets, starts its first fetch), which waits mostly on the disk and the
    broker; a Python changelog is only ever called from the restore threads.

    Results come back in the order of ``specs``. A failing restore does not
    raise: its result carries the exception in ``error`` and the other
    restores go on. Two specs must not name the same store.

    A job that creates two stores or more makes them durable once, at its
    end, rather than at each of RocksDB's syncs (a dozen a new store): until
    then a marker lies beside each, ``.<store>.unsynced``. Should the job not
    finish, the next restore of such a store keeps it if only the process
    died, and wipes it to restore it from the start if the machine went down.

    With ``open_stores`` each store is taken from there if it is open, and
    kept there afterwards: the next restore of it opens nothing, and a replay
    leaves it unflushed (a key-value store's every batch holds its offset, a
    window or session store keeps its offset in memory until flushed, so a
    crash loses a suffix, never vouches for missing data). Before recording a
    store's offsets anywhere else, flush it (``open_stores.flush(path)``); close
    it there before opening it in any other way. A store goes back there after
    a failed restore too, as its offset describes it. From Kafka's native
    fetcher, the partitions of stores kept open at most 1,000 offsets below the
    last stable offset (a standby's round) are fetched from the job's start,
    together: one Fetch per broker names them all, rather than one each at its
    restore's turn.
    """
    if threads is None:
        threads = min(len(specs), os.cpu_count() or 1)
    if threads < 1 and specs:
        raise ValueError(f"threads must be >= 1, got {threads}")
    paths = [p if isinstance(p := s.store_path, Path) else Path(p) for s in specs]
    if len({_store_identity(p) for p in paths}) != len(paths):
        raise ValueError("restore_many: two specs name the same store; restore each store once")
    for s in specs:
        _check_log(s.changelog)
        check_format(s.format)
    # A spec's partition is a TopicPartition since its construction; its path becomes a Path.
    specs = [s if s.store_path is p else replace(s, store_path=p) for p, s in zip(paths, specs, strict=True)]
    # The topic id recorded beside each store not kept open (one kept open had its own read when it
    # was first restored in this process, and is held to what its client last read since).
    checked = [False] * len(specs)
    recorded: list[str | None] = [None] * len(specs)
    if any(topic_ids.is_native(s.changelog) for s in specs):
        kept = {str(p) for p in open_stores.paths()} if open_stores is not None else set()
        checked = [str(p) not in kept for p in paths]
        recorded = [
            topic_ids.held_topic_id(s.changelog, s.tp, p) if c else None
            for p, s, c in zip(paths, specs, checked, strict=True)
        ]
        specs = [
            replace(s, topic_id=r) if s.topic_id is None and r is not None else s
            for s, r in zip(specs, recorded, strict=True)
        ]
    out = _native.restore_many(specs, max(threads, 1), open_stores)
    results = []
    for p, s, c, r, outcome in zip(paths, specs, checked, recorded, out, strict=True):
        tp = s.tp
        if isinstance(outcome, _native.RestoreOutcome):
            if c:
                topic_ids.record(p, tp, r, outcome.topic_id)
            results.append(_result(tp, p, outcome))
        else:
            err = outcome
            if not isinstance(err, StateStoreError):
                wrapped = RestoreError(f"restoring store {p} from {tp} failed: {err!r}", path=p)
                wrapped.__cause__ = err
                err = wrapped
            results.append(
                RestoreResult(
                    tp=tp,
                    store_path=p,
                    mode=s.mode,
                    start_offset=OFFSET_UNKNOWN,
                    end_offset=OFFSET_UNKNOWN,
                    records_applied=0,
                    records_skipped=SkippedRecords(),
                    bytes_read=0,
                    seconds=0.0,
                    offset=None,
                    error=err,
                )
            )
    return results


__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "DEFAULT_PROGRESS_INTERVAL",
    "MODES",
    "STORE_FORMATS",
    "HasLogDir",
    "LogLike",
    "OpenStores",
    "RestoreListener",
    "RestoreResult",
    "RestoreSpec",
    "SkippedRecords",
    "restore_many",
    "restore_store",
]
