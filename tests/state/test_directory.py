"""StateDirectory: layout, process lock and id, task locks, cleaner, wipe (reference §7 items 8-18)."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from statestore import IllegalStateError, LockError, StateStoreError, TaskId
from statestore.state.directory import PROCESS_FILE_NAME, StateDirectory, TaskLock

T0 = TaskId(0, 0)
T1 = TaskId(0, 1)
T2 = TaskId(1, 0)


@pytest.fixture
def sd(tmp_path: Path) -> Iterator[StateDirectory]:
    d = StateDirectory(tmp_path, "app")
    yield d
    d.close()


def in_thread(fn: Callable[[], object]) -> object:
    """Run ``fn`` in a fresh thread and return its result (or raise its exception)."""
    out: list[object] = []
    err: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:
            err.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if err:
        raise err[0]
    return out[0]


def test_layout(sd: StateDirectory, tmp_path: Path) -> None:
    assert sd.app_dir == tmp_path / "app"
    assert (tmp_path / "app" / ".lock").is_file()
    assert sd.task_dir(T1) == tmp_path / "app" / "0_1"
    assert sd.store_dir(T1, "s") == tmp_path / "app" / "0_1" / "rocksdb" / "s"
    assert sd.checkpoint_path(T1) == tmp_path / "app" / "0_1" / ".checkpoint"
    assert not sd.task_dir(T1).exists()  # paths only; lock() creates
    assert sd.lock(T1)
    assert sd.task_dir(T1).is_dir()
    assert sd.task_dirs() == [T1]


def test_should_report_directory_empty(sd: StateDirectory) -> None:
    """Item 8: a directory with only `.checkpoint` is empty; store content makes it non-empty."""
    assert sd.lock(T0)
    assert sd.is_empty(T0)  # the lock file does not count
    (sd.task_dir(T0) / ".checkpoint").write_text("0\n0\n")
    assert sd.is_empty(T0)
    (sd.task_dir(T0) / "db" / "store1").mkdir(parents=True)
    assert not sd.is_empty(T0)
    (sd.task_dir(T0) / "db" / "store1").rmdir()
    (sd.task_dir(T0) / "db").rmdir()
    assert sd.is_empty(T0)


def test_should_not_lock_state_dir_locked_by_another_thread(sd: StateDirectory) -> None:
    """Item 9: thread B locks and exits without unlocking; A cannot lock."""
    assert in_thread(lambda: sd.lock(T0)) is True
    assert sd.lock(T0) is False


def test_should_not_unlock_state_dir_locked_by_another_thread(sd: StateDirectory) -> None:
    """Item 10: unlock by a non-owner is ignored; after the owner unlocks, another thread can lock."""
    got = threading.Event()
    release = threading.Event()
    done = threading.Event()

    def owner() -> None:
        assert sd.lock(T0)
        got.set()
        release.wait()
        sd.unlock(T0)
        done.set()

    t = threading.Thread(target=owner)
    t.start()
    got.wait()
    sd.unlock(T0)  # ignored
    assert sd.lock(T0) is False
    release.set()
    done.wait()
    t.join()
    assert sd.lock(T0) is True


def test_should_be_true_if_already_holds_lock(sd: StateDirectory) -> None:
    """Item 11: locking twice from the same thread returns True (not counted: one unlock releases)."""
    assert sd.lock(T0)
    assert sd.lock(T0)
    sd.unlock(T0)
    assert in_thread(lambda: sd.lock(T0)) is True


def test_clean_up_task_directories_that_are_not_locked(tmp_path: Path) -> None:
    """Item 12: three task directories, two locked; the cleaner deletes only the unlocked one."""
    with StateDirectory(tmp_path, "app", cleanup_delay_ms=0) as sd:
        for t in (T0, T1, T2):
            assert sd.lock(t)
        sd.unlock(T2)
        assert in_thread(lambda: sd.clean_removed_tasks(now_ms=int(time.time() * 1000) + 1000)) == [T2]
        assert sd.task_dirs() == [T0, T1]


def test_cleanup_uses_last_modified_and_delay(tmp_path: Path) -> None:
    """Item 13: with a 60 s delay the directory survives; 61 s later it is deleted."""
    with StateDirectory(tmp_path, "app", cleanup_delay_ms=60_000) as sd:
        assert sd.lock(T0)
        sd.unlock(T0)
        mtime_ms = int(os.stat(sd.task_dir(T0)).st_mtime * 1000)
        assert sd.clean_removed_tasks(now_ms=mtime_ms + 1000) == []
        assert sd.task_dirs() == [T0]
        assert sd.clean_removed_tasks(now_ms=mtime_ms + 61_000) == [T0]
        assert not sd.task_dir(T0).exists()


def test_should_not_remove_non_task_directories_and_files(tmp_path: Path) -> None:
    """Item 14: `foo/`, files and the process files survive the cleaner."""
    with StateDirectory(tmp_path, "app", cleanup_delay_ms=0) as sd:
        (sd.app_dir / "foo").mkdir()
        (sd.app_dir / "0_x").mkdir()
        (sd.app_dir / "1_1").write_text("a file named like a task")
        assert sd.clean_removed_tasks(now_ms=int(time.time() * 1000) + 10_000) == []
        for name in ("foo", "0_x", "1_1", ".lock", PROCESS_FILE_NAME):
            assert (sd.app_dir / name).exists(), name


def test_should_only_list_non_empty_task_directories(sd: StateDirectory) -> None:
    """Item 15: only directories with store content are non-empty; non-task entries are not listed."""
    for t in (T0, T1, T2):
        assert sd.lock(t)
    (sd.store_dir(T1, "s")).mkdir(parents=True)
    (sd.task_dir(T2) / ".checkpoint").write_text("0\n0\n")
    (sd.app_dir / "foo").mkdir()
    assert sd.task_dirs() == [T0, T1, T2]
    assert sd.non_empty_task_dirs() == [T1]


def test_process_id_is_stable_across_restart(tmp_path: Path) -> None:
    """Item 16a: the process id survives close() and reopen."""
    with StateDirectory(tmp_path, "app") as sd:
        first = sd.process_id
    data = json.loads((tmp_path / "app" / PROCESS_FILE_NAME).read_text())
    assert data == {"processId": str(first)}
    with StateDirectory(tmp_path, "app") as sd:
        assert sd.process_id == first


@pytest.mark.parametrize("content", ["not json at all", '{"processId": null}', '{"processId": "xyz"}', "[]"])
def test_fresh_process_id_if_file_unreadable(tmp_path: Path, content: str) -> None:
    """Item 16b: an unreadable process file yields a new UUID, which is then persisted."""
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / PROCESS_FILE_NAME).write_text(content)
    with StateDirectory(tmp_path, "app") as sd:
        pid = sd.process_id
        assert isinstance(pid, uuid.UUID)
    with StateDirectory(tmp_path, "app") as sd:
        assert sd.process_id == pid


def test_app_dir_occupied_by_a_file(tmp_path: Path) -> None:
    """Item 17: `<app>` is a regular file -> an error naming it."""
    (tmp_path / "app").write_text("x")
    with pytest.raises(StateStoreError, match="not a directory") as e:
        StateDirectory(tmp_path, "app")
    assert e.value.path == str(tmp_path / "app")


def test_second_opener_in_same_process_is_refused_and_told_the_holder(tmp_path: Path) -> None:
    with StateDirectory(tmp_path, "app"):
        with pytest.raises(LockError, match=f"process {os.getpid()}"):
            StateDirectory(tmp_path, "app")
    StateDirectory(tmp_path, "app").close()  # released on close


def test_shared_openers_coexist_but_exclude_an_exclusive_one(tmp_path: Path) -> None:
    a = StateDirectory(tmp_path, "app", shared=True)
    b = StateDirectory(tmp_path, "app", shared=True)
    try:
        assert a.process_id == b.process_id
        with pytest.raises(LockError):
            StateDirectory(tmp_path, "app")
        # task locks still exclude each other across the two openers
        assert a.lock(T0)
        assert b.lock(T0) is False
    finally:
        a.close()
        b.close()


def test_lock_ownership_moves_to_another_thread(sd: StateDirectory) -> None:
    """Item 18: a startup task's lock moves from the main thread to a stream thread; tokens stay valid."""
    token = sd.acquire(T0)
    assert token is not None
    stream = threading.Thread(target=lambda: None)
    sd.transfer_lock(T0, stream)
    assert sd.owner(T0) is stream
    assert sd.lock(T0) is False  # the main thread no longer owns it
    sd.ensure_held(token)
    with pytest.raises(LockError):
        sd.transfer_lock(T0, threading.current_thread())


def test_lock_on_deleted_application_directory_raises(tmp_path: Path) -> None:
    sd = StateDirectory(tmp_path, "app")
    try:
        import shutil

        shutil.rmtree(sd.app_dir)
        with pytest.raises(IllegalStateError, match="has been deleted"):
            sd.lock(T0)
        assert not sd.app_dir.exists()
    finally:
        sd.close()


def test_closed_directory_refuses_locks_and_releases_held_ones(tmp_path: Path) -> None:
    sd = StateDirectory(tmp_path, "app")
    token = sd.acquire(T0)
    sd.close()
    with pytest.raises(IllegalStateError):
        sd.lock(T0)
    with pytest.raises(LockError):
        sd.ensure_held(token)
    with StateDirectory(tmp_path, "app") as again:
        assert again.lock(T0)


def test_tokens_are_per_acquisition(sd: StateDirectory) -> None:
    first = sd.acquire(T0)
    assert first is not None and sd.acquire(T0) == first  # re-entrant: same token
    sd.unlock(T0)
    with pytest.raises(LockError, match="released or taken over"):
        sd.ensure_held(first)
    second = sd.acquire(T0)
    assert second is not None and second != first
    with pytest.raises(LockError):
        sd.ensure_held(first)  # same thread, new acquisition: the old token stays dead
    sd.ensure_held(second)
    with pytest.raises(LockError, match="never acquired"):
        sd.ensure_held(None)


def test_ensure_held_detects_a_deleted_task_directory(sd: StateDirectory) -> None:
    import shutil

    token = sd.acquire(T0)
    assert token is not None
    shutil.rmtree(sd.task_dir(T0))
    with pytest.raises(LockError, match="deleted while locked") as e:
        sd.ensure_held(token)
    assert e.value.task_id == T0
    assert not sd.task_dir(T0).exists()


def test_release_by_token_from_any_thread(sd: StateDirectory) -> None:
    token = in_thread(lambda: sd.acquire(T0))
    assert isinstance(token, TaskLock)
    assert sd.release(token) is True
    assert sd.release(token) is False  # stale
    assert sd.lock(T0)


def test_cleaner_never_deletes_a_locked_directory_even_when_old(tmp_path: Path) -> None:
    """Item 18a: the cleaner leaves locked tasks alone -- startup standbys hold their locks."""
    with StateDirectory(tmp_path, "app", cleanup_delay_ms=0) as sd:
        assert sd.lock(T0)
        (sd.store_dir(T0, "s")).mkdir(parents=True)
        far_future = int(time.time() * 1000) + 10**9
        assert sd.clean_removed_tasks(now_ms=far_future) == []  # the owner thread cleaning
        assert in_thread(lambda: sd.clean_removed_tasks(now_ms=far_future)) == []
        assert sd.store_dir(T0, "s").is_dir()


def test_wipe_requires_the_lock_and_keeps_it(sd: StateDirectory) -> None:
    assert sd.lock(T0)
    sd.store_dir(T0, "s").mkdir(parents=True)
    (sd.task_dir(T0) / ".checkpoint").write_text("0\n0\n")
    with pytest.raises(LockError, match="without holding its lock"):
        in_thread(lambda: sd.wipe(T0))
    assert not sd.is_empty(T0)
    sd.wipe(T0)
    assert sd.is_empty(T0)
    assert not (sd.task_dir(T0) / ".checkpoint").exists()
    assert in_thread(lambda: sd.lock(T0)) is False  # still held
    token = sd.acquire(T0)
    sd.ensure_held(token)
    with pytest.raises(LockError):
        sd.wipe(T1)


def test_a_wipe_that_fails_halfway_never_leaves_a_checkpoint_over_deleted_stores(
    sd: StateDirectory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the I/O-fault torture: the wipe deleted in directory order, so an error deleting the
    checkpoint after the stores were gone left a checkpoint whose offset the next restore started
    from -- into an empty store (at-least-once with a checkpoint: committed updates lost)."""
    import shutil

    assert sd.lock(T0)
    ckpt = sd.task_dir(T0) / ".checkpoint"

    def fill() -> None:
        (sd.store_dir(T0, "a") / "data").mkdir(parents=True, exist_ok=True)
        (sd.store_dir(T0, "z") / "data").mkdir(parents=True, exist_ok=True)
        ckpt.write_text("0\n1\napp-a-changelog 0 41\n")

    real_unlink, real_rmtree = os.unlink, shutil.rmtree

    def failing_unlink(path: str | os.PathLike[str], *a: object, **kw: object) -> None:
        if os.fspath(path).endswith(".checkpoint"):
            raise OSError(5, "Input/output error", os.fspath(path))
        real_unlink(path)

    fill()
    monkeypatch.setattr(os, "unlink", failing_unlink)
    with pytest.raises(StateStoreError, match="cannot wipe"):
        sd.wipe(T0)
    monkeypatch.setattr(os, "unlink", real_unlink)
    assert ckpt.exists() and sd.store_dir(T0, "a").exists() and sd.store_dir(T0, "z").exists(), (
        "the checkpoint could not be deleted, so nothing it describes may be"
    )

    def failing_rmtree(path: str | os.PathLike[str], *a: object, **kw: object) -> None:
        raise OSError(28, "No space left on device", os.fspath(path))

    monkeypatch.setattr(shutil, "rmtree", failing_rmtree)
    with pytest.raises(StateStoreError, match="cannot wipe"):
        sd.wipe(T0)
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    assert not ckpt.exists(), "stores are deleted only after the checkpoint is gone"
    sd.wipe(T0)
    assert sd.is_empty(T0)


def test_concurrent_lockers_get_exclusive_access(sd: StateDirectory) -> None:
    """Many threads race for one task lock: at any time at most one holds it."""
    holders = 0
    max_holders = 0
    guard = threading.Lock()
    wins = 0

    def worker() -> None:
        nonlocal holders, max_holders, wins
        for _ in range(200):
            if sd.lock(T0):
                with guard:
                    holders += 1
                    wins += 1
                    max_holders = max(max_holders, holders)
                with guard:
                    holders -= 1
                sd.unlock(T0)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max_holders == 1
    assert wins > 0
