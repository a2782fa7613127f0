"""What a changelog must offer the task manager, its tasks, the state updater and the restore engine.

Two implementations exist: :class:`statestore.changelog.segment_log.SegmentLog` (the embedded
segment log) and :class:`statestore.changelog.kafka.KafkaChangelog` (a Kafka cluster,
fetched natively by the restore engine). Everything above them -- policies, tasks, the
updater, the restore engine -- is typed against these protocols only, so it
behaves the same on both.

Offsets follow Kafka: the *end* offset is the next offset to be written, the
*last stable* offset the first offset of the oldest open transaction (else the
end), and transaction markers occupy offsets. A changelog is caught up when a
reader's position reaches the end offset, never when a record at ``end - 1``
was seen.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self, runtime_checkable

from statestore.ids import PartitionLike, TopicPartition

if TYPE_CHECKING:
    from statestore.changelog.segment_log import Record

#: A record header: its name and its value (``None``: a header without a value).
Header = tuple[str, bytes | None]

#: Kafka's default ``transaction.timeout.ms``: how long a transactional producer's
#: transaction may stay open before the broker aborts it.
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000


class ClosesOnCleanExit:
    """A producer usable in ``with``: closed when the block ends without an exception.

    On an exception it is left open, so the caller decides (abort the open
    transaction, or let the next producer of the same id fence and abort it).
    """

    def close(self) -> None:
        """Flush and release what the producer holds."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()


class ChangelogProducer(Protocol):
    """Writes store changes to a changelog; transactional when made with a transactional id.

    A transactional producer sends only between :meth:`begin` and
    :meth:`commit` or :meth:`abort`; a newer producer with the same
    transactional id fences it (``ProducerFencedError``).
    """

    transactional_id: str | None

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open."""
        ...

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
        """Send one record; returns its offset, or -1 when the offset is only known once delivered.

        A producer that returns -1 implements :class:`DeferredOffsets`.
        """
        ...

    def flush(self) -> None:
        """Make every record sent so far durable in the changelog."""
        ...

    def begin(self) -> None:
        """Open a transaction."""
        ...

    def commit(self) -> None:
        """Commit the open transaction (its records become visible to read_committed readers)."""
        ...

    def abort(self) -> None:
        """Abort the open transaction."""
        ...

    def close(self) -> None:
        """Flush; an open transaction stays open (the next producer of the id, or a timeout, aborts it)."""
        ...


@runtime_checkable
class DeferredOffsets(Protocol):
    """A producer whose offsets are known only once records are delivered (Kafka)."""

    def take_offsets(self) -> dict[TopicPartition, int]:
        """Offset of the last record delivered per partition since the previous call.

        Complete for every record sent before the last successful ``flush``
        or ``commit``.
        """
        ...


class Changelog(Protocol):
    """A changelog as the task manager, tasks, updater and restore engine use it."""

    def producer(self, transactional_id: str | None = None) -> ChangelogProducer:
        """A producer; with ``transactional_id``, a transactional one that fences earlier ones of that id."""
        ...

    def offsets(self, tp: PartitionLike) -> tuple[int, int, int]:
        """``(start, end, last_stable)`` offsets of ``tp``."""
        ...

    def start_offset(self, tp: PartitionLike) -> int:
        """The first offset still in the log of ``tp``."""
        ...

    def end_offset(self, tp: PartitionLike) -> int:
        """The log end offset of ``tp``: the next offset to be written."""
        ...

    def last_stable_offset(self, tp: PartitionLike) -> int:
        """First offset of the oldest open transaction of ``tp``, else the end offset."""
        ...

    def read(
        self, tp: PartitionLike, start_offset: int | None = None, *, end_offset: int | None = None
    ) -> Iterator[Record]:
        """The committed records of ``tp`` from ``start_offset`` (default: the log start) to ``end_offset``
        (exclusive; default: the last stable offset): no aborted records, no markers."""
        ...

    def committed_records(self, tp: PartitionLike, start: int, end: int) -> int:
        """How many committed data records of ``tp`` lie in ``[start, end)``: what a restore would apply.

        Aborted records and transaction markers occupy offsets but are not
        counted, so this is a store's lag in records, where ``end - start`` is
        only its distance in offsets.
        """
        ...

    def abort_expired_transactions(self, timeout_ms: int) -> list[str]:
        """Abort transactions open longer than ``timeout_ms``; returns their transactional ids.

        A Kafka broker's transaction coordinator does this itself (there it
        returns an empty list).
        """
        ...

    def create(self) -> None:
        """Make the changelog exist, empty, if it does not yet (a new application's changelog).

        The segment log creates its directory; on Kafka the changelog topics
        are created by :func:`statestore.changelog.kafka.ensure_changelog_topics`.
        """
        ...


@runtime_checkable
class FedChangelog(Protocol):
    """A changelog the restore engine reads through Python, a chunk of records per call (the fallback of
    ``KafkaChangelog`` for configurations its native fetcher cannot serve).

    ``restore_feed`` returns an object with ``poll(max_records) -> list`` of
    message objects with C-level ``error()``, ``offset()``, ``key()``,
    ``value()`` and ``timestamp()`` methods, and ``headers()`` (a list of ``(str, bytes | None)``
    or None, read for a header-aware store only) (confluent-kafka's ``Message``), ``on_error(message)
    -> bool`` (True at the end of the partition; raises for real errors),
    ``position() -> int | None`` and ``close()``.
    """

    #: Seconds without any record or progress after which a restore gives up.
    restore_stall_timeout: float

    def restore_bounds(self, topic: str, partition: int) -> tuple[int, int, int]:
        """``(start, end, last_stable)`` of the partition, for the engine."""
        ...

    def restore_feed(self, topic: str, partition: int, start: int) -> Any:
        """A read_committed feed positioned at ``start``."""
        ...


def changelog_argument(changelog: Any, log: Any, where: str) -> Any:
    """The changelog given as ``changelog``, or under its old keyword ``log`` with a deprecation warning.

    ``changelog`` is the parameter's name throughout the public API; ``log`` was
    its name in ``restore_store``, ``RestoreSpec`` and ``store_lag`` before.
    Callers give the result their own parameter's type.
    """
    if log is not None:
        warnings.warn(
            f"{where}: the keyword 'log' is deprecated, use 'changelog'", DeprecationWarning, stacklevel=3
        )
        if changelog is not None:
            raise TypeError(f"{where}: give the changelog once, as 'changelog' (not also as 'log')")
        changelog = log
    if changelog is None:
        raise TypeError(f"{where}: missing the changelog ('changelog')")
    return changelog


__all__ = [
    "Changelog",
    "ChangelogProducer",
    "DeferredOffsets",
    "FedChangelog",
    "PartitionLike",
    "changelog_argument",
]
