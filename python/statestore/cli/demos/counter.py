"""The counting processor of ``statestore demo``, run as a child process the demo SIGKILLs.

``python -m statestore.cli.demos.counter <root> <records> <commit_every>``

Task ``0_0`` of application ``demo-counter`` counts words of a deterministic
input under exactly_once_v2 with offsets kept in the store: every update goes
to the changelog in a transaction and reaches RocksDB only when that
transaction commits. The input position ``__pos`` is a key of the same store,
so it commits atomically with the counts. Lines on stdout tell the parent what
happened: ``restored <start> <end> <records>`` after restoration,
``committed <position>`` after each commit, ``done <position>`` at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path

from statestore.changelog.segment_log import SegmentLog
from statestore.ids import TaskId, TopicPartition
from statestore.processing.task_manager import TaskManager
from statestore.restore.engine import RestoreListener

APP = "demo-counter"
STORE = "counts"
TASK = TaskId(0, 0)
POS_KEY = b"__pos"
WORDS = [w.encode() for w in "state store changelog offset commit restore standby task lock wipe".split()]


def word(i: int) -> bytes:
    """The ``i``-th input record: a word, deterministic so the result can be checked."""
    return WORDS[(i * 7 + i // 13) % len(WORDS)]


def expected_counts(records: int) -> dict[bytes, int]:
    """What the counts must be after processing the first ``records`` inputs exactly once."""
    counts: dict[bytes, int] = {}
    for i in range(records):
        counts[word(i)] = counts.get(word(i), 0) + 1
    return counts


class _Reporter(RestoreListener):
    """Prints what restoration did, for the parent to show."""

    def __init__(self) -> None:
        self.start = self.end = 0

    def on_restore_start(
        self, tp: TopicPartition, store_name: str, start_offset: int, end_offset: int
    ) -> None:
        self.start, self.end = start_offset, end_offset

    def on_batch_restored(
        self, tp: TopicPartition, store_name: str, batch_end_offset: int, num_restored: int
    ) -> None:
        pass

    def on_restore_end(self, tp: TopicPartition, store_name: str, total_restored: int) -> None:
        print(f"restored {self.start} {self.end} {total_restored}", flush=True)


def run(root: Path, records: int, commit_every: int) -> None:
    """Restore, then count until ``records`` inputs are processed, committing every ``commit_every``."""
    log = SegmentLog(root / "log", sync=False)
    tm = TaskManager(
        root / "state", log, [STORE], guarantee="exactly_once_v2", application_id=APP, listener=_Reporter()
    )
    tm.start()
    tm.assign([TASK], [])
    tm.restore()
    store = tm.active_task(TASK).store(STORE)
    pos = int(store.get(POS_KEY) or b"0")
    print(f"resumed {pos}", flush=True)
    while pos < records:
        key = word(pos)
        store.put(key, b"%d" % (int(store.get(key) or b"0") + 1))
        pos += 1
        store.put(POS_KEY, b"%d" % pos)
        if pos % commit_every == 0 or pos == records:
            tm.commit()
            print(f"committed {pos}", flush=True)
    tm.close()
    print(f"done {pos}", flush=True)


if __name__ == "__main__":
    run(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
