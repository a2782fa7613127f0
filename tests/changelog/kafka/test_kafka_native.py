"""The native Kafka fetcher (``rust/src/kafka``) against Apache Kafka 4.4 on 127.0.0.1.

- It is the restore path of a ``KafkaChangelog`` (replay, bulk, ``restore_many``),
  and restores exactly what the segment log holding the same transactions
  restores, with the same skip counts (aborted records and markers), where the
  confluent-kafka path reports none.
- An aborted transaction whose records span many fetch responses (tiny
  ``max.partition.fetch.bytes``), interleaved with a committed one, is dropped
  whole; batches cut at the end of a response are fetched again.
- ``KafkaChangelog.read`` reads through the same fetcher.
- A SASL mechanism it does not speak falls back to confluent-kafka with one log line.
- ``restore_on_spark(kafka=...)`` restores every partition of every store on the executors.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statestore import SegmentLog, TopicPartition, _native, errors, restore_many, restore_store
from statestore.restore.engine import RestoreSpec
from support.kafka_writes import write_twins
from support.model import store_difference

kafka = pytest.importorskip("statestore.changelog.kafka")
KafkaChangelog = kafka.KafkaChangelog


Rec = tuple[bytes, bytes | None]


@pytest.fixture
def changelog(kafka_bootstrap: str) -> Iterator[Any]:
    c = KafkaChangelog(kafka_bootstrap, request_timeout=20.0, restore_stall_timeout=20.0)
    yield c
    c.close()


def _topic(prefix: str = "native") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _txn(rng: random.Random, n: int, keys: int, tag: str) -> list[Rec]:
    return [
        (b"k%05d" % rng.randrange(keys), None if rng.random() < 0.1 else f"{tag}-{i}".encode() * 3)
        for i in range(n)
    ]


def _same_store(a: Path, b: Path) -> None:
    diff = store_difference(a, b)
    assert diff is None, diff


def test_native_restore_equals_the_segment_log_with_skip_counts(
    changelog: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    assert changelog.native is not None, "the native fetcher serves a PLAINTEXT cluster"
    topic = _topic()
    changelog.create_topics({topic: 2})
    seg = SegmentLog(tmp_path / "log", sync=False)
    for p in range(2):
        write_twins(changelog, seg, TopicPartition(topic, p), seed=p, rounds=12)
    tp = TopicPartition(topic, 0)
    # Offsets come from ListOffsets (earliest, latest, latest under read_committed).
    assert changelog.offsets(tp) == seg.offsets(tp)
    fallback = KafkaChangelog(kafka_bootstrap, native=False, request_timeout=20.0)
    try:
        assert fallback.native is None
        for mode in ("bulk", "replay"):
            a = restore_store(tmp_path / f"seg-{mode}", seg, tp, mode=mode)
            b = restore_store(tmp_path / f"kafka-{mode}", changelog, tp, mode=mode)
            c = restore_store(tmp_path / f"ck-{mode}", fallback, tp, mode=mode)
            assert (b.mode, b.records_applied, b.start_offset, b.end_offset, b.offset) == (
                a.mode,
                a.records_applied,
                a.start_offset,
                a.end_offset,
                a.offset,
            )
            # The native fetcher sees markers and aborted batches and counts them as the segment log does.
            assert b.records_skipped == a.records_skipped
            assert b.records_skipped.aborted > 0 and b.records_skipped.control > 0
            assert c.records_skipped.aborted == 0, "confluent-kafka hides what it skips"
            assert c.records_applied == b.records_applied
            _same_store(tmp_path / f"seg-{mode}", tmp_path / f"kafka-{mode}")
            _same_store(tmp_path / f"seg-{mode}", tmp_path / f"ck-{mode}")
    finally:
        fallback.close()

    # restore_many on two threads, in two steps (to a middle offset, then resume from the store's offset).
    mid = changelog.end_offset(tp) // 2
    specs = [
        RestoreSpec(tmp_path / f"many-{p}", changelog, TopicPartition(topic, p), end_offset=mid)
        for p in range(2)
    ]
    first = restore_many(specs, threads=2)
    assert all(r.ok for r in first), [r.error for r in first]
    rest = restore_many([RestoreSpec(s.store_path, changelog, s.tp) for s in specs], threads=2)
    for p, r in enumerate(rest):
        assert r.ok, r.error
        restore_store(tmp_path / f"seg-many-{p}", seg, TopicPartition(topic, p))
        _same_store(tmp_path / f"seg-many-{p}", tmp_path / f"many-{p}")

    # read() goes through the same fetcher: the records, timestamps and headers of the segment log.
    assert [(r.offset, r.key, r.value) for r in changelog.read(tp)] == [
        (r.offset, r.key, r.value) for r in seg.read(tp)
    ]
    assert changelog.committed_records(tp, 0, changelog.end_offset(tp)) == seg.committed_records(
        tp, 0, seg.end_offset(tp)
    )


def test_an_aborted_transaction_spanning_many_fetch_responses_is_dropped_whole(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    # 2 KiB responses: every transaction below spans many of them, and batches are cut at their ends.
    small = KafkaChangelog(
        kafka_bootstrap,
        request_timeout=20.0,
        restore_stall_timeout=20.0,
        **{"max.partition.fetch.bytes": "2048"},
    )
    try:
        topic = _topic("span")
        small.create_topics({topic: 1})
        tp = TopicPartition(topic, 0)
        seg = SegmentLog(tmp_path / "log", sync=False)
        write_twins(small, seg, tp, seed=9, rounds=6)
        for mode in ("replay", "bulk"):
            a = restore_store(tmp_path / f"seg-{mode}", seg, tp, mode=mode)
            b = restore_store(tmp_path / f"kafka-{mode}", small, tp, mode=mode)
            assert (b.records_applied, b.offset, b.records_skipped) == (
                a.records_applied,
                a.offset,
                a.records_skipped,
            )
            assert b.records_skipped.aborted > 500
            _same_store(tmp_path / f"seg-{mode}", tmp_path / f"kafka-{mode}")
    finally:
        small.close()


@pytest.mark.parametrize("native", [True, False], ids=["native", "confluent-kafka"])
def test_a_cluster_that_does_not_answer_is_changelog_unavailable_never_a_plain_log_error(
    tmp_path: Path, native: bool
) -> None:
    """Nothing listens: offsets and a restore fail with ``ChangelogUnavailableError`` within the
    request budget (the application rides that out within its ``task_timeout``; any other
    ``LogError`` stops it), and the store is left as it was."""
    c = KafkaChangelog("127.0.0.1:1", request_timeout=1.0, restore_stall_timeout=1.0, native=native)
    try:
        with pytest.raises(errors.ChangelogUnavailableError, match=r"127\.0\.0\.1:1"):
            c.offsets(TopicPartition("t", 0))
        with pytest.raises(errors.ChangelogUnavailableError, match="t-0"):
            restore_store(tmp_path / "s", c, TopicPartition("t", 0))
        assert not (tmp_path / "s").exists()
    finally:
        c.close()


def test_unsupported_sasl_mechanisms_fall_back_to_confluent_kafka_with_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="statestore.changelog.kafka.source"):
        c = KafkaChangelog("127.0.0.1:1", security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER")
    try:
        assert c.native is None
        lines = [r.getMessage() for r in caplog.records if r.name == "statestore.changelog.kafka.source"]
        assert len(lines) == 1 and "OAUTHBEARER" in lines[0] and "confluent-kafka" in lines[0], lines
    finally:
        c.close()
    assert (
        _native.KafkaClient.unsupported(
            {"bootstrap.servers": "h:1", "security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"}
        )
        is not None
    )
    assert (
        _native.KafkaClient.unsupported(
            {
                "bootstrap.servers": "h:1",
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": "u",
                "sasl.password": "p",
            }
        )
        is None
    )


@pytest.mark.spark
def test_restore_on_spark_from_kafka(
    spark: Any, changelog: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    from statestore.restore.spark import restore_on_spark

    app = f"app{uuid.uuid4().hex[:6]}"
    stores = ["a", "b"]
    kafka.ensure_changelog_topics(changelog, app, stores, 2)
    seg = SegmentLog(tmp_path / "log", sync=False)
    for i, s in enumerate(stores):
        for p in range(2):
            write_twins(changelog, seg, TopicPartition(f"{app}-{s}-changelog", p), seed=10 * i + p, rounds=3)
    df = restore_on_spark(
        spark,
        kafka={"bootstrap.servers": kafka_bootstrap},
        state_dir=tmp_path / "state",
        application_id=app,
        stores=stores,
    )
    rows = df.collect()
    assert len(rows) == 4 and all(r.status == "ok" for r in rows), [r.error for r in rows]
    for r in rows:
        tp = TopicPartition(r.topic, r.partition)
        ref = restore_store(tmp_path / f"ref-{r.topic}-{r.partition}", seg, tp)
        assert r.records_applied == ref.records_applied and r.records_skipped == ref.records_skipped.total > 0
        assert r.lag == 0
        _same_store(
            tmp_path / f"ref-{r.topic}-{r.partition}",
            tmp_path / "state" / app / f"0_{r.partition}" / "rocksdb" / r.store,
        )


def test_the_synthetic_producer_writes_what_the_segment_log_writer_writes(
    changelog: Any, tmp_path: Path
) -> None:
    """``_testing.produce_synthetic_changelog`` (the benchmarks' fast producer, ``kafka::produce``) puts the
    records ``write_synthetic_changelog`` writes to a segment log on the broker, in the same order, over
    batches of at most 1 MB and several requests in flight; a bad argument raises, naming it."""
    topic = _topic("synthetic")
    changelog.create_topics({topic: 1})
    tp = TopicPartition(topic, 0)
    records, keys = 60_000, 6_000  # ~8 MB: 8 batches of <= 1 MB, more than IN_FLIGHT (5) requests unanswered
    sent = _native._testing.produce_synthetic_changelog(changelog.native, topic, 0, records, keys, seed=7)
    assert sent == records
    assert changelog.offsets(tp) == (0, records, records)
    seg = SegmentLog(tmp_path / "log", sync=False)
    _native._testing.write_synthetic_changelog(tmp_path / "log", topic, 0, records, keys, seed=7)
    got = [(r.offset, r.timestamp, r.key, r.value) for r in changelog.read(tp)]
    want = [(r.offset, r.timestamp, r.key, r.value) for r in seg.read(tp)]
    assert len(got) == records and got == want
    for mode in ("bulk", "replay"):
        restore_store(tmp_path / f"kafka-{mode}", changelog, tp, mode=mode)
    _same_store(tmp_path / "kafka-bulk", tmp_path / "kafka-replay")
    with pytest.raises(errors.LogError, match="acks must be 1 or -1"):
        _native._testing.produce_synthetic_changelog(changelog.native, topic, 0, 10, 10, acks=0)
    with pytest.raises(errors.LogError, match="at least one key"):
        _native._testing.produce_synthetic_changelog(changelog.native, topic, 0, 10, 0)
    assert changelog.offsets(tp) == (0, records, records), "nothing written by a refused call"
