"""Writing transactional changelogs to Kafka in tests, and waiting for them to settle.

``commit_transaction`` returns once the coordinator has decided; it writes the COMMIT markers to
the partitions afterwards. Until a partition's marker is written its last stable offset stays
below the committed records, so a restore started at once may stop short of the last
transaction: every writer here ends with :func:`settle`.
"""

from __future__ import annotations

import random
import time
from typing import Any

from statestore import SegmentLog, TopicPartition


def settle(changelog: Any, tp: TopicPartition, open_records: int = 0, timeout: float = 15.0) -> None:
    """Wait until every ended transaction on ``tp`` has its marker: the last stable offset is the end,
    or ``open_records`` below it when a transaction of that many records is knowingly left open."""
    deadline = time.monotonic() + timeout
    while True:
        _, end, lso = changelog.offsets(tp)
        if lso >= end - open_records:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{tp}: last stable offset {lso} still below the end {end} after {timeout}s")
        time.sleep(0.05)


def write_twins(
    kc: Any,
    seg: SegmentLog,
    tp: TopicPartition,
    seed: int,
    rounds: int,
    sizes: tuple[int, int] = (50, 400),
    keys: int = 600,
) -> int:
    """Committed and aborted transactions of two interleaved producers, to Kafka and a segment log alike.

    Every third transaction (by round and producer) aborts after its records were delivered, so
    aborted records sit in the log between committed ones. Returns the records sent.
    """
    rng = random.Random(seed)
    pairs = [(kc.producer(f"{tp}-{name}-{seed}"), seg.producer(f"{name}-{seed}")) for name in ("a", "b")]
    written = 0
    for r in range(rounds):
        for kp, sp in pairs:
            kp.begin()
            sp.begin()
        for i, (kp, sp) in enumerate(pairs):
            for j in range(rng.randrange(*sizes)):
                k = b"k%05d" % rng.randrange(keys)
                v = None if rng.random() < 0.1 else f"{r}-{i}-{j}-{rng.random()}".encode() * 2
                kp.send(tp.topic, tp.partition, k, v)
                sp.send(tp.topic, tp.partition, k, v)
                written += 1
            kp.flush()  # the two transactions' records interleave in the log
        for i, (kp, sp) in enumerate(pairs):
            if (r + i) % 3 == 0:
                kp.abort()
                sp.abort()
            else:
                kp.commit()
                sp.commit()
    for kp, sp in pairs:
        kp.close()
        sp.close()
    settle(kc, tp)
    return written
