"""Which on-disk layout each Kafka Streams version reads, and the conversion to the older one.

Kafka Streams 4.3 (KIP-1035) keeps each store's committed offset in the
store itself, in an ``offsets`` column family; older versions keep the
offsets of every store of a task in the task's ``.checkpoint`` file and
cannot open a store that has column families they do not know. Kafka
Streams 3.6 - 3.9 run rocksdbjni 7.9, which reads SST files up to table
``format_version`` 5. So:

=====================  ==============================================  ==================
Kafka Streams          offsets                                         ``format_version``
=====================  ==============================================  ==================
3.6 - 4.2              the task's ``.checkpoint`` (no ``offsets`` CF)   5
4.3, 4.4               the store's ``offsets`` column family           6
=====================  ==============================================  ==================

Kafka Streams 4.3+ migrates a ``.checkpoint`` into its stores on start, so
the older layout is read by every version. The restore engine writes the
4.3+ layout; :func:`to_checkpoint_layout` turns a restored store into the
older one (drops the ``offsets`` family, rewrites every table file at
``format_version`` 5) and gives the offset its task's ``.checkpoint`` must
record. A store restored from a changelog partition without a committed
record gets Kafka Streams' ``OFFSET_UNKNOWN`` in either layout
(:func:`record_no_offset_yet`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rocksdict import (
    BlockBasedOptions,
    BottommostLevelCompaction,
    CompactOptions,
    Options,
    Rdict,
)

from statestore import _native
from statestore.errors import StoreError
from statestore.ids import OFFSET_UNKNOWN, TopicPartition, committed_offset
from statestore.state.checkpoint import OffsetCheckpoint

#: Column family of the KIP-1035 layout's offsets (and status marker).
_OFFSETS_CF: str = _native.OFFSETS_CF
_TIMESTAMPED_CF: str = _native.TIMESTAMPED_CF


@dataclass(frozen=True)
class Layout:
    """How a Kafka Streams version expects a task's stores on disk."""

    #: ``"kip-1035"`` (offsets in each store) or ``"checkpoint"`` (offsets in the task's ``.checkpoint``).
    name: str
    #: Whether each store keeps its offset and status in an ``offsets`` column family.
    offsets_in_store: bool
    #: The highest table ``format_version`` its RocksDB reads, the one statestore writes.
    table_format_version: int


KIP_1035 = Layout("kip-1035", offsets_in_store=True, table_format_version=6)
CHECKPOINT = Layout("checkpoint", offsets_in_store=False, table_format_version=5)

#: Every layout by its name (what a Spark task receives).
LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in (KIP_1035, CHECKPOINT)}

#: ``(oldest, newest)`` Kafka Streams version (major, minor) -> the layout it reads: the one table.
VERSIONS: tuple[tuple[tuple[int, int], tuple[int, int], Layout], ...] = (
    ((3, 6), (4, 2), CHECKPOINT),
    ((4, 3), (4, 4), KIP_1035),
)
#: The versions ``--kafka-streams-version`` accepts, oldest first.
VERSION_NAMES: tuple[str, ...] = tuple(
    f"{major}.{minor}"
    for lo, hi, _ in VERSIONS
    for major in range(lo[0], hi[0] + 1)
    for minor in range(10)
    if lo <= (major, minor) <= hi
)
_VERSION_RE = re.compile(r"(0|[1-9][0-9]?)\.(0|[1-9][0-9]?)(?:\.(0|[1-9][0-9]{0,2}))?")


def layout_for(version: str) -> Layout:
    """The layout Kafka Streams ``version`` (``"3.9"``, ``"4.2.0"``...) reads; ``ValueError`` for a
    version outside :data:`VERSIONS`, naming the versions there are."""
    m = _VERSION_RE.fullmatch(version.strip())
    if m is not None:
        key = (int(m.group(1)), int(m.group(2)))
        for lo, hi, layout in VERSIONS:
            if lo <= key <= hi:
                return layout
    raise ValueError(
        f"Kafka Streams version {version!r} is not one statestore writes for: use one of "
        f"{VERSION_NAMES[0]} - {VERSION_NAMES[-1]}"
    )


def store_layout(path: Path) -> Layout | None:
    """The layout of the store at ``path`` as found on disk; None when there is no RocksDB there."""
    if not (path / "CURRENT").is_file():
        return None
    try:
        families = Rdict.list_cf(str(path))
    except Exception as e:  # rocksdict raises plain Exception
        raise StoreError(f"store {path}: cannot list its column families: {e}", path=path) from e
    return KIP_1035 if _OFFSETS_CF in families else CHECKPOINT


def table_format_versions(path: Path) -> set[int]:
    """The table ``format_version`` of every SST file of the store at ``path`` (from each file's footer:
    a 4-byte little-endian version before the 8-byte magic number)."""
    versions = set()
    for sst in path.glob("*.sst"):
        with sst.open("rb") as f:
            f.seek(-12, 2)
            versions.add(int.from_bytes(f.read(4), "little"))
    return versions


def record_in_checkpoint(checkpoint: Path, offsets: Mapping[TopicPartition, int | None]) -> None:
    """Record ``offsets`` in the ``.checkpoint`` file at ``checkpoint``, keeping its other entries;
    a None offset removes the entry (nothing vouches for that store any more). The caller holds the
    task lock."""
    file = OffsetCheckpoint(checkpoint)
    entries = file.read()
    for tp, offset in offsets.items():
        if offset is None:
            entries.pop(tp, None)
        else:
            entries[tp] = offset
    file.write(entries)


def record_no_offset_yet(path: Path, checkpoint: Path, tp: TopicPartition, fmt: str, layout: Layout) -> None:
    """Record ``OFFSET_UNKNOWN`` for the store at ``path``, restored from a changelog partition with
    no committed record (it recorded no offset), as Kafka Streams records it for a store whose
    task committed none: under exactly_once_v2 Kafka Streams takes a store without any offset in a
    non-empty task directory for corruption and wipes the whole task, the other stores' restored
    state with it. In the store's ``offsets`` family (KIP-1035) or in the task's ``.checkpoint``.
    A store that holds data is left alone. The caller holds the task lock."""
    if not layout.offsets_in_store:
        record_in_checkpoint(checkpoint, {tp: OFFSET_UNKNOWN})
        return
    _native.store_record_if_empty(path, fmt, str(tp), OFFSET_UNKNOWN)


def to_checkpoint_layout(path: Path, tp: TopicPartition) -> int | None:
    """Turn the closed store at ``path``, restored in the KIP-1035 layout, into the older one.

    Returns the offset the store recorded for ``tp`` (None: none), which the
    task's ``.checkpoint`` must now record; drops the ``offsets`` family and
    rewrites every table file at ``format_version`` 5 (one full compaction,
    bottommost level included). A store already in the older layout is left
    as it is (None: its offset is the ``.checkpoint``'s).

    A window or session store (a directory of segments, no RocksDB of its
    own) has every segment converted; its offset is the one Kafka Streams
    4.3+ would read, the newest segment's. Kafka Streams 3.6 - 4.2 checkpoint
    a segmented store's changelog offset in the task's ``.checkpoint`` like
    any persistent store's (``ProcessorStateManager.checkpoint``) and open
    each segment with its store type's column families alone.
    """
    if not (path / "CURRENT").is_file() and path.is_dir():
        info = _native.segmented_info(path)
        for segment in info.segments:
            to_checkpoint_layout(Path(segment.path), tp)
        return committed_offset(info.offsets.get(str(tp)))
    if store_layout(path) is not KIP_1035:
        return None
    families = Rdict.list_cf(str(path))
    table = BlockBasedOptions()
    table.set_format_version(CHECKPOINT.table_format_version)
    opts = Options(raw_mode=True)
    opts.set_block_based_table_factory(table)
    column_families = {cf: opts for cf in families if cf != "default"}
    try:
        db = Rdict(str(path), opts, column_families=column_families)
    except Exception as e:  # rocksdict raises plain Exception
        raise StoreError(
            f"store {path}: cannot open it to convert to the .checkpoint layout: {e}", path=path
        ) from e
    try:
        raw = db.get_column_family(_OFFSETS_CF).get(str(tp).encode())
        offset = None if raw is None else _native.decode_offset(raw)
        db.drop_column_family(_OFFSETS_CF)
        compact = CompactOptions()
        compact.set_bottommost_level_compaction(BottommostLevelCompaction.force())
        db.compact_range(None, None, compact)
        for cf in families:
            if cf not in ("default", _OFFSETS_CF):
                db.get_column_family(cf).compact_range(None, None, compact)
        db.flush(True)
    except Exception as e:  # rocksdict raises plain Exception
        raise StoreError(f"store {path}: converting to the .checkpoint layout failed: {e}", path=path) from e
    finally:
        db.close()
    return committed_offset(offset)


__all__ = [
    "CHECKPOINT",
    "KIP_1035",
    "LAYOUTS",
    "VERSIONS",
    "VERSION_NAMES",
    "Layout",
    "layout_for",
    "record_in_checkpoint",
    "record_no_offset_yet",
    "store_layout",
    "table_format_versions",
    "to_checkpoint_layout",
]
