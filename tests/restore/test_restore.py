"""The restore engine against a Python model of the committed log.

Changelogs are written with the segment log's own producers (plain and
transactional, with aborted transactions, tombstones, null keys and
overwrites); the model applies the committed records in offset order. Replay
and bulk (with a generous and a tiny memory budget) must both produce exactly
the model: every key and value, compared by iteration, and the offset of the
last committed record.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statestore import RestoreError, StateStoreError, TopicPartition
from statestore._native import _testing
from statestore.changelog.segment_log import SegmentLog
from statestore.restore.engine import RestoreResult, RestoreSpec, restore_many, restore_store
from support.model import apply, store_contents

TP = TopicPartition("app-store-changelog", 0)

Rec = tuple[bytes | None, bytes | None]


@dataclass
class Model:
    """What the committed log holds: the store it must produce and its offset."""

    records: list[tuple[int, bytes | None, bytes | None]] = field(default_factory=list)
    #: Last stable offset: the default end of a restore.
    end: int = 0

    def store_at(self, end: int) -> tuple[dict[bytes, bytes], int | None]:
        below = [(off, k, v) for off, k, v in self.records if off < end]
        return apply({}, ((k, v) for _, k, v in below)), (below[-1][0] if below else None)


def write_log(log_dir: Path, groups: list[tuple[str, list[Rec]]], tp: TopicPartition = TP) -> Model:
    """Write ``groups`` (``plain``, ``commit``, ``abort`` or a final ``open``) and return the model."""
    log = SegmentLog(log_dir, sync=False)
    model = Model()
    plain = log.producer()
    txn = log.producer(transactional_id=f"restore-test-{tp.partition}")
    open_start = None
    for kind, recs in groups:
        if kind == "plain":
            for k, v in recs:
                model.records.append((plain.send(tp.topic, tp.partition, k, v), k, v))
            plain.flush()
            continue
        txn.begin()
        offs = [(txn.send(tp.topic, tp.partition, k, v), k, v) for k, v in recs]
        txn.flush()
        if kind == "commit":
            txn.commit()
            model.records.extend(offs)
        elif kind == "abort":
            txn.abort()
        else:
            open_start = offs[0][0] if offs else None
            break
    plain.flush()
    model.records.sort()
    model.end = _native_end(log_dir, tp) if open_start is None else open_start
    return model


def _native_end(log_dir: Path, tp: TopicPartition) -> int:
    """The log end offset, from a throwaway restore of nothing (end_offset defaults to the LSO)."""
    log = SegmentLog(log_dir, sync=False)
    return log.end_offset(tp)


def dump(path: Path) -> tuple[dict[bytes, bytes], dict[str, int]]:
    contents = store_contents(path)
    return contents.data, contents.offsets


def check(path: Path, model: Model, end: int) -> None:
    data, offsets = dump(path)
    want, last = model.store_at(end)
    assert data == want
    assert offsets.get(str(TP)) == last


keys = st.one_of(st.none(), st.sampled_from([b"a", b"b", b"c", b"dd", b"e" * 30, b"\x00", b"\xff\x01"]))
values = st.one_of(st.none(), st.binary(max_size=40))
records = st.lists(st.tuples(keys, values), min_size=0, max_size=12)
groups = st.lists(
    st.tuples(st.sampled_from(["plain", "commit", "abort", "abort", "commit"]), records), max_size=10
)
open_tail = st.one_of(st.none(), records.filter(bool))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(groups=groups, tail=open_tail)
def test_replay_and_bulk_equal_the_model(
    tmp_path_factory: pytest.TempPathFactory, groups: Any, tail: Any
) -> None:
    base = tmp_path_factory.mktemp("eq")
    gs = list(groups) + ([("open", tail)] if tail else [])
    model = write_log(base / "log", gs)
    results: list[RestoreResult] = []
    for name, mode, budget in [("r", "replay", 256 << 20), ("b", "bulk", 256 << 20), ("t", "bulk", 1)]:
        res = restore_store(base / name, base / "log", TP, mode=mode, memory_budget_bytes=budget)
        assert res.mode == mode
        assert res.end_offset == model.end
        check(base / name, model, model.end)
        results.append(res)
    r, b, t = results
    assert dump(base / "r") == dump(base / "b") == dump(base / "t")
    for x in (b, t):
        assert (x.records_applied, x.records_skipped, x.offset) == (
            r.records_applied,
            r.records_skipped,
            r.offset,
        )
    committed_with_key = sum(1 for off, k, _ in model.records if off < model.end and k is not None)
    assert r.records_applied == committed_with_key
    assert r.merge_seconds == b.merge_seconds == 0.0, "a short replay merges nothing at its end"
    assert r.records_skipped.null_key == sum(
        1 for off, k, _ in model.records if off < model.end and k is None
    )


def _mixed_log(log_dir: Path, n: int, keys: int, seed: int = 1) -> Model:
    import random

    rng = random.Random(seed)
    gs: list[tuple[str, list[Rec]]] = []
    for _ in range(n):
        kind = rng.choice(["plain", "commit", "commit", "abort"])
        recs: list[Rec] = []
        for _ in range(rng.randint(1, 20)):
            k = None if rng.random() < 0.03 else b"key-%05d" % rng.randrange(keys)
            v = None if rng.random() < 0.1 else rng.randbytes(rng.randint(0, 100))
            recs.append((k, v))
        gs.append((kind, recs))
    return write_log(log_dir, gs)


@pytest.mark.parametrize("mode", ["replay", "bulk", "auto"])
def test_resume_from_the_middle_equals_one_restore(tmp_path: Path, mode: str) -> None:
    model = _mixed_log(tmp_path / "log", 80, 300)
    mid = model.end // 2
    first = restore_store(tmp_path / "s", tmp_path / "log", TP, end_offset=mid, mode=mode)
    assert first.end_offset == mid
    check(tmp_path / "s", model, mid)
    second = restore_store(tmp_path / "s", tmp_path / "log", TP, mode=mode)
    assert second.start_offset == first.offset + 1 if first.offset is not None else 0
    assert second.end_offset == model.end
    if mode == "auto":
        assert (first.mode, second.mode) == ("bulk", "replay")
    restore_store(tmp_path / "one", tmp_path / "log", TP, mode=mode)
    assert dump(tmp_path / "s") == dump(tmp_path / "one")
    check(tmp_path / "s", model, model.end)
    again = restore_store(tmp_path / "s", tmp_path / "log", TP, mode=mode)
    assert again.records_applied == 0 and again.offset == second.offset


@pytest.mark.parametrize("mode", ["replay", "bulk"])
def test_without_read_ahead_the_store_is_the_same(tmp_path: Path, mode: str) -> None:
    model = _mixed_log(tmp_path / "log", 80, 300)
    ahead = restore_store(tmp_path / "a", tmp_path / "log", TP, mode=mode)
    inline = restore_store(tmp_path / "i", tmp_path / "log", TP, mode=mode, read_ahead=False)
    assert (inline.offset, inline.records_applied, inline.records_skipped) == (
        ahead.offset,
        ahead.records_applied,
        ahead.records_skipped,
    )
    assert dump(tmp_path / "i") == dump(tmp_path / "a")
    check(tmp_path / "i", model, model.end)


@pytest.mark.parametrize("budget", [256 << 20, 64 << 10])
def test_one_partition_split_across_threads_is_the_same_store(tmp_path: Path, budget: int) -> None:
    """A bulk restore split by key range across threads (``bulk_threads``; ``restore_many`` with
    fewer specs than threads) gives the store one thread gives: tombstones, overwrites, and with
    the tiny budget keys in several spilled runs, the newest winning."""
    model = _mixed_log(tmp_path / "log", 300, 2_000)
    kw: dict[str, Any] = {"mode": "bulk", "memory_budget_bytes": budget}
    one = restore_store(tmp_path / "1", tmp_path / "log", TP, **kw)
    split = restore_store(tmp_path / "3", tmp_path / "log", TP, bulk_threads=3, **kw)
    (many,) = restore_many([RestoreSpec(tmp_path / "m", tmp_path / "log", TP, **kw)], threads=2)
    assert many.ok
    for res in (split, many):
        assert (res.offset, res.records_applied, res.records_skipped) == (
            one.offset,
            one.records_applied,
            one.records_skipped,
        )
    assert dump(tmp_path / "1") == dump(tmp_path / "3") == dump(tmp_path / "m")
    check(tmp_path / "3", model, model.end)
    with pytest.raises(ValueError, match="bulk_threads"):
        restore_store(tmp_path / "0", tmp_path / "log", TP, bulk_threads=0)


def test_tiny_budget_far_below_the_data_size(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path / "log", sync=False)
    p = log.producer()
    model = Model()
    for i in range(30_000):
        k, v = b"k%07d" % ((i * 7919) % 20_000), bytes([i % 251]) * 100
        model.records.append((p.send(TP.topic, TP.partition, k, v), k, v))
    p.flush()
    model.end = model.records[-1][0] + 1
    budget = 64 * 1024  # the data is ~3.3 MB: about 50x the budget
    res = restore_store(tmp_path / "s", tmp_path / "log", TP, memory_budget_bytes=budget)
    assert res.mode == "bulk" and res.records_applied == 30_000
    check(tmp_path / "s", model, model.end)
    assert not (tmp_path / ".s.restore-tmp").exists()


def _column_family_options(store: Path, cf: str) -> dict[str, str]:
    """The options of column family ``cf`` in the OPTIONS file RocksDB wrote when ``store`` was last opened."""
    text = sorted(store.glob("OPTIONS-*"))[-1].read_text()
    section = text.split(f'[CFOptions "{cf}"]', 1)[1].split("\n[", 1)[0]
    pairs = (line.strip().split("=", 1) for line in section.splitlines() if "=" in line)
    return {k.strip(): v.strip() for k, v in pairs}


@pytest.mark.parametrize(
    ("budget", "memtable", "level0_files"),
    [(256 << 20, 32 << 20, 8), (64 << 20, 8 << 20, 16), (4 << 30, 64 << 20, 4)],
)
def test_a_replay_gives_rocksdbs_memtables_half_of_its_memory_budget(
    tmp_path: Path, budget: int, memtable: int, level0_files: int
) -> None:
    """Memtables came on top of the budget (4 x 64 MiB): now four of an eighth each, 64 MiB at most, and
    level 0 compacted, and writes slowed and stopped, after as many bytes as RocksDB's defaults would
    keep there."""
    model = _mixed_log(tmp_path / "log", 3_000, 500)
    res = restore_store(tmp_path / "s", tmp_path / "log", TP, mode="replay", memory_budget_bytes=budget)
    assert res.mode == "replay"
    check(tmp_path / "s", model, model.end)
    opts = _column_family_options(tmp_path / "s", "default")
    assert int(opts["write_buffer_size"]) == memtable
    assert int(opts["max_write_buffer_number"]) * memtable <= budget // 2
    assert int(opts["level0_file_num_compaction_trigger"]) == level0_files
    # writes slow and stop at as many level-0 bytes as RocksDB's defaults (40 and 64 files of 64 MiB)
    assert int(opts["level0_slowdown_writes_trigger"]) == 10 * level0_files
    assert int(opts["level0_stop_writes_trigger"]) == 16 * level0_files
    # the offsets' column family, flushed with the data, never stops or slows the data's writes first
    offsets = _column_family_options(tmp_path / "s", "offsets")
    assert int(offsets["max_write_buffer_number"]) >= int(opts["max_write_buffer_number"])
    assert int(offsets["level0_slowdown_writes_trigger"]) >= 4 * int(opts["level0_slowdown_writes_trigger"])


@pytest.mark.parametrize("level", [None, "warn", "nonsense", "info"])
def test_rocksdb_logs_its_warnings_not_its_options_unless_asked_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, level: str | None
) -> None:
    """RocksDB formatted some 280 lines of options into a store's LOG at every open, ~10% of the CPU
    of creating many small stores: the LOG now holds warnings (stalled writes), and
    STATESTORE_ROCKSDB_LOG=info brings the rest back for a diagnosis."""
    if level is None:
        monkeypatch.delenv("STATESTORE_ROCKSDB_LOG", raising=False)
    else:
        monkeypatch.setenv("STATESTORE_ROCKSDB_LOG", level)
    model = _mixed_log(tmp_path / "log", 500, 50)
    restore_store(tmp_path / "s", tmp_path / "log", TP, mode="replay")
    check(tmp_path / "s", model, model.end)
    logs = [p.read_text(errors="replace") for p in (tmp_path / "s").glob("LOG*")]
    assert logs, "RocksDB keeps its LOG whatever the level"
    assert any("Options.write_buffer_size" in log for log in logs) == (level == "info"), logs


def _level0_files(store: Path) -> int:
    """The most level-0 files any of the store's column families holds."""
    from rocksdict import AccessType, Options, Rdict

    db = Rdict(str(store), Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        return max(
            int(db.get_column_family(cf).property_int_value("rocksdb.num-files-at-level0") or 0)
            for cf in Rdict.list_cf(str(store))
        )
    finally:
        db.close()


def test_a_restore_in_chunks_hands_over_no_level0_that_would_stop_writes(tmp_path: Path) -> None:
    """The state updater restores in chunks (a call per 50,000 offsets), and each call flushed a
    level-0 file and closed the store before RocksDB's compaction of them could finish: 40 chunks
    handed the application 40 level-0 files, where RocksDB's defaults stop writes at 36. A replay
    now waits for RocksDB's compactions while a column family holds 36 or more."""
    records, chunk = 400_000, 10_000
    _testing.write_synthetic_changelog(tmp_path / "log", TP.topic, TP.partition, records, records)
    store, most = tmp_path / "s", 0
    for end in range(chunk, records + 1, chunk):
        r = restore_store(store, tmp_path / "log", TP, mode="replay", end_offset=end, read_ahead=False)
        assert r.records_applied == chunk
        most = max(most, _level0_files(store))
    assert 8 <= most < 36, f"{most} level-0 files after a chunk"


def test_restored_store_reads_in_rocksdict_raw_mode(tmp_path: Path) -> None:
    from rocksdict import AccessType, Options, Rdict

    model = _mixed_log(tmp_path / "log", 50, 100)
    for name, mode in [("b", "bulk"), ("r", "replay")]:
        restore_store(tmp_path / name, tmp_path / "log", TP, mode=mode)
        want, last = model.store_at(model.end)
        db = Rdict(
            str(tmp_path / name),
            Options(raw_mode=True),
            column_families={"offsets": Options(raw_mode=True)},
            access_type=AccessType.read_only(),
        )
        try:
            assert dict(db.items()) == want
            offsets = db.get_column_family("offsets")
            assert offsets[str(TP).encode()] == int(last or 0).to_bytes(8, "big", signed=True)
            del offsets
        finally:
            db.close()


class Recorder:
    """A listener that records its calls, optionally raising on the n-th batch."""

    def __init__(self, fail_on_batch: int | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.threads: set[int] = set()
        self.fail_on_batch = fail_on_batch

    def on_restore_start(
        self, tp: TopicPartition, store_name: str, start_offset: int, end_offset: int
    ) -> None:
        self.threads.add(threading.get_ident())
        self.calls.append(("start", tp, store_name, start_offset, end_offset))

    def on_batch_restored(
        self, tp: TopicPartition, store_name: str, batch_end_offset: int, num_restored: int
    ) -> None:
        self.calls.append(("batch", tp, store_name, batch_end_offset, num_restored))
        if self.fail_on_batch is not None and sum(c[0] == "batch" for c in self.calls) >= self.fail_on_batch:
            raise KeyError("listener says stop")

    def on_restore_end(self, tp: TopicPartition, store_name: str, total_restored: int) -> None:
        self.calls.append(("end", tp, store_name, total_restored))


def _big_plain_log(log_dir: Path, n: int, value_size: int = 1000) -> Model:
    """``n`` plain records over 5000 keys; 1000-byte values make it span several 4 MiB chunks."""
    log = SegmentLog(log_dir, sync=False)
    p = log.producer()
    model = Model()
    for start in range(0, n, 5000):
        recs: list[Rec] = [
            (b"k%06d" % (i % 5000), b"%d" % i + b"v" * value_size) for i in range(start, min(n, start + 5000))
        ]
        first = p.send_many(TP.topic, TP.partition, recs)
        model.records += [(first + j, k, v) for j, (k, v) in enumerate(recs)]
    p.flush()
    model.end = n
    return model


# A replay batch covers at most a fifth of the memory budget, an eighth with
# read-ahead (and at least a 4 MiB read): with this budget the 20 MB logs below
# replay in several batches.
SMALL_REPLAY_BATCHES = 12 << 20


@pytest.mark.parametrize("mode", ["replay", "bulk"])
def test_listener_is_called_with_kafkas_shape(tmp_path: Path, mode: str) -> None:
    _big_plain_log(tmp_path / "log", 20_000)
    rec = Recorder()
    res = restore_store(
        tmp_path / "store",
        tmp_path / "log",
        TP,
        mode=mode,
        listener=rec,
        progress_interval=0,
        memory_budget_bytes=SMALL_REPLAY_BATCHES,
    )
    assert rec.calls[0] == ("start", TP, "store", 0, 20_000)
    assert rec.calls[-1] == ("end", TP, "store", 20_000)
    batches = [c for c in rec.calls if c[0] == "batch"]
    assert 1 < len(batches) < 20_000  # per chunk, never per record
    assert sum(c[4] for c in batches) == res.records_applied
    assert [c[3] for c in batches] == sorted(c[3] for c in batches)
    assert batches[-1][3] == 19_999
    # a long interval: one call once the whole log is read, before the store is written
    rec2 = Recorder()
    restore_store(tmp_path / "s2", tmp_path / "log", TP, mode=mode, listener=rec2, progress_interval=3600)
    assert rec2.calls == [
        ("start", TP, "s2", 0, 20_000),
        ("batch", TP, "s2", 19_999, 20_000),
        ("end", TP, "s2", 20_000),
    ]


@pytest.mark.parametrize("mode", ["replay", "bulk"])
def test_listener_exception_stops_the_restore_and_keeps_the_store_consistent(
    tmp_path: Path, mode: str
) -> None:
    model = _big_plain_log(tmp_path / "log", 20_000)
    rec = Recorder(fail_on_batch=2)
    with pytest.raises(RestoreError, match="listener") as ei:
        restore_store(
            tmp_path / "s",
            tmp_path / "log",
            TP,
            mode=mode,
            listener=rec,
            progress_interval=0,
            memory_budget_bytes=SMALL_REPLAY_BATCHES,
        )
    assert isinstance(ei.value.__cause__, KeyError)
    assert str(tmp_path / "s") in str(ei.value) and str(TP) in str(ei.value)
    assert rec.calls[-1][0] == "batch"
    data, offsets = dump(tmp_path / "s")
    off = offsets.get(str(TP))
    if mode == "bulk":
        assert (data, off) == ({}, None)  # nothing ingested
    else:
        assert off is not None and off < 19_999
        assert data == model.store_at(off + 1)[0]
    restore_store(tmp_path / "s", tmp_path / "log", TP, mode=mode)
    check(tmp_path / "s", model, model.end)


def test_restore_many_isolates_a_failure(tmp_path: Path) -> None:
    models = {}
    for part in range(4):
        tp = TopicPartition(TP.topic, part)
        models[part] = write_log(
            tmp_path / "log", [("plain", [(b"k%d" % i, b"p%d-%d" % (part, i)) for i in range(500)])], tp
        )
    # store 3 already holds data and an offset far beyond its log: its restore fails, untouched
    _testing.store_write_batch(str(tmp_path / "s3"), [(b"old", b"data")], {f"{TP.topic}-3": 10**6})
    before = dump(tmp_path / "s3")
    specs = [RestoreSpec(tmp_path / f"s{p}", tmp_path / "log", TopicPartition(TP.topic, p)) for p in range(4)]
    out = restore_many(specs, threads=2)
    assert [r.ok for r in out] == [True, True, True, False]
    assert isinstance(out[3].error, StateStoreError) and "ahead" in str(out[3].error)
    assert dump(tmp_path / "s3") == before
    for p in range(3):
        assert out[p].tp == TopicPartition(TP.topic, p)
        data, offsets = dump(tmp_path / f"s{p}")
        assert data == models[p].store_at(10**9)[0]
        assert offsets[f"{TP.topic}-{p}"] == 499


def test_bad_arguments_name_the_problem(tmp_path: Path) -> None:
    _big_plain_log(tmp_path / "log", 10, value_size=1)
    with pytest.raises(RestoreError, match="mode"):
        restore_store(tmp_path / "s", tmp_path / "log", TP, mode="fast")
    with pytest.raises(RestoreError, match="last stable offset 10"):
        restore_store(tmp_path / "s", tmp_path / "log", TP, end_offset=11)
    with pytest.raises(ValueError, match="same store"):
        restore_many([RestoreSpec(tmp_path / "s", tmp_path / "log", TP)] * 2)
    # The same store however its path is spelled: through a link to its directory, with `..`, or
    # through a link to the store itself once it exists.
    (tmp_path / "state").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "state")
    spellings = [
        tmp_path / "state" / "s",
        tmp_path / "alias" / "s",
        tmp_path / "state" / ".." / "state" / "s",
    ]
    for other in spellings[1:]:
        with pytest.raises(ValueError, match="same store"):
            restore_many(
                [RestoreSpec(spellings[0], tmp_path / "log", TP), RestoreSpec(other, tmp_path / "log", TP)]
            )
    assert not spellings[0].exists(), "refused before anything was restored"
    restore_store(spellings[0], tmp_path / "log", TP)
    (tmp_path / "link").symlink_to(spellings[0])
    with pytest.raises(ValueError, match="same store"):
        restore_many(
            [
                RestoreSpec(tmp_path / "link", tmp_path / "log", TP),
                RestoreSpec(spellings[1], tmp_path / "log", TP),
            ]
        )
    # Two stores side by side are two stores, existing or not.
    out = restore_many(
        [
            RestoreSpec(spellings[1], tmp_path / "log", TP),
            RestoreSpec(tmp_path / "alias" / "t", tmp_path / "log", TP),
        ]
    )
    assert [r.records_applied for r in out] == [0, 10]


def test_gil_is_released_during_a_restore(tmp_path: Path) -> None:
    import time

    _big_plain_log(tmp_path / "log", 100_000, value_size=100)
    done = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            restore_store(tmp_path / "s", tmp_path / "log", TP, mode="replay")
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            done.set()

    t = threading.Thread(target=run)
    t.start()
    ticks = 0
    while not done.is_set():
        time.sleep(0.001)  # wakes only if the restoring thread lets go of the GIL
        ticks += 1
    t.join()
    assert not errors
    assert ticks > 3


@pytest.mark.parametrize("mode", ["replay", "bulk"])
def test_a_store_named_by_a_bare_relative_path_is_created_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    log = SegmentLog(tmp_path / "log")
    with log.producer("w") as p:
        p.begin()
        p.send("app-s-changelog", 0, b"k", b"v")
        p.commit()
    monkeypatch.chdir(tmp_path)
    r = restore_store("counts-1", log, TopicPartition("app-s-changelog", 0), mode=mode)
    assert r.records_applied == 1 and (tmp_path / "counts-1").is_dir()
