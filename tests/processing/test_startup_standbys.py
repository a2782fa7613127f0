"""Guarantee 8 of docs/architecture.md (KAFKA-17411): local state is opened as standbys on start, corruption wiped before any assignment.

A process restarts with 8 local task directories, 2 of them corrupted. At
``start()`` both corrupted ones are wiped; on the first assignment the other 6
are reused -- the same state manager, the same task lock, no re-restore --
whether they are assigned as active or standby. At most ``max_startup_tasks``
stay open.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from statestore import SegmentLog, TaskId
from statestore.processing.task import StandbyTask, TaskState
from statestore.state.store import OFFSETS_CF, STATUS_KEY, STATUS_OPEN, encode_i64
from support.tasks import STORE, Events, changelog_tp, close_all, manager

TASKS = [TaskId(0, p) for p in range(8)]
CORRUPT = [TASKS[2], TASKS[5]]


def write_state(root: Path, guarantee: str, offsets: str) -> None:
    tm = manager(root, guarantee, offsets)
    tm.start()
    tm.assign(TASKS, [])
    assert tm.restore()
    for t in TASKS:
        for i in range(10):
            tm.active_task(t).store(STORE).put(b"k%d" % i, b"%s-%d" % (str(t).encode(), i))
    tm.commit()
    close_all(tm)


def store_db(root: Path, task: TaskId) -> Rdict:
    path = root / "state" / "app" / str(task) / "rocksdb" / STORE
    return Rdict(str(path), Options(raw_mode=True), column_families={OFFSETS_CF: Options(raw_mode=True)})


def corrupt(root: Path, offsets: str) -> None:
    a, b = CORRUPT
    if offsets == "store":
        db = store_db(root, a)  # data without an offset: unknown state under exactly-once
        del db.get_column_family(OFFSETS_CF)[str(changelog_tp(a)).encode()]
        db.close()
        db = store_db(root, b)  # an offset the changelog never reached
        db.get_column_family(OFFSETS_CF)[str(changelog_tp(b)).encode()] = encode_i64(10**9)
        db.close()
    else:
        (root / "state" / "app" / str(a) / ".checkpoint").unlink()  # local files without a checkpoint
        db = store_db(root, b)  # left OPEN by a crash: may hold aborted writes
        db.get_column_family(OFFSETS_CF)[STATUS_KEY] = encode_i64(STATUS_OPEN)
        db.close()


@pytest.mark.parametrize("offsets", ["store", "checkpoint"])
def test_eight_task_dirs_two_corrupted(tmp_path: Path, offsets: str) -> None:
    (tmp_path / "log").mkdir()
    write_state(tmp_path, "exactly_once_v2", offsets)
    corrupt(tmp_path, offsets)

    events = Events()
    tm = manager(tmp_path, "exactly_once_v2", offsets, listener=events, standby_listener=events)
    tm.start()
    app = tmp_path / "state" / "app"
    for t in CORRUPT:
        assert not (app / str(t) / "rocksdb").exists(), f"corrupted task {t} must be wiped at start()"
    startup = {t.id: t for t in tm.startup_tasks()}
    assert sorted(startup) == [t for t in TASKS if t not in CORRUPT]
    assert all(isinstance(t, StandbyTask) and t.state is TaskState.RUNNING for t in startup.values())
    opened = {tid: (t.state_manager, t.state_manager.lock_token) for tid, t in startup.items()}

    active, standby = TASKS[:4], TASKS[4:]
    tm.assign(active, standby)
    assert tm.restore()
    for tid, (sm, token) in opened.items():
        task = tm.task(tid)
        assert task.state_manager is sm and sm.lock_token == token, f"{tid} was reopened instead of reused"
    assert tm.startup_tasks() == []
    log = SegmentLog(tmp_path / "log")
    for t in active:
        data = dict(tm.active_task(t).store(STORE))
        assert data == {b"k%d" % i: b"%s-%d" % (str(t).encode(), i) for i in range(10)}
    starts = {c[1]: c[3] for c in events.calls if c[0] == "start"}
    assert starts[changelog_tp(CORRUPT[0])] == 0, "the wiped task restores from the beginning"
    for t in active:
        if t not in CORRUPT:
            assert starts[changelog_tp(t)] > 0, f"{t} was reused: only the tail is restored"
            assert starts[changelog_tp(t)] >= log.end_offset(changelog_tp(t)) - 1
    close_all(tm)


def test_startup_standbys_are_bounded(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    write_state(tmp_path, "exactly_once_v2", "store")
    corrupt(tmp_path, "store")
    tm = manager(tmp_path, "exactly_once_v2", "store", max_startup_tasks=3)
    tm.start()
    assert len(tm.startup_tasks()) == 3
    assert sorted(tm.directory.locked_tasks()) == sorted(t.id for t in tm.startup_tasks()), (
        "the rest were closed"
    )
    app = tmp_path / "state" / "app"
    for t in CORRUPT:
        assert not (app / str(t) / "rocksdb").exists(), "corruption is wiped even beyond the bound"
    tm.assign([], [])
    assert tm.startup_tasks() == [] and tm.directory.locked_tasks() == [], (
        "unclaimed startup tasks are closed"
    )
    close_all(tm)
