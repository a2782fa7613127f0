"""Race child: threads of this process fight over the task locks of one shared state directory.

``race_locks.py <root> <audit file> <seconds> <seed> <threads> <tasks>``

The state directory is opened ``shared=True`` (as PySpark workers do), so
several of these processes use it at once, coordinated by task locks alone.
``threads`` worker threads lock random tasks and, while holding a lock, write
an owner file and read it back (nobody else may change it), write a
checkpoint, or wipe the task; some release the lock and then try to write
with the old token, as a stale writer would (it must be refused). A cleaner
thread deletes unlocked directories with a zero cleanup delay, and a monitor
thread logs every task directory it sees holding files, so the parent can
tell whether files appeared in a directory nobody had locked.

Every lock event goes to the shared audit log (see ``race_audit.py``). At the
end the child prints one JSON line: operation counts, the inodes seen and the
violations it saw itself.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from statestore import LockError, OffsetCheckpoint, TaskId, TopicPartition
from statestore.state.directory import LOCK_FILE_NAME, StateDirectory
from support.race_audit import AuditLog, watch_directories

OWNER_FILE = "owner"


def main() -> None:
    root, audit_path = Path(sys.argv[1]), Path(sys.argv[2])
    seconds, seed, n_threads, n_tasks = (
        float(sys.argv[3]),
        int(sys.argv[4]),
        int(sys.argv[5]),
        int(sys.argv[6]),
    )
    audit = AuditLog(audit_path)
    sd = StateDirectory(root, "app", shared=True, cleanup_delay_ms=0, audit=audit)
    deadline = time.monotonic() + seconds
    stats: Counter[str] = Counter()
    violations: list[str] = []
    guard = threading.Lock()

    def violation(msg: str) -> None:
        with guard:
            violations.append(f"pid {os.getpid()}: {msg}")

    def count(what: str) -> None:
        with guard:
            stats[what] += 1

    def worker(idx: int) -> None:
        rng = random.Random(f"{seed}-{os.getpid()}-{idx}")
        me = f"{os.getpid()}-{idx}"
        while time.monotonic() < deadline:
            task = TaskId(0, rng.randrange(n_tasks))
            try:
                token = sd.acquire(task)
            except LockError:
                count("acquire_gave_up")
                continue
            if token is None:
                count("busy")
                time.sleep(rng.random() / 1000)
                continue
            count("acquired")
            task_dir = sd.task_dir(task)
            op = rng.random()
            released = False
            try:
                if op < 0.45:
                    sd.ensure_held(token, what="write the owner file")
                    stamp = f"{me}-{token.generation}"
                    (task_dir / OWNER_FILE).write_text(stamp)
                    time.sleep(rng.random() / 500)
                    try:
                        got = (task_dir / OWNER_FILE).read_text()
                    except FileNotFoundError:
                        violation(f"task {task}: owner file deleted while {me} held the lock")
                    else:
                        if got != stamp:
                            violation(f"task {task}: owner file says {got!r} while {stamp} holds the lock")
                    count("owner_writes")
                elif op < 0.65:
                    sd.ensure_held(token, what="write the checkpoint")
                    tp = TopicPartition("app-s-changelog", task.partition)
                    OffsetCheckpoint(sd.checkpoint_path(task)).write({tp: rng.randrange(1000)})
                    count("checkpoint_writes")
                elif op < 0.8:
                    sd.wipe(task, token)
                    left = sorted(os.listdir(task_dir))
                    if left != [LOCK_FILE_NAME]:
                        violation(f"task {task}: after a wipe under the lock the directory holds {left}")
                    count("wipes")
                else:
                    # A stale writer: the lock is gone (released, maybe taken by another owner,
                    # maybe the directory cleaned); writing with the old token must be refused.
                    sd.release(token)
                    released = True
                    time.sleep(rng.random() / 500)
                    try:
                        sd.ensure_held(token, what="write a stale checkpoint")
                    except LockError:
                        count("stale_writes_refused")
                    else:
                        violation(
                            f"task {task}: a released token of generation {token.generation} still validates"
                        )
            except LockError as e:
                violation(f"task {task}: lock lost while held by {me}: {e}")
            finally:
                if not released:
                    sd.release(token)

    def cleaner() -> None:
        rng = random.Random(f"{seed}-{os.getpid()}-cleaner")
        while time.monotonic() < deadline:
            removed = len(sd.clean_removed_tasks())
            with guard:
                stats["cleaned"] += removed
                stats["cleaner_runs"] += 1
            time.sleep(rng.random() / 1000)

    def monitor() -> None:
        stats["monitor_scans"] = watch_directories(sd.app_dir, audit, deadline)

    threads = [threading.Thread(target=worker, args=(i,), name=f"worker-{i}") for i in range(n_threads)]
    threads += [
        threading.Thread(target=cleaner, name="cleaner"),
        threading.Thread(target=monitor, name="monitor"),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sd.close()
    audit.close()
    print(json.dumps({"stats": dict(stats), "violations": violations}), flush=True)


if __name__ == "__main__":
    main()
