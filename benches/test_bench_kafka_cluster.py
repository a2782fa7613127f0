"""The native Kafka fetcher on a 3-node Kafka 4.4 cluster (issue 33, Deliver 5), baseline and candidate in one run.

A 3-node cluster (``scripts/kafka-cluster.sh``: replication factor 3,
``min.insync.replicas=2``) and a single broker (``scripts/kafka-broker.sh``),
both on 127.0.0.1, get the same transactions: one partition of N records,
keys drawn from N/10, 100-byte values. The cluster also holds a topic of 12
partitions (M records each), whose leaders are spread over its 3 nodes.
Ratios (baseline time / candidate time, higher is better) and their goals:

- native replay restore of the partition from the cluster vs from the single
  broker: >= 0.8 (replication must not cost the reader)
- ``restore_many`` of the 12 partitions led by 3 brokers on 2 threads vs
  1 thread: >= 1.6

As context, each row reports the CPU seconds the brokers and this process
spent per timed restore (``/proc/PID/stat``) and the machine's cores: on
2 cores the brokers serving the restore compete with it for the CPU.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from conftest import median_times_alternating, scaled
from statestore import TopicPartition
from statestore.restore.engine import RestoreSpec, restore_many, restore_store
from support.kafka_broker import BrokerUnavailable, start_broker
from support.kafka_cluster import ClusterUnavailable, start_cluster
from support.model import store_difference

kafka = pytest.importorskip("statestore.changelog.kafka")
pytest.importorskip("confluent_kafka")

N = scaled(400_000, minimum=20_000)  # records of the partition restored from the cluster and from one broker
MANY = 12  # partitions of the restore_many topic
M = scaled(100_000, minimum=5_000)  # records of each of them
TXN = 5_000
ROUNDS = 5  # each side, in turn: restores of 0.1-0.4 s move with the host by more than a goal's margin
VALUE_SIZE = 100


class Data(NamedTuple):
    cluster: Any  # support.kafka_cluster.Cluster
    broker: Any  # support.kafka_broker.Broker
    on_cluster: Any  # KafkaChangelog (native) on the cluster
    on_broker: Any  # KafkaChangelog (native) on the single broker
    one: TopicPartition  # the partition both hold
    many: list[TopicPartition]  # the cluster's 12 partitions
    leaders: dict[int, int]  # partition of ``many`` -> leading node


def _write(changelogs: list[Any], tps: list[TopicPartition], n: int, seed: int) -> None:
    """``n`` records to each of ``tps`` in transactions of TXN, the same ones to every changelog."""
    rng = random.Random(seed)
    values = [rng.randbytes(VALUE_SIZE) for _ in range(997)]
    producers = [c.producer(f"bench-cluster-{seed}") for c in changelogs]
    for tp in tps:
        for start in range(0, n, TXN):
            for p in producers:
                p.begin()
            for i in range(start, min(start + TXN, n)):
                k, v = b"key-%012d" % rng.randrange(n // 10), values[i % 997]
                for p in producers:
                    p.send(tp.topic, tp.partition, k, v)
            for p in producers:
                p.commit()
    for p in producers:
        p.close()


def _wait_offsets(changelog: Any, tp: TopicPartition, want: Any, timeout: float = 60.0) -> None:
    """Wait for the last COMMIT marker: the coordinator writes it after commit returns."""
    deadline = time.monotonic() + timeout
    while changelog.offsets(tp) != want:
        assert time.monotonic() < deadline, (tp, changelog.offsets(tp), want)
        time.sleep(0.1)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Data]:
    try:
        cluster = start_cluster(tmp_path_factory.mktemp("kafka-cluster-bench"))
    except ClusterUnavailable as e:
        pytest.skip(f"no Kafka cluster could start: {e}")
    try:
        broker = start_broker()
    except BrokerUnavailable as e:
        cluster.stop()
        pytest.skip(f"no Kafka broker could start: {e}")
    opts = {"request_timeout": 60.0, "restore_stall_timeout": 60.0}
    on_cluster = kafka.KafkaChangelog(cluster.bootstrap, **opts)
    on_broker = kafka.KafkaChangelog(broker.bootstrap, **opts)
    try:
        assert on_cluster.native is not None and on_broker.native is not None
        one, many = "bench-cluster-one", "bench-cluster-many"
        on_cluster.create_topics({one: 1, many: MANY}, replication_factor=3)
        on_broker.create_topics({one: 1})
        cluster.wait_healthy([one, many], min_isr=3, timeout=120)
        tp_one = TopicPartition(one, 0)
        tps = [TopicPartition(many, p) for p in range(MANY)]
        t0 = time.perf_counter()
        _write([on_cluster, on_broker], [tp_one], N, seed=33)
        _write([on_cluster], tps, M, seed=34)
        _wait_offsets(on_cluster, tp_one, on_broker.offsets(tp_one))
        for tp in tps:
            assert on_cluster.offsets(tp)[1] >= M, (tp, on_cluster.offsets(tp))
        leaders = {p: n for p, n in cluster.leaders(many).items() if n is not None}
        assert len(leaders) == MANY and len(set(leaders.values())) == 3, leaders
        print(
            f"\nkafka cluster benchmark data: {N:,} records on the cluster and the broker, "
            f"{MANY} x {M:,} on the cluster (leaders {dict(Counter(leaders.values()))}), "
            f"written in {time.perf_counter() - t0:.1f}s"
        )
        yield Data(cluster, broker, on_cluster, on_broker, tp_one, tps, leaders)
    finally:
        on_cluster.close()
        on_broker.close()
        broker.stop()
        cluster.stop()


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` so far (their threads included)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(f[11]) + int(f[12])  # utime, stime (fields 14 and 15)
    return total / tick


def _cpu_of(fn: Callable[[], Any], brokers: list[int]) -> dict[str, float]:
    """Wall and CPU seconds (the brokers', this process's) of one call of ``fn``."""
    b0, c0 = _cpu_seconds(brokers), _cpu_seconds([os.getpid()])
    t0 = time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "brokers_cpu_s": _cpu_seconds(brokers) - b0,
        "client_cpu_s": _cpu_seconds([os.getpid()]) - c0,
    }


def test_native_restore_from_the_cluster_vs_one_broker(benchmark: Any, data: Data, tmp_path: Path) -> None:
    store = tmp_path / "s"

    def reset() -> None:
        shutil.rmtree(store, ignore_errors=True)

    def restore(changelog: Any) -> Any:
        return restore_store(store, changelog, data.one, mode="replay")

    broker_s, cluster_s = median_times_alternating(
        lambda: restore(data.on_broker), lambda: restore(data.on_cluster), reset, ROUNDS
    )
    reset()
    ref = tmp_path / "ref"
    restore_store(ref, data.on_broker, data.one, mode="replay")
    restore(data.on_cluster)
    assert store_difference(ref, store) is None, store_difference(ref, store)
    reset()
    cluster_pids = [p for p in data.cluster.pids if p is not None]
    cpu = _cpu_of(lambda: restore(data.on_cluster), cluster_pids)
    reset()
    cpu_one = _cpu_of(lambda: restore(data.on_broker), [data.broker.pid])
    benchmark.pedantic(lambda: restore(data.on_cluster), setup=reset, rounds=1, iterations=1)
    benchmark.extra_info.update(
        {
            "baseline": "native Kafka replay restore from one broker (Apache Kafka 4.4 on loopback)",
            "candidate": "the same records from a 3-node Kafka 4.4 cluster (replication factor 3)",
            "ratio": broker_s / cluster_s,
            "goal": 0.8,
            "records": N,
            "broker_records_per_s": N / broker_s,
            "cluster_records_per_s": N / cluster_s,
            "cluster_brokers_cpu_s": cpu["brokers_cpu_s"],
            "broker_cpu_s": cpu_one["brokers_cpu_s"],
            "client_cpu_s": cpu["client_cpu_s"],
            "cores": os.cpu_count() or 0,
            "load_avg_1m": os.getloadavg()[0],
        }
    )
    print(
        f"\none broker {N / broker_s:,.0f} rec/s, cluster {N / cluster_s:,.0f} rec/s, "
        f"ratio {broker_s / cluster_s:.2f}; cluster {cpu}, one broker {cpu_one}"
    )


def test_native_restore_many_of_12_partitions_on_3_brokers_two_threads_vs_one(
    benchmark: Any, data: Data, tmp_path: Path
) -> None:
    native = data.on_cluster

    def reset() -> None:
        for tp in data.many:
            shutil.rmtree(tmp_path / f"m{tp.partition}", ignore_errors=True)

    def run(threads: int) -> None:
        rs = restore_many(
            [RestoreSpec(tmp_path / f"m{tp.partition}", native, tp, mode="replay") for tp in data.many],
            threads=threads,
        )
        assert all(r.ok for r in rs), [r.error for r in rs]

    one_s, two_s = median_times_alternating(lambda: run(1), lambda: run(2), reset, ROUNDS)
    cluster_pids = [p for p in data.cluster.pids if p is not None]
    reset()
    cpu_one = _cpu_of(lambda: run(1), cluster_pids)
    reset()
    cpu_two = _cpu_of(lambda: run(2), cluster_pids)
    benchmark.pedantic(lambda: run(2), setup=reset, rounds=1, iterations=1)
    total = M * MANY
    benchmark.extra_info.update(
        {
            "baseline": f"restore_many of {MANY} partitions on a 3-node cluster (native replay) on 1 thread",
            "candidate": "the same on 2 threads",
            "ratio": one_s / two_s,
            "goal": 1.6,
            "records": total,
            "leaders_per_node": ",".join(str(c) for _, c in sorted(Counter(data.leaders.values()).items())),
            "one_thread_records_per_s": total / one_s,
            "two_threads_records_per_s": total / two_s,
            "one_thread_client_cpu_s": cpu_one["client_cpu_s"],
            "one_thread_brokers_cpu_s": cpu_one["brokers_cpu_s"],
            "two_threads_client_cpu_s": cpu_two["client_cpu_s"],
            "two_threads_brokers_cpu_s": cpu_two["brokers_cpu_s"],
            "two_threads_wall_s": cpu_two["wall_s"],
            "cores": os.cpu_count() or 0,
            "load_avg_1m": os.getloadavg()[0],
        }
    )
    print(
        f"\n1 thread {total / one_s:,.0f} rec/s, 2 threads {total / two_s:,.0f}, ratio {one_s / two_s:.2f}; "
        f"1 thread {cpu_one}, 2 threads {cpu_two}"
    )
