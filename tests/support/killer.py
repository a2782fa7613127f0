"""Kill points for crash-test children (SIGKILL this process at a chosen step), and the parent's side."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any


class Killer:
    """Counts steps and SIGKILLs this process at step ``kill_at``."""

    def __init__(self, kill_at: int) -> None:
        self.kill_at = kill_at
        self.step = 0

    def point(self) -> None:
        self.step += 1
        if self.step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def wrap(self, cls: Any, name: str) -> None:
        """Make ``cls.name`` pass a kill point before and after it runs."""
        original: Callable[..., Any] = getattr(cls, name)
        killer = self

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            killer.point()
            out = original(*args, **kwargs)
            killer.point()
            return out

        setattr(cls, name, wrapped)


def run_until_killed(
    cmd: list[str],
    rng: random.Random,
    *,
    self_kill: bool,
    startup: tuple[float, float],
    processing: tuple[float, float],
    timeout: float,
) -> tuple[int, str, str]:
    """Run a crash child until it dies; returns ``(returncode, stdout, stderr)``.

    With ``self_kill`` the child kills itself at a step it was given; else the
    parent SIGKILLs it, half the time ``startup`` seconds after the start
    (during start-up or restoration), half the time ``processing`` seconds
    after its first line of output (while processing). A child that never
    reaches its kill step within ``timeout`` is killed by the parent.
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        if self_kill:
            proc.wait(timeout=timeout)
        else:
            if rng.random() < 0.5:
                time.sleep(rng.uniform(*startup))
            else:
                proc.stdout.readline()
                time.sleep(rng.uniform(*processing))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    return proc.returncode, out, err


def kill_counting_children(
    rng: random.Random,
    kills_wanted: int,
    command: Callable[[int], list[str]],
    after_kill: Callable[[], None],
    *,
    max_kill_at: int,
    startup: tuple[float, float],
    processing: tuple[float, float],
    timeout: float,
) -> dict[str, int]:
    """SIGKILL crash children until ``kills_wanted`` died that way; returns the counts.

    Each run is ``command(kill_at)`` (``kill_at`` -1: the parent kills it,
    see :func:`run_until_killed`; else the child kills itself at that step,
    half the time). Every run must end by SIGKILL; ``after_kill`` then checks
    what is on disk. ``verified`` counts the children that checked their
    restored store (each prints ``verified``) before dying.
    """
    stats = {"kills": 0, "self_kills": 0, "runs": 0, "verified": 0}
    while stats["kills"] < kills_wanted:
        stats["runs"] += 1
        assert stats["runs"] <= kills_wanted * 2, f"children keep failing to die: {stats}"
        self_kill = rng.random() < 0.5
        kill_at = rng.randint(1, max_kill_at) if self_kill else -1
        code, out, err = run_until_killed(
            command(kill_at),
            rng,
            self_kill=self_kill,
            startup=startup,
            processing=processing,
            timeout=timeout,
        )
        errors = "\n".join(line for line in err.splitlines() if not line.startswith("%"))  # librdkafka's logs
        assert code == -signal.SIGKILL, f"child exited with {code}:\n{errors}"
        stats["kills"] += 1
        stats["self_kills"] += self_kill
        stats["verified"] += out.count("verified")
        after_kill()
    return stats


def kill_after_first_line(cmd: list[str]) -> str:
    """Run a crash child until it prints its first line, SIGKILL it, and return that line.

    The child prints what the parent needs to know once it has reached the
    state to crash in, then waits; a child that exits without a line fails
    with its stderr.
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(proc.stderr.read())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, proc.returncode
    return line
