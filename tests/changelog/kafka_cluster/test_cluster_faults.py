"""Restores from a 3-node Kafka 4.4 cluster while it does what production clusters do (issue 33, point 3).

One compacted changelog of 4 partitions, replication factor 3, written by two
interleaved transactional producers per partition with every third
transaction aborted; every record also goes to a segment log, whose restores
are the stores that must come out (the committed records, aborted ones
dropped). Each case restores the 4 partitions with ``restore_many`` (2
threads) through a ``KafkaChangelog`` on the native fetcher, every store must
equal its segment-log twin, and the restore must end within the case's bound:

(a) the node leading most partitions is SIGKILLed -- just before the restore
    (the client's cached metadata still names it) or while it runs (from the
    first ``on_restore_start``);
(b) that node is SIGSTOPped for longer than ``broker.session.timeout.ms``
    (connections open, nothing answers) and resumed while the restore waits --
    before the client's request timeout, or after it;
(c) the cluster is restarted node by node (clean stops: leaders move away
    first), a restore running again and again meanwhile on one long-lived
    changelog;
(d) the partitions led by that node are reassigned to the other two (its
    replica removed, so it neither leads nor follows them any more) -- just
    before the restore or while it runs -- and back afterwards;
(e) a ``consumer_byte_rate`` client quota throttles the restore;
(f) the first bootstrap address is a port nobody listens on;
(g) on a cluster of its own whose brokers close connections idle for 3 s
    (``connections.max.idle.ms``), a long-lived changelog with the client's
    default restores, sits idle until the brokers have closed its pooled
    connections, and restores again;
(h) on a cluster of its own with a TLS listener on every node whose
    certificate names the host only in its CN (no subjectAltName, which rustls
    refuses): the changelog falls back to confluent-kafka saying so once, and
    restores.

The bounds leave room for the broker's session timeout (4 s), the client's
request timeout (10 s; one attempt waits a third of it, so a call at a paused
leader is retried at the new one within it) and a loaded 2-core machine.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from statestore import SegmentLog, TopicPartition, restore_many, restore_store
from statestore.restore.engine import RestoreSpec
from support.kafka_cluster import SCRIPT, SESSION_TIMEOUT, Cluster, ClusterUnavailable, start_cluster
from support.kafka_writes import write_twins
from support.model import store_difference

kafka = pytest.importorskip("statestore.changelog.kafka")
KafkaChangelog = kafka.KafkaChangelog

PARTITIONS = 4
STORE = "counts"
REQUEST_TIMEOUT = 10.0

#: Seconds each restore_many of the 4 partitions may take, per case.
BOUND_KILL = 30.0
BOUND_PAUSE = 45.0
BOUND_DEAD_BOOTSTRAP = 15.0
BOUND_ROLLING = 30.0
BOUND_QUOTA = 60.0
BOUND_REASSIGN = 30.0
BOUND_IDLE = 15.0
BOUND_TLS = 60.0
#: The brokers' connections.max.idle.ms in (g), and how long the client sits idle there: well past it.
BROKER_IDLE_MS = 3000
IDLE_SECONDS = 3 * BROKER_IDLE_MS / 1000
#: How long (b) keeps the leader paused: past the session timeout, so the controller fences it.
PAUSE_SECONDS = SESSION_TIMEOUT + 3.0
#: ... and past the client's request timeout too, so a fetch waiting on the paused leader must time out and go to
#: the new one rather than be answered once the old one resumes.
PAUSE_PAST_REQUEST_TIMEOUT = REQUEST_TIMEOUT + 5.0


@dataclass
class Changelog:
    """The test changelog on the cluster and the segment-log restores its partitions must equal."""

    topic: str
    expected: dict[int, Path]
    records: int


@pytest.fixture(scope="module")
def changelog_data(kafka_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Changelog:
    d = tmp_path_factory.mktemp("cluster-changelog")
    app = f"cluster{uuid.uuid4().hex[:8]}"
    kc = KafkaChangelog(kafka_cluster.bootstrap, request_timeout=30.0)
    try:
        (topic,) = kafka.ensure_changelog_topics(kc, app, [STORE], PARTITIONS)
        kafka_cluster.wait_healthy([topic], min_isr=3)
        described = kafka_cluster.describe(topic)
        assert all(len(replicas) == 3 for _, replicas, _ in described.values()), described
        seg = SegmentLog(d / "log", sync=False)
        records = sum(
            write_twins(kc, seg, TopicPartition(topic, p), seed=p, rounds=6) for p in range(PARTITIONS)
        )
        # The coordinator writes a transaction's COMMIT marker after commit_transaction returns: wait for the
        # last ones, so that the cluster's offsets are the segment log's.
        deadline = time.monotonic() + 30
        for p in range(PARTITIONS):
            tp = TopicPartition(topic, p)
            while kc.offsets(tp) != seg.offsets(tp):
                assert time.monotonic() < deadline, (kc.offsets(tp), seg.offsets(tp))
                time.sleep(0.1)
        expected = {}
        for p in range(PARTITIONS):
            expected[p] = d / f"expected-{p}"
            r = restore_store(expected[p], seg, TopicPartition(topic, p))
            assert r.records_skipped.aborted > 0 and r.records_skipped.control > 0
        return Changelog(topic, expected, records)
    finally:
        kc.close()


@pytest.fixture(autouse=True)
def healthy_cluster(kafka_cluster: Cluster, changelog_data: Changelog) -> Iterator[None]:
    """Every node running, every partition led by its preferred replica with ISR >= 2, before and after a test."""
    _heal(kafka_cluster, changelog_data.topic)
    yield
    _heal(kafka_cluster, changelog_data.topic)


def _heal(cluster: Cluster, topic: str) -> None:
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


def _changelog(bootstrap: str) -> Any:
    return KafkaChangelog(bootstrap, request_timeout=REQUEST_TIMEOUT, restore_stall_timeout=30.0)


def _restore_all(kc: Any, data: Changelog, into: Path, listener: Any = None, native: bool = True) -> float:
    """restore_many of every partition into ``into``/<p> on 2 threads; every store checked; the seconds taken."""
    if native:
        assert kc.native is not None, "the native fetcher serves a PLAINTEXT cluster"
    into.mkdir(parents=True, exist_ok=True)
    specs = [
        RestoreSpec(into / str(p), kc, TopicPartition(data.topic, p), listener=listener)
        for p in range(PARTITIONS)
    ]
    t0 = time.monotonic()
    results = restore_many(specs, threads=2)
    took = time.monotonic() - t0
    print(f"restore_many of {PARTITIONS} partitions into {into.name}: {took:.2f}s")
    errors = {p: repr(r.error) for p, r in enumerate(results) if not r.ok}
    assert not errors, f"restores failed after {took:.1f}s: {errors}"
    for p in range(PARTITIONS):
        diff = store_difference(data.expected[p], into / str(p))
        assert diff is None, f"partition {p}: {diff}"
    return took


def _warm(kc: Any, topic: str) -> None:
    """Ask for every partition's offsets: the client now holds metadata and connections to the leaders."""
    for p in range(PARTITIONS):
        kc.offsets(TopicPartition(topic, p))


class _OnFirstStart:
    """A restore listener that calls ``action`` once, from the first ``on_restore_start``."""

    def __init__(self, action: Any) -> None:
        self._action = action
        self._lock = threading.Lock()
        self.fired = False

    def on_restore_start(
        self, tp: TopicPartition, store_name: str, start_offset: int, end_offset: int
    ) -> None:
        with self._lock:
            if not self.fired:
                self.fired = True
                self._action()

    def on_batch_restored(
        self, tp: TopicPartition, store_name: str, batch_end_offset: int, num_restored: int
    ) -> None:
        pass

    def on_restore_end(self, tp: TopicPartition, store_name: str, total_restored: int) -> None:
        pass


# -- (a) SIGKILL ---------------------------------------------------------------------------------


@pytest.mark.parametrize("when", ["before", "while"])
def test_a_restore_survives_a_sigkill_of_the_busiest_leader(
    kafka_cluster: Cluster, changelog_data: Changelog, tmp_path: Path, when: str
) -> None:
    victim = kafka_cluster.busiest_leader([changelog_data.topic])
    led = [p for p, n in kafka_cluster.leaders(changelog_data.topic).items() if n == victim]
    assert led, "the victim leads a partition"
    pid = kafka_cluster.pid(victim)
    assert pid is not None
    kc = _changelog(kafka_cluster.bootstrap)
    try:
        _warm(kc, changelog_data.topic)
        if when == "before":
            kafka_cluster.kill(victim)
            took = _restore_all(kc, changelog_data, tmp_path)
        else:
            listener = _OnFirstStart(lambda: os.kill(pid, signal.SIGKILL))
            took = _restore_all(kc, changelog_data, tmp_path, listener)
            assert listener.fired
    finally:
        kc.close()
    deadline = time.monotonic() + 30
    while (
        Path(f"/proc/{pid}").exists() and time.monotonic() < deadline
    ):  # gone, not restarted behind our back
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), f"node {victim} ({pid}) outlived its SIGKILL"
    assert took < BOUND_KILL, f"{took:.1f}s with node {victim} (leader of {led}) killed {when} the restore"


# -- (b) SIGSTOP past the session timeout ---------------------------------------------------------


@pytest.mark.parametrize(
    "pause",
    [
        pytest.param(PAUSE_SECONDS, id="past-session"),
        pytest.param(PAUSE_PAST_REQUEST_TIMEOUT, id="past-request"),
    ],
)
def test_b_restore_survives_the_busiest_leader_paused_past_the_session_timeout(
    kafka_cluster: Cluster, changelog_data: Changelog, tmp_path: Path, pause: float
) -> None:
    victim = kafka_cluster.busiest_leader([changelog_data.topic])
    kc = _changelog(kafka_cluster.bootstrap)
    resumer = threading.Timer(pause, kafka_cluster.resume, args=(victim,))
    try:
        _warm(kc, changelog_data.topic)
        kafka_cluster.pause(victim)
        resumer.start()
        took = _restore_all(kc, changelog_data, tmp_path)
    finally:
        resumer.join()
        kc.close()
    assert took < BOUND_PAUSE, f"{took:.1f}s with node {victim} paused for {pause}s"


# -- (c) rolling restart -----------------------------------------------------------------------------


def test_c_restores_through_a_rolling_restart(
    kafka_cluster: Cluster, changelog_data: Changelog, tmp_path: Path
) -> None:
    failure: list[BaseException] = []

    def roll() -> None:
        try:
            for n in kafka_cluster.node_ids:
                kafka_cluster.restart(n)
                kafka_cluster.wait_healthy(
                    [changelog_data.topic], min_isr=3, timeout=90
                )  # as an operator waits
        except BaseException as e:
            failure.append(e)

    roller = threading.Thread(target=roll)
    kc = _changelog(kafka_cluster.bootstrap)  # one client for every round: its connections see every restart
    times = []
    try:
        _warm(kc, changelog_data.topic)
        roller.start()
        while roller.is_alive():
            times.append(_restore_all(kc, changelog_data, tmp_path / f"round-{len(times)}"))
        times.append(_restore_all(kc, changelog_data, tmp_path / "after"))
    finally:
        roller.join()
        kc.close()
    assert not failure, failure
    assert len(times) >= 4, times
    assert max(times) < BOUND_ROLLING, f"{len(times)} rounds, slowest {max(times):.1f}s"


# -- (d) partition reassignment ------------------------------------------------------------------


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


class _Reassigner:
    """Kafka's own Admin client (confluent-kafka has no AlterPartitionReassignments), started before a test so
    that a reassignment is one line away rather than a JVM start away."""

    def __init__(self, cluster: Cluster) -> None:
        src = cluster.dir / "Reassign.java"
        src.write_text(_REASSIGN_JAVA)
        cp = subprocess.run(
            ["bash", str(SCRIPT.parent / "kafka-broker.sh"), "classpath"],
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        ).stdout.strip()
        self._proc = subprocess.Popen(
            ["java", "-Xmx128m", "-cp", cp, str(src), cluster.bootstrap],
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


@pytest.mark.parametrize("when", ["before", "while"])
def test_d_restore_survives_a_reassignment_away_from_the_leader(
    kafka_cluster: Cluster, changelog_data: Changelog, tmp_path: Path, when: str
) -> None:
    topic = changelog_data.topic
    victim = kafka_cluster.busiest_leader([topic])
    original = {p: replicas for p, (_, replicas, _) in kafka_cluster.describe(topic).items()}
    moved = {
        p: [n for n in r if n != victim]
        for p, r in original.items()
        if kafka_cluster.leader(topic, p) == victim
    }
    assert moved, "the victim leads a partition"
    tool = _Reassigner(kafka_cluster)
    kc = _changelog(kafka_cluster.bootstrap)
    try:
        _warm(kc, topic)  # the client's metadata names the victim as the leader
        if when == "before":
            for p, replicas in moved.items():
                tool.reassign(topic, p, replicas)
            took = _restore_all(kc, changelog_data, tmp_path)
        else:

            def move() -> None:  # the first restore has its offsets from the victim; its fetches come after
                for p, replicas in moved.items():
                    tool.reassign(topic, p, replicas)

            listener = _OnFirstStart(move)
            took = _restore_all(kc, changelog_data, tmp_path, listener)
            assert listener.fired
        after = kafka_cluster.describe(topic)
        for p, replicas in moved.items():  # the reassignment did happen
            assert sorted(after[p][1]) == sorted(replicas), (p, after[p])
    finally:
        kc.close()
        try:
            for p in moved:  # back to three replicas in the original order, for the next tests
                tool.reassign(topic, p, original[p])
        finally:
            tool.close()
    assert took < BOUND_REASSIGN, (
        f"{took:.1f}s with {sorted(moved)} moved off node {victim} {when} the restore"
    )


# -- (e) client quota ------------------------------------------------------------------------------


def test_e_restore_under_a_consumer_byte_rate_quota(
    kafka_cluster: Cluster, changelog_data: Changelog, tmp_path: Path
) -> None:
    # Bytes per second per broker, for every client id. A broker caps a response at what the quota allows in its
    # window (10 s) and throttles once the rate over the window exceeds the quota: with ~330 KB to read from the
    # busiest broker, the restore is throttled for about 10 s.
    rate = 16 * 1024
    kafka_cluster.set_default_consumer_byte_rate(rate)
    try:
        kc = _changelog(kafka_cluster.bootstrap)
        try:
            took = _restore_all(kc, changelog_data, tmp_path)
        finally:
            kc.close()
    finally:
        kafka_cluster.set_default_consumer_byte_rate(None)
    assert took < BOUND_QUOTA, f"{took:.1f}s under {rate} B/s per broker"
    assert took > 3.0, f"{took:.1f}s: the quota did not hold the restore back, so this case tested nothing"


# -- (f) dead first bootstrap address ----------------------------------------------------------------


def test_f_restore_with_a_dead_first_bootstrap_address(
    kafka_cluster: Cluster, changelog_data: Changelog, tmp_path: Path
) -> None:
    with socket.socket() as s:  # a port nobody listens on: bound, never listening, so connecting is refused
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
        kc = _changelog(",".join([dead, *kafka_cluster.addresses]))
        try:
            took = _restore_all(kc, changelog_data, tmp_path)
        finally:
            kc.close()
    assert took < BOUND_DEAD_BOOTSTRAP, f"{took:.1f}s with {dead} first"


# -- (g) connections idle past the broker's connections.max.idle.ms ---------------------------------


def _tcp_states(remote_ports: set[int]) -> dict[int, str]:
    """``{local port: state}`` of this machine's IPv4 TCP sockets connected to one of ``remote_ports``
    (state 01 ESTABLISHED, 08 CLOSE_WAIT: the peer closed it)."""
    out = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        local, remote, state = f[1], f[2], f[3]
        if int(remote.split(":")[1], 16) in remote_ports:
            out[int(local.split(":")[1], 16)] = state
    return out


def _own_socket_inodes() -> set[str]:
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _own_connections(remote_ports: set[int]) -> dict[int, str]:
    """Like :func:`_tcp_states`, for this process's sockets only."""
    mine = _own_socket_inodes()
    out = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[9] in mine and int(f[2].split(":")[1], 16) in remote_ports:
            out[int(f[1].split(":")[1], 16)] = f[3]
    return out


def _small_changelog(cluster: Cluster, d: Path, prefix: str, seed: int) -> Changelog:
    """A changelog as the module's, smaller, on ``cluster``, and its segment-log restores in ``d``."""
    app = f"{prefix}{uuid.uuid4().hex[:8]}"
    kc = KafkaChangelog(cluster.bootstrap, request_timeout=30.0)
    seg = SegmentLog(d / "log", sync=False)
    try:
        (topic,) = kafka.ensure_changelog_topics(kc, app, [STORE], PARTITIONS)
        cluster.wait_healthy([topic], min_isr=3)
        records = sum(
            write_twins(kc, seg, TopicPartition(topic, p), seed=seed + p, rounds=3) for p in range(PARTITIONS)
        )
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
        restore_store(expected[p], seg, TopicPartition(topic, p))
    return Changelog(topic, expected, records)


def _own_cluster(d: Path, properties: list[str]) -> Cluster:
    """A cluster of the test's own, or a skip (a failure under ``CI=true``) when none can start."""
    try:
        return start_cluster(d, properties)
    except ClusterUnavailable as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and no Kafka cluster could start: {e}")
        pytest.skip(f"no Kafka cluster could start: {e}")


@pytest.fixture
def idle_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A second 3-node cluster whose brokers close connections idle for ``BROKER_IDLE_MS``, for one test."""
    cluster = _own_cluster(
        tmp_path_factory.mktemp("kafka-idle-cluster"), [f"connections.max.idle.ms={BROKER_IDLE_MS}"]
    )
    try:
        yield cluster
    finally:
        cluster.stop()


def test_g_restore_after_the_brokers_closed_idle_connections(idle_cluster: Cluster, tmp_path: Path) -> None:
    data = _small_changelog(idle_cluster, tmp_path, "idle", seed=10)
    ports = {int(a.rsplit(":", 1)[1]) for a in idle_cluster.addresses}
    idle_cluster.admin()  # made before the first look at the sockets, so its connections are not counted as ours
    kc = _changelog(idle_cluster.bootstrap)  # the client's default connections.max.idle.ms (9 minutes)
    try:
        first = _restore_all(kc, data, tmp_path / "first")
        pooled = {port for port, state in _own_connections(ports).items() if state == "01"}
        assert pooled, "the first restore left no connection open to reuse"
        print(f"{len(pooled)} connections open after the first restore; idle for {IDLE_SECONDS}s")
        time.sleep(IDLE_SECONDS)
        states = _tcp_states(ports)
        still = {port for port in pooled if states.get(port) == "01"}
        assert not still, (
            f"the brokers did not close {len(still)} of {len(pooled)} idle connections: {states}"
        )
        second = _restore_all(kc, data, tmp_path / "second")
    finally:
        kc.close()
    assert first < BOUND_IDLE and second < BOUND_IDLE, (first, second)


# -- (h) TLS with a CN-only certificate ---------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _cn_only_certificates(d: Path) -> None:
    """ca.pem, and cn.pem: a key and a v3 certificate for localhost with no subjectAltName (the host in the CN)."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=statestore test CA", cwd=d)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "cn.key", "-out", "cn.csr", "-subj", "/CN=localhost",
             cwd=d)  # fmt: skip
    (d / "cn.ext").write_text("basicConstraints=CA:FALSE\n")
    _openssl("x509", "-req", "-in", "cn.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
             "cn.crt", "-days", "2", "-extfile", "cn.ext", cwd=d)  # fmt: skip
    _openssl(
        "pkcs8", "-topk8", "-nocrypt", "-in", "cn.key", "-out", "cn.p8", cwd=d
    )  # PKCS#8: Kafka's PEM store
    (d / "cn.pem").write_text((d / "cn.p8").read_text() + (d / "cn.crt").read_text())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, str, Path]]:
    """A second cluster, for one test, whose every node also has an SSL listener ``SSL_CN`` advertised as localhost:PORT with
    the CN-only certificate; the bootstrap of those listeners; the directory of ca.pem."""
    import shutil

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    certs = tmp_path_factory.mktemp("cn-certs")
    _cn_only_certificates(certs)
    # The script formats a cluster on its first start and has one substitution (@PORT@) for per-node ports: so
    # start it, stop it, and give each node its own TLS port before starting it again.
    cluster = _own_cluster(tmp_path_factory.mktemp("kafka-tls-cluster"), [])
    try:
        cluster.stop()
        tls = []
        for n in cluster.node_ids:
            conf = cluster.dir / f"node{n}" / "server.properties"
            port = _free_port()
            tls.append(f"localhost:{port}")
            lines = []
            for line in conf.read_text().splitlines():
                if line.startswith("listeners="):
                    line += f",SSL_CN://127.0.0.1:{port}"
                elif line.startswith("advertised.listeners="):
                    line += f",SSL_CN://localhost:{port}"
                lines.append(line)
            lines += [
                "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SSL_CN:SSL",
                "listener.name.ssl_cn.ssl.keystore.type=PEM",
                f"listener.name.ssl_cn.ssl.keystore.location={certs / 'cn.pem'}",
            ]
            conf.write_text("\n".join(lines) + "\n")
        cluster.start()
        cluster.wait_brokers(timeout=60)
        yield cluster, ",".join(tls), certs
    finally:
        cluster.stop()


def test_h_restore_from_tls_listeners_with_a_cn_only_certificate(
    tls_cluster: tuple[Cluster, str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    cluster, bootstrap, certs = tls_cluster
    data = _small_changelog(cluster, tmp_path, "tls", seed=20)
    conf = {"security.protocol": "SSL", "ssl.ca.location": str(certs / "ca.pem")}
    with caplog.at_level(logging.WARNING, logger="statestore.changelog.kafka.source"):
        kc = KafkaChangelog(bootstrap, request_timeout=REQUEST_TIMEOUT, restore_stall_timeout=30.0, **conf)
        try:
            assert kc.native is None, "rustls refuses a certificate without subjectAltName"
            took = _restore_all(kc, data, tmp_path / "tls", native=False)
        finally:
            kc.close()
    lines = [r.getMessage() for r in caplog.records if "through confluent-kafka" in r.getMessage()]
    assert len(lines) == 1 and "subjectAltName" in lines[0], lines
    assert took < BOUND_TLS, f"{took:.1f}s through confluent-kafka over TLS"
