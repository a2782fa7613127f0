"""The record collector: the one changelog producer of a task manager."""

from __future__ import annotations

from statestore.changelog import Changelog, ChangelogProducer, DeferredOffsets
from statestore.ids import TopicPartition


class RecordCollector:
    """The task manager's changelog producer: every store write of every active task goes through it.

    Under exactly-once it is transactional (one transactional id per state
    directory process id, so a restarted process fences its predecessor and
    aborts what it left open) and a transaction is begun by the first write
    after a commit.
    """

    def __init__(self, changelog: Changelog, transactional_id: str | None) -> None:
        self.producer: ChangelogProducer = changelog.producer(transactional_id)
        self.transactional = transactional_id is not None

    def send(self, tp: TopicPartition, key: bytes, value: bytes | None) -> int:
        """Send one change and return its offset (beginning a transaction if needed)."""
        if self.transactional and not self.producer.in_transaction:
            self.producer.begin()
        return self.producer.send(tp.topic, tp.partition, key, value)

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
