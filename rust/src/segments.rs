//! Kafka Streams' segmented stores on disk: window and session stores.
//!
//! Such a store is a directory `<task>/<store>/` (not under `rocksdb/`)
//! holding one RocksDB per time segment, `<store>.<segmentId * segmentInterval>`,
//! where `segmentId = timestamp / segmentInterval`. Each segment is a plain,
//! timestamped or header-aware key-value RocksDB ([`crate::store::Store`],
//! in the store format's [`StoreFormat::db_format`]) with its own
//! `offsets` column family and status (Kafka Streams 4.3+ commits the same
//! offset into every segment and reads it from the newest segment that has
//! one). A record's segment is found from its key ([`KeySchema`]):
//!
//! - window store: `key ‖ window start (8 bytes BE) ‖ seqnum (4 bytes BE)`,
//!   segmented by the window start;
//! - session store: `key ‖ session end (8 bytes BE) ‖ session start (8 bytes BE)`,
//!   segmented by the end;
//! - emit-final (time-ordered) window store: `0x00 ‖ window start ‖ key ‖ seqnum`,
//!   segmented by the window start, its changelog key that of a window store
//!   (Kafka Streams' `PrefixedWindowKeySchemas.TimeFirstWindowKeySchema`);
//! - emit-final session store: `0x00 ‖ session end ‖ session start ‖ key`,
//!   segmented by the end, its changelog key that of a session store
//!   (`PrefixedSessionKeySchemas.TimeFirstSessionKeySchema`), beside an index
//!   row `0x01 ‖ key ‖ session end ‖ session start` -> empty per session
//!   (`KeyFirstSessionKeySchema`), in plain segments or, under
//!   `dsl.store.format=headers`, in `sessionKeyValueWithHeaders`; a
//!   header-aware emit-final window store has index rows too, `0x01 ‖ key ‖
//!   window start ‖ seqnum`.
//!
//! The changelog key is the store key (an emit-final window store's is
//! rewritten time first, [`KeySchema::store_key`]), so a restore routes each
//! record by its key. Stream time is the largest segment timestamp seen; a segment is live
//! while `segmentId >= segmentId(streamTime - retention)`, and Kafka Streams
//! drops the others, when restoring as when processing. Kafka Streams keeps
//! stream time in memory only; a restore into existing segments starts from
//! the newest one's start, a time the store has certainly reached. [`SegmentedStore`]
//! keeps that bookkeeping: which segments exist, the stream time a restore
//! observed, creating live segments (CLOSED from birth), dropping expired
//! ones, and recording an offset in every segment.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;

use rocksdb::{IngestExternalFileOptions, Options, WriteBatch};

use crate::store::{Store, StoreError, StoreFormat, STATUS_CLOSED};
use crate::threads::side_by_side;

/// Where the timestamp that chooses a record's segment sits in its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySchema {
    /// `key ‖ window start ‖ seqnum` (Kafka's `WindowKeySchema`).
    Window,
    /// `key ‖ session end ‖ session start` (Kafka's `SessionKeySchema`).
    Session,
    /// `0x00 ‖ window start ‖ key ‖ seqnum` in the store, from the changelog's
    /// `key ‖ window start ‖ seqnum` (Kafka's `TimeFirstWindowKeySchema`, the
    /// base rows of an emit-final window store; its key-first index rows,
    /// `0x01 ‖ key ‖ window start ‖ seqnum`, exist for sliding windows only).
    TimeOrderedWindow,
    /// `0x00 ‖ session end ‖ session start ‖ key` in the store, from the
    /// changelog's `key ‖ session end ‖ session start` (Kafka's
    /// `TimeFirstSessionKeySchema`, the base rows of an emit-final session
    /// store), and an index row `0x01 ‖ key ‖ session end ‖ session start`
    /// (`KeyFirstSessionKeySchema`), empty, per base row.
    TimeOrderedSession,
}

/// The first byte of a time-ordered store's base row (`TIME_FIRST_PREFIX`).
pub const TIME_FIRST_PREFIX: u8 = 0;
/// The first byte of a time-ordered store's index row (`KEY_FIRST_PREFIX`).
pub const KEY_FIRST_PREFIX: u8 = 1;

impl KeySchema {
    pub fn name(self) -> &'static str {
        match self {
            KeySchema::Window => "window",
            KeySchema::Session => "session",
            KeySchema::TimeOrderedWindow => "emit-final window",
            KeySchema::TimeOrderedSession => "emit-final session",
        }
    }

    /// Bytes that follow the record's own key in a changelog key.
    pub const fn suffix_len(self) -> usize {
        match self {
            KeySchema::Window | KeySchema::TimeOrderedWindow => 12,
            KeySchema::Session | KeySchema::TimeOrderedSession => 16,
        }
    }

    /// The timestamp that chooses the segment of store key `key` (the window
    /// start, the session end); None for a key too short to be of this schema.
    #[inline]
    pub fn segment_timestamp(self, key: &[u8]) -> Option<i64> {
        let at = match self {
            KeySchema::Window | KeySchema::Session => key.len().checked_sub(self.suffix_len())?,
            // a base row: the time first; an index row: the changelog key behind the prefix
            _ if key.len() <= self.suffix_len() => return None,
            _ if key[0] == TIME_FIRST_PREFIX => 1,
            _ if key[0] == KEY_FIRST_PREFIX => key.len() - self.suffix_len(),
            _ => return None,
        };
        Some(i64::from_be_bytes(key[at..at + 8].try_into().expect("8 bytes")))
    }

    /// Whether the store key differs from the changelog key ([`KeySchema::store_key`]).
    pub fn rewrites_key(self) -> bool {
        matches!(self, KeySchema::TimeOrderedWindow | KeySchema::TimeOrderedSession)
    }

    /// Append the index row's key of changelog key `key` to `out`: `0x01 ‖
    /// key` (`KeyFirstSessionKeySchema.prefixNonPrefixSessionKey`,
    /// `KeyFirstWindowKeySchema.fromNonPrefixWindowKey`); its value is
    /// empty, or a tombstone with the record's. Which stores have index rows
    /// is [`crate::store::StoreFormat::has_index`].
    #[inline]
    pub fn index_key(self, key: &[u8], out: &mut Vec<u8>) {
        out.push(KEY_FIRST_PREFIX);
        out.extend_from_slice(key);
    }

    /// Append the store key of changelog key `key` to `out`: the key itself,
    /// or for an emit-final window store `0x00 ‖ window start ‖ key ‖ seqnum`
    /// (`TimeFirstWindowKeySchema.fromNonPrefixWindowKey`). A key too short
    /// for the schema is appended as is, for [`KeySchema::segment_timestamp`]
    /// to refuse.
    #[inline]
    pub fn store_key(self, key: &[u8], out: &mut Vec<u8>) {
        match self {
            KeySchema::TimeOrderedWindow if key.len() >= 12 => {
                let (k, suffix) = key.split_at(key.len() - 12);
                out.push(TIME_FIRST_PREFIX);
                out.extend_from_slice(&suffix[..8]);
                out.extend_from_slice(k);
                out.extend_from_slice(&suffix[8..]);
            }
            // `TimeFirstSessionKeySchema.extractWindowBytesFromNonPrefixSessionKey`
            KeySchema::TimeOrderedSession if key.len() >= 16 => {
                let (k, suffix) = key.split_at(key.len() - 16);
                out.push(TIME_FIRST_PREFIX);
                out.extend_from_slice(suffix);
                out.extend_from_slice(k);
            }
            _ => out.extend_from_slice(key),
        }
    }

    /// What a key too short for this schema is, for error messages.
    pub fn bad_key(self, key: &[u8]) -> String {
        let what = match self {
            KeySchema::Window | KeySchema::TimeOrderedWindow => "key ‖ window start ‖ seqnum",
            KeySchema::Session | KeySchema::TimeOrderedSession => "key ‖ session end ‖ session start",
        };
        format!(
            "a changelog key of {} bytes is no {} store key ({what}: at least {} bytes); \
             is the store's format right?",
            key.len(),
            self.name(),
            self.suffix_len()
        )
    }
}

/// Least segment interval of Kafka Streams' DSL window and session stores.
pub const MIN_DSL_SEGMENT_INTERVAL_MS: i64 = 60_000;

/// How a segmented store cuts time: retention and segment interval (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segmentation {
    pub retention_ms: i64,
    pub segment_interval_ms: i64,
}

impl Segmentation {
    /// The DSL's segment interval for `retention_ms`:
    /// `max(retention / 2, 60_000)` (as `Materialized` sets it for windowed
    /// and session aggregations and `Stores.persistentWindowStore` /
    /// `persistentSessionStore` do).
    pub fn dsl_segment_interval(retention_ms: i64) -> i64 {
        (retention_ms / 2).max(MIN_DSL_SEGMENT_INTERVAL_MS)
    }

    /// Retention and segment interval (None: the DSL's, from the retention);
    /// both must be positive.
    pub fn new(retention_ms: i64, segment_interval_ms: Option<i64>) -> Result<Self, String> {
        let segment_interval_ms = segment_interval_ms.unwrap_or_else(|| Self::dsl_segment_interval(retention_ms));
        if retention_ms <= 0 || segment_interval_ms <= 0 {
            return Err(format!(
                "retention ({retention_ms} ms) and segment interval ({segment_interval_ms} ms) must be positive"
            ));
        }
        Ok(Self { retention_ms, segment_interval_ms })
    }

    /// The segment of a record at `timestamp`.
    #[inline]
    pub fn segment_id(&self, timestamp: i64) -> i64 {
        timestamp / self.segment_interval_ms
    }

    /// The oldest live segment at `stream_time`.
    #[inline]
    pub fn min_live_segment(&self, stream_time: i64) -> i64 {
        self.segment_id(stream_time.saturating_sub(self.retention_ms))
    }

    /// Directory name of segment `id` of `store`.
    pub fn segment_name(&self, store: &str, id: i64) -> String {
        format!("{store}.{}", id * self.segment_interval_ms)
    }

    /// The segment a directory entry of `store` is, if it is one; an entry
    /// named as a segment that does not start at a multiple of the segment
    /// interval was written with another interval: an error.
    pub fn segment_of_name(&self, store: &str, name: &str) -> Result<Option<i64>, String> {
        let Some(start) = segment_start(store, name) else { return Ok(None) };
        if start % self.segment_interval_ms != 0 {
            return Err(format!(
                "segment {name} does not start at a multiple of the segment interval {} ms: the store was \
                 written with another segment interval",
                self.segment_interval_ms
            ));
        }
        Ok(Some(start / self.segment_interval_ms))
    }
}

/// The start (ms) of the segment the directory entry `name` of `store`
/// names (`<store>.<start>`, start >= 0), None when it names none (Kafka
/// Streams' `<store>.position` file, anything else).
pub fn segment_start(store: &str, name: &str) -> Option<i64> {
    let n = name.strip_prefix(store)?.strip_prefix('.')?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse::<i64>().ok()
}

/// A segmented store read without writing anything (tools: `inspect`,
/// `verify`): its segments, oldest first, each opened read-only in the
/// format its column families say. The segment interval is not needed: the
/// segments are named by their start.
pub struct SegmentsReadOnly {
    pub dir: PathBuf,
    /// `(start, segment)`, oldest first.
    pub segments: Vec<(i64, Store)>,
}

impl SegmentsReadOnly {
    /// Open every segment of the store at `dir` read-only; entries that name
    /// no segment are left alone. Segments of different formats (plain and
    /// timestamped) are an error: no store type mixes them.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        if !dir.is_dir() {
            return Err(StoreError::new(dir, "no store here (directory missing)"));
        }
        if dir.join("CURRENT").exists() {
            return Err(StoreError::new(dir, "a key-value store (one RocksDB), not a store of segments"));
        }
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let entries = std::fs::read_dir(dir).map_err(|e| StoreError::new(dir, format!("cannot list: {e}")))?;
        let mut found = Vec::new();
        for e in entries {
            let e = e.map_err(|e| StoreError::new(dir, format!("cannot list: {e}")))?;
            if let Some(start) = segment_start(&name, &e.file_name().to_string_lossy()) {
                if e.path().is_dir() {
                    found.push((start, e.path()));
                }
            }
        }
        found.sort();
        let mut segments = Vec::with_capacity(found.len());
        for (start, path) in found {
            segments.push((start, Store::open_read_only(&path)?));
        }
        let view = Self { dir: dir.to_path_buf(), segments };
        view.db_format()?;
        Ok(view)
    }

    /// The format of the segments (`Plain` or `Timestamped`), None without
    /// segments; an error when they differ.
    pub fn db_format(&self) -> Result<Option<StoreFormat>, StoreError> {
        let mut formats = self.segments.iter().map(|(_, s)| (s.format(), s.path()));
        let Some((first, first_path)) = formats.next() else { return Ok(None) };
        if let Some((other, path)) = formats.find(|(f, _)| *f != first) {
            return Err(StoreError::new(
                &self.dir,
                format!(
                    "segments of different formats: {} is {}, {} is {}; no store type mixes them",
                    first_path.display(),
                    first.name(),
                    path.display(),
                    other.name()
                ),
            ));
        }
        Ok(Some(first))
    }

    /// The offset of every topic partition as Kafka Streams 4.3+ reads it:
    /// that of the newest segment that records one.
    pub fn offsets(&self) -> Result<BTreeMap<String, i64>, StoreError> {
        let mut out = BTreeMap::new();
        for (_, s) in self.segments.iter().rev() {
            for (tp, off) in s.offsets()? {
                out.entry(tp).or_insert(off);
            }
        }
        Ok(out)
    }
}

/// No stream time observed yet.
const NO_TIME: i64 = i64::MIN;

/// A window or session store: its directory, its open segments, and the
/// stream time of the restore that writes it. Methods take `&self` (the
/// segments sit behind a lock taken once per call), so a restore's read-ahead
/// thread may hold it too.
pub struct SegmentedStore {
    dir: PathBuf,
    name: String,
    format: StoreFormat,
    schema: KeySchema,
    seg: Segmentation,
    opts: Options,
    stream_time: AtomicI64,
    segments: Mutex<BTreeMap<i64, Store>>,
    /// Segments [`SegmentedStore::write`] wrote data into since they were
    /// last flushed: the ones whose data [`SegmentedStore::record`] must make
    /// durable before any offset (ingested data is durable once ingested).
    unflushed: Mutex<BTreeSet<i64>>,
    /// Offsets a replay left in memory only ([`SegmentedStore::hold`]): the
    /// data they cover sits in the segments' memtables, and the next
    /// [`SegmentedStore::record`] or [`SegmentedStore::flush`] records them
    /// once every segment is flushed.
    held: Mutex<BTreeMap<String, i64>>,
}

impl SegmentedStore {
    /// Open the store at `dir` (of a segmented `format`) and every segment in
    /// it; with `create`, a missing directory is created (its parent must
    /// exist). Entries that are no segment of this store are left alone.
    pub fn open(
        dir: &Path,
        format: StoreFormat,
        seg: Segmentation,
        opts: Options,
        create: bool,
    ) -> Result<Self, StoreError> {
        let schema = format
            .key_schema()
            .ok_or_else(|| StoreError::new(dir, format!("a {} store is not segmented", format.name())))?;
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| StoreError::new(dir, "a segmented store's directory needs a name"))?;
        if !dir.is_dir() {
            if !create {
                return Err(StoreError::new(dir, "no store here (directory missing)"));
            }
            if !crate::fileio::parent_of(dir).is_dir() {
                return Err(StoreError::new(dir, "parent directory does not exist"));
            }
            std::fs::create_dir(dir).map_err(|e| StoreError::new(dir, format!("cannot create: {e}")))?;
        } else if dir.join("CURRENT").exists() {
            return Err(StoreError::new(
                dir,
                format!(
                    "a key-value store (one RocksDB), not a {} store of segments; statestore leaves it untouched",
                    format.name()
                ),
            ));
        }
        let mut segments = BTreeMap::new();
        for (id, path) in Self::list(dir, &name, &seg)? {
            segments.insert(id, Store::open_segment(&path, opts.clone(), format)?);
        }
        // Stream time lives in memory only; the newest segment's start is the
        // most that is known of it: never past it, so nothing is dropped that
        // the stream time which created that segment keeps.
        let known = segments.keys().next_back().map_or(NO_TIME, |&id| id * seg.segment_interval_ms);
        Ok(Self {
            dir: dir.to_path_buf(),
            name,
            format,
            schema,
            seg,
            opts,
            stream_time: AtomicI64::new(known),
            segments: Mutex::new(segments),
            unflushed: Mutex::new(BTreeSet::new()),
            held: Mutex::new(BTreeMap::new()),
        })
    }

    /// The segments in `dir` (id, path), oldest first.
    pub fn list(dir: &Path, name: &str, seg: &Segmentation) -> Result<Vec<(i64, PathBuf)>, StoreError> {
        let entries = std::fs::read_dir(dir).map_err(|e| StoreError::new(dir, format!("cannot list: {e}")))?;
        let mut out = Vec::new();
        for e in entries {
            let e = e.map_err(|e| StoreError::new(dir, format!("cannot list: {e}")))?;
            let file = e.file_name().to_string_lossy().into_owned();
            if let Some(id) = seg.segment_of_name(name, &file).map_err(|m| StoreError::new(&e.path(), m))? {
                out.push((id, e.path()));
            }
        }
        out.sort();
        Ok(out)
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    pub fn format(&self) -> StoreFormat {
        self.format
    }

    pub fn key_schema(&self) -> KeySchema {
        self.schema
    }

    pub fn segmentation(&self) -> Segmentation {
        self.seg
    }

    /// Bytes the memtables of every segment hold.
    pub fn memtable_bytes(&self) -> u64 {
        self.lock().values().map(Store::memtable_bytes).sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<i64, Store>> {
        self.segments.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn held(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, i64>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take the set of segments written since their last flush, leaving it empty.
    fn take_unflushed(&self) -> BTreeSet<i64> {
        std::mem::take(&mut *self.unflushed.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Flush the segments written since their last flush (`all`: every
    /// segment); on a failure they stay listed as written.
    fn flush_written(&self, all: bool) -> Result<(), StoreError> {
        let segments = self.lock();
        let unflushed = self.take_unflushed();
        let first = segments.iter().filter(|(id, _)| all || unflushed.contains(id));
        let flushed = side_by_side(first, |(_, s)| s.flush()).into_iter().collect::<Result<(), _>>();
        if flushed.is_err() {
            self.unflushed.lock().unwrap_or_else(|p| p.into_inner()).extend(unflushed);
        }
        flushed
    }

    /// The ids of the segments open now, oldest first.
    pub fn segment_ids(&self) -> Vec<i64> {
        self.lock().keys().copied().collect()
    }

    /// Advance stream time to `timestamp` if it is later.
    pub fn observe(&self, timestamp: i64) {
        self.stream_time.fetch_max(timestamp, Ordering::Relaxed);
    }

    /// The largest segment timestamp observed, if any.
    pub fn stream_time(&self) -> Option<i64> {
        Some(self.stream_time.load(Ordering::Relaxed)).filter(|&t| t != NO_TIME)
    }

    /// The segment `key` goes to at the stream time observed so far, None
    /// when that segment has expired; an error for a key of another schema.
    #[inline]
    pub fn route(&self, key: &[u8]) -> Result<Option<i64>, String> {
        let ts = self.schema.segment_timestamp(key).ok_or_else(|| self.schema.bad_key(key))?;
        let id = self.seg.segment_id(ts);
        Ok(match self.stream_time() {
            Some(t) if id < self.seg.min_live_segment(t) => None,
            _ => Some(id),
        })
    }

    /// The offset Kafka Streams reads for `tp`: that of the newest segment
    /// that records one; while the store is open, one held in memory
    /// ([`SegmentedStore::hold`]) comes first.
    pub fn offset(&self, tp: &str) -> Result<Option<i64>, StoreError> {
        if let Some(&held) = self.held().get(tp) {
            return Ok(Some(held));
        }
        for s in self.lock().values().rev() {
            if let Some(o) = s.offset(tp)? {
                return Ok(Some(o));
            }
        }
        Ok(None)
    }

    /// True when no segment holds data.
    pub fn is_data_empty(&self) -> bool {
        self.lock().values().all(Store::is_data_empty)
    }

    /// Whether segment `id` exists and holds data.
    pub fn holds_data(&self, id: i64) -> bool {
        self.lock().get(&id).is_some_and(|s| !s.is_data_empty())
    }

    /// Mark CLOSED every segment that has no status yet (a status a
    /// processor wrote is left alone); whether any was marked.
    pub fn close_unmarked(&self) -> Result<bool, StoreError> {
        let mut marked = false;
        for s in self.lock().values() {
            if s.status()?.is_none() {
                let mut b = WriteBatch::default();
                s.put_status(&mut b, STATUS_CLOSED);
                s.write(b, false)?;
                marked = true;
            }
        }
        Ok(marked)
    }

    /// Segment `id`, created (CLOSED) if missing, in `segments`.
    fn segment<'m>(&self, segments: &'m mut BTreeMap<i64, Store>, id: i64) -> Result<&'m Store, StoreError> {
        match segments.entry(id) {
            Entry::Occupied(e) => Ok(e.into_mut()),
            Entry::Vacant(e) => Ok(e.insert(self.create(id)?)),
        }
    }

    /// Open segment `id`'s database, creating it (CLOSED) if missing; the
    /// caller puts it in the map.
    fn create(&self, id: i64) -> Result<Store, StoreError> {
        let path = self.dir.join(self.seg.segment_name(&self.name, id));
        let s = Store::open_segment(&path, self.opts.clone(), self.format)?;
        if s.status()?.is_none() {
            let mut b = WriteBatch::default();
            s.put_status(&mut b, STATUS_CLOSED);
            s.write(b, false)?;
        }
        Ok(s)
    }

    /// Apply operations (in key order, one per key) to their live segments,
    /// one `WriteBatch` per segment, without WAL and without offsets (see
    /// [`SegmentedStore::record`]). Stream time must already cover them.
    pub fn write<'k>(&self, ops: impl IntoIterator<Item = (&'k [u8], Option<&'k [u8]>)>) -> Result<(), StoreError> {
        let mut segments = self.lock();
        let mut batches: BTreeMap<i64, WriteBatch> = BTreeMap::new();
        for (k, v) in ops {
            let Some(id) = self.route(k).map_err(|m| StoreError::new(&self.dir, m))? else { continue };
            let cf = self.segment(&mut segments, id)?.data_cf();
            let b = batches.entry(id).or_default();
            match v {
                Some(v) => b.put_cf(cf, k, v),
                None => b.delete_cf(cf, k),
            }
        }
        let mut unflushed = self.unflushed.lock().unwrap_or_else(|p| p.into_inner());
        for (id, b) in batches {
            segments[&id].write(b, false)?;
            unflushed.insert(id);
        }
        Ok(())
    }

    /// Ingest sorted SST files of segment `id`'s data (moved, not copied),
    /// creating the segment if missing (even with no file to ingest).
    pub fn ingest(&self, id: i64, files: Vec<PathBuf>) -> Result<(), StoreError> {
        let mut segments = self.lock();
        let s = self.segment(&mut segments, id)?;
        Self::ingest_into(s, files)
    }

    /// [`SegmentedStore::ingest`] of several segments (id -> files), side by
    /// side: creating a segment's RocksDB costs a dozen syncs and ingesting
    /// into it a few more, and the disk serves those of several segments at
    /// once (the threads wait on the disk, not on a core). One segment's
    /// ingestion failing leaves the others' done, as one after another would.
    pub fn ingest_all(&self, files: BTreeMap<i64, Vec<PathBuf>>) -> Result<(), StoreError> {
        let mut segments = self.lock();
        let missing: Vec<i64> = files.keys().copied().filter(|id| !segments.contains_key(id)).collect();
        let created = side_by_side(missing, |id| self.create(id).map(|s| (id, s)));
        for r in created {
            let (id, s) = r?;
            segments.insert(id, s);
        }
        let segments = &*segments;
        side_by_side(files, |(id, files)| Self::ingest_into(&segments[&id], files)).into_iter().collect()
    }

    fn ingest_into(s: &Store, files: Vec<PathBuf>) -> Result<(), StoreError> {
        if files.is_empty() {
            return Ok(());
        }
        let mut io = IngestExternalFileOptions::default();
        io.set_move_files(true);
        s.db()
            .ingest_external_file_cf_opts(s.data_cf(), &io, files)
            .map_err(|e| StoreError::rocksdb(s.path(), "ingesting SST files", &e))
    }

    /// Drop the segments expired at the observed stream time (their
    /// directories deleted), as Kafka Streams does when it restores.
    pub fn drop_expired(&self) -> Result<(), StoreError> {
        let Some(t) = self.stream_time() else { return Ok(()) };
        let min_live = self.seg.min_live_segment(t);
        let mut segments = self.lock();
        let expired: Vec<i64> = segments.range(..min_live).map(|(&id, _)| id).collect();
        for id in expired {
            let s = segments.remove(&id).expect("listed above");
            let path = s.path().to_path_buf();
            drop(s);
            std::fs::remove_dir_all(&path)
                .map_err(|e| StoreError::new(&path, format!("cannot delete expired segment: {e}")))?;
        }
        Ok(())
    }

    /// Keep `offset` for `tp` in memory only: a store kept open between
    /// replays (`restore::open_stores`) leaves the data it replayed in the
    /// segments' memtables, and an offset on disk must never cover data that
    /// is not. [`SegmentedStore::offset`] answers it while the store is open;
    /// the next [`SegmentedStore::record`] or [`SegmentedStore::flush`]
    /// records it once every segment is flushed. A crash before then loses
    /// it with the data it covers, or leaves data a memtable flush made
    /// durable ahead of the offset on disk, which a replay from there
    /// converges over.
    pub fn hold(&self, tp: &str, offset: i64) {
        self.held().insert(tp.to_owned(), offset);
    }

    /// Drop expired segments, make every segment's data durable, then record
    /// `offset` (if any) for `tp`, and every offset held in memory
    /// ([`SegmentedStore::hold`]), in every live segment and flush again: an
    /// offset never reaches disk before the data it covers in all segments.
    /// Only segments [`SegmentedStore::write`] wrote into need the first
    /// flush (ingested data is durable already; the status of a new segment
    /// reaches disk with its offset), which spares a bulk restore a flush,
    /// its SST file and its syncs per segment.
    pub fn record(&self, tp: &str, offset: Option<i64>) -> Result<(), StoreError> {
        let mut offsets = std::mem::take(&mut *self.held());
        if let Some(off) = offset {
            offsets.insert(tp.to_owned(), off);
        }
        self.record_offsets(&offsets)
    }

    /// [`SegmentedStore::record`] of `offsets` (none: every segment flushed,
    /// no offset written). If a segment's data cannot be flushed, the
    /// offsets go back to memory and the segments written into stay to be
    /// flushed first: a later record must not write an offset beside data
    /// that is still only in a memtable.
    fn record_offsets(&self, offsets: &BTreeMap<String, i64>) -> Result<(), StoreError> {
        let flushed = self.drop_expired().and_then(|()| self.flush_written(offsets.is_empty()));
        if let Err(e) = flushed {
            let mut held = self.held();
            for (tp, &off) in offsets {
                held.entry(tp.clone()).or_insert(off);
            }
            return Err(e);
        }
        let segments = self.lock();
        if !offsets.is_empty() {
            side_by_side(segments.values(), |s| {
                let mut b = WriteBatch::default();
                for (tp, &off) in offsets {
                    s.put_offset(&mut b, tp, off);
                }
                s.write(b, false)?;
                s.flush()
            })
            .into_iter()
            .collect::<Result<(), _>>()?;
        }
        Ok(())
    }

    /// [`Store::settle_level0`] for every segment.
    pub fn settle_level0(&self, files: u64) {
        self.lock().values().for_each(|s| s.settle_level0(files));
    }

    /// [`Store::compact_all`] for every segment.
    pub fn compact_all(&self) -> Result<(), StoreError> {
        self.lock().values().try_for_each(Store::compact_all)
    }

    /// Flush every segment; offsets held in memory are recorded ([`SegmentedStore::record`]).
    pub fn flush(&self) -> Result<(), StoreError> {
        let held = std::mem::take(&mut *self.held());
        if !held.is_empty() {
            return self.record_offsets(&held);
        }
        let segments = self.lock();
        self.take_unflushed();
        segments.values().try_for_each(Store::flush)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window_key(k: &[u8], start: i64, seq: i32) -> Vec<u8> {
        [k, &start.to_be_bytes(), &seq.to_be_bytes()].concat()
    }

    #[test]
    fn segment_timestamps_come_from_the_key_schema() {
        assert_eq!(KeySchema::Window.segment_timestamp(&window_key(b"abc", 123_456, 7)), Some(123_456));
        let session = [b"k".as_slice(), &900i64.to_be_bytes(), &100i64.to_be_bytes()].concat();
        assert_eq!(KeySchema::Session.segment_timestamp(&session), Some(900), "the end, not the start");
        assert_eq!(KeySchema::Window.segment_timestamp(&[0; 12]), Some(0), "an empty record key is a key");
        assert_eq!(KeySchema::Window.segment_timestamp(&[0; 11]), None);
        assert!(KeySchema::Session.bad_key(&[0; 3]).contains("3 bytes"));
        // an emit-final window store: the changelog's window key rewritten time first
        let mut stored = Vec::new();
        KeySchema::TimeOrderedWindow.store_key(&window_key(b"abc", 0x0102, 7), &mut stored);
        assert_eq!(stored, [&[0u8, 0, 0, 0, 0, 0, 0, 1, 2][..], b"abc", &[0, 0, 0, 7]].concat());
        assert_eq!(KeySchema::TimeOrderedWindow.segment_timestamp(&stored), Some(0x0102));
        assert!(KeySchema::TimeOrderedWindow.rewrites_key() && !KeySchema::Window.rewrites_key());
        let mut empty_key = Vec::new();
        KeySchema::TimeOrderedWindow.store_key(&window_key(b"", 5, 0), &mut empty_key);
        assert_eq!(empty_key.len(), 13, "an empty record key is a key");
        let mut short = Vec::new();
        KeySchema::TimeOrderedWindow.store_key(&[0; 11], &mut short);
        assert_eq!(KeySchema::TimeOrderedWindow.segment_timestamp(&short), None, "refused, not misread");
        assert_eq!(KeySchema::TimeOrderedWindow.segment_timestamp(&[2; 20]), None, "neither base nor index row");
        // an emit-final session store: time first, and an index row key first
        let session = [b"ab".as_slice(), &900i64.to_be_bytes(), &100i64.to_be_bytes()].concat();
        let (mut base, mut index) = (Vec::new(), Vec::new());
        KeySchema::TimeOrderedSession.store_key(&session, &mut base);
        KeySchema::TimeOrderedSession.index_key(&session, &mut index);
        assert_eq!(base, [&[0u8][..], &900i64.to_be_bytes(), &100i64.to_be_bytes(), b"ab"].concat());
        assert_eq!(index, [&[1u8][..], &session].concat());
        assert_eq!(KeySchema::TimeOrderedSession.segment_timestamp(&base), Some(900), "the end");
        assert_eq!(KeySchema::TimeOrderedSession.segment_timestamp(&index), Some(900), "the end, also indexed");
    }

    #[test]
    fn segmentation_is_kafka_s() {
        assert_eq!(Segmentation::dsl_segment_interval(86_400_000), 43_200_000);
        assert_eq!(Segmentation::dsl_segment_interval(60_000), 60_000);
        let s = Segmentation::new(300_000, None).unwrap();
        assert_eq!(s.segment_interval_ms, 150_000);
        assert_eq!(s.segment_id(1_700_000_000_000), 11_333_333);
        assert_eq!(s.segment_name("counts", 11_333_333), "counts.1699999950000");
        assert_eq!(s.segment_of_name("counts", "counts.1699999950000"), Ok(Some(11_333_333)));
        assert_eq!(s.segment_of_name("counts", "counts.position"), Ok(None));
        assert_eq!(s.segment_of_name("counts", "other.1699999950000"), Ok(None));
        assert!(s.segment_of_name("counts", "counts.1699999960000").unwrap_err().contains("segment interval"));
        // live: segmentId >= segmentId(streamTime - retention)
        assert_eq!(s.min_live_segment(1_000_000), 4);
        assert!(Segmentation::new(0, None).is_err() && Segmentation::new(1000, Some(0)).is_err());
    }

    #[test]
    fn segments_are_named_by_their_start() {
        assert_eq!(segment_start("counts", "counts.1699999950000"), Some(1_699_999_950_000));
        assert_eq!(segment_start("counts", "counts.0"), Some(0));
        for other in ["counts.position", "counts.", "counts.-60000", "counts.+1", "other.60000", "counts:60000"] {
            assert_eq!(segment_start("counts", other), None, "{other}");
        }
    }

    #[test]
    fn a_read_only_view_reads_offsets_from_the_newest_segment_that_has_one() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("win");
        let seg = Segmentation::new(600_000, Some(60_000)).unwrap();
        let opts = crate::store::store_options(true);
        let s = SegmentedStore::open(&p, StoreFormat::Window, seg, opts, true).unwrap();
        let (a, b) = (window_key(b"a", 60_000, 0), window_key(b"b", 180_000, 0));
        s.observe(180_000);
        s.write([(a.as_slice(), Some(b"1".as_slice())), (b.as_slice(), Some(b"2".as_slice()))]).unwrap();
        s.record("t-0", Some(5)).unwrap();
        drop(s);
        std::fs::write(p.join("win.position"), b"not a segment").unwrap();
        // an older segment records a later offset of another partition: only the newest counts per partition
        let old = Store::open(&p.join("win.60000"), false).unwrap();
        let mut batch = WriteBatch::default();
        old.put_offset(&mut batch, "t-0", 99);
        old.put_offset(&mut batch, "t-1", 7);
        old.write(batch, true).unwrap();
        drop(old);
        let view = SegmentsReadOnly::open(&p).unwrap();
        assert_eq!(view.segments.iter().map(|(start, _)| *start).collect::<Vec<_>>(), vec![60_000, 180_000]);
        assert_eq!(view.db_format().unwrap(), Some(StoreFormat::Plain));
        assert_eq!(view.offsets().unwrap(), BTreeMap::from([("t-0".to_string(), 5), ("t-1".to_string(), 7)]));
        drop(view);
        Store::open_format(&p.join("win.240000"), crate::store::store_options(true), StoreFormat::Timestamped).unwrap();
        let e = SegmentsReadOnly::open(&p).err().unwrap().to_string();
        assert!(e.contains("different formats") && e.contains("win.240000"), "{e}");
    }

    #[test]
    fn records_go_to_their_live_segments_and_expired_segments_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("win");
        let seg = Segmentation::new(200_000, Some(100_000)).unwrap();
        let opts = crate::store::store_options(true);
        let s = SegmentedStore::open(&p, StoreFormat::TimestampedWindow, seg, opts.clone(), true).unwrap();
        let (a, b, c) = (window_key(b"a", 50_000, 0), window_key(b"b", 150_000, 0), window_key(b"c", 450_000, 0));
        s.observe(150_000);
        s.write([(a.as_slice(), Some(b"1".as_slice())), (b.as_slice(), Some(b"2".as_slice()))]).unwrap();
        assert_eq!(s.segment_ids(), vec![0, 1]);
        s.observe(450_000); // live from segmentId(250_000) = 2
        assert_eq!(s.route(&a), Ok(None));
        s.write([(c.as_slice(), None)]).unwrap();
        s.record("t-0", Some(9)).unwrap();
        assert_eq!(s.segment_ids(), vec![4], "a tombstone's segment exists, expired ones are gone");
        assert!(!p.join("win.0").exists() && !p.join("win.100000").exists() && p.join("win.400000").exists());
        drop(s);
        let s = SegmentedStore::open(&p, StoreFormat::TimestampedWindow, seg, opts.clone(), false).unwrap();
        assert_eq!(s.offset("t-0").unwrap(), Some(9));
        assert_eq!(s.stream_time(), Some(400_000), "reopened: at least the newest segment's start");
        assert_eq!(s.route(&window_key(b"x", 199_999, 0)), Ok(None), "expired: before segmentId(200_000)");
        assert_eq!(s.route(&window_key(b"x", 200_000, 0)), Ok(Some(2)));
        let seg4 = Store::open_read_only(&p.join("win.400000")).unwrap();
        assert_eq!(seg4.format(), StoreFormat::Timestamped);
        assert_eq!(seg4.status().unwrap(), Some(STATUS_CLOSED));
        drop((s, seg4));
        let e = SegmentedStore::open(
            &p,
            StoreFormat::Session,
            Segmentation::new(200_000, Some(30_000)).unwrap(),
            opts,
            false,
        )
        .err()
        .unwrap();
        assert!(e.to_string().contains("segment interval"), "{e}");
    }
}
