"""Changelogs for the restore benchmarks, written with the segment log's producer."""

from __future__ import annotations

import random
from pathlib import Path

from statestore.changelog.segment_log import SegmentLog

VALUE_SIZE = 100


def write_changelog(
    log_dir: Path, topic: str, partitions: int, records: int, keys: int, seed: int = 1
) -> None:
    """``records`` records of ``VALUE_SIZE``-byte values per partition, over ``keys`` keys.

    Keys are visited in a shuffled order, so with ``keys < records`` each key is
    updated ``records // keys`` times, spread over the log; with ``keys ==
    records`` every key is unique.
    """
    rng = random.Random(seed)
    values = [rng.randbytes(VALUE_SIZE) for _ in range(997)]
    producer = SegmentLog(log_dir, sync=False).producer()
    for p in range(partitions):
        order = list(range(keys))
        sent = 0
        while sent < records:
            rng.shuffle(order)
            for i in range(0, min(keys, records - sent), 10_000):
                ks = order[i : min(i + 10_000, records - sent)]
                producer.send_many(
                    topic, p, [(b"key-%012d" % k, values[(sent + j) % 997]) for j, k in enumerate(ks)]
                )
            sent += min(keys, records - sent)
        producer.flush()
