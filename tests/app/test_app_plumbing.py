"""The small pieces the runner adds below it, against the broker:

* ``KafkaProducer.send_offsets``: input positions committed with the transaction, or not at all;
* ``RecordCollector.renew``: a fenced (fatal) producer replaced by a new one of the same transactional id;
* ``ensure_changelog_topics`` run by two instances at once (both succeed);
* ``TaskManager.poll(commit=False)`` leaves committing to the caller;
* the runner after a failed commit: the transaction aborted, staged writes dropped, the input sought
  back -- the output still counts every record exactly once; after a fenced producer: every task
  starts again from its last commit, exactly once too; a batch slower than the transaction timeout
  commits within itself;
* a state directory in use by another instance, a second instance with the same instance id.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import confluent_kafka as ck
import pytest
from app_tools import create_topics, expected_outputs, output_by_key, produce, read_committed, unique
from counting_app import count

from statestore import TaskId, TopicPartition
from statestore.app import App, Context, Record
from statestore.changelog.kafka import KafkaChangelog, KafkaProducer, ensure_changelog_topics
from statestore.errors import (
    ApplicationError,
    ChangelogUnavailableError,
    LockError,
    LogError,
    ProducerFencedError,
    TransactionInDoubtError,
)
from statestore.processing.record_collector import RecordCollector
from statestore.processing.task_manager import TaskManager


def committed_offset(bootstrap: str, group: str, topic: str) -> int:
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed"})
    try:
        [tp] = c.committed([ck.TopicPartition(topic, 0)], timeout=20)
        return int(tp.offset)
    finally:
        c.close()


def test_send_offsets_commits_input_positions_with_the_transaction_only(kafka_bootstrap: str) -> None:
    inp, group = unique("so-in"), unique("so-group")
    create_topics(kafka_bootstrap, {inp: 1})
    consumer = ck.Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    consumer.subscribe([inp])
    deadline = time.monotonic() + 30
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(0.1)
    with KafkaChangelog(kafka_bootstrap) as changelog:
        p = changelog.producer(unique("so-tid"))
        p.begin()
        p.send_offsets({TopicPartition(inp, 0): 5}, consumer.consumer_group_metadata())
        p.abort()
        assert committed_offset(kafka_bootstrap, group, inp) < 0
        p.begin()
        p.send_offsets({TopicPartition(inp, 0): 7}, consumer.consumer_group_metadata())
        p.commit()
        assert committed_offset(kafka_bootstrap, group, inp) == 7
        with pytest.raises(LogError, match="outside a transaction"):
            p.send_offsets({TopicPartition(inp, 0): 8}, consumer.consumer_group_metadata())
        p.close()
    consumer.close()


def test_a_fenced_producer_is_fatal_and_renewed_under_the_same_transactional_id(kafka_bootstrap: str) -> None:
    topic, tid = unique("renew"), unique("renew-tid")
    create_topics(kafka_bootstrap, {topic: 1})
    with KafkaChangelog(kafka_bootstrap) as changelog:
        collector = RecordCollector(changelog, tid)
        collector.send(TopicPartition(topic, 0), b"k", b"lost")
        other = changelog.producer(tid)  # fences the collector's producer and aborts its transaction
        with pytest.raises(ProducerFencedError):
            collector.commit()
        assert collector.failed
        other.close()
        collector.renew()
        assert not collector.failed
        assert isinstance(collector.producer, KafkaProducer) and collector.producer.transactional_id == tid
        collector.send_record(topic, -1, b"k", b"kept")
        collector.commit()
        collector.close()
    assert [m.value() for m in read_committed(kafka_bootstrap, topic, 1)] == [b"kept"]


def test_two_instances_creating_the_changelog_topics_at_once_both_succeed(kafka_bootstrap: str) -> None:
    app_id = unique("race")
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def ensure() -> None:
        with KafkaChangelog(kafka_bootstrap) as changelog:
            start.wait()
            try:
                ensure_changelog_topics(changelog, app_id, ["a", "b"], 3)
            except BaseException as e:
                errors.append(e)

    threads = [threading.Thread(target=ensure) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with KafkaChangelog(kafka_bootstrap) as changelog:
        assert changelog.topic_partitions(f"{app_id}-a-changelog") == 3
        with pytest.raises(LogError, match="has 3 partitions"):
            ensure_changelog_topics(changelog, app_id, ["a"], 4)


def test_poll_without_commit_leaves_committing_to_the_caller(kafka_bootstrap: str, tmp_path: Path) -> None:
    app_id = unique("nocommit")
    with KafkaChangelog(kafka_bootstrap) as changelog:
        ensure_changelog_topics(changelog, app_id, ["s"], 1)
        tm = TaskManager(
            tmp_path,
            changelog,
            ["s"],
            guarantee="exactly_once_v2",
            application_id=app_id,
            commit_interval_ms=0,
        )
        tm.assign(active=[TaskId(0, 0)], standby=[])
        assert tm.restore(timeout=30)
        task = tm.active_task(TaskId(0, 0))
        task.store("s").put(b"k", b"v")
        tm.poll(commit=False)
        assert task.commit_needed  # not committed behind the caller's back
        tm.close_lost([TaskId(0, 0)])  # dirty: nothing committed, the task gone
        assert tm.active_tasks() == {}
        tm.close()


def test_a_failed_commit_rolls_back_and_every_record_still_counts_once(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app_id, inp, out = unique("fail-app"), unique("fail-in"), unique("fail-out")
    create_topics(kafka_bootstrap, {inp: 2, out: 2})
    records = [(i % 2, b"k%d" % (i % 6), b"%d" % i) for i in range(400)]
    produce(kafka_bootstrap, inp, records)
    real_commit = KafkaProducer.commit
    calls = {"n": 0}

    def failing_commit(self: KafkaProducer) -> None:
        calls["n"] += 1
        if calls["n"] in (2, 4):
            raise LogError("injected: the transaction's commit failed")
        real_commit(self)

    monkeypatch.setattr(KafkaProducer, "commit", failing_commit)
    app = App(
        app_id,
        kafka_bootstrap,
        input_topics=[inp],
        output_topics=[out],
        stores=["agg"],
        process=count,
        state_dir=tmp_path / "state",
        commit_interval_ms=0,
        max_poll_records=37,
    )
    app.start()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60:
        app.poll_once()  # commits after every batch of at most 37 records
        if all(app._committed.get(TopicPartition(inp, p)) == 200 for p in (0, 1)):
            break
    app.close()
    assert app.aborts >= 2, f"the injected failures did not abort ({calls})"
    want = expected_outputs(records)
    got = output_by_key(read_committed(kafka_bootstrap, out, 2))
    assert {k: len(v) for k, v in got.items()} == {k: len(v) for k, v in want.items()}
    assert got == want


def test_a_fenced_producer_restarts_every_task_from_its_last_commit(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit finds the producer fenced (as after the broker aborted a transaction that outlived its
    timeout): the instance does not stop; its tasks close dirty and start again from their last commit."""
    app_id, inp, out = unique("fenced-app"), unique("fenced-in"), unique("fenced-out")
    create_topics(kafka_bootstrap, {inp: 2, out: 2})
    records = [(i % 2, b"k%d" % (i % 6), b"%d" % i) for i in range(300)]
    produce(kafka_bootstrap, inp, records)
    real_commit = KafkaProducer.commit
    calls = {"n": 0}

    def fenced_commit(self: KafkaProducer) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            self._fenced = True  # as _error() marks it
            raise ProducerFencedError("injected: fenced by a newer producer with the same transactional id")
        real_commit(self)

    monkeypatch.setattr(KafkaProducer, "commit", fenced_commit)
    app = App(
        app_id,
        kafka_bootstrap,
        input_topics=[inp],
        output_topics=[out],
        stores=["agg"],
        process=count,
        state_dir=tmp_path / "state",
        commit_interval_ms=0,
        max_poll_records=29,
    )
    app.start()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60:
        app.poll_once()
        if all(app._committed.get(TopicPartition(inp, p)) == 150 for p in (0, 1)):
            break
    app.close()
    assert app.migrations == 1
    assert output_by_key(read_committed(kafka_bootstrap, out, 2)) == expected_outputs(records)


def test_a_state_directory_in_use_is_refused(kafka_bootstrap: str, tmp_path: Path) -> None:
    app_id, inp, out = unique("lock-app"), unique("lock-in"), unique("lock-out")
    create_topics(kafka_bootstrap, {inp: 1, out: 1})
    first = App(
        app_id,
        kafka_bootstrap,
        input_topics=[inp],
        output_topics=[out],
        stores=["agg"],
        process=count,
        state_dir=tmp_path / "state",
    )
    first.start()
    try:
        second = App(
            app_id,
            kafka_bootstrap,
            input_topics=[inp],
            output_topics=[out],
            stores=["agg"],
            process=count,
            state_dir=tmp_path / "state",
        )
        with pytest.raises(LockError, match="is in use by process"):
            second.start()
    finally:
        first.close()


def test_a_second_instance_with_the_same_instance_id_stops_the_first(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Static membership (``instance_id``): the newer member takes the id over; the older one is fenced
    by the group coordinator and stops with ``ApplicationError``, committing nothing more."""
    app_id, inp, out = unique("static-app"), unique("static-in"), unique("static-out")
    create_topics(kafka_bootstrap, {inp: 2, out: 2})

    def make(state: str) -> App:
        return App(
            app_id,
            kafka_bootstrap,
            input_topics=[inp],
            output_topics=[out],
            stores=["agg"],
            process=count,
            state_dir=tmp_path / state,
            instance_id="one",
            consumer_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
        )

    first, second = make("a"), make("b")
    errors: list[BaseException] = []

    def run_first() -> None:
        try:
            t0 = time.monotonic()
            first.run(until=lambda: time.monotonic() - t0 > 60, handle_signals=False)
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=run_first)
    thread.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not first.active_tasks():
        time.sleep(0.1)
    assert first.active_tasks(), "the first instance never got its tasks"
    second.start()
    t0 = time.monotonic()
    while thread.is_alive() and time.monotonic() - t0 < 45:
        second.poll_once()
    second.close()
    thread.join(timeout=60)
    assert len(errors) == 1 and isinstance(errors[0], ApplicationError), errors
    assert "fenced by other consumer with same group.instance.id" in str(errors[0]), errors[0]


def test_standby_placement_follows_the_range_assignor_without_the_owner() -> None:
    from statestore.app.runner import range_owner, standby_members

    members = ["a", "b", "c"]
    assert [range_owner(members, p, 4) for p in range(4)] == ["a", "a", "b", "c"]
    assert [range_owner(members, p, 6) for p in range(6)] == ["a", "a", "b", "b", "c", "c"]
    assert [range_owner(members, p, 2) for p in range(2)] == ["a", "b"]
    # Task 3 owned by c: without c, range over (a, b) gives partition 3 to b.
    assert standby_members(members, "c", 3, 4, 1) == ["b"]
    assert standby_members(members, "c", 3, 4, 2) == ["b", "a"]
    assert standby_members(members, "a", 0, 4, 5) == ["b", "c"]  # never more than the other members
    assert standby_members(["a"], "a", 0, 4, 1) == []
    for owner in members:
        for p in range(4):
            assert owner not in standby_members(members, owner, p, 4, 2)


class _LeaderStub:
    """A consumer's metadata and watermark calls: partition ``p`` of every topic is led by broker
    ``leaders[p]``; records the partitions whose watermarks were asked for."""

    def __init__(self, leaders: dict[int, int], fail: bool = False) -> None:
        self.leaders, self.fail, self.asked = leaders, fail, []

    def list_topics(self, topic: str, timeout: float) -> object:
        from types import SimpleNamespace

        if self.fail:
            raise ck.KafkaException(ck.KafkaError(ck.KafkaError._TRANSPORT))
        parts = {p: SimpleNamespace(leader=b) for p, b in self.leaders.items()}
        return SimpleNamespace(topics={topic: SimpleNamespace(partitions=parts)})

    def get_watermark_offsets(self, tp: ck.TopicPartition, timeout: float, cached: bool) -> tuple[int, int]:
        assert not cached, "a cached answer sends no request: it would wake no fetcher"
        self.asked.append((tp.topic, tp.partition))
        return 0, 0


def _offline_app(tmp_path: Path, **kw: Any) -> App:
    """An application never started (no broker behind it), for the runner's own steps with stubs."""
    return App(
        "offline", "127.0.0.1:1", input_topics=["in"], stores=["agg"], process=count, state_dir=tmp_path, **kw
    )


def test_a_resume_wakes_each_leader_of_the_resumed_partitions_once(tmp_path: Path) -> None:
    """librdkafka fetches a resumed partition when its broker's thread next wakes up, up to a second
    later when nothing else is in flight there; one request to each leader wakes it (the failover
    benchmark: first output 0.11-0.13 s after the resume, 0.5-0.9 s without)."""
    app = _offline_app(tmp_path)
    stub = _LeaderStub({0: 1, 1: 2, 2: 1, 3: 3})
    app._consumer = stub
    app._wake_fetchers([TopicPartition("in", p) for p in (3, 2, 0)] + [TopicPartition("other", 1)])
    # "in" 3 (broker 3) and 2 (broker 1; 0 shares it), "other" 1 (broker 2): one request a leader
    assert stub.asked == [("in", 3), ("in", 2), ("other", 1)]
    failing = _LeaderStub({0: 1}, fail=True)
    app._consumer = failing
    app._wake_fetchers([TopicPartition("in", 0)])  # no metadata: nothing asked, nothing raised
    assert failing.asked == []


def test_a_batch_slower_than_the_transaction_timeout_commits_within_itself(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A batch of 200 records at 20 ms each takes 4 s, twice the transaction timeout: committed only
    after it, its transaction would be aborted by the broker every time and the batch come again
    forever. The commit interval is checked between records, so the instance commits within the
    batch, is never fenced, and counts every record once."""
    app_id, inp, out = unique("slow-app"), unique("slow-in"), unique("slow-out")
    create_topics(kafka_bootstrap, {inp: 1, out: 1})
    records = [(0, b"k%d" % (i % 5), b"%d" % i) for i in range(400)]
    produce(kafka_bootstrap, inp, records)

    def slow_count(record: Record, ctx: Context) -> None:
        time.sleep(0.02)
        count(record, ctx)

    app = App(
        app_id,
        kafka_bootstrap,
        input_topics=[inp],
        output_topics=[out],
        stores=["agg"],
        process=slow_count,
        state_dir=tmp_path / "state",
        transaction_timeout_ms=2_000,
        commit_interval_ms=500,
        max_poll_records=200,
    )
    app.start()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60 and app._committed.get(TopicPartition(inp, 0)) != 400:
        app.poll_once()
    app.close()
    assert app.migrations == 0 and app.aborts == 0, (app.migrations, app.aborts)
    assert output_by_key(read_committed(kafka_bootstrap, out, 1)) == expected_outputs(records)


def test_starting_again_is_tried_while_the_cluster_does_not_answer_within_task_timeout(
    tmp_path: Path,
) -> None:
    """What ``App._start_again`` does with the new producer and the group's offsets: tried again on an
    unanswered call (an error of statestore or of confluent-kafka) until ``task_timeout``; a fencing,
    the deadline, or a stop asked for raises the last error at once."""
    app = _offline_app(tmp_path, task_timeout=30.0)
    calls: list[float] = []

    def answered_after(n: int, error: Exception) -> Callable[[], str]:
        def call() -> str:
            calls.append(time.monotonic())
            if len(calls) <= n:
                raise error
            return "answered"

        return call

    timeout = ck.KafkaException(ck.KafkaError(ck.KafkaError._TIMED_OUT))

    def wrapped(cause: ck.KafkaException) -> LogError:  # as the producer raises what the client raised
        e = LogError(f"no answer ({cause})")
        e.__cause__ = cause
        return e

    no_answer = wrapped(timeout)
    assert app._until_answered("asking", answered_after(2, no_answer)) == "answered"
    assert len(calls) == 3 and calls[2] - calls[0] >= 1.5  # a pause between tries
    calls.clear()
    assert app._until_answered("asking", answered_after(1, timeout)) == "answered"
    calls.clear()
    for refusal in (
        ProducerFencedError("fenced"),
        wrapped(ck.KafkaException(ck.KafkaError(ck.KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED))),
        LogError("no client error inside"),
    ):
        with pytest.raises(type(refusal)):
            app._until_answered("asking", answered_after(5, refusal))
        assert len(calls) == 1, refusal
        calls.clear()
    app.task_timeout = 0.0
    with pytest.raises(LogError, match="no answer"):
        app._until_answered("asking", answered_after(5, no_answer))
    assert len(calls) == 1
    calls.clear()
    app.task_timeout = 30.0
    app._state = "CLOSING"  # closing after an error: one try, not another task_timeout
    with pytest.raises(LogError, match="no answer"):
        app._until_answered("asking", answered_after(5, no_answer))
    assert len(calls) == 1
    calls.clear()
    app._state = "CREATED"
    app.stop()
    with pytest.raises(LogError, match="no answer"):
        app._until_answered("asking", answered_after(5, no_answer))
    assert len(calls) == 1
    with pytest.raises(ValueError, match="task_timeout"):
        _offline_app(tmp_path, task_timeout=-1)


class _InDoubtCollector:
    """A record collector whose commits answer with the given outcomes (None: committed)."""

    def __init__(self, *outcomes: Exception | None) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[str] = []
        self.failed = False

    def commit(self) -> dict[TopicPartition, int]:
        self.calls.append("commit")
        outcome = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
        if outcome is not None:
            raise outcome
        return {}

    def renew(self) -> None:
        self.calls.append("renew")


class _StartAgainStub:
    """The task manager's side of starting every task again."""

    def __init__(self, collector: _InDoubtCollector) -> None:
        self.collector = collector
        self.closed: list[list[TaskId]] = []
        self._closed = False

    def active_tasks(self) -> dict[TaskId, Any]:
        return {}

    def close_lost(self, ids: list[TaskId]) -> None:
        self.closed.append(ids)

    def assign(self, active: set[TaskId], standby: set[TaskId]) -> None:
        pass


def test_a_commit_in_doubt_is_asked_again_of_the_same_producer_before_another_is_made(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A second client of the transactional id made while the first still retries its commit raced it
    at the coordinator (Kafka 4.4), and once left the group's offsets unreadable for minutes. So the
    commit in doubt is asked again of the same producer within ``task_timeout`` (as Kafka Streams
    does); the producer is replaced only when that commit fails for good, is fenced, or gets no
    answer in time. Every task starts again either way."""
    in_doubt = TransactionInDoubtError("committing kept timing out")
    in_doubt.__cause__ = LogError("committing the transaction failed: timed out")  # as the producer's
    cases: list[tuple[tuple[Exception | None, ...], float, list[str]]] = [
        ((in_doubt, None), 30.0, ["commit", "commit"]),  # the broker woke: it committed
        ((LogError("the coordinator aborted it"),), 30.0, ["commit", "renew"]),
        ((ProducerFencedError("fenced"),), 30.0, ["commit", "renew"]),
        ((in_doubt,), 0.0, ["commit", "renew"]),  # no answer within task_timeout
    ]
    for outcomes, task_timeout, calls in cases:
        app = _offline_app(tmp_path, task_timeout=task_timeout)
        collector = _InDoubtCollector(*outcomes)
        tm = _StartAgainStub(collector)
        app.task_manager = tm  # type: ignore[assignment]
        app._committed[TopicPartition("in", 0)] = 7
        with caplog.at_level("INFO", logger="statestore.app.runner"):
            caplog.clear()
            app._in_doubt(in_doubt)
        assert collector.calls == calls, outcomes
        assert tm.closed == [[]] and app._committed == {}, outcomes  # every task starts again
        settled = "the commit in doubt completed" in caplog.text
        assert settled == ("renew" not in calls), caplog.text
        assert (app.commits, app.aborts) == ((1, 0) if settled else (0, 1)), outcomes
    # One task_timeout for the whole of it: a settle that used it up leaves the new producer one try.
    app = _offline_app(tmp_path, task_timeout=1.5)
    collector = _InDoubtCollector(in_doubt)
    app.task_manager = _StartAgainStub(collector)  # type: ignore[assignment]

    def renew_unanswered() -> None:
        collector.calls.append("renew")
        raise ChangelogUnavailableError("no answer")

    collector.renew = renew_unanswered  # type: ignore[method-assign]
    t0 = time.monotonic()
    with pytest.raises(ChangelogUnavailableError):
        app._in_doubt(in_doubt)
    assert collector.calls[-1] == "renew" and set(collector.calls[:-1]) == {"commit"}
    assert time.monotonic() - t0 < 3.0  # not another task_timeout for the renewal


class _CommittedStub:
    """A consumer whose ``committed()`` answers with the given partitions, one answer a call."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)

    def committed(self, parts: list[Any], timeout: float) -> list[Any]:
        return self.answers.pop(0)


class _PendingCommitStub(_CommittedStub):
    """A consumer whose committed offsets answer as scripted, and that seeks anywhere."""

    member = "member-1"

    def consumer_group_metadata(self) -> str:
        return "group-metadata"

    def memberid(self) -> str:
        return self.member

    def seek(self, part: Any) -> None:
        pass


def test_committed_offsets_that_stay_unstable_have_an_offset_commit_left_pending_cleared_once(
    tmp_path: Path,
) -> None:
    """Kafka 4.4's coordinator, aborting an expired transaction while the client's commit of it
    arrived (a broker stalled past the transaction timeout), left that transaction open: its offset
    commit pending (``read_committed`` offset reads timed out, the instance waited out its
    task_timeout) and its records without an end marker (restores and readers held there). A read
    that gets no stable answer now has this instance's producer abort a transaction over those
    offsets and every changelog and output partition, once a rewind: its markers end what its
    producer id left open. At-least-once has no transaction to abort."""
    timeout = ck.KafkaException(ck.KafkaError(ck.KafkaError._TIMED_OUT))
    settled = SimpleNamespace(topic="in", partition=0, offset=42, error=None)
    unstable = SimpleNamespace(
        topic="in", partition=0, offset=-1001, error=ck.KafkaError(ck.KafkaError.UNSTABLE_OFFSET_COMMIT)
    )
    for guarantee, cleared in (("exactly_once_v2", True), ("at_least_once", False)):
        app = _offline_app(tmp_path, guarantee=guarantee, task_timeout=30.0)
        aborted: list[tuple[list[TopicPartition], Any]] = []

        def abort_everywhere(
            written: list[TopicPartition], tps: list[TopicPartition], gm: Any, aborted: list[Any] = aborted
        ) -> bool:
            # every changelog and output partition is written, aborted
            assert written == [TopicPartition("offline-agg-changelog", p) for p in range(2)]
            aborted.append((list(tps), gm))
            return True

        collector = SimpleNamespace(abort_everywhere=abort_everywhere, failed=False)
        app.task_manager = SimpleNamespace(collector=collector)  # type: ignore[assignment]
        app.changelog = SimpleNamespace(topics=lambda: {"offline-agg-changelog": 2, "in": 2})  # type: ignore[assignment]

        class Consumer(_PendingCommitStub):
            def committed(self, parts: list[Any], timeout: float) -> list[Any]:
                answer = self.answers.pop(0)
                if isinstance(answer, Exception):
                    raise answer
                return answer

        app._consumer = Consumer(timeout, [unstable], [settled])
        app._rewind([TopicPartition("in", 0)])
        assert app._committed[TopicPartition("in", 0)] == 42 and app._next[TopicPartition("in", 0)] == 42
        assert aborted == ([([TopicPartition("in", 0)], "group-metadata")] if cleared else []), guarantee
    # Its deadline spent (a settle used the task_timeout): the read after the clearing is made all
    # the same; a consumer that is no member of the group clears nothing.
    app = _offline_app(tmp_path, task_timeout=30.0)  # exactly-once
    app.task_manager = SimpleNamespace(collector=collector)  # type: ignore[assignment]
    app.changelog = SimpleNamespace(topics=lambda: {"offline-agg-changelog": 2, "in": 2})  # type: ignore[assignment]
    for member, cleared in (("member-1", True), ("", False)):
        app._committed.clear()
        aborted.clear()
        app._consumer = Consumer(timeout, [settled])
        app._consumer.member = member
        try:
            app._rewind([TopicPartition("in", 0)], deadline=time.monotonic())
        except ck.KafkaException:
            assert not cleared, "the read after the clearing was not made"
        else:
            assert cleared and app._committed[TopicPartition("in", 0)] == 42
        assert len(aborted) == int(cleared), member


def test_a_committed_offset_answered_with_an_error_is_asked_again_never_taken_as_none(tmp_path: Path) -> None:
    """After a commit in doubt the input is sought back to the group's committed offsets: one the
    coordinator answered with an error (unstable while a transaction that commits it is open) must
    not become "none committed", which sent the input back to its start."""
    app = _offline_app(tmp_path)
    unstable = SimpleNamespace(
        topic="in", partition=0, offset=-1001, error=ck.KafkaError(ck.KafkaError.UNSTABLE_OFFSET_COMMIT)
    )
    settled = SimpleNamespace(topic="in", partition=0, offset=42, error=None)
    app._consumer = _CommittedStub([unstable])
    with pytest.raises(ck.KafkaException):
        app._committed_offsets([TopicPartition("in", 0)])
    app._consumer = _CommittedStub([unstable], [settled])
    got = app._until_answered("reading", lambda: app._committed_offsets([TopicPartition("in", 0)]))
    assert [p.offset for p in got] == [42]


def test_a_changelog_that_does_not_answer_holds_back_its_tasks_within_task_timeout_then_stops(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What ``App.poll_once`` does with the task manager's poll (restores and standby updates): a
    changelog whose cluster gives no answer costs a round of its tasks, logged at most every 10 s,
    and the instance goes on processing; only past ``task_timeout`` without an answer does it stop.
    Any other error stops it at once."""
    app = _offline_app(tmp_path, task_timeout=0.6)
    outcomes: list[Exception | None] = []

    class Polled:
        def poll(self, timeout: float, *, commit: bool) -> bool:
            outcome = outcomes.pop(0) if outcomes else None
            if outcome is not None:
                raise outcome
            return True

    app.task_manager = Polled()  # type: ignore[assignment]
    silent = ChangelogUnavailableError("broker 127.0.0.1:1: no answer within 30 s")
    wrapped = LogError("offsets: timed out")  # the confluent-kafka path's, a client timeout inside
    wrapped.__cause__ = ck.KafkaException(ck.KafkaError(ck.KafkaError._TIMED_OUT))
    outcomes[:] = [silent, wrapped, silent]
    with caplog.at_level("WARNING", logger="statestore.app.runner"):
        assert [app._poll_tasks(0.0) for _ in range(4)] == [False, False, False, True]
    said = [r for r in caplog.records if "gives no answer" in r.getMessage()]
    assert len(said) == 1, "one line for the outage, not one a round"
    # The clock starts again after an answer: 0.4 s silent since is within the 0.6 s.
    outcomes[:] = [silent, silent]
    assert app._poll_tasks(0.0) is False
    time.sleep(0.4)
    assert app._poll_tasks(0.0) is False
    assert app._poll_tasks(0.0) is True
    outcomes[:] = [silent] * 100
    assert app._poll_tasks(0.0) is False
    time.sleep(0.7)
    with pytest.raises(ChangelogUnavailableError, match="task_timeout") as stopped:
        app._poll_tasks(0.0)
    assert stopped.value.__cause__ is silent
    outcomes[:] = [LogError("a corrupt fetch response")]
    with pytest.raises(LogError, match="corrupt"):
        app._poll_tasks(0.0)
