"""The task manager: assignments in, RUNNING tasks with correct state out.

:class:`TaskManager` is what a stream processor talks to. It

* on :meth:`~TaskManager.start`, opens every non-empty task directory as a
  *startup standby* (guarantee 8 of docs/architecture.md, KAFKA-17411): corrupted state is found and wiped
  before any assignment, at most ``max_startup_tasks`` stay open (memory is
  bounded), and the first assignment reuses them instead of reopening;
* turns assignments into tasks (:meth:`~TaskManager.assign`): creates,
  recycles between active and standby, suspends and closes, every offset
  decision taken from the policy table;
* drives restoration and standby updates through the
  :class:`~statestore.processing.updater.StateUpdater` (:meth:`~TaskManager.poll`);
* commits (:meth:`~TaskManager.commit`): under exactly-once the changelog
  transaction commits first and only then does each task apply its staged
  writes with the offsets they were written at; under at-least-once the
  changelog is flushed, then the writes are applied and offsets recorded;
* handles corruption: the corrupted task alone is closed dirty, wiped,
  revived and restored again; the others keep running.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from statestore.changelog.protocol import DEFAULT_TRANSACTION_TIMEOUT_MS, Changelog
from statestore.errors import (
    ChangelogUnavailableError,
    IllegalStateError,
    LockError,
    LogError,
    ProducerFencedError,
    StateStoreError,
    StoreError,
    TaskCorruptedError,
    TransactionInDoubtError,
)
from statestore.ids import TaskId, TopicPartition, changelog_topic, committed_offset
from statestore.ops.metrics import RestoreMetrics
from statestore.processing.record_collector import RecordCollector
from statestore.processing.task import (
    ActiveTask,
    StandbyTask,
    Task,
    TaskState,
    build_state_manager,
    store_formats,
)
from statestore.processing.unanswered import UnansweredChangelogs
from statestore.processing.updater import (
    DEFAULT_TIME_SLICE_MS,
    StandbyUpdateListener,
    StateUpdater,
    SuspendReason,
)
from statestore.restore.engine import RestoreListener
from statestore.state.checkpoint import OffsetCheckpoint
from statestore.state.directory import StateDirectory
from statestore.state.lag import Lag, store_lag
from statestore.state.policy import Guarantee, OffsetsMode, Policy
from statestore.state.state_manager import StateManager
from statestore.state.store import read_offsets

logger = logging.getLogger(__name__)

#: How long restore() waits between polls that made no progress, in seconds.
_IDLE_WAIT = 0.01
#: Default most startup standbys kept open until the first assignment.
DEFAULT_MAX_STARTUP_TASKS = 64
#: Most times in a row a task that restores nothing is wiped before poll() raises instead.
MAX_WIPES = 3


class TaskManager:
    """Tasks of one application instance over a state directory and a changelog (segment log or Kafka).

    ``state_dir`` is a :class:`StateDirectory` (or its root path, with
    ``application_id``); ``stores`` names the logged persistent stores every
    task has (or maps each name to its format, ``"plain"`` or ``"timestamped"``). ``guarantee`` is ``"at_least_once"`` or ``"exactly_once_v2"``;
    ``offsets`` is ``"store"`` (offsets inside RocksDB, the default) or
    ``"checkpoint"`` (Kafka's ``.checkpoint`` file).

    Several task managers may share one :class:`StateDirectory` (the stream
    threads of one instance; task locks keep them apart). Under exactly-once
    give each its own ``client_id``: the changelog producer's transactional id
    is ``<application id>-<process id>[-<client_id>]``, and two managers with
    the same one fence each other.

    Call :meth:`start`, then :meth:`assign`; :meth:`poll` until it returns True
    (every active task RUNNING) or use :meth:`restore`; process through
    ``task(task_id).store(name)``; :meth:`commit`; :meth:`close`.
    """

    def __init__(
        self,
        state_dir: StateDirectory | str | Path,
        changelog: Changelog,
        stores: Mapping[str, str] | Iterable[str],
        *,
        guarantee: Guarantee | str,
        offsets: OffsetsMode | str = "store",
        listener: RestoreListener | None = None,
        standby_listener: StandbyUpdateListener | None = None,
        metrics: RestoreMetrics | None = None,
        commit_interval_ms: int = 30_000,
        application_id: str | None = None,
        max_startup_tasks: int = DEFAULT_MAX_STARTUP_TASKS,
        transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS,
        time_slice_ms: int = DEFAULT_TIME_SLICE_MS,
        chunk_offsets: int | None = None,
        background_restore: bool = False,
        checkpoint_delta: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        client_id: str | None = None,
    ) -> None:
        if isinstance(state_dir, StateDirectory):
            self.directory = state_dir
            self._owns_directory = False
        else:
            if application_id is None:
                raise ValueError("application_id is required when state_dir is a path")
            self.directory = StateDirectory(state_dir, application_id)
            self._owns_directory = True
        if max_startup_tasks < 0:
            raise ValueError(f"max_startup_tasks must be >= 0, got {max_startup_tasks}")
        self.changelog = changelog
        self.store_formats = store_formats(stores)
        self.store_names = list(self.store_formats)
        if not self.store_names:
            raise ValueError("a task manager needs at least one store name")
        self.policy = (
            Policy.of(guarantee, offsets)
            if checkpoint_delta is None
            else Policy.of(guarantee, offsets, checkpoint_delta=checkpoint_delta)
        )
        self.max_startup_tasks = max_startup_tasks
        self.client_id = client_id
        self.commit_interval = commit_interval_ms / 1000
        self._clock = clock
        # Tasks waiting (not opened, or not taken by the state updater) and changelogs being
        # restored or updated whose cluster gave no answer: who is asked again, and when.
        self.unanswered = UnansweredChangelogs()
        self.updater = StateUpdater(
            changelog,
            unanswered=self.unanswered,
            listener=listener,
            standby_listener=standby_listener,
            metrics=metrics,
            commit_interval_ms=commit_interval_ms,
            transaction_timeout_ms=transaction_timeout_ms,
            time_slice_ms=time_slice_ms,
            chunk_offsets=chunk_offsets,
            background=background_restore,
            clock=clock,
        )
        self._active: dict[TaskId, ActiveTask] = {}
        self._standby: dict[TaskId, StandbyTask] = {}
        self._startup: dict[TaskId, StandbyTask] = {}
        self._wipes: dict[TaskId, int] = {}
        # Initialized tasks the state updater has not taken yet: their changelogs gave no answer.
        self._unadded: set[TaskId] = set()
        self._collector: RecordCollector | None = None
        self._started = False
        self._closed = False
        self._last_commit = clock()
        self.metrics = metrics
        if metrics is not None:
            metrics.tasks_by_state = self.tasks_by_state

    def __repr__(self) -> str:
        return (
            f"TaskManager({self.directory.app_dir}, {self.policy.guarantee.value}, "
            f"offsets={self.policy.offsets.value}, active={sorted(map(str, self._active))}, "
            f"standby={sorted(map(str, self._standby))})"
        )

    # -- building tasks ----------------------------------------------------------------------

    def _state_manager(self, task_id: TaskId, *, standby: bool) -> StateManager:
        return build_state_manager(self.directory, task_id, self.policy, self.store_formats, standby=standby)

    @property
    def collector(self) -> RecordCollector:
        """The changelog producer shared by all active tasks (created by :meth:`start`)."""
        if self._collector is None:
            raise IllegalStateError("task manager not started; call start() first")
        return self._collector

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError(f"{self!r} is closed")

    # -- start: startup standbys ----------------------------------------------------------------

    def start(self) -> None:
        """Open the changelog producer and every non-empty local task directory as a startup standby.

        Corrupted state is wiped here, before any assignment (guarantee 8). At
        most ``max_startup_tasks`` startup standbys stay open until the first
        :meth:`assign`; the others are verified (and wiped if corrupted) and
        closed again. Under exactly-once the producer fences this instance's
        previous incarnation and aborts its open transaction.
        """
        self._check_open()
        if self._started:
            return
        self.changelog.create()  # a new application's changelog is an empty one
        tid = None
        if self.policy.eos:
            tid = f"{self.directory.application_id}-{self.directory.process_id}"
            if self.client_id is not None:
                tid += f"-{self.client_id}"
        self._collector = RecordCollector(self.changelog, tid)  # may fail: start() is then asked again
        self._started = True
        for task_id in self.directory.non_empty_task_dirs():
            task = StandbyTask(task_id, self._state_manager(task_id, standby=True), self.changelog)
            try:
                task.initialize()
            except (LockError, ChangelogUnavailableError) as e:
                logger.info("task %s: not opened as a startup standby: %s", task_id, e)
                continue
            except TaskCorruptedError as e:
                logger.warning("startup: %s", e)
                task.close_dirty_and_revive(wipe=True)  # wiped now, before any assignment
                self._close(task, clean=True)
                continue
            task.take_changelog_ranges()  # stale by the time an assignment hands it over
            if len(self._startup) < self.max_startup_tasks:
                self._startup[task_id] = task
            else:
                self._close(task, clean=True)  # verified; closed to bound memory

    def startup_tasks(self) -> list[StandbyTask]:
        """Startup standbys not yet claimed by an assignment."""
        return list(self._startup.values())

    # -- initialization and corruption ----------------------------------------------------------

    def _initialize(self, task: Task) -> None:
        """Initialize a CREATED task; corrupted local state is wiped and the task initialized again.

        ``LockError`` propagates (retry on the next poll).
        """
        for _ in range(3):
            try:
                task.initialize()
                return
            except TaskCorruptedError as e:
                logger.warning("%s", e)
                task.close_dirty_and_revive(wipe=True)
        raise TaskCorruptedError(
            f"{task.kind} task {task.id}: still corrupted after being wiped three times; "
            f"check {self.directory.task_dir(task.id)} and the changelog",
            task_ids=frozenset({task.id}),
            task_id=task.id,
            path=self.directory.task_dir(task.id),
        )

    def _initialize_pending(self) -> None:
        """Initialize CREATED tasks and hand them to the state updater. One whose lock is not free
        yet, or whose changelog gives no answer, is tried again on the next poll; the others go on."""
        for task in [*self._active.values(), *self._standby.values()]:
            pending = task.state is TaskState.CREATED or (
                task.id in self._unadded and task.id not in self.updater
            )
            if not pending:
                continue
            if not self.unanswered.may_ask(task.id, [cs.tp for cs in task.changelog_stores()]):
                continue  # silent during this poll, or it waits for an answer and it is not its turn
            if task.state is TaskState.CREATED:
                try:
                    self._initialize(task)
                except LockError as e:
                    logger.debug(
                        "task %s: lock not available yet (%s); retrying on the next poll", task.id, e
                    )
                    continue
                except ChangelogUnavailableError as e:
                    self._unanswered(task, e)
                    continue
            self._add(task)

    def _add(self, task: Task) -> None:
        """Hand an initialized task to the state updater; one whose changelog gives no answer is
        kept aside and handed over by a later poll."""
        try:
            self.updater.add(task)
        except ChangelogUnavailableError as e:
            self._unadded.add(task.id)
            self._unanswered(task, e)
        else:
            self._unadded.discard(task.id)
            self.unanswered.answered(task.id)

    def _unanswered(self, task: Task, error: ChangelogUnavailableError) -> None:
        logger.debug(
            "%s task %s: its changelog gives no answer (%s); trying again on the next poll",
            task.kind,
            task.id,
            error,
        )
        self.unanswered.no_answer(task.id, [cs.tp for cs in task.changelog_stores()], error)

    def _unavailable(self) -> ChangelogUnavailableError | None:
        """What a changelog that has not answered since said: of a task still waiting for it, or
        of one the state updater holds back."""
        owned = {**self._active, **self._standby}
        for waiter in self.unanswered.waiting():
            if not isinstance(waiter, TaskId):
                continue  # a changelog of the state updater's: it keeps that one up to date
            task = owned.get(waiter)
            if task is None or not (task.state is TaskState.CREATED or waiter in self._unadded):
                self.unanswered.forget(waiter)  # gone, or it answered another way
        return self.unanswered.first

    def _handle_corrupted(self, task: Task, error: StateStoreError) -> None:
        """Close dirty, wipe, revive: the task is restored again from its changelog's start."""
        logger.warning("%s task %s is corrupted (%s); wiping and restoring it", task.kind, task.id, error)
        self.updater.remove(task.id, SuspendReason.MIGRATED)
        if isinstance(task, ActiveTask):
            task.abort()
        task.close_dirty_and_revive(wipe=True)

    def _handle_failed(self, task: Task, error: StateStoreError) -> StateStoreError | None:
        """A restore or standby update failed: wipe and restore the task, unless that cannot help.

        Returns the error to raise instead: when the changelog itself cannot
        be read (a ``LogError``, e.g. a corrupt segment), wiping the local
        state would only lose it and fail again; and when the task failed
        again without restoring anything :data:`MAX_WIPES` times in a row since
        it was wiped (e.g. the disk is full), wiping again would loop forever.
        Such a task is closed dirty and revived unwiped; the next poll tries
        it again.
        """
        cause = error.__cause__ if isinstance(error.__cause__, StateStoreError) else error
        if isinstance(cause, LogError):
            logger.error(
                "%s task %s: its changelog cannot be read (%s); not wiping it", task.kind, task.id, cause
            )
            task.close_dirty_and_revive(wipe=False)
            return cause
        if all(off is None for off in task.offsets().values()):
            self._wipes[task.id] = self._wipes.get(task.id, 0) + 1
        else:
            self._wipes[task.id] = 1
        if self._wipes[task.id] > MAX_WIPES:
            self._wipes[task.id] = MAX_WIPES  # one more attempt on the next poll
            task.close_dirty_and_revive(wipe=False)
            failed = TaskCorruptedError(
                f"{task.kind} task {task.id}: restoring failed {MAX_WIPES + 1} times in a row without "
                f"restoring anything since it was wiped ({cause}); fix the cause (disk space, permissions) "
                "and poll again",
                task_ids=frozenset({task.id}),
                task_id=task.id,
                path=cause.path or self.directory.task_dir(task.id),
            )
            failed.__cause__ = cause
            return failed
        self._handle_corrupted(task, error)
        return None

    def handle_corruption(self, task_ids: Iterable[TaskId]) -> None:
        """Wipe and restore these tasks (standbys first); other tasks keep running.

        The open transaction is committed first for the tasks that are not
        corrupted, as Kafka does, so their work is not lost.
        """
        ids = set(task_ids)
        for tid in sorted(ids):
            if tid in self._standby:
                self._handle_corrupted(self._standby[tid], TaskCorruptedError(f"task {tid} marked corrupted"))
        for tid in sorted(ids):
            if tid in self._active:
                self._active[tid].abort()
        try:
            self.commit()
        finally:
            for tid in sorted(ids):
                if tid in self._active:
                    self._handle_corrupted(
                        self._active[tid], TaskCorruptedError(f"task {tid} marked corrupted")
                    )

    # -- assignment ------------------------------------------------------------------------------

    def assign(self, active: Iterable[TaskId], standby: Iterable[TaskId]) -> None:
        """Make this instance own exactly ``active`` and ``standby`` tasks.

        Tasks kept stay as they are; tasks moving between active and standby
        are recycled (same stores, offsets and lock); revoked tasks are
        committed, suspended and closed cleanly; new tasks are created
        (startup standbys first) and initialized by the next :meth:`poll`.
        """
        self._check_open()
        self.start()
        want_active, want_standby = set(active), set(standby)
        both = want_active & want_standby
        if both:
            raise ValueError(f"tasks assigned both as active and standby: {sorted(map(str, both))}")
        leaving = [t for tid, t in self._active.items() if tid not in want_active]
        if any(t.commit_needed for t in leaving):
            self.commit()
        # Actives: keep, recycle to standby, or close.
        for tid, task in list(self._active.items()):
            if tid in want_active:
                continue
            del self._active[tid]
            self.updater.remove(tid)
            if tid in want_standby:
                self._standby[tid] = self._recycle_to_standby(task)
            else:
                self._close(task, clean=True)
        # Standbys: keep, promote, or close.
        for tid, standby_task in list(self._standby.items()):
            if tid in want_standby:
                continue
            del self._standby[tid]
            if tid in want_active:
                self.updater.remove(tid, SuspendReason.PROMOTED)
                self._active[tid] = self._recycle_to_active(standby_task)
            else:
                self.updater.remove(tid, SuspendReason.MIGRATED)
                self._close(standby_task, clean=True)
        # Startup standbys first, then new tasks.
        for tid in sorted(want_active - set(self._active)):
            startup = self._startup.pop(tid, None)
            if startup is not None:
                self._active[tid] = self._recycle_to_active(startup)
            else:
                self._active[tid] = ActiveTask(
                    tid, self._state_manager(tid, standby=False), self.changelog, self.collector
                )
        for tid in sorted(want_standby - set(self._standby)):
            startup = self._startup.pop(tid, None)
            if startup is not None:
                self._standby[tid] = startup
                self._add(startup)
            else:
                self._standby[tid] = StandbyTask(tid, self._state_manager(tid, standby=True), self.changelog)
        # Startup standbys nobody claimed are closed: memory stays bounded.
        for tid in list(self._startup):
            self._close(self._startup.pop(tid), clean=True)
        self._initialize_pending()

    def close_lost(self, task_ids: Iterable[TaskId]) -> None:
        """Close these active tasks dirty, committing nothing: this instance lost them (its group
        membership expired) and another instance may own them already.

        Their staged writes are dropped; the caller aborts the open transaction
        (it may hold their changelog writes) before calling this.
        """
        self._check_open()
        for tid in sorted(set(task_ids)):
            task = self._active.pop(tid, None)
            if task is None:
                continue
            self.updater.remove(tid)
            task.abort()
            self._close(task, clean=False)

    def _recycle_to_standby(self, task: ActiveTask) -> StandbyTask:
        """Suspend (offsets recorded as the policy says) and hand the state manager to a new standby."""
        task.suspend()
        return task.recycle()  # CREATED; the next _initialize_pending() adds it to the updater

    def _recycle_to_active(self, task: StandbyTask) -> ActiveTask:
        active = task.recycle()
        active.sender = self.collector
        return active

    def _close(self, task: Task, *, clean: bool) -> None:
        try:
            task.close(clean=clean)
        except StateStoreError as e:
            if not clean:
                raise
            logger.warning("%s task %s: clean close failed (%s); closing dirty", task.kind, task.id, e)
            task.close(clean=False)

    # -- polling -----------------------------------------------------------------------------

    def poll(self, timeout: float | None = None, *, commit: bool = True) -> bool:
        """Initialize new tasks, restore and update for at most a time slice, commit on the interval.

        Returns True when every active task is RUNNING. ``commit=False`` leaves
        committing to the caller (an application runner, whose commits carry
        its input positions in the same transaction).

        A changelog that gives no answer (its cluster down or stalled) holds back only its own
        tasks: everything else is done, then its ``ChangelogUnavailableError`` is raised; those
        tasks are as they were, and the next poll tries them again.
        """
        self._check_open()
        self.unanswered.new_poll()
        self._initialize_pending()
        self.updater.poll(timeout)
        stop: StateStoreError | None = None
        for task, error in self.updater.drain_failed():
            stop = self._handle_failed(task, error) or stop
        if stop is not None:
            raise stop
        self._initialize_pending()
        if commit and self._clock() - self._last_commit >= self.commit_interval:
            self.commit()
        unavailable = self._unavailable()
        if unavailable is not None:
            raise unavailable
        return self.all_running()

    def all_running(self) -> bool:
        """Whether every active task is RUNNING."""
        return all(t.state is TaskState.RUNNING for t in self._active.values())

    def restore(self, timeout: float | None = None) -> bool:
        """Poll until every active task is RUNNING (True) or ``timeout`` seconds passed (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.poll():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            if not self.updater.made_progress:
                time.sleep(_IDLE_WAIT)  # blocked (e.g. on an open transaction): do not spin
        return True

    # -- access ------------------------------------------------------------------------------

    def task(self, task_id: TaskId) -> Task:
        """The active or standby task ``task_id`` (``KeyError`` if this instance does not own it)."""
        task: Task | None = self._active.get(task_id) or self._standby.get(task_id)
        if task is None:
            raise KeyError(f"task {task_id} is not assigned to this instance")
        return task

    def active_task(self, task_id: TaskId) -> ActiveTask:
        """The active task ``task_id``."""
        try:
            return self._active[task_id]
        except KeyError:
            raise KeyError(f"task {task_id} is not an active task of this instance") from None

    def tasks(self) -> dict[TaskId, Task]:
        """Every owned task, active and standby."""
        return {**self._standby, **self._active}

    def active_tasks(self) -> dict[TaskId, ActiveTask]:
        """The active tasks."""
        return dict(self._active)

    def standby_tasks(self) -> dict[TaskId, StandbyTask]:
        """The standby tasks."""
        return dict(self._standby)

    def tasks_by_state(self) -> dict[str, int]:
        """How many owned tasks are in each state, ``"<kind> <STATE>"`` (e.g. ``"active RESTORING"``)."""
        counts: dict[str, int] = {}
        for task in self.tasks().values():
            key = f"{task.kind} {task.state.value}"
            counts[key] = counts.get(key, 0) + 1
        return counts

    def lag(self) -> dict[TaskId, dict[str, Lag]]:
        """Each owned task's stores' lag behind their changelogs, in committed records (and offsets beside).

        A store that holds every committed record has 0 records of lag, even
        when aborted records or transaction markers follow its offset.
        """
        out: dict[TaskId, dict[str, Lag]] = {}
        for tid, task in self.tasks().items():
            offsets = task.offsets()
            out[tid] = {
                cs.name: store_lag(self.changelog, cs.tp, offsets.get(cs.tp))
                for cs in task.changelog_stores()
            }
        return out

    # -- offset sums ---------------------------------------------------------------------------

    def task_offset_sums(self) -> dict[TaskId, int]:
        """Sum of changelog offsets per local task, so an assignor can place tasks where their state is.

        Owned and startup tasks report the offsets they hold in memory. Other
        non-empty task directories are read under their task lock, released
        at once; a directory locked elsewhere is skipped, an empty one is never
        locked. Unknown offsets are skipped; a sum is pinned at ``2**63 - 1``.
        """
        sums: dict[TaskId, int] = {}
        owned: dict[TaskId, Task] = {**self._startup, **self._standby, **self._active}
        for tid, task in owned.items():
            sums[tid] = _offset_sum(task.offsets().values())
        for tid in self.directory.non_empty_task_dirs():
            if tid in owned or not self.directory.lock(tid):
                continue
            try:
                sums[tid] = _offset_sum(self._recorded_offsets(tid).values())
            except StateStoreError as e:
                # As Kafka does: a task whose offsets cannot be read reports no sum
                # (the assignor treats it as holding no state); opening it wipes it.
                logger.warning("task %s: offsets unreadable, no offset sum reported: %s", tid, e)
            finally:
                self.directory.unlock(tid)
        return sums

    def _recorded_offsets(self, task_id: TaskId) -> dict[TopicPartition, int]:
        """Offsets recorded on disk for an unowned task (caller holds its lock); nothing is modified."""
        wanted = {
            name: TopicPartition(changelog_topic(self.directory.application_id, name), task_id.partition)
            for name in self.store_names
        }
        if self.policy.offsets is OffsetsMode.CHECKPOINT:
            loaded = OffsetCheckpoint(self.directory.checkpoint_path(task_id)).read()
            return {
                tp: off for tp in wanted.values() if (off := committed_offset(loaded.get(tp))) is not None
            }
        out: dict[TopicPartition, int] = {}
        for name, tp in wanted.items():
            path = self.directory.store_dir(task_id, name)
            if not (path / "CURRENT").exists():
                continue
            try:
                recorded = read_offsets(path)
            except StoreError as e:
                raise StoreError(
                    f"task {task_id}: cannot read the offsets of store {path}: {e}",
                    path=path,
                    task_id=task_id,
                ) from e
            offset = committed_offset(recorded.get(str(tp)))
            if offset is not None:
                out[tp] = offset
        return out

    # -- commit and close ----------------------------------------------------------------------

    def commit(self) -> None:
        """Commit every task.

        Exactly-once: commit the changelog transaction, then let each RUNNING
        active task apply its staged writes with the offsets they were written
        at. At-least-once: flush the changelog, then apply and record offsets
        as the policy says. Standbys record their offsets (both guarantees).
        If the changelog commit fails the transaction is aborted, every
        task's staged writes are dropped and the error is raised; a fenced
        producer means another instance took over: close dirty.
        """
        self._check_open()
        self._last_commit = self._clock()
        running = [t for t in self._active.values() if t.state is TaskState.RUNNING]
        delivered: dict[TopicPartition, int] = {}
        if self._collector is not None:
            try:
                delivered = self._collector.commit()
            except (ProducerFencedError, TransactionInDoubtError):
                # Nothing to abort: a fenced producer's transaction is the broker's to abort, and one
                # in doubt is settled by its commit asked again, or by the next producer of the id.
                for t in running:
                    t.abort()
                raise
            except LogError as e:
                try:
                    self._collector.abort()
                except StateStoreError as abort_error:
                    # The transaction cannot be aborted either (e.g. the client's state is fatal): the
                    # next producer of the id, or the transaction timeout, aborts it. The tasks' staged
                    # writes are dropped all the same, and the commit's own error is the one raised.
                    logger.warning(
                        "aborting the transaction after a failed commit failed too: %s", abort_error
                    )
                    e.add_note(f"aborting the transaction failed too: {abort_error}")
                for t in running:
                    t.abort()
                raise
        corrupted: list[TaskCorruptedError] = []
        for t in running:
            if t.commit_needed:
                try:
                    t.commit(delivered)
                except TaskCorruptedError as e:
                    # Damaged store files (e.g. found by a background compaction): the changelog
                    # already holds these writes, so the other tasks commit and this one is wiped
                    # and restored by handle_corruption(), which the caller runs as Kafka's stream
                    # thread does.
                    logger.warning("%s task %s: commit found its local state corrupted: %s", t.kind, t.id, e)
                    corrupted.append(e)
        self.updater.record_offsets()
        if corrupted:
            raise _combined(corrupted)

    def close(self, clean: bool = True) -> None:
        """Close every task (committing first when clean), the updater and the producer.

        A dirty close aborts the open transaction (at-least-once: flushes what
        was sent, before any task lock is released) and records nothing beyond
        what the policy keeps for a dirty close.
        """
        if self._closed:
            return
        try:
            if clean:
                try:
                    self.commit()
                except StateStoreError as e:
                    logger.warning("final commit failed (%s); closing dirty", e)
                    clean = False
            if not clean and self._collector is not None:
                try:
                    self._collector.abort()
                    if not self._collector.transactional:
                        # At-least-once: what was sent reaches the changelog, and it must get there
                        # before the task locks go. Flushed later (by this process's shared partition
                        # writer), it would land behind the back of a next owner that restored to an
                        # end offset without it, and whose committed offset would then vouch for it.
                        self._collector.producer.flush()
                except StateStoreError as e:
                    logger.warning("aborting or flushing the changelog producer failed: %s", e)
            self.updater.close()
            for task in [*self._active.values(), *self._standby.values(), *self._startup.values()]:
                self.updater.remove(task.id)
                self._close(task, clean=clean)
            self._active.clear()
            self._standby.clear()
            self._startup.clear()
        finally:
            self._closed = True
            if self._collector is not None:
                try:
                    self._collector.close()
                except StateStoreError as e:
                    logger.warning("closing the changelog producer failed: %s", e)
            if self._owns_directory:
                self.directory.close()

    def __enter__(self) -> TaskManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(clean=exc == (None, None, None))


def _combined(errors: list[TaskCorruptedError]) -> TaskCorruptedError:
    """One ``TaskCorruptedError`` naming every task of ``errors`` (the first is the cause)."""
    if len(errors) == 1:
        return errors[0]
    ids = frozenset().union(*(e.task_ids for e in errors))
    out = TaskCorruptedError(
        f"tasks {', '.join(sorted(map(str, ids)))} are corrupted: " + "; ".join(map(str, errors)),
        task_ids=ids,
        path=errors[0].path,
    )
    out.__cause__ = errors[0]
    return out


#: Largest offset sum reported (Kafka pins overflowing sums at Long.MAX_VALUE).
MAX_OFFSET_SUM = 2**63 - 1


def _offset_sum(offsets: Iterable[int | None]) -> int:
    return min(MAX_OFFSET_SUM, sum(o for o in offsets if o is not None and o >= 0))


__all__ = ["DEFAULT_MAX_STARTUP_TASKS", "MAX_OFFSET_SUM", "MAX_WIPES", "TaskManager"]
