"""Restoring many stores on Spark executors, one Spark task per (store, changelog partition): the Spark glue.

:func:`restore_on_spark` plans the work on the driver (:mod:`statestore.restore.planning`),
runs one Spark task per (store, partition) -- placed 1:1 by explicit
partitioning, so no hash skew -- and returns one row per (store, partition) as
a DataFrame (:data:`~statestore.restore.work.RESULT_COLUMNS`). Each task runs
:func:`statestore.restore.staging.restore_partition` inside the executor's Python
worker (the Rust restore engine, GIL released), which is safe under Spark's
retries and speculative execution (see :mod:`statestore.restore.staging`). The rows
say how many attempts each partition took and why the failed ones failed, as
Spark's driver saw it (an executor lost, a Python worker killed ...).

Importing this module does not import pyspark; only :func:`restore_on_spark`
and :func:`spark_session` do.
"""

from __future__ import annotations

import gc
import logging
import os
import re
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from statestore import _native
from statestore._testing.faults import FAIL_ATTEMPT_ENV
from statestore.errors import ClusterError
from statestore.restore.engine import DEFAULT_MEMORY_BUDGET
from statestore.restore.planning import plan
from statestore.restore.staging import (
    DEFAULT_LOCK_TIMEOUT,
    check_mode,
    kafka_changelog,
    kafka_conf,
    restore_partition,
    sweep_staging,
)
from statestore.restore.work import RESULT_COLUMNS, PartitionWork, RestoreRow
from statestore.state.layout import KIP_1035, layout_for
from statestore.state.policy import Guarantee
from statestore.state.store import check_format

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

logger = logging.getLogger(__name__)

#: JVM options :func:`spark_session` gives the driver of a local session (``conf`` may override them):
#: the quick compiler only. Restore tasks run in Python workers; the JVM just schedules them, and its
#: optimising compiler (C2) otherwise burns 0.7-0.9 s of CPU per 8-task job for a few jobs after
#: start -- time the restores running beside it lose on a small machine.
LOCAL_DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"
#: Default longest wait, in seconds, for the first executor of a cluster to join before a restore.
DEFAULT_EXECUTOR_TIMEOUT: float = 120.0
#: Longest wait, in seconds, for a standalone master to accept a connection (:func:`spark_session`).
MASTER_CONNECT_TIMEOUT: float = 5.0


def _max_attempts(master: str, conf_value: str | None) -> int:
    """How many attempts Spark gives a task: ``local[N,F]`` -> F, other local masters 1, else the conf."""
    m = re.fullmatch(r"local\[\s*(\d+|\*)\s*,\s*(\d+)\s*\]", master)
    if m is not None:
        return int(m.group(2))
    if master == "local" or re.fullmatch(r"local\[\s*(\d+|\*)\s*\]", master):
        return 1
    return int(conf_value) if conf_value else 4


def _is_local(master: str) -> bool:
    return master.startswith("local")


def _task_payload(work: PartitionWork, index: int, **job: Any) -> dict[str, Any]:
    """What the task for ``work`` receives: plain data only (a dict of builtins), so an executor that
    cannot import statestore can still unpickle it and answer with a row saying so.

    ``failed_row`` is that answer, built here with :meth:`RestoreRow.failed` and filled in there.
    """
    template = RestoreRow.failed(work, "{error}", mode=job["mode"], seconds=0.0)
    return {
        "index": index,
        "store": work.store,
        "subtopology": work.task_id.subtopology,
        "partition": work.tp.partition,
        "failed_row": tuple(template),
        "error_at": RestoreRow._fields.index("error"),
        "attempts_at": RestoreRow._fields.index("attempts"),
        **job,
    }


_worker_settled = False


def _settle_worker() -> None:
    """Once per Python worker of Spark, after its first task: collect, then move every object the
    worker holds (pyspark's, statestore's, their modules') to the garbage collector's permanent
    generation. Called by the task function only where a Spark task context exists.

    PySpark's daemon runs a full ``gc.collect()`` after every task of a reused worker: 10-13 ms
    over those ~35,000 objects, on the core the next task waits for. Frozen, they are no longer
    scanned; objects made later are collected as before, and reference counting frees frozen
    ones as ever (only a cycle among them would stay).
    """
    global _worker_settled
    if not _worker_settled:
        gc.collect()
        gc.freeze()
        _worker_settled = True


def _spark_task(payload: dict[str, Any], attempt: int, label: str, cpus: int = 1) -> RestoreRow:
    """Run one (store, partition) inside a Spark task. Unknown errors raise while Spark may retry."""
    host = socket.gethostname()
    t0 = time.perf_counter()
    work = PartitionWork.of(
        payload["application_id"], payload["store"], payload["partition"], payload["subtopology"]
    )
    max_attempts: int = payload["max_attempts"]
    try:
        row = restore_partition(
            log_dir=payload.get("log_dir"),
            kafka=payload.get("kafka"),
            state_dir=payload["state_dir"],
            application_id=payload["application_id"],
            store=work.store,
            partition=work.tp.partition,
            subtopology=work.task_id.subtopology,
            mode=payload["mode"],
            guarantee=payload["guarantee"],
            memory_budget_bytes=payload["memory_budget_bytes"],
            lock_timeout=payload["lock_timeout"],
            attempt=attempt,
            attempt_label=label,
            cpus=cpus,
            create_state_dir=payload["create_state_dir"],
            format=payload["format"],
            layout=payload.get("layout", KIP_1035.name),
            retention_ms=payload["retention_ms"],
            segment_interval_ms=payload["segment_interval_ms"],
        )
    except Exception as e:
        if attempt + 1 < max_attempts:
            raise  # Spark retries the task
        return RestoreRow.failed(
            work,
            f"{type(e).__name__}: {e} (attempt {attempt + 1} of {max_attempts}, host {host})",
            mode=payload["mode"],
            seconds=time.perf_counter() - t0,
            attempts=attempt + 1,
        )
    if not row.ok and row.error is not None and host not in row.error:
        row = row._replace(error=f"{row.error} (host {host})")
    return row


def _make_task_function(
    payloads: list[dict[str, Any]],
) -> Callable[[int, Iterable[int]], Iterator[tuple[Any, ...]]]:
    """The function Spark runs for partition ``index``: restores ``payloads[index]``.

    It is a closure over plain data, so Spark ships it by value: the executor
    can run it, and report clearly, even when statestore itself cannot be
    imported there.
    """

    def run(index: int, _rows: Iterable[int]) -> Iterator[tuple[Any, ...]]:
        import os as _os
        import sys as _sys

        payload = payloads[index]
        attempt, cpus, label, in_worker = 0, 1, "local", False
        try:
            from pyspark import TaskContext

            tc = TaskContext.get()
            in_worker = tc is not None
            if tc is not None:
                attempt = tc.attemptNumber()
                cpus = tc.cpus()  # spark.task.cpus: the cores this task may use
                label = f"s{tc.stageId()}-t{tc.taskAttemptId()}-a{attempt}"
        except ImportError:
            pass
        try:
            from statestore.restore.spark import _settle_worker, _spark_task
        except Exception as e:  # ImportError, or the extension failing to load
            row = list(payload["failed_row"])
            error_at, attempts_at = payload["error_at"], payload["attempts_at"]
            row[error_at] = row[error_at].replace(
                "{error}",
                (
                    f"statestore cannot be imported on executor host {_os.uname().nodename} by "
                    f"{_sys.executable} (Python {_sys.version.split()[0]}): {type(e).__name__}: {e}. "
                    "Install the statestore wheel on every executor, or point spark.pyspark.python at an "
                    "interpreter that has it"
                ),
            )
            row[attempts_at] = attempt + 1
            yield tuple(row)
            return
        try:
            yield tuple(_spark_task(payload, attempt, label, cpus))
        finally:
            if in_worker:
                _settle_worker()

    return run


def _default_python(sc: Any) -> None:
    """Executors use this interpreter unless PYSPARK_PYTHON (or spark.pyspark.python) chose one."""
    if "PYSPARK_PYTHON" in os.environ or sc.getConf().get("spark.pyspark.python"):
        return
    os.environ["PYSPARK_PYTHON"] = sys.executable
    if sc.pythonExec == "python3":  # the default, taken when the context was made
        sc.pythonExec = sys.executable


def _wait_for_executors(sc: Any, timeout: float) -> None:
    """On a cluster, wait until at least one executor joined; ``ClusterError`` after ``timeout`` seconds.

    A job submitted to a cluster without executors (a master nobody answers,
    no worker with free cores, executors that cannot start) waits forever;
    this bounds it and says what to check.
    """
    if _is_local(sc.master):
        return
    jsc = sc._jsc.sc()
    deadline = time.monotonic() + timeout
    while True:
        if jsc.isStopped():
            raise ClusterError(
                f"the Spark context for master {sc.master} was stopped (the master gave up "
                "on this application: it does not answer, or refused it); check the master URL"
            )
        if len(jsc.statusTracker().getExecutorInfos()) > 1:  # the driver is listed too
            return
        if time.monotonic() >= deadline:
            raise ClusterError(
                f"no executor joined within {timeout:g} s on master {sc.master}: check that the master "
                "answers at that URL, that it has workers alive with free cores and enough memory for "
                "spark.executor.memory, and the workers' logs"
            )
        time.sleep(0.2)


def _seq(scala_seq: Any) -> list[Any]:
    return [scala_seq.apply(i) for i in range(scala_seq.size())]


def _reason(message: str) -> str:
    """The line of Spark's error message for a task attempt that says why: for a Python exception the
    last line of its traceback (``Class: message``), else the first line."""
    lines = [line.rstrip() for line in message.strip().splitlines()]
    if lines and "PythonException" in lines[0]:
        told = []
        for line in lines[1:]:
            if line.startswith("\tat ") or line.lstrip().startswith("at org.apache."):
                break  # the Java stack trace follows the Python traceback
            if line.strip() and not line.strip().startswith("SQLSTATE:"):
                told.append(line.strip())
        if told:
            return told[-1]
    return lines[0] if lines else "no message"


def _failed_attempts(sc: Any, job_group: str, earlier_jobs: Iterable[int] = ()) -> dict[int, list[str]]:
    """Attempts of the job group's tasks that failed or were killed, by task index, as Spark's driver saw them.

    Read from the driver's status store (Spark's own record of every task
    attempt) through the JVM gateway, once its listener bus has caught up.
    Best effort: an empty answer when this Spark does not offer it.
    """
    out: dict[int, list[str]] = {}
    try:
        jsc = sc._jsc.sc()
        try:
            jsc.listenerBus().waitUntilEmpty(10_000)
        except Exception:  # older or newer signatures: the store is at most a moment behind
            time.sleep(0.5)
        store = jsc.statusStore()
        tracker = sc.statusTracker()
        for job_id in sorted(set(tracker.getJobIdsForGroup(job_group)) - set(earlier_jobs)):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else []:
                stage = tracker.getStageInfo(stage_id)
                for stage_attempt in range(0, (stage.currentAttemptId if stage is not None else 0) + 1):
                    for t in _seq(store.taskList(stage_id, stage_attempt, 1 << 30)):
                        status = str(t.status())
                        if status not in ("FAILED", "KILLED"):
                            continue
                        why = t.errorMessage()
                        reason = _reason(str(why.get())) if why.isDefined() else status.lower()
                        out.setdefault(int(t.index()), []).append(
                            f"attempt {int(t.attempt()) + 1} on {t.host()} (executor {t.executorId()}): "
                            f"{status.lower()}: {reason}"
                        )
    except Exception as e:  # the gateway or Spark's internals differ: rows go without the detail
        logger.debug("Spark's failed task attempts unavailable: %s", e)
    return {i: sorted(v) for i, v in out.items()}


def result_schema() -> Any:
    """The Spark schema of the result rows (``pyspark.sql.types.StructType``)."""
    from pyspark.sql.types import StructType

    return StructType.fromDDL(", ".join(f"{name} {t}" for name, t in RESULT_COLUMNS))


#: Up to this many result rows become an inline table (see :func:`rows_frame`).
INLINE_ROWS_MAX = 1000


def _sql_literal(value: Any, sql_type: str) -> str:
    """``value`` as a Spark SQL literal of ``sql_type``; text goes as hex bytes, so no quoting can break."""
    if value is None:
        return f"CAST(NULL AS {sql_type.upper()})"
    if sql_type == "string":
        return f"CAST(X'{str(value).encode().hex()}' AS STRING)"
    if sql_type == "double":
        return f"CAST('{float(value)!r}' AS DOUBLE)"
    return f"CAST({int(value)} AS {sql_type.upper()})"


def rows_frame(spark: SparkSession, rows: Sequence[Sequence[Any]]) -> DataFrame:
    """Result rows (:data:`RESULT_COLUMNS`) as a DataFrame held by the driver.

    Up to :data:`INLINE_ROWS_MAX` rows become an inline table (``VALUES``),
    which Spark answers without running a job: ``createDataFrame`` from a
    local list would run a second small job (0.1-0.2 s) each time the result
    is collected. More rows, or a Spark that refuses the SQL, fall back to
    ``createDataFrame``.
    """
    if 0 < len(rows) <= INLINE_ROWS_MAX:
        names = ", ".join(f"`{name}`" for name, _ in RESULT_COLUMNS)
        values = ", ".join(
            "(" + ", ".join(_sql_literal(v, t) for v, (_, t) in zip(row, RESULT_COLUMNS, strict=True)) + ")"
            for row in rows
        )
        try:
            return spark.sql(f"SELECT * FROM VALUES {values} AS results({names})")
        except Exception as e:  # any refusal: the general path below still works
            logger.debug("inline result table refused (%s); using createDataFrame", e)
    return spark.createDataFrame(list(rows), result_schema())


def restore_on_spark(
    spark: SparkSession,
    *,
    log_dir: str | os.PathLike[str] | None = None,
    kafka: Mapping[str, Any] | None = None,
    state_dir: str | os.PathLike[str],
    application_id: str,
    stores: Sequence[str] | Mapping[str, int],
    partitions: Iterable[int] | None = None,
    mode: str = "auto",
    guarantee: Guarantee | str = Guarantee.EXACTLY_ONCE_V2,
    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET,
    lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
    executor_timeout: float = DEFAULT_EXECUTOR_TIMEOUT,
    formats: Mapping[str, str] | None = None,
    kafka_streams_version: str | None = None,
    retentions: Mapping[str, int] | None = None,
    segment_intervals: Mapping[str, int] | None = None,
) -> DataFrame:
    """Restore every (store, changelog partition) in one Spark job and return one row for each.

    One Spark task per (store, partition), placed 1:1 (the job's partition *i*
    is work item *i*). ``stores`` lists store names (subtopology 0) or maps
    names to subtopologies; ``partitions=None`` restores every partition of each
    store's changelog found under ``log_dir`` (read on the driver). ``log_dir``
    and ``state_dir`` are paths as the executors see them (relative ones are
    made absolute on the driver): a shared filesystem, or local disks holding
    the same log (see docs/spark.md, "Which state_dir"). Or ``kafka={"bootstrap.servers": ...,
    ...}`` (confluent-kafka style properties, SSL and SASL included): every
    task fetches its own partition from the cluster natively, and partitions
    default to every partition of each store's changelog topic. On a local master ``state_dir`` is created
    when missing; on a cluster it must exist on every executor, and a host
    where it does not (a filesystem not mounted there) answers with failed
    rows naming the host and the path.

    The job runs now; the returned DataFrame holds the rows
    (:data:`~statestore.restore.work.RESULT_COLUMNS`), ordered by store then
    partition. A partition that fails has status ``failed`` and an ``error``
    naming the task, file, offset and host; unexpected errors are retried by
    Spark first, and ``attempts``/``failed_attempts`` say which attempts
    failed and why. Each attempt is safe under retries and speculation (see
    :mod:`statestore.restore.staging`). When PYSPARK_PYTHON is unset, executors run
    this interpreter. On a cluster without any executor after
    ``executor_timeout`` seconds it raises ``ClusterError``. ``formats`` maps
    store names to their format (``"plain"``, the default, or
    ``"timestamped"`` for Kafka Streams' timestamped stores, or a window or
    session store's format, or ``"versioned"``; see
    :func:`~statestore.restore.engine.restore_store`); ``retentions`` maps
    each window or session store to its retention (ms), and each versioned
    store to its history retention, and ``segment_intervals`` to its segment
    interval when it is not the default (the DSL's, or Kafka's for a
    versioned store).
    ``kafka_streams_version`` (``"3.6"`` ... ``"4.4"``, default the newest)
    chooses the layout the stores are left in (:mod:`statestore.state.layout`):
    for 3.6 - 4.2 each task's ``.checkpoint`` records the offsets.
    """
    check_mode(mode)
    g = Guarantee(guarantee)
    layout = KIP_1035 if kafka_streams_version is None else layout_for(kafka_streams_version)
    fmts = dict(formats or {})
    for name, fmt in fmts.items():
        try:
            check_format(fmt)
        except ValueError as e:
            raise ValueError(f"store {name!r}: {e}") from None
    rets, intervals = dict(retentions or {}), dict(segment_intervals or {})
    for name in set(rets) | set(intervals):
        if fmts.get(name, "plain") not in _native.RETAINED_STORE_FORMATS:
            raise ValueError(
                f"store {name!r}: retention and segment interval belong to window, session and versioned "
                "stores"
            )
    for name, fmt in fmts.items():
        if fmt in _native.RETAINED_STORE_FORMATS and name not in rets:
            raise ValueError(
                f"store {name!r}: a {fmt} store needs its retention (retentions={{{name!r}: ms}})"
            )
    if memory_budget_bytes <= 0:
        raise ValueError(f"memory_budget_bytes must be > 0, got {memory_budget_bytes}")
    if (log_dir is None) == (kafka is None):
        raise ValueError("name the changelog: log_dir (a segment log) or kafka (a cluster's properties)")
    conf = None if kafka is None else kafka_conf(kafka)
    source: Any = kafka_changelog(conf) if conf is not None else log_dir
    work = plan(source, application_id, stores, partitions)
    sc = spark.sparkContext
    master = sc.master or "local"
    _default_python(sc)
    max_attempts = _max_attempts(master, sc.getConf().get("spark.task.maxFailures"))
    payloads = [
        _task_payload(
            w,
            i,
            log_dir=None if log_dir is None else os.path.abspath(log_dir),
            kafka=conf,
            state_dir=os.path.abspath(state_dir),
            application_id=application_id,
            mode=mode,
            memory_budget_bytes=memory_budget_bytes,
            lock_timeout=lock_timeout,
            max_attempts=max_attempts,
            guarantee=g.value,
            create_state_dir=_is_local(master),
            format=fmts.get(w.store, "plain"),
            layout=layout.name,
            retention_ms=rets.get(w.store),
            segment_interval_ms=intervals.get(w.store),
        )
        for i, w in enumerate(work)
    ]
    check_master(master)
    _wait_for_executors(sc, executor_timeout)
    if os.environ.get(FAIL_ATTEMPT_ENV):
        sc.environment[FAIL_ATTEMPT_ENV] = os.environ[FAIL_ATTEMPT_ENV]
    # The job runs in the caller's job group, else in one of its own: the group finds its task attempts.
    caller_group = sc.getLocalProperty("spark.jobGroup.id")
    caller_description = sc.getLocalProperty("spark.job.description")
    group = caller_group or f"statestore-restore-{uuid.uuid4().hex}"
    sc.setLocalProperty("spark.jobGroup.id", group)
    sc.setJobDescription(f"statestore restore {application_id}: {len(payloads)} (store, partition) tasks")
    earlier_jobs = sc.statusTracker().getJobIdsForGroup(group)
    t0 = time.perf_counter()
    try:
        rdd = sc.parallelize(range(len(payloads)), len(payloads)).mapPartitionsWithIndex(
            _make_task_function(payloads)
        )
        raw = rdd.collect()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", caller_group)  # type: ignore[arg-type]
        sc.setJobDescription(caller_description)  # type: ignore[arg-type]
        sc.environment.pop(FAIL_ATTEMPT_ENV, None)
    rows = [RestoreRow(*r) for r in raw]
    if any(r.attempts > 1 for r in rows):
        failures = _failed_attempts(sc, group, earlier_jobs)
        rows = [
            r.with_failed_attempts(
                "\n".join(failures[i])
                if i in failures
                else f"attempts 1-{r.attempts - 1} failed (Spark gave no detail)"
            )
            if r.attempts > 1 or i in failures
            else r
            for i, r in enumerate(rows)
        ]
    failed = sum(1 for r in rows if not r.ok)
    logger.info(
        "restored %d (store, partition) pairs on Spark in %.2f s, %d failed",
        len(rows),
        time.perf_counter() - t0,
        failed,
    )
    sweep_staging(state_dir, application_id, work, fmts)
    return rows_frame(spark, rows)


def check_master(master: str | None = None, timeout: float = MASTER_CONNECT_TIMEOUT) -> None:
    """Raise ``ClusterError`` when a standalone master (``spark://host:port[,host:port...]``) accepts no
    connection within ``timeout`` seconds per address; other masters pass.

    A driver started for a master nobody answers retries registering for a
    minute before it gives up; call this first (:func:`spark_session` does; a
    ``spark-submit`` job calls it without ``master`` before building its
    session, as ``examples/restore_job.py`` does, and the master is read from
    the configuration ``spark-submit`` gave the driver).
    """
    if master is None:
        from pyspark import SparkConf, SparkContext

        SparkContext._ensure_initialized()  # the JVM spark-submit started: its configuration names the master
        master = SparkConf().get("spark.master", "") or ""
    if not master.startswith("spark://"):
        return
    problems = []
    for address in master[len("spark://") :].split(","):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ClusterError(f"master URL {master!r}: {address!r} is not host:port")
        try:
            socket.create_connection((host, int(port)), timeout=timeout).close()
            return
        except OSError as e:
            problems.append(f"{address}: {e.strerror or e}")
    raise ClusterError(
        f"Spark master {master} does not answer ({'; '.join(problems)}); check the URL, "
        "and that the master runs (scripts/spark-cluster.sh start DIR prints it)"
    )


def spark_session(
    master: str = "local[2]", app_name: str = "statestore-restore", **conf: str
) -> SparkSession:
    """A SparkSession for restores: executors on this interpreter, UI off, driver on 127.0.0.1 when local
    or when the standalone master is on 127.0.0.1.

    A local session's JVM (started by this call, if none runs yet) also gets
    :data:`LOCAL_DRIVER_JAVA_OPTIONS`: its tasks are all Python, so the JVM
    only schedules them, and its optimising compiler would otherwise spend
    most of a core per job competing with the restores for the machine.

    ``conf`` adds Spark settings (use their dotted names through a dict:
    ``spark_session(**{"spark.executor.memory": "4g"})``). On a cluster
    started with ``spark-submit``, use ``SparkSession.builder.getOrCreate()``
    instead and set PYSPARK_PYTHON there. A standalone master
    (``spark://...``) that accepts no connection within
    :data:`MASTER_CONNECT_TIMEOUT` seconds is a ``ClusterError``.
    """
    check_master(master)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    # Executors run this interpreter (its statestore); a cluster whose workers have another, e.g. a
    # shipped venv (spark.archives), says so through ``conf``.
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.pyspark.python": sys.executable,
    }
    if master.startswith("spark://127.0.0.1:") or master.startswith("spark://localhost:"):
        # A standalone cluster on this machine: keep the driver on the loopback interface too.
        settings.update({"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"})
    if master.startswith("local"):
        settings.update(
            {
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.driver.host": "127.0.0.1",
                "spark.driver.extraJavaOptions": LOCAL_DRIVER_JAVA_OPTIONS,
            }
        )
    settings.update(conf)
    for k, v in settings.items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


__all__ = [
    "DEFAULT_EXECUTOR_TIMEOUT",
    "INLINE_ROWS_MAX",
    "LOCAL_DRIVER_JAVA_OPTIONS",
    "MASTER_CONNECT_TIMEOUT",
    "check_master",
    "restore_on_spark",
    "result_schema",
    "rows_frame",
    "spark_session",
]
