//! Bulk restore: keep only the last operation per key of the changelog range,
//! sort, write SST files with `SstFileWriter`, ingest them into the store in
//! one atomic ingestion (files moved, not copied), then record the offset.
//! A window or session store gets SST files per live segment (the stream
//! time, the largest segment timestamp of the keys, is known once all is
//! collected, so records of expired segments are never written), one
//! ingestion per segment, then its offset in every segment.
//!
//! Memory stays within the budget: the [`collect::Collector`] holds the last
//! operation per key within its share and, when full, compacts itself or
//! spills a sorted run to a temporary directory beside the store; the runs
//! are merged (in several passes when there are many) into the SST files.
//!
//! With read-ahead (a lone restore, which may use two cores) the log is
//! read, decoded and hashed on a second thread while this one collects; the
//! chunks' buffers go back and forth between the two. Without it (each
//! restore of `restore_many` keeps to one thread, and a source that fetches
//! on a thread of its own gains nothing from a third) the records go from the
//! source's own buffers (a fetch response, a segment file's batch) straight
//! into the collector, a slice at a time, with no copy in between.
//!
//! With `threads` above one (a restore that has the job's idle threads: a
//! `restore_many` job with fewer stores than threads), the last phase --
//! sorting, merging the spilled runs and writing the SST files -- is split
//! by key range across that many threads: the collector's keys at the
//! quantiles of a sample of them, or the runs at the quantiles of their
//! sparse indexes ([`runs::pivots`]); each range is sorted or merged and
//! written into SST files of its own on its own thread (a spill's ranges
//! into run files of their own, which make one run), and all the files
//! go into the one ingestion, so the store receives exactly what the single
//! thread would have written. Collecting stays on one thread (records come
//! in log order; read-ahead decodes on the second). The memory budget is
//! shared, not multiplied: the sort order is split in place, and the
//! merge's share is divided between the ranges (each range's reader of a
//! run gets `buffer / threads`); the SST writers' own buffers are small
//! beside it (a block, and the index and filter of a file).
//!
//! Nothing touches the store before the ingestion, so a failure or a crash
//! before it leaves the store exactly as it was. A crash between the
//! ingestion and the offset write leaves data ahead of the recorded offset,
//! never an offset ahead of the data; replaying from the recorded offset is
//! idempotent and converges to the same store.

pub mod collect;
pub(super) mod pool;
pub mod runs;

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use rocksdb::{Options, SstFileWriter};

use super::chunk::ChunkOps;
use super::{for_each_chunk, restore_options, Applied, Dest, ErrorKind, Progress, RestoreError, Target};
use crate::segments::KeySchema;
use crate::source::{ChangelogSource, LogError};
use crate::store::StoreFormat;
use crate::threads::side_by_side;
use collect::{Collector, Full, Stage};

/// Largest chunk of log a bulk restore buffers at a time: a chunk is decoded,
/// then its records are added to the collector, so a chunk that fits the
/// core's own cache is read from there (replay batches more, for RocksDB).
pub const BULK_CHUNK_BYTES: usize = 1 << 20;

/// Most runs one merge reads at once (each through a buffer of at least
/// 256 KiB of the merge's quarter of the budget: 256 at the default 256 MiB).
/// 100M unique keys spill ~167 runs: with 64 they were merged twice (29.3 GiB
/// written for a 10.7 GiB store, 79 s), with 256 once (22.2 GiB, 67 s;
/// test_bench_scale.py). A merge of more runs costs more comparisons a
/// record (a binary heap), far less than writing every record once more.
const MAX_FAN_IN: usize = 256;

/// The fan-in a merge on `threads` threads may use within a quarter of the
/// process's open-file limit: each thread's range merge opens every run
/// (64 at least, as before the limit was looked at).
fn fan_in_within_open_files(threads: usize) -> usize {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes the struct it is given.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 { lim.rlim_cur } else { 1024 };
    let room = usize::try_from(soft / 4).unwrap_or(usize::MAX);
    (room / threads.max(1)).max(64)
}

/// Tuning of one bulk restore.
#[derive(Debug, Clone, Copy)]
pub struct BulkOptions {
    /// Memory the restore may use for keys, values and merge buffers.
    pub memory_budget: usize,
    /// Bytes of log read per chunk.
    pub chunk_bytes: usize,
    /// An SST file is closed once it reaches this size.
    pub sst_target_bytes: u64,
    /// Read, decode and hash the next chunks on a second thread while this
    /// one collects (a restore that may use two cores; see `restore::for_each_chunk`),
    /// unless the source reads on a thread of its own already
    /// ([`ChangelogSource::reads_ahead`]).
    pub read_ahead: bool,
    /// Threads the sort, the merge and the SST writing are split across by
    /// key range (1: this thread alone; see the module documentation).
    pub threads: usize,
}

impl BulkOptions {
    pub fn new(memory_budget: usize) -> Self {
        Self {
            memory_budget,
            chunk_bytes: BULK_CHUNK_BYTES,
            sst_target_bytes: 128 << 20,
            read_ahead: false,
            threads: 1,
        }
    }
}

/// The scratch directory of a bulk restore of the store at `store`: a hidden
/// sibling (same file system, so ingestion can move the files).
pub fn scratch_dir(store: &Path) -> PathBuf {
    crate::fileio::hidden_sibling(store, ".restore-tmp")
}

enum Failure {
    Io(io::Error),
    Rocks(rocksdb::Error),
    Stop(RestoreError),
    /// A key of a segmented store that is not of its key schema.
    BadKey(String),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure::Io(e)
    }
}
impl From<rocksdb::Error> for Failure {
    fn from(e: rocksdb::Error) -> Self {
        Failure::Rocks(e)
    }
}
impl From<RestoreError> for Failure {
    fn from(e: RestoreError) -> Self {
        Failure::Stop(e)
    }
}

/// Restore `[source.position(), end)` into `store` in bulk. See the module
/// documentation for what a failure leaves behind.
pub fn bulk(
    target: Target<'_>,
    source: &mut dyn ChangelogSource,
    opts: &BulkOptions,
    progress: &mut Progress<'_>,
) -> Result<Applied, RestoreError> {
    let Target { store, tp, end } = target;
    let dir = scratch_dir(store.path());
    let start = source.position();
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        RestoreError::new(
            ErrorKind::Restore,
            format!(
                "bulk restore of store {} from {tp} (offsets {start}..{end}) failed {what}: {e}; \
                 the store was left as it was",
                store.path().display()
            ),
        )
    };
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| failed(&format!("removing stale {}", dir.display()), &e))?;
    }
    std::fs::create_dir(&dir).map_err(|e| failed(&format!("creating {}", dir.display()), &e))?;
    let result = run(target, source, opts, progress, &dir);
    remove_scratch(&dir, opts.threads);
    result.map_err(|f| match f {
        Failure::Io(e) => failed(&format!("in scratch directory {}", dir.display()), &e),
        Failure::Rocks(e) => failed("writing SST files", &e),
        Failure::Stop(e) => e,
        Failure::BadKey(m) => failed("reading a key", &m),
    })
}

/// Remove the scratch directory `dir`, its files spread over `threads`
/// threads: giving back the page cache of the runs a large restore spilled
/// (2.4 GiB for 20M records) takes a quarter of a second on one thread, the
/// restore's last step. A file that cannot be removed is left behind, and the
/// next bulk restore of the store removes it first.
fn remove_scratch(dir: &Path, threads: usize) {
    let files: Vec<PathBuf> =
        std::fs::read_dir(dir).map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect()).unwrap_or_default();
    let threads = threads.clamp(1, files.len().max(1));
    side_by_side(0..threads, |t| {
        for f in files.iter().skip(t).step_by(threads) {
            let _ = std::fs::remove_file(f);
        }
    });
    let _ = std::fs::remove_dir_all(dir);
}

fn run(
    target: Target<'_>,
    source: &mut dyn ChangelogSource,
    opts: &BulkOptions,
    progress: &mut Progress<'_>,
    dir: &Path,
) -> Result<Applied, Failure> {
    let Target { store, tp, end } = target;
    let budget = opts.memory_budget.max(64 << 10);
    let merge_share = budget / 4;
    let fan_in = (merge_share / (256 << 10)).clamp(2, MAX_FAN_IN).min(fan_in_within_open_files(opts.threads));
    let buffer = (merge_share / fan_in).clamp(4 << 10, 4 << 20);
    let mut into = Collecting {
        collector: Collector::new(budget * 3 / 5),
        threads: opts.threads.max(1),
        runs: Vec::new(),
        seq: 0,
        dir,
        buffer,
        schema: store.key_schema(),
        stream_time: None,
    };
    let mut applied = Applied::default();
    let format = store.format();
    if opts.read_ahead && !source.reads_ahead() {
        let chunk_bytes = opts.chunk_bytes;
        for_each_chunk(
            target,
            source,
            Some(CHUNKS_AHEAD),
            |chunk: &mut Chunk, source| chunk.fill(source, end, format, chunk_bytes),
            |chunk| {
                let Chunk { ops, hashes } = &*chunk;
                into.prefetch_first(hashes);
                for (i, &h) in hashes.iter().enumerate() {
                    into.prefetch_ahead(hashes, i);
                    let (k, v) = ops.get(i);
                    into.add(k, v, h)?;
                }
                applied.null_keys += ops.null_keys();
                applied.add(ops.last_offset(), ops.records() as u64, progress).map_err(Failure::from)
            },
        )?;
    } else {
        add_slices(target, source, opts.chunk_bytes, &mut into, progress, &mut applied)?;
    }
    progress.read_all();
    progress.read_to(source.position())?;
    let Collecting { mut collector, mut runs, mut seq, stream_time, .. } = into;
    if let Some(t) = stream_time {
        store.observe(t); // a segmented store: only segments live at the end are written
    }

    let sst_opts = restore_options();
    let threads = opts.threads.max(1);
    let new_out = |part| SstOut::new(&sst_opts, dir, opts.sst_target_bytes, store, part);
    let files = if runs.is_empty() && threads == 1 {
        let mut out = new_out(0);
        collector.drain_sorted(|k, v| out.add(k, v))?;
        drop(collector);
        out.finish()?
    } else if runs.is_empty() {
        let parts = collector.drain_sorted_parts(threads, |part, range| {
            let mut out = new_out(part);
            for (k, v) in range.records() {
                out.add(k, v)?;
            }
            out.finish()
        });
        drop(collector);
        join_parts(parts)?
    } else {
        if !collector.is_empty() {
            runs.push(spill(&mut collector, dir, buffer, &mut seq, threads)?);
        }
        drop(collector);
        let runs = runs::reduce(runs, fan_in, buffer, dir, &mut seq)?;
        let pivots = if threads == 1 { Vec::new() } else { runs::pivots(&runs, threads) };
        // The ranges' merges share the merge's part of the budget.
        let buffer = (buffer / (pivots.len() + 1)).max(4 << 10);
        let range = |part: usize| {
            let lo = part.checked_sub(1).map(|p| &pivots[p][..]);
            let mut out = new_out(part);
            runs::merge_range(&runs, buffer, lo, pivots.get(part).map(|p| &p[..]), |k, v| out.add(k, v))?;
            out.finish()
        };
        join_parts(side_by_side(0..=pivots.len(), range))?
    };
    store.ingest_all(files).map_err(|e| {
        RestoreError::new(
            if e.corruption { ErrorKind::StoreCorrupted } else { ErrorKind::Store },
            format!(
                "ingesting SST files for {tp} failed: {e}; each database's ingestion is atomic: \
                 the store keeps its previous state (a segment ingested before stays ahead of \
                 the recorded offset, which replays over it)",
            ),
        )
    })?;
    store.record(tp, applied.last_offset).map_err(|e| RestoreError::store(tp, e))?;
    Ok(applied)
}

/// The files of the key ranges written side by side, per database, in key
/// order (the ranges are consecutive): one ingestion takes them all.
fn join_parts(
    parts: Vec<Result<BTreeMap<i64, Vec<PathBuf>>, Failure>>,
) -> Result<BTreeMap<i64, Vec<PathBuf>>, Failure> {
    let mut all: BTreeMap<i64, Vec<PathBuf>> = BTreeMap::new();
    for part in parts {
        for (id, files) in part? {
            all.entry(id).or_default().extend(files);
        }
    }
    Ok(all)
}

/// Chunks read ahead of the one being collected.
const CHUNKS_AHEAD: usize = 2;

/// Records the collector is asked to bring a key's slot into cache ahead of
/// adding it, and then (once the slot is there) the record it points to: the
/// adds are bound by cache misses, not by work; two restores side by side
/// share the cache, so hiding the misses matters more there.
const SLOT_AHEAD: usize = 32;
const DATA_AHEAD: usize = 16;

/// Where a bulk restore puts its operations: the collector, and the sorted
/// runs it spilled to the scratch directory when full.
struct Collecting<'a> {
    collector: Collector,
    /// Threads a spill is split across ([`BulkOptions::threads`]).
    threads: usize,
    runs: Vec<runs::Run>,
    seq: usize,
    dir: &'a Path,
    buffer: usize,
    /// The key schema of a segmented store, and the stream time its keys
    /// reached (the largest segment timestamp).
    schema: Option<KeySchema>,
    stream_time: Option<i64>,
}

impl Collecting<'_> {
    /// Add `key`'s operation (of hash `h`), spilling the collector when full.
    #[inline]
    fn add(&mut self, key: &[u8], value: Option<&[u8]>, h: u64) -> Result<(), Failure> {
        if let Some(schema) = self.schema {
            let t = schema.segment_timestamp(key).ok_or_else(|| Failure::BadKey(schema.bad_key(key)))?;
            self.stream_time = Some(self.stream_time.map_or(t, |s| s.max(t)));
        }
        if self.collector.add_hashed(key, value, h) == Full::Spill {
            let run = spill(&mut self.collector, self.dir, self.buffer, &mut self.seq, self.threads)?;
            self.runs.push(run);
            let again = self.collector.add_hashed(key, value, h);
            debug_assert_eq!(again, Full::No);
        }
        Ok(())
    }

    /// Before adding the operations of `hashes`: ask for the first ones' slots.
    #[inline]
    fn prefetch_first(&self, hashes: &[u64]) {
        for &h in hashes.iter().take(SLOT_AHEAD) {
            self.collector.prefetch(h, Stage::Slot);
        }
    }

    /// Before adding the `i`-th operation of `hashes`: ask for what later ones touch.
    #[inline]
    fn prefetch_ahead(&self, hashes: &[u64], i: usize) {
        for (ahead, stage) in [(SLOT_AHEAD, Stage::Slot), (DATA_AHEAD, Stage::Data)] {
            if let Some(&later) = hashes.get(i + ahead) {
                self.collector.prefetch(later, stage);
            }
        }
    }
}

/// Add the records of `source` below the target's end as the source hands
/// them over, slice by slice ([`ChangelogSource::next_records`]): straight
/// from its buffers into the collector, with no copy in between.
fn add_slices(
    target: Target<'_>,
    source: &mut dyn ChangelogSource,
    read_bytes: usize,
    into: &mut Collecting<'_>,
    progress: &mut Progress<'_>,
    applied: &mut Applied,
) -> Result<(), Failure> {
    let Target { store, tp, end } = target;
    let format = store.format();
    let (mut hashes, mut stamped, mut stored_key) = (Vec::<u64>::new(), Vec::<u8>::new(), Vec::<u8>::new());
    let rewrites_key = format.rewrites_key();
    // The key a record is stored under (hashed as the collector hashes it).
    let store_key = |key: &[u8], out: &mut Vec<u8>| {
        out.clear();
        format.encode_key(key, out);
    };
    loop {
        let (mut failed, mut last_offset, mut records) = (None, None, 0u64);
        let more = source.next_records(end, read_bytes, &mut |slice| {
            if failed.is_some() {
                return; // the rest of this read is dropped with the restore
            }
            hashes.clear();
            if rewrites_key {
                hashes.extend(slice.iter().map(|r| {
                    r.key.map_or(0, |k| {
                        store_key(k, &mut stored_key);
                        Collector::hash(&stored_key)
                    })
                }));
            } else {
                hashes.extend(slice.iter().map(|r| r.key.map_or(0, Collector::hash)));
            }
            into.prefetch_first(&hashes);
            for (i, r) in slice.iter().enumerate() {
                into.prefetch_ahead(&hashes, i);
                let Some(key) = r.key else {
                    applied.null_keys += 1;
                    continue;
                };
                let value = match r.value {
                    Some(v) if !format.stores_value_as_is() => {
                        stamped.clear();
                        format.encode_value(r.timestamp, r.headers, v, &mut stamped);
                        Some(stamped.as_slice())
                    }
                    v => v,
                };
                if let Some(schema) = format.key_schema().filter(|_| format.has_index()) {
                    stored_key.clear();
                    schema.index_key(key, &mut stored_key);
                    let index_value: Option<&[u8]> = value.map(|_| &[][..]);
                    if let Err(e) = into.add(&stored_key, index_value, Collector::hash(&stored_key)) {
                        failed = Some(e);
                        return;
                    }
                }
                let key = if rewrites_key {
                    store_key(key, &mut stored_key);
                    stored_key.as_slice()
                } else {
                    key
                };
                if let Err(e) = into.add(key, value, hashes[i]) {
                    failed = Some(e);
                    return;
                }
                records += 1;
            }
            last_offset = slice.last().map(|r| r.offset).or(last_offset);
        });
        let more = more.map_err(|e| RestoreError::source(store.path(), tp, source.position(), e))?;
        if let Some(e) = failed {
            return Err(e);
        }
        applied.add(last_offset, records, progress)?;
        if !more {
            return Ok(());
        }
    }
}

/// Move the collector's contents, sorted, into a run in `dir`. On several
/// `threads` the keys are split into as many ranges, each sorted and written
/// on its own thread into a file of its own: the files, in key order, are one
/// run (one file written by two threads would have them wait on each other:
/// the file system serialises buffered writes to one file).
fn spill(
    collector: &mut Collector,
    dir: &Path,
    buffer: usize,
    seq: &mut usize,
    threads: usize,
) -> io::Result<runs::Run> {
    *seq += 1;
    let path = dir.join(format!("run-{:06}", *seq));
    let buffer = buffer.max(64 << 10);
    if threads <= 1 {
        let mut w = runs::RunWriter::create(&path, buffer)?;
        collector.drain_sorted(|k, v| w.add(k, v))?;
        return w.finish();
    }
    let parts = collector.drain_sorted_parts(threads, |part, range| {
        let mut w = runs::RunWriter::create(&path.with_extension(part.to_string()), buffer / threads)?;
        for (k, v) in range.records() {
            w.add(k, v)?;
        }
        w.finish()
    });
    Ok(runs::Run::join(parts.into_iter().collect::<io::Result<Vec<_>>>()?))
}

/// One chunk of log, decoded: its operations and their keys' hashes.
#[derive(Default)]
struct Chunk {
    ops: ChunkOps,
    hashes: Vec<u64>,
}

impl Chunk {
    /// Refill with the next chunk of `source` below `end`; whether more follows.
    fn fill(
        &mut self,
        source: &mut dyn ChangelogSource,
        end: i64,
        format: StoreFormat,
        chunk_bytes: usize,
    ) -> Result<bool, LogError> {
        let Self { ops, hashes } = self;
        ops.clear();
        let more = ops.read(source, end, chunk_bytes, format)?;
        hashes.clear();
        hashes.extend((0..ops.len()).map(|i| Collector::hash(ops.get(i).0)));
        Ok(more)
    }
}

/// Bytes an SST entry may take beyond its key and value (its lengths and
/// sequence number; counted high: a low count would let a file pass its target).
const SST_ENTRY_OVERHEAD: u64 = 16;

/// Writes the merged stream into SST files of about `target` bytes each,
/// per database of the store ([`Dest::route`]: one for a key-value store,
/// one per live segment, expired segments skipped). Tombstones bound for a
/// database that holds no data are dropped.
struct SstOut<'a> {
    opts: &'a Options,
    dir: &'a Path,
    target: u64,
    dest: &'a Dest,
    outs: BTreeMap<i64, DbOut<'a>>,
    files: usize,
    /// The key range this writer's files hold (part of their names).
    part: usize,
}

/// The SST files of one database.
struct DbOut<'a> {
    drop_tombstones: bool,
    writer: Option<SstFileWriter<'a>>,
    files: Vec<PathBuf>,
    /// The open file's size when last asked, and the key and value bytes
    /// added since: the file grows by no more than those (no compression;
    /// keys share prefixes within a block), so it is asked again only when
    /// the two together reach the target, not after every record.
    size: u64,
    added: u64,
}

impl<'a> SstOut<'a> {
    fn new(opts: &'a Options, dir: &'a Path, target: u64, dest: &'a Dest, part: usize) -> Self {
        Self { opts, dir, target, dest, outs: BTreeMap::new(), files: 0, part }
    }

    fn add(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<(), Failure> {
        let Some(id) = self.dest.route(key).map_err(Failure::BadKey)? else { return Ok(()) };
        let dest = self.dest;
        let out = self.outs.entry(id).or_insert_with(|| DbOut {
            drop_tombstones: !dest.holds_data(id),
            writer: None,
            files: Vec::new(),
            size: 0,
            added: 0,
        });
        if value.is_none() && out.drop_tombstones {
            return Ok(());
        }
        if out.writer.is_none() {
            let path = self.dir.join(format!("bulk-{:03}-{:06}.sst", self.part, self.files));
            self.files += 1;
            let w = SstFileWriter::create(self.opts);
            w.open(&path)?;
            out.files.push(path);
            out.writer = Some(w);
            (out.size, out.added) = (0, 0);
        }
        let w = out.writer.as_mut().expect("opened above");
        match value {
            Some(v) => w.put(key, v)?,
            None => w.delete(key)?,
        }
        out.added += (key.len() + value.map_or(0, <[u8]>::len)) as u64 + SST_ENTRY_OVERHEAD;
        if out.size + out.added >= self.target {
            (out.size, out.added) = (w.file_size(), 0);
            if out.size >= self.target {
                out.writer.take().expect("open").finish()?;
            }
        }
        Ok(())
    }

    /// The files of each database an operation went to (perhaps none: a
    /// segment that only tombstones reached is created empty, as Kafka
    /// Streams creates it).
    fn finish(self) -> Result<BTreeMap<i64, Vec<PathBuf>>, Failure> {
        let mut all = BTreeMap::new();
        for (id, mut out) in self.outs {
            if let Some(mut w) = out.writer.take() {
                w.finish()?;
            }
            all.insert(id, out.files);
        }
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rocksdb::DB;

    use super::*;
    use crate::restore::replay::replay;
    use crate::restore::restore_options;
    use crate::restore::testing::*;
    use crate::restore::Dest;
    use crate::source::{ChangeRecord, SkipCounts};
    use crate::store::Store;

    fn restore_bulk(p: &Path, log: &[Entry], start: i64, end: i64, budget: usize, read_ahead: bool) -> Applied {
        let store = Dest::Store(Store::open_with(p, restore_options()).unwrap());
        let mut src = VecSource::new(log.to_vec(), start);
        let mut opts = BulkOptions::new(budget);
        opts.read_ahead = read_ahead;
        opts.chunk_bytes = 300;
        opts.sst_target_bytes = 4096;
        let mut pr = Progress::new(None, Duration::ZERO);
        let a = bulk(Target { store: &store, tp: "t-0", end }, &mut src, &opts, &mut pr).unwrap();
        assert!(!scratch_dir(p).exists());
        a
    }

    fn restore_bulk_threads(p: &Path, log: &[Entry], start: i64, end: i64, budget: usize, threads: usize) -> Applied {
        let store = Dest::Store(Store::open_with(p, restore_options()).unwrap());
        let mut src = VecSource::new(log.to_vec(), start);
        let mut opts = BulkOptions::new(budget);
        (opts.chunk_bytes, opts.sst_target_bytes, opts.threads) = (300, 4096, threads);
        let mut pr = Progress::new(None, Duration::ZERO);
        let a = bulk(Target { store: &store, tp: "t-0", end }, &mut src, &opts, &mut pr).unwrap();
        assert!(!scratch_dir(p).exists());
        a
    }

    /// A source that fetches on a thread of its own, as Kafka's does.
    struct Fetching(VecSource);

    impl ChangelogSource for Fetching {
        fn position(&self) -> i64 {
            self.0.position()
        }
        fn next_chunk(&mut self, _: i64, _: usize, _: &mut dyn FnMut(ChangeRecord<'_>)) -> Result<bool, LogError> {
            panic!("a source that reads ahead itself was read ahead again, on a decoding thread")
        }
        fn next_records(
            &mut self,
            end: i64,
            max_bytes: usize,
            sink: &mut dyn FnMut(&[ChangeRecord<'_>]),
        ) -> Result<bool, LogError> {
            self.0.next_records(end, max_bytes, sink)
        }
        fn skipped(&self) -> SkipCounts {
            self.0.skipped()
        }
        fn bytes_read(&self) -> u64 {
            self.0.bytes_read()
        }
        fn reads_ahead(&self) -> bool {
            true
        }
    }

    #[test]
    fn the_fan_in_keeps_within_the_open_file_limit() {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        let quarter = usize::try_from(lim.rlim_cur / 4).unwrap_or(usize::MAX);
        for threads in [1, 2, 8, 64] {
            let f = fan_in_within_open_files(threads);
            assert!(f >= 64, "{threads} threads: {f}");
            assert!(f == 64 || f * threads <= quarter, "{threads} threads: {f} runs each, limit {}", lim.rlim_cur);
        }
        assert_eq!(fan_in_within_open_files(usize::MAX / 2), 64, "never below the old fan-in");
    }

    #[test]
    fn a_source_that_reads_ahead_itself_is_taken_in_slices_even_with_read_ahead() {
        let log = random_log(5_000, 500, 8);
        let (m, last) = model(&log, 5_000);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        let store = Dest::Store(Store::open_with(&p, restore_options()).unwrap());
        let mut src = Fetching(VecSource::new(log, 0));
        let mut opts = BulkOptions::new(64 << 20);
        (opts.read_ahead, opts.chunk_bytes) = (true, 300);
        let mut pr = Progress::new(None, Duration::ZERO);
        let a = bulk(Target { store: &store, tp: "t-0", end: 5_000 }, &mut src, &opts, &mut pr).unwrap();
        assert_eq!((dump(&store), a.last_offset), (m, last));
        assert_eq!(store.offset("t-0").unwrap(), last);
    }

    #[test]
    fn bulk_equals_replay_and_model_with_and_without_spilling() {
        let log = random_log(20_000, 2_000, 3);
        let (m, last) = model(&log, 20_000);
        for (budget, read_ahead) in [(64 << 20, false), (64 << 10, false), (64 << 20, true), (64 << 10, true)] {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("s");
            let a = restore_bulk(&p, &log, 0, 20_000, budget, read_ahead);
            let store = Store::open(&p, false).unwrap();
            assert_eq!(dump(&store), m, "budget {budget}, read-ahead {read_ahead}");
            assert_eq!(store.offset("t-0").unwrap(), last);
            assert_eq!(a.last_offset, last);

            let p2 = dir.path().join("r");
            let s2 = Dest::Store(Store::open_with(&p2, restore_options()).unwrap());
            let mut src = VecSource::new(log.clone(), 0);
            let r = replay(
                Target { store: &s2, tp: "t-0", end: 20_000 },
                &mut src,
                1000,
                read_ahead,
                &mut Progress::new(None, Duration::ZERO),
            )
            .unwrap();
            assert_eq!(r, a);
        }
    }

    #[test]
    fn split_across_threads_restores_what_one_thread_does() {
        // tombstones, overwrites, null keys; a large budget (one sort, split)
        // and small ones (spilled runs with a key in several, the newest
        // winning; merged by range), over a new store and over existing data
        let log = random_log(30_000, 4_000, 17);
        let (m, last) = model(&log, 30_000);
        for budget in [64 << 20, 256 << 10, 64 << 10] {
            for (start, resume) in [(0, false), (10_000, true)] {
                let dir = tempfile::tempdir().unwrap();
                let mut want = None;
                for threads in [1, 2, 3, 8] {
                    let p = dir.path().join(format!("s{threads}"));
                    if resume {
                        restore_bulk_threads(&p, &log, 0, start, budget, 1);
                    }
                    let a = restore_bulk_threads(&p, &log, if resume { start } else { 0 }, 30_000, budget, threads);
                    let store = Store::open(&p, false).unwrap();
                    let got = (dump(&store), store.offset("t-0").unwrap(), a);
                    assert_eq!((&got.0, got.1), (&m, last), "budget {budget}, {threads} threads, resume {resume}");
                    match &want {
                        None => want = Some(got),
                        Some(w) => assert_eq!(w, &got, "budget {budget}, {threads} threads, resume {resume}"),
                    }
                }
            }
        }
    }

    #[test]
    fn sst_files_are_cut_at_their_target_size() {
        // The writer asks a file's size only once the bytes added could have
        // reached the target: each file still ends at the first record that
        // takes it past the target.
        let dir = tempfile::tempdir().unwrap();
        let store = Dest::Store(Store::open_with(&dir.path().join("s"), restore_options()).unwrap());
        let scratch = dir.path().join("scratch");
        std::fs::create_dir(&scratch).unwrap();
        let opts = restore_options();
        let target = 64 << 10;
        let mut out = SstOut::new(&opts, &scratch, target, &store, 0);
        let value = [7u8; 100];
        for i in 0..20_000u32 {
            assert!(out.add(format!("key-{i:012}").as_bytes(), (i % 9 != 0).then_some(&value[..])).is_ok());
        }
        let Ok(mut files) = out.finish() else { panic!("finishing the files failed") };
        let files = files.remove(&0).unwrap();
        let sizes: Vec<u64> = files.iter().map(|f| std::fs::metadata(f).unwrap().len()).collect();
        assert!(sizes.len() > 20, "{sizes:?}");
        let (last, full) = sizes.split_last().unwrap();
        // A file's size counts its data blocks; the index and filter come on top at its end.
        assert!(full.iter().all(|&n| n >= target && n < target + (16 << 10)), "{sizes:?}");
        assert!(*last < target + (16 << 10), "{sizes:?}");
    }

    #[test]
    fn split_ranges_may_be_empty() {
        // fewer keys than threads, one key, no data at all: every range
        // that gets nothing writes no file, and the store is still right
        for keys in [0usize, 1, 3] {
            let log: Vec<Entry> = (0..50)
                .map(|i| Entry::Data {
                    key: (keys > 0).then(|| format!("k{}", i % keys.max(1)).into_bytes()),
                    value: Some(vec![i as u8; 3]),
                })
                .collect();
            let (m, last) = model(&log, 50);
            for budget in [64 << 20, 64 << 10] {
                let dir = tempfile::tempdir().unwrap();
                let p = dir.path().join("s");
                restore_bulk_threads(&p, &log, 0, 50, budget, 8);
                let store = Store::open(&p, false).unwrap();
                assert_eq!((dump(&store), store.offset("t-0").unwrap()), (m.clone(), last), "{keys} keys");
            }
        }
    }

    #[test]
    fn bulk_resume_over_existing_data_applies_tombstones() {
        let log = random_log(8_000, 500, 11);
        for (budget, read_ahead) in [(64 << 20, false), (64 << 10, true)] {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("s");
            restore_bulk(&p, &log, 0, 3_000, budget, read_ahead);
            let off = Store::open(&p, false).unwrap().offset("t-0").unwrap().unwrap();
            restore_bulk(&p, &log, off + 1, 8_000, budget, read_ahead);
            let store = Store::open(&p, false).unwrap();
            let (m, last) = model(&log, 8_000);
            assert_eq!(dump(&store), m);
            assert_eq!(store.offset("t-0").unwrap(), last);
        }
    }

    #[test]
    fn timestamped_bulk_and_replay_write_timestamp_and_value_into_their_own_family() {
        use crate::restore::testing::model_format;
        use crate::store::{StoreFormat, TIMESTAMPED_CF, TIMESTAMPED_HEADERS_CF};
        let log = random_log(12_000, 900, 21);
        for (format, cf) in
            [(StoreFormat::Timestamped, TIMESTAMPED_CF), (StoreFormat::TimestampedHeaders, TIMESTAMPED_HEADERS_CF)]
        {
            let want = model_format(&log, 12_000, format);
            if format == StoreFormat::Timestamped {
                assert_eq!(want, model_timestamped(&log, 12_000));
            }
            let dir = tempfile::tempdir().unwrap();
            for (name, budget, bulk_mode) in [("bulk", 64 << 20, true), ("spill", 64 << 10, true), ("replay", 0, false)]
            {
                let p = dir.path().join(name);
                {
                    let store = Dest::Store(Store::open_format(&p, restore_options(), format).unwrap());
                    let mut src = VecSource::new(log.clone(), 0);
                    let mut pr = Progress::new(None, Duration::ZERO);
                    if bulk_mode {
                        let mut opts = BulkOptions::new(budget);
                        opts.chunk_bytes = 300;
                        bulk(Target { store: &store, tp: "t-0", end: 12_000 }, &mut src, &opts, &mut pr).unwrap();
                    } else {
                        replay(Target { store: &store, tp: "t-0", end: 12_000 }, &mut src, 1000, true, &mut pr)
                            .unwrap();
                    }
                }
                let mut cfs = DB::list_cf(&Options::default(), &p).unwrap();
                cfs.sort();
                let mut expected = vec!["default", cf, "offsets"];
                expected.sort();
                assert_eq!(cfs, expected, "{name}");
                let store = Store::open(&p, false).unwrap();
                assert_eq!(store.format(), format, "{name}: detected from its families");
                assert_eq!(dump(&store), want, "{format:?} {name}");
                assert!(
                    store.db().iterator(rocksdb::IteratorMode::Start).next().is_none(),
                    "{name}: default stays empty"
                );
                assert_eq!(store.offset("t-0").unwrap(), model(&log, 12_000).1);
            }
            // a store of one format is never opened as another
            let e = Store::open_format(&dir.path().join("bulk"), restore_options(), StoreFormat::Plain).err().unwrap();
            assert!(e.to_string().contains(format.name()), "{e}");
        }
    }

    #[test]
    fn a_failing_source_leaves_the_store_untouched() {
        let log = random_log(5_000, 300, 5);
        for read_ahead in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("s");
            restore_bulk(&p, &log, 0, 2_000, 1 << 20, false);
            let before = dump(&Store::open(&p, false).unwrap());
            let off = Store::open(&p, false).unwrap().offset("t-0").unwrap().unwrap();
            {
                let store = Dest::Store(Store::open_with(&p, restore_options()).unwrap());
                let mut src = VecSource::new(log.clone(), off + 1);
                src.fail_at = Some(4_500);
                let opts = BulkOptions { read_ahead, ..BulkOptions::new(64 << 10) };
                let opts = BulkOptions { chunk_bytes: 300, sst_target_bytes: 4096, ..opts };
                let e = bulk(
                    Target { store: &store, tp: "t-0", end: 5_000 },
                    &mut src,
                    &opts,
                    &mut Progress::new(None, Duration::ZERO),
                )
                .unwrap_err();
                assert_eq!(e.kind, ErrorKind::CorruptLog, "read-ahead {read_ahead}");
                assert_eq!(e.offset, Some(4_500), "read-ahead {read_ahead}: the offset it stopped at");
            }
            let store = Store::open(&p, false).unwrap();
            assert_eq!(dump(&store), before);
            assert_eq!(store.offset("t-0").unwrap(), Some(off));
            assert!(!scratch_dir(&p).exists());
        }
    }
}
