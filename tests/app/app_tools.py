"""What the ``app`` tests share: topics, input, the read_committed output, the counting children."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import confluent_kafka as ck

from support.app_kafka import COUNTING_APP, create_topics, end_offset, produce_fast, unique

__all__ = [
    "COUNTING_APP",
    "create_topics",
    "end_offset",
    "expected_outputs",
    "first_difference",
    "input_records",
    "last_count",
    "open_transactions",
    "output_by_key",
    "produce",
    "produce_fast",
    "read_committed",
    "start_counting_app",
    "unique",
]


def produce(bootstrap: str, topic: str, records: Iterable[tuple[int, bytes, bytes]]) -> None:
    """Send ``(partition, key, value)`` records (idempotent producer: order per partition kept)."""
    p = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for part, key, value in records:
        p.produce(topic, key=key, value=value, partition=part)
        p.poll(0)
    assert p.flush(30) == 0


def read_committed(
    bootstrap: str,
    topic: str,
    partitions: int,
    *,
    timeout: float = 10.0,
    idle: float = 2.0,
    isolation: str = "read_committed",
) -> list[Any]:
    """Every record of ``topic`` a read_committed consumer sees (until ``idle`` s without a new one)."""
    c = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("verify"),
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    c.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in range(partitions)])
    out: list[Any] = []
    deadline, last = time.monotonic() + timeout, time.monotonic()
    try:
        while time.monotonic() < deadline and time.monotonic() - last < idle:
            for m in c.consume(1000, 0.2):
                if m.error() is None:
                    out.append(m)
                    last = time.monotonic()
    finally:
        c.close()
    return out


def open_transactions(bootstrap: str, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    """Partitions whose last stable offset is below their end: ``{partition: (lso, end)}``."""
    out: dict[int, tuple[int, int]] = {}
    rc = ck.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": unique("lso"), "isolation.level": "read_committed"}
    )
    ru = ck.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": unique("hw"), "isolation.level": "read_uncommitted"}
    )
    try:
        for p in range(partitions):
            tp = ck.TopicPartition(topic, p)
            lso = rc.get_watermark_offsets(tp, timeout=10, cached=False)[1]
            end = ru.get_watermark_offsets(tp, timeout=10, cached=False)[1]
            if lso != end:
                out[p] = (lso, end)
    finally:
        rc.close()
        ru.close()
    return out


def start_counting_app(
    bootstrap: str,
    app_id: str,
    state_dir: Path,
    inp: str,
    out: str,
    log: Path,
    guarantee: str = "exactly_once_v2",
    commit_interval_ms: int = 100,
    standbys: int = 0,
    request_timeout: float = 30.0,
    session_timeout_ms: int = 6000,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    with open(log, "ab") as f:
        return subprocess.Popen(
            [
                sys.executable,
                str(COUNTING_APP),
                bootstrap,
                app_id,
                str(state_dir),
                inp,
                out,
                guarantee,
                str(commit_interval_ms),
                str(standbys),
                str(request_timeout),
                str(session_timeout_ms),
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=None if env is None else {**os.environ, **env},
        )


def input_records(seed: int, records: int, keys: int, partitions: int) -> list[tuple[int, bytes, bytes]]:
    """The counting application's input: ``(partition, key, value)``, key ``k<n>`` on partition
    ``n % partitions``, values 0-99 as text."""
    rng = random.Random(seed)
    out = []
    for _ in range(records):
        k = rng.randrange(keys)
        out.append((k % partitions, b"k%02d" % k, b"%d" % rng.randrange(100)))
    return out


def expected_outputs(records: list[tuple[int, bytes, bytes]]) -> dict[bytes, list[bytes]]:
    """What the counting application sends per key, exactly once: ``b"<count>,<running sum>"``."""
    out: dict[bytes, list[bytes]] = defaultdict(list)
    state: dict[bytes, tuple[int, int]] = {}
    for _, key, value in records:
        n, s = state.get(key, (0, 0))
        state[key] = (n + 1, s + int(value))
        out[key].append(b"%d,%d" % state[key])
    return dict(out)


def output_by_key(msgs: list[Any]) -> dict[bytes, list[bytes]]:
    """Output messages grouped by key, in offset order."""
    out: dict[bytes, list[bytes]] = defaultdict(list)
    for m in msgs:
        out[m.key()].append(m.value())
    return dict(out)


def last_count(outputs: list[bytes]) -> int:
    """The count in a key's last output."""
    return int(outputs[-1].split(b",")[0])


def first_difference(got: list[bytes], want: list[bytes]) -> str:
    """Where one key's outputs first differ from what was expected, for an assertion's message."""
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        if g != w:
            return f"at output {i}: got {g!r}, want {w!r} (got {got[max(0, i - 2) : i + 3]})"
    return f"got {len(got)} outputs, want {len(want)}; last got {got[-3:]}"
