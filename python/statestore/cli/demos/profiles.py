"""The pieces of ``statestore demo``: a realistic changelog, and its parallel restoration.

Kept apart from the command so tests and benchmarks can build the same data.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from statestore.changelog.segment_log import SegmentLog
from statestore.ids import TaskId, TopicPartition, changelog_topic
from statestore.restore.engine import RestoreListener, RestoreResult, RestoreSpec, restore_many

DEMO_APP = "demo-app"
DEMO_STORE = "profiles"


@dataclass(frozen=True)
class ChangelogStats:
    """What :func:`build_changelog` wrote."""

    partitions: int
    records: int
    committed: int
    aborted: int
    tombstones: int
    keys: int


def build_changelog(
    log: SegmentLog,
    topic: str,
    partitions: int,
    records: int,
    *,
    seed: int = 7,
    txn_records: int = 25_000,
    abort_every: int = 8,
    updates_per_key: int = 10,
    value_bytes: int = 100,
    on_partition: Callable[[int], None] | None = None,
) -> ChangelogStats:
    """Write ``records`` changelog records over ``partitions`` partitions.

    Keys are overwritten about ``updates_per_key`` times, about 3% of records
    are tombstones, and every ``abort_every``-th transaction is aborted, so a
    restore must skip aborted data and markers and keep only last values.
    """
    rng = random.Random(seed)
    per_part = max(1, records // partitions)
    keys = max(1, per_part // updates_per_key)
    producer = log.producer("demo-loader")
    committed = aborted = tombstones = 0
    pad = b"x" * max(0, value_bytes - 16)
    txn_no = 0
    for part in range(partitions):
        written = 0
        while written < per_part:
            n = min(txn_records, per_part - written)
            batch: list[tuple[bytes | None, bytes | None]] = []
            for i in range(n):
                key = b"user-%07d" % rng.randrange(keys)
                if rng.random() < 0.03:
                    batch.append((key, None))
                else:
                    batch.append((key, b"%016d" % (written + i) + pad))
            txn_no += 1
            abort = txn_no % abort_every == 0
            producer.begin()
            producer.send_many(topic, part, batch)
            if abort:
                producer.abort()
                aborted += n
            else:
                producer.commit()
                committed += n
                tombstones += sum(1 for _k, v in batch if v is None)
            written += n
        if on_partition is not None:
            on_partition(part)
    producer.close()
    log.flush()
    return ChangelogStats(
        partitions, per_part * partitions, committed, aborted, tombstones, keys * partitions
    )


def store_path(state_dir: Path, task: TaskId, store: str = DEMO_STORE, app: str = DEMO_APP) -> Path:
    """``<state_dir>/<app>/<task>/rocksdb/<store>``, with its parents created."""
    path = state_dir / app / str(task) / "rocksdb" / store
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def restore_partitions(
    log: SegmentLog,
    state_dir: Path,
    partitions: Sequence[int],
    *,
    threads: int | None = None,
    listener_for: Callable[[TopicPartition], RestoreListener | None] | None = None,
    app: str = DEMO_APP,
    store: str = DEMO_STORE,
) -> list[RestoreResult]:
    """Restore ``store`` of task ``0_<p>`` for every partition, in parallel."""
    topic = changelog_topic(app, store)
    specs = []
    for p in partitions:
        tp = TopicPartition(topic, p)
        specs.append(
            RestoreSpec(
                store_path=store_path(state_dir, TaskId(0, p), store, app),
                log=log,
                tp=tp,
                listener=listener_for(tp) if listener_for else None,
            )
        )
    return restore_many(specs, threads=threads)


__all__ = ["DEMO_APP", "DEMO_STORE", "ChangelogStats", "build_changelog", "restore_partitions", "store_path"]
