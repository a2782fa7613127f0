"""The transactional producer's calls that fail with retriable errors, against a scripted client.

librdkafka resumes a transactional call (``init_transactions``, ``commit_transaction``,
``abort_transaction``) that failed with a retriable error when it is asked again, and refuses any
other call until then ("Conflicting ... API call is already in progress"). So a producer that
answered a timed-out commit with an abort, or with the next ``begin``, was refused forever. These
tests drive ``KafkaProducer`` with a client whose answers are scripted, no broker needed.
"""

from __future__ import annotations

import time
import weakref
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from statestore.changelog.kafka import KafkaChangelog
from statestore.changelog.kafka.producer import KafkaProducer
from statestore.errors import LogError, TransactionInDoubtError, TransactionStateError
from statestore.ids import TopicPartition
from statestore.processing.record_collector import RecordCollector

TIMEOUT = 0.3


def timed_out() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._TIMED_OUT, "timed out", retriable=True))


def requires_abort() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._INVALID_ARG, "abortable", txn_requires_abort=True))


class Client:
    """Answers each transactional call with the next scripted outcome (None: success; an exception:
    raised; when the script runs out: the last outcome again), and records the calls."""

    def __init__(self, **scripts: list[Exception | None]) -> None:
        self.scripts = scripts
        self.calls: list[str] = []

    def _answer(self, name: str) -> None:
        self.calls.append(name)
        script = self.scripts.get(name, [None])
        outcome = script.pop(0) if len(script) > 1 else script[0]
        if outcome is not None:
            # a new one each time, as the real client's are (one kept in the script and raised again
            # would hold this client's frames: alive until the garbage collector comes)
            raise type(outcome)(*outcome.args)

    def init_transactions(self, timeout: float) -> None:
        self._answer("init_transactions")

    def commit_transaction(self, timeout: float) -> None:
        self._answer("commit_transaction")

    def abort_transaction(self, timeout: float) -> None:
        self._answer("abort_transaction")

    def begin_transaction(self) -> None:
        self._answer("begin_transaction")

    def send_offsets_to_transaction(self, parts: list[Any], group_metadata: Any, timeout: float) -> None:
        self._answer("send_offsets_to_transaction")

    def produce(self, topic: str, **kw: Any) -> None:
        self.calls.append(f"produce {topic}-{kw.get('partition')}")

    def flush(self, timeout: float) -> int:
        self.calls.append("flush")
        return 0

    def poll(self, timeout: float) -> int:
        return 0

    def purge(self, **kw: Any) -> None:
        self.calls.append("purge")

    def close(self) -> None:
        self.calls.append("close")


def changelog_stub() -> SimpleNamespace:
    """What a ``KafkaProducer`` (and a ``RecordCollector``'s ``producer(tid)``) asks of its changelog."""
    changelog = SimpleNamespace(
        request_timeout=TIMEOUT,
        bootstrap_servers="127.0.0.1:1",
        transaction_timeout_ms=10_000,
        client_config=lambda conf: conf,
    )
    changelog.producer = lambda tid: KafkaProducer(changelog, tid)  # type: ignore[arg-type]
    return changelog


def producer(monkeypatch: pytest.MonkeyPatch, client: Client) -> KafkaProducer:
    """A transactional ``KafkaProducer`` on ``client``, its transaction open."""
    monkeypatch.setattr("confluent_kafka.Producer", lambda conf: client)
    p = KafkaProducer(changelog_stub(), "tid")  # type: ignore[arg-type]
    p.begin()
    return p


def test_a_commit_that_times_out_is_asked_again_and_completes(monkeypatch: pytest.MonkeyPatch) -> None:
    client = Client(commit_transaction=[timed_out(), timed_out(), None])
    p = producer(monkeypatch, client)
    p.commit()
    assert client.calls.count("commit_transaction") == 3
    assert not p.in_transaction and not p.fatal
    p.begin()  # the next transaction begins: nothing is left unsettled
    p.commit()
    p.close()
    assert client.calls[-1] == "close"


def test_a_commit_that_keeps_timing_out_is_in_doubt_and_leaves_the_producer_to_be_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = Client(commit_transaction=[timed_out()])
    p = producer(monkeypatch, client)
    t0 = time.monotonic()
    with pytest.raises(TransactionInDoubtError, match="may still commit or abort"):
        p.commit()
    assert time.monotonic() - t0 >= TIMEOUT  # asked again for one more request timeout
    assert client.calls.count("commit_transaction") >= 2
    assert p.fatal
    # An abort would be refused by the client (the commit may still complete): not even tried.
    with pytest.raises(TransactionInDoubtError):
        p.abort()
    assert "abort_transaction" not in client.calls
    p.close()  # drops what is queued; the client's close() would try to abort
    assert client.calls[-1] == "purge"


def test_a_commit_in_doubt_asked_again_of_the_same_producer_completes_and_it_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the App does with a commit in doubt before it would make a second client of the id: the
    same producer's commit, asked again once the coordinator answers, completes, and the producer is
    no longer fatal: the next transaction begins on it."""
    client = Client(commit_transaction=[timed_out(), timed_out(), timed_out(), timed_out(), None])
    p = producer(monkeypatch, client)
    with pytest.raises(TransactionInDoubtError):
        p.commit()
    assert p.fatal and p.in_transaction
    p.commit()  # the client resumes the same call
    assert not p.fatal and not p.in_transaction
    assert client.calls.count("commit_transaction") == 5 and "abort_transaction" not in client.calls
    p.begin()
    p.commit()
    p.close()
    assert client.calls[-1] == "close"


def test_a_producer_closed_in_doubt_lets_its_client_go_before_the_next_one_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client still retrying its commit (or abort) beside a new producer of the same transactional
    id races it at the coordinator. Closing a producer whose commit is in doubt drops its client at
    once, so renewing the collector's producer never has two clients of the id alive."""
    events: list[str] = []
    made: list[weakref.ref[Client]] = []

    class Recorded(Client):
        n = 0

        def init_transactions(self, timeout: float) -> None:
            events.append(f"client {self.n} init")
            super().init_transactions(timeout)

    def make(conf: dict[str, Any]) -> Client:
        client = Recorded(commit_transaction=[timed_out()] if not made else [None])
        client.n = len(made)
        weakref.finalize(client, events.append, f"client {client.n} gone")
        made.append(weakref.ref(client))
        return client

    monkeypatch.setattr("confluent_kafka.Producer", make)
    collector = RecordCollector(changelog_stub(), transactional_id="tid")
    collector.producer.begin()
    try:
        collector.producer.commit()
    except TransactionInDoubtError:
        pass
    else:
        pytest.fail("the commit was not in doubt")
    collector.renew()
    assert events == ["client 0 init", "client 0 gone", "client 1 init"]
    assert made[0]() is None and made[1]() is not None


def test_closing_a_producer_whose_commit_failed_for_good_never_raises_nor_waits_without_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A commit in doubt asked again can end in a plain error (``EndTxn`` answered "unknown broker
    error" as the broker's transaction timeout fenced the epoch), the client learning only later
    that it is fenced. Its own ``close()`` aborts first, with no time limit, and raised that
    fencing: the application stopped while replacing the producer. Now the abort is asked with its
    bounds, and nothing the client raises on the way out escapes."""
    unknown = KafkaException(KafkaError(KafkaError.UNKNOWN, "EndTxn commit failed: Unknown broker error"))
    fenced = KafkaException(KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True))

    class Closing(Client):
        def close(self) -> None:
            super().close()
            raise type(fenced)(*fenced.args)

    client = Closing(commit_transaction=[unknown], abort_transaction=[fenced])
    p = producer(monkeypatch, client)
    with pytest.raises(LogError, match="Unknown broker error"):
        p.commit()
    assert p.in_transaction and not p.fatal
    p.close()  # the abort is fenced: what is queued is dropped, the client let go
    assert client.calls[-2:] == ["abort_transaction", "purge"]
    client = Closing(commit_transaction=[None])
    p = producer(monkeypatch, client)
    p.commit()
    p.close()  # the client's close raises: logged, not raised
    assert client.calls[-1] == "close"
    # A closed producer refuses further calls with statestore's error; an abort has nothing left.
    with pytest.raises(TransactionStateError, match="closed"):
        p.begin()
    with pytest.raises(TransactionStateError, match="closed"):
        p.send("t", 0, b"k", b"v")
    p.abort()
    assert not p.in_transaction and client.calls[-1] == "close"


def test_aborting_everywhere_writes_each_partition_and_the_offsets_in_a_transaction_it_aborts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What ends a transaction of this producer's id a broker left open (data without its end
    marker, an offset commit left pending): a new transaction that writes an empty record to each
    partition and adds the offsets, delivered, then aborted; never while a transaction is open."""
    client = Client()
    monkeypatch.setattr("confluent_kafka.Producer", lambda conf: client)
    collector = RecordCollector(changelog_stub(), transactional_id="tid")
    written = [TopicPartition("app-s-changelog", 0), TopicPartition("out", 1)]
    assert collector.abort_everywhere(written, [TopicPartition("in", 0)], "gm")
    assert client.calls[-6:] == [
        "begin_transaction",
        "produce app-s-changelog-0",
        "produce out-1",
        "flush",
        "send_offsets_to_transaction",
        "abort_transaction",
    ]
    assert not collector.producer.in_transaction and not collector.failed
    collector.producer.begin()
    assert not collector.abort_everywhere(written, [TopicPartition("in", 0)], "gm")  # one is open
    assert client.calls[-1] == "begin_transaction"


def test_a_commit_that_requires_an_abort_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    client = Client(commit_transaction=[requires_abort()])
    p = producer(monkeypatch, client)
    with pytest.raises(LogError) as failed:
        p.commit()
    assert not isinstance(failed.value, TransactionInDoubtError)
    assert client.calls.count("commit_transaction") == 1 and not p.fatal
    p.abort()
    assert client.calls[-1] == "abort_transaction" and not p.in_transaction and not p.fatal


def test_an_abort_that_times_out_is_asked_again_or_leaves_the_producer_to_be_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = Client(abort_transaction=[timed_out(), None])
    p = producer(monkeypatch, client)
    p.abort()
    assert client.calls.count("abort_transaction") == 2 and not p.fatal
    client = Client(abort_transaction=[timed_out()])
    p = producer(monkeypatch, client)
    with pytest.raises(LogError):
        p.abort()
    assert p.fatal and not p.in_transaction


def test_init_transactions_that_times_out_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    client = Client(init_transactions=[timed_out(), None])
    producer(monkeypatch, client)
    assert client.calls[:3] == ["init_transactions", "init_transactions", "begin_transaction"]


def test_a_producer_whose_init_gave_up_is_resumed_by_the_next_producer_of_its_id_never_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cluster silent for longer than init_transactions' own retry: the application asks for
    the producer again (``RecordCollector.renew`` within ``task_timeout``). librdkafka wants the
    same client asked again, and has aborted the process when one whose call still ran was
    dropped for a new client of the id."""
    made: list[Client] = []
    scripts = [[timed_out(), timed_out(), timed_out(), timed_out(), timed_out(), timed_out(), None]]

    def new_client(conf: dict[str, Any]) -> Client:
        made.append(Client(init_transactions=scripts.pop(0) if scripts else [None]))
        return made[-1]

    monkeypatch.setattr("confluent_kafka.Producer", new_client)
    changelog = KafkaChangelog("127.0.0.1:1", request_timeout=TIMEOUT / 3, native=False)
    try:
        tries = 0
        while True:
            tries += 1
            try:
                p = changelog.producer("tid")
                break
            except LogError:
                assert tries < 10
        assert tries >= 2, "the init's own retry should have given up at least once"
        assert len(made) == 1, "each try must resume the client whose init still runs"
        assert made[0].calls.count("init_transactions") == 7
        assert "purge" not in made[0].calls and "close" not in made[0].calls
        assert p.initializing is False and not p.fatal
        p.begin()
        p.commit()
        # Another id, or a settled one, gets a client of its own.
        assert changelog.producer("tid") is not p and len(made) == 2
        changelog.producer("other")
        assert len(made) == 3
    finally:
        changelog.close()


def test_a_producer_still_initializing_is_closed_with_its_changelog(monkeypatch: pytest.MonkeyPatch) -> None:
    client = Client(init_transactions=[timed_out()])
    monkeypatch.setattr("confluent_kafka.Producer", lambda conf: client)
    changelog = KafkaChangelog("127.0.0.1:1", request_timeout=TIMEOUT / 3, native=False)
    with pytest.raises(LogError, match="initializing transactions"):
        changelog.producer("tid")
    assert "purge" not in client.calls
    asked = client.calls.count("init_transactions")
    changelog.close()
    # Asked once more before it is let go, then closed as a client whose call still runs can be.
    assert client.calls.count("init_transactions") > asked and client.calls[-1] == "purge"
    with pytest.raises(LogError):
        changelog.producer("tid")  # a closed changelog keeps nothing
