"""Crash-test child: a counting processor on a TaskManager, SIGKILLed at random points.

``counting_child.py <root> <guarantee> <offsets> <seed> <kill_at> <commit_every>``

Task 0_0 has one store ``counts``. The input is endless and deterministic:
record ``i`` has key :func:`input_key`. Processing record ``i`` increments
``counts[key]`` and sets ``__pos`` to ``i + 1`` -- both through the task's
store, so both go to the changelog and, under exactly-once, commit together.
A commit runs every ``commit_every`` records; now and then the task is
recycled to a standby and back, or the whole manager is closed and reopened.

On start, after restoration, the child checks its store against a model
built independently from the committed changelog (read with the Python log
reader, not the restore engine) and prints ``verified <n>``:

* exactly-once: the store equals the model exactly, and every count equals the
  number of occurrences of its key among the first ``__pos`` input records;
* at-least-once: every key of the model is in the store with the model's value.

A failed check exits with status 3 and says why on stderr.

``kill_at`` > 0 makes the child SIGKILL itself at that step: steps are
counted at restore batches, inside commits (before and after the changelog
commit, the store write, flushes, checkpoint writes), while processing and
around closes, so the narrow windows are hit precisely. The parent also
kills at random moments.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.killer import Killer
from support.model import last_values

TASK_PARTITION = 0
STORE = "counts"
POS_KEY = b"__pos"


def input_key(i: int) -> bytes:
    """The key of input record ``i``."""
    return b"k%d" % ((i * 2654435761) % 1009 % 13)


def start_with_kill_points(tm: Any, task: Any, killer: Any) -> Any:
    """Start ``tm``, assign it ``task`` as active and restore it, with kill points between; return ``tm``."""
    tm.start()
    killer.point()
    tm.assign([task], [])
    tm.restore()
    killer.point()
    return tm


def reopen(tm: Any, open_manager: Any, killer: Any) -> Any:
    """Close ``tm`` and its state directory, with a kill point after, and return ``open_manager()``."""
    tm.close()
    tm.directory.close()
    killer.point()
    return open_manager()


def count_one(view: Any, pos: int) -> int:
    """Process input record ``pos``: increment its key's count and move ``__pos`` past it."""
    key = input_key(pos)
    view.put(key, b"%d" % (int(view.get(key) or b"0") + 1))
    view.put(POS_KEY, b"%d" % (pos + 1))
    return pos + 1


def count_after_verifying(
    tm: Any,
    task: Any,
    rng: random.Random,
    killer: Any,
    commit_every: int,
    *,
    verify: Callable[[dict[bytes, bytes]], str | None],
    what: str,
    after_commit: Callable[[Any, int], Any],
) -> None:
    """The child's life after a (re)start: check the restored store with ``verify`` (exit 3 with the problem
    when it finds one), print ``verified N``, then count input records for ever, with kill points, committing
    every ``commit_every`` records; ``after_commit(tm, pos)`` sees the position committed, may recycle or
    reopen the manager, and returns it."""
    view = tm.active_task(task).store(STORE)
    store = dict(view)
    problem = verify(store)
    if problem is not None:
        sys.stderr.write(f"after restart and restore {what}: {problem}\n")
        sys.exit(3)
    print(f"verified {len(store)}", flush=True)
    pos = int(view.get(POS_KEY) or b"0")
    since_commit = 0
    while True:
        pos = count_one(view, pos)
        since_commit += 1
        if rng.random() < 0.05:
            killer.point()
        if since_commit >= commit_every:
            tm.commit()
            since_commit = 0
            tm = after_commit(tm, pos)
            view = tm.active_task(task).store(STORE)


def model_from_log(log_dir: Path) -> dict[bytes, bytes]:
    """Last committed value per key of the changelog (tombstones remove), read without the engine."""
    from statestore import SegmentLog, TopicPartition

    tp = TopicPartition(f"app-{STORE}-changelog", TASK_PARTITION)
    log = SegmentLog(log_dir, sync=False)
    if not (log_dir / str(tp)).exists():
        return {}
    return last_values(log.read(tp))


def check(store: dict[bytes, bytes], model: dict[bytes, bytes], *, eos: bool) -> str | None:
    """None if ``store`` is right for ``model`` under the guarantee, else what is wrong."""
    if eos:
        if store != model:
            extra = {k: v for k, v in store.items() if model.get(k) != v}
            missing = {k: v for k, v in model.items() if store.get(k) != v}
            return f"store differs from the committed changelog: store has {extra}, model has {missing}"
        pos = int(store.get(POS_KEY, b"0"))
        expected: dict[bytes, int] = {}
        for i in range(pos):
            k = input_key(i)
            expected[k] = expected.get(k, 0) + 1
        counts = {k: int(v) for k, v in store.items() if k != POS_KEY}
        if counts != expected:
            return f"counts after {pos} records are {counts}, expected {expected}"
        return None
    lost = {k: v for k, v in model.items() if store.get(k) != v}
    if lost:
        return f"committed updates missing from the store: {lost}"
    return None


def main(argv: list[str]) -> None:
    root = Path(argv[0])
    guarantee, offsets, seed, kill_at, commit_every = (
        argv[1],
        argv[2],
        int(argv[3]),
        int(argv[4]),
        int(argv[5]),
    )
    rng = random.Random(seed)
    killer = Killer(kill_at)
    eos = guarantee == "exactly_once_v2"

    from statestore import OffsetCheckpoint, SegmentLog, TaskId
    from statestore.changelog.segment_log import Producer
    from statestore.processing.task_manager import TaskManager
    from statestore.processing.updater import StateRestoreListener
    from statestore.state.directory import StateDirectory
    from statestore.state.store import Store

    for cls, name in [
        (Producer, "commit"),
        (Producer, "flush"),
        (Store, "commit"),
        (Store, "flush"),
        (Store, "close"),
        (OffsetCheckpoint, "write"),
        (OffsetCheckpoint, "delete"),
    ]:
        killer.wrap(cls, name)

    class KillingListener(StateRestoreListener):
        def on_batch_restored(
            self, tp: Any, store_name: str, batch_end_offset: int, num_restored: int
        ) -> None:
            killer.point()

    task = TaskId(0, TASK_PARTITION)
    log = SegmentLog(root / "log", sync=False)

    def open_manager() -> TaskManager:
        tm = TaskManager(
            StateDirectory(root / "state", "app"),
            log,
            [STORE],
            guarantee=guarantee,
            offsets=offsets,
            listener=KillingListener(),
            chunk_offsets=rng.choice([256, 4096, 50_000]),
            checkpoint_delta=rng.choice([0, 5, 50]),
            transaction_timeout_ms=0,
        )
        return start_with_kill_points(tm, task, killer)

    def recycle(tm: Any, _pos: int) -> Any:
        roll = rng.random()
        if roll < 0.03:
            tm.assign([], [task])  # recycle to standby ...
            killer.point()
            tm.poll()
            tm.assign([task], [])  # ... and back
            tm.restore()
            killer.point()
        elif roll < 0.06:
            tm = reopen(tm, open_manager, killer)
        return tm

    count_after_verifying(
        open_manager(),
        task,
        rng,
        killer,
        commit_every,
        verify=lambda store: check(store, model_from_log(root / "log"), eos=eos),
        what=f"under {guarantee}/{offsets}",
        after_commit=recycle,
    )


if __name__ == "__main__":
    # fall back to the source tree only when statestore is not installed (the CI wheel job tests the wheel)
    main(sys.argv[1:])
