//! What a restore writes into: one RocksDB (a key-value store), a directory
//! of time segments (a window or session store, [`SegmentedStore`]), or a
//! versioned store ([`VersionedStore`]: one RocksDB written through Kafka's
//! put logic, record by record, never in bulk).
//! The engine and both modes see only [`Dest`]: it says where the store
//! resumes, routes each operation to its database, and records the offset
//! when a pass is done.
//!
//! A key-value store takes its offset in the same `WriteBatch` as the data
//! (replay) or right after one atomic ingestion (bulk). A segmented store's
//! segments are separate databases, so a pass writes their data without
//! offsets and records the offset in every live segment once all of them are
//! flushed ([`SegmentedStore::record`]): a crash leaves data ahead of the
//! recorded offset, never an offset ahead of data, and replaying from it
//! converges to the same store.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rocksdb::{IngestExternalFileOptions, Options, WriteBatch};

use super::chunk::ChunkOps;
use crate::segments::{KeySchema, Segmentation, SegmentedStore};
use crate::store::{Store, StoreError, StoreFormat, STATUS_CLOSED};
use crate::versioned::{History, VersionedStore};

/// Why a versioned store takes no bulk write (the engine replays it instead).
const VERSIONED_NOT_BULK: &str =
    "a versioned store is restored by replaying Kafka's put logic record by record, never in bulk";

/// A store a restore writes: see the module documentation.
pub enum Dest {
    Store(Store),
    Segmented(SegmentedStore),
    Versioned(VersionedStore),
}

impl Dest {
    /// Whether a store of `format` exists at `path` (a segmented store is
    /// its directory).
    pub fn exists(path: &Path, format: StoreFormat) -> bool {
        match format.key_schema() {
            Some(_) => path.is_dir(),
            None => path.join("CURRENT").exists(),
        }
    }

    /// Open (or create) the store at `path` in `format`; a segmented format
    /// needs its `segmentation`, a versioned one its history retention and
    /// segment interval in the same two fields.
    pub fn open(
        path: &Path,
        opts: Options,
        format: StoreFormat,
        segmentation: Option<Segmentation>,
    ) -> Result<Self, StoreError> {
        if format.is_versioned() {
            let seg = segmentation.ok_or_else(|| {
                StoreError::new(path, "a versioned store needs its history retention (and segment interval)")
            })?;
            let history =
                History::new(seg.retention_ms, Some(seg.segment_interval_ms)).map_err(|m| StoreError::new(path, m))?;
            return VersionedStore::open(path, opts, history).map(Dest::Versioned);
        }
        match format.key_schema() {
            None => Store::open_format(path, opts, format).map(Dest::Store),
            Some(_) => {
                let seg = segmentation.ok_or_else(|| {
                    StoreError::new(
                        path,
                        format!("a {} store needs its retention (and segment interval)", format.name()),
                    )
                })?;
                SegmentedStore::open(path, format, seg, opts, true).map(Dest::Segmented)
            }
        }
    }

    pub fn path(&self) -> &Path {
        match self {
            Dest::Store(s) => s.path(),
            Dest::Segmented(s) => s.path(),
            Dest::Versioned(v) => v.store().path(),
        }
    }

    /// Bytes the store's memtables hold.
    pub fn memtable_bytes(&self) -> u64 {
        match self {
            Dest::Store(s) | Dest::Versioned(VersionedStore { store: s, .. }) => s.memtable_bytes(),
            Dest::Segmented(s) => s.memtable_bytes(),
        }
    }

    /// A replay left its store open and unflushed (`open_stores`) with its
    /// last operation at `offset`: a key-value or versioned store's every
    /// batch already holds its offset beside its data ([`Dest::write_chunk`]),
    /// so whatever RocksDB flushes of it is a committed prefix with its
    /// offset; a segmented store, whose segments are separate databases,
    /// keeps the offset in memory until every segment is flushed
    /// ([`SegmentedStore::hold`]).
    pub fn hold(&self, tp: &str, offset: Option<i64>) {
        if let (Dest::Segmented(s), Some(off)) = (self, offset) {
            s.hold(tp, off)
        }
    }

    pub fn format(&self) -> StoreFormat {
        match self {
            Dest::Store(s) => s.format(),
            Dest::Segmented(s) => s.format(),
            Dest::Versioned(_) => StoreFormat::Versioned,
        }
    }

    /// The key schema of a segmented store.
    pub fn key_schema(&self) -> Option<KeySchema> {
        match self {
            Dest::Store(_) | Dest::Versioned(_) => None,
            Dest::Segmented(s) => Some(s.key_schema()),
        }
    }

    /// The offset recorded for `tp` (of a segmented store: as Kafka Streams
    /// reads it, from the newest segment that has one).
    pub fn offset(&self, tp: &str) -> Result<Option<i64>, StoreError> {
        match self {
            Dest::Store(s) => s.offset(tp),
            Dest::Segmented(s) => s.offset(tp),
            Dest::Versioned(v) => v.store().offset(tp),
        }
    }

    pub fn is_data_empty(&self) -> bool {
        match self {
            Dest::Store(s) => s.is_data_empty(),
            Dest::Segmented(s) => s.is_data_empty(),
            Dest::Versioned(v) => v.store().is_data_empty(),
        }
    }

    /// Mark CLOSED what has no status yet (a store, or each segment; a new
    /// segment is CLOSED from birth), as Kafka Streams expects of a store it
    /// may reuse under exactly_once_v2; a status a processor wrote is left
    /// alone. Whether anything was marked (it reaches disk with the next flush).
    pub fn close_unmarked(&self) -> Result<bool, StoreError> {
        match self {
            Dest::Store(s) | Dest::Versioned(VersionedStore { store: s, .. }) => {
                if s.status()?.is_some() {
                    return Ok(false);
                }
                let mut b = WriteBatch::default();
                s.put_status(&mut b, STATUS_CLOSED);
                s.write(b, false)?;
                Ok(true)
            }
            Dest::Segmented(s) => s.close_unmarked(),
        }
    }

    /// Write one replay chunk (the last operation per key, in key order):
    /// one batch with its offset into a store; into a versioned store every
    /// record through the put logic, then one batch with its offset; into a segmented store, stream
    /// time advanced over the whole chunk first (as Kafka Streams does per
    /// restored batch), then a batch per live segment, without offset.
    pub fn write_chunk(&self, ops: &mut ChunkOps, tp: &str, offset: i64) -> Result<(), StoreError> {
        match self {
            Dest::Store(s) => {
                let mut batch = ops.to_batch(s);
                s.put_offset(&mut batch, tp, offset);
                s.write(batch, false)
            }
            Dest::Versioned(v) => v.write_chunk(ops, tp, offset),
            Dest::Segmented(s) => {
                ops.sort_last();
                let schema = s.key_schema();
                for (k, _) in ops.sorted() {
                    let ts = schema.segment_timestamp(k).ok_or_else(|| StoreError::new(s.path(), schema.bad_key(k)))?;
                    s.observe(ts);
                }
                s.write(ops.sorted())
            }
        }
    }

    /// A pass is done (or stopped): record `offset` (if any) for `tp` and
    /// make it durable; a segmented store drops its expired segments first.
    pub fn record(&self, tp: &str, offset: Option<i64>) -> Result<(), StoreError> {
        match self {
            Dest::Store(s) | Dest::Versioned(VersionedStore { store: s, .. }) => {
                if let Some(off) = offset {
                    let mut b = WriteBatch::default();
                    s.put_offset(&mut b, tp, off);
                    s.write(b, false)?;
                }
                s.flush()
            }
            Dest::Segmented(s) => s.record(tp, offset),
        }
    }

    /// Wait until no database of the store holds `files` level-0 files or more
    /// ([`Store::settle_level0`]).
    pub fn settle_level0(&self, files: u64) {
        match self {
            Dest::Store(s) | Dest::Versioned(VersionedStore { store: s, .. }) => s.settle_level0(files),
            Dest::Segmented(s) => s.settle_level0(files),
        }
    }

    /// Merge every database of the store into RocksDB's last level ([`Store::compact_all`]).
    pub fn compact_all(&self) -> Result<(), StoreError> {
        match self {
            Dest::Store(s) | Dest::Versioned(VersionedStore { store: s, .. }) => s.compact_all(),
            Dest::Segmented(s) => s.compact_all(),
        }
    }

    /// Make what was written durable, with any offset held in memory ([`Dest::hold`]).
    pub fn flush(&self) -> Result<(), StoreError> {
        match self {
            Dest::Store(s) | Dest::Versioned(VersionedStore { store: s, .. }) => s.flush(),
            Dest::Segmented(s) => s.flush(),
        }
    }

    /// Advance a segmented store's stream time to `timestamp`.
    pub fn observe(&self, timestamp: i64) {
        if let Dest::Segmented(s) = self {
            s.observe(timestamp)
        }
    }

    /// The database `key` goes to (a store's is 0), None when its segment
    /// has expired at the stream time observed.
    #[inline]
    pub fn route(&self, key: &[u8]) -> Result<Option<i64>, String> {
        match self {
            Dest::Store(_) => Ok(Some(0)),
            Dest::Segmented(s) => s.route(key),
            Dest::Versioned(_) => Err(VERSIONED_NOT_BULK.to_string()),
        }
    }

    /// Whether database `id` (see [`Dest::route`]) holds data: tombstones
    /// bound for one that does not need not be written.
    pub fn holds_data(&self, id: i64) -> bool {
        match self {
            Dest::Store(s) | Dest::Versioned(VersionedStore { store: s, .. }) => !s.is_data_empty(),
            Dest::Segmented(s) => s.holds_data(id),
        }
    }

    /// Ingest sorted SST files into database `id`'s data (moved, not copied;
    /// one atomic ingestion per database).
    pub fn ingest(&self, id: i64, files: Vec<PathBuf>) -> Result<(), StoreError> {
        match self {
            Dest::Store(_) if files.is_empty() => Ok(()),
            Dest::Store(s) => {
                let mut io = IngestExternalFileOptions::default();
                io.set_move_files(true);
                s.db()
                    .ingest_external_file_cf_opts(s.data_cf(), &io, files)
                    .map_err(|e| StoreError::rocksdb(s.path(), "ingesting SST files", &e))
            }
            Dest::Segmented(s) => s.ingest(id, files),
            Dest::Versioned(v) => Err(StoreError::new(v.store().path(), VERSIONED_NOT_BULK)),
        }
    }

    /// [`Dest::ingest`] of several databases (id -> files); a segmented
    /// store ingests into its segments side by side
    /// ([`SegmentedStore::ingest_all`]).
    pub fn ingest_all(&self, files: BTreeMap<i64, Vec<PathBuf>>) -> Result<(), StoreError> {
        match self {
            Dest::Store(_) | Dest::Versioned(_) => files.into_iter().try_for_each(|(id, files)| self.ingest(id, files)),
            Dest::Segmented(s) => s.ingest_all(files),
        }
    }
}
