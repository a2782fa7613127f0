"""Emit-final window and session stores (``emitStrategy(onWindowClose())``) restored from their changelogs.

The changelog of an emit-final window store is that of any window store
(keys ``key ‖ window start ‖ seqnum``); Kafka Streams' time-ordered store
(``RocksDBTimeOrderedWindowSegmentedBytesStore``) keeps each record under
``0x00 ‖ window start ‖ key ‖ seqnum`` with a timestamped value, in
``default`` (``emit-final-window``) or, under ``dsl.store.format=headers``,
in ``windowKeyValueWithHeaders`` with the record's headers in front and an
index row ``0x01 ‖ key ‖ window start ‖ seqnum`` -> empty besides
(``emit-final-window-headers``), and so does the store of sliding windows
(``emit-final-sliding-window``). An emit-final session store
(``emit-final-session``) keeps a session store's changelog record under
``0x00 ‖ end ‖ start ‖ key`` with the value as logged, and an index row
``0x01 ‖ key ‖ end ‖ start`` -> empty. The model here builds that layout in
Python from the committed records alone; segments and stream time as for
any window or session store (``test_segmented.py``).
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from statestore import StateStoreError, TopicPartition, _native
from statestore.changelog.protocol import Header
from statestore.changelog.segment_log import SegmentLog
from statestore.restore.engine import RestoreSpec, restore_many, restore_store

TP = TopicPartition("app-ef-changelog", 0)
BASE = 1_700_000_000_000
RETENTION = 300_000
INTERVAL = _native.dsl_segment_interval(RETENTION)
FAMILIES = {
    "emit-final-window": ["default", "offsets"],
    "emit-final-sliding-window": ["default", "offsets"],
    "emit-final-window-headers": ["default", "offsets", "windowKeyValueWithHeaders"],
    "emit-final-session": ["default", "offsets"],
    "emit-final-session-headers": ["default", "offsets", "sessionKeyValueWithHeaders"],
}

Record = tuple[int, bytes, bytes | None, int, list[Header]]


def write_changelog(log_dir: Path, n: int, seed: int, session: bool = False) -> list[Record]:
    """``n`` transactions of windowed (or session) updates marching through time (some aborted,
    some tombstones)."""
    rng = random.Random(seed)
    log = SegmentLog(log_dir, sync=False)
    txn = log.producer(transactional_id=f"ef-{seed}")
    committed: list[Record] = []
    now = BASE
    for _ in range(n):
        now += rng.randrange(0, 20_000)
        txn.begin()
        sent = []
        for _ in range(rng.randrange(1, 6)):
            start = now - now % 60_000 - 60_000 * rng.randrange(2)
            user = b"user-%d" % rng.randrange(10)
            key = user + (
                struct.pack(">qq", start + 50_000, start) if session else struct.pack(">qi", start, 0)
            )
            value = None if rng.random() < 0.1 else b"%d" % rng.randrange(1000)
            hs: list[Header] = [("h", b"%d" % rng.randrange(9))] if rng.random() < 0.5 else []
            ts = now - rng.randrange(500)
            sent.append((txn.send(TP.topic, TP.partition, key, value, hs, timestamp=ts), key, value, ts, hs))
        txn.flush()
        if rng.random() < 0.15:
            txn.abort()
        else:
            txn.commit()
            committed.extend(sent)
    log.close()
    return committed


def time_first(fmt: str, key: bytes) -> bytes:
    """``TimeFirstWindowKeySchema.fromNonPrefixWindowKey``; a session's
    ``TimeFirstSessionKeySchema.extractWindowBytesFromNonPrefixSessionKey``."""
    if fmt.startswith("emit-final-session"):
        return b"\x00" + key[-16:] + key[:-16]
    return b"\x00" + key[-12:-4] + key[:-12] + key[-4:]


def segment_time(fmt: str, key: bytes) -> int:
    """A window's start, a session's end."""
    return int(struct.unpack(">q", key[-16:-8] if fmt.startswith("emit-final-session") else key[-12:-4])[0])


def stored(fmt: str, ts: int, headers: list[Header], value: bytes) -> bytes:
    if fmt.startswith("emit-final-session"):
        return value  # without headers, also in sessionKeyValueWithHeaders (as Kafka Streams 4.4 keeps it)
    if fmt in ("emit-final-window", "emit-final-sliding-window"):
        return struct.pack(">q", ts) + value
    h = b""
    if headers:
        h = bytes([2 * len(headers)])
        for k, v in headers:
            assert v is not None and len(v) < 64
            h += bytes([2 * len(k)]) + k.encode() + bytes([2 * len(v)]) + v
    return bytes([2 * len(h)]) + h + struct.pack(">q", ts) + value


def model(fmt: str, records: list[Record]) -> dict[str, dict[bytes, bytes]]:
    indexed = fmt != "emit-final-window"
    data: dict[int, dict[bytes, bytes]] = {}
    for _, k, v, ts, hs in records:
        seg = data.setdefault(segment_time(fmt, k) // INTERVAL, {})
        if v is None:
            seg.pop(time_first(fmt, k), None)
            if indexed:
                seg.pop(b"\x01" + k, None)
        else:
            seg[time_first(fmt, k)] = stored(fmt, ts, hs, v)
            if indexed:
                seg[b"\x01" + k] = b""
    min_live = (max(segment_time(fmt, r[1]) for r in records) - RETENTION) // INTERVAL
    return {f"ef.{i * INTERVAL}": d for i, d in data.items() if i >= min_live}


def on_disk(store: Path, fmt: str) -> tuple[dict[str, dict[bytes, bytes]], set[int | None]]:
    data, offsets = {}, set()
    for seg in sorted(store.iterdir()):
        assert sorted(Rdict.list_cf(str(seg), Options(raw_mode=True))) == FAMILIES[fmt], seg
        dump = _native.store_dump(seg)
        data[seg.name] = dict(dump.entries)
        offsets.add(dump.offsets.get(str(TP)))
        assert dump.status == _native.STATUS_CLOSED
    return data, offsets


@pytest.mark.parametrize("fmt", list(FAMILIES))
def test_bulk_replay_and_many_write_time_first_rows_into_live_segments(tmp_path: Path, fmt: str) -> None:
    records = write_changelog(tmp_path / "log", n=300, seed=17, session=fmt.startswith("emit-final-session"))
    want = model(fmt, records)
    index_rows = sum(k[0] == 1 for seg in want.values() for k in seg)
    assert (index_rows > 0) == (fmt != "emit-final-window"), index_rows
    assert len(want) >= 2, "a few segments live"
    log = SegmentLog(tmp_path / "log")
    for mode in ("bulk", "replay"):
        store = tmp_path / mode / "ef"
        store.parent.mkdir()
        r = restore_store(store, log, TP, mode=mode, format=fmt, retention_ms=RETENTION)
        assert r.mode == mode
        assert on_disk(store, fmt) == (want, {records[-1][0]}), mode
    many = tmp_path / "many" / "ef"
    many.parent.mkdir()
    (r,) = restore_many([RestoreSpec(many, log, TP, format=fmt, retention_ms=RETENTION)])
    assert r.ok, r.error
    assert on_disk(many, fmt) == (want, {records[-1][0]})


def test_a_key_too_short_for_a_window_key_is_refused(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path / "log", sync=False)
    p = log.producer()
    p.send(TP.topic, TP.partition, b"short", b"v")
    p.flush()
    log.close()
    for mode in ("bulk", "replay"):
        with pytest.raises(StateStoreError, match="no emit-final window store key"):
            restore_store(
                tmp_path / f"s-{mode}",
                SegmentLog(tmp_path / "log"),
                TP,
                mode=mode,
                format="emit-final-window",
                retention_ms=RETENTION,
            )
