"""The state updater: restores active tasks, then keeps standby tasks up to date.

What Kafka Streams' ``DefaultStateUpdater`` and ``StoreChangelogReader`` do,
with every byte of restoration going through the Rust restore engine
(:func:`statestore.restore.engine.restore_many`, GIL released):

* When an active task is added, the end offset of each of its changelogs is
  fixed to the changelog's end offset at that moment. A changelog is complete
  when the reader's *position* is ``>= end`` (markers and aborted records
  occupy offsets, so the last record's offset is never compared).
* Records are read ``read_committed``; the engine never reads past the last
  stable offset. A transaction left open by a dead producer holds the last
  stable offset back, so while a restoration is blocked on one, the updater
  asks the log to abort transactions older than the transaction timeout
  (:meth:`SegmentLog.abort_expired_transactions`) instead of waiting forever.
* Standby tasks are updated only while no active task restores, with
  committed data only.
* Work per :meth:`StateUpdater.poll` is bounded: restores run in chunks of at
  most ``chunk_offsets`` offsets per changelog and a poll stops starting new
  chunks once its time slice is spent. With ``background=True`` chunks run on
  a worker thread and ``poll`` only collects what finished. Unless
  ``chunk_offsets`` is given, the updater sizes the chunks itself: from
  50,000 offsets, doubled after a round of restore calls much shorter than
  its aim (the time slice; one second in the background) and halved after
  one much longer, since every call pays a fixed cost.
* A task's stores stay open in the engine between rounds
  (:class:`~statestore.restore.engine.OpenStores`), their memtables
  unflushed: a round opens nothing and writes no file of its own. The task's
  state manager flushes them whenever its policy flushes (before offsets are
  recorded outside the stores), and has them closed before anything else
  opens, closes or wipes them; the updater closes them when the task leaves
  it or the updater closes (:meth:`StateManager.lend_stores
  <statestore.state.state_manager.StateManager.lend_stores>`).
* "Restore complete" belongs to one assignment (guarantee 5 of docs/architecture.md, KAFKA-7672): all
  progress of a task is kept in one record that :meth:`StateUpdater.remove`
  drops, so a task added again starts from what its stores hold now.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from statestore.changelog.protocol import DEFAULT_TRANSACTION_TIMEOUT_MS, Changelog
from statestore.errors import (
    ChangelogUnavailableError,
    LogError,
    RestoreError,
    StateStoreError,
    StoreError,
    TaskCorruptedError,
)
from statestore.ids import TaskId, TopicPartition
from statestore.ops.metrics import RestoreMetrics
from statestore.processing.task import ActiveTask, ChangelogStore, StandbyTask, Task, TaskState
from statestore.processing.unanswered import UnansweredChangelogs
from statestore.restore.engine import (
    DEFAULT_MEMORY_BUDGET,
    OpenStores,
    RestoreListener,
    RestoreResult,
    RestoreSpec,
    restore_many,
)

logger = logging.getLogger(__name__)

#: Default most offsets one restore call covers per changelog, to begin with (see ``chunk_offsets``).
DEFAULT_CHUNK_OFFSETS = 50_000
#: Most offsets one restore call grows to cover per changelog when the updater sizes its chunks.
MAX_CHUNK_OFFSETS = 64 * DEFAULT_CHUNK_OFFSETS
#: Seconds a round of restore calls on the background thread aims at: what removing a task in
#: the middle of its restoration may wait for.
BACKGROUND_ROUND_S = 1.0
#: Default time slice of one poll, in milliseconds.
DEFAULT_TIME_SLICE_MS = 100
#: Least time between two attempts to abort expired transactions, in seconds.
_ABORT_CHECK_INTERVAL = 0.2


class SuspendReason(enum.Enum):
    """Why a standby stopped being updated (Kafka's ``StandbyUpdateListener.SuspendReason``)."""

    PROMOTED = "PROMOTED"
    """The standby became an active task on this instance."""
    MIGRATED = "MIGRATED"
    """The standby was revoked from this instance."""


class StateRestoreListener(RestoreListener):
    """Restoration of active tasks' changelogs, with the shape of Kafka's ``StateRestoreListener``.

    The restore engine's listener (:class:`statestore.RestoreListener`) plus
    :meth:`on_restore_suspended`. Subclass and override what you need; the
    updater also accepts any object with the engine listener's three methods.
    Every method is called from the thread that calls
    :meth:`StateUpdater.poll`, once per restored chunk, never per record.
    """

    def on_restore_start(
        self, tp: TopicPartition, store_name: str, start_offset: int, end_offset: int
    ) -> None:
        """Restoration of ``[start_offset, end_offset)`` begins."""

    def on_batch_restored(
        self, tp: TopicPartition, store_name: str, batch_end_offset: int, num_restored: int
    ) -> None:
        """``num_restored`` records up to ``batch_end_offset`` were applied."""

    def on_restore_end(self, tp: TopicPartition, store_name: str, total_restored: int) -> None:
        """The changelog reached its end offset; ``total_restored`` records were applied."""

    def on_restore_suspended(self, tp: TopicPartition, store_name: str, total_restored: int) -> None:
        """The task was removed (revoked, closed, corrupted) before its restoration completed."""


class StandbyUpdateListener:
    """Updates of standby tasks, with the shape of Kafka's ``StandbyUpdateListener``."""

    def on_update_start(self, tp: TopicPartition, store_name: str, starting_offset: int) -> None:
        """Updating starts; ``starting_offset`` is the first offset to read."""

    def on_batch_loaded(
        self,
        tp: TopicPartition,
        store_name: str,
        task_id: TaskId,
        batch_end_offset: int,
        batch_size: int,
        current_end_offset: int,
    ) -> None:
        """``batch_size`` committed records up to ``batch_end_offset`` were applied."""

    def on_update_suspended(
        self,
        tp: TopicPartition,
        store_name: str,
        store_offset: int,
        current_end_offset: int,
        reason: SuspendReason,
    ) -> None:
        """Updating stopped: the standby was promoted to active or migrated away."""


class ChangelogPhase(enum.Enum):
    """Where one changelog of a task stands (Kafka's ``ChangelogState``)."""

    RESTORING = "RESTORING"
    COMPLETED = "COMPLETED"


@dataclass
class _Changelog:
    """Progress of one store's changelog for one assignment of one task."""

    store: ChangelogStore
    end_offset: int | None  # fixed when an active restoration starts; None for standbys
    position: int  # next offset to read
    phase: ChangelogPhase = ChangelogPhase.RESTORING
    restored: int = 0


@dataclass
class _Updating:
    """One task in the updater and its changelogs' progress; dropped by remove()."""

    task: Task
    changelogs: list[_Changelog] = field(default_factory=list)
    failed: bool = False

    @property
    def active(self) -> bool:
        return isinstance(self.task, ActiveTask)


class StateUpdater:
    """Restores active tasks and updates standby tasks from their changelog (segment log or Kafka).

    ``add`` a task once it is initialized (active: RESTORING, standby:
    RUNNING); ``poll`` does a bounded amount of work and returns the active
    tasks whose restoration completed (they are RUNNING and no longer in the
    updater). Tasks that fail (bad offsets, a log or store error) are taken
    out and reported by :meth:`drain_failed`; the others go on.
    """

    def __init__(
        self,
        changelog: Changelog,
        *,
        listener: RestoreListener | None = None,
        standby_listener: StandbyUpdateListener | None = None,
        metrics: RestoreMetrics | None = None,
        commit_interval_ms: int = 30_000,
        transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS,
        time_slice_ms: int = DEFAULT_TIME_SLICE_MS,
        chunk_offsets: int | None = None,
        threads: int | None = None,
        background: bool = False,
        clock: Callable[[], float] = time.monotonic,
        unanswered: UnansweredChangelogs | None = None,
    ) -> None:
        if chunk_offsets is not None and chunk_offsets < 1:
            raise ValueError(f"chunk_offsets must be >= 1, got {chunk_offsets}")
        if time_slice_ms < 0 or commit_interval_ms < 0 or transaction_timeout_ms < 0:
            raise ValueError("time_slice_ms, commit_interval_ms and transaction_timeout_ms must be >= 0")
        self.changelog = changelog
        self.listener = listener
        self.standby_listener = standby_listener
        self.metrics = metrics
        self.commit_interval = commit_interval_ms / 1000
        self.transaction_timeout_ms = transaction_timeout_ms
        self.time_slice = time_slice_ms / 1000
        #: Offsets the next restore call covers per changelog.
        self.chunk_offsets = DEFAULT_CHUNK_OFFSETS if chunk_offsets is None else chunk_offsets
        self._sizes_chunks = chunk_offsets is None
        #: Seconds a round of restore calls aims at when the updater sizes its chunks.
        self._round_s = BACKGROUND_ROUND_S if background else time_slice_ms / 1000
        self.threads = threads
        self._clock = clock
        self._tasks: dict[TaskId, _Updating] = {}
        self._failed: list[tuple[Task, StateStoreError]] = []
        self._last_recorded = clock()
        self._last_abort_check = float("-inf")
        self._executor = (
            ThreadPoolExecutor(1, thread_name_prefix="statestore-restore") if background else None
        )
        self._inflight: Future[list[RestoreResult]] | None = None
        self._inflight_plan: list[tuple[_Updating, _Changelog, int]] = []
        self._completed: list[ActiveTask] = []
        # The stores of the tasks here, open in the engine between rounds.
        self._open = OpenStores(DEFAULT_MEMORY_BUDGET)
        #: Whether the last poll applied a restored chunk.
        self.made_progress = False
        #: Changelogs that gave no answer (``ChangelogUnavailableError``) and have not answered
        #: since: their tasks stay as they were and are asked again on a later poll (one a poll);
        #: the others go on. One leaves by a restore of it that succeeds (or, with nothing to fetch,
        #: by its offsets read again), or when its task leaves. Shared with the task manager that
        #: passes it (which then begins each poll); otherwise this updater's own.
        self.unanswered = unanswered if unanswered is not None else UnansweredChangelogs()
        self._owns_unanswered = unanswered is None

    # -- membership -----------------------------------------------------------------------

    def add(self, task: Task) -> None:
        """Start restoring (active) or updating (standby) ``task``.

        An active task's end offsets are fixed here: the changelogs' end
        offsets now. Its restoration starts from what its stores hold.
        """
        if task.id in self._tasks:
            raise ValueError(f"task {task.id} is already in the state updater")
        expected = TaskState.RESTORING if isinstance(task, ActiveTask) else TaskState.RUNNING
        if task.state is not expected:
            raise ValueError(
                f"{task.kind} task {task.id} must be {expected.value} to be added, it is {task.state.value}"
            )
        # The changelogs' ends first (read when the task's state was opened, if it just was): a
        # cluster that does not answer (ChangelogUnavailableError) leaves the task as it was, to be
        # added again.
        ranges = task.take_changelog_ranges()
        if ranges is None:
            ranges = {cs.tp: self.changelog.offsets(cs.tp)[:2] for cs in task.changelog_stores()}
        task.release_stores()
        task.state_manager.lend_stores(self._open)
        entry = _Updating(task)
        offsets = task.offsets()
        for cs in task.changelog_stores():
            start, end = ranges[cs.tp]
            offset = offsets.get(cs.tp)
            position = max(offset + 1, start) if offset is not None else start
            if isinstance(task, ActiveTask):
                entry.changelogs.append(_Changelog(cs, end, position))
                if self.listener is not None:
                    self.listener.on_restore_start(cs.tp, cs.name, position, end)
                if self.metrics is not None:
                    self.metrics.restore_started(task.id, cs.tp, cs.name, position, end)
            else:
                entry.changelogs.append(_Changelog(cs, None, position))
                if self.standby_listener is not None:
                    self.standby_listener.on_update_start(cs.tp, cs.name, position)
        self._tasks[task.id] = entry

    def remove(self, task_id: TaskId, reason: SuspendReason = SuspendReason.MIGRATED) -> Task | None:
        """Take a task out, forgetting all its progress; listeners hear it was suspended.

        Waits for an in-flight background chunk that involves the task, so the
        engine no longer has its stores open when this returns.
        """
        entry = self._tasks.get(task_id)
        if entry is None:
            return None
        if self._inflight is not None and any(e is entry for e, _, _ in self._inflight_plan):
            self._collect(wait=None)
            entry = self._tasks.get(task_id)
            if entry is None:  # it completed or failed meanwhile
                return None
        del self._tasks[task_id]
        self._close_stores(entry)
        if self.metrics is not None:
            self.metrics.forget(task_id)
        for cl in entry.changelogs:
            self.unanswered.forget(cl.store.tp)
            if entry.active:
                suspended = getattr(self.listener, "on_restore_suspended", None)
                if cl.phase is ChangelogPhase.RESTORING and suspended is not None:
                    suspended(cl.store.tp, cl.store.name, cl.restored)
            elif self.standby_listener is not None:
                offset = entry.task.offsets().get(cl.store.tp)
                try:
                    end = self.changelog.end_offset(cl.store.tp)
                except ChangelogUnavailableError:
                    end = -1  # unknown: the task leaves all the same
                self.standby_listener.on_update_suspended(
                    cl.store.tp, cl.store.name, offset if offset is not None else -1, end, reason
                )
        return entry.task

    def _unanswered(self, tp: TopicPartition, error: ChangelogUnavailableError) -> None:
        self.unanswered.no_answer(tp, (tp,), error)

    @property
    def unavailable(self) -> ChangelogUnavailableError | None:
        """What a changelog that has not answered since it last gave no answer said, if one has not
        (with a shared :attr:`unanswered`: the task manager's waiting tasks too)."""
        return self.unanswered.first

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._tasks

    def tasks(self) -> list[Task]:
        """Tasks in the updater (restoring actives and standbys)."""
        return [e.task for e in self._tasks.values()]

    def restoring_active(self) -> bool:
        """Whether an active task is still restoring."""
        return any(e.active for e in self._tasks.values())

    def drain_failed(self) -> list[tuple[Task, StateStoreError]]:
        """Tasks taken out because restoring or updating them failed, with the error; cleared."""
        out, self._failed = self._failed, []
        return out

    # -- work -------------------------------------------------------------------------------

    def _plan(self) -> list[tuple[_Updating, _Changelog, int]]:
        """The next chunk per changelog: actives first; standbys only when no active restores."""
        actives = [e for e in self._tasks.values() if e.active]
        entries = actives if actives else list(self._tasks.values())
        plan = []
        blocked = False
        for entry in entries:
            for cl in entry.changelogs:
                if cl.phase is ChangelogPhase.COMPLETED:
                    continue
                if not self.unanswered.may_ask(cl.store.tp, (cl.store.tp,)):
                    continue  # silent during this poll, or one that gave no answer before, not its turn
                try:
                    lso = self.changelog.last_stable_offset(cl.store.tp)
                except ChangelogUnavailableError as e:
                    # Its cluster gives no answer: the others go on; this one is asked next poll.
                    self._unanswered(cl.store.tp, e)
                    continue
                limit = lso if cl.end_offset is None else min(cl.end_offset, lso)
                target = min(limit, cl.position + self.chunk_offsets)
                if target > cl.position:
                    plan.append((entry, cl, target))
                    continue
                self.unanswered.answered(cl.store.tp)  # it answers, and has nothing to fetch
                if cl.end_offset is not None and cl.position < cl.end_offset:
                    blocked = True
        if blocked and not plan:
            self._abort_expired()
        return plan

    def _abort_expired(self) -> None:
        now = self._clock()
        if now - self._last_abort_check < _ABORT_CHECK_INTERVAL:
            return
        self._last_abort_check = now
        aborted = self.changelog.abort_expired_transactions(self.transaction_timeout_ms)
        if aborted:
            logger.info(
                "aborted transactions open longer than %d ms of dead producers %s; restoration goes on",
                self.transaction_timeout_ms,
                ", ".join(aborted),
            )

    def _specs(self, plan: list[tuple[_Updating, _Changelog, int]]) -> list[RestoreSpec]:
        return [
            RestoreSpec(cl.store.path, self.changelog, cl.store.tp, end_offset=target, format=cl.store.format)
            for _, cl, target in plan
        ]

    def _run(self, plan: list[tuple[_Updating, _Changelog, int]]) -> list[RestoreResult]:
        started = time.monotonic()
        results = restore_many(self._specs(plan), threads=self.threads, open_stores=self._open)
        self._size_chunks(time.monotonic() - started)
        return results

    def _size_chunks(self, round_s: float) -> None:
        """Double the chunk after a round that took under a quarter of its aim, halve it after one
        that took over twice it, within ``DEFAULT_CHUNK_OFFSETS..MAX_CHUNK_OFFSETS``.

        Every restore call has a fixed cost (reading the store's offset, opening a cursor on the
        changelog; before stores stayed open between rounds, also opening, flushing and closing
        the store: 2M records in calls of 50,000 took 2.6x as long as in one call). Larger calls
        keep that cost small while a round stays about as long as its aim.
        """
        if not self._sizes_chunks:
            return
        if round_s < self._round_s / 4:
            self.chunk_offsets = min(MAX_CHUNK_OFFSETS, self.chunk_offsets * 2)
        elif round_s > self._round_s * 2:
            self.chunk_offsets = max(DEFAULT_CHUNK_OFFSETS, self.chunk_offsets // 2)

    def poll(self, timeout: float | None = None) -> list[ActiveTask]:
        """Do at most a time slice of work (``timeout`` seconds if given); return tasks that turned RUNNING.

        In the foreground, chunks run until the slice is spent (at least one).
        In the background, a chunk is started if none is running, and its
        results are collected when it finishes (waiting up to ``timeout``).
        """
        slice_ = self.time_slice if timeout is None else timeout
        self.made_progress = False
        if self._owns_unanswered:
            self.unanswered.new_poll()
        self._complete_ready()
        if self._executor is not None:
            if self._inflight is None:
                plan = self._plan()
                if plan:
                    self._inflight_plan = plan
                    self._inflight = self._executor.submit(self._run, plan)
            if self._inflight is not None:
                self._collect(wait=slice_)
        else:
            deadline = self._clock() + slice_
            while True:
                plan = self._plan()
                if not plan:
                    break
                self._apply(plan, self._run(plan))
                if self._clock() >= deadline or self.unanswered.silent():
                    break  # the slice is spent, or a changelog gave no answer: asked next poll
        self._maybe_record_offsets()
        done, self._completed = self._completed, []
        return done

    def _collect(self, wait: float | None) -> None:
        future = self._inflight
        if future is None:
            return
        try:
            results = future.result(timeout=wait)
        except TimeoutError:
            return
        plan, self._inflight, self._inflight_plan = self._inflight_plan, None, []
        self._apply(plan, results)

    def _apply(self, plan: list[tuple[_Updating, _Changelog, int]], results: list[RestoreResult]) -> None:
        for (entry, cl, _target), result in zip(plan, results, strict=True):
            if self._tasks.get(entry.task.id) is not entry or entry.failed:
                continue  # removed meanwhile: its progress is forgotten
            if isinstance(result.error, ChangelogUnavailableError):
                # No answer from its cluster: the store is as the restore left it (its offset with
                # its data), and the next round goes on from there. Not a failure of the task.
                self._unanswered(cl.store.tp, result.error)
                continue
            if result.error is not None:
                self._fail(entry, result.error, cl)
                continue
            self.unanswered.answered(cl.store.tp)
            self.made_progress = True
            cl.position = max(cl.position, result.end_offset)
            cl.restored += result.records_applied
            if result.offset is not None:
                entry.task.update_offsets({cl.store.tp: result.offset})
            self._report_batch(entry, cl, result)
        self._complete_ready()

    def _complete_ready(self) -> None:
        """Mark changelogs whose position reached the end COMPLETED; active tasks with all done turn RUNNING."""
        for entry in list(self._tasks.values()):
            if not entry.active or entry.failed:
                continue
            for cl in entry.changelogs:
                if (
                    cl.phase is ChangelogPhase.RESTORING
                    and cl.end_offset is not None
                    and cl.position >= cl.end_offset
                ):
                    cl.phase = ChangelogPhase.COMPLETED
                    if self.listener is not None:
                        self.listener.on_restore_end(cl.store.tp, cl.store.name, cl.restored)
                    if self.metrics is not None:
                        self.metrics.restore_ended(entry.task.id, cl.store.name, cl.restored)
            if all(c.phase is ChangelogPhase.COMPLETED for c in entry.changelogs):
                task = entry.task
                assert isinstance(task, ActiveTask)
                try:
                    task.complete_restoration()  # its stores come back from the engine first
                except StateStoreError as e:
                    self._fail(entry, e, None)
                    continue
                del self._tasks[task.id]
                self._completed.append(task)

    def _report_batch(self, entry: _Updating, cl: _Changelog, result: RestoreResult) -> None:
        if result.records_applied == 0 or result.offset is None:
            return
        if entry.active:
            if self.listener is not None:
                self.listener.on_batch_restored(
                    cl.store.tp, cl.store.name, result.offset, result.records_applied
                )
            if self.metrics is not None:
                self.metrics.restored(
                    entry.task.id, cl.store.tp, cl.store.name, result.records_applied, cl.position
                )
        elif self.standby_listener is not None or self.metrics is not None:
            try:
                end = self.changelog.end_offset(cl.store.tp)
            except ChangelogUnavailableError as e:
                self._unanswered(cl.store.tp, e)
                return  # reported with the next batch
            if self.standby_listener is not None:
                self.standby_listener.on_batch_loaded(
                    cl.store.tp, cl.store.name, entry.task.id, result.offset, result.records_applied, end
                )
            if self.metrics is not None:
                self.metrics.standby_updated(
                    entry.task.id, cl.store.tp, cl.store.name, result.records_applied, cl.position, end
                )

    def _close_stores(self, entry: _Updating) -> None:
        """Flush and close the task's stores open in the engine (a store that fails is marked corrupted)."""
        try:
            entry.task.state_manager.reclaim_stores()
        except StateStoreError:
            pass  # logged by the state manager, which no longer vouches for that store's offset

    def _fail(self, entry: _Updating, error: StateStoreError, cl: _Changelog | None) -> None:
        entry.failed = True
        task = entry.task
        original = error
        # A TaskCorruptedError that does not name its task (e.g. the restore engine's
        # StoreCorruptedError for damaged store files) is wrapped too, so it does.
        named = isinstance(error, TaskCorruptedError) and error.task_id is not None
        if isinstance(error, (LogError, StoreError, RestoreError)) and not named:
            where = f" restoring {cl.store.name} from {cl.store.tp}" if cl is not None else ""
            error = TaskCorruptedError(
                f"{task.kind} task {task.id}:{where} failed: {error}; wiping the task to restore it "
                "from its changelog",
                task_ids=frozenset({task.id}),
                task_id=task.id,
                path=cl.store.path if cl is not None else None,
                offset=cl.position if cl is not None else None,
            )
            error.__cause__ = original
        logger.warning("%s", error)
        self.remove(task.id, SuspendReason.MIGRATED)
        self._failed.append((task, error))

    def _maybe_record_offsets(self) -> None:
        now = self._clock()
        if now - self._last_recorded <= self.commit_interval:
            return
        self._last_recorded = now
        self.record_offsets()

    def record_offsets(self) -> None:
        """Record every updating task's offsets as the policy says (restore progress, standby commit)."""
        for entry in list(self._tasks.values()):
            if self._inflight is not None and any(e is entry for e, _, _ in self._inflight_plan):
                continue
            task = entry.task
            try:
                if isinstance(task, ActiveTask):
                    task.restoration_progress()
                elif isinstance(task, StandbyTask):
                    task.commit()
            except StateStoreError as e:
                self._fail(entry, e, None)

    def close(self) -> None:
        """Wait for in-flight work, stop the worker thread, flush and close the stores; tasks stay here."""
        if self._inflight is not None:
            self._collect(wait=None)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        for entry in self._tasks.values():
            self._close_stores(entry)


__all__ = [
    "DEFAULT_CHUNK_OFFSETS",
    "DEFAULT_TIME_SLICE_MS",
    "ChangelogPhase",
    "StandbyUpdateListener",
    "StateRestoreListener",
    "StateUpdater",
    "SuspendReason",
]
