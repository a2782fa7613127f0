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

How both sides are run, timed and recorded is shared with the windowed
count's benchmark (``test_bench_kstreams_windowed.py``) in
``kstreams_bench.py``.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from conftest import scaled
from kstreams_bench import Setup, Timed, kafka_streams_bench, measure, median_of, report, restore_kafka
from statestore import TopicPartition

N = scaled(2_000_000, minimum=20_000)
PARTITIONS = 4
VALUE_SIZE = 100
APP = "ks-bench"
STORE = "latest"
ROUNDS = 3


@contextmanager
def kstreams_setup(
    tmp_path_factory: pytest.TempPathFactory, records: int, partitions: int, rounds: int = ROUNDS
) -> Iterator[Setup]:
    """The application's changelog of ``records`` records over ``partitions`` partitions (``records // 10``
    keys), and Kafka Streams' restorations of it timed (``kafka_streams_bench``)."""
    with kafka_streams_bench(
        tmp_path_factory,
        app=APP,
        changelogs=[TopicPartition(f"{APP}-{STORE}-changelog", p) for p in range(partitions)],
        produce=records,
        rounds=rounds,
        common={
            "keys": max(1, records // 10),
            "value_size": VALUE_SIZE,
            "partitions": partitions,
            "stores": STORE,
            "timeout": 3600,
        },
    ) as s:
        yield s


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    with kstreams_setup(tmp_path_factory, N, PARTITIONS) as s:
        yield s


def restore(s: Setup, mode: str, threads: int) -> Timed:
    """One ``restore_many`` of the changelog's partitions into plain stores, one directory each."""
    return restore_kafka(
        s, s.work / f"ss-{mode}-{threads}", mode, threads, lambda root, tp: root / f"p{tp.partition}"
    )


def statestore_vs_kafka_streams(benchmark: Any, s: Setup, mode: str, goal: float) -> None:
    """The row of statestore's ``mode`` restore against Kafka Streams', at the same threads."""
    rounds = len(s.ks_rounds[1])
    ones, twos = measure(benchmark, lambda threads: restore(s, mode, threads), rounds)
    report(
        benchmark,
        s,
        ones,
        twos,
        mode=mode,
        goal=goal,
        baseline="Kafka Streams 4.4.0 restoration (first onRestoreStart to last onRestoreEnd), 1 stream thread",
        candidate=f"statestore {mode} (restore_many, native Kafka fetch; first on_restore_start to last "
        f"on_restore_end), 1 thread",
        title=f"statestore {mode} vs Kafka Streams restoration",
        shape={"partitions": len(s.tps), "value_bytes": VALUE_SIZE},
    )


def spark_vs_kafka_streams(benchmark: Any, s: Setup, mode: str, goal: float) -> None:
    """The row of ``restore_on_spark`` on ``local[2]`` (the broker's log.dirs) against Kafka Streams on 2 threads."""
    from statestore.restore.spark import restore_on_spark, spark_session

    ks2 = s.ks[2].restore_ms / 1000
    n_rounds = len(s.ks_rounds[2])
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
            shutil.rmtree(state, ignore_errors=True)
            assert all(r.status == "ok" for r in rows), rows
            return seconds, sum(r.records_applied for r in rows)

        job(f"spark-warm-{mode}")  # the session's first job starts its Python workers

        def run() -> None:
            rounds.append(job(f"spark-{mode}"))

        benchmark.pedantic(run, rounds=n_rounds, iterations=1)
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
            "partitions": len(s.tps),
            "kafka_streams_2_threads_s": ks2,
            "spark_s": seconds,
            "rounds": n_rounds,
            "kafka_streams_2_threads_rounds_s": [round(r.restore_ms / 1000, 3) for r in s.ks_rounds[2]],
            "spark_rounds_s": [round(r[0], 3) for r in rounds],
        }
    )
    print(
        f"\nstatestore {mode} on Spark local[2] vs Kafka Streams (2 threads): {ratio:.2f}x (goal >= {goal})"
    )


@pytest.mark.parametrize("mode,goal", [("replay", 3.0), ("bulk", 10.0)])
def test_statestore_vs_kafka_streams_restoration(
    benchmark: Any, setup: Setup, mode: str, goal: float
) -> None:
    statestore_vs_kafka_streams(benchmark, setup, mode, goal)


@pytest.mark.spark
@pytest.mark.parametrize("mode,goal", [("replay", 3.0), ("bulk", 10.0)])
def test_spark_vs_kafka_streams_restoration(benchmark: Any, setup: Setup, mode: str, goal: float) -> None:
    spark_vs_kafka_streams(benchmark, setup, mode, goal)
