"""Looking at an application's local state without disturbing it.

Everything here reads only: stores are opened read-only (no RocksDB lock is
taken, nothing is written), lock holders are found in ``/proc/locks`` rather
than by trying the locks, so inspecting a live application never makes one of
its lock attempts fail.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from statestore import _native
from statestore.changelog.protocol import Changelog
from statestore.changelog.segment_log import SegmentLog
from statestore.errors import StateStoreError
from statestore.ids import SENTINEL_OFFSETS, TaskId, TopicPartition, changelog_topic, committed_offset
from statestore.state.checkpoint import CHECKPOINT_FILE_NAME, OffsetCheckpoint
from statestore.state.directory import LOCK_FILE_NAME, flock_holders, lock_holder
from statestore.state.lag import store_lag
from statestore.state.layout import store_layout
from statestore.state.segmented import read_segmented, task_store_dirs
from statestore.state.store import STATUS_NAMES
from statestore.state.store_kinds import (
    KEY_VALUE,
    VERSIONED,
    WINDOW_OR_SESSION,
    history_retention_from_topic_config,
    kind_from_topic_config,
)

if TYPE_CHECKING:
    from statestore.ops.metrics import MetricsSnapshot


@dataclass(frozen=True)
class LocalStore:
    """One store found on disk: ``<state_dir>/<app>/<task>/rocksdb/<store>``, or a window or session
    store's directory of segments ``<state_dir>/<app>/<task>/<store>`` (``segmented``)."""

    task_id: TaskId
    store: str
    path: Path
    changelog: TopicPartition
    segmented: bool = False

    @property
    def task_dir(self) -> Path:
        """The store's task directory (that of its ``.checkpoint`` and ``.lock``)."""
        return self.path.parent if self.segmented else self.path.parent.parent


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
        if not task_dir.is_dir():
            continue
        for name, store_dir, segmented in task_store_dirs(task_dir):
            if stores is None or name in stores:
                tp = TopicPartition(changelog_topic(application_id, name), task_id.partition)
                found.append(LocalStore(task_id, name, store_dir, tp, segmented))
    return sorted(found, key=lambda s: (s.task_id, s.store, s.segmented))


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
class SegmentReport:
    """One segment of a window or session store, as ``statestore inspect`` shows it."""

    #: Its start (ms); its directory is ``<store>.<start>``.
    start: int
    directory: str
    #: The offset it records for the store's changelog partition (None: none, or a sentinel).
    store_offset: int | None
    offset_note: str | None
    status: str
    approx_keys: int


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
    #: 4.3+) or ``"checkpoint"`` (the task's ``.checkpoint``, 3.6 - 4.2); None when unreadable (or a
    #: window or session store without segments).
    layout: str | None = None
    #: ``"key-value"`` or ``"window or session"`` (a directory of segments); None when unreadable.
    kind: str | None = None
    #: A window or session store's segments, oldest first (offset and status each, as Kafka
    #: Streams 4.3+ records them in every segment); empty for a key-value store.
    segments: tuple[SegmentReport, ...] = ()
    #: What settling the format needs when the bytes do not tell it (plain segments: a window or a
    #: session store, ``--store-format``).
    format_note: str | None = None

    def to_json(self) -> dict[str, object]:
        """A plain dict for ``--json``."""
        return asdict(self)


def versioned_by_changelog(changelog: Changelog | None, found: Sequence[LocalStore]) -> dict[str, int | None]:
    """The stores of ``found`` whose changelog's topic configs say they are versioned (store name ->
    history retention, ms, when the configs tell it): a versioned store's bytes look like a plain
    store's, so only its changelog (a Kafka changelog reports topic configs; a segment log has
    none) tells it."""
    topic_configs = getattr(changelog, "topic_configs", None)
    if not callable(topic_configs) or not found:
        return {}
    configs: Mapping[str, Mapping[str, str]] = topic_configs(sorted({s.changelog.topic for s in found}))
    out: dict[str, int | None] = {}
    for s in found:
        config = configs.get(s.changelog.topic)
        if config is not None and kind_from_topic_config(config) == VERSIONED:
            out[s.store] = history_retention_from_topic_config(config)
    return out


def inspect_app(
    state_dir: str | Path,
    application_id: str,
    log_dir: str | Path | None = None,
    *,
    changelog: Changelog | None = None,
    check_blocks: bool = False,
    formats: Mapping[str, str] | None = None,
    retentions: Mapping[str, int] | None = None,
) -> tuple[int | None, list[StoreReport]]:
    """The process-lock holder's pid and one report per store of the application.

    A window or session store (a directory of segments) is reported with
    its segments, each with the offset and status it records; the store's
    offset is the one Kafka Streams 4.3+ reads (the newest segment's), and
    its format the one its bytes tell (timestamped segments) or ``formats``
    gives (name -> ``window`` or ``session``: plain segments fit both).
    With ``retentions`` (name -> ms) its segments are checked against the
    segment interval the DSL gives that retention: a segment that does not
    start at a multiple of it is the store's problem. A versioned store,
    whose bytes look like a plain store's, is reported as one when
    ``formats`` says so (``"versioned"``) or its changelog's topic configs do
    (``changelog``: a Kafka changelog).

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
    found = local_stores(state_dir, application_id)
    versioned = versioned_by_changelog(changelog, [ls for ls in found if not ls.segmented])
    for ls in found:
        problem = None
        offset: int | None = None
        status = "none"
        keys: int | None = None
        store_unreadable = False
        fmt: str | None = None
        note: str | None = None
        ckpt_note: str | None = None
        layout: str | None = None
        kind: str | None = None
        segments: tuple[SegmentReport, ...] = ()
        format_note: str | None = None
        try:
            if ls.segmented:
                view = read_segmented(ls.path, check_blocks)
                kind = WINDOW_OR_SESSION
                layout = None if view.layout is None else view.layout.name
                try:
                    fmt = view.format_for((formats or {}).get(ls.store), ls.store)
                except ValueError as e:
                    if (formats or {}).get(ls.store) is not None:
                        problem = str(e)
                    else:
                        format_note = str(e)
                recorded, status, keys = (
                    view.info.offsets.get(str(ls.changelog)),
                    view.status,
                    view.estimated_keys,
                )
                segments = tuple(_segment_report(s, ls.changelog) for s in view.info.segments)
                if ls.store in (retentions or {}):
                    _native.segments_check(ls.path, (retentions or {})[ls.store])
            else:
                found_layout = store_layout(ls.path)
                layout = None if found_layout is None else found_layout.name
                fmt = _native.store_format(ls.path)
                kind = KEY_VALUE
                named = (formats or {}).get(ls.store)
                if fmt == "plain" and (ls.store in versioned or named in _native.VERSIONED_STORE_FORMATS):
                    fmt, kind = _native.VERSIONED_STORE_FORMATS[0], VERSIONED
                info = _native.store_info(ls.path, check_blocks)
                recorded, st, keys = info.offsets.get(str(ls.changelog)), info.status, info.estimated_keys
                status = STATUS_NAMES.get(st, f"unknown ({st})") if st is not None else "none"
            offset = committed_offset(recorded)
            note = SENTINEL_OFFSETS.get(recorded) if recorded is not None else None
        except StateStoreError as e:
            problem = str(e)
            store_unreadable = True
        ckpt_offset = None
        try:
            ckpt_recorded = OffsetCheckpoint(ls.task_dir / CHECKPOINT_FILE_NAME).read().get(ls.changelog)
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
                lock_holder_pid=lock_holder(ls.task_dir / LOCK_FILE_NAME, holders),
                log_start=start,
                log_end=end,
                lag=lag,
                offset_lag=offset_lag,
                problem=problem,
                format=fmt,
                offset_note=note,
                checkpoint_note=ckpt_note,
                layout=layout,
                kind=kind,
                segments=segments,
                format_note=format_note,
            )
        )
    return lock_holder(root / LOCK_FILE_NAME, holders), reports


def _segment_report(s: _native.SegmentInfo, tp: TopicPartition) -> SegmentReport:
    recorded = s.offsets.get(str(tp))
    return SegmentReport(
        start=s.start,
        directory=Path(s.path).name,
        store_offset=committed_offset(recorded),
        offset_note=SENTINEL_OFFSETS.get(recorded) if recorded is not None else None,
        status=STATUS_NAMES.get(s.status, f"unknown ({s.status})") if s.status is not None else "none",
        approx_keys=s.estimated_keys,
    )


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
    "SegmentReport",
    "StoreReport",
    "app_dir",
    "inspect_app",
    "local_stores",
    "lock_holder",
    "reports_json",
]
