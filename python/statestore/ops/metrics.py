"""Restore and standby metrics, the ones Kafka Streams users know (KIP-869 style).

:class:`RestoreMetrics` collects, per task and store, what an operator asks
of a restoration -- how many records are restored, how fast, how many remain,
how long it has run -- and of a standby: how fast it is updated and how far
it lags; per process, how many tasks are in each state, each task's state,
how often a task that moved in found a standby (and how many records it
replayed before it ran), and an application's liveness. It has no
dependency: read it with :meth:`RestoreMetrics.snapshot`, hand it to
:func:`statestore.ops.exporter.start_exporter` (``statestore[metrics]``)
to serve Prometheus, or let :class:`MetricsPublisher` write snapshots that
``statestore watch`` reads from another process.

Recording is a few integer updates under a lock, never I/O, so it cannot slow
a restore measurably; the progress callbacks it hangs on come at most every
``progress_interval`` of the engine (0.1 s by default), not per record.

*Remaining records* is the offset distance from the restore's position to its
end offset: what Kafka Streams reports, an upper bound on the records still
to apply (markers and aborted records occupy offsets); it reaches 0 when the
restore completes. ``statestore inspect`` reports the exact lag in records.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from statestore import _native
from statestore.ids import TaskId, TopicPartition
from statestore.restore.engine import RestoreListener

#: Seconds of history a rate is computed over.
RATE_WINDOW_SECONDS = 5.0
#: Directory under an application's directory where live processes publish metric snapshots.
METRICS_DIR_NAME = ".metrics"


@dataclass(frozen=True)
class StoreMetrics:
    """Metrics of one store of one task, as of a snapshot."""

    application_id: str
    task_id: str
    store: str
    changelog: str
    kind: str
    """``"active"`` (a restoration) or ``"standby"`` (updates of a standby)."""
    records_restored: int
    """Records applied so far (restored for an active task, loaded for a standby)."""
    rate: float
    """Records applied per second over the last :data:`RATE_WINDOW_SECONDS`."""
    remaining_records: int | None
    """Active: end offset minus position (0 once complete). Standby: its lag in offsets. None: unknown."""
    seconds: float
    """Active: time from the restore's start to its end (or to now while it runs)."""
    position: int | None
    """Next changelog offset to read."""
    end_offset: int | None
    done: bool

    def eta_seconds(self) -> float | None:
        """Time to completion at the current rate; None when there is no rate or nothing is known."""
        if self.done:
            return 0.0
        if self.remaining_records is None or self.rate <= 0:
            return None
        return self.remaining_records / self.rate


@dataclass(frozen=True)
class MetricsSnapshot:
    """Everything :class:`RestoreMetrics` knows at one moment."""

    application_id: str
    pid: int
    taken_at: float
    """``time.time()`` of the snapshot."""
    stores: list[StoreMetrics]
    tasks_by_state: dict[str, int]
    task_states: dict[str, str] = field(default_factory=dict)
    """Each task of this process and its state: ``RESTORING``, ``RUNNING`` (active) or ``STANDBY``."""
    standby_promotions: dict[str, int] = field(default_factory=dict)
    """Tasks that moved to this process (promoted to active) by whether they found a standby here:
    ``{"hit": n, "miss": m}``."""
    promotion_replayed_records: dict[str, int] = field(default_factory=dict)
    """Records those tasks restored before they ran, by ``"hit"``/``"miss"``: a hit replays only
    what its standby had not applied."""
    liveness: dict[str, Any] = field(default_factory=dict)
    """What the process says of itself (an application: ``state`` and ``last_poll_at``, a
    ``time.time()``); empty for a process that does not tell."""

    def hit_rate(self) -> float | None:
        """Share of promoted tasks that found a standby; None before any promotion."""
        hits, misses = self.standby_promotions.get("hit", 0), self.standby_promotions.get("miss", 0)
        return hits / (hits + misses) if hits + misses else None

    def to_json(self) -> str:
        """The snapshot as JSON (what :class:`MetricsPublisher` writes)."""
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> MetricsSnapshot:
        """Parse :meth:`to_json`'s output; ``ValueError`` when it is not one."""
        try:
            doc = json.loads(text)
            return MetricsSnapshot(
                application_id=str(doc["application_id"]),
                pid=int(doc["pid"]),
                taken_at=float(doc["taken_at"]),
                stores=[StoreMetrics(**s) for s in doc["stores"]],
                tasks_by_state={str(k): int(v) for k, v in doc["tasks_by_state"].items()},
                task_states={str(k): str(v) for k, v in doc.get("task_states", {}).items()},
                standby_promotions={str(k): int(v) for k, v in doc.get("standby_promotions", {}).items()},
                promotion_replayed_records={
                    str(k): int(v) for k, v in doc.get("promotion_replayed_records", {}).items()
                },
                liveness=dict(doc.get("liveness", {})),
            )
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as e:
            raise ValueError(f"not a metrics snapshot: {e}") from e


@dataclass
class _Progress:
    """Mutable progress of one (task, store); only touched under the recorder's lock."""

    task_id: str
    store: str
    changelog: str
    kind: str
    started: float
    position: int | None = None
    end_offset: int | None = None
    records: int = 0
    ended: float | None = None
    window: deque[tuple[float, int]] = field(default_factory=deque)

    def record(self, now: float, records: int, position: int | None) -> None:
        self.records += records
        if position is not None:
            self.position = position if self.position is None else max(self.position, position)
        self.window.append((now, self.records))
        while len(self.window) > 2 and now - self.window[0][0] > RATE_WINDOW_SECONDS:
            self.window.popleft()

    def rate(self, now: float) -> float:
        if not self.window:
            return 0.0
        if self.ended is not None:
            span = self.ended - self.started
            return self.records / span if span > 0 else 0.0
        t0, r0 = self.window[0]
        if len(self.window) == 1:
            t0, r0 = self.started, 0
        span = now - t0
        return (self.records - r0) / span if span > 0 else 0.0


class RestoreMetrics:
    """Collects restore and standby metrics of one application in this process; thread-safe.

    Feed it from a :class:`~statestore.processing.updater.StateUpdater` or
    :class:`~statestore.processing.task_manager.TaskManager` (their ``metrics=``
    argument), or give :meth:`listener` to ``restore_store`` /
    ``restore_many`` / ``RestoreSpec``. ``tasks_by_state`` is a callable asked
    at snapshot time (e.g. ``TaskManager.tasks_by_state``), so the per-process
    gauge costs nothing between scrapes.
    """

    def __init__(self, application_id: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.application_id = application_id
        self._clock = clock
        self._lock = threading.Lock()
        self._stores: dict[tuple[str, str], _Progress] = {}
        self._promotions: Counter[str] = Counter()
        self._replayed: Counter[str] = Counter()
        self.tasks_by_state: Callable[[], Mapping[str, int]] | None = None
        #: Asked at snapshot time: each task's state (``RESTORING``/``RUNNING``/``STANDBY``).
        self.task_states: Callable[[], Mapping[str, str]] | None = None
        #: Asked at snapshot time: the process's liveness (see :attr:`MetricsSnapshot.liveness`).
        self.liveness: Callable[[], Mapping[str, Any]] | None = None

    # -- recording ------------------------------------------------------------------------

    def restore_started(
        self, task_id: TaskId | str, tp: TopicPartition, store: str, position: int, end: int
    ) -> None:
        """An active task's store starts restoring from ``position`` to ``end``."""
        with self._lock:
            p = _Progress(str(task_id), store, str(tp), "active", self._clock(), position, end)
            self._stores[(str(task_id), store)] = p

    def restored(
        self, task_id: TaskId | str, tp: TopicPartition, store: str, records: int, next_position: int | None
    ) -> None:
        """``records`` more records were applied; the reader is at ``next_position``."""
        with self._lock:
            p = self._stores.get((str(task_id), store))
            if p is None:
                p = _Progress(str(task_id), store, str(tp), "active", self._clock())
                self._stores[(str(task_id), store)] = p
            p.record(self._clock(), records, next_position)

    def restore_ended(self, task_id: TaskId | str, store: str, total_restored: int | None = None) -> None:
        """The store's restoration completed, having applied ``total_restored`` records (when known)."""
        with self._lock:
            p = self._stores.get((str(task_id), store))
            if p is not None:
                p.ended = self._clock()
                if total_restored is not None and total_restored > p.records:
                    # the engine reports progress at most every progress interval: a short
                    # restore may end before reporting any batch
                    p.record(p.ended, total_restored - p.records, None)
                if p.end_offset is not None:
                    p.position = max(p.position or 0, p.end_offset)

    def standby_updated(
        self,
        task_id: TaskId | str,
        tp: TopicPartition,
        store: str,
        records: int,
        next_position: int,
        end: int,
    ) -> None:
        """A standby's store loaded ``records`` more records; the changelog ends at ``end``."""
        with self._lock:
            key = (str(task_id), store)
            p = self._stores.get(key)
            if p is None or p.kind != "standby":
                p = _Progress(str(task_id), store, str(tp), "standby", self._clock(), next_position, end)
                self._stores[key] = p
            p.end_offset = end
            p.record(self._clock(), records, next_position)

    def promoted(self, task_id: TaskId | str, found_standby: bool) -> None:
        """A task moved to this process as an active task; it found a standby of itself here or not."""
        with self._lock:
            self._promotions["hit" if found_standby else "miss"] += 1

    def promotion_replayed(self, task_id: TaskId | str, found_standby: bool, records: int) -> None:
        """A promoted task ran after restoring ``records`` records (what its standby lacked, on a hit)."""
        with self._lock:
            self._replayed["hit" if found_standby else "miss"] += records

    def active_restored(self, task_id: TaskId | str) -> int:
        """Records restored so far into the active stores of ``task_id`` (0 when none restored)."""
        with self._lock:
            return sum(
                p.records for (t, _), p in self._stores.items() if t == str(task_id) and p.kind == "active"
            )

    def forget(self, task_id: TaskId | str) -> None:
        """Drop every store of a task (it was closed, wiped or migrated)."""
        with self._lock:
            for key in [k for k in self._stores if k[0] == str(task_id)]:
                del self._stores[key]

    def listener(self, task_id: TaskId | str, also: RestoreListener | None = None) -> TaskRestoreListener:
        """An engine restore listener (``restore_store(listener=...)``) that records into this for ``task_id``.

        ``also`` is a listener that hears every call too (e.g. a progress bar).
        """
        return TaskRestoreListener(self, str(task_id), also)

    # -- reading --------------------------------------------------------------------------

    def snapshot(self) -> MetricsSnapshot:
        """Every store's metrics and the tasks by state, now."""
        states = dict(self.tasks_by_state()) if self.tasks_by_state is not None else {}
        task_states = dict(self.task_states()) if self.task_states is not None else {}
        liveness = dict(self.liveness()) if self.liveness is not None else {}
        now = self._clock()
        with self._lock:
            stores = [self._store_metrics(p, now) for p in self._stores.values()]
            promotions = {"hit": self._promotions["hit"], "miss": self._promotions["miss"]}
            replayed = {"hit": self._replayed["hit"], "miss": self._replayed["miss"]}
        stores.sort(key=lambda s: (s.task_id, s.store))
        return MetricsSnapshot(
            self.application_id,
            os.getpid(),
            time.time(),
            stores,
            states,
            task_states,
            promotions,
            replayed,
            liveness,
        )

    def _store_metrics(self, p: _Progress, now: float) -> StoreMetrics:
        remaining = None
        if p.end_offset is not None and p.position is not None:
            remaining = max(0, p.end_offset - p.position)
        if p.ended is not None:
            remaining = 0
        end = p.ended if p.ended is not None else now
        return StoreMetrics(
            application_id=self.application_id,
            task_id=p.task_id,
            store=p.store,
            changelog=p.changelog,
            kind=p.kind,
            records_restored=p.records,
            rate=p.rate(now),
            remaining_records=remaining,
            seconds=end - p.started if p.kind == "active" else 0.0,
            position=p.position,
            end_offset=p.end_offset,
            done=p.ended is not None,
        )


class TaskRestoreListener:
    """The engine's restore-listener shape, recording one task's progress into :class:`RestoreMetrics`."""

    def __init__(self, metrics: RestoreMetrics, task_id: str, also: RestoreListener | None = None) -> None:
        self._metrics = metrics
        self._task_id = task_id
        self._also = also

    def on_restore_start(
        self, tp: TopicPartition, store_name: str, start_offset: int, end_offset: int
    ) -> None:
        """Called once when the store's restoration starts."""
        self._metrics.restore_started(self._task_id, tp, store_name, start_offset, end_offset)
        if self._also is not None:
            self._also.on_restore_start(tp, store_name, start_offset, end_offset)

    def on_batch_restored(
        self, tp: TopicPartition, store_name: str, batch_end_offset: int, num_restored: int
    ) -> None:
        """Called as records are applied (at most every progress interval), and once the whole log is read."""
        self._metrics.restored(self._task_id, tp, store_name, num_restored, batch_end_offset + 1)
        if self._also is not None:
            self._also.on_batch_restored(tp, store_name, batch_end_offset, num_restored)

    def on_restore_end(self, tp: TopicPartition, store_name: str, total_restored: int) -> None:
        """Called once when the store's restoration completed."""
        self._metrics.restore_ended(self._task_id, store_name, total_restored)
        if self._also is not None:
            self._also.on_restore_end(tp, store_name, total_restored)


class MetricsPublisher:
    """Writes :class:`RestoreMetrics` snapshots for ``statestore watch`` in another process.

    Every ``interval`` seconds a background thread replaces
    ``<state_dir>/<app>/.metrics/<pid>.json`` atomically (never on the restore
    path); :meth:`close` removes it. A reader never takes a lock: it reads
    whole files and ignores those of dead processes.
    """

    def __init__(self, metrics: RestoreMetrics, state_dir: str | Path, *, interval: float = 1.0) -> None:
        self.metrics = metrics
        self.path = Path(state_dir) / metrics.application_id / METRICS_DIR_NAME / f"{os.getpid()}.json"
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="statestore-metrics-publisher", daemon=True)

    def start(self) -> MetricsPublisher:
        """Publish once now, then every ``interval`` until :meth:`close`."""
        self.publish()
        self._thread.start()
        return self

    def publish(self) -> None:
        """Write one snapshot now (creating the directory if needed)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _native.atomic_write(str(self.path), self.metrics.snapshot().to_json().encode())

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.publish()
            except OSError:
                # The application directory may be wiped or moved under us; try again next time.
                continue

    def close(self) -> None:
        """Stop publishing and remove this process's snapshot."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        try:
            self.path.unlink()
        except OSError:
            pass

    def __enter__(self) -> MetricsPublisher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def published_snapshots(state_dir: str | Path, application_id: str) -> list[MetricsSnapshot]:
    """Snapshots published by live processes of the application; unreadable or stale files are skipped."""
    d = Path(state_dir) / application_id / METRICS_DIR_NAME
    out: list[MetricsSnapshot] = []
    try:
        files: Iterable[Path] = sorted(d.glob("*.json"))
    except OSError:
        return out
    for f in files:
        try:
            snap = MetricsSnapshot.from_json(f.read_text())
        except (OSError, ValueError, UnicodeDecodeError):
            continue
        if _alive(snap.pid):
            out.append(snap)
    return out


#: A snapshot older than this many seconds says its process stopped polling (its loop hangs).
STALE_AFTER_SECONDS = 10.0


def task_states_by_process(snaps: Iterable[MetricsSnapshot]) -> dict[str, tuple[str, int]]:
    """``task id -> (state, pid)`` from the snapshots of live processes (``RESTORING``/``RUNNING``/``STANDBY``)."""
    out: dict[str, tuple[str, int]] = {}
    for snap in snaps:
        for task, state in snap.task_states.items():
            # An active task wins over a standby another process holds of it.
            if task not in out or out[task][0] == "STANDBY":
                out[task] = (state, snap.pid)
    return out


def describe_liveness(snap: MetricsSnapshot, now: float | None = None) -> str:
    """One line on a live process: its state, how long ago its loop polled, its standby hit rate."""
    now = time.time() if now is None else now
    parts = [f"pid {snap.pid}"]
    state = snap.liveness.get("state")
    age = now - snap.taken_at
    if age > STALE_AFTER_SECONDS:
        parts.append(f"NOT RESPONDING (last snapshot {age:.0f} s ago)")
    elif state is not None:
        parts.append(str(state))
    last_poll = snap.liveness.get("last_poll_at")
    if last_poll is not None:
        parts.append(f"last poll {max(0.0, now - float(last_poll)):.1f} s ago")
    counts = ", ".join(f"{n} {k}" for k, n in sorted(snap.tasks_by_state.items()))
    if counts:
        parts.append(f"tasks: {counts}")
    rate = snap.hit_rate()
    if rate is not None:
        hits, misses = snap.standby_promotions.get("hit", 0), snap.standby_promotions.get("miss", 0)
        replayed = sum(snap.promotion_replayed_records.values())
        parts.append(
            f"standby hits {hits}/{hits + misses} ({rate:.0%}), {replayed:,} records replayed on promotion"
        )
    return "; ".join(parts)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


__all__ = [
    "METRICS_DIR_NAME",
    "RATE_WINDOW_SECONDS",
    "STALE_AFTER_SECONDS",
    "MetricsPublisher",
    "MetricsSnapshot",
    "RestoreMetrics",
    "StoreMetrics",
    "TaskRestoreListener",
    "describe_liveness",
    "published_snapshots",
    "task_states_by_process",
]
