"""The native Kafka fetcher (issue 18), side by side in one run on one real broker.

An Apache Kafka 4.4 broker of its own (``scripts/kafka-broker.sh``) on
127.0.0.1 gets the same transactions as a segment log: 4 partitions of N
records each, keys drawn from N/10 (about 10 updates a key). Every restore
goes through the same engine; only the changelog differs. Ratios (baseline
time / candidate time, higher is better) and their goals:

- native Kafka replay vs segment-log replay: >= 0.7
- native Kafka replay vs the confluent-kafka path (``native=False``): >= 4
- native bulk vs native replay (about 10 updates a key): >= 2
- ``restore_many`` of the 4 partitions on 2 threads vs 1 thread: >= 1.6

As context, each row reports the bytes the broker served per second while
the native replay ran (loopback bytes sent, read from ``/proc/net/dev``,
which also counts the small requests going the other way).
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from conftest import median_times_alternating, scaled
from statestore import SegmentLog, TopicPartition
from statestore.restore.engine import RestoreSpec, restore_many, restore_store
from support.kafka_broker import BrokerUnavailable, start_broker
from support.model import store_difference

kafka = pytest.importorskip("statestore.changelog.kafka")

N = scaled(400_000, minimum=20_000)  # records per partition
PARTITIONS = 4
TXN = 5_000
ROUNDS = 5  # each side, in turn: restores of 0.1-0.4 s move with the host by more than a goal's margin
VALUE_SIZE = 100

Data = tuple[Any, Any, SegmentLog, list[TopicPartition]]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Data]:
    try:
        broker = start_broker()
    except BrokerUnavailable as e:
        pytest.skip(f"no Kafka broker could start: {e}")
    native = kafka.KafkaChangelog(broker.bootstrap, request_timeout=60.0, restore_stall_timeout=60.0)
    fallback = kafka.KafkaChangelog(
        broker.bootstrap, request_timeout=60.0, restore_stall_timeout=60.0, native=False
    )
    assert native.native is not None and fallback.native is None
    seg = SegmentLog(tmp_path_factory.mktemp("kafka-native-bench") / "log", sync=False)
    topic = "bench-native"
    native.create_topics({topic: PARTITIONS})
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    rng = random.Random(18)
    values = [rng.randbytes(VALUE_SIZE) for _ in range(997)]
    kp, sp = native.producer("bench-native"), seg.producer("bench-native")
    t0 = time.perf_counter()
    for tp in tps:
        for start in range(0, N, TXN):
            kp.begin()
            sp.begin()
            for i in range(start, min(start + TXN, N)):
                k, v = b"key-%012d" % rng.randrange(N // 10), values[i % 997]
                kp.send(tp.topic, tp.partition, k, v)
                sp.send(tp.topic, tp.partition, k, v)
            kp.commit()
            sp.commit()
    kp.close()
    sp.close()
    for tp in tps:
        assert native.offsets(tp) == seg.offsets(tp)
    print(
        f"\nnative kafka benchmark data: {PARTITIONS} x {N:,} records written in {time.perf_counter() - t0:.1f}s"
    )
    yield native, fallback, seg, tps
    native.close()
    fallback.close()
    broker.stop()


def loopback_tx_bytes() -> int:
    """Bytes sent on the loopback interface so far (all processes)."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            return int(rest.split()[8])
    return 0


def _served(native: Any, tp: TopicPartition, store: Path) -> dict[str, float]:
    shutil.rmtree(store, ignore_errors=True)
    b0 = loopback_tx_bytes()
    t0 = time.perf_counter()
    r = restore_store(store, native, tp, mode="replay")
    dt = time.perf_counter() - t0
    served = loopback_tx_bytes() - b0
    return {"broker_served_mb_per_s": served / dt / 1e6, "log_mb": r.bytes_read / 1e6}


class Side(NamedTuple):
    """One side of a comparison: a short name for its figures, what it is, and the restore it times."""

    name: str
    description: str
    changelog: Any
    mode: str


def side_by_side(
    benchmark: Any,
    data: Data,
    tp: TopicPartition,
    store: Path,
    baseline: Side,
    candidate: Side,
    goal: float,
    reference: Any = None,
) -> None:
    """Time the baseline's and the candidate's restore of ``tp`` into ``store`` (median of ROUNDS each, taken in turn) and
    record the ratio baseline / candidate, with the bytes the broker served during a native replay. With a
    ``reference`` changelog the candidate's store must equal a replay of it."""

    def reset() -> None:
        shutil.rmtree(store, ignore_errors=True)

    def restore(side: Side) -> Any:
        return restore_store(store, side.changelog, tp, mode=side.mode)

    base_s, cand_s = median_times_alternating(
        lambda: restore(baseline), lambda: restore(candidate), reset, ROUNDS
    )
    if reference is not None:
        ref = store.parent / "ref"
        restore_store(ref, reference, tp, mode="replay")
        assert store_difference(ref, store) is None, store_difference(ref, store)
    ctx = _served(data[0], tp, store)
    benchmark.pedantic(lambda: restore(candidate), setup=reset, rounds=1, iterations=1)
    benchmark.extra_info.update(
        {
            "baseline": baseline.description,
            "candidate": candidate.description,
            "ratio": base_s / cand_s,
            "goal": goal,
            "records": N,
            f"{baseline.name}_records_per_s": N / base_s,
            f"{candidate.name}_records_per_s": N / cand_s,
            **ctx,
        }
    )
    print(
        f"\n{baseline.name} {N / base_s:,.0f} rec/s, {candidate.name} {N / cand_s:,.0f} rec/s, "
        f"ratio {base_s / cand_s:.2f}; {ctx}"
    )


def test_native_kafka_replay_vs_segment_log_replay(benchmark: Any, data: Data, tmp_path: Path) -> None:
    native, _fallback, seg, tps = data
    side_by_side(
        benchmark,
        data,
        tps[0],
        tmp_path / "s",
        reference=seg,
        goal=0.7,
        baseline=Side("segment", "segment-log replay restore, same records", seg, "replay"),
        candidate=Side(
            "native", "native Kafka replay restore (Apache Kafka 4.4 on loopback)", native, "replay"
        ),
    )


def test_native_kafka_vs_the_confluent_kafka_path(benchmark: Any, data: Data, tmp_path: Path) -> None:
    native, fallback, _seg, tps = data
    side_by_side(
        benchmark,
        data,
        tps[1],
        tmp_path / "s",
        goal=4.0,
        baseline=Side(
            "confluent",
            "Kafka replay restore through confluent-kafka (the fallback path), same broker",
            fallback,
            "replay",
        ),
        candidate=Side("native", "native Kafka replay restore", native, "replay"),
    )


def test_native_kafka_bulk_vs_native_replay(benchmark: Any, data: Data, tmp_path: Path) -> None:
    native, _fallback, _seg, tps = data
    side_by_side(
        benchmark,
        data,
        tps[2],
        tmp_path / "s",
        reference=native,
        goal=2.0,
        baseline=Side("replay", "native Kafka replay restore", native, "replay"),
        candidate=Side("bulk", "native Kafka bulk restore (about 10 updates a key)", native, "bulk"),
    )


def test_native_kafka_restore_many_two_threads_vs_one(benchmark: Any, data: Data, tmp_path: Path) -> None:
    native, _fallback, _seg, tps = data

    def reset() -> None:
        for p in range(PARTITIONS):
            shutil.rmtree(tmp_path / f"m{p}", ignore_errors=True)

    def run(threads: int) -> None:
        rs = restore_many(
            [RestoreSpec(tmp_path / f"m{tp.partition}", native, tp, mode="replay") for tp in tps],
            threads=threads,
        )
        assert all(r.ok for r in rs), [r.error for r in rs]

    one_s, two_s = median_times_alternating(lambda: run(1), lambda: run(2), reset, ROUNDS)
    reset()
    b0 = loopback_tx_bytes()
    t0 = time.perf_counter()
    run(2)
    served = (loopback_tx_bytes() - b0) / (time.perf_counter() - t0) / 1e6
    benchmark.pedantic(lambda: run(2), setup=reset, rounds=1, iterations=1)
    benchmark.extra_info.update(
        {
            "baseline": f"restore_many of {PARTITIONS} Kafka partitions (native replay) on 1 thread",
            "candidate": "the same on 2 threads",
            "ratio": one_s / two_s,
            "goal": 1.6,
            "records": N * PARTITIONS,
            "one_thread_records_per_s": N * PARTITIONS / one_s,
            "two_threads_records_per_s": N * PARTITIONS / two_s,
            "broker_served_mb_per_s": served,
        }
    )
    print(
        f"\n1 thread {N * PARTITIONS / one_s:,.0f} rec/s, 2 threads {N * PARTITIONS / two_s:,.0f}, "
        f"ratio {one_s / two_s:.2f}"
    )
