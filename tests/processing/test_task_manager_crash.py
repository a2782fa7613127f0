"""Exactly-once with offsets in the store: after a crash, recovery replays only the tail.

A child process writes and commits, then commits one more changelog
transaction and is SIGKILLed before its store applies it. On restart the
restore covers just those records -- at most the records written since the
store last recorded its offset, never the whole changelog -- and no wipe is
needed.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from statestore import SegmentLog, TaskId
from support import SUPPORT
from support.tasks import STORE, Events, changelog_tp, close_all, manager

CHILD = SUPPORT / "tail_child.py"
T = TaskId(0, 0)
TP = changelog_tp(T)


def test_exactly_once_store_recovery_replays_only_the_tail(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    records, tail = 400, 7
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(tmp_path), str(records), "50", str(tail)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert proc.stdout.split() == ["committed", str(records)]
    log = SegmentLog(tmp_path / "log")
    assert sum(1 for _ in log.read(TP)) == records + tail, "every record is committed in the changelog"

    events = Events()
    tm = manager(tmp_path, "exactly_once_v2", "store", listener=events, log=log)
    tm.start()
    tm.assign([T], [])
    assert tm.restore()
    start = next(c for c in events.calls if c[0] == "start")
    assert start[3] > records, "restoration resumes after the offset the store recorded"
    replayed = events.total_restored()
    assert replayed <= tail, (
        f"replayed {replayed} records, more than the {tail} written since the last store commit"
    )
    assert replayed == tail
    data = dict(tm.active_task(T).store(STORE))
    assert all(data[b"t%d" % i] == b"tail" for i in range(tail))
    assert data[b"k%d" % ((records - 1) % 37)] == b"%d" % (records - 1)
    close_all(tm)
