"""Lag is counted in records a restore would apply, not in offsets (architecture: "end offset").

Aborted records and transaction markers occupy offsets; a store that holds
every committed record has no lag even when they follow its offset.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from statestore import SegmentLog, TopicPartition, restore_store
from statestore.ops.inspection import inspect_app
from statestore.state.lag import store_lag

APP = "lag-app"
STORE = "counts"
TOPIC = f"{APP}-{STORE}-changelog"
TP = TopicPartition(TOPIC, 0)


def committed_after(log: SegmentLog, offset: int | None) -> int:
    """The reference: records a read_committed reader yields past ``offset``."""
    return sum(1 for _ in log.read(TP, None if offset is None else offset + 1))


@pytest.fixture
def log(tmp_path: Path) -> SegmentLog:
    """A partition of committed, aborted and committed transactions, then an aborted tail."""
    seg = SegmentLog(tmp_path / "log")
    p = seg.producer("writer")
    for round_ in range(3):
        p.begin()
        for i in range(100):
            p.send(TOPIC, 0, b"k%03d" % (i % 30), b"v%d-%d" % (round_, i))
        p.commit()
        p.begin()
        for i in range(40):
            p.send(TOPIC, 0, b"k%03d" % i, b"ABORTED")
        p.abort()
    p.close()
    return seg


def test_an_up_to_date_store_has_no_lag_though_offsets_follow_it(log: SegmentLog, tmp_path: Path) -> None:
    store = tmp_path / "state" / APP / "0_0" / "rocksdb" / STORE
    store.parent.mkdir(parents=True)
    result = restore_store(store, log, TP)
    lag = store_lag(log, TP, result.offset)
    assert lag.records == 0
    assert (
        lag.offsets == lag.log_end - (result.offset + 1) == 42
    )  # a commit marker, 40 aborted records and their marker
    _holder, reports = inspect_app(tmp_path / "state", APP, changelog=log)
    assert [(r.lag, r.offset_lag) for r in reports] == [(0, 42)]


@pytest.mark.parametrize("offset", [None, -4, 0, 57, 100, 101, 140, 141, 250])
def test_lag_is_the_committed_records_past_the_offset(log: SegmentLog, offset: int | None) -> None:
    lag = store_lag(log, TP, offset)
    known = offset if offset is not None and offset >= 0 else None
    assert lag.records == committed_after(log, known)
    assert lag.offsets == max(0, lag.log_end - (0 if known is None else known + 1))


def test_an_open_transaction_is_not_lag(log: SegmentLog) -> None:
    before = store_lag(log, TP, None).records
    p = log.producer("open-writer")
    p.begin()
    for i in range(25):
        p.send(TOPIC, 0, b"open%d" % i, b"x")
    p.flush()
    lag = store_lag(log, TP, None)
    assert lag.records == before == 300
    assert lag.offsets == lag.log_end
    p.commit()
    p.close()
    assert store_lag(log, TP, None).records == 325


def test_an_unreadable_store_shows_unknown_lag(log: SegmentLog, tmp_path: Path) -> None:
    store = tmp_path / "state" / APP / "0_0" / "rocksdb" / STORE
    store.parent.mkdir(parents=True)
    restore_store(store, log, TP)
    for f in store.iterdir():
        if f.name.startswith("MANIFEST") or f.name == "CURRENT":
            f.write_bytes(b"garbage")
    _holder, reports = inspect_app(tmp_path / "state", APP, changelog=log)
    (r,) = reports
    assert r.problem is not None
    assert r.lag is None and r.offset_lag is None


@pytest.mark.spark
def test_spark_rows_report_lag_in_records(log: SegmentLog, tmp_path: Path, spark: object) -> None:
    from statestore.restore.spark import restore_on_spark

    rows = restore_on_spark(
        spark,
        log_dir=log.log_dir,
        state_dir=tmp_path / "state",
        application_id=APP,  # type: ignore[arg-type]
        stores=[STORE],
    ).collect()
    (row,) = rows
    assert row.status == "ok", row.error
    assert (row.lag, row.offset_lag) == (0, 42), "up to date; the aborted tail occupies 42 offsets"


def test_cli_restore_rows_report_lag_in_records(log: SegmentLog, tmp_path: Path) -> None:
    from statestore.cli.restore import restore_local
    from statestore.restore.planning import plan
    from statestore.state.policy import Guarantee

    work = plan(log.log_dir, APP, [STORE], None)
    (row,) = restore_local(
        work,
        log_dir=log.log_dir,
        state_dir=tmp_path / "state",
        application_id=APP,
        mode="auto",
        guarantee=Guarantee.EXACTLY_ONCE_V2,
        memory_budget_bytes=64 << 20,
        threads=1,
    )
    assert row.ok and (row.lag, row.offset_lag) == (0, 42)


def test_a_restore_hands_on_the_bounds_it_read_while_nothing_was_written(
    log: SegmentLog, tmp_path: Path
) -> None:
    """The lag after a restore comes from the bounds the restore read, not from reading them again."""
    result = restore_store(tmp_path / "s", log, TP)
    assert result.changelog_bounds == log.offsets(TP) == (0, 426, 426)
    assert store_lag(log, TP, result.offset, bounds=result.changelog_bounds) == store_lag(
        log, TP, result.offset
    )


def test_a_log_written_to_during_the_restore_hands_on_no_bounds_and_the_lag_counts_the_new_records(
    log: SegmentLog, tmp_path: Path
) -> None:
    from statestore.restore.staging import _lag_after

    class WriteMore:
        def on_restore_start(self, tp: TopicPartition, store_name: str, start: int, end: int) -> None:
            p = log.producer(None)
            for i in range(7):
                p.send(TOPIC, 0, b"new%d" % i, b"v")
            p.close()

        def on_batch_restored(self, tp: TopicPartition, store_name: str, end: int, n: int) -> None:
            pass

        def on_restore_end(self, tp: TopicPartition, store_name: str, total: int) -> None:
            pass

    result = restore_store(tmp_path / "s", log, TP, listener=WriteMore())
    assert result.end_offset == 426 and result.changelog_bounds is None
    lag = _lag_after(log.log_dir, TP, result)
    assert lag is not None and (lag.records, lag.log_end) == (7, 433)
