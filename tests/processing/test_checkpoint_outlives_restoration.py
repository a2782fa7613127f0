"""Guarantees 1 and 2 of docs/architecture.md (KAFKA-20685): under exactly-once, a checkpoint outlived restoration and vouched for aborted writes.

The story. Kafka 4.2's state updater writes an enforced checkpoint when a task
finishes restoring -- and under exactly_once_v2 nothing deleted it when the
task turned RUNNING. The file survived the whole processing session. RocksDB
ran with its WAL off and Streams did not flush on commit, so background
flushes could persist writes of a transaction that was later aborted. After an
unclean crash the restart found the old checkpoint, trusted it, skipped the
wipe that a missing checkpoint would have forced, and replayed only the
committed tail on top of a store holding aborted data.

What must hold (DESIGN guarantees 1-3): with ``offsets="checkpoint"`` the file
is deleted when restoration completes, before RUNNING, so a crash while
RUNNING finds no checkpoint and a non-empty store -> ``TaskCorruptedError`` ->
wipe -> full restore. With ``offsets="store"`` uncommitted writes never reach
RocksDB at all, so a crash keeps exactly the committed prefix with its offset
and needs no wipe. The crash here is a real SIGKILL of a child process; the
same child run with Kafka 4.2's rule (file kept at restoration end) shows the
wipe being skipped, i.e. that this test catches the bug.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from statestore import OffsetCheckpoint, TaskCorruptedError, TaskId, TopicPartition
from statestore.state.directory import StateDirectory
from statestore.state.policy import Policy
from statestore.state.state_manager import StateManager
from support.model import store_contents

TASK = TaskId(0, 0)
TP = TopicPartition("app-s-changelog", 0)

CHILD = textwrap.dedent(
    """
    import sys
    from statestore import TaskId, TopicPartition
    from statestore.state.directory import StateDirectory
    from statestore.state.policy import POLICY_TABLE, Decision, Event, Guarantee, OffsetAction, OffsetsMode, Policy
    from statestore.state.state_manager import StateManager

    root, mode, rule = sys.argv[1], sys.argv[2], sys.argv[3]
    if rule == "kafka-4.2":  # the bug: keep the checkpoint written at restoration end
        key = (Event.RESTORE_COMPLETE, Guarantee.EXACTLY_ONCE_V2, OffsetsMode.CHECKPOINT)
        POLICY_TABLE[key] = Decision(OffsetAction.WRITE, True, False, "resume")
    tp = TopicPartition("app-s-changelog", 0)
    sd = StateDirectory(root, "app")
    sm = StateManager(sd, TaskId(0, 0), Policy.of("exactly_once_v2", mode, checkpoint_delta=0))
    sm.register("s")
    sm.initialize()
    # restoration of committed changelog data, offsets 0..9
    for off in range(10):
        sm.store("s").put(b"r%d" % off, b"restored")
    sm.restoration_progress({tp: 9})
    sm.complete_restoration({tp: 9})
    # RUNNING: transaction at offsets 10..11 commits (marker at 12) ...
    sm.store("s").put(b"a", b"committed")
    sm.store("s").put(b"b", b"committed")
    sm.commit({tp: 11})
    # ... the next transaction is still open when the process dies: it will be aborted
    sm.store("s").put(b"a", b"ABORTED")
    sm.store("s").put(b"c", b"ABORTED")
    print("running", flush=True)
    sys.stdin.readline()
    """
)


def crash_while_running(root: Path, mode: str, rule: str = "fixed") -> None:
    """Run the child until it is RUNNING with an open transaction, then SIGKILL it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root), mode, rule],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline().strip()
    assert line == "running", proc.stderr.read()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None:
            f.close()


def reopen(root: Path, mode: str) -> StateManager:
    sd = StateDirectory(root, "app")
    sm = StateManager(sd, TASK, Policy.of("exactly_once_v2", mode))
    sm.register("s")
    return sm


def test_checkpoint_is_gone_before_running(tmp_path: Path) -> None:
    with StateDirectory(tmp_path, "app") as sd:
        sm = StateManager(sd, TASK, Policy.of("exactly_once_v2", "checkpoint", checkpoint_delta=0))
        sm.register("s")
        sm.initialize()
        ckpt = OffsetCheckpoint(sd.checkpoint_path(TASK))
        sm.store("s").put(b"r", b"1")
        sm.restoration_progress({TP: 4})
        assert ckpt.read() == {TP: 4}  # restored data is committed: a checkpoint of it is fine ...
        sm.complete_restoration({TP: 9})
        assert not ckpt.exists()  # ... but it must be gone before the task turns RUNNING
        for off in range(10, 30_000, 10_000):
            sm.store("s").put(b"k", b"%d" % off)
            sm.commit({TP: off})
            assert not ckpt.exists()
        sm.close()
        assert ckpt.read() == {TP: 20_010}


def test_crash_while_running_with_checkpoint_mode_forces_a_wipe(tmp_path: Path) -> None:
    crash_while_running(tmp_path, "checkpoint")
    assert not (tmp_path / "app" / str(TASK) / ".checkpoint").exists()
    sm = reopen(tmp_path, "checkpoint")
    try:
        with pytest.raises(TaskCorruptedError) as e:
            sm.initialize()
        assert e.value.task_ids == frozenset({TASK})
        sm.wipe()
        sm.initialize()
        assert sm.offsets()[TP] is None  # full restore from the beginning
        assert list(sm.store("s")) == []
        sm.close(clean=False)
    finally:
        sm.directory.close()


def test_kafka_42_rule_would_skip_the_wipe(tmp_path: Path) -> None:
    """With the file kept at restoration end (the bug), the restart trusts a stale checkpoint: no wipe."""
    crash_while_running(tmp_path, "checkpoint", rule="kafka-4.2")
    assert OffsetCheckpoint(tmp_path / "app" / str(TASK) / ".checkpoint").read() == {TP: 9}
    sm = reopen(tmp_path, "checkpoint")
    try:
        sm.initialize()  # no TaskCorruptedError: this is what lost data in Kafka
        assert sm.offsets()[TP] == 9
        sm.close(clean=False)
    finally:
        sm.directory.close()


def test_crash_while_running_with_store_offsets_keeps_the_committed_prefix(tmp_path: Path) -> None:
    """Offsets in the store: the open transaction never reached RocksDB; resume from 11, no wipe."""
    crash_while_running(tmp_path, "store")
    store = store_contents(tmp_path / "app" / str(TASK) / "rocksdb" / "s")
    content = store.data
    assert store.offsets == {str(TP): 11}
    assert store.status == 1  # the crash left the store marked open
    assert b"ABORTED" not in content.values()
    assert content[b"a"] == b"committed" and b"c" not in content
    sm = reopen(tmp_path, "store")
    try:
        sm.initialize()  # no wipe needed
        assert sm.offsets()[TP] == 11
        sm.close()
    finally:
        sm.directory.close()
