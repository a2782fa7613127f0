"""The cluster faults of ``test_cluster_faults.py`` again and again, at random moments inside the restores, on a
larger changelog that the log cleaner has compacted: the torture variant (``make torture``; marker ``torture``).

The changelog has ten times the transactions of the small one, over ten times the keys, in segments that roll every
200 ms, and is restored only once every replica's log cleaner has compacted every partition (dropping aborted
records and overridden values, leaving markers and the batches around them as the cleaner leaves them). One client
restores it round after round, so its metadata and leader epochs live through every fault; its first bootstrap
address is dead, and it closes connections idle for 2 s (every round reconnects). It fetches one batch a partition
at a time (a partition holds a few hundred), so that a restore is many fetches and whatever follows a fault's moment
is fetched after it, but for the few batches fetched ahead (by default a compacted partition this size comes in one
response). Each round draws a fault, a restore mode (replay or bulk) and a moment -- a number of records the
restores have applied -- and at that moment, from inside the restore:

- **kill**: SIGKILL the node leading most partitions;
- **pause**: SIGSTOP it for longer than the broker session timeout, resumed while the restore waits;
- **restart**: stop it cleanly and start it again (one step of a rolling restart);
- **reassign**: move the partitions it leads to the other two nodes (its replica removed).

The restore thread that started the fault waits for it (a restart, a reassignment) while the other goes on.

Every store must equal its segment-log twin (the committed records), within the case's bound of the small test;
then the cluster is healed (every node running, the original replicas, preferred leaders) for the next round.
``STATESTORE_CLUSTER_TORTURE_ROUNDS`` (default 12) and ``STATESTORE_CLUSTER_TORTURE_SEED`` (default: drawn and
printed) set the run.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from support.cluster_restores import (
    BOUNDS,
    PARTITIONS,
    PAUSE_SECONDS,
    Changelog,
    OnRecords,
    Reassigner,
    changelog_client,
    heal,
    restore_all,
    warm,
    write_changelog,
)
from support.kafka_cluster import Cluster

pytest.importorskip("statestore.changelog.kafka")

pytestmark = pytest.mark.torture

ROUNDS = int(os.environ.get("STATESTORE_CLUSTER_TORTURE_ROUNDS", "12"))
SEED = int(os.environ.get("STATESTORE_CLUSTER_TORTURE_SEED", "0")) or random.randrange(1, 1 << 30)
FAULTS = ("kill", "pause", "restart", "reassign")
#: Segments that roll every 200 ms of writing, each cleanable as soon as it rolled.
COMPACTED = {"segment.ms": "200", "min.cleanable.dirty.ratio": "0.01"}
#: The restoring client: one batch a partition a Fetch (a broker always returns the first whole), and pooled
#: connections closed after 2 s idle (the heal between rounds takes longer: every round connects afresh).
CLIENT = {"max.partition.fetch.bytes": 1, "connections.max.idle.ms": 2000}


def _cleaned(cluster: Cluster, topic: str) -> dict[tuple[int, int], int]:
    """``{(node, partition): offset}`` each replica's log cleaner has cleaned ``topic`` up to (its
    ``cleaner-offset-checkpoint``: a version line, a count line, then ``topic partition offset`` lines)."""
    out = {}
    for node, log_dir in zip(cluster.node_ids, cluster.log_dirs, strict=True):
        f = log_dir / "cleaner-offset-checkpoint"
        lines = f.read_text().splitlines()[2:] if f.exists() else []
        for line in lines:
            t, p, offset = line.split()
            if t == topic:
                out[(node, int(p))] = int(offset)
    return out


@pytest.fixture(scope="module")
def compacted_changelog(kafka_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Changelog:
    data = write_changelog(
        kafka_cluster,
        tmp_path_factory.mktemp("cluster-torture-changelog"),
        "torture",
        seed=100,
        rounds=60,
        keys=6_000,
        config=COMPACTED,
    )
    deadline = time.monotonic() + 120
    want = {(n, p) for n in kafka_cluster.node_ids for p in range(PARTITIONS)}
    while not want <= {k for k, offset in _cleaned(kafka_cluster, data.topic).items() if offset > 0}:
        assert time.monotonic() < deadline, (
            f"not every replica was cleaned: {_cleaned(kafka_cluster, data.topic)}"
        )
        time.sleep(0.5)
    print(f"{data.records} records written; cleaned up to {_cleaned(kafka_cluster, data.topic)}")
    return data


@pytest.fixture
def healthy(kafka_cluster: Cluster, compacted_changelog: Changelog) -> Iterator[None]:
    heal(kafka_cluster, compacted_changelog.topic)
    yield
    heal(kafka_cluster, compacted_changelog.topic)


def _fault(
    kind: str, cluster: Cluster, topic: str, tool: Reassigner, timers: list[threading.Timer]
) -> tuple[Callable[[], None], Callable[[], None]]:
    """The action that starts fault ``kind`` from inside a restore (on its thread: the other restore thread goes on
    meanwhile), and what undoes it after the restore."""
    victim = cluster.busiest_leader([topic])
    original = {p: replicas for p, (_, replicas, _) in cluster.describe(topic).items()}
    led = [p for p, n in cluster.leaders(topic).items() if n == victim]
    assert led, "the victim leads a partition"
    if kind == "kill":
        pid = cluster.pid(victim)
        assert pid is not None
        return (lambda: os.kill(pid, signal.SIGKILL)), (lambda: None)
    if kind == "pause":

        def pause() -> None:
            cluster.pause(victim)
            resumer = threading.Timer(PAUSE_SECONDS, cluster.resume, args=(victim,))
            resumer.start()
            timers.append(resumer)

        return pause, (lambda: None)
    if kind == "restart":
        return (lambda: cluster.restart(victim)), (lambda: None)
    assert kind == "reassign"

    def move() -> None:
        for p in led:
            tool.reassign(topic, p, [n for n in original[p] if n != victim])

    def back() -> None:
        for p in led:
            tool.reassign(topic, p, original[p])

    return move, back


def test_restores_through_faults_at_random_moments_on_a_compacted_changelog(
    kafka_cluster: Cluster, compacted_changelog: Changelog, healthy: None, tmp_path: Path
) -> None:
    tool = Reassigner(kafka_cluster)
    try:
        with socket.socket() as dead:  # bound, never listening: connecting to it is refused
            dead.bind(("127.0.0.1", 0))
            bootstrap = ",".join([f"127.0.0.1:{dead.getsockname()[1]}", *kafka_cluster.addresses])
            _rounds(kafka_cluster, compacted_changelog, tool, bootstrap, tmp_path)
    finally:
        tool.close()


def _rounds(cluster: Cluster, data: Changelog, tool: Reassigner, bootstrap: str, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    print(f"STATESTORE_CLUSTER_TORTURE_SEED={SEED} STATESTORE_CLUSTER_TORTURE_ROUNDS={ROUNDS}")
    kc = changelog_client(bootstrap, **CLIENT)  # one client for every round: it lives through every fault
    try:
        warm(kc, data.topic)
        # The records a restore of every partition applies (fewer than were written: compacted, aborts dropped):
        # the moments are drawn below it, so that every fault starts inside a restore.
        applied = restore_all(kc, data, tmp_path / "clean").records
        shutil.rmtree(tmp_path / "clean")
        log = []
        for r in range(ROUNDS):
            kind, mode, after = rng.choice(FAULTS), rng.choice(("replay", "bulk")), rng.randrange(applied)
            timers: list[threading.Timer] = []
            start, undo = _fault(kind, cluster, data.topic, tool, timers)
            listener = OnRecords(start, after=after)
            try:
                took = restore_all(kc, data, tmp_path / f"round-{r}", listener, mode=mode).seconds
            finally:
                for t in timers:
                    t.join()
            assert listener.fired, f"round {r}: the {kind} at {after} of {applied} records never started"
            log.append(f"{kind} at {after}/{applied} ({mode}): {took:.1f}s")
            print(f"round {r}: {log[-1]}")
            assert took < BOUNDS[kind], (
                f"round {r}: {log[-1]}, over the bound of {BOUNDS[kind]}s; rounds: {log}"
            )
            undo()
            heal(cluster, data.topic)
            shutil.rmtree(tmp_path / f"round-{r}")
    finally:
        kc.close()
