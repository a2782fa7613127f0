"""Crash-test child and the changelog model it is checked against.

Run as a script, this is the child: it opens task 0_0 of application ``app``
under a state directory, restores its store ``s`` from a model changelog, then
processes transactions until it is SIGKILLed -- by the parent at a
random moment, or by itself at a random step (``--kill-at``), which hits the
narrow windows (between the changelog commit and the store commit) precisely.

The model changelog is a text file, one record per line, appended with one
``write`` per line (a SIGKILL cannot tear it)::

    R <offset> <txn> <key> <value>     a record; value = str(offset)
    C <offset> <txn>                   commit marker of transaction txn (exactly-once only)

The child prints ``running`` when its task turns RUNNING and ``leaving`` before
it suspends or closes, so the parent knows the phase a kill interrupted.

Under exactly-once a transaction's records are read_committed-visible only if
its commit marker exists; a transaction without one was aborted by the crash.
Under at-least-once every record is visible once written. Markers occupy an
offset, as in Kafka.
"""

from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

from support.killer import Killer

TOPIC_PARTITION = ("app-s-changelog", 0)


@dataclass
class Changelog:
    """A parsed model changelog."""

    records: list[tuple[int, int, bytes, bytes]] = field(default_factory=list)  # offset, txn, key, value
    committed_txns: set[int] = field(default_factory=set)
    end: int = 0  # next offset to write

    @classmethod
    def read(cls, path: Path) -> Changelog:
        """Parse ``path``; a missing file is an empty changelog, a torn last line is ignored."""
        log = cls()
        try:
            text = path.read_text()
        except FileNotFoundError:
            return log
        for line in text.split("\n")[:-1]:
            parts = line.split(" ")
            if parts[0] == "R":
                off, txn = int(parts[1]), int(parts[2])
                log.records.append((off, txn, parts[3].encode(), parts[4].encode()))
            else:
                off, txn = int(parts[1]), int(parts[2])
                log.committed_txns.add(txn)
            log.end = off + 1
        return log

    def visible(self, eos: bool) -> list[tuple[int, bytes, bytes]]:
        """Records a read_committed reader sees: ``(offset, key, value)``."""
        return [(o, k, v) for o, t, k, v in self.records if not eos or t in self.committed_txns]

    def state_at(self, offset: int | None, eos: bool) -> dict[bytes, bytes]:
        """The store content after applying every visible record up to ``offset`` (None: nothing)."""
        if offset is None:
            return {}
        return {k: v for o, k, v in self.visible(eos) if o <= offset}


def check_invariants(
    store: dict[bytes, bytes], claimed: int | None, log: Changelog, *, eos: bool, exact: bool
) -> None:
    """Assert guarantee 1 on what a crash left on disk.

    * the claimed offset never claims data the store lacks: every key of the
      changelog state at ``claimed`` is in the store at that version or later;
    * every value in the store comes from a visible changelog record -- under
      exactly-once, never from an aborted or uncommitted transaction;
    * ``exact``: the store is exactly the changelog state at ``claimed``.
    """
    visible = {o: k for o, k, _ in log.visible(eos)}
    if claimed is not None:
        assert claimed < log.end, f"offset {claimed} claims beyond the changelog end {log.end}"
    expected = log.state_at(claimed, eos)
    for key, value in expected.items():
        assert key in store, f"offset {claimed} claims key {key!r}@{value!r} but the store lacks it"
        assert int(store[key]) >= int(value), (
            f"store has {key!r}@{store[key]!r}, offset {claimed} claims @{value!r}"
        )
    for key, value in store.items():
        off = int(value)
        assert visible.get(off) == key, (
            f"store holds {key!r}@{off}, which is not a {'committed ' if eos else ''}changelog record"
        )
    if exact:
        assert store == expected, f"store differs from the changelog state at offset {claimed}"


# -- the child ---------------------------------------------------------------------------


def child_main(argv: list[str]) -> None:
    """``helpers_crash.py <root> <guarantee> <offsets-mode> <seed> <kill-at>``."""
    from statestore import TaskCorruptedError, TaskId, TopicPartition
    from statestore.state.directory import StateDirectory
    from statestore.state.policy import Policy
    from statestore.state.state_manager import StateManager

    root, guarantee, mode, seed, kill_at = argv[0], argv[1], argv[2], int(argv[3]), int(argv[4])
    rng = random.Random(seed)
    killer = Killer(kill_at)
    eos = guarantee == "exactly_once_v2"
    tp = TopicPartition(*TOPIC_PARTITION)
    changelog_path = Path(root) / "changelog.txt"
    sd = StateDirectory(root, "app")
    policy = Policy.of(guarantee, mode, checkpoint_delta=rng.choice([0, 3, 20]))
    fd = os.open(changelog_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def open_task() -> StateManager:
        sm = StateManager(sd, TaskId(0, 0), policy)
        sm.register("s")
        try:
            sm.initialize()
        except TaskCorruptedError:
            print("corrupted", flush=True)
            sm.wipe()
            sm.initialize()
        killer.point()
        # restore the committed tail after the recorded offset
        start = sm.offsets()[tp]
        store = sm.store("s")
        last = None
        for i, (off, key, value) in enumerate(Changelog.read(changelog_path).visible(eos)):
            if start is not None and off <= start:
                continue
            store.put(key, value)
            last = off
            if i % 7 == 6:
                sm.restoration_progress({tp: off})
                killer.point()
        sm.complete_restoration({tp: last} if last is not None else None)
        print("running", flush=True)
        killer.point()
        return sm

    sm = open_task()
    next_offset = Changelog.read(changelog_path).end
    for _ in range(400):
        txn = next_offset
        last = next_offset
        for _ in range(rng.randint(1, 4)):
            key = f"k{rng.randint(0, 9)}"
            sm.store("s").put(key.encode(), str(next_offset).encode())
            os.write(fd, f"R {next_offset} {txn} {key} {next_offset}\n".encode())
            last = next_offset
            next_offset += 1
        killer.point()
        if eos:  # the transaction commits in the changelog; only then may the store see it
            os.write(fd, f"C {next_offset} {txn}\n".encode())
            next_offset += 1
            killer.point()
        sm.commit({tp: last})
        killer.point()
        roll = rng.random()
        if roll < 0.04:
            print("leaving", flush=True)
            sm.suspend()
            killer.point()
            sm.resume()
            print("running", flush=True)
        elif roll < 0.08:
            print("leaving", flush=True)
            sm.close()
            killer.point()
            sm = open_task()
    sm.close()
    sd.close()


if __name__ == "__main__":
    child_main(sys.argv[1:])
