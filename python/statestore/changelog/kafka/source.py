"""Restoring from Kafka: the native fetcher, and confluent-kafka as its fallback.

The restore engine reads a :class:`~statestore.changelog.kafka.KafkaChangelog` through
``_native.KafkaClient`` (``rust/src/kafka``): the broker's record batches go
straight to the engine's decoder, which applies the aborted-transaction list
and markers itself, with the GIL released for the whole restore. The same
client serves the changelog's offsets (ListOffsets) and :func:`read_records`
(``KafkaChangelog.read``).

A configuration the native fetcher cannot honour (a SASL mechanism other than
PLAIN or SCRAM, a keystore, a CA directory...) or a TLS handshake rustls
refuses when the client is made (a certificate naming the host only in its
CN, an old protocol or suite) falls back, with one log line saying why, to
:class:`RestoreFeed`: a confluent-kafka read_committed consumer the engine
pulls through Python (``rust/src/py/feed.rs``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from statestore import _native
from statestore.changelog.kafka.common import POLL_TIMEOUT, PYTHON_KEYS, require
from statestore.changelog.segment_log import Record
from statestore.errors import LogError, TaskCorruptedError
from statestore.ids import TopicPartition

if TYPE_CHECKING:
    from statestore.changelog.kafka import KafkaChangelog

logger = logging.getLogger(__name__)

#: Bytes of log per ``KafkaChangelog.read`` chunk.
READ_CHUNK_BYTES = 4 << 20


def native_properties(conf: Mapping[str, Any]) -> dict[str, str]:
    """The string properties of a confluent-kafka configuration (callbacks and loggers left out)."""
    out: dict[str, str] = {}
    for k, v in conf.items():
        if k in PYTHON_KEYS or callable(v) or v is None:
            continue
        out[k] = ("true" if v else "false") if isinstance(v, bool) else str(v)
    return out


def native_client(
    conf: Mapping[str, Any], *, request_timeout: float, stall_timeout: float
) -> _native.KafkaClient | None:
    """A native client for ``conf``, or None (logged once, with the reason) when it cannot serve it."""
    props = native_properties(conf)
    why = _native.KafkaClient.unsupported(props)
    client = None
    if why is None:
        client = _native.KafkaClient(props, request_timeout, stall_timeout)
        # A TLS setup rustls refuses (a certificate naming the host only in its CN, an old protocol or
        # suite) shows only in a handshake: one connection tells, and is kept for the first request.
        why = client.tls_refused()
    if why is not None:
        logger.warning(
            "restoring from %s through confluent-kafka, not the native fetcher: %s",
            props.get("bootstrap.servers", "?"),
            why,
        )
        return None
    return client


def read_records(client: _native.KafkaClient, tp: TopicPartition, start: int, end: int) -> Iterator[Record]:
    """The committed records of ``tp`` in ``[start, end)``, read by the engine's fetcher a chunk at a time."""
    reader = client.reader(tp.topic, tp.partition, start)
    while True:
        rows = reader.poll(end, READ_CHUNK_BYTES)
        if not rows:
            return
        for o, k, v, ts, h in rows:
            yield Record(o, k, v, ts, tuple(h))


class RestoreFeed:
    """A read_committed consumer assigned to one partition, used by the restore engine (the fallback: see FedChangelog)."""

    def __init__(self, changelog: KafkaChangelog, tp: TopicPartition) -> None:
        ck = require()
        self.changelog = changelog
        self.tp = tp
        self._ktp = ck.TopicPartition(tp.topic, tp.partition)
        self._consumer = ck.Consumer(
            changelog.client_config(
                {
                    "group.id": changelog.group_id,
                    "isolation.level": "read_committed",
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "auto.offset.reset": "error",
                    "enable.partition.eof": True,
                    # At the end of the log a fetch waits this long for data before it comes back
                    # empty (the end-of-partition event); a restore's tail should not wait 500 ms.
                    "fetch.wait.max.ms": 50,
                }
            )
        )
        self._assigned = False

    def seek(self, start: int) -> None:
        """Position the consumer at ``start`` (assign; drops what was fetched ahead)."""
        self._ktp = require().TopicPartition(self.tp.topic, self.tp.partition, start)
        self._consumer.assign([self._ktp])
        self._assigned = True

    def poll(self, max_records: int) -> list[Any]:
        """Up to ``max_records`` messages (the end-of-partition event among them)."""
        msgs: list[Any] = self._consumer.consume(num_messages=max_records, timeout=POLL_TIMEOUT)
        return msgs

    def on_error(self, msg: Any) -> bool:
        """True for the end of the partition; raises for an offset out of range or a fatal error."""
        ck = require()
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


def read_through_consumer(
    changelog: KafkaChangelog, tp: TopicPartition, pos: int, end: int
) -> Iterator[Record]:
    """:func:`read_records` for a changelog the native fetcher cannot serve: a :class:`RestoreFeed`'s messages."""
    feed = changelog.restore_feed(tp.topic, tp.partition, pos)
    deadline = time.monotonic() + changelog.restore_stall_timeout
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
                    hs = tuple((k, v) for k, v in (m.headers() or []))
                    yield Record(o, m.key(), m.value(), m.timestamp()[1], hs)
                    pos, progressed = o + 1, True
            p = feed.position()
            if p is not None and p > pos:
                pos, progressed = min(p, end), True
            if progressed:
                deadline = time.monotonic() + changelog.restore_stall_timeout
            elif at_end or time.monotonic() > deadline:
                return
    finally:
        feed.close()


__all__ = [
    "READ_CHUNK_BYTES",
    "RestoreFeed",
    "native_client",
    "native_properties",
    "read_records",
    "read_through_consumer",
]
