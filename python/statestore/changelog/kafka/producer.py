"""The changelog producer on a Kafka cluster (confluent-kafka ``Producer``), idempotent or transactional."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from statestore.changelog.kafka.common import kafka_error, require
from statestore.changelog.protocol import ClosesOnCleanExit, Header
from statestore.errors import (
    LogError,
    ProducerFencedError,
    TransactionInDoubtError,
    TransactionStateError,
)
from statestore.ids import TopicPartition

if TYPE_CHECKING:
    from statestore.changelog.kafka import KafkaChangelog

logger = logging.getLogger(__name__)

#: Pause between two attempts of a transactional call that failed at once with a retriable error.
_RETRY_BACKOFF_S = 0.1
#: What a commit is called in errors, and in ``_unsettled`` while it may still complete.
_COMMITTING = "committing the transaction"
#: What ``init_transactions`` is called in errors, and in ``_unsettled`` while it still runs.
_INITIALIZING = "initializing transactions"


class KafkaProducer(ClosesOnCleanExit):
    """A changelog producer on a Kafka cluster (confluent-kafka ``Producer``).

    Transactional when made with a transactional id: construction calls
    ``init_transactions`` (unless ``initialize=False``: then :meth:`initialize` does), which
    fences the previous producer of the id and aborts what it left open. ``send`` returns -1:
    the offset is known only once the record is delivered; :meth:`take_offsets` hands them out
    after :meth:`flush` or :meth:`commit`.
    """

    def __init__(
        self,
        changelog: KafkaChangelog,
        transactional_id: str | None,
        config: Mapping[str, Any] | None = None,
        *,
        initialize: bool = True,
    ) -> None:
        ck = require()
        self.transactional_id = transactional_id
        self._timeout = changelog.request_timeout
        self._bootstrap = changelog.bootstrap_servers
        conf: dict[str, Any] = {"enable.idempotence": True, "acks": "all", "linger.ms": 5, **(config or {})}
        if transactional_id is not None:
            conf["transactional.id"] = transactional_id
            conf["transaction.timeout.ms"] = changelog.transaction_timeout_ms
        self._producer = ck.Producer(changelog.client_config(conf))
        self._delivered: dict[TopicPartition, int] = {}
        self._failure: Any = None
        self._in_transaction = False
        self._closed = False
        self._fenced = False
        self._fatal = False
        # The transactional call (what it was doing) that failed with a retriable error and gave up:
        # it may still run in the client, which refuses any other until it is asked again.
        self._unsettled: str | None = None
        if transactional_id is not None and initialize:
            self.initialize()

    def initialize(self) -> None:
        """``init_transactions``: fence the previous producer of the transactional id and settle
        what it left open. One that keeps failing for want of an answer leaves the call running in
        the client (:attr:`initializing`); asked again, it resumes that call, as librdkafka wants
        (a client dropped while its call runs may abort the process)."""
        self._settle(_INITIALIZING, "init_transactions")

    @property
    def initializing(self) -> bool:
        """Whether ``init_transactions`` gave up unanswered and still runs in the client: call
        :meth:`initialize` again rather than make another producer of the id."""
        return self._unsettled == _INITIALIZING

    def _what(self) -> str:
        tid = f" (transactional id {self.transactional_id!r})" if self.transactional_id else ""
        return f"Kafka producer{tid} on {self._bootstrap}"

    def _call(self, what: str, method: str, *args: Any) -> Any:
        """The client's ``method(*args)``, its errors as statestore's. The method is named, not
        passed: a bound method in a frame of the error's traceback would keep the client alive
        after :meth:`close` (still retrying beside its successor)."""
        ck = require()
        self._check_open(what)
        try:
            return getattr(self._producer, method)(*args)
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

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise TransactionStateError(f"{self._what()}: {what}: the producer is closed")

    def _settle(self, what: str, method: str) -> None:
        """Call the client's transactional ``method(timeout)`` until it ends. The client resumes a call that
        failed with a retriable error (a timeout, the coordinator moving) when it is asked again,
        and refuses any other call meanwhile: so it is asked again until it succeeds, fails for
        good, or one more request timeout has passed. Then the last error is raised and the call
        stays unsettled (:attr:`fatal`)."""
        deadline: float | None = None
        while True:
            remaining = self._timeout if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                self._call(what, method, remaining)
            except LogError as e:
                err = kafka_error(e.__cause__) if e.__cause__ is not None else None
                if err is None or not err.retriable():
                    self._unsettled = None  # ended: fenced, fatal, or one that requires an abort
                    raise
                self._unsettled = what
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._timeout
                elif now >= deadline:
                    raise
                time.sleep(min(_RETRY_BACKOFF_S, deadline - now))
            else:
                self._unsettled = None
                return

    def _error(self, what: str, e: BaseException) -> LogError:
        ck = require()
        err = kafka_error(e)
        code = err.code() if err is not None else None
        if err is not None and err.fatal():
            self._fatal = True
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
            ck = require()
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
            raise self._error(what, require().KafkaException(failure))

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open."""
        return self._in_transaction

    @property
    def fatal(self) -> bool:
        """Whether the client hit a fatal error (fenced, or e.g. ``INVALID_TXN_STATE`` from an abort),
        or a transactional call of it gave up unsettled (a commit in doubt, an abort that kept
        timing out): it can do nothing else. A commit in doubt may be asked again (:meth:`commit`),
        which settles it once the coordinator answers; otherwise close it and make a new producer of
        the same transactional id."""
        return self._fatal or self._fenced or self._unsettled is not None

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
        """Queue one record; ``value=None`` is a tombstone. Returns -1 (see :meth:`take_offsets`).

        ``partition=-1`` lets the producer's partitioner choose (by the key).
        """
        self._check_open(f"sending to {topic}-{partition}")
        if self.transactional_id is not None and not self._in_transaction:
            raise TransactionStateError(f"{self._what()}: send outside a transaction; call begin() first")
        kw: dict[str, Any] = {"key": key, "value": value, "on_delivery": self._on_delivery}
        if partition >= 0:
            kw["partition"] = partition
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
            except require().KafkaException as e:
                raise self._error(f"sending to {topic}-{partition}", e) from e
        self._producer.poll(0)
        return -1

    def take_offsets(self) -> dict[TopicPartition, int]:
        """Offset of the last record delivered per partition since the previous call."""
        out, self._delivered = self._delivered, {}
        return out

    def flush(self) -> None:
        """Wait until every queued record is delivered (acks=all); raises if one failed."""
        left = self._call("flushing", "flush", self._timeout)
        if left:
            raise LogError(f"{self._what()}: {left} records still undelivered after {self._timeout:.0f} s")
        self._check_delivery("delivering records")

    def begin(self) -> None:
        """Open a transaction."""
        if self.transactional_id is None:
            raise TransactionStateError(f"{self._what()}: begin() on a producer without a transactional id")
        self._call("beginning a transaction", "begin_transaction")
        self._in_transaction = True

    def commit(self) -> None:
        """Flush and commit the open transaction; on failure the caller aborts (or closes, when fenced).

        A commit that keeps failing with retriable errors (see :meth:`_settle`) may still commit
        or abort: :class:`~statestore.errors.TransactionInDoubtError`, and this producer is
        :attr:`fatal` until :meth:`commit`, asked again, settles it.
        """
        self._call("flushing the transaction", "flush", self._timeout)
        self._check_delivery("delivering the transaction's records")
        try:
            self._settle(_COMMITTING, "commit_transaction")
        except LogError as e:
            if self._unsettled is None:
                raise
            raise TransactionInDoubtError(
                f"{self._what()}: committing the transaction kept failing for {2 * self._timeout:.0f} s "
                f"({e}): it may still commit or abort; ask the commit again, or replace the producer, and "
                "start the tasks again from what the changelog and the group coordinator hold"
            ) from e
        self._in_transaction = False

    def send_offsets(self, offsets: Mapping[TopicPartition, int], group_metadata: Any) -> None:
        """Add consumer positions to the open transaction (KIP-447): committed with it, or not at all.

        ``offsets`` maps each input partition to the next offset to consume;
        ``group_metadata`` is the consumer's ``consumer_group_metadata()``, so the
        group coordinator refuses the commit of a member that lost the partitions.
        """
        if not self._in_transaction:
            raise TransactionStateError(
                f"{self._what()}: send_offsets outside a transaction; call begin() first"
            )
        ck = require()
        parts = [ck.TopicPartition(tp.topic, tp.partition, off) for tp, off in sorted(offsets.items())]
        self._call(
            "sending input offsets to the transaction",
            "send_offsets_to_transaction",
            parts,
            group_metadata,
            self._timeout,
        )

    def abort(self) -> None:
        """Abort the open transaction (its records become invisible to read_committed consumers).

        Not while its commit is in doubt: the client refuses; the commit asked again, or a new
        producer, settles it.
        An abort that keeps failing with retriable errors leaves this producer :attr:`fatal`; its
        successor aborts the transaction.
        """
        self._delivered.clear()
        self._failure = None
        if self._closed:
            # closing aborted what it could; the rest is its successor's, or the transaction timeout's
            self._in_transaction = False
            return
        try:
            if self._unsettled == _COMMITTING:
                raise TransactionInDoubtError(
                    f"{self._what()}: cannot abort a transaction whose commit may still complete; "
                    "ask the commit again, or replace the producer"
                )
            self._settle("aborting the transaction", "abort_transaction")
        finally:
            self._in_transaction = False

    def close(self) -> None:
        """Flush what is queued and close the client, aborting an open transaction (asked again for
        at most two request timeouts, as :meth:`abort`). A transaction the client cannot abort
        (fenced, fatal, its commit failed and may still complete, or the abort got no answer) is
        left to the next producer of the id, or to the transaction timeout; the client is let go at
        once, whatever it was still retrying, and what it raises on the way out is logged."""
        if self._closed:
            return
        if self._in_transaction and not self.fatal:
            # the client's own close would ask its abort with no time limit
            try:
                self.abort()
            except Exception as e:  # closing goes on whatever the abort met
                logger.warning("%s: aborting the open transaction on close failed: %s", self._what(), e)
        self._closed = True
        try:
            if self.fatal or self._in_transaction:
                # The client's close would abort the transaction first, which it refuses here (or
                # waits for without end): drop what is queued, let the client go.
                try:
                    self._producer.purge(in_queue=True, in_flight=True, blocking=False)
                    self._producer.poll(0)
                except (require().KafkaException, SystemError):
                    pass  # the purged records' callbacks report the fatal error again: it is known
                return
            try:
                self._producer.flush(self._timeout)
                self._producer.close()
            except (require().KafkaException, SystemError) as e:
                # e.g. a fatal error (fenced) the client learnt after its last call
                logger.warning("%s: closing: %s", self._what(), e)
        finally:
            # The client goes now, not whenever the last reference does: one that still retries a
            # transactional call beside its successor (same transactional id) races it at the
            # transaction coordinator.
            self._producer = None


__all__ = ["KafkaProducer"]
