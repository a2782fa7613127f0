"""Locks across processes: the application directory and task locks exclude other processes too.

Each test starts a fresh interpreter that takes a lock and waits; this process
then contends for the same lock. Killing the child (SIGKILL) must free it: the
OS drops the file locks of a dead process, so no stale lock survives a crash.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from statestore import LockError, TaskId
from statestore.state.directory import StateDirectory

T0 = TaskId(0, 0)

CHILD = textwrap.dedent(
    """
    import sys
    from statestore import TaskId
    from statestore.state.directory import StateDirectory
    root, shared, task = sys.argv[1], sys.argv[2] == "shared", sys.argv[3]
    sd = StateDirectory(root, "app", shared=shared)
    ok = sd.lock(TaskId.parse(task)) if task != "-" else True
    print("locked" if ok else "busy", flush=True)
    sys.stdin.readline()
    """
)


class Child:
    """A child process holding locks until told to stop (or killed)."""

    def __init__(self, root: Path, *, shared: bool, task: str = "-") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(root), "shared" if shared else "exclusive", task],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.status = self.proc.stdout.readline().strip()
        if not self.status:
            raise AssertionError(f"child failed: {self.proc.stderr.read() if self.proc.stderr else ''}")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write("\n")
            self.proc.stdin.flush()
            self.proc.wait()


@pytest.fixture
def children() -> Iterator[list[Child]]:
    made: list[Child] = []
    yield made
    for c in made:
        if c.proc.poll() is None:
            c.kill()


def test_second_process_gets_lock_error_naming_the_holder(tmp_path: Path, children: list[Child]) -> None:
    child = Child(tmp_path, shared=False)
    children.append(child)
    assert child.status == "locked"
    with pytest.raises(LockError, match=f"process {child.proc.pid} on host") as e:
        StateDirectory(tmp_path, "app")
    assert e.value.path == str(tmp_path / "app" / ".lock")
    child.kill()  # a crashed holder frees the directory
    with StateDirectory(tmp_path, "app") as sd:
        assert sd.lock(T0)


def test_child_is_refused_while_this_process_holds_the_directory(tmp_path: Path) -> None:
    with StateDirectory(tmp_path, "app"):
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, str(tmp_path), "exclusive", "-"],
            capture_output=True,
            text=True,
            input="\n",
        )
    assert proc.returncode != 0
    assert "LockError" in proc.stderr and f"process {os.getpid()}" in proc.stderr


def test_two_processes_contend_for_one_task_lock(tmp_path: Path, children: list[Child]) -> None:
    """Shared openers (e.g. PySpark workers) exclude each other per task through OS file locks."""
    child = Child(tmp_path, shared=True, task="0_0")
    children.append(child)
    assert child.status == "locked"
    with StateDirectory(tmp_path, "app", shared=True) as sd:
        assert sd.lock(T0) is False
        assert sd.lock(TaskId(0, 1)) is True  # another task is free
        other = Child(tmp_path, shared=True, task="0_1")
        children.append(other)
        assert other.status == "busy"  # and this process's lock excludes the child
        child.kill()
        assert sd.lock(T0) is True  # the dead holder's lock is gone
        token = sd.acquire(T0)
        sd.ensure_held(token)


def test_cleaner_skips_a_task_locked_by_another_process(tmp_path: Path, children: list[Child]) -> None:
    child = Child(tmp_path, shared=True, task="0_0")
    children.append(child)
    with StateDirectory(tmp_path, "app", shared=True, cleanup_delay_ms=0) as sd:
        sd.store_dir(T0, "s").mkdir(parents=True)
        assert sd.clean_removed_tasks(now_ms=10**15) == []
        assert sd.store_dir(T0, "s").is_dir()
        child.stop()
        assert sd.clean_removed_tasks(now_ms=10**15) == [T0]
        assert not sd.task_dir(T0).exists()


#: Kafka Streams' lock on ``<app>/.lock``: Java's ``FileChannel.tryLock``, a POSIX (fcntl) lock.
KAFKA_STREAMS_LOCK = textwrap.dedent(
    """
    import fcntl, sys
    f = open(sys.argv[1], "a+")
    try:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print("busy", flush=True)
        sys.exit(0)
    print("locked", flush=True)
    sys.stdin.readline()
    """
)


def _kafka_streams_lock(app: Path) -> subprocess.Popen[str]:
    app.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-c", KAFKA_STREAMS_LOCK, str(app / ".lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("shared", [False, True], ids=["exclusive", "shared"])
def test_kafka_streams_and_statestore_lock_each_other_out_of_one_state_directory(
    tmp_path: Path, shared: bool
) -> None:
    """Kafka Streams' POSIX lock on ``<app>/.lock`` is unseen by an flock: statestore used to open a
    directory a running Kafka Streams used (its tools checked /proc/locks first, with a window
    before the work), and Kafka Streams could start on one statestore used. Now either refuses the
    other, with no window between a check and the work."""
    app = tmp_path / "app"
    ks = _kafka_streams_lock(app)
    try:
        assert ks.stdout is not None and ks.stdout.readline().strip() == "locked"
        with pytest.raises(LockError, match=f"process {ks.pid}, which holds a POSIX lock"):
            StateDirectory(tmp_path, "app", shared=shared)
        assert not (app / "kafka-streams-process-metadata").exists()  # nothing was touched
    finally:
        ks.kill()
        ks.wait()
    with StateDirectory(tmp_path, "app", shared=shared):
        late = _kafka_streams_lock(app)  # Kafka Streams starting meanwhile cannot lock it
        assert late.stdout is not None and late.stdout.readline().strip() == "busy"
        late.wait()
    after = _kafka_streams_lock(app)
    assert after.stdout is not None and after.stdout.readline().strip() == "locked"
    after.kill()
    after.wait()


def test_a_second_opener_in_this_process_leaves_kafka_streams_locked_out(tmp_path: Path) -> None:
    """A classic POSIX lock goes with any close of the file in the process: a second opener here,
    refused by the flock, closed its descriptor and so let Kafka Streams in under the first. The
    lock is one of the open file description (Linux), which goes only with its own descriptor."""
    app = tmp_path / "app"
    with StateDirectory(tmp_path, "app"):
        with pytest.raises(LockError):
            StateDirectory(tmp_path, "app")
        ks = _kafka_streams_lock(app)
        assert ks.stdout is not None and ks.stdout.readline().strip() == "busy"
        ks.wait()
