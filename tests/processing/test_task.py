"""Tasks: the transition table, recycling, and StreamTaskTest / StandbyTaskTest scenarios (reference §7, 40-46)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from statestore import IllegalStateError, OffsetCheckpoint, SegmentLog, TaskId
from statestore.processing.task import (
    TRANSITIONS,
    ActiveTask,
    StandbyTask,
    TaskState,
    build_state_manager,
    check_transition,
)
from statestore.processing.task_manager import TaskManager
from statestore.processing.updater import SuspendReason
from statestore.state.directory import StateDirectory
from statestore.state.policy import Policy
from support.tasks import STORE, Events, changelog_tp, close_all, manager, produce

T = TaskId(0, 1)
TP = changelog_tp(T)
S = TaskState


def test_transition_table_is_kafkas() -> None:
    assert TRANSITIONS == {
        S.CREATED: {S.RESTORING, S.SUSPENDED},
        S.RESTORING: {S.RUNNING, S.SUSPENDED},
        S.RUNNING: {S.SUSPENDED},
        S.SUSPENDED: {S.RESTORING, S.CLOSED},
        S.CLOSED: {S.CREATED},
    }


@pytest.mark.parametrize("current", list(TaskState))
@pytest.mark.parametrize("target", list(TaskState))
def test_every_transition_outside_the_table_is_illegal(current: TaskState, target: TaskState) -> None:
    if target in TRANSITIONS[current]:
        check_transition(T, "active", current, target)
        return
    with pytest.raises(IllegalStateError) as e:
        check_transition(T, "active", current, target)
    assert str(T) in str(e.value)
    assert f"from {current.value} to {target.value}" in str(e.value)
    assert e.value.task_id == T


@pytest.fixture
def tm_root(tmp_path: Path) -> Path:
    (tmp_path / "log").mkdir()
    return tmp_path


@pytest.fixture
def sd(tmp_path: Path) -> Iterator[StateDirectory]:
    d = StateDirectory(tmp_path / "state", "app")
    yield d
    d.close()


def test_illegal_call_on_a_real_task_names_task_and_states(sd: StateDirectory, tmp_path: Path) -> None:
    log = SegmentLog(tmp_path / "log", sync=False)
    (tmp_path / "log").mkdir()
    task = ActiveTask(
        T, build_state_manager(sd, T, Policy.of("exactly_once_v2"), [STORE], standby=False), log
    )
    with pytest.raises(
        IllegalStateError, match=r"active task 0_1: illegal transition from CREATED to RUNNING"
    ):
        task.complete_restoration()
    with pytest.raises(IllegalStateError, match="RUNNING"):
        task.store(STORE)
    task.initialize()
    assert task.state is S.RESTORING
    with pytest.raises(IllegalStateError, match="from RESTORING to RESTORING"):
        task.initialize()
    task.close()
    assert task.state is S.CLOSED
    with pytest.raises(IllegalStateError, match="from CLOSED to RESTORING"):
        task.resume()


def test_standby_goes_straight_to_running_and_never_processes(sd: StateDirectory, tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    log = SegmentLog(tmp_path / "log", sync=False)
    task = StandbyTask(T, build_state_manager(sd, T, Policy.of("at_least_once"), [STORE], standby=True), log)
    task.initialize()
    assert task.state is S.RUNNING
    assert not hasattr(task, "store")
    task.resume()  # a no-op, as in Kafka
    assert task.state is S.RUNNING
    task.close()


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once_v2"])
@pytest.mark.parametrize("offsets", ["store", "checkpoint"])
def test_recycling_keeps_open_stores_and_offsets(tm_root: Path, guarantee: str, offsets: str) -> None:
    events = Events()
    tm = manager(tm_root, guarantee, offsets, listener=events, standby_listener=events)
    tm.start()
    tm.assign([T], [])
    assert tm.restore()
    active = tm.active_task(T)
    for i in range(20):
        active.store(STORE).put(b"k%d" % i, b"v%d" % i)
    tm.commit()
    sm, token = active.state_manager, active.state_manager.lock_token
    last = sm.offsets()[TP]
    assert last is not None

    tm.assign([], [T])  # active -> standby
    standby = tm.task(T)
    assert isinstance(standby, StandbyTask) and standby.state is S.RUNNING
    assert standby.state_manager is sm and sm.lock_token == token, "recycling must not reopen or relock"
    assert sm.offsets()[TP] == last
    assert events.calls[-1] == ("update_start", TP, STORE, last + 1)

    tm.assign([T], [])  # standby -> active
    assert tm.restore()
    back = tm.active_task(T)
    assert back.state_manager is sm and sm.lock_token == token
    assert ("update_suspended", TP, STORE, last, SuspendReason.PROMOTED) in events.calls
    starts = [c for c in events.calls if c[0] == "start"]
    assert starts[-1][3] > last, "no re-restore: the recycled task restores only the tail"
    assert dict(back.store(STORE))[b"k7"] == b"v7"
    close_all(tm)


# -- StreamTaskTest -------------------------------------------------------------------------------


def _running(tm_root: Path, guarantee: str, offsets: str = "checkpoint", **kw: object) -> TaskManager:
    tm = manager(tm_root, guarantee, offsets, **kw)  # type: ignore[arg-type]
    tm.start()
    tm.assign([T], [])
    assert tm.restore()
    return tm


def _ckpt(tm_root: Path) -> OffsetCheckpoint:
    return OffsetCheckpoint(tm_root / "state" / "app" / str(T) / ".checkpoint")


def test_40_checkpoint_after_restoration_when_at_least_once(tm_root: Path) -> None:
    produce(SegmentLog(tm_root / "log"), TP, [(b"a", b"1"), (b"b", b"2")])
    tm = _running(tm_root, "at_least_once")
    assert _ckpt(tm_root).read() == {TP: 1}
    close_all(tm)


def test_40_no_checkpoint_after_restoration_when_exactly_once(tm_root: Path) -> None:
    produce(SegmentLog(tm_root / "log"), TP, [(b"a", b"1"), (b"b", b"2")], transactional_id="other")
    tm = _running(tm_root, "exactly_once_v2")
    assert tm.active_task(T).state is S.RUNNING
    assert not _ckpt(tm_root).exists(), "KAFKA-20685: no checkpoint may exist while RUNNING under EOS"
    close_all(tm)


def test_41_no_checkpoint_on_commit_when_exactly_once(tm_root: Path) -> None:
    tm = _running(tm_root, "exactly_once_v2", checkpoint_delta=0)
    for i in range(50):
        tm.active_task(T).store(STORE).put(b"k%d" % i, b"v")
    tm.commit()
    assert not _ckpt(tm_root).exists()
    close_all(tm)
    assert _ckpt(tm_root).read() == {TP: 49}, "a clean close writes the checkpoint"


def test_42_checkpoint_on_commit_only_when_offsets_moved_much(tm_root: Path) -> None:
    produce(SegmentLog(tm_root / "log"), TP, [(b"k", b"%d" % i) for i in range(11)])
    tm = _running(tm_root, "at_least_once", checkpoint_delta=100)
    assert _ckpt(tm_root).read() == {TP: 10}, "enforced at restoration end"
    view = tm.active_task(T).store(STORE)
    for i in range(10):
        view.put(b"k", b"%d" % i)
    tm.commit()
    assert _ckpt(tm_root).read() == {TP: 10}, "10 -> 20 is below the threshold"
    for i in range(200):
        view.put(b"k", b"%d" % i)
    tm.commit()
    assert _ckpt(tm_root).read() == {TP: 220}, "10 -> 220 is above it"
    close_all(tm)


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once_v2"])
def test_43_suspended_created_task_is_not_checkpointed_but_a_restored_one_is(
    tm_root: Path, sd: StateDirectory, guarantee: str
) -> None:
    log = SegmentLog(tm_root / "log", sync=False)
    created = ActiveTask(
        T, build_state_manager(sd, T, Policy.of(guarantee, "checkpoint"), [STORE], standby=False), log
    )
    created.suspend()
    assert created.state is S.SUSPENDED
    assert not _ckpt(tm_root).exists()
    created.close()
    produce(log, TP, [(b"a", b"1")])
    task = ActiveTask(
        T, build_state_manager(sd, T, Policy.of(guarantee, "checkpoint"), [STORE], standby=False), log
    )
    task.initialize()
    task.update_offsets({TP: 0})
    task.suspend()
    assert _ckpt(tm_root).read() == {TP: 0}
    task.close()


def test_44_dirty_close_under_exactly_once_wipes_then_unlocks(tm_root: Path) -> None:
    tm = _running(tm_root, "exactly_once_v2")
    tm.active_task(T).store(STORE).put(b"k", b"v")
    tm.commit()
    task_dir = tm.directory.task_dir(T)
    assert (task_dir / "rocksdb" / STORE).exists()
    tm.close(clean=False)
    assert not (task_dir / "rocksdb").exists(), "EOS with a checkpoint file: a dirty close wipes the task"
    assert tm.directory.lock(T), "and the lock is released afterwards"
    tm.directory.close()


def test_44_dirty_close_under_at_least_once_keeps_files(tm_root: Path) -> None:
    tm = _running(tm_root, "at_least_once")
    tm.active_task(T).store(STORE).put(b"k", b"v")
    tm.commit()
    tm.close(clean=False)
    assert (tm.directory.task_dir(T) / "rocksdb" / STORE).exists()
    tm.directory.close()


def test_45_clean_close_of_a_task_with_uncommitted_writes_is_refused(tm_root: Path) -> None:
    tm = _running(tm_root, "exactly_once_v2")
    task = tm.active_task(T)
    task.store(STORE).put(b"k", b"v")
    with pytest.raises(IllegalStateError, match="uncommitted"):
        task.close(clean=True)
    assert task.state is S.RUNNING
    close_all(tm)  # the manager commits first, so its clean close works


def test_46_standby_checkpoints_only_big_advances_unless_enforced(tm_root: Path) -> None:
    log = SegmentLog(tm_root / "log", sync=False)
    tm = manager(tm_root, "exactly_once_v2", "checkpoint", checkpoint_delta=100, log=log)
    tm.start()
    tm.assign([], [T])
    produce(log, TP, [(b"k", b"%d" % i) for i in range(51)], transactional_id="writer")  # offsets 0..50
    tm.poll()
    tm.commit()
    assert not _ckpt(tm_root).exists(), "0 -> 50 is below the threshold"
    produce(log, TP, [(b"k", b"%d" % i) for i in range(150)], transactional_id="writer")
    tm.poll()
    tm.commit()
    assert _ckpt(tm_root).read() == {TP: 201}, (
        "a standby applies committed data only: safe to checkpoint under EOS"
    )
    produce(log, TP, [(b"k", b"x")], transactional_id="writer")
    tm.poll()
    tm.commit()
    assert _ckpt(tm_root).read() == {TP: 201}
    tm.assign([], [])  # closing enforces the checkpoint
    assert _ckpt(tm_root).read() == {TP: 203}
    close_all(tm)


def test_46_unclean_close_of_a_standby_under_exactly_once_wipes(tm_root: Path) -> None:
    log = SegmentLog(tm_root / "log", sync=False)
    produce(log, TP, [(b"k", b"v")], transactional_id="writer")
    tm = manager(tm_root, "exactly_once_v2", "checkpoint", log=log)
    tm.start()
    tm.assign([], [T])
    tm.poll()
    assert (tm.directory.task_dir(T) / "rocksdb" / STORE).exists()
    tm.close(clean=False)
    assert not (tm.directory.task_dir(T) / "rocksdb").exists()
    tm.directory.close()


def test_restoring_active_recycled_to_standby_keeps_its_progress(tm_root: Path) -> None:
    produce(SegmentLog(tm_root / "log"), TP, [(b"k%d" % i, b"v") for i in range(100)])
    events = Events()
    tm = manager(
        tm_root,
        "exactly_once_v2",
        listener=events,
        standby_listener=events,
        chunk_offsets=30,
        time_slice_ms=0,
    )
    tm.start()
    tm.assign([T], [])
    tm.poll()
    task = tm.active_task(T)
    assert task.state is S.RESTORING and task.offsets() == {TP: 29}
    sm = task.state_manager
    tm.assign([], [T])
    assert ("suspended", TP, STORE, 30) in events.calls, "the interrupted restoration is reported"
    standby = tm.task(T)
    assert isinstance(standby, StandbyTask) and standby.state_manager is sm
    assert events.calls[-1] == ("update_start", TP, STORE, 30), "the standby goes on from where it stopped"
    close_all(tm)
