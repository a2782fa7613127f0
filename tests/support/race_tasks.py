"""Race child: one application instance whose stream threads fight over tasks under random rebalances.

``race_tasks.py <root> <index> <processes> <seconds> <seed> <threads> <partitions> <guarantee> <offsets> <layout>``

With layout ``own`` the instance has its own state directory
``<root>/state-<index>``; with ``shared`` all instances use
``<root>/state-shared``, opened ``shared=True``, so stream threads of
different processes contend for the same task directories. Either way the
instance opens one :class:`StateDirectory` (a zero cleanup delay) and runs
``threads`` stream threads, each a :class:`TaskManager` over it; all instances
share the changelog ``<root>/log``. Partition ``p`` is written only by the instance
``p % processes`` (one process writes a changelog partition at a time);
every instance keeps standbys of any partition, reading while others write.

A rebalancer thread publishes a new random assignment every few
milliseconds: each of this instance's partitions goes active to one thread,
and any partition may go standby to another. Threads pick it up at their own
pace, with no barrier -- exactly the seed-001 setting: a thread assigned a
task another thread still holds fails to lock it and retries on its next
poll. Active tasks process by incrementing keyed counters (read, add one,
write), commit at random, and now and then a thread crashes (its task
manager is closed dirty) and starts a new one. A cleaner thread deletes
unlocked task directories continuously; a monitor logs every task directory
it sees holding files (see ``race_audit.py``).

Lock events go to ``<root>/audit-<index>.log`` (``audit-shared.log`` when shared). At the end every thread
closes cleanly and the child prints one JSON line of counts and of the
unexpected errors it met (each one a violation).
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
import traceback
from collections import Counter
from pathlib import Path

from statestore import SegmentLog, TaskId
from statestore.processing.task import ActiveTask, TaskState
from statestore.processing.task_manager import TaskManager
from statestore.state.directory import StateDirectory
from support.race_audit import AuditLog, watch_directories

STORE = "s"
KEYS = [b"k%02d" % i for i in range(12)]


class Rebalancer:
    """Publishes random assignments: ``generation, {thread: (active, standby)}``."""

    def __init__(self, rng: random.Random, index: int, processes: int, threads: int, partitions: int) -> None:
        self.rng = rng
        self.own = [p for p in range(partitions) if p % processes == index]
        self.partitions = partitions
        self.threads = threads
        self.lock = threading.Lock()
        self.generation = 0
        self.assignment: dict[int, tuple[set[TaskId], set[TaskId]]] = self._draw()

    def _draw(self) -> dict[int, tuple[set[TaskId], set[TaskId]]]:
        out: dict[int, tuple[set[TaskId], set[TaskId]]] = {t: (set(), set()) for t in range(self.threads)}
        active_of: dict[int, int] = {}
        for p in self.own:
            t = self.rng.randrange(self.threads)
            active_of[p] = t
            out[t][0].add(TaskId(0, p))
        for p in range(self.partitions):
            if self.rng.random() < 0.6:
                choices = [t for t in range(self.threads) if active_of.get(p) != t]
                out[self.rng.choice(choices)][1].add(TaskId(0, p))
        return out

    def step(self) -> None:
        with self.lock:
            self.assignment = self._draw()
            self.generation += 1

    def current(self, thread: int) -> tuple[int, set[TaskId], set[TaskId]]:
        with self.lock:
            active, standby = self.assignment[thread]
            return self.generation, set(active), set(standby)


def main() -> None:
    root, index, processes = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    seconds, seed, n_threads, partitions = (
        float(sys.argv[4]),
        int(sys.argv[5]),
        int(sys.argv[6]),
        int(sys.argv[7]),
    )
    guarantee, offsets, shared = sys.argv[8], sys.argv[9], sys.argv[10] == "shared"
    name = "shared" if shared else str(index)
    audit = AuditLog(root / f"audit-{name}.log")
    sd = StateDirectory(root / f"state-{name}", "app", cleanup_delay_ms=0, audit=audit, shared=shared)
    changelog = SegmentLog(root / "log", sync=False)
    deadline = time.monotonic() + seconds
    stats: Counter[str] = Counter()
    errors: list[str] = []
    guard = threading.Lock()
    rebalancer = Rebalancer(
        random.Random(f"{seed}-{index}-rebalance"), index, processes, n_threads, partitions
    )

    def count(what: str, n: int = 1) -> None:
        with guard:
            stats[what] += n

    def error(where: str) -> None:
        with guard:
            errors.append(f"pid {os.getpid()} {where}: {traceback.format_exc()}")

    def new_manager(thread: int) -> TaskManager:
        return TaskManager(
            sd,
            changelog,
            [STORE],
            guarantee=guarantee,
            offsets=offsets,
            commit_interval_ms=50,
            time_slice_ms=20,
            chunk_offsets=500,
            transaction_timeout_ms=2_000,
            client_id=f"p{index}t{thread}",
        )

    def stream_thread(thread: int) -> None:
        rng = random.Random(f"{seed}-{index}-{thread}")
        tm = new_manager(thread)
        seen_generation = -1
        try:
            while time.monotonic() < deadline:
                try:
                    generation, active, standby = rebalancer.current(thread)
                    if generation != seen_generation:
                        tm.assign(active, standby)
                        seen_generation = generation
                        count("assignments")
                    tm.poll(0)
                    for task in tm.active_tasks().values():
                        if task.state is not TaskState.RUNNING:
                            continue
                        process(task, rng)
                    r = rng.random()
                    if r < 0.2:
                        tm.commit()
                        count("commits")
                    elif r < 0.21:
                        tm.close(clean=False)  # a crash of this stream thread
                        count("crashes")
                        tm = new_manager(thread)
                        seen_generation = -1
                except Exception:
                    error(f"thread {thread}")
                    count("errors")
                    try:
                        tm.close(clean=False)
                    except Exception:
                        error(f"thread {thread} closing after an error")
                    tm = new_manager(thread)
                    seen_generation = -1
        finally:
            try:
                tm.close(clean=True)
            except Exception:
                error(f"thread {thread} final close")

    def process(task: ActiveTask, rng: random.Random) -> None:
        store = task.store(STORE)
        for _ in range(rng.randrange(1, 20)):
            key = rng.choice(KEYS)
            raw = store.get(key)
            store.put(key, b"%d" % (int(raw) + 1 if raw is not None else 1))
        count("increments")

    def rebalance() -> None:
        rng = random.Random(f"{seed}-{index}-pace")
        while time.monotonic() < deadline:
            time.sleep(rng.choice((0.002, 0.02, 0.1, 0.3)) * rng.random())
            rebalancer.step()
            count("rebalances")

    def cleaner() -> None:
        rng = random.Random(f"{seed}-{index}-cleaner")
        while time.monotonic() < deadline:
            try:
                count("cleaned", len(sd.clean_removed_tasks()))
            except Exception:
                error("cleaner")
            time.sleep(rng.uniform(0, 0.003))

    def monitor() -> None:
        count("monitor_scans", watch_directories(sd.app_dir, audit, deadline))

    threads = [
        threading.Thread(target=stream_thread, args=(i,), name=f"stream-{i}") for i in range(n_threads)
    ]
    threads += [threading.Thread(target=f, name=f.__name__) for f in (rebalance, cleaner, monitor)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    changelog.close()
    sd.close()
    audit.close()
    print(json.dumps({"stats": dict(stats), "violations": errors}), flush=True)


if __name__ == "__main__":
    main()
