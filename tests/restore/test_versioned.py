"""Versioned key-value stores restored through the Python API and ``statestore restore``.

The changelog is a segment log of a versioned store's records (raw key, raw
value or tombstone, the version's timestamp as the record timestamp). What
Kafka Streams' put logic makes of them is checked against Kafka Streams
itself in ``tests/interop/test_kafka_streams_versioned.py`` and rule by rule
in the Rust unit tests (``rust/src/versioned/``); here: the store's rows
follow the layout (latest values under segment -1, older versions under
their validTo's segment), a versioned store is always replayed, its history
retention is required, the CLI writes it with ``--retention`` (locally and on
Spark, never for the ``.checkpoint`` layout), and ``verify`` rebuilds it.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from statestore import OffsetCheckpoint, TopicPartition, _native
from statestore.changelog.segment_log import SegmentLog
from statestore.errors import StateStoreError
from statestore.ops.inspection import inspect_app, local_stores, versioned_by_changelog
from statestore.restore.engine import RestoreSpec, restore_many, restore_store
from statestore.state.layout import CHECKPOINT, store_layout, table_format_versions
from support.cli import restore_args
from support.cli import run_cli as cli
from support.model import store_contents

APP = "shop"
STORE = "prices"
TOPIC = f"{APP}-{STORE}-changelog"
HISTORY = 60_000  # Kafka's default segment interval for it: 20 s
INTERVAL = 20_000
BASE = 1_700_000_000_000
LATEST = b"\xff" * 8


@pytest.fixture
def log_root(tmp_path: Path) -> Path:
    """A changelog of two partitions: key ``a`` versions at BASE, +5 s, +30 s, one out of order at
    +10 s and a tombstone at +50 s; key ``b`` one version at +40 s."""
    log = SegmentLog(tmp_path / "log", sync=False)
    producer = log.producer("writer")
    producer.begin()
    for p in (0, 1):
        for key, value, dt in [
            (b"a", b"1", 0),
            (b"a", b"2", 5_000),
            (b"a", b"4", 30_000),
            (b"a", b"3", 10_000),
            (b"b", b"x", 40_000),
            (b"a", None, 50_000),
        ]:
            producer.send(TOPIC, p, key, value, timestamp=BASE + dt)
    producer.commit()
    producer.close()
    log.close()
    return tmp_path


def segment(ts: int) -> bytes:
    return struct.pack(">q", ts // INTERVAL)


def segment_value(next_ts: int, versions: list[tuple[int, bytes | None]]) -> bytes:
    """Kafka's segment value: next_ts, min_ts, (ts, size) newest first, values oldest first."""
    table = b"".join(struct.pack(">qi", ts, -1 if v is None else len(v)) for ts, v in versions)
    values = b"".join(v for _, v in reversed(versions) if v is not None)
    return struct.pack(">qq", next_ts, versions[-1][0]) + table + values


def expected_rows() -> dict[bytes, bytes]:
    """What Kafka Streams' put logic leaves for the fixture's records."""
    t = BASE
    return {
        # a: 1 [t, t+5s) and 2 [t+5s, t+10s) in the segment of t+5s and t+10s; 3 [t+10s, t+30s) and
        # 4 [t+30s, t+50s) in the segments of their ends; the tombstone at t+50s left no latest value
        segment(t + 5_000) + b"a": segment_value(t + 10_000, [(t + 5_000, b"2"), (t, b"1")]),
        segment(t + 30_000) + b"a": segment_value(t + 30_000, [(t + 10_000, b"3")]),
        segment(t + 50_000) + b"a": segment_value(t + 50_000, [(t + 30_000, b"4")]),
        LATEST + b"b": struct.pack(">q", t + 40_000) + b"x",
    }


def test_a_versioned_store_is_replayed_through_kafka_s_put_logic(log_root: Path) -> None:
    path = log_root / "s0"
    r = restore_store(
        path,
        log_root / "log",
        TopicPartition(TOPIC, 0),
        format="versioned",
        retention_ms=HISTORY,
        mode="bulk",
    )
    assert r.mode == "replay", "bulk asked: a versioned store is replayed"
    assert r.records_applied == 6 and r.offset == 5
    c = store_contents(path)
    assert c.data == expected_rows()
    assert c.offsets == {f"{TOPIC}-0": 5}
    assert _native.store_info(path).status == _native.STATUS_CLOSED
    assert _native.store_format(path) == "plain", "its bytes look like a plain store's"


def test_restore_many_and_a_history_retention_is_required(log_root: Path) -> None:
    specs = [
        RestoreSpec(
            log_root / f"s{p}",
            log_root / "log",
            TopicPartition(TOPIC, p),
            format="versioned",
            retention_ms=HISTORY,
            segment_interval_ms=INTERVAL,
        )
        for p in (0, 1)
    ]
    results = restore_many(specs, threads=2)
    assert all(r.ok for r in results), results
    for p in (0, 1):
        assert store_contents(log_root / f"s{p}").data == expected_rows()
    with pytest.raises(StateStoreError, match="versioned store needs its history retention"):
        restore_store(log_root / "s9", log_root / "log", TopicPartition(TOPIC, 0), format="versioned")
    assert not (log_root / "s9").exists()


def test_statestore_restore_writes_a_versioned_store_with_its_history_retention(log_root: Path) -> None:
    flags = ["--store", STORE, "--store-format", f"{STORE}=versioned"]
    out = cli(*restore_args(log_root, APP, *flags))
    assert out.returncode == 1, out.stdout + out.stderr
    assert (
        f"not restored: store {STORE} (sub-topology 0): it is a versioned store, whose history retention"
        in (out.stdout)
    )
    assert not any((log_root / "state").glob(f"{APP}/*/rocksdb/{STORE}")), "never opened for writing"

    out = cli(*restore_args(log_root, APP, *flags, "--retention", f"{STORE}={HISTORY}"))
    assert out.returncode == 0, out.stdout + out.stderr
    for p in (0, 1):
        c = store_contents(log_root / "state" / APP / f"0_{p}" / "rocksdb" / STORE)
        assert c.data == expected_rows()
        assert c.offsets == {f"{TOPIC}-{p}": 5}


def test_statestore_restore_writes_a_versioned_store_for_the_checkpoint_layout(log_root: Path) -> None:
    """For Kafka Streams 4.2: the same rows, no offsets family, table files of format_version 5 at
    most, the offset in each task's ``.checkpoint``."""
    flags = ["--store", STORE, "--store-format", f"{STORE}=versioned", "--retention", f"{STORE}={HISTORY}"]
    out = cli(*restore_args(log_root, APP, *flags, "--kafka-streams-version", "4.2"))
    assert out.returncode == 0, out.stdout + out.stderr
    for p in (0, 1):
        task = log_root / "state" / APP / f"0_{p}"
        path = task / "rocksdb" / STORE
        assert store_contents(path).data == expected_rows()
        assert store_layout(path) is CHECKPOINT and table_format_versions(path) <= {5}
        assert OffsetCheckpoint(task / ".checkpoint").read() == {TopicPartition(TOPIC, p): 5}


def test_statestore_verify_rebuilds_a_versioned_store_by_its_put_logic(log_root: Path) -> None:
    flags = ["--store", STORE, "--store-format", f"{STORE}=versioned", "--retention", f"{STORE}={HISTORY}"]
    assert cli(*restore_args(log_root, APP, *flags)).returncode == 0
    verify = [
        "verify",
        "--state-dir",
        str(log_root / "state"),
        "--app-id",
        APP,
        "--log-dir",
        str(log_root / "log"),
    ]
    out = cli(*verify, *flags[2:])
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("exact") == 2 and "versioned" in out.stdout, out.stdout
    # its bytes look like a plain store's: taken for one, it is no such store
    out = cli(*verify)
    assert out.returncode == 1 and "MISMATCH" in out.stdout, out.stdout
    out = cli(*verify, "--store-format", f"{STORE}=versioned")
    assert out.returncode == 1 and f"give its history retention to verify it (--retention {STORE}=MS)" in (
        out.stdout + out.stderr
    )


def test_inspect_reports_a_versioned_store_its_format_or_changelog_names(log_root: Path) -> None:
    flags = ["--store", STORE, "--store-format", f"{STORE}=versioned", "--retention", f"{STORE}={HISTORY}"]
    assert cli(*restore_args(log_root, APP, *flags)).returncode == 0
    state = log_root / "state"

    _, reports = inspect_app(state, APP)
    assert {(r.format, r.kind) for r in reports} == {("plain", "key-value")}, "its bytes are a plain store's"
    _, reports = inspect_app(state, APP, formats={STORE: "versioned"})
    assert {(r.format, r.kind) for r in reports} == {("versioned", "versioned")}

    class Changelog:
        """A changelog whose topic configs say what a Kafka changelog of a versioned store says."""

        def topic_configs(self, topics: list[str]) -> dict[str, dict[str, str]]:
            lag = str(HISTORY + 86_400_000)
            return {t: {"cleanup.policy": "compact", "min.compaction.lag.ms": lag} for t in topics}

    assert versioned_by_changelog(Changelog(), local_stores(state, APP)) == {STORE: HISTORY}
    assert versioned_by_changelog(None, local_stores(state, APP)) == {}

    out = cli("inspect", "--state-dir", str(state), "--app-id", APP, "--store-format", f"{STORE}=versioned")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("versioned") >= 2, out.stdout


@pytest.mark.spark
def test_the_spark_engine_writes_a_versioned_store_with_its_history_retention(log_root: Path) -> None:
    pytest.importorskip("pyspark")
    flags = ["--store", STORE, "--store-format", f"{STORE}=versioned", "--retention", f"{STORE}={HISTORY}"]
    out = cli(*restore_args(log_root, APP, "--engine", "spark", "--master", "local[2]", *flags), timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 ok, 0 failed, 0 stores not restored" in out.stdout
    for p in (0, 1):
        c = store_contents(log_root / "state" / APP / f"0_{p}" / "rocksdb" / STORE)
        assert (c.data, c.offsets) == (expected_rows(), {f"{TOPIC}-{p}": 5})
