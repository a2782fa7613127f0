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
import os
import subprocess
import sys
from pathlib import Path

import pytest

from statestore import OFFSET_UNKNOWN, SegmentLog, TaskId
from statestore._native import _testing
from statestore.ids import SENTINEL_OFFSETS, committed_offset
from statestore.ops.inspection import inspect_app
from statestore.ops.verify import verify_app
from statestore.state.store import STATUS_CLOSED
from support.model import store_contents
from support.tasks import STORE, changelog_tp, close_all, manager

APP = "app"
T = TaskId(0, 0)
TP = changelog_tp(T)
RECORDS = [(b"k%d" % i, b"v%d" % i) for i in range(10)]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "statestore.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "250"},
    )


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
    assert "no offset yet" in out.stdout and "-4" not in out.stdout
    doc = json.loads(
        _cli("inspect", "--state-dir", str(root / "state"), "--app-id", APP, "--json", "--quick").stdout
    )
    assert doc["stores"][0]["store_offset"] is None
    assert doc["stores"][0]["offset_note"] == "no offset yet"


def test_inspect_reads_a_checkpoint_sentinel_the_same_way(root: Path) -> None:
    from statestore import OffsetCheckpoint

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
