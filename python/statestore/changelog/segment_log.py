"""The embedded changelog: a Kafka-format segment log on a local or shared filesystem.

Partitions live in ``<log_dir>/<topic>-<partition>/`` as Kafka lays them out
(``<20-digit base offset>.log`` holding RecordBatch v2, plus a sparse
``.index``), so archived Kafka partition directories read with the same code.
Producers may be transactional: their records become visible to
``read_committed`` readers only once committed, and a newer producer with the
same transactional id fences the old one and aborts what it left open.

This module is a thin typed layer over the Rust data plane
(``statestore._native``): encoding, decoding, file I/O and transaction
filtering happen there with the GIL released, a chunk of records per call.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

from statestore import _native
from statestore._native import LogBatch
from statestore.changelog.protocol import ClosesOnCleanExit, Header
from statestore.ids import PartitionLike, TopicPartition, coerce_tp

#: Default segment size (Kafka's ``segment.bytes``): 1 GiB.
DEFAULT_SEGMENT_BYTES = 1 << 30

Isolation = Literal["read_committed", "read_uncommitted"]
Compression = Literal["none", "gzip", "snappy", "lz4", "zstd"]

_POLL_RECORDS = 10_000
_POLL_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class Record:
    """One data record of a changelog partition. A ``None`` value is a tombstone."""

    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: tuple[Header, ...] = ()


class LogReader:
    """A cursor over one partition, for Python callers.

    ``position`` is the next offset to read. It steps over transaction markers
    and aborted records, so a caller knows it has caught up when ``position``
    reaches the end (or last stable) offset -- never by the last record's
    offset. ``read_committed`` stops at the first open transaction.
    """

    def __init__(self, log_dir: Path, tp: TopicPartition, start_offset: int, isolation: Isolation) -> None:
        self._core = _native.LogReaderCore(str(log_dir), tp.topic, tp.partition, start_offset, isolation)
        self.topic_partition = tp

    @property
    def position(self) -> int:
        """Next offset to read."""
        return int(self._core.position)

    @property
    def skipped(self) -> tuple[int, int]:
        """``(aborted, control)`` records stepped over so far."""
        aborted, control = self._core.skipped
        return int(aborted), int(control)

    def poll(
        self, max_records: int = _POLL_RECORDS, max_bytes: int = _POLL_BYTES, end: int | None = None
    ) -> list[Record]:
        """The next records (at most ``max_records``, about ``max_bytes`` of log, below ``end``).

        An empty list means nothing more is readable now.
        """
        rows = self._core.poll(max_records, max_bytes, end)
        return [Record(o, k, v, ts, tuple(h)) for (o, k, v, ts, h) in rows]

    def __iter__(self) -> Iterator[Record]:
        while True:
            batch = self.poll()
            if not batch:
                return
            yield from batch


class Producer(ClosesOnCleanExit):
    """Writes records to the log; transactional when made with a transactional id.

    Records are buffered into multi-record batches; ``send`` returns the
    record's offset at once. ``flush`` writes buffered records. A
    transactional producer sends only between ``begin()`` and ``commit()`` or
    ``abort()``; if a newer producer with the same transactional id exists,
    every call raises ``ProducerFencedError``.
    """

    def __init__(self, core: _native.ProducerCore, transactional_id: str | None) -> None:
        self._core = core
        self.transactional_id = transactional_id

    @property
    def producer_id(self) -> int:
        """The producer id (-1 for a plain producer)."""
        return int(self._core.identity()[0])

    @property
    def epoch(self) -> int:
        """The producer epoch (-1 for a plain producer)."""
        return int(self._core.identity()[1])

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open."""
        return bool(self._core.in_transaction())

    def send(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header] | None = None,
        *,
        timestamp: int | None = None,
    ) -> int:
        """Buffer one record and return its offset. ``value=None`` writes a tombstone."""
        hs = list(headers) if headers else None
        return int(self._core.send(topic, partition, key, value, hs, timestamp))

    def send_many(
        self, topic: str, partition: int, records: Sequence[tuple[bytes | None, bytes | None]]
    ) -> int:
        """Buffer many ``(key, value)`` records in one call; returns the first one's offset."""
        return int(self._core.send_many(topic, partition, list(records)))

    def flush(self) -> None:
        """Write every buffered record to the segment files (and fsync when the log syncs)."""
        self._core.flush()

    def begin(self) -> None:
        """Open a transaction."""
        self._core.begin()

    def commit(self) -> None:
        """Commit the open transaction: a COMMIT marker on every partition it wrote."""
        self._core.commit()

    def abort(self) -> None:
        """Abort the open transaction: an ABORT marker on every partition it wrote."""
        self._core.abort()

    def close(self) -> None:
        """Flush what is buffered. An open transaction stays open (a later producer or expiry aborts it)."""
        self._core.flush()


class SegmentLog:
    """A changelog of Kafka-format segment files under ``log_dir``.

    Readers take no lock and may run while producers append. Writers of one
    partition are excluded across processes by a lock file in the partition
    directory (``LockError`` names it); inside a process, all producers of all
    ``SegmentLog`` objects share one writer per partition.
    """

    def __init__(
        self,
        log_dir: str | Path,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        sync: bool = True,
        compression: Compression = "none",
    ) -> None:
        self.log_dir: Path = Path(log_dir)
        self.segment_bytes = segment_bytes
        self._core = _native.SegmentLogCore(str(self.log_dir), segment_bytes, sync, compression)

    def producer(self, transactional_id: str | None = None) -> Producer:
        """A producer. With ``transactional_id``, a transactional one that fences earlier producers of that id."""
        return Producer(self._core.producer(transactional_id), transactional_id)

    def reader(
        self, tp: PartitionLike, start_offset: int | None = None, *, isolation: Isolation = "read_committed"
    ) -> LogReader:
        """A cursor over ``tp`` from ``start_offset`` (default: the start of the log)."""
        # Offsets below the start of the log begin at its first record.
        return LogReader(self.log_dir, coerce_tp(tp), 0 if start_offset is None else start_offset, isolation)

    def read(
        self,
        tp: PartitionLike,
        start_offset: int | None = None,
        *,
        end_offset: int | None = None,
        isolation: Isolation = "read_committed",
        max_records: int | None = None,
        max_bytes: int | None = None,
    ) -> Iterator[Record]:
        """Yield the records of ``tp`` from ``start_offset`` to ``end_offset`` (exclusive; default: no bound).

        ``read_committed`` (the default) yields no aborted records, no control
        records and nothing at or beyond the last stable offset. ``max_records``
        and ``max_bytes`` (of keys and values) bound what is yielded.
        """
        r = self.reader(tp, start_offset, isolation=isolation)
        left = max_records if max_records is not None else -1
        budget = max_bytes if max_bytes is not None else -1
        while left != 0 and budget != 0:
            n = _POLL_RECORDS if left < 0 else min(left, _POLL_RECORDS)
            batch = r.poll(n, end=end_offset)
            if not batch:
                return
            for rec in batch:
                yield rec
                if left > 0:
                    left -= 1
                if budget >= 0:
                    budget = max(0, budget - len(rec.key or b"") - len(rec.value or b""))
                    if budget == 0:
                        return

    def offsets(self, tp: PartitionLike) -> tuple[int, int, int]:
        """``(start, end, last_stable)`` offsets of ``tp`` (all 0 for a partition with no files)."""
        t = coerce_tp(tp)
        b = _native.log_offsets(str(self.log_dir), t.topic, t.partition)
        return b.start, b.end, b.last_stable

    def start_offset(self, tp: PartitionLike) -> int:
        """The first offset in the log of ``tp``."""
        return self.offsets(tp)[0]

    def end_offset(self, tp: PartitionLike) -> int:
        """The log end offset of ``tp``: the next offset to be written."""
        return self.offsets(tp)[1]

    def last_stable_offset(self, tp: PartitionLike) -> int:
        """First offset of the oldest open transaction of ``tp``, else the end offset."""
        return self.offsets(tp)[2]

    def committed_records(self, tp: PartitionLike, start: int, end: int) -> int:
        """How many committed data records of ``tp`` lie in ``[start, end)`` (markers and aborted records are not)."""
        t = coerce_tp(tp)
        if end <= start:
            return 0
        return _native.log_committed_stats(str(self.log_dir), t.topic, t.partition, start, end).records

    def recover(self, tp: PartitionLike) -> int:
        """Open ``tp`` for writing now: take its writer lock, cut a torn tail, rebuild its index.

        Producers do this on their first send; calling it directly checks a
        partition after a crash. Returns the log end offset.
        """
        t = coerce_tp(tp)
        return int(self._core.recover(t.topic, t.partition))

    def create(self) -> None:
        """Create the log directory if it does not exist (an empty log is a valid one)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)

    def abort_expired_transactions(self, timeout_ms: int) -> list[str]:
        """Abort transactions open longer than ``timeout_ms`` and finish ones a crash interrupted.

        What a broker's transaction coordinator does, so that a crashed
        producer cannot hold back the last stable offset forever. The
        producers of aborted transactions are fenced. Returns their
        transactional ids.
        """
        return list(self._core.abort_expired_transactions(timeout_ms))

    def dump(
        self, tp: PartitionLike, *, records: bool = False, isolation: Isolation = "read_committed"
    ) -> list[LogBatch]:
        """The batches of ``tp`` as kafka-dump-log shows them (and their records when asked).

        Each :class:`LogBatch` holds the batch header's fields, whether its CRC
        is valid, its control type and transaction outcome, and with
        ``records`` the ``(offset, key, value, timestamp, headers)`` of each
        record a consumer of ``isolation`` would get.
        """
        t = coerce_tp(tp)
        return list(_native.log_dump(str(self.log_dir), t.topic, t.partition, records, isolation))

    def partitions(self) -> list[TopicPartition]:
        """The partitions that have a directory under ``log_dir``."""
        out = []
        if self.log_dir.is_dir():
            for d in self.log_dir.iterdir():
                if d.is_dir():
                    try:
                        out.append(TopicPartition.parse(d.name))
                    except ValueError:
                        continue
        return sorted(out)

    def flush(self) -> None:
        """Write every record buffered by this log's producers."""
        self._core.flush()

    def close(self) -> None:
        """Flush and release this object's partition writers (and their locks, once unused in this process)."""
        self._core.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


__all__ = ["DEFAULT_SEGMENT_BYTES", "LogBatch", "LogReader", "Producer", "Record", "SegmentLog"]
