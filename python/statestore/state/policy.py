"""When offsets are written, deleted or kept: every decision in one table.

The table :data:`POLICY_TABLE` maps (lifecycle event, guarantee, offsets mode)
to a :class:`Decision`. Nothing else in statestore decides these questions; the
state manager looks its decisions up here. ``docs/policy.md`` is this table
rendered by :func:`render_markdown` (regenerate it with
``python -m statestore.state.policy > docs/policy.md``; a test checks it is current).

The semantics are Kafka Streams' with its known bugs fixed:

* ``offsets="store"`` (default): offsets live in the store and move in the same
  WriteBatch as the data. Staged writes reach RocksDB only after the changelog
  transaction commits, so under exactly-once a crash needs no wipe.
* ``offsets="checkpoint"``: Kafka's ``.checkpoint`` file. Under exactly-once it
  is loaded then deleted at init, deleted again when restoration completes
  (before RUNNING -- the KAFKA-20685 fix), never written on a RUNNING commit,
  written on clean suspend/close after a flush; a dirty close wipes. Under
  at-least-once it is written after a flush when the offsets moved by more
  than the threshold, at restoration end, and on clean suspend/close.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from statestore.ids import TopicPartition

#: Kafka's ``OFFSET_DELTA_THRESHOLD_FOR_CHECKPOINT``.
DEFAULT_CHECKPOINT_DELTA = 10_000


class Guarantee(enum.Enum):
    """Processing guarantee, named as in Kafka (``processing.guarantee``)."""

    AT_LEAST_ONCE = "at_least_once"
    EXACTLY_ONCE_V2 = "exactly_once_v2"


class OffsetsMode(enum.Enum):
    """Where a task's changelog offsets are kept."""

    STORE = "store"
    CHECKPOINT = "checkpoint"


class Event(enum.Enum):
    """A lifecycle event of a task's state at which offsets may be written."""

    INIT = "init"
    """Lock taken, stores opened: offsets are loaded."""
    RESTORE_PROGRESS = "restore_progress"
    """Periodically during restoration (restored data is committed data)."""
    RESTORE_COMPLETE = "restore_complete"
    """Restoration reached the end offset; the task is about to turn RUNNING."""
    COMMIT = "commit"
    """A commit of an active RUNNING task."""
    STANDBY_COMMIT = "standby_commit"
    """A commit of a standby task (it applies committed changelog data only)."""
    SUSPEND = "suspend"
    """Clean suspension (revocation), after the final commit."""
    RESUME = "resume"
    """A suspended task is taken up again."""
    CLOSE_CLEAN = "close_clean"
    """Clean close, after the final commit."""
    CLOSE_DIRTY = "close_dirty"
    """Close without a final commit (error, corruption, lost ownership); a crash is the same case."""


class OffsetAction(enum.Enum):
    """What happens to the recorded offsets at an event."""

    LOAD = "load"
    """Read the offsets (they stay where they are)."""
    LOAD_DELETE = "load, then delete"
    """Read the offsets, then delete the checkpoint file."""
    WRITE = "write"
    """Record the current offsets."""
    WRITE_IF_MOVED = "write if moved > threshold"
    """Record the offsets if they moved by more than the threshold since last recorded."""
    DELETE = "delete"
    """Delete the checkpoint file."""
    KEEP = "keep"
    """Leave recorded offsets as they are."""


@dataclass(frozen=True)
class Decision:
    """What to do at one event: the offsets action, whether to flush first, whether to wipe.

    ``corrupt_if_missing``: at INIT, a logged persistent store without an offset
    whose task directory is not empty is ``TaskCorruptedError``.
    ``crash_after``: what recovery does if the process dies after this event
    (before the next one) -- "resume" from the recorded offsets, or "wipe".
    """

    offsets: OffsetAction
    flush: bool
    wipe: bool
    crash_after: Literal["resume", "wipe", "-"]
    corrupt_if_missing: bool = False
    why: str = ""


_ALOS = Guarantee.AT_LEAST_ONCE
_EOS = Guarantee.EXACTLY_ONCE_V2
_STORE = OffsetsMode.STORE
_CKPT = OffsetsMode.CHECKPOINT
_A = OffsetAction

#: Every decision, keyed by (event, guarantee, mode). The single source of truth.
POLICY_TABLE: Mapping[tuple[Event, Guarantee, OffsetsMode], Decision] = {
    # -- INIT
    (Event.INIT, _ALOS, _STORE): Decision(
        _A.LOAD,
        False,
        False,
        "resume",
        why="offsets in the store match its data; no offset means restore from the beginning",
    ),
    (Event.INIT, _EOS, _STORE): Decision(
        _A.LOAD,
        False,
        False,
        "resume",
        corrupt_if_missing=True,
        why="nothing uncommitted ever reaches RocksDB, so even status OPEN resumes; data without offset is unknown state",
    ),
    (Event.INIT, _ALOS, _CKPT): Decision(
        _A.LOAD, False, False, "resume", why="the file stays: a crash replays from it, duplicates are allowed"
    ),
    (Event.INIT, _EOS, _CKPT): Decision(
        _A.LOAD_DELETE,
        False,
        False,
        "wipe",
        corrupt_if_missing=True,
        why="no file may outlive init, so a crash from here on finds none and wipes",
    ),
    # -- RESTORE_PROGRESS
    (Event.RESTORE_PROGRESS, _ALOS, _STORE): Decision(
        _A.WRITE, False, False, "resume", why="the restore engine writes offsets in the batch with the data"
    ),
    (Event.RESTORE_PROGRESS, _EOS, _STORE): Decision(
        _A.WRITE, False, False, "resume", why="restored data is committed data"
    ),
    (Event.RESTORE_PROGRESS, _ALOS, _CKPT): Decision(
        _A.WRITE_IF_MOVED, True, False, "resume", why="periodic checkpoint while restoring"
    ),
    (Event.RESTORE_PROGRESS, _EOS, _CKPT): Decision(
        _A.WRITE_IF_MOVED,
        True,
        False,
        "resume",
        why="restored data is committed data, so a checkpoint of it is safe",
    ),
    # -- RESTORE_COMPLETE
    (Event.RESTORE_COMPLETE, _ALOS, _STORE): Decision(
        _A.WRITE, True, False, "resume", why="offsets of the restored data, flushed"
    ),
    (Event.RESTORE_COMPLETE, _EOS, _STORE): Decision(
        _A.WRITE, True, False, "resume", why="offsets of the restored data, flushed"
    ),
    (Event.RESTORE_COMPLETE, _ALOS, _CKPT): Decision(
        _A.WRITE, True, False, "resume", why="enforced checkpoint at restoration end"
    ),
    (Event.RESTORE_COMPLETE, _EOS, _CKPT): Decision(
        _A.DELETE, False, False, "wipe", why="KAFKA-20685: no checkpoint may exist while RUNNING"
    ),
    # -- COMMIT (active, RUNNING)
    (Event.COMMIT, _ALOS, _STORE): Decision(
        _A.WRITE, False, False, "resume", why="offsets go in the commit's WriteBatch"
    ),
    (Event.COMMIT, _EOS, _STORE): Decision(
        _A.WRITE, False, False, "resume", why="applied only after the transaction committed, with its offsets"
    ),
    (Event.COMMIT, _ALOS, _CKPT): Decision(
        _A.WRITE_IF_MOVED, True, False, "resume", why="flush then checkpoint when offsets moved enough"
    ),
    (Event.COMMIT, _EOS, _CKPT): Decision(
        _A.KEEP,
        False,
        False,
        "wipe",
        why="never a checkpoint while RUNNING under exactly-once; no flush either",
    ),
    # -- STANDBY_COMMIT
    (Event.STANDBY_COMMIT, _ALOS, _STORE): Decision(
        _A.WRITE, False, False, "resume", why="offsets go in the commit's WriteBatch"
    ),
    (Event.STANDBY_COMMIT, _EOS, _STORE): Decision(
        _A.WRITE, False, False, "resume", why="standbys apply committed data only"
    ),
    (Event.STANDBY_COMMIT, _ALOS, _CKPT): Decision(
        _A.WRITE_IF_MOVED, True, False, "resume", why="flush then checkpoint when offsets moved enough"
    ),
    (Event.STANDBY_COMMIT, _EOS, _CKPT): Decision(
        _A.WRITE_IF_MOVED,
        True,
        False,
        "resume",
        why="standbys apply committed data only, so a checkpoint is safe under both guarantees",
    ),
    # -- SUSPEND
    (Event.SUSPEND, _ALOS, _STORE): Decision(
        _A.WRITE, True, False, "resume", why="final commit's offsets, flushed"
    ),
    (Event.SUSPEND, _EOS, _STORE): Decision(
        _A.WRITE, True, False, "resume", why="final commit's offsets, flushed"
    ),
    (Event.SUSPEND, _ALOS, _CKPT): Decision(
        _A.WRITE, True, False, "resume", why="enforced checkpoint after flush"
    ),
    (Event.SUSPEND, _EOS, _CKPT): Decision(
        _A.WRITE,
        True,
        False,
        "resume",
        why="the transaction committed and the stores are flushed: the file is true until resume",
    ),
    # -- RESUME
    (Event.RESUME, _ALOS, _STORE): Decision(_A.KEEP, False, False, "resume", why="nothing to do"),
    (Event.RESUME, _EOS, _STORE): Decision(_A.KEEP, False, False, "resume", why="nothing to do"),
    (Event.RESUME, _ALOS, _CKPT): Decision(_A.KEEP, False, False, "resume", why="the file stays"),
    (Event.RESUME, _EOS, _CKPT): Decision(
        _A.DELETE, False, False, "wipe", why="KAFKA-10362: processing resumes, so the file must go"
    ),
    # -- CLOSE_CLEAN
    (Event.CLOSE_CLEAN, _ALOS, _STORE): Decision(_A.WRITE, True, False, "resume", why="flush, status CLOSED"),
    (Event.CLOSE_CLEAN, _EOS, _STORE): Decision(_A.WRITE, True, False, "resume", why="flush, status CLOSED"),
    (Event.CLOSE_CLEAN, _ALOS, _CKPT): Decision(
        _A.WRITE, True, False, "resume", why="enforced checkpoint after flush"
    ),
    (Event.CLOSE_CLEAN, _EOS, _CKPT): Decision(
        _A.WRITE,
        True,
        False,
        "resume",
        why="enforced checkpoint after flush, read and deleted at the next init",
    ),
    # -- CLOSE_DIRTY
    (Event.CLOSE_DIRTY, _ALOS, _STORE): Decision(
        _A.KEEP,
        False,
        False,
        "resume",
        why="store offsets match store data; uncommitted staged writes are dropped",
    ),
    (Event.CLOSE_DIRTY, _EOS, _STORE): Decision(
        _A.KEEP, False, False, "resume", why="staged writes never reached RocksDB: no wipe needed"
    ),
    (Event.CLOSE_DIRTY, _ALOS, _CKPT): Decision(
        _A.KEEP, False, False, "resume", why="duplicates are allowed; files kept"
    ),
    (Event.CLOSE_DIRTY, _EOS, _CKPT): Decision(
        _A.DELETE, False, True, "wipe", why="the store may hold data the changelog aborted: wipe the task"
    ),
}


@dataclass(frozen=True)
class Policy:
    """A guarantee and an offsets mode, with the checkpoint threshold: the table's view for one task."""

    guarantee: Guarantee = Guarantee.AT_LEAST_ONCE
    offsets: OffsetsMode = OffsetsMode.STORE
    checkpoint_delta: int = DEFAULT_CHECKPOINT_DELTA

    @classmethod
    def of(
        cls,
        guarantee: Guarantee | str = Guarantee.AT_LEAST_ONCE,
        offsets: OffsetsMode | str = "store",
        checkpoint_delta: int = DEFAULT_CHECKPOINT_DELTA,
    ) -> Policy:
        """Build a policy from enum members or their string names (``"exactly_once_v2"``, ``"checkpoint"``)."""
        if checkpoint_delta < 0:
            raise ValueError(f"checkpoint_delta must be >= 0, got {checkpoint_delta}")
        return cls(Guarantee(guarantee), OffsetsMode(offsets), checkpoint_delta)

    @property
    def eos(self) -> bool:
        """Whether the guarantee is exactly-once."""
        return self.guarantee is Guarantee.EXACTLY_ONCE_V2

    def decide(self, event: Event) -> Decision:
        """The table's decision for ``event`` under this policy."""
        return POLICY_TABLE[(event, self.guarantee, self.offsets)]

    def should_write(
        self,
        decision: Decision,
        recorded: Mapping[TopicPartition, int] | None,
        current: Mapping[TopicPartition, int],
    ) -> bool:
        """Whether ``decision`` writes offsets now, given those last recorded and the current ones.

        ``WRITE`` always writes; ``WRITE_IF_MOVED`` writes when the offsets moved
        by more than ``checkpoint_delta`` in total (Kafka's rule: a partition
        never recorded counts from 0; nothing recorded yet at all means the
        stores were never initialized, so nothing is written).
        """
        if decision.offsets is OffsetAction.WRITE:
            return True
        if decision.offsets is not OffsetAction.WRITE_IF_MOVED or recorded is None:
            return False
        moved = sum(off - recorded.get(tp, 0) for tp, off in current.items() if off >= 0)
        return moved > self.checkpoint_delta


def render_markdown() -> str:
    """``docs/policy.md``: the table, one section per offsets mode."""
    out = [
        "# Offsets policy",
        "",
        "Generated from `statestore.state.policy.POLICY_TABLE` by `python -m statestore.state.policy`; do not edit by hand.",
        "",
        "Columns: what happens to recorded offsets at the event; whether stores are flushed first;",
        "whether the task's local state is wiped; what recovery does if the process dies after the",
        "event. *corrupt if missing*: a logged persistent store with no offset in a non-empty task",
        "directory raises `TaskCorruptedError` (the task is wiped and restored).",
        f"`WRITE_IF_MOVED` writes when offsets moved by more than `checkpoint_delta` "
        f"(default {DEFAULT_CHECKPOINT_DELTA:,}) since last written.",
        "",
    ]
    for mode in OffsetsMode:
        out += [f'## offsets="{mode.value}"', ""]
        out += [
            "| event | guarantee | offsets | flush | wipe | crash after | why |",
            "|---|---|---|---|---|---|---|",
        ]
        for event in Event:
            for guarantee in Guarantee:
                d = POLICY_TABLE[(event, guarantee, mode)]
                offsets = d.offsets.value + (" (corrupt if missing)" if d.corrupt_if_missing else "")
                out.append(
                    f"| {event.value} | {guarantee.value} | {offsets} | {'yes' if d.flush else 'no'} | "
                    f"{'yes' if d.wipe else 'no'} | {d.crash_after} | {d.why} |"
                )
        out.append("")
    return "\n".join(out)


__all__ = [
    "DEFAULT_CHECKPOINT_DELTA",
    "POLICY_TABLE",
    "Decision",
    "Event",
    "Guarantee",
    "OffsetAction",
    "OffsetsMode",
    "Policy",
    "render_markdown",
]

if __name__ == "__main__":
    sys.stdout.write(render_markdown())
