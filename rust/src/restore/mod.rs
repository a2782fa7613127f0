//! Restoring a store from its changelog partition: the engine ([`engine`])
//! decides where to start and end and which mode to use, and runs many
//! restores on a pool of threads; the two modes are [`replay`] (one large
//! `WriteBatch` per chunk of log, the offset in the same batch) and [`bulk`]
//! (last value per key, sorted SST files, one ingestion), both writing
//! into a [`dest::Dest`]: one RocksDB, or the live time segments of a window
//! or session store. [`feed`] is a
//! source over chunks a client hands out (a changelog reached through
//! Python).
//!
//! This file holds what the engine and both modes share: the error type
//! ([`RestoreError`]), what a pass writes ([`Target`]) and applied
//! ([`Applied`]), the throttled progress listener ([`Progress`]), the options
//! a store is restored with, and the loop that hands chunks of log from a
//! reader (on a second thread, with read-ahead) to a writer
//! (`for_each_chunk`). [`chunk::ChunkOps`] is the decoded chunk both modes
//! read the log into.

pub mod bulk;
pub mod chunk;
pub mod dest;
pub mod engine;
pub mod feed;
pub mod open_stores;
mod progress;
pub mod replay;
#[cfg(test)]
pub(crate) mod testing;

pub use progress::{Listener, Progress};

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, sync_channel};

use rocksdb::{DBCompressionType, Options};

use crate::source::{ChangelogSource, LogError, LogErrorKind};
use crate::store::{kafka_streams_table, store_options, StoreError};
pub use dest::Dest;

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
    /// The changelog's cluster gave no answer in time: the store is as the
    /// restore left it, and a later restore may go on from there.
    Unavailable,
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
            LogErrorKind::Unavailable => ErrorKind::Unavailable,
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

    /// A source error at `position`, naming the store (at `store`) and the partition.
    pub fn source(store: &Path, tp: &str, position: i64, e: LogError) -> Self {
        let offset = e.offset.unwrap_or(position);
        let mut r = Self::new(
            ErrorKind::of_log(&e),
            format!(
                "restoring store {} from {tp} stopped at offset {position}: {e}; \
                 the store keeps its last committed state, restore again once the log is repaired",
                store.display()
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
    pub store: &'a Dest,
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
    /// Time spent merging the store at the end ([`replay::Handover::Compacted`]).
    pub merge: std::time::Duration,
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

/// Largest memtable of a store opened for restoring (RocksDB's default).
pub const MAX_WRITE_BUFFER_BYTES: usize = 64 << 20;
/// Smallest memtable a restore's memory budget gives a store.
const MIN_WRITE_BUFFER_BYTES: usize = 1 << 20;
/// Memtables a store opened for restoring may hold: one being written, the
/// others waiting for or in their flush.
const MEMTABLES: usize = 4;
/// Level-0 bytes that start a compaction into level 1: RocksDB's default
/// (four files of 64 MiB, and its `max_bytes_for_level_base`). Smaller
/// memtables make more level-0 files of the same total, not earlier
/// compactions ([`restore_options_with`]).
const LEVEL0_BYTES: usize = 256 << 20;

/// How a replay shares its memory budget: half for RocksDB's memtables
/// ([`MEMTABLES`] of an eighth each), half for its batches. A batch holds
/// about 2.5 times its log bytes while it is written, and with read-ahead the
/// next one, gathered meanwhile, about 1.2 times its own: a chunk of an eighth
/// of the budget (a fifth without read-ahead) keeps both within that half.
/// RocksDB switches memtables only between writes, so a memtable takes whole
/// batches: one each when the two are the same size.
///
/// A source's own buffers (a Kafka fetcher's responses in flight,
/// `Changelog::buffered_bytes`) come out of the budget first.
///
/// Before, four 64 MiB memtables came on top of the budget: 482-587 MiB peak
/// RSS at 10M-100M records under a budget of 256 MiB; with these shares
/// 263-363 MiB from the segment log, and from native Kafka 339-365 MiB at
/// 10M records once its buffers were counted and its reads stopped within a
/// response (372-446 MiB before). The smaller batch met a
/// repeated key less often (2M records over 200k keys replayed ~19% slower,
/// benches/notes.md) until a key-value store's chunk dropped the operations
/// a later one overrides as it gathers (`replay::gather`), covering more log
/// in the same memory. Two or three larger memtables went over the budget,
/// or stalled repeated keys. A budget of 512 MiB gives the memtables and
/// batches of before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayMemory {
    /// Memtable size of the store while it is restored.
    pub write_buffer_bytes: usize,
    /// Bytes a replay chunk holds (one `WriteBatch`): of log, or for a
    /// key-value store of its operations, dropping those a later one of the
    /// same key overrides (`replay::gather`).
    pub chunk_bytes: usize,
}

impl ReplayMemory {
    /// The shares of `memory_budget`, within [`MIN_WRITE_BUFFER_BYTES`]..=[`MAX_WRITE_BUFFER_BYTES`]
    /// and [`READ_BYTES`]..=`max_chunk_bytes`.
    pub fn of(memory_budget: usize, read_ahead: bool, max_chunk_bytes: usize) -> Self {
        let write_buffer_bytes =
            (memory_budget / (2 * MEMTABLES)).clamp(MIN_WRITE_BUFFER_BYTES, MAX_WRITE_BUFFER_BYTES);
        let chunk_share = if read_ahead { 8 } else { 5 };
        let chunk_bytes = (memory_budget / chunk_share).max(READ_BYTES).min(max_chunk_bytes.max(1));
        Self { write_buffer_bytes, chunk_bytes }
    }
}

/// Options a store is opened with for restoring: big memtables so flushes are
/// few and large, no compression (as Kafka Streams), two background jobs, its
/// tables loaded by at most one thread per core.
/// `atomic_flush` and the column families are enforced by [`crate::store::Store::open_with`].
pub fn restore_options() -> Options {
    restore_options_with(MAX_WRITE_BUFFER_BYTES)
}

/// [`restore_options`] with another memtable size (see [`ReplayMemory`]). With the WAL off, replay
/// progress reaches disk when memtables are flushed, so smaller memtables
/// mean less work lost to a crash (and more, smaller files).
pub fn restore_options_with(write_buffer_bytes: usize) -> Options {
    let mut o = store_options(true);
    // The tables' index blocks in the block cache, not held beside it for
    // every open table: they grow with the store (~70 MiB at 100M records,
    // test_bench_scale.py), and a restore seldom reads them (compactions do,
    // once a table). The store's own options, when the application opens
    // it, are unchanged.
    let mut table = kafka_streams_table();
    table.set_cache_index_and_filter_blocks(true);
    o.set_block_based_table_factory(&table);
    let write_buffer_bytes = write_buffer_bytes.max(64 << 10);
    o.set_write_buffer_size(write_buffer_bytes);
    o.set_max_write_buffer_number(MEMTABLES as i32);
    let level0_files = level0_trigger(write_buffer_bytes);
    o.set_level_zero_file_num_compaction_trigger(level0_files);
    o.set_max_background_jobs(2);
    o.set_compression_type(DBCompressionType::None);
    o.set_level_zero_slowdown_writes_trigger(10 * level0_files);
    o.set_level_zero_stop_writes_trigger(16 * level0_files);
    // Opening a database starts `max_file_opening_threads - 1` threads per column family to load
    // its tables, even when it has none: 15 of them (the default, 16) for every store a restore
    // creates, started and joined within its fixed cost (test_bench_scale.py: many small stores).
    // More threads than cores load no faster.
    o.set_max_file_opening_threads(per_core_threads());
    o
}

/// Offsets of log from which a replay into a key-value store defers RocksDB's
/// compactions to its end ([`deferred_compaction_options`]; the spec's
/// `defer_compactions_from`). Leveled compaction rewrites each record once
/// more for every level the store grows into, while the replay writes: 100M
/// unique keys wrote 36 GiB for a 12 GiB store and took 177 s; deferred, 22
/// GiB and 115 s. At 10M records deferring was slower (8.3 s against 5.7-6.9
/// s: one merge after the replay instead of compactions beside it); at 30M
/// the two took the same time (benches/notes.md).
pub const DEFERRED_COMPACTION_OFFSETS: i64 = 30_000_000;

/// [`restore_options_with`] for a replay that defers RocksDB's compactions to
/// its end ([`crate::store::Store::compact_all`]): level 0 gathers every memtable
/// flushed, no write is slowed or stopped for its files, and the one merge at
/// the end runs on every core. Reads of such a level 0 check every file, so
/// only a replay, which does not read, opens a store this way.
pub fn deferred_compaction_options(write_buffer_bytes: usize) -> Options {
    let mut o = restore_options_with(write_buffer_bytes);
    o.set_disable_auto_compactions(true);
    o.set_level_zero_slowdown_writes_trigger(1 << 30);
    o.set_level_zero_stop_writes_trigger(1 << 30);
    o.set_soft_pending_compaction_bytes_limit(0);
    o.set_hard_pending_compaction_bytes_limit(0);
    o.set_max_subcompactions(per_core_threads() as u32);
    o
}

/// Level-0 files that start a compaction when each is a memtable of
/// `write_buffer_bytes`: [`LEVEL0_BYTES`] of them, 4 (RocksDB's default) to 16,
/// so level 0 holds as many bytes before a compaction as with 64 MiB
/// memtables. The slowdown and stop triggers, also counted in files, are 10
/// and 16 times it (40 and 64 at 64 MiB): left at 40 with 32 MiB files, they
/// slowed a replay of 100M unique keys at half the bytes, and each compaction
/// into the base level took less of level 0 (45.8 GiB written, not 40.6).
fn level0_trigger(write_buffer_bytes: usize) -> i32 {
    (LEVEL0_BYTES / write_buffer_bytes.max(1)).clamp(4, 16) as i32
}

/// Threads a store opened for restoring loads its tables with (and a deferred
/// compaction merges on): one per core, at most RocksDB's default 16.
fn per_core_threads() -> i32 {
    crate::threads::cores().min(16) as i32
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
    let (store, tp) = (target.store.path(), target.tp);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What a replay holds at its peak: the batch being written (~2.5x its
    /// log bytes), the next one gathered beside it with read-ahead (~1.2x)
    /// and every memtable full.
    fn peak(m: ReplayMemory, read_ahead: bool) -> usize {
        let batches = if read_ahead { m.chunk_bytes * 37 / 10 } else { m.chunk_bytes * 5 / 2 };
        batches + MEMTABLES * m.write_buffer_bytes
    }

    #[test]
    fn a_replay_keeps_its_batches_and_memtables_within_its_budget() {
        for budget_mib in [40, 64, 100, 256, 500, 511] {
            for read_ahead in [true, false] {
                let budget = budget_mib << 20;
                let m = ReplayMemory::of(budget, read_ahead, usize::MAX);
                assert!(peak(m, read_ahead) <= budget, "{budget_mib} MiB, read-ahead {read_ahead}: {m:?}");
                assert!(MEMTABLES * m.write_buffer_bytes <= budget / 2, "{budget_mib} MiB: {m:?}");
            }
        }
        let m = ReplayMemory::of(256 << 20, true, replay::DEFAULT_CHUNK_BYTES);
        assert_eq!(m, ReplayMemory { write_buffer_bytes: 32 << 20, chunk_bytes: 32 << 20 });
        assert_eq!(ReplayMemory::of(256 << 20, false, usize::MAX).chunk_bytes, (256 << 20) / 5);
    }

    #[test]
    fn replay_shares_stay_within_their_bounds() {
        // A tiny budget still reads whole reads and keeps a usable memtable;
        // a huge one stops at RocksDB's default memtable and the chunk cap.
        let tiny = ReplayMemory::of(1 << 20, true, usize::MAX);
        assert_eq!(tiny, ReplayMemory { write_buffer_bytes: MIN_WRITE_BUFFER_BYTES, chunk_bytes: READ_BYTES });
        let huge = ReplayMemory::of(64 << 30, true, replay::DEFAULT_CHUNK_BYTES);
        assert_eq!(
            huge,
            ReplayMemory { write_buffer_bytes: MAX_WRITE_BUFFER_BYTES, chunk_bytes: replay::DEFAULT_CHUNK_BYTES }
        );
        assert_eq!(ReplayMemory::of(256 << 20, true, 300).chunk_bytes, 300, "the cap is a test's small chunk");
    }

    #[test]
    fn level_zero_holds_the_same_bytes_before_a_compaction_whatever_the_memtable() {
        assert_eq!(level0_trigger(64 << 20), 4);
        assert_eq!(level0_trigger(32 << 20), 8);
        assert_eq!(level0_trigger(16 << 20), 16);
        assert_eq!(level0_trigger(1 << 20), 16, "at most 16 files");
        assert_eq!(level0_trigger(1 << 30), 4, "at least RocksDB's default");
    }
}
