"""Kafka Streams' sentinel offsets on disk read as what they mean.

Kafka Streams 4.3+ records ``OFFSET_UNKNOWN`` (-4) in a store's ``offsets``
column family (and every version in the task's ``.checkpoint``) while the
store's task has committed no changelog record. It means "no offset yet": the
store is trusted and restored from its changelog's start. ``inspect``,
``verify``, ``restore`` and the task manager must read it so, never as an
offset, a mismatch or corruption.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from statestore import OFFSET_UNKNOWN, OffsetCheckpoint, SegmentLog, TaskId, TopicPartition, restore_store
from statestore._native import _testing
from statestore.ids import SENTINEL_OFFSETS, committed_offset
from statestore.ops.inspection import inspect_app
from statestore.ops.verify import verify_app
from statestore.restore.staging import restore_partition
from statestore.state.store import STATUS_CLOSED
from support.cli import run_cli as _cli
from support.model import store_contents
from support.tasks import STORE, changelog_tp, close_all, manager

APP = "app"
T = TaskId(0, 0)
TP = changelog_tp(T)
RECORDS = [(b"k%d" % i, b"v%d" % i) for i in range(10)]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A committed changelog of 10 records for task 0_0's store, and that store recording -4."""
    log = SegmentLog(tmp_path / "log")
    producer = log.producer("writer")
    producer.begin()
    for key, value in RECORDS:
        producer.send(TP.topic, TP.partition, key, value)
    producer.commit()
    producer.close()
    log.close()
    return tmp_path


def store_path(root: Path) -> Path:
    return root / "state" / APP / str(T) / "rocksdb" / STORE


def leave_no_offset_yet(root: Path, items: list[tuple[bytes, bytes | None]]) -> Path:
    """The store as Kafka Streams leaves it before its task committed: ``items`` and offset -4, CLOSED."""
    path = store_path(root)
    path.parent.mkdir(parents=True)
    _testing.store_write_batch(path, items, {str(TP): OFFSET_UNKNOWN}, status=STATUS_CLOSED)
    return path


def test_the_one_sentinel_kafka_streams_writes_means_no_offset() -> None:
    assert SENTINEL_OFFSETS == {-4: "no offset yet"}
    assert committed_offset(OFFSET_UNKNOWN) is None
    assert committed_offset(None) is None
    assert committed_offset(0) == 0 and committed_offset(41) == 41


@pytest.mark.parametrize("items", [[], [(b"k0", b"v0")]], ids=["empty", "holding-data"])
def test_verify_reports_no_offset_yet_not_a_mismatch(
    root: Path, items: list[tuple[bytes, bytes | None]]
) -> None:
    leave_no_offset_yet(root, items)
    [result] = verify_app(root / "state", APP, root / "log")
    assert result.offset is None and result.offset_note == "no offset yet"
    assert result.ok and result.problem is None
    assert result.actual_entries == len(items)
    out = _cli("verify", "--state-dir", str(root / "state"), "--app-id", APP, "--log-dir", str(root / "log"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no offset yet" in out.stdout and "MISMATCH" not in out.stdout
    assert "claims offset -4" not in out.stderr


def test_inspect_shows_no_offset_yet_and_the_whole_changelog_as_lag(root: Path) -> None:
    leave_no_offset_yet(root, [])
    _, [report] = inspect_app(root / "state", APP, root / "log")
    assert report.store_offset is None and report.offset_note == "no offset yet"
    assert report.lag == len(RECORDS), "a restore applies every committed record, from the start"
    assert report.problem is None
    out = _cli("inspect", "--state-dir", str(root / "state"), "--app-id", APP, "--log-dir", str(root / "log"))
    assert out.returncode == 0, out.stderr
    # -4 as a value of its own, not inside the state directory's path (pytest-4xx)
    assert "no offset yet" in out.stdout and not re.search(r"(?<![\w/.-])-4\b", out.stdout), out.stdout
    doc = json.loads(
        _cli("inspect", "--state-dir", str(root / "state"), "--app-id", APP, "--json", "--quick").stdout
    )
    assert doc["stores"][0]["store_offset"] is None
    assert doc["stores"][0]["offset_note"] == "no offset yet"


def test_inspect_reads_a_checkpoint_sentinel_the_same_way(root: Path) -> None:
    leave_no_offset_yet(root, [])
    OffsetCheckpoint(store_path(root).parent.parent / ".checkpoint").write({TP: OFFSET_UNKNOWN})
    _, [report] = inspect_app(root / "state", APP, root / "log")
    assert report.checkpoint_offset is None and report.checkpoint_note == "no offset yet"
    assert report.lag == len(RECORDS)


@pytest.mark.parametrize("guarantee", ["exactly_once_v2", "at_least_once"])
def test_restore_starts_from_the_changelog_s_start(root: Path, guarantee: str) -> None:
    path = leave_no_offset_yet(root, [])
    out = _cli(
        "restore",
        "--log-dir",
        str(root / "log"),
        "--state-dir",
        str(root / "state"),
        "--app-id",
        APP,
        "--store",
        STORE,
        "--guarantee",
        guarantee,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    contents = store_contents(path)
    assert contents.data == dict(RECORDS)
    assert contents.offsets == {str(TP): len(RECORDS) - 1}


@pytest.mark.parametrize("mode", ["replay", "bulk"])
def test_restore_store_called_directly_starts_from_the_changelog_s_start(root: Path, mode: str) -> None:
    path = leave_no_offset_yet(root, [])
    r = restore_store(path, SegmentLog(root / "log"), TP, mode=mode)
    assert (r.start_offset, r.records_applied) == (0, len(RECORDS))
    contents = store_contents(path)
    assert contents.data == dict(RECORDS)
    assert contents.offsets == {str(TP): len(RECORDS) - 1}


def test_the_task_manager_trusts_the_store_and_restores_it_from_the_start(root: Path) -> None:
    """Under exactly_once_v2 a store holding data without an offset is wiped; with -4 it is not."""
    path = leave_no_offset_yet(root, [(b"local-only", b"x")])
    tm = manager(root, "exactly_once_v2")
    tm.start()
    tm.assign([T], [])
    assert tm.restore()
    view = dict(tm.active_task(T).store(STORE))
    assert view == {**dict(RECORDS), b"local-only": b"x"}, "replayed from offset 0 over the store, not wiped"
    assert tm.active_task(T).offsets() == {TP: len(RECORDS) - 1}
    close_all(tm)
    assert store_contents(path).offsets == {str(TP): len(RECORDS) - 1}


@pytest.mark.parametrize(("version", "layout"), [("4.4", "store"), ("4.2", "checkpoint")])
def test_a_store_restored_from_no_committed_record_records_no_offset_yet(
    tmp_path: Path, version: str, layout: str
) -> None:
    """Else Kafka Streams, under exactly_once_v2, takes a store without any offset in a task directory
    that is not empty for corruption and wipes the task."""
    log = SegmentLog(tmp_path / "log")
    producer = log.producer("writer")
    producer.begin()
    producer.send(TP.topic, 1, b"k", b"aborted")  # partition 1 holds no committed record
    producer.abort()
    producer.begin()
    producer.send(TP.topic, 0, b"k", b"v")
    producer.commit()
    producer.close()
    log.close()
    args = ["--log-dir", str(tmp_path / "log"), "--state-dir", str(tmp_path / "state"), "--app-id", APP]
    out = _cli("restore", *args, "--store", STORE, "--kafka-streams-version", version)
    assert out.returncode == 0, out.stdout + out.stderr
    empty = tmp_path / "state" / APP / "0_1" / "rocksdb" / STORE
    ckpt = OffsetCheckpoint(empty.parent.parent / ".checkpoint")
    if layout == "store":
        contents = store_contents(empty)
        assert contents.data == {} and contents.offsets == {f"{TP.topic}-1": OFFSET_UNKNOWN}
        assert contents.status == STATUS_CLOSED and not ckpt.exists()
    else:
        assert ckpt.read() == {TopicPartition(TP.topic, 1): OFFSET_UNKNOWN}
        assert store_contents(empty).offsets == {}
    # the Spark task's way (a staged restore swapped into place) records it too
    row = restore_partition(
        log_dir=tmp_path / "log",
        state_dir=tmp_path / "staged",
        application_id=APP,
        store=STORE,
        partition=1,
        layout="kip-1035" if layout == "store" else "checkpoint",
    )
    assert row.ok, row.error
    staged = tmp_path / "staged" / APP / "0_1" / "rocksdb" / STORE
    if layout == "store":
        assert store_contents(staged).offsets == {f"{TP.topic}-1": OFFSET_UNKNOWN}
    else:
        assert OffsetCheckpoint(staged.parent.parent / ".checkpoint").read() == {
            TopicPartition(TP.topic, 1): OFFSET_UNKNOWN
        }
    [result] = [
        r for r in verify_app(tmp_path / "state", APP, tmp_path / "log") if r.store.task_id == TaskId(0, 1)
    ]
    assert result.ok and result.offset_note == "no offset yet"
