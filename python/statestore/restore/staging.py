"""Restoring one store's changelog partition safely beside other attempts at it: the staging swap.

This is what each Spark task runs (:mod:`statestore.restore.spark` is only the glue),
and it needs no Spark: any process may call :func:`restore_partition`. An
attempt

1. opens the application's state directory *shared* (several Python workers of
   one machine may use it; an application holding it exclusively is never
   disturbed) and takes the **task lock**, which excludes other threads and
   other processes, waiting while another attempt or another store of the same
   task holds it;
2. under the lock removes what earlier attempts left behind (a killed attempt
   cannot clean up), and puts a previous store back if an attempt died in the
   middle of replacing it;
3. restores into a **staging directory named by its attempt**
   (``<task dir>/.staging/<store>/<attempt>/store``; a window or session
   store's ``.../<attempt>/<store>``, whose segments are named after it), starting from a copy of
   the current store (SST files hard-linked, :func:`statestore._native.link_copy_dir`)
   so only the changelog's tail is replayed -- or from nothing, when the
   current store holds data without an offset under exactly-once (unknown
   state, wiped by policy);
4. checks that it still holds the lock and **swaps** the staging store into
   place (:func:`statestore._native.replace_dir`: ``renameat2(RENAME_EXCHANGE)``
   where the filesystem has it, else two renames that the next attempt rolls
   back if interrupted), then deletes the old store and its staging directory.

So a failed or killed attempt never damages the store that was there before,
and two attempts of one partition running at once leave one correct store: the
second waits for the lock, then finds the first one's store up to date.
:func:`sweep_staging` removes what killed attempts left once a job is done.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from statestore import _native
from statestore._testing.faults import FAIL_ATTEMPT_ENV, InjectedFailure, failure_injected
from statestore.changelog.segment_log import SegmentLog
from statestore.errors import LockError, StateStoreError, StoreError
from statestore.ids import OFFSET_UNKNOWN, SENTINEL_OFFSETS, TaskId, TopicPartition
from statestore.restore import topic_ids
from statestore.restore.discovery import layout_refusal
from statestore.restore.engine import DEFAULT_MEMORY_BUDGET, MODES, RestoreResult, restore_store
from statestore.restore.work import PartitionWork, RestoreRow
from statestore.state.directory import StateDirectory, TaskLock
from statestore.state.lag import Lag, store_lag
from statestore.state.layout import (
    KIP_1035,
    LAYOUTS,
    record_in_checkpoint,
    record_no_offset_yet,
    to_checkpoint_layout,
)
from statestore.state.policy import Event, Guarantee, Policy
from statestore.state.segmented import check_segmented_format
from statestore.state.store import check_store_format

logger = logging.getLogger(__name__)

#: Directory inside a task directory that holds the staging stores of restore attempts.
STAGING_DIR_NAME = ".staging"
#: Default longest wait, in seconds, for a task lock held by another attempt or store of the task.
DEFAULT_LOCK_TIMEOUT: float = 3600.0


def check_mode(mode: str) -> None:
    """Refuse a restore mode the engine does not know."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")


def store_location(sd: StateDirectory, task_id: TaskId, store: str, format: str = "plain") -> Path:
    """Where ``store`` of ``task_id`` lives: ``<task>/rocksdb/<store>``, or a window or session store's
    directory of segments, ``<task>/<store>`` (as Kafka Streams lays them out)."""
    if format in _native.SEGMENTED_STORE_FORMATS:
        return sd.task_dir(task_id) / store
    return sd.store_dir(task_id, store)


def _offsets_and_keys(target: Path) -> tuple[dict[str, int], int]:
    """The offsets a store records and its estimated keys; a segmented store's over its segments
    (every segment records the same offsets)."""
    if (target / "CURRENT").exists():
        info = _native.store_info(target)
        return dict(info.offsets), info.estimated_keys
    offsets: dict[str, int] = {}
    keys = 0
    for segment in sorted(p for p in target.iterdir() if (p / "CURRENT").exists()):
        info = _native.store_info(segment)
        offsets.update(info.offsets)
        keys += info.estimated_keys
    return offsets, keys


def can_resume_from(target: Path, tp: TopicPartition, guarantee: Guarantee | str) -> bool:
    """Whether the closed store at ``target`` may be the start of a restore of ``tp``, else restore from nothing.

    Yes when it records an offset for ``tp``. A store holding data without an
    offset is unknown state: exactly-once restores it from nothing (the
    policy's INIT decision); at-least-once replays the changelog from its start
    over it. A store recording Kafka Streams' ``OFFSET_UNKNOWN`` (its task had
    committed no changelog record) is restored from the changelog's start, from
    nothing: the engine resumes only from a position. A missing, empty or
    unreadable store: no.
    """
    policy = Policy(Guarantee(guarantee))
    if not target.is_dir():
        return False
    try:
        offsets, keys = _offsets_and_keys(target)
    except StateStoreError as e:
        logger.warning("%s cannot be read (%s); restoring it from the changelog's start", target, e)
        return False
    if offsets.get(str(tp)) in SENTINEL_OFFSETS:
        return False
    if str(tp) in offsets:
        return True
    if keys == 0:
        return False  # nothing worth copying
    return not policy.decide(Event.INIT).corrupt_if_missing


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
                logger.warning(
                    "task %s: putting back %s, moved aside by an interrupted restore", task_id, target
                )
                os.rename(aside, target)
                _native.fsync_dir(target.parent)
                break
    for entry in entries:
        if entry.name != keep:
            logger.info("task %s: removing %s left by an earlier attempt", task_id, entry.path)
            shutil.rmtree(entry.path, ignore_errors=True)


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):  # not empty: another store's staging, or already gone
        path.parent.rmdir()
        path.parent.parent.rmdir()


def _lag_after(changelog: Any, tp: TopicPartition, result: RestoreResult) -> Lag | None:
    """The store's lag once restored; None (unknown) when the log cannot be read now."""
    try:
        return store_lag(
            SegmentLog(changelog) if isinstance(changelog, Path) else changelog,
            tp,
            result.offset,
            bounds=result.changelog_bounds,
        )
    except StateStoreError as e:
        logger.debug("lag of %s unknown after its restore: %s", tp, e)
        return None


#: A Kafka cluster as Spark work items carry it: its confluent-kafka style properties, sorted.
KafkaConf = tuple[tuple[str, str], ...]

_KAFKA_CHANGELOGS: dict[KafkaConf, Any] = {}
_KAFKA_LOCK = threading.Lock()


def kafka_conf(kafka: Mapping[str, Any]) -> KafkaConf:
    """``kafka`` (``{"bootstrap.servers": ..., ...}``) as a hashable, picklable work-item field."""
    conf = tuple(sorted((str(k).replace("_", "."), str(v)) for k, v in kafka.items()))
    if not any(k == "bootstrap.servers" for k, _ in conf):
        raise ValueError("kafka= needs bootstrap.servers")
    return conf


def kafka_changelog(conf: KafkaConf) -> Any:
    """The process's :class:`~statestore.changelog.kafka.KafkaChangelog` for ``conf`` (one per executor process, reused
    by its tasks so connections to the brokers are too)."""
    with _KAFKA_LOCK:
        cl = _KAFKA_CHANGELOGS.get(conf)
        if cl is None:
            from statestore.changelog.kafka import KafkaChangelog

            props: dict[str, Any] = dict(conf)
            cl = _KAFKA_CHANGELOGS[conf] = KafkaChangelog(props.pop("bootstrap.servers"), **props)
        return cl


def restore_partition(
    *,
    log_dir: str | os.PathLike[str] | None = None,
    kafka: KafkaConf | Mapping[str, Any] | None = None,
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
    attempt_label: str = "local",
    cpus: int = 2,
    create_state_dir: bool = True,
    format: str = "plain",
    layout: str = KIP_1035.name,
    retention_ms: int | None = None,
    segment_interval_ms: int | None = None,
) -> RestoreRow:
    """Restore one store's changelog partition safely next to concurrent attempts (see the module doc).

    The store is ``<state_dir>/<application_id>/<subtopology>_<partition>/rocksdb/<store>``
    and its changelog ``<application_id>-<store>-changelog`` partition
    ``partition`` under ``log_dir``, or on the Kafka cluster ``kafka`` names
    (confluent-kafka style properties; fetched natively). Errors of statestore (bad log, lock
    timeout, state directory held exclusively by an application ...) come back
    as a row with status ``failed``; anything else raises, after the staging
    directory is removed. ``attempt`` is the 0-based attempt number (Spark's),
    ``attempt_label`` names the staging directory with the process id and a
    random part added. ``cpus`` is the number of cores the task may use
    (Spark's ``spark.task.cpus``): with one, the log is not read ahead on a
    second thread, so tasks running side by side do not oversubscribe the
    executor's cores. With ``create_state_dir=False`` a missing ``state_dir``
    is a failed row naming this host and the path (on a cluster, a shared
    filesystem that is not mounted here), never a new directory on the wrong
    disk. ``format`` is the store's format (see
    :func:`~statestore.restore.engine.restore_store`; a window or session store,
    with its ``retention_ms`` and ``segment_interval_ms``, is the directory
    ``<task>/<store>`` of its segments); a store of another format is left
    untouched and answered with a failed row. ``layout`` is the name of the
    :mod:`~statestore.state.layout` the store is left in: with ``"checkpoint"``
    (Kafka Streams 3.6 - 4.2) the staged store is converted before the swap,
    the task's ``.checkpoint`` entry is removed before the swap and recorded
    after it, so no entry ever vouches for more than the store in place holds.
    """
    check_mode(mode)
    if (log_dir is None) == (kafka is None):
        raise ValueError("name the changelog: log_dir or kafka")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    in_store = LAYOUTS[layout].offsets_in_store
    changelog: Any = (
        Path(log_dir)
        if log_dir is not None
        else kafka_changelog(kafka if isinstance(kafka, tuple) else kafka_conf(kafka or {}))
    )
    policy = Policy(Guarantee(guarantee))
    work = PartitionWork.of(application_id, store, partition, subtopology)
    task_id, tp = work.task_id, work.tp
    t0 = time.perf_counter()

    def failed(error: str) -> RestoreRow:
        return RestoreRow.failed(
            work, error, mode=mode, seconds=time.perf_counter() - t0, attempts=attempt + 1
        )

    if not create_state_dir and not Path(state_dir).is_dir():
        return failed(
            f"state directory {state_dir} does not exist on host {socket.gethostname()} (a shared "
            "filesystem not mounted there?); create it, or mount it at the same path on every executor"
        )
    try:
        sd = StateDirectory(Path(state_dir), application_id, shared=True)
    except StateStoreError as e:
        return failed(str(e))
    attempt_dir: Path | None = None
    staged: Path | None = None
    target: Path | None = None
    try:
        token = _acquire(sd, task_id, lock_timeout)
        target = store_location(sd, task_id, store, format)
        segmented = format in _native.SEGMENTED_STORE_FORMATS
        why = layout_refusal(format, offsets_in_store=in_store)
        if why is not None:
            return failed(f"task {task_id} store {store}: {why}")
        if segmented:
            check_segmented_format(target, format, who=f"task {task_id} store {store}")
        else:
            check_store_format(target, format)
        staging_root = sd.task_dir(task_id) / STAGING_DIR_NAME / store
        _recover_staging(staging_root, target, task_id)
        attempt_dir = staging_root / f"{attempt_label}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        attempt_dir.mkdir(parents=True)
        # a segmented store's segments are named after its directory
        staged = attempt_dir / (store if segmented else "store")
        # A job that created the store and died leaves its marker beside it, not inside (see
        # `fileio::deferred`): sync the store and keep it, or wipe it, before resuming from a copy.
        _native.recover_unsynced(target)
        held: str | None = None
        if can_resume_from(target, tp, policy.guarantee):
            _native.link_copy_dir(target, staged)
            topic_ids.copy(target, staged)
            # Held to the store's own id whether or not its copy beside the staged store was made:
            # a copy that failed must not let the restore read on from another topic.
            held = topic_ids.held_topic_id(changelog, tp, target)
        result = restore_store(
            staged,
            changelog,
            tp,
            topic_id=held,
            mode=mode,
            memory_budget_bytes=memory_budget_bytes,
            read_ahead=cpus > 1,
            format=format,
            retention_ms=retention_ms,
            segment_interval_ms=segment_interval_ms,
        )
        if failure_injected(store, partition, attempt):
            raise InjectedFailure(
                f"task {task_id} store {store}: failure injected into attempt {attempt} by {FAIL_ATTEMPT_ENV}"
            )
        if in_store and result.offset is None and not segmented:
            # No committed record in the changelog: Kafka Streams' "no offset yet", in the staged store
            # (a segmented store without one has no segment to record it in).
            record_no_offset_yet(staged, sd.checkpoint_path(task_id), tp, format, LAYOUTS[layout])
        offset = None if in_store else to_checkpoint_layout(staged, tp)
        sd.ensure_held(token, what=f"move the restored store {store} into place")
        target.parent.mkdir(exist_ok=True)
        if not in_store:
            record_in_checkpoint(sd.checkpoint_path(task_id), {tp: None})
        _native.fsync_dir(staged)  # what the restore wrote beside the copy's links
        try:
            _native.replace_dir(staged, target, attempt_dir / "previous")
        except OSError as e:  # a failed swap puts the store there before back (see finally)
            raise StoreError(
                f"task {task_id} store {store}: moving the restored store into place at {target} failed: {e}",
                path=target,
            ) from e
        topic_ids.move(staged, target)
        if not in_store:
            sd.ensure_held(token, what=f"record the offset of store {store} in the task's .checkpoint")
            record_in_checkpoint(
                sd.checkpoint_path(task_id), {tp: OFFSET_UNKNOWN if offset is None else offset}
            )
        return RestoreRow.restored(
            work,
            result,
            seconds=time.perf_counter() - t0,
            lag=_lag_after(changelog, tp, result),
            attempts=attempt + 1,
        )
    except StateStoreError as e:
        msg = str(e)
        if staged is not None and target is not None:  # the staging store started as a copy of the store
            msg = msg.replace(str(staged), f"{target} (restored in {staged})")
        return failed(msg)
    finally:
        if attempt_dir is not None:
            if target is not None and not target.exists() and (attempt_dir / "previous").is_dir():
                # A swap failed and could not put the old store back either: its only copy is
                # kept for the next attempt's recovery, which puts it back in place.
                logger.error(
                    "task %s store %s: %s is missing; its previous store is kept in %s",
                    task_id,
                    store,
                    target,
                    attempt_dir,
                )
            else:
                _remove_tree(attempt_dir)
        sd.close()


def sweep_staging(
    state_dir: str | os.PathLike[str],
    application_id: str,
    work: Iterable[PartitionWork],
    formats: Mapping[str, str] | None = None,
) -> int:
    """Remove what killed attempts left in the staging directories of ``work``'s tasks; best effort.

    An attempt that Spark kills (the loser of a speculative race) cannot clean
    up, and no later attempt of its partition may come. Each task whose lock
    is free right now is swept under that lock (an interrupted swap is rolled
    back first); a task locked by someone is skipped, as is a state directory
    this process cannot see (executors' local disks). Never raises; returns
    how many tasks were swept. ``formats`` names the stores' formats (a
    window or session store lives elsewhere in its task directory).
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
                        target = store_location(sd, task_id, store, (formats or {}).get(store, "plain"))
                        _recover_staging(staging / store, target, task_id)
                        with contextlib.suppress(OSError):
                            (staging / store).rmdir()
                    with contextlib.suppress(OSError):
                        staging.rmdir()
                    swept += 1
                finally:
                    sd.unlock(task_id)
    except (StateStoreError, OSError) as e:
        logger.warning("could not sweep the staging directories under %s: %s", app_dir, e)
    return swept


__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "STAGING_DIR_NAME",
    "can_resume_from",
    "check_mode",
    "restore_partition",
    "store_location",
    "sweep_staging",
]
