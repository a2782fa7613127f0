"""Crash safety of restores, for real: SIGKILL a restoring child at random moments.

After every kill the store on disk must be consistent:

- replay: the recorded offset ``O`` vouches for exactly the committed prefix
  ``[0, O]`` (no offset: no data);
- replay with RocksDB's compactions deferred to one merge at its end (as a
  replay of tens of millions of offsets runs): the same; whatever level 0 a
  kill left, the next replay that completes merges it;
- bulk from an empty store: either nothing, or all the data without an offset
  (killed between ingestion and the offset write: data ahead, never an offset
  ahead of the data), or all the data with the final offset. A half-ingested
  store that claims an offset is never seen.

Each following child goes on from whatever the killed one left; whenever a
child completes, the store must equal the model. At the end a restore in this
process completes and equals the model.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rocksdict import AccessType, Options, Rdict

from statestore import TopicPartition, _native
from statestore.changelog.segment_log import SegmentLog
from statestore.restore.engine import restore_store
from support.model import apply, store_contents

TP = TopicPartition("app-crash-changelog", 0)
KILLS = 30

CHILD = r"""
import json, sys
from statestore import TopicPartition, _native
store, log, topic, kwargs = sys.argv[1:5]
sys.stdout.write("go\n"); sys.stdout.flush()
r = _native.restore_store(store, log, TopicPartition(topic, 0), **json.loads(kwargs))
sys.stdout.write(f"done {r.end_offset}\n"); sys.stdout.flush()
"""


def restore_kwargs(mode: str, budget: int) -> dict[str, Any]:
    """``_native.restore_store``'s keyword arguments for the test's ``mode``.

    256 KiB memtables and 64 KiB chunks: with the WAL off, replay progress
    reaches disk at each (atomic) memtable flush, so small ones make kills
    land between flushes. ``replay-deferred`` defers RocksDB's compactions
    from the first offset (by default only replays of tens of millions do).
    """
    kwargs: dict[str, Any] = {
        "mode": "bulk" if mode == "bulk" else "replay",
        "memory_budget_bytes": budget,
        "write_buffer_bytes": 256 << 10,
        "chunk_bytes": 64 << 10,
    }
    if mode == "replay-deferred":
        kwargs["defer_compactions_from"] = 1
    return kwargs


def level0_files(store: Path) -> int:
    """The most level-0 files a column family of the store holds."""
    db = Rdict(str(store), Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        cfs = Rdict.list_cf(str(store), Options(raw_mode=True))
        return max(
            int(db.get_column_family(cf).property_int_value("rocksdb.num-files-at-level0") or 0) for cf in cfs
        )
    finally:
        db.close()


Records = list[tuple[int, bytes | None, bytes | None]]


def build_log(log_dir: Path, n: int) -> tuple[Records, int]:
    """A changelog of ``n`` sends: overwrites, tombstones, null keys, some aborted transactions."""
    rng = random.Random(4)
    log = SegmentLog(log_dir, sync=False)
    plain = log.producer()
    txn = log.producer(transactional_id="crash-test")
    committed: Records = []
    sent = 0
    while sent < n:
        recs = []
        for _ in range(rng.randint(50, 400)):
            k = None if rng.random() < 0.01 else b"key-%06d" % rng.randrange(n // 4)
            v = None if rng.random() < 0.08 else rng.randbytes(100)
            recs.append((k, v))
        sent += len(recs)
        kind = rng.choice(["plain", "plain", "commit", "abort"])
        if kind == "plain":
            committed += [(plain.send(TP.topic, TP.partition, k, v), k, v) for k, v in recs]
            plain.flush()
        else:
            txn.begin()
            offs = [(txn.send(TP.topic, TP.partition, k, v), k, v) for k, v in recs]
            txn.flush()
            if kind == "commit":
                txn.commit()
                committed += offs
            else:
                txn.abort()
    plain.flush()
    committed.sort()
    return committed, committed[-1][0]


def model_at(records: Records, last: int | None) -> dict[bytes, bytes]:
    """The reference model through offset ``last`` of the committed ``records``."""
    if last is None:
        return {}
    return apply({}, ((k, v) for off, k, v in records if off <= last))


def on_disk(store: Path) -> tuple[dict[bytes, bytes], int | None]:
    if not (store / "CURRENT").exists():
        return {}, None  # killed before RocksDB created the store
    if "offsets" not in Rdict.list_cf(str(store), Options(raw_mode=True)):
        # killed while RocksDB was creating the store: it must hold nothing yet
        db = Rdict(str(store), Options(raw_mode=True), access_type=AccessType.read_only())
        try:
            return dict(db.items()), None
        finally:
            db.close()
    contents = store_contents(store)
    return contents.data, contents.offsets.get(str(TP))


@pytest.fixture(scope="module")
def changelog(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Records, int]:
    d = tmp_path_factory.mktemp("crashlog") / "log"
    records, last = build_log(d, 60_000)
    return d, records, last


def run_kills(base: Path, changelog: tuple[Path, Records, int], mode: str, kills: int, seed: int) -> None:
    log_dir, records, last = changelog
    final = model_at(records, last)
    budget = 1 << 20 if mode == "bulk" else 256 << 20
    kwargs = restore_kwargs(mode, budget)
    store = base / f"store-{mode}"
    # how long a whole restore takes here, to spread the kills over it
    t0 = time.monotonic()
    out = _native.restore_store(store, log_dir, TP, **kwargs)
    full = time.monotonic() - t0
    assert on_disk(store) == (final, last)
    assert (out.merge_seconds > 0) == (mode == "replay-deferred"), out
    if mode == "replay-deferred":
        assert level0_files(store) == 0, "merged at the end"
    shutil.rmtree(store)

    rng = random.Random(seed)
    killed = completed = partial = 0
    while killed < kills:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(store), str(log_dir), TP.topic, json.dumps(kwargs)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line == b"go\n", child.stderr.read() if child.stderr else b""
        time.sleep(rng.random() * full * 1.3)
        child.send_signal(signal.SIGKILL)
        rc = child.wait()
        out = child.stdout.read()
        data, off = on_disk(store)
        if rc == -signal.SIGKILL and not out.startswith(b"done"):
            killed += 1
            if mode != "bulk":
                assert data == model_at(records, off), f"kill {killed}: data disagrees with offset {off}"
            else:
                assert (data, off) in (({}, None), (final, None), (final, last)), (
                    f"kill {killed}: half-ingested store (offset {off}, {len(data)} keys)"
                )
            if (off is not None and off < last) or (off is None and data):
                partial += 1
        else:
            assert rc in (0, -signal.SIGKILL), child.stderr.read() if child.stderr else b""
            completed += 1
        if (data, off) == (final, last):
            shutil.rmtree(store)  # start over so the next child has work to do
    # whatever the last kill left, one more restore completes and equals the model
    if mode == "replay-deferred":
        _native.restore_store(store, log_dir, TP, **kwargs)
        assert level0_files(store) == 0, "the last replay merged what the kills left"
    else:
        restore_store(store, log_dir, TP, mode=mode, memory_budget_bytes=budget)
    assert on_disk(store) == (final, last)
    assert killed == kills
    print(f"\n{mode}: {killed} kills ({partial} left a partial store), {completed} children completed")
    if mode != "bulk":
        assert partial > 0, "no kill landed in the middle of a replay"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["replay", "replay-deferred", "bulk"])
def test_sigkill_during_restore_leaves_a_consistent_store(
    tmp_path: Path, changelog: tuple[Path, Records, int], mode: str
) -> None:
    run_kills(tmp_path, changelog, mode, KILLS, seed=17)


@pytest.mark.torture
@pytest.mark.parametrize("mode", ["replay", "replay-deferred", "bulk"])
def test_sigkill_during_restore_torture(
    request: pytest.FixtureRequest, tmp_path: Path, changelog: tuple[Path, Records, int], mode: str
) -> None:
    if "torture" not in str(request.config.getoption("markexpr")):
        pytest.skip("300 kills: run with -m torture (make torture)")
    run_kills(tmp_path, changelog, mode, 300, seed=99)
