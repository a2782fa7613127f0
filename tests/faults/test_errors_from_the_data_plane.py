"""Every class of ``statestore.errors`` the Rust data plane raises, raised for real, with its fields.

``rust/src/py/errors.rs`` is the one place where data-plane errors become
exceptions; it promises the class that says what to do and the fields that
say what the error is about (``path``, ``topic``/``partition``, ``offset``),
so tools never parse messages. Each case here provokes one class through a
public call and checks both.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from statestore import (
    CorruptLogError,
    LogError,
    ProducerFencedError,
    RestoreError,
    SegmentLog,
    StoreError,
    TaskCorruptedError,
    TopicPartition,
    TransactionStateError,
    _native,
    restore_store,
)
from statestore._native import _testing
from statestore.errors import UnsupportedCompressionError

TP = TopicPartition("app-s-changelog", 0)


def _log_with(tmp_path: Path, n: int) -> SegmentLog:
    log = SegmentLog(tmp_path / "log", sync=False)
    p = log.producer()
    for i in range(n):
        p.send(TP.topic, TP.partition, b"k%d" % i, b"v")
    p.flush()
    return log


def _segment(log: SegmentLog) -> Path:
    return next((log.log_dir / str(TP)).glob("*.log"))


def test_log_error_names_the_missing_directory(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(LogError) as ei:
        restore_store(tmp_path / "s", missing, TP)
    e = ei.value
    assert type(e) is LogError
    assert e.topic == TP.topic and e.partition == TP.partition
    assert str(missing) in str(e)


def test_corrupt_log_error_carries_segment_and_offset(tmp_path: Path) -> None:
    log = _log_with(tmp_path, 10)
    log.close()
    seg = _segment(log)
    data = bytearray(seg.read_bytes())
    data[-3] ^= 0xFF  # inside the only batch: its CRC no longer matches
    seg.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError) as ei:
        list(log.read(TP))
    assert ei.value.path == str(seg) and ei.value.offset == 0
    # Through the restore engine the same facts arrive, plus the partition restored.
    with pytest.raises(CorruptLogError) as ei:
        restore_store(tmp_path / "s", log, TP)
    e = ei.value
    assert (e.path, e.offset, e.topic, e.partition) == (str(seg), 0, TP.topic, TP.partition)


def test_unsupported_compression_carries_segment_and_offset(tmp_path: Path) -> None:
    log = _log_with(tmp_path, 1)
    log.close()
    seg = _segment(log)
    data = bytearray(seg.read_bytes())
    data[22] |= 0x05  # attributes: codec 5 does not exist
    from kafka.record.util import calc_crc32c

    data[17:21] = calc_crc32c(bytes(data[21:])).to_bytes(4, "big")
    seg.write_bytes(bytes(data))
    with pytest.raises(UnsupportedCompressionError) as ei:
        list(log.read(TP))
    assert ei.value.path == str(seg) and ei.value.offset == 0


def test_lock_error_names_the_partition_directory(tmp_path: Path) -> None:
    a = _log_with(tmp_path, 1)  # holds the partition's writer lock; another process must fail to take it
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\nfrom statestore import SegmentLog, LockError\n"
            "try:\n    SegmentLog(sys.argv[1]).recover(sys.argv[2])\nexcept LockError as e:\n"
            "    print('LOCK', e.path)\n",
            str(tmp_path / "log"),
            str(TP),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.stdout.startswith("LOCK "), child.stdout + child.stderr
    locked = Path(child.stdout.split(" ", 1)[1].strip())
    assert locked.parent == tmp_path / "log" / str(TP), child.stdout
    a.close()


def test_producer_fenced_and_transaction_state_errors(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path / "log", sync=False)
    old = log.producer("app-1")
    old.begin()
    log.producer("app-1")  # a newer producer of the id fences the old one
    with pytest.raises(ProducerFencedError) as fenced:
        old.send(TP.topic, TP.partition, b"k", b"v")
    # the file that records the newer epoch, inside the log directory
    assert fenced.value.path is not None and Path(fenced.value.path).parent == tmp_path / "log"
    assert Path(fenced.value.path).is_file() and '"app-1"' in str(fenced.value)
    fresh = log.producer("app-2")
    with pytest.raises(TransactionStateError) as state:
        fresh.commit()  # commit without begin
    assert state.value.path == str(tmp_path / "log") and '"app-2"' in str(state.value)


def test_store_error_names_the_store(tmp_path: Path) -> None:
    garbage = tmp_path / "not-a-store"
    garbage.mkdir()
    (garbage / "CURRENT").write_text("MANIFEST-nope\n")
    with pytest.raises(StoreError) as ei:
        _native.store_info(garbage)
    assert ei.value.path == str(garbage)


def test_restore_error_carries_store_and_partition(tmp_path: Path) -> None:
    log = _log_with(tmp_path, 5)
    with pytest.raises(RestoreError) as ei:
        restore_store(tmp_path / "s", log, TP, end_offset=99)  # beyond the last stable offset
    e = ei.value
    assert type(e) is RestoreError
    assert (e.path, e.topic, e.partition) == (str(tmp_path / "s"), TP.topic, TP.partition)


def test_task_corrupted_error_carries_the_recorded_offset(tmp_path: Path) -> None:
    log = _log_with(tmp_path, 5)
    store = tmp_path / "s"
    _testing.store_write_batch(store, [(b"k", b"v")], {str(TP): 1000})  # ahead of the log's end (5)
    with pytest.raises(TaskCorruptedError) as ei:
        restore_store(store, log, TP)
    e = ei.value
    assert (e.path, e.topic, e.partition, e.offset) == (str(store), TP.topic, TP.partition, 1000)
