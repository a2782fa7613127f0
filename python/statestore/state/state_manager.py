"""The stores of one task and their changelog offsets, driven by the policy table.

A :class:`StateManager` does no I/O until :meth:`StateManager.initialize`, which
takes the task lock *first* and only then opens stores and reads offsets
(KAFKA-8574/8187: offsets read before the lock can be stale). Every later write
of offsets -- into the stores or the ``.checkpoint`` file -- first checks that
this very lock acquisition is still current (:meth:`StateDirectory.ensure_held`),
so a state manager that lost its lock, or whose directory was deleted, fails
with ``LockError`` and writes nothing.

Which lifecycle event writes, deletes or keeps offsets, flushes or wipes is not
decided here but looked up in :data:`statestore.state.policy.POLICY_TABLE`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from statestore.errors import IllegalStateError, LockError, StateStoreError, TaskCorruptedError
from statestore.ids import OFFSET_UNKNOWN, TaskId, TopicPartition, changelog_topic, committed_offset
from statestore.state.checkpoint import CHECKPOINT_FILE_NAME, OffsetCheckpoint
from statestore.state.directory import StateDirectory, TaskLock
from statestore.state.policy import Decision, Event, OffsetAction, OffsetsMode, Policy
from statestore.state.store import InMemoryStore, Store, check_format

logger = logging.getLogger(__name__)

#: Either kind of store a state manager holds.
AnyStore = Store | InMemoryStore


class StoreHolder(Protocol):
    """Who keeps a task's released stores open between restores of them
    (:class:`statestore.restore.engine.OpenStores`, for the state updater)."""

    def flush(self, path: Path) -> bool:
        """Flush the store open at ``path``; whether one was open."""
        ...

    def close(self, path: Path) -> bool:
        """Flush and close the store open at ``path``; whether one was open."""
        ...


@dataclass
class _StoreMeta:
    """What the state manager knows about one registered store."""

    name: str
    logged: bool
    persistent: bool
    changelog: TopicPartition | None
    #: The store's format (``STORE_FORMATS``: Kafka Streams' plain or timestamped key-value store).
    format: str = "plain"
    store: AnyStore | None = None
    offset: int | None = None
    corrupted: bool = False

    @property
    def checkpointable(self) -> bool:
        """Logged, persistent and not corrupted: its offset is recorded."""
        return self.changelog is not None and self.persistent and not self.corrupted


class StateManager:
    """The stores of task ``task_id`` in ``directory``, and their changelog offsets.

    Register stores with :meth:`register`, then :meth:`initialize`. The
    lifecycle methods (:meth:`commit`, :meth:`complete_restoration`,
    :meth:`suspend`, :meth:`resume`, :meth:`close` ...) apply the policy's
    decision for their event. Under exactly-once, call :meth:`commit` only
    after the changelog transaction has committed: that is what keeps
    uncommitted data out of RocksDB.

    Not thread-safe: one thread at a time (not necessarily the lock owner --
    the lock token travels with the manager).
    """

    def __init__(
        self,
        directory: StateDirectory,
        task_id: TaskId,
        policy: Policy | None = None,
        *,
        standby: bool = False,
    ) -> None:
        self.directory = directory
        self.task_id = task_id
        self.policy = policy if policy is not None else Policy()
        self.standby = standby
        self.checkpoint_file = OffsetCheckpoint(directory.checkpoint_path(task_id))
        self._stores: dict[str, _StoreMeta] = {}
        self._lock: TaskLock | None = None
        self._recorded: dict[TopicPartition, int] | None = None
        self._state = "created"
        # Who holds the released stores open (lend_stores), if anyone.
        self._holder: StoreHolder | None = None

    def __repr__(self) -> str:
        return f"StateManager(task {self.task_id}, {self.policy.guarantee.value}, offsets={self.policy.offsets.value})"

    # -- registration -----------------------------------------------------------------

    def register(
        self, name: str, *, logged: bool = True, persistent: bool = True, format: str = "plain"
    ) -> None:
        """Declare a store. Its changelog is ``<application_id>-<name>-changelog``, task partition.

        ``format`` is the persistent store's format (``"plain"`` or ``"timestamped"``, Kafka
        Streams' timestamped key-value store, whose values are ``encode_timestamped`` bytes).

        A duplicate name, or a store named ``.checkpoint``, raises ``ValueError``.
        Registration does no I/O; stores are opened by :meth:`initialize`.
        """
        if name == CHECKPOINT_FILE_NAME:
            raise ValueError(
                f"task {self.task_id}: illegal store name {name!r}: it is the checkpoint file's name"
            )
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"task {self.task_id}: store name {name!r} cannot name a directory")
        if name in self._stores:
            raise ValueError(f"task {self.task_id}: store {name!r} has already been registered")
        if self._state != "created":
            raise IllegalStateError(f"task {self.task_id}: register stores before initialize()")
        tp = (
            TopicPartition(changelog_topic(self.directory.application_id, name), self.task_id.partition)
            if logged
            else None
        )
        self._stores[name] = _StoreMeta(name, logged, persistent, tp, check_format(format))

    def store(self, name: str) -> AnyStore:
        """The open store called ``name``."""
        meta = self._meta(name)
        if meta.store is None:
            raise IllegalStateError(f"task {self.task_id}: store {name!r} is not open; initialize() first")
        return meta.store

    def _meta(self, name: str) -> _StoreMeta:
        try:
            return self._stores[name]
        except KeyError:
            raise KeyError(f"task {self.task_id}: no store {name!r} is registered") from None

    def store_names(self) -> list[str]:
        """Registered store names, in registration order."""
        return list(self._stores)

    def store_formats(self) -> dict[str, str]:
        """Registered store name -> its format, in registration order."""
        return {m.name: m.format for m in self._stores.values()}

    def changelog_partition(self, name: str) -> TopicPartition | None:
        """The changelog partition of store ``name``, None if it is not logged."""
        return self._meta(name).changelog

    def changelog_partitions(self) -> dict[str, TopicPartition]:
        """Store name -> changelog partition, for every logged store."""
        return {m.name: m.changelog for m in self._stores.values() if m.changelog is not None}

    @property
    def lock_token(self) -> TaskLock | None:
        """The token of the task lock taken by :meth:`initialize`, None before."""
        return self._lock

    # -- offsets ----------------------------------------------------------------------

    def offsets(self) -> dict[TopicPartition, int | None]:
        """Changelog partition -> offset of the last applied record (None: restore from the beginning)."""
        return {m.changelog: m.offset for m in self._stores.values() if m.changelog is not None}

    def update_offsets(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Record that the stores now reflect the changelog up to ``offsets``; unknown partitions are ignored."""
        by_tp = {m.changelog: m for m in self._stores.values() if m.changelog is not None}
        for tp, offset in offsets.items():
            meta = by_tp.get(TopicPartition(*tp))
            if meta is None:
                logger.debug("task %s: ignoring offset %d of unknown partition %s", self.task_id, offset, tp)
                continue
            if offset < 0:
                raise ValueError(f"task {self.task_id}: negative offset {offset} for {tp}")
            meta.offset = offset

    def mark_changelog_corrupted(self, partitions: Iterable[TopicPartition]) -> None:
        """Exclude these partitions' stores from recorded offsets until the task is wiped."""
        wanted = {TopicPartition(*tp) for tp in partitions}
        for meta in self._stores.values():
            if meta.changelog in wanted:
                meta.corrupted = True

    # -- initialization -----------------------------------------------------------------

    def initialize(self) -> None:
        """Lock the task, open its stores, load their offsets as the policy says.

        Raises ``LockError`` if another thread or process holds the lock (retry
        later), ``CheckpointError`` for a damaged checkpoint file, and
        ``TaskCorruptedError`` when a logged persistent store has no offset but
        local state exists under exactly-once: wipe (:meth:`wipe`) and
        initialize again, which restores it from the changelog. After such a
        failure the stores are closed and the lock is still held.
        """
        if self._state == "closed":
            raise IllegalStateError(f"task {self.task_id}: state manager is closed; create a new one")
        if self._state == "initialized":
            raise IllegalStateError(f"task {self.task_id}: state manager is already initialized")
        for meta in self._stores.values():
            if meta.corrupted:
                raise IllegalStateError(
                    f"task {self.task_id}: store {meta.name} is marked corrupted; wipe the task before "
                    "initializing its offsets",
                    task_id=self.task_id,
                )
        if self._lock is None:
            token = self.directory.acquire(self.task_id)
            if token is None:
                raise LockError(
                    f"task {self.task_id}: {self.directory.task_dir(self.task_id)} is locked by another thread "
                    "or process; retry once it has released the task",
                    path=self.directory.task_dir(self.task_id),
                    task_id=self.task_id,
                )
            self._lock = token
        # From here on, everything happens under the lock.
        dir_was_empty = self.directory.is_empty(self.task_id)
        self._open_stores()
        try:
            self._load_offsets(self.policy.decide(Event.INIT), dir_was_empty)
        except BaseException:
            # Nothing is trusted: stores closed, offsets unknown, lock kept so the
            # caller can wipe() and initialize() again, or close() (which then
            # records nothing, so the evidence of corruption stays on disk).
            for meta in self._stores.values():
                meta.offset = None
            try:
                self._close_stores(clean=False)
            except StateStoreError as e:
                logger.error("task %s: closing stores after a failed initialization: %s", self.task_id, e)
            raise
        self._state = "initialized"

    def _open_stores(self) -> None:
        stores_dir = self.directory.stores_dir(self.task_id)
        if any(m.persistent for m in self._stores.values()):
            self.directory.ensure_held(self._lock, what="open stores")
            try:
                stores_dir.mkdir(exist_ok=True)
            except FileNotFoundError as e:
                raise LockError(
                    f"task {self.task_id}: task directory {stores_dir.parent} vanished while locked; "
                    "close the task dirty and let it be assigned again",
                    path=stores_dir.parent,
                    task_id=self.task_id,
                ) from e
        try:
            for meta in self._stores.values():
                if meta.store is None:
                    meta.store = (
                        Store(
                            stores_dir / meta.name, name=meta.name, task_id=self.task_id, format=meta.format
                        )
                        if meta.persistent
                        else InMemoryStore(meta.name)
                    )
        except BaseException:
            self._close_stores(clean=False)
            raise

    def _load_offsets(self, decision: Decision, dir_was_empty: bool) -> None:
        missing: list[str] = []
        if self.policy.offsets is OffsetsMode.STORE:
            for meta in self._stores.values():
                if not (meta.changelog is not None and meta.persistent):
                    continue
                assert isinstance(meta.store, Store)
                recorded = meta.store.recorded_offset(meta.changelog)
                meta.offset = committed_offset(recorded)
                # Kafka Streams' OFFSET_UNKNOWN vouches for the store (its task committed no
                # changelog record yet): restored from the changelog's start, never corruption.
                if recorded is None and not meta.store.is_empty():
                    missing.append(f"{meta.name} ({meta.changelog}, store {meta.store.path})")
        else:
            loaded = self.checkpoint_file.read()
            for meta in self._stores.values():
                if not (meta.changelog is not None and meta.persistent):
                    continue
                if meta.changelog in loaded:
                    meta.offset = committed_offset(loaded.pop(meta.changelog))
                else:
                    meta.offset = None
                    if not dir_was_empty:
                        missing.append(f"{meta.name} ({meta.changelog}, {self.checkpoint_file.path})")
            for tp, offset in loaded.items():
                logger.warning(
                    "task %s: %s has offset %d for %s, which no registered store logs; ignored",
                    self.task_id,
                    self.checkpoint_file.path,
                    offset,
                    tp,
                )
        if missing and decision.corrupt_if_missing:
            raise TaskCorruptedError(
                f"task {self.task_id}: no changelog offset for {', '.join(missing)} although local state "
                f"exists in {self.directory.task_dir(self.task_id)} under {self.policy.guarantee.value}; "
                "its contents cannot be trusted -- wipe the task and restore it from the changelog",
                task_ids=frozenset({self.task_id}),
                task_id=self.task_id,
                path=self.directory.task_dir(self.task_id),
            )
        if decision.offsets is OffsetAction.LOAD_DELETE:
            self.directory.ensure_held(self._lock, what="delete the checkpoint")
            self.checkpoint_file.delete()
        self._recorded = {tp: off for tp, off in self.offsets().items() if off is not None}

    # -- lifecycle events -----------------------------------------------------------------

    def _check_initialized(self, what: str) -> None:
        if self._state != "initialized":
            raise IllegalStateError(f"task {self.task_id}: cannot {what}: state manager is {self._state}")

    def flush(self) -> None:
        """Flush every store's committed data to disk, in registration order (also stores lent out)."""
        if self._holder is not None:
            self._each_lent("flush", self._holder.flush)
        first: BaseException | None = None
        for meta in self._stores.values():
            if meta.store is not None and not meta.store.closed:
                try:
                    meta.store.flush()
                except StateStoreError as e:
                    logger.error("task %s: flush of store %s failed: %s", self.task_id, meta.name, e)
                    first = first or e
        if first is not None:
            raise first

    def _recordable(self) -> dict[TopicPartition, int]:
        return {
            m.changelog: m.offset
            for m in self._stores.values()
            if m.checkpointable and m.changelog is not None and m.offset is not None
        }

    def _apply_staged(self, decision: Decision) -> None:
        """Apply every store's staged writes; in store mode with their offsets in the same batch."""
        with_offsets = self.policy.offsets is OffsetsMode.STORE and decision.offsets in (
            OffsetAction.WRITE,
            OffsetAction.WRITE_IF_MOVED,
        )
        if any(m.store is not None and m.store.uncommitted for m in self._stores.values()) or with_offsets:
            self.directory.ensure_held(self._lock, what="commit")
        for meta in self._stores.values():
            if meta.store is None:
                continue
            offsets = None
            if (
                with_offsets
                and meta.checkpointable
                and meta.changelog is not None
                and meta.offset is not None
            ):
                offsets = {meta.changelog: meta.offset}
            meta.store.commit(offsets)

    def _run(self, event: Event) -> bool:
        """Apply the policy's decision for ``event``; True if offsets were written."""
        decision = self.policy.decide(event)
        self.directory.ensure_held(self._lock, what=f"{event.value} task {self.task_id}")
        current = self._recordable()
        self._apply_staged(decision)
        write = self.policy.should_write(decision, self._recorded, current)
        if decision.flush and (write or decision.offsets is not OffsetAction.WRITE_IF_MOVED):
            self.flush()
        if write:
            if self.policy.offsets is OffsetsMode.CHECKPOINT:
                self._write_checkpoint()
            self._recorded = current
        elif decision.offsets is OffsetAction.DELETE:
            self.directory.ensure_held(self._lock, what="delete the checkpoint")
            self.checkpoint_file.delete()
        return write

    def _write_checkpoint(self) -> None:
        entries = {
            m.changelog: (m.offset if m.offset is not None else OFFSET_UNKNOWN)
            for m in self._stores.values()
            if m.checkpointable and m.changelog is not None
        }
        self.directory.ensure_held(self._lock, what=f"write checkpoint {self.checkpoint_file.path}")
        self.checkpoint_file.write(entries)

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> bool:
        """Apply the staged writes, which correspond to the changelog up to ``offsets``.

        In store mode the offsets go in the same WriteBatch as the data. In
        checkpoint mode the file is written or not as the policy says. Returns
        whether offsets were recorded. ``LockError`` if the lock was lost.
        """
        self._check_initialized("commit")
        if offsets:
            self.update_offsets(offsets)
        return self._run(Event.STANDBY_COMMIT if self.standby else Event.COMMIT)

    def restoration_progress(self, offsets: Mapping[TopicPartition, int]) -> bool:
        """Restoration applied the changelog up to ``offsets``; record them if the policy says so."""
        self._check_initialized("record restoration progress")
        self.update_offsets(offsets)
        return self._run(Event.RESTORE_PROGRESS)

    def complete_restoration(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        """Restoration reached the end offsets; called before the task turns RUNNING."""
        self._check_initialized("complete restoration")
        if offsets:
            self.update_offsets(offsets)
        self._run(Event.RESTORE_COMPLETE)

    def suspend(self) -> None:
        """Clean suspension after the final commit: flush and record offsets."""
        self._check_initialized("suspend")
        self._require_committed("suspend")
        self._run(Event.SUSPEND)

    def resume(self) -> None:
        """A suspended task resumes processing."""
        self._check_initialized("resume")
        self._run(Event.RESUME)

    def _require_committed(self, what: str) -> None:
        pending = [m.name for m in self._stores.values() if m.store is not None and m.store.uncommitted]
        if pending:
            raise IllegalStateError(
                f"task {self.task_id}: cannot {what} cleanly with uncommitted writes in {', '.join(pending)}; "
                "commit first, or close dirty",
                task_id=self.task_id,
            )

    # -- closing and wiping -----------------------------------------------------------

    def _close_stores(self, *, clean: bool) -> None:
        first: BaseException | None = None
        for meta in self._stores.values():
            if meta.store is None:
                continue
            try:
                meta.store.close(clean=clean)
            except StateStoreError as e:
                logger.error("task %s: closing store %s failed: %s", self.task_id, meta.name, e)
                first = first or e
            finally:
                meta.store = None
        if first is not None:
            raise first

    @property
    def initialized(self) -> bool:
        """Whether :meth:`initialize` succeeded and the manager is not closed or wiped since."""
        return self._state == "initialized"

    def release_stores(self) -> None:
        """Close the RocksDB stores cleanly but keep the lock and the offsets: for the Rust restore engine.

        rocksdict and the restore engine must never hold one store open at the
        same time. Staged writes must have been committed first.
        """
        self._check_initialized("release stores")
        self._require_committed("release the stores")
        self._close_stores(clean=True)

    def reopen_stores(self) -> None:
        """Open the stores again after :meth:`release_stores` (the lock must still be held)."""
        self._check_initialized("reopen stores")
        self.reclaim_stores()
        self._open_stores()

    def lend_stores(self, holder: StoreHolder) -> None:
        """The released stores may be kept open by ``holder`` (the state updater's engine).

        The holder's stores are flushed whenever this manager flushes (before
        it records offsets outside them, as the policy says), and closed
        before anything else opens, closes or wipes them (:meth:`reclaim_stores`).
        """
        self._holder = holder

    def reclaim_stores(self) -> None:
        """Have the holder the stores were lent to flush and close them; nothing if not lent."""
        holder, self._holder = self._holder, None
        if holder is not None:
            self._each_lent("close", holder.close)

    def _each_lent(self, what: str, act: Callable[[Path], object]) -> None:
        """``act`` (the holder's flush or close, named ``what``) on every persistent store; the first failure.

        A store that fails has its changelog marked corrupted: what the holder
        had not flushed is lost while the offsets here count it, so none may be
        recorded for that store until the task is wiped.
        """
        stores_dir = self.directory.stores_dir(self.task_id)
        first: StateStoreError | None = None
        for meta in self._stores.values():
            if not meta.persistent:
                continue
            try:
                act(stores_dir / meta.name)
            except StateStoreError as e:
                logger.error("task %s: %s of store %s failed: %s", self.task_id, what, meta.name, e)
                if meta.changelog is not None:
                    self.mark_changelog_corrupted([meta.changelog])
                first = first or e
        if first is not None:
            raise first

    def _holds_lock(self) -> bool:
        try:
            self.directory.ensure_held(self._lock)
        except LockError:
            return False
        return True

    def close(self, *, clean: bool = True) -> None:
        """Close the stores and release the lock.

        Clean: flush and record offsets first (``IllegalStateError`` if writes
        are still uncommitted). Dirty: record nothing; under exactly-once with
        a checkpoint the task is wiped. If the lock was lost, the stores are
        closed without writing anything and ``LockError`` is raised.
        """
        if self._state == "closed":
            return
        if clean and self._state == "initialized":
            self._require_committed("close")
        lost: LockError | None = None
        try:
            try:
                self.reclaim_stores()
            except StateStoreError:
                pass  # logged, and the store marked: no offset vouches for what the holder lost
            if self._state == "initialized" and clean:
                try:
                    self._run(Event.CLOSE_CLEAN)
                except LockError as e:
                    lost = e
            stores_clean = clean and lost is None and self._holds_lock()
            try:
                self._close_stores(clean=stores_clean)
            except StateStoreError:
                if lost is None:
                    raise
                # already logged; the lost lock is what the caller must hear about
            if not clean and self._state == "initialized":
                decision = self.policy.decide(Event.CLOSE_DIRTY)
                if decision.wipe and self._holds_lock():
                    self.directory.wipe(self.task_id, self._lock)
                elif decision.offsets is OffsetAction.DELETE and self._holds_lock():
                    self.checkpoint_file.delete()
        finally:
            if self._lock is not None:
                self.directory.release(self._lock)
            self._lock = None
            self._state = "closed"
            for meta in self._stores.values():
                meta.offset = None
        if lost is not None:
            raise lost

    def wipe(self) -> None:
        """Close the stores and delete the task's local state; the lock stays held.

        Offsets become unknown, so the next :meth:`initialize` restores from
        the beginning. Corruption marks are cleared.
        """
        try:
            self.reclaim_stores()
        except StateStoreError:
            pass  # logged; the files go anyway
        self._close_stores(clean=False)
        self.directory.wipe(self.task_id, self._lock)
        for meta in self._stores.values():
            meta.offset = None
            meta.corrupted = False
        self._recorded = None
        if self._state == "initialized":
            self._state = "created"


__all__ = ["StateManager"]
