"""Kafka as the changelog: restore from and log to a real Kafka cluster.

:class:`KafkaChangelog` implements the same :class:`~statestore.changelog.protocol.Changelog`
interface as :class:`~statestore.changelog.segment_log.SegmentLog`, so the ``TaskManager``, its
policies and the restore engine run unchanged on it. The package has three
parts:

* :mod:`statestore.changelog.kafka.source` -- **restoring**. The engine fetches from the
  partition leaders itself (``rust/src/kafka``: ApiVersions, SASL, Metadata,
  ListOffsets, Fetch with ``isolation_level=read_committed``), hands the
  broker's record batches to the decoder the segment log uses, and drops
  aborted transactions and markers exactly as on disk (and counts them), with
  the GIL released for the whole restore. ``read``, ``committed_records`` and
  the offsets go through the same client. An offset outside the log is
  :class:`~statestore.errors.TaskCorruptedError`; the task manager wipes the
  task and restores it from the start. A configuration the native fetcher
  cannot honour (GSSAPI, OAUTHBEARER, keystores...) falls back to a
  confluent-kafka read_committed consumer, with one log line saying why.
* :mod:`statestore.changelog.kafka.producer` -- **logging**. Exactly-once goes through a
  transactional producer (``transactional.id`` per task manager).
  ``init_transactions`` fences the previous incarnation and aborts its open
  transaction; a fenced producer raises
  :class:`~statestore.errors.ProducerFencedError`. Offsets of sent records are
  known only once delivered (:meth:`KafkaProducer.take_offsets`).
* :mod:`statestore.changelog.kafka.admin` -- **topics**. :func:`ensure_changelog_topics`
  creates changelog topics with ``cleanup.policy=compact`` and the tasks'
  partition count, and refuses to run against an existing topic whose
  partition count differs.

Behaviour verified against Apache Kafka 4.4 (the test suite starts one with
``scripts/kafka-broker.sh``): aborted transactions never reach a restore, the
last stable offset bounds a restore while a transaction is open, a start
offset outside the log is ``TaskCorruptedError``.

The producer and admin need confluent-kafka, an optional dependency:
``pip install 'statestore[kafka]'``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, Self

from statestore import _native
from statestore.changelog.kafka.admin import KafkaAdmin, ensure_changelog_topics
from statestore.changelog.kafka.common import (
    CLIENT_LOG,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_STALL_TIMEOUT,
    client_properties,
    require,
    unanswered,
)
from statestore.changelog.kafka.producer import KafkaProducer
from statestore.changelog.kafka.source import RestoreFeed, native_client, read_records, read_through_consumer
from statestore.changelog.protocol import DEFAULT_TRANSACTION_TIMEOUT_MS, PartitionLike
from statestore.changelog.segment_log import Record
from statestore.errors import ChangelogUnavailableError, LogError, TaskCorruptedError
from statestore.ids import TopicPartition, coerce_tp


class KafkaChangelog:
    """A changelog on a Kafka cluster: ``KafkaChangelog("broker:9092", **client_config)``.

    ``client_config`` holds librdkafka properties applied to every client
    (``security.protocol``, ``sasl.*``, ``ssl.*`` ...; underscores may stand
    for dots). Topics must exist (:func:`ensure_changelog_topics`).
    ``native=False`` restores through confluent-kafka even where the native
    fetcher could (for comparisons).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        restore_stall_timeout: float = DEFAULT_STALL_TIMEOUT,
        transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS,
        group_id: str = "statestore-restore",
        native: bool = True,
        **client_config: Any,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.request_timeout = request_timeout
        #: Seconds a restore may see no progress before giving up (read by the restore engine).
        self.restore_stall_timeout = restore_stall_timeout
        self.transaction_timeout_ms = transaction_timeout_ms
        #: Group id of the restore consumers; they never join the group nor commit offsets.
        self.group_id = group_id
        self._extra = client_properties(client_config)
        self._lock = threading.Lock()
        self._idle: dict[TopicPartition, list[RestoreFeed]] = {}
        # Transactional producers whose init_transactions still runs, by transactional id.
        self._initializing: dict[str, KafkaProducer] = {}
        self._watermark: dict[str, Any] = {}
        self._admin = KafkaAdmin(self)
        self._closed = False
        self._native = (
            native_client(
                self.client_config({}), request_timeout=request_timeout, stall_timeout=restore_stall_timeout
            )
            if native
            else None
        )
        if self._native is None:
            require()

    @property
    def native(self) -> _native.KafkaClient | None:
        """The native fetcher the restore engine reads this changelog with, None on the confluent-kafka path."""
        return self._native

    def __repr__(self) -> str:
        return f"KafkaChangelog({self.bootstrap_servers!r})"

    def client_config(self, conf: Mapping[str, Any]) -> dict[str, Any]:
        """A librdkafka configuration: ``bootstrap.servers``, then ``conf``, then the user's properties.

        Client logs go to the ``statestore.changelog.kafka.client`` logger (not stderr)
        unless the user's properties name a ``logger``.
        """
        return {"bootstrap.servers": self.bootstrap_servers, "logger": CLIENT_LOG, **conf, **self._extra}

    # -- offsets --------------------------------------------------------------------------------

    def _watermark_consumer(self, isolation: str) -> Any:
        with self._lock:
            c = self._watermark.get(isolation)
            if c is None:
                c = self._watermark[isolation] = require().Consumer(
                    self.client_config(
                        {
                            "group.id": self.group_id,
                            "isolation.level": isolation,
                            "enable.auto.commit": False,
                        }
                    )
                )
            return c

    def _watermarks(self, tp: TopicPartition, isolation: str) -> tuple[int, int]:
        ck = require()
        c = self._watermark_consumer(isolation)
        try:
            low, high = c.get_watermark_offsets(
                ck.TopicPartition(tp.topic, tp.partition), timeout=self.request_timeout, cached=False
            )
        except ck.KafkaException as e:
            raise (ChangelogUnavailableError if unanswered(e) else LogError)(
                f"changelog {tp} on {self.bootstrap_servers}: cannot read its offsets: {e}; "
                "does the topic exist (ensure_changelog_topics) and is the broker reachable?"
            ) from e
        return int(low), int(high)

    def offsets(self, tp: PartitionLike) -> tuple[int, int, int]:
        """``(start, end, last_stable)`` of ``tp``: earliest, latest, and latest under read_committed."""
        t = coerce_tp(tp)
        if self._native is not None:
            b = self._native.offsets(t.topic, t.partition)
            return b.start, b.end, b.last_stable
        start, end = self._watermarks(t, "read_uncommitted")
        _, lso = self._watermarks(t, "read_committed")
        return start, end, min(max(lso, start), end)

    def start_offset(self, tp: PartitionLike) -> int:
        """The first offset still in the log of ``tp`` (the low watermark)."""
        return self.offsets(tp)[0]

    def end_offset(self, tp: PartitionLike) -> int:
        """The log end offset of ``tp`` (the high watermark)."""
        return self.offsets(tp)[1]

    def last_stable_offset(self, tp: PartitionLike) -> int:
        """The last stable offset of ``tp`` (the high watermark a read_committed consumer sees)."""
        return self.offsets(tp)[2]

    def create(self) -> None:
        """Nothing to do here: changelog topics are created by :func:`ensure_changelog_topics`."""

    def abort_expired_transactions(self, timeout_ms: int) -> list[str]:
        """Nothing to do: the broker's transaction coordinator aborts expired transactions."""
        return []

    # -- producing ------------------------------------------------------------------------------

    def producer(
        self, transactional_id: str | None = None, config: Mapping[str, Any] | None = None
    ) -> KafkaProducer:
        """A producer; with ``transactional_id``, a transactional one (fences earlier ones of that id).

        ``config`` adds librdkafka producer properties (e.g. ``partitioner`` for records sent with
        ``partition=-1``); the user's client properties still win.

        A transactional producer whose ``init_transactions`` gave up unanswered (the cluster down
        for two request timeouts) is kept, and the next call for its id resumes that call on the
        same client (with the configuration it was made with) instead of making another:
        librdkafka asks for that, and has aborted the process when such a client was dropped for
        a new one.
        """
        if transactional_id is None:
            return KafkaProducer(self, None, config)
        with self._lock:
            held = self._initializing.pop(transactional_id, None)
        producer = (
            held if held is not None else KafkaProducer(self, transactional_id, config, initialize=False)
        )
        try:
            producer.initialize()
        except BaseException:
            if producer.initializing:
                with self._lock:
                    if not self._closed:
                        self._initializing[transactional_id] = producer
                        raise
            producer.close()
            raise
        return producer

    # -- restoring (the native fetcher is `native`; the FedChangelog side is the fallback) -----

    def restore_bounds(self, topic: str, partition: int) -> tuple[int, int, int]:
        """``(start, end, last_stable)`` for the restore engine."""
        return self.offsets(TopicPartition(topic, partition))

    def restore_feed(self, topic: str, partition: int, start: int) -> RestoreFeed:
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
            feed = RestoreFeed(self, tp)
        if not feed._assigned or feed.position() != start:
            feed.seek(start)
        return feed

    def _release(self, feed: RestoreFeed) -> None:
        with self._lock:
            if not self._closed:
                self._idle.setdefault(feed.tp, []).append(feed)
                return
        feed.shutdown()

    def read(
        self, tp: PartitionLike, start_offset: int | None = None, *, end_offset: int | None = None
    ) -> Iterator[Record]:
        """Yield the records of ``tp`` from ``start_offset`` to ``end_offset`` (default: the last stable offset).

        read_committed: no aborted records, no markers. Read by the restore
        engine's fetcher (on the fallback path, by a confluent-kafka consumer).
        """
        t = coerce_tp(tp)
        start, _end, lso = self.offsets(t)
        pos = start if start_offset is None else max(start_offset, start)
        end = lso if end_offset is None else end_offset
        if pos >= end:
            return
        if self._native is not None:
            yield from read_records(self._native, t, pos, end)
        else:
            yield from read_through_consumer(self, t, pos, end)

    def committed_records(self, tp: PartitionLike, start: int, end: int) -> int:
        """How many committed data records of ``tp`` lie in ``[start, end)`` (markers and aborted records are not)."""
        if end <= start:
            return 0
        return sum(1 for _ in self.read(tp, start, end_offset=end))

    # -- topics (statestore.changelog.kafka.admin) -------------------------------------------------------

    def admin(self) -> Any:
        """The changelog's confluent-kafka ``AdminClient``."""
        return self._admin.client()

    def topic_partitions(self, topic: str) -> int | None:
        """Number of partitions of ``topic``, None if it does not exist."""
        return self._admin.topic_partitions(topic)

    def topics(self) -> dict[str, int]:
        """Every topic of the cluster and its partition count."""
        return self._admin.topics()

    def partitions(self) -> list[TopicPartition]:
        """Every partition of every topic (internal topics excluded), sorted."""
        return self._admin.partitions()

    def topic_configs(self, topics: Iterable[str]) -> dict[str, dict[str, str]]:
        """Every config of each of ``topics`` by topic (a missing topic is left out): the kind of a
        Kafka Streams store shows in its changelog's (``statestore.state.store_kinds``)."""
        return self._admin.topic_configs(topics)

    def create_topics(
        self,
        topics: Mapping[str, int],
        *,
        config: Mapping[str, str] | None = None,
        replication_factor: int = -1,
    ) -> None:
        """Create ``topic -> partitions`` as compacted changelog topics (``cleanup.policy=compact``)."""
        self._admin.create_topics(topics, config=config, replication_factor=replication_factor)

    def delete_topics(self, topics: Iterable[str]) -> None:
        """Delete ``topics`` (missing ones are ignored). Restore consumers of them are dropped."""
        self._admin.delete_topics(topics)
        # librdkafka 2.16 crashed (rd_kafka_metadata_cache_find) in a consumer that had the topic
        # cached when it was recreated: start every client of this changelog afresh.
        self._close_clients()

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the idle restore consumers, the offset consumers, and producers still initializing."""
        with self._lock:
            self._closed = True
            initializing = list(self._initializing.values())
            self._initializing.clear()
        for p in initializing:
            # Asked once more first: a call that ends is closed as any producer is; one that does
            # not is left to the client's own teardown.
            with contextlib.suppress(LogError):
                p.initialize()
            p.close()
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

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


__all__ = ["DEFAULT_STALL_TIMEOUT", "KafkaChangelog", "KafkaProducer", "ensure_changelog_topics"]
