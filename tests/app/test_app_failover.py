"""Failover without restore: a task of ~1M keys moves to the instance holding its standby and replays
only what the standby had not applied, against a real broker, real processes and a real SIGKILL.

Two instances of ``counting_app.py`` (per key a count and a running sum) with
``num_standby_replicas=1`` share 2 input partitions; every input record goes
to partition 0, so task ``0_0`` builds a state of :data:`STATE_KEYS` keys
(one record per key) and the other instance keeps a standby of it. Once the
owner processed them all and the standby caught up, a tail of updates of
existing keys flows and the owner is SIGKILLed in the middle of it (its
transaction open). The survivor takes task ``0_0`` from its standby: it
replays no more records than the changelog holds after the standby's last
published position (read from the survivor's metrics snapshot just before
the kill), which is far below the state's size; and the output, read
``read_committed``, holds for every key exactly the counts 1, 2, ... and the
running sums of its input, no gap, no repeat.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka as ck
import pytest
from app_tools import (
    create_topics,
    end_offset,
    open_transactions,
    produce_fast,
    start_counting_app,
    unique,
)
from test_app_exactly_once import owned
from test_app_health import wait_for

from statestore.ops.metrics import published_snapshots

pytestmark = pytest.mark.slow

PARTITIONS = 2
#: Keys of task 0_0's state: one input record each.
STATE_KEYS = 1_000_000
#: Updates of existing keys written after the standby caught up; the owner dies in the middle of them.
TAIL = 100_000
#: The owner is killed once this many of the tail's outputs are in the output topic (committed or not).
KILL_AFTER = 20_000
#: At most this share of the state may be replayed on promotion ("far below the state's size").
MAX_REPLAYED_SHARE = 0.05


def value_of(key: int, occurrence: int) -> int:
    """The input value of a key's first (0) or second (1) record."""
    return key % 97 if occurrence == 0 else (key * 7) % 89


def state_records() -> Iterator[tuple[int, bytes, bytes]]:
    for k in range(STATE_KEYS):
        yield 0, b"k%07d" % k, b"%d" % value_of(k, 0)


def tail_records() -> Iterator[tuple[int, bytes, bytes]]:
    for k in range(TAIL):
        yield 0, b"k%07d" % k, b"%d" % value_of(k, 1)


def expected_output(key: int, occurrence: int) -> bytes:
    total = sum(value_of(key, i) for i in range(occurrence + 1))
    return b"%d,%d" % (occurrence + 1, total)


def check_output(bootstrap: str, topic: str, timeout: float = 180.0) -> tuple[int, list[str]]:
    """Read partition 0 of the output ``read_committed`` and compare every record with what the input
    makes of it, streaming (no list of a million outputs). Returns the records read and the errors."""
    seen = bytearray(STATE_KEYS)  # outputs seen per key so far (at most 2)
    want = STATE_KEYS + TAIL
    errors: list[str] = []
    n = 0
    c = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("verify"),
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "fetch.max.bytes": 50 << 20,
        }
    )
    c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    deadline = time.monotonic() + timeout
    try:
        while n < want and time.monotonic() < deadline:
            for m in c.consume(10_000, 0.5):
                if m.error() is not None:
                    continue
                n += 1
                key = int((m.key() or b"k-1")[1:])
                occurrence = seen[key]
                if occurrence >= 2 or m.value() != expected_output(key, occurrence):
                    if len(errors) < 10:
                        errors.append(f"key {m.key()!r}: output {occurrence + 1} is {m.value()!r}")
                    continue
                seen[key] = occurrence + 1
        # Nothing more may follow (a repeat would show here).
        for m in c.consume(10_000, 2.0):
            if m.error() is None:
                n += 1
                errors.append(f"an output beyond the expected ones: {m.key()!r} -> {m.value()!r}")
    finally:
        c.close()
    missing = sum(1 for k in range(STATE_KEYS) if seen[k] != (2 if k < TAIL else 1))
    if missing:
        errors.append(f"{missing} keys without every expected output")
    return n, errors


def standby_position(state_dir: Path, app_id: str) -> tuple[int, float]:
    """The next changelog offset the standby of task 0_0 on this instance reads, and when it was
    published (``time.time()``); ``(-1, 0.0)`` while none is published."""
    for snap in published_snapshots(state_dir, app_id):
        for s in snap.stores:
            if s.task_id == "0_0" and s.kind == "standby" and s.position is not None:
                return s.position, snap.taken_at
    return -1, 0.0


def committed_records(bootstrap: str, topic: str, partition: int, start: int, end: int) -> int:
    """Committed records of a partition in ``[start, end)`` (aborted records and markers not counted)."""
    c = ck.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": unique("count"), "isolation.level": "read_committed"}
    )
    c.assign([ck.TopicPartition(topic, partition, start)])
    n, deadline = 0, time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            msgs = c.consume(10_000, 1.0)
            n += len([m for m in msgs if m.error() is None and (m.offset() or 0) < end])
            if c.position([ck.TopicPartition(topic, partition)])[0].offset >= end:
                return n
        raise AssertionError(f"could not read {topic}-{partition} up to {end}")
    finally:
        c.close()


def test_failover_resumes_a_million_key_task_from_its_standby(kafka_bootstrap: str, tmp_path: Path) -> None:
    app_id, inp, out = unique("failover-app"), unique("failover-in"), unique("failover-out")
    changelog = f"{app_id}-agg-changelog"
    create_topics(kafka_bootstrap, {inp: PARTITIONS, out: PARTITIONS})
    logs = [tmp_path / f"instance-{i}.log" for i in range(2)]
    states = [tmp_path / f"state-{i}" for i in range(2)]
    procs = []
    try:
        for i in range(2):
            procs.append(
                start_counting_app(kafka_bootstrap, app_id, states[i], inp, out, logs[i], standbys=1)
            )
        wait_for(
            "both instances holding one task and the other's standby",
            lambda: all(len(owned(log)) == 1 and "standby tasks now 0_" in log.read_text() for log in logs),
            90,
            procs,
            logs,
        )
        owner = 0 if owned(logs[0]) == {0} else 1
        survivor = 1 - owner
        assert owned(logs[owner]) == {0} and owned(logs[survivor]) == {1}

        t0 = time.monotonic()
        produce_fast(kafka_bootstrap, inp, state_records())
        produced_s = time.monotonic() - t0
        wait_for(
            f"task 0_0 to process {STATE_KEYS} records",
            lambda: end_offset(kafka_bootstrap, out, 0, "read_committed") >= STATE_KEYS,
            300,
            procs,
            logs,
        )
        processed_s = time.monotonic() - t0
        state_end = end_offset(kafka_bootstrap, changelog, 0, "read_committed")
        wait_for(
            "the standby of task 0_0 to catch up",
            lambda: standby_position(states[survivor], app_id)[0] >= state_end,
            120,
            procs,
            logs,
        )

        # -- the tail flows; the owner dies in the middle of it ------------------------------------
        produce_fast(kafka_bootstrap, inp, tail_records())
        wait_for(
            "part of the tail processed",
            lambda: end_offset(kafka_bootstrap, out, 0) >= STATE_KEYS + KILL_AFTER,
            120,
            procs,
            logs,
        )
        position, published_at = standby_position(states[survivor], app_id)
        assert position >= state_end
        procs[owner].send_signal(signal.SIGKILL)
        procs[owner].wait(30)
        killed_at, killed_wall = time.monotonic(), time.time()
        # The owner's committed writes end here: its open transaction (if any) holds the last
        # stable offset, and the survivor cannot write before the session timeout expired.
        owner_end = end_offset(kafka_bootstrap, changelog, 0, "read_committed")
        killed_with_open = open_transactions(kafka_bootstrap, changelog, 1)

        promoted = re.compile(r"task 0_0 moved here runs after replaying (\d+) records \((.*?)\)")
        wait_for(
            "the survivor to run task 0_0",
            lambda: promoted.search(logs[survivor].read_text()) is not None,
            120,
            procs[survivor : survivor + 1],
            logs[survivor : survivor + 1],
        )
        running_after = time.monotonic() - killed_at
        m = promoted.search(logs[survivor].read_text())
        assert m is not None
        replayed, how = int(m.group(1)), m.group(2)
        assert "found a standby: 0_0" in logs[survivor].read_text()
        assert how == "from its standby", logs[survivor].read_text()[-3000:]
        wait_for(
            "the survivor to process the tail",
            lambda: (
                end_offset(kafka_bootstrap, out, 0, "read_committed") >= STATE_KEYS + TAIL
                and not open_transactions(kafka_bootstrap, out, 1)
            ),
            120,
            procs[survivor : survivor + 1],
            logs[survivor : survivor + 1],
        )
        procs[survivor].send_signal(signal.SIGTERM)
        assert procs[survivor].wait(60) == 0, logs[survivor].read_text()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    # Written after the standby's last update (as published before the kill; it only moved on
    # since): the owner's committed changelog records from that position on. What its killed
    # transaction wrote is aborted, so no restore reads it.
    written_after = committed_records(kafka_bootstrap, changelog, 0, position, owner_end)
    n, errors = check_output(kafka_bootstrap, out)
    print(
        f"\nstate of task 0_0: {STATE_KEYS:,} keys (input written in {produced_s:.1f} s, processed and "
        f"standby updated in {processed_s:.1f} s); killed with the changelog transaction "
        f"{'open' if killed_with_open else 'closed'}; standby position {position:,} (published "
        f"{killed_wall - published_at:.1f} s before the kill), {written_after:,} changelog records "
        f"after it; replayed {replayed:,} on promotion; task 0_0 RUNNING on the survivor "
        f"{running_after:.1f} s after the SIGKILL; {n:,} outputs checked"
    )
    assert replayed <= written_after, (replayed, written_after)
    assert replayed <= MAX_REPLAYED_SHARE * STATE_KEYS, (replayed, STATE_KEYS)
    assert written_after <= TAIL
    assert not errors, errors
    assert n == STATE_KEYS + TAIL
    assert open_transactions(kafka_bootstrap, out, PARTITIONS) == {}
