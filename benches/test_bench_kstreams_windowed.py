"""statestore against Kafka Streams 4.4's own restoration of a windowed count, one broker, one changelog.

The Kafka Streams application of ``interop/kafka-streams`` (``--stores
wcounts``: ``groupByKey().windowedBy(TimeWindows.ofSizeWithNoGrace(1 min))
.count()``, a timestamped window store of retention 20 minutes, so the DSL's
segment interval is 10 minutes) processes 2M input records over 4
partitions, at_least_once, with the record cache off
(``statestore.cache.max.bytes=0``), so every input record is one changelog
record: ``<app>-wcounts-changelog`` holds 2M records (key ``k%06d`` ‖
window start ‖ seqnum, 19 bytes; value the 8-byte count; the record's
timestamp is the window's latest update).

Input record ``seq`` has key ``seq % KEYS`` and timestamp ``FIRST + seq *
STEP_MS``: the input spans 2,000 s (33 min 20 s) at any scale, starting on a
segment boundary an hour ago, and each (key, window) is counted
``UPDATES`` (10) times, so the changelog holds about 200k windows (6,000
keys x 34 windows) of ~10 updates each, as the key-value benchmark's 200k
keys. At the end stream time is 33 minutes in, so segments 1-3 of each
partition are live (minutes 10-33: about 70% of the windows and records)
and segment 0 (minutes 0-10) has expired.

The two sides do not read the same records. Kafka Streams 4.4 starts a
window store's restoration (with no offset yet) at the first changelog
record at or after the last record's timestamp minus the retention
(``StoreChangelogReader``: it reads the partition's last record, then seeks
by ``offsetsForTimes``), so it reads the last 20 of the 33 minutes: ~1.2M
records. statestore reads the changelog from its start, all 2M, and drops
what expires as it goes (replay writes segment 0 while stream time is early
and deletes it at the end; bulk never writes it). The row records both
counts (``records``, ``kafka_streams_records``).

Timed as the key-value benchmark (``benches/kstreams_bench.py``, shared):
Kafka Streams by its StateRestoreListener, first ``onRestoreStart`` to last
``onRestoreEnd``, one and two stream threads; statestore's ``restore_many``
(``format="timestamped-window"``, the retention) by its RestoreListener the
same way, replay and bulk, one and two threads; medians of ``ROUNDS``
rounds, each from an empty state directory. Goals as for key-value stores:
replay >= 3x, bulk >= 10x, at the same number of threads.

Correctness, checked after every statestore round (outside the timed
window, :func:`check_against_kafka_streams`): each partition's store holds
exactly the segment directories that one of Kafka Streams' own restores
holds, each CLOSED, and each segment every window that restore holds with
the same value (record timestamp and count); beside them only the windows
last updated before Kafka Streams' starting timestamp, which it never read.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import scaled
from kstreams_bench import Setup, Timed, kafka_streams_bench, measure, report, restore_kafka
from statestore import TopicPartition, _native

N = scaled(2_000_000, minimum=20_000)
PARTITIONS = 4
APP = "ksw-bench"
STORE = "wcounts"
FORMAT = "timestamped-window"
WINDOW_MS = 60_000
#: Updates of each (key, window): the key-value benchmark's ~10 updates a key.
UPDATES = 10
#: The input's timestamps span this much whatever the scale (records are spaced by STEP_MS).
SPAN_MS = 2_000_000
STEP_MS = max(1, SPAN_MS // N)
KEYS = max(1, WINDOW_MS // (UPDATES * STEP_MS))
RETENTION_MS = 20 * 60_000
SEGMENT_MS = _native.dsl_segment_interval(RETENTION_MS)
#: The timestamp of input record 0: on a segment boundary about an hour ago (the broker's retention keeps it).
FIRST = (int(time.time() * 1000) // SEGMENT_MS - 6) * SEGMENT_MS
ROUNDS = 3


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    with kafka_streams_bench(
        tmp_path_factory,
        app=APP,
        changelogs=[TopicPartition(f"{APP}-{STORE}-changelog", p) for p in range(PARTITIONS)],
        produce=N,
        rounds=ROUNDS,
        common={
            "keys": KEYS,
            "value_size": 20,
            "partitions": PARTITIONS,
            "stores": STORE,
            "retention_ms": RETENTION_MS,
            "timeout": 3600,
        },
        process={
            "time_step_ms": STEP_MS,
            "first_timestamp_ms": FIRST,
            # every update reaches the changelog: 2M input records, 2M changelog records
            "config": {"statestore.cache.max.bytes": "0"},
        },
        keep_reference=True,
    ) as s:
        yield s


def store_dir(root: Path, tp: TopicPartition) -> Path:
    """Where Kafka Streams keeps partition ``tp``'s window store: ``<state>/<app>/0_<p>/wcounts``."""
    return root / APP / f"0_{tp.partition}" / STORE


def segments(store: Path) -> list[str]:
    return sorted(p.name for p in store.iterdir()) if store.is_dir() else []


def entries(segment: Path) -> dict[bytes, bytes]:
    """The data of one segment: window key -> record timestamp (8 bytes BE) + count."""
    return {bytes(k): bytes(v) for k, v in _native.store_dump(segment).entries}


def stamp(value: bytes) -> int:
    """The record timestamp of a timestamped-window value: that of the window's last update."""
    return int.from_bytes(value[:8], "big", signed=True)


class KafkaStreamsState:
    """The segments of one of Kafka Streams' own restores, read once: partition -> segment -> entries."""

    def __init__(self, s: Setup):
        assert s.reference is not None
        self.segments = {
            tp.partition: {
                seg: entries(store_dir(s.reference, tp) / seg) for seg in segments(store_dir(s.reference, tp))
            }
            for tp in s.tps
        }


def check_against_kafka_streams(s: Setup, theirs: KafkaStreamsState, root: Path) -> dict[str, int]:
    """Assert that the store restored under ``root`` is Kafka Streams' own restore, segment for segment;
    the shape of what it holds.

    Kafka Streams 4.4 restores a window store from the changelog's first record at or after the last
    record's timestamp minus the retention (``StoreChangelogReader``: it reads the last record, then seeks
    by ``offsetsForTimes``), statestore from the changelog's start. So the segments are the same (both
    drop the expired ones), every window Kafka Streams holds is ours with the same value, and ours holds
    beside them exactly the windows last updated before that timestamp: those the application itself
    holds after processing, which neither a query nor a later update reads (they lie before stream time
    minus the retention) and which go with their segment.
    """
    live, windows, skipped = 0, 0, 0
    for tp in s.tps:
        ours_dir = store_dir(root, tp)
        names = list(theirs.segments[tp.partition])
        assert names and segments(ours_dir) == names, (tp, segments(ours_dir), names)
        ours = {seg: entries(ours_dir / seg) for seg in names}
        since = max(stamp(v) for data in ours.values() for v in data.values()) - RETENTION_MS
        for seg, data in ours.items():
            kept = {k: v for k, v in data.items() if stamp(v) >= since}
            want = theirs.segments[tp.partition][seg]
            differ = sorted(kept.keys() ^ want.keys()) or sorted(k for k in kept if kept[k] != want[k])
            assert not differ, (
                f"{ours_dir / seg}: {len(kept)} windows updated since {since} against Kafka Streams' "
                f"{len(want)}; first differing key {differ[0]!r}: ours {kept.get(differ[0])!r}, "
                f"theirs {want.get(differ[0])!r}"
            )
            assert _native.store_info(ours_dir / seg).status == _native.STATUS_CLOSED, ours_dir / seg
            windows += len(data)
            skipped += len(data) - len(kept)
        live += len(names)
    return {"live_segments": live, "windows": windows, "windows_kafka_streams_skipped": skipped}


def restore(s: Setup, theirs: KafkaStreamsState, mode: str, threads: int, shape: dict[str, int]) -> Timed:
    """One ``restore_many`` of the 4 partitions into window stores laid out as Kafka Streams', then checked
    (outside the timed window)."""
    root = s.work / f"ss-{mode}-{threads}"
    timed = restore_kafka(s, root, mode, threads, store_dir, format=FORMAT, retention_ms=RETENTION_MS)
    shape.update(check_against_kafka_streams(s, theirs, root))
    return timed


@pytest.mark.parametrize("mode,goal", [("replay", 3.0), ("bulk", 10.0)])
def test_statestore_vs_kafka_streams_windowed_restoration(
    benchmark: Any, setup: Setup, mode: str, goal: float
) -> None:
    shape: dict[str, int] = {}
    theirs = KafkaStreamsState(setup)
    ones, twos = measure(benchmark, lambda threads: restore(setup, theirs, mode, threads, shape), ROUNDS)
    report(
        benchmark,
        setup,
        ones,
        twos,
        mode=mode,
        goal=goal,
        baseline="Kafka Streams 4.4.0 restoration of a windowed count (first onRestoreStart to last "
        "onRestoreEnd), 1 stream thread",
        candidate=f"statestore {mode} (restore_many, timestamped-window, native Kafka fetch; first "
        f"on_restore_start to last on_restore_end), 1 thread",
        title=f"statestore {mode} vs Kafka Streams restoration of a windowed count",
        shape={
            "partitions": PARTITIONS,
            "keys": KEYS,
            "window_ms": WINDOW_MS,
            "retention_ms": RETENTION_MS,
            "segment_ms": SEGMENT_MS,
            "input_span_ms": STEP_MS * N,
            **shape,
        },
        same_records=False,
    )
