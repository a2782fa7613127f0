//! Replay: a changelog partition applied to a store one large `WriteBatch`
//! per read chunk, with the write-ahead log off and the offset of the last
//! applied record in the same batch, so whatever RocksDB has flushed (both
//! column families together, `atomic_flush`) is a committed prefix of the log
//! with its exact offset. A window or session store takes a batch per live
//! segment and its offset once every segment is flushed ([`super::Dest`]).
//!
//! [`super::engine`] picks this mode for a store that already holds data (or
//! when asked); the store's offset then says where the log resumes.

use super::chunk::ChunkOps;
use super::{for_each_chunk, Applied, Progress, RestoreError, Target, READ_BYTES};
use crate::source::{ChangelogSource, LogError};
use crate::store::{StoreFormat, DEFAULT_LEVEL0_STOP_FILES};

/// Most bytes a replay chunk holds (one `WriteBatch`; see `gather`),
/// whatever the memory budget. Large on purpose: a batch keeps only the last
/// operation of each key, so the more log it covers, the fewer writes reach
/// RocksDB when keys repeat (a changelog with ~10 updates a key replays
/// twice as fast with 64 MiB batches as with 4 MiB ones). Building a batch
/// holds about 2.5 times this in memory. With the WAL off nothing reaches disk before a memtable
/// flush, so a larger batch does not put more work at risk in a crash.
pub const DEFAULT_CHUNK_BYTES: usize = 64 << 20;

/// Replay `source` into `store` up to `end` (exclusive): one `WriteBatch` per
/// chunk of about `chunk_bytes` of log (read [`READ_BYTES`] at a time),
/// written without WAL, holding the data and the offset of the last record it
/// applies. Flushes both column families at the end, and also when stopping
/// on an error, so the store on disk is always a committed prefix with its
/// offset (a chunk the error cut short is not written); a segmented store
/// records its offset there, in every live segment ([`super::Dest::record`]).
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
    replay_handing_over(target, source, chunk_bytes, read_ahead, Handover::Flushed, progress)
}

/// How a replay that succeeded leaves its store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handover {
    /// Flushed, its offset recorded: durable (the store is then closed).
    Flushed,
    /// Left open to the next replay ([`super::open_stores::OpenStores`]),
    /// unflushed, its offset where a crash cannot separate it from the data
    /// it covers ([`super::Dest::hold`]). A replay that fails flushes.
    KeptOpen,
    /// Flushed, its offset recorded, then merged into RocksDB's last level
    /// ([`crate::store::Store::compact_all`]): the store was opened with its
    /// compactions deferred ([`super::deferred_compaction_options`]). A replay
    /// that fails is flushed only: the next restore of a store left with 36
    /// level-0 files or more defers and merges again (a replay of 30M offsets
    /// leaves over a hundred at the default budget); fewer, RocksDB's own compactions
    /// merge once a store is opened the usual way.
    Compacted,
}

/// [`replay`], leaving the store as `handover` says.
pub fn replay_handing_over(
    target: Target<'_>,
    source: &mut dyn ChangelogSource,
    chunk_bytes: usize,
    read_ahead: bool,
    handover: Handover,
    progress: &mut Progress<'_>,
) -> Result<Applied, RestoreError> {
    let Target { store, tp, .. } = target;
    let mut applied = Applied::default();
    let result = replay_chunks(target, source, chunk_bytes, read_ahead, progress, &mut applied);
    progress.read_all();
    let result = result.and_then(|()| progress.read_to(source.position()));
    let flushed = if handover == Handover::KeptOpen && result.is_ok() {
        store.hold(tp, applied.last_offset);
        Ok(())
    } else {
        store.record(tp, applied.last_offset).map_err(|e| RestoreError::store(tp, e))
    };
    result?;
    flushed?;
    if handover == Handover::Compacted {
        let t0 = std::time::Instant::now();
        store.compact_all().map_err(|e| RestoreError::store(tp, e))?;
        applied.merge = t0.elapsed();
    }
    // The store is complete and durable; what RocksDB has not merged of level 0 is left for the
    // application only while it would not stop its writes (the cost of a large replay).
    store.settle_level0(DEFAULT_LEVEL0_STOP_FILES);
    Ok(applied)
}

/// Most log one replay chunk covers, in chunks: a chunk whose keys repeat
/// keeps gathering while its last operations per key take less than
/// [`KEPT_SHARE_TO_GATHER_ON`] of it, up to this many times its size in log.
/// The bound keeps batches (and progress reports) coming, and the writer
/// busy beside the reader.
const MAX_LOG_PER_CHUNK: usize = 4;
/// A chunk full of operations is deduplicated, and gathers on while what
/// it keeps is below this share (numerator, denominator) of its size: each
/// such pass then makes room for at least a fifth of a chunk of new log, so
/// no record is hashed more than about five times. A pass that would keep
/// more ends the chunk as it is (its last operations already found for the
/// batch, nothing moved).
const KEPT_SHARE_TO_GATHER_ON: (usize, usize) = (4, 5);

/// Gather the next chunk of `source` below `end` into `ops`, read
/// [`READ_BYTES`] at a time; whether more follows. A chunk covers about
/// `chunk_bytes` of log for a versioned or segmented store. A key-value
/// store's chunk holds about `chunk_bytes` of operations
/// ([`ChunkOps::held_bytes`], about its log when no key repeats) and drops
/// those a later one of the same key overrides as it fills
/// ([`ChunkOps::keep_last_per_key`]), so it covers more log when keys
/// repeat, in the same memory: fewer writes reach RocksDB.
fn gather(
    ops: &mut ChunkOps,
    source: &mut dyn ChangelogSource,
    end: i64,
    chunk_bytes: usize,
    format: StoreFormat,
) -> Result<bool, LogError> {
    ops.clear();
    let keeps_last = format.is_key_value();
    let log_bytes = if keeps_last { MAX_LOG_PER_CHUNK.saturating_mul(chunk_bytes) } else { chunk_bytes };
    let (kept_num, kept_den) = KEPT_SHARE_TO_GATHER_ON;
    let first = source.bytes_read();
    let mut more = true;
    while more {
        let read = usize::try_from(source.bytes_read().saturating_sub(first)).unwrap_or(usize::MAX);
        if read >= log_bytes {
            break;
        }
        let room = if keeps_last {
            if ops.held_bytes() >= chunk_bytes {
                ops.index_last_per_key();
                if ops.kept_bytes() > chunk_bytes / kept_den * kept_num {
                    break;
                }
                ops.keep_last_per_key();
            }
            chunk_bytes - ops.held_bytes()
        } else {
            chunk_bytes - read
        };
        more = ops.read(source, end, room.min(log_bytes - read).min(READ_BYTES), format)?;
    }
    if keeps_last {
        // On this (the reading) thread, beside the writer: the batch then only sorts.
        ops.index_last_per_key();
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
        store.write_chunk(ops, tp, off).map_err(|e| RestoreError::store(tp, e))?;
        applied.null_keys += ops.null_keys();
    }
    applied.add(ops.last_offset(), ops.records() as u64, progress)
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::restore::testing::*;
    use crate::restore::Dest;
    use crate::restore::{restore_options, ErrorKind, Listener};
    use crate::store::Store;

    #[test]
    fn replay_equals_model_and_records_offset_in_small_chunks() {
        let log = random_log(3000, 300, 7);
        let (m, last) = model(&log, 3000);
        for read_ahead in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let store = Dest::Store(Store::open_with(&dir.path().join("s"), restore_options()).unwrap());
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
        // ~6 MiB of log of unique keys: a 5 MiB chunk is two reads (READ_BYTES, then the rest of the chunk)
        let n = 28_000;
        let log = unique_log(n, 200);
        let dir = tempfile::tempdir().unwrap();
        for (name, chunk, batches, read_ahead) in [
            ("gathered", 5 << 20, 2, false),
            ("default", DEFAULT_CHUNK_BYTES, 1, false),
            ("gathered-ahead", 5 << 20, 2, true),
        ] {
            let store = Dest::Store(Store::open_with(&dir.path().join(name), restore_options()).unwrap());
            let mut src = VecSource::new(log.clone(), 0);
            let mut counted = Batches::default();
            let mut p = Progress::new(Some(&mut counted), Duration::ZERO);
            let target = Target { store: &store, tp: "t-0", end: n as i64 };
            let a = replay(target, &mut src, chunk, read_ahead, &mut p).unwrap();
            assert!(src.bytes > (READ_BYTES + (1 << 20)) as u64, "{name}: the log is larger than a read");
            assert!(src.bytes < (5 << 20) + READ_BYTES as u64, "{name}: two 5 MiB chunks at most");
            assert_eq!(counted.count(), batches, "{name}: one write per chunk, not per read");
            let (m, last) = model(&log, n as i64);
            assert_eq!(dump(&store), m, "{name}");
            assert_eq!(store.offset("t-0").unwrap(), last, "{name}");
            assert_eq!(a.last_offset, last, "{name}");
        }
    }

    #[test]
    fn a_chunk_of_repeated_keys_gathers_more_log_up_to_its_bound() {
        // ~4 MiB of log over 2,000 keys: a chunk's last operation per key takes
        // a fraction of it, so it covers MAX_LOG_PER_CHUNK chunks of log (the
        // next test: a versioned store and unique keys do not).
        let n = 100_000;
        let chunk = 128 << 10;
        let log = random_log(n, 2_000, 21);
        let (m, last) = model(&log, n as i64);
        let dir = tempfile::tempdir().unwrap();
        for read_ahead in [false, true] {
            let store =
                Dest::Store(Store::open_with(&dir.path().join(format!("s{read_ahead}")), restore_options()).unwrap());
            let mut src = VecSource::new(log.clone(), 0);
            let mut counted = Batches::default();
            let mut p = Progress::new(Some(&mut counted), Duration::ZERO);
            let target = Target { store: &store, tp: "t-0", end: n as i64 };
            let a = replay(target, &mut src, chunk, read_ahead, &mut p).unwrap();
            let by_log = (src.bytes as usize).div_ceil(chunk);
            let bound = (src.bytes as usize).div_ceil(MAX_LOG_PER_CHUNK * chunk);
            assert!(by_log > 20, "{by_log} chunks of log");
            assert!(
                counted.count() <= bound + 1,
                "read-ahead {read_ahead}: {} batches, {bound} chunks of log",
                counted.count()
            );
            assert_eq!(dump(&store), m, "read-ahead {read_ahead}");
            assert_eq!(store.offset("t-0").unwrap(), last);
            assert_eq!(
                (a.last_offset, a.records as usize),
                (last, n - (src.skipped.aborted + src.skipped.control) as usize - a.null_keys as usize)
            );
        }
    }

    #[test]
    fn a_chunk_gathers_by_log_bytes_where_every_record_counts_or_no_key_repeats() {
        let chunk = 128 << 10;
        let mut ops = ChunkOps::default();
        let log = random_log(100_000, 2_000, 21);
        let mut src = VecSource::new(log, 0);
        gather(&mut ops, &mut src, 100_000, chunk, StoreFormat::Versioned).unwrap();
        assert!(src.bytes as usize >= chunk && (src.bytes as usize) < chunk + READ_BYTES, "{}", src.bytes);
        let mut src = VecSource::new(unique_log(20_000, 40), 0);
        ops = ChunkOps::default();
        gather(&mut ops, &mut src, 20_000, chunk, StoreFormat::Plain).unwrap();
        assert!(ops.held_bytes() >= chunk && ops.held_bytes() < chunk + 4096, "{}", ops.held_bytes());
        assert!((src.bytes as usize) < chunk + 4096, "about a chunk of log: {}", src.bytes);
    }

    #[test]
    fn a_replay_hands_over_no_level0_that_would_stop_the_application_s_writes() {
        // 40 level-0 files (~4 MB) compacted at 1 MB/s: the compaction outlasts the replay
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        store_with_level0_files(&p, 40);
        let mut o = restore_options();
        o.set_ratelimiter(1 << 20, 100_000, 10);
        // the replay's own writes are never slowed (which would wait for the compaction too)
        o.set_level_zero_slowdown_writes_trigger(1 << 10);
        o.set_level_zero_stop_writes_trigger(1 << 11);
        let store = Dest::Store(Store::open_with(&p, o).unwrap());
        let log = unique_log(100, 10);
        let mut src = VecSource::new(log.clone(), 0);
        let mut p = Progress::new(None, Duration::ZERO);
        replay(Target { store: &store, tp: "t-0", end: 100 }, &mut src, 1 << 20, false, &mut p).unwrap();
        let Dest::Store(s) = &store else { unreachable!() };
        assert!(s.level0_files() < DEFAULT_LEVEL0_STOP_FILES, "{} level-0 files", s.level0_files());
        assert_eq!(store.offset("t-0").unwrap(), Some(99));
    }

    #[test]
    fn a_source_error_keeps_the_applied_prefix_with_its_offset() {
        let log = random_log(2000, 100, 9);
        for read_ahead in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("s");
            {
                let store = Dest::Store(Store::open_with(&p, restore_options()).unwrap());
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
            let store = Dest::Store(Store::open_with(&p, restore_options()).unwrap());
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
