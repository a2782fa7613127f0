"""Which (store, partition) pairs a restore of an application covers: asked of the changelog.

The changelog says which partitions exist (``partitions()``, which both
:class:`~statestore.changelog.segment_log.SegmentLog` and
:class:`~statestore.changelog.kafka.KafkaChangelog` answer); planning never re-derives a
changelog's layout. A path stands for the segment log under it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from statestore.changelog.segment_log import SegmentLog
from statestore.errors import StateStoreError
from statestore.ids import TopicPartition, changelog_topic
from statestore.restore.work import PartitionWork


class ListsPartitions(Protocol):
    """A changelog that can list its partitions."""

    def partitions(self) -> list[TopicPartition]:
        """Every partition the changelog holds, sorted."""
        ...


#: A changelog to plan from, or the directory of a segment log.
PlanSource = ListsPartitions | str | os.PathLike[str]


def _changelog(source: PlanSource) -> ListsPartitions:
    return SegmentLog(Path(source)) if isinstance(source, (str, os.PathLike)) else source


def _where(source: PlanSource) -> str:
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    return str(getattr(source, "log_dir", None) or getattr(source, "bootstrap_servers", None) or source)


def parse_partitions(text: str) -> list[int]:
    """Parse ``"0-7"``, ``"3"`` or ``"0,2,5-7"`` into sorted distinct partition numbers."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if m is None:
            raise ValueError(f"not a partition list (expected e.g. '0-7' or '0,2,5-7'): {text!r}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise ValueError(f"partition range {part!r} is empty (end before start)")
        out.update(range(lo, hi + 1))
    return sorted(out)


def changelog_stores(source: PlanSource, application_id: str) -> list[str]:
    """Names of the stores of ``application_id`` with a changelog partition in ``source``, sorted."""
    prefix, suffix = application_id + "-", "-changelog"
    return sorted(
        {
            tp.topic[len(prefix) : -len(suffix)]
            for tp in _changelog(source).partitions()
            if tp.topic.startswith(prefix)
            and tp.topic.endswith(suffix)
            and len(tp.topic) > len(prefix) + len(suffix)
        }
    )


def plan(
    source: PlanSource,
    application_id: str,
    stores: Sequence[str] | Mapping[str, int],
    partitions: Iterable[int] | None = None,
) -> list[PartitionWork]:
    """The (store, partition) pairs to restore, store by store, partitions ascending.

    ``stores`` lists store names (subtopology 0) or maps each name to its
    subtopology. With ``partitions=None`` each store's partitions are those
    its changelog has in ``source`` (a changelog, or a segment log directory
    the caller can read); a store without any raises ``StateStoreError``.
    """
    subs: dict[str, int] = dict(stores) if isinstance(stores, Mapping) else dict.fromkeys(stores, 0)
    if not subs:
        raise ValueError("no stores given: name at least one store to restore")
    for name, sub in subs.items():
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"store name {name!r} cannot name a directory")
        if sub < 0:
            raise ValueError(f"store {name!r}: subtopology must be >= 0, got {sub}")
    wanted = None if partitions is None else sorted(set(partitions))
    if wanted is not None and any(p < 0 for p in wanted):
        raise ValueError(f"partitions must be >= 0, got {wanted}")
    listed = None if wanted is not None else _changelog(source).partitions()
    work: list[PartitionWork] = []
    for name, sub in subs.items():
        topic = changelog_topic(application_id, name)
        parts = wanted if listed is None else sorted(tp.partition for tp in listed if tp.topic == topic)
        if not parts:
            where = _where(source)
            raise StateStoreError(
                f"store {name}: no partition of changelog {topic} under {where}; check the changelog "
                "(--log-dir or --kafka) and --app-id, or name the partitions explicitly",
                path=Path(source) if isinstance(source, (str, os.PathLike)) else None,
            )
        work.extend(PartitionWork.of(application_id, name, p, sub) for p in parts)
    return work


__all__ = ["ListsPartitions", "PlanSource", "changelog_stores", "parse_partitions", "plan"]
