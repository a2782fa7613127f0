"""Work items and result rows of a restore of many stores, both built here and only here.

A :class:`PartitionWork` names one store of one task and its changelog
partition; planning (:mod:`statestore.restore.planning`) makes them, the engines
(``statestore restore``'s threads, :func:`statestore.restore.spark.restore_on_spark`)
restore them and answer with one :class:`RestoreRow` each. The row's
constructors below are the only places rows are made, so every engine fills
the same fields the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from statestore.ids import TaskId, TopicPartition, changelog_topic

if TYPE_CHECKING:
    from statestore.restore.engine import RestoreResult
    from statestore.state.lag import Lag

#: Columns of the result rows, in order, with their Spark SQL types.
RESULT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("task_id", "string"),
    ("store", "string"),
    ("topic", "string"),
    ("partition", "int"),
    ("start_offset", "bigint"),
    ("end_offset", "bigint"),
    ("records_applied", "bigint"),
    ("records_skipped", "bigint"),
    ("bytes_read", "bigint"),
    ("seconds", "double"),
    ("mode", "string"),
    ("status", "string"),
    ("error", "string"),
    ("lag", "bigint"),
    ("offset_lag", "bigint"),
    ("attempts", "int"),
    ("failed_attempts", "string"),
)


@dataclass(frozen=True)
class PartitionWork:
    """One unit of work: a store of a task and its changelog partition."""

    store: str
    task_id: TaskId
    tp: TopicPartition

    @classmethod
    def of(cls, application_id: str, store: str, partition: int, subtopology: int = 0) -> PartitionWork:
        """The work of ``store``'s partition ``partition``: task ``<subtopology>_<partition>``, its changelog."""
        return cls(
            store,
            TaskId(subtopology, partition),
            TopicPartition(changelog_topic(application_id, store), partition),
        )

    def describe(self) -> str:
        """``"task 0_3 store counts (app-counts-changelog-3)"``: how errors name this work."""
        return f"task {self.task_id} store {self.store} ({self.tp})"


class RestoreRow(NamedTuple):
    """The outcome of restoring one store's changelog partition: one result row (:data:`RESULT_COLUMNS`)."""

    task_id: str
    store: str
    topic: str
    partition: int
    #: First offset read; None when the restore failed before reading.
    start_offset: int | None
    #: Exclusive end offset reached; None when the restore failed before reading.
    end_offset: int | None
    records_applied: int
    #: Aborted, control and null-key records stepped over.
    records_skipped: int
    bytes_read: int
    #: Wall time of the attempt, lock wait included.
    seconds: float
    #: ``"replay"`` or ``"bulk"`` (the mode asked for, when the restore failed early).
    mode: str
    #: ``"ok"`` or ``"failed"``.
    status: str
    #: Why it failed (names the file, task and offset where known); None when ok.
    error: str | None
    #: Committed records past the restored store's offset once done (appended meanwhile); None: unknown.
    lag: int | None = None
    #: Offsets from the store's next offset to the log end (markers and aborted records included).
    offset_lag: int | None = None
    #: Attempts made at this partition, this row's included (Spark retries a failed task).
    attempts: int = 1
    #: The attempts before this row's that failed: ``"attempt 1 on <host> (executor 0): <why>"``, one a line.
    failed_attempts: str | None = None

    @property
    def ok(self) -> bool:
        """True when the restore completed."""
        return self.status == "ok"

    @classmethod
    def restored(
        cls,
        work: PartitionWork,
        result: RestoreResult,
        *,
        seconds: float | None = None,
        lag: Lag | None = None,
        attempts: int = 1,
    ) -> RestoreRow:
        """The row of a restore that completed: ``result`` and the store's lag once done (None: unknown)."""
        return cls(
            task_id=str(work.task_id),
            store=work.store,
            topic=work.tp.topic,
            partition=work.tp.partition,
            start_offset=result.start_offset,
            end_offset=result.end_offset,
            records_applied=result.records_applied,
            records_skipped=result.records_skipped.total,
            bytes_read=result.bytes_read,
            seconds=result.seconds if seconds is None else seconds,
            mode=result.mode,
            status="ok",
            error=None,
            lag=None if lag is None else lag.records,
            offset_lag=None if lag is None else lag.offsets,
            attempts=attempts,
        )

    @classmethod
    def failed(
        cls,
        work: PartitionWork,
        error: str,
        *,
        mode: str,
        seconds: float,
        records_applied: int = 0,
        records_skipped: int = 0,
        bytes_read: int = 0,
        attempts: int = 1,
    ) -> RestoreRow:
        """The row of a restore that failed; ``error`` is prefixed with the work's task, store and
        partition unless it already names the task."""
        if f"task {work.task_id}" not in error:
            error = f"{work.describe()}: {error}"
        return cls(
            task_id=str(work.task_id),
            store=work.store,
            topic=work.tp.topic,
            partition=work.tp.partition,
            start_offset=None,
            end_offset=None,
            records_applied=records_applied,
            records_skipped=records_skipped,
            bytes_read=bytes_read,
            seconds=seconds,
            mode=mode,
            status="failed",
            error=error,
            attempts=attempts,
        )

    def with_failed_attempts(self, failed_attempts: str | None) -> RestoreRow:
        """This row, saying which earlier attempts failed and why (the driver learns it from Spark)."""
        return self._replace(failed_attempts=failed_attempts)


assert tuple(RestoreRow._fields) == tuple(c for c, _ in RESULT_COLUMNS)

__all__ = ["RESULT_COLUMNS", "PartitionWork", "RestoreRow"]
