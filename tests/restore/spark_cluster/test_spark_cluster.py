"""``restore_on_spark`` on a real standalone cluster: separate executor JVMs that can die on their own.

The cluster (``scripts/spark-cluster.sh``: a master and two 1-core workers on
127.0.0.1) runs jobs submitted with ``spark-submit`` -- the driver is a
process of its own, as in production -- whose executors run this
interpreter. Checked: the restored application -- from a segment log, and from
a Kafka 4.4 broker with aborted transactions -- equals an in-process
``restore_many`` store by store, offsets included; SIGKILLing an executor JVM
or a Python worker in the middle of a task is retried by Spark and leaves
exact stores and no staging leftovers; two jobs over the same state directory
restore each partition once; the rows say which attempts failed and why.
Bad input ends within a bounded time with an error naming what is wrong: a
master nobody answers, a host without the state directory, a log directory
the executors cannot see, a host whose Python cannot import statestore.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from statestore import SegmentLog, TopicPartition
from statestore.restore.engine import RestoreSpec, restore_many
from statestore.restore.staging import STAGING_DIR_NAME
from support import ROOT
from support.kafka_writes import settle
from support.model import store_contents
from support.restore_data import write_changelog

APP = "cluster-app"
STORES = {"counts": 8, "totals": 8}
JOB = ROOT / "examples" / "restore_job.py"


def spark_submit(master: str, *args: str, conf: tuple[str, ...] = ()) -> list[str]:
    """The ``spark-submit`` command of the example job, as docs/spark.md shows it; ``conf``: more ``K=V``."""
    import pyspark

    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    more = [a for kv in conf for a in ("--conf", kv)]
    return [
        str(submit),
        "--master",
        master,
        "--conf",
        f"spark.pyspark.python={sys.executable}",
        "--conf",
        "spark.driver.host=127.0.0.1",
        "--conf",
        "spark.driver.bindAddress=127.0.0.1",
        "--conf",
        "spark.executor.memory=512m",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.task.maxFailures=4",
        *more,
        str(JOB),
        *args,
    ]


@pytest.fixture(scope="module")
def app_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    log = tmp_path_factory.mktemp("cluster-log") / "log"
    for i, store in enumerate(STORES):
        write_changelog(log, f"{APP}-{store}-changelog", STORES[store], 120_000, 12_000, seed=i + 1)
    return log


def expected_stores(source: Any, root: Path, app: str) -> dict[str, Path]:
    """Every store of ``app`` restored in this process from ``source`` (a log directory or a changelog)."""
    root.mkdir(parents=True, exist_ok=True)
    specs, names = [], {}
    for store, parts in STORES.items():
        for p in range(parts):
            path = root / f"{store}-{p}"
            specs.append(RestoreSpec(path, source, TopicPartition(f"{app}-{store}-changelog", p)))
            names[f"0_{p}/{store}"] = path
    results = restore_many(specs, threads=2)
    assert all(r.ok for r in results), [r.error for r in results]
    return names


def assert_same_as_in_process(source: Any, state: Path, tmp_path: Path, app: str = APP) -> None:
    for key, expected in expected_stores(source, tmp_path / "expected", app).items():
        task, store = key.split("/")
        got = state / app / task / "rocksdb" / store
        a, b = store_contents(got), store_contents(expected)
        assert (a.data, a.offsets) == (b.data, b.offsets), f"{key} differs"
        assert a.data, f"{key}: an empty store proves nothing"
        assert not list((state / app / task).glob(f"{STAGING_DIR_NAME}/*/*")), f"{key}: staging leftovers"


def test_a_submitted_job_restores_the_application_exactly(
    spark_cluster: tuple[str, Path], app_log: Path, tmp_path: Path
) -> None:
    master, _ = spark_cluster
    state = tmp_path / "state"
    state.mkdir()
    out = subprocess.run(
        spark_submit(master, "--log-dir", str(app_log), "--state-dir", str(state), "--app-id", APP),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"{sum(STORES.values())} ok, 0 failed" in out.stdout
    assert_same_as_in_process(app_log, state, tmp_path)
    # A second job finds every partition up to date.
    again = subprocess.run(
        spark_submit(master, "--log-dir", str(app_log), "--state-dir", str(state), "--app-id", APP),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("records=0 ") == sum(STORES.values())


def write_kafka_changelogs(changelog: Any, app: str, seed: int) -> tuple[dict[str, int], int]:
    """Every store's changelog on the broker: transactions over all 8 partitions, every fourth aborted
    after its records were delivered. Returns the committed records per ``"<task> <store>"`` and how many
    records the aborted transactions wrote."""
    rng = random.Random(seed)
    committed: dict[str, int] = {}
    aborted = 0
    for store, parts in STORES.items():
        topic = f"{app}-{store}-changelog"
        producer = changelog.producer(f"{topic}-writer")
        for t in range(24):
            producer.begin()
            records = [
                (
                    rng.randrange(parts),
                    b"k%05d" % rng.randrange(2000),
                    None if rng.random() < 0.05 else rng.randbytes(rng.randrange(10, 200)),
                )
                for _ in range(rng.randrange(200, 800))
            ]
            for p, k, v in records:
                producer.send(topic, p, k, v)
            if t % 4 == 3:
                producer.flush()  # delivered, then aborted: in the log, never in a store
                producer.abort()
                aborted += len(records)
            else:
                producer.commit()
                for p, _, _ in records:
                    committed[f"0_{p} {store}"] = committed.get(f"0_{p} {store}", 0) + 1
        producer.close()
        for p in range(parts):
            settle(changelog, TopicPartition(topic, p))
    return committed, aborted


@pytest.mark.kafka
def test_a_submitted_job_restores_the_application_from_kafka_exactly(
    spark_cluster: tuple[str, Path], kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The same job with ``--kafka``: each executor fetches its partitions from the broker natively,
    applies exactly the committed records and skips the aborted ones."""
    from statestore.changelog.kafka import KafkaChangelog, ensure_changelog_topics

    master, _ = spark_cluster
    app = f"cluster-kafka-{uuid.uuid4().hex[:6]}"
    changelog = KafkaChangelog(kafka_bootstrap, request_timeout=30.0)
    try:
        ensure_changelog_topics(changelog, app, list(STORES), 8)
        committed, aborted = write_kafka_changelogs(changelog, app, seed=3)
        assert aborted > 0 and len(committed) == sum(STORES.values())
        state = tmp_path / "state"
        state.mkdir()
        out = subprocess.run(
            spark_submit(master, "--kafka", kafka_bootstrap, "--state-dir", str(state), "--app-id", app),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        assert f"{sum(STORES.values())} ok, 0 failed" in out.stdout, out.stdout
        applied = {
            " ".join(line.split()[:2]): int(line.split()[3].removeprefix("records="))
            for line in out.stdout.splitlines()
            if line.startswith("0_")
        }
        assert applied == committed
        assert_same_as_in_process(changelog, state, tmp_path, app)
    finally:
        changelog.close()


def processes(pattern: str, under: Path) -> list[int]:
    """Pids whose command line has ``pattern`` and whose working directory is under ``under``."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(d / "cwd")
        except OSError:
            continue
        if pattern in cmd and cwd.startswith(str(under)):
            out.append(int(d.name))
    return out


def parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def busy_python_worker(under: Path) -> int | None:
    """A Python worker forked by an executor's pyspark daemon (forks share the daemon's command line)."""
    pys = set(processes("pyspark.daemon", under))
    daemons = {p for p in pys if parent(p) not in pys}
    workers = [p for p in pys if parent(p) in daemons]
    return workers[0] if workers else None


# How Spark's driver names the failure of an attempt whose process was killed. A Python worker's
# death reaches the executor either as the end of what it reads from the worker or, when the
# executor was writing to it at that moment, as a broken or reset pipe: which one is a race.
KILLED_AS_SPARK_SAYS = {
    "executor JVM": ("ExecutorLostFailure",),
    "Python worker": ("Python worker exited unexpectedly", "Broken pipe", "Connection reset by peer"),
}


@pytest.mark.parametrize("victim", list(KILLED_AS_SPARK_SAYS))
def test_a_killed_executor_or_worker_is_retried_and_the_stores_are_exact(
    spark_cluster: tuple[str, Path], app_log: Path, tmp_path: Path, victim: str
) -> None:
    master, cluster_dir = spark_cluster
    state = tmp_path / "state"
    state.mkdir()
    job = subprocess.Popen(
        spark_submit(master, "--log-dir", str(app_log), "--state-dir", str(state), "--app-id", APP),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    killed = None
    deadline = time.monotonic() + 300
    while killed is None and time.monotonic() < deadline and job.poll() is None:
        if list(state.glob(f"{APP}/*/{STAGING_DIR_NAME}/*/*")):  # a task is in the middle of its restore
            if victim == "executor JVM":
                pids = processes("CoarseGrainedExecutorBackend", cluster_dir)
                killed = pids[0] if pids else None
            else:
                killed = busy_python_worker(cluster_dir)
            if killed is not None:
                os.kill(killed, signal.SIGKILL)
        time.sleep(0.02)
    stdout, stderr = job.communicate(timeout=600)
    assert killed is not None, f"no {victim} was caught in the middle of a task"
    assert job.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert f"{sum(STORES.values())} ok, 0 failed" in stdout, stdout
    assert_same_as_in_process(app_log, state, tmp_path)
    # The rows say which attempts failed, where, and why (as Spark's driver saw it).
    retried = [line for line in stdout.splitlines() if " attempts=" in line and " attempts=1" not in line]
    failures = [line.strip() for line in stdout.splitlines() if line.startswith("    attempt ")]
    assert retried and failures, stdout
    assert all(f.startswith("attempt ") and " on 127.0.0.1 (executor " in f for f in failures), failures
    assert any(why in f for f in failures for why in KILLED_AS_SPARK_SAYS[victim]), failures


def test_two_concurrent_jobs_restore_each_partition_once(
    spark_cluster: tuple[str, Path], app_log: Path, tmp_path: Path
) -> None:
    master, _ = spark_cluster
    state = tmp_path / "state"
    state.mkdir()
    cmd = spark_submit(
        master, "--log-dir", str(app_log), "--state-dir", str(state), "--app-id", APP, "--store", "counts"
    )
    jobs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    outs = [j.communicate(timeout=600) for j in jobs]
    assert all(j.returncode == 0 for j in jobs), [o[1][-2000:] for o in outs]
    applied: dict[str, int] = {}
    for stdout, _ in outs:
        for line in stdout.splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[2] == "ok":
                applied[parts[0]] = applied.get(parts[0], 0) + int(parts[3].removeprefix("records="))
    # Every partition's records were applied once in all: one job restored it, the other found it up to date.
    assert applied == {f"0_{p}": 120_000 for p in range(8)}, applied
    log = SegmentLog(app_log)
    for p in range(8):
        offsets = store_contents(state / APP / f"0_{p}" / "rocksdb" / "counts").offsets
        assert offsets == {f"{APP}-counts-changelog-{p}": log.end_offset((f"{APP}-counts-changelog", p)) - 1}
    shutil.rmtree(state)


def test_a_host_that_cannot_import_statestore_answers_with_rows_saying_so(
    app_log: Path, tmp_path: Path
) -> None:
    """A cluster of its own whose second worker's Python cannot import statestore (its environment hides
    the package, as on a host where the wheel was never installed): the job ends, that host's rows say
    what is missing and where, the other host's partitions are restored."""
    script = ROOT / "scripts" / "spark-cluster.sh"
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        'import sys\nsys.modules["statestore"] = None  # not installed here\n'
    )
    cluster = tmp_path / "cluster"
    env = {**os.environ, "PYTHON": sys.executable, "WORKER2_ENV": f"PYTHONPATH={hide}"}
    out = subprocess.run(
        ["bash", str(script), "start", str(cluster), "2"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    master = dict(kv.split("=", 1) for kv in out.stdout.split())["master"]
    try:
        state = tmp_path / "state"
        state.mkdir()
        # Both executors registered before the first task, so each host gets some.
        cmd = spark_submit(
            master,
            "--log-dir",
            str(app_log),
            "--state-dir",
            str(state),
            "--app-id",
            APP,
            "--store",
            "counts",
            conf=(
                "spark.scheduler.minRegisteredResourcesRatio=1.0",
                "spark.scheduler.maxRegisteredResourcesWaitingTime=120s",
            ),
        )
        t0 = time.monotonic()
        job = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        elapsed = time.monotonic() - t0
    finally:
        subprocess.run(["bash", str(script), "stop", str(cluster)], capture_output=True, timeout=120)
    rows = [line for line in job.stdout.splitlines() if line.startswith("0_")]
    assert job.returncode == 1 and len(rows) == 8, job.stdout[-3000:] + job.stderr[-3000:]
    failed = [r for r in rows if " failed " in r]
    assert failed and len(failed) < len(rows), rows
    for r in failed:
        assert (
            f"statestore cannot be imported on executor host {os.uname().nodename} by {sys.executable}" in r
        ), r
        assert "attempts=1 " in r, "an import error is a row at once, not a retry"
    assert elapsed < 300, elapsed


def test_bad_input_ends_in_bounded_time_naming_host_and_path(
    spark_cluster: tuple[str, Path], app_log: Path, tmp_path: Path
) -> None:
    """A master nobody answers is a ClusterError at once; a state directory missing on the executors (a
    filesystem not mounted there) and a log directory they cannot see are failed rows naming the host and
    the path, and nothing is created in their place."""
    import socket

    master, _ = spark_cluster
    host = socket.gethostname()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"spark://127.0.0.1:{s.getsockname()[1]}"  # bound, never listening: nobody answers
        t0 = time.monotonic()
        out = subprocess.run(
            spark_submit(dead, "--log-dir", str(app_log), "--state-dir", str(tmp_path), "--app-id", APP),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode != 0
        said = out.stdout + out.stderr  # spark-submit passes the Python driver's stderr on as its stdout
        assert f"ClusterError: Spark master {dead} does not answer" in said, said[-3000:]
        assert time.monotonic() - t0 < 120

    unmounted = tmp_path / "not-mounted" / "state"
    out = subprocess.run(
        spark_submit(
            master,
            "--log-dir",
            str(app_log),
            "--state-dir",
            str(unmounted),
            "--app-id",
            APP,
            "--store",
            "counts",
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    rows = [line for line in out.stdout.splitlines() if line.startswith("0_")]
    assert out.returncode == 1 and len(rows) == 8, out.stdout[-3000:] + out.stderr[-3000:]
    for r in rows:
        assert f"state directory {unmounted} does not exist on host {host}" in r, r
    assert not unmounted.exists(), "nothing is created where the shared filesystem should be"

    state = tmp_path / "state"
    state.mkdir()
    missing_log = tmp_path / "log-not-mounted"
    out = subprocess.run(
        spark_submit(
            master,
            "--log-dir",
            str(missing_log),
            "--state-dir",
            str(state),
            "--app-id",
            APP,
            "--store",
            "counts",
            "--partitions",
            "0-3",
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    rows = [line for line in out.stdout.splitlines() if line.startswith("0_")]
    assert out.returncode == 1 and len(rows) == 4, out.stdout[-3000:] + out.stderr[-3000:]
    for r in rows:
        assert str(missing_log) in r and f"host {host}" in r and " failed " in r, r
    assert not list(state.glob(f"{APP}/*/rocksdb/*")), "no store is left from a log that was not there"
