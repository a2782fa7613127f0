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
* no task directory was created other than by taking its lock: every task
  directory inode seen while running, or left at the end, was reported as
  created by a lock acquisition (a stale writer re-creating a directory the
  cleaner deleted, as in seed 001, would show up as an unknown inode);
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

from race_audit import AuditReport, check_audit  # noqa: E402

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


def check_directory_inodes(run: Run, app_dir: Path, seen: set[tuple[str, int]]) -> list[str]:
    """Every task directory seen or left must have been created by a lock acquisition."""
    left = set()
    for entry in os.scandir(app_dir) if app_dir.is_dir() else []:
        if entry.is_dir(follow_symlinks=False) and "_" in entry.name and not entry.name.startswith("."):
            left.add((entry.name, os.stat(entry.path).st_ino))
    return [
        f"task directory {name} (inode {ino}) was not created by taking its lock: re-created by a stale writer?"
        for name, ino in sorted(seen | left)
        if (name, ino) not in run.audit.created
    ]


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
    seen = {(name, ino) for o in outputs for name, ino in o["seen"]}
    violations = [v for o in outputs for v in o["violations"]] + run.audit.violations
    violations += check_directory_inodes(run, tmp_path / "state" / "app", seen)
    figures = {
        "processes": PROCESSES, "threads_per_process": THREADS, "tasks": n_tasks,
        "acquisitions": run.audit.acquisitions, "cleaner_holds": run.audit.cleaner_holds,
        "directories_deleted": run.audit.deletions, "directories_created": len(run.audit.created),
        "owner_writes": run.stat("owner_writes"), "checkpoint_writes": run.stat("checkpoint_writes"),
        "wipes": run.stat("wipes"), "stale_writes_refused": run.stat("stale_writes_refused"),
        "busy": run.stat("busy"), "audit_events": run.audit.events, "violations": len(violations),
    }
    record_figures("locks", seed, seconds, figures)
    assert not violations, f"seed {seed}: {len(violations)} violations:\n" + "\n".join(violations[:30])
    # The run must have raced for real: every kind of operation happened, locks changed hands
    # between processes, and the cleaner deleted directories that were then created again.
    assert run.audit.acquisitions > 50 and run.audit.deletions > 5 and len(run.audit.created) > 5, figures
    assert run.stat("stale_writes_refused") > 0 and run.stat("wipes") > 0 and run.stat("busy") > 0, figures


@pytest.mark.parametrize("seed", seeds([1, 2]))
def test_lock_races_across_processes(tmp_path: Path, seed: int) -> None:
    race_locks(tmp_path, seed, SHORT_SECONDS)


@pytest.mark.torture
@pytest.mark.parametrize("seed", seeds([101]))
def test_lock_races_across_processes_torture(tmp_path: Path, seed: int) -> None:
    race_locks(tmp_path, seed, TORTURE_SECONDS)
