"""An empty control batch that Apache Kafka's log cleaner itself left on disk (issue 33, Deliver 4).

A transactional producer writes a transaction and is replaced before it
commits: its successor (the same ``transactional.id``) fences it, and the
coordinator aborts the open transaction with an ABORT marker in the bumped
producer epoch. That marker is then the producer's last batch, with no data
offset after the epoch bump, so once the cleaner has dropped the aborted
records and the marker's delete horizon (``delete.retention.ms``) has passed,
it keeps the marker's batch -- control and transactional flags, offsets,
producer id and epoch -- with no record (``count: 0`` in ``DumpLogSegments``),
for the producer's fencing state. Committed transactions of another producer
and plain records (which roll the segments) surround it.

Restored natively from the broker, and read by the segment log from the
broker's own files after it stopped, the store is exactly the committed
records the compacted log holds.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
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

TOPIC = "cleaned-txn"
TP = TopicPartition(TOPIC, 0)
#: Seconds the log cleaner gets to leave an empty control batch behind.
CLEANER_BOUND = 180.0


def batches(partition_dir: Path) -> list[tuple[int, int, int, bool, bool]]:
    """(base offset, last offset, record count, transactional, control) of every complete batch of the segments."""
    out = []
    for seg in sorted(partition_dir.glob("*.log")):
        b = seg.read_bytes()
        at = 0
        while at + 61 <= len(b):
            base, length = struct.unpack_from(">qi", b, at)
            if length <= 0 or at + 12 + length > len(b):
                break
            (attrs,) = struct.unpack_from(">h", b, at + 21)
            (last_delta,) = struct.unpack_from(">i", b, at + 23)
            (count,) = struct.unpack_from(">i", b, at + 57)
            out.append((base, base + last_delta, count, bool(attrs & 0x10), bool(attrs & 0x20)))
            at += 12 + length
    return out


def empty_control_batches(partition_dir: Path) -> list[int]:
    return [base for base, _last, count, _txn, control in batches(partition_dir) if control and count == 0]


DUMP_EMPTY_CONTROL = re.compile(
    r"baseOffset: (\d+) lastOffset: \d+ count: 0 .*?isTransactional: true .*?"
    r"isControl: true"
)


def kafka_dump_empty_controls(partition_dir: Path) -> list[int]:
    """Base offsets of the control batches with ``count: 0`` that Kafka's ``DumpLogSegments`` shows."""
    cp = subprocess.run(["bash", str(SCRIPT), "tools-classpath"], capture_output=True, text=True, timeout=600)
    if cp.returncode != 0:
        pytest.fail(f"Kafka's tools could not be resolved: {cp.stderr[-2000:]}")
    found = []
    for seg in sorted(partition_dir.glob("*.log")):
        out = subprocess.run(
            ["java", "-cp", cp.stdout.strip(), "org.apache.kafka.tools.DumpLogSegments", "--files", str(seg)],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "KAFKA_HEAP_OPTS": "-Xmx256m"},
        )
        assert out.returncode == 0, out.stderr[-2000:]
        found += [int(m[1]) for m in DUMP_EMPTY_CONTROL.finditer(out.stdout)]
    return found


def _transactional(bootstrap: str, txn_id: str) -> Any:
    p = ck.Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5})
    p.init_transactions(60)
    return p


@pytest.fixture(scope="module")
def cleaned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Broker, dict[bytes, bytes], int]]:
    try:
        broker = start_broker(tmp_path_factory.mktemp("cleaned-broker"))
    except BrokerUnavailable as e:
        pytest.fail(f"no Kafka broker could start: {e}")
    try:
        with kafka.KafkaChangelog(broker.bootstrap, request_timeout=60.0) as c:
            c.create_topics(
                {TOPIC: 1},
                config={
                    "segment.ms": "200",
                    "segment.bytes": "1048576",
                    "min.cleanable.dirty.ratio": "0.01",
                    "delete.retention.ms": "100",
                    "min.compaction.lag.ms": "0",
                    "max.compaction.lag.ms": "1000",
                },
            )
            model: dict[bytes, bytes] = {}
            committer = _transactional(broker.bootstrap, "committer")
            for t in range(4):
                committer.begin_transaction()
                for i in range(50):
                    k, v = b"c%03d" % (i + 50 * (t % 2)), b"committed-%d-%d" % (t, i)
                    committer.produce(TOPIC, key=k, value=v, partition=0)
                    model[k] = v
                committer.commit_transaction(60)
            # A producer replaced mid-transaction: its successor's init_transactions aborts the transaction
            # with a marker in the bumped epoch, the producer's last batch.
            doomed = _transactional(broker.bootstrap, "replaced")
            doomed.begin_transaction()
            for i in range(40):
                doomed.produce(TOPIC, key=b"a%03d" % i, value=b"aborted-%d" % i, partition=0)
            doomed.flush(60)
            successor = _transactional(broker.bootstrap, "replaced")
            plain = ck.Producer(
                {"bootstrap.servers": broker.bootstrap, "enable.idempotence": False, "linger.ms": 0}
            )
            part = broker.log_dir / str(TP)
            deadline = time.monotonic() + CLEANER_BOUND
            n = 0
            while not empty_control_batches(part):
                assert time.monotonic() < deadline, (
                    f"no empty control batch after {CLEANER_BOUND}s: {batches(part)}"
                )
                for _ in range(20):  # roll segments, so the cleaner has something dirty to clean
                    k, v = b"p%03d" % (n % 60), b"plain-%d" % n
                    plain.produce(TOPIC, key=k, value=v, partition=0)
                    model[k] = v
                    n += 1
                plain.flush(30)
                time.sleep(0.5)
            end = c.end_offset(TP)
            del doomed, successor
    except BaseException:
        broker.stop()
        raise
    yield broker, model, end
    broker.stop()


def test_an_empty_control_batch_the_cleaner_left_restores_exactly_natively_and_from_the_broker_files(
    cleaned: tuple[Broker, dict[bytes, bytes], int], tmp_path: Path
) -> None:
    broker, model, _end = cleaned
    part = broker.log_dir / str(TP)
    empties = empty_control_batches(part)
    assert empties
    with kafka.KafkaChangelog(broker.bootstrap, request_timeout=30.0, restore_stall_timeout=30.0) as c:
        assert c.native is not None
        for mode in ("replay", "bulk"):
            restore_store(tmp_path / f"native-{mode}", c, TP, mode=mode)
            assert store_contents(tmp_path / f"native-{mode}").data == model, mode
        read = {rec.key: rec.value for rec in c.read(TP)}
        assert read == model
    broker.stop()
    # Kafka's own tool shows the batch the reader steps over: a control batch holding no record.
    assert set(empties) <= set(kafka_dump_empty_controls(part)), empties
    log = SegmentLog(broker.log_dir)
    for mode in ("replay", "bulk"):
        restore_store(tmp_path / f"files-{mode}", log, TP, mode=mode)
        assert store_contents(tmp_path / f"files-{mode}").data == model, mode
    assert {rec.key: rec.value for rec in log.read(TP)} == model
