"""Kafka restore vs segment-log restore of the same records (issue 10), both measured in the same run.

An Apache Kafka 4.4 broker (``scripts/kafka-broker.sh``) is started on
127.0.0.1; the benchmark is skipped when none can start. The same transactions go to a
Kafka topic and to a segment log; then the same restore engine replays each
into a fresh store. Also measured: the floor any restore through
confluent-kafka pays -- ``consume()`` handing out every message, untouched --
and a restore in Python (a loop over the messages into a RocksDB write
batch), so the report can say where the time goes.

The ratio is segment-log seconds / Kafka seconds (below 1: Kafka is slower).
The Kafka restores go through ``KafkaChangelog``'s native fetcher (the
consume() floor and the Python restore through confluent-kafka). It has no
goal: test_bench_kafka_native.py holds the native fetcher's goals; the
figures here are recorded in BENCHMARKS.md's Kafka section.
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import median_time, scaled
from statestore import SegmentLog, TopicPartition
from statestore.restore.engine import restore_store
from support.kafka_broker import BrokerUnavailable, start_broker
from support.model import store_difference

kafka = pytest.importorskip("statestore.changelog.kafka")

N = scaled(300_000, minimum=20_000)
TXN = 10_000
ROUNDS = 3
VALUE_SIZE = 100


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, SegmentLog, TopicPartition]]:
    try:
        broker = start_broker()
    except BrokerUnavailable as e:
        pytest.skip(f"no Kafka broker could start: {e}")
    changelog = kafka.KafkaChangelog(broker.bootstrap, request_timeout=60.0)
    seg = SegmentLog(tmp_path_factory.mktemp("kafka-bench") / "log", sync=False)
    tp = TopicPartition("bench-kafka", 0)
    changelog.create_topics({tp.topic: 1})
    rng = random.Random(1)
    values = [rng.randbytes(VALUE_SIZE) for _ in range(997)]
    kp, sp = changelog.producer("bench"), seg.producer("bench")
    t0 = time.perf_counter()
    for start in range(0, N, TXN):
        kp.begin()
        sp.begin()
        for i in range(start, min(start + TXN, N)):
            k, v = b"key-%012d" % rng.randrange(N // 10), values[i % 997]
            kp.send(tp.topic, 0, k, v)
            sp.send(tp.topic, 0, k, v)
        kp.commit()
        sp.commit()
    kp.close()
    sp.close()
    assert changelog.offsets(tp) == seg.offsets(tp)
    print(
        f"\nkafka benchmark data: {N:,} records in {N // TXN} transactions written in {time.perf_counter() - t0:.1f}s"
    )
    yield changelog, seg, tp
    changelog.close()
    broker.stop()


def consume_only(changelog: Any, tp: TopicPartition, end: int) -> int:
    """Every message handed out by consume(), untouched: the client's floor."""
    feed = changelog.restore_feed(tp.topic, tp.partition, 0)
    n, pos = 0, 0
    try:
        while pos < end:
            for m in feed.poll(10_000):
                if m.error() is None:
                    n += 1
            p = feed.position()
            pos = p if p is not None else pos
    finally:
        feed.close()
    return n


def restore_in_python(changelog: Any, tp: TopicPartition, path: Path) -> int:
    """A restore written in Python: a loop over the messages into rocksdict write batches."""
    from rocksdict import Rdict, WriteBatch

    db = Rdict(str(path))
    n = 0
    try:
        batch = WriteBatch()
        for rec in changelog.read(tp):
            if rec.value is None:
                batch.delete(rec.key)
            else:
                batch.put(rec.key, rec.value)
            n += 1
            if n % 10_000 == 0:
                db.write(batch)
                batch = WriteBatch()
        db.write(batch)
    finally:
        db.close()
    return n


def test_kafka_restore_vs_segment_log(
    benchmark: Any, data: tuple[Any, SegmentLog, TopicPartition], tmp_path: Path
) -> None:
    changelog, seg, tp = data
    end = changelog.end_offset(tp)
    store = tmp_path / "s"

    def reset() -> None:
        shutil.rmtree(store, ignore_errors=True)

    figures: dict[str, float] = {}
    for mode in ("replay", "bulk"):
        for name, source in (("segment", seg), ("kafka", changelog)):
            figures[f"{name}_{mode}_s"] = median_time(
                lambda m=mode, c=source: restore_store(store, c, tp, mode=m), reset, ROUNDS
            )
    expected = tmp_path / "expected"
    restore_store(expected, seg, tp, mode="replay")
    reset()
    restore_store(store, changelog, tp, mode="replay")
    assert store_difference(expected, store) is None
    figures["consume_only_s"] = median_time(lambda: consume_only(changelog, tp, end), lambda: None, ROUNDS)
    py = tmp_path / "py"
    figures["python_restore_s"] = median_time(
        lambda: restore_in_python(changelog, tp, py), lambda: shutil.rmtree(py, ignore_errors=True), ROUNDS
    )
    rate = {k.replace("_s", "_records_per_s"): N / v for k, v in figures.items()}
    benchmark.pedantic(
        lambda: restore_store(store, changelog, tp, mode="replay"), setup=reset, rounds=1, iterations=1
    )
    benchmark.extra_info.update(
        {
            "baseline": "segment-log replay restore, same records",
            "candidate": "Kafka replay restore (Apache Kafka 4.4 on loopback, the native fetcher)",
            "ratio": figures["segment_replay_s"] / figures["kafka_replay_s"],
            "goal": None,
            "records": N,
            **rate,
        }
    )
    print("\n" + "\n".join(f"{k}: {v:,.0f}" for k, v in rate.items()))
