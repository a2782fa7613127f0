"""Our RecordBatch v2 codec against kafka-python's independent implementation.

kafka-python 3.0.12 (a test dependency only) builds batches with
``DefaultRecordBatchBuilder`` and reads them with ``DefaultRecordBatch``. Its
builder never sets the control bit (brokers write markers), so control
batches are built by it with a marker key and then flagged, with the CRC
recomputed by its own ``calc_crc32c``. Only codecs kafka-python can use here
(none, gzip) are compared; the others are round-tripped in Rust tests.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.util import calc_crc32c

from statestore import SegmentLog, TopicPartition
from statestore._native import _testing

Rec = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]

RECORDS: list[Rec] = [
    (1_700_000_000_000, b"key-0", b"value-0", []),
    (1_700_000_000_005, None, b"null key", [("trace", b"abc"), ("empty", None)]),
    (1_699_999_999_990, b"tombstone", None, []),  # timestamp before the first: negative delta
    (1_700_000_000_100, b"k" * 200, b"v" * 5000, [("h" * 130, b"x" * 300)]),  # multi-byte varints
    (1_700_000_000_101, b"", b"", []),
]

CODECS = {"none": 0, "gzip": 1}


def kp_batch(
    base_offset: int,
    records: list[Rec],
    *,
    transactional: bool = False,
    producer_id: int = -1,
    epoch: int = -1,
    base_sequence: int = -1,
    codec: str = "none",
    control: bool = False,
) -> bytes:
    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=CODECS[codec],
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=base_sequence,
        batch_size=1 << 20,
    )
    for i, (ts, k, v, h) in enumerate(records):
        assert b.append(i, timestamp=ts, key=k, value=v, headers=h) is not None
    buf = bytearray(b.build())
    struct.pack_into(">q", buf, 0, base_offset)  # the broker's job
    if control:
        attrs = struct.unpack_from(">h", buf, 21)[0] | 0x20
        struct.pack_into(">h", buf, 21, attrs)
        struct.pack_into(">I", buf, 17, calc_crc32c(memoryview(buf)[21:]))
    return bytes(buf)


def kp_marker(
    base_offset: int, producer_id: int, epoch: int, commit: bool, ts: int = 1_700_000_000_000
) -> bytes:
    key = struct.pack(">hh", 0, 1 if commit else 0)
    value = struct.pack(">hi", 0, 0)
    return kp_batch(
        base_offset,
        [(ts, key, value, [])],
        transactional=True,
        producer_id=producer_id,
        epoch=epoch,
        base_sequence=-1,
        control=True,
    )


def kp_read(data: bytes) -> tuple[DefaultRecordBatch, list[Any]]:
    batch = DefaultRecordBatch(bytearray(data))
    assert batch.validate_crc(), "kafka-python finds the CRC valid"
    records = list(DefaultRecordBatch(bytearray(data)))
    return batch, records


@pytest.mark.parametrize("codec", ["none", "gzip"])
@pytest.mark.parametrize("transactional", [False, True])
def test_kafka_python_batches_decode_identically(codec: str, transactional: bool) -> None:
    pid, epoch, seq = (4242, 7, 100) if transactional else (-1, -1, -1)
    data = kp_batch(
        1000,
        RECORDS,
        transactional=transactional,
        producer_id=pid,
        epoch=epoch,
        base_sequence=seq,
        codec=codec,
    )
    header, records = _testing.decode_batch(data)
    kb, krecs = kp_read(data)
    assert header["base_offset"] == kb.base_offset == 1000
    assert header["last_offset"] == kb.last_offset == 1004
    assert header["count"] == kb.records_count == 5
    assert header["crc"] == kb.crc
    assert header["compression"] == codec
    assert header["transactional"] == kb.is_transactional == transactional
    assert header["is_control"] is kb.is_control_batch is False
    assert (header["producer_id"], header["producer_epoch"], header["base_sequence"]) == (
        kb.producer_id,
        kb.producer_epoch,
        kb.base_sequence,
    )
    assert (header["base_timestamp"], header["max_timestamp"]) == (kb.first_timestamp, kb.max_timestamp)
    ours = [(o, k, v, ts, list(h)) for (o, k, v, ts, h) in records]
    theirs = [(r.offset, r.key, r.value, r.timestamp, list(r.headers)) for r in krecs]
    assert ours == theirs


@pytest.mark.parametrize("codec", ["none", "gzip"])
@pytest.mark.parametrize("transactional", [False, True])
def test_our_batches_decode_identically_with_kafka_python(codec: str, transactional: bool) -> None:
    pid, epoch, seq = (99, 3, 0) if transactional else (-1, -1, -1)
    recs = [(1000 + i, ts, k, v, h) for i, (ts, k, v, h) in enumerate(RECORDS)]
    data = _testing.encode_batch(1000, recs, pid, epoch, seq, transactional, codec)
    kb, krecs = kp_read(data)
    assert kb.magic == 2 and kb.base_offset == 1000 and kb.last_offset == 1004 and kb.records_count == 5
    assert kb.is_transactional == transactional and not kb.is_control_batch
    assert (kb.producer_id, kb.producer_epoch, kb.base_sequence) == (pid, epoch, seq)
    assert kb.compression_type == CODECS[codec]
    assert [(r.offset, r.key, r.value, r.timestamp, list(r.headers)) for r in krecs] == [
        (o, k, v, ts, h) for (o, ts, k, v, h) in recs
    ]
    if codec == "none":
        # Same bytes as kafka-python's builder, apart from the partition leader
        # epoch (a broker field outside the CRC): same CRC.
        theirs = bytearray(
            kp_batch(
                1000, RECORDS, transactional=transactional, producer_id=pid, epoch=epoch, base_sequence=seq
            )
        )
        ours = bytearray(data)
        ours[12:16] = theirs[12:16]
        assert bytes(ours) == bytes(theirs)


@pytest.mark.parametrize("commit", [True, False])
def test_control_batches_interoperate(commit: bool) -> None:
    ours = _testing.encode_batch(
        77, [(77, 1_700_000_000_000, None, None, [])], 5, 2, -1, True, "none", "COMMIT" if commit else "ABORT"
    )
    kb, krecs = kp_read(ours)
    assert kb.is_control_batch and kb.is_transactional and kb.base_offset == 77
    assert (kb.producer_id, kb.producer_epoch) == (5, 2)
    assert len(krecs) == 1 and krecs[0].commit == commit and krecs[0].abort == (not commit)
    theirs = kp_marker(77, 5, 2, commit)
    header, records = _testing.decode_batch(theirs)
    assert header["is_control"] and header["transactional"]
    assert header["control"] == ("COMMIT" if commit else "ABORT")
    assert len(records) == 1


def test_kafka_python_crc_mismatch_is_refused_by_both() -> None:
    data = bytearray(kp_batch(0, RECORDS))
    data[-2] ^= 0xFF
    assert not DefaultRecordBatch(bytearray(data)).validate_crc()
    with pytest.raises(Exception, match="CRC"):
        _testing.decode_batch(bytes(data))


def test_segment_of_kafka_python_batches_reads_committed(tmp_path: Path) -> None:
    """An 'archived Kafka partition': every batch written by kafka-python's codec."""
    tp = TopicPartition("archived", 0)
    d = tmp_path / str(tp)
    d.mkdir()
    batches = [
        kp_batch(
            0,
            [(1, b"a", b"committed-1", []), (2, b"a", b"committed-2", [])],
            transactional=True,
            producer_id=10,
            epoch=0,
            base_sequence=0,
        ),
        kp_batch(
            2,
            [(3, b"b", b"aborted", [])],
            transactional=True,
            producer_id=11,
            epoch=0,
            base_sequence=0,
            codec="gzip",
        ),
        kp_marker(3, 11, 0, commit=False),
        kp_batch(4, [(4, b"c", b"plain", [])]),
        kp_marker(5, 10, 0, commit=True),
        kp_batch(6, [(6, b"d", b"open", [])], transactional=True, producer_id=12, epoch=0, base_sequence=0),
        kp_batch(7, [(7, b"e", b"behind-open", [])]),
    ]
    (d / f"{0:020d}.log").write_bytes(b"".join(batches))
    log = SegmentLog(tmp_path)
    assert log.offsets(tp) == (0, 8, 6)
    assert [r.value for r in log.read(tp)] == [b"committed-1", b"committed-2", b"plain"]
    r = log.reader(tp, 0)
    r.poll()
    assert r.position == 6
    assert [r.value for r in log.read(tp, isolation="read_uncommitted")] == [
        b"committed-1",
        b"committed-2",
        b"aborted",
        b"plain",
        b"open",
        b"behind-open",
    ]
    dumped = log.dump(tp)
    assert [b.control for b in dumped] == [None, None, "ABORT", None, "COMMIT", None, None]
    assert [b.outcome for b in dumped] == ["committed", "aborted", None, None, None, "open", None]


def test_our_segment_files_read_with_kafka_python(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, compression="gzip")
    tp = TopicPartition("ours", 0)
    a = log.producer("a")
    a.begin()
    for i in range(50):
        a.send(tp.topic, 0, b"k%d" % i, b"v" * i, [("i", b"%d" % i)], timestamp=1000 + i)
    a.abort()
    a.begin()
    a.send(tp.topic, 0, b"last", None, timestamp=2000)
    a.commit()
    log.close()
    data = (tmp_path / str(tp) / f"{0:020d}.log").read_bytes()
    pos, seen, controls = 0, [], []
    while pos < len(data):
        length = struct.unpack_from(">i", data, pos + 8)[0]
        kb, krecs = kp_read(data[pos : pos + length + 12])
        if kb.is_control_batch:
            controls.append("COMMIT" if krecs[0].commit else "ABORT")
        else:
            seen += [(r.offset, r.key, r.value, r.timestamp) for r in krecs]
        pos += length + 12
    assert controls == ["ABORT", "COMMIT"]
    assert seen == [(i, b"k%d" % i, b"v" * i, 1000 + i) for i in range(50)] + [(51, b"last", None, 2000)]
