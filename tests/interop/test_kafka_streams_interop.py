"""Kafka Streams 4.4 and statestore on one real broker: each reads what the other wrote.

The application (``interop/kafka-streams``, run by ``scripts/kafka-streams-app.sh``)
has a plain store ``latest`` (Processor API, ``Stores.persistentKeyValueStore``)
and a timestamped store ``counts`` (DSL ``count()``), in tasks ``0_<p>``. Its
input is deterministic, so every result is checked exactly.

* statestore reads what Kafka Streams wrote: after a clean run, ``inspect``
  shows every task and store, their offsets and CLOSED, and ``verify`` finds
  each store equal to its changelog; after a SIGKILL under exactly_once_v2
  the stores are OPEN.
* Kafka Streams reads what statestore wrote: statestore restores both stores
  from the changelog topics into an empty state directory (threads, and Spark
  from the broker's own log directory), then the application starts there
  and restores nothing, under at_least_once and exactly_once_v2, and its
  results are exact.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from statestore import _native
from statestore._native import _testing
from statestore.ops.inspection import inspect_app
from statestore.ops.verify import verify_app
from statestore.state.store import decode_timestamped
from support import kstreams_app
from support.model import store_contents, store_difference

kafka = pytest.importorskip("statestore.changelog.kafka")


PARTITIONS = 2
KEYS = 150
VALUE_SIZE = 40
GUARANTEES = ["at_least_once", "exactly_once_v2"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250"}
    return subprocess.run(
        [sys.executable, "-m", "statestore.cli", *args], capture_output=True, text=True, timeout=300, env=env
    )


def store_dir(state: Path, app: str, partition: int, store: str) -> Path:
    return state / app / f"0_{partition}" / "rocksdb" / store


def read_stores(state: Path, app: str) -> tuple[dict[str, str], dict[str, int], dict[str, int]]:
    """``(latest, counts, count timestamps)`` read with statestore from the application's stores."""
    latest: dict[str, str] = {}
    counts: dict[str, int] = {}
    stamps: dict[str, int] = {}
    for p in range(PARTITIONS):
        latest.update(
            (k.decode(), v.decode()) for k, v in store_contents(store_dir(state, app, p, "latest")).entries
        )
        for k, raw in store_contents(store_dir(state, app, p, "counts")).entries:
            ts, v = decode_timestamped(raw)
            counts[k.decode()] = int.from_bytes(v, "big", signed=True)
            stamps[k.decode()] = ts
    return latest, counts, stamps


def process(
    bootstrap: str, app: str, state: Path, guarantee: str, produce: int, **kw: Any
) -> kstreams_app.AppRun:
    return kstreams_app.run_app(
        bootstrap,
        app,
        state,
        guarantee=guarantee,
        mode="process",
        produce=produce,
        keys=KEYS,
        value_size=VALUE_SIZE,
        partitions=PARTITIONS,
        print_results=True,
        config={"commit.interval.ms": "500"},
        **kw,
    )


def check_results(run: kstreams_app.AppRun, total: int) -> None:
    """The application's own results (read through interactive queries) are exact for ``total`` inputs."""
    latest, counts = kstreams_app.expected(total, KEYS, VALUE_SIZE)
    assert run.results["latest"] == latest
    assert {k: int(v) for k, v in run.results["counts"].items()} == counts
    assert run.stores["counts"]["sum"] == str(total)


@pytest.mark.parametrize("guarantee", GUARANTEES)
def test_statestore_reads_what_kafka_streams_wrote(
    app_built: Path, kafka_bootstrap: str, tmp_path: Path, guarantee: str
) -> None:
    app = f"ksr{uuid.uuid4().hex[:8]}"
    state = tmp_path / "state"
    run = process(kafka_bootstrap, app, state, guarantee, 3000)
    assert run.closed_clean
    check_results(run, 3000)

    # inspect: every task and store, its offset, its format, CLOSED, no lag
    out = cli("inspect", "--kafka", kafka_bootstrap, "--state-dir", str(state), "--app-id", app, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    stores = json.loads(out.stdout)["stores"]
    assert sorted((s["task_id"], s["store"], s["format"], s["status"]) for s in stores) == sorted(
        (f"0_{p}", name, fmt, "closed")
        for p in range(PARTITIONS)
        for name, fmt in kstreams_app.STORE_FORMATS.items()
    )
    for s in stores:
        assert s["problem"] is None, s
        assert s["store_offset"] is not None and s["store_offset"] >= 0, s
        assert s["lag"] == 0, s

    # verify: each store equals its changelog on the broker, in its own format
    out = cli("verify", "--kafka", kafka_bootstrap, "--state-dir", str(state), "--app-id", app)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("exact") == 2 * PARTITIONS, out.stdout
    assert "timestamped" in out.stdout and "plain" in out.stdout

    # and what statestore reads from Kafka Streams' files is what the application computed
    latest, counts, stamps = read_stores(state, app)
    assert latest == run.results["latest"]
    assert {k: str(v) for k, v in counts.items()} == run.results["counts"]
    now_ms = time.time() * 1000
    assert all(now_ms - 600_000 < ts <= now_ms for ts in stamps.values()), (
        "record timestamps in front of values"
    )


def test_a_sigkilled_exactly_once_application_leaves_open_stores(
    app_built: Path, kafka_bootstrap: str, tmp_path: Path
) -> None:
    app = f"ksk{uuid.uuid4().hex[:8]}"
    state = tmp_path / "state"
    # Small memtables and no record cache: RocksDB flushes while the application runs (Kafka Streams writes with
    # the WAL off, so only flushed writes -- the status OPEN among them -- are on disk when it is killed).
    cmd = kstreams_app.command(
        kafka_bootstrap,
        app,
        state,
        guarantee="exactly_once_v2",
        produce=400_000,
        keys=KEYS,
        value_size=VALUE_SIZE,
        partitions=PARTITIONS,
        config={
            "rocksdb.config.setter": "statestore.interop.SmallMemtables",
            "statestore.write.buffer.bytes": "65536",
            "statestore.cache.max.bytes": "0",
        },
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("PROGRESS") and int(line.split("=")[1]) >= 150_000:
                break
        else:
            pytest.fail("the application ended before processing 150,000 records:\n" + "".join(seen[-30:]))
        # Restoring into the directory of a running instance is refused (its Java file lock on <app>/.lock).
        busy = cli(
            "restore",
            "--kafka",
            kafka_bootstrap,
            "--state-dir",
            str(state),
            "--app-id",
            app,
            "--store-format",
            "counts=timestamped",
        )
        said = " ".join((busy.stdout + busy.stderr).split())  # rich wraps long lines
        assert busy.returncode != 0 and f"process {proc.pid}, which holds a POSIX lock" in said, said
        # The java process is the script's exec'd child: same pid.
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    with kafka.KafkaChangelog(kafka_bootstrap) as changelog:
        _holder, reports = inspect_app(state, app, changelog=changelog)
    assert sorted((r.task_id, r.store, r.format, r.status) for r in reports) == sorted(
        (f"0_{p}", name, fmt, "open")
        for p in range(PARTITIONS)
        for name, fmt in kstreams_app.STORE_FORMATS.items()
    )
    assert all(r.problem is None for r in reports), [r.problem for r in reports]
    # The CLI shows the same, as a table.
    out = cli("inspect", "--state-dir", str(state), "--app-id", app)
    assert out.returncode == 0 and out.stdout.count("open") >= 2 * PARTITIONS, out.stdout + out.stderr


def restore_threads(bootstrap: str, state: Path, app: str) -> None:
    out = cli(
        "restore",
        "--kafka",
        bootstrap,
        "--state-dir",
        str(state),
        "--app-id",
        app,
        "--threads",
        "2",
        "--store-format",
        "counts=timestamped",
        "--guarantee",
        "exactly_once_v2",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{2 * PARTITIONS} ok, 0 failed" in out.stdout, out.stdout


@pytest.mark.parametrize("guarantee", GUARANTEES)
def test_kafka_streams_starts_on_what_statestore_restored(
    app_built: Path, kafka_bootstrap: str, tmp_path: Path, guarantee: str
) -> None:
    app = f"ksw{uuid.uuid4().hex[:8]}"
    first = tmp_path / "first"
    process(kafka_bootstrap, app, first, guarantee, 4000)

    # statestore rebuilds both stores from the changelog topics into an empty state directory
    restored = tmp_path / "restored"
    restore_threads(kafka_bootstrap, restored, app)
    for p in range(PARTITIONS):
        assert _native.store_format(store_dir(restored, app, p, "counts")) == "timestamped"
        assert _native.store_format(store_dir(restored, app, p, "latest")) == "plain"
        assert _native.store_info(store_dir(restored, app, p, "counts")).status == 0, "CLOSED"
    # byte for byte what Kafka Streams itself holds (same digests, both formats)
    for p in range(PARTITIONS):
        for name in kstreams_app.STORE_FORMATS:
            diff = store_difference(store_dir(first, app, p, name), store_dir(restored, app, p, name))
            assert diff is None, f"{name} partition {p}: {diff}"

    # Kafka Streams, restore only: nothing to restore
    only = kstreams_app.run_app(
        kafka_bootstrap,
        app,
        restored,
        guarantee=guarantee,
        mode="restore",
        partitions=PARTITIONS,
        keys=KEYS,
        value_size=VALUE_SIZE,
    )
    assert only.restored_records == 0, only.restores
    assert len(only.restores) == 2 * PARTITIONS, only.lines
    assert all(r.start == r.end or r.restored == 0 for r in only.restores.values()), only.restores

    # then it processes 1,000 more records on that state: exact results, still nothing restored
    run = process(kafka_bootstrap, app, restored, guarantee, 1000)
    assert run.restored_records == 0, run.restores
    check_results(run, 5000)


@pytest.mark.spark
def test_kafka_streams_starts_on_what_spark_restored(
    app_built: Path, kafka_broker: Any, spark: Any, tmp_path: Path
) -> None:
    from statestore.restore.spark import restore_on_spark

    bootstrap = str(kafka_broker.bootstrap)
    app = f"kss{uuid.uuid4().hex[:8]}"
    process(bootstrap, app, tmp_path / "first", "exactly_once_v2", 3000)
    restored = tmp_path / "restored"
    # Spark tasks read the broker's own partition directories (the segment log reads Kafka's log.dirs).
    df = restore_on_spark(
        spark,
        log_dir=kafka_broker.log_dir,
        state_dir=restored,
        application_id=app,
        stores=list(kstreams_app.STORE_FORMATS),
        formats={"counts": "timestamped"},
    )
    rows = df.collect()
    assert [r.status for r in rows] == ["ok"] * (2 * PARTITIONS), rows
    run = process(bootstrap, app, restored, "exactly_once_v2", 500)
    assert run.restored_records == 0, run.restores
    check_results(run, 3500)


def test_unknown_store_types_are_reported_and_left_untouched(tmp_path: Path) -> None:
    """Kafka Streams stores statestore does not know: reported store by store, never opened for writing."""
    from statestore.errors import StoreError
    from statestore.state.store import Store

    app = "odd"
    base = tmp_path / "state" / app / "0_0" / "rocksdb"
    base.mkdir(parents=True)
    # a windowed store: RocksDB segments one level down
    (base / "win").mkdir()
    _testing.store_write_batch(base / "win" / "win.1700000000000", [(b"k", b"v")], {})
    # a store halfway through Kafka Streams' upgrade to headers: the data families of two formats
    _testing.store_write_batch(base / "hdr", [(b"k", b"v")], {"odd-hdr-changelog-0": 0}, format="timestamped")
    import rocksdict

    raw = rocksdict.Options(raw_mode=True)
    db = rocksdict.Rdict(
        str(base / "hdr"), raw, column_families={"offsets": raw, "keyValueWithTimestamp": raw}
    )
    db.create_column_family("keyValueWithTimestampAndHeaders", raw)
    db.close()
    # a store RocksDB cannot open: CURRENT names a manifest that is not there
    _testing.store_write_batch(base / "broken", [(b"k", b"v")], {})
    (base / "broken" / "CURRENT").write_text("MANIFEST-999999\n")
    before = {p: p.stat().st_mtime_ns for p in base.rglob("*") if p.is_file()}

    _holder, reports = inspect_app(tmp_path / "state", app)
    by_store = {r.store: r for r in reports}
    broken = by_store["broken"].problem or ""
    assert "cannot" in broken and "MANIFEST-999999" in broken, broken  # RocksDB's own reason, named
    assert (
        "segmented store" in (by_store["win"].problem or "")
        and "win.1700000000000" in by_store["win"].problem
    )
    assert (
        "statestore does not write" in (by_store["hdr"].problem or "")
        and "keyValueWithTimestampAndHeaders" in by_store["hdr"].problem
    )
    for fmt in ("plain", "timestamped"):
        with pytest.raises(StoreError, match="statestore does not"):
            Store(base / "hdr", format=fmt)
    out = cli(
        "restore",
        "--log-dir",
        str(tmp_path),
        "--state-dir",
        str(tmp_path / "state"),
        "--app-id",
        app,
        "--store",
        "win",
        "--store",
        "hdr",
        "--partitions",
        "0",
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "segmented store" in out.stdout and "keyValueWithTimestampAndHeaders" in out.stdout, out.stdout
    verdicts = {r.store.store: r for r in verify_app(tmp_path / "state", app, tmp_path / "nolog")}
    assert all(not v.ok and v.problem for v in verdicts.values()), verdicts
    after = {p: p.stat().st_mtime_ns for p in base.rglob("*") if p.is_file()}
    assert after == before, "nothing was written"
