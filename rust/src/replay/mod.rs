//! Replay: a changelog partition applied to a store one large `WriteBatch`
//! per read chunk, with the write-ahead log off and the offset of the last
//! applied record in the same batch, so whatever RocksDB has flushed (both
//! column families together, `atomic_flush`) is a committed prefix of the log
//! with its exact offset.
//!
//! This module also holds what the two restore modes share: the error type,
//! the throttled progress listener and the record counts. [`engine`] picks the
//! mode, the start and the end, and runs many restores on a thread pool.

pub mod ceiling;
pub mod engine;
pub mod feed;
mod progress;

pub use progress::{Listener, Progress};

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, sync_channel};

use rocksdb::{DBCompressionType, Options, WriteBatch};

use crate::bulk::collect::{sort_by_key, Collector};
use crate::source::{ChangeRecord, ChangelogSource, LogError, LogErrorKind};
use crate::store::{store_options, Store, StoreError, StoreFormat};

/// Bytes of log one replay `WriteBatch` covers by default. Large on
/// purpose: a batch keeps only the last operation of each key, so the more
/// log it covers, the fewer writes reach RocksDB when keys repeat (a
/// changelog with ~10 updates a key replays twice as fast with 64 MiB
/// batches as with 4 MiB ones). Building a batch holds about 2.5 times this
/// in memory. With the WAL off nothing reaches disk before a memtable
/// flush, so a larger batch does not put more work at risk in a crash.
pub const DEFAULT_CHUNK_BYTES: usize = 64 << 20;

/// Most bytes of log asked of a source at a time; a replay batch gathers
/// reads up to its chunk size.
pub const READ_BYTES: usize = 4 << 20;

/// Why a restore stopped, by what the caller should do about it (each maps
/// to one class of `statestore.errors`, see `py::errors`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The restore itself could not go on (bad range, listener raised...).
    Restore,
    /// RocksDB refused to open, read or write the store.
    Store,
    /// The changelog holds bytes that are not a valid record batch.
    CorruptLog,
    /// A batch uses a compression codec this build cannot decode.
    UnsupportedCompression,
    /// Any other problem with the changelog (missing partition, I/O).
    Log,
    /// The progress listener raised; the restore stopped cleanly.
    Listener,
    /// The store's offset lies outside the changelog (records deleted, topic
    /// recreated, store ahead): its state cannot be trusted, wipe and restore.
    OutOfRange,
    /// The store's files are damaged (RocksDB `Corruption`): wipe and restore.
    StoreCorrupted,
}

impl ErrorKind {
    /// The kind of a restore stopped by `e` from its changelog.
    pub fn of_log(e: &LogError) -> Self {
        match e.kind {
            LogErrorKind::Corrupt => ErrorKind::CorruptLog,
            LogErrorKind::UnsupportedCompression => ErrorKind::UnsupportedCompression,
            LogErrorKind::OutOfRange => ErrorKind::OutOfRange,
            _ => ErrorKind::Log,
        }
    }
}

/// Why a restore stopped. The message names the store, the topic partition
/// and the offset, and says what the store holds now; the fields carry the
/// same facts for tools (filled by the engine for every restore error).
#[derive(Debug, Clone)]
pub struct RestoreError {
    pub kind: ErrorKind,
    pub message: String,
    /// The file the error is about: a log segment, else the store.
    pub path: Option<PathBuf>,
    pub topic: Option<String>,
    pub partition: Option<i32>,
    /// The changelog offset the error is about (where the restore stopped).
    pub offset: Option<i64>,
}

impl RestoreError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into(), path: None, topic: None, partition: None, offset: None }
    }

    /// The same error, about `offset`.
    pub fn with_offset(mut self, offset: i64) -> Self {
        self.offset = Some(offset);
        self
    }

    /// Fill what is not known yet: the store's path and the partition restored.
    pub fn in_restore_of(mut self, store_path: &Path, topic: &str, partition: i32) -> Self {
        self.path.get_or_insert_with(|| store_path.to_path_buf());
        self.topic.get_or_insert_with(|| topic.to_string());
        self.partition.get_or_insert(partition);
        self
    }

    /// A store error, re-worded to name the topic partition too.
    /// Damaged store files become [`ErrorKind::StoreCorrupted`].
    pub fn store(tp: &str, e: StoreError) -> Self {
        let path = e.path.clone();
        let kind = if e.corruption { ErrorKind::StoreCorrupted } else { ErrorKind::Store };
        let mut r = Self::new(kind, format!("restoring {tp}: {e}"));
        r.path = Some(path);
        r
    }

    /// A changelog error, with `context` in front of its message.
    pub fn log(e: LogError, context: impl fmt::Display) -> Self {
        let mut r = Self::new(ErrorKind::of_log(&e), format!("{context}: {e}"));
        r.path = e.path;
        r.offset = e.offset;
        r
    }

    /// A source error at `position`, naming the store and the partition.
    pub fn source(store: &Store, tp: &str, position: i64, e: LogError) -> Self {
        let offset = e.offset.unwrap_or(position);
        let mut r = Self::new(
            ErrorKind::of_log(&e),
            format!(
                "restoring store {} from {tp} stopped at offset {position}: {e}; \
                 the store keeps its last committed state, restore again once the log is repaired",
                store.path().display()
            ),
        );
        r.path = e.path;
        r.offset = Some(offset);
        r
    }
}

impl fmt::Display for RestoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RestoreError {}

/// What a restore pass (replay or bulk) writes and how far: the store, the
/// partition it restores as `"<topic>-<partition>"` (the key of its offset),
/// and the exclusive end offset.
#[derive(Clone, Copy)]
pub struct Target<'a> {
    pub store: &'a Store,
    pub tp: &'a str,
    pub end: i64,
}

/// What one replay or bulk pass applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    /// Committed data records with a key (puts and tombstones).
    pub records: u64,
    /// Committed data records without a key: skipped.
    pub null_keys: u64,
    /// Offset of the last committed data record consumed (the one recorded
    /// in the store), if any.
    pub last_offset: Option<i64>,
}

impl Applied {
    /// Count `records` more applied, up to the record at `last_offset` (if
    /// any record was consumed), and tell the listener.
    pub fn add(
        &mut self,
        last_offset: Option<i64>,
        records: u64,
        progress: &mut Progress<'_>,
    ) -> Result<(), RestoreError> {
        if let Some(off) = last_offset {
            self.records += records;
            self.last_offset = Some(off);
            progress.batch(off, records)?;
        }
        Ok(())
    }
}

/// Memtable size of a store opened for restoring.
pub const DEFAULT_WRITE_BUFFER_BYTES: usize = 64 << 20;

/// Options a store is opened with for restoring: big memtables so flushes are
/// few and large, no compression (as Kafka Streams), two background jobs.
/// `atomic_flush` and the column families are enforced by [`Store::open_with`].
pub fn restore_options() -> Options {
    restore_options_with(DEFAULT_WRITE_BUFFER_BYTES)
}

/// [`restore_options`] with another memtable size. With the WAL off, replay
/// progress reaches disk when memtables are flushed, so smaller memtables
/// mean less work lost to a crash (and more, smaller files).
pub fn restore_options_with(write_buffer_bytes: usize) -> Options {
    let mut o = store_options(true);
    o.set_write_buffer_size(write_buffer_bytes.max(64 << 10));
    o.set_max_write_buffer_number(4);
    o.set_max_background_jobs(2);
    o.set_compression_type(DBCompressionType::None);
    o.set_level_zero_slowdown_writes_trigger(40);
    o.set_level_zero_stop_writes_trigger(64);
    o
}

/// Replay `source` into `store` up to `end` (exclusive): one `WriteBatch` per
/// chunk of about `chunk_bytes` of log (read [`READ_BYTES`] at a time),
/// written without WAL, holding the data and the offset of the last record it
/// applies. Flushes both column families at the end, and also when stopping
/// on an error, so the store on disk is always a committed prefix with its
/// offset (a chunk the error cut short is not written).
///
/// With `read_ahead` the next chunk is read, decoded and gathered on a
/// second thread while this one sorts and writes the current one: two chunks
/// in memory instead of one, the same batches in the same order.
pub fn replay(
    target: Target<'_>,
    source: &mut dyn ChangelogSource,
    chunk_bytes: usize,
    read_ahead: bool,
    progress: &mut Progress<'_>,
) -> Result<Applied, RestoreError> {
    let Target { store, tp, .. } = target;
    let mut applied = Applied::default();
    let result = replay_chunks(target, source, chunk_bytes, read_ahead, progress, &mut applied);
    progress.read_all();
    let flushed = store.flush().map_err(|e| RestoreError::store(tp, e));
    result?;
    flushed?;
    Ok(applied)
}

/// Gather the next chunk of `source` below `end` (about `chunk_bytes` of
/// log, read [`READ_BYTES`] at a time) into `ops`; whether more follows.
fn gather(
    ops: &mut ChunkOps,
    source: &mut dyn ChangelogSource,
    end: i64,
    chunk_bytes: usize,
    format: StoreFormat,
) -> Result<bool, LogError> {
    ops.clear();
    let first = source.bytes_read();
    let mut more = true;
    while more {
        let read = usize::try_from(source.bytes_read().saturating_sub(first)).unwrap_or(usize::MAX);
        if read >= chunk_bytes {
            break;
        }
        more = ops.read(source, end, (chunk_bytes - read).min(READ_BYTES), format)?;
    }
    Ok(more)
}

/// Write a gathered chunk as one batch with its offset, and report it.
fn apply(
    ops: &mut ChunkOps,
    target: Target<'_>,
    progress: &mut Progress<'_>,
    applied: &mut Applied,
) -> Result<(), RestoreError> {
    let Target { store, tp, .. } = target;
    if let Some(off) = ops.last_offset() {
        let mut batch = ops.to_batch(store);
        store.put_offset(&mut batch, tp, off);
        store.write(batch, false).map_err(|e| RestoreError::store(tp, e))?;
        applied.null_keys += ops.null_keys();
    }
    applied.add(ops.last_offset(), ops.len() as u64, progress)
}

fn replay_chunks(
    target: Target<'_>,
    source: &mut dyn ChangelogSource,
    chunk_bytes: usize,
    read_ahead: bool,
    progress: &mut Progress<'_>,
    applied: &mut Applied,
) -> Result<(), RestoreError> {
    let (end, format) = (target.end, target.store.format());
    for_each_chunk(
        target,
        source,
        // The next chunk is handed over when this thread takes it: at most two exist.
        read_ahead.then_some(0),
        |ops: &mut ChunkOps, source| gather(ops, source, end, chunk_bytes, format),
        |ops| apply(ops, target, progress, applied),
    )
}

/// Fill chunks of `source` with `fill` (whether more follows) and hand each
/// to `take`, in log order, until the log ends: what replay and bulk share.
///
/// With `ahead`, the filling runs on a second thread while `take` works on
/// this one, with up to that many filled chunks waiting to be taken; taken
/// chunks go back to be filled again (a fresh multi-MiB buffer per chunk
/// costs a page fault and the zeroing of every page). Either way a fill that
/// fails reaches `take`'s side after every chunk before it, as an error
/// naming the store, partition and position; when `take` fails the reader
/// stops at its next hand-over.
pub(crate) fn for_each_chunk<C, E>(
    target: Target<'_>,
    source: &mut dyn ChangelogSource,
    ahead: Option<usize>,
    mut fill: impl FnMut(&mut C, &mut dyn ChangelogSource) -> Result<bool, LogError> + Send,
    mut take: impl FnMut(&mut C) -> Result<(), E>,
) -> Result<(), E>
where
    C: Default + Send,
    E: From<RestoreError>,
{
    let Target { store, tp, .. } = target;
    let Some(waiting) = ahead else {
        let mut chunk = C::default();
        loop {
            let more = fill(&mut chunk, source).map_err(|e| RestoreError::source(store, tp, source.position(), e))?;
            take(&mut chunk)?;
            if !more {
                return Ok(());
            }
        }
    };
    std::thread::scope(|scope| {
        let (filled_tx, filled) = sync_channel::<Result<C, RestoreError>>(waiting);
        let (spent, reuse) = channel::<C>();
        scope.spawn(move || loop {
            let mut chunk = reuse.try_recv().unwrap_or_default();
            let (msg, more) = match fill(&mut chunk, source) {
                Ok(more) => (Ok(chunk), more),
                Err(e) => (Err(RestoreError::source(store, tp, source.position(), e)), false),
            };
            if filled_tx.send(msg).is_err() || !more {
                return;
            }
        });
        // Leaving this loop early (an error) drops `filled`: the reader then stops.
        for msg in filled {
            let mut chunk = msg?;
            take(&mut chunk)?;
            let _ = spent.send(chunk); // the reader may be done: then the buffers are dropped
        }
        Ok(())
    })
}

/// The operations of one chunk, turned into a `WriteBatch` in key order with
/// only the last operation per key: the batch is applied atomically, so the
/// result is the same as applying every operation in log order, and a
/// memtable takes sorted keys much faster than random ones.
#[derive(Default)]
pub struct ChunkOps {
    data: Vec<u8>,
    /// `(key offset, key length, value length or u32::MAX for a tombstone)`;
    /// the value follows its key in `data`.
    ops: Vec<(usize, u32, u32)>,
    /// Open-addressing index of the chunk's keys (kept between chunks): per
    /// slot, 1 + the index of the key's last operation; 0 is empty.
    slots: Vec<u32>,
    /// Index of the last operation of each key.
    last: Vec<u32>,
    /// Those indices in key order, each with the 8 bytes of its key that
    /// follow the prefix every key of the chunk shares (compared first).
    order: Vec<(u64, u32)>,
    /// Offset of the last committed data record read into the chunk.
    last_offset: Option<i64>,
    /// Records read into the chunk without a key (skipped).
    null_keys: u64,
}

impl ChunkOps {
    pub fn clear(&mut self) {
        self.data.clear();
        self.ops.clear();
        self.last_offset = None;
        self.null_keys = 0;
    }

    /// Add the records of one read of `source` (about `max_bytes` of log
    /// below `end`) as a store of `format` keeps them; whether more follows.
    pub fn read(
        &mut self,
        source: &mut dyn ChangelogSource,
        end: i64,
        max_bytes: usize,
        format: StoreFormat,
    ) -> Result<bool, LogError> {
        source.next_chunk(end, max_bytes, &mut |r| {
            self.last_offset = Some(r.offset);
            match r.key {
                None => self.null_keys += 1,
                Some(k) => self.push_record(format, k, &r),
            }
        })
    }

    /// Offset of the last committed data record read since [`ChunkOps::clear`].
    pub fn last_offset(&self) -> Option<i64> {
        self.last_offset
    }

    /// Records without a key read since [`ChunkOps::clear`] (they are skipped).
    pub fn null_keys(&self) -> u64 {
        self.null_keys
    }

    /// Operations pushed (not deduplicated).
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The `i`-th operation pushed, in log order.
    pub fn get(&self, i: usize) -> (&[u8], Option<&[u8]>) {
        let (at, kl, vl) = self.ops[i];
        let v0 = at + kl as usize;
        (&self.data[at..v0], (vl != u32::MAX).then(|| &self.data[v0..v0 + vl as usize]))
    }

    /// Push one changelog record as a store of `format` keeps it (a
    /// timestamped store's value starts with the record's timestamp).
    pub fn push_record(&mut self, format: StoreFormat, key: &[u8], r: &ChangeRecord<'_>) {
        match (format, r.value) {
            (StoreFormat::Timestamped, Some(v)) => {
                let at = self.data.len();
                self.data.extend_from_slice(key);
                format.encode_value(r.timestamp, v, &mut self.data);
                self.ops.push((at, key.len() as u32, (v.len() + 8) as u32));
            }
            _ => self.push(key, r.value),
        }
    }

    pub fn push(&mut self, key: &[u8], value: Option<&[u8]>) {
        let at = self.data.len();
        self.data.extend_from_slice(key);
        let vlen = match value {
            Some(v) => {
                self.data.extend_from_slice(v);
                v.len() as u32
            }
            None => u32::MAX,
        };
        self.ops.push((at, key.len() as u32, vlen));
    }

    /// Keep the last operation of each key (found by hashing: a chunk
    /// holds many operations per key when keys repeat, and sorting them all
    /// cost more than the writes), sort those by key (as the bulk collector
    /// does, [`sort_by_key`]: a large chunk of unique keys sorts nearly as
    /// fast per key as a small one), and build the batch of `store`'s data
    /// column family.
    pub fn to_batch(&mut self, store: &Store) -> WriteBatch {
        let cf = store.data_cf();
        self.find_last_per_key();
        let Self { data, ops, last, order, .. } = &mut *self;
        sort_by_key(
            order,
            || last.iter().copied(),
            |i| {
                let (at, kl, _) = ops[i as usize];
                &data[at..at + kl as usize]
            },
        );
        let mut batch = WriteBatch::default();
        for &(_, i) in &self.order {
            match self.get(i as usize) {
                (k, Some(v)) => batch.put_cf(cf, k, v),
                (k, None) => batch.delete_cf(cf, k),
            }
        }
        batch
    }

    /// Fill `last` with the index of the last operation of each key (in no order).
    fn find_last_per_key(&mut self) {
        let Self { data, ops, slots, last, .. } = self;
        let key = |i: u32| {
            let (at, kl, _) = ops[i as usize];
            &data[at..at + kl as usize]
        };
        let size = (ops.len() * 2).next_power_of_two().max(16);
        slots.clear();
        slots.resize(size, 0);
        let mask = size - 1;
        for i in 0..ops.len() as u32 {
            let k = key(i);
            let mut at = Collector::hash(k) as usize & mask;
            loop {
                match slots[at] {
                    0 => break,
                    e if key(e - 1) == k => break,
                    _ => at = (at + 1) & mask,
                }
            }
            slots[at] = i + 1; // a later operation of the same key wins
        }
        last.clear();
        last.extend(slots.iter().filter(|&&e| e != 0).map(|&e| e - 1));
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! A vector-backed [`ChangelogSource`] and a model of the committed log,
    //! for the restore engine's own tests.

    use std::collections::BTreeMap;

    use crate::source::{ChangeRecord, ChangelogSource, LogError, LogErrorKind, SkipCounts};

    /// The timestamp a [`VecSource`] gives the record at `offset`.
    pub fn ts_of(offset: i64) -> i64 {
        1_700_000_000_000 + offset * 7
    }

    /// One log entry as the source sees it.
    #[derive(Debug, Clone)]
    pub enum Entry {
        Data { key: Option<Vec<u8>>, value: Option<Vec<u8>> },
        Aborted,
        Control,
    }

    pub struct VecSource {
        pub log: Vec<Entry>,
        pub pos: i64,
        pub skipped: SkipCounts,
        pub bytes: u64,
        /// Fail with a corrupt-log error when reaching this offset.
        pub fail_at: Option<i64>,
    }

    impl VecSource {
        pub fn new(log: Vec<Entry>, start: i64) -> Self {
            Self { log, pos: start, skipped: SkipCounts::default(), bytes: 0, fail_at: None }
        }
    }

    impl ChangelogSource for VecSource {
        fn position(&self) -> i64 {
            self.pos
        }
        fn next_chunk(
            &mut self,
            end: i64,
            max_bytes: usize,
            sink: &mut dyn FnMut(ChangeRecord<'_>),
        ) -> Result<bool, LogError> {
            let end = end.min(self.log.len() as i64);
            let mut used = 0usize;
            while self.pos < end && used < max_bytes.max(1) {
                if self.fail_at == Some(self.pos) {
                    return Err(LogError::new(LogErrorKind::Corrupt, format!("bad batch at offset {}", self.pos)));
                }
                match &self.log[self.pos as usize] {
                    Entry::Data { key, value } => {
                        used += 16 + key.as_ref().map_or(0, Vec::len) + value.as_ref().map_or(0, Vec::len);
                        sink(ChangeRecord {
                            offset: self.pos,
                            timestamp: ts_of(self.pos),
                            key: key.as_deref(),
                            value: value.as_deref(),
                        });
                    }
                    Entry::Aborted => {
                        used += 16;
                        self.skipped.aborted += 1;
                    }
                    Entry::Control => {
                        used += 16;
                        self.skipped.control += 1;
                    }
                }
                self.pos += 1;
            }
            self.bytes += used as u64;
            Ok(self.pos < end)
        }
        fn skipped(&self) -> SkipCounts {
            self.skipped
        }
        fn bytes_read(&self) -> u64 {
            self.bytes
        }
    }

    /// The store a committed log prefix `[0, end)` must produce, and its offset.
    pub fn model(log: &[Entry], end: i64) -> (BTreeMap<Vec<u8>, Vec<u8>>, Option<i64>) {
        let mut m = BTreeMap::new();
        let mut last = None;
        for (off, e) in log.iter().enumerate().take(end as usize) {
            if let Entry::Data { key, value } = e {
                last = Some(off as i64);
                match (key, value) {
                    (Some(k), Some(v)) => {
                        m.insert(k.clone(), v.clone());
                    }
                    (Some(k), None) => {
                        m.remove(k);
                    }
                    (None, _) => {}
                }
            }
        }
        (m, last)
    }

    /// A deterministic pseudo-random log with overwrites, tombstones, null
    /// keys, aborted records and markers.
    pub fn random_log(n: usize, keys: u64, seed: u64) -> Vec<Entry> {
        let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407) | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        (0..n)
            .map(|_| {
                let r = next();
                match r % 100 {
                    0..=4 => Entry::Aborted,
                    5..=7 => Entry::Control,
                    8 => Entry::Data { key: None, value: Some(b"nk".to_vec()) },
                    9..=20 => Entry::Data { key: Some(format!("k{:05}", next() % keys).into_bytes()), value: None },
                    _ => {
                        let len = (next() % 40) as usize;
                        Entry::Data {
                            key: Some(format!("k{:05}", next() % keys).into_bytes()),
                            value: Some(vec![(r >> 8) as u8; len]),
                        }
                    }
                }
            })
            .collect()
    }

    /// Everything in a store's data column family.
    /// [`model`] as a timestamped store holds it: each value behind its record's timestamp.
    pub fn model_timestamped(log: &[Entry], end: i64) -> BTreeMap<Vec<u8>, Vec<u8>> {
        let mut m = BTreeMap::new();
        for (off, e) in log.iter().enumerate().take(end as usize) {
            if let Entry::Data { key: Some(k), value } = e {
                match value {
                    Some(v) => {
                        let mut stored = ts_of(off as i64).to_be_bytes().to_vec();
                        stored.extend_from_slice(v);
                        m.insert(k.clone(), stored);
                    }
                    None => {
                        m.remove(k);
                    }
                }
            }
        }
        m
    }

    /// The data column family of `store`, in key order.
    pub fn dump(store: &crate::store::Store) -> BTreeMap<Vec<u8>, Vec<u8>> {
        store
            .db()
            .iterator_cf(store.data_cf(), rocksdb::IteratorMode::Start)
            .map(|kv| {
                let (k, v) = kv.unwrap();
                (k.to_vec(), v.to_vec())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::testing::*;
    use super::*;

    #[test]
    fn replay_equals_model_and_records_offset_in_small_chunks() {
        let log = random_log(3000, 300, 7);
        let (m, last) = model(&log, 3000);
        for read_ahead in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open_with(&dir.path().join("s"), restore_options()).unwrap();
            let mut src = VecSource::new(log.clone(), 0);
            let mut p = Progress::new(None, Duration::ZERO);
            let a = replay(Target { store: &store, tp: "t-0", end: 3000 }, &mut src, 200, read_ahead, &mut p).unwrap();
            assert_eq!(dump(&store), m, "read-ahead {read_ahead}");
            assert_eq!(store.offset("t-0").unwrap(), last);
            assert_eq!(a.last_offset, last);
            assert!(a.null_keys > 0 && src.skipped.aborted > 0);
            assert_eq!(src.position(), 3000, "read-ahead {read_ahead}: the source is where the reader left it");
        }
    }

    #[test]
    fn replay_gathers_several_reads_into_one_batch_when_its_chunk_is_larger_than_a_read() {
        // ~6 MiB of log: a 5 MiB chunk is two reads (READ_BYTES, then the rest of the chunk)
        let n = 150_000;
        let log = random_log(n, 5_000, 13);
        let dir = tempfile::tempdir().unwrap();
        struct Batches(usize);
        impl Listener for Batches {
            fn on_start(&mut self, _: i64, _: i64) -> Result<(), String> {
                Ok(())
            }
            fn on_batch(&mut self, _: i64, _: u64) -> Result<(), String> {
                self.0 += 1;
                Ok(())
            }
            fn on_end(&mut self, _: u64) -> Result<(), String> {
                Ok(())
            }
        }
        for (name, chunk, batches, read_ahead) in [
            ("gathered", 5 << 20, 2, false),
            ("default", DEFAULT_CHUNK_BYTES, 1, false),
            ("gathered-ahead", 5 << 20, 2, true),
        ] {
            let store = Store::open_with(&dir.path().join(name), restore_options()).unwrap();
            let mut src = VecSource::new(log.clone(), 0);
            let mut counted = Batches(0);
            let mut p = Progress::new(Some(&mut counted), Duration::ZERO);
            let target = Target { store: &store, tp: "t-0", end: n as i64 };
            let a = replay(target, &mut src, chunk, read_ahead, &mut p).unwrap();
            assert!(src.bytes > (READ_BYTES + (1 << 20)) as u64, "{name}: the log is larger than a read");
            assert!(src.bytes < (5 << 20) + READ_BYTES as u64, "{name}: two 5 MiB chunks at most");
            assert_eq!(counted.0, batches, "{name}: one write per chunk, not per read");
            let (m, last) = model(&log, n as i64);
            assert_eq!(dump(&store), m, "{name}");
            assert_eq!(store.offset("t-0").unwrap(), last, "{name}");
            assert_eq!(a.last_offset, last, "{name}");
        }
    }

    #[test]
    fn chunk_ops_sort_keys_bytewise_whatever_their_shared_prefix_and_lengths() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_with(&dir.path().join("s"), restore_options()).unwrap();
        let shapes: [&[u8]; 12] = [
            b"ns:",
            b"ns:a",
            b"ns:a\0",
            b"ns:a\0\0",
            b"ns:ab",
            b"ns:abcdefgh",
            b"ns:abcdefghi",
            b"ns:abcdefgh\xff",
            b"ns:abcdefghij",
            b"ns:b",
            b"ns:\xff",
            b"ns:\xff\xff\xff\xff\xff\xff\xff\xff\x01",
        ];
        let mut ops = ChunkOps::default();
        for (n, i) in [7usize, 3, 11, 0, 5, 9, 1, 3, 10, 2, 8, 4, 6, 0].into_iter().enumerate() {
            ops.push(shapes[i], Some(format!("{n}").as_bytes()));
        }
        let _ = ops.to_batch(&store);
        let got: Vec<&[u8]> = ops.order.iter().map(|&(_, i)| ops.get(i as usize).0).collect();
        let mut want = shapes.to_vec();
        want.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn chunk_ops_keep_the_last_operation_per_key_in_log_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_with(&dir.path().join("s"), restore_options()).unwrap();
        let mut ops = ChunkOps::default();
        ops.push(b"b", Some(b"1"));
        ops.push(b"a", Some(b"1"));
        ops.push(b"b", None);
        ops.push(b"c", None);
        ops.push(b"c", Some(b"3"));
        ops.push(b"a", Some(b"2"));
        ops.push(b"d", Some(b"4"));
        ops.push(b"d", Some(b"5"));
        assert_eq!(ops.len(), 8);
        store.write(ops.to_batch(&store), false).unwrap();
        let got: Vec<(Vec<u8>, Vec<u8>)> = dump(&store).into_iter().collect();
        assert_eq!(
            got,
            vec![(b"a".to_vec(), b"2".to_vec()), (b"c".to_vec(), b"3".to_vec()), (b"d".to_vec(), b"5".to_vec())]
        );
    }

    #[test]
    fn a_source_error_keeps_the_applied_prefix_with_its_offset() {
        let log = random_log(2000, 100, 9);
        for read_ahead in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("s");
            {
                let store = Store::open_with(&p, restore_options()).unwrap();
                let mut src = VecSource::new(log.clone(), 0);
                src.fail_at = Some(1500);
                let mut pr = Progress::new(None, Duration::ZERO);
                let target = Target { store: &store, tp: "t-0", end: 2000 };
                let e = replay(target, &mut src, 100, read_ahead, &mut pr).unwrap_err();
                assert_eq!(e.kind, ErrorKind::CorruptLog);
                assert_eq!(e.offset, Some(1500), "read-ahead {read_ahead}: the offset it stopped at");
                assert!(e.message.contains("t-0") && e.message.contains(&p.display().to_string()), "{e}");
            }
            let store = Store::open(&p, false).unwrap();
            let off = store.offset("t-0").unwrap().unwrap();
            assert!(off < 1500);
            assert_eq!(dump(&store), model(&log, off + 1).0, "read-ahead {read_ahead}");
        }
    }

    #[test]
    fn a_failing_write_side_stops_the_reader_and_keeps_a_committed_prefix() {
        // A listener that refuses the third batch stops the replay there; the reader thread ends.
        struct StopAt(u32);
        impl Listener for StopAt {
            fn on_start(&mut self, _: i64, _: i64) -> Result<(), String> {
                Ok(())
            }
            fn on_batch(&mut self, _: i64, _: u64) -> Result<(), String> {
                self.0 -= 1;
                if self.0 == 0 {
                    return Err("stop".into());
                }
                Ok(())
            }
            fn on_end(&mut self, _: u64) -> Result<(), String> {
                Ok(())
            }
        }
        let log = random_log(5000, 200, 17);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        {
            let store = Store::open_with(&p, restore_options()).unwrap();
            let mut src = VecSource::new(log.clone(), 0);
            let mut stop = StopAt(3);
            let mut pr = Progress::new(Some(&mut stop), Duration::ZERO);
            let target = Target { store: &store, tp: "t-0", end: 5000 };
            replay(target, &mut src, 300, true, &mut pr).unwrap_err();
            assert!(src.position() < 5000, "the reader stopped early");
        }
        let store = Store::open(&p, false).unwrap();
        let off = store.offset("t-0").unwrap().unwrap();
        assert_eq!(dump(&store), model(&log, off + 1).0);
    }
}
