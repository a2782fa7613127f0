"""Restoring on Spark (statestore.restore.spark): results, retries, concurrent attempts, executor errors.

The Spark tests share one local SparkSession (conftest ``spark``) and are
marked ``spark`` (run them alone with ``-m spark``); they are few, because a
Spark job costs seconds. What does not need Spark -- concurrent attempts in
separate processes, interrupted swaps, the executor's import error, planning,
the CLI's in-process engine -- is tested without it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from statestore import TaskId, TopicPartition, changelog_topic
from statestore._native import _testing
from statestore._testing.faults import FAIL_ATTEMPT_ENV, InjectedFailure
from statestore.changelog.segment_log import SegmentLog
from statestore.cli import main
from statestore.restore.engine import RestoreSpec, restore_many, restore_store
from statestore.restore.planning import changelog_stores, parse_partitions, plan
from statestore.restore.spark import restore_on_spark
from statestore.restore.staging import STAGING_DIR_NAME, restore_partition
from statestore.restore.work import RESULT_COLUMNS, PartitionWork, RestoreRow
from statestore.state.directory import StateDirectory
from support.model import store_contents

APP = "app"
STORES = ("counts", "totals")
PARTITIONS = 8


def write_changelogs(
    log_dir: Path,
    stores: tuple[str, ...] = STORES,
    partitions: int = PARTITIONS,
    records: int = 120,
    seed: int = 7,
) -> None:
    """Overwrites, tombstones, null keys, committed and aborted transactions in every partition."""
    rng = random.Random(seed)
    log = SegmentLog(log_dir, sync=False)
    plain = log.producer()
    for store in stores:
        topic = changelog_topic(APP, store)
        for p in range(partitions):
            txn = log.producer(transactional_id=f"t-{store}-{p}")
            for i in range(records):
                k = None if i % 37 == 5 else b"k%03d" % rng.randrange(40)
                v = None if i % 11 == 3 else rng.randbytes(rng.randint(1, 60))
                plain.send(topic, p, k, v)
            plain.flush()
            for outcome in ("commit", "abort", "commit"):
                txn.begin()
                for _ in range(10):
                    txn.send(topic, p, b"k%03d" % rng.randrange(40), rng.randbytes(8))
                txn.flush()
                txn.commit() if outcome == "commit" else txn.abort()
            txn.close()
    plain.close()


def dump(path: Path) -> tuple[list[tuple[bytes, bytes]], dict[str, int]]:
    contents = store_contents(path)
    return contents.entries, contents.offsets


def store_path(state_dir: Path, store: str, partition: int) -> Path:
    return state_dir / APP / f"0_{partition}" / "rocksdb" / store


def no_staging_left(state_dir: Path) -> bool:
    return not list((state_dir / APP).glob(f"*/{STAGING_DIR_NAME}"))


def restore_in_process(log_dir: Path, out: Path) -> dict[tuple[str, int], Any]:
    """The reference: ``restore_many`` of every (store, partition) into the same layout under ``out``."""
    specs = []
    for store in STORES:
        for p in range(PARTITIONS):
            path = store_path(out, store, p)
            path.parent.mkdir(parents=True, exist_ok=True)
            specs.append(RestoreSpec(path, log_dir, TopicPartition(changelog_topic(APP, store), p)))
    results = restore_many(specs, threads=2)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    return {
        (s, p): r
        for (s, p), r in zip([(s, p) for s in STORES for p in range(PARTITIONS)], results, strict=True)
    }


@pytest.fixture(scope="module")
def changelogs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("spark-log") / "log"
    write_changelogs(d)
    return d


# -- on Spark -------------------------------------------------------------------------------


@pytest.mark.spark
def test_spark_restore_equals_restore_many_then_resumes(spark: Any, changelogs: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    ref = tmp_path / "ref"
    expected = restore_in_process(changelogs, ref)

    df = restore_on_spark(spark, log_dir=changelogs, state_dir=state, application_id=APP, stores=list(STORES))
    assert tuple(df.columns) == tuple(c for c, _ in RESULT_COLUMNS)
    rows = df.collect()
    assert [(r.store, r.partition) for r in rows] == [(s, p) for s in STORES for p in range(PARTITIONS)]
    for r in rows:
        want = expected[(r.store, r.partition)]
        assert (r.status, r.error) == ("ok", None)
        assert r.task_id == f"0_{r.partition}" and r.topic == changelog_topic(APP, r.store)
        assert (r.start_offset, r.end_offset, r.records_applied, r.records_skipped, r.mode) == (
            want.start_offset,
            want.end_offset,
            want.records_applied,
            want.records_skipped.total,
            "bulk",
        )
        assert dump(store_path(state, r.store, r.partition)) == dump(store_path(ref, r.store, r.partition))
    assert no_staging_left(state)

    # More changelog for two partitions: a second job starts from the stores it finds (replay of the tail).
    log = SegmentLog(changelogs, sync=False)
    prod = log.producer()
    for p in (0, 1):
        for i in range(30):
            prod.send(changelog_topic(APP, "counts"), p, b"k%03d" % i, b"new-%d" % i)
    prod.flush()
    for p in (0, 1):
        restore_store(
            store_path(ref, "counts", p), changelogs, TopicPartition(changelog_topic(APP, "counts"), p)
        )
    again = restore_on_spark(
        spark,
        log_dir=changelogs,
        state_dir=state,
        application_id=APP,
        stores=["counts"],
        partitions=[0, 1],
        mode="auto",
    ).collect()
    for r in again:
        assert (r.status, r.mode, r.records_applied) == ("ok", "replay", 30)
        assert r.start_offset == expected[("counts", r.partition)].offset + 1
        assert dump(store_path(state, "counts", r.partition)) == dump(store_path(ref, "counts", r.partition))
    assert no_staging_left(state)


@pytest.mark.spark
def test_spark_retries_an_injected_failure(
    spark: Any, changelogs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    ref = tmp_path / "ref"
    tp = TopicPartition(changelog_topic(APP, "totals"), 3)
    restore_store(
        store_path(ref, "totals", 3).parent.mkdir(parents=True) or store_path(ref, "totals", 3),
        changelogs,
        tp,
    )
    monkeypatch.setenv(FAIL_ATTEMPT_ENV, "totals:3:0")
    sc = spark.sparkContext
    sc.setJobGroup("inject", "restore with one failing attempt")
    try:
        rows = restore_on_spark(
            spark,
            log_dir=changelogs,
            state_dir=state,
            application_id=APP,
            stores=["totals"],
            partitions=[2, 3],
        ).collect()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert [(r.partition, r.status) for r in rows] == [(2, "ok"), (3, "ok")]
    tracker = sc.statusTracker()
    failed = sum(
        tracker.getStageInfo(s).numFailedTasks
        for j in tracker.getJobIdsForGroup("inject")
        for s in tracker.getJobInfo(j).stageIds
    )
    assert failed == 1, "attempt 0 of totals-3 must fail once and be retried"
    ok, retried = rows
    assert (ok.attempts, ok.failed_attempts) == (1, None)
    assert retried.attempts == 2, "the row is the second attempt's"
    assert (retried.failed_attempts or "").startswith("attempt 1 on "), retried.failed_attempts
    assert "InjectedFailure" in (retried.failed_attempts or ""), "the reason is the Python exception's line"
    assert dump(store_path(state, "totals", 3)) == dump(store_path(ref, "totals", 3))
    assert no_staging_left(state)


# -- one partition, without Spark ----------------------------------------------------------------


def _attempt(args: dict[str, Any], started: Any, out: Any) -> None:
    started.release()
    out.put(tuple(restore_partition(**args)))


def test_two_concurrent_attempts_in_processes_leave_one_correct_store(tmp_path: Path) -> None:
    log_dir = tmp_path / "log"
    write_changelogs(log_dir, stores=("counts",), partitions=1, records=20_000)
    state = tmp_path / "state"
    args = {
        "log_dir": str(log_dir),
        "state_dir": str(state),
        "application_id": APP,
        "store": "counts",
        "partition": 0,
    }
    tp = TopicPartition(changelog_topic(APP, "counts"), 0)
    (tmp_path / "ref").mkdir()
    restore_store(tmp_path / "ref" / "s", log_dir, tp)
    # Hold the task lock while both attempts start, so both are waiting when it is released.
    sd = StateDirectory(state, APP, shared=True)
    assert sd.lock(TaskId(0, 0))
    ctx = mp.get_context("spawn")
    started, out = ctx.Semaphore(0), ctx.Queue()
    procs = [ctx.Process(target=_attempt, args=(args, started, out)) for _ in range(2)]
    for p in procs:
        p.start()
    for _ in procs:
        assert started.acquire(timeout=60)
    sd.unlock(TaskId(0, 0))
    sd.close()
    rows = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert [r[11] for r in rows] == ["ok", "ok"], rows
    applied = sorted(r[6] for r in rows)
    assert applied[0] == 0 and applied[1] > 0, "the second attempt finds the first one's store up to date"
    assert dump(store_path(state, "counts", 0)) == dump(tmp_path / "ref" / "s")
    assert no_staging_left(state)


def _store_at_offset_50(tmp_path: Path, changelogs: Path) -> tuple[Path, TopicPartition, Path]:
    """Store ``counts`` of task 0_5 restored up to offset 50: ``(state_dir, its partition, its path)``."""
    state = tmp_path / "state"
    tp = TopicPartition(changelog_topic(APP, "counts"), 5)
    target = store_path(state, "counts", 5)
    target.parent.mkdir(parents=True)
    restore_store(target, changelogs, tp, end_offset=50)
    return state, tp, target


def test_failed_attempt_keeps_the_previous_store_and_removes_its_staging(
    tmp_path: Path, changelogs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state, tp, target = _store_at_offset_50(tmp_path, changelogs)
    before = dump(target)
    monkeypatch.setenv(FAIL_ATTEMPT_ENV, "counts:5:0")
    with pytest.raises(InjectedFailure, match="task 0_5 store counts"):
        restore_partition(
            log_dir=changelogs, state_dir=state, application_id=APP, store="counts", partition=5
        )
    assert dump(target) == before
    assert no_staging_left(state)
    row = restore_partition(
        log_dir=changelogs, state_dir=state, application_id=APP, store="counts", partition=5, attempt=1
    )
    assert row.ok and row.mode == "replay" and row.start_offset == 50
    (tmp_path / "ref").mkdir()
    restore_store(tmp_path / "ref" / "s", changelogs, tp)
    assert dump(target) == dump(tmp_path / "ref" / "s")


def test_a_swap_that_fails_keeps_the_previous_store_and_reports_a_failed_row(
    tmp_path: Path, changelogs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the filesystem cannot exchange two directories (NFS), the swap is two renames; the
    second one failing (EIO, ESTALE, a quota) must leave the store that was there, not delete it
    with the attempt's directory."""
    from statestore.restore import staging

    state, _, target = _store_at_offset_50(tmp_path, changelogs)
    before = dump(target)

    def second_rename_fails(staged: Path, target: Path, aside: Path) -> None:
        os.rename(target, aside)  # the first rename; the second fails, and the store is put back
        os.rename(aside, target)
        raise OSError(5, "Input/output error", str(staged))

    monkeypatch.setattr(staging._native, "replace_dir", second_rename_fails)
    row = restore_partition(
        log_dir=changelogs, state_dir=state, application_id=APP, store="counts", partition=5
    )
    assert row.status == "failed" and f"moving the restored store into place at {target}" in (
        row.error or ""
    ), row
    assert dump(target) == before
    assert no_staging_left(state)


@pytest.mark.parametrize(("marker", "start"), [("earlier_boot", 0), ("sync_failed", 0), ("this_boot", 50)])
def test_a_store_left_unsynced_by_a_job_is_wiped_or_kept_before_an_attempt_resumes_from_it(
    tmp_path: Path, changelogs: Path, marker: str, start: int
) -> None:
    """A restore job that created a store and did not finish leaves a marker beside it (not inside):
    an attempt must not resume from a copy of a store whose files may have lost writes (an earlier
    boot's marker, or a failed sync's), and must not leave such a marker beside the store it puts in
    place, where ``Store`` would refuse it."""
    from statestore import Store, _native

    state, tp, target = _store_at_offset_50(tmp_path, changelogs)
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    written = {"this_boot": boot, "earlier_boot": "0" * 8, "sync_failed": "sync failed"}[marker]
    (target.parent / ".counts.unsynced").write_text(written)
    assert _native.unsynced_marker(target) == marker
    row = restore_partition(
        log_dir=changelogs, state_dir=state, application_id=APP, store="counts", partition=5
    )
    assert row.ok and row.start_offset == start, row
    assert _native.unsynced_marker(target) is None
    (tmp_path / "ref").mkdir()
    restore_store(tmp_path / "ref" / "s", changelogs, tp)
    assert dump(target) == dump(tmp_path / "ref" / "s")
    Store(target).close()  # opens: no marker left to refuse it
    assert no_staging_left(state)


def test_interrupted_swap_is_rolled_back_and_stale_attempts_removed(tmp_path: Path, changelogs: Path) -> None:
    state = tmp_path / "state"
    tp = TopicPartition(changelog_topic(APP, "counts"), 2)
    target = store_path(state, "counts", 2)
    staging = state / APP / "0_2" / STAGING_DIR_NAME / "counts"
    # What an attempt killed between its two renames leaves: the old store moved aside, no store in place,
    # and another killed attempt's half-restored staging store.
    (staging / "killed-1").mkdir(parents=True)
    restore_store(staging / "killed-1" / "previous", changelogs, tp, end_offset=40)
    (staging / "killed-2").mkdir()
    restore_store(staging / "killed-2" / "store", changelogs, tp, end_offset=10)
    target.parent.mkdir(parents=True)
    row = restore_partition(
        log_dir=changelogs, state_dir=state, application_id=APP, store="counts", partition=2
    )
    assert row.ok and row.mode == "replay" and row.start_offset == 40, "the moved-aside store was put back"
    (tmp_path / "ref").mkdir()
    restore_store(tmp_path / "ref" / "s", changelogs, tp)
    assert dump(target) == dump(tmp_path / "ref" / "s")
    assert no_staging_left(state)


@pytest.mark.parametrize(("guarantee", "stray_kept"), [("exactly_once_v2", False), ("at_least_once", True)])
def test_store_with_data_but_no_offset(
    tmp_path: Path, changelogs: Path, guarantee: str, stray_kept: bool
) -> None:
    """Exactly-once: unknown state, restored from nothing. At-least-once: replayed over from the start."""
    state = tmp_path / "state"
    target = store_path(state, "counts", 1)
    target.parent.mkdir(parents=True)
    _testing.store_write_batch(str(target), [(b"stray", b"x")], {})
    row = restore_partition(
        log_dir=changelogs,
        state_dir=state,
        application_id=APP,
        store="counts",
        partition=1,
        guarantee=guarantee,
    )
    assert row.ok and row.mode == ("replay" if stray_kept else "bulk")
    entries, _ = dump(target)
    assert (b"stray", b"x") in entries if stray_kept else b"stray" not in dict(entries)


def test_errors_come_back_as_rows_naming_task_and_file(tmp_path: Path, changelogs: Path) -> None:
    state = tmp_path / "state"
    with StateDirectory(state, APP):  # an application holds the state directory exclusively
        row = restore_partition(
            log_dir=changelogs, state_dir=state, application_id=APP, store="counts", partition=0
        )
    assert row.status == "failed" and "task 0_0 store counts" in (row.error or "")
    assert str(state / APP) in (row.error or "")
    # A store whose offset is beyond the log's end cannot be restored; it is left as it was.
    target = store_path(state, "counts", 0)
    target.parent.mkdir(parents=True, exist_ok=True)
    _testing.store_write_batch(
        str(target), [(b"a", b"b")], {str(TopicPartition(changelog_topic(APP, "counts"), 0)): 10**6}
    )
    before = dump(target)
    row = restore_partition(
        log_dir=changelogs, state_dir=state, application_id=APP, store="counts", partition=0
    )
    assert row.status == "failed" and "task 0_0" in (row.error or "") and row.start_offset is None
    assert f"{target} (restored in" in (row.error or ""), (
        "the error names the store, not only its staging copy"
    )
    assert dump(target) == before
    assert no_staging_left(state)


def _payload(work: PartitionWork, log_dir: str, state_dir: str, *, max_attempts: int) -> dict[str, Any]:
    from statestore.restore.spark import _task_payload

    return _task_payload(
        work,
        0,
        log_dir=log_dir,
        state_dir=state_dir,
        application_id=APP,
        mode="auto",
        memory_budget_bytes=1 << 24,
        lock_timeout=10.0,
        max_attempts=max_attempts,
        guarantee="exactly_once_v2",
        create_state_dir=True,
        format="plain",
        retention_ms=None,
        segment_interval_ms=None,
    )


def test_executor_without_statestore_gets_a_clear_row(tmp_path: Path) -> None:
    """The task function is shipped by value, so it runs, and says why, where statestore cannot be imported."""
    pytest.importorskip("pyspark")
    from pyspark import cloudpickle

    from statestore.restore.spark import _make_task_function

    payload = _payload(PartitionWork.of(APP, "counts", 4), "/log", "/state", max_attempts=1)
    (tmp_path / "fn.pkl").write_bytes(cloudpickle.dumps(_make_task_function([payload])))
    child = textwrap.dedent(f"""
        import pickle, sys
        sys.modules["statestore"] = None  # as on an executor without the wheel
        fn = pickle.loads(open({str(tmp_path / "fn.pkl")!r}, "rb").read())
        print(repr(list(fn(0, iter([0])))))
    """)
    out = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=60, check=True
    )
    (row,) = [RestoreRow(*r) for r in eval(out.stdout)]
    assert row[:4] == ("0_4", "counts", "app-counts-changelog", 4)
    assert (row.status, row.attempts) == ("failed", 1)
    assert "statestore cannot be imported on executor host" in (row.error or "") and sys.executable in (
        row.error or ""
    )
    assert "spark.pyspark.python" in (row.error or "")


@pytest.mark.parametrize("in_spark", [True, False], ids=["in-a-spark-worker", "outside-spark"])
def test_a_spark_worker_freezes_what_it_holds_after_its_first_task(
    tmp_path: Path, changelogs: Path, in_spark: bool
) -> None:
    """PySpark's daemon collects garbage after every task of a reused worker: after its first task a
    worker's objects are frozen, so those collections scan only what later tasks make. A process
    that is not a Spark worker (no task context) is left alone."""
    pytest.importorskip("pyspark")
    from pyspark import cloudpickle

    from statestore.restore.spark import _make_task_function

    payloads = [
        _payload(PartitionWork.of(APP, "counts", p), str(changelogs), str(tmp_path / "state"), max_attempts=1)
        for p in (1, 2)
    ]
    (tmp_path / "fn.pkl").write_bytes(cloudpickle.dumps(_make_task_function(payloads)))
    child = textwrap.dedent(f"""
        import gc, pickle
        import pyspark
        from statestore.restore.work import RestoreRow

        class Task:
            def attemptNumber(self): return 0
            def cpus(self): return 1
            def stageId(self): return 1
            def taskAttemptId(self): return 7

        if {in_spark!r}:
            pyspark.TaskContext.get = staticmethod(lambda: Task())
        fn = pickle.loads(open({str(tmp_path / "fn.pkl")!r}, "rb").read())
        statuses, frozen = [], []
        for i in (0, 1):
            statuses += [RestoreRow(*r).status for r in fn(i, iter([i]))]
            frozen.append(gc.get_freeze_count())
        print(repr((statuses, frozen, len(gc.get_objects()))))
    """)
    out = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=120, check=True
    )
    statuses, frozen, scanned = eval(out.stdout)
    assert statuses == ["ok", "ok"], out.stdout
    if in_spark:
        assert frozen[0] > 10_000, frozen  # pyspark, statestore and their modules
        assert frozen[1] == frozen[0], "frozen once per worker"
        assert scanned < frozen[0] / 4, (scanned, frozen)  # what the daemon's collections still scan
    else:
        assert frozen == [0, 0]


# -- planning and the CLI --------------------------------------------------------------------------


def test_plan_and_partition_lists(changelogs: Path) -> None:
    assert parse_partitions("0-3,6, 9") == [0, 1, 2, 3, 6, 9]
    for bad in ("", "a", "3-1", "1-"):
        with pytest.raises(ValueError):
            parse_partitions(bad)
    assert changelog_stores(changelogs, APP) == sorted(STORES)
    work = plan(changelogs, APP, {"counts": 1, "totals": 0}, None)
    assert [(w.store, str(w.task_id)) for w in work][:2] == [("counts", "1_0"), ("counts", "1_1")]
    assert len(work) == 2 * PARTITIONS
    assert [w.tp.partition for w in plan(changelogs, APP, ["counts"], [5, 2, 2])] == [2, 5]
    with pytest.raises(Exception, match="no partition of changelog app-nope-changelog"):
        plan(changelogs, APP, ["nope"])


def test_cli_restore_in_process(tmp_path: Path, changelogs: Path) -> None:
    state = tmp_path / "state"
    args = [
        "restore",
        "--log-dir",
        str(changelogs),
        "--state-dir",
        str(state),
        "--app-id",
        APP,
        "--partitions",
        "0-2",
        "--threads",
        "2",
    ]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "counts" in res.output and "totals" in res.output and "6 ok" in res.output
    ref = tmp_path / "ref"
    ref.mkdir()
    restore_store(ref / "s", changelogs, TopicPartition(changelog_topic(APP, "totals"), 2))
    assert dump(store_path(state, "totals", 2)) == dump(ref / "s")
    # A damaged segment fails its partition: the table says so and the exit code is 1.
    broken = tmp_path / "broken"
    write_changelogs(broken, stores=("counts",), partitions=1, records=50)
    seg = next((broken / f"{changelog_topic(APP, 'counts')}-0").glob("*.log"))
    data = bytearray(seg.read_bytes())
    data[70] ^= 0xFF
    seg.write_bytes(bytes(data))
    res = CliRunner().invoke(
        main,
        [
            "restore",
            "--log-dir",
            str(broken),
            "--state-dir",
            str(tmp_path / "s2"),
            "--app-id",
            APP,
            "--store",
            "counts",
            "--mode",
            "replay",
        ],
    )
    assert res.exit_code == 1, res.output
    assert "failed" in res.output


@pytest.mark.spark
def test_cli_restore_on_spark(spark: Any, changelogs: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    res = CliRunner().invoke(
        main,
        [
            "restore",
            "--engine",
            "spark",
            "--log-dir",
            str(changelogs),
            "--state-dir",
            str(state),
            "--app-id",
            APP,
            "--store",
            "counts",
            "--partitions",
            "0-1",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "2 ok, 0 failed" in res.output and "(spark)" in res.output
    assert store_path(state, "counts", 1).is_dir() and not store_path(state, "counts", 2).exists()
    assert not spark.sparkContext._jsc.sc().isStopped(), "the CLI leaves a session it did not start running"


@pytest.mark.spark
def test_local_session_driver_runs_the_quick_compiler_only(spark: Any) -> None:
    """The JVM that spark_session started got LOCAL_DRIVER_JAVA_OPTIONS (read back from the running JVM)."""
    from statestore.restore.spark import LOCAL_DRIVER_JAVA_OPTIONS

    args = list(
        spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
    )
    assert LOCAL_DRIVER_JAVA_OPTIONS in args, args
    assert LOCAL_DRIVER_JAVA_OPTIONS in spark.sparkContext.getConf().get("spark.driver.extraJavaOptions")


@pytest.mark.spark
def test_result_rows_come_back_exactly_without_another_job(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rows_frame: any text (quotes, backslashes, newlines, non-ASCII), nulls, big ints and floats survive;
    collecting the inline table runs no Spark job; the createDataFrame fallback gives the same rows."""
    import statestore.restore.spark as ss

    rows = [
        (
            "0_3",
            "s",
            "app-s-changelog",
            3,
            0,
            2**40,
            2**40,
            7,
            2**33,
            1e-05,
            "bulk",
            "ok",
            None,
            0,
            2**40,
            1,
            None,
        ),
        (
            "1_0",
            "t'x",
            "app-t'x-changelog",
            0,
            None,
            None,
            0,
            0,
            0,
            0.25,
            "replay",
            "failed",
            "it's a \\ 'quoted' \"error\" ü\nsecond line; DROP TABLE x; --",
            None,
            None,
            3,
            "attempt 1 on h (executor 0): failed: x\nattempt 2 on h (executor 1): killed: y",
        ),
    ]
    sc = spark.sparkContext
    tracker = sc.statusTracker()
    before = set(tracker.getJobIdsForGroup(None))
    got = [tuple(r) for r in ss.rows_frame(spark, rows).collect()]
    assert got == rows
    assert set(tracker.getJobIdsForGroup(None)) == before, "collecting the inline table ran a Spark job"
    assert [f.name for f in ss.rows_frame(spark, rows).schema.fields] == [c for c, _ in RESULT_COLUMNS]
    monkeypatch.setattr(ss, "INLINE_ROWS_MAX", 1)
    assert [tuple(r) for r in ss.rows_frame(spark, rows).collect()] == rows


def test_executors_default_to_this_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    from statestore.restore.spark import _default_python

    class Conf:
        def get(self, key: str) -> str | None:
            return None

    class Context:
        pythonExec = "python3"

        def getConf(self) -> Conf:
            return Conf()

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    sc = Context()
    _default_python(sc)
    assert os.environ["PYSPARK_PYTHON"] == sys.executable and sc.pythonExec == sys.executable
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/python")
    sc.pythonExec = "/opt/python"
    _default_python(sc)
    assert sc.pythonExec == "/opt/python"


def test_unexpected_errors_raise_while_spark_can_retry_then_become_rows(
    tmp_path: Path, changelogs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from statestore.restore.spark import _max_attempts, _spark_task

    assert [_max_attempts(m, None) for m in ("local", "local[2]", "local[*]", "local[2,3]", "yarn")] == [
        1,
        1,
        1,
        3,
        4,
    ]
    assert _max_attempts("spark://h:7077", "8") == 8
    monkeypatch.setenv(FAIL_ATTEMPT_ENV, "counts:6:0")
    work = PartitionWork.of(APP, "counts", 6)
    with pytest.raises(InjectedFailure):  # attempt 1 of 2: Spark retries it
        _spark_task(_payload(work, str(changelogs), str(tmp_path / "state"), max_attempts=2), 0, "t")
    # attempt 1 of 1: the row says why
    last = _spark_task(_payload(work, str(changelogs), str(tmp_path / "state"), max_attempts=1), 0, "t")
    assert (
        last.status == "failed"
        and "InjectedFailure" in (last.error or "")
        and "attempt 1 of 1" in (last.error or "")
    )
    assert socket.gethostname() in (last.error or "")
    assert no_staging_left(tmp_path / "state")


def test_sweep_removes_what_killed_attempts_left_unless_the_task_is_locked(
    tmp_path: Path, changelogs: Path
) -> None:
    from statestore.restore.staging import sweep_staging

    state = tmp_path / "state"
    for p in (3, 4):
        killed = state / APP / f"0_{p}" / STAGING_DIR_NAME / "counts" / "s0-t9-a1-123-abc"
        killed.mkdir(parents=True)
        restore_store(
            killed / "store", changelogs, TopicPartition(changelog_topic(APP, "counts"), p), end_offset=20
        )
    work = plan(changelogs, APP, ["counts"], [3, 4, 5])
    with StateDirectory(state, APP, shared=True) as other:  # another attempt is running on task 0_4
        assert other.lock(TaskId(0, 4))
        assert sweep_staging(state, APP, work) == 1  # the lock is an OS lock: a second opener is excluded
    assert not (state / APP / "0_3" / STAGING_DIR_NAME).exists()
    assert (state / APP / "0_4" / STAGING_DIR_NAME / "counts" / "s0-t9-a1-123-abc" / "store").is_dir()
    assert sweep_staging(state, APP, work) == 1 and no_staging_left(state)
    assert sweep_staging(tmp_path / "elsewhere", APP, work) == 0


def test_attempt_killed_while_restoring_leaves_the_previous_store(tmp_path: Path) -> None:
    import signal
    import time

    log_dir = tmp_path / "log"
    write_changelogs(log_dir, stores=("counts",), partitions=1, records=60_000)
    state = tmp_path / "state"
    tp = TopicPartition(changelog_topic(APP, "counts"), 0)
    target = store_path(state, "counts", 0)
    target.parent.mkdir(parents=True)
    restore_store(target, log_dir, tp, end_offset=50)
    before = dump(target)
    (tmp_path / "ref").mkdir()
    restore_store(tmp_path / "ref" / "s", log_dir, tp)
    full = dump(tmp_path / "ref" / "s")
    child = (
        "from statestore.restore.staging import restore_partition\n"
        f"restore_partition(log_dir={str(log_dir)!r}, state_dir={str(state)!r}, application_id={APP!r}, "
        "store='counts', partition=0, mode='replay')\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", child])
    staging = state / APP / "0_0" / STAGING_DIR_NAME / "counts"
    while proc.poll() is None and not any(staging.glob("*/store")):
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert dump(target) in (before, full), "the store in place is the previous one or the complete new one"
    row = restore_partition(log_dir=log_dir, state_dir=state, application_id=APP, store="counts", partition=0)
    assert row.ok and dump(target) == full
    assert no_staging_left(state)


def test_a_master_nobody_answers_is_a_cluster_error_at_once() -> None:
    """spark_session checks that a standalone master accepts connections before starting a driver that
    would retry registering with it for a minute."""
    import time

    from statestore.errors import ClusterError
    from statestore.restore.spark import spark_session

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, never listening: nobody answers
        url = f"spark://127.0.0.1:{s.getsockname()[1]}"
        t0 = time.monotonic()
        with pytest.raises(ClusterError, match=f"Spark master {url} does not answer"):
            spark_session(url)
        assert time.monotonic() - t0 < 10
    with pytest.raises(ClusterError, match="is not host:port"):
        spark_session("spark://nohost")
