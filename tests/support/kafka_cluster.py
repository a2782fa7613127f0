"""A 3-node Apache Kafka 4.4 cluster for the fault tests, started by ``scripts/kafka-cluster.sh``.

:func:`start_cluster` starts one in a directory of its own on 127.0.0.1 and
returns a :class:`Cluster`: its bootstrap addresses and node ids, and what a
production cluster does to a client -- :meth:`Cluster.kill` (SIGKILL),
:meth:`Cluster.pause` (SIGSTOP) and :meth:`Cluster.resume` (SIGCONT) of one
node, :meth:`Cluster.restart` (a clean stop, then a start on the same ports and
log directory), :meth:`Cluster.stop` of all. :meth:`Cluster.leader` and
:meth:`Cluster.leaders` ask the cluster (confluent-kafka ``describe_topics``)
who leads a partition; :meth:`Cluster.wait_healthy` waits until every partition
of some topics has a live leader and an ISR of at least two. It raises
:class:`ClusterUnavailable` with the script's output when no cluster can start,
so the fixture can skip -- or fail, under ``CI=true``.
"""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "kafka-cluster.sh"

#: broker.session.timeout.ms of the script's nodes: a dead or paused broker is fenced after this long.
SESSION_TIMEOUT = 4.0


class ClusterUnavailable(Exception):
    """No Kafka cluster could start; the message says why."""


def _fields(line: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in line.split())


@dataclass
class Cluster:
    """A cluster started by ``scripts/kafka-cluster.sh`` in ``dir``; nodes are numbered from 1."""

    dir: Path
    bootstrap: str
    log_dirs: list[Path]
    pids: list[int | None]
    _admin: Any = field(default=None, repr=False)

    @property
    def addresses(self) -> list[str]:
        """``host:port`` of each node, node 1 first."""
        return self.bootstrap.split(",")

    @property
    def node_ids(self) -> list[int]:
        return list(range(1, len(self.pids) + 1))

    def address(self, node: int) -> str:
        return self.addresses[node - 1]

    def pid(self, node: int) -> int | None:
        return self.pids[node - 1]

    def _run(self, *args: str, timeout: float = 300) -> str:
        out = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(
                f"kafka-cluster.sh {' '.join(args)} failed ({out.returncode}):\n{out.stderr[-3000:]}"
            )
        return out.stdout

    def refresh(self) -> None:
        """Re-read the pids (``-`` for a node that is not running) from the script's ``status``."""
        self._set(self._run("status", str(self.dir)).strip().splitlines()[-1])

    def _set(self, line: str) -> None:
        f = _fields(line)
        self.bootstrap = f["bootstrap"]
        self.log_dirs = [Path(d) for d in f["log_dirs"].split(",")]
        self.pids = [None if p == "-" else int(p) for p in f["pids"].split(",")]

    # -- faults --------------------------------------------------------------------------------

    def kill(self, node: int) -> None:
        """SIGKILL ``node``, as a crash would, and wait until it is gone."""
        self._run("kill", str(self.dir), str(node))
        self.pids[node - 1] = None

    def pause(self, node: int) -> None:
        """SIGSTOP ``node``: its sockets stay open and nothing answers."""
        self._run("pause", str(self.dir), str(node))

    def resume(self, node: int) -> None:
        """SIGCONT ``node``."""
        self._run("resume", str(self.dir), str(node))

    def restart(self, node: int) -> None:
        """Stop ``node`` cleanly if it runs (its leaders move away first), start it again and wait for its port."""
        self._set(self._run("restart", str(self.dir), str(node)).strip().splitlines()[-1])

    def start(self) -> None:
        """Start every node that is not running (after :meth:`stop` or kills)."""
        self._set(self._run("start", str(self.dir)).strip().splitlines()[-1])

    def stop(self) -> None:
        """Stop every node (a paused one is resumed first); SIGKILL after the script's timeout."""
        if self._admin is not None:
            self._admin = None
        self._run("stop", str(self.dir), timeout=120)
        self.pids = [None] * len(self.pids)

    def alive(self, node: int) -> bool:
        pid = self.pid(node)
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    def rss_bytes(self) -> dict[int, int]:
        """Resident memory of each running node."""
        out = {}
        for n in self.node_ids:
            pid = self.pid(n)
            if pid is None:
                continue
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    out[n] = int(line.split()[1]) * 1024
        return out

    # -- quotas --------------------------------------------------------------------------------

    def java_tool(self, name: str, source: str) -> list[str]:
        """The command that runs the single-file Java program ``source`` (class ``name``) on Kafka's own
        classpath (for what confluent-kafka's admin client cannot do); its arguments go after it."""
        src = self.dir / f"{name}.java"
        src.write_text(source)
        cp = subprocess.run(
            ["bash", str(SCRIPT.parent / "kafka-broker.sh"), "classpath"],
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        ).stdout.strip()
        return ["java", "-Xmx128m", "-cp", cp, str(src)]

    def set_default_consumer_byte_rate(self, rate: int | None) -> None:
        """Set (or, with None, remove) the ``consumer_byte_rate`` quota of every client id, on every broker.

        confluent-kafka has no AlterClientQuotas: a few lines of Java run it through Kafka's own Admin client.
        """
        value = "-" if rate is None else str(rate)
        out = subprocess.run(
            [*self.java_tool("ClientQuota", _CLIENT_QUOTA_JAVA), self.bootstrap, value],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if out.returncode != 0:
            raise RuntimeError(f"setting consumer_byte_rate={rate} failed:\n{out.stdout}{out.stderr[-3000:]}")

    # -- metadata ------------------------------------------------------------------------------

    def admin(self) -> Any:
        """A confluent-kafka AdminClient on the cluster (made once)."""
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            self._admin = AdminClient(
                {
                    "bootstrap.servers": self.bootstrap,
                    "socket.connection.setup.timeout.ms": 3000,
                    "logger": _QUIET,
                }
            )
        return self._admin

    def describe(
        self, topic: str, timeout: float = 10.0
    ) -> dict[int, tuple[int | None, list[int], list[int]]]:
        """``{partition: (leader or None, replicas, isr)}`` of ``topic``, as the controller has it now.

        A topic just created reaches each node's metadata at its own pace (seconds on a loaded machine):
        a node that does not know it yet is asked again until ``timeout``.
        """
        from confluent_kafka import KafkaError, KafkaException, TopicCollection

        deadline = time.monotonic() + timeout
        while True:
            futures = self.admin().describe_topics(TopicCollection([topic]), request_timeout=timeout)
            try:
                desc = futures[topic].result(timeout=timeout)
                break
            except KafkaException as e:
                unknown = e.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
                if not unknown or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        return {
            p.id: (
                p.leader.id if p.leader is not None and p.leader.id >= 0 else None,
                [n.id for n in p.replicas],
                [n.id for n in p.isr],
            )
            for p in desc.partitions
        }

    def leader(self, topic: str, partition: int) -> int | None:
        """The node leading ``topic``/``partition`` (None while it has none)."""
        return self.describe(topic)[partition][0]

    def leaders(self, topic: str) -> dict[int, int | None]:
        """``{partition: leading node}`` of ``topic``."""
        return {p: d[0] for p, d in self.describe(topic).items()}

    def busiest_leader(self, topics: Iterable[str]) -> int:
        """The node leading the most partitions of ``topics`` (the lowest id on a tie)."""
        count: Counter[int] = Counter()
        for t in topics:
            count.update(n for n in self.leaders(t).values() if n is not None)
        return min(count, key=lambda n: (-count[n], n))

    def wait_healthy(self, topics: Iterable[str], min_isr: int = 2, timeout: float = 60.0) -> None:
        """Wait until every partition of ``topics`` has a running leader and an ISR of at least ``min_isr``."""
        topics = list(topics)
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            try:
                last = {t: self.describe(t, timeout=5.0) for t in topics}
                if all(
                    leader is not None and self.alive(leader) and len(isr) >= min_isr
                    for d in last.values()
                    for leader, _, isr in d.values()
                ):
                    return
            except Exception as e:  # a node down: describe may time out; ask again
                last = e
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topics} not led with ISR >= {min_isr} within {timeout}s: {last}")
            time.sleep(0.25)

    def wait_brokers(self, count: int | None = None, timeout: float = 60.0) -> None:
        """Wait until the cluster's metadata lists ``count`` brokers (all of them by default)."""
        want = len(self.pids) if count is None else count
        deadline = time.monotonic() + timeout
        while True:
            try:
                if len(self.admin().list_topics(timeout=5.0).brokers) >= want:
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cluster in {self.dir} did not list {want} brokers within {timeout}s")
            time.sleep(0.25)


#: librdkafka's connection-refused chatter while nodes are down goes here rather than to stderr.
_QUIET = logging.getLogger("support.kafka_cluster.admin")


_CLIENT_QUOTA_JAVA = """
import java.util.*;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.common.quota.*;

public class ClientQuota {
    // ClientQuota BOOTSTRAP RATE|-: consumer_byte_rate of the default client id (every client), or its removal
    public static void main(String[] args) throws Exception {
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", args[0]))) {
            ClientQuotaEntity entity = new ClientQuotaEntity(Collections.singletonMap(ClientQuotaEntity.CLIENT_ID, null));
            Double rate = args[1].equals("-") ? null : Double.valueOf(args[1]);
            ClientQuotaAlteration.Op op = new ClientQuotaAlteration.Op("consumer_byte_rate", rate);
            admin.alterClientQuotas(List.of(new ClientQuotaAlteration(entity, List.of(op)))).all().get();
        }
    }
}
"""


def start_cluster(
    directory: Path | None = None, properties: list[str] | None = None, nodes: int = 3
) -> Cluster:
    """Start a cluster of ``nodes`` in ``directory`` (a fresh temporary one by default) with extra ``properties``."""
    d = Path(tempfile.mkdtemp(prefix="statestore-kafka-cluster-")) if directory is None else directory
    try:
        out = subprocess.run(
            ["bash", str(SCRIPT), "start", str(d), "--nodes", str(nodes), *(properties or [])],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ClusterUnavailable(f"{SCRIPT} start {d}: {e}") from e
    if out.returncode != 0:
        raise ClusterUnavailable(f"{SCRIPT} start {d} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    line = out.stdout.strip().splitlines()[-1]
    c = Cluster(d, "", [], [])
    try:
        c._set(line)
    except (KeyError, ValueError) as e:
        raise ClusterUnavailable(f"{SCRIPT} start printed {line!r}") from e
    try:
        c.wait_brokers(timeout=60)
    except TimeoutError as e:
        c.stop()
        raise ClusterUnavailable(str(e)) from e
    return c


def cluster_or_skip_reason(directory: Path | None = None) -> tuple[Cluster | None, str | None]:
    """A started cluster, or the reason none could start (raised again under ``CI=true``)."""
    try:
        return start_cluster(directory), None
    except ClusterUnavailable as e:
        if os.environ.get("CI") == "true":
            raise
        return None, str(e)
