"""Kill points for crash-test children: SIGKILL this process at a chosen step."""

from __future__ import annotations

import os
import signal
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
