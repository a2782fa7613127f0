"""Restoring many stores on Spark executors, one Spark task per (store, changelog partition).

:func:`restore_on_spark` plans the work on the driver, runs one Spark task per
(store, partition) -- placed 1:1 by explicit partitioning, so no hash skew --
and returns one row per (store, partition) as a DataFrame
(:data:`RESULT_COLUMNS`). Each task calls :func:`restore_partition`, which runs
the Rust restore engine inside the executor's Python worker, GIL released.

Safety under Spark's retries and speculative execution: an attempt

1. opens the application's state directory *shared* (several Python workers of
   one machine may use it; an application holding it exclusively is never
   disturbed) and takes the **task lock**, which excludes other threads and
   other processes, waiting while another attempt or another store of the same
   task holds it;
2. under the lock removes what earlier attempts left behind (a killed attempt
   cannot clean up), and puts a previous store back if an attempt died in the
   middle of replacing it;
3. restores into a **staging directory named by its attempt**
   (``<task dir>/.staging/<store>/<attempt>/store``), starting from a copy of
   the current store (SST files hard-linked) so only the changelog's tail is
   replayed -- or from nothing, when the current store holds data without an
   offset under exactly-once (unknown state, wiped by policy);
4. checks that it still holds the lock and **atomically swaps** the staging
   store into place (``renameat2(RENAME_EXCHANGE)`` where the filesystem has
   it, else two renames that the next attempt rolls back if interrupted), then
   deletes the old store and its staging directory.

So a failed or killed attempt never damages the store that was there before,
and two attempts of one partition running at once leave one correct store: the
second waits for the lock, then finds the first one's store up to date. After
the job, the driver sweeps what killed attempts left in staging directories it
can see (:func:`sweep_staging`).

Importing this module does not import pyspark; only :func:`restore_on_spark`
and :func:`spark_session` do.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import re
import shutil
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from statestore.directory import StateDirectory, TaskLock
from statestore.errors import LockError, StateStoreError, StoreError
from statestore.ids import TaskId, TopicPartition, changelog_topic
from statestore.lag import Lag, store_lag
from statestore.log import SegmentLog
from statestore.policy import Event, Guarantee, Policy
from statestore.restore import DEFAULT_MEMORY_BUDGET, MODES, STORE_FORMATS, restore_store

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: Directory inside a task directory that holds the staging stores of restore attempts.
STAGING_DIR_NAME = ".staging"
#: Environment variable naming attempts that fail on purpose (tests): ``<store>:<partition>:<attempt>[,...]``.
#: Such an attempt restores into its staging directory, then raises before moving it into place.
FAIL_ATTEMPT_ENV = "STATESTORE_SPARK_FAIL_ATTEMPT"
#: JVM options :func:`spark_session` gives the driver of a local session (``conf`` may override them):
#: the quick compiler only. Restore tasks run in Python workers; the JVM just schedules them, and its
#: optimising compiler (C2) otherwise burns 0.7-0.9 s of CPU per 8-task job for a few jobs after
#: start -- time the restores running beside it lose on a small machine.
LOCAL_DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"
#: Default longest wait, in seconds, for a task lock held by another attempt or store of the task.
DEFAULT_LOCK_TIMEOUT: float = 3600.0

#: Columns of the result rows, in order, with their Spark SQL types.
RESULT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("task_id", "string"),
    ("store", "string"),
    ("topic", "string"),
    ("partition", "int"),
    ("start_offset", "bigint"),
    ("end_offset", "bigint"),
    ("records_applied", "bigint"),
    ("records_skipped", "bigint"),
    ("bytes_read", "bigint"),
    ("seconds", "double"),
    ("mode", "string"),
    ("status", "string"),
    ("error", "string"),
    ("lag", "bigint"),
    ("offset_lag", "bigint"),
)


class RestoreRow(NamedTuple):
    """The outcome of restoring one store's changelog partition: one result row."""

    task_id: str
    store: str
    topic: str
    partition: int
    #: First offset read; None when the restore failed before reading.
    start_offset: int | None
    #: Exclusive end offset reached; None when the restore failed before reading.
    end_offset: int | None
    records_applied: int
    #: Aborted, control and null-key records stepped over.
    records_skipped: int
    bytes_read: int
    #: Wall time of the attempt, lock wait included.
    seconds: float
    #: ``"replay"`` or ``"bulk"`` (the mode asked for, when the restore failed early).
    mode: str
    #: ``"ok"`` or ``"failed"``.
    status: str
    #: Why it failed (names the file, task and offset where known); None when ok.
    error: str | None
    #: Committed records past the restored store's offset once done (appended meanwhile); None: unknown.
    lag: int | None = None
    #: Offsets from the store's next offset to the log end (markers and aborted records included).
    offset_lag: int | None = None

    @property
    def ok(self) -> bool:
        """True when the restore completed."""
        return self.status == "ok"


assert tuple(RestoreRow._fields) == tuple(c for c, _ in RESULT_COLUMNS)


class InjectedFailure(RuntimeError):
    """Raised by an attempt named in :data:`FAIL_ATTEMPT_ENV` (tests of retries)."""


@dataclass(frozen=True)
class PartitionWork:
    """One unit of work: a store of a task and its changelog partition."""

    store: str
    task_id: TaskId
    tp: TopicPartition


# -- planning ---------------------------------------------------------------------------


def parse_partitions(text: str) -> list[int]:
    """Parse ``"0-7"``, ``"3"`` or ``"0,2,5-7"`` into sorted distinct partition numbers."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if m is None:
            raise ValueError(f"not a partition list (expected e.g. '0-7' or '0,2,5-7'): {text!r}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise ValueError(f"partition range {part!r} is empty (end before start)")
        out.update(range(lo, hi + 1))
    return sorted(out)


def changelog_partitions(log_dir: str | os.PathLike[str], topic: str) -> list[int]:
    """Partitions of ``topic`` that have a directory (``<topic>-<n>``) under ``log_dir``, sorted."""
    out = []
    prefix = topic + "-"
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(log_dir):
            if entry.name.startswith(prefix) and entry.is_dir():
                rest = entry.name[len(prefix):]
                if rest.isdigit():
                    out.append(int(rest))
    return sorted(out)


def changelog_stores(log_dir: str | os.PathLike[str], application_id: str) -> list[str]:
    """Names of the stores of ``application_id`` with a changelog partition under ``log_dir``, sorted."""
    names: set[str] = set()
    prefix, suffix = application_id + "-", "-changelog"
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(log_dir):
            try:
                tp = TopicPartition.parse(entry.name)
            except ValueError:
                continue
            if tp.topic.startswith(prefix) and tp.topic.endswith(suffix) and entry.is_dir():
                store = tp.topic[len(prefix):-len(suffix)]
                if store:
                    names.add(store)
    return sorted(names)


def plan(
    log_dir: str | os.PathLike[str],
    application_id: str,
    stores: Sequence[str] | Mapping[str, int],
    partitions: Iterable[int] | None = None,
) -> list[PartitionWork]:
    """The (store, partition) pairs to restore, store by store, partitions ascending.

    ``stores`` lists store names (subtopology 0) or maps each name to its
    subtopology. With ``partitions=None`` each store's partitions are those
    its changelog has under ``log_dir`` (which the caller must be able to
    read); a store without any raises ``StateStoreError``.
    """
    subs: dict[str, int] = dict(stores) if isinstance(stores, Mapping) else dict.fromkeys(stores, 0)
    if not subs:
        raise ValueError("no stores given: name at least one store to restore")
    for name, sub in subs.items():
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"store name {name!r} cannot name a directory")
        if sub < 0:
            raise ValueError(f"store {name!r}: subtopology must be >= 0, got {sub}")
    wanted = None if partitions is None else sorted(set(partitions))
    if wanted is not None and any(p < 0 for p in wanted):
        raise ValueError(f"partitions must be >= 0, got {wanted}")
    work: list[PartitionWork] = []
    for name, sub in subs.items():
        topic = changelog_topic(application_id, name)
        parts = wanted if wanted is not None else changelog_partitions(log_dir, topic)
        if not parts:
            raise StateStoreError(
                f"store {name}: no partition of changelog {topic} under {log_dir}; check --log-dir and "
                "--app-id, or name the partitions explicitly",
                path=Path(log_dir),
            )
        work.extend(PartitionWork(name, TaskId(sub, p), TopicPartition(topic, p)) for p in parts)
    return work


def _guarantee(guarantee: Guarantee | str) -> Guarantee:
    return guarantee if isinstance(guarantee, Guarantee) else Guarantee(guarantee)


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")


# -- one partition, in any process ----------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths with ``renameat2(RENAME_EXCHANGE)``; False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, f"renameat2({a}, {b}, RENAME_EXCHANGE): {os.strerror(err)}")


def _link_copy(src: Path, dst: Path) -> None:
    """Copy a closed RocksDB directory: SST and blob files hard-linked (immutable), the rest copied."""
    dst.mkdir()
    for entry in os.scandir(src):
        s, d = Path(entry.path), dst / entry.name
        if entry.name == "LOCK":
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.copytree(s, d)
        elif entry.name.endswith((".sst", ".blob")):
            try:
                os.link(s, d)
            except OSError:
                shutil.copy2(s, d)
        else:
            shutil.copy2(s, d)


def _attempt_name() -> str:
    """A name unique to this attempt: Spark's stage, task attempt id and attempt number when in a task."""
    label = "local"
    try:
        from pyspark import TaskContext

        tc = TaskContext.get()
        if tc is not None:
            label = f"s{tc.stageId()}-t{tc.taskAttemptId()}-a{tc.attemptNumber()}"
    except ImportError:
        pass
    return f"{label}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _failure_injected(store: str, partition: int, attempt: int) -> bool:
    spec = os.environ.get(FAIL_ATTEMPT_ENV, "")
    return f"{store}:{partition}:{attempt}" in {s.strip() for s in spec.split(",")}


def _acquire(sd: StateDirectory, task_id: TaskId, timeout: float | None) -> TaskLock:
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = 0.02
    while True:
        token = sd.acquire(task_id)
        if token is not None:
            return token
        if deadline is not None and time.monotonic() >= deadline:
            raise LockError(
                f"task {task_id}: the lock on {sd.task_dir(task_id)} stayed taken for {timeout:g} s "
                "(another attempt or another store of this task is restoring, or an application runs "
                "on this state directory); retry when it is done",
                path=sd.task_dir(task_id),
                task_id=task_id,
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


def _recover_staging(staging_root: Path, target: Path, task_id: TaskId, keep: str | None = None) -> None:
    """Under the task lock: put back a store an interrupted swap moved aside, delete stale attempts."""
    if not staging_root.is_dir():
        return
    entries = sorted(os.scandir(staging_root), key=lambda e: e.name)
    if not target.exists():
        for entry in entries:
            aside = Path(entry.path) / "previous"
            if aside.is_dir():
                log.warning("task %s: putting back %s, moved aside by an interrupted restore", task_id, target)
                os.rename(aside, target)
                _fsync_dir(target.parent)
                break
    for entry in entries:
        if entry.name != keep:
            log.info("task %s: removing %s left by an earlier attempt", task_id, entry.path)
            shutil.rmtree(entry.path, ignore_errors=True)


def _swap_into_place(staged: Path, target: Path, attempt_dir: Path) -> None:
    """Make ``staged`` the store at ``target`` atomically; the old store ends in ``attempt_dir``."""
    if not target.exists():
        os.rename(staged, target)
    elif not _exchange(staged, target):
        # Two renames; if we die between them, the next attempt puts "previous" back.
        os.rename(target, attempt_dir / "previous")
        os.rename(staged, target)
    _fsync_dir(target.parent)


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):  # not empty: another store's staging, or already gone
        path.parent.rmdir()
        path.parent.parent.rmdir()


def can_resume_from(target: Path, tp: TopicPartition, guarantee: Guarantee | str) -> bool:
    """Whether the closed store at ``target`` may be the start of a restore of ``tp``, else restore from nothing.

    Yes when it records an offset for ``tp``. A store holding data without an
    offset is unknown state: exactly-once restores it from nothing (the
    policy's INIT decision); at-least-once replays the changelog from its start
    over it. A missing, empty or unreadable store: no.
    """
    policy = Policy(_guarantee(guarantee))
    if not target.is_dir():
        return False
    from statestore import _native

    try:
        offsets, _status, keys = _native.store_info(target)
    except StateStoreError as e:
        log.warning("%s cannot be read (%s); restoring it from the changelog's start", target, e)
        return False
    if str(tp) in offsets:
        return True
    if keys == 0:
        return False  # nothing worth copying
    # Data without an offset: unknown state. Exactly-once treats it as corrupt (wipe and
    # restore); at-least-once replays the changelog from its start over it.
    return not policy.decide(Event.INIT).corrupt_if_missing


def check_store_format(target: Path, fmt: str) -> None:
    """Refuse (``StoreError``) to touch a store of another format or of a type statestore does not know.

    Nothing is opened for writing: the column families are listed, so a
    store statestore cannot use is never damaged (a restore would otherwise
    wipe what it cannot read).
    """
    from statestore import _native

    if not target.is_dir():
        return
    found = _native.store_format(target)  # raises StoreError naming an unknown type's column families
    if found is not None and found != fmt:
        raise StoreError(
            f"store {target} is {found}, not {fmt}; statestore leaves it untouched (choose the store's format, "
            "or wipe it to restore it in the other one)",
            path=target,
        )


def restore_partition(
    *,
    log_dir: str | os.PathLike[str],
    state_dir: str | os.PathLike[str],
    application_id: str,
    store: str,
    partition: int,
    subtopology: int = 0,
    mode: str = "auto",
    guarantee: Guarantee | str = Guarantee.EXACTLY_ONCE_V2,
    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET,
    lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
    attempt: int = 0,
    cpus: int = 2,
    format: str = "plain",
) -> RestoreRow:
    """Restore one store's changelog partition safely next to concurrent attempts (see the module doc).

    The store is ``<state_dir>/<application_id>/<subtopology>_<partition>/rocksdb/<store>``
    and its changelog ``<application_id>-<store>-changelog`` partition
    ``partition`` under ``log_dir``. Errors of statestore (bad log, lock
    timeout, state directory held exclusively by an application ...) come back
    as a row with status ``failed``; anything else raises, after the staging
    directory is removed. ``attempt`` is the Spark attempt number (for
    :data:`FAIL_ATTEMPT_ENV`). ``cpus`` is the number of cores the task may
    use (Spark's ``spark.task.cpus``): with one, the log is not read ahead on
    a second thread, so tasks running side by side do not oversubscribe the
    executor's cores.
    """
    _check_mode(mode)
    policy = Policy(_guarantee(guarantee))
    task_id = TaskId(subtopology, partition)
    tp = TopicPartition(changelog_topic(application_id, store), partition)
    t0 = time.perf_counter()

    def row(**kw: Any) -> RestoreRow:
        base: dict[str, Any] = {
            "task_id": str(task_id), "store": store, "topic": tp.topic, "partition": partition,
            "start_offset": None, "end_offset": None, "records_applied": 0, "records_skipped": 0,
            "bytes_read": 0, "mode": mode, "status": "ok", "error": None,
        }
        base.update(kw)
        return RestoreRow(seconds=time.perf_counter() - t0, **base)

    try:
        sd = StateDirectory(Path(state_dir), application_id, shared=True)
    except StateStoreError as e:
        return row(status="failed", error=f"task {task_id} store {store}: {e}")
    attempt_dir: Path | None = None
    staged: Path | None = None
    target: Path | None = None
    try:
        token = _acquire(sd, task_id, lock_timeout)
        target = sd.store_dir(task_id, store)
        check_store_format(target, format)
        staging_root = sd.task_dir(task_id) / STAGING_DIR_NAME / store
        _recover_staging(staging_root, target, task_id)
        attempt_dir = staging_root / _attempt_name()
        attempt_dir.mkdir(parents=True)
        staged = attempt_dir / "store"
        if can_resume_from(target, tp, policy.guarantee):
            _link_copy(target, staged)
        result = restore_store(
            staged, log_dir, tp, mode=mode, memory_budget_bytes=memory_budget_bytes, read_ahead=cpus > 1,
            format=format,
        )
        if _failure_injected(store, partition, attempt):
            raise InjectedFailure(
                f"task {task_id} store {store}: failure injected into attempt {attempt} by {FAIL_ATTEMPT_ENV}"
            )
        sd.ensure_held(token, what=f"move the restored store {store} into place")
        target.parent.mkdir(exist_ok=True)
        _fsync_dir(staged)  # the hard links made by the copy
        _swap_into_place(staged, target, attempt_dir)
        lag = _lag_after(log_dir, tp, result.offset)
        return row(
            lag=None if lag is None else lag.records,
            offset_lag=None if lag is None else lag.offsets,
            start_offset=result.start_offset,
            end_offset=result.end_offset,
            records_applied=result.records_applied,
            records_skipped=result.records_skipped.total,
            bytes_read=result.bytes_read,
            mode=result.mode,
        )
    except StateStoreError as e:
        msg = str(e)
        if staged is not None and target is not None:  # the staging store started as a copy of the store
            msg = msg.replace(str(staged), f"{target} (restored in {staged})")
        if f"task {task_id}" not in msg:
            msg = f"task {task_id} store {store} ({tp}): {msg}"
        return row(status="failed", error=msg)
    finally:
        if attempt_dir is not None:
            _remove_tree(attempt_dir)
        sd.close()


def sweep_staging(state_dir: str | os.PathLike[str], application_id: str, work: Iterable[PartitionWork]) -> int:
    """Remove what killed attempts left in the staging directories of ``work``'s tasks; best effort.

    An attempt that Spark kills (the loser of a speculative race) cannot clean
    up, and no later attempt of its partition may come. Each task whose lock
    is free right now is swept under that lock (an interrupted swap is rolled
    back first); a task locked by someone is skipped, as is a state directory
    this process cannot see (executors' local disks). Never raises; returns
    how many tasks were swept.
    """
    app_dir = Path(state_dir) / application_id
    tasks: dict[TaskId, set[str]] = {}
    for w in work:
        tasks.setdefault(w.task_id, set()).add(w.store)
    if not any((app_dir / str(t) / STAGING_DIR_NAME).is_dir() for t in tasks):
        return 0
    swept = 0
    try:
        with StateDirectory(Path(state_dir), application_id, shared=True) as sd:
            for task_id, stores in sorted(tasks.items()):
                staging = sd.task_dir(task_id) / STAGING_DIR_NAME
                if not staging.is_dir() or sd.acquire(task_id) is None:
                    continue
                try:
                    for store in sorted(stores):
                        _recover_staging(staging / store, sd.store_dir(task_id, store), task_id)
                        with contextlib.suppress(OSError):
                            (staging / store).rmdir()
                    with contextlib.suppress(OSError):
                        staging.rmdir()
                    swept += 1
                finally:
                    sd.unlock(task_id)
    except (StateStoreError, OSError) as e:
        log.warning("could not sweep the staging directories under %s: %s", app_dir, e)
    return swept


# -- Spark ----------------------------------------------------------------------------------


def _lag_after(log_dir: str | os.PathLike[str], tp: TopicPartition, offset: int | None) -> Lag | None:
    """The store's lag once restored; None (unknown) when the log cannot be read now."""
    try:
        return store_lag(SegmentLog(Path(log_dir)), tp, offset)
    except StateStoreError as e:
        log.debug("lag of %s unknown after its restore: %s", tp, e)
        return None


def _max_attempts(master: str, conf_value: str | None) -> int:
    """How many attempts Spark gives a task: ``local[N,F]`` -> F, other local masters 1, else the conf."""
    m = re.fullmatch(r"local\[\s*(\d+|\*)\s*,\s*(\d+)\s*\]", master)
    if m is not None:
        return int(m.group(2))
    if master == "local" or re.fullmatch(r"local\[\s*(\d+|\*)\s*\]", master):
        return 1
    return int(conf_value) if conf_value else 4


_Item = tuple[str, int, int, str, str, str, str, int, float | None, int, str, str]


def _spark_task(item: _Item, attempt: int, cpus: int = 1) -> RestoreRow:
    """Run one (store, partition) inside a Spark task. Unknown errors raise while Spark may retry."""
    (store, sub, partition, log_dir, state_dir, app_id, mode, budget, lock_timeout, max_attempts, guarantee,
     fmt) = item
    t0 = time.perf_counter()
    try:
        return restore_partition(
            log_dir=log_dir, state_dir=state_dir, application_id=app_id, store=store, partition=partition,
            subtopology=sub, mode=mode, guarantee=guarantee, memory_budget_bytes=budget,
            lock_timeout=lock_timeout, attempt=attempt, cpus=cpus, format=fmt,
        )
    except Exception as e:
        if attempt + 1 < max_attempts:
            raise  # Spark retries the task
        return RestoreRow(
            task_id=str(TaskId(sub, partition)), store=store, topic=changelog_topic(app_id, store),
            partition=partition, start_offset=None, end_offset=None, records_applied=0, records_skipped=0,
            bytes_read=0, seconds=time.perf_counter() - t0, mode=mode, status="failed",
            error=f"task {TaskId(sub, partition)} store {store}: {type(e).__name__}: {e} "
            f"(attempt {attempt + 1} of {max_attempts}, host {socket.gethostname()})",
        )


def _make_task_function(
    items: list[_Item],
) -> Callable[[int, Iterable[int]], Iterator[tuple[Any, ...]]]:
    """The function Spark runs for partition ``index``: restores ``items[index]``.

    It is a closure, so Spark ships it by value: the executor can run it, and
    report clearly, even when statestore itself cannot be imported there.
    """

    def run(index: int, _rows: Iterable[int]) -> Iterator[tuple[Any, ...]]:
        import os as _os
        import sys as _sys

        item = items[index]
        attempt = 0
        cpus = 1
        try:
            from pyspark import TaskContext

            tc = TaskContext.get()
            if tc is not None:
                attempt = tc.attemptNumber()
                cpus = tc.cpus()  # spark.task.cpus: the cores this task may use
        except ImportError:
            pass
        try:
            from statestore.spark import _spark_task
        except Exception as e:  # ImportError, or the extension failing to load
            store, sub, partition, _log, _state, app_id, mode = item[:7]
            yield (
                f"{sub}_{partition}", store, f"{app_id}-{store}-changelog", partition, None, None, 0, 0, 0,
                0.0, mode, "failed",
                f"statestore cannot be imported on executor {_os.uname().nodename} by "
                f"{_sys.executable} (Python {_sys.version.split()[0]}): {type(e).__name__}: {e}. "
                "Install the statestore wheel on every executor, or point PYSPARK_PYTHON at an "
                "interpreter that has it",
            )
            return
        yield tuple(_spark_task(item, attempt, cpus))

    return run


def _default_python(sc: Any) -> None:
    """Executors use this interpreter unless PYSPARK_PYTHON (or spark.pyspark.python) chose one."""
    if "PYSPARK_PYTHON" in os.environ or sc.getConf().get("spark.pyspark.python"):
        return
    os.environ["PYSPARK_PYTHON"] = sys.executable
    if sc.pythonExec == "python3":  # the default, taken when the context was made
        sc.pythonExec = sys.executable


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
            log.debug("inline result table refused (%s); using createDataFrame", e)
    return spark.createDataFrame(list(rows), result_schema())


def restore_on_spark(
    spark: SparkSession,
    *,
    log_dir: str | os.PathLike[str],
    state_dir: str | os.PathLike[str],
    application_id: str,
    stores: Sequence[str] | Mapping[str, int],
    partitions: Iterable[int] | None = None,
    mode: str = "auto",
    guarantee: Guarantee | str = Guarantee.EXACTLY_ONCE_V2,
    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET,
    lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
    formats: Mapping[str, str] | None = None,
) -> DataFrame:
    """Restore every (store, changelog partition) in one Spark job and return one row for each.

    One Spark task per (store, partition), placed 1:1 (the job's partition *i*
    is work item *i*). ``stores`` lists store names (subtopology 0) or maps
    names to subtopologies; ``partitions=None`` restores every partition of each
    store's changelog found under ``log_dir`` (read on the driver). ``log_dir``
    and ``state_dir`` are paths as the executors see them (relative ones are
    made absolute on the driver): a shared filesystem, or local disks holding
    the same log (see the README).

    The job runs now; the returned DataFrame holds the rows
    (:data:`RESULT_COLUMNS`), ordered by store then partition. A partition that
    fails has status ``failed`` and an ``error`` naming the task, file and
    offset; unexpected errors are retried by Spark first. Each attempt is safe
    under retries and speculation (see the module doc). When PYSPARK_PYTHON is
    unset, executors run this interpreter. ``formats`` maps store names to
    their format (``"plain"``, the default, or ``"timestamped"`` for Kafka
    Streams' timestamped stores; see :func:`~statestore.restore.restore_store`).
    """
    from pyspark import SparkContext

    _check_mode(mode)
    g = _guarantee(guarantee)
    fmts = dict(formats or {})
    bad = {n: f for n, f in fmts.items() if f not in STORE_FORMATS}
    if bad:
        raise ValueError(f"unknown store formats {bad}: use one of {', '.join(STORE_FORMATS)}")
    if memory_budget_bytes <= 0:
        raise ValueError(f"memory_budget_bytes must be > 0, got {memory_budget_bytes}")
    work = plan(log_dir, application_id, stores, partitions)
    sc: SparkContext = spark.sparkContext
    _default_python(sc)
    max_attempts = _max_attempts(sc.master or "local", sc.getConf().get("spark.task.maxFailures"))
    items: list[_Item] = [
        (w.store, w.task_id.subtopology, w.tp.partition, os.path.abspath(log_dir), os.path.abspath(state_dir),
         application_id, mode, memory_budget_bytes, lock_timeout, max_attempts, g.value,
         fmts.get(w.store, "plain"))
        for w in work
    ]
    if os.environ.get(FAIL_ATTEMPT_ENV):
        sc.environment[FAIL_ATTEMPT_ENV] = os.environ[FAIL_ATTEMPT_ENV]
    sc.setJobDescription(f"statestore restore {application_id}: {len(items)} (store, partition) tasks")
    t0 = time.perf_counter()
    try:
        rdd = sc.parallelize(range(len(items)), len(items)).mapPartitionsWithIndex(_make_task_function(items))
        rows = rdd.collect()
    finally:
        sc.setJobDescription(None)  # type: ignore[arg-type]
        sc.environment.pop(FAIL_ATTEMPT_ENV, None)
    failed = sum(1 for r in rows if r[11] != "ok")
    log.info("restored %d (store, partition) pairs on Spark in %.2f s, %d failed",
             len(rows), time.perf_counter() - t0, failed)
    sweep_staging(state_dir, application_id, work)
    return rows_frame(spark, rows)


def spark_session(master: str = "local[2]", app_name: str = "statestore-restore", **conf: str) -> SparkSession:
    """A SparkSession for restores: executors on this interpreter, UI off, driver on 127.0.0.1 when local
    or when the standalone master is on 127.0.0.1.

    A local session's JVM (started by this call, if none runs yet) also gets
    :data:`LOCAL_DRIVER_JAVA_OPTIONS`: its tasks are all Python, so the JVM
    only schedules them, and its optimising compiler would otherwise spend
    most of a core per job competing with the restores for the machine.

    ``conf`` adds Spark settings (use their dotted names through a dict:
    ``spark_session(**{"spark.executor.memory": "4g"})``). On a cluster
    started with ``spark-submit``, use ``SparkSession.builder.getOrCreate()``
    instead and set PYSPARK_PYTHON there.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    # Executors run this interpreter (its statestore); a cluster whose workers have another, e.g. a
    # shipped venv (spark.archives), says so through ``conf``.
    settings = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                "spark.pyspark.python": sys.executable}
    if master.startswith("spark://127.0.0.1:") or master.startswith("spark://localhost:"):
        # A standalone cluster on this machine: keep the driver on the loopback interface too.
        settings.update({"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"})
    if master.startswith("local"):
        settings.update({
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.extraJavaOptions": LOCAL_DRIVER_JAVA_OPTIONS,
        })
    settings.update(conf)
    for k, v in settings.items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "FAIL_ATTEMPT_ENV",
    "INLINE_ROWS_MAX",
    "LOCAL_DRIVER_JAVA_OPTIONS",
    "RESULT_COLUMNS",
    "STAGING_DIR_NAME",
    "InjectedFailure",
    "PartitionWork",
    "RestoreRow",
    "can_resume_from",
    "changelog_partitions",
    "changelog_stores",
    "check_store_format",
    "parse_partitions",
    "plan",
    "restore_on_spark",
    "restore_partition",
    "result_schema",
    "rows_frame",
    "spark_session",
    "sweep_staging",
]
