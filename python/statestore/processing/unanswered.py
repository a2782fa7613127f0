"""Changelogs whose cluster gave no answer, and when each is asked again.

A changelog whose cluster gives no answer (``ChangelogUnavailableError``: brokers down, stalled or
unreachable) holds back only the tasks it feeds; they are asked again on a later poll. Asking one
again may wait a whole request timeout (a broker that stalls without refusing connections), so
with many of them a poll that asked each would wait that long for every one, while the running
tasks wait for the loop. :class:`UnansweredChangelogs` decides who is asked.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from statestore.errors import ChangelogUnavailableError
from statestore.ids import TaskId, TopicPartition

#: What waits for an answer: a task not yet opened or handed to the state updater (the task manager
#: asks for all its changelogs at once), or one changelog partition the state updater restores or
#: updates.
Waiter = TaskId | TopicPartition


class UnansweredChangelogs:
    """What gave no answer and has not answered since, shared by the task manager and the state
    updater for one poll after another.

    A poll asks again at most one waiter that gave no answer before it -- the one asked longest
    ago, so each gets its turn -- and nothing whose changelog gave no answer during the poll. So
    beyond the changelogs that fall silent during it, a poll waits for at most one silent cluster.
    A waiter leaves once it answers (:meth:`answered`) or its task leaves (:meth:`forget`); until
    then every poll reports it (:attr:`first`), and an application stops after ``task_timeout``.
    """

    def __init__(self) -> None:
        self._errors: dict[Waiter, ChangelogUnavailableError] = {}
        # When each was last asked, as a count of asks (a clock may stand still, or tie).
        self._asks = itertools.count()
        self._asked: dict[Waiter, int] = {}
        self._silent: set[TopicPartition] = set()
        self._turn: Waiter | None = None
        self._turn_taken = False

    def new_poll(self) -> None:
        """A poll begins: what fell silent during the last may be asked again, and the waiter asked
        longest ago gets its turn."""
        if self._turn is not None and not self._turn_taken and self._turn in self._errors:
            # Nobody asked for it (its task was not due): the turn passes, or it would come back
            # to the same waiter again and again.
            self._asked[self._turn] = next(self._asks)
        self._silent.clear()
        self._turn = min(self._errors, key=lambda w: self._asked.get(w, -1), default=None)
        self._turn_taken = False

    def may_ask(self, waiter: Waiter, tps: Iterable[TopicPartition]) -> bool:
        """Whether ``waiter`` (reading ``tps``) may ask its cluster now; a yes to one that gave no
        answer before takes this poll's turn."""
        if any(tp in self._silent for tp in tps):
            return False
        if waiter not in self._errors:
            return True
        if waiter != self._turn or self._turn_taken:
            return False
        self._turn_taken = True
        self._asked[waiter] = next(self._asks)
        return True

    def no_answer(
        self, waiter: Waiter, tps: Iterable[TopicPartition], error: ChangelogUnavailableError
    ) -> None:
        """``waiter`` got no answer reading ``tps``: not asked again during this poll."""
        self._errors[waiter] = error
        self._asked[waiter] = next(self._asks)
        self._silent.update(tps)

    def answered(self, waiter: Waiter) -> None:
        """``waiter`` got its answer (or no longer waits for one)."""
        self._errors.pop(waiter, None)
        self._asked.pop(waiter, None)

    forget = answered

    def silent(self) -> bool:
        """Whether a changelog gave no answer during this poll."""
        return bool(self._silent)

    def waiting(self) -> list[Waiter]:
        """Who waits for an answer."""
        return list(self._errors)

    def error(self, waiter: Waiter) -> ChangelogUnavailableError | None:
        """What ``waiter`` was last told, if it waits."""
        return self._errors.get(waiter)

    @property
    def first(self) -> ChangelogUnavailableError | None:
        """What one that waits was last told; None when none waits."""
        return next(iter(self._errors.values()), None)

    def __contains__(self, waiter: object) -> bool:
        return waiter in self._errors


__all__ = ["UnansweredChangelogs", "Waiter"]
