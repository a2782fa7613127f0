"""One key-value store of one task: a RocksDB (bytes -> bytes) with its offsets inside.

On disk a store is a plain RocksDB with a bytewise comparator and two column
families, the same shape the Rust data plane writes (``rust/src/store.rs``):

* ``default`` -- the data;
* ``offsets`` -- ``"<topic>-<partition>"`` -> 8-byte big-endian signed offset of
  the last applied changelog record, and ``status`` -> 8-byte ``1`` (open) or
  ``0`` (closed cleanly).

Writes made while processing are *staged* in memory (reads see them) and reach
RocksDB only in :meth:`Store.commit`, as one WriteBatch together with the
changelog offsets they correspond to. So nothing uncommitted ever reaches
RocksDB, and data and offsets can never disagree on disk. Commits go through
the write-ahead log, which keeps each batch atomic across a crash of the
process; :meth:`Store.flush` flushes data before offsets, so even without the
log an offset on disk never runs ahead of its data.

A store in the ``"timestamped"`` format (Kafka Streams' timestamped key-value
store, the DSL default) keeps its data in the column family
``keyValueWithTimestamp`` instead, each value being the record timestamp (8
bytes, big-endian) followed by the value (:func:`encode_timestamped`); its
``default`` family stays empty.

The processing path uses rocksdict (raw mode); restoration uses the Rust
engine. They must never hold one store open at the same time: close the
:class:`Store` before restoring into its directory.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from statestore import _native
from statestore.errors import IllegalStateError, StoreCorruptedError, StoreError
from statestore.ids import OFFSET_UNKNOWN, TaskId, TopicPartition, committed_offset

logger = logging.getLogger(__name__)

# The store layout is defined once, in the Rust crate (``rust/src/offsets.rs``,
# ``rust/src/store.rs``), which every writer -- this class, the restore engine,
# Kafka Streams' layout checks -- shares; Python reads it from there.

#: Column family holding offsets and the status marker.
OFFSETS_CF: str = _native.OFFSETS_CF
#: Column family holding the data of a timestamped store.
TIMESTAMPED_CF: str = _native.TIMESTAMPED_CF
#: Store formats: Kafka Streams' plain key-value store and its timestamped one, its window and
#: session stores (``SEGMENTED_STORE_FORMATS``: a directory of segments, written by restores only),
#: its versioned key-value store (``VERSIONED_STORE_FORMATS``), and the header-aware stores of Kafka
#: Streams 4.3+ (``HEADERS_STORE_FORMATS``): all written by restores only.
STORE_FORMATS: tuple[str, ...] = tuple(_native.STORE_FORMATS)
#: The formats of one RocksDB key-value store, which :class:`Store` reads and writes (a
#: header-aware key-value store is restored, never processed, by statestore).
KEY_VALUE_FORMATS: tuple[str, ...] = tuple(
    f
    for f in STORE_FORMATS
    if f not in _native.RETAINED_STORE_FORMATS and f not in _native.HEADERS_STORE_FORMATS
)
#: Key of the status marker in the offsets column family.
STATUS_KEY: bytes = _native.STATUS_KEY
#: Kafka Streams' interactive-query position in the offsets column family: not an offset, skipped.
POSITION_KEY: bytes = _native.POSITION_KEY
#: Status value while the store is open; a crash leaves it behind.
STATUS_OPEN: int = _native.STATUS_OPEN
#: Status value after a clean close.
STATUS_CLOSED: int = _native.STATUS_CLOSED
#: Names of the status values, as ``inspect`` prints them.
STATUS_NAMES: dict[int, str] = {STATUS_OPEN: "open", STATUS_CLOSED: "closed"}


def check_format(fmt: str) -> str:
    """``fmt`` if it is one of :data:`STORE_FORMATS`, else ``ValueError`` listing them: the one check of a format."""
    if fmt not in STORE_FORMATS:
        raise ValueError(f"unknown store format {fmt!r}: use one of {', '.join(STORE_FORMATS)}")
    return fmt


def rocksdb_format(fmt: str) -> str:
    """The key-value format of the one RocksDB of a store of ``fmt``: a versioned store's RocksDB has a
    plain store's column families (its versions are key prefixes in ``default``), other formats are
    their own."""
    return "plain" if fmt in _native.VERSIONED_STORE_FORMATS else fmt


def check_store_format(
    path: Path, fmt: str, *, who: str | None = None, task_id: TaskId | None = None
) -> None:
    """Refuse (``StoreError``) to touch the store at ``path`` if it is of another format than ``fmt``,
    or of a type statestore does not know.

    Nothing is opened for writing: the Rust extension lists the column
    families, so a store statestore cannot use is never damaged (a restore
    would otherwise wipe what it cannot read). A missing store passes.
    """
    if not path.is_dir():
        return
    found = _native.store_format(path)  # StoreError naming a store type statestore does not know
    # A versioned store has a plain store's column families: its bytes do not tell them apart.
    if found is not None and found != rocksdb_format(fmt):
        raise StoreError(
            f"{who or 'store'}: {path} is a {found} store, not {fmt}; statestore leaves it untouched "
            "(choose the store's format, or wipe it to restore it in the other one)",
            path=path,
            task_id=task_id,
        )


def encode_timestamped(timestamp: int, value: bytes) -> bytes:
    """A timestamped store's value: the timestamp (ms, 8 bytes big-endian) followed by ``value``."""
    return timestamp.to_bytes(8, "big", signed=True) + value


def decode_timestamped(raw: bytes) -> tuple[int, bytes]:
    """``(timestamp, value)`` of a timestamped store's value; ``ValueError`` if shorter than 8 bytes."""
    if len(raw) < 8:
        raise ValueError(f"a timestamped value is at least 8 bytes, got {len(raw)}")
    return int.from_bytes(raw[:8], "big", signed=True), raw[8:]


def encode_i64(value: int) -> bytes:
    """8-byte big-endian signed encoding of an offset or status value."""
    return _native.encode_offset(value)


def is_corruption(e: BaseException) -> bool:
    """Whether a RocksDB error (rocksdict raises plain ``Exception``) reports damaged files.

    RocksDB's status text starts with its code: ``Corruption: block checksum mismatch ...``,
    ``Corruption: Sst file size mismatch ...``, ``Corruption: Bad table magic number ...``; a
    background compaction that read a damaged block makes later writes fail with the same status.
    """
    return str(e).lstrip().startswith(_native.CORRUPTION_PREFIX)


def decode_i64(data: bytes, *, what: str, path: Path, task_id: object | None = None) -> int:
    """Decode an 8-byte big-endian signed value; any other length is a ``StoreCorruptedError`` naming ``what``."""
    value = _native.decode_offset(data)
    if value is None:
        raise StoreCorruptedError(
            f"store {path}: {what} is {len(data)} bytes, expected 8; the offsets column family is damaged "
            "-- wipe the task to restore it from its changelog",
            path=path,
            task_id=task_id,
            task_ids=frozenset() if task_id is None else frozenset({task_id}),
        )
    return value


def read_offsets(path: Path) -> dict[str, int]:
    """The offsets recorded in the store at ``path`` (``"<topic>-<partition>"`` -> offset), read-only.

    Takes no lock and changes nothing, so a tool or the task manager may read
    an unowned store; a damaged offsets column family is a ``StoreError``
    naming the store.
    """
    return dict(_native.store_info(path).offsets)


def decode_offset_entry(
    key: bytes, value: bytes, *, path: Path, who: str, task_id: object | None = None
) -> tuple[TopicPartition, int]:
    """Decode one ``"<topic>-<partition>" -> offset`` entry of the offsets column family.

    The bytes come from disk: a key that is not ``<topic>-<partition>`` or a
    value that is not 8 bytes raises ``StoreCorruptedError`` (a ``StoreError``)
    naming the store, never another exception.
    """
    try:
        tp = TopicPartition.parse(key.decode())
    except (UnicodeDecodeError, ValueError) as e:
        shown = key if len(key) <= 80 else key[:80] + b"..."
        raise StoreCorruptedError(
            f"{who}: offsets key {shown!r} in {path} is not '<topic>-<partition>'; "
            "wipe the task to restore it from its changelog",
            path=path,
            task_id=task_id,
            task_ids=frozenset() if task_id is None else frozenset({task_id}),
        ) from e
    return tp, decode_i64(value, what=f"offset of {tp}", path=path, task_id=task_id)


class _Staging:
    """Uncommitted writes: key -> value, or None for a delete. Reads consult it first."""

    def __init__(self) -> None:
        self.writes: dict[bytes, bytes | None] = {}

    def merged(
        self, committed: Iterator[tuple[bytes, bytes]], start: bytes | None, end: bytes | None
    ) -> Iterator[tuple[bytes, bytes]]:
        """Merge committed ``(key, value)`` pairs (sorted, in range) with the staged writes in range."""
        keys = sorted(k for k in self.writes if (start is None or k >= start) and (end is None or k < end))
        snapshot = {k: self.writes[k] for k in keys}
        i = 0
        for key, value in committed:
            while i < len(keys) and keys[i] < key:
                staged = snapshot[keys[i]]
                if staged is not None:
                    yield keys[i], staged
                i += 1
            if i < len(keys) and keys[i] == key:
                staged = snapshot[key]
                i += 1
                if staged is not None:
                    yield key, staged
                continue
            yield key, value
        for key in keys[i:]:
            staged = snapshot[key]
            if staged is not None:
                yield key, staged


class _StagedWrites:
    """What both stores share about writes staged until commit."""

    _staging: _Staging

    @property
    def uncommitted(self) -> int:
        """Number of staged writes not yet committed."""
        return len(self._staging.writes)

    def abort(self) -> None:
        """Drop every staged write (the transaction they belonged to did not commit)."""
        self._staging.writes.clear()


def _check_bytes(what: str, value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be bytes, got {type(value).__name__}")


class Store(_StagedWrites):
    """A RocksDB store at ``path``, opened (created if missing) for processing.

    Opening writes status OPEN and remembers the status found
    (:attr:`previous_status`: ``STATUS_CLOSED`` after a clean close,
    ``STATUS_OPEN`` after a crash, None for a new store). The parent directory
    must exist: a store is never created inside a directory that was deleted.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        name: str | None = None,
        task_id: TaskId | None = None,
        format: str = "plain",
    ) -> None:
        self.path = Path(path)
        self.name = name if name is not None else self.path.name
        self.task_id = task_id
        if check_format(format) not in KEY_VALUE_FORMATS:
            what = (
                "a directory of segments, not one key-value store"
                if format in _native.SEGMENTED_STORE_FORMATS
                else "restored by statestore, not processed"
            )
            raise ValueError(
                f"store {self.path}: a {format} store is {what}; a Store is {' or '.join(KEY_VALUE_FORMATS)}"
            )
        #: ``"plain"`` or ``"timestamped"`` (values are then :func:`encode_timestamped` bytes).
        self.format = format
        self._staging = _Staging()
        if not self.path.parent.is_dir():
            raise StoreError(
                f"{self._who()}: cannot open {self.path}: parent directory does not exist "
                "(task directory deleted?); lock the task again before opening its stores",
                path=self.path,
                task_id=task_id,
            )
        self._check_unsynced()
        self._check_format_on_disk()
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.create_missing_column_families(True)
        opts.set_atomic_flush(True)
        families = {OFFSETS_CF: Options(raw_mode=True)}
        if format == "timestamped":
            families[TIMESTAMPED_CF] = Options(raw_mode=True)
        try:
            self._db: Rdict | None = Rdict(str(self.path), opts, column_families=families)
        except Exception as e:  # rocksdict raises plain Exception
            if is_corruption(e):
                raise self._failed(f"cannot open RocksDB at {self.path}", e) from e
            raise StoreError(
                f"{self._who()}: cannot open RocksDB at {self.path}: {e}; if another process or the "
                "restore engine has it open, close that first",
                path=self.path,
                task_id=task_id,
            ) from e
        self._offsets_db: Rdict | None = self._db.get_column_family(OFFSETS_CF)
        self._data_db: Rdict | None = (
            self._db.get_column_family(TIMESTAMPED_CF) if format == "timestamped" else self._db
        )
        self._wal = WriteOptions()
        try:
            self.previous_status: int | None = self._status_now()
            self._write_marker(STATUS_OPEN)
        except BaseException:
            self._drop_handles(quiet=True)
            raise

    def _check_format_on_disk(self) -> None:
        check_store_format(self.path, self.format, who=self._who(), task_id=self.task_id)

    def _who(self) -> str:
        return f"task {self.task_id} store {self.name}" if self.task_id is not None else f"store {self.name}"

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r})"

    # -- plumbing ---------------------------------------------------------------------

    def _open_db(self) -> Rdict:
        if self._db is None:
            raise IllegalStateError(
                f"{self._who()} at {self.path} is closed", path=self.path, task_id=self.task_id
            )
        return self._db

    def _offsets(self) -> Rdict:
        self._open_db()
        assert self._offsets_db is not None
        return self._offsets_db

    def _data(self) -> Rdict:
        self._open_db()
        assert self._data_db is not None
        return self._data_db

    def _batch(self) -> WriteBatch:
        return WriteBatch(raw_mode=True)

    def _check_unsynced(self) -> None:
        """A restore job that created this store defers its syncs to the job's end, with a marker
        beside it meanwhile: left by this boot (the process died), the store is synced and kept;
        left by an earlier boot (the machine went down) or by a job whose last sync failed, its
        files may have lost any write, and it must be restored again, which a restore does by
        wiping it."""
        try:
            marker = _native.unsynced_marker(self.path)
            if marker == "this_boot":
                _native.recover_unsynced(self.path)
        except OSError as e:  # the marker (or the store's files) cannot be read or synced
            raise StoreError(
                f"{self._who()}: cannot tell whether {self.path} was made durable: {e}",
                path=self.path,
                task_id=self.task_id,
            ) from e
        if marker is not None and marker != "this_boot":
            cause = "the machine going down" if marker == "earlier_boot" else "a failed sync of its files"
            raise StoreCorruptedError(
                f"{self._who()}: the restore that created {self.path} was cut short by {cause}, so "
                "its files may have lost writes -- wipe the task to restore it from its changelog",
                path=self.path,
                task_id=self.task_id,
                task_ids=frozenset() if self.task_id is None else frozenset({self.task_id}),
            )

    def _failed(self, what: str, e: Exception) -> StoreError:
        """The error for a failed RocksDB call: ``StoreCorruptedError`` when RocksDB reports damaged files
        (wipe the task and restore it), else ``StoreError``. Both name the store and keep RocksDB's reason."""
        if is_corruption(e):
            return StoreCorruptedError(
                f"{self._who()}: {what}: {e}; its files are damaged -- wipe the task to restore it from "
                "its changelog",
                path=self.path,
                task_id=self.task_id,
                task_ids=frozenset() if self.task_id is None else frozenset({self.task_id}),
            )
        return StoreError(f"{self._who()}: {what}: {e}", path=self.path, task_id=self.task_id)

    def _write(self, batch: WriteBatch) -> None:
        try:
            self._open_db().write(batch, self._wal)
        except IllegalStateError:
            raise
        except Exception as e:
            raise self._failed(f"write to {self.path} failed", e) from e

    def _write_marker(self, status: int) -> None:
        db = self._open_db()
        batch = self._batch()
        batch.put(STATUS_KEY, encode_i64(status), db.get_column_family_handle(OFFSETS_CF))
        self._write(batch)

    # -- reads ------------------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        """The value of ``key``, staged writes included; None if absent or deleted."""
        key = _check_bytes("key", key)
        if key in self._staging.writes:
            return self._staging.writes[key]
        db = self._data()
        try:
            value: bytes | None = db.get(key)
        except Exception as e:  # rocksdict raises plain Exception, e.g. for a block with a bad checksum
            raise self._read_failed(e) from e
        return value

    def _read_failed(self, e: Exception) -> StoreError:
        return self._failed(f"reading {self.path} failed", e)

    def _committed(self, start: bytes | None, end: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        it = self._data().iter()
        try:
            if start is None:
                it.seek_to_first()
            else:
                it.seek(start)
            while it.valid():
                key: bytes = it.key()
                if end is not None and key >= end:
                    return
                yield key, it.value()
                it.next()
            # An iterator that hit an error (a damaged block) just stops being valid:
            # without this check a damaged store would read as if it ended there.
            try:
                it.status()
            except Exception as e:
                raise self._read_failed(e) from e
        finally:
            del it

    def range(self, start: bytes | None = None, end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs with ``start <= key < end`` in key order, staged writes included."""
        return self._staging.merged(self._committed(start, end), start, end)

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        return self.range()

    def approximate_num_entries(self) -> int:
        """RocksDB's estimate of the number of keys, plus staged puts (an estimate, never exact)."""
        try:
            estimate = self._data().property_int_value("rocksdb.estimate-num-keys") or 0
        except IllegalStateError:
            raise
        except Exception as e:
            raise self._read_failed(e) from e
        staged = sum(1 for v in self._staging.writes.values() if v is not None)
        return estimate + staged

    def is_empty(self) -> bool:
        """True when no committed data is in the store (staged writes do not count)."""
        return next(self._committed(None, None), None) is None

    # -- staged writes ----------------------------------------------------------------

    def put(self, key: bytes, value: bytes) -> None:
        """Stage ``key -> value``; it reaches RocksDB at the next :meth:`commit`."""
        self._open_db()
        self._staging.writes[_check_bytes("key", key)] = _check_bytes("value", value)

    def delete(self, key: bytes) -> None:
        """Stage the deletion of ``key``."""
        self._open_db()
        self._staging.writes[_check_bytes("key", key)] = None

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        """Apply the staged writes and ``offsets`` to RocksDB in one WriteBatch, atomically.

        ``offsets`` maps changelog partitions to the offset of the last record
        the staged writes correspond to; pass None (checkpoint mode) to write
        data only. Offsets must be >= 0, or ``OFFSET_UNKNOWN`` (a store that
        applied no changelog record: Kafka Streams' "no offset yet").
        """
        db = self._open_db()
        batch = self._batch()
        data_cf = db.get_column_family_handle(TIMESTAMPED_CF) if self.format == "timestamped" else None
        for key, value in self._staging.writes.items():
            if value is None:
                batch.delete(key, data_cf)
            else:
                batch.put(key, value, data_cf)
        del data_cf
        if offsets:
            cf = db.get_column_family_handle(OFFSETS_CF)
            for tp, offset in offsets.items():
                if offset < 0 and offset != OFFSET_UNKNOWN:
                    raise ValueError(
                        f"{self._who()}: refusing to store negative offset {offset} for {tp} in {self.path}"
                    )
                batch.put(str(TopicPartition(*tp)).encode(), encode_i64(offset), cf)
            del cf
        if len(batch) == 0:
            return
        self._write(batch)
        self._staging.writes.clear()

    # -- offsets and status -----------------------------------------------------------

    def _get_offsets_entry(self, key: bytes) -> bytes | None:
        try:
            raw: bytes | None = self._offsets().get(key)
        except IllegalStateError:
            raise
        except Exception as e:  # rocksdict raises plain Exception
            raise self._read_failed(e) from e
        return raw

    def _decode(self, raw: bytes, what: str) -> int:
        return decode_i64(raw, what=what, path=self.path, task_id=self.task_id)

    def offsets(self) -> dict[TopicPartition, int]:
        """Every offset recorded in the store (the status marker excluded)."""
        out: dict[TopicPartition, int] = {}
        try:
            items = list(self._offsets().items())
        except IllegalStateError:
            raise
        except Exception as e:  # rocksdict raises plain Exception
            raise self._read_failed(e) from e
        for key, value in items:
            if not isinstance(key, bytes) or key in (STATUS_KEY, POSITION_KEY):
                continue
            tp, offset = decode_offset_entry(
                key, value, path=self.path, who=self._who(), task_id=self.task_id
            )
            out[tp] = offset
        return out

    def recorded_offset(self, tp: TopicPartition) -> int | None:
        """The value recorded for ``tp`` as it is on disk (a sentinel such as ``OFFSET_UNKNOWN``
        included), or None when nothing is recorded."""
        raw = self._get_offsets_entry(str(TopicPartition(*tp)).encode())
        return None if raw is None else self._decode(raw, f"offset of {tp}")

    def offset(self, tp: TopicPartition) -> int | None:
        """The offset of the last applied record of ``tp``; None when the store records none, or
        records Kafka Streams' ``OFFSET_UNKNOWN`` (its task had committed no changelog record)."""
        return committed_offset(self.recorded_offset(tp))

    def clear_offset(self, tp: TopicPartition) -> None:
        """Remove what the store records for ``tp`` (a sentinel the restore engine must not resume from)."""
        db = self._open_db()
        batch = self._batch()
        batch.delete(str(TopicPartition(*tp)).encode(), db.get_column_family_handle(OFFSETS_CF))
        self._write(batch)

    def _status_now(self) -> int | None:
        raw = self._get_offsets_entry(STATUS_KEY)
        return None if raw is None else self._decode(raw, "status marker")

    def status(self) -> int | None:
        """The status marker as stored now (``STATUS_OPEN`` while open)."""
        return self._status_now()

    # -- durability and closing -------------------------------------------------------

    def flush(self) -> None:
        """Flush committed data, then offsets, to SST files and wait (staged writes are not flushed).

        A flush after a background compaction found damaged files raises
        ``StoreCorruptedError``; other failures (disk full, I/O errors) ``StoreError``.
        """
        try:
            self._data().flush(True)
            self._offsets().flush(True)
        except IllegalStateError:
            raise
        except Exception as e:
            raise self._failed(f"flush of {self.path} failed", e) from e

    def _drop_handles(self, *, quiet: bool = False) -> None:
        """Close RocksDB. With ``quiet`` (a dirty close) a failure is only logged: RocksDB repeats the
        error that stopped its writes (e.g. a compaction that found a damaged block), the handle is
        released all the same, and nothing of the store is trusted anyway."""
        # Column-family handles keep the RocksDB LOCK alive: drop them first.
        self._offsets_db = None
        self._data_db = None
        db, self._db = self._db, None
        if db is None:
            return
        try:
            db.close()
        except Exception as e:
            if not quiet:
                raise self._failed(f"closing {self.path} failed", e) from e
            logger.warning("%s: closing %s dirty: %s", self._who(), self.path, e)
        finally:
            del db

    @property
    def closed(self) -> bool:
        """Whether the store has been closed."""
        return self._db is None

    def close(self, *, clean: bool = True) -> None:
        """Close the store, dropping staged writes. Idempotent.

        A clean close flushes and then marks the status CLOSED; a dirty close
        (``clean=False``) leaves the status OPEN, as a crash would.
        """
        if self._db is None:
            return
        if self._staging.writes:
            logger.info("%s: dropping %d uncommitted writes on close", self._who(), len(self._staging.writes))
            self._staging.writes.clear()
        try:
            if clean:
                self.flush()
                self._write_marker(STATUS_CLOSED)
                try:
                    self._offsets().flush(True)
                except Exception as e:
                    raise self._failed(f"flush of {self.path} failed", e) from e
        finally:
            self._drop_handles(quiet=not clean)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(clean=exc == (None, None, None))


class InMemoryStore(_StagedWrites):
    """A non-persistent store with :class:`Store`'s processing API, for stores that need no disk.

    It keeps no offsets (nothing survives a restart, so it always restores from
    the beginning) and is never written to a checkpoint.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._data: dict[bytes, bytes] = {}
        self._keys: list[bytes] = []
        self._staging = _Staging()
        self._closed = False

    def _check(self) -> None:
        if self._closed:
            raise IllegalStateError(f"in-memory store {self.name} is closed")

    def get(self, key: bytes) -> bytes | None:
        """The value of ``key``, staged writes included."""
        key = _check_bytes("key", key)
        if key in self._staging.writes:
            return self._staging.writes[key]
        return self._data.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        """Stage ``key -> value``."""
        self._check()
        self._staging.writes[_check_bytes("key", key)] = _check_bytes("value", value)

    def delete(self, key: bytes) -> None:
        """Stage the deletion of ``key``."""
        self._check()
        self._staging.writes[_check_bytes("key", key)] = None

    def range(self, start: bytes | None = None, end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs with ``start <= key < end`` in key order, staged writes included."""
        lo = 0 if start is None else bisect.bisect_left(self._keys, start)
        hi = len(self._keys) if end is None else bisect.bisect_left(self._keys, end)
        committed = ((k, self._data[k]) for k in self._keys[lo:hi])
        return self._staging.merged(committed, start, end)

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        return self.range()

    def approximate_num_entries(self) -> int:
        """Number of committed keys plus staged puts."""
        return len(self._data) + sum(1 for v in self._staging.writes.values() if v is not None)

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        """Apply the staged writes (offsets are not kept: the store restores from the beginning)."""
        self._check()
        for key, value in self._staging.writes.items():
            if value is None:
                if self._data.pop(key, None) is not None:
                    self._keys.pop(bisect.bisect_left(self._keys, key))
            else:
                if key not in self._data:
                    bisect.insort(self._keys, key)
                self._data[key] = value
        self._staging.writes.clear()

    def is_empty(self) -> bool:
        """True when no committed data is held."""
        return not self._data

    def flush(self) -> None:
        """Nothing to flush."""

    @property
    def closed(self) -> bool:
        """Whether the store has been closed."""
        return self._closed

    def close(self, *, clean: bool = True) -> None:
        """Drop everything: an in-memory store does not outlive its task."""
        self._data.clear()
        self._keys.clear()
        self._staging.writes.clear()
        self._closed = True


__all__ = [
    "KEY_VALUE_FORMATS",
    "OFFSETS_CF",
    "POSITION_KEY",
    "STATUS_CLOSED",
    "STATUS_KEY",
    "STATUS_NAMES",
    "STATUS_OPEN",
    "STORE_FORMATS",
    "TIMESTAMPED_CF",
    "InMemoryStore",
    "Store",
    "check_format",
    "check_store_format",
    "decode_i64",
    "decode_offset_entry",
    "decode_timestamped",
    "encode_i64",
    "encode_timestamped",
    "is_corruption",
    "rocksdb_format",
]
