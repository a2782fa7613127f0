"""Races under load (issue #9, item 3): the seed-001 race at scale.

Two harnesses, each run by several real processes at once for a bounded time:

* **locks** (``procs/race_locks.py``): processes sharing one state directory
  (``shared=True``) lock, write, wipe and release random tasks from several
  threads each, with a cleaner deleting unlocked directories on a zero delay
  in every process, and stale writers trying their old tokens.
* **tasks** (``procs/race_tasks.py``): each process is an application instance
  with its own state directory and several stream threads (one
  :class:`~statestore.task_manager.TaskManager` each) over one changelog;
  random rebalances move active and standby tasks between threads with no
  barrier, threads crash (dirty close) and restart, processing increments
  keyed counters, and a cleaner runs on a zero delay.

Afterwards, from the files alone:

* no lock was ever held by two owners: the audit log every directory writes
  (see ``procs/race_audit.py``) replays without overlap;
* no task directory was re-created by a stale writer: monitors log every task
  directory (by inode) they see holding files, and each must have been locked
  by someone before (a stale writer re-creating a directory the cleaner
  deleted, as in seed 001, writes into an inode nobody locked);
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

PROCS = Path(__file__).resolve().parent / "procs"
sys.path.insert(0, str(PROCS))

from race_audit import TASK_DIR, AuditReport, check_audit  # noqa: E402

PROCESSES = 3
THREADS = 3
SHORT_SECONDS = 4.0
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
    env = {**os.environ, "PYTHONPATH": str(PROCS)}
    procs = [
        subprocess.Popen([sys.executable, str(PROCS / script), *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
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
            if os.listdir(entry.path) not in ([], [".lock"]) and (entry.name, ino) not in run.audit.locked_dirs:
                out.append(f"task directory {entry.name} (inode {ino}) holds files but was never locked")
    return out


# -- locks ---------------------------------------------------------------------------------


def race_locks(tmp_path: Path, seed: int, seconds: float) -> None:
    audit = tmp_path / "audit.log"
    n_tasks = 4
    outputs = run_children(
        "race_locks.py",
        [[str(tmp_path / "state"), str(audit), str(seconds), str(seed * 10 + i), str(THREADS), str(n_tasks)]
         for i in range(PROCESSES)],
        timeout=seconds + 120,
    )
    run = Run(outputs, check_audit(audit.read_text().splitlines()))
    violations = [v for o in outputs for v in o["violations"]] + run.audit.violations
    violations += check_left_directories(run, tmp_path / "state" / "app")
    figures = {
        "processes": PROCESSES, "threads_per_process": THREADS, "tasks": n_tasks,
        "acquisitions": run.audit.acquisitions, "cleaner_holds": run.audit.cleaner_holds,
        "directories_deleted": run.audit.deletions, "directories_seen_with_files": run.audit.seen,
        "owner_writes": run.stat("owner_writes"), "checkpoint_writes": run.stat("checkpoint_writes"),
        "wipes": run.stat("wipes"), "stale_writes_refused": run.stat("stale_writes_refused"),
        "busy": run.stat("busy"), "audit_events": run.audit.events, "violations": len(violations),
    }
    record_figures("locks", seed, seconds, figures)
    assert not violations, f"seed {seed}: {len(violations)} violations:\n" + "\n".join(violations[:30])
    # The run must have raced for real: every kind of operation happened, locks changed hands
    # between processes, and the cleaner deleted directories that were then created again.
    assert run.audit.acquisitions > 50 and run.audit.deletions > 5 and run.audit.seen > 50, figures
    assert run.stat("stale_writes_refused") > 0 and run.stat("wipes") > 0 and run.stat("busy") > 0, figures


@pytest.mark.parametrize("seed", seeds([1, 2]))
def test_lock_races_across_processes(tmp_path: Path, seed: int) -> None:
    race_locks(tmp_path, seed, SHORT_SECONDS)


@pytest.mark.torture
@pytest.mark.parametrize("seed", seeds([101]))
def test_lock_races_across_processes_torture(tmp_path: Path, seed: int) -> None:
    race_locks(tmp_path, seed, TORTURE_SECONDS)


def test_no_one_can_lock_a_directory_the_cleaner_is_half_way_through_deleting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race the lock harness found: deleting in place unlinks ``.lock`` midway, and another
    process (here: a second shared opener, whose flock is just as separate) could lock a new
    ``.lock`` in the half-deleted directory -- two holders, and old files under the new lock."""
    from statestore import TaskId
    from statestore import directory as directory_module
    from statestore.directory import StateDirectory

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
