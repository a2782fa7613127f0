"""Lag is counted in records a restore would apply, not in offsets (architecture: "end offset").

Aborted records and transaction markers occupy offsets; a store that holds
every committed record has no lag even when they follow its offset.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from statestore import SegmentLog, TopicPartition, restore_store
from statestore.inspection import inspect_app
from statestore.lag import store_lag

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
    assert lag.offsets == lag.log_end - (result.offset + 1) == 42  # a commit marker, 40 aborted records and their marker
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
