"""Looking at an application's local state without disturbing it.

Everything here reads only: stores are opened read-only (no RocksDB lock is
taken, nothing is written), lock holders are found in ``/proc/locks`` rather
than by trying the locks, so inspecting a live application never makes one of
its lock attempts fail.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from statestore import _native
from statestore.changelog.protocol import Changelog
from statestore.changelog.segment_log import SegmentLog
from statestore.errors import StateStoreError
from statestore.ids import SENTINEL_OFFSETS, TaskId, TopicPartition, changelog_topic, committed_offset
from statestore.state.checkpoint import CHECKPOINT_FILE_NAME, OffsetCheckpoint
from statestore.state.directory import LOCK_FILE_NAME, STORES_DIR_NAME
from statestore.state.lag import store_lag
from statestore.state.layout import store_layout
from statestore.state.store import STATUS_NAMES

if TYPE_CHECKING:
    from statestore.ops.metrics import MetricsSnapshot


@dataclass(frozen=True)
class LocalStore:
    """One store found on disk: ``<state_dir>/<app>/<task>/rocksdb/<store>``."""

    task_id: TaskId
    store: str
    path: Path
    changelog: TopicPartition


def app_dir(state_dir: str | Path, application_id: str) -> Path:
    """The application's directory; ``StateStoreError`` naming it if it does not exist."""
    d = Path(state_dir) / application_id
    if not d.is_dir():
        raise StateStoreError(
            f"no state for application {application_id!r}: {d} is not a directory "
            "(check --state-dir and --app-id)",
            path=d,
        )
    return d


def local_stores(
    state_dir: str | Path, application_id: str, stores: list[str] | None = None
) -> list[LocalStore]:
    """Every store of every task directory, sorted by task then store name."""
    root = app_dir(state_dir, application_id)
    found = []
    for task_dir in sorted(root.iterdir()):
        try:
            task_id = TaskId.parse(task_dir.name)
        except ValueError:
            continue
        sdir = task_dir / STORES_DIR_NAME
        if not sdir.is_dir():
            continue
        for store_dir in sorted(sdir.iterdir()):
            if store_dir.is_dir() and (stores is None or store_dir.name in stores):
                tp = TopicPartition(changelog_topic(application_id, store_dir.name), task_id.partition)
                found.append(LocalStore(task_id, store_dir.name, store_dir, tp))
    return sorted(found, key=lambda s: (s.task_id, s.store))


def flock_holders(kind: str = "FLOCK") -> dict[tuple[int, int], int]:
    """``(device, inode) -> pid`` of every flock held on this machine (empty where /proc/locks is absent).

    ``kind="POSIX"`` gives the holders of POSIX record locks instead: Java's
    ``FileChannel.lock``, which Kafka Streams takes on ``<app>/.lock`` and
    which ``flock`` does not see.
    """
    holders: dict[tuple[int, int], int] = {}
    try:
        text = Path("/proc/locks").read_text()
    except OSError:
        return holders
    for line in text.splitlines():
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"
        if len(parts) < 6 or parts[1] != kind or parts[4] == "->":
            continue
        try:
            major, minor, inode = parts[5].split(":")
            dev = os.makedev(int(major, 16), int(minor, 16))
            holders[(dev, int(inode))] = int(parts[4])
        except ValueError:
            continue
    return holders


def lock_holder(lock_file: Path, holders: dict[tuple[int, int], int] | None = None) -> int | None:
    """Pid of the process holding an flock on ``lock_file``, or None."""
    try:
        st = lock_file.stat()
    except OSError:
        return None
    table = flock_holders() if holders is None else holders
    return table.get((st.st_dev, st.st_ino))


def disk_size(path: Path) -> int:
    """Bytes used by the files under ``path``."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += (Path(dirpath) / f).stat().st_size
            except OSError:
                pass
    return total


@dataclass(frozen=True)
class StoreReport:
    """What ``statestore inspect`` shows for one store."""

    task_id: str
    store: str
    changelog: str
    store_offset: int | None
    checkpoint_offset: int | None
    status: str
    approx_keys: int | None
    size_bytes: int
    lock_holder_pid: int | None
    log_start: int | None = None
    log_end: int | None = None
    #: Committed records past the store's offset: what a restore would apply
    #: (aborted records and transaction markers are not lag). None: unknown.
    lag: int | None = None
    #: Offsets between the store's offset and the log end (markers and
    #: aborted records included), beside ``lag``.
    offset_lag: int | None = None
    problem: str | None = None
    #: ``"plain"``, ``"timestamped"`` (Kafka Streams' timestamped store) or ``"timestamped-headers"`` (its
    #: header-aware one, 4.3+); None when unreadable.
    format: str | None = None
    #: What a sentinel the store records in place of an offset means (``"no offset yet"`` for Kafka
    #: Streams' ``OFFSET_UNKNOWN``: the task committed no changelog record, a restore starts at the
    #: changelog's start); ``store_offset`` is None then. None: no sentinel.
    offset_note: str | None = None
    #: The same for the task's ``.checkpoint`` file and ``checkpoint_offset``.
    checkpoint_note: str | None = None
    #: Where the store's offsets live: ``"kip-1035"`` (its ``offsets`` column family, Kafka Streams
    #: 4.3+) or ``"checkpoint"`` (the task's ``.checkpoint``, 3.6 - 4.2); None when unreadable.
    layout: str | None = None

    def to_json(self) -> dict[str, object]:
        """A plain dict for ``--json``."""
        return asdict(self)


def inspect_app(
    state_dir: str | Path,
    application_id: str,
    log_dir: str | Path | None = None,
    *,
    changelog: Changelog | None = None,
    check_blocks: bool = False,
) -> tuple[int | None, list[StoreReport]]:
    """The process-lock holder's pid and one report per store of the application.

    Log offsets and lag come from the segment log in ``log_dir``, or from
    ``changelog`` (e.g. a :class:`~statestore.changelog.kafka.KafkaChangelog`). With
    ``check_blocks`` every block of every store is read with its checksum
    verified (a full read of the stores), so a damaged data block shows as the
    store's problem with RocksDB's reason; without it only what opening a store
    and reading its offsets notices does.
    """
    root = app_dir(state_dir, application_id)
    holders = flock_holders()
    log: Changelog | None = SegmentLog(log_dir) if log_dir is not None else changelog
    reports = []
    for ls in local_stores(state_dir, application_id):
        problem = None
        offset: int | None = None
        status = "none"
        keys: int | None = None
        store_unreadable = False
        fmt: str | None = None
        note: str | None = None
        ckpt_note: str | None = None
        layout: str | None = None
        try:
            found_layout = store_layout(ls.path)
            layout = None if found_layout is None else found_layout.name
            fmt = _native.store_format(ls.path)
            info = _native.store_info(ls.path, check_blocks)
            recorded, st, keys = info.offsets.get(str(ls.changelog)), info.status, info.estimated_keys
            offset = committed_offset(recorded)
            note = SENTINEL_OFFSETS.get(recorded) if recorded is not None else None
            status = STATUS_NAMES.get(st, f"unknown ({st})") if st is not None else "none"
        except StateStoreError as e:
            problem = str(e)
            store_unreadable = True
        ckpt_offset = None
        try:
            ckpt_recorded = (
                OffsetCheckpoint(ls.path.parent.parent / CHECKPOINT_FILE_NAME).read().get(ls.changelog)
            )
            ckpt_offset = committed_offset(ckpt_recorded)
            ckpt_note = SENTINEL_OFFSETS.get(ckpt_recorded) if ckpt_recorded is not None else None
        except StateStoreError as e:
            problem = (problem + "; " if problem else "") + str(e)
        start = end = lag = offset_lag = None
        if log is not None:
            known = offset if offset is not None else ckpt_offset
            try:
                lg = store_lag(log, ls.changelog, known)
                start, end, lag, offset_lag = lg.log_start, lg.log_end, lg.records, lg.offsets
            except StateStoreError as e:
                problem = (problem + "; " if problem else "") + f"lag unknown: {e}"
            if store_unreadable:
                # The store's own offset is unknown: any lag would be a guess.
                lag = offset_lag = None
        reports.append(
            StoreReport(
                task_id=str(ls.task_id),
                store=ls.store,
                changelog=str(ls.changelog),
                store_offset=offset,
                checkpoint_offset=ckpt_offset,
                status=status,
                approx_keys=keys,
                size_bytes=disk_size(ls.path),
                lock_holder_pid=lock_holder(ls.path.parent.parent / LOCK_FILE_NAME, holders),
                log_start=start,
                log_end=end,
                lag=lag,
                offset_lag=offset_lag,
                problem=problem,
                format=fmt,
                offset_note=note,
                checkpoint_note=ckpt_note,
                layout=layout,
            )
        )
    return lock_holder(root / LOCK_FILE_NAME, holders), reports


def reports_json(
    process_holder: int | None, reports: list[StoreReport], live: Sequence[MetricsSnapshot] = ()
) -> str:
    """The ``--json`` document of :func:`inspect_app`; ``live``: the snapshots live processes published
    (their pid, liveness, each task's state, standby promotions)."""
    processes = [
        {
            "pid": snap.pid,
            "taken_at": snap.taken_at,
            "liveness": snap.liveness,
            "task_states": snap.task_states,
            "tasks_by_state": snap.tasks_by_state,
            "standby_promotions": snap.standby_promotions,
            "promotion_replayed_records": snap.promotion_replayed_records,
        }
        for snap in live
    ]
    return json.dumps(
        {
            "process_lock_holder_pid": process_holder,
            "stores": [r.to_json() for r in reports],
            "processes": processes,
        },
        indent=2,
    )


__all__ = [
    "LocalStore",
    "StoreReport",
    "app_dir",
    "inspect_app",
    "local_stores",
    "lock_holder",
    "reports_json",
]
