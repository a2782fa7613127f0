"""The application runner: a confluent-kafka consumer group over a :class:`TaskManager`.

One instance = one consumer (group id = application id), one transactional
producer (the task manager's record collector: changelog writes, output
records and input positions go through it), one task manager over the
instance's state directory. The loop:

1. ``consume()`` a bounded batch (rebalance callbacks run inside it);
2. ``TaskManager.poll(commit=False)``: at most a time slice of restoration;
   the input partitions of a task stay paused until it is RUNNING;
3. each record goes to the processing function with its task's stores;
4. on the commit interval, one commit (exactly-once: output, changelog and
   ``send_offsets_to_transaction`` in one transaction; then the stores apply
   their staged writes with their offsets).

After an aborted transaction the input of every task is sought back to its
last committed position, so nothing is lost or counted twice.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from statestore.changelog.kafka import KafkaChangelog, ensure_changelog_topics
from statestore.changelog.kafka.common import client_properties, require, unanswered
from statestore.changelog.protocol import Header
from statestore.errors import (
    ApplicationError,
    ChangelogUnavailableError,
    LogError,
    ProcessingError,
    ProducerFencedError,
    StateStoreError,
    TaskCorruptedError,
    TransactionInDoubtError,
)
from statestore.ids import TaskId, TopicPartition, changelog_topic
from statestore.ops.metrics import MetricsPublisher, RestoreMetrics
from statestore.processing.task import ActiveTask, TaskState, TaskStore, store_formats
from statestore.processing.task_manager import TaskManager
from statestore.state.policy import Guarantee
from statestore.state.store import KEY_VALUE_FORMATS

logger = logging.getLogger(__name__)


def _corrupted_tasks(error: TaskCorruptedError) -> list[TaskId]:
    """The tasks ``error`` says are corrupted, sorted."""
    return sorted(t for t in error.task_ids if isinstance(t, TaskId))


#: The one subtopology: task ``0_p`` owns partition ``p`` of every input topic.
SUBTOPOLOGY = 0
#: Group protocols the runner speaks (see docs/app.md for why ``classic`` is the default).
GROUP_PROTOCOLS = ("classic", "consumer")
#: Default commit interval under exactly-once (Kafka Streams' default), in ms.
EOS_COMMIT_INTERVAL_MS = 100
#: Default commit interval under at-least-once (Kafka Streams' default), in ms.
ALOS_COMMIT_INTERVAL_MS = 30_000
#: Default transaction timeout: a dead instance's open transaction blocks its successor at most this long.
APP_TRANSACTION_TIMEOUT_MS = 10_000
#: Seconds between two placements of standby tasks (and after every assignment).
STANDBY_REFRESH_S = 5.0
#: Seconds between two metric snapshots the loop publishes for ``statestore inspect``/``watch``.
PUBLISH_INTERVAL_S = 1.0
#: Seconds between two updates of the standby tasks while every active task runs: each update asks
#: the broker for the changelogs' ends and fetches what is new, so updating after every batch of
#: input would cost the processing a round trip per batch; a standby lags by about this much more.
STANDBY_UPDATE_INTERVAL_S = 0.25
#: Seconds of a round spent restoring while a task restores (its input is paused meanwhile).
RESTORE_SLICE_S = 0.1
#: Seconds the loop waits for each request that wakes a leader's fetcher after a resume (:meth:`App._wake_fetchers`).
WAKE_TIMEOUT_S = 1.0
#: Default seconds the application keeps trying to start its tasks again while the cluster does not
#: answer (Kafka Streams' ``task.timeout.ms`` default, 5 minutes).
DEFAULT_TASK_TIMEOUT = 300.0
#: Seconds between two tries of a call the cluster did not answer (each try waits its own timeout first).
_UNANSWERED_BACKOFF_S = 1.0
#: Seconds between two log lines saying a changelog still gives no answer.
_UNANSWERED_LOG_INTERVAL_S = 10.0

_T = TypeVar("_T")


@dataclass(frozen=True)
class Record:
    """One input record as the processing function gets it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: Sequence[Header] | None = None


class Context:
    """What the processing function may touch: its task's stores and the output.

    ``store(name)`` is the task's :class:`~statestore.processing.task.TaskStore`
    (reads see the task's own uncommitted writes; writes are staged and sent to
    the changelog); :meth:`send` sends an output record. Under exactly-once
    both are part of the task's open transaction.
    """

    def __init__(self, app: App, task: ActiveTask) -> None:
        self._app = app
        self._task = task
        self.task_id: TaskId = task.id

    def store(self, name: str) -> TaskStore:
        """The store ``name`` of this task."""
        return self._task.store(name)

    def send(
        self,
        key: bytes | None,
        value: bytes | None,
        *,
        topic: str | None = None,
        partition: int | None = None,
        headers: Sequence[Header] | None = None,
        timestamp: int | None = None,
    ) -> None:
        """Send one output record to ``topic`` (default: the application's one output topic).

        ``partition=None`` lets the producer's partitioner choose by the key
        (librdkafka's ``consistent_random``, unless the client config names a ``partitioner``).
        """
        self._app._send_output(key, value, topic, -1 if partition is None else partition, headers, timestamp)


Process = Callable[[Record, Context], None]


class App:
    """A stateful application instance on Kafka.

    ``App(application_id, bootstrap_servers, input_topics=[...], stores={"counts": "plain"},
    process=fn, output_topics=["out"], state_dir="/var/lib/app")`` then :meth:`run`.

    * ``input_topics`` must exist and have the same number of partitions (co-partitioned);
      ``output_topics`` must exist. Changelog topics ``<application_id>-<store>-changelog``
      are created (compacted) with that many partitions.
    * ``stores`` maps each store name to its format: ``"plain"``, or ``"timestamped"`` (Kafka
      Streams' timestamped key-value store: values are ``encode_timestamped(ts, value)`` bytes,
      as a Kafka Streams application reading the same changelog expects); a list of names
      means plain stores.
    * ``process(record, ctx)`` runs once per input record, inside the task's transaction under
      exactly-once; if it raises, the transaction is aborted and the application stops with
      :class:`~statestore.errors.ProcessingError` naming the task, partition and offset.
    * ``guarantee``: ``"exactly_once_v2"`` (default) or ``"at_least_once"``.
    * ``num_standby_replicas``: each task has up to that many standbys on other instances, placed
      from the group's membership (see :meth:`_place_standbys`); a task that moves to an instance
      holding its standby restores only what the standby had not applied.
    * ``client_config``: librdkafka properties for every client (security, ...);
      ``consumer_config``: for the group consumer only (``session.timeout.ms``, ...).
    * ``group_protocol``: ``"classic"`` (default; range assignor) or ``"consumer"`` (KIP-848 with
      the server-side range assignor).
    * ``request_timeout`` (seconds): how long one request to the cluster may take; a transactional
      call is asked again for as long once more before it fails.
    * ``task_timeout`` (seconds, Kafka Streams' ``task.timeout.ms``): how long the application
      keeps trying while the cluster does not answer -- to start its tasks again (a new producer,
      the group's committed offsets), or to restore and update tasks whose changelogs give no
      answer (the running tasks go on meanwhile) -- before it stops with the error; 0 tries once.
    * ``publish_metrics``: the loop writes a snapshot of :attr:`metrics` (restores, standbys, each
      task's state, standby hits, liveness) under ``<state_dir>/<application_id>/.metrics/`` every
      second, for ``statestore inspect``/``watch`` in another process; serve :attr:`metrics` to
      Prometheus with :func:`statestore.ops.exporter.start_exporter`.
    """

    def __init__(
        self,
        application_id: str,
        bootstrap_servers: str,
        *,
        input_topics: Iterable[str],
        process: Process,
        stores: Mapping[str, str] | Iterable[str],
        state_dir: str | Path,
        output_topics: Iterable[str] = (),
        guarantee: Guarantee | str = "exactly_once_v2",
        num_standby_replicas: int = 0,
        commit_interval_ms: int | None = None,
        transaction_timeout_ms: int = APP_TRANSACTION_TIMEOUT_MS,
        group_protocol: str = "classic",
        instance_id: str | None = None,
        client_config: Mapping[str, Any] | None = None,
        consumer_config: Mapping[str, Any] | None = None,
        max_poll_records: int = 500,
        request_timeout: float = 30.0,
        task_timeout: float = DEFAULT_TASK_TIMEOUT,
        publish_metrics: bool = True,
    ) -> None:
        self.application_id = application_id
        self.bootstrap_servers = bootstrap_servers
        self.input_topics = list(dict.fromkeys(input_topics))
        if not self.input_topics:
            raise ValueError("an application needs at least one input topic")
        self.output_topics = list(dict.fromkeys(output_topics))
        self.process = process
        self.stores = _store_formats(stores)
        self.state_dir = Path(state_dir)
        self.guarantee = Guarantee(guarantee) if isinstance(guarantee, str) else guarantee
        self.eos = self.guarantee is Guarantee.EXACTLY_ONCE_V2
        if num_standby_replicas < 0:
            raise ValueError(f"num_standby_replicas must be >= 0, got {num_standby_replicas}")
        self.num_standby_replicas = num_standby_replicas
        if commit_interval_ms is None:
            commit_interval_ms = EOS_COMMIT_INTERVAL_MS if self.eos else ALOS_COMMIT_INTERVAL_MS
        self.commit_interval = commit_interval_ms / 1000
        self.transaction_timeout_ms = transaction_timeout_ms
        if group_protocol not in GROUP_PROTOCOLS:
            raise ValueError(
                f"group_protocol must be one of {', '.join(GROUP_PROTOCOLS)}, got {group_protocol!r}"
            )
        self.group_protocol = group_protocol
        self.instance_id = instance_id
        self.client_config = dict(client_config or {})
        self.consumer_config = client_properties(consumer_config or {})
        self.max_poll_records = max_poll_records
        self.request_timeout = request_timeout
        if not task_timeout >= 0:
            raise ValueError(f"task_timeout must be >= 0 seconds, got {task_timeout}")
        self.task_timeout = task_timeout

        self.changelog: KafkaChangelog | None = None
        self.task_manager: TaskManager | None = None
        self.partitions = 0
        self._consumer: Any = None
        self._stop = threading.Event()
        self._closed = False
        # Input partitions assigned to this instance, paused ones among them.
        self._assigned: set[TopicPartition] = set()
        self._paused: set[TopicPartition] = set()
        # Next offset to process per input partition; last committed position; processed since the commit.
        self._next: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._dirty: set[TopicPartition] = set()
        self._contexts: dict[TaskId, Context] = {}
        # Standby tasks this instance holds for tasks other members own (num_standby_replicas > 0).
        self._standbys: set[TaskId] = set()
        self._standby_due = 0.0
        # The group description a placement of standbys waits for (it never blocks the loop).
        self._describing: Any = None
        self._standby_update_due = 0.0
        self._before_rebalance: set[TaskId] = set()
        self._assignments = 0
        self._rebalancing = False
        self._rewinds = 0
        # Since when (monotonic) the task manager's changelogs give no answer, and when it was last said.
        self._unanswered_since: float | None = None
        self._unanswered_said = 0.0
        self._close_clean = True
        self._callback_error: BaseException | None = None
        self._last_commit = time.monotonic()
        #: Records processed (again, after an abort), commits made, transactions aborted.
        self.processed = 0
        self.commits = 0
        self.aborts = 0
        #: Times the producer was fenced and every task started again from its last commit.
        self.migrations = 0
        #: Tasks that moved to this instance and found a standby here (hit) or not (miss).
        self.standby_hits = 0
        self.standby_misses = 0
        #: Restore and standby metrics, task states, standby hits and liveness of this instance.
        self.metrics = RestoreMetrics(application_id)
        self.metrics.task_states = self.task_states
        self.metrics.liveness = self.liveness
        self.publish_metrics = publish_metrics
        self._publisher: MetricsPublisher | None = None
        self._published = 0.0
        self._state = "CREATED"
        self._last_poll: float | None = None
        # Tasks that moved in and are not RUNNING yet: whether each found a standby here.
        self._promoting: dict[TaskId, bool] = {}

    def __repr__(self) -> str:
        return f"App({self.application_id!r}, {self.bootstrap_servers!r}, inputs={self.input_topics})"

    # -- start ------------------------------------------------------------------------------

    def start(self) -> None:
        """Check the topics, create the changelog topics, open the task manager and join the group."""
        if self._consumer is not None:
            return
        if self._closed:
            raise ApplicationError(f"{self!r} is closed")
        ck = require()
        self.changelog = KafkaChangelog(
            self.bootstrap_servers,
            request_timeout=self.request_timeout,
            transaction_timeout_ms=self.transaction_timeout_ms,
            group_id=f"{self.application_id}-restore",
            **self.client_config,
        )
        try:
            self.partitions = self._check_topics(self.changelog)
            ensure_changelog_topics(self.changelog, self.application_id, list(self.stores), self.partitions)
            self.task_manager = TaskManager(
                self.state_dir,
                self.changelog,
                self.stores,
                guarantee=self.guarantee,
                application_id=self.application_id,
                commit_interval_ms=max(1, int(self.commit_interval * 1000)),
                transaction_timeout_ms=self.transaction_timeout_ms,
                client_id=self.instance_id,
                metrics=self.metrics,
                # Restore and standby chunks run on a thread of their own (the engine releases the
                # GIL), so a standby update overlaps the processing instead of stopping it.
                background_restore=True,
            )
            self._state = "STARTING"
            if self.publish_metrics:
                self._publisher = MetricsPublisher(self.metrics, self.state_dir, interval=PUBLISH_INTERVAL_S)
                self._publish()
            # Under exactly-once its producer's init_transactions fences our previous incarnation.
            self._until_answered("starting the task manager", self.task_manager.start)
            conf: dict[str, Any] = {
                "group.id": self.application_id,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
            }
            if self.group_protocol == "classic":
                conf["partition.assignment.strategy"] = "range"
            else:
                conf["group.protocol"] = "consumer"
                conf["group.remote.assignor"] = "range"
            if self.instance_id is not None:
                conf["group.instance.id"] = self.instance_id
            conf.update(self.consumer_config)
            self._consumer = ck.Consumer(self.changelog.client_config(conf))
            self._consumer.subscribe(
                self.input_topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
            )
        except BaseException:
            self._close_quietly()
            raise
        self._last_commit = time.monotonic()

    def _check_topics(self, changelog: KafkaChangelog) -> int:
        topics = changelog.topics()
        missing = [t for t in self.input_topics if t not in topics]
        if missing:
            raise ApplicationError(
                f"application {self.application_id}: input topic(s) {', '.join(missing)} do not exist on "
                f"{self.bootstrap_servers}; create them (co-partitioned: the same partition count) first",
                topic=missing[0],
            )
        counts = {t: topics[t] for t in self.input_topics}
        if len(set(counts.values())) > 1:
            listed = ", ".join(f"{t} has {n}" for t, n in counts.items())
            raise ApplicationError(
                f"application {self.application_id}: input topics are not co-partitioned ({listed} partitions); "
                "task 0_p owns partition p of every input topic, so they must have the same partition count",
                topic=max(counts, key=lambda t: counts[t]),
            )
        missing = [t for t in self.output_topics if t not in topics]
        if missing:
            raise ApplicationError(
                f"application {self.application_id}: output topic(s) {', '.join(missing)} do not exist on "
                f"{self.bootstrap_servers}; create them before starting (records sent to a missing topic "
                "would fail the transaction)",
                topic=missing[0],
            )
        return counts[self.input_topics[0]]

    # -- running ------------------------------------------------------------------------------

    def run(self, *, until: Callable[[], bool] | None = None, handle_signals: bool = True) -> None:
        """Start, process until :meth:`stop` (SIGTERM or SIGINT when run on the main thread) or
        ``until()`` is true, then close cleanly: commit, stores closed, group left.

        An error (a :class:`~statestore.errors.ProcessingError`, a fatal consumer...) closes the
        instance without committing anything more and is raised. A fenced producer is not an error:
        the tasks start again from their last commit (see :meth:`commit`).
        """
        previous: dict[signal.Signals, Any] = {}
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda *_: self._stop.set())
        try:
            self.start()
            while not self._stop.is_set() and not (until is not None and until()):
                self.poll_once()
        except BaseException:
            self.close(clean=False)
            raise
        else:
            self.close()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def stop(self) -> None:
        """Ask :meth:`run` to close cleanly after the current batch (thread-safe)."""
        self._stop.set()

    def poll_once(self, timeout: float = 0.1) -> int:
        """One round: consume a batch, restore for a time slice, process, commit on the interval.

        Returns the number of records processed.
        """
        self.start()
        tm, consumer = self._tm(), self._consumer
        msgs = consumer.consume(self.max_poll_records, timeout if not self._paused else min(timeout, 0.01))
        self._last_poll = time.time()
        self._raise_callback_error()
        # Restoration (a task not RUNNING) goes on every round for a time slice, chunk after chunk;
        # standbys are updated on their interval, without waiting: their chunk runs on the task
        # manager's restore thread and a later round collects it.
        now = time.monotonic()
        if self._paused or not tm.all_running():
            deadline = now + RESTORE_SLICE_S
            while True:
                answered = self._poll_tasks(max(0.0, deadline - time.monotonic()))
                if not answered or tm.all_running() or not tm.updater.made_progress:
                    break  # done, blocked (e.g. on an open transaction or an unanswered changelog)
                if time.monotonic() >= deadline:
                    break  # the slice is spent
        elif now >= self._standby_update_due:
            self._standby_update_due = now + STANDBY_UPDATE_INTERVAL_S
            self._poll_tasks(0.0)
        if self._paused:
            self._resume_running()
        done = 0
        rewinds = self._rewinds
        for msg in msgs:
            if msg.error() is not None:
                self._consumer_error(msg.error())
                continue
            if self._handle(msg):
                done += 1
            if self._rewinds != rewinds:
                break  # sought back: the rest of this batch comes again
            if self.commit_interval > 0 and time.monotonic() - self._last_commit >= self.commit_interval:
                # Within the batch too (an interval of 0 commits once a batch): a batch slower than
                # the transaction timeout would otherwise be aborted by the broker, and come again.
                self.commit()
                if self._rewinds != rewinds:
                    break
        if time.monotonic() - self._last_commit >= self.commit_interval:
            self.commit()
        if self.num_standby_replicas and not self._rebalancing:
            if self._describing is not None and self._describing.done():
                self._place_standbys()
            elif self._describing is None and time.monotonic() >= self._standby_due:
                self._describe_group()
        if self._publisher is not None and time.monotonic() - self._published >= PUBLISH_INTERVAL_S:
            self._publish()
        return done

    def _poll_tasks(self, timeout: float) -> bool:
        """Restore and update the tasks for up to ``timeout`` seconds; whether every changelog answered.

        A changelog whose cluster gives no answer holds back only the tasks it feeds; the running
        tasks go on, and the task manager asks it again next round. After ``task_timeout`` seconds
        without an answer the error is raised (the instance stops), as Kafka Streams does.
        """
        try:
            self._tm().poll(timeout, commit=False)
        except LogError as e:
            if not unanswered(e):
                raise
            now = time.monotonic()
            if self._unanswered_since is None:
                self._unanswered_since = now
            silent = now - self._unanswered_since
            if silent > self.task_timeout:
                raise ChangelogUnavailableError(
                    f"{self.application_id}: changelogs gave no answer for {silent:.0f} s, more than "
                    f"task_timeout ({self.task_timeout:.0f} s): {e}"
                ) from e
            if now - self._unanswered_said >= _UNANSWERED_LOG_INTERVAL_S:
                self._unanswered_said = now
                logger.warning(
                    "%s: a changelog gives no answer (%s); its tasks wait, the others go on; trying again "
                    "for up to %.0f s more (task_timeout)",
                    self.application_id,
                    e,
                    self.task_timeout - silent,
                )
            return False
        if self._unanswered_since is not None:
            logger.info(
                "%s: the changelogs answer again after %.0f s",
                self.application_id,
                time.monotonic() - self._unanswered_since,
            )
            self._unanswered_since = None
            self._unanswered_said = 0.0
        return True

    def _publish(self) -> None:
        """Write a metrics snapshot (from the loop's thread: the task manager is not thread-safe)."""
        self._published = time.monotonic()
        if self._publisher is None:
            return
        try:
            self._publisher.publish()
        except OSError as e:  # the next one tries again
            logger.debug("%s: publishing metrics: %s", self.application_id, e)

    def _handle(self, msg: Any) -> bool:
        tp = TopicPartition(msg.topic(), msg.partition())
        offset = msg.offset()
        if tp not in self._assigned:
            return False  # revoked meanwhile
        expected = self._next.get(tp)
        if expected is not None and offset < expected:
            return False  # already processed (fetched before a seek back)
        tid = TaskId(SUBTOPOLOGY, tp.partition)
        try:
            task = self._tm().active_task(tid)
        except KeyError:
            task = None
        if task is None or task.state is not TaskState.RUNNING:
            # Paused too late: remember where to go on from when the task runs.
            if expected is None:
                self._next[tp] = offset
            if tp not in self._paused:
                self._consumer.pause([require().TopicPartition(tp.topic, tp.partition)])
                self._paused.add(tp)
            return False
        ctx = self._contexts.get(tid)
        if ctx is None or ctx._task is not task:
            ctx = self._contexts[tid] = Context(self, task)
        ts = msg.timestamp()
        record = Record(
            tp.topic, tp.partition, offset, msg.key(), msg.value(), ts[1] if ts else -1, msg.headers()
        )
        try:
            self.process(record, ctx)
        except ProducerFencedError as e:  # from a store write or a send: not the function's fault
            self._migrated(e)
            return False
        except TaskCorruptedError as e:  # a store read or write found damaged files: neither
            ids = _corrupted_tasks(e)
            if not ids:
                raise
            self._abort(f"task(s) {', '.join(map(str, ids))} found corrupted")
            self._repair(ids, e)
            return False
        except LogError as e:
            logger.warning("%s: sending failed (%s); rolling back to the last commit", self.application_id, e)
            self._abort(f"sending failed: {e}")
            return False
        except Exception as e:
            self._abort(f"the processing function raised on {tp} at offset {offset}")
            raise ProcessingError(
                f"application {self.application_id}: the processing function raised on task {tid}, "
                f"input {tp} at offset {offset}: {e!r}; the open transaction was aborted and nothing of it "
                "was applied; fix the function (or the record) and restart: processing goes on from the "
                "last commit",
                task_id=tid,
                topic=tp.topic,
                partition=tp.partition,
                offset=offset,
            ) from e
        self._next[tp] = offset + 1
        self._dirty.add(tp)
        self.processed += 1
        return True

    def _send_output(
        self,
        key: bytes | None,
        value: bytes | None,
        topic: str | None,
        partition: int,
        headers: Sequence[Header] | None,
        timestamp: int | None,
    ) -> None:
        if topic is None:
            if len(self.output_topics) != 1:
                raise ValueError(
                    f"application {self.application_id} has {len(self.output_topics)} output topics: "
                    "name the topic to send to"
                )
            topic = self.output_topics[0]
        elif topic not in self.output_topics:
            raise ValueError(
                f"{topic!r} is not an output topic of {self.application_id}: {self.output_topics}"
            )
        self._tm().collector.send_record(topic, partition, key, value, headers, timestamp=timestamp)

    def _consumer_error(self, err: Any) -> None:
        ck = require()
        # librdkafka reports a fatal consumer error (e.g. a static member fenced by a newer one with the
        # same group.instance.id) as an event of code _FATAL whose fatal() is False.
        if err.fatal() or err.code() == ck.KafkaError._FATAL:
            raise ApplicationError(
                f"application {self.application_id}: the group consumer failed fatally: {err.str()}; "
                "this instance stops (another instance with the same instance_id took its place?)"
            )
        if err.code() == ck.KafkaError._PARTITION_EOF:
            return
        logger.warning("%s: consumer error: %s", self.application_id, err)

    # -- commit and abort --------------------------------------------------------------------

    def commit(self) -> bool:
        """Commit now: exactly-once, one transaction with output, changelog and input positions,
        then the stores apply their writes; at-least-once, flush, apply, then commit the input offsets.

        Returns False when the commit failed and was rolled back (the input is sought back to the
        last commit; a fenced producer is replaced and every task starts again from its last
        commit), or was in doubt (every task starts again from what the changelog and the group
        coordinator hold, whichever way it ended). Never runs while a rebalance is in progress
        (returns False).
        """
        self._last_commit = time.monotonic()
        if self._rebalancing or self.task_manager is None:
            return False
        tm = self.task_manager
        pending = {tp: self._next[tp] for tp in self._dirty if tp in self._next}
        try:
            if self.eos:
                if pending:
                    tm.collector.send_offsets(pending, self._consumer.consumer_group_metadata())
                tm.commit()
            else:
                tm.commit()
                if pending:
                    ck = require()
                    self._consumer.commit(
                        offsets=[
                            ck.TopicPartition(tp.topic, tp.partition, off) for tp, off in pending.items()
                        ],
                        asynchronous=False,
                    )
        except ProducerFencedError as e:
            self._migrated(e)
            return False
        except TransactionInDoubtError as e:
            self._in_doubt(e)
            return False
        except TaskCorruptedError as e:
            # Raised once the changelog commit succeeded (exactly-once: with the input offsets; at-least-
            # once: before them, which the next commit sends): every write is in the changelog, and
            # only these tasks' local state is damaged.
            ids = _corrupted_tasks(e)
            if not ids:
                raise
            if self.eos:
                self._committed.update(pending)
                self._dirty.clear()
            self.commits += 1
            self._repair(ids, e)
            return True
        except (LogError, require().KafkaException) as e:
            logger.warning("%s: commit failed (%s); rolling back to the last commit", self.application_id, e)
            self._abort(f"commit failed: {e}")
            return False
        self._committed.update(pending)
        self._dirty.clear()
        self.commits += 1
        return True

    def _abort(self, why: str) -> None:
        """Abort the open transaction, drop every task's staged writes, seek the input back."""
        self.aborts += 1
        tm = self._tm()
        try:
            tm.collector.abort()
        except StateStoreError as e:
            logger.warning("%s: aborting the transaction failed (%s)", self.application_id, e)
        for task in tm.active_tasks().values():
            task.abort()
        self._replace_if_dead()
        self._rewind(self._assigned)
        logger.info(
            "%s: transaction aborted (%s); input sought back to the last commit", self.application_id, why
        )

    def _replace_if_dead(self, deadline: float | None = None) -> bool:
        """Replace a producer that went fatal (same transactional id) within ``deadline``; whether
        it was."""
        tm = self._tm()
        if not tm.collector.failed:
            return False
        logger.warning("%s: the producer is dead; replacing it (same transactional id)", self.application_id)
        self._until_answered("replacing the producer", tm.collector.renew, deadline)
        return True

    def _migrated(self, error: ProducerFencedError) -> None:
        """The producer was fenced: the broker aborted our transaction (it outlived
        ``transaction.timeout.ms``: this instance stalled) or bumped our epoch. As Kafka Streams does
        for a ``TaskMigratedException``: every active task closes dirty, a new producer of the same
        transactional id is made, and the tasks start again from their last commit. If the group
        gave them away meanwhile, the revocation or loss that follows closes them."""
        self.migrations += 1
        logger.warning(
            "%s: the producer was fenced (%s); closing every task dirty and starting again from the last commit",
            self.application_id,
            error,
        )
        self._start_again()

    def _repair(self, ids: list[TaskId], error: TaskCorruptedError) -> None:
        """Some tasks' local state is damaged (a bad block found by a read, a write or a background
        compaction), and nothing is open in the transaction for them. As Kafka Streams does for a
        ``TaskCorruptedException``: those tasks are wiped and restored from their changelogs (their
        input paused meanwhile) while the others go on."""
        logger.warning(
            "%s: the local state of task(s) %s is corrupted (%s); wiping and restoring it",
            self.application_id,
            ", ".join(map(str, ids)),
            error,
        )
        self._tm().handle_corruption(ids)
        for tid in ids:
            self._contexts.pop(tid, None)
        self._pause_not_running()

    def _in_doubt(self, error: TransactionInDoubtError) -> None:
        """A commit kept failing and may still complete (e.g. the transaction coordinator was
        unreachable for a request timeout and more). As Kafka Streams does for a commit that timed
        out under exactly-once, the same producer's commit is asked again (within ``task_timeout``)
        rather than a second client of the transactional id made while the first still retries it
        (what a broker left open meanwhile is ended by :meth:`_clear_pending_offsets`). Only a
        commit that cannot be settled so has the producer
        replaced (its successor's ``init_transactions`` settles the transaction). Either way every
        active task closes dirty, whether the input offsets went with the transaction is asked of
        the group coordinator, not taken from this instance's memory, and each task's restore
        reads what its changelog holds: so the batch is neither lost nor done twice."""
        logger.warning(
            "%s: the commit is in doubt (%s); asking it again, then closing every task dirty and "
            "starting again from what the changelog and the group coordinator hold",
            self.application_id,
            error,
        )
        self._committed.clear()
        deadline = time.monotonic() + self.task_timeout  # one task_timeout for all of it
        settled = self._settle_in_doubt(deadline)
        if settled:
            self.commits += 1
        else:
            self.aborts += 1
        self._start_again(renew=not settled, deadline=deadline)

    def _settle_in_doubt(self, deadline: float) -> bool:
        """Ask the producer's commit in doubt again until it ends or ``deadline`` passes: True
        once it committed and the producer goes on; False when the producer must be replaced (the
        commit failed for good, the producer was fenced, or no answer came in time)."""
        tm = self._tm()
        try:
            self._until_answered("asking the commit in doubt again", tm.collector.commit, deadline)
        except (LogError, require().KafkaException) as e:
            logger.warning(
                "%s: the commit in doubt could not be settled (%s); replacing the producer",
                self.application_id,
                e,
            )
            return False
        if tm.collector.failed:
            logger.warning(
                "%s: the commit in doubt could not be settled (the producer failed); replacing it",
                self.application_id,
            )
            return False
        logger.info("%s: the commit in doubt completed", self.application_id)
        return True

    def _start_again(self, *, renew: bool = True, deadline: float | None = None) -> None:
        """Replace the producer (unless ``renew`` is false: it is settled and goes on), close every
        active task dirty, seek the input back to the last commit (``_committed``, else the group
        coordinator's), and assign the tasks again; the calls to the cluster within ``deadline``
        (default: ``task_timeout`` each)."""
        tm = self._tm()
        if renew:
            # init_transactions: a new epoch; the old transaction is settled
            self._until_answered("replacing the producer", tm.collector.renew, deadline)
        tm.close_lost(list(tm.active_tasks()))
        self._contexts.clear()
        self._rewind(self._assigned, deadline)
        tasks = self._complete_tasks()
        tm.assign(active=tasks, standby=self._standbys - tasks)
        self._pause_not_running()

    def _until_answered(self, what: str, call: Callable[[], _T], deadline: float | None = None) -> _T:
        """``call()``, tried again while it fails for want of an answer from the cluster (a broker
        or coordinator down or stalled: each try already waits a request timeout or two) until
        ``task_timeout`` has passed (or ``deadline``, a ``time.monotonic()`` instant: several calls
        sharing one ``task_timeout``), as Kafka Streams retries a task's calls within
        ``task.timeout.ms``. Being fenced is an answer, and is raised at once; so is the last error
        once :meth:`stop` is asked for, and while closing a single try is made."""
        if self._state == "CLOSING":
            deadline = time.monotonic()
        elif deadline is None:
            deadline = time.monotonic() + self.task_timeout
        tries = 0
        while True:
            tries += 1
            try:
                return call()
            except ProducerFencedError:
                raise
            except (LogError, require().KafkaException) as e:
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set() or not unanswered(e):
                    raise
                logger.warning(
                    "%s: %s failed (try %d: %s); trying again for up to %.0f s more (task_timeout)",
                    self.application_id,
                    what,
                    tries,
                    e,
                    left,
                )
                self._stop.wait(min(_UNANSWERED_BACKOFF_S, left))  # a stop asked for meanwhile ends it

    def _committed_offsets(self, tps: list[TopicPartition]) -> list[Any]:
        """The group's committed offsets of ``tps``. A partition the coordinator answered with an
        error (e.g. its offsets unstable while a transaction that commits them is open) raises that
        error: taken as "none committed", it would send the input back to its start."""
        ck = require()
        got = self._consumer.committed(
            [ck.TopicPartition(tp.topic, tp.partition) for tp in tps], timeout=self.request_timeout
        )
        for p in got:
            if p.error is not None:
                raise ck.KafkaException(p.error)
        return list(got)

    def _rewind(self, tps: Iterable[TopicPartition], deadline: float | None = None) -> None:
        ck = require()
        self._rewinds += 1
        tps = sorted(tps)
        unknown = [tp for tp in tps if tp not in self._committed]
        if unknown:
            cleared: list[bool] = []

            def read() -> list[Any]:
                try:
                    return self._committed_offsets(unknown)
                except (LogError, ck.KafkaException) as e:
                    if cleared or not self.eos or not unanswered(e):
                        raise
                    cleared.append(self._clear_pending_offsets(unknown, deadline))
                    if not cleared[0]:
                        raise
                # read once more at once: past the deadline too, the clearing may have taken it
                return self._committed_offsets(unknown)

            got = self._until_answered("reading the group's committed offsets", read, deadline)
            for p in got:
                self._committed[TopicPartition(p.topic, p.partition)] = (
                    p.offset if p.offset >= 0 else ck.OFFSET_BEGINNING
                )
        for tp in tps:
            off = self._committed[tp]
            self._dirty.discard(tp)
            if off >= 0:
                self._next[tp] = off
            else:
                self._next.pop(tp, None)
            try:
                self._consumer.seek(ck.TopicPartition(tp.topic, tp.partition, off))
            except ck.KafkaException as e:
                # Not fetching yet (just assigned): it starts from the committed offset anyway.
                logger.debug("%s: seek %s to %d: %s", self.application_id, tp, off, e)

    def _clear_pending_offsets(self, tps: list[TopicPartition], deadline: float | None = None) -> bool:
        """The group's committed offsets of ``tps`` gave no stable answer: end any transactional
        offset commit of this instance's producer id the coordinator still holds pending (see
        :meth:`~statestore.processing.record_collector.RecordCollector.abort_everywhere`), and
        any transaction of that id a changelog or output partition still holds open: aborted, with
        an empty record to each. Harmless when there is none: only a transaction of this producer
        is aborted. Not with a producer that failed, nor while this consumer is no member of the
        group (the offsets it adds, aborted, would hold up another owner's reads meanwhile). A
        producer the clearing leaves failed (its cluster gave no answer) is replaced within
        ``deadline``. Asked once a rewind; whether it ran."""
        tm = self._tm()
        if tm.collector.failed or not self._consumer.memberid():
            return False
        try:
            ran = tm.collector.abort_everywhere(
                self._written_partitions(), tps, self._consumer.consumer_group_metadata()
            )
        except (LogError, require().KafkaException) as e:
            logger.info("%s: clearing offset commits left pending failed: %s", self.application_id, e)
            ran = False
        if self._replace_if_dead(deadline):
            return False
        if ran:
            logger.warning(
                "%s: the group's committed offsets of %s gave no stable answer; aborted a transaction "
                "of this instance's producer over them and every changelog and output partition, which "
                "ends what a transaction of its producer id may have left open there",
                self.application_id,
                ", ".join(map(str, tps)),
            )
        return ran

    def _written_partitions(self) -> list[TopicPartition]:
        """Every partition this application's transactions may write: its changelogs' and its
        output topics'."""
        assert self.changelog is not None
        counts = self.changelog.topics()
        topics = [changelog_topic(self.application_id, s) for s in self.stores] + self.output_topics
        return [TopicPartition(t, p) for t in topics for p in range(counts.get(t, 0))]

    # -- rebalancing ---------------------------------------------------------------------------

    def _task_partitions(self, tid: TaskId) -> list[TopicPartition]:
        return [TopicPartition(t, tid.partition) for t in self.input_topics]

    def _complete_tasks(self) -> set[TaskId]:
        """Tasks all of whose input partitions are assigned here (co-partitioning)."""
        parts = {tp.partition for tp in self._assigned}
        return {
            TaskId(SUBTOPOLOGY, p)
            for p in parts
            if all(tp in self._assigned for tp in self._task_partitions(TaskId(SUBTOPOLOGY, p)))
        }

    def _callback(self, fn: Callable[[list[Any]], None]) -> Callable[[Any, list[Any]], None]:
        def run(consumer: Any, parts: list[Any]) -> None:
            try:
                fn(parts)
            except BaseException as e:  # raised again after consume(): librdkafka's thread must not see it
                logger.exception("%s: rebalance callback failed", self.application_id)
                if self._callback_error is None:
                    self._callback_error = e

        return run

    def _raise_callback_error(self) -> None:
        if self._callback_error is not None:
            e, self._callback_error = self._callback_error, None
            raise e

    @property
    def _on_assign(self) -> Callable[[Any, list[Any]], None]:
        return self._callback(self._assign)

    @property
    def _on_revoke(self) -> Callable[[Any, list[Any]], None]:
        return self._callback(self._revoke)

    @property
    def _on_lost(self) -> Callable[[Any, list[Any]], None]:
        return self._callback(self._lose)

    def _assign(self, parts: list[Any]) -> None:
        if self.group_protocol == "classic":
            self._consumer.assign(parts)
        else:
            self._consumer.incremental_assign(parts)
        self._rebalancing = False
        new = {TopicPartition(p.topic, p.partition) for p in parts}
        self._assigned |= new
        tasks = self._complete_tasks()
        incomplete = {tp for tp in self._assigned if TaskId(SUBTOPOLOGY, tp.partition) not in tasks}
        if incomplete:
            logger.warning(
                "%s: input partitions %s arrived without the partitions of every input topic of their task; "
                "held paused (are all instances subscribed to the same topics?)",
                self.application_id,
                ", ".join(map(str, sorted(incomplete))),
            )
        logger.info(
            "%s: assigned %s; active tasks now %s",
            self.application_id,
            ", ".join(map(str, sorted(new))) or "nothing",
            ", ".join(map(str, sorted(tasks))) or "none",
        )
        tm = self._tm()
        moved_in = tasks - self._before_rebalance - set(tm.active_tasks())
        if self.num_standby_replicas and moved_in and self._assignments:
            hits = moved_in & set(tm.standby_tasks())
            self.standby_hits += len(hits)
            self.standby_misses += len(moved_in - hits)
            for tid in moved_in:
                self.metrics.promoted(tid, tid in hits)
                self._promoting[tid] = tid in hits
            logger.info(
                "%s: tasks moved here: %s; found a standby: %s",
                self.application_id,
                ", ".join(map(str, sorted(moved_in))),
                ", ".join(map(str, sorted(hits))) or "none",
            )
        self._before_rebalance = set()
        self._assignments += 1
        self._promoting = {t: hit for t, hit in self._promoting.items() if t in tasks}
        tm.assign(active=tasks, standby=self._standbys - tasks)
        self._pause_not_running()
        self._standby_due = 0.0  # the membership changed: place standbys again
        self._describing = None  # (a description asked for before it is out of date)

    def _pause_not_running(self) -> None:
        """Pause every assigned input partition whose task is missing or not RUNNING (restoring)."""
        ck = require()
        active = self._tm().active_tasks()
        to_pause = [
            tp
            for tp in self._assigned
            if tp not in self._paused
            and (
                (task := active.get(TaskId(SUBTOPOLOGY, tp.partition))) is None
                or task.state is not TaskState.RUNNING
            )
        ]
        if to_pause:
            self._consumer.pause([ck.TopicPartition(tp.topic, tp.partition) for tp in to_pause])
            self._paused.update(to_pause)

    def _revoke(self, parts: list[Any]) -> None:
        revoked = {TopicPartition(p.topic, p.partition) for p in parts}
        logger.info("%s: revoked %s", self.application_id, ", ".join(map(str, sorted(revoked))))
        if self.task_manager is not None and not self.task_manager._closed:
            # One commit covers the revoked tasks and every other one, as Kafka Streams does
            # (not when closing after an error: that aborted everything).
            if not self._closed or self._close_clean:
                self.commit()
            self._before_rebalance |= set(self._tm().active_tasks())
            self._forget(revoked)
            remaining = self._complete_tasks()
            self._tm().assign(active=remaining, standby=self._standbys - remaining)
        else:
            self._forget(revoked)
        if self.group_protocol == "classic":
            self._rebalancing = True  # until the assignment arrives: no commit in between
            self._consumer.unassign()
        else:
            self._consumer.incremental_unassign(parts)

    def _lose(self, parts: list[Any]) -> None:
        lost = {TopicPartition(p.topic, p.partition) for p in parts}
        logger.warning(
            "%s: lost %s (membership expired); closing their tasks dirty, committing nothing",
            self.application_id,
            ", ".join(map(str, sorted(lost))),
        )
        if self.task_manager is not None and not self.task_manager._closed:
            before = self._complete_tasks()
            # Forgotten first: the abort seeks back only the partitions still here, and asks the
            # group coordinator (maybe unreachable now) for none of the lost ones' offsets.
            self._forget(lost)
            self._abort("partitions lost")
            self.task_manager.close_lost(before - self._complete_tasks())
            self._before_rebalance |= self._complete_tasks()
        else:
            self._forget(lost)
        if self.group_protocol == "classic":
            self._rebalancing = True
            self._consumer.unassign()
        else:
            self._consumer.incremental_unassign(parts)

    def _forget(self, tps: set[TopicPartition]) -> None:
        self._assigned -= tps
        self._paused -= tps
        for tp in tps:
            self._next.pop(tp, None)
            self._committed.pop(tp, None)
            self._dirty.discard(tp)

    def _describe_group(self) -> None:
        """Ask for the group's membership, to place standbys once it arrives (:meth:`_place_standbys`).

        The answer is awaited by later rounds of the loop, never by this one: right after an
        assignment the tasks that moved here must not wait for a round trip to the coordinator.
        """
        self._standby_due = time.monotonic() + STANDBY_REFRESH_S
        assert self.changelog is not None
        try:
            self._describing = self.changelog.admin().describe_consumer_groups(
                [self.application_id], request_timeout=self.request_timeout
            )[self.application_id]
        except Exception as e:  # the next refresh tries again
            logger.info("%s: cannot describe the group to place standbys: %s", self.application_id, e)

    def _place_standbys(self) -> None:
        """Hold standbys for the tasks the group would give this instance if their owner left.

        The consumer-group protocols cannot carry standby placement, so every instance computes it
        from the group's membership (``describe_consumer_groups``, asked for by
        :meth:`_describe_group`): for task ``p`` owned by member ``o``, the first standby goes to
        the member the range assignor would give ``p`` to if ``o`` left (members sorted by member
        id), the next ones to the members after it. A wrong guess only costs a restore.
        """
        future, self._describing = self._describing, None
        try:
            desc = future.result(0)
            me = self._consumer.memberid()
        except Exception as e:  # the next refresh tries again
            logger.info("%s: cannot describe the group to place standbys: %s", self.application_id, e)
            return
        owners: dict[int, str] = {}
        for m in desc.members:
            for tp in m.assignment.topic_partitions if m.assignment else ():
                if tp.topic == self.input_topics[0]:
                    owners[tp.partition] = m.member_id
        members = sorted(m.member_id for m in desc.members)
        want = {
            TaskId(SUBTOPOLOGY, p)
            for p, owner in owners.items()
            if owner != me
            and me in standby_members(members, owner, p, self.partitions, self.num_standby_replicas)
        }
        # A task no member owns is between owners (its owner left, or a rebalance is under way):
        # a standby held here stays until an assignment gives the task to someone, very likely here.
        want |= {t for t in self._standbys if t.partition not in owners}
        want -= set(self._tm().active_tasks())
        if want != self._standbys:
            logger.info(
                "%s: standby tasks now %s", self.application_id, ", ".join(map(str, sorted(want))) or "none"
            )
            self._standbys = want
            self._tm().assign(active=set(self._tm().active_tasks()), standby=want)

    def _resume_running(self) -> None:
        ck = require()
        tm = self._tm()
        ready: list[TopicPartition] = []
        for tp in self._paused:
            tid = TaskId(SUBTOPOLOGY, tp.partition)
            try:
                if tm.active_task(tid).state is TaskState.RUNNING:
                    ready.append(tp)
            except KeyError:
                continue
        for tid, hit in list(self._promoting.items()):
            task = tm.active_tasks().get(tid)
            if task is not None and task.state is TaskState.RUNNING:
                del self._promoting[tid]
                replayed = self.metrics.active_restored(tid)
                self.metrics.promotion_replayed(tid, hit, replayed)
                logger.info(
                    "%s: task %s moved here runs after replaying %d records (%s)",
                    self.application_id,
                    tid,
                    replayed,
                    "from its standby" if hit else "no standby",
                )
        if not ready:
            return
        for tp in ready:
            if tp in self._next:
                try:
                    self._consumer.seek(ck.TopicPartition(tp.topic, tp.partition, self._next[tp]))
                except ck.KafkaException as e:
                    logger.debug("%s: seek %s: %s", self.application_id, tp, e)
        self._consumer.resume([ck.TopicPartition(tp.topic, tp.partition) for tp in ready])
        self._wake_fetchers(ready)
        self._paused.difference_update(ready)
        logger.info("%s: tasks restored; resumed %s", self.application_id, ", ".join(map(str, sorted(ready))))

    def _wake_fetchers(self, tps: list[TopicPartition]) -> None:
        """Have the leaders of the resumed ``tps`` fetch them now, not up to a second later.

        librdkafka takes a resume into account when the broker's thread next wakes up: with every
        partition of that broker paused (their tasks restoring after a rebalance) nothing is in flight
        there, and the thread sleeps up to a second. The first records of a promoted standby came
        ~0.8 s after its resume, longer than its restore (benches/notes.md). Any request to the
        broker wakes its thread: one ListOffsets per leader, for one of the partitions it leads.
        Failures are only logged: the fetch then starts on librdkafka's own time.
        """
        ck = require()
        by_topic: dict[str, list[TopicPartition]] = {}
        for tp in tps:
            by_topic.setdefault(tp.topic, []).append(tp)
        leaders: dict[int, TopicPartition] = {}
        for topic, resumed in sorted(by_topic.items()):
            try:
                partitions = (
                    self._consumer.list_topics(topic, timeout=WAKE_TIMEOUT_S).topics[topic].partitions
                )
            except (ck.KafkaException, KeyError) as e:
                logger.debug("%s: metadata of %s to wake its fetchers: %s", self.application_id, topic, e)
                continue
            for tp in resumed:
                if (meta := partitions.get(tp.partition)) is not None:
                    leaders.setdefault(meta.leader, tp)
        for tp in leaders.values():
            try:
                self._consumer.get_watermark_offsets(
                    ck.TopicPartition(tp.topic, tp.partition), timeout=WAKE_TIMEOUT_S, cached=False
                )
            except ck.KafkaException as e:
                logger.debug("%s: waking the fetcher of %s: %s", self.application_id, tp, e)

    # -- state ---------------------------------------------------------------------------------

    def _tm(self) -> TaskManager:
        if self.task_manager is None:
            raise ApplicationError(f"{self!r} is not started")
        return self.task_manager

    def active_tasks(self) -> dict[TaskId, str]:
        """Each active task of this instance and its state (``RESTORING``, ``RUNNING``...)."""
        if self.task_manager is None:
            return {}
        return {tid: t.state.value for tid, t in self.task_manager.active_tasks().items()}

    def task_states(self) -> dict[str, str]:
        """Each task of this instance and its state: ``RESTORING``/``RUNNING`` (active), ``STANDBY``."""
        tm = self.task_manager
        if tm is None or tm._closed:
            return {}
        out = {str(tid): "STANDBY" for tid in tm.standby_tasks()}
        out.update({str(tid): t.state.value for tid, t in tm.active_tasks().items()})
        return out

    def liveness(self) -> dict[str, Any]:
        """``state`` (``CREATED``, ``STARTING``, ``RUNNING``, ``REBALANCING``, ``CLOSING``, ``CLOSED``),
        ``last_poll_at`` (``time.time()`` of the loop's last poll, None before the first) and the
        instance's ``instance_id``: a loop that hangs stops moving ``last_poll_at``."""
        state = self._state
        if state == "STARTING" and self._assignments:
            state = "RUNNING"
        if state == "RUNNING" and self._rebalancing:
            state = "REBALANCING"
        return {"state": state, "last_poll_at": self._last_poll, "instance_id": self.instance_id}

    # -- close ---------------------------------------------------------------------------------

    def close(self, clean: bool = True) -> None:
        """Clean: commit, close the tasks (stores CLOSED), leave the group. Dirty (after an error):
        abort what is open, commit nothing more, close everything."""
        if self._closed:
            return
        self._state = "CLOSING"
        try:
            if self.task_manager is not None and self._consumer is not None:
                if clean:
                    if not self.commit():
                        clean = False
                else:
                    try:
                        self._abort("closing after an error")
                    except (StateStoreError, require().KafkaException) as e:
                        logger.warning("%s: abort on close failed: %s", self.application_id, e)
        finally:
            self._closed = True
            self._close_clean = clean
            self._close_quietly(clean)

    def _close_quietly(self, clean: bool = False) -> None:
        if self._publisher is not None:
            self._publisher.close()  # removes the snapshot: no live process of this instance
            self._publisher = None
        self._state = "CLOSED"
        consumer = self._consumer
        if consumer is not None:
            try:
                consumer.close()  # leaves the group; the revoke callback closes the tasks (commits nothing new)
                self._raise_callback_error()
            except Exception as e:
                logger.warning("%s: closing the consumer: %s", self.application_id, e)
            finally:
                self._consumer = None
        if self.task_manager is not None:
            try:
                self.task_manager.close(clean=clean)
            except StateStoreError as e:
                logger.warning("%s: closing the task manager: %s", self.application_id, e)
        if self.changelog is not None:
            self.changelog.close()

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(clean=exc == (None, None, None))


def range_owner(members: Sequence[str], partition: int, partitions: int) -> str:
    """The member the range assignor gives ``partition`` to (``members`` sorted)."""
    per, extra = divmod(partitions, len(members))
    # The first ``extra`` members get ``per + 1`` partitions, the others ``per``.
    boundary = extra * (per + 1)
    index = partition // (per + 1) if partition < boundary else extra + (partition - boundary) // max(per, 1)
    return members[min(index, len(members) - 1)]


def standby_members(
    members: Sequence[str], owner: str, partition: int, partitions: int, replicas: int
) -> list[str]:
    """The members that hold a standby of task ``partition`` owned by ``owner``: first the one the range
    assignor would pick if the owner left, then the next ones in member order (never the owner)."""
    others = [m for m in members if m != owner]
    if not others or replicas < 1:
        return []
    first = others.index(range_owner(others, partition, partitions))
    return [others[(first + i) % len(others)] for i in range(min(replicas, len(others)))]


def _store_formats(stores: Mapping[str, str] | Iterable[str]) -> dict[str, str]:
    out = store_formats(stores)
    if not out:
        raise ValueError("an application needs at least one store")
    for name, fmt in out.items():
        if fmt not in KEY_VALUE_FORMATS:
            raise ValueError(
                f"store {name!r}: format {fmt!r} is not a key-value store's; an application's stores are "
                f"{' or '.join(KEY_VALUE_FORMATS)}"
            )
    return out


__all__ = [
    "ALOS_COMMIT_INTERVAL_MS",
    "APP_TRANSACTION_TIMEOUT_MS",
    "DEFAULT_TASK_TIMEOUT",
    "EOS_COMMIT_INTERVAL_MS",
    "App",
    "Context",
    "Record",
]
