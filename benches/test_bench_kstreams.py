"""statestore against Kafka Streams 4.4's own restoration, side by side on one broker and one changelog.

The Kafka Streams application of ``interop/kafka-streams`` (``--stores latest``:
one plain persistent store, Processor API) processes 2M input records over 4
partitions, ~10 updates a key, 100-byte values, at_least_once: its changelog
topic ``<app>-latest-changelog`` then holds 2M records. Every restore below
starts from an empty state directory and restores that same changelog.

* **Kafka Streams**: the application in "restore only" mode (one instance,
  one stream thread, then two), timed by its own StateRestoreListener, from
  the first ``onRestoreStart`` to the last ``onRestoreEnd`` (store opening and
  the rebalance are outside the window, as Kafka Streams reports it).
* **statestore**: ``restore_many`` over the same 4 changelog partitions
  through the Kafka path the library uses (``KafkaChangelog`` with its
  native fetcher, ``rust/src/kafka``), replay and
  bulk, one thread and two, timed the same way by its own restore listener
  (``RestoreListener``, the shape of Kafka Streams' ``StateRestoreListener``):
  from the first ``on_restore_start`` to the last ``on_restore_end``. The
  whole ``restore_many`` call (the first connection to the broker and the
  first store's creation besides) is recorded beside it, with its ratio;
  and ``restore_on_spark`` on ``local[2]``, which
  reads the broker's own partition directories (the segment log reads
  Kafka's log.dirs; executors see the same disk here), timed from the job's
  submission to its rows.

Goals, at the same number of threads: statestore replay ÷ Kafka Streams >= 3x,
statestore bulk ÷ Kafka Streams >= 10x.

Each side is measured ``ROUNDS`` times, every round from an empty state
directory, and the ratio is of the medians: one slow round on either side (the
broker's page cache, a JIT or GC pause, a neighbour on the 2 cores) does not
move it. Every round's time is recorded beside the ratio.

Held equal: the broker, the changelog (records, keys, 100-byte values, no
compression), 4 partitions, state on the same disk (one temporary directory),
the write-ahead log off on both sides (Kafka Streams restores with
``disableWAL``; statestore writes WAL-off batches and flushes), each side's
default fetch settings (Kafka Streams' restore consumer: ``max.poll.records``
1000, ``max.partition.fetch.bytes`` 1 MiB, ``fetch.max.bytes`` 50 MiB;
statestore's native fetcher: ``max.partition.fetch.bytes`` 8 MiB, reached from a
first response of 1 MiB that doubles with each response, 100 ms fetch wait),
the same store format (plain).
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from conftest import scaled
from statestore import TopicPartition
from statestore.restore.engine import RestoreSpec, restore_many
from support import kstreams_app
from support.kafka_broker import Broker, BrokerUnavailable, start_broker

kafka = pytest.importorskip("statestore.changelog.kafka")

N = scaled(2_000_000, minimum=20_000)
KEYS = max(1, N // 10)
PARTITIONS = 4
VALUE_SIZE = 100
APP = "ks-bench"
STORE = "latest"
ROUNDS = 3


class Setup:
    """The broker, the work directory and Kafka Streams' own restore figures.

    ``ks_rounds[threads]`` holds every round of Kafka Streams' restoration with
    that many stream threads, ``ks[threads]`` the round of median time.
    """

    def __init__(
        self,
        broker: Broker,
        work: Path,
        ks_rounds: dict[int, list[kstreams_app.AppRun]],
        tps: list[TopicPartition],
    ):
        self.broker, self.work, self.ks_rounds, self.tps = broker, work, ks_rounds, tps
        self.ks = {t: median_of(runs, key=lambda r: r.restore_ms) for t, runs in ks_rounds.items()}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    try:
        kstreams_app.build()
    except (RuntimeError, FileNotFoundError) as e:
        pytest.skip(f"the Kafka Streams application could not be built: {e}")
    try:
        broker = start_broker(tmp_path_factory.mktemp("ks-broker"))
    except BrokerUnavailable as e:
        pytest.skip(f"no Kafka broker could start: {e}")
    work = tmp_path_factory.mktemp("ks")
    try:
        common: dict[str, Any] = {
            "keys": KEYS,
            "value_size": VALUE_SIZE,
            "partitions": PARTITIONS,
            "stores": STORE,
            "timeout": 3600,
        }
        kstreams_app.run_app(broker.bootstrap, APP, work / "processed", mode="process", produce=N, **common)
        ks: dict[int, list[kstreams_app.AppRun]] = {1: [], 2: []}
        for _ in range(ROUNDS):
            for threads in (1, 2):
                state = work / f"ks-{threads}"
                ks[threads].append(
                    kstreams_app.run_app(
                        broker.bootstrap, APP, state, mode="restore", threads=threads, **common
                    )
                )
                shutil.rmtree(state, ignore_errors=True)
        tps = [TopicPartition(f"{APP}-{STORE}-changelog", p) for p in range(PARTITIONS)]
        yield Setup(broker, work, ks, tps)
    finally:
        broker.stop()


class Timed:
    """One statestore restore of the changelog.

    ``seconds``: from the first ``on_restore_start`` to the last
    ``on_restore_end`` (Kafka Streams' window); ``call_seconds``: the whole
    ``restore_many`` call; ``cpu``: CPU seconds of the process over the call.
    """

    def __init__(self, seconds: float, call_seconds: float, cpu: float, records: int):
        self.seconds, self.call_seconds, self.cpu, self.records = seconds, call_seconds, cpu, records


class Window:
    """A restore listener that keeps the first start and the last end (``time.perf_counter``)."""

    def __init__(self) -> None:
        self.first_start = float("inf")
        self.last_end = float("-inf")
        self._lock = threading.Lock()

    def on_restore_start(
        self, tp: TopicPartition, store_name: str, start_offset: int, end_offset: int
    ) -> None:
        now = time.perf_counter()
        with self._lock:
            self.first_start = min(self.first_start, now)

    def on_batch_restored(
        self, tp: TopicPartition, store_name: str, batch_end_offset: int, num_restored: int
    ) -> None:
        pass

    def on_restore_end(self, tp: TopicPartition, store_name: str, total_restored: int) -> None:
        now = time.perf_counter()
        with self._lock:
            self.last_end = max(self.last_end, now)

    @property
    def seconds(self) -> float:
        assert self.last_end >= self.first_start, "the listener saw no whole restore"
        return self.last_end - self.first_start


T = TypeVar("T")


def median_of(rounds: list[T], key: Callable[[T], float]) -> T:
    """The round of median ``key`` (the lower middle one of an even count)."""
    return sorted(rounds, key=key)[(len(rounds) - 1) // 2]


def restore_kafka(s: Setup, root: Path, mode: str, threads: int) -> Timed:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    window = Window()
    with kafka.KafkaChangelog(s.broker.bootstrap, request_timeout=60.0) as c:
        # Progress only at the start and the end, as Kafka Streams' listener is called per batch of a poll.
        specs = [
            RestoreSpec(root / f"p{tp.partition}", c, tp, mode=mode, listener=window, progress_interval=60.0)
            for tp in s.tps
        ]
        c0, t0 = time.process_time(), time.perf_counter()
        results = restore_many(specs, threads=threads)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    return Timed(window.seconds, seconds, cpu, sum(r.records_applied for r in results))


@pytest.mark.parametrize("mode,goal", [("replay", 3.0), ("bulk", 10.0)])
def test_statestore_vs_kafka_streams_restoration(
    benchmark: Any, setup: Setup, mode: str, goal: float
) -> None:
    s = setup
    ks1, ks2 = s.ks[1].restore_ms / 1000, s.ks[2].restore_ms / 1000
    twos: list[Timed] = []

    def run() -> None:
        twos.append(restore_kafka(s, s.work / f"ss-{mode}-2", mode, 2))

    ones = [restore_kafka(s, s.work / f"ss-{mode}-1", mode, 1) for _ in range(ROUNDS)]
    benchmark.pedantic(run, rounds=ROUNDS, iterations=1)
    one, two = median_of(ones, key=lambda t: t.seconds), median_of(twos, key=lambda t: t.seconds)
    n = one.records
    counts = {t.records for t in ones + twos} | {
        r.restored_records for runs in s.ks_rounds.values() for r in runs
    }
    assert counts == {n}, counts
    ratio, ratio2 = ks1 / one.seconds, ks2 / two.seconds
    call1, call2 = (
        median_of(ones, key=lambda t: t.call_seconds),
        median_of(twos, key=lambda t: t.call_seconds),
    )
    benchmark.extra_info.update(
        {
            "baseline": "Kafka Streams 4.4.0 restoration (first onRestoreStart to last onRestoreEnd), 1 stream thread",
            "candidate": f"statestore {mode} (restore_many, native Kafka fetch; first on_restore_start to last "
            f"on_restore_end), 1 thread",
            "ratio": ratio,
            "goal": goal,
            "ratio_2_threads": ratio2,
            # The whole restore_many call: the first connection and the first store's creation as well.
            "ratio_whole_call": ks1 / call1.call_seconds,
            "ratio_whole_call_2_threads": ks2 / call2.call_seconds,
            "statestore_1_thread_call_s": call1.call_seconds,
            "statestore_2_threads_call_s": call2.call_seconds,
            "statestore_1_thread_call_rounds_s": [round(t.call_seconds, 3) for t in ones],
            "statestore_2_threads_call_rounds_s": [round(t.call_seconds, 3) for t in twos],
            "records": n,
            "partitions": PARTITIONS,
            "value_bytes": VALUE_SIZE,
            "kafka_streams_1_thread_s": ks1,
            "kafka_streams_2_threads_s": ks2,
            "statestore_1_thread_s": one.seconds,
            "statestore_2_threads_s": two.seconds,
            "rounds": ROUNDS,
            "kafka_streams_1_thread_rounds_s": [round(r.restore_ms / 1000, 3) for r in s.ks_rounds[1]],
            "kafka_streams_2_threads_rounds_s": [round(r.restore_ms / 1000, 3) for r in s.ks_rounds[2]],
            "statestore_1_thread_rounds_s": [round(t.seconds, 3) for t in ones],
            "statestore_2_threads_rounds_s": [round(t.seconds, 3) for t in twos],
            # CPU time of each whole process over its restore (every thread: statestore's fetch threads and
            # RocksDB's; Kafka Streams' JVM with its clients, RocksDB, GC and JIT): what "one thread" costs.
            "kafka_streams_1_thread_cpu_s": s.ks[1].restore_cpu_ms / 1000,
            "kafka_streams_2_threads_cpu_s": s.ks[2].restore_cpu_ms / 1000,
            "statestore_1_thread_cpu_s": one.cpu,
            "statestore_2_threads_cpu_s": two.cpu,
            "kafka_streams_records_per_s": n / ks1,
            "statestore_records_per_s": n / one.seconds,
        }
    )
    print(
        f"\nstatestore {mode} vs Kafka Streams restoration: 1 thread {ratio:.2f}x, 2 threads {ratio2:.2f}x "
        f"(goal >= {goal}); Kafka Streams {ks1:.2f} s / {ks2:.2f} s "
        f"(CPU {s.ks[1].restore_cpu_ms / 1000:.2f} s / {s.ks[2].restore_cpu_ms / 1000:.2f} s), "
        f"statestore {one.seconds:.3f} s / {two.seconds:.3f} s (CPU {one.cpu:.2f} s / {two.cpu:.2f} s), "
        f"medians of {ROUNDS} rounds; the whole restore_many call {call1.call_seconds:.3f} s / "
        f"{call2.call_seconds:.3f} s: {ks1 / call1.call_seconds:.2f}x / {ks2 / call2.call_seconds:.2f}x"
    )


@pytest.mark.spark
@pytest.mark.parametrize("mode,goal", [("replay", 3.0), ("bulk", 10.0)])
def test_spark_vs_kafka_streams_restoration(benchmark: Any, setup: Setup, mode: str, goal: float) -> None:
    from statestore.restore.spark import restore_on_spark, spark_session

    s = setup
    ks2 = s.ks[2].restore_ms / 1000
    spark = spark_session("local[2]")
    rounds: list[tuple[float, int]] = []
    try:

        def job(name: str) -> tuple[float, int]:
            state = s.work / name
            shutil.rmtree(state, ignore_errors=True)
            t0 = time.perf_counter()
            rows = restore_on_spark(
                spark,
                log_dir=s.broker.log_dir,
                state_dir=state,
                application_id=APP,
                stores=[STORE],
                mode=mode,
            ).collect()
            seconds = time.perf_counter() - t0
            assert all(r.status == "ok" for r in rows), rows
            return seconds, sum(r.records_applied for r in rows)

        job(f"spark-warm-{mode}")  # the session's first job starts its Python workers

        def run() -> None:
            rounds.append(job(f"spark-{mode}"))

        benchmark.pedantic(run, rounds=ROUNDS, iterations=1)
    finally:
        spark.stop()
    seconds, n = median_of(rounds, key=lambda r: r[0])
    assert {r[1] for r in rounds} == {s.ks[2].restored_records}, rounds
    ratio = ks2 / seconds
    benchmark.extra_info.update(
        {
            "baseline": "Kafka Streams 4.4.0 restoration, 2 stream threads",
            "candidate": f"statestore {mode} on Spark local[2] (reads the broker's log.dirs), job submission to rows",
            "ratio": ratio,
            "goal": goal,
            "records": n,
            "kafka_streams_2_threads_s": ks2,
            "spark_s": seconds,
            "rounds": ROUNDS,
            "kafka_streams_2_threads_rounds_s": [round(r.restore_ms / 1000, 3) for r in s.ks_rounds[2]],
            "spark_rounds_s": [round(r[0], 3) for r in rounds],
        }
    )
    print(
        f"\nstatestore {mode} on Spark local[2] vs Kafka Streams (2 threads): {ratio:.2f}x (goal >= {goal})"
    )
