"""Kafka as the changelog: restore from and log to a real Kafka cluster (confluent-kafka).

:class:`KafkaChangelog` implements the same :class:`~statestore.changelog.Changelog`
interface as :class:`~statestore.log.SegmentLog`, so the ``TaskManager``, its
policies and the restore engine run unchanged on it:

* **Restore** reads with a ``read_committed`` consumer (``isolation.level``),
  ``enable.auto.commit=false`` and ``auto.offset.reset=error`` (librdkafka's
  spelling of Java's ``none``): a start offset outside the log is never
  silently moved, it becomes :class:`~statestore.errors.TaskCorruptedError`
  and the task manager wipes the task and restores it from the start. The
  restore engine pulls batches of up to 10,000 messages (``consume()``) with
  the GIL released between pulls and reads offset, key and value of each
  message through the C API -- no Python bytecode per record (see
  ``rust/src/py/feed.rs``). Completion is judged by the consumer's position,
  which steps over transaction markers.
* **End offsets** come from the watermarks, queried from the broker
  (``get_watermark_offsets(cached=False)``): with a ``read_uncommitted``
  consumer the high watermark is the log end offset; with a
  ``read_committed`` one it is the last stable offset.
* **Exactly-once** logging goes through a transactional producer
  (``transactional.id`` per task manager). ``init_transactions`` fences the
  previous incarnation and aborts its open transaction; a fenced producer
  raises :class:`~statestore.errors.ProducerFencedError`. Offsets of sent
  records are known only once delivered (:meth:`KafkaProducer.take_offsets`).
* **Topics**: :func:`ensure_changelog_topics` creates changelog topics with
  ``cleanup.policy=compact`` and the tasks' partition count, and refuses to run
  against an existing topic whose partition count differs.

Behaviour verified against Apache Kafka 4.4 (the test suite starts one with
``scripts/kafka-broker.sh``): aborted transactions never reach a restore, the
last stable offset bounds a restore while a transaction is open, a start
offset outside the log is ``TaskCorruptedError``. Two client-side habits of
librdkafka are absorbed here: cached watermarks are unset until a consumer
fetched, so only broker queries are used; and ``consume(n, timeout)`` waits
for the whole timeout when fewer than ``n`` messages are there, so the engine
never asks for more messages than offsets remain (+1) and pulls with a short
timeout.

confluent-kafka is an optional dependency: ``pip install 'statestore[kafka]'``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

from statestore.changelog import ClosesOnCleanExit, Header, PartitionLike
from statestore.errors import LogError, ProducerFencedError, TaskCorruptedError, TransactionStateError
from statestore.ids import TopicPartition, changelog_topic, coerce_tp
from statestore.log import Record

_ck: Any
try:
    import confluent_kafka as _ck
    from confluent_kafka.admin import AdminClient as _AdminClient
    from confluent_kafka.admin import NewTopic as _NewTopic  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - exercised only without the extra
    _ck = None

#: Where librdkafka's own log lines go.
_CLIENT_LOG = logging.getLogger("statestore.kafka.client")

#: Default seconds a broker request may take.
DEFAULT_REQUEST_TIMEOUT = 30.0
#: Default seconds a restore may see no progress before giving up.
DEFAULT_STALL_TIMEOUT = 60.0
#: Seconds one ``consume()`` call waits at most.
POLL_TIMEOUT = 0.05
#: Default ``transaction.timeout.ms`` of transactional producers.
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000


def _require() -> Any:
    if _ck is None:
        raise ImportError("statestore's Kafka changelog needs confluent-kafka: pip install 'statestore[kafka]'")
    return _ck


def _kafka_error(e: BaseException) -> Any:
    """The ``KafkaError`` inside a ``KafkaException`` (or None)."""
    args = getattr(e, "args", ())
    return args[0] if args and hasattr(args[0], "code") else None


#: confluent-kafka's own (Python) configuration keys, which keep their underscores.
_PYTHON_KEYS = frozenset({"error_cb", "throttle_cb", "stats_cb", "oauth_cb", "on_commit", "on_delivery", "logger"})


def _config(pairs: Mapping[str, Any]) -> dict[str, Any]:
    """librdkafka properties; ``security_protocol=...`` may be written for ``security.protocol``."""
    return {k if k in _PYTHON_KEYS else k.replace("_", "."): v for k, v in pairs.items()}


class KafkaProducer(ClosesOnCleanExit):
    """A changelog producer on a Kafka cluster (confluent-kafka ``Producer``).

    Transactional when made with a transactional id: construction calls
    ``init_transactions``, which fences the previous producer of the id and
    aborts what it left open. ``send`` returns -1: the offset is known only
    once the record is delivered; :meth:`take_offsets` hands them out after
    :meth:`flush` or :meth:`commit`.
    """

    def __init__(self, changelog: KafkaChangelog, transactional_id: str | None) -> None:
        ck = _require()
        self.transactional_id = transactional_id
        self._timeout = changelog.request_timeout
        self._bootstrap = changelog.bootstrap_servers
        conf: dict[str, Any] = {"enable.idempotence": True, "acks": "all", "linger.ms": 5}
        if transactional_id is not None:
            conf["transactional.id"] = transactional_id
            conf["transaction.timeout.ms"] = changelog.transaction_timeout_ms
        self._producer = ck.Producer(changelog.client_config(conf))
        self._delivered: dict[TopicPartition, int] = {}
        self._failure: Any = None
        self._in_transaction = False
        self._closed = False
        self._fenced = False
        if transactional_id is not None:
            self._call("initializing transactions", self._producer.init_transactions, self._timeout)

    def _what(self) -> str:
        tid = f" (transactional id {self.transactional_id!r})" if self.transactional_id else ""
        return f"Kafka producer{tid} on {self._bootstrap}"

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        ck = _require()
        try:
            return fn(*args)
        except ck.KafkaException as e:
            raise self._error(what, e) from e
        except SystemError as e:
            # A fatal error (e.g. fencing) raised inside librdkafka while it ran our delivery
            # callback reaches Python as a SystemError whose cause is the KafkaException.
            cause = e.__cause__ or e.__context__
            if isinstance(cause, ck.KafkaException):
                raise self._error(what, cause) from e
            if self._failure is not None:
                failure, self._failure = self._failure, None
                raise self._error(what, ck.KafkaException(failure)) from e
            raise

    def _error(self, what: str, e: BaseException) -> LogError:
        ck = _require()
        err = _kafka_error(e)
        code = err.code() if err is not None else None
        fenced = {
            ck.KafkaError.PRODUCER_FENCED,
            ck.KafkaError._FENCED,
            ck.KafkaError.INVALID_PRODUCER_EPOCH,
        }
        if code in fenced:
            self._fenced = True
            return ProducerFencedError(
                f"{self._what()}: {what}: fenced by a newer producer with the same transactional id ({e}); "
                "another instance owns these tasks now: close this one dirty"
            )
        if code == ck.KafkaError._STATE:
            return TransactionStateError(f"{self._what()}: {what}: {e}")
        return LogError(f"{self._what()}: {what} failed: {e}; the transaction (if any) must be aborted")

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            ck = _require()
            # Records purged by an abort (or a fenced close) report _PURGE_*: they were meant to go.
            purged = err.code() in (ck.KafkaError._PURGE_QUEUE, ck.KafkaError._PURGE_INFLIGHT)
            if self._failure is None and not purged:
                self._failure = err
            return
        tp = TopicPartition(msg.topic(), msg.partition())
        off = msg.offset()
        if off > self._delivered.get(tp, -1):
            self._delivered[tp] = off

    def _check_delivery(self, what: str) -> None:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise self._error(what, _require().KafkaException(failure))

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open."""
        return self._in_transaction

    def send(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header] | None = None,
        *,
        timestamp: int | None = None,
    ) -> int:
        """Queue one record; ``value=None`` is a tombstone. Returns -1 (see :meth:`take_offsets`)."""
        if self.transactional_id is not None and not self._in_transaction:
            raise TransactionStateError(f"{self._what()}: send outside a transaction; call begin() first")
        kw: dict[str, Any] = {"key": key, "value": value, "partition": partition, "on_delivery": self._on_delivery}
        if headers:
            kw["headers"] = list(headers)
        if timestamp is not None:
            kw["timestamp"] = timestamp
        while True:
            try:
                self._producer.produce(topic, **kw)
                break
            except BufferError:
                self._producer.poll(0.05)  # local queue full: let deliveries drain
            except _require().KafkaException as e:
                raise self._error(f"sending to {topic}-{partition}", e) from e
        self._producer.poll(0)
        return -1

    def take_offsets(self) -> dict[TopicPartition, int]:
        """Offset of the last record delivered per partition since the previous call."""
        out, self._delivered = self._delivered, {}
        return out

    def flush(self) -> None:
        """Wait until every queued record is delivered (acks=all); raises if one failed."""
        left = self._call("flushing", self._producer.flush, self._timeout)
        if left:
            raise LogError(f"{self._what()}: {left} records still undelivered after {self._timeout:.0f} s")
        self._check_delivery("delivering records")

    def begin(self) -> None:
        """Open a transaction."""
        if self.transactional_id is None:
            raise TransactionStateError(f"{self._what()}: begin() on a producer without a transactional id")
        self._call("beginning a transaction", self._producer.begin_transaction)
        self._in_transaction = True

    def commit(self) -> None:
        """Flush and commit the open transaction; on failure the caller aborts (or closes, when fenced)."""
        self._call("flushing the transaction", self._producer.flush, self._timeout)
        self._check_delivery("delivering the transaction's records")
        self._call("committing the transaction", self._producer.commit_transaction, self._timeout)
        self._in_transaction = False

    def abort(self) -> None:
        """Abort the open transaction (its records become invisible to read_committed consumers)."""
        self._delivered.clear()
        self._failure = None
        try:
            self._call("aborting the transaction", self._producer.abort_transaction, self._timeout)
        finally:
            self._in_transaction = False

    def close(self) -> None:
        """Flush what is queued and close the client. An open transaction stays open: the next
        producer of the id (or the transaction timeout) aborts it."""
        if self._closed:
            return
        self._closed = True
        if self._fenced:
            # close() would abort the transaction first, which a fenced producer cannot do:
            # drop what is queued, let the client go.
            self._producer.purge(in_queue=True, in_flight=True, blocking=False)
            self._producer.poll(0)
            return
        try:
            self._producer.flush(self._timeout)
        except _require().KafkaException:
            pass  # a failed producer has nothing left to deliver
        self._producer.close()


class _RestoreFeed:
    """A read_committed consumer assigned to one partition, used by the restore engine (see FedChangelog)."""

    def __init__(self, changelog: KafkaChangelog, tp: TopicPartition) -> None:
        ck = _require()
        self.changelog = changelog
        self.tp = tp
        self._ktp = ck.TopicPartition(tp.topic, tp.partition)
        self._consumer = ck.Consumer(changelog.client_config({
            "group.id": changelog.group_id,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
            "enable.partition.eof": True,
            # At the end of the log a fetch waits this long for data before it comes back
            # empty (the end-of-partition event); a restore's tail should not wait 500 ms.
            "fetch.wait.max.ms": 50,
        }))
        self._assigned = False

    def seek(self, start: int) -> None:
        """Position the consumer at ``start`` (assign; drops what was fetched ahead)."""
        self._ktp = _require().TopicPartition(self.tp.topic, self.tp.partition, start)
        self._consumer.assign([self._ktp])
        self._assigned = True

    def poll(self, max_records: int) -> list[Any]:
        """Up to ``max_records`` messages (the end-of-partition event among them)."""
        msgs: list[Any] = self._consumer.consume(num_messages=max_records, timeout=POLL_TIMEOUT)
        return msgs

    def on_error(self, msg: Any) -> bool:
        """True for the end of the partition; raises for an offset out of range or a fatal error."""
        ck = _require()
        err = msg.error()
        code = err.code()
        if code == ck.KafkaError._PARTITION_EOF:
            return True
        if code in (ck.KafkaError.OFFSET_OUT_OF_RANGE, ck.KafkaError._AUTO_OFFSET_RESET):
            raise TaskCorruptedError(
                f"changelog {self.tp} on {self.changelog.bootstrap_servers}: offset out of range ({err}); the "
                "topic was truncated, deleted or recreated behind the store: wipe the store and restore it"
            )
        if err.retriable() or code in (ck.KafkaError._TRANSPORT, ck.KafkaError._ALL_BROKERS_DOWN):
            return False  # transient: the engine keeps pulling until its stall timeout
        raise LogError(f"changelog {self.tp} on {self.changelog.bootstrap_servers}: consuming failed: {err}")

    def position(self) -> int | None:
        """The consumer's position (next offset to hand out; steps over markers), None before a fetch."""
        off = int(self._consumer.position([self._ktp])[0].offset)
        return off if off >= 0 else None

    def close(self) -> None:
        """Give the consumer back to the changelog for the next restore of this partition."""
        self.changelog._release(self)

    def shutdown(self) -> None:
        self._consumer.close()


class KafkaChangelog:
    """A changelog on a Kafka cluster: ``KafkaChangelog("broker:9092", **client_config)``.

    ``client_config`` holds librdkafka properties applied to every client
    (``security.protocol``, ``sasl.*``, ``ssl.*`` ...; underscores may stand
    for dots). Topics must exist (:func:`ensure_changelog_topics`).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        restore_stall_timeout: float = DEFAULT_STALL_TIMEOUT,
        transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS,
        group_id: str = "statestore-restore",
        **client_config: Any,
    ) -> None:
        _require()
        self.bootstrap_servers = bootstrap_servers
        self.request_timeout = request_timeout
        #: Seconds a restore may see no progress before giving up (read by the restore engine).
        self.restore_stall_timeout = restore_stall_timeout
        self.transaction_timeout_ms = transaction_timeout_ms
        #: Group id of the restore consumers; they never join the group nor commit offsets.
        self.group_id = group_id
        self._extra = _config(client_config)
        self._lock = threading.Lock()
        self._idle: dict[TopicPartition, list[_RestoreFeed]] = {}
        self._watermark: dict[str, Any] = {}
        self._admin: Any = None
        self._closed = False

    def __repr__(self) -> str:
        return f"KafkaChangelog({self.bootstrap_servers!r})"

    def client_config(self, conf: Mapping[str, Any]) -> dict[str, Any]:
        """A librdkafka configuration: ``bootstrap.servers``, then ``conf``, then the user's properties.

        Client logs go to the ``statestore.kafka.client`` logger (not stderr)
        unless the user's properties name a ``logger``.
        """
        return {"bootstrap.servers": self.bootstrap_servers, "logger": _CLIENT_LOG, **conf, **self._extra}

    # -- offsets --------------------------------------------------------------------------------

    def _watermark_consumer(self, isolation: str) -> Any:
        with self._lock:
            c = self._watermark.get(isolation)
            if c is None:
                c = self._watermark[isolation] = _require().Consumer(self.client_config({
                    "group.id": self.group_id,
                    "isolation.level": isolation,
                    "enable.auto.commit": False,
                }))
            return c

    def _watermarks(self, tp: TopicPartition, isolation: str) -> tuple[int, int]:
        ck = _require()
        c = self._watermark_consumer(isolation)
        try:
            low, high = c.get_watermark_offsets(ck.TopicPartition(tp.topic, tp.partition),
                                                timeout=self.request_timeout, cached=False)
        except ck.KafkaException as e:
            raise LogError(f"changelog {tp} on {self.bootstrap_servers}: cannot read its offsets: {e}; "
                           "does the topic exist (ensure_changelog_topics) and is the broker reachable?") from e
        return int(low), int(high)

    def offsets(self, tp: PartitionLike) -> tuple[int, int, int]:
        """``(start, end, last_stable)`` of ``tp``: low watermark, high watermark, read_committed high watermark."""
        t = coerce_tp(tp)
        start, end = self._watermarks(t, "read_uncommitted")
        _, lso = self._watermarks(t, "read_committed")
        return start, end, min(max(lso, start), end)

    def start_offset(self, tp: PartitionLike) -> int:
        """The first offset still in the log of ``tp`` (the low watermark)."""
        return self._watermarks(coerce_tp(tp), "read_uncommitted")[0]

    def end_offset(self, tp: PartitionLike) -> int:
        """The log end offset of ``tp`` (the high watermark)."""
        return self._watermarks(coerce_tp(tp), "read_uncommitted")[1]

    def last_stable_offset(self, tp: PartitionLike) -> int:
        """The last stable offset of ``tp`` (the high watermark a read_committed consumer sees)."""
        return self._watermarks(coerce_tp(tp), "read_committed")[1]

    def create(self) -> None:
        """Nothing to do here: changelog topics are created by :func:`ensure_changelog_topics`."""

    def abort_expired_transactions(self, timeout_ms: int) -> list[str]:
        """Nothing to do: the broker's transaction coordinator aborts expired transactions."""
        return []

    # -- producing ------------------------------------------------------------------------------

    def producer(self, transactional_id: str | None = None) -> KafkaProducer:
        """A producer; with ``transactional_id``, a transactional one (fences earlier ones of that id)."""
        return KafkaProducer(self, transactional_id)

    # -- restoring (the engine's FedChangelog side) ---------------------------------------------

    def restore_bounds(self, topic: str, partition: int) -> tuple[int, int, int]:
        """``(start, end, last_stable)`` for the restore engine."""
        return self.offsets(TopicPartition(topic, partition))

    def restore_feed(self, topic: str, partition: int, start: int) -> _RestoreFeed:
        """A read_committed consumer of ``topic-partition`` positioned at ``start``.

        A consumer left by the previous restore of the partition is reused
        (no reconnect, and no refetch when it stands at ``start``). A start
        outside ``[low, high]`` raises ``TaskCorruptedError`` before any fetch,
        naming the range (the broker's OFFSET_OUT_OF_RANGE would say less).
        """
        tp = TopicPartition(topic, partition)
        low, high = self._watermarks(tp, "read_uncommitted")
        if not low <= start <= high:
            raise TaskCorruptedError(
                f"changelog {tp} on {self.bootstrap_servers}: offset {start} is out of range [{low}, {high}]; "
                "the topic was truncated, deleted or recreated behind the store: wipe the store and restore it"
            )
        with self._lock:
            if self._closed:
                raise LogError(f"{self!r} is closed")
            idle = self._idle.get(tp)
            feed = idle.pop() if idle else None
        if feed is None:
            feed = _RestoreFeed(self, tp)
        if not feed._assigned or feed.position() != start:
            feed.seek(start)
        return feed

    def _release(self, feed: _RestoreFeed) -> None:
        with self._lock:
            if not self._closed:
                self._idle.setdefault(feed.tp, []).append(feed)
                return
        feed.shutdown()

    def read(self, tp: PartitionLike, start_offset: int | None = None, *, end_offset: int | None = None) -> Iterator[Record]:
        """Yield the records of ``tp`` from ``start_offset`` to ``end_offset`` (default: the last stable offset).

        read_committed: no aborted records, no markers. For tools and tests;
        restores go through the engine.
        """
        t = coerce_tp(tp)
        start, _end, lso = self.offsets(t)
        pos = start if start_offset is None else max(start_offset, start)
        end = lso if end_offset is None else end_offset
        if pos >= end:
            return
        feed = self.restore_feed(t.topic, t.partition, pos)
        deadline = time.monotonic() + self.restore_stall_timeout
        try:
            while pos < end:
                progressed = False
                at_end = False
                for m in feed.poll(10_000):
                    if m.error() is not None:
                        at_end = feed.on_error(m) or at_end
                        continue
                    o = m.offset()
                    if o >= end:
                        pos = end
                        break
                    if o >= pos:
                        ts = m.timestamp()[1]
                        hs = tuple((k, v) for k, v in (m.headers() or []))
                        yield Record(o, m.key(), m.value(), ts, hs)
                        pos, progressed = o + 1, True
                p = feed.position()
                if p is not None and p > pos:
                    pos, progressed = min(p, end), True
                if progressed:
                    deadline = time.monotonic() + self.restore_stall_timeout
                elif at_end or time.monotonic() > deadline:
                    return
        finally:
            feed.close()

    def committed_records(self, tp: PartitionLike, start: int, end: int) -> int:
        """How many committed data records of ``tp`` lie in ``[start, end)`` (markers and aborted records are not)."""
        if end <= start:
            return 0
        return sum(1 for _ in self.read(tp, start, end_offset=end))

    # -- topics ---------------------------------------------------------------------------------

    def admin(self) -> Any:
        """The changelog's confluent-kafka ``AdminClient``."""
        with self._lock:
            if self._admin is None:
                _require()
                self._admin = _AdminClient(self.client_config({}))
            return self._admin

    def topic_partitions(self, topic: str) -> int | None:
        """Number of partitions of ``topic``, None if it does not exist."""
        # A metadata request naming the topic may create it on brokers that
        # auto-create topics: list them all instead.
        return self.topics().get(topic)

    def topics(self) -> dict[str, int]:
        """Every topic of the cluster and its partition count."""
        md = self.admin().list_topics(timeout=self.request_timeout)
        return {name: len(t.partitions) for name, t in md.topics.items() if t.error is None}

    def partitions(self) -> list[TopicPartition]:
        """Every partition of every topic (internal topics excluded), sorted."""
        return sorted(
            TopicPartition(name, p) for name, n in self.topics().items() if not name.startswith("__") for p in range(n)
        )

    def create_topics(self, topics: Mapping[str, int], *, config: Mapping[str, str] | None = None,
                      replication_factor: int = -1) -> None:
        """Create ``topic -> partitions`` as compacted changelog topics (``cleanup.policy=compact``).

        ``replication_factor=-1`` takes the broker's default.
        """
        if not topics:
            return
        conf = {"cleanup.policy": "compact", **(config or {})}
        new = [_NewTopic(t, num_partitions=n, replication_factor=replication_factor, config=dict(conf))
               for t, n in topics.items()]
        futures = self.admin().create_topics(new, request_timeout=self.request_timeout)
        for topic, fut in futures.items():
            try:
                fut.result(self.request_timeout)
            except Exception as e:
                raise LogError(f"creating changelog topic {topic} on {self.bootstrap_servers} failed: {e}") from e
        self._wait_for(lambda: all(self.topic_partitions(t) == n for t, n in topics.items()),
                       f"topics {sorted(topics)} to appear")

    def delete_topics(self, topics: Iterable[str]) -> None:
        """Delete ``topics`` (missing ones are ignored). Restore consumers of them are dropped."""
        names = list(topics)
        if not names:
            return
        futures = self.admin().delete_topics(names, request_timeout=self.request_timeout)
        ck = _require()
        for topic, fut in futures.items():
            try:
                fut.result(self.request_timeout)
            except ck.KafkaException as e:
                err = _kafka_error(e)
                if err is None or err.code() != ck.KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise LogError(f"deleting topic {topic} on {self.bootstrap_servers} failed: {e}") from e
        self._wait_for(lambda: all(self.topic_partitions(t) is None for t in names), f"topics {names} to go")
        # librdkafka 2.16 crashed (rd_kafka_metadata_cache_find) in a consumer that had the topic
        # cached when it was recreated: start every client of this changelog afresh.
        self._close_clients()

    def _wait_for(self, cond: Any, what: str) -> None:
        deadline = time.monotonic() + self.request_timeout
        while not cond():
            if time.monotonic() > deadline:
                raise LogError(f"{self!r}: timed out after {self.request_timeout:.0f} s waiting for {what}")
            time.sleep(0.05)

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the idle restore consumers and the offset consumers."""
        with self._lock:
            self._closed = True
        self._close_clients()

    def _close_clients(self) -> None:
        with self._lock:
            feeds = [f for fs in self._idle.values() for f in fs]
            self._idle.clear()
            wm = list(self._watermark.values())
            self._watermark.clear()
        for f in feeds:
            f.shutdown()
        for c in wm:
            c.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def ensure_changelog_topics(
    changelog: KafkaChangelog,
    application_id: str,
    stores: Iterable[str],
    partitions: int,
    *,
    create: bool = True,
    config: Mapping[str, str] | None = None,
) -> list[str]:
    """Make sure every store's changelog topic exists with ``partitions`` partitions (one per task).

    Missing topics are created compacted (``create=True``). An existing topic
    with another partition count raises ``LogError``: tasks map to changelog
    partitions one to one, so such a changelog would restore the wrong data.
    Returns the topics created.
    """
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    existing = changelog.topics()
    missing: dict[str, int] = {}
    for store in stores:
        topic = changelog_topic(application_id, store)
        n = existing.get(topic)
        if n is None:
            missing[topic] = partitions
        elif n != partitions:
            raise LogError(
                f"changelog topic {topic} on {changelog.bootstrap_servers} has {n} partitions but the application "
                f"has {partitions} tasks per store; refusing to run (a changelog partition belongs to one task): "
                "fix the topic or the partition count"
            )
    if missing and not create:
        raise LogError(f"changelog topics {sorted(missing)} do not exist on {changelog.bootstrap_servers}; "
                       "create them (ensure_changelog_topics(..., create=True))")
    changelog.create_topics(missing, config=config)
    return sorted(missing)


__all__ = ["DEFAULT_STALL_TIMEOUT", "KafkaChangelog", "KafkaProducer", "ensure_changelog_topics"]
