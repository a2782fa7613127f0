"""Shared by the race children and tests/processing/test_races.py: the lock audit log and its checks.

Every race child opens its :class:`~statestore.state.directory.StateDirectory` with
an ``audit`` hook that appends one line per :class:`LockEvent` to one file
opened with ``O_APPEND`` (all processes share it). The directory reports an
event while the lock it concerns is held, and a small ``O_APPEND`` write is
atomic, so the file orders lock holders exactly as they held the locks: two
owners of one lock show up as a "locked" line while another owner's lock is
still open.

Line format: ``<pid> <thread ident> <event> <task> <generation> <inode>``.
Monitors add ``seen`` lines: a task directory (inode) seen holding more than
its lock file. Files appear in a directory only after a holder locked it, and
the holder logs ``locked`` with the directory's inode before writing, so a
``seen`` inode that no earlier ``locked`` line names was written by someone
who never held its lock -- a stale writer re-creating a deleted directory (an
inode reused by the filesystem could hide one; nothing can make one up).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from statestore.state.directory import LockEvent

TASK_DIR = re.compile(r"^\d+_\d+$")


class AuditLog:
    """The hook: one appended line per lock event."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.pid = os.getpid()

    def __call__(self, ev: LockEvent) -> None:
        line = f"{self.pid} {threading.get_ident()} {ev.event} {ev.task_id} {ev.generation} {ev.inode}\n"
        os.write(self.fd, line.encode())

    def seen(self, task: str, inode: int) -> None:
        """A monitor saw task directory ``inode`` holding more than its lock file."""
        os.write(self.fd, f"{self.pid} {threading.get_ident()} seen {task} 0 {inode}\n".encode())

    def close(self) -> None:
        os.close(self.fd)


def watch_directories(app_dir: Path, audit: AuditLog, until: float, lock_file: str = ".lock") -> int:
    """Until ``time.monotonic() >= until``, log every task directory seen holding more than its lock file.

    The directory is opened first and listed through its descriptor, so the
    inode logged is the one whose contents were seen. Returns the number of scans.
    """
    scans = 0
    while time.monotonic() < until:
        scans += 1
        try:
            entries = [e.name for e in os.scandir(app_dir)]
        except FileNotFoundError:
            continue
        for name in entries:
            if not TASK_DIR.match(name):
                continue
            try:
                fd = os.open(app_dir / name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                ino = os.fstat(fd).st_ino
                if any(n != lock_file for n in os.listdir(fd)):
                    audit.seen(name, ino)
            except OSError:
                pass
            finally:
                os.close(fd)
        time.sleep(0.0005)
    return scans


@dataclass
class AuditReport:
    """What the audit log shows: counts and every violation found."""

    events: int = 0
    acquisitions: int = 0
    cleaner_holds: int = 0
    deletions: int = 0
    locked_dirs: set[tuple[str, int]] = field(default_factory=set)
    seen: int = 0
    violations: list[str] = field(default_factory=list)


def check_audit(lines: Iterable[str]) -> AuditReport:
    """Replay the audit log: per task, every lock is released by its holder before anyone else locks.

    The holder of a task lock is ``(pid, generation)``; the cleaner's hold is
    ``(pid, thread, "clean")``. A ``deleting`` event must come from the
    cleaner that holds the lock.
    """
    report = AuditReport()
    holder: dict[str, tuple[str, ...]] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        pid, thread, event, task, gen, inode = line.split()
        report.events += 1
        if event == "seen":
            # Contents appear only after a holder locked this very directory (and logged it).
            report.seen += 1
            if (task, int(inode)) not in report.locked_dirs:
                report.violations.append(
                    f"line {n}: task directory {task} (inode {inode}) holds files but nobody had locked it: "
                    "written by a stale writer?"
                )
            continue
        owner: tuple[str, ...]
        if event.startswith("clean-") or event == "deleting":
            owner = (pid, thread, "clean")
        else:
            owner = (pid, gen)
        current = holder.get(task)
        if event in ("locked", "clean-locked"):
            if current is not None:
                report.violations.append(f"line {n}: task {task} locked by {owner} while held by {current}")
            holder[task] = owner
            if event == "locked":
                report.acquisitions += 1
                report.locked_dirs.add((task, int(inode)))
            else:
                report.cleaner_holds += 1
        elif event in ("unlocking", "clean-unlocking"):
            if current != owner:
                report.violations.append(f"line {n}: task {task} released by {owner} but held by {current}")
            holder.pop(task, None)
        elif event == "deleting":
            report.deletions += 1
            if current != owner:
                report.violations.append(f"line {n}: task {task} deleted by {owner} but held by {current}")
        else:
            report.violations.append(f"line {n}: unknown event {event!r}")
    return report
