"""Kafka semantics that only a real broker shows, on Apache Kafka 4.4 (``scripts/kafka-broker.sh``).

- A restore applies exactly the committed records: transactions aborted in
  the middle of the log are skipped, the last stable offset is the end while
  a transaction is open, markers are stepped over.
- A compacted changelog restores to the same store as the records it was
  compacted from, tombstones included.
- Records deleted below the store's offset make the task corrupted; the task
  manager wipes it and restores it from what is left.
- A transaction left open by a SIGKILLed process is aborted -- by a successor
  with the same transactional id, and by ``transaction.timeout.ms`` when none
  comes -- and nothing of it reaches any store.
- The broker SIGKILLed during a restore and during an exactly-once commit,
  then restarted on the same log directory: no committed update lost, no
  aborted one kept, the restore resumes. A broker that stays down is a clear
  error naming the bootstrap address after a bounded time.
"""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statestore import TaskId, TopicPartition, restore_store
from statestore.errors import LogError, StateStoreError, TaskCorruptedError
from statestore.processing.task_manager import TaskManager
from support.kafka_broker import Broker
from support.kafka_writes import settle
from support.model import apply, store_contents

kafka = pytest.importorskip("statestore.changelog.kafka")
ck = pytest.importorskip("confluent_kafka")
KafkaChangelog = kafka.KafkaChangelog


Model = dict[bytes, bytes]


@pytest.fixture
def changelog(kafka_bootstrap: str) -> Iterator[Any]:
    c = KafkaChangelog(kafka_bootstrap, request_timeout=30.0, restore_stall_timeout=30.0)
    yield c
    c.close()


def topic_name(prefix: str = "sem") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def txn(rng: random.Random, n: int, keys: int, tag: str) -> list[tuple[bytes, bytes | None]]:
    return [
        (b"k%05d" % rng.randrange(keys), None if rng.random() < 0.1 else f"{tag}-{i}".encode())
        for i in range(n)
    ]


def test_restore_applies_exactly_the_committed_records(changelog: Any, tmp_path: Path) -> None:
    topic = topic_name()
    changelog.create_topics({topic: 1})
    tp = TopicPartition(topic, 0)
    rng = random.Random(5)
    model: Model = {}
    aborted = 0
    p = changelog.producer(f"w-{topic}")
    for i in range(30):
        records = txn(rng, rng.randrange(50, 400), 500, f"t{i}")
        p.begin()
        for k, v in records:
            p.send(topic, 0, k, v)
        if i % 4 == 2:
            # Delivered first, so the aborted records are in the log (an abort before
            # delivery would purge them, and can race the client's AddPartitionsToTxn).
            p.flush()
            p.abort()  # aborted in the middle of the log
            aborted += len(records)
        else:
            p.commit()
            apply(model, records)
    # A transaction left open: the last stable offset holds the restore back.
    p.begin()
    open_records = [(b"k%05d" % i, b"OPEN") for i in range(100)]
    for k, v in open_records:
        p.send(topic, 0, k, v)
    p.flush()
    settle(changelog, tp, open_records=len(open_records))
    start, end, lso = changelog.offsets(tp)
    assert start == 0 and lso < end, "an open transaction keeps the last stable offset below the end"
    committed = sum(1 for _ in changelog.read(tp))
    # every record sent is in the log, aborted ones too, with one marker per ended transaction
    assert end == committed + aborted + 30 + len(open_records)
    for mode in ("replay", "bulk"):
        store = tmp_path / mode
        r = restore_store(store, changelog, tp, mode=mode)
        assert r.end_offset == lso and r.offset is not None and r.offset < lso
        assert r.records_applied == committed
        contents = store_contents(store)
        data, offsets = contents.data, contents.offsets
        assert data == model, f"{mode}: the store is not the committed changelog"
        assert offsets == {str(tp): r.offset}
    # The open transaction commits: a resumed replay picks up only its records and the marker.
    p.commit()
    apply(model, open_records)
    p.close()
    settle(changelog, tp)
    r = restore_store(tmp_path / "replay", changelog, tp)
    assert r.mode == "replay" and r.records_applied == len(open_records)
    assert r.end_offset == changelog.end_offset(tp) and r.offset == r.end_offset - 2
    assert store_contents(tmp_path / "replay").data == model


def test_a_compacted_changelog_restores_to_the_same_store(changelog: Any, tmp_path: Path) -> None:
    topic = topic_name("compact")
    changelog.create_topics(
        {topic: 1},
        config={
            "segment.bytes": "1048576",
            "segment.ms": "100",
            "min.cleanable.dirty.ratio": "0.001",
            "delete.retention.ms": "100",
            "min.compaction.lag.ms": "0",
            "max.compaction.lag.ms": "1000",
        },
    )
    tp = TopicPartition(topic, 0)
    rng = random.Random(9)
    model: Model = {}
    p = changelog.producer(f"c-{topic}")
    written = 0
    for i in range(40):
        records = txn(rng, 200, 300, f"c{i}")
        p.begin()
        for k, v in records:
            p.send(topic, 0, k, v)
        p.commit()
        apply(model, records)
        written += len(records)
    settle(changelog, tp)
    uncompacted = tmp_path / "before"
    restore_store(uncompacted, changelog, tp, mode="replay")
    assert store_contents(uncompacted).data == model
    # Roll the active segment (segment.ms) so the cleaner may compact everything before it, then wait for it.
    deadline = time.monotonic() + 90
    remaining = written
    while time.monotonic() < deadline:
        time.sleep(1.0)
        p.begin()
        p.send(topic, 0, b"roll", b"%d" % time.monotonic_ns())
        p.commit()
        model[b"roll"] = b""  # value checked apart below
        remaining = sum(1 for _ in changelog.read(tp))
        if remaining < written // 2:
            break
    p.close()
    settle(changelog, tp)
    assert remaining < written // 2, (
        f"the log cleaner did not compact the topic in time ({remaining} of {written})"
    )
    for mode in ("replay", "bulk"):
        store = tmp_path / f"after-{mode}"
        restore_store(store, changelog, tp, mode=mode)
        data = store_contents(store).data
        assert data.pop(b"roll") and model.get(b"roll") is not None
        expected = {k: v for k, v in model.items() if k != b"roll"}
        assert data == expected, f"{mode}: the compacted changelog restored to another store"
    before = store_contents(uncompacted).data
    assert {k for k in before if k != b"roll"} == {k for k in expected}, "tombstoned keys must stay deleted"


def test_records_deleted_below_the_store_offset_make_the_task_corrupted(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    app = f"del{uuid.uuid4().hex[:8]}"
    store = "s"
    tp = TopicPartition(f"{app}-{store}-changelog", 0)
    with KafkaChangelog(kafka_bootstrap, request_timeout=30.0) as changelog:
        changelog.create_topics({tp.topic: 1}, config={"cleanup.policy": "delete"})
        p = changelog.producer()
        for i in range(300):
            p.send(tp.topic, 0, b"k%03d" % (i % 100), b"v%d" % i)
        p.close()
        tm = TaskManager(
            tmp_path / "state", changelog, [store], guarantee="exactly_once_v2", application_id=app
        )
        tm.start()
        tm.assign([TaskId(0, 0)], [])
        assert tm.restore()
        assert tm.task(TaskId(0, 0)).offsets()[tp] == 299
        tm.close()
        # Records are deleted past the store's offset + 1: what the store would resume from is gone.
        p = changelog.producer()
        for i in range(300, 400):
            p.send(tp.topic, 0, b"k%03d" % (i % 100), b"v%d" % i)
        p.close()
        admin = changelog.admin()
        fut = admin.delete_records([ck.TopicPartition(tp.topic, 0, 350)])
        next(iter(fut.values())).result(30)
        assert changelog.start_offset(tp) == 350
        with pytest.raises(TaskCorruptedError, match="records between were deleted"):
            restore_store(tmp_path / "state" / app / "0_0" / "rocksdb" / store, changelog, tp)
        tm = TaskManager(
            tmp_path / "state", changelog, [store], guarantee="exactly_once_v2", application_id=app
        )
        tm.start()
        tm.assign([TaskId(0, 0)], [])
        assert tm.restore(), "the corrupted task must be wiped and restored from the new log start"
        tm.close()
        contents = store_contents(tmp_path / "state" / app / "0_0" / "rocksdb" / store)
        data, offsets = contents.data, contents.offsets
        assert offsets[str(tp)] == 399
        assert data == {b"k%03d" % (i % 100): b"v%d" % i for i in range(350, 400)}


CHILD = textwrap.dedent("""
    import sys, time
    from statestore.changelog.kafka import KafkaChangelog
    bootstrap, topic, tid, timeout_ms = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    c = KafkaChangelog(bootstrap, transaction_timeout_ms=timeout_ms)
    p = c.producer(tid)
    p.begin()
    for i in range(200):
        p.send(topic, 0, b"k%03d" % i, b"LOST")
    p.flush()
    print("open", flush=True)
    time.sleep(3600)
""")


def open_transaction_then_sigkill(bootstrap: str, topic: str, tid: str, timeout_ms: int) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, bootstrap, topic, tid, str(timeout_ms)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "open", "the child did not open its transaction"
    child.kill()
    child.wait(30)


@pytest.mark.parametrize("aborted_by", ["a successor", "the transaction timeout"])
def test_a_transaction_left_open_by_a_killed_process_is_aborted(
    changelog: Any, tmp_path: Path, aborted_by: str
) -> None:
    topic = topic_name("open")
    changelog.create_topics({topic: 1})
    tp = TopicPartition(topic, 0)
    p = changelog.producer(f"before-{topic}")
    p.begin()
    for i in range(50):
        p.send(topic, 0, b"k%03d" % i, b"KEPT")
    p.commit()
    p.close()
    tid = f"killed-{topic}"
    open_transaction_then_sigkill(changelog.bootstrap_servers, topic, tid, 3_000)
    _start, end, lso = changelog.offsets(tp)
    assert lso < end, "the killed process's transaction is open"
    if aborted_by == "a successor":
        successor = changelog.producer(
            tid
        )  # init_transactions fences the dead one and aborts its transaction
        successor.close()
    deadline = time.monotonic() + 60
    while changelog.offsets(tp)[2] < changelog.offsets(tp)[1] and time.monotonic() < deadline:
        time.sleep(0.2)
    _start, end, lso = changelog.offsets(tp)
    assert lso == end, f"the open transaction was not aborted by {aborted_by}"
    r = restore_store(tmp_path / "s", changelog, tp)
    data = store_contents(tmp_path / "s").data
    assert data == {b"k%03d" % i: b"KEPT" for i in range(50)}, (
        "records of the aborted transaction reached the store"
    )
    assert r.records_applied == 50


# -- faults of the broker itself (a broker of their own, so the session's is not disturbed) -------------------


def test_a_broker_killed_during_a_restore_and_a_commit_loses_nothing(
    own_broker: Broker, tmp_path: Path
) -> None:
    topic = topic_name("crash")
    tp = TopicPartition(topic, 0)
    model: Model = {}
    # A short transaction timeout: whichever comes first, the successor or the coordinator's timeout, aborts
    # the transaction the broker crash left in doubt. The commit to the dead broker fails after the request
    # timeout, so that is short too (ample for the commits before it).
    with KafkaChangelog(
        own_broker.bootstrap, request_timeout=20.0, restore_stall_timeout=120.0, transaction_timeout_ms=10_000
    ) as c:
        c.create_topics({topic: 1})
        rng = random.Random(3)
        p = c.producer(f"w-{topic}")
        for i in range(25):
            records = [(b"k%05d" % rng.randrange(20_000), b"v%d-%d" % (i, j) * 8) for j in range(2_000)]
            p.begin()
            for k, v in records:
                p.send(topic, 0, k, v)
            p.commit()
            apply(model, records)
        # SIGKILL during an exactly-once commit: the commit fails or succeeds, never half.
        p.begin()
        doomed = [(b"k%05d" % i, b"IN-DOUBT") for i in range(1000)]
        for k, v in doomed:
            p.send(topic, 0, k, v)
        p.flush()
        own_broker.kill()
        with pytest.raises(StateStoreError):
            p.commit()
        # The failed commit may still complete: closing leaves the transaction to the successor below,
        # and says nothing (the client's own close() would try to abort it, fail and warn).
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            p.close()
        warned = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        assert not warned, warned
    own_broker.restart()
    with KafkaChangelog(own_broker.bootstrap, request_timeout=60.0, restore_stall_timeout=120.0) as c:
        successor = c.producer(f"w-{topic}")  # aborts the in-doubt transaction if the broker did not
        successor.close()
        deadline = time.monotonic() + 30  # the abort marker is written after init_transactions returns
        while c.offsets(tp)[2] < c.offsets(tp)[1] and time.monotonic() < deadline:
            time.sleep(0.2)
        # Seen once under load: the broker restarted after the SIGKILL kept the in-doubt transaction open
        # (its partition's producer state says open, its coordinator did not abort it): the last stable
        # offset stays below it, so a restore stops there and still holds nothing of it (asserted below).
        store = tmp_path / "store"
        out: dict[str, Any] = {}

        def run() -> None:
            try:
                out["result"] = restore_store(store, c, tp, mode="replay")
            except StateStoreError as e:
                out["error"] = e

        t = threading.Thread(target=run)
        t.start()
        time.sleep(0.5)
        own_broker.kill()  # during the restore
        time.sleep(1.0)
        own_broker.restart()
        t.join(180)
        assert not t.is_alive(), "the restore hung after the broker came back"
        # The restore either finished across the restart or failed cleanly; either way a second call completes it.
        r = restore_store(store, c, tp)
        assert r.offset is not None and r.end_offset == c.offsets(tp)[2]
        data = store_contents(store).data
        assert data == model, "after the broker crashes the store is not the committed changelog"
        assert all(v != b"IN-DOUBT" for v in data.values())


def test_a_broker_that_stays_down_is_a_clear_error_within_the_timeout(
    own_broker: Broker, tmp_path: Path
) -> None:
    topic = topic_name("down")
    with KafkaChangelog(own_broker.bootstrap, request_timeout=5.0, restore_stall_timeout=5.0) as c:
        c.create_topics({topic: 1})
        own_broker.stop()
        t0 = time.monotonic()
        with pytest.raises(LogError, match=own_broker.bootstrap.replace(".", r"\.")):
            restore_store(tmp_path / "s", c, TopicPartition(topic, 0))
        assert time.monotonic() - t0 < 30, "the error took far longer than the configured timeout"
