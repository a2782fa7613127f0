"""Restores from the 3-node test cluster, checked against their segment-log twins: what the cluster fault tests
(``tests/changelog/kafka_cluster``) share.

A test changelog (:func:`write_changelog`) is written to the cluster and to a segment log alike by
:func:`support.kafka_writes.write_twins`; the segment log's restores are the stores every restore from the cluster
must equal (the committed records, aborted ones dropped). :func:`restore_all` restores every partition with
``restore_many`` on 2 threads and checks each store; :func:`heal` brings the cluster back to every node running
and every partition led by its preferred replica; :class:`OnRecords` starts a fault from inside a restore;
:class:`Reassigner` moves partitions between nodes with Kafka's own Admin client.
"""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from statestore import SegmentLog, TopicPartition, restore_many, restore_store
from statestore.restore.engine import RestoreSpec
from support.kafka_cluster import SESSION_TIMEOUT, Cluster
from support.kafka_writes import write_twins
from support.model import store_difference

PARTITIONS = 4
STORE = "counts"
#: The client's request timeout in every case: one attempt waits a third of it.
REQUEST_TIMEOUT = 10.0
#: Seconds a restore_many of every partition may take with each fault. They leave room for the broker's session
#: timeout, the client's request timeout (a call at a paused leader is retried at the new one within it) and a
#: loaded 2-core machine.
BOUNDS = {
    "kill": 30.0,
    "pause": 45.0,
    "dead-bootstrap": 15.0,
    "restart": 30.0,
    "quota": 60.0,
    "reassign": 30.0,
    "idle": 15.0,
    "tls": 60.0,
}
#: How long a paused leader stays paused: past the session timeout, so the controller fences it.
PAUSE_SECONDS = SESSION_TIMEOUT + 3.0


@dataclass
class Changelog:
    """A test changelog on the cluster and the segment-log restores its partitions must equal."""

    topic: str
    expected: dict[int, Path]
    records: int


def write_changelog(
    cluster: Cluster,
    d: Path,
    prefix: str,
    seed: int,
    rounds: int,
    keys: int = 600,
    config: Mapping[str, str] | None = None,
) -> Changelog:
    """A compacted changelog of :data:`PARTITIONS` partitions, replication factor 3 (topic ``config`` over the
    defaults), ``rounds`` rounds of :func:`write_twins` over ``keys`` keys a partition; its segment-log twin and
    restores in ``d``."""
    from statestore.changelog.kafka import KafkaChangelog, ensure_changelog_topics

    app = f"{prefix}{uuid.uuid4().hex[:8]}"
    kc = KafkaChangelog(cluster.bootstrap, request_timeout=30.0)
    seg = SegmentLog(d / "log", sync=False)
    try:
        (topic,) = ensure_changelog_topics(kc, app, [STORE], PARTITIONS, config=config)
        cluster.wait_healthy([topic], min_isr=3)
        described = cluster.describe(topic)
        assert all(len(replicas) == 3 for _, replicas, _ in described.values()), described
        records = sum(
            write_twins(kc, seg, TopicPartition(topic, p), seed=seed + p, rounds=rounds, keys=keys)
            for p in range(PARTITIONS)
        )
        # The coordinator writes a transaction's COMMIT marker after commit_transaction returns: wait for the
        # last ones, so that the cluster's offsets are the segment log's.
        deadline = time.monotonic() + 30
        for p in range(PARTITIONS):
            tp = TopicPartition(topic, p)
            while kc.offsets(tp) != seg.offsets(tp):
                assert time.monotonic() < deadline, (kc.offsets(tp), seg.offsets(tp))
                time.sleep(0.1)
    finally:
        kc.close()
    expected = {}
    for p in range(PARTITIONS):
        expected[p] = d / f"expected-{p}"
        r = restore_store(expected[p], seg, TopicPartition(topic, p))
        assert r.records_skipped.aborted > 0 and r.records_skipped.control > 0
    return Changelog(topic, expected, records)


def heal(cluster: Cluster, topic: str) -> None:
    """Every node running, every partition of ``topic`` led by its preferred replica with an ISR of 3."""
    from confluent_kafka import ElectionType
    from confluent_kafka import TopicPartition as CkTopicPartition

    cluster.refresh()
    for n in cluster.node_ids:
        if cluster.alive(n):
            cluster.resume(n)
    if not all(cluster.alive(n) for n in cluster.node_ids):
        cluster.start()
    cluster.wait_healthy([topic], min_isr=3, timeout=90)
    preferred = {p: replicas[0] for p, (_, replicas, _) in cluster.describe(topic).items()}
    deadline = time.monotonic() + 30
    while cluster.leaders(topic) != preferred:
        try:
            cluster.admin().elect_leaders(
                ElectionType.PREFERRED, [CkTopicPartition(topic, p) for p in range(PARTITIONS)]
            ).result(timeout=10)
        except Exception:
            pass  # ELECTION_NOT_NEEDED for those already led by their preferred replica
        assert time.monotonic() < deadline, f"preferred leaders not elected: {cluster.describe(topic)}"
        time.sleep(0.5)


def changelog_client(bootstrap: str, **conf: Any) -> Any:
    """The ``KafkaChangelog`` every case restores through: :data:`REQUEST_TIMEOUT`, a 30 s stall timeout."""
    from statestore.changelog.kafka import KafkaChangelog

    return KafkaChangelog(bootstrap, request_timeout=REQUEST_TIMEOUT, restore_stall_timeout=30.0, **conf)


class Restored(NamedTuple):
    """What :func:`restore_all` took: seconds, and records applied in all."""

    seconds: float
    records: int


def restore_all(
    kc: Any, data: Changelog, into: Path, listener: Any = None, native: bool = True, mode: str = "auto"
) -> Restored:
    """restore_many of every partition into ``into``/<p> on 2 threads; every store checked."""
    if native:
        assert kc.native is not None, "the native fetcher serves a PLAINTEXT cluster"
    into.mkdir(parents=True, exist_ok=True)
    specs = [
        RestoreSpec(
            into / str(p),
            kc,
            TopicPartition(data.topic, p),
            mode=mode,
            listener=listener,
            progress_interval=0.0 if listener is not None else RestoreSpec.progress_interval,
        )
        for p in range(PARTITIONS)
    ]
    t0 = time.monotonic()
    results = restore_many(specs, threads=2)
    took = time.monotonic() - t0
    print(f"restore_many ({mode}) of {PARTITIONS} partitions into {into.name}: {took:.2f}s")
    errors = {p: repr(r.error) for p, r in enumerate(results) if not r.ok}
    assert not errors, f"restores failed after {took:.1f}s: {errors}"
    for p in range(PARTITIONS):
        diff = store_difference(data.expected[p], into / str(p))
        assert diff is None, f"partition {p}: {diff}"
    return Restored(took, sum(r.records_applied for r in results))


def warm(kc: Any, topic: str) -> None:
    """Ask for every partition's offsets: the client now holds metadata and connections to the leaders."""
    for p in range(PARTITIONS):
        kc.offsets(TopicPartition(topic, p))


class OnRecords:
    """A restore listener that calls ``action`` once: from the first ``on_restore_start`` (``after`` 0), or from
    the first ``on_batch_restored`` by which the restores have applied ``after`` records in all."""

    def __init__(self, action: Any, after: int = 0) -> None:
        self._action = action
        self._after = after
        self._restored = 0
        self._lock = threading.Lock()
        self.fired = False

    def _maybe_fire(self) -> None:
        if not self.fired and self._restored >= self._after:
            self.fired = True
            self._action()

    def on_restore_start(
        self, tp: TopicPartition, store_name: str, start_offset: int, end_offset: int
    ) -> None:
        with self._lock:
            self._maybe_fire()

    def on_batch_restored(
        self, tp: TopicPartition, store_name: str, batch_end_offset: int, num_restored: int
    ) -> None:
        with self._lock:
            self._restored += num_restored
            self._maybe_fire()

    def on_restore_end(self, tp: TopicPartition, store_name: str, total_restored: int) -> None:
        pass


_REASSIGN_JAVA = """
import java.io.*;
import java.util.*;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.common.TopicPartition;

public class Reassign {
    // Reassign BOOTSTRAP; then a line "TOPIC PARTITION R1,R2,..." per reassignment on stdin, each answered with
    // "ok" once the controller has no reassignment of that partition in progress any more (or "error ...").
    public static void main(String[] args) throws Exception {
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", args[0]))) {
            System.out.println("ready");
            System.out.flush();
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
            String line;
            while ((line = in.readLine()) != null) {
                try {
                    String[] f = line.trim().split(" ");
                    TopicPartition tp = new TopicPartition(f[0], Integer.parseInt(f[1]));
                    List<Integer> replicas = new ArrayList<>();
                    for (String r : f[2].split(",")) replicas.add(Integer.valueOf(r));
                    admin.alterPartitionReassignments(
                        Map.of(tp, Optional.of(new NewPartitionReassignment(replicas)))).all().get();
                    long deadline = System.currentTimeMillis() + 60000;
                    while (!admin.listPartitionReassignments(Set.of(tp)).reassignments().get().isEmpty()) {
                        if (System.currentTimeMillis() > deadline) throw new Exception("still reassigning " + tp);
                        Thread.sleep(100);
                    }
                    System.out.println("ok");
                } catch (Exception e) {
                    System.out.println("error " + e.toString().replace('\\n', ' '));
                }
                System.out.flush();
            }
        }
    }
}
"""


class Reassigner:
    """Kafka's own Admin client (confluent-kafka has no AlterPartitionReassignments), started before a test so
    that a reassignment is one line away rather than a JVM start away."""

    def __init__(self, cluster: Cluster) -> None:
        self._proc = subprocess.Popen(
            [*cluster.java_tool("Reassign", _REASSIGN_JAVA), cluster.bootstrap],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._lock = threading.Lock()
        assert self._read() == "ready"

    def _read(self) -> str:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().strip()
        assert line, f"the reassignment tool exited ({self._proc.poll()})"
        return line

    def send(self, topic: str, partition: int, replicas: list[int]) -> None:
        """Ask for a reassignment and return without waiting for it (:meth:`wait` reads the answer)."""
        assert self._proc.stdin is not None
        with self._lock:
            self._proc.stdin.write(f"{topic} {partition} {','.join(map(str, replicas))}\n")
            self._proc.stdin.flush()

    def wait(self) -> None:
        line = self._read()
        assert line == "ok", line

    def reassign(self, topic: str, partition: int, replicas: list[int]) -> None:
        self.send(topic, partition, replicas)
        self.wait()

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
