"""The record collector: the one producer of a task manager (changelog writes, and an application's output)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from statestore.changelog.protocol import Changelog, ChangelogProducer, DeferredOffsets, Header
from statestore.errors import TransactionStateError
from statestore.ids import TopicPartition


class RecordCollector:
    """The task manager's changelog producer: every store write of every active task goes through it.

    Under exactly-once it is transactional (one transactional id per state
    directory process id, so a restarted process fences its predecessor and
    aborts what it left open) and a transaction is begun by the first write
    after a commit. An application runner sends its output records and its
    input positions through the same producer (:meth:`send_record`,
    :meth:`send_offsets`), so one transaction holds all three.
    """

    def __init__(self, changelog: Changelog, transactional_id: str | None) -> None:
        self._changelog = changelog
        self._transactional_id = transactional_id
        self.producer: ChangelogProducer = changelog.producer(transactional_id)
        self.transactional = transactional_id is not None

    def _begin_if_needed(self) -> None:
        if self.transactional and not self.producer.in_transaction:
            self.producer.begin()

    def send(
        self, tp: TopicPartition, key: bytes, value: bytes | None, *, timestamp: int | None = None
    ) -> int:
        """Send one change and return its offset (beginning a transaction if needed)."""
        self._begin_if_needed()
        return self.producer.send(tp.topic, tp.partition, key, value, timestamp=timestamp)

    def send_record(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header] | None = None,
        *,
        timestamp: int | None = None,
    ) -> None:
        """Send one output record (``partition=-1``: the partitioner chooses), in the open transaction."""
        self._begin_if_needed()
        self.producer.send(topic, partition, key, value, headers, timestamp=timestamp)

    def send_offsets(self, offsets: Mapping[TopicPartition, int], group_metadata: Any) -> None:
        """Exactly-once: add a consumer group's input positions to the transaction (beginning one if needed)."""
        if not self.transactional:
            raise TransactionStateError("send_offsets needs a transactional producer (exactly-once)")
        send = getattr(self.producer, "send_offsets", None)
        if send is None:
            raise TransactionStateError(f"{type(self.producer).__name__} cannot commit consumer offsets")
        self._begin_if_needed()
        send(offsets, group_metadata)

    def abort_everywhere(
        self, written: Iterable[TopicPartition], inputs: Iterable[TopicPartition], group_metadata: Any
    ) -> bool:
        """Exactly-once, with no transaction open: a transaction that writes an empty record (key
        ``b""``, no value) to each partition of ``written`` and adds offsets of ``inputs``, aborted.
        Its abort markers, under this producer's id, end whatever transaction of that id a
        partition still holds open, aborted: data a broker left without its end marker, and an
        offset commit the group coordinator left pending -- what Kafka 4.4's abort of an expired
        transaction racing the client's commit of it left behind, holding every ``read_committed``
        reader (and restore) of those partitions at that offset, and which a later commit of this
        producer would have committed with its own. Nothing is committed. Returns whether it ran."""
        if not self.transactional or self.producer.in_transaction:
            return False
        send_offsets = getattr(self.producer, "send_offsets", None)
        if send_offsets is None:
            return False
        self.producer.begin()
        try:
            for tp in written:
                self.producer.send(tp.topic, tp.partition, b"", None)
            self.producer.flush()  # delivered: each partition is in the transaction
            send_offsets({tp: 0 for tp in inputs}, group_metadata)
        finally:
            self.producer.abort()
        return True

    @property
    def failed(self) -> bool:
        """Whether the producer is dead (fatal or fenced) and must be replaced (:meth:`renew`)."""
        return bool(getattr(self.producer, "fatal", False))

    def renew(self) -> None:
        """Close the producer and make a new one with the same transactional id.

        Its ``init_transactions`` fences the old client and aborts what it left
        open; the tasks go on from their last committed state.
        """
        try:
            self.producer.close()
        finally:
            self.producer = self._changelog.producer(self._transactional_id)

    def commit(self) -> dict[TopicPartition, int]:
        """Make everything sent durable and visible: commit the transaction, or flush.

        Returns the offsets learnt on delivery (a Kafka producer's ``send``
        returns -1), by partition; empty for the segment log.
        """
        if self.transactional:
            if self.producer.in_transaction:
                self.producer.commit()
        else:
            self.producer.flush()
        return self.producer.take_offsets() if isinstance(self.producer, DeferredOffsets) else {}

    def abort(self) -> None:
        """Abort the open transaction (exactly-once); at-least-once has nothing to abort."""
        if self.transactional and self.producer.in_transaction:
            self.producer.abort()

    def close(self) -> None:
        """Flush what is buffered; an open transaction stays open (its successor aborts it)."""
        self.producer.close()


__all__ = ["RecordCollector"]
