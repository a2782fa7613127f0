"""Restoring on Spark (issue 7), each baseline measured in the same run.

(a) ``restore_on_spark`` on local[2] vs local[1]: 8 partitions of 2M records
    each at scale 1.0 (goal >= 1.7x; the goal asks for >= 500k: partitions are
    larger where Spark is worth using, and the fixed costs below are reported
    apart). 7 rounds alternate between the two masters, a fresh session each,
    and each session runs the same job twice. The ratio compares the second
    jobs: the steady state of a running application, which is what scales
    with slots. A session's first job also starts its Python workers: each
    worker's first restore faults in its collector's memory (0.1-0.3 s on this
    VM, whose host backs fresh memory lazily), once per worker and in parallel
    on both sides, so a fixed cost like Spark's own; those first jobs' ratio
    is recorded beside (``cold_ratio``). The ratio is that of the medians: on
    this shared VM one round in a few stalls for a second or more (the host,
    not the job), which a mean would book on one side only. The ratio of the
    means and every round's time are recorded too.
(b) ``restore_on_spark`` on local[2] vs in-process ``restore_many(threads=2)``
    on the same work (goal >= 0.8: Spark's overhead stays small), with Spark's
    fixed costs: ``job_overhead_s``, the wall time of a job of one task with
    nothing to restore (the store is up to date), and ``task_overhead_s``, the
    wall time each further such task adds to a job on local[2] (so about half
    of the core time a task costs, with two slots). Rounds alternate between
    baseline and candidate.

Every timed restore starts from an empty state directory (bulk mode).
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import run_times, scaled
from statestore import TopicPartition, changelog_topic
from statestore.changelog.segment_log import SegmentLog
from statestore.restore.engine import RestoreSpec, restore_many
from statestore.restore.spark import restore_on_spark, spark_session

pyspark = pytest.importorskip("pyspark")


APP = "bench"
STORE = "s"
PARTITIONS = 8
N = scaled(2_000_000, minimum=20_000)  # records per partition
KEYS = N // 5
ROUNDS = 3
SLOT_ROUNDS = 7
NOOP_ROUNDS = 5


def write_changelogs(log_dir: Path) -> None:
    """``N`` records of 100-byte values per partition over ``KEYS`` keys, written in large batches."""
    rng = random.Random(3)
    values = [rng.randbytes(100) for _ in range(997)]
    producer = SegmentLog(log_dir, sync=False).producer()
    topic = changelog_topic(APP, STORE)
    for p in range(PARTITIONS):
        keys = [rng.randrange(KEYS) for _ in range(N)]
        for start in range(0, N, 20_000):
            chunk = [
                (b"key-%012d" % k, values[(start + i) % 997])
                for i, k in enumerate(keys[start : start + 20_000])
            ]
            producer.send_many(topic, p, chunk)
        producer.flush()
    producer.close()


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("spark-bench") / "log"
    t0 = time.perf_counter()
    write_changelogs(d)
    os.sync()  # no writeback of the fresh log may run during the timed rounds
    print(f"\nspark benchmark data: {PARTITIONS} x {N:,} records written in {time.perf_counter() - t0:.1f}s")
    return d


def session(master: str) -> Any:
    """A fresh session on ``master`` (the previous one stopped), its two Python workers started."""
    active = pyspark.sql.SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    s = spark_session(master, "statestore-bench")
    s.sparkContext.parallelize(range(4), 4).map(
        lambda x: __import__("statestore.restore.spark").__name__
    ).collect()
    s.createDataFrame([(1, "a")], "x int, y string").collect()  # the SQL side's first-use costs
    return s


@pytest.fixture(scope="module")
def spark2() -> Iterator[Any]:
    s = session("local[2]")
    yield s
    s.stop()


def fresh(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


def spark_restore(spark: Any, log_dir: Path, state: Path, partitions: list[int] | None = None) -> list[Any]:
    rows = restore_on_spark(
        spark, log_dir=log_dir, state_dir=state, application_id=APP, stores=[STORE], partitions=partitions
    ).collect()
    assert all(r.status == "ok" for r in rows), [r.error for r in rows if r.status != "ok"]
    return rows


def load() -> float:
    """The 1-minute load average: on a shared machine, the context of every figure."""
    return round(os.getloadavg()[0], 2)


def task_seconds(rows: list[Any]) -> float:
    """Sum of the tasks' own wall times: grows with contention for cores, not with Spark's scheduling."""
    return round(sum(r.seconds for r in rows), 3)


def record(
    benchmark: Any, baseline: str, candidate: str, base_s: float, cand_s: float, goal: float, **extra: Any
) -> None:
    ratio = base_s / cand_s
    benchmark.extra_info.update(
        {"baseline": baseline, "candidate": candidate, "ratio": ratio, "goal": goal, **extra}
    )
    print(f"\n{candidate} vs {baseline}: {ratio:.2f}x (goal >= {goal}) {extra}")


def test_a_spark_two_slots_vs_one(benchmark: Any, log_dir: Path, tmp_path: Path) -> None:
    """Rounds alternate local[1] and local[2], so drifting load on a shared machine weighs on both
    alike: each round's setup runs local[1]'s two jobs and local[2]'s first, then the timed call is
    local[2]'s second job."""
    state = tmp_path / "state"
    load_before = load()
    times: dict[str, list[float]] = {"local1_cold": [], "local1": [], "local2_cold": []}
    rows: dict[str, list[Any]] = {}
    current: list[Any] = []

    def timed(spark: Any, name: str) -> list[Any]:
        fresh(state)
        t0 = time.perf_counter()
        result = spark_restore(spark, log_dir, state)
        times[name].append(time.perf_counter() - t0)
        return result

    def setup() -> None:
        one = session("local[1]")
        try:
            timed(one, "local1_cold")
            rows["one"] = timed(one, "local1")
        finally:
            one.stop()
        current[:] = [session("local[2]")]
        timed(current[0], "local2_cold")
        fresh(state)

    def candidate() -> None:
        rows["two"] = spark_restore(current[0], log_dir, state)

    try:
        benchmark.pedantic(candidate, setup=setup, rounds=SLOT_ROUNDS, iterations=1)
    finally:
        if current:
            current[0].stop()
    base = statistics.median(times["local1"])
    cand = float(benchmark.stats.stats.median)
    cand_s = list(benchmark.stats.stats.data)
    cold1, cold2 = statistics.median(times["local1_cold"]), statistics.median(times["local2_cold"])

    def rounds(ts: list[float]) -> str:
        return " ".join(f"{t:.2f}" for t in ts)

    record(
        benchmark,
        "restore_on_spark local[1]",
        "restore_on_spark local[2]",
        base,
        cand,
        1.7,
        partitions=PARTITIONS,
        records_per_partition=N,
        rounds=SLOT_ROUNDS,
        local1_s=base,
        local2_s=cand,
        ratio_of_means=statistics.mean(times["local1"]) / statistics.mean(cand_s),
        cold_ratio=cold1 / cold2,
        local1_cold_s=cold1,
        local2_cold_s=cold2,
        local1_rounds_s=rounds(times["local1"]),
        local2_rounds_s=rounds(cand_s),
        local1_cold_rounds_s=rounds(times["local1_cold"]),
        local2_cold_rounds_s=rounds(times["local2_cold"]),
        local1_task_s_sum=task_seconds(rows["one"]),
        local2_task_s_sum=task_seconds(rows["two"]),
        load_before=load_before,
        load_after=load(),
    )


def test_b_spark_vs_restore_many(benchmark: Any, log_dir: Path, tmp_path: Path, spark2: Any) -> None:
    state = tmp_path / "state"
    local = tmp_path / "local"
    tps = [TopicPartition(changelog_topic(APP, STORE), p) for p in range(PARTITIONS)]

    def in_process() -> None:
        specs = []
        for tp in tps:
            parent = local / APP / f"0_{tp.partition}" / "rocksdb"
            parent.mkdir(parents=True, exist_ok=True)
            specs.append(RestoreSpec(parent / STORE, log_dir, tp))
        assert all(r.ok for r in restore_many(specs, threads=2))

    load_before = load()
    base_s: list[float] = []

    def setup() -> None:  # rounds alternate: in-process baseline, then the timed Spark job
        base_s.append(statistics.mean(run_times(in_process, lambda: fresh(local), 1)))
        fresh(state)

    benchmark.pedantic(
        lambda: spark_restore(spark2, log_dir, state), setup=setup, rounds=ROUNDS, iterations=1
    )
    base = sum(base_s) / len(base_s)
    cand = float(benchmark.stats.stats.mean)

    # Fixed costs: jobs whose tasks find their stores up to date (state restored by the last round).
    def noop(parts: list[int]) -> float:
        runs = run_times(lambda: spark_restore(spark2, log_dir, state, parts), lambda: None, NOOP_ROUNDS)
        return statistics.mean(runs)

    job1 = noop([0])
    job8 = noop(list(range(PARTITIONS)))
    per_task = (job8 - job1) / (PARTITIONS - 1)
    record(
        benchmark,
        "restore_many threads=2",
        "restore_on_spark local[2]",
        base,
        cand,
        0.8,
        partitions=PARTITIONS,
        records_per_partition=N,
        in_process_s=base,
        spark_s=cand,
        job_overhead_s=job1,
        task_overhead_s=per_task,
        noop_job_8_tasks_s=job8,
        load_before=load_before,
        load_after=load(),
    )
