"""I/O-fault child: the counting processor of ``counting_child.py`` with EIO/ENOSPC injected into its system calls.

``iofault_child.py <root> <guarantee> <offsets> <phase> <seed> <records> <commit_every>``

Runs under ``tests/faults/iofault.c`` (LD_PRELOAD), which fails calls on files
under ``<root>`` once armed. ``phase`` says when the faults are armed:

* ``restore`` -- from ``start()`` until every task is RUNNING (the restoring child);
* ``process`` -- after restoration, while ``records`` input records are
  processed and committed every ``commit_every`` records (the processing child).

Outside the armed phase the child checks its store against the committed
changelog as ``counting_child`` does (exit status 3 on a mismatch). Corruption
raised while processing (``TaskCorruptedError``) is handled as Kafka's stream
thread does: ``handle_corruption`` wipes the task and it is restored.

The last line of stdout is a JSON report: ``outcome`` is ``completed`` (the
phase ran to its end), ``error`` (a ``statestore.errors`` exception stopped it;
``error`` holds its class, message and ``path``) or ``foreign`` (any other
exception: a bug), plus ``faults`` (injected) and ``wipes``.
"""

from __future__ import annotations

import ctypes
import json
import random
import sys
import traceback
from pathlib import Path
from typing import Any

from support.counting_child import POS_KEY, STORE, TASK_PARTITION, check, count_one, model_from_log


def main(argv: list[str]) -> None:
    root = Path(argv[0])
    guarantee, offsets, phase = argv[1], argv[2], argv[3]
    seed, records, commit_every = int(argv[4]), int(argv[5]), int(argv[6])
    rng = random.Random(seed)
    eos = guarantee == "exactly_once_v2"

    from statestore import SegmentLog, StateStoreError, TaskCorruptedError, TaskId
    from statestore.processing.task import Task
    from statestore.processing.task_manager import TaskManager
    from statestore.state.directory import StateDirectory

    lib = ctypes.CDLL(None)
    arm = lib.statestore_fault_arm
    arm.restype = ctypes.c_long
    finish = lib.statestore_fault_finish
    finish.restype = ctypes.c_long

    wipes = 0
    original = Task.close_dirty_and_revive

    def counting_revive(self: Any, *, wipe: bool) -> None:
        nonlocal wipes
        if wipe:
            wipes += 1
        original(self, wipe=wipe)

    Task.close_dirty_and_revive = counting_revive  # type: ignore[method-assign]

    task = TaskId(0, TASK_PARTITION)
    report: dict[str, Any] = {"outcome": "completed", "phase": phase}
    tm: TaskManager | None = None

    def verify(tm: TaskManager) -> None:
        store = dict(tm.active_task(task).store(STORE))
        problem = check(store, model_from_log(root / "log"), eos=eos)
        if problem is not None:
            arm(0)
            sys.stderr.write(f"after restore under {guarantee}/{offsets}: {problem}\n")
            sys.exit(3)

    try:
        tm = TaskManager(
            StateDirectory(root / "state", "app"),
            SegmentLog(root / "log", sync=True),
            [STORE],
            guarantee=guarantee,
            offsets=offsets,
            chunk_offsets=rng.choice([256, 4096, 50_000]),
            checkpoint_delta=rng.choice([0, 5, 50]),
            transaction_timeout_ms=0,
        )
        if phase == "restore":
            arm(1)
        tm.start()
        tm.assign([task], [])
        if not tm.restore(timeout=30):
            raise AssertionError("restore did not finish in 30 s")
        arm(0)
        verify(tm)
        if phase == "process":
            arm(1)
            view = tm.active_task(task).store(STORE)
            pos = int(view.get(POS_KEY) or b"0")
            done = since_commit = 0
            while done < records:
                try:
                    pos = count_one(view, pos)
                    done += 1
                    since_commit += 1
                    if since_commit >= commit_every:
                        since_commit = 0
                        tm.commit()
                except TaskCorruptedError as e:
                    if not e.task_ids:
                        raise
                    tm.handle_corruption(e.task_ids)
                    if not tm.restore(timeout=30):
                        raise AssertionError("restore after a wipe did not finish in 30 s") from e
                    since_commit = 0
                    view = tm.active_task(task).store(STORE)
                    pos = int(view.get(POS_KEY) or b"0")
            tm.commit()
            arm(0)
            verify(tm)
        tm.close()
    except StateStoreError as e:
        report["outcome"] = "error"
        report["error"] = {"class": type(e).__name__, "message": str(e), "path": e.path}
    except Exception as e:  # anything outside the hierarchy is a bug the parent reports
        report["outcome"] = "foreign"
        report["error"] = {"class": type(e).__name__, "message": str(e), "trace": traceback.format_exc()}
    report["faults"] = finish()
    if report["outcome"] != "completed" and tm is not None:
        try:
            tm.close(clean=False)
        except StateStoreError as e:
            report["close"] = str(e)
    report["wipes"] = wipes
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
