"""The layout each Kafka Streams version reads: offsets in the store (4.3+) or in the task's .checkpoint (3.6 - 4.2).

``restore --kafka-streams-version 3.9`` writes stores Kafka Streams 3.6 - 4.2
open: no ``offsets`` column family, every table file at ``format_version`` 5
(rocksdbjni 7.9 reads no newer), the offsets in each task's ``.checkpoint``
(Kafka's version 0 text format); ``inspect`` and ``verify`` read both layouts.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from rocksdict import Rdict

from statestore import OffsetCheckpoint, SegmentLog, TopicPartition
from statestore.ops.inspection import inspect_app
from statestore.ops.verify import verify_app
from statestore.restore.spark import restore_on_spark
from statestore.restore.staging import restore_partition
from statestore.state.layout import (
    CHECKPOINT,
    KIP_1035,
    VERSION_NAMES,
    layout_for,
    store_layout,
    table_format_versions,
)
from support.cli import run_cli
from support.model import store_contents

APP = "shop"
STORES = {"latest": "plain", "counts": "timestamped"}


def topic(store: str) -> str:
    return f"{APP}-{store}-changelog"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=180)


def produce(log_dir: Path, n: int, first: int = 0) -> None:
    log = SegmentLog(log_dir)
    producer = log.producer("writer")
    producer.begin()
    for store in STORES:
        for i in range(first, first + n):
            producer.send(topic(store), i % 2, b"k%d" % (i % 50), b"%d" % i)
    producer.commit()
    producer.close()
    log.close()


def restore(root: Path, state: str, *extra: str) -> subprocess.CompletedProcess[str]:
    formats = [a for name, fmt in STORES.items() for a in ("--store-format", f"{name}={fmt}")]
    return cli(
        "restore",
        "--log-dir",
        str(root / "log"),
        "--state-dir",
        str(root / state),
        "--app-id",
        APP,
        *formats,
        *extra,
    )


LAYOUTS = [("3.6", CHECKPOINT), ("3.9.1", CHECKPOINT), ("4.0", CHECKPOINT), ("4.2.0", CHECKPOINT)]


@pytest.mark.parametrize(("version", "layout"), [*LAYOUTS, ("4.3", KIP_1035), ("4.4.0", KIP_1035)])
def test_one_table_maps_each_version_to_its_layout(version: str, layout: object) -> None:
    assert layout_for(version) is layout


@pytest.mark.parametrize("version", ["3.5", "4.5", "2.8.1", "four", "4"])
def test_a_version_outside_the_table_is_refused_naming_the_range(version: str) -> None:
    with pytest.raises(ValueError, match=r"use one of 3\.6 - 4\.4"):
        layout_for(version)
    assert VERSION_NAMES == ("3.6", "3.7", "3.8", "3.9", "4.0", "4.1", "4.2", "4.3", "4.4")


def test_restore_for_kafka_streams_3_9_writes_the_checkpoint_layout(tmp_path: Path) -> None:
    produce(tmp_path / "log", 200)
    out = restore(tmp_path, "legacy", "--kafka-streams-version", "3.9")
    assert out.returncode == 0, out.stdout + out.stderr
    assert restore(tmp_path, "current").returncode == 0
    for p in (0, 1):
        task = tmp_path / "legacy" / APP / f"0_{p}"
        # Kafka's version 0 text format, entries sorted: counts before latest; 100 records -> offset 99.
        assert (task / ".checkpoint").read_bytes() == (
            f"0\n2\n{topic('counts')} {p} 99\n{topic('latest')} {p} 99\n".encode()
        )
        for store, fmt in STORES.items():
            path = task / "rocksdb" / store
            families = ["default"] + (["keyValueWithTimestamp"] if fmt == "timestamped" else [])
            assert sorted(Rdict.list_cf(str(path))) == sorted(families), "no offsets column family"
            assert table_format_versions(path) == {5}
            assert store_layout(path) is CHECKPOINT
            current = tmp_path / "current" / APP / f"0_{p}" / "rocksdb" / store
            assert table_format_versions(current) == {6} and store_layout(current) is KIP_1035
            assert store_contents(path).data == store_contents(current).data
            assert store_contents(path).offsets == {}


def test_inspect_and_verify_read_the_checkpoint_layout(tmp_path: Path) -> None:
    produce(tmp_path / "log", 200)
    assert restore(tmp_path, "state", "--kafka-streams-version", "4.2").returncode == 0
    _, reports = inspect_app(tmp_path / "state", APP, tmp_path / "log")
    assert len(reports) == 4
    for r in reports:
        assert r.layout == "checkpoint" and r.problem is None
        assert r.store_offset is None and r.checkpoint_offset == 99 and r.lag == 0
    results = verify_app(tmp_path / "state", APP, tmp_path / "log")
    assert [r.ok for r in results] == [True] * 4 and {r.offset for r in results} == {99}
    out = cli(
        "verify", "--state-dir", str(tmp_path / "state"), "--app-id", APP, "--log-dir", str(tmp_path / "log")
    )
    assert out.returncode == 0 and out.stdout.count("exact") == 4, out.stdout + out.stderr
    doc = json.loads(cli("inspect", "--state-dir", str(tmp_path / "state"), "--app-id", APP, "--json").stdout)
    assert {s["layout"] for s in doc["stores"]} == {"checkpoint"}


def test_a_second_restore_in_the_checkpoint_layout_catches_up(tmp_path: Path) -> None:
    produce(tmp_path / "log", 200)
    for guarantee in ("exactly_once_v2", "at_least_once"):
        assert (
            restore(
                tmp_path, guarantee, "--kafka-streams-version", "3.6", "--guarantee", guarantee
            ).returncode
            == 0
        )
    produce(tmp_path / "log", 60, first=200)
    for guarantee in ("exactly_once_v2", "at_least_once"):
        out = restore(tmp_path, guarantee, "--kafka-streams-version", "3.6", "--guarantee", guarantee)
        assert out.returncode == 0, out.stdout + out.stderr
        results = verify_app(tmp_path / guarantee, APP, tmp_path / "log")
        # 100 + 30 records per partition and a commit marker between: the last record is at offset 130.
        assert [(r.ok, r.offset) for r in results] == [(True, 130)] * 4
        assert all(store_layout(r.store.path) is CHECKPOINT for r in results)


def test_a_staged_restore_records_the_checkpoint_after_the_swap(tmp_path: Path) -> None:
    """What every Spark task does: restore in a staging directory, convert, swap, record the offset."""
    produce(tmp_path / "log", 200)
    state = tmp_path / "state"
    checkpoint = state / APP / "0_1" / ".checkpoint"

    def staged(store: str) -> None:
        row = restore_partition(
            log_dir=tmp_path / "log",
            state_dir=state,
            application_id=APP,
            store=store,
            partition=1,
            format=STORES[store],
            layout="checkpoint",
        )
        assert row.ok, row.error

    staged("latest")
    assert OffsetCheckpoint(checkpoint).read() == {TopicPartition(topic("latest"), 1): 99}
    staged("counts")
    produce(tmp_path / "log", 20, first=200)
    staged("latest")  # again, after the changelog grew: the other store's entry stays
    assert OffsetCheckpoint(checkpoint).read() == {
        TopicPartition(topic("counts"), 1): 99,
        TopicPartition(topic("latest"), 1): 110,
    }
    for store in STORES:
        path = state / APP / "0_1" / "rocksdb" / store
        assert store_layout(path) is CHECKPOINT and table_format_versions(path) == {5}
    assert [r.ok for r in verify_app(state, APP, tmp_path / "log")] == [True, True]


@pytest.mark.spark
def test_restore_on_spark_writes_the_checkpoint_layout(spark: Any, tmp_path: Path) -> None:
    produce(tmp_path / "log", 200)
    rows = restore_on_spark(
        spark,
        log_dir=tmp_path / "log",
        state_dir=tmp_path / "state",
        application_id=APP,
        stores=list(STORES),
        formats=STORES,
        kafka_streams_version="3.9",
    ).collect()
    assert [r.status for r in rows] == ["ok"] * 4
    for p in (0, 1):
        assert (tmp_path / "state" / APP / f"0_{p}" / ".checkpoint").read_bytes() == (
            f"0\n2\n{topic('counts')} {p} 99\n{topic('latest')} {p} 99\n".encode()
        )
    assert all(
        store_layout(r.store.path) is CHECKPOINT
        for r in verify_app(tmp_path / "state", APP, tmp_path / "log")
    )
