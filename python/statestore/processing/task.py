"""Tasks and their lifecycle: one table of legal transitions, active and standby tasks.

A task owns the stores of one :class:`~statestore.ids.TaskId` through a
:class:`~statestore.state.state_manager.StateManager`. Its lifecycle is Kafka
Streams' (reference §5)::

    CREATED -> RESTORING, SUSPENDED
    RESTORING -> RUNNING, SUSPENDED
    RUNNING -> SUSPENDED
    SUSPENDED -> RESTORING, CLOSED
    CLOSED -> CREATED            (revive after corruption)

Every state change goes through :data:`TRANSITIONS`; anything else raises
:class:`~statestore.errors.IllegalStateError` naming the task and both states.

While a task restores (active) or is kept up to date (standby), its RocksDB
stores belong to the Rust restore engine: the rocksdict handles are closed,
because the two must never hold one RocksDB open at once. An active task
reopens them when restoration completes, just before it turns RUNNING.

Recycling (active <-> standby) hands the same state manager -- open stores,
task lock, in-memory offsets -- to a task of the other kind: no reopen, no
re-restore.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from statestore.changelog.protocol import Changelog
from statestore.errors import IllegalStateError, StoreError, TaskCorruptedError
from statestore.ids import SENTINEL_OFFSETS, TaskId, TopicPartition
from statestore.state.directory import StateDirectory
from statestore.state.policy import Event, Policy
from statestore.state.state_manager import StateManager
from statestore.state.store import STATUS_OPEN, Store, decode_timestamped

logger = logging.getLogger(__name__)


class TaskState(enum.Enum):
    """Lifecycle state of a task (Kafka's ``Task.State``)."""

    CREATED = "CREATED"
    """Built, nothing opened yet."""
    RESTORING = "RESTORING"
    """Locked and opened; its stores are being restored (active) or updated (standby)."""
    RUNNING = "RUNNING"
    """Active: processing. Standby: being kept up to date."""
    SUSPENDED = "SUSPENDED"
    """Committed and flushed, not processing; may resume or close."""
    CLOSED = "CLOSED"
    """Stores closed and lock released (or wiped); may be revived after corruption."""


#: The one table of legal transitions.
TRANSITIONS: Mapping[TaskState, frozenset[TaskState]] = {
    TaskState.CREATED: frozenset({TaskState.RESTORING, TaskState.SUSPENDED}),
    TaskState.RESTORING: frozenset({TaskState.RUNNING, TaskState.SUSPENDED}),
    TaskState.RUNNING: frozenset({TaskState.SUSPENDED}),
    TaskState.SUSPENDED: frozenset({TaskState.RESTORING, TaskState.CLOSED}),
    TaskState.CLOSED: frozenset({TaskState.CREATED}),
}


def check_transition(task_id: TaskId, kind: str, current: TaskState, target: TaskState) -> None:
    """Raise ``IllegalStateError`` unless ``current -> target`` is in :data:`TRANSITIONS`."""
    if target not in TRANSITIONS[current]:
        raise IllegalStateError(
            f"{kind} task {task_id}: illegal transition from {current.value} to {target.value} "
            f"(legal from {current.value}: {', '.join(sorted(s.value for s in TRANSITIONS[current])) or 'none'})",
            task_id=task_id,
        )


def unclean_status_is_corruption(policy: Policy) -> bool:
    """Whether a store found with status OPEN (the process died with it open) must be wiped.

    Decided by the policy table: a crash is a dirty close, so if a dirty close
    wipes (exactly-once with a checkpoint file), a store left OPEN may hold
    writes of transactions the changelog aborted (KAFKA-20685) and is corrupt.
    """
    return policy.decide(Event.CLOSE_DIRTY).wipe


class ChangelogSender(Protocol):
    """Where a task's store writes go on their way to the changelog (the task manager's producer)."""

    def send(
        self, tp: TopicPartition, key: bytes, value: bytes | None, *, timestamp: int | None = None
    ) -> int:
        """Send one change; return its changelog offset."""
        ...


@dataclass(frozen=True)
class ChangelogStore:
    """One logged store of a task as the restore engine sees it: name, changelog partition, path."""

    name: str
    tp: TopicPartition
    path: Path
    #: The store's format (``STORE_FORMATS``), which its restores write.
    format: str = "plain"


def build_state_manager(
    directory: StateDirectory,
    task_id: TaskId,
    policy: Policy,
    stores: Mapping[str, str] | Iterable[str],
    *,
    standby: bool,
) -> StateManager:
    """A state manager for ``task_id`` with the logged persistent stores ``stores`` registered
    (names, or names mapped to their formats; a bare name is a plain store)."""
    sm = StateManager(directory, task_id, policy, standby=standby)
    for name, fmt in store_formats(stores).items():
        sm.register(name, format=fmt)
    return sm


def store_formats(stores: Mapping[str, str] | Iterable[str]) -> dict[str, str]:
    """``stores`` as store name -> format: a mapping as it is, names as plain stores."""
    return dict(stores) if isinstance(stores, Mapping) else dict.fromkeys(stores, "plain")


class Task:
    """What active and standby tasks share: state, state manager, store handles, corruption checks.

    ``changelog`` is the log the stores are restored from; it is only read
    here (to validate offsets). Use :class:`ActiveTask` or
    :class:`StandbyTask`.
    """

    kind: ClassVar[str] = "task"

    def __init__(self, task_id: TaskId, state_manager: StateManager, changelog: Changelog) -> None:
        self.id = task_id
        self.state_manager = state_manager
        self.changelog = changelog
        self._state = TaskState.CREATED
        self._stores_released = False
        # The changelogs' (start, end) read when the state was opened, until the state updater takes them.
        self._ranges: dict[TopicPartition, tuple[int, int]] | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id}, {self._state.value})"

    # -- state ------------------------------------------------------------------------

    @property
    def state(self) -> TaskState:
        """The current lifecycle state."""
        return self._state

    def _transition(self, target: TaskState) -> None:
        check_transition(self.id, self.kind, self._state, target)
        logger.debug("%s task %s: %s -> %s", self.kind, self.id, self._state.value, target.value)
        self._state = target

    @property
    def policy(self) -> Policy:
        """The task's offsets policy."""
        return self.state_manager.policy

    # -- stores and offsets -------------------------------------------------------------

    def changelog_stores(self) -> list[ChangelogStore]:
        """The task's logged stores, in registration order."""
        sd = self.state_manager.directory
        formats = self.state_manager.store_formats()
        return [
            ChangelogStore(name, tp, sd.store_dir(self.id, name), formats[name])
            for name, tp in self.state_manager.changelog_partitions().items()
        ]

    def offsets(self) -> dict[TopicPartition, int | None]:
        """Changelog partition -> offset of the last applied record (None: nothing applied)."""
        return self.state_manager.offsets()

    def release_stores(self) -> None:
        """Close the rocksdict handles (cleanly) so the restore engine may open the stores."""
        if not self._stores_released:
            self.state_manager.release_stores()
            self._stores_released = True

    def acquire_stores(self) -> None:
        """Reopen the rocksdict handles after the restore engine is done with the stores."""
        if self._stores_released:
            self.state_manager.reopen_stores()
            self._stores_released = False

    @property
    def stores_released(self) -> bool:
        """Whether the stores currently belong to the restore engine."""
        return self._stores_released

    def _open_state(self) -> None:
        """Lock, open and load offsets (if not already done), check for corruption, release the stores.

        Raises ``TaskCorruptedError`` for local state that cannot be trusted:
        the state manager's own verdict (no offset for existing data under
        exactly-once), a store that fails to open, a store left OPEN by a
        crash when the policy says a crash means wipe, or an offset beyond
        the changelog's end or before its start. The changelogs' ranges are read first, so a
        cluster that does not answer (``ChangelogUnavailableError``) leaves nothing opened or
        locked, and the next try checks everything again.
        """
        sm = self.state_manager
        if not sm.initialized:
            ranges = {cs.tp: self.changelog.offsets(cs.tp)[:2] for cs in self.changelog_stores()}
            try:
                sm.initialize()
            except StoreError as e:
                raise TaskCorruptedError(
                    f"{self.kind} task {self.id}: a store failed to open ({e}); wiping the task to restore "
                    "it from its changelog",
                    task_ids=frozenset({self.id}),
                    task_id=self.id,
                    path=e.path,
                ) from e
            self._stores_released = False
            self._verify_local_state(ranges)
            self._ranges = ranges
        self.release_stores()

    def take_changelog_ranges(self) -> dict[TopicPartition, tuple[int, int]] | None:
        """The changelogs' ``(start, end)`` read when the task's state was opened, once (then None):
        the state updater starts the restore or update from them instead of asking the cluster a
        second time for every changelog of a new task."""
        ranges, self._ranges = self._ranges, None
        return ranges

    def _verify_local_state(self, ranges: Mapping[TopicPartition, tuple[int, int]]) -> None:
        sm = self.state_manager
        offsets = sm.offsets()
        for cs in self.changelog_stores():
            store = sm.store(cs.name)
            if not isinstance(store, Store):
                continue
            if store.previous_status == STATUS_OPEN and unclean_status_is_corruption(self.policy):
                raise self._corrupted(
                    f"store {cs.name} at {cs.path} was left open by a crash (status OPEN) under "
                    f"{self.policy.guarantee.value} with offsets in a checkpoint file; it may hold writes of "
                    "aborted transactions",
                    cs.path,
                    None,
                )
            start, end = ranges[cs.tp]
            if store.recorded_offset(cs.tp) in SENTINEL_OFFSETS:
                # Kafka Streams' "no offset yet": the engine restores from the changelog's start,
                # which it does for a store recording nothing (it would take -4 for a position).
                store.clear_offset(cs.tp)
            in_store = store.offset(cs.tp)
            for offset in {offsets.get(cs.tp), in_store} - {None}:
                assert offset is not None
                if offset >= end or offset + 1 < start:
                    raise self._corrupted(
                        f"store {cs.name} at {cs.path} records offset {offset} of {cs.tp}, outside the "
                        f"changelog's range [{start}, {end})",
                        cs.path,
                        offset,
                    )
            # The engine resumes from the offset kept in the store; a checkpoint that vouches for
            # more is the better start (the data it vouches for is there, guarantee 1).
            loaded = offsets.get(cs.tp)
            if loaded is not None and (in_store is None or in_store < loaded):
                store.commit({cs.tp: loaded})

    def _corrupted(self, what: str, path: Path, offset: int | None) -> TaskCorruptedError:
        return TaskCorruptedError(
            f"{self.kind} task {self.id}: {what}; wiping the task to restore it from its changelog",
            task_ids=frozenset({self.id}),
            task_id=self.id,
            path=path,
            offset=offset,
        )

    def update_offsets(self, offsets: Mapping[TopicPartition, int]) -> None:
        """The restore engine applied the changelog up to ``offsets`` (it wrote them into the stores)."""
        self.state_manager.update_offsets(offsets)

    def _abort_staged(self) -> None:
        sm = self.state_manager
        if self._stores_released:
            return
        for name in sm.store_names():
            try:
                sm.store(name).abort()
            except IllegalStateError:
                continue

    # -- lifecycle shared by both kinds -------------------------------------------------

    def initialize(self) -> None:
        """Leave CREATED: lock, open and check the stores (see the subclasses)."""
        raise NotImplementedError

    def suspend(self) -> None:
        """Stop restoring or processing; flush and record offsets as the policy says.

        An active task must have committed its writes first (``IllegalStateError``
        otherwise). A CREATED task is suspended without touching any file.
        """
        if self._state is TaskState.SUSPENDED:
            return
        was = self._state
        self._transition(TaskState.SUSPENDED)
        if was is not TaskState.CREATED and self.state_manager.initialized:
            self.state_manager.suspend()

    def close(self, *, clean: bool = True) -> None:
        """Close the task (suspending it first). Clean: flush and record offsets. Dirty: as the policy says.

        A clean close of a task with uncommitted writes raises
        ``IllegalStateError``; the caller then closes it dirty.
        """
        if self._state is TaskState.CLOSED:
            return
        if clean:
            self.suspend()
        else:
            self._abort_staged()
            if self._state is not TaskState.SUSPENDED:
                self._transition(TaskState.SUSPENDED)
        self.state_manager.close(clean=clean)
        self._stores_released = False
        self._transition(TaskState.CLOSED)

    def close_dirty_and_revive(self, *, wipe: bool) -> None:
        """Close without committing, optionally wipe the local state, and go back to CREATED.

        With ``wipe`` the task lock stays held across the wipe, so nobody can
        slip in between; the next initialization restores from the changelog's
        start. Without it the state manager is closed dirty (the policy may
        still wipe) and a new one is built. A task that does not hold its lock
        (or is already CLOSED) cannot be wiped here: it is revived with a new
        state manager, whose initialization finds the corruption again.
        """
        self._abort_staged()
        if self._state not in (TaskState.SUSPENDED, TaskState.CLOSED):
            self._transition(TaskState.SUSPENDED)
        sm = self.state_manager
        if wipe and sm.lock_token is not None and self._state is not TaskState.CLOSED:
            sm.wipe()
        else:
            sm.close(clean=False)
            self.state_manager = build_state_manager(
                sm.directory, self.id, sm.policy, sm.store_formats(), standby=sm.standby
            )
        self._stores_released = False
        if self._state is not TaskState.CLOSED:
            self._transition(TaskState.CLOSED)
        self._transition(TaskState.CREATED)


class TaskStore:
    """The processing view of one store of a RUNNING active task.

    Reads go to the :class:`~statestore.state.store.Store` and see the task's own
    uncommitted writes. ``put`` and ``delete`` stage the change in the store
    and send it to the changelog (transactional under exactly-once); the
    change reaches RocksDB at the next commit, with the offset it was written
    at.
    """

    def __init__(self, task: ActiveTask, name: str, tp: TopicPartition) -> None:
        self._task = task
        self.name = name
        self.tp = tp

    @property
    def store(self) -> Store:
        """The underlying store."""
        return self._task._running_store(self.name)

    def get(self, key: bytes) -> bytes | None:
        """The value of ``key`` (uncommitted writes of this task included), None if absent."""
        return self.store.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        """Write ``key -> value``: staged in the store and sent to the changelog.

        In a timestamped store ``value`` is ``encode_timestamped(ts, v)``; the changelog gets ``v``
        with the record timestamp ``ts``, as Kafka Streams logs it (a restore puts them together
        again), so Kafka Streams and statestore read each other's changelogs.
        """
        store = self.store
        if store.format == "timestamped":
            timestamp, logged = decode_timestamped(value)
            store.put(key, value)
            offset = self._task._sender_for_write().send(self.tp, key, logged, timestamp=timestamp)
        else:
            store.put(key, value)
            offset = self._task._sender_for_write().send(self.tp, key, value)
        self._task._sent(self.tp, offset)

    def delete(self, key: bytes) -> None:
        """Delete ``key``: staged in the store and a tombstone sent to the changelog."""
        self.store.delete(key)
        self._task._sent(self.tp, self._task._sender_for_write().send(self.tp, key, None))

    def range(self, start: bytes | None = None, end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` with ``start <= key < end`` in key order, uncommitted writes included."""
        return self.store.range(start, end)

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        return self.range()

    def approximate_num_entries(self) -> int:
        """RocksDB's estimate of the number of keys (plus staged puts)."""
        return self.store.approximate_num_entries()

    @property
    def uncommitted(self) -> int:
        """Number of writes staged since the last commit."""
        return self.store.uncommitted


class ActiveTask(Task):
    """A task that restores its stores, then processes: its writes go to the stores and the changelog."""

    kind = "active"

    def __init__(
        self,
        task_id: TaskId,
        state_manager: StateManager,
        changelog: Changelog,
        sender: ChangelogSender | None = None,
    ) -> None:
        super().__init__(task_id, state_manager, changelog)
        self.sender = sender
        self._written: dict[TopicPartition, int] = {}
        self._views: dict[str, TaskStore] = {}
        state_manager.standby = False

    def initialize(self) -> None:
        """CREATED -> RESTORING: lock, open, load offsets, check for corruption; stores go to the engine.

        ``TaskCorruptedError`` leaves the task CREATED with its lock held;
        :meth:`close_dirty_and_revive` with ``wipe=True`` recovers it.
        """
        check_transition(self.id, self.kind, self._state, TaskState.RESTORING)
        self._open_state()
        self._transition(TaskState.RESTORING)

    def resume(self) -> None:
        """SUSPENDED -> RESTORING: a revoked-then-reassigned task restores the tail again."""
        check_transition(self.id, self.kind, self._state, TaskState.RESTORING)
        self.state_manager.resume()
        self.release_stores()
        self._transition(TaskState.RESTORING)

    def restoration_progress(self) -> bool:
        """Record the restored offsets if the policy says so (called on the commit interval)."""
        current = {tp: off for tp, off in self.offsets().items() if off is not None}
        return self.state_manager.restoration_progress(current)

    def complete_restoration(self) -> None:
        """RESTORING -> RUNNING: reopen the stores, record the restored offsets as the policy says."""
        check_transition(self.id, self.kind, self._state, TaskState.RUNNING)
        self.acquire_stores()
        self.state_manager.complete_restoration()
        self._written.clear()
        self._transition(TaskState.RUNNING)

    # -- processing -----------------------------------------------------------------------

    def store(self, name: str) -> TaskStore:
        """The processing view of store ``name``; the task must be RUNNING."""
        if self._state is not TaskState.RUNNING:
            raise IllegalStateError(
                f"active task {self.id}: store {name!r} is not available while {self._state.value}; "
                "wait until the task is RUNNING (TaskManager.poll() returns True)",
                task_id=self.id,
            )
        view = self._views.get(name)
        if view is None:
            tp = self.state_manager.changelog_partition(name)
            if tp is None:
                raise KeyError(f"active task {self.id}: store {name!r} is not logged")
            view = self._views[name] = TaskStore(self, name, tp)
        return view

    def _running_store(self, name: str) -> Store:
        if self._state is not TaskState.RUNNING:
            raise IllegalStateError(
                f"active task {self.id}: store {name!r} used while {self._state.value}", task_id=self.id
            )
        store = self.state_manager.store(name)
        assert isinstance(store, Store)
        return store

    def _sender_for_write(self) -> ChangelogSender:
        if self.sender is None:
            raise IllegalStateError(f"active task {self.id} has no changelog producer", task_id=self.id)
        return self.sender

    def _sent(self, tp: TopicPartition, offset: int) -> None:
        self._written[tp] = offset

    @property
    def commit_needed(self) -> bool:
        """Whether writes were made since the last commit."""
        return bool(self._written)

    @property
    def written_offsets(self) -> dict[TopicPartition, int]:
        """Changelog offset of the last write per partition since the last commit."""
        return dict(self._written)

    def commit(self, delivered: Mapping[TopicPartition, int] | None = None) -> bool:
        """Apply the staged writes with the offsets they were written at (after the changelog committed).

        ``delivered`` holds the offsets a producer learnt only on delivery
        (Kafka: ``send`` returned -1); they replace what ``send`` returned.
        Returns whether offsets were recorded. Only a RUNNING task has
        anything to commit; for others this is a no-op.
        """
        if self._state is not TaskState.RUNNING:
            return False
        written, self._written = self._written, {}
        if delivered:
            written = {tp: delivered.get(tp, off) for tp, off in written.items()}
        return self.state_manager.commit({tp: off for tp, off in written.items() if off >= 0})

    def abort(self) -> None:
        """Drop the writes staged since the last commit (their transaction was aborted)."""
        self._abort_staged()
        self._written.clear()

    def close(self, *, clean: bool = True) -> None:
        """Close the task; see :meth:`Task.close`. Uncommitted writes make a clean close illegal."""
        if clean and self._written:
            raise IllegalStateError(
                f"active task {self.id}: cannot close cleanly with uncommitted writes to "
                f"{', '.join(map(str, self._written))}; commit first, or close dirty",
                task_id=self.id,
            )
        if not clean:
            self._written.clear()
        super().close(clean=clean)

    def close_dirty_and_revive(self, *, wipe: bool) -> None:
        """See :meth:`Task.close_dirty_and_revive`; uncommitted writes are dropped."""
        self._written.clear()
        self._views.clear()
        super().close_dirty_and_revive(wipe=wipe)

    def recycle(self) -> StandbyTask:
        """A SUSPENDED active task becomes a standby with the same state manager (no reopen)."""
        if self._state is not TaskState.SUSPENDED:
            raise IllegalStateError(
                f"active task {self.id}: only a SUSPENDED task can be recycled, it is {self._state.value}",
                task_id=self.id,
            )
        if self.state_manager.initialized:
            self.release_stores()
        # A task that never got its lock (another stream thread held it) has nothing open:
        # the standby initializes it like a new one.
        standby = StandbyTask(self.id, self.state_manager, self.changelog)
        standby._stores_released = self._stores_released
        self._transition(TaskState.CLOSED)
        return standby


class StandbyTask(Task):
    """A task that keeps a warm copy of its stores from committed changelog data; it never processes."""

    kind = "standby"

    def __init__(self, task_id: TaskId, state_manager: StateManager, changelog: Changelog) -> None:
        super().__init__(task_id, state_manager, changelog)
        state_manager.standby = True

    def initialize(self) -> None:
        """CREATED -> RESTORING -> RUNNING: open and check the stores, hand them to the engine."""
        check_transition(self.id, self.kind, self._state, TaskState.RESTORING)
        self._open_state()
        self._transition(TaskState.RESTORING)
        self._transition(TaskState.RUNNING)

    def resume(self) -> None:
        """Nothing to do for a standby (Kafka: a no-op)."""

    def commit(self) -> bool:
        """Record the offsets applied so far, as the policy says for standbys (both guarantees)."""
        if self._state not in (TaskState.RUNNING, TaskState.SUSPENDED) or not self.state_manager.initialized:
            return False
        return self.state_manager.commit()

    def recycle(self) -> ActiveTask:
        """This standby becomes a CREATED active task with the same state manager (no reopen).

        The active task restores only the tail the standby has not applied yet.
        """
        if self._state not in (TaskState.RUNNING, TaskState.SUSPENDED, TaskState.CREATED):
            raise IllegalStateError(
                f"standby task {self.id}: cannot recycle a {self._state.value} task", task_id=self.id
            )
        self.suspend()
        active = ActiveTask(self.id, self.state_manager, self.changelog)
        active._stores_released = self._stores_released
        self._transition(TaskState.CLOSED)
        return active


__all__ = [
    "TRANSITIONS",
    "ActiveTask",
    "ChangelogSender",
    "ChangelogStore",
    "StandbyTask",
    "Task",
    "TaskState",
    "TaskStore",
    "build_state_manager",
    "check_transition",
    "unclean_status_is_corruption",
]
