"""Type stubs of the Rust extension ``statestore._native``: every class and function it exports.

Results crossing from Rust are frozen classes with named fields. What only
tests and benchmarks call lives in the submodule ``_testing`` (``_testing.pyi``).
``python -m mypy.stubtest statestore._native`` checks both against the built module.
"""

from collections.abc import Sequence
from os import PathLike
from typing import Final, Literal, Protocol, Self, final

# tests and benchmarks only: the submodule (_testing.pyi beside this file)
from statestore._native import _testing as _testing

_Path = str | PathLike[str]
#: ``(offset, key, value, timestamp, headers)`` of one record, as the log hands it to Python.
_RecordRow = tuple[int, bytes | None, bytes | None, int, tuple[tuple[str, bytes | None], ...]]

class _TopicPartition(Protocol):
    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...

# fileio

def atomic_write(path: _Path, data: bytes) -> None: ...
def fsync_dir(path: _Path) -> None: ...
def replace_dir(
    staged: _Path, target: _Path, aside: _Path
) -> Literal["renamed", "exchanged", "moved_aside"]: ...
def link_copy_dir(src: _Path, dst: _Path) -> None: ...
def unsynced_marker(path: _Path) -> Literal["this_boot", "earlier_boot", "sync_failed"] | None: ...
def recover_unsynced(path: _Path) -> Literal["clean", "synced", "wiped"]: ...

# restore engine (statestore.restore)

@final
class RestoreOutcome:
    """What one restore did."""

    @property
    def mode(self) -> str: ...
    @property
    def start_offset(self) -> int: ...
    @property
    def end_offset(self) -> int: ...
    @property
    def records_applied(self) -> int: ...
    @property
    def skipped_aborted(self) -> int: ...
    @property
    def skipped_control(self) -> int: ...
    @property
    def skipped_null_key(self) -> int: ...
    @property
    def bytes_read(self) -> int: ...
    @property
    def seconds(self) -> float: ...
    @property
    def merge_seconds(self) -> float: ...
    @property
    def offset(self) -> int | None: ...
    @property
    def log_bounds(self) -> tuple[int, int, int] | None: ...
    @property
    def topic_id(self) -> str | None: ...

class _RestoreSpec(Protocol):
    """What ``restore_many`` reads from each spec (``statestore.restore.RestoreSpec``)."""

    @property
    def store_path(self) -> _Path: ...
    @property
    def changelog(self) -> object: ...
    @property
    def tp(self) -> _TopicPartition: ...
    @property
    def end_offset(self) -> int | None: ...
    @property
    def mode(self) -> str: ...
    @property
    def memory_budget_bytes(self) -> int: ...
    @property
    def listener(self) -> object | None: ...
    @property
    def progress_interval(self) -> float: ...
    @property
    def format(self) -> str: ...
    @property
    def retention_ms(self) -> int | None: ...
    @property
    def segment_interval_ms(self) -> int | None: ...
    @property
    def topic_id(self) -> str | None: ...

#: ``restore_store``: ``format`` is one of :data:`STORE_FORMATS`; ``retention_ms`` a window or session
#: store's retention, or a versioned store's history retention (required by those formats);
#: ``segment_interval_ms`` their segment interval (default: the DSL's, or
#: ``Stores.persistentVersionedKeyValueStore``'s). A versioned store is always replayed.
def restore_store(
    store_path: _Path,
    log: object,
    tp: _TopicPartition,
    end_offset: int | None = None,
    mode: str = "auto",
    memory_budget_bytes: int = ...,
    listener: object | None = None,
    progress_interval: float = 0.1,
    write_buffer_bytes: int | None = None,
    chunk_bytes: int = ...,
    read_ahead: bool = True,
    format: str = "plain",
    retention_ms: int | None = None,
    segment_interval_ms: int | None = None,
    bulk_threads: int = 1,
    defer_compactions_from: int | None = None,
    topic_id: str | None = None,
) -> RestoreOutcome: ...
def restore_many(
    specs: Sequence[_RestoreSpec], threads: int, open_stores: OpenStores | None = None
) -> list[RestoreOutcome | BaseException]: ...

@final
class OpenStores:
    """Stores kept open between restores of them (``restore_many(..., open_stores=)``).

    Their memtables share ``memory_budget_bytes``; a replay leaves its store
    unflushed, so whoever records a store's offsets outside it flushes it first.
    A store closed because a flush failed unheard (one flushed to make room for
    another) makes its next ``flush`` or ``close`` raise that error.
    """

    def __new__(cls, memory_budget_bytes: int = ...) -> Self: ...
    def flush(self, path: _Path) -> bool: ...
    def close(self, path: _Path) -> bool: ...
    def close_all(self) -> None: ...
    def paths(self) -> list[_Path]: ...
    def memtable_bytes(self) -> int: ...
    def __len__(self) -> int: ...

#: The restore modes (``rust/src/restore/engine.rs``, ``Mode::ALL``).
MODES: Final[tuple[str, ...]]
DEFAULT_MEMORY_BUDGET: Final[int]

# segment log (statestore.changelog.segment_log)

@final
class TransactionInfo:
    """The coordinator's record of one transactional id."""

    @property
    def transactional_id(self) -> str: ...
    @property
    def producer_id(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def started_ms(self) -> int: ...
    @property
    def partitions(self) -> list[tuple[str, int]]: ...

@final
class ProducerCore:
    def send(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
        timestamp: int | None = None,
    ) -> int: ...
    def send_many(
        self, topic: str, partition: int, records: Sequence[tuple[bytes | None, bytes | None]]
    ) -> int: ...
    def flush(self) -> None: ...
    def begin(self) -> None: ...
    def commit(self) -> None: ...
    def abort(self) -> None: ...
    def identity(self) -> tuple[int, int]: ...
    def in_transaction(self) -> bool: ...

@final
class SegmentLogCore:
    def __new__(
        cls, log_dir: _Path, segment_bytes: int, sync: bool = True, compression: str = "none"
    ) -> Self: ...
    def producer(self, transactional_id: str | None = None) -> ProducerCore: ...
    def recover(self, topic: str, partition: int) -> int: ...
    def abort_expired_transactions(self, timeout_ms: int) -> list[str]: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...
    def transactions(self) -> list[TransactionInfo]: ...

@final
class LogReaderCore:
    def __new__(
        cls, log_dir: _Path, topic: str, partition: int, start_offset: int, isolation: str = "read_committed"
    ) -> Self: ...
    @property
    def position(self) -> int: ...
    @property
    def skipped(self) -> tuple[int, int]: ...
    def poll(self, max_records: int, max_bytes: int, end: int | None = None) -> list[_RecordRow]: ...

@final
class PartitionBounds:
    """Start, end and last stable offset of a changelog partition."""

    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...
    @property
    def last_stable(self) -> int: ...

@final
class CommittedStats:
    """What a read_committed pass over a range of a partition found."""

    @property
    def records(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def position(self) -> int: ...
    @property
    def bytes_read(self) -> int: ...

@final
class LogBatch:
    """One batch of a partition as kafka-dump-log shows it."""

    @property
    def segment(self) -> str: ...
    @property
    def position(self) -> int: ...
    @property
    def base_offset(self) -> int: ...
    @property
    def last_offset(self) -> int: ...
    @property
    def count(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def producer_id(self) -> int: ...
    @property
    def producer_epoch(self) -> int: ...
    @property
    def base_sequence(self) -> int: ...
    @property
    def transactional(self) -> bool: ...
    @property
    def control(self) -> str | None: ...
    @property
    def outcome(self) -> str | None: ...
    @property
    def compression(self) -> str: ...
    @property
    def crc(self) -> int: ...
    @property
    def crc_valid(self) -> bool: ...
    @property
    def max_timestamp(self) -> int: ...
    @property
    def records(self) -> list[_RecordRow] | None: ...

def log_offsets(log_dir: _Path, topic: str, partition: int) -> PartitionBounds: ...
def log_committed_stats(
    log_dir: _Path, topic: str, partition: int, start_offset: int, end: int
) -> CommittedStats: ...
def log_dump(
    log_dir: _Path, topic: str, partition: int, records: bool = False, isolation: str = "read_committed"
) -> list[LogBatch]: ...

# Kafka (statestore.kafka): the native fetcher

@final
class KafkaClient:
    """The native Kafka fetcher of a cluster (``rust/src/py/kafka.rs``)."""

    def __new__(
        cls, config: dict[str, str], request_timeout: float = 30.0, stall_timeout: float = 60.0
    ) -> Self: ...
    @staticmethod
    def unsupported(config: dict[str, str]) -> str | None: ...
    def tls_refused(self) -> str | None: ...
    @property
    def bootstrap_servers(self) -> str: ...
    def offsets(self, topic: str, partition: int) -> PartitionBounds: ...
    def reader(self, topic: str, partition: int, start: int) -> KafkaReaderCore: ...

@final
class KafkaReaderCore:
    @property
    def position(self) -> int: ...
    @property
    def skipped(self) -> tuple[int, int]: ...
    def poll(self, end: int, max_bytes: int) -> list[_RecordRow]: ...

# stores (statestore.ops.verify, statestore.ops.inspection, tools)

@final
class StoreInfo:
    """What a tool shows about a store, read without taking its lock."""

    @property
    def offsets(self) -> dict[str, int]: ...
    @property
    def status(self) -> int | None: ...
    @property
    def estimated_keys(self) -> int: ...

@final
class StoreComparison:
    """The data of two stores compared, in key order."""

    @property
    def expected_digest(self) -> str: ...
    @property
    def actual_digest(self) -> str: ...
    @property
    def expected_entries(self) -> int: ...
    @property
    def actual_entries(self) -> int: ...
    @property
    def first_difference(self) -> tuple[bytes, bytes | None, bytes | None] | None: ...

@final
class StoreDump:
    """A whole store read into memory."""

    @property
    def entries(self) -> list[tuple[bytes, bytes]]: ...
    @property
    def offsets(self) -> dict[str, int]: ...
    @property
    def status(self) -> int | None: ...

@final
class SegmentInfo:
    """One segment of a window or session store, read without taking its lock."""

    @property
    def start(self) -> int: ...
    @property
    def path(self) -> _Path: ...
    @property
    def offsets(self) -> dict[str, int]: ...
    @property
    def status(self) -> int | None: ...
    @property
    def estimated_keys(self) -> int: ...
    @property
    def offsets_family(self) -> bool: ...

@final
class SegmentedStoreInfo:
    """A window or session store (a directory of segments), read without taking a lock."""

    @property
    def segment_format(self) -> str | None: ...
    @property
    def formats(self) -> list[str]: ...
    @property
    def offsets(self) -> dict[str, int]: ...
    @property
    def segments(self) -> list[SegmentInfo]: ...

def store_info(path: _Path, check_blocks: bool = False) -> StoreInfo: ...
def segmented_info(path: _Path, check_blocks: bool = False) -> SegmentedStoreInfo: ...
def segments_check(path: _Path, retention_ms: int, segment_interval_ms: int | None = None) -> list[int]: ...
def store_compare(expected: _Path, actual: _Path) -> StoreComparison: ...
def store_create(path: _Path, format: str = "plain") -> None: ...
def store_dump(path: _Path) -> StoreDump: ...
def store_format(path: _Path) -> str | None: ...
def store_record_if_empty(path: _Path, format: str, tp: str, offset: int) -> bool: ...

# the store layout: the one source of these facts (``rust/src/offsets.rs``, ``rust/src/store.rs``)

#: The column family holding offsets and the status marker.
OFFSETS_CF: Final[str]
#: The column family of a timestamped store's data.
TIMESTAMPED_CF: Final[str]
#: The key of the status marker in :data:`OFFSETS_CF`.
STATUS_KEY: Final[bytes]
#: The key of Kafka Streams' position entry in :data:`OFFSETS_CF` (neither read nor written).
POSITION_KEY: Final[bytes]
#: Status value: the store is open (a crash leaves it behind).
STATUS_OPEN: Final[int]
#: Status value: the store was closed cleanly.
STATUS_CLOSED: Final[int]
#: Kafka Streams' "no offset yet" (its ``OFFSET_UNKNOWN``), recorded for a store whose task committed no changelog record.
OFFSET_UNKNOWN: Final[int]
#: The store formats (``StoreFormat::ALL``), in the order they are listed to users.
STORE_FORMATS: Final[tuple[str, ...]]
#: The formats of segmented stores (Kafka Streams' window and session stores: a RocksDB per time segment).
SEGMENTED_STORE_FORMATS: Final[tuple[str, ...]]
#: The formats that need a retention: the segmented ones and the versioned one (its history retention).
RETAINED_STORE_FORMATS: Final[tuple[str, ...]]
#: The format of Kafka Streams' versioned key-value store (one RocksDB, versions in key-prefixed segments).
VERSIONED_STORE_FORMATS: Final[tuple[str, ...]]
#: The header-aware formats (Kafka Streams 4.3+, ``dsl.store.format=headers``): values keep the record's headers.
HEADERS_STORE_FORMATS: Final[tuple[str, ...]]
#: How RocksDB's status text of damaged files begins.
CORRUPTION_PREFIX: Final[str]

def encode_offset(value: int) -> bytes: ...
def decode_offset(data: bytes) -> int | None: ...
def dsl_segment_interval(retention_ms: int) -> int: ...
def versioned_segment_interval(history_retention_ms: int) -> int: ...

#: What the module exports (PyO3 lists every name the bindings register; stubtest compares the two).
__all__ = [
    "CORRUPTION_PREFIX",
    "DEFAULT_MEMORY_BUDGET",
    "HEADERS_STORE_FORMATS",
    "MODES",
    "OFFSETS_CF",
    "OFFSET_UNKNOWN",
    "POSITION_KEY",
    "RETAINED_STORE_FORMATS",
    "SEGMENTED_STORE_FORMATS",
    "STATUS_CLOSED",
    "STATUS_KEY",
    "STATUS_OPEN",
    "STORE_FORMATS",
    "TIMESTAMPED_CF",
    "VERSIONED_STORE_FORMATS",
    "CommittedStats",
    "KafkaClient",
    "KafkaReaderCore",
    "LogBatch",
    "LogReaderCore",
    "OpenStores",
    "PartitionBounds",
    "ProducerCore",
    "RestoreOutcome",
    "SegmentInfo",
    "SegmentLogCore",
    "SegmentedStoreInfo",
    "StoreComparison",
    "StoreDump",
    "StoreInfo",
    "TransactionInfo",
    "_testing",
    "atomic_write",
    "decode_offset",
    "dsl_segment_interval",
    "encode_offset",
    "fsync_dir",
    "link_copy_dir",
    "log_committed_stats",
    "log_dump",
    "log_offsets",
    "recover_unsynced",
    "replace_dir",
    "restore_many",
    "restore_store",
    "segmented_info",
    "segments_check",
    "store_compare",
    "store_create",
    "store_dump",
    "store_format",
    "store_info",
    "store_record_if_empty",
    "unsynced_marker",
    "versioned_segment_interval",
]
