"""StateUpdater: StoreChangelogReaderTest and DefaultStateUpdaterTest scenarios (reference §7, 30-39).

Offsets here are real segment-log offsets: transaction markers occupy one, so
"position >= end" -- never "last record == end - 1" -- decides completion.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from statestore import SegmentLog, TaskCorruptedError, TaskId
from statestore.processing.task import ActiveTask, StandbyTask, TaskState, build_state_manager
from statestore.processing.updater import (
    DEFAULT_CHUNK_OFFSETS,
    MAX_CHUNK_OFFSETS,
    StateUpdater,
    SuspendReason,
)
from statestore.restore.engine import restore_store
from statestore.state.directory import StateDirectory
from statestore.state.policy import Policy
from statestore.state.store import Store
from support.model import store_contents
from support.tasks import STORE, Events, changelog_tp, close_all, manager, produce

T = TaskId(0, 0)
T2 = TaskId(0, 1)
TP = changelog_tp(T)
TP2 = changelog_tp(T2)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def log(tmp_path: Path) -> SegmentLog:
    (tmp_path / "log").mkdir()
    return SegmentLog(tmp_path / "log", sync=False)


@pytest.fixture
def sd(tmp_path: Path) -> Iterator[StateDirectory]:
    d = StateDirectory(tmp_path / "state", "app")
    yield d
    d.close()


def active(
    sd: StateDirectory,
    log: SegmentLog,
    task: TaskId = T,
    *,
    policy: Policy | None = None,
    stores: tuple[str, ...] = (STORE,),
) -> ActiveTask:
    sm = build_state_manager(sd, task, policy or Policy.of("at_least_once"), stores, standby=False)
    t = ActiveTask(task, sm, log)
    t.initialize()
    return t


def standby(
    sd: StateDirectory, log: SegmentLog, task: TaskId = T, *, policy: Policy | None = None
) -> StandbyTask:
    t = StandbyTask(
        task, build_state_manager(sd, task, policy or Policy.of("at_least_once"), [STORE], standby=True), log
    )
    t.initialize()
    return t


def prefill(sd: StateDirectory, log: SegmentLog, task: TaskId, end: int) -> None:
    """Restore the task's store up to ``end`` beforehand, as a previous run would have left it."""
    assert sd.lock(task)
    sd.stores_dir(task).mkdir(exist_ok=True)
    restore_store(sd.store_dir(task, STORE), log, changelog_tp(task), end_offset=end)
    sd.unlock(task)


def contents(task: ActiveTask) -> dict[bytes, bytes]:
    return dict(task.store(STORE))


def poll_until_restored(updater: StateUpdater, polls: int = 100) -> list[ActiveTask]:
    done: list[ActiveTask] = []
    for _ in range(polls):
        done += updater.poll()
        if not updater.restoring_active():
            return done
    raise AssertionError("restoration did not complete")


def poll_in_background_until_done(updater: StateUpdater, polls: int = 1000) -> list[ActiveTask]:
    """Poll a background updater until a task turns RUNNING; the tasks that did."""
    for _ in range(polls):
        done = updater.poll(timeout=0.05)
        if done:
            return done
    return []


# -- StoreChangelogReaderTest -------------------------------------------------------------------


def test_30_store_at_end_completes_at_once_with_start_and_end_but_no_batch(
    sd: StateDirectory, log: SegmentLog
) -> None:
    produce(log, TP, [(b"k%d" % i, b"v") for i in range(10)])  # offsets 0..9, end 10
    prefill(sd, log, T, 10)
    events = Events()
    updater = StateUpdater(log, listener=events, standby_listener=events)
    task = active(sd, log)
    assert task.offsets() == {TP: 9}
    updater.add(task)
    assert updater.poll() == [task]
    assert task.state is TaskState.RUNNING
    assert events.kinds() == ["start", "end"]
    assert events.calls[0] == ("start", TP, STORE, 10, 10)
    assert events.calls[1] == ("end", TP, STORE, 0)
    task.close()
    sb = standby(sd, log)
    updater.add(sb)
    assert updater.poll() == []
    assert sb in updater.tasks() and sb.state is TaskState.RUNNING, "a standby never completes"
    sb.close()


def test_31_restore_from_position_up_to_the_fixed_end(sd: StateDirectory, log: SegmentLog) -> None:
    produce(log, TP, [(b"k%d" % i, b"%d" % i) for i in range(6)])  # 0..5
    prefill(sd, log, T, 6)
    produce(log, TP, [(b"k6", b"6"), (b"k7", b"7"), (None, b"8"), (b"k9", b"9")])  # 6..9, 8 has no key
    events = Events()
    updater = StateUpdater(log, listener=events)
    task = active(sd, log)
    updater.add(task)  # end fixed at 10 now
    produce(log, TP, [(b"k10", b"10")])  # offset 10: beyond the end
    assert poll_until_restored(updater) == [task]
    assert events.total_restored() == 3
    assert task.offsets() == {TP: 9}
    data = contents(task)
    assert data[b"k9"] == b"9" and b"k10" not in data
    task.close()
    sb_events = Events()
    sb_updater = StateUpdater(log, standby_listener=sb_events)
    sb = standby(sd, log)  # the same stores, now kept by a standby
    sb_updater.add(sb)
    sb_updater.poll()
    assert sum(c[4] for c in sb_events.calls if c[0] == "loaded") == 1, (
        "the standby goes on past the end: k10"
    )
    assert sb.offsets() == {TP: 10}
    sb.close()


def test_32_restore_from_beginning_completes_only_when_position_passes_the_marker(
    sd: StateDirectory, log: SegmentLog
) -> None:
    offsets = produce(log, TP, [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")], transactional_id="w")
    assert offsets == [0, 1, 2] and log.end_offset(TP) == 4  # the commit marker is offset 3
    events = Events()
    updater = StateUpdater(log, listener=events, chunk_offsets=3, time_slice_ms=0)
    task = active(sd, log, policy=Policy.of("exactly_once_v2"))
    updater.add(task)
    assert events.calls[0] == ("start", TP, STORE, 0, 4)
    assert updater.poll() == [], "position 3 < end 4: the marker is still ahead"
    assert task.state is TaskState.RESTORING and task.offsets() == {TP: 2}
    assert updater.poll() == [task]
    assert events.total_restored() == 3
    task.close()


def test_33_empty_changelog_completes_at_once(sd: StateDirectory, log: SegmentLog) -> None:
    events = Events()
    updater = StateUpdater(log, listener=events)
    task = active(sd, log)
    updater.add(task)
    assert events.calls == [("start", TP, STORE, 0, 0)]
    assert updater.poll() == [task]
    assert events.kinds() == ["start", "end"]
    task.close()


def test_34_standby_applies_committed_data_only(sd: StateDirectory, log: SegmentLog) -> None:
    produce(log, TP, [(b"a", b"1")], transactional_id="w1")  # 0, marker 1
    open_txn = log.producer("w2")
    open_txn.begin()
    open_txn.send(TP.topic, TP.partition, b"b", b"uncommitted")
    open_txn.flush()
    produce(log, TP, [(b"c", b"3")], transactional_id="w3")  # after the open transaction
    updater = StateUpdater(log)
    sb = standby(sd, log, policy=Policy.of("exactly_once_v2"))
    updater.add(sb)
    for _ in range(3):
        updater.poll()
    assert sb.offsets() == {TP: 0}, "held at the last stable offset"
    open_txn.commit()
    updater.poll()
    assert sb.offsets() == {TP: 3}  # b=2, c=3; markers at 1, 4 and 5
    sb.close()
    with Store(sd.store_dir(T, STORE)) as store:
        assert dict(store) == {b"a": b"1", b"b": b"uncommitted", b"c": b"3"}


def test_35_removing_before_completion_fires_suspended(sd: StateDirectory, log: SegmentLog) -> None:
    produce(log, TP, [(b"k%d" % i, b"v") for i in range(100)])
    produce(log, TP2, [(b"k%d" % i, b"v") for i in range(100)])
    events = Events()
    updater = StateUpdater(log, listener=events, standby_listener=events, chunk_offsets=10, time_slice_ms=0)
    task = active(sd, log)
    sb = standby(sd, log, T2)
    updater.add(task)
    updater.add(sb)
    updater.poll()
    assert task.state is TaskState.RESTORING
    assert updater.remove(T) is task
    assert events.calls[-1] == ("suspended", TP, STORE, 10)
    assert T not in updater
    assert updater.remove(T2, SuspendReason.PROMOTED) is sb
    assert events.calls[-1][0] == "update_suspended" and events.calls[-1][-1] is SuspendReason.PROMOTED
    task.suspend()
    task.close()
    sb.close()


# -- DefaultStateUpdaterTest --------------------------------------------------------------------


def test_36_task_turns_running_once_all_changelogs_complete_with_enforced_checkpoint(
    sd: StateDirectory, log: SegmentLog
) -> None:
    other = changelog_tp(T, "t")
    produce(log, TP, [(b"k%d" % i, b"v") for i in range(5)])
    produce(log, other, [(b"k%d" % i, b"v") for i in range(50)])
    updater = StateUpdater(log, chunk_offsets=10, time_slice_ms=0)
    task = active(
        sd, log, policy=Policy.of("at_least_once", "checkpoint", checkpoint_delta=10**9), stores=(STORE, "t")
    )
    updater.add(task)
    assert updater.poll() == []
    assert task.state is TaskState.RESTORING, "one changelog done, the other not"
    done = poll_until_restored(updater)
    assert done == [task] and task.state is TaskState.RUNNING
    assert task.state_manager.checkpoint_file.read() == {TP: 4, other: 49}, "enforced at restoration end"
    assert task not in updater.tasks()
    task.suspend()
    task.close()


def test_37_a_corrupted_task_fails_alone(sd: StateDirectory, log: SegmentLog) -> None:
    produce(log, TP, [(b"k%d" % i, b"v") for i in range(50)])
    produce(log, TP2, [(b"k%d" % i, b"v") for i in range(50)])
    updater = StateUpdater(log, chunk_offsets=10, time_slice_ms=0)
    good, bad = active(sd, log), active(sd, log, T2)
    updater.add(good)
    updater.add(bad)
    updater.poll()
    (sd.store_dir(T2, STORE) / "CURRENT").write_text("garbage\n")  # the store no longer opens
    done = poll_until_restored(updater)
    assert done == [good]
    failed = updater.drain_failed()
    assert [t for t, _ in failed] == [bad]
    assert isinstance(failed[0][1], TaskCorruptedError) and failed[0][1].task_id == T2
    assert updater.drain_failed() == []
    good.suspend()
    good.close()
    bad.close(clean=False)


def test_38_offsets_recorded_only_after_the_commit_interval(sd: StateDirectory, log: SegmentLog) -> None:
    produce(log, TP, [(b"k%d" % i, b"v") for i in range(5)])
    clock = Clock()
    updater = StateUpdater(log, commit_interval_ms=1000, clock=clock)
    sb = standby(sd, log, policy=Policy.of("at_least_once", "checkpoint", checkpoint_delta=0))
    updater.add(sb)
    updater.poll()
    assert sb.offsets() == {TP: 4}
    assert not sb.state_manager.checkpoint_file.exists(), "interval not elapsed"
    clock.now += 0.5
    updater.poll()
    assert not sb.state_manager.checkpoint_file.exists(), "interval not elapsed"
    clock.now += 0.6
    updater.poll()
    assert sb.state_manager.checkpoint_file.read() == {TP: 4}
    sb.close()


def test_39_actives_first_then_standbys_then_actives_again(sd: StateDirectory, log: SegmentLog) -> None:
    produce(log, TP, [(b"k%d" % i, b"v") for i in range(30)])
    produce(log, TP2, [(b"k%d" % i, b"v") for i in range(30)])
    updater = StateUpdater(log, chunk_offsets=10, time_slice_ms=0)
    task = active(sd, log)
    sb = standby(sd, log, T2)
    updater.add(task)
    updater.add(sb)
    updater.poll()
    assert sb.offsets() == {TP2: None}, "standbys wait while an active task restores"
    poll_until_restored(updater)
    updater.poll()
    assert sb.offsets() == {TP2: 9}, "then they are updated"
    T3 = TaskId(0, 2)
    produce(log, changelog_tp(T3), [(b"k%d" % i, b"v") for i in range(30)])
    again = active(sd, log, T3)
    updater.add(again)
    updater.poll()
    assert sb.offsets() == {TP2: 9}, "a new active task pauses the standbys again"
    poll_until_restored(updater)
    for _ in range(3):
        updater.poll()
    assert sb.offsets() == {TP2: 29}
    for t in (task, again):
        t.suspend()
        t.close()
    sb.close()


# -- beyond Kafka's tests ----------------------------------------------------------------------


def test_open_transaction_of_a_dead_producer_is_aborted_after_the_timeout(
    sd: StateDirectory, log: SegmentLog
) -> None:
    produce(log, TP, [(b"a", b"1")], transactional_id="alive")
    dead = log.producer("dead")
    dead.begin()
    dead.send(TP.topic, TP.partition, b"b", b"aborted")
    dead.flush()
    del dead
    clock = Clock()
    updater = StateUpdater(log, transaction_timeout_ms=3_600_000, clock=clock)
    task = active(sd, log, policy=Policy.of("exactly_once_v2"))
    updater.add(task)
    for _ in range(5):
        assert updater.poll() == []
        clock.now += 1
    assert task.state is TaskState.RESTORING, "blocked by the open transaction, which has not timed out"
    updater.transaction_timeout_ms = 0  # as if an hour had passed
    assert poll_until_restored(updater) == [task]
    assert contents(task) == {b"a": b"1"}, "the dead producer's records were aborted, never applied"
    task.suspend()
    task.close()


def test_work_per_poll_is_bounded(sd: StateDirectory, log: SegmentLog) -> None:
    produce(log, TP, [(b"k%d" % i, b"v") for i in range(100)])
    events = Events()
    updater = StateUpdater(log, listener=events, chunk_offsets=10, time_slice_ms=0)
    task = active(sd, log)
    updater.add(task)
    for n in range(1, 5):
        updater.poll()
        assert [c[4] for c in events.calls if c[0] == "batch"] == [10] * n
    assert task.state is TaskState.RESTORING
    poll_until_restored(updater)
    assert events.total_restored() == 100
    task.suspend()
    task.close()


def test_background_restore(sd: StateDirectory, log: SegmentLog) -> None:
    produce(log, TP, [(b"k%d" % i, b"%d" % i) for i in range(500)])
    updater = StateUpdater(log, chunk_offsets=100, background=True)
    task = active(sd, log)
    updater.add(task)
    done = poll_in_background_until_done(updater)
    assert done == [task]
    assert len(contents(task)) == 500 and contents(task)[b"k499"] == b"499"
    updater.close()
    task.suspend()
    task.close()


def test_an_updater_sizes_its_chunks_by_how_long_its_rounds_take(log: SegmentLog) -> None:
    """Every restore call opens, flushes and closes the store: 2M records in calls of 50,000 took 2.6x
    as long as in one. Unless told a chunk size, the updater doubles its chunks after a round far
    shorter than its aim (one second in the background, the time slice in the foreground) and
    halves them after one far longer, within DEFAULT_CHUNK_OFFSETS..MAX_CHUNK_OFFSETS."""
    background = StateUpdater(log, background=True)
    assert background.chunk_offsets == DEFAULT_CHUNK_OFFSETS
    for want in (2, 4, 8):
        background._size_chunks(0.1)  # a tenth of its aim
        assert background.chunk_offsets == want * DEFAULT_CHUNK_OFFSETS
    background._size_chunks(0.5)  # about its aim: kept
    assert background.chunk_offsets == 8 * DEFAULT_CHUNK_OFFSETS
    background._size_chunks(3.0)
    assert background.chunk_offsets == 4 * DEFAULT_CHUNK_OFFSETS
    for _ in range(20):
        background._size_chunks(0.0)
    assert background.chunk_offsets == MAX_CHUNK_OFFSETS
    for _ in range(20):
        background._size_chunks(60.0)
    assert background.chunk_offsets == DEFAULT_CHUNK_OFFSETS
    background.close()
    foreground = StateUpdater(log, time_slice_ms=100)
    foreground._size_chunks(0.1)  # its time slice: kept
    assert foreground.chunk_offsets == DEFAULT_CHUNK_OFFSETS
    foreground._size_chunks(0.01)
    assert foreground.chunk_offsets == 2 * DEFAULT_CHUNK_OFFSETS
    told = StateUpdater(log, chunk_offsets=10, background=True)
    told._size_chunks(0.0)
    assert told.chunk_offsets == 10, "a chunk size given is kept"
    told.close()


def test_a_background_restore_takes_larger_chunks_as_its_rounds_stay_short(
    sd: StateDirectory, log: SegmentLog
) -> None:
    produce(log, TP, [(b"k%d" % i, b"v") for i in range(20_000)])
    events = Events()
    updater = StateUpdater(log, listener=events, background=True)
    updater.chunk_offsets = 1_000  # as if told: rounds of 1,000 records are far below a second
    updater._sizes_chunks = True
    task = active(sd, log)
    updater.add(task)
    done = poll_in_background_until_done(updater)
    assert done == [task]
    batches = [c[4] for c in events.calls if c[0] == "batch"]
    assert sum(batches) == 20_000 and len(contents(task)) == 20_000
    assert batches[:2] == [1_000, 2_000] and max(batches) > 2_000, batches
    updater.close()
    task.suspend()
    task.close()


# -- guarantees 5 and 6 (KAFKA-7672): "restore complete" belongs to one assignment ---------------------


@pytest.mark.parametrize("offsets", ["store", "checkpoint"])
def test_reassigned_task_whose_state_was_cleaned_is_restored_in_full(tmp_path: Path, offsets: str) -> None:
    t11 = TaskId(1, 1)
    tp = changelog_tp(t11)
    (tmp_path / "log").mkdir()
    log = SegmentLog(tmp_path / "log", sync=False)
    produce(log, tp, [(b"k%d" % i, b"a") for i in range(20)], transactional_id="elsewhere")
    events = Events()
    tm = manager(tmp_path, "exactly_once_v2", offsets, listener=events, log=log)
    tm.start()
    tm.assign([t11], [])
    assert tm.restore()
    assert events.total_restored() == 20
    tm.assign([], [])  # revoked: the task moves to another thread or instance ...
    assert t11 not in tm.updater and t11 not in tm.tasks()
    produce(
        log, tp, [(b"k%d" % i, b"b") for i in range(10, 40)], transactional_id="elsewhere"
    )  # ... which goes on
    assert tm.directory.clean_removed_tasks(now_ms=2**62) == [t11]  # and the local state is cleaned away
    events.calls.clear()
    tm.assign([t11], [])  # ... and then comes back
    assert tm.restore()
    assert events.calls[0] == ("start", tp, STORE, 0, log.end_offset(tp)), "from the beginning"
    assert events.total_restored() == 50, "every record restored again, nothing assumed complete"
    data = dict(tm.active_task(t11).store(STORE))
    assert len(data) == 40 and data[b"k5"] == b"a" and data[b"k39"] == b"b"
    close_all(tm)


def test_exactly_once_without_checkpoint_but_local_files_wipes_and_restores(tmp_path: Path) -> None:
    t11 = TaskId(1, 1)
    tp = changelog_tp(t11)
    (tmp_path / "log").mkdir()
    log = SegmentLog(tmp_path / "log", sync=False)
    produce(log, tp, [(b"k%d" % i, b"a") for i in range(20)], transactional_id="elsewhere")
    events = Events()
    tm = manager(tmp_path, "exactly_once_v2", "checkpoint", listener=events, log=log)
    tm.start()
    tm.assign([t11], [])
    assert tm.restore()
    tm.assign([], [])
    checkpoint = tm.directory.checkpoint_path(t11)
    assert checkpoint.exists(), "a clean close writes the checkpoint"
    checkpoint.unlink()  # e.g. read by the next owner before the previous one finished writing it
    produce(log, tp, [(b"x", b"1")], transactional_id="elsewhere")
    events.calls.clear()
    tm.assign([t11], [])
    assert tm.restore()
    assert events.calls[0][3] == 0 and events.total_restored() == 21, "wiped and restored in full"
    assert dict(tm.active_task(t11).store(STORE))[b"x"] == b"1"
    close_all(tm)


def test_a_standby_s_store_stays_open_between_rounds_and_is_closed_when_it_leaves(
    sd: StateDirectory, log: SegmentLog
) -> None:
    """A round neither opens (a new MANIFEST and OPTIONS file each time) nor flushes (a table file) the store."""
    produce(log, TP, [(b"k%d" % i, b"v") for i in range(100)])
    updater = StateUpdater(log, time_slice_ms=0)
    sb = standby(sd, log)
    updater.add(sb)
    updater.poll()
    path = sd.store_dir(T, STORE)
    files = sorted(p.name for p in path.iterdir())
    for i in range(5):
        produce(log, TP, [(b"k%d" % i, b"w%d" % i)])
        updater.poll()
    assert sb.offsets() == {TP: 104}
    assert sorted(p.name for p in path.iterdir()) == files, "no round opened, flushed or closed the store"
    assert updater.remove(T) is sb
    sb.close()
    with Store(path) as store:
        assert dict(store) == {b"k%d" % i: (b"w%d" % i if i < 5 else b"v") for i in range(100)}
    assert store_contents(path).offsets == {str(TP): 104}
