"""The embedded changelog: producer, transactions, read_committed, segments, corruption."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from statestore import (
    CorruptLogError,
    LockError,
    LogError,
    ProducerFencedError,
    Record,
    SegmentLog,
    TopicPartition,
    TransactionStateError,
    UnsupportedCompressionError,
)

TP = TopicPartition("app-store-changelog", 0)


def values(records: list[Record]) -> list[bytes | None]:
    return [r.value for r in records]


def log_file(log_dir: Path, tp: TopicPartition = TP, base: int = 0) -> Path:
    return log_dir / str(tp) / f"{base:020d}.log"


def test_send_returns_offsets_and_writes_multi_record_batches(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path)
    p = log.producer()
    offsets = [p.send(TP.topic, 0, b"k%d" % i, b"v%d" % i) for i in range(1000)]
    assert offsets == list(range(1000))
    p.flush()
    batches = log.dump(TP)
    assert len(batches) < 10, "records are batched, not one batch per record"
    assert sum(b.count for b in batches) == 1000
    got = list(log.read(TP))
    assert [r.offset for r in got] == offsets
    assert got[5].key == b"k5" and got[5].value == b"v5"
    assert log.offsets(TP) == (0, 1000, 1000)


def test_null_key_tombstone_and_headers_round_trip(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path)
    p = log.producer()
    p.send(TP.topic, 0, None, b"v", [("h1", b"x"), ("h2", None)], timestamp=1234)
    p.send(TP.topic, 0, b"k", None, timestamp=1300)
    p.flush()
    a, b = log.read(TP)
    assert (a.key, a.value, a.timestamp, a.headers) == (None, b"v", 1234, (("h1", b"x"), ("h2", None)))
    assert (b.key, b.value, b.timestamp, b.headers) == (b"k", None, 1300, ())


def test_interleaved_transactions_two_producers_commit_abort_and_open(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path)
    a = log.producer("a")
    b = log.producer("b")
    a.begin()
    b.begin()
    a.send(TP.topic, 0, b"a", b"a1")  # 0
    b.send(TP.topic, 0, b"b", b"b1")  # 1
    a.send(TP.topic, 0, b"a", b"a2")  # 2
    b.send(TP.topic, 0, b"b", b"b2")  # 3
    a.commit()  # 4
    b.abort()  # 5
    b.begin()
    b.send(TP.topic, 0, b"b", b"b3")  # 6
    b.commit()  # 7
    a.begin()
    a.send(TP.topic, 0, b"a", b"open")  # 8
    b.begin()
    b.send(TP.topic, 0, b"b", b"after-open")  # 9
    b.commit()  # 10
    a.flush()
    assert log.start_offset(TP) == 0
    assert log.end_offset(TP) == 11
    assert log.last_stable_offset(TP) == 8, "the open transaction holds back the LSO"
    assert values(list(log.read(TP))) == [b"a1", b"a2", b"b3"]
    r = log.reader(TP, 0)
    assert values(r.poll()) == [b"a1", b"a2", b"b3"]
    assert r.position == 8, "position steps over markers and aborted records up to the LSO"
    assert r.skipped == (2, 3)
    assert r.poll() == []
    uncommitted = values(list(log.read(TP, isolation="read_uncommitted")))
    assert uncommitted == [b"a1", b"b1", b"a2", b"b2", b"b3", b"open", b"after-open"]
    a.commit()  # 11
    assert log.last_stable_offset(TP) == 12
    assert values(r.poll()) == [b"open", b"after-open"]
    assert r.position == 12
    # Reading from the middle of a transaction's range still filters correctly.
    assert values(list(log.read(TP, 3))) == [b"b3", b"open", b"after-open"]
    assert [r.offset for r in log.read(TP, 2, max_records=1)] == [2]


def test_transaction_over_several_partitions(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path)
    p = log.producer("multi")
    p.begin()
    for part in range(3):
        p.send("t", part, b"k", b"p%d" % part)
    p.commit()
    p.begin()
    p.send("t", 1, b"k", b"gone")
    p.abort()
    for part in range(3):
        tp = TopicPartition("t", part)
        assert values(list(log.read(tp))) == [b"p%d" % part]
        assert log.last_stable_offset(tp) == log.end_offset(tp)
    assert log.end_offset(("t", 1)) == 4


def test_empty_partition(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path)
    assert log.offsets(TP) == (0, 0, 0)
    assert list(log.read(TP)) == []
    r = log.reader(TP)
    assert r.poll() == [] and r.position == 0
    # A partition whose directory exists but holds no record.
    log.producer().flush()
    (tmp_path / str(TP)).mkdir()
    assert log.offsets(TP) == (0, 0, 0)


def test_partition_starting_at_non_zero_offset(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, segment_bytes=4096)
    p = log.producer()
    for i in range(300):
        p.send(TP.topic, 0, b"k", b"%0100d" % i)
        if i % 10 == 9:
            p.flush()
    log.close()
    segs = sorted((tmp_path / str(TP)).glob("*.log"))
    assert len(segs) > 3
    for s in segs[:2]:  # retention deleted the oldest segments
        s.unlink()
        s.with_suffix(".index").unlink()
    start = int(segs[2].stem)
    assert start > 0
    log2 = SegmentLog(tmp_path, segment_bytes=4096)
    assert log2.offsets(TP) == (start, 300, 300)
    got = list(log2.read(TP))
    assert got[0].offset == start and len(got) == 300 - start
    assert [r.offset for r in log2.read(TP, 0, max_records=2)] == [start, start + 1]
    # Appending continues after the last offset.
    assert log2.producer().send(TP.topic, 0, None, b"x") == 300


def test_zombie_producer_is_fenced_and_its_transaction_aborted(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path)
    zombie = log.producer("task-0_0")
    zombie.begin()
    zombie.send(TP.topic, 0, b"k", b"zombie")
    zombie.send("other", 3, b"k", b"zombie")
    zombie.flush()
    assert log.last_stable_offset(TP) == 0
    # A new instance (here through another SegmentLog object) takes over.
    fresh = SegmentLog(tmp_path).producer("task-0_0")
    assert fresh.producer_id == zombie.producer_id
    assert fresh.epoch == zombie.epoch + 1
    assert log.last_stable_offset(TP) == log.end_offset(TP) == 2
    assert log.last_stable_offset(("other", 3)) == 2
    with pytest.raises(ProducerFencedError, match="fenced"):
        zombie.send(TP.topic, 0, b"k", b"late")
    with pytest.raises(ProducerFencedError):
        zombie.commit()
    with pytest.raises(ProducerFencedError):
        zombie.begin()
    fresh.begin()
    fresh.send(TP.topic, 0, b"k", b"fresh")
    fresh.commit()
    assert values(list(log.read(TP))) == [b"fresh"]
    assert values(list(log.read(("other", 3)))) == []


def test_expired_transaction_is_aborted(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path)
    slow = log.producer("slow")
    slow.begin()
    slow.send(TP.topic, 0, b"k", b"stuck")
    slow.flush()
    done = log.producer("done")
    done.begin()
    done.send(TP.topic, 0, b"k", b"behind")
    done.commit()
    assert log.last_stable_offset(TP) == 0
    assert list(log.read(TP)) == []
    assert log.abort_expired_transactions(60_000) == []
    time.sleep(0.02)
    assert log.abort_expired_transactions(10) == ["slow"]
    assert log.last_stable_offset(TP) == log.end_offset(TP)
    assert values(list(log.read(TP))) == [b"behind"]
    with pytest.raises(ProducerFencedError):
        slow.commit()


def test_transaction_state_errors(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path)
    p = log.producer("t")
    with pytest.raises(TransactionStateError, match="begin"):
        p.send(TP.topic, 0, b"k", b"v")
    with pytest.raises(TransactionStateError):
        p.commit()
    p.begin()
    with pytest.raises(TransactionStateError):
        p.begin()
    p.abort()
    plain = log.producer()
    with pytest.raises(TransactionStateError, match="transactional"):
        plain.begin()
    with pytest.raises(LogError, match="invalid topic"):
        plain.send("../escape", 0, None, b"v")


def test_segments_roll_at_the_configured_size(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, segment_bytes=10_000)
    p = log.producer()
    for i in range(2000):
        p.send(TP.topic, 0, b"key-%d" % i, b"x" * 50)
        if i % 50 == 49:
            p.flush()
    p.flush()
    segs = sorted((tmp_path / str(TP)).glob("*.log"))
    assert len(segs) > 10
    assert all(s.stat().st_size <= 10_000 for s in segs)
    assert all(s.with_suffix(".index").exists() for s in segs)
    assert int(segs[0].stem) == 0
    for start in (0, 999, 1999):
        got = list(log.read(TP, start))
        assert [r.offset for r in got] == list(range(start, 2000))


def test_index_rebuilt_when_missing_or_damaged(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, segment_bytes=50_000)
    p = log.producer()
    for i in range(3000):
        p.send(TP.topic, 0, b"k", b"%040d" % i)
        if i % 20 == 19:
            p.flush()
    log.close()
    segs = sorted((tmp_path / str(TP)).glob("*.log"))
    idx = [s.with_suffix(".index") for s in segs]
    good = [i.read_bytes() for i in idx]
    assert all(len(g) > 0 for g in good)
    idx[0].unlink()
    idx[-1].write_bytes(b"\x00\x00\x00\x05\x00\x00\xff\xff\x01")  # stale and cut short
    # Readers never trust the index blindly.
    assert [r.offset for r in SegmentLog(tmp_path).read(TP, 1500, max_records=3)] == [1500, 1501, 1502]
    # Opening for write rebuilds both.
    log2 = SegmentLog(tmp_path, segment_bytes=50_000)
    log2.producer().send(TP.topic, 0, None, b"x")
    log2.close()
    assert idx[0].read_bytes() == good[0]
    assert idx[-1].read_bytes() == good[-1]


def test_flipped_byte_raises_corrupt_log_error_with_file_and_position(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path)
    p = log.producer()
    for i in range(3):
        p.send(TP.topic, 0, b"k", b"v%d" % i)
        p.flush()
    log.close()
    f = log_file(tmp_path)
    batches = SegmentLog(tmp_path).dump(TP)
    second = batches[1].position
    data = bytearray(f.read_bytes())
    data[second + 65] ^= 0x01
    f.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError) as ei:
        list(SegmentLog(tmp_path).read(TP))
    msg = str(ei.value)
    assert str(f) in msg and f"at byte {second}" in msg and "offset 1" in msg
    with pytest.raises(CorruptLogError):
        SegmentLog(tmp_path).producer().send(TP.topic, 0, None, b"x")
    # The dump still shows the damage instead of failing.
    dumped = SegmentLog(tmp_path).dump(TP)
    assert [b.crc_valid for b in dumped] == [True, False, True]


def test_truncated_tail_is_recovered(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path)
    p = log.producer("t")
    for i in range(3):
        p.begin()
        p.send(TP.topic, 0, b"k", b"v%d" % i)
        p.commit()
    log.close()
    f = log_file(tmp_path)
    full = f.read_bytes()
    # A crash in the middle of appending a batch leaves a prefix of it.
    f.write_bytes(full + full[:40])
    assert values(list(SegmentLog(tmp_path).read(TP))) == [b"v0", b"v1", b"v2"], (
        "readers stop at the torn tail"
    )
    assert SegmentLog(tmp_path).end_offset(TP) == 6
    log2 = SegmentLog(tmp_path)
    p2 = log2.producer("t")
    p2.begin()
    assert p2.send(TP.topic, 0, b"k", b"v3") == 6
    p2.commit()
    assert f.read_bytes().startswith(full)
    assert values(list(log2.read(TP))) == [b"v0", b"v1", b"v2", b"v3"]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_round_trip(tmp_path: Path, codec: str) -> None:
    log = SegmentLog(tmp_path, compression=codec)  # type: ignore[arg-type]
    p = log.producer("c")
    p.begin()
    for i in range(500):
        p.send(TP.topic, 0, b"key-%d" % (i % 7), b"value " * 20)
    p.commit()
    batches = log.dump(TP)
    assert {b.compression for b in batches if not b.control} == {codec}
    got = list(log.read(TP))
    assert len(got) == 500 and got[499].key == b"key-%d" % (499 % 7)


def _fix_crc(batch: bytearray) -> None:
    from kafka.record.util import calc_crc32c

    batch[17:21] = calc_crc32c(bytes(batch[21:])).to_bytes(4, "big")


def test_unknown_codec_raises_unsupported_compression(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path)
    p = log.producer()
    p.send(TP.topic, 0, b"k", b"v")
    p.flush()
    log.close()
    f = log_file(tmp_path)
    data = bytearray(f.read_bytes())
    data[22] |= 0x05  # attributes: codec 5 does not exist
    _fix_crc(data)
    f.write_bytes(bytes(data))
    with pytest.raises(UnsupportedCompressionError) as ei:
        list(SegmentLog(tmp_path).read(TP))
    assert str(f) in str(ei.value) and "byte 0" in str(ei.value) and "codec 5" in str(ei.value)


_HOLDER = textwrap.dedent(
    """
    import sys
    from statestore import SegmentLog
    log = SegmentLog(sys.argv[1])
    p = log.producer()
    p.send("t", 0, None, b"x")
    p.flush()
    print("ready", flush=True)
    sys.stdin.readline()
    """
)


def start_child(script: str, *args: str) -> subprocess.Popen[str]:
    """Run ``script`` in a new interpreter and wait until it prints ``ready``."""
    child = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    if child.stdout.readline().strip() != "ready":
        _, err = child.communicate(timeout=30)
        pytest.fail(f"child process did not start: {err}")
    return child


def test_second_writer_process_gets_a_clear_lock_error(tmp_path: Path) -> None:
    child = start_child(_HOLDER, str(tmp_path))
    try:
        log = SegmentLog(tmp_path)
        with pytest.raises(LockError) as ei:
            log.producer().send("t", 0, None, b"y")
        assert "t-0" in str(ei.value) and "another process" in str(ei.value)
        # Another partition is free, and reading never needs the lock.
        assert log.producer().send("t", 1, None, b"y") == 0
        assert len(list(log.read(("t", 0)))) == 1
    finally:
        child.communicate("\n", timeout=30)
    assert SegmentLog(tmp_path).producer().send("t", 0, None, b"z") == 1


_ZOMBIE = textwrap.dedent(
    """
    import sys
    from statestore import SegmentLog, ProducerFencedError
    log = SegmentLog(sys.argv[1])
    p = log.producer("shared-id")
    p.begin()
    p.send("t", 0, b"k", b"zombie")
    log.close()  # lets go of the partition; the producer object lives on
    print("ready", flush=True)
    sys.stdin.readline()
    for call in (lambda: p.send("t", 0, b"k", b"late"), p.commit):
        try:
            call()
            print("accepted", flush=True)
        except ProducerFencedError:
            print("fenced", flush=True)
    """
)


def test_zombie_in_another_process_is_fenced(tmp_path: Path) -> None:
    child = start_child(_ZOMBIE, str(tmp_path))
    log = SegmentLog(tmp_path)
    fresh = log.producer("shared-id")
    out, _ = child.communicate("\n", timeout=30)
    assert out.split() == ["fenced", "fenced"]
    assert log.offsets(TP._replace(topic="t")) == (0, 2, 2)
    fresh.begin()
    fresh.send("t", 0, b"k", b"fresh")
    fresh.commit()
    assert values(list(log.read(("t", 0)))) == [b"fresh"]


_APPENDER = textwrap.dedent(
    """
    import sys
    from statestore import SegmentLog
    log = SegmentLog(sys.argv[1], segment_bytes=8192)
    part = int(sys.argv[2])
    p = log.producer("writer-%d" % part)
    for t in range(25):
        p.begin()
        for i in range(10):
            p.send("shared", part, b"%d" % t, b"%d:%d" % (t, i))
        p.commit()
    """
)


def test_processes_append_to_different_partitions_while_readers_read(tmp_path: Path) -> None:
    children = [
        subprocess.Popen([sys.executable, "-c", _APPENDER, str(tmp_path), str(part)], stderr=subprocess.PIPE)
        for part in range(3)
    ]
    log = SegmentLog(tmp_path)

    def committed_prefix_is_whole(part: int) -> int:
        got = [r.value for r in log.read(("shared", part))]
        assert len(got) % 10 == 0, "read_committed never shows part of a transaction"
        assert got == [b"%d:%d" % (t, i) for t in range(len(got) // 10) for i in range(10)]
        return len(got)

    while any(c.poll() is None for c in children):
        for part in range(3):
            if (tmp_path / f"shared-{part}").exists():
                committed_prefix_is_whole(part)
    for c in children:
        _, err = c.communicate(timeout=60)
        assert c.returncode == 0, err.decode()
    assert [committed_prefix_is_whole(p) for p in range(3)] == [250, 250, 250]
    ids = {log.producer(f"writer-{p}").producer_id for p in range(3)}
    assert len(ids) == 3, "each transactional id got its own producer id"
