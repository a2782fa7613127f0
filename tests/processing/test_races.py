"""Races under load (issue #9, item 3): the seed-001 race at scale.

Two harnesses, each run by several real processes at once for a bounded time:

* **locks** (``support/race_locks.py``): processes sharing one state directory
  (``shared=True``) lock, write, wipe and release random tasks from several
  threads each, with a cleaner deleting unlocked directories on a zero delay
  in every process, and stale writers trying their old tokens.
* **tasks** (``support/race_tasks.py``): each process is an application instance
  with its own state directory and several stream threads (one
  :class:`~statestore.processing.task_manager.TaskManager` each) over one changelog;
  random rebalances move active and standby tasks between threads with no
  barrier, threads crash (dirty close) and restart, processing increments
  keyed counters, and a cleaner runs on a zero delay.

Afterwards, from the files alone:

* no lock was ever held by two owners: the audit log every directory writes
  (see ``support/race_audit.py``) replays without overlap;
* no task directory was re-created by a stale writer: monitors log every task
  directory (by inode) they see holding files, and each must have been locked
  by someone before (a stale writer re-creating a directory the cleaner
  deleted, as in KAFKA-8187, writes into an inode nobody locked);
* every store equals the model of its changelog: a store holding its offsets
  equals the committed changelog replayed up to that offset; after a final
  restore every store equals the whole changelog; and every counter in the
  committed changelog goes up by exactly one per write -- an owner that
  started from a store missing history would write a value seen before.

``make test`` runs a few seconds per seed; ``make torture`` runs
``STATESTORE_RACE_SECONDS`` (default 120) per harness. A failure names the
seed; rerun one with ``STATESTORE_RACE_SEED=<seed>``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from support import SUPPORT
from support.race_audit import TASK_DIR, AuditReport, check_audit

PROCS = SUPPORT


PROCESSES = 3
THREADS = 3
SHORT_SECONDS = 3.0
TORTURE_SECONDS = float(os.environ.get("STATESTORE_RACE_SECONDS", "120"))
FIGURES = os.environ.get("STATESTORE_RACE_FIGURES")  # a JSON-lines file to append each run's figures to


def seeds(default: list[int]) -> list[int]:
    env = os.environ.get("STATESTORE_RACE_SEED")
    return [int(env)] if env else default


@dataclass
class Run:
    """What the children of one run reported."""

    outputs: list[dict[str, Any]] = field(default_factory=list)
    audit: AuditReport = field(default_factory=AuditReport)

    def stat(self, name: str) -> int:
        return sum(int(o["stats"].get(name, 0)) for o in self.outputs)


def run_children(script: str, args_per_child: list[list[str]], timeout: float) -> list[dict[str, Any]]:
    """Start every child at once, wait, and return each one's JSON summary (its last stdout line)."""
    procs = [
        subprocess.Popen(
            [sys.executable, str(PROCS / script), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in args_per_child
    ]
    outputs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            if p.returncode != 0 or not out.strip():
                raise AssertionError(f"{script} {p.args[2:]} exited {p.returncode}:\n{err[-4000:]}")
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outputs


def record_figures(name: str, seed: int, seconds: float, figures: dict[str, Any]) -> None:
    line = json.dumps({"harness": name, "seed": seed, "seconds": seconds, **figures})
    print(line)
    if FIGURES:
        with open(FIGURES, "a") as f:
            f.write(line + "\n")


def check_left_directories(run: Run, app_dir: Path) -> list[str]:
    """Every task directory left holding files must be one that was locked (see ``check_audit``)."""
    out = []
    for entry in os.scandir(app_dir) if app_dir.is_dir() else []:
        if entry.is_dir(follow_symlinks=False) and TASK_DIR.match(entry.name):
            ino = os.stat(entry.path).st_ino
            if (
                os.listdir(entry.path) not in ([], [".lock"])
                and (entry.name, ino) not in run.audit.locked_dirs
            ):
                out.append(f"task directory {entry.name} (inode {ino}) holds files but was never locked")
    return out


# -- locks ---------------------------------------------------------------------------------


def race_locks(tmp_path: Path, seed: int, seconds: float) -> None:
    audit = tmp_path / "audit.log"
    n_tasks = 4
    outputs = run_children(
        "race_locks.py",
        [
            [
                str(tmp_path / "state"),
                str(audit),
                str(seconds),
                str(seed * 10 + i),
                str(THREADS),
                str(n_tasks),
            ]
            for i in range(PROCESSES)
        ],
        timeout=seconds + 120,
    )
    run = Run(outputs, check_audit(audit.read_text().splitlines()))
    violations = [v for o in outputs for v in o["violations"]] + run.audit.violations
    violations += check_left_directories(run, tmp_path / "state" / "app")
    figures = {
        "processes": PROCESSES,
        "threads_per_process": THREADS,
        "tasks": n_tasks,
        "acquisitions": run.audit.acquisitions,
        "cleaner_holds": run.audit.cleaner_holds,
        "directories_deleted": run.audit.deletions,
        "directories_seen_with_files": run.audit.seen,
        "owner_writes": run.stat("owner_writes"),
        "checkpoint_writes": run.stat("checkpoint_writes"),
        "wipes": run.stat("wipes"),
        "stale_writes_refused": run.stat("stale_writes_refused"),
        "busy": run.stat("busy"),
        "audit_events": run.audit.events,
        "violations": len(violations),
    }
    record_figures("locks", seed, seconds, figures)
    assert not violations, f"seed {seed}: {len(violations)} violations:\n" + "\n".join(violations[:30])
    # The run must have raced for real: every kind of operation happened, locks changed hands
    # between processes, and the cleaner deleted directories that were then locked again.
    assert run.audit.acquisitions > 50 and run.audit.deletions > 5 and run.audit.seen > 50, figures
    assert run.stat("stale_writes_refused") > 0 and run.stat("wipes") > 0 and run.stat("busy") > 0, figures


@pytest.mark.parametrize("seed", seeds([1, 2]))
def test_lock_races_across_processes(tmp_path: Path, seed: int) -> None:
    race_locks(tmp_path, seed, SHORT_SECONDS)


@pytest.mark.torture
@pytest.mark.parametrize("seed", seeds([101]))
def test_lock_races_across_processes_torture(tmp_path: Path, seed: int) -> None:
    race_locks(tmp_path, seed, TORTURE_SECONDS)


# -- tasks ---------------------------------------------------------------------------------

TASK_PARTITIONS = 6
TASK_STORE = "s"


def changelog_model(
    log: Any, partition: int, upto: int | None = None
) -> tuple[dict[bytes, bytes], list[str]]:
    """Last committed value per key of the changelog of ``partition`` (through offset ``upto``), and
    every place a counter did not go up by exactly one."""
    from statestore import TopicPartition

    tp = TopicPartition(f"app-{TASK_STORE}-changelog", partition)
    model: dict[bytes, bytes] = {}
    broken: list[str] = []
    if not (log.log_dir / str(tp)).is_dir():
        return model, broken
    for rec in log.read(tp):
        if upto is not None and rec.offset > upto:
            break
        assert rec.key is not None and rec.value is not None
        before = int(model.get(rec.key, b"0"))
        if int(rec.value) != before + 1:
            broken.append(
                f"{tp} offset {rec.offset}: counter {rec.key!r} went from {before} to "
                f"{int(rec.value)} (history lost or made up)"
            )
        model[rec.key] = rec.value
    return model, broken


def check_stores_at_rest(state_dir: Path, log: Any) -> tuple[int, list[str]]:
    """Every store holding its offsets equals the committed changelog replayed through that offset."""
    from statestore import TaskId, TopicPartition
    from statestore.state.store import Store

    checked, out = 0, []
    app = state_dir / "app"
    for entry in sorted(os.scandir(app), key=lambda e: e.name) if app.is_dir() else []:
        if not TASK_DIR.match(entry.name):
            continue
        task = TaskId.parse(entry.name)
        path = Path(entry.path) / "rocksdb" / TASK_STORE
        if not (path / "CURRENT").exists():
            continue
        tp = TopicPartition(f"app-{TASK_STORE}-changelog", task.partition)
        store = Store(path)
        try:
            offset = store.offset(tp)
            content = dict(store.range())
        finally:
            store.close()
        model = changelog_model(log, task.partition, offset)[0] if offset is not None else {}
        checked += 1
        if content != model:
            out.append(
                f"{path}: holds {len(content)} keys at offset {offset}, the changelog through that "
                f"offset {len(model)}; differing keys: "
                f"{sorted(k for k in content.keys() | model.keys() if content.get(k) != model.get(k))[:5]}"
            )
    return checked, out


def check_final_restore(state_dir: Path, log: Any, guarantee: str, offsets: str) -> list[str]:
    """Restore every partition as an active task from ``state_dir``: each store equals its changelog."""
    from statestore import TaskId
    from statestore.processing.task_manager import TaskManager
    from statestore.state.directory import StateDirectory

    out = []
    tm = TaskManager(
        StateDirectory(state_dir, "app"), log, [TASK_STORE], guarantee=guarantee, offsets=offsets
    )
    try:
        tm.assign([TaskId(0, p) for p in range(TASK_PARTITIONS)], [])
        assert tm.restore(timeout=120), "final restore did not finish"
        for p in range(TASK_PARTITIONS):
            content = dict(tm.active_task(TaskId(0, p)).store(TASK_STORE).range())
            model = changelog_model(log, p)[0]
            if content != model:
                out.append(
                    f"{state_dir.name} task 0_{p}: after restoring, the store holds {len(content)} keys, "
                    f"the changelog {len(model)}"
                )
    finally:
        tm.close()
        tm.directory.close()
    return out


def race_tasks(tmp_path: Path, seed: int, seconds: float, guarantee: str, offsets: str, layout: str) -> None:
    from statestore import SegmentLog

    outputs = run_children(
        "race_tasks.py",
        [
            [
                str(tmp_path),
                str(i),
                str(PROCESSES),
                str(seconds),
                str(seed),
                str(THREADS),
                str(TASK_PARTITIONS),
                guarantee,
                offsets,
                layout,
            ]
            for i in range(PROCESSES)
        ],
        timeout=seconds + 180,
    )
    violations = [v for o in outputs for v in o["violations"]]
    run = Run(outputs)
    names = ["shared"] if layout == "shared" else [str(i) for i in range(PROCESSES)]
    for name in names:
        report = check_audit((tmp_path / f"audit-{name}.log").read_text().splitlines())
        violations += [f"state-{name}: {v}" for v in report.violations]
        violations += check_left_directories(Run(audit=report), tmp_path / f"state-{name}" / "app")
        run.audit.acquisitions += report.acquisitions
        run.audit.deletions += report.deletions
        run.audit.seen += report.seen
    log = SegmentLog(tmp_path / "log", sync=False)
    records = 0
    for p in range(TASK_PARTITIONS):
        model, broken = changelog_model(log, p)
        violations += broken
        records += sum(int(v) for v in model.values())
    stores_checked = 0
    if offsets == "store":
        for name in names:
            checked, bad = check_stores_at_rest(tmp_path / f"state-{name}", log)
            stores_checked += checked
            violations += bad
    for name in names:
        violations += check_final_restore(tmp_path / f"state-{name}", log, guarantee, offsets)
    figures = {
        "guarantee": guarantee,
        "offsets": offsets,
        "layout": layout,
        "processes": PROCESSES,
        "threads_per_process": THREADS,
        "tasks": TASK_PARTITIONS,
        "increments_written": records,
        "process_calls": run.stat("increments"),
        "commits": run.stat("commits"),
        "rebalances": run.stat("rebalances"),
        "assignments": run.stat("assignments"),
        "crashes": run.stat("crashes"),
        "lock_acquisitions": run.audit.acquisitions,
        "directories_deleted": run.audit.deletions,
        "directories_seen_with_files": run.audit.seen,
        "stores_checked_at_rest": stores_checked,
        "stores_restored_and_checked": len(names) * TASK_PARTITIONS,
        "violations": len(violations),
    }
    record_figures("tasks", seed, seconds, figures)
    assert not violations, f"seed {seed}: {len(violations)} violations:\n" + "\n".join(violations[:30])
    assert records > 20 and run.stat("crashes") > 0 and run.audit.deletions > 0, figures


MODES = [
    (g, o, layout)
    for g in ("at_least_once", "exactly_once_v2")
    for o in ("store", "checkpoint")
    for layout in ("own", "shared")
]
#: make test: every guarantee, offsets mode and layout once (the torture run has every combination).
SHORT_MODES = [
    ("at_least_once", "store", "own"),
    ("exactly_once_v2", "store", "shared"),
    ("at_least_once", "checkpoint", "shared"),
    ("exactly_once_v2", "checkpoint", "own"),
]


@pytest.mark.parametrize(("guarantee", "offsets", "layout"), SHORT_MODES)
@pytest.mark.parametrize("seed", seeds([1]))
def test_task_races_across_threads_and_processes(
    tmp_path: Path, seed: int, guarantee: str, offsets: str, layout: str
) -> None:
    race_tasks(tmp_path, seed, SHORT_SECONDS, guarantee, offsets, layout)


@pytest.mark.torture
@pytest.mark.parametrize(("guarantee", "offsets", "layout"), MODES)
@pytest.mark.parametrize("seed", seeds([101]))
def test_task_races_across_threads_and_processes_torture(
    tmp_path: Path, seed: int, guarantee: str, offsets: str, layout: str
) -> None:
    race_tasks(tmp_path, seed, TORTURE_SECONDS, guarantee, offsets, layout)


def test_no_one_can_lock_a_directory_the_cleaner_is_half_way_through_deleting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race the lock harness found: deleting in place unlinks ``.lock`` midway, and another
    process (here: a second shared opener, whose flock is just as separate) could lock a new
    ``.lock`` in the half-deleted directory -- two holders, and old files under the new lock."""
    from statestore import TaskId
    from statestore.state import directory as directory_module
    from statestore.state.directory import StateDirectory

    task = TaskId(0, 0)
    cleaner = StateDirectory(tmp_path, "app", shared=True, cleanup_delay_ms=0)
    other = StateDirectory(tmp_path, "app", shared=True)
    assert cleaner.lock(task)
    cleaner.store_dir(task, "s").mkdir(parents=True)
    (cleaner.store_dir(task, "s") / "CURRENT").write_text("MANIFEST-000001\n")
    cleaner.checkpoint_path(task).write_text("0\n1\napp-s-changelog 0 41\n")
    cleaner.unlock(task)
    real_rmtree = directory_module.shutil.rmtree
    midway: dict[str, Any] = {}

    def rmtree_midway(path: Any, *args: Any, **kwargs: Any) -> None:
        (Path(path) / ".lock").unlink(missing_ok=True)  # rmtree may unlink the lock file first
        token = other.acquire(task)
        midway["token"] = token
        midway["files"] = sorted(os.listdir(other.task_dir(task))) if token else None
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(directory_module.shutil, "rmtree", rmtree_midway)
    try:
        assert cleaner.clean_removed_tasks(now_ms=10**15) == [task]
        assert midway["token"] is not None  # the task was free: its old directory was gone as a whole
        assert midway["files"] == [".lock"], "locked a half-deleted directory"
        other.ensure_held(midway["token"])  # and the cleaner did not delete the new one
        assert sorted(os.listdir(tmp_path / "app")) == [".lock", "0_0", "kafka-streams-process-metadata"]
    finally:
        cleaner.close()
        other.close()


def test_active_task_that_never_got_its_lock_can_be_moved_to_standby(tmp_path: Path) -> None:
    """The first race the task harness found. Stream thread B is assigned active task 0_0 while
    thread A still holds it: B cannot lock it and keeps it CREATED (retrying on its next poll,
    KAFKA-8187's setting). The next rebalance makes it B's standby: recycling a task that was never
    initialized must not fail (it raised ``IllegalStateError`` and left B's assignment half done)."""
    from concurrent.futures import ThreadPoolExecutor

    from statestore import SegmentLog, TaskId
    from statestore.processing.task import TaskState
    from statestore.processing.task_manager import TaskManager
    from statestore.state.directory import StateDirectory

    task = TaskId(0, 0)
    a, b = ThreadPoolExecutor(1), ThreadPoolExecutor(1)  # task locks belong to threads
    sd = StateDirectory(tmp_path / "state", "app")
    log = SegmentLog(tmp_path / "log", sync=False)
    tm_a = TaskManager(sd, log, ["s"], guarantee="at_least_once", client_id="a")
    tm_b = TaskManager(sd, log, ["s"], guarantee="at_least_once", client_id="b")
    try:
        a.submit(tm_a.assign, [task], []).result()
        assert a.submit(tm_a.restore, 30).result()
        b.submit(tm_b.assign, [task], []).result()  # A still holds it
        assert tm_b.active_task(task).state is TaskState.CREATED
        b.submit(tm_b.assign, [], [task]).result()  # now B's standby
        a.submit(tm_a.assign, [], []).result()  # A lets go
        b.submit(tm_b.poll, 0).result()
        assert tm_b.standby_tasks()[task].state is TaskState.RUNNING
    finally:
        a.submit(tm_a.close).result()
        b.submit(tm_b.close).result()
        a.shutdown()
        b.shutdown()
        sd.close()


def test_at_least_once_dirty_close_flushes_what_it_sent_before_letting_go_of_its_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream thread crashes (dirty close) with changelog records still buffered in the
    process's shared partition writer. If it released its task locks first and flushed after,
    another thread could restore the task to an end offset that misses those records, then
    commit an offset past them: its store would lack records its offset vouches for."""
    from concurrent.futures import ThreadPoolExecutor

    from statestore import SegmentLog, TaskId
    from statestore.processing.task_manager import RecordCollector, TaskManager
    from statestore.state.directory import StateDirectory

    task = TaskId(0, 0)
    a, b = ThreadPoolExecutor(1), ThreadPoolExecutor(1)
    sd = StateDirectory(tmp_path / "state", "app")
    log = SegmentLog(tmp_path / "log", sync=False)
    tm_a = TaskManager(sd, log, ["s"], guarantee="at_least_once", client_id="a")
    tm_b = TaskManager(sd, log, ["s"], guarantee="at_least_once", client_id="b")

    def increment(tm: TaskManager) -> None:
        store = tm.active_task(task).store("s")
        raw = store.get(b"k")
        store.put(b"k", b"%d" % (int(raw) + 1 if raw is not None else 1))

    def b_takes_over() -> None:
        tm_b.assign([task], [])
        assert tm_b.restore(30)
        increment(tm_b)
        tm_b.commit()

    real_close = RecordCollector.close

    def close(self: RecordCollector) -> None:
        if self is tm_a.collector:  # A's tasks may be free now: B takes over, then A's buffer goes out
            b.submit(b_takes_over).result()
        real_close(self)

    monkeypatch.setattr(RecordCollector, "close", close)
    try:
        a.submit(tm_a.assign, [task], []).result()
        assert a.submit(tm_a.restore, 30).result()
        a.submit(increment, tm_a).result()
        a.submit(tm_a.commit).result()
        a.submit(increment, tm_a).result()  # sent, still buffered
        a.submit(tm_a.close, False).result()  # crash
        b.submit(tm_b.close).result()
        model, broken = changelog_model_of(log, "app-s-changelog", 0)
        assert not broken, broken
        assert model == {b"k": b"3"}
    finally:
        a.shutdown()
        b.shutdown()
        sd.close()


def changelog_model_of(log: Any, topic: str, partition: int) -> tuple[dict[bytes, bytes], list[str]]:
    """Counters of one changelog partition and where they did not go up by one."""
    model: dict[bytes, bytes] = {}
    broken = []
    for rec in log.read((topic, partition)):
        before = int(model.get(rec.key, b"0"))
        if int(rec.value) != before + 1:
            broken.append(f"offset {rec.offset}: {rec.key!r} {before} -> {int(rec.value)}")
        model[rec.key] = rec.value
    return model, broken


def test_stream_threads_sharing_a_state_directory_under_exactly_once_each_have_a_transactional_id(
    tmp_path: Path,
) -> None:
    """Task managers over one state directory (the stream threads of one instance) used one
    transactional id, ``<app>-<process id>``: each new one fenced the others. With a
    ``client_id`` each has its own and all of them commit."""
    from concurrent.futures import ThreadPoolExecutor

    from statestore import ProducerFencedError, SegmentLog, TaskId
    from statestore.processing.task_manager import TaskManager
    from statestore.state.directory import StateDirectory

    def run(client_ids: tuple[str | None, str | None]) -> None:
        root = tmp_path / "-".join(map(str, client_ids))
        sd = StateDirectory(root / "state", "app")
        log = SegmentLog(root / "log", sync=False)
        pools = [ThreadPoolExecutor(1), ThreadPoolExecutor(1)]
        tms = [TaskManager(sd, log, ["s"], guarantee="exactly_once_v2", client_id=c) for c in client_ids]
        try:
            for i, (pool, tm) in enumerate(zip(pools, tms, strict=True)):
                pool.submit(tm.assign, [TaskId(0, i)], []).result()
                assert pool.submit(tm.restore, 30).result()
            for i, (pool, tm) in enumerate(zip(pools, tms, strict=True)):
                pool.submit(
                    lambda tm=tm, i=i: tm.active_task(TaskId(0, i)).store("s").put(b"k", b"1")
                ).result()
                pool.submit(tm.commit).result()
        finally:
            for pool, tm in zip(pools, tms, strict=True):
                pool.submit(tm.close, False).result()
                pool.shutdown()
            sd.close()

    with pytest.raises(ProducerFencedError):
        run((None, None))
    run(("t0", "t1"))


def test_acquire_survives_another_process_deleting_the_directory_it_is_creating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the task harness (shared layout): ``mkdir(exist_ok=True)`` raises
    ``FileExistsError`` when the directory exists at ``mkdir`` but is gone by the time pathlib
    checks ``is_dir()`` -- another process's cleaner deleted it in between. ``acquire`` must
    treat that as the vanished directory it is, and create it again."""
    from statestore import TaskId
    from statestore.state.directory import StateDirectory

    task = TaskId(0, 0)
    sd = StateDirectory(tmp_path, "app", shared=True)
    real_mkdir = os.mkdir
    calls = []

    def mkdir_then_cleaned(path: Any, *args: Any, **kwargs: Any) -> None:
        if Path(path) == sd.task_dir(task) and not calls:
            calls.append(path)
            real_mkdir(path, *args, **kwargs)  # it was there ...
            os.rmdir(path)  # ... and another process's cleaner took it away
            raise FileExistsError(17, "File exists", str(path))
        real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir_then_cleaned)
    try:
        token = sd.acquire(task)
        assert token is not None and calls
        sd.ensure_held(token)
    finally:
        sd.close()
