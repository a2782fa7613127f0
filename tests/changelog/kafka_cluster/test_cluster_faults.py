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
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.cluster_restores import (
    BOUNDS,
    PAUSE_SECONDS,
    REQUEST_TIMEOUT,
    Changelog,
    OnRecords,
    Reassigner,
    changelog_client,
    heal,
    restore_all,
    warm,
    write_changelog,
)
from support.kafka_cluster import Cluster, ClusterUnavailable, start_cluster

pytest.importorskip("statestore.changelog.kafka")

#: Seconds each restore_many of the 4 partitions may take, per case.
BOUND_KILL = BOUNDS["kill"]
BOUND_PAUSE = BOUNDS["pause"]
BOUND_DEAD_BOOTSTRAP = BOUNDS["dead-bootstrap"]
BOUND_ROLLING = BOUNDS["restart"]
BOUND_QUOTA = BOUNDS["quota"]
BOUND_REASSIGN = BOUNDS["reassign"]
BOUND_IDLE = BOUNDS["idle"]
BOUND_TLS = BOUNDS["tls"]
#: The brokers' connections.max.idle.ms in (g), and how long the client sits idle there: well past it.
BROKER_IDLE_MS = 3000
IDLE_SECONDS = 3 * BROKER_IDLE_MS / 1000
#: ... and past the client's request timeout too, so a fetch waiting on the paused leader must time out and go to
#: the new one rather than be answered once the old one resumes.
PAUSE_PAST_REQUEST_TIMEOUT = REQUEST_TIMEOUT + 5.0


@pytest.fixture(scope="module")
def changelog_data(kafka_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Changelog:
    return write_changelog(
        kafka_cluster, tmp_path_factory.mktemp("cluster-changelog"), "cluster", seed=0, rounds=6
    )


@pytest.fixture(autouse=True)
def healthy_cluster(kafka_cluster: Cluster, changelog_data: Changelog) -> Iterator[None]:
    """Every node running, every partition led by its preferred replica with ISR >= 2, before and after a test."""
    heal(kafka_cluster, changelog_data.topic)
    yield
    heal(kafka_cluster, changelog_data.topic)


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
    kc = changelog_client(kafka_cluster.bootstrap)
    try:
        warm(kc, changelog_data.topic)
        if when == "before":
            kafka_cluster.kill(victim)
            took = restore_all(kc, changelog_data, tmp_path).seconds
        else:
            listener = OnRecords(lambda: os.kill(pid, signal.SIGKILL))
            took = restore_all(kc, changelog_data, tmp_path, listener).seconds
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
    kc = changelog_client(kafka_cluster.bootstrap)
    resumer = threading.Timer(pause, kafka_cluster.resume, args=(victim,))
    try:
        warm(kc, changelog_data.topic)
        kafka_cluster.pause(victim)
        resumer.start()
        took = restore_all(kc, changelog_data, tmp_path).seconds
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
    kc = changelog_client(
        kafka_cluster.bootstrap
    )  # one client for every round: its connections see every restart
    times: list[float] = []
    try:
        warm(kc, changelog_data.topic)
        roller.start()
        while roller.is_alive():
            times.append(restore_all(kc, changelog_data, tmp_path / f"round-{len(times)}").seconds)
        times.append(restore_all(kc, changelog_data, tmp_path / "after").seconds)
    finally:
        roller.join()
        kc.close()
    assert not failure, failure
    assert len(times) >= 4, times
    assert max(times) < BOUND_ROLLING, f"{len(times)} rounds, slowest {max(times):.1f}s"


# -- (d) partition reassignment ------------------------------------------------------------------


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
    tool = Reassigner(kafka_cluster)
    kc = changelog_client(kafka_cluster.bootstrap)
    try:
        warm(kc, topic)  # the client's metadata names the victim as the leader
        if when == "before":
            for p, replicas in moved.items():
                tool.reassign(topic, p, replicas)
            took = restore_all(kc, changelog_data, tmp_path).seconds
        else:

            def move() -> None:  # the first restore has its offsets from the victim; its fetches come after
                for p, replicas in moved.items():
                    tool.reassign(topic, p, replicas)

            listener = OnRecords(move)
            took = restore_all(kc, changelog_data, tmp_path, listener).seconds
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
        kc = changelog_client(kafka_cluster.bootstrap)
        try:
            took = restore_all(kc, changelog_data, tmp_path).seconds
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
        kc = changelog_client(",".join([dead, *kafka_cluster.addresses]))
        try:
            took = restore_all(kc, changelog_data, tmp_path).seconds
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
    data = write_changelog(idle_cluster, tmp_path, "idle", seed=10, rounds=3)
    ports = {int(a.rsplit(":", 1)[1]) for a in idle_cluster.addresses}
    idle_cluster.admin()  # made before the first look at the sockets, so its connections are not counted as ours
    kc = changelog_client(idle_cluster.bootstrap)  # the client's default connections.max.idle.ms (9 minutes)
    try:
        first = restore_all(kc, data, tmp_path / "first").seconds
        pooled = {port for port, state in _own_connections(ports).items() if state == "01"}
        assert pooled, "the first restore left no connection open to reuse"
        print(f"{len(pooled)} connections open after the first restore; idle for {IDLE_SECONDS}s")
        time.sleep(IDLE_SECONDS)
        states = _tcp_states(ports)
        still = {port for port in pooled if states.get(port) == "01"}
        assert not still, (
            f"the brokers did not close {len(still)} of {len(pooled)} idle connections: {states}"
        )
        second = restore_all(kc, data, tmp_path / "second").seconds
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
    data = write_changelog(cluster, tmp_path, "tls", seed=20, rounds=3)
    conf = {"security.protocol": "SSL", "ssl.ca.location": str(certs / "ca.pem")}
    with caplog.at_level(logging.WARNING, logger="statestore.changelog.kafka.source"):
        kc = changelog_client(bootstrap, **conf)
        try:
            assert kc.native is None, "rustls refuses a certificate without subjectAltName"
            took = restore_all(kc, data, tmp_path / "tls", native=False).seconds
        finally:
            kc.close()
    lines = [r.getMessage() for r in caplog.records if "through confluent-kafka" in r.getMessage()]
    assert len(lines) == 1 and "subjectAltName" in lines[0], lines
    assert took < BOUND_TLS, f"{took:.1f}s through confluent-kafka over TLS"
