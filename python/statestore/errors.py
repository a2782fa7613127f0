"""One exception hierarchy for everything statestore raises.

Every error names what it is about -- the file, the task, the changelog
partition and the offset where known -- and, where there is one, what to do
about it. The Rust data plane raises these same classes (``rust/src/py/errors.rs``
maps each of its errors to one of them and fills the fields below), so callers
catch one family whatever layer failed.
"""

from __future__ import annotations

from pathlib import Path


class StateStoreError(Exception):
    """Root of every error statestore raises.

    ``path``, ``task_id``, ``topic``/``partition`` and ``offset`` are filled in
    when the error is about a particular file, task, changelog partition or
    offset, so tools can act on them without parsing the message.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        task_id: object | None = None,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        super().__init__(message)
        self.path = str(path) if path is not None else None
        self.task_id = task_id
        self.topic = topic
        self.partition = partition
        self.offset = offset


class CheckpointError(StateStoreError):
    """A `.checkpoint` file is malformed or cannot be read or written."""


class LockError(StateStoreError):
    """A lock (process, task or log partition) is held elsewhere or was lost."""


class LogError(StateStoreError):
    """A problem with the changelog segment log."""


class ChangelogUnavailableError(LogError):
    """The changelog's cluster gave no answer in time (brokers down, stalled or unreachable, a
    leader election that outlasted the request budget). Nothing is known to be wrong with the
    changelog or the stores: asking again later may succeed, and a restore it stopped goes on from
    where it stood. An application retries within its ``task_timeout``."""


class CorruptLogError(LogError):
    """A segment holds bytes that are not a valid record batch (bad CRC or header)."""


class UnsupportedCompressionError(LogError):
    """A record batch uses a compression codec this build cannot decode."""


class ProducerFencedError(LogError):
    """A newer producer with the same transactional id has taken over; this one must stop."""


class TransactionStateError(LogError):
    """A transactional call was made in the wrong order (e.g. commit without begin)."""


class TransactionInDoubtError(LogError):
    """A transaction's commit kept failing with retriable errors (e.g. its coordinator unreachable)
    and may still commit or abort: nobody can tell which yet. Asking the same producer's commit
    again settles it once the coordinator answers; failing that, the producer must be replaced (its
    successor's ``init_transactions`` waits until the transaction is settled). Either way what the
    transaction held must be learnt again from the changelog and the group coordinator."""


class StoreError(StateStoreError):
    """A RocksDB store could not be opened, read or written."""


class RestoreError(StateStoreError):
    """Restoring a store from its changelog failed; the store keeps its previous committed state."""


class TaskCorruptedError(StateStoreError):
    """A task's local state cannot be trusted; it must be wiped and restored from the changelog."""

    def __init__(self, message: str, *, task_ids: frozenset[object] = frozenset(), **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.task_ids = task_ids


class StoreCorruptedError(StoreError, TaskCorruptedError):
    """A store's files are damaged: RocksDB reported ``Corruption`` (a bad block checksum, a
    truncated, missing or unreadable table file, a damaged MANIFEST -- also when a background
    compaction found it), or the offsets column family holds bytes statestore never writes.

    It is a ``StoreError`` (the store failed) and a ``TaskCorruptedError`` (its task's local state
    cannot be trusted): the task manager closes the task dirty, wipes it and restores it from its
    changelog. ``task_ids`` names the task when the store knows it.
    """


class TopologyError(StateStoreError):
    """A topology description (the text Kafka Streams' ``Topology.describe()`` prints) does not
    parse, or disagrees with the changelogs or the state directory: ``path`` names the file and
    ``line`` the line (1-based) where known."""

    def __init__(self, message: str, *, line: int | None = None, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.line = line


class IllegalStateError(StateStoreError):
    """A lifecycle transition or call that is not legal in the current state."""


class ClusterError(StateStoreError):
    """A Spark cluster cannot run a restore: its master does not answer, or no executor joined in time."""


class ApplicationError(StateStoreError):
    """A stateful application (``statestore.app``) cannot start or go on: its topics do not fit it
    (a missing input or output topic, input topics with different partition counts), or its
    configuration is wrong."""


class ProcessingError(ApplicationError):
    """The application's processing function raised on a record: ``task_id``, ``topic``,
    ``partition`` and ``offset`` name the record. The open transaction was aborted, so nothing of
    it is visible or applied; the application stops, and a restart retries from the last commit."""


__all__ = [
    "ApplicationError",
    "CheckpointError",
    "ClusterError",
    "CorruptLogError",
    "IllegalStateError",
    "LockError",
    "LogError",
    "ProcessingError",
    "ProducerFencedError",
    "RestoreError",
    "StateStoreError",
    "StoreCorruptedError",
    "StoreError",
    "TaskCorruptedError",
    "TopologyError",
    "TransactionInDoubtError",
    "TransactionStateError",
    "UnsupportedCompressionError",
]
