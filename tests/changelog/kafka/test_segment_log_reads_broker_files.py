"""The segment log reads the partition directories an Apache Kafka 4.4 broker wrote (architecture: "On disk").

A real broker gets records from real clients -- idempotent producers with
every compression codec, a transactional producer that aborts some
transactions, a compacted topic the log cleaner has rewritten -- over several
segments. Then it is stopped, and its ``log.dirs`` is read as a segment log:
every partition yields exactly what a read_committed consumer read from the
broker (offsets, keys, values, tombstones) beside the broker's own index,
time index, producer snapshots, leader epoch checkpoint and
partition metadata; stores restore from it (``restore_store`` and
``statestore restore --log-dir``); and ``statestore log dump`` agrees with
Kafka's own ``DumpLogSegments`` batch by batch.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statestore import SegmentLog, TopicPartition, restore_store
from support.kafka_broker import SCRIPT, Broker, BrokerUnavailable, start_broker
from support.model import store_contents

kafka = pytest.importorskip("statestore.changelog.kafka")
ck = pytest.importorskip("confluent_kafka")


CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
APP, STORE = "brokerapp", "counts"
TXN_TOPIC = f"{APP}-{STORE}-changelog"
COMPACTED = "compacted"
SEGMENT = {"segment.bytes": "1048576"}


def produce_codec_topic(bootstrap: str, codec: str, rng: random.Random) -> None:
    p = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "compression.type": codec,
            "linger.ms": 20,
            "batch.size": 65536,
        }
    )
    for i in range(25_000):
        value = None if i % 97 == 0 else rng.randbytes(rng.randrange(40, 120))
        p.produce(f"codec-{codec}", key=b"k%05d" % rng.randrange(5_000), value=value, partition=i % 2)
        if i % 5_000 == 0:
            p.poll(0)
    p.flush(60)


def produce_transactions(bootstrap: str, rng: random.Random) -> None:
    """40 transactions, every 5th aborted. A transaction the client gives up on (a fatal error on a loaded
    machine) is fenced by a fresh producer of the same id, which aborts it, and written again."""

    def producer() -> Any:
        p = ck.Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": "brokerfiles-txn", "linger.ms": 5}
        )
        p.init_transactions(60)
        return p

    p = producer()
    for t in range(40):
        records = [
            (b"w%04d" % rng.randrange(2_000), None if rng.random() < 0.05 else rng.randbytes(80))
            for _ in range(rng.randrange(100, 900))
        ]
        for _attempt in range(3):
            try:
                p.begin_transaction()
                for key, value in records:
                    p.produce(TXN_TOPIC, key=key, value=value, partition=0)
                if t % 5 == 3:
                    p.abort_transaction(60)
                else:
                    p.commit_transaction(60)
                break
            except ck.KafkaException:
                p = producer()
        else:
            raise AssertionError(f"transaction {t} failed three times")


def produce_compacted(c: Any, rng: random.Random) -> None:
    p = ck.Producer({"bootstrap.servers": c.bootstrap_servers, "enable.idempotence": True, "linger.ms": 5})
    written = 0
    for _ in range(30_000):
        p.produce(COMPACTED, key=b"c%03d" % rng.randrange(300), value=rng.randbytes(60), partition=0)
        written += 1
    p.flush(60)
    tp = TopicPartition(COMPACTED, 0)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:  # roll the active segment until the cleaner has compacted the rest
        time.sleep(1.0)
        p.produce(COMPACTED, key=b"roll", value=b"%d" % time.monotonic_ns(), partition=0)
        p.flush(30)
        if sum(1 for _ in c.read(tp)) < written // 4:
            return
    raise AssertionError("the log cleaner did not compact the topic in time")


@pytest.fixture(scope="module")
def broker_files(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Broker, dict[TopicPartition, list[Any]]]]:
    try:
        broker = start_broker(tmp_path_factory.mktemp("broker-files"))
    except BrokerUnavailable as e:
        pytest.fail(f"no Kafka broker could start: {e}")
    rng = random.Random(17)
    expected: dict[TopicPartition, list[Any]] = {}
    try:
        with kafka.KafkaChangelog(broker.bootstrap, request_timeout=60.0) as c:
            for codec in CODECS:
                c.create_topics({f"codec-{codec}": 2}, config={"cleanup.policy": "delete", **SEGMENT})
            c.create_topics({TXN_TOPIC: 1}, config={"cleanup.policy": "delete", **SEGMENT})
            c.create_topics(
                {COMPACTED: 1},
                config={
                    **SEGMENT,
                    "segment.ms": "200",
                    "min.cleanable.dirty.ratio": "0.001",
                    "delete.retention.ms": "100",
                    "min.compaction.lag.ms": "0",
                    "max.compaction.lag.ms": "1000",
                },
            )
            for codec in CODECS:
                produce_codec_topic(broker.bootstrap, codec, rng)
            produce_transactions(broker.bootstrap, rng)
            produce_compacted(c, rng)
            topics = [f"codec-{codec}" for codec in CODECS]
            tps = [TopicPartition(t, p) for t in topics for p in range(2)]
            tps += [TopicPartition(TXN_TOPIC, 0), TopicPartition(COMPACTED, 0)]
            for tp in tps:
                expected[tp] = [(r.offset, r.key, r.value) for r in c.read(tp)]
                assert expected[tp], f"nothing read from {tp}"
    finally:
        broker.stop()
    yield broker, expected


def test_the_segment_log_reads_what_a_read_committed_consumer_read(
    broker_files: tuple[Broker, dict[TopicPartition, list[Any]]],
) -> None:
    broker, expected = broker_files
    log = SegmentLog(broker.log_dir)
    for tp, records in expected.items():
        got = [(r.offset, r.key, r.value) for r in log.read(tp)]
        assert got == records, f"{tp}: the segment log disagrees with the broker's read_committed consumer"
    # The broker's own files are there beside the segments, and are no obstacle.
    names = {
        f.suffix if f.stem.isdigit() else f.name
        for tp in expected
        for f in (broker.log_dir / str(tp)).iterdir()
    }
    for kind in (
        ".log",
        ".index",
        ".timeindex",
        ".snapshot",
        "leader-epoch-checkpoint",
        "partition.metadata",
    ):
        assert kind in names, f"no {kind} file in the broker's partition directories"
    # (Kafka 4.4 writes a .txnindex only for some segments with aborted transactions; the reader never needs one.)
    assert len(list((broker.log_dir / "codec-none-0").glob("*.log"))) >= 2, "several segments"
    assert TopicPartition(TXN_TOPIC, 0) in log.partitions()


def test_stores_restore_from_the_broker_log_dir(
    broker_files: tuple[Broker, dict[TopicPartition, list[Any]]], tmp_path: Path
) -> None:
    broker, expected = broker_files
    log = SegmentLog(broker.log_dir)
    for tp in (TopicPartition(TXN_TOPIC, 0), TopicPartition(COMPACTED, 0), TopicPartition("codec-zstd", 1)):
        model: dict[bytes, bytes] = {}
        for _o, k, v in expected[tp]:
            if v is None:
                model.pop(k, None)
            else:
                model[k] = v
        for mode in ("replay", "bulk"):
            store = tmp_path / f"{tp}-{mode}"
            r = restore_store(store, log, tp, mode=mode)
            contents = store_contents(store)
            assert contents.data == model, f"{tp} {mode}"
            assert contents.offsets == {str(tp): expected[tp][-1][0]} and r.offset == expected[tp][-1][0]
    state = tmp_path / "state"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "statestore.cli",
            "restore",
            "--log-dir",
            str(broker.log_dir),
            "--state-dir",
            str(state),
            "--app-id",
            APP,
            "--store",
            STORE,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 ok, 0 failed" in out.stdout
    a = store_contents(state / APP / "0_0" / "rocksdb" / STORE)
    b = store_contents(tmp_path / f"{TopicPartition(TXN_TOPIC, 0)}-replay")
    assert (a.data, a.offsets) == (b.data, b.offsets)


DUMP_LINE = re.compile(
    r"baseOffset: (\d+) lastOffset: (\d+) count: \d+ .*?producerId: (-?\d+) .*?"
    r"isTransactional: (true|false) .*?isControl: (true|false)"
)


def kafka_dump(segment: Path) -> list[tuple[int, int, int, bool, bool]]:
    cp = subprocess.run(["bash", str(SCRIPT), "tools-classpath"], capture_output=True, text=True, timeout=600)
    if cp.returncode != 0:
        pytest.fail(f"Kafka's tools could not be resolved: {cp.stderr[-2000:]}")
    out = subprocess.run(
        ["java", "-cp", cp.stdout.strip(), "org.apache.kafka.tools.DumpLogSegments", "--files", str(segment)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "KAFKA_HEAP_OPTS": "-Xmx256m"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = []
    for line in out.stdout.splitlines():
        m = DUMP_LINE.search(line)
        if m:
            rows.append((int(m[1]), int(m[2]), int(m[3]), m[4] == "true", m[5] == "true"))
    assert rows, out.stdout[:2000]
    return rows


def test_log_dump_agrees_with_kafkas_dump_log_segments(
    broker_files: tuple[Broker, dict[TopicPartition, list[Any]]],
) -> None:
    broker, _expected = broker_files
    log = SegmentLog(broker.log_dir)
    for tp in (TopicPartition(TXN_TOPIC, 0), TopicPartition("codec-lz4", 0)):
        ours = [
            (b.base_offset, b.last_offset, int(b.producer_id), bool(b.transactional), b.control is not None)
            for b in log.dump(tp)
        ]
        theirs = []
        for seg in sorted((broker.log_dir / str(tp)).glob("*.log")):
            theirs += kafka_dump(seg)
        assert ours == theirs, f"{tp}: statestore log dump and DumpLogSegments disagree"
