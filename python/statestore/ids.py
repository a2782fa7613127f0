"""Names of things: topic partitions, tasks, and the offset sentinel."""

from __future__ import annotations

import re
from typing import NamedTuple

from statestore import _native

#: Offset recorded for a logged store whose position is not known (Kafka's -4).
OFFSET_UNKNOWN: int = _native.OFFSET_UNKNOWN

#: The recorded offsets that are not positions in a changelog, and what each means. Kafka Streams
#: writes exactly one to disk: ``OFFSET_UNKNOWN`` (its ``OffsetCheckpoint``, and under KIP-1035 the
#: store's ``offsets`` column family), for a logged store whose task has not committed a changelog
#: record yet; it reads it back as "no offset", restores such a store from the changelog's start and
#: never takes it for corruption. Its other negative offsets (-1, ``Task.LATEST_OFFSET`` = -2,
#: ``UNKNOWN_OFFSET_SUM`` = -3) live only in memory and in rebalance subscriptions: its checkpoint
#: reader skips them, so a recorded -1, -2 or -3 is not an offset at all.
SENTINEL_OFFSETS: dict[int, str] = {OFFSET_UNKNOWN: "no offset yet"}

# fullmatch, not match with "$": "$" also matches before a final newline, so
# a directory named "0_1\n" would pass for task 0_1.
_TASK_RE = re.compile(r"(0|[1-9][0-9]{0,9})_(0|[1-9][0-9]{0,9})")
# Kafka's own form of a partition number: ASCII digits, no sign or leading
# zero, so that str() of the parsed value gives back the text exactly.
_PARTITION_RE = re.compile(r"0|[1-9][0-9]{0,9}")
_INT32_MAX = 2**31 - 1


class TopicPartition(NamedTuple):
    """One partition of one topic; ``str()`` gives Kafka's ``"<topic>-<partition>"`` form."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"

    @classmethod
    def parse(cls, text: str) -> TopicPartition:
        """Parse ``"<topic>-<partition>"`` (the topic may itself contain dashes)."""
        topic, sep, part = text.rpartition("-")
        if not sep or not topic or not _PARTITION_RE.fullmatch(part) or int(part) > _INT32_MAX:
            raise ValueError(f"not a topic partition (expected '<topic>-<partition>'): {text[:300]!r}")
        return cls(topic, int(part))


class TaskId(NamedTuple):
    """A unit of parallelism: ``(subtopology, partition)``; its directory is ``"<sub>_<part>"``."""

    subtopology: int
    partition: int

    def __str__(self) -> str:
        return f"{self.subtopology}_{self.partition}"

    @classmethod
    def parse(cls, text: str) -> TaskId:
        """Parse a task directory name such as ``"0_3"``; anything else raises ``ValueError``."""
        m = _TASK_RE.fullmatch(text)
        if m is None or int(m.group(1)) > _INT32_MAX or int(m.group(2)) > _INT32_MAX:
            raise ValueError(
                f"not a task id (expected '<subtopology>_<partition>', e.g. '0_3'): {text[:300]!r}"
            )
        return cls(int(m.group(1)), int(m.group(2)))


#: What calls that take a topic partition accept: the tuple itself, a plain
#: ``(topic, partition)`` pair, or Kafka's ``"<topic>-<partition>"`` text.
PartitionLike = TopicPartition | tuple[str, int] | str


def coerce_tp(tp: PartitionLike) -> TopicPartition:
    """The :class:`TopicPartition` that ``tp`` names (see :data:`PartitionLike`)."""
    if isinstance(tp, TopicPartition):
        return tp
    if isinstance(tp, str):
        return TopicPartition.parse(tp)
    topic, partition = tp
    return TopicPartition(topic, partition)


def committed_offset(recorded: int | None) -> int | None:
    """The offset of the last applied record that a ``recorded`` value stands for; None when it
    stands for none (nothing recorded, or a sentinel of :data:`SENTINEL_OFFSETS`)."""
    if recorded is None or recorded in SENTINEL_OFFSETS:
        return None
    return recorded


def changelog_topic(application_id: str, store: str) -> str:
    """The changelog topic of ``store``: ``<application_id>-<store>-changelog``."""
    return f"{application_id}-{store}-changelog"


__all__ = [
    "OFFSET_UNKNOWN",
    "SENTINEL_OFFSETS",
    "PartitionLike",
    "TaskId",
    "TopicPartition",
    "changelog_topic",
    "coerce_tp",
    "committed_offset",
]
