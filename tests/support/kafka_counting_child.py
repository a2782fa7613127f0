"""Crash-test child: a counting processor on a TaskManager whose changelog is a Kafka topic.

``kafka_counting_child.py <root> <bootstrap> <app> <seed> <kill_at> <commit_every>``

Like ``counting_child.py`` (exactly-once, offsets in the store), with a
:class:`~statestore.changelog.kafka.KafkaChangelog`: every store write goes through a
transactional Kafka producer, and restart restores from the broker. Task 0_0
has one store ``counts``; processing input record ``i`` increments
``counts[key(i)]`` and sets ``__pos`` to ``i + 1``.

After each successful ``TaskManager.commit()`` the child appends the input
position to ``<root>/committed`` and fsyncs it: a lower bound of what the
broker committed. On start, after restoration, it checks and prints
``verified <n>``, or exits with status 3 saying why on stderr:

* no committed update is lost: ``__pos`` is at least the last position in
  ``committed``, and every count at least that position's count;
* the store equals the committed changelog as the broker serves it to a
  read_committed reader (read with the Python reader, not the restore engine).

The broker is Apache Kafka, so its read_committed view holds no aborted
record: a store equal to it holds nothing of a killed transaction.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path
from typing import Any

from support.counting_child import (
    POS_KEY,
    STORE,
    TASK_PARTITION,
    count_after_verifying,
    input_key,
    reopen,
    start_with_kill_points,
)
from support.killer import Killer
from support.model import last_values


def expected_counts(pos: int) -> dict[bytes, int]:
    out: dict[bytes, int] = {}
    for i in range(pos):
        k = input_key(i)
        out[k] = out.get(k, 0) + 1
    return out


def model_from_broker(changelog: Any, topic: str, upto: int | None = None) -> dict[bytes, bytes]:
    """Last value per key of the topic's read_committed view (up to offset ``upto``, inclusive)."""
    from statestore import TopicPartition

    end = None if upto is None else upto + 1
    return last_values(changelog.read(TopicPartition(topic, TASK_PARTITION), end_offset=end))


def last_committed(root: Path) -> int:
    path = root / "committed"
    if not path.exists():
        return 0
    lines = path.read_text().split()
    return int(lines[-1]) if lines else 0


def check(store: dict[bytes, bytes], model: dict[bytes, bytes], committed: int) -> str | None:
    """None if nothing committed is lost and the store equals the broker's committed view."""
    if store != model:
        extra = {k: v for k, v in store.items() if model.get(k) != v}
        missing = {k: v for k, v in model.items() if store.get(k) != v}
        return f"store differs from the changelog's committed records: store has {extra}, changelog has {missing}"
    pos = int(store.get(POS_KEY, b"0"))
    if pos < committed:
        return f"input position {pos} is behind the committed position {committed}: committed updates lost"
    counts = {k: int(v) for k, v in store.items() if k != POS_KEY}
    short = {k: (counts.get(k, 0), n) for k, n in expected_counts(committed).items() if counts.get(k, 0) < n}
    if short:
        return f"counts below what position {committed} committed (have, committed): {short}"
    return None


def main(argv: list[str]) -> None:
    root, bootstrap, app = Path(argv[0]), argv[1], argv[2]
    seed, kill_at, commit_every = int(argv[3]), int(argv[4]), int(argv[5])
    rng = random.Random(seed)
    killer = Killer(kill_at)

    from statestore import TaskId
    from statestore.changelog.kafka import KafkaChangelog, KafkaProducer
    from statestore.ids import changelog_topic
    from statestore.processing.task_manager import TaskManager
    from statestore.processing.updater import StateRestoreListener
    from statestore.state.directory import StateDirectory
    from statestore.state.store import Store

    for cls, name in [
        (KafkaProducer, "commit"),
        (KafkaProducer, "flush"),
        (Store, "commit"),
        (Store, "flush"),
        (Store, "close"),
    ]:
        killer.wrap(cls, name)

    class KillingListener(StateRestoreListener):
        def on_batch_restored(
            self, tp: Any, store_name: str, batch_end_offset: int, num_restored: int
        ) -> None:
            killer.point()

    task = TaskId(0, TASK_PARTITION)
    topic = changelog_topic(app, STORE)
    changelog = KafkaChangelog(bootstrap, request_timeout=20.0, restore_stall_timeout=20.0)

    def open_manager() -> TaskManager:
        tm = TaskManager(
            StateDirectory(root / "state", app),
            changelog,
            [STORE],
            guarantee="exactly_once_v2",
            listener=KillingListener(),
            chunk_offsets=rng.choice([64, 1000, 50_000]),
        )
        return start_with_kill_points(tm, task, killer)

    ledger = os.open(root / "committed", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def record_and_reopen(tm: Any, pos: int) -> Any:
        os.write(ledger, b"%d\n" % pos)
        os.fsync(ledger)
        return reopen(tm, open_manager, killer) if rng.random() < 0.03 else tm

    count_after_verifying(
        open_manager(),
        task,
        rng,
        killer,
        commit_every,
        verify=lambda store: check(store, model_from_broker(changelog, topic), last_committed(root)),
        what="from Kafka",
        after_commit=record_and_reopen,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
