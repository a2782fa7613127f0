"""What the benchmarks against Kafka Streams' own restoration share (``test_bench_kstreams*.py``).

Each such benchmark lets the Kafka Streams 4.4 application of
``interop/kafka-streams`` process its input on a broker of its own, so that
its changelog topics hold the state to restore, and then restores that same
changelog both ways, every round from an empty state directory:

* Kafka Streams in "restore only" mode, one stream thread and then two,
  timed by its own ``StateRestoreListener`` from the first
  ``onRestoreStart`` to the last ``onRestoreEnd`` (:func:`kafka_streams_bench`);
* statestore's ``restore_many`` through ``KafkaChangelog`` and its native
  fetcher, one thread and then two, timed the same way by its own restore
  listener (:class:`Window`, :func:`restore_kafka`, :func:`measure`).

The ratio is of the medians of ``rounds`` rounds on each side, so one slow
round (the broker's page cache, a JIT or GC pause, a neighbour on the shared
cores) does not move it; :func:`report` records every round beside it.
Kept here once so that the key-value and the windowed benchmarks time,
compare and record exactly alike.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from statestore import TopicPartition
from statestore.restore.engine import RestoreSpec, restore_many
from support import kstreams_app
from support.kafka_broker import Broker, BrokerUnavailable, start_broker

kafka = pytest.importorskip("statestore.changelog.kafka")

T = TypeVar("T")

#: The stream thread counts (Kafka Streams) and restore thread counts (statestore) compared.
THREADS = (1, 2)


def median_of(rounds: list[T], key: Callable[[T], float]) -> T:
    """The round of median ``key`` (the lower middle one of an even count)."""
    return sorted(rounds, key=key)[(len(rounds) - 1) // 2]


@dataclass
class Setup:
    """The broker, the work directory and Kafka Streams' own restore figures.

    ``ks_rounds[threads]`` holds every round of Kafka Streams' restoration
    with that many stream threads, ``ks[threads]`` the round of median time;
    ``reference`` is the state directory one of those rounds restored, kept
    when asked for (the windowed benchmark checks statestore's segments
    against it), else None.
    """

    broker: Broker
    work: Path
    ks_rounds: dict[int, list[kstreams_app.AppRun]]
    tps: list[TopicPartition]
    reference: Path | None = None
    ks: dict[int, kstreams_app.AppRun] = field(init=False)

    def __post_init__(self) -> None:
        self.ks = {t: median_of(runs, key=lambda r: r.restore_ms) for t, runs in self.ks_rounds.items()}

    def ks_seconds(self, threads: int) -> float:
        """Kafka Streams' median restoration with ``threads`` stream threads, seconds."""
        return self.ks[threads].restore_ms / 1000


@contextmanager
def kafka_streams_bench(
    tmp_path_factory: pytest.TempPathFactory,
    *,
    app: str,
    changelogs: list[TopicPartition],
    produce: int,
    rounds: int,
    common: dict[str, Any],
    process: dict[str, Any] | None = None,
    keep_reference: bool = False,
) -> Iterator[Setup]:
    """Build the application, start a broker, let the application process ``produce`` input records, then
    time Kafka Streams' restoration of ``changelogs`` ``rounds`` times with each of :data:`THREADS`.

    ``common`` are the application's arguments for every run (``kstreams_app.run_app``), ``process``
    those of the processing run only. Each restore round starts from an empty state directory and is
    deleted after, except (``keep_reference``) the last one-thread round, kept as ``Setup.reference``.
    Skips when the application cannot be built or no broker can start; the broker is stopped after.
    """
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
        kstreams_app.run_app(
            broker.bootstrap,
            app,
            work / "processed",
            mode="process",
            produce=produce,
            **common,
            **(process or {}),
        )
        ks: dict[int, list[kstreams_app.AppRun]] = {t: [] for t in THREADS}
        reference = work / "ks-reference" if keep_reference else None
        for last in [False] * (rounds - 1) + [True]:
            for threads in THREADS:
                state = work / f"ks-{threads}"
                ks[threads].append(
                    kstreams_app.run_app(
                        broker.bootstrap, app, state, mode="restore", threads=threads, **common
                    )
                )
                if reference is not None and last and threads == 1:
                    state.rename(reference)
                else:
                    shutil.rmtree(state, ignore_errors=True)
        yield Setup(broker, work, ks, changelogs, reference)
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


def restore_kafka(
    s: Setup,
    root: Path,
    mode: str,
    threads: int,
    store_path: Callable[[Path, TopicPartition], Path],
    **spec: Any,
) -> Timed:
    """Restore the changelogs of ``s`` with ``restore_many`` from an empty ``root``, timed.

    Each partition's store goes to ``store_path(root, tp)`` (its parent is
    created first); ``spec`` adds ``RestoreSpec`` fields (format, retention).
    """
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    paths = [store_path(root, tp) for tp in s.tps]
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
    window = Window()
    with kafka.KafkaChangelog(s.broker.bootstrap, request_timeout=60.0) as c:
        # Progress only at the start and the end, as Kafka Streams' listener is called per batch of a poll.
        specs = [
            RestoreSpec(path, c, tp, mode=mode, listener=window, progress_interval=60.0, **spec)
            for path, tp in zip(paths, s.tps, strict=True)
        ]
        c0, t0 = time.process_time(), time.perf_counter()
        results = restore_many(specs, threads=threads)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    return Timed(window.seconds, seconds, cpu, sum(r.records_applied for r in results))


def measure(benchmark: Any, restore: Callable[[int], Timed], rounds: int) -> tuple[list[Timed], list[Timed]]:
    """``rounds`` restores on one thread, then ``rounds`` on two under pytest-benchmark (its own timing is
    not the one reported: the listener's window is)."""
    ones = [restore(1) for _ in range(rounds)]
    twos: list[Timed] = []

    def run() -> None:
        twos.append(restore(2))

    benchmark.pedantic(run, rounds=rounds, iterations=1)
    return ones, twos


def report(
    benchmark: Any,
    s: Setup,
    ones: list[Timed],
    twos: list[Timed],
    *,
    mode: str,
    goal: float,
    baseline: str,
    candidate: str,
    title: str,
    shape: dict[str, Any],
    same_records: bool = True,
) -> None:
    """Check that every round of each side restored the same number of records (and, with
    ``same_records``, both sides the same), record the row (ratios of the medians, every round, CPU times,
    ``shape``) in ``benchmark.extra_info`` and print the ratios.

    Without ``same_records`` (Kafka Streams 4.4 starts a windowed store's restoration at the retention
    before the changelog's last record, statestore from the changelog's start) the row records Kafka
    Streams' count beside statestore's as ``kafka_streams_records``.
    """
    rounds = len(ones)
    ks1, ks2 = s.ks_seconds(1), s.ks_seconds(2)
    one, two = median_of(ones, key=lambda t: t.seconds), median_of(twos, key=lambda t: t.seconds)
    n = one.records
    ks_counts = {r.restored_records for runs in s.ks_rounds.values() for r in runs}
    assert {t.records for t in ones + twos} == {n} and len(ks_counts) == 1, (
        {t.records for t in ones + twos},
        ks_counts,
    )
    ks_n = ks_counts.pop()
    assert not same_records or ks_n == n, (ks_n, n)
    if not same_records:
        shape = {"kafka_streams_records": ks_n, **shape}
    ratio, ratio2 = ks1 / one.seconds, ks2 / two.seconds
    call1, call2 = (
        median_of(ones, key=lambda t: t.call_seconds),
        median_of(twos, key=lambda t: t.call_seconds),
    )
    benchmark.extra_info.update(
        {
            "baseline": baseline,
            "candidate": candidate,
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
            **shape,
            "kafka_streams_1_thread_s": ks1,
            "kafka_streams_2_threads_s": ks2,
            "statestore_1_thread_s": one.seconds,
            "statestore_2_threads_s": two.seconds,
            "rounds": rounds,
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
            "kafka_streams_records_per_s": ks_n / ks1,
            "statestore_records_per_s": n / one.seconds,
        }
    )
    print(
        f"\n{title}: 1 thread {ratio:.2f}x, 2 threads {ratio2:.2f}x "
        f"(goal >= {goal}); Kafka Streams {ks1:.2f} s / {ks2:.2f} s "
        f"(CPU {s.ks[1].restore_cpu_ms / 1000:.2f} s / {s.ks[2].restore_cpu_ms / 1000:.2f} s), "
        f"statestore {one.seconds:.3f} s / {two.seconds:.3f} s (CPU {one.cpu:.2f} s / {two.cpu:.2f} s), "
        f"medians of {rounds} rounds; the whole restore_many call {call1.call_seconds:.3f} s / "
        f"{call2.call_seconds:.3f} s: {ks1 / call1.call_seconds:.2f}x / {ks2 / call2.call_seconds:.2f}x"
    )
