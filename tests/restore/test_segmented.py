"""Window and session stores (Kafka Streams' segmented stores) restored from their changelogs.

The changelogs are written with the segment log's transactional producer
(aborted transactions, tombstones, windows that expire, records with their
own timestamps); the model here is computed from the committed records
alone, as Kafka Streams lays the store out: one RocksDB per live segment at
``<task>/<store>/<store>.<segmentId * segmentInterval>``, ``segmentId =
timestamp / segmentInterval``, the timestamp read from the key (a window's
start; a session's end), segments older than ``segmentId(streamTime -
retention)`` absent, stream time the largest timestamp of any key. Every
segment holds exactly the column families of its kind, the data, the offset
of the last restored record and CLOSED.
"""

from __future__ import annotations

import json
import random
import struct
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from rocksdict import Options, Rdict

from statestore import RestoreError, StoreError, TopicPartition, _native
from statestore.changelog.segment_log import SegmentLog
from statestore.restore.engine import RestoreSpec, restore_many, restore_store
from statestore.restore.spark import restore_on_spark
from statestore.restore.staging import STAGING_DIR_NAME, restore_partition
from support.killer import kill_after_first_line

TP = TopicPartition("app-win-changelog", 2)
BASE = 1_700_000_000_000
RETENTION = 600_000  # a DSL windowed count: window + grace; its segment interval is max(R / 2, 60 s)
INTERVAL = _native.dsl_segment_interval(RETENTION)


def window_key(key: bytes, start: int, seq: int = 0) -> bytes:
    return key + struct.pack(">qi", start, seq)


def session_key(key: bytes, start: int, end: int) -> bytes:
    return key + struct.pack(">qq", end, start)


@dataclass
class Changelog:
    """The committed records of a window or session store's changelog."""

    schema: str  # "window" or "session"
    records: list[tuple[int, bytes, bytes | None, int]] = field(default_factory=list)
    end: int = 0

    def segment_time(self, key: bytes) -> int:
        if self.schema == "window":
            return int(struct.unpack(">q", key[-12:-4])[0])
        return int(struct.unpack(">q", key[-16:-8])[0])

    def segments(
        self, fmt: str, end: int | None = None, interval: int = INTERVAL, store: str = "win"
    ) -> tuple[dict[str, dict[bytes, bytes]], int | None]:
        """The store Kafka Streams holds after restoring up to ``end``: segment name -> key -> value."""
        below = [r for r in self.records if end is None or r[0] < end]
        data: dict[int, dict[bytes, bytes]] = {}
        for _, k, v, ts in below:
            seg = data.setdefault(self.segment_time(k) // interval, {})
            if v is None:
                seg.pop(k, None)
            else:
                seg[k] = (struct.pack(">q", ts) + v) if fmt == "timestamped-window" else v
        if below:
            stream_time = max(self.segment_time(k) for _, k, _, _ in below)
            min_live = (stream_time - RETENTION) // interval
            data = {i: d for i, d in data.items() if i >= min_live}
        return {f"{store}.{i * interval}": d for i, d in data.items()}, (below[-1][0] if below else None)


def write_changelog(
    log_dir: Path, schema: str, n: int, seed: int, start_time: int = BASE, tp: TopicPartition = TP
) -> Changelog:
    """``n`` transactions of windowed updates marching through time (some aborted), with tombstones."""
    rng = random.Random(seed)
    log = SegmentLog(log_dir, sync=False)
    txn = log.producer(transactional_id=f"seg-{seed}")
    model = Changelog(schema)
    now = start_time
    for _ in range(n):
        now += rng.randrange(0, 40_000)
        txn.begin()
        sent = []
        for _ in range(rng.randrange(1, 8)):
            user = b"user-%d" % rng.randrange(12)
            if schema == "window":
                start = now - now % 60_000 - 60_000 * rng.randrange(3)
                key = window_key(user, start, rng.choice([0, 0, 0, 1]))
            else:
                end_ = now - rng.randrange(50_000)
                key = session_key(user, end_ - rng.randrange(30_000), end_)
            value = None if rng.random() < 0.15 else b"%d" % rng.randrange(10_000)
            ts = now - rng.randrange(1000)
            sent.append((txn.send(tp.topic, tp.partition, key, value, timestamp=ts), key, value, ts))
        txn.flush()
        if rng.random() < 0.15:
            txn.abort()
        else:
            txn.commit()
            model.records.extend(sent)
    model.end = log.end_offset(tp)
    return model


def on_disk(
    store: Path, fmt: str, tp: TopicPartition = TP
) -> tuple[dict[str, dict[bytes, bytes]], set[int | None], set[int | None]]:
    """The segments at ``store``, their offsets of TP and their status, checking each one's column families."""
    families = (
        ["default", "keyValueWithTimestamp", "offsets"]
        if fmt == "timestamped-window"
        else ["default", "offsets"]
    )
    data, offsets, status = {}, set(), set()
    for seg in sorted(store.iterdir()):
        assert sorted(Rdict.list_cf(str(seg), Options(raw_mode=True))) == sorted(families), seg
        dump = _native.store_dump(seg)
        data[seg.name] = dict(dump.entries)
        offsets.add(dump.offsets.get(str(tp)))
        status.add(dump.status)
    return data, offsets, status


@pytest.mark.parametrize("fmt", ["timestamped-window", "window", "session"])
def test_bulk_replay_and_many_write_the_live_segments_kafka_streams_would(tmp_path: Path, fmt: str) -> None:
    schema = "session" if fmt == "session" else "window"
    changelog = write_changelog(tmp_path / "log", schema, n=300, seed=7)
    want, last = changelog.segments(fmt)
    assert 2 <= len(want) <= 4, "a few segments live"
    assert min(changelog.segment_time(k) for _, k, _, _ in changelog.records) // INTERVAL < min(
        int(n.split(".")[1]) // INTERVAL for n in want
    ), "older segments expired"
    results = []
    for name, mode in [("bulk", "bulk"), ("replay", "replay"), ("auto", "auto")]:
        store = tmp_path / name / "win"
        store.parent.mkdir()
        res = restore_store(store, tmp_path / "log", TP, mode=mode, format=fmt, retention_ms=RETENTION)
        assert (res.end_offset, res.offset) == (changelog.end, last)
        assert on_disk(store, fmt) == (want, {last}, {_native.STATUS_CLOSED}), name
        results.append(res)
    assert results[2].mode == "bulk"
    assert results[0].records_applied == results[1].records_applied == len(changelog.records)

    specs = []
    for p in range(2):
        (tmp_path / f"many{p}").mkdir()
        specs.append(
            RestoreSpec(
                tmp_path / f"many{p}" / "win", tmp_path / "log", TP, format=fmt, retention_ms=RETENTION
            )
        )
    for r in restore_many(specs, threads=2):
        assert r.ok, r.error
        assert on_disk(r.store_path, fmt) == (want, {last}, {_native.STATUS_CLOSED})


def test_a_resumed_restore_drops_segments_that_expired_meanwhile(tmp_path: Path) -> None:
    fmt = "timestamped-window"
    first = write_changelog(tmp_path / "log", "window", n=120, seed=3)
    store = tmp_path / "0_2" / "win"
    store.parent.mkdir()
    restore_store(store, tmp_path / "log", TP, format=fmt, retention_ms=RETENTION)
    before, last = first.segments(fmt)
    assert on_disk(store, fmt)[0] == before
    # an hour later: every segment restored first has expired
    later = write_changelog(tmp_path / "log", "window", n=60, seed=4, start_time=BASE + 3_600_000)
    later.records = first.records + later.records
    res = restore_store(store, tmp_path / "log", TP, format=fmt, retention_ms=RETENTION)
    assert (res.mode, res.start_offset) == ("replay", last + 1)
    want, last = later.segments(fmt)
    assert not set(want) & set(before)
    assert on_disk(store, fmt) == (want, {last}, {_native.STATUS_CLOSED})
    again = restore_store(store, tmp_path / "log", TP, format=fmt, retention_ms=RETENTION)
    assert again.records_applied == 0


def test_segment_interval_is_an_input_and_a_store_written_with_another_is_refused(tmp_path: Path) -> None:
    changelog = write_changelog(tmp_path / "log", "session", n=80, seed=9)
    store = tmp_path / "0_2" / "win"
    store.parent.mkdir()
    restore_store(
        store, tmp_path / "log", TP, format="session", retention_ms=RETENTION, segment_interval_ms=120_000
    )
    want, _ = changelog.segments("session", interval=120_000)
    assert on_disk(store, "session")[0] == want
    with pytest.raises(StoreError, match="another segment interval"):
        restore_store(store, tmp_path / "log", TP, format="session", retention_ms=RETENTION)


def test_formats_and_their_parameters_are_checked(tmp_path: Path) -> None:
    write_changelog(tmp_path / "log", "window", n=5, seed=1)
    with pytest.raises(RestoreError, match="retention"):
        restore_store(tmp_path / "w", tmp_path / "log", TP, format="window")
    with pytest.raises(RestoreError, match="window, session and versioned stores"):
        restore_store(tmp_path / "kv", tmp_path / "log", TP, format="plain", retention_ms=RETENTION)
    assert not (tmp_path / "w").exists() and not (tmp_path / "kv").exists()
    # plain keys are no session keys: an error naming the store and partition, nothing written
    log = SegmentLog(tmp_path / "plainlog", sync=False)
    p = log.producer()
    p.send(TP.topic, TP.partition, b"k", b"v")
    p.flush()
    with pytest.raises(RestoreError, match="no session store key") as e:
        restore_store(tmp_path / "s", tmp_path / "plainlog", TP, format="session", retention_ms=RETENTION)
    assert str(TP) in str(e.value) and Path(str(e.value.path)) == tmp_path / "s"


# -- the Spark path: a staging attempt per partition, swapped into place ---------------------------------

APP = "app"  # TP is the changelog of store "win" of application "app", task 0_2


def test_restore_partition_stages_the_segments_and_resumes_from_them(tmp_path: Path) -> None:
    fmt = "timestamped-window"
    first = write_changelog(tmp_path / "log", "window", n=120, seed=11)
    state = tmp_path / "state"
    row = restore_partition(
        log_dir=tmp_path / "log",
        state_dir=state,
        application_id=APP,
        store="win",
        partition=2,
        format=fmt,
        retention_ms=RETENTION,
    )
    assert (row.status, row.mode) == ("ok", "bulk"), row.error
    store = state / APP / "0_2" / "win"
    want, last = first.segments(fmt)
    assert on_disk(store, fmt) == (want, {last}, {_native.STATUS_CLOSED})
    assert not (state / APP / "0_2" / "rocksdb").exists()
    # later records, some in the newest segments restored first
    later_start = max(first.segment_time(k) for _, k, _, _ in first.records) - 120_000
    later = write_changelog(tmp_path / "log", "window", n=40, seed=12, start_time=later_start)
    later.records = first.records + later.records
    row = restore_partition(
        log_dir=tmp_path / "log",
        state_dir=state,
        application_id=APP,
        store="win",
        partition=2,
        format=fmt,
        retention_ms=RETENTION,
    )
    assert (row.status, row.mode, row.start_offset) == ("ok", "replay", first.records[-1][0] + 1), row.error
    want, last = later.segments(fmt)
    assert on_disk(store, fmt) == (want, {last}, {_native.STATUS_CLOSED})
    assert not any((state / APP / "0_2" / STAGING_DIR_NAME).glob("*/*")), "no staging left"


@pytest.mark.spark
def test_restore_on_spark_writes_window_and_session_stores(spark: Any, tmp_path: Path) -> None:
    stores = {"win": ("timestamped-window", "window"), "sess": ("session", "session")}
    tps = {name: TopicPartition(f"{APP}-{name}-changelog", 2) for name in stores}
    models = {
        name: write_changelog(tmp_path / "log", schema, n=80, seed=len(name), tp=tps[name])
        for name, (_, schema) in stores.items()
    }
    with pytest.raises(ValueError, match="needs its retention"):
        restore_on_spark(
            spark,
            log_dir=tmp_path / "log",
            state_dir=tmp_path / "state",
            application_id=APP,
            stores=list(stores),
            formats={"win": "timestamped-window"},
        )
    rows = restore_on_spark(
        spark,
        log_dir=tmp_path / "log",
        state_dir=tmp_path / "state",
        application_id=APP,
        stores=list(stores),
        formats={n: f for n, (f, _) in stores.items()},
        retentions={n: RETENTION for n in stores},
    ).collect()
    assert sorted((r.store, r.status) for r in rows) == [("sess", "ok"), ("win", "ok")], [
        r.error for r in rows
    ]
    for name, (fmt, _) in stores.items():
        want, last = models[name].segments(fmt, store=name)
        got = on_disk(tmp_path / "state" / APP / "0_2" / name, fmt, tps[name])
        assert got == (want, {last}, {_native.STATUS_CLOSED}), name


KEPT_OPEN_CHILD = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from statestore import TopicPartition
    from statestore.restore.engine import OpenStores, RestoreSpec, restore_many

    root, fmt, retention, cuts = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
    tp = TopicPartition.parse(sys.argv[5])
    store = root / "kept" / "win"
    kept = OpenStores()

    def up_to(end):
        spec = RestoreSpec(store, root / "log", tp, end_offset=end, mode="replay", format=fmt, retention_ms=retention)
        [r] = restore_many([spec], open_stores=kept)
        assert r.ok, r.error
        return r.offset

    up_to(cuts[0])
    up_to(cuts[1])
    kept.flush(store)
    up_to(cuts[2])
    applied = up_to(cuts[3])
    print(json.dumps({"applied": applied}), flush=True)
    time.sleep(60)
    """
)


def test_a_window_store_kept_open_between_restores_loses_only_unflushed_rounds_to_a_crash(
    tmp_path: Path,
) -> None:
    """A replay into a store kept open (``restore_many(..., open_stores=)``) leaves a window store's
    segments unflushed and its offset in memory. A child restores in four rounds, flushes after the
    second and is SIGKILLed after the fourth: on disk every segment holding data must carry the
    offset of the flush and be the changelog's model up to it, and a restore from there converges."""
    fmt = "timestamped-window"
    changelog = write_changelog(tmp_path / "log", "window", n=300, seed=11)
    cuts = [changelog.end * i // 4 for i in (1, 2, 3)] + [changelog.end]
    (tmp_path / "kept").mkdir()
    line = kill_after_first_line(
        [sys.executable, "-c", KEPT_OPEN_CHILD, str(tmp_path), fmt, str(RETENTION), json.dumps(cuts), str(TP)]
    )
    applied = json.loads(line)["applied"]
    want, last = changelog.segments(fmt)
    assert applied == last

    store = tmp_path / "kept" / "win"
    flushed, flushed_last = changelog.segments(fmt, end=cuts[1])
    assert flushed_last is not None and flushed_last < last
    held: dict[str, dict[bytes, bytes]] = {}
    for seg in sorted(store.iterdir()):
        dump = _native.store_dump(seg)
        if dump.offsets.get(str(TP)) is None:
            # a segment the unflushed rounds created: nothing of it reached disk
            assert not dump.entries, seg
            continue
        assert dump.offsets == {str(TP): flushed_last}, seg
        assert dump.status == _native.STATUS_CLOSED
        held[seg.name] = dict(dump.entries)
    assert held == flushed, "the store on disk is the changelog's model up to the offset it holds"

    res = restore_store(store, tmp_path / "log", TP, format=fmt, retention_ms=RETENTION)
    assert (res.mode, res.start_offset) == ("replay", flushed_last + 1)
    assert on_disk(store, fmt) == (want, {last}, {_native.STATUS_CLOSED})
