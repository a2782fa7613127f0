"""Topics and input for the application runner's tests (``tests/app``) and benchmarks (``benches/test_bench_app.py``).

Names made unique per test, topics created and waited for until the broker's
metadata shows them, input written fast, and where a counting application
lives (``tests/app/counting_app.py``, which both run as a child process).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from pathlib import Path

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, NewTopic

#: The counting application (per key a count and a running sum) the tests and benchmarks run.
COUNTING_APP = Path(__file__).resolve().parents[1] / "app" / "counting_app.py"


def unique(prefix: str) -> str:
    """``prefix`` with a random suffix: topics and groups of one test never meet another's."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topics(bootstrap: str, topics: dict[str, int]) -> None:
    """Create ``topic -> partitions`` and wait until the broker's metadata lists them."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(t, n, 1) for t, n in topics.items()]).values():
        f.result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        md = admin.list_topics(timeout=10).topics
        if all(t in md and len(md[t].partitions) == n for t, n in topics.items()):
            return
        time.sleep(0.1)
    raise AssertionError(f"topics {sorted(topics)} did not appear")


def produce_fast(bootstrap: str, topic: str, records: Iterable[tuple[int, bytes, bytes]]) -> int:
    """Send many ``(partition, key, value)`` records quickly (1 MiB batches, idempotent: order per
    partition kept); returns how many were sent."""
    p = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 50,
            "batch.size": 1 << 20,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    n = 0
    for part, key, value in records:
        while True:
            try:
                p.produce(topic, key=key, value=value, partition=part)
                break
            except BufferError:  # the local queue is full: let librdkafka send some
                p.poll(0.05)
        n += 1
        if n % 10_000 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    return n


def end_offset(bootstrap: str, topic: str, partition: int, isolation: str = "read_uncommitted") -> int:
    """The end offset of one partition: the high watermark, or under ``read_committed`` the last
    stable offset (it stays behind an open transaction)."""
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": unique("end"), "isolation.level": isolation})
    try:
        return int(c.get_watermark_offsets(ck.TopicPartition(topic, partition), timeout=10, cached=False)[1])
    finally:
        c.close()
