"""Kafka Streams' window and session stores as tools find and read them on disk.

A task directory holds its key-value stores under ``rocksdb/<store>`` and its
window and session stores beside it, each a directory of segments
``<store>/<store>.<segmentStart>`` (one RocksDB per time segment; the
segment layout itself is ``rust/src/segments.rs``). :func:`task_store_dirs`
lists both kinds; :func:`read_segmented` reads a segmented store without
writing anything (``_native.segmented_info``): its segments with the offset
and status each holds, the formats its bytes fit, and the layout its
offsets are in.

What the bytes tell: timestamped segments (``keyValueWithTimestamp``) are a
``timestamped-window`` store; plain segments are a ``window`` or a
``session`` store, which neither the bytes nor the changelog's configs tell
apart (``--store-format NAME=window|session``). Neither tells the retention
(``--retention NAME=MS``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from statestore import _native
from statestore.errors import StoreError
from statestore.state.directory import STORES_DIR_NAME
from statestore.state.layout import CHECKPOINT, KIP_1035, Layout
from statestore.state.store import STATUS_CLOSED, STATUS_NAMES, STATUS_OPEN


def task_store_dirs(task_dir: Path) -> list[tuple[str, Path, bool]]:
    """``(store, directory, segmented)`` of every store in a task directory, sorted by name: the
    key-value stores ``rocksdb/<store>`` and the window and session stores ``<store>`` (any other
    directory of the task directory; statestore's own ``.staging`` and other dot directories
    excepted)."""
    found: list[tuple[str, Path, bool]] = []
    kv = task_dir / STORES_DIR_NAME
    if kv.is_dir():
        found += [(d.name, d, False) for d in kv.iterdir() if d.is_dir()]
    found += [
        (d.name, d, True)
        for d in task_dir.iterdir()
        if d.is_dir() and d.name != STORES_DIR_NAME and not d.name.startswith(".")
    ]
    return sorted(found, key=lambda f: (f[0], f[2]))


@dataclass(frozen=True)
class SegmentedView:
    """A window or session store read from disk (read-only)."""

    path: Path
    info: _native.SegmentedStoreInfo

    @property
    def format(self) -> str | None:
        """The store's format where its bytes tell it (``timestamped-window``); None when they fit
        more than one (plain segments: ``window`` or ``session``), or there is no segment."""
        return self.info.formats[0] if len(self.info.formats) == 1 else None

    @property
    def layout(self) -> Layout | None:
        """Where its offsets live: KIP-1035 when a segment has an ``offsets`` family (Kafka Streams
        4.3+), else the task's ``.checkpoint`` (3.6 - 4.2); None without segments."""
        if not self.info.segments:
            return None
        return KIP_1035 if any(s.offsets_family for s in self.info.segments) else CHECKPOINT

    @property
    def status(self) -> str:
        """``open`` when a segment is open (Kafka Streams holds the store, or was killed), ``closed``
        when every segment recording a status is closed, ``none`` when none records one."""
        statuses = {s.status for s in self.info.segments if s.status is not None}
        if STATUS_OPEN in statuses:
            return STATUS_NAMES[STATUS_OPEN]
        if statuses == {STATUS_CLOSED}:
            return STATUS_NAMES[STATUS_CLOSED]
        if statuses:
            return ", ".join(sorted(f"unknown ({st})" for st in statuses if st not in STATUS_NAMES))
        return "none"

    @property
    def estimated_keys(self) -> int:
        return sum(s.estimated_keys for s in self.info.segments)

    def format_for(self, given: str | None, name: str) -> str:
        """The store's format: ``given`` (``--store-format``) if its segments fit it, else the one
        their bytes tell; ``ValueError`` saying what is needed when neither settles it."""
        fits = self.info.formats
        if given is not None:
            if given not in fits:
                raise ValueError(
                    f"--store-format {name}={given} does not fit its segments ({self.info.segment_format}: "
                    f"a {' or '.join(fits)} store)"
                )
            return given
        if len(fits) == 1:
            return fits[0]
        raise ValueError(
            f"a {' or '.join(fits)} store: its bytes do not tell which; give --store-format "
            f"{name}={'|'.join(fits)}"
        )


def read_segmented(path: Path, check_blocks: bool = False) -> SegmentedView:
    """The window or session store at ``path``, read without writing; ``StoreError`` naming a
    segment of a type statestore does not know, or segments of different formats."""
    return SegmentedView(path, _native.segmented_info(path, check_blocks))


def check_segmented_format(path: Path, fmt: str, *, who: str | None = None) -> None:
    """Refuse (``StoreError``) to touch the window or session store at ``path`` if a segment is of
    a type statestore does not know, or its segments do not fit ``fmt``; a missing store passes.

    Nothing is opened for writing: a restore would otherwise delete what it
    cannot read and restore it from nothing, or add column families Kafka
    Streams then refuses.
    """
    if not path.exists():
        return
    try:
        read_segmented(path).format_for(fmt, path.name)
    except ValueError as e:
        raise StoreError(f"{who or 'store'}: {path}: {e}; statestore leaves it untouched", path=path) from e
    except StoreError as e:
        raise StoreError(f"{who or 'store'}: {e}; statestore leaves it untouched", path=path) from e


__all__ = ["SegmentedView", "check_segmented_format", "read_segmented", "task_store_dirs"]
