"""Guarantees 5 and 6 of docs/architecture.md (KAFKA-7672): "already restored" survived a reassignment, so a task ran on missing state.

The story. Each Kafka 1.x/2.0 stream thread kept a set of changelog partitions
it had finished restoring and never cleared it. Task 1_1 once ran on thread A
and was restored there. It moved away, and after some rebalances came back to
A -- this time without a checkpoint (under exactly-once a task that moved
between threads of one instance often had none: the next thread read before
the previous one had finished writing). The right move was to wipe and restore
from the beginning; instead A found the partition in its stale set, believed it
restored, and went RUNNING on an empty store. Historic data was lost.

What must hold (DESIGN guarantees 5 and 6): nothing about restoration survives
a reassignment, a revoke or a wipe -- a task's offsets come from disk, read
under its lock, for every assignment afresh; with no checkpoint and local files
under exactly-once the state is wiped and fully restored, never assumed
complete; and a thread taking over a task cannot read its checkpoint before
the previous owner has finished writing it, because both happen under the lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from statestore import (
    IllegalStateError,
    LockError,
    OffsetCheckpoint,
    TaskCorruptedError,
    TaskId,
    TopicPartition,
)
from statestore.state.directory import StateDirectory
from statestore.state.policy import Policy
from statestore.state.state_manager import StateManager

TASK = TaskId(1, 1)
TP = TopicPartition("app-store1-changelog", 1)
EOS_CKPT = Policy.of("exactly_once_v2", "checkpoint")


@pytest.fixture
def sd(tmp_path: Path) -> Iterator[StateDirectory]:
    d = StateDirectory(tmp_path, "app")
    yield d
    d.close()


def assign(sd: StateDirectory, policy: Policy = EOS_CKPT) -> StateManager:
    sm = StateManager(sd, TASK, policy)
    sm.register("store1")
    return sm


def restore_and_run(sm: StateManager, upto: int) -> None:
    for off in range(upto + 1):
        sm.store("store1").put(b"k%d" % off, b"v")
    sm.complete_restoration({TP: upto})
    sm.store("store1").put(b"live", b"1")
    sm.commit({TP: upto + 1})


def test_restoration_does_not_survive_a_revoke_without_checkpoint(sd: StateDirectory) -> None:
    """A restores 1_1, loses it uncleanly (EOS -> wiped); when 1_1 comes back, nothing says 'restored'."""
    first = assign(sd)
    first.initialize()
    restore_and_run(first, 100)
    first.close(clean=False)  # revoked without a clean close: EOS wipes the task
    with pytest.raises(IllegalStateError):
        first.initialize()  # a closed assignment cannot be revived with its old knowledge
    again = assign(sd)
    again.initialize()
    assert again.offsets()[TP] is None  # restore from the beginning ...
    assert list(again.store("store1")) == []  # ... into an empty store
    again.close(clean=False)


def test_no_checkpoint_and_local_files_under_eos_is_wiped_not_assumed_complete(sd: StateDirectory) -> None:
    """Guarantee 6: the checkpoint is missing but files are there -> TaskCorrupted, then a full restore."""
    first = assign(sd)
    first.initialize()
    restore_and_run(first, 100)
    first.close()  # clean: checkpoint written ...
    OffsetCheckpoint(sd.checkpoint_path(TASK)).delete()  # ... and lost (e.g. never finished writing)
    again = assign(sd)
    with pytest.raises(TaskCorruptedError):
        again.initialize()
    again.wipe()
    again.initialize()
    assert again.offsets()[TP] is None and list(again.store("store1")) == []
    again.close(clean=False)


def test_wipe_forgets_offsets_within_one_assignment(sd: StateDirectory) -> None:
    sm = assign(sd, Policy.of("exactly_once_v2", "store"))
    sm.initialize()
    restore_and_run(sm, 10)
    assert sm.offsets()[TP] == 11
    sm.wipe()
    assert sm.offsets()[TP] is None
    sm.initialize()
    assert sm.offsets()[TP] is None
    sm.close()


def test_next_thread_cannot_read_before_the_previous_one_finished_writing(
    sd: StateDirectory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seed's second finding: thread B read the checkpoint while A was still writing it.

    Here A is paused in the middle of its clean close (inside the checkpoint
    write, lock held): B cannot initialize at all. Once A is done, B reads the
    complete checkpoint and needs no restoration from scratch.
    """
    a_sm = assign(sd)
    a_sm.initialize()
    restore_and_run(a_sm, 100)
    entered, proceed = threading.Event(), threading.Event()
    real_write = OffsetCheckpoint.write

    def slow_write(self: OffsetCheckpoint, offsets: dict[TopicPartition, int]) -> None:
        entered.set()
        proceed.wait()
        real_write(self, offsets)

    monkeypatch.setattr(OffsetCheckpoint, "write", slow_write)
    closer = threading.Thread(target=a_sm.close)
    # A's lock is owned by this (main) thread; hand it to the closing thread, as a stream thread would own it.
    sd.transfer_lock(TASK, closer)
    closer.start()
    entered.wait()
    b_sm = assign(sd)
    errors: list[BaseException] = []

    def b_init() -> None:
        try:
            b_sm.initialize()
        except BaseException as e:
            errors.append(e)

    tb = threading.Thread(target=b_init)
    tb.start()
    tb.join()
    assert len(errors) == 1 and isinstance(errors[0], LockError)
    proceed.set()
    closer.join()
    monkeypatch.undo()
    b_sm.initialize()
    assert b_sm.offsets()[TP] == 101
    assert b_sm.store("store1").get(b"live") == b"1"
    b_sm.close()
