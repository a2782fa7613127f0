"""Child for the KAFKA-20685 scenario: ``aborted_writes_child.py <root> <variant> crash|recover``.

``crash``: under exactly-once with ``offsets="checkpoint"``, restore task 0_0,
go RUNNING, write records in a transaction that never commits, let a
"background flush" persist them to RocksDB (what Kafka's stores do with the
WAL off and no flush on commit: the memtable is flushed whenever it fills),
then SIGKILL itself.

``recover``: start again, restore, print the store as JSON
(``{"start": <first restore offset>, "store": {key: value}}``) and exit.

Variants:

* ``fixed`` -- statestore as it is;
* ``policy_only`` -- the status-marker check is off, so only the policy's
  fix (delete the checkpoint when restoration completes) protects the store;
* ``pre_fix`` -- Kafka 4.2 before the fix: the checkpoint written at
  restoration end is kept while RUNNING, and there is no status marker check.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

STORE = "s"


def apply_variant(variant: str) -> None:
    import statestore.processing.task
    from statestore.state import policy

    if variant in ("policy_only", "pre_fix"):
        statestore.processing.task.unclean_status_is_corruption = lambda _policy: False  # type: ignore[assignment]
    if variant == "pre_fix":
        key = (policy.Event.RESTORE_COMPLETE, policy.Guarantee.EXACTLY_ONCE_V2, policy.OffsetsMode.CHECKPOINT)
        table: Any = policy.POLICY_TABLE
        table[key] = policy.Decision(policy.OffsetAction.WRITE, True, False, "resume", why="pre-fix: kept")


def main(argv: list[str]) -> None:
    root, variant, phase = Path(argv[0]), argv[1], argv[2]
    apply_variant(variant)

    from statestore import SegmentLog, TaskId
    from statestore.processing.task_manager import TaskManager
    from statestore.processing.updater import StateRestoreListener
    from statestore.state.directory import StateDirectory

    starts: list[int] = []

    class Starts(StateRestoreListener):
        def on_restore_start(self, tp: Any, store_name: str, start_offset: int, end_offset: int) -> None:
            starts.append(start_offset)

    task = TaskId(0, 0)
    tm = TaskManager(
        StateDirectory(root / "state", "app"),
        SegmentLog(root / "log", sync=False),
        [STORE],
        guarantee="exactly_once_v2",
        offsets="checkpoint",
        listener=Starts(),
    )
    tm.start()
    tm.assign([task], [])
    assert tm.restore()
    view = tm.active_task(task).store(STORE)
    if phase == "recover":
        print(
            json.dumps({"start": starts[0], "store": {k.decode(): v.decode() for k, v in view}}), flush=True
        )
        tm.close()
        tm.directory.close()
        return
    checkpoint = tm.directory.checkpoint_path(task)
    print(json.dumps({"running": True, "checkpoint": checkpoint.exists()}), flush=True)
    for i in range(5):
        view.put(b"k%d" % i, b"ABORTED")
    tm.collector.producer.flush()  # in the changelog, inside a transaction that will never commit
    view.store.commit(None)  # the background flush: uncommitted writes reach RocksDB ...
    view.store.flush()  # ... and its files
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1:])
