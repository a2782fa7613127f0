"""StateManager: registration, offsets loaded after locking, commit/flush/close/wipe (reference §7 items 19-29)."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from statestore import (
    CheckpointError,
    IllegalStateError,
    LockError,
    OffsetCheckpoint,
    TaskCorruptedError,
    TaskId,
    TopicPartition,
)
from statestore._native import _testing
from statestore.state.directory import StateDirectory
from statestore.state.policy import Policy
from statestore.state.state_manager import StateManager
from statestore.state.store import Store
from support.model import store_contents

TASK = TaskId(0, 1)
P = TopicPartition("app-persistent-changelog", 1)
P2 = TopicPartition("app-persistentTwo-changelog", 1)
MEM = TopicPartition("app-inMemory-changelog", 1)
IRRELEVANT = TopicPartition("other-changelog", 9)

ALOS_CKPT = Policy.of("at_least_once", "checkpoint")
EOS_CKPT = Policy.of("exactly_once_v2", "checkpoint")
ALOS_STORE = Policy.of("at_least_once", "store")
EOS_STORE = Policy.of("exactly_once_v2", "store")


@pytest.fixture
def sd(tmp_path: Path) -> Iterator[StateDirectory]:
    d = StateDirectory(tmp_path, "app")
    yield d
    d.close()


def manager(sd: StateDirectory, policy: Policy, *, standby: bool = False) -> StateManager:
    sm = StateManager(sd, TASK, policy, standby=standby)
    sm.register("persistent")
    sm.register("persistentTwo")
    sm.register("inMemory", persistent=False)
    sm.register("unlogged", logged=False)
    return sm


def write_checkpoint(sd: StateDirectory, offsets: dict[TopicPartition, int]) -> OffsetCheckpoint:
    assert sd.lock(TASK)
    sd.unlock(TASK)
    ckpt = OffsetCheckpoint(sd.checkpoint_path(TASK))
    ckpt.write(offsets)
    return ckpt


def make_non_empty(sd: StateDirectory) -> None:
    """Leave committed data in the `persistent` store, with no offsets anywhere."""
    assert sd.lock(TASK)
    sd.stores_dir(TASK).mkdir(exist_ok=True)
    with Store(sd.store_dir(TASK, "persistent")) as s:
        s.put(b"k", b"v")
        s.commit()
    sd.unlock(TASK)


# -- registration -----------------------------------------------------------------------


def test_changelog_partitions_follow_the_naming_rule(sd: StateDirectory) -> None:
    sm = manager(sd, ALOS_STORE)
    assert sm.changelog_partition("persistent") == P
    assert sm.changelog_partition("inMemory") == MEM
    assert sm.changelog_partition("unlogged") is None
    assert sm.changelog_partitions() == {"persistent": P, "persistentTwo": P2, "inMemory": MEM}
    assert sm.store_names() == ["persistent", "persistentTwo", "inMemory", "unlogged"]


def test_registration_rejects_duplicates_and_the_checkpoint_name(sd: StateDirectory) -> None:
    """Item 29b: a store named `.checkpoint` is refused, as is a duplicate name."""
    sm = manager(sd, ALOS_STORE)
    with pytest.raises(ValueError, match="already been registered"):
        sm.register("persistent")
    with pytest.raises(ValueError, match="checkpoint"):
        sm.register(".checkpoint")
    with pytest.raises(ValueError):
        sm.register("a/b")
    with pytest.raises(KeyError):
        sm.store("nope")


def test_nothing_is_read_before_the_lock(sd: StateDirectory) -> None:
    """Offsets are read only under the lock: a manager that cannot lock reads and writes nothing."""
    ckpt = write_checkpoint(sd, {P: 10})
    holder_ready = threading.Event()
    stop = threading.Event()

    def holder() -> None:
        assert sd.lock(TASK)
        holder_ready.set()
        stop.wait()
        sd.unlock(TASK)

    t = threading.Thread(target=holder)
    t.start()
    holder_ready.wait()
    try:
        sm = manager(sd, EOS_CKPT)
        with pytest.raises(LockError, match="locked by another thread"):
            sm.initialize()
        assert sm.offsets()[P] is None
        assert ckpt.read() == {P: 10}  # not loaded, not deleted
        with pytest.raises(IllegalStateError):
            sm.commit({P: 11})
    finally:
        stop.set()
        t.join()
    sm.initialize()  # the lock is free now: loads, then (EOS) deletes
    assert sm.offsets()[P] == 10 and not ckpt.exists()
    sm.close()


# -- loading offsets: items 19-23, 27, 29 ------------------------------------------------


def test_initialize_offsets_from_checkpoint_file(sd: StateDirectory) -> None:
    """Item 19 (ALOS): persistent gets 10, persistentTwo and inMemory none; the file is kept."""
    ckpt = write_checkpoint(sd, {P: 10, MEM: 10, IRRELEVANT: 5})
    sm = manager(sd, ALOS_CKPT)
    sm.initialize()
    assert sm.offsets() == {P: 10, P2: None, MEM: None}
    assert ckpt.read() == {P: 10, MEM: 10, IRRELEVANT: 5}
    sm.close()


def test_initialize_offsets_from_checkpoint_and_delete_under_eos(sd: StateDirectory) -> None:
    """Item 20: the same under EOS, and the file is deleted afterwards."""
    ckpt = write_checkpoint(sd, {P: 10, MEM: 10, IRRELEVANT: 5})
    sm = manager(sd, EOS_CKPT)
    sm.initialize()
    assert sm.offsets() == {P: 10, P2: None, MEM: None}
    assert not ckpt.exists()
    sm.close(clean=False)


def test_sentinel_offset_loads_as_unknown(sd: StateDirectory) -> None:
    write_checkpoint(sd, {P: -4, P2: 3})
    sm = manager(sd, ALOS_CKPT)
    sm.initialize()
    assert sm.offsets()[P] is None and sm.offsets()[P2] == 3
    sm.close()


@pytest.mark.parametrize("policy", [EOS_CKPT, EOS_STORE], ids=["checkpoint", "store"])
def test_task_corrupted_without_offset_and_non_empty_dir(sd: StateDirectory, policy: Policy) -> None:
    """Item 21: EOS, local state present, no offset for a persistent store -> TaskCorruptedError({task})."""
    make_non_empty(sd)
    write_checkpoint(sd, {P2: 5})  # `persistent` has data but no offset
    sm = manager(sd, policy)
    with pytest.raises(TaskCorruptedError, match="wipe the task") as e:
        sm.initialize()
    assert e.value.task_ids == frozenset({TASK})
    assert e.value.task_id == TASK
    # the way out: wipe, initialize again, restore from the beginning
    sm.wipe()
    assert sd.is_empty(TASK)
    sm.initialize()
    assert sm.offsets() == {P: None, P2: None, MEM: None}
    sm.close()


@pytest.mark.parametrize("policy", [ALOS_CKPT, ALOS_STORE], ids=["checkpoint", "store"])
def test_missing_offset_is_not_corruption_under_alos(sd: StateDirectory, policy: Policy) -> None:
    make_non_empty(sd)
    sm = manager(sd, policy)
    sm.initialize()
    assert sm.offsets()[P] is None  # restore from the beginning over what is there
    sm.close()


def test_missing_in_memory_offset_is_not_corruption(sd: StateDirectory) -> None:
    """Item 22: under EOS, an in-memory store missing from the checkpoint does not count."""
    make_non_empty(sd)
    write_checkpoint(sd, {P: 3, P2: 4})
    sm = manager(sd, EOS_CKPT)
    sm.initialize()
    assert sm.offsets() == {P: 3, P2: 4, MEM: None}
    sm.close()


@pytest.mark.parametrize("policy", [EOS_CKPT, EOS_STORE], ids=["checkpoint", "store"])
def test_no_task_corruption_after_checkpointing(sd: StateDirectory, policy: Policy) -> None:
    """Item 23: EOS; offsets recorded by a clean close, then re-registered with a non-empty dir."""
    sm = manager(sd, policy)
    sm.initialize()
    sm.store("persistent").put(b"k", b"v")
    sm.store("persistentTwo").put(b"k", b"v")
    sm.commit({P: 7, P2: 8})
    sm.close()
    assert not sd.is_empty(TASK)
    again = manager(sd, policy)
    again.initialize()
    assert again.offsets() == {P: 7, P2: 8, MEM: None}
    assert again.store("persistent").get(b"k") == b"v"
    again.close()


def test_damaged_checkpoint_fails_initialize(sd: StateDirectory) -> None:
    """Item 27: a checkpoint containing `abcdefg` -> CheckpointError naming the file."""
    assert sd.lock(TASK)
    sd.unlock(TASK)
    sd.checkpoint_path(TASK).write_text("abcdefg")
    sm = manager(sd, ALOS_CKPT)
    with pytest.raises(CheckpointError, match=r"\.checkpoint:1"):
        sm.initialize()
    sm.close(clean=False)


def test_initializing_offsets_of_a_corrupted_store_is_illegal(sd: StateDirectory) -> None:
    """Item 29a: a store marked corrupted must be wiped before its offsets are initialized."""
    sm = manager(sd, EOS_CKPT)
    sm.mark_changelog_corrupted([P])
    with pytest.raises(IllegalStateError, match="corrupted"):
        sm.initialize()
    assert sd.lock(TASK)  # and the lock was not taken
    sd.unlock(TASK)


def test_initialize_twice_or_after_close_is_illegal(sd: StateDirectory) -> None:
    sm = manager(sd, ALOS_STORE)
    sm.initialize()
    with pytest.raises(IllegalStateError):
        sm.initialize()
    sm.close()
    with pytest.raises(IllegalStateError, match="closed"):
        sm.initialize()


# -- writing offsets: items 24-26, 28 ----------------------------------------------------


@pytest.mark.parametrize(
    "policy", [ALOS_CKPT, ALOS_STORE, EOS_STORE], ids=["alos-ckpt", "alos-store", "eos-store"]
)
def test_offset_of_last_restored_record_is_recorded(sd: StateDirectory, policy: Policy) -> None:
    """Item 24: restoring a record at offset 100 records {tp: 100}, the last applied offset."""
    sm = manager(sd, policy)
    sm.initialize()
    sm.complete_restoration({P: 100})
    sm.close(clean=False)  # only what restoration recorded counts
    if policy is ALOS_CKPT:
        assert OffsetCheckpoint(sd.checkpoint_path(TASK)).read() == {P: 100, P2: -4}
    else:
        with Store(sd.store_dir(TASK, "persistent")) as s:
            assert s.offsets() == {P: 100}


def test_no_checkpoint_for_in_memory_or_unlogged_stores(sd: StateDirectory) -> None:
    """Item 25: only logged persistent stores appear; with none, the file reads back empty."""
    sm = StateManager(sd, TASK, ALOS_CKPT)
    sm.register("inMemory", persistent=False)
    sm.register("unlogged", logged=False)
    sm.initialize()
    sm.update_offsets({MEM: 9})
    sm.close()
    assert OffsetCheckpoint(sd.checkpoint_path(TASK)).read() == {}


def test_flush_then_checkpoint_on_close(sd: StateDirectory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 26: acked {persistent:123, inMemory:456, unregistered:789} -> the file holds persistent:123 only.

    Stores are flushed in registration order, and before the file is written.
    """
    events: list[str] = []
    real_flush = Store.flush
    real_write = OffsetCheckpoint.write

    def flush(self: Store) -> None:
        events.append(f"flush {self.name}")
        real_flush(self)

    def write(self: OffsetCheckpoint, offsets: dict[TopicPartition, int]) -> None:
        events.append("checkpoint")
        real_write(self, offsets)

    monkeypatch.setattr(Store, "flush", flush)
    monkeypatch.setattr(OffsetCheckpoint, "write", write)
    sm = StateManager(sd, TASK, ALOS_CKPT)
    sm.register("persistent")
    sm.register("inMemory", persistent=False)
    sm.register("zeta")
    sm.register("alpha")
    sm.initialize()
    sm.update_offsets({P: 123, MEM: 456, TopicPartition("unregistered", 1): 789})
    sm.close()
    assert OffsetCheckpoint(sd.checkpoint_path(TASK)).read() == {
        P: 123,
        TopicPartition("app-zeta-changelog", 1): -4,
        TopicPartition("app-alpha-changelog", 1): -4,
    }
    assert events[:4] == ["flush persistent", "flush zeta", "flush alpha", "checkpoint"]


@pytest.mark.parametrize(
    "policy",
    [ALOS_CKPT, EOS_CKPT, ALOS_STORE, EOS_STORE],
    ids=lambda p: f"{p.guarantee.value}-{p.offsets.value}",
)
def test_offsets_into_deleted_directory_fail_and_never_recreate_it(
    sd: StateDirectory, policy: Policy
) -> None:
    """Item 28, with the bug fixed: Kafka logs a WARN and moves on; we refuse with LockError.

    The task directory was deleted under the task; writing offsets (file or
    store) must not re-create it (KAFKA-8187), and the caller must learn that
    its state is gone.
    """
    sm = manager(sd, policy)
    sm.initialize()
    sm.update_offsets({P: 5})
    shutil.rmtree(sd.task_dir(TASK))
    with pytest.raises(LockError, match="deleted while locked"):
        sm.commit({P: 6})
    with pytest.raises(LockError, match="deleted while locked"):
        sm.close()
    assert not sd.task_dir(TASK).exists()


@pytest.mark.parametrize(
    "policy",
    [ALOS_CKPT, EOS_CKPT, ALOS_STORE, EOS_STORE],
    ids=lambda p: f"{p.guarantee.value}-{p.offsets.value}",
)
def test_holder_that_lost_its_lock_cannot_write_offsets(sd: StateDirectory, policy: Policy) -> None:
    """A released-and-retaken lock invalidates the old holder: its commit writes nothing."""
    sm = manager(sd, policy)
    sm.initialize()
    sm.store("persistent").put(b"k", b"stale")
    sd.unlock(TASK)  # lost (e.g. released by mistake) ...
    thief = threading.Thread(target=lambda: sd.lock(TASK))
    thief.start()
    thief.join()  # ... and taken by another thread
    with pytest.raises(LockError, match="released or taken over"):
        sm.commit({P: 1})
    sm.store("persistent").abort()
    with pytest.raises(LockError):
        sm.close()  # clean close: nothing recorded, stores closed, and the caller is told
    assert all(sm.store_names()) and sd.owner(TASK) is not threading.current_thread()
    assert not OffsetCheckpoint(sd.checkpoint_path(TASK)).exists()
    contents = store_contents(sd.store_dir(TASK, "persistent"))
    assert contents.data == {} and contents.offsets == {}


def test_clean_close_with_uncommitted_writes_is_refused(sd: StateDirectory) -> None:
    sm = manager(sd, EOS_STORE)
    sm.initialize()
    sm.store("persistent").put(b"k", b"v")
    with pytest.raises(IllegalStateError, match="uncommitted"):
        sm.close()
    with pytest.raises(IllegalStateError, match="uncommitted"):
        sm.suspend()
    sm.close(clean=False)
    assert sd.lock(TASK)  # released


def test_dirty_close_wipes_only_under_eos_with_checkpoint(sd: StateDirectory) -> None:
    for policy, wiped in ((EOS_CKPT, True), (ALOS_CKPT, False), (EOS_STORE, False), (ALOS_STORE, False)):
        sm = manager(sd, policy)
        sm.initialize()
        sm.store("persistent").put(b"k", b"v")
        sm.commit({P: 1})
        sm.close(clean=False)
        assert sd.is_empty(TASK) is wiped, policy
        if not wiped:
            assert sd.lock(TASK)
            sd.wipe(TASK)
            sd.unlock(TASK)


def test_wipe_resets_offsets_and_keeps_the_lock(sd: StateDirectory) -> None:
    sm = manager(sd, ALOS_STORE)
    sm.initialize()
    sm.store("persistent").put(b"k", b"v")
    sm.commit({P: 5})
    assert sm.offsets()[P] == 5
    sm.wipe()
    assert sm.offsets()[P] is None
    assert sd.is_empty(TASK)
    assert threading.Thread(target=lambda: None) and sd.owner(TASK) is threading.current_thread()
    sm.initialize()
    assert sm.store("persistent").get(b"k") is None
    sm.close()


def test_commit_applies_staged_writes_with_offsets_in_store_mode(sd: StateDirectory) -> None:
    sm = manager(sd, EOS_STORE)
    sm.initialize()
    sm.store("persistent").put(b"a", b"1")
    sm.store("unlogged").put(b"b", b"2")
    sm.store("inMemory").put(b"c", b"3")
    assert sm.commit({P: 10, IRRELEVANT: 99}) is True
    assert sm.store("inMemory").get(b"c") == b"3"
    sm.close()
    persistent = store_contents(sd.store_dir(TASK, "persistent"))
    assert (persistent.data, persistent.offsets, persistent.status) == ({b"a": b"1"}, {str(P): 10}, 0)
    unlogged = store_contents(sd.store_dir(TASK, "unlogged"))
    assert len(unlogged.data) == 1 and unlogged.offsets == {}


def test_close_releases_the_lock_held_by_another_thread(sd: StateDirectory) -> None:
    """A state manager initialized on one thread may be closed from another: the token proves ownership."""
    sm = manager(sd, ALOS_STORE)
    t = threading.Thread(target=sm.initialize)
    t.start()
    t.join()
    sm.close()
    assert sd.lock(TASK)


def test_release_and_reopen_stores_for_the_restore_engine(sd: StateDirectory) -> None:
    """While released, the Rust engine can open the store; offsets and the lock stay with the manager."""
    sm = manager(sd, EOS_STORE)
    sm.initialize()
    sm.store("persistent").put(b"a", b"1")
    with pytest.raises(IllegalStateError, match="uncommitted"):
        sm.release_stores()
    sm.commit({P: 3})
    sm.release_stores()
    assert sm.initialized and sd.owner(TASK) is threading.current_thread()
    _testing.store_write_batch(str(sd.store_dir(TASK, "persistent")), [(b"b", b"2")], {str(P): 4})
    sm.reopen_stores()
    sm.update_offsets({P: 4})
    assert sm.store("persistent").get(b"b") == b"2"
    assert sm.offsets()[P] == 4
    sm.close()
    assert not sm.initialized


def test_clean_close_after_corruption_records_nothing(sd: StateDirectory) -> None:
    """A task found corrupted must not paper over it: a clean close writes no offsets, the next init fails again."""
    make_non_empty(sd)
    sm = manager(sd, EOS_CKPT)
    with pytest.raises(TaskCorruptedError):
        sm.initialize()
    with pytest.raises(IllegalStateError):
        sm.store("persistent")  # closed: nothing is trusted
    sm.close()
    assert not OffsetCheckpoint(sd.checkpoint_path(TASK)).exists()
    with pytest.raises(TaskCorruptedError):
        manager(sd, EOS_CKPT).initialize()
