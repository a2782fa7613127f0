"""Helpers shared by the task, updater and task-manager tests and their child processes."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from statestore import SegmentLog, TaskId, TopicPartition
from statestore.processing.task_manager import TaskManager
from statestore.processing.updater import StandbyUpdateListener, StateRestoreListener, SuspendReason
from statestore.state.directory import StateDirectory

APP = "app"
STORE = "s"


def changelog_tp(task: TaskId, store: str = STORE) -> TopicPartition:
    """The changelog partition of ``store`` of ``task``."""
    return TopicPartition(f"{APP}-{store}-changelog", task.partition)


def produce(
    log: SegmentLog,
    tp: TopicPartition,
    records: Iterable[tuple[bytes | None, bytes | None]],
    *,
    transactional_id: str | None = None,
    commit: bool = True,
) -> list[int]:
    """Write records to ``tp`` (in one transaction with ``transactional_id``); return their offsets."""
    producer = log.producer(transactional_id)
    if transactional_id is not None:
        producer.begin()
    offsets = [producer.send(tp.topic, tp.partition, k, v) for k, v in records]
    if transactional_id is not None and commit:
        producer.commit()
    else:
        producer.flush()
    return offsets


def manager(root: Path, guarantee: str, offsets: str = "store", **kw: Any) -> TaskManager:
    """A TaskManager over ``root/state`` and ``root/log`` with the one store ``s``."""
    log = kw.pop("log", None) or SegmentLog(root / "log", sync=False)
    return TaskManager(
        StateDirectory(root / "state", APP), log, [STORE], guarantee=guarantee, offsets=offsets, **kw
    )


def close_all(tm: TaskManager, *, clean: bool = True) -> None:
    """Close the manager and its state directory."""
    tm.close(clean=clean)
    tm.directory.close()


class Events(StateRestoreListener, StandbyUpdateListener):
    """Records every listener call as a tuple, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def on_restore_start(
        self, tp: TopicPartition, store_name: str, start_offset: int, end_offset: int
    ) -> None:
        self.calls.append(("start", tp, store_name, start_offset, end_offset))

    def on_batch_restored(
        self, tp: TopicPartition, store_name: str, batch_end_offset: int, num_restored: int
    ) -> None:
        self.calls.append(("batch", tp, store_name, batch_end_offset, num_restored))

    def on_restore_end(self, tp: TopicPartition, store_name: str, total_restored: int) -> None:
        self.calls.append(("end", tp, store_name, total_restored))

    def on_restore_suspended(self, tp: TopicPartition, store_name: str, total_restored: int) -> None:
        self.calls.append(("suspended", tp, store_name, total_restored))

    def on_update_start(self, tp: TopicPartition, store_name: str, starting_offset: int) -> None:
        self.calls.append(("update_start", tp, store_name, starting_offset))

    def on_batch_loaded(
        self,
        tp: TopicPartition,
        store_name: str,
        task_id: TaskId,
        batch_end_offset: int,
        batch_size: int,
        current_end_offset: int,
    ) -> None:
        self.calls.append(("loaded", tp, store_name, batch_end_offset, batch_size))

    def on_update_suspended(
        self,
        tp: TopicPartition,
        store_name: str,
        store_offset: int,
        current_end_offset: int,
        reason: SuspendReason,
    ) -> None:
        self.calls.append(("update_suspended", tp, store_name, store_offset, reason))

    def kinds(self) -> list[str]:
        """The names of the calls, in order."""
        return [c[0] for c in self.calls]

    def total_restored(self) -> int:
        """Sum of ``total_restored`` over every restore end."""
        return sum(c[3] for c in self.calls if c[0] == "end")
