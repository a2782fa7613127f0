"""The stateful application (``statestore.App``) against Quix Streams 3.28: failover time and throughput.

Both frameworks run **the counting application** (per key a count and a
running sum in a RocksDB store, ``key -> b"<count>,<sum>"`` to an output
topic): statestore's is ``tests/app/counting_app.py``, Quix Streams' is
``benches/peers/quix_counting.py`` (in Quix's own virtual environment, see
``benches/peer_envs.py``). Held equal: one broker of the benchmark's own,
the same input topic (4 partitions, ``key-N`` goes to partition ``N % 4``),
exactly-once (Quix ``processing_guarantee="exactly-once"``), a commit
interval of 100 ms, a session timeout of 6 s (heartbeat 1 s) and a
transaction timeout of 10 s, every instance a process of its own.

**Failover** (2 instances, 4 partitions): the input holds
:data:`STATE_KEYS` keys, one record each, so each instance builds a state of
half of them (about 1M keys at scale 1). Once both processed everything
(their group's committed offsets are the input's end; with standbys, every
standby caught up), a steady trickle of updates (:data:`TRICKLE_RATE`
records/s) flows and one instance is SIGKILLed. The time from the kill to
the first committed output record (read ``read_committed``) of a key of a
partition the killed instance owned is reported in parts, from the
survivor's own timestamps: **detection** (kill to the rebalance callback on
the survivor: the session timeout), **assignment** (callback to the new
assignment), **restore** (assignment to the moved tasks running: statestore's
"tasks restored; resumed" log line, Quix's end of recovery), **first commit**
(to the first committed output of a moved key). If the kill left a
transaction of the killed instance open, the read_committed view of its
partitions waits until the broker aborts it, a transaction timeout after it
began: when that happened is reported too (``*_dead_transaction_aborted_s``,
-1 when the kill found none open). Goals, on the time after detection:
statestore with one standby >= 10x faster than Quix, statestore without
standbys >= 3x.

**Throughput**: one instance, :data:`THROUGHPUT_RECORDS` records over
:data:`THROUGHPUT_KEYS` keys already in the input; the rate is the committed
output records per second between 10 % and 100 % of the output (watched
through the output's last stable offsets, so startup is not counted).
statestore ÷ Quix, goal >= 1.2x. **Standby cost**: statestore, two instances
started on an empty input, then the same records written; the rate from 30 %
to 100 % of the output with ``num_standby_replicas=1`` ÷ with 0, goal >= 0.8;
how far the standbys were behind when the output was complete is reported
(a standby that fell behind would only put its cost off). Each rate is
measured :data:`RATE_ROUNDS` times, baseline and candidate alternately, and
the ratio is of the medians: on a shared machine one round says little.

Scale with ``STATESTORE_BENCH_SCALE`` (the state shrinks with it; the ratios
of a small state say little about restore).
"""

from __future__ import annotations

import datetime as dt
import json
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conftest import scaled
from peer_envs import PEER_APPS, QUIX_VERSION, broker_or_skip, quix_python
from support.app_kafka import COUNTING_APP, create_topics, unique
from support.app_kafka import produce_fast as produce
from support.kafka_broker import Broker

ck = pytest.importorskip("confluent_kafka")

PARTITIONS = 4
#: Keys of the failover input, one record each: each of the 2 instances holds half of them.
STATE_KEYS = scaled(2_000_000, minimum=20_000)
#: Records per second of the updates that flow while an instance is killed.
TRICKLE_RATE = 2000
#: Seconds the trickle flows before the kill.
TRICKLE_BEFORE_KILL = 3.0
THROUGHPUT_RECORDS = scaled(1_000_000, minimum=20_000)
THROUGHPUT_KEYS = max(1000, THROUGHPUT_RECORDS // 4)
#: Rounds of each rate measurement (baseline and candidate alternately); the ratio is of the medians.
RATE_ROUNDS = 3
SESSION_MS = 6000
#: Seconds within which a live instance's transaction ends (commit interval plus the commit): one
#: still open after this long since the kill is the killed instance's.
LIVE_TRANSACTION_S = 2.0
TRANSACTION_MS = 10_000
COMMIT_MS = 100
QUIX_COUNTING = PEER_APPS / "quix_counting.py"


def key_of(k: int) -> tuple[int, bytes]:
    """Partition and key of key number ``k``."""
    return k % PARTITIONS, b"key-%08d" % k


def partition_of(key: bytes) -> int:
    return int(key[4:]) % PARTITIONS


class Offsets:
    """Ends and committed positions of partitions, through one consumer (no group membership)."""

    def __init__(self, bootstrap: str, group: str | None = None, isolation: str = "read_committed") -> None:
        self.c = ck.Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group or unique("offsets"),
                "isolation.level": isolation,
            }
        )

    def ends(self, topic: str) -> list[int]:
        return [
            int(self.c.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=10, cached=False)[1])
            for p in range(PARTITIONS)
        ]

    def committed(self, topic: str) -> list[int]:
        got = self.c.committed([ck.TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
        return [max(0, int(tp.offset)) for tp in got]

    def close(self) -> None:
        self.c.close()


def wait(what: str, cond: Callable[[], bool], timeout: float, procs: Iterable[Instance] = ()) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        for p in procs:
            assert p.proc.poll() is None, f"{p.name} exited with {p.proc.returncode}:\n{p.tail()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n" + "\n".join(
            p.tail() for p in procs
        )
        time.sleep(0.25)


# -- the instances ------------------------------------------------------------------------------------------


@dataclass
class Instance:
    """One application instance (a child process) and what its output says of its rebalances."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    framework: str
    events: list[tuple[float, str, set[int]]] = field(default_factory=list)

    def tail(self, n: int = 3000) -> str:
        return f"--- {self.name} ---\n" + self.log.read_text(errors="replace")[-n:]

    def parse(self) -> list[tuple[float, str, set[int]]]:
        """``(time.time(), event, partitions)``: ``revoked``/``lost``/``assigned`` (the rebalance
        callbacks), ``running`` (moved tasks restored and resumed), ``tasks`` (active tasks now)."""
        out: list[tuple[float, str, set[int]]] = []
        for line in self.log.read_text(errors="replace").splitlines():
            if self.framework == "quix":
                if not line.startswith("{"):
                    continue
                doc = json.loads(line)
                name = "running" if doc["event"] == "recovered" else doc["event"]
                out.append((float(doc["t"]), name, set(doc.get("partitions", []))))
                continue
            m = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ \S+ (.*)", line)
            if not m:
                continue
            t = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            msg = m.group(2)
            parts = {int(p) for p in re.findall(r"-(\d+)(?:,|$)", msg)}
            if ": revoked " in msg:
                out.append((t, "revoked", parts))
            elif ": lost " in msg:
                out.append((t, "lost", parts))
            elif ": assigned " in msg:
                tasks = re.search(r"active tasks now ([0-9_, ]+|none)", msg)
                owned = (
                    {int(x.split("_")[1]) for x in tasks.group(1).split(", ")}
                    if tasks and "_" in tasks.group(1)
                    else set()
                )
                out.append((t, "assigned", owned))
            elif "tasks restored; resumed" in msg:
                out.append((t, "running", parts))
        self.events = out
        return out

    def owned(self) -> set[int]:
        """The input partitions of the last assignment."""
        assigned = [parts for _, e, parts in self.parse() if e == "assigned"]
        return assigned[-1] if assigned else set()

    def kill(self) -> float:
        self.proc.send_signal(signal.SIGKILL)
        t = time.time()
        self.proc.wait(30)
        return t

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


def start_statestore(
    broker: Broker, app_id: str, inp: str, out: str, work: Path, name: str, standbys: int
) -> Instance:
    log = work / f"{name}.log"
    with log.open("ab") as f:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(COUNTING_APP),
                broker.bootstrap,
                app_id,
                str(work / f"{name}-state"),
                inp,
                out,
                "exactly_once_v2",
                str(COMMIT_MS),
                str(standbys),
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    return Instance(name, proc, log, "statestore")


def start_quix(py: Path, broker: Broker, app_id: str, inp: str, out: str, work: Path, name: str) -> Instance:
    log = work / f"{name}.log"
    with log.open("ab") as f:
        proc = subprocess.Popen(
            [
                str(py),
                str(QUIX_COUNTING),
                "--bootstrap",
                broker.bootstrap,
                "--input",
                inp,
                "--output",
                out,
                "--app-id",
                app_id,
                "--state-dir",
                str(work / f"{name}-state"),
                "--commit-ms",
                str(COMMIT_MS),
                "--session-ms",
                str(SESSION_MS),
                "--transaction-ms",
                str(TRANSACTION_MS),
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    return Instance(name, proc, log, "quix")


Starter = Callable[[str, str, str, Path, str], Instance]


# -- failover -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Failover:
    """The parts of one failover, in seconds, and what it moved."""

    detection: float
    assignment: float
    restore: float
    first_commit: float
    moved: list[int]
    #: Seconds from the kill until the killed instance's open transaction was aborted (None: the
    #: kill found none open: every transaction open then ended within a live commit's time).
    dead_transaction: float | None = None

    @property
    def after_detection(self) -> float:
        return self.assignment + self.restore + self.first_commit

    @property
    def total(self) -> float:
        return self.detection + self.after_detection

    def figures(self, prefix: str) -> dict[str, float]:
        return {
            f"{prefix}_detection_s": self.detection,
            f"{prefix}_assignment_s": self.assignment,
            f"{prefix}_restore_s": self.restore,
            f"{prefix}_first_commit_s": self.first_commit,
            f"{prefix}_after_detection_s": self.after_detection,
            f"{prefix}_dead_transaction_aborted_s": -1.0
            if self.dead_transaction is None
            else self.dead_transaction,
        }


class Trickle:
    """Updates of existing keys at a steady rate, on a thread, until stopped."""

    def __init__(self, bootstrap: str, topic: str, keys: int, rate: int) -> None:
        self.bootstrap, self.topic, self.keys, self.rate = bootstrap, topic, keys, rate
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        p = ck.Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "linger.ms": 5})
        rng = random.Random(5)
        start, sent = time.monotonic(), 0
        while not self._stop.is_set():
            due = int((time.monotonic() - start) * self.rate)
            while sent < due:
                part, key = key_of(rng.randrange(self.keys))
                p.produce(self.topic, key=key, value=b"%d" % rng.randrange(100), partition=part)
                sent += 1
            p.poll(0.01)
        p.flush(30)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


class TransactionWatch:
    """Watches partitions, on a thread, for the moment the transactions open at the start are over.

    A partition holds an open transaction while its last stable offset is below its high watermark;
    the one open at the start is over once the last stable offset moved past where it stood (a
    live producer's transaction commits within a commit interval, a dead one's is aborted by the
    broker after the transaction timeout)."""

    def __init__(self, bootstrap: str, partitions: Iterable[tuple[str, int]]) -> None:
        self.committed = Offsets(bootstrap)
        self.all = Offsets(bootstrap, isolation="read_uncommitted")
        self.partitions = sorted(partitions)
        self.was_open = False
        self.closed_at: float | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _ends(self, c: Offsets) -> list[int]:
        return [
            int(c.c.get_watermark_offsets(ck.TopicPartition(t, p), timeout=10, cached=False)[1])
            for t, p in self.partitions
        ]

    def _run(self) -> None:
        start, high = self._ends(self.committed), self._ends(self.all)
        self.was_open = any(s < h for s, h in zip(start, high, strict=True))
        deadline = time.monotonic() + 120
        while self.was_open and time.monotonic() < deadline:
            now = self._ends(self.committed)
            if all(n > s or s == h for n, s, h in zip(now, start, high, strict=True)):
                self.closed_at = time.time()
                break
            time.sleep(0.05)

    def result(self, killed_at: float) -> float | None:
        """Seconds from ``killed_at`` until the last transaction open at the start ended, if that
        took longer than :data:`LIVE_TRANSACTION_S` (a live instance's transaction ends sooner)."""
        self._thread.join(130)
        self.committed.close()
        self.all.close()
        if self.closed_at is None or self.closed_at - killed_at <= LIVE_TRANSACTION_S:
            return None
        return self.closed_at - killed_at


def changelog_topic(bootstrap: str, app_id: str, framework: str) -> str:
    """The changelog topic of the counting application's store."""
    if framework == "statestore":
        return f"{app_id}-agg-changelog"
    from confluent_kafka.admin import AdminClient

    topics = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
    (name,) = [t for t in topics if t.startswith("changelog__") and app_id in t]
    return str(name)


def first_moved_output(
    bootstrap: str, topic: str, start: list[int], moved: set[int], timeout: float
) -> float:
    """``time.time()`` when the first committed output record of a key of a ``moved`` partition at or
    after ``start`` (per output partition) is read."""
    c = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("first"),
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 10,
        }
    )
    c.assign([ck.TopicPartition(topic, p, off) for p, off in enumerate(start)])
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            for m in c.consume(1000, 0.05):
                if m.error() is None and m.key() is not None and partition_of(m.key()) in moved:
                    return time.time()
    finally:
        c.close()
    raise AssertionError(f"no output of partitions {sorted(moved)} within {timeout} s")


def run_failover(broker: Broker, inp: str, work: Path, starter: Starter, standbys: int) -> Failover:
    """Two instances process the whole input, then one is SIGKILLed while updates flow: its parts."""
    app_id, out = unique("failover"), unique("failover-out")
    create_topics(broker.bootstrap, {out: PARTITIONS})
    offsets = Offsets(broker.bootstrap, group=app_id)
    instances = [starter(app_id, inp, out, work, f"{app_id}-{i}") for i in range(2)]
    trickle: Trickle | None = None
    try:
        wait(
            "both instances with 2 tasks each",
            lambda: all(len(i.owned()) == PARTITIONS // 2 for i in instances),
            120,
            instances,
        )
        ends = offsets.ends(inp)
        t0 = time.monotonic()
        wait(
            f"the {STATE_KEYS:,} keys processed",
            lambda: offsets.committed(inp) == ends,
            3600,
            instances,
        )
        processed_s = time.monotonic() - t0
        survivor, victim = instances
        if standbys and survivor.framework == "statestore":
            changelog = changelog_topic(broker.bootstrap, app_id, survivor.framework)
            wait(
                "the survivor's standbys to catch up",
                lambda: standbys_caught_up(work / f"{survivor.name}-state", app_id, offsets.ends(changelog)),
                600,
                instances,
            )
        print(f"\n{survivor.framework} (standbys {standbys}): state processed in {processed_s:.1f} s")
        trickle = Trickle(broker.bootstrap, inp, STATE_KEYS, TRICKLE_RATE)
        time.sleep(TRICKLE_BEFORE_KILL)
        moved = victim.owned()
        changelog = changelog_topic(broker.bootstrap, app_id, victim.framework)
        killed_at = victim.kill()
        # The output, and the changelog of the moved tasks: where the killed instance's open
        # transaction (if any) holds the last stable offset until the broker aborts it.
        watch = TransactionWatch(
            broker.bootstrap, [(out, p) for p in range(PARTITIONS)] + [(changelog, p) for p in moved]
        )
        time.sleep(1.0)  # a commit the victim sent before it died lands now; the survivor cannot write yet
        start = offsets.ends(out)
        first = first_moved_output(broker.bootstrap, out, start, moved, 600)
        trickle.stop()
        trickle = None
        after = [(t, e, parts) for t, e, parts in survivor.parse() if t >= killed_at - 0.01]
        detected = next(t for t, e, _ in after if e in ("revoked", "lost"))
        assigned = next(t for t, e, parts in after if e == "assigned" and t >= detected and parts & moved)
        # The first moved task running (Quix reports the end of a recovery without partitions).
        running = next(
            t for t, e, parts in after if e == "running" and t >= assigned and (parts & moved or not parts)
        )
        return Failover(
            detection=detected - killed_at,
            assignment=assigned - detected,
            restore=running - assigned,
            first_commit=first - running,
            moved=sorted(moved),
            dead_transaction=watch.result(killed_at),
        )
    finally:
        if trickle is not None:
            trickle.stop()
        for i in instances:
            i.stop()
        offsets.close()


def standbys_caught_up(state_dir: Path, app_id: str, changelog_ends: list[int]) -> bool:
    """Whether every standby the instance publishes reads at or past its changelog's last stable offset."""
    from statestore.ops.metrics import published_snapshots

    standby = [
        s for snap in published_snapshots(state_dir, app_id) for s in snap.stores if s.kind == "standby"
    ]
    return bool(standby) and all(
        s.position is not None and s.position >= changelog_ends[int(s.task_id.split("_")[1])] for s in standby
    )


@pytest.fixture(scope="module")
def failover_setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Broker, Path, str, Path]]:
    py = quix_python()
    broker = broker_or_skip(tmp_path_factory, "app-broker")
    work = tmp_path_factory.mktemp("app-bench")
    try:
        inp = "failover-input"
        create_topics(broker.bootstrap, {inp: PARTITIONS})
        rng = random.Random(1)
        produce(broker.bootstrap, inp, ((*key_of(k), b"%d" % rng.randrange(100)) for k in range(STATE_KEYS)))
        yield broker, py, inp, work
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def quix_failover(failover_setup: tuple[Broker, Path, str, Path]) -> Failover:
    broker, py, inp, work = failover_setup
    f = run_failover(
        broker, inp, work, lambda a, i, o, w, n: start_quix(py, broker, a, i, o, w, n), standbys=0
    )
    print(f"Quix Streams failover: {f}")
    return f


@pytest.mark.parametrize("standbys,goal", [(1, 10.0), (0, 3.0)])
def test_failover_vs_quix_streams(
    benchmark: Any,
    failover_setup: tuple[Broker, Path, str, Path],
    quix_failover: Failover,
    standbys: int,
    goal: float,
) -> None:
    broker, _, inp, work = failover_setup
    got: dict[str, Failover] = {}

    def run() -> None:
        got["f"] = run_failover(
            broker,
            inp,
            work,
            lambda a, i, o, w, n: start_statestore(broker, a, i, o, w, n, standbys),
            standbys=standbys,
        )

    benchmark.pedantic(run, rounds=1, iterations=1)
    ss, quix = got["f"], quix_failover
    ratio = quix.after_detection / ss.after_detection
    benchmark.extra_info.update(
        {
            "baseline": f"Quix Streams {QUIX_VERSION} failover after detection (no standbys)",
            "candidate": f"statestore App failover after detection, {standbys} standby"
            + ("" if standbys == 1 else "s (restore from the changelog)"),
            "ratio": ratio,
            "goal": goal,
            "state_keys": STATE_KEYS,
            "partitions": PARTITIONS,
            "moved_partitions": len(ss.moved),
            **quix.figures("quix"),
            **ss.figures("statestore"),
            "quix_total_s": quix.total,
            "statestore_total_s": ss.total,
        }
    )
    print(f"\nstatestore ({standbys} standbys) failover: {ss}\nafter detection {ratio:.2f}x (goal >= {goal})")


# -- throughput ---------------------------------------------------------------------------------------------


def throughput_records() -> Iterator[tuple[int, bytes, bytes]]:
    rng = random.Random(2)
    for _ in range(THROUGHPUT_RECORDS):
        part, key = key_of(rng.randrange(THROUGHPUT_KEYS))
        yield part, key, b"%d" % rng.randrange(100)


def output_rate(bootstrap: str, out: str, instances: list[Instance], start_share: float) -> float:
    """Committed output records per second from ``start_share`` of the expected output to all of it,
    from the output's last stable offsets (transaction markers count too: a few per commit)."""
    offsets = Offsets(bootstrap)
    marks: list[tuple[float, int]] = []
    try:
        deadline = time.monotonic() + 3600
        while True:
            n = sum(offsets.ends(out))
            now = time.monotonic()
            if not marks and n >= start_share * THROUGHPUT_RECORDS:
                marks.append((now, n))
            if n >= THROUGHPUT_RECORDS:
                marks.append((now, n))
                break
            for i in instances:
                assert i.proc.poll() is None, i.tail()
            assert now < deadline, "the output did not complete"
            time.sleep(0.1)
    finally:
        offsets.close()
    (t0, n0), (t1, n1) = marks[0], marks[-1]
    return (n1 - n0) / (t1 - t0)


def measure_rate(
    broker: Broker, starter: Starter, work: Path, count: int, preload: bool, standbys: int = 0
) -> float:
    """Records/s of ``count`` instances of the counting application over a fresh input.

    ``preload``: the input is written before the instances start (one instance: nothing moves);
    otherwise the instances first settle in the group, then the input is written and the rate is
    taken from 30 % of the output on (the writing overlaps the first part)."""
    app_id, inp, out = unique("rate"), unique("rate-in"), unique("rate-out")
    create_topics(broker.bootstrap, {inp: PARTITIONS, out: PARTITIONS})
    if preload:
        produce(broker.bootstrap, inp, throughput_records())
    instances = [starter(app_id, inp, out, work, f"{app_id}-{i}") for i in range(count)]
    try:
        if not preload:
            wait(
                "the instances to settle",
                lambda: (
                    all(len(i.owned()) == PARTITIONS // count for i in instances)
                    and (not standbys or all("standby tasks now 0_" in i.log.read_text() for i in instances))
                ),
                120,
                instances,
            )
            threading.Thread(
                target=produce, args=(broker.bootstrap, inp, throughput_records()), daemon=True
            ).start()
        rate = output_rate(broker.bootstrap, out, instances, 0.1 if preload else 0.3)
        if standbys:
            # Steady state: the standbys kept up while the input was processed (a standby that
            # fell behind would only have put its cost off until after the measurement).
            lag = standby_lag(broker.bootstrap, app_id, [work / f"{i.name}-state" for i in instances])
            STANDBY_LAG_AT_END.append(lag)
            print(f"standbys {lag:,} offsets behind their changelogs when the output was complete")
        return rate
    finally:
        for i in instances:
            i.stop()


#: The standbys' lag when the output of a measurement with standbys was complete, per measurement.
STANDBY_LAG_AT_END: list[int] = []


def standby_lag(bootstrap: str, app_id: str, state_dirs: list[Path]) -> int:
    """Offsets between the standbys' positions (as last published) and their changelogs' last stable offsets."""
    from statestore.ops.metrics import published_snapshots

    offsets = Offsets(bootstrap)
    try:
        ends = offsets.ends(changelog_topic(bootstrap, app_id, "statestore"))
    finally:
        offsets.close()
    return sum(
        max(0, ends[int(s.task_id.split("_")[1])] - (s.position or 0))
        for d in state_dirs
        for snap in published_snapshots(d, app_id)
        for s in snap.stores
        if s.kind == "standby"
    )


@pytest.fixture(scope="module")
def rate_setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Broker, Path, Path]]:
    py = quix_python()
    broker = broker_or_skip(tmp_path_factory, "rate-broker")
    try:
        yield broker, py, tmp_path_factory.mktemp("rate")
    finally:
        broker.stop()


def alternate(
    benchmark: Any, baseline: Callable[[], float], candidate: Callable[[], float]
) -> tuple[list[float], list[float]]:
    """:data:`RATE_ROUNDS` rates of each, measured alternately (the load of a shared machine moves
    both alike); the last candidate round runs under ``benchmark``."""
    base: list[float] = []
    cand: list[float] = []
    for r in range(RATE_ROUNDS):
        base.append(baseline())
        if r < RATE_ROUNDS - 1:
            cand.append(candidate())
        else:
            benchmark.pedantic(lambda: cand.append(candidate()), rounds=1, iterations=1)
    return base, cand


def test_throughput_vs_quix_streams(benchmark: Any, rate_setup: tuple[Broker, Path, Path]) -> None:
    broker, py, work = rate_setup
    quix, ss = alternate(
        benchmark,
        lambda: measure_rate(
            broker, lambda a, i, o, w, n: start_quix(py, broker, a, i, o, w, n), work, 1, True
        ),
        lambda: measure_rate(
            broker, lambda a, i, o, w, n: start_statestore(broker, a, i, o, w, n, 0), work, 1, True
        ),
    )
    ratio = statistics.median(ss) / statistics.median(quix)
    benchmark.extra_info.update(
        {
            "baseline": f"Quix Streams {QUIX_VERSION} counting application, exactly-once, 1 instance",
            "candidate": "statestore App counting application, exactly-once, 1 instance (records/s ratio)",
            "ratio": ratio,
            "goal": 1.2,
            "records": THROUGHPUT_RECORDS,
            "keys": THROUGHPUT_KEYS,
            "rounds": RATE_ROUNDS,
            "quix_records_per_s": statistics.median(quix),
            "statestore_records_per_s": statistics.median(ss),
            "quix_rounds": " / ".join(f"{r:,.0f}" for r in quix),
            "statestore_rounds": " / ".join(f"{r:,.0f}" for r in ss),
        }
    )
    print(
        f"\nthroughput (medians of {RATE_ROUNDS}): statestore {ss}, Quix {quix}: {ratio:.2f}x (goal >= 1.2)"
    )


def test_standby_steady_state_cost(benchmark: Any, rate_setup: tuple[Broker, Path, Path]) -> None:
    broker, _, work = rate_setup

    def starter(standbys: int) -> Starter:
        return lambda a, i, o, w, n: start_statestore(broker, a, i, o, w, n, standbys)

    without, with_one = alternate(
        benchmark,
        lambda: measure_rate(broker, starter(0), work, 2, False),
        lambda: measure_rate(broker, starter(1), work, 2, False, standbys=1),
    )
    ratio = statistics.median(with_one) / statistics.median(without)
    benchmark.extra_info.update(
        {
            "baseline": "statestore App, 2 instances, no standbys",
            "candidate": "statestore App, 2 instances, 1 standby each (records/s ratio)",
            "ratio": ratio,
            "goal": 0.8,
            "records": THROUGHPUT_RECORDS,
            "rounds": RATE_ROUNDS,
            "records_per_s_k0": statistics.median(without),
            "records_per_s_k1": statistics.median(with_one),
            "k0_rounds": " / ".join(f"{r:,.0f}" for r in without),
            "k1_rounds": " / ".join(f"{r:,.0f}" for r in with_one),
            "standby_lag_at_end": " / ".join(f"{n:,}" for n in STANDBY_LAG_AT_END),
        }
    )
    print(
        f"\nstandby cost (medians of {RATE_ROUNDS}): k=1 {with_one}, k=0 {without}: {ratio:.2f} (goal >= 0.8)"
    )
