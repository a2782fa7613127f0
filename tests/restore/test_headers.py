"""Header-aware stores (Kafka Streams 4.3+, ``dsl.store.format=headers``) restored from their changelogs.

The changelogs are written with the segment log's transactional producer,
records with none, one or several headers (a null value among them), some
transactions aborted. The model here builds the stored value as Kafka
Streams' restore does (``RecordConverters``), in Python and from the
committed records alone: ``varint(len H) ‖ H ‖ timestamp ‖ value`` for a
key-value or window store, ``varint(len H) ‖ H ‖ value`` for a session store,
where H is nothing without headers, else ``varint(count)`` and the headers in
the record wire format, every varint Kafka's zig-zag varint. Each store (or
segment) holds exactly the column families Kafka Streams opens for it.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path
from typing import Any

import pytest
from rocksdict import Options, Rdict

from statestore import StoreError, TopicPartition, _native
from statestore.changelog.protocol import Header
from statestore.changelog.segment_log import SegmentLog
from statestore.restore.engine import RestoreSpec, restore_many, restore_store
from statestore.state.store import KEY_VALUE_FORMATS, Store

TP = TopicPartition("app-h-changelog", 1)
BASE = 1_700_000_000_000
RETENTION = 600_000
INTERVAL = _native.dsl_segment_interval(RETENTION)

#: The column families of each RocksDB of each header-aware format (a store, or a segment).
FAMILIES = {
    "timestamped-headers": ["default", "keyValueWithTimestampAndHeaders", "offsets"],
    "timestamped-window-headers": ["default", "keyValueWithTimestampAndHeaders", "offsets"],
    "session-headers": ["default", "offsets", "sessionKeyValueWithHeaders"],
}


def varint(n: int) -> bytes:
    """Kafka's zig-zag varint of a 32-bit int (``ByteUtils.writeVarint``)."""
    z = ((n << 1) ^ (n >> 31)) & 0xFFFFFFFF
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def headers_bytes(headers: list[Header]) -> bytes:
    """H: ``HeadersSerializer``'s output for ``headers``."""
    if not headers:
        return b""
    out = varint(len(headers))
    for k, v in headers:
        kb = k.encode()
        out += varint(len(kb)) + kb + (varint(-1) if v is None else varint(len(v)) + v)
    return out


def stored(fmt: str, ts: int, headers: list[Header], value: bytes) -> bytes:
    """The value a header-aware store of ``fmt`` holds for a changelog record."""
    h = headers_bytes(headers)
    stamp = b"" if fmt == "session-headers" else struct.pack(">q", ts)
    return varint(len(h)) + h + stamp + value


def test_the_model_is_kafka_streams_byte_for_byte() -> None:
    # as Kafka Streams 4.4's RecordConverters.reconstructFromRaw writes them
    assert stored("timestamped-headers", 1, [], b"v") == b"\x00" + b"\x00" * 7 + b"\x01v"
    assert stored("session-headers", 1, [("k", b"v")], b"a") == b"\x0a\x02\x02k\x02va"
    assert headers_bytes([("n", None)]) == b"\x02\x02n\x01"
    assert varint(300) == b"\xd8\x04"


def random_headers(rng: random.Random, seq: int) -> list[Header]:
    match rng.randrange(4):
        case 0:
            return []
        case 1:
            return [("trace", b"%d" % seq)]
        case 2:
            return [("a", b"x"), ("none", None), ("empty", b"")]
        case _:
            return [("big", b"z" * rng.randrange(60, 200))]  # len H takes two varint bytes


def key_of(schema: str, user: bytes, now: int, rng: random.Random) -> bytes:
    if schema == "key-value":
        return user
    if schema == "window":
        return user + struct.pack(">qi", now - now % 60_000, 0)
    end = now - rng.randrange(50_000)
    return user + struct.pack(">qq", end, end - rng.randrange(30_000))


def write_changelog(
    log_dir: Path, schema: str, n: int, seed: int
) -> list[tuple[int, bytes, bytes | None, int, list[Header]]]:
    """``n`` transactions of updates with headers (some aborted); the committed records."""
    rng = random.Random(seed)
    log = SegmentLog(log_dir, sync=False)
    txn = log.producer(transactional_id=f"h-{seed}")
    committed = []
    now = BASE
    for i in range(n):
        now += rng.randrange(0, 30_000)
        txn.begin()
        sent = []
        for j in range(rng.randrange(1, 6)):
            key = key_of(schema, b"user-%d" % rng.randrange(15), now, rng)
            value = None if rng.random() < 0.15 else b"%d" % rng.randrange(10_000)
            hs = random_headers(rng, i * 10 + j)
            ts = now - rng.randrange(1000)
            sent.append((txn.send(TP.topic, TP.partition, key, value, hs, timestamp=ts), key, value, ts, hs))
        txn.flush()
        if rng.random() < 0.15:
            txn.abort()
        else:
            txn.commit()
            committed.extend(sent)
    log.close()
    return committed


def segment_time(schema: str, key: bytes) -> int:
    return int(struct.unpack(">q", key[-12:-4] if schema == "window" else key[-16:-8])[0])


def model(
    fmt: str, records: list[tuple[int, bytes, bytes | None, int, list[Header]]]
) -> dict[str, dict[bytes, bytes]]:
    """RocksDB name (``""`` for a key-value store, else the segment's) -> key -> stored value."""
    schema = {"timestamped-headers": "key-value", "timestamped-window-headers": "window"}.get(fmt, "session")
    data: dict[int, dict[bytes, bytes]] = {}
    for _, k, v, ts, hs in records:
        seg = data.setdefault(0 if schema == "key-value" else segment_time(schema, k) // INTERVAL, {})
        if v is None:
            seg.pop(k, None)
        else:
            seg[k] = stored(fmt, ts, hs, v)
    if schema == "key-value":
        return {"": data[0]}
    min_live = (max(segment_time(schema, r[1]) for r in records) - RETENTION) // INTERVAL
    return {f"h.{i * INTERVAL}": d for i, d in data.items() if i >= min_live}


def on_disk(store: Path, fmt: str) -> tuple[dict[str, dict[bytes, bytes]], set[int | None]]:
    """Each RocksDB of ``store`` (name as in :func:`model`), checking its families and format; the offsets."""
    dbs = (
        [("", store)]
        if fmt not in _native.SEGMENTED_STORE_FORMATS
        else [(p.name, p) for p in store.iterdir()]
    )
    data, offsets = {}, set()
    for name, path in sorted(dbs):
        assert sorted(Rdict.list_cf(str(path), Options(raw_mode=True))) == FAMILIES[fmt], path
        assert _native.store_format(path) == ("timestamped-headers" if fmt != "session-headers" else fmt)
        dump = _native.store_dump(path)
        data[name] = dict(dump.entries)
        offsets.add(dump.offsets.get(str(TP)))
        assert dump.status == _native.STATUS_CLOSED
    return data, offsets


@pytest.mark.parametrize("fmt", list(FAMILIES))
def test_replay_bulk_and_many_keep_each_record_s_headers(tmp_path: Path, fmt: str) -> None:
    schema = {"timestamped-headers": "key-value", "timestamped-window-headers": "window"}.get(fmt, "session")
    records = write_changelog(tmp_path / "log", schema, n=250, seed=11)
    want = model(fmt, records)
    assert any(v[0] != 0 for seg in want.values() for v in seg.values()), "stored headers"
    assert any(v[0] == 0 for seg in want.values() for v in seg.values()), "and stored values without"
    retention = None if schema == "key-value" else RETENTION
    log = SegmentLog(tmp_path / "log")
    for mode in ("bulk", "replay"):
        store = tmp_path / mode / "h"
        store.parent.mkdir()
        r = restore_store(store, log, TP, mode=mode, format=fmt, retention_ms=retention)
        assert r.mode == mode and r.offset == records[-1][0]
        assert on_disk(store, fmt) == (want, {records[-1][0]}), mode
    many = tmp_path / "many" / "h"
    many.parent.mkdir()
    (r,) = restore_many([RestoreSpec(many, log, TP, format=fmt, retention_ms=retention)])
    assert r.ok, r.error
    assert on_disk(many, fmt) == (want, {records[-1][0]})


def test_a_header_aware_store_is_told_apart_and_never_opened_as_another(tmp_path: Path) -> None:
    records = write_changelog(tmp_path / "log", "key-value", n=20, seed=3)
    store = tmp_path / "s"
    restore_store(store, SegmentLog(tmp_path / "log"), TP, format="timestamped-headers")
    assert _native.store_format(store) == "timestamped-headers"
    with pytest.raises(StoreError, match="timestamped-headers"):
        restore_store(store, SegmentLog(tmp_path / "log"), TP, format="timestamped")
    assert "timestamped-headers" not in KEY_VALUE_FORMATS, "restored, not processed"
    with pytest.raises(ValueError, match="restored by statestore, not processed"):
        Store(store, format="timestamped-headers")
    assert on_disk(store, "timestamped-headers")[0] == model("timestamped-headers", records)


class Message:
    """A confluent-kafka ``Message`` as the Python feed reads it."""

    def __init__(self, offset: int, key: bytes, value: bytes | None, ts: int, headers: list[Header]) -> None:
        self._r = (offset, key, value, ts, headers)

    def error(self) -> None:
        return None

    def offset(self) -> int:
        return self._r[0]

    def key(self) -> bytes:
        return self._r[1]

    def value(self) -> bytes | None:
        return self._r[2]

    def timestamp(self) -> tuple[int, int]:
        return (1, self._r[3])

    def headers(self) -> list[Header] | None:
        return self._r[4] or None  # confluent-kafka gives None for no headers


class Feed:
    """A changelog reached through Python (``restore_bounds``, ``restore_feed``) over ``records``."""

    restore_stall_timeout = 10.0

    def __init__(self, records: list[tuple[int, bytes, bytes | None, int, list[Header]]]) -> None:
        self.records, self.end = records, records[-1][0] + 1

    def restore_bounds(self, topic: str, partition: int) -> tuple[int, int, int]:
        return (0, self.end, self.end)

    def restore_feed(self, topic: str, partition: int, start: int) -> Any:
        outer = self

        class One:
            pos = start

            def poll(self, n: int) -> list[Message]:
                batch = [Message(*r) for r in outer.records if r[0] >= self.pos][:n]
                self.pos = batch[-1].offset() + 1 if batch else outer.end
                return batch

            def on_error(self, msg: Any) -> bool:
                return True

            def position(self) -> int:
                return self.pos

            def close(self) -> None:
                pass

        return One()


def test_a_changelog_reached_through_python_hands_over_the_headers_too(tmp_path: Path) -> None:
    records = write_changelog(tmp_path / "log", "key-value", n=60, seed=5)
    store = tmp_path / "s"
    r = restore_store(store, Feed(records), TP, format="timestamped-headers", mode="replay")
    assert r.offset == records[-1][0]
    assert on_disk(store, "timestamped-headers")[0] == model("timestamped-headers", records)
