"""Exactly-once under chaos, after Kafka's ``streams_eos_test``: instances killed, added and removed.

Three instances of ``counting_app.py`` (per key a count and a running sum)
over 6 input partitions with ``num_standby_replicas=1``. While the input
flows, a chaos loop acts every few seconds: it SIGKILLs a random instance
(waiting, up to a bound, until an output partition the victim owns has an
open transaction: a kill mid-transaction) and restarts it on its state
directory; it adds a fourth instance (a fresh state directory); it removes
one (SIGTERM: a clean close). Every action makes the group rebalance, and
every kill leaves a transaction its restart (same transactional id) aborts.

Then, read ``read_committed``: for every key the outputs are exactly the
counts 1, 2, 3, ... with the running sums of the input's values (no gap, no
repeat), so the final count and sum are the input's; no transaction is left
open once every instance closed. The at-least-once variant checks that
nothing is lost (repeats allowed). Kills, rebalances and records are printed
(``-s``).

The small runs are in ``make test`` (marker ``app``, about 80 s each on 2
cores); the long ones (40 000 records, random actions every 3-8 s while
they flow, about 7 minutes each) are marked ``torture`` too.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from app_tools import (
    create_topics,
    expected_outputs,
    first_difference,
    input_records,
    last_count,
    open_transactions,
    output_by_key,
    produce,
    read_committed,
    start_counting_app,
    unique,
)

PARTITIONS = 6
KEYS = 60
#: Commit interval of the instances: transactions long enough that kills land inside one.
COMMIT_MS = 1000


@dataclass(frozen=True)
class Scale:
    records: int
    #: Seconds the input flows.
    feed_seconds: float
    #: The chaos actions, in order (``None``: random ones until the input is all sent).
    actions: tuple[str, ...] | None
    #: Seconds between two actions.
    pause: tuple[float, float]


SMALL = Scale(6000, 36.0, ("kill", "add", "kill", "remove", "kill", "kill"), (3.0, 5.0))
LARGE = Scale(40000, 200.0, None, (3.0, 8.0))


def owned(log: Path) -> set[int]:
    """Partitions of the tasks an instance's log says it runs last."""
    found = re.findall(r"active tasks now ([0-9_, ]+|none)", log.read_text())
    if not found or found[-1] == "none":
        return set()
    return {int(t.split("_")[1]) for t in found[-1].split(", ")}


@dataclass
class Cluster:
    """The instances of one run: ``procs[i]`` is None while instance ``i`` is not running."""

    bootstrap: str
    app_id: str
    inp: str
    out: str
    tmp: Path
    guarantee: str
    procs: list[subprocess.Popen[bytes] | None] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    def log(self, i: int) -> Path:
        return self.tmp / f"instance-{i}.log"

    def start(self, i: int) -> None:
        while len(self.procs) <= i:
            self.procs.append(None)
        self.procs[i] = start_counting_app(
            self.bootstrap,
            self.app_id,
            self.tmp / f"state-{i}",
            self.inp,
            self.out,
            self.log(i),
            self.guarantee,
            commit_interval_ms=COMMIT_MS,
            standbys=1,
        )

    def live(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if p is not None and p.poll() is None]

    def check_alive(self) -> None:
        for i, p in enumerate(self.procs):
            if p is not None and p.poll() is not None:
                raise AssertionError(
                    f"instance {i} exited with {p.returncode}:\n{self.log(i).read_text()[-4000:]}"
                )

    def kill(self, rng: random.Random) -> None:
        """SIGKILL a random instance inside an open transaction of one of its output partitions, restart it."""
        victim = rng.choice(self.live())
        # Under at-least-once there is no transaction to wait for: the kill lands between commits.
        deadline = time.monotonic() + (5 if self.guarantee == "exactly_once_v2" else 0)
        in_txn = False
        while time.monotonic() < deadline:
            if set(open_transactions(self.bootstrap, self.out, PARTITIONS)) & owned(self.log(victim)):
                in_txn = True
                break
            time.sleep(0.02)
        p = self.procs[victim]
        assert p is not None
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        self.counts["kills"] += 1
        self.counts["kills inside a transaction"] += in_txn
        time.sleep(rng.uniform(0.0, 2.0))
        self.start(victim)

    def add(self) -> None:
        self.start(len(self.procs))
        self.counts["added"] += 1

    def remove(self, rng: random.Random) -> None:
        """SIGTERM a random instance (a clean close) and do not restart it."""
        i = rng.choice(self.live())
        p = self.procs[i]
        assert p is not None
        p.send_signal(signal.SIGTERM)
        code = p.wait(timeout=60)
        assert code == 0, f"instance {i} did not close cleanly ({code}):\n{self.log(i).read_text()[-4000:]}"
        self.procs[i] = None
        self.counts["removed"] += 1

    def stop_all(self) -> list[int]:
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        return [p.wait(timeout=90) for p in self.procs if p is not None]

    def rebalances(self) -> int:
        """Assignments received, summed over every instance (each rebalance gives one per member)."""
        return sum(self.log(i).read_text().count(": assigned ") for i in range(len(self.procs)))


def run_chaos(bootstrap: str, tmp: Path, guarantee: str, scale: Scale, seed: int) -> None:
    eos = guarantee == "exactly_once_v2"
    rng = random.Random(seed)
    app_id, inp, out = unique("chaos-app"), unique("chaos-in"), unique("chaos-out")
    create_topics(bootstrap, {inp: PARTITIONS, out: PARTITIONS})
    records = input_records(seed, records=scale.records, keys=KEYS, partitions=PARTITIONS)
    want = expected_outputs(records)
    cluster = Cluster(bootstrap, app_id, inp, out, tmp, guarantee)
    started = time.monotonic()
    for i in range(3):
        cluster.start(i)
    # The input flows once the three instances run their tasks (and hold standbys).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(
        "standby tasks now 0_" in cluster.log(i).read_text() for i in range(3)
    ):
        cluster.check_alive()
        time.sleep(0.5)
    batch = 100
    steps = scale.records // batch

    def feed() -> None:
        for i in range(0, scale.records, batch):
            produce(bootstrap, inp, records[i : i + batch])
            time.sleep(scale.feed_seconds / steps)

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        actions = list(scale.actions) if scale.actions is not None else None
        time.sleep(rng.uniform(*scale.pause))
        while actions if actions is not None else feeder.is_alive():
            cluster.check_alive()
            if actions is not None:
                action = actions.pop(0)
            else:
                live = len(cluster.live())
                action = rng.choice(
                    ["kill", "kill", "kill"]
                    + (["add"] if live < 4 else [])
                    + (["remove"] if live > 2 else [])
                )
            if action == "kill":
                cluster.kill(rng)
            elif action == "add":
                cluster.add()
            else:
                cluster.remove(rng)
            time.sleep(rng.uniform(*scale.pause))
        feeder.join()
        # Wait until every key's last output is its final count (or time out and report).
        final = {k: v[-1] for k, v in want.items()}
        deadline = time.monotonic() + 180
        got: dict[bytes, list[bytes]] = {}
        while time.monotonic() < deadline:
            got = output_by_key(read_committed(bootstrap, out, PARTITIONS, timeout=60, idle=1.0))
            if eos and all(got.get(k, [b""])[-1] == v for k, v in final.items()):
                break
            if not eos and all(last_count(got.get(k, [b"0,0"])) >= len(w) for k, w in want.items()):
                break
            cluster.check_alive()
            time.sleep(2)
    finally:
        feeder.join()
        codes = cluster.stop_all()
    assert all(c == 0 for c in codes), f"clean shutdown failed: {codes}\n" + "\n".join(
        cluster.log(i).read_text()[-3000:] for i in range(len(cluster.procs))
    )
    logs = "".join(cluster.log(i).read_text() for i in range(len(cluster.procs)))
    hits = len(re.findall(r"found a standby: (?!none)", logs))
    summary = (
        f"chaos {guarantee} records={scale.records} instances={len(cluster.procs)} "
        + " ".join(f"{k.replace(' ', '_')}={v}" for k, v in sorted(cluster.counts.items()))
        + f" rebalances(assignments)={cluster.rebalances()} moves_with_a_standby_found={hits} "
        f"seconds={time.monotonic() - started:.0f}"
    )
    if not eos:
        short = {
            k: (last_count(got.get(k, [b"0,0"])), len(w))
            for k, w in want.items()
            if last_count(got.get(k, [b"0,0"])) < len(w)
        }
        assert not short, f"at-least-once lost records (last count, inputs): {short}"
        print(f"{summary} outputs={sum(map(len, got.values()))} (repeats allowed)")
        return
    bad = {k: first_difference(got.get(k, []), w) for k, w in want.items() if got.get(k) != w}
    assert not bad, f"{len(bad)} keys differ from the input's counts and sums: " + "; ".join(
        f"{k!r} {d}" for k, d in list(bad.items())[:5]
    )
    assert sum(map(len, got.values())) == scale.records
    assert open_transactions(bootstrap, out, PARTITIONS) == {}
    raw = read_committed(bootstrap, out, PARTITIONS, timeout=60, idle=1.0, isolation="read_uncommitted")
    print(f"{summary} output committed={scale.records} output incl. aborted={len(raw)}")
    assert cluster.counts["kills"] >= 1


@pytest.mark.parametrize("guarantee", ["exactly_once_v2", "at_least_once"])
def test_chaos_small(guarantee: str, kafka_bootstrap: str, tmp_path: Path) -> None:
    """4 kills, one instance added and one removed, 6000 records over ~36 s."""
    run_chaos(kafka_bootstrap, tmp_path, guarantee, SMALL, seed=34)


@pytest.mark.torture
@pytest.mark.parametrize("guarantee", ["exactly_once_v2", "at_least_once"])
def test_chaos_large(guarantee: str, kafka_bootstrap: str, tmp_path: Path) -> None:
    """Random kills, additions and removals every 3-8 s while 40 000 records flow for ~200 s."""
    run_chaos(kafka_bootstrap, tmp_path, guarantee, LARGE, seed=int(time.time()))
