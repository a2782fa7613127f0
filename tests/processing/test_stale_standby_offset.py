"""Guarantee 4 of docs/architecture.md (KAFKA-8187): a standby that never got its lock wrote back a stale offset.

The story. Two stream threads of one process, A and B. A has standby task 1_0
with all its data. A rebalance moves the standby to B. B creates the task --
and Kafka 2.0 read the task's checkpoint *at construction, before locking* --
then fails to lock the directory because A still holds it, and goes RUNNING
without retrying. A closes its standby and unlocks. Ten minutes later the
cleaner finds 1_0 unlocked and old, and deletes it. At the next rebalance B
closes its never-initialized standby and writes back the offset it read long
ago: the write *re-creates the task directory* with a `.checkpoint` and no
data. Whoever gets 1_0 next trusts that checkpoint and skips everything before
it: the store silently lacks all that history.

What must hold (DESIGN guarantee 4): offsets are read only after the lock is
taken, written only while this very lock acquisition is still held, and a
directory the cleaner deleted is never re-created by a stale writer. The same
sequence is run against a deliberately naive state manager (Kafka 2.0's order
of operations) to show that this test does catch the bug.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

import pytest

from statestore import LockError, OffsetCheckpoint, TaskId, TopicPartition
from statestore.state.directory import StateDirectory
from statestore.state.policy import Policy
from statestore.state.state_manager import StateManager

TASK = TaskId(1, 0)
TP = TopicPartition("app-s-changelog", 0)
POLICY = Policy.of("at_least_once", "checkpoint", checkpoint_delta=0)
R = TypeVar("R")


class Thread:
    """A named stream thread: every call runs on the same OS thread, as task locks are per thread."""

    def __init__(self, name: str) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def run(self, fn: Callable[[], R]) -> R:
        return self.pool.submit(fn).result()

    def stop(self) -> None:
        self.pool.shutdown()


class StandbyManager(Protocol):
    def initialize(self) -> None: ...
    def close(self) -> None: ...


class RealStandby:
    """Our StateManager for the standby (checkpoint mode, as in Kafka 2.0)."""

    def __init__(self, sd: StateDirectory) -> None:
        self.sm = StateManager(sd, TASK, POLICY, standby=True)
        self.sm.register("s")

    def initialize(self) -> None:
        self.sm.initialize()

    def close(self) -> None:
        self.sm.close()


class NaiveStandby:
    """Kafka 2.0's order: read the checkpoint at construction, write it back at close, lock unchecked."""

    def __init__(self, sd: StateDirectory) -> None:
        self.sd = sd
        self.ckpt = OffsetCheckpoint(sd.checkpoint_path(TASK))
        self.offsets = self.ckpt.read()  # before the lock!

    def initialize(self) -> None:
        if not self.sd.lock(TASK):
            raise LockError(f"task {TASK} is locked")

    def close(self) -> None:
        self.ckpt.path.parent.mkdir(parents=True, exist_ok=True)  # directoryForTask() creates it
        self.ckpt.write(self.offsets)
        self.sd.unlock(TASK)


@dataclass
class Outcome:
    b_failed_to_lock: bool
    dir_recreated: bool
    next_offset: int | None
    next_store_empty: bool


@pytest.fixture
def threads() -> Iterator[tuple[Thread, Thread, Thread]]:
    a, b, cleaner = Thread("A"), Thread("B"), Thread("cleaner")
    yield a, b, cleaner
    for t in (a, b, cleaner):
        t.stop()


def run_scenario(
    tmp_path: Path, threads: tuple[Thread, Thread, Thread], make_b: Callable[[StateDirectory], StandbyManager]
) -> Outcome:
    a, b, cleaner = threads
    sd = StateDirectory(tmp_path, "app", cleanup_delay_ms=600_000)
    try:
        # A owns standby 1_0 with data up to offset 100, checkpointed.
        a_sm = StateManager(sd, TASK, POLICY, standby=True)
        a_sm.register("s")
        a.run(a_sm.initialize)

        def a_applies() -> None:
            for off in range(101):
                a_sm.store("s").put(b"k%03d" % off, b"v")
            a_sm.commit({TP: 100})

        a.run(a_applies)
        assert OffsetCheckpoint(sd.checkpoint_path(TASK)).read() == {TP: 100}

        # Rebalance: B gets the standby and cannot lock it (A still has it) -- and does not retry.
        b_sm = b.run(lambda: make_b(sd))
        try:
            b.run(b_sm.initialize)
            b_failed = False
        except LockError:
            b_failed = True
        # A closes its old standby.
        a.run(a_sm.close)
        # 10 to 20 minutes later the cleaner deletes the unlocked directory.
        far = 10**15
        assert cleaner.run(lambda: sd.clean_removed_tasks(now_ms=far)) == [TASK]
        assert not sd.task_dir(TASK).exists()
        # The next rebalance: B closes the standby it never initialized.
        try:
            b.run(b_sm.close)
        except LockError:
            pass
        recreated = sd.task_dir(TASK).exists()
        # Whoever gets 1_0 next opens it as an active task.
        nxt = StateManager(sd, TASK, Policy.of("at_least_once", "checkpoint"))
        nxt.register("s")
        b.run(nxt.initialize)
        offset = nxt.offsets()[TP]
        empty = nxt.store("s").approximate_num_entries() == 0
        b.run(lambda: nxt.close(clean=False))
        return Outcome(b_failed, recreated, offset, empty)
    finally:
        sd.close()


def test_stale_standby_never_recreates_the_directory_or_its_offset(
    tmp_path: Path, threads: tuple[Thread, Thread, Thread]
) -> None:
    outcome = run_scenario(tmp_path, threads, RealStandby)
    assert outcome.b_failed_to_lock
    assert not outcome.dir_recreated, "a stale writer re-created a directory the cleaner deleted"
    assert outcome.next_offset is None, "the next owner must restore from the beginning"
    assert outcome.next_store_empty


def test_the_naive_order_loses_data_in_this_sequence(
    tmp_path: Path, threads: tuple[Thread, Thread, Thread]
) -> None:
    """The same sequence with Kafka 2.0's order: the check above would fail (it catches the bug)."""
    outcome = run_scenario(tmp_path, threads, NaiveStandby)
    assert outcome.b_failed_to_lock
    assert outcome.dir_recreated
    assert outcome.next_offset == 100 and outcome.next_store_empty  # offset claims data the store lacks


def test_holder_whose_lock_was_released_cannot_write_its_old_offset(
    tmp_path: Path, threads: tuple[Thread, Thread, Thread]
) -> None:
    """Variant: B *did* lock and read offset 100, then its lock was released behind its back
    (revocation); the cleaner deleted the directory; B's late clean close must fail, not re-create it."""
    b, _, cleaner = threads
    with StateDirectory(tmp_path, "app") as sd:
        sm = StateManager(sd, TASK, POLICY, standby=True)
        sm.register("s")
        b.run(sm.initialize)

        def apply() -> None:
            sm.store("s").put(b"k", b"v")
            sm.commit({TP: 100})

        b.run(apply)
        assert sm.lock_token is not None
        sd.release(sm.lock_token)  # released behind the state manager's back
        assert cleaner.run(lambda: sd.clean_removed_tasks(now_ms=10**15)) == [TASK]
        with pytest.raises(LockError, match=str(TASK)):
            b.run(sm.close)
        assert not sd.task_dir(TASK).exists()
