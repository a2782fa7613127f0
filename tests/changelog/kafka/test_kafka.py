"""Kafka as the changelog, against Apache Kafka 4.4 started on 127.0.0.1: restore, offsets, markers,
fencing, topics, corruption handling. Aborted data and broker faults: test_kafka_broker_semantics.py.
"""

from __future__ import annotations

import random
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from statestore import SegmentLog, TaskId, TopicPartition, restore_many, restore_store
from statestore.errors import LogError, ProducerFencedError, TaskCorruptedError
from statestore.processing.task_manager import TaskManager
from statestore.restore.engine import RestoreSpec
from statestore.restore.topic_ids import recorded_topic_id
from statestore.state.directory import StateDirectory
from support.kafka_writes import settle
from support.model import store_difference
from support.tasks import Events

kafka = pytest.importorskip("statestore.changelog.kafka")
KafkaChangelog = kafka.KafkaChangelog
ensure_changelog_topics = kafka.ensure_changelog_topics


@pytest.fixture
def changelog(kafka_bootstrap: str) -> Iterator[KafkaChangelog]:
    c = KafkaChangelog(kafka_bootstrap, request_timeout=20.0, restore_stall_timeout=20.0)
    yield c
    c.close()


def _topic(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


Rec = tuple[bytes, bytes | None]


def _workload(seed: int, n: int, keys: int) -> list[list[Rec]]:
    """Transactions of random puts and tombstones over ``keys`` keys."""
    rng = random.Random(seed)
    txns: list[list[Rec]] = []
    while sum(map(len, txns)) < n:
        size = rng.randrange(1, 700)
        txns.append(
            [
                (
                    b"k%05d" % rng.randrange(keys),
                    None if rng.random() < 0.07 else b"v%d-%d" % (len(txns), i) * rng.randrange(1, 4),
                )
                for i in range(size)
            ]
        )
    return txns


def _write_both(kc: KafkaChangelog, seg: SegmentLog, tp: TopicPartition, txns: list[list[Rec]]) -> None:
    """The same transactions to the Kafka topic and the segment log, then check their offsets agree."""
    kp, sp = kc.producer(f"w-{tp.topic}"), seg.producer("w")
    for txn in txns:
        kp.begin()
        sp.begin()
        for k, v in txn:
            kp.send(tp.topic, tp.partition, k, v)
            sp.send(tp.topic, tp.partition, k, v)
        kp.commit()
        sp.commit()
    kp.close()
    sp.close()


def _same_store(a: Path, b: Path) -> None:
    diff = store_difference(a, b)
    assert diff is None, diff


def test_restore_from_kafka_equals_restore_from_a_segment_log(
    changelog: KafkaChangelog, tmp_path: Path
) -> None:
    topic = _topic()
    changelog.create_topics({topic: 2})
    seg = SegmentLog(tmp_path / "log", sync=False)
    txns = {p: _workload(p + 7, 12_000 + 3_000 * p, 2_000) for p in range(2)}
    for p in range(2):
        _write_both(changelog, seg, TopicPartition(topic, p), txns[p])
    for p in range(2):
        tp = TopicPartition(topic, p)
        # Transaction markers occupy offsets in both logs alike.
        assert changelog.offsets(tp) == seg.offsets(tp)
        assert changelog.end_offset(tp) == sum(map(len, txns[p])) + len(txns[p])

    for mode in ("bulk", "replay"):
        for p in range(2):
            tp = TopicPartition(topic, p)
            a = restore_store(tmp_path / f"seg-{mode}-{p}", seg, tp, mode=mode)
            events = Events()
            b = restore_store(
                tmp_path / f"kafka-{mode}-{p}",
                changelog,
                tp,
                mode=mode,
                listener=events,
                progress_interval=0.0,
            )
            assert (b.mode, b.records_applied, b.start_offset, b.end_offset, b.offset) == (
                a.mode,
                a.records_applied,
                a.start_offset,
                a.end_offset,
                a.offset,
            )
            assert b.records_applied == sum(map(len, txns[p]))
            assert b.offset == changelog.end_offset(tp) - 2, (
                "the last record sits just before the last marker"
            )
            _same_store(tmp_path / f"seg-{mode}-{p}", tmp_path / f"kafka-{mode}-{p}")
            assert events.calls[0][0] == "start" and events.calls[-1][0] == "end"

    # restore_many on threads, in two steps: up to a middle offset, then the rest (resume from the store's offset).
    specs = [
        RestoreSpec(tmp_path / f"many-{p}", changelog, TopicPartition(topic, p), end_offset=5_001)
        for p in range(2)
    ]
    first = restore_many(specs, threads=2)
    assert all(r.ok for r in first), [r.error for r in first]
    rest = restore_many([RestoreSpec(s.store_path, changelog, s.tp) for s in specs], threads=2)
    for p, (r1, r2) in enumerate(zip(first, rest, strict=True)):
        assert r2.ok, r2.error
        assert r2.mode == "replay" and r2.start_offset == r1.offset + 1
        _same_store(tmp_path / f"seg-bulk-{p}", tmp_path / f"many-{p}")

    # The Python reader sees the same records as the segment log's.
    tp = TopicPartition(topic, 1)
    assert [(r.offset, r.key, r.value) for r in changelog.read(tp)] == [
        (r.offset, r.key, r.value) for r in seg.read(tp)
    ]


def test_restore_resumes_after_the_stored_offset_and_steps_over_the_final_marker(
    changelog: KafkaChangelog, tmp_path: Path
) -> None:
    topic = _topic()
    changelog.create_topics({topic: 1})
    tp = TopicPartition(topic, 0)
    p = changelog.producer("r")
    for i in range(3):
        p.begin()
        p.send(topic, 0, b"k%d" % i, b"%d" % i)
        p.commit()
    p.close()
    settle(changelog, tp)
    # offsets: 0 data, 1 marker, 2 data, 3 marker, 4 data, 5 marker
    assert changelog.offsets(tp) == (0, 6, 6)
    r = restore_store(tmp_path / "s", changelog, tp, end_offset=3)
    assert (r.records_applied, r.offset, r.end_offset) == (2, 2, 3)
    r = restore_store(tmp_path / "s", changelog, tp)
    assert (r.mode, r.start_offset, r.records_applied, r.offset, r.end_offset) == ("replay", 3, 1, 4, 6)
    again = restore_store(tmp_path / "s", changelog, tp)
    assert again.records_applied == 0 and again.offset == 4


def test_a_start_offset_beyond_the_log_is_task_corruption(changelog: KafkaChangelog, tmp_path: Path) -> None:
    topic = _topic()
    changelog.create_topics({topic: 1})
    p = changelog.producer()
    for i in range(5):
        p.send(topic, 0, b"k%d" % i, b"v")
    p.close()
    with pytest.raises(TaskCorruptedError, match=r"offset 9 is out of range \[0, 5\]"):
        changelog.restore_feed(topic, 0, 9)
    # Through the engine a fed changelog's exception keeps its class.
    r = restore_many([RestoreSpec(tmp_path / "s", changelog, TopicPartition(topic, 0), end_offset=5)])[0]
    assert r.ok and r.offset == 4
    with pytest.raises(LogError, match="does the topic exist"):
        restore_store(tmp_path / "t", changelog, TopicPartition(_topic("missing"), 0))


def test_a_changelog_topic_recreated_behind_the_store_is_detected_and_rebuilt(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    app = f"app{uuid.uuid4().hex[:8]}"
    topic = f"{app}-s-changelog"
    task, tp = TaskId(0, 0), TopicPartition(topic, 0)

    def changelog() -> KafkaChangelog:
        return KafkaChangelog(kafka_bootstrap, request_timeout=20.0)

    def manager(changelog: KafkaChangelog) -> TaskManager:
        return TaskManager(
            StateDirectory(tmp_path / "state", app), changelog, ["s"], guarantee="exactly_once_v2"
        )

    # Each party has its own clients, as separate processes would: the application before and
    # after its restart, and an operator who recreates the topic in between.
    first = changelog()
    ensure_changelog_topics(first, app, ["s"], 1)
    tm = manager(first)
    tm.start()
    tm.assign([task], [])
    assert tm.restore()
    view = tm.active_task(task).store("s")
    for i in range(200):
        view.put(b"old%d" % (i % 50), b"%d" % i)
    tm.commit()
    stored = dict(view)
    tm.close()
    tm.directory.close()
    first.close()
    assert len(stored) == 50

    # The topic is deleted and recreated with fewer records: the store's offset is beyond its end.
    with changelog() as operator:
        operator.delete_topics([topic])
        ensure_changelog_topics(operator, app, ["s"], 1)
        with operator.producer() as p:
            new = {b"new%d" % i: b"n%d" % i for i in range(20)}
            for k, v in new.items():
                p.send(topic, 0, k, v)
        assert operator.end_offset(tp) == 20

    second = changelog()
    tm = manager(second)
    tm.start()  # the startup check finds offset 200+ outside [0, 20): wiped before any assignment
    tm.assign([task], [])
    assert tm.restore()
    assert dict(tm.active_task(task).store("s")) == new
    assert tm.active_task(task).offsets()[tp] == 19
    tm.close()
    tm.directory.close()
    second.close()


@pytest.mark.parametrize(
    "after",
    [
        "same_client",
        "another_store_from_scratch",
        "restarted",
        "restarted_many",
        "restarted_many_beside_one_from_scratch",
    ],
)
def test_a_recreated_topic_is_task_corrupted_never_read_on(
    changelog: KafkaChangelog,
    kafka_bootstrap: str,
    tmp_path: Path,
    after: str,
    request: pytest.FixtureRequest,
) -> None:
    # The new topic holds more records than the store's offset, so offsets alone cannot tell: the
    # topic's id (Metadata v10+, Fetch v13+ by id) does, as the client remembers it while it lives
    # and as the file beside the store keeps it for the store (another store of the partition read
    # from scratch first, or a restarted process with a new client).
    assert changelog.native is not None
    topic = _topic("recreated")
    tp = TopicPartition(topic, 0)

    def write(prefix: bytes, n: int) -> None:
        with changelog.producer() as p:
            for i in range(n):
                p.send(topic, 0, b"%s%d" % (prefix, i % 40), b"%s-%d" % (prefix, i))
        deadline = time.monotonic() + 20
        while changelog.end_offset(tp) != n:
            assert time.monotonic() < deadline, changelog.end_offset(tp)
            time.sleep(0.05)

    changelog.create_topics({topic: 1})
    write(b"old", 100)
    r = restore_store(tmp_path / "s", changelog, tp, end_offset=50)
    assert r.offset == 49
    changelog.delete_topics([topic])
    changelog.create_topics({topic: 1})
    write(b"new", 300)
    if after == "another_store_from_scratch":
        assert restore_store(tmp_path / "other", changelog, tp).records_applied == 300
    if after.startswith("restarted"):
        changelog.close()
        changelog = KafkaChangelog(kafka_bootstrap, request_timeout=20.0, restore_stall_timeout=20.0)
        request.addfinalizer(changelog.close)
        assert changelog.native is not None
    if after.startswith("restarted_many"):  # as the task manager restores: the error is the store's result
        specs = [RestoreSpec(tmp_path / "s", changelog, tp)]
        if after.endswith("beside_one_from_scratch"):  # read first, on the one thread, under the new id
            specs.insert(0, RestoreSpec(tmp_path / "other", changelog, tp))
        *others, result = restore_many(specs, threads=1)
        assert isinstance(result.error, TaskCorruptedError) and "recreated" in str(result.error)
        assert [o.records_applied for o in others] == [300] * len(others)
        assert all(
            o.topic_id is not None and o.topic_id == recorded_topic_id(o.store_path, tp) for o in others
        )
    else:
        with pytest.raises(TaskCorruptedError, match="recreated"):
            restore_store(tmp_path / "s", changelog, tp)
    # Wiped, the store is restored from the new topic alone.
    shutil.rmtree(tmp_path / "s")
    r = restore_store(tmp_path / "s", changelog, tp)
    assert (r.offset, r.records_applied) == (299, 300)
    seg = SegmentLog(tmp_path / "log", sync=False)
    sp = seg.producer()
    for i in range(300):
        sp.send(topic, 0, b"new%d" % (i % 40), b"new-%d" % i)
    sp.close()
    restore_store(tmp_path / "expected", seg, tp)
    assert store_difference(tmp_path / "expected", tmp_path / "s") is None


@pytest.mark.parametrize("copied", [True, False], ids=["id-copied", "copy-failed"])
def test_a_store_restored_in_a_staging_directory_keeps_its_topic_id_when_put_in_place(
    changelog: KafkaChangelog,
    kafka_bootstrap: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    copied: bool,
) -> None:
    # What a Spark task runs: the store is restored in a copy and moved into place, its topic id with
    # it. The copy's restore is held to the store's own id even when the id's file was not copied.
    from statestore.restore import staging, topic_ids
    from statestore.restore.staging import restore_partition

    app = f"app{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(f"{app}-s-changelog", 0)
    args = {
        "kafka": {"bootstrap.servers": kafka_bootstrap},
        "state_dir": tmp_path / "state",
        "application_id": app,
        "store": "s",
        "partition": 0,
    }

    def write(n: int) -> None:
        with changelog.producer() as p:
            for i in range(n):
                p.send(tp.topic, 0, b"k%d" % (i % 30), b"v%d" % i)

    changelog.create_topics({tp.topic: 1})
    write(60)
    row = restore_partition(**args)  # type: ignore[arg-type]
    assert (row.status, row.records_applied) == ("ok", 60), row.error
    store = tmp_path / "state" / app / "0_0" / "rocksdb" / "s"
    assert topic_ids.recorded_topic_id(store, tp) is not None
    assert not list((tmp_path / "state" / app / "0_0").rglob("*.topic-id.tmp"))
    changelog.delete_topics([tp.topic])
    changelog.create_topics({tp.topic: 1})
    write(200)
    if not copied:  # as when writing the copy fails (a warning)
        monkeypatch.setattr(staging.topic_ids, "copy", lambda src, dst: None)
    # Another executor: a client of its own, which never read the partition.
    args["kafka"] = {"bootstrap.servers": kafka_bootstrap, "client.id": "another-executor"}
    row = restore_partition(**args)  # type: ignore[arg-type]
    assert row.status == "failed" and "recreated" in (row.error or ""), row


def test_exactly_once_commits_record_delivered_offsets_and_restart_replays_nothing(
    changelog: KafkaChangelog, tmp_path: Path
) -> None:
    app = f"app{uuid.uuid4().hex[:8]}"
    ensure_changelog_topics(changelog, app, ["s"], 2)
    tasks = [TaskId(0, 0), TaskId(0, 1)]

    def manager(events: Events | None = None) -> TaskManager:
        return TaskManager(
            StateDirectory(tmp_path / "state", app),
            changelog,
            ["s"],
            guarantee="exactly_once_v2",
            listener=events,
        )

    tm = manager()
    tm.start()
    tm.assign(tasks, [])
    assert tm.restore()
    for round_ in range(3):
        for t in tasks:
            view = tm.active_task(t).store("s")
            for i in range(30):
                view.put(b"%d-%d" % (t.partition, i), b"r%d" % round_)
        tm.commit()
    expected = {t: dict(tm.active_task(t).store("s")) for t in tasks}
    for t in tasks:
        tp = TopicPartition(f"{app}-s-changelog", t.partition)
        # 3 transactions of 30 records, each followed by its marker: the last record is at 3*31 - 2.
        assert tm.active_task(t).offsets()[tp] == 91
        # The coordinator writes the last COMMIT marker after the commit returns.
        deadline = time.monotonic() + 10
        while changelog.end_offset(tp) < 93 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert changelog.end_offset(tp) == 93
    tm.close()
    tm.directory.close()

    events = Events()
    tm = manager(events)
    tm.start()
    tm.assign(tasks, [])
    assert tm.restore()
    assert events.total_restored() == 0, "the stores were up to date: nothing to replay"
    for t in tasks:
        assert dict(tm.active_task(t).store("s")) == expected[t]
    tm.close()
    tm.directory.close()

    # A wiped task restores everything from the broker.
    import shutil

    shutil.rmtree(tmp_path / "state" / app / "0_1")
    tm = manager()
    tm.start()
    tm.assign(tasks, [])
    assert tm.restore()
    assert dict(tm.active_task(tasks[1]).store("s")) == expected[tasks[1]]
    tm.close()
    tm.directory.close()


def test_a_newer_transactional_producer_fences_the_older(changelog: KafkaChangelog) -> None:
    topic = _topic()
    changelog.create_topics({topic: 1})
    old = changelog.producer("same-id")
    old.begin()
    old.send(topic, 0, b"a", b"1")
    old.flush()
    new = changelog.producer("same-id")  # fences `old` and aborts its transaction
    with pytest.raises(ProducerFencedError, match="same-id"):
        old.send(topic, 0, b"b", b"2")
        old.commit()
    new.begin()
    new.send(topic, 0, b"c", b"3")
    new.commit()
    assert new.take_offsets() == {TopicPartition(topic, 0): 2}, "offset 1 holds the abort marker"
    new.close()
    old.close()


def test_changelog_topics_are_created_compacted_and_a_partition_mismatch_is_refused(
    changelog: KafkaChangelog,
) -> None:
    app = f"app{uuid.uuid4().hex[:8]}"
    created = ensure_changelog_topics(changelog, app, ["a", "b"], 3)
    assert created == [f"{app}-a-changelog", f"{app}-b-changelog"]
    assert changelog.topic_partitions(f"{app}-a-changelog") == 3
    assert ensure_changelog_topics(changelog, app, ["a", "b"], 3) == []
    with pytest.raises(LogError, match=r"has 3 partitions but the application has 4 tasks"):
        ensure_changelog_topics(changelog, app, ["a"], 4)
    with pytest.raises(LogError, match="do not exist"):
        ensure_changelog_topics(changelog, app, ["c"], 3, create=False)
    from confluent_kafka.admin import ConfigResource

    res = ConfigResource(ConfigResource.Type.TOPIC, f"{app}-a-changelog")
    try:
        configs = changelog.admin().describe_configs([res])[res].result(10)
    except Exception as e:  # a broker without DescribeConfigs cannot show it
        pytest.skip(f"the broker cannot describe topic configs: {e}")
    assert configs["cleanup.policy"].value == "compact"


def test_a_standby_follows_the_committed_changelog_on_the_broker(
    changelog: KafkaChangelog, tmp_path: Path
) -> None:
    import time

    app = f"app{uuid.uuid4().hex[:8]}"
    ensure_changelog_topics(changelog, app, ["s"], 1)
    task, tp = TaskId(0, 0), TopicPartition(f"{app}-s-changelog", 0)
    active = TaskManager(StateDirectory(tmp_path / "a", app), changelog, ["s"], guarantee="exactly_once_v2")
    standby = TaskManager(StateDirectory(tmp_path / "b", app), changelog, ["s"], guarantee="exactly_once_v2")
    active.start()
    active.assign([task], [])
    assert active.restore()
    standby.start()
    standby.assign([], [task])
    view = active.active_task(task).store("s")
    for round_ in range(3):
        for i in range(40):
            view.put(b"k%d" % i, b"r%d" % round_)
        active.commit()
    written = active.active_task(task).offsets()[tp]
    assert written == 3 * 41 - 2
    deadline = time.monotonic() + 30
    while standby.task(task).offsets().get(tp) != written:
        assert time.monotonic() < deadline, f"standby stuck at {standby.task(task).offsets()}"
        standby.poll()
        time.sleep(0.01)
    active.close()
    active.directory.close()
    # The standby becomes active: its store already holds everything, nothing is replayed.
    events = Events()
    standby.updater.listener = events
    standby.assign([task], [])
    assert standby.restore(timeout=30)
    assert dict(standby.active_task(task).store("s")) == {b"k%d" % i: b"r2" for i in range(40)}
    assert events.total_restored() == 0
    standby.close()
    standby.directory.close()


def test_an_unreachable_broker_is_one_clear_error(tmp_path: Path) -> None:
    pytest.importorskip("confluent_kafka")
    with KafkaChangelog("127.0.0.1:1", request_timeout=1.0) as c:
        with pytest.raises(LogError, match=r"127\.0\.0\.1:1.*cannot read its offsets.*broker reachable"):
            c.offsets(TopicPartition("t", 0))
        with pytest.raises(LogError, match="cannot read its offsets"):
            restore_store(tmp_path / "s", c, TopicPartition("t", 0))


def test_client_properties_may_use_underscores_but_python_callbacks_keep_theirs() -> None:
    pytest.importorskip("confluent_kafka")
    with KafkaChangelog(
        "127.0.0.1:1", security_protocol="PLAINTEXT", error_cb=print, **{"client.id": "x"}
    ) as c:
        conf = c.client_config({"acks": "all"})
    assert conf["security.protocol"] == "PLAINTEXT" and conf["client.id"] == "x" and conf["acks"] == "all"
    assert conf["error_cb"] is print and "error.cb" not in conf
