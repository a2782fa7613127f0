"""TaskManager: processing API, commit under both guarantees, corruption handling (reference §7, 47-50)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rocksdict import Options, Rdict

from statestore import (
    OFFSET_UNKNOWN,
    ChangelogUnavailableError,
    IllegalStateError,
    LogError,
    RestoreResult,
    RestoreSpec,
    SegmentLog,
    SkippedRecords,
    TaskId,
    TopicPartition,
    _native,
)
from statestore.changelog.protocol import PartitionLike
from statestore.ids import coerce_tp
from statestore.processing import updater as updater_module
from statestore.processing.task import ActiveTask, TaskState
from statestore.processing.task_manager import TaskManager
from statestore.processing.unanswered import UnansweredChangelogs
from statestore.state.directory import StateDirectory
from statestore.state.store import OFFSETS_CF, STATUS_KEY, STATUS_OPEN, encode_i64, encode_timestamped
from support.model import store_contents
from support.tasks import STORE, Events, changelog_tp, close_all, manager, produce

T = TaskId(0, 0)
T2 = TaskId(0, 1)
TP = changelog_tp(T)
TP2 = changelog_tp(T2)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "log").mkdir()
    return tmp_path


def running(
    root: Path,
    guarantee: str,
    offsets: str = "store",
    *,
    active: list[TaskId] | None = None,
    standby: list[TaskId] | None = None,
    **kw: object,
) -> TaskManager:
    tm = manager(root, guarantee, offsets, **kw)  # type: ignore[arg-type]
    tm.start()
    tm.assign(active if active is not None else [T], standby or [])
    assert tm.restore()
    return tm


def committed(root: Path, tp: object = TP) -> dict[bytes, bytes | None]:
    return {r.key: r.value for r in SegmentLog(root / "log").read(tp) if r.key is not None}  # type: ignore[arg-type]


def on_disk(root: Path, task: TaskId = T) -> tuple[dict[bytes, bytes], dict[str, int]]:

    contents = store_contents(root / "state" / "app" / str(task) / "rocksdb" / STORE)
    return contents.data, contents.offsets


# -- processing API and commit -------------------------------------------------------------------


def test_writes_are_read_back_before_commit_and_reach_the_changelog(root: Path) -> None:
    tm = running(root, "exactly_once_v2")
    task = tm.task(T)
    assert isinstance(task, ActiveTask)
    view = task.store(STORE)
    view.put(b"a", b"1")
    view.put(b"b", b"2")
    view.delete(b"a")
    assert view.get(b"a") is None and view.get(b"b") == b"2"
    assert dict(view) == {b"b": b"2"}
    assert committed(root) == {}, "read_committed sees nothing before the transaction commits"
    assert on_disk(root)[0] == {}, "nothing uncommitted reaches RocksDB"
    tm.commit()
    assert committed(root) == {b"a": None, b"b": b"2"}
    data, offsets = on_disk(root)
    assert data == {b"b": b"2"}
    assert offsets == {str(TP): 2}, "the offset of the last write, in the same batch as the data"
    close_all(tm)


def test_failed_changelog_commit_drops_the_staged_writes(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tm = running(root, "exactly_once_v2")
    view = tm.active_task(T).store(STORE)
    view.put(b"a", b"1")
    tm.commit()
    view.put(b"b", b"2")

    def fail() -> None:
        raise LogError("disk full")

    monkeypatch.setattr(tm.collector.producer, "commit", fail)
    with pytest.raises(LogError):
        tm.commit()
    monkeypatch.undo()
    assert dict(view) == {b"a": b"1"}, "the transaction was aborted: its writes are gone"
    assert b"b" not in committed(root)
    close_all(tm)


def test_a_commit_whose_abort_fails_too_still_drops_the_staged_writes(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Kafka client can refuse the abort after a failed commit (a fatal client state): the staged writes
    are dropped all the same, and the error raised is the commit's, with the abort's failure noted."""
    tm = running(root, "exactly_once_v2")
    view = tm.active_task(T).store(STORE)
    view.put(b"a", b"1")
    tm.commit()
    view.put(b"b", b"2")

    def fail(what: str) -> Callable[[], None]:
        def raise_() -> None:
            raise LogError(what)

        return raise_

    monkeypatch.setattr(tm.collector.producer, "commit", fail("commit refused"))
    monkeypatch.setattr(tm.collector.producer, "abort", fail("abort refused"))
    with pytest.raises(LogError, match="commit refused") as ei:
        tm.commit()
    assert any("abort refused" in note for note in ei.value.__notes__)
    monkeypatch.undo()
    assert dict(view) == {b"a": b"1"}, "the staged write was dropped"
    assert b"b" not in committed(root)
    close_all(tm, clean=False)


def test_at_least_once_commit_flushes_the_changelog_then_applies(root: Path) -> None:
    tm = running(root, "at_least_once")
    view = tm.active_task(T).store(STORE)
    for i in range(5):
        view.put(b"k%d" % i, b"%d" % i)
    tm.commit()
    assert len(committed(root)) == 5
    assert on_disk(root) == ({b"k%d" % i: b"%d" % i for i in range(5)}, {str(TP): 4})
    close_all(tm)


def test_dirty_close_under_exactly_once_aborts_the_transaction(root: Path) -> None:
    tm = running(root, "exactly_once_v2")
    tm.active_task(T).store(STORE).put(b"a", b"1")
    tm.close(clean=False)
    tm.directory.close()
    assert committed(root) == {}
    assert SegmentLog(root / "log").last_stable_offset(TP) == SegmentLog(root / "log").end_offset(TP)


def test_poll_reports_running_only_when_every_active_task_is(root: Path) -> None:
    produce(SegmentLog(root / "log"), TP2, [(b"k%d" % i, b"v") for i in range(100)])
    tm = manager(root, "at_least_once", chunk_offsets=10, time_slice_ms=0)
    tm.start()
    tm.assign([T, T2], [])
    assert tm.poll() is False
    assert tm.task(T).state is TaskState.RUNNING and tm.task(T2).state is TaskState.RESTORING
    with pytest.raises(IllegalStateError, match="RESTORING"):
        tm.active_task(T2).store(STORE)
    assert tm.restore()
    assert set(tm.tasks()) == {T, T2}
    with pytest.raises(KeyError):
        tm.task(TaskId(9, 9))
    close_all(tm)


def test_assign_rejects_a_task_both_active_and_standby(root: Path) -> None:
    tm = manager(root, "at_least_once")
    with pytest.raises(ValueError, match="both"):
        tm.assign([T], [T])
    close_all(tm)


def test_commit_interval_commits_from_poll(root: Path) -> None:
    now = [0.0]
    tm = running(root, "exactly_once_v2", commit_interval_ms=1000, clock=lambda: now[0])
    tm.active_task(T).store(STORE).put(b"a", b"1")
    tm.poll()
    assert committed(root) == {}
    now[0] += 1.5
    tm.poll()
    assert committed(root) == {b"a": b"1"}
    close_all(tm)


# -- corruption (TaskManagerTest 47, 48; KIP-1035 integration 50) ---------------------------------


def test_47_corrupted_running_task_is_wiped_revived_and_restored_others_keep_running(root: Path) -> None:
    events = Events()
    tm = running(root, "exactly_once_v2", active=[T, T2], listener=events)
    for t in (T, T2):
        tm.active_task(t).store(STORE).put(b"k", b"%s" % str(t).encode())
    tm.commit()
    tm.active_task(T2).store(STORE).put(b"pending", b"x")
    events.calls.clear()
    tm.handle_corruption([T])
    assert tm.task(T).state is TaskState.CREATED
    assert tm.task(T2).state is TaskState.RUNNING
    assert committed(root, TP2)[b"pending"] == b"x", "the others' open work was committed first"
    assert tm.restore()
    assert events.calls[0] == ("start", TP, STORE, 0, SegmentLog(root / "log").end_offset(TP)), (
        "restored from the start"
    )
    assert dict(tm.active_task(T).store(STORE)) == {b"k": b"0_0"}
    close_all(tm)


def test_48_corrupted_standby_is_revived_even_when_the_commit_fails(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tm = running(root, "exactly_once_v2", active=[T], standby=[T2])
    tm.active_task(T).store(STORE).put(b"k", b"v")

    def fail() -> None:
        raise LogError("commit failed")

    monkeypatch.setattr(tm.collector.producer, "commit", fail)
    with pytest.raises(LogError):
        tm.handle_corruption([T2])
    monkeypatch.undo()
    assert tm.task(T2).state is TaskState.CREATED, "revived before the failing commit"
    tm.poll()
    assert tm.task(T2).state is TaskState.RUNNING
    close_all(tm)


def _close_with_state(root: Path, guarantee: str, offsets: str, n: int = 10) -> None:
    tm = running(root, guarantee, offsets)
    for i in range(n):
        tm.active_task(T).store(STORE).put(b"k%d" % i, b"%d" % i)
    tm.commit()
    close_all(tm)


def _store_db(root: Path) -> Rdict:
    path = root / "state" / "app" / str(T) / "rocksdb" / STORE
    return Rdict(str(path), Options(raw_mode=True), column_families={OFFSETS_CF: Options(raw_mode=True)})


def _force_status_open(root: Path) -> None:
    db = _store_db(root)
    db.get_column_family(OFFSETS_CF)[STATUS_KEY] = encode_i64(STATUS_OPEN)
    db.close()


@pytest.mark.parametrize(
    ("guarantee", "offsets", "wiped"),
    [
        ("at_least_once", "store", False),
        ("exactly_once_v2", "store", False),  # nothing uncommitted ever reaches RocksDB
        ("at_least_once", "checkpoint", False),
        ("exactly_once_v2", "checkpoint", True),  # the store may hold aborted writes
    ],
)
def test_50_status_open_after_a_crash(root: Path, guarantee: str, offsets: str, wiped: bool) -> None:
    _close_with_state(root, guarantee, offsets)
    _force_status_open(root)
    events = Events()
    tm = running(root, guarantee, offsets, listener=events)
    start = next(c for c in events.calls if c[0] == "start")
    assert (start[3] == 0) is wiped
    assert dict(tm.active_task(T).store(STORE)) == {b"k%d" % i: b"%d" % i for i in range(10)}
    close_all(tm)


def test_50_missing_offsets_under_exactly_once_wipe_and_restore(root: Path) -> None:
    _close_with_state(root, "exactly_once_v2", "store")
    db = _store_db(root)
    del db.get_column_family(OFFSETS_CF)[str(TP).encode()]
    db.close()
    events = Events()
    tm = running(root, "exactly_once_v2", listener=events)
    assert events.calls[0][3] == 0 and events.total_restored() == 10
    assert len(dict(tm.active_task(T).store(STORE))) == 10
    close_all(tm)


def test_offset_beyond_the_changelog_end_is_corruption(root: Path) -> None:
    _close_with_state(root, "at_least_once", "store")
    shutil.rmtree(root / "log" / str(TP))  # the changelog was deleted and recreated
    tm = running(root, "at_least_once")
    assert dict(tm.active_task(T).store(STORE)) == {}, "wiped: the local data matches no changelog"
    close_all(tm)


def test_store_that_fails_to_open_is_corruption(root: Path) -> None:
    _close_with_state(root, "at_least_once", "store")
    (root / "state" / "app" / str(T) / "rocksdb" / STORE / "CURRENT").write_text("not a manifest\n")
    tm = running(root, "at_least_once")
    assert len(dict(tm.active_task(T).store(STORE))) == 10, "wiped and restored from the changelog"
    close_all(tm)


# -- offset sums (TaskManagerTest 49) ---------------------------------------------------------------


def _two_store_manager(root: Path, offsets: str) -> TaskManager:
    from statestore.state.directory import StateDirectory

    return TaskManager(
        StateDirectory(root / "state", "app"),
        SegmentLog(root / "log"),
        ["s", "t"],
        guarantee="at_least_once",
        offsets=offsets,
    )


def _write_checkpoint(root: Path, task: TaskId, entries: dict[object, int]) -> None:
    from statestore import OffsetCheckpoint

    (root / "state" / "app" / str(task) / "rocksdb" / "s").mkdir(parents=True)  # local state present
    OffsetCheckpoint(root / "state" / "app" / str(task) / ".checkpoint").write(entries)  # type: ignore[arg-type]


def test_49_offset_sum_from_checkpoint_file_of_an_uninitialized_task(root: Path) -> None:
    tm = _two_store_manager(root, "checkpoint")
    _write_checkpoint(root, T, {changelog_tp(T, "s"): 5, changelog_tp(T, "t"): 10})
    assert tm.task_offset_sums() == {T: 15}
    assert tm.directory.locked_tasks() == [], "directories read for offset sums are unlocked again"
    close_all(tm)


def test_49_unknown_offsets_are_skipped_and_sums_pinned(root: Path) -> None:
    tm = _two_store_manager(root, "checkpoint")
    _write_checkpoint(root, T, {changelog_tp(T, "s"): -4, changelog_tp(T, "t"): 10})
    _write_checkpoint(root, T2, {changelog_tp(T2, "s"): 2**63 - 1, changelog_tp(T2, "t"): 2**63 - 1})
    assert tm.task_offset_sums() == {T: 10, T2: 2**63 - 1}
    close_all(tm)


def test_49_offset_sums_of_owned_tasks_and_of_offsets_kept_in_stores(root: Path) -> None:
    _close_with_state(root, "at_least_once", "store", n=12)
    tm = running(root, "at_least_once", active=[T2])
    assert tm.task_offset_sums() == {T: 11, T2: 0}
    assert tm.directory.locked_tasks() == [T2]
    empty = TaskId(3, 3)
    assert tm.directory.lock(empty)
    tm.directory.unlock(empty)
    assert empty not in tm.task_offset_sums(), "empty task directories are skipped, never left locked"
    close_all(tm)


def test_background_restore_while_another_task_processes(root: Path) -> None:
    log = SegmentLog(root / "log")
    produce(log, TP2, [(b"k%d" % i, b"%d" % i) for i in range(3000)])
    tm = manager(root, "exactly_once_v2", background_restore=True, chunk_offsets=500, log=log)
    tm.start()
    tm.assign([T, T2], [])
    processed = 0
    while not tm.poll(timeout=0.01):
        if tm.task(T).state is TaskState.RUNNING:  # processing goes on while T2 restores
            tm.active_task(T).store(STORE).put(b"n", b"%d" % processed)
            processed += 1
            tm.commit()
    assert processed >= 1
    data = dict(tm.active_task(T2).store(STORE))
    assert len(data) == 3000 and data[b"k2999"] == b"2999"
    assert dict(tm.active_task(T).store(STORE)) == {b"n": b"%d" % (processed - 1)}
    close_all(tm)


def test_offset_before_the_changelog_start_is_corruption(root: Path) -> None:
    log = SegmentLog(root / "log", segment_bytes=2048, sync=False)
    tm = running(root, "at_least_once", log=log)
    for i in range(20):
        tm.active_task(T).store(STORE).put(b"mine%d" % i, b"v")
    tm.commit()  # the store records offset 19
    close_all(tm)
    writer = log.producer()
    for i in range(280):
        writer.send(TP.topic, TP.partition, b"k%d" % i, b"x" * 20)
        if i % 20 == 19:
            writer.flush()
    log.close()
    first = sorted((root / "log" / str(TP)).glob("*.log"))[0]
    first.unlink()  # retention deleted the oldest segment: offsets 20.. and more are gone
    first.with_suffix(".index").unlink(missing_ok=True)
    log = SegmentLog(root / "log", segment_bytes=2048, sync=False)
    start = log.start_offset(TP)
    assert start > 20
    events = Events()
    tm = running(root, "at_least_once", log=log, listener=events)
    assert events.calls[0][3] == start, "wiped: restored from the log's new start"
    data = dict(tm.active_task(T).store(STORE))
    assert not any(k.startswith(b"mine") for k in data), (
        "the records between offset 19 and the start are lost"
    )
    close_all(tm)


# -- store formats -------------------------------------------------------------------------------


@pytest.mark.parametrize("guarantee", ["exactly_once_v2", "at_least_once"])
def test_a_timestamped_store_is_written_and_restored_in_its_format(root: Path, guarantee: str) -> None:
    def timestamped_manager(state: str) -> TaskManager:
        tm = TaskManager(
            StateDirectory(root / state, "app"),
            SegmentLog(root / "log", sync=False),
            {STORE: "timestamped"},
            guarantee=guarantee,
        )
        tm.start()
        return tm

    values = {b"k%d" % i: encode_timestamped(1_700_000_000_000 + i, b"v%d" % i) for i in range(50)}
    tm = timestamped_manager("state")
    tm.assign([T], [])
    assert tm.restore()
    task = tm.task(T)
    assert isinstance(task, ActiveTask)
    for k, v in values.items():
        task.store(STORE).put(k, v)
    tm.commit()
    close_all(tm)
    written = root / "state" / "app" / str(T) / "rocksdb" / STORE
    assert _native.store_format(written) == "timestamped"
    # The changelog holds what Kafka Streams logs: the plain value, with the timestamp on the record.
    logged = {r.key: encode_timestamped(r.timestamp, r.value) for r in SegmentLog(root / "log").read(TP)}
    assert logged == values
    # Restored elsewhere from the changelog, as an active task and as a standby: the same format.
    for state, active, standby in (("active", [T], []), ("standby", [], [T])):
        other = timestamped_manager(state)
        other.assign(active, standby)
        for _ in range(200):
            other.poll()
            if other.task(T).offsets().get(TP) == len(values) - 1:
                break
        assert other.task(T).offsets().get(TP) == len(values) - 1, state
        close_all(other)
        restored = root / state / "app" / str(T) / "rocksdb" / STORE
        assert _native.store_format(restored) == "timestamped", state
        assert store_contents(restored).data == store_contents(written).data == values, state


# -- a changelog whose cluster gives no answer ---------------------------------------------------


class Unanswering(SegmentLog):
    """A segment log whose offsets give no answer (``ChangelogUnavailableError``) for the
    partitions in ``down``, and for each call scripted ``False`` in ``script[tp]``."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, sync=False)
        self.down: set[TopicPartition] = set()
        self.script: dict[TopicPartition, list[bool]] = {}
        self.asked: list[TopicPartition] = []

    def offsets(self, tp: PartitionLike) -> tuple[int, int, int]:
        t = coerce_tp(tp)
        self.asked.append(t)
        script = self.script.get(t)
        if t in self.down or (script and not script.pop(0)):
            raise ChangelogUnavailableError(f"changelog {t}: no answer")
        return super().offsets(tp)


def _poll_until(tm: TaskManager, done: Callable[[], bool], unanswered: bool) -> None:
    """Poll until ``done()``: each poll raises ChangelogUnavailableError when ``unanswered``."""
    for _ in range(50):
        if unanswered:
            with pytest.raises(ChangelogUnavailableError):
                tm.poll()
        else:
            tm.poll()
        if done():
            return
    raise AssertionError("not done after 50 polls")


def test_a_changelog_that_does_not_answer_holds_back_only_its_own_tasks(root: Path) -> None:
    """A cluster that does not answer for one changelog (a broker down or stalled) costs only the
    tasks it feeds: the others restore, process and commit; its own wait, with nothing opened or
    locked, and go on from where they stood once it answers. Each poll says so (raising
    ``ChangelogUnavailableError`` after doing everything else)."""
    log = Unanswering(root / "log")
    produce(log, TP, [(b"a%d" % i, b"%d" % i) for i in range(100)])
    produce(log, TP2, [(b"b%d" % i, b"%d" % i) for i in range(100)])
    tm = manager(root, "exactly_once_v2", log=log)

    def standby_at_end() -> bool:
        return tm.task(T2).offsets().get(TP2) == SegmentLog(root / "log").end_offset(TP2) - 1

    tm.start()
    # T's changelog answers its initialization (the state updater starts from that answer), then
    # not once; T2's nothing.
    log.script[TP] = [True, False]
    log.down = {TP2}
    tm.assign([T], [T2])  # assigning raises nothing: the tasks wait
    log.asked.clear()
    with pytest.raises(ChangelogUnavailableError):
        tm.poll()
    assert log.asked.count(TP2) == 1, "a waiting task is asked once a poll"
    _poll_until(tm, lambda: tm.task(T).state is TaskState.RUNNING, unanswered=True)
    assert dict(tm.active_task(T).store(STORE)) == {b"a%d" % i: b"%d" % i for i in range(100)}
    assert tm.task(T2).state is TaskState.CREATED
    assert T2 not in tm.directory.locked_tasks(), "a task that waits holds no lock"
    tm.active_task(T).store(STORE).put(b"n", b"1")  # processing goes on
    tm.commit()
    assert committed(root)[b"n"] == b"1"
    # It answers: the standby is opened and brought up to date.
    log.down = set()
    _poll_until(tm, lambda: T2 in tm.updater and standby_at_end(), unanswered=False)
    # Silent again while more is written: the standby waits, then catches up.
    produce(log, TP2, [(b"c%d" % i, b"%d" % i) for i in range(50)])
    log.down = {TP2}
    for _ in range(3):
        log.asked.clear()
        with pytest.raises(ChangelogUnavailableError):
            tm.poll()
        # Each unanswered call may cost a request timeout: asked once a poll, not at every step.
        assert log.asked.count(TP2) == 1
    tm.active_task(T).store(STORE).put(b"n", b"2")
    tm.commit()
    log.down = set()
    _poll_until(tm, standby_at_end, unanswered=False)
    close_all(tm)
    data, offsets = on_disk(root, T2)
    assert len(data) == 150 and data[b"c49"] == b"49"
    assert offsets == {str(TP2): SegmentLog(root / "log").end_offset(TP2) - 1}


def test_many_changelogs_that_do_not_answer_cost_a_poll_one_ask_and_each_gets_its_turn(root: Path) -> None:
    """Each ask of a changelog whose cluster gives no answer may wait a whole request timeout (a
    broker that stalls without refusing connections): a poll that asked every waiting one again
    waited that long for each, the running tasks with it. Now a poll asks one again, the one asked
    longest ago, so each gets its turn; one whose cluster answers again is taken up on its turn."""
    tasks = [TaskId(0, p) for p in range(4)]
    tps = [changelog_tp(t) for t in tasks]
    log = Unanswering(root / "log")
    for tp in tps:
        produce(log, tp, [(b"k%d" % i, b"%d" % i) for i in range(20)])
    tm = manager(root, "exactly_once_v2", log=log)
    tm.start()
    log.down = set(tps[1:])  # three standbys whose changelogs give no answer
    tm.assign([tasks[0]], tasks[1:])
    assert tm.task(tasks[0]).state is not TaskState.CREATED
    asked: list[list[TopicPartition]] = []
    for _ in range(6):
        log.asked.clear()
        with pytest.raises(ChangelogUnavailableError):
            tm.poll()
        asked.append([tp for tp in log.asked if tp in log.down])
    assert [len(a) for a in asked] == [1] * 6, asked  # one ask a poll, not three
    assert {tp for a in asked[:3] for tp in a} == set(tps[1:]), "each in its turn"
    assert asked[3:] == asked[:3]
    assert tm.task(tasks[0]).state is TaskState.RUNNING  # the other task went on
    log.down = {tps[1], tps[2]}  # the third answers again: taken up on its turn
    for _ in range(3):
        with pytest.raises(ChangelogUnavailableError):
            tm.poll()
    assert tasks[3] in tm.updater
    log.down = set()
    with pytest.raises(ChangelogUnavailableError):
        tm.poll()  # one of the two waiting is asked on its turn, and answers; the other still waits
    assert len(tm.unanswered.waiting()) == 1
    tm.poll()  # every changelog has answered
    assert all(t in tm.updater for t in tasks[1:])
    close_all(tm)


def test_a_turn_nobody_takes_passes_to_the_next_waiter() -> None:
    """A waiter whose turn comes while its task is not due this poll must not keep the turn, or the
    others would never be asked again."""
    u = UnansweredChangelogs()
    a, b = TopicPartition("c", 0), TopicPartition("c", 1)
    silent = ChangelogUnavailableError("no answer")
    u.no_answer(a, [a], silent)
    u.no_answer(b, [b], silent)
    u.new_poll()  # a's turn (asked longest ago); nobody asks for it
    assert not u.may_ask(b, [b])
    u.new_poll()  # the turn passed to b
    assert not u.may_ask(a, [a]) and u.may_ask(b, [b]) and not u.may_ask(b, [b])
    u.no_answer(b, [b], silent)
    assert not u.may_ask(TopicPartition("c", 2), [b]), "nothing reading a changelog silent this poll"
    u.answered(b)
    u.new_poll()
    assert u.may_ask(a, [a]) and u.may_ask(b, [b]) and u.waiting() == [a]


def test_a_new_task_asks_its_changelogs_range_once_to_open_and_to_start_restoring(root: Path) -> None:
    """Opening a task's state reads its changelogs' ranges (to check the stores' offsets against
    them); the state updater starts the restore or update from the same answer instead of asking
    the cluster again: one round trip a changelog of a new task, not two."""
    log = Unanswering(root / "log")
    produce(log, TP, [(b"a%d" % i, b"%d" % i) for i in range(10)])
    produce(log, TP2, [(b"b%d" % i, b"%d" % i) for i in range(10)])
    tm = manager(root, "exactly_once_v2", log=log)
    tm.start()
    log.asked.clear()
    tm.assign([T], [T2])  # opened and handed to the state updater
    assert T in tm.updater and T2 in tm.updater
    assert (log.asked.count(TP), log.asked.count(TP2)) == (1, 1), log.asked
    tm.poll()
    assert tm.task(T).state is TaskState.RUNNING
    close_all(tm)


@pytest.mark.parametrize("background", [False, True], ids=["foreground", "background"])
def test_a_restore_stopped_by_a_changelog_that_does_not_answer_goes_on_from_where_it_stood(
    root: Path, monkeypatch: pytest.MonkeyPatch, background: bool
) -> None:
    """The restore engine's ChangelogUnavailableError (a fetch that got no answer) fails no task:
    the store is as the restore left it, and the next poll goes on; nothing is wiped. Every poll
    says it until that changelog's restore succeeds -- also the polls in the background that find
    the next chunk still running, or an application would take them for an answer and never stop
    waiting (its task_timeout starts again on every answer)."""
    log = SegmentLog(root / "log", sync=False)
    produce(log, TP, [(b"a%d" % i, b"%d" % i) for i in range(300)])
    real = updater_module.restore_many
    silent = [2]  # the first two rounds get no answer

    def restore_many(specs: list[RestoreSpec], **kw: Any) -> list[RestoreResult]:
        if silent[0] == 0:
            return real(specs, **kw)
        time.sleep(0.05)  # a fetch that waited
        silent[0] -= 1
        error = ChangelogUnavailableError("broker 127.0.0.1:1: no answer within 30 s")
        return [
            RestoreResult(
                s.tp,
                s.store_path,
                s.mode,
                OFFSET_UNKNOWN,
                OFFSET_UNKNOWN,
                0,
                SkippedRecords(),
                0,
                0.0,
                None,
                error,
            )
            for s in specs
        ]

    monkeypatch.setattr(updater_module, "restore_many", restore_many)
    wipes: list[TaskId] = []
    tm = manager(root, "exactly_once_v2", log=log, chunk_offsets=100, background_restore=background)
    monkeypatch.setattr(tm, "_handle_corrupted", lambda task, error: wipes.append(task.id))
    tm.start()
    tm.assign([T], [])
    said = 0
    for _ in range(200):
        try:
            tm.poll(0.01)
        except ChangelogUnavailableError:
            said += 1
            assert tm.task(T).state is TaskState.RESTORING and T in tm.updater
            continue
        if said:  # the first answer after silence: the restore that succeeded
            assert silent[0] == 0
            break
    assert said >= 2
    assert tm.restore()
    assert dict(tm.active_task(T).store(STORE)) == {b"a%d" % i: b"%d" % i for i in range(300)}
    assert wipes == []
    close_all(tm)
