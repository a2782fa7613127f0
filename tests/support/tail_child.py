"""Child for the tail-only recovery test: ``tail_child.py <root> <records> <commit_every> <tail>``.

Under exactly-once with offsets in the store: restore task 0_0, write
``records`` records committing every ``commit_every``, then write ``tail``
more, commit the changelog transaction and SIGKILL itself before the store
applies them -- the widest window a crash can leave between changelog and
store. Prints ``committed <n>`` (records whose store commit completed).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    root, records, commit_every, tail = Path(argv[0]), int(argv[1]), int(argv[2]), int(argv[3])

    from statestore import SegmentLog, TaskId
    from statestore.processing.task_manager import TaskManager
    from statestore.state.directory import StateDirectory

    task = TaskId(0, 0)
    tm = TaskManager(
        StateDirectory(root / "state", "app"),
        SegmentLog(root / "log", sync=False),
        ["s"],
        guarantee="exactly_once_v2",
        offsets="store",
    )
    tm.start()
    tm.assign([task], [])
    assert tm.restore()
    view = tm.active_task(task).store("s")
    for i in range(records):
        view.put(b"k%d" % (i % 37), b"%d" % i)
        if (i + 1) % commit_every == 0:
            tm.commit()
    tm.commit()
    print(f"committed {records}", flush=True)
    for i in range(tail):
        view.put(b"t%d" % i, b"tail")
    tm.collector.commit()  # the changelog transaction commits ...
    os.kill(os.getpid(), signal.SIGKILL)  # ... and the process dies before the store applies it


if __name__ == "__main__":
    main(sys.argv[1:])
