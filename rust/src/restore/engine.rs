//! The restore engine: for one (store, changelog partition) pair, decide where
//! to start (the store's recorded offset + 1, else the log's start), where to
//! end (the requested end, else the last stable offset), which mode to use
//! (bulk for an empty store, replay otherwise, unless asked; a versioned
//! store always replays, bulk asked or not), and run it;
//! [`restore_many`] does that for many pairs on a pool of threads.

use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::bulk::{bulk, scratch_dir, BulkOptions, BULK_CHUNK_BYTES};
use super::open_stores::{Held, OpenStores};
use super::replay::{replay_handing_over, Handover, DEFAULT_CHUNK_BYTES};
use super::{
    deferred_compaction_options, restore_options_with, Applied, Dest, ErrorKind, Listener, Progress, ReplayMemory,
    RestoreError, Target, DEFERRED_COMPACTION_OFFSETS,
};
use crate::fileio::deferred::{self, DeferredSyncs};
use crate::offsets::OFFSET_UNKNOWN;
use crate::segments::Segmentation;
use crate::source::{Bounds, Changelog, ChangelogSource, JobPart, LogError, SkipCounts};
use crate::store::{StoreFormat, DEFAULT_LEVEL0_STOP_FILES};

/// How to restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Bulk when the store holds no data, replay otherwise.
    Auto,
    Replay,
    Bulk,
}

impl Mode {
    /// Every mode, in the order names are listed to users (the one list:
    /// `_native.MODES` and every "use one of" message come from it).
    pub const ALL: [Mode; 3] = [Mode::Auto, Mode::Replay, Mode::Bulk];

    /// The mode named `s` (one of [`Mode::ALL`]'s names), else a message
    /// naming the modes there are.
    pub fn parse(s: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|m| m.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|m| m.name()).collect();
            format!("unknown mode {s:?}: use one of {}", names.join(", "))
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Auto => "auto",
            Mode::Replay => "replay",
            Mode::Bulk => "bulk",
        }
    }
}

/// Memory a restore may hold unless told otherwise ([`RestoreSpec::memory_budget`]), and what the
/// stores an [`OpenStores`] keeps share by default: 256 MiB. Python reads it from the module.
pub const DEFAULT_MEMORY_BUDGET: usize = 256 << 20;

/// One restore to do.
#[derive(Debug, Clone)]
pub struct RestoreSpec {
    pub store_path: PathBuf,
    pub topic: String,
    pub partition: i32,
    /// Exclusive end; `None`: the last stable offset when the restore starts.
    pub end_offset: Option<i64>,
    pub mode: Mode,
    /// Bytes a restore may hold in memory: a bulk restore's keys, values and merge buffers, a
    /// replay's batches and memtables ([`ReplayMemory`]); [`DEFAULT_MEMORY_BUDGET`] by default.
    pub memory_budget: usize,
    /// Least time between two progress calls of the listener.
    pub progress_interval: Duration,
    /// Most bytes per replay `WriteBatch` (see [`DEFAULT_CHUNK_BYTES`]): a cap on its share of
    /// `memory_budget` ([`ReplayMemory`]).
    pub chunk_bytes: usize,
    /// Memtable size of the store while restoring; `None`: its share of
    /// `memory_budget` ([`ReplayMemory`]).
    pub write_buffer_bytes: Option<usize>,
    /// Decode the log on a second thread while applying (one restore alone).
    /// [`restore_many`] turns it off: there the pool's threads are the
    /// parallelism, one per partition.
    pub read_ahead: bool,
    /// Threads a bulk restore splits its sort, merge and SST writing across
    /// by key range (`bulk::BulkOptions::threads`); 1 by default.
    /// [`restore_many`] gives each restore its share of the job's threads
    /// when the job has fewer restores than threads.
    pub bulk_threads: usize,
    /// How the store lays out its data (Kafka Streams' plain or timestamped
    /// key-value store, window or session store).
    pub format: StoreFormat,
    /// Retention and segment interval of a window or session store (needed
    /// by those formats only).
    pub segmentation: Option<Segmentation>,
    /// Where the store stays open after the restore, for the next restore of
    /// it (the state updater's rounds): taken from there if open, and a
    /// replay leaves it unflushed ([`OpenStores`]). `None`: the store is
    /// flushed and closed.
    pub kept_open: Option<Arc<OpenStores>>,
    /// A replay of at least this many offsets into a key-value store not kept
    /// open defers RocksDB's compactions to its end and merges once
    /// ([`DEFERRED_COMPACTION_OFFSETS`] by default; see
    /// [`deferred_compaction_options`]).
    pub defer_compactions_from: i64,
    /// The topic id the store's records were read under (a Kafka topic's,
    /// [`RestoreOutcome::topic_id`] of its last restore): a read going on
    /// from the store's offset must find the topic under it, or it was
    /// deleted and recreated ([`Changelog::open_held`]). `None`: not known.
    pub topic_id: Option<[u8; 16]>,
}

impl RestoreSpec {
    pub fn new(store_path: PathBuf, topic: &str, partition: i32) -> Self {
        Self {
            store_path,
            topic: topic.to_string(),
            partition,
            end_offset: None,
            mode: Mode::Auto,
            memory_budget: DEFAULT_MEMORY_BUDGET,
            progress_interval: Duration::from_millis(100),
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            write_buffer_bytes: None,
            read_ahead: true,
            bulk_threads: 1,
            format: StoreFormat::Plain,
            segmentation: None,
            kept_open: None,
            defer_compactions_from: DEFERRED_COMPACTION_OFFSETS,
            topic_id: None,
        }
    }

    /// How a replay of this spec shares its memory budget, less the
    /// `buffered` bytes its source holds ([`Changelog::buffered_bytes`]), with
    /// the overrides of `write_buffer_bytes` and `chunk_bytes` (a cap).
    pub fn replay_memory(&self, buffered: usize) -> ReplayMemory {
        let budget = self.memory_budget.saturating_sub(buffered);
        let shares = ReplayMemory::of(budget, self.read_ahead, self.chunk_bytes);
        ReplayMemory { write_buffer_bytes: self.write_buffer_bytes.unwrap_or(shares.write_buffer_bytes), ..shares }
    }

    /// Kafka's `"<topic>-<partition>"`.
    pub fn tp(&self) -> String {
        format!("{}-{}", self.topic, self.partition)
    }
}

/// What one restore did.
#[derive(Debug, Clone, PartialEq)]
pub struct RestoreOutcome {
    /// The mode used (never `Auto`).
    pub mode: Mode,
    pub start_offset: i64,
    pub end_offset: i64,
    pub records_applied: u64,
    pub skipped: SkipCounts,
    pub skipped_null_key: u64,
    pub bytes_read: u64,
    pub seconds: f64,
    /// Of `seconds`, the merge a replay with deferred compactions ends with (0 without one).
    pub merge_seconds: f64,
    /// The offset the store records after the restore.
    pub offset: Option<i64>,
    /// The partition's bounds as the restore leaves the log, when the log can
    /// tell they have not changed since the restore asked for them
    /// ([`Changelog::stamp`]); `None`: ask the log.
    pub log_bounds: Option<Bounds>,
    /// The topic id the records were read under ([`ChangelogSource::topic_id`]; `None`: none read,
    /// or a log without topic ids).
    pub topic_id: Option<[u8; 16]>,
}

/// Restore one store from its changelog partition in `log`. Every error names
/// the store, the partition and, where known, the offset.
pub fn restore(
    log: &dyn Changelog,
    spec: &RestoreSpec,
    listener: Option<&mut dyn Listener>,
) -> Result<RestoreOutcome, RestoreError> {
    restore_prepared(log, spec, None, listener, None)
}

/// [`restore`] of a restore whose first steps were taken by [`prepare`]
/// (perhaps on another thread, ahead of its turn); `None` prepares here.
/// `on_read_all` is called once the restore has read all it restores.
pub fn restore_prepared<'a>(
    log: &dyn Changelog,
    spec: &RestoreSpec,
    prepared: Option<Result<Prepared, RestoreError>>,
    listener: Option<&'a mut dyn Listener>,
    on_read_all: Option<&'a dyn Fn()>,
) -> Result<RestoreOutcome, RestoreError> {
    prepared
        .unwrap_or_else(|| prepare(log, spec))
        .and_then(|p| {
            let (bounds, stamp) = (p.bounds, p.stamp);
            let mut outcome = run_one(spec, p, listener, on_read_all)?;
            // The bounds taken before the restore, if nothing was written to the log since.
            outcome.log_bounds = stamp.filter(|&s| log.stamp(&spec.topic, spec.partition) == Some(s)).map(|_| bounds);
            Ok(outcome)
        })
        .map_err(|e| e.in_restore_of(&spec.store_path, &spec.topic, spec.partition))
}

/// A restore's first steps taken: its store open, its range and mode
/// decided, and its changelog cursor open and asked to start fetching.
/// Nothing of it is applied yet, and the listener has not been called.
pub struct Prepared {
    store: Held,
    recorded: Option<i64>,
    start: i64,
    end: i64,
    mode: Mode,
    /// `None` when there is nothing to restore.
    source: Option<Box<dyn ChangelogSource>>,
    /// A replay's shares of the memory budget, beside what the source buffers.
    memory: ReplayMemory,
    /// Time the preparation took (counted in the restore's seconds).
    took: Duration,
    /// The partition's bounds, and the log's stamp taken before them.
    bounds: Bounds,
    stamp: Option<u64>,
    /// The store was opened with its compactions deferred to the end of the replay.
    compactions_deferred: bool,
}

/// Take a restore's first steps: open (or create) its store, ask the log for
/// the partition's bounds, decide the range and the mode, open the cursor and
/// let it start fetching ([`ChangelogSource::prime`]). A store that does not
/// exist yet records no offset, so its cursor starts fetching before the
/// store is created: RocksDB creating a database (a dozen fsyncs) and the
/// first fetch response overlap.
pub fn prepare(log: &dyn Changelog, spec: &RestoreSpec) -> Result<Prepared, RestoreError> {
    let t0 = Instant::now();
    let tp = spec.tp();
    let path = &spec.store_path;
    // A job that created the store and deferred its syncs did not finish: keep it or wipe it.
    deferred::recover(path).map_err(|e| {
        RestoreError::new(ErrorKind::Restore, format!("restoring store {} from {tp}: {e}", path.display()))
    })?;
    let log_err = |e: LogError| RestoreError::log(e, format!("restoring store {} from {tp}", path.display()));
    let memory = spec.replay_memory(log.buffered_bytes());
    let open = |deferred: bool, new: bool| {
        let mut opts =
            if deferred { deferred_compaction_options } else { restore_options_with }(memory.write_buffer_bytes);
        if new {
            // A new database has no table to load: no thread started (and joined) to load them.
            opts.set_max_file_opening_threads(1);
        }
        Dest::open(path, opts, spec.format, spec.segmentation)
            .map(|store| Held::new(store, spec.kept_open.as_ref()))
            .map_err(|e| RestoreError::store(&tp, e))
    };
    let offset_of = |store: &Dest| store.offset(&tp).map_err(|e| RestoreError::store(&tp, e));
    // A store that does not exist yet records no offset: it is created after its cursor is primed.
    let existing = match spec.kept_open.as_ref().and_then(|kept| Held::take(kept, path)) {
        Some(store) if store.format() != spec.format => {
            let open_as = store.format();
            return Err(RestoreError::new(
                ErrorKind::Restore,
                format!(
                    "restoring store {} from {tp} as a {} store: it is open as a {} store; close it first",
                    path.display(),
                    spec.format.name(),
                    open_as.name()
                ),
            ));
        }
        Some(store) => Some(store),
        None if Dest::exists(path, spec.format) => Some(open(false, false)?),
        None => None,
    };
    // Kafka Streams' "no offset yet" is no position: such a store restores from the changelog's start.
    let recorded = existing.as_deref().map(offset_of).transpose()?.flatten().filter(|&o| o != OFFSET_UNKNOWN);
    let stamp = log.stamp(&spec.topic, spec.partition);
    let bounds = log.bounds(&spec.topic, spec.partition).map_err(log_err)?;
    let out_of_range = |msg: String| {
        RestoreError::new(ErrorKind::OutOfRange, format!("restoring store {} from {tp}: {msg}", path.display()))
    };
    let start = match recorded {
        Some(o) if o + 1 < bounds.start => {
            return Err(out_of_range(format!(
                "the store records offset {o} but the log starts at {}: records between were deleted; \
                 wipe the store and restore it from the start",
                bounds.start
            ))
            .with_offset(o))
        }
        Some(o) if o + 1 > bounds.end => {
            return Err(out_of_range(format!(
                "the store records offset {o} but the log ends at {}: the store is ahead of its changelog; \
                 wipe the store and restore it from the start",
                bounds.end
            ))
            .with_offset(o))
        }
        Some(o) => o + 1,
        None => bounds.start,
    };
    let end = end_of(spec, &bounds, &tp, path)?;
    let source = if start < end {
        let mut s = log.open_held(&spec.topic, spec.partition, start, spec.topic_id).map_err(log_err)?;
        s.prime(end);
        Some(s)
    } else {
        None
    };
    let mode = match spec.mode {
        // Where a version goes depends on every record before it: a versioned store is always replayed.
        _ if spec.format.is_versioned() => Mode::Replay,
        Mode::Auto if existing.as_deref().is_none_or(Dest::is_data_empty) => Mode::Bulk,
        Mode::Auto => Mode::Replay,
        m => m,
    };
    let deferred = defers_compactions(spec, mode, end - start, existing.as_deref());
    let store = match existing {
        Some(store) if deferred => {
            drop(store); // closed (a store kept open is never deferred), to open again deferring
            open(true, false)?
        }
        Some(store) => store,
        None => {
            let store = open(deferred, true)?;
            if let Some(o) = offset_of(&store)? {
                return Err(RestoreError::new(
                    ErrorKind::Restore,
                    format!(
                        "restoring store {}: the store appeared while its restore began, recording offset {o}; \
                         is another process restoring it?",
                        path.display()
                    ),
                )
                .with_offset(o));
            }
            store
        }
    };
    let took = t0.elapsed();
    Ok(Prepared {
        store,
        recorded,
        start,
        end,
        mode,
        source,
        memory,
        took,
        bounds,
        stamp,
        compactions_deferred: deferred,
    })
}

/// Whether a restore's replay defers RocksDB's compactions to its end: a
/// key-value store's replay (which never reads) of at least
/// [`RestoreSpec::defer_compactions_from`] offsets, or of a store whose level
/// 0 already holds as many files as would stop writes (a deferred replay
/// killed before its merge: merged even when nothing is left to replay).
/// Never a store kept open between the state
/// updater's rounds, which are short and would each end in a merge.
fn defers_compactions(spec: &RestoreSpec, mode: Mode, offsets: i64, existing: Option<&Dest>) -> bool {
    let piled_up = matches!(existing, Some(Dest::Store(s)) if s.level0_files() >= DEFAULT_LEVEL0_STOP_FILES);
    mode == Mode::Replay
        && spec.format.is_key_value()
        && spec.kept_open.is_none()
        && (piled_up || offsets > 0 && offsets >= spec.defer_compactions_from)
}

/// The exclusive end of a restore: the one asked for, else the last stable
/// offset; an end beyond the last stable offset is refused.
fn end_of(spec: &RestoreSpec, bounds: &Bounds, tp: &str, path: &Path) -> Result<i64, RestoreError> {
    match spec.end_offset {
        Some(e) if e > bounds.last_stable => Err(RestoreError::new(
            ErrorKind::Restore,
            format!(
                "restoring store {} from {tp}: end offset {e} is beyond the last stable offset {} (log end {}); \
                 ask for at most {}",
                path.display(),
                bounds.last_stable,
                bounds.end,
                bounds.last_stable
            ),
        )),
        Some(e) => Ok(e),
        None => Ok(bounds.last_stable),
    }
}

fn run_one<'a>(
    spec: &RestoreSpec,
    prepared: Prepared,
    listener: Option<&'a mut dyn Listener>,
    on_read_all: Option<&'a dyn Fn()>,
) -> Result<RestoreOutcome, RestoreError> {
    let t0 = Instant::now();
    let Prepared { store, recorded, start, end, mode, source, memory, took, compactions_deferred, .. } = prepared;
    let tp = spec.tp();
    let path = &spec.store_path;
    let scratch = scratch_dir(path);
    if scratch.exists() {
        std::fs::remove_dir_all(&scratch).map_err(|e| {
            RestoreError::new(
                ErrorKind::Restore,
                format!(
                    "restoring {}: cannot remove stale scratch directory {}: {e}",
                    path.display(),
                    scratch.display()
                ),
            )
        })?;
    }
    let bad = |msg: String| {
        RestoreError::new(ErrorKind::Restore, format!("restoring store {} from {tp}: {msg}", path.display()))
    };
    let mut progress = Progress::new(listener, spec.progress_interval);
    progress.set_context(format!("restoring store {} from {tp}", path.display()));
    progress.set_on_read_all(on_read_all);
    progress.start(start, end.max(start))?;
    let mut outcome = RestoreOutcome {
        mode,
        start_offset: start,
        end_offset: end.max(start),
        records_applied: 0,
        skipped: SkipCounts::default(),
        skipped_null_key: 0,
        bytes_read: 0,
        seconds: 0.0,
        merge_seconds: 0.0,
        offset: recorded,
        log_bounds: None,
        topic_id: None,
    };
    // A store no processor ever opened is closed: say so, as Kafka Streams
    // expects of a store it may reuse under exactly_once_v2. A status a
    // processor wrote (OPEN while it runs) is left alone. Written first, it
    // reaches disk with the restore's own flush (one flush, not two); a
    // restore that stops on an error leaves a committed state with its
    // offset, which CLOSED describes truly.
    let unmarked = store.close_unmarked().map_err(|e| RestoreError::store(&tp, e))?;
    if let Some(mut source) = source.filter(|_| start < end) {
        let target = Target { store: &store, tp: &tp, end };
        let applied: Applied = match mode {
            Mode::Bulk => {
                let opts = BulkOptions {
                    memory_budget: spec.memory_budget,
                    chunk_bytes: spec.chunk_bytes.min(BULK_CHUNK_BYTES),
                    sst_target_bytes: 128 << 20,
                    read_ahead: spec.read_ahead,
                    threads: spec.bulk_threads,
                };
                bulk(target, source.as_mut(), &opts, &mut progress)?
            }
            _ => {
                let handover = if spec.kept_open.is_some() {
                    Handover::KeptOpen
                } else if compactions_deferred {
                    Handover::Compacted
                } else {
                    Handover::Flushed
                };
                replay_handing_over(
                    target,
                    source.as_mut(),
                    memory.chunk_bytes,
                    spec.read_ahead,
                    handover,
                    &mut progress,
                )?
            }
        };
        if source.position() < end {
            return Err(bad(format!(
                "the log ended at offset {} before the end offset {end}; the store keeps what was applied, \
                 with its offset",
                source.position()
            )));
        }
        outcome.records_applied = applied.records;
        outcome.skipped = source.skipped();
        outcome.skipped_null_key = applied.null_keys;
        outcome.bytes_read = source.bytes_read();
        outcome.topic_id = source.topic_id();
        outcome.merge_seconds = applied.merge.as_secs_f64();
        if applied.last_offset.is_some() {
            outcome.offset = applied.last_offset;
        }
    } else {
        if unmarked {
            store.flush().map_err(|e| RestoreError::store(&tp, e))?; // nothing restored flushed the status
        }
        if compactions_deferred {
            let t0 = Instant::now();
            store.compact_all().map_err(|e| RestoreError::store(&tp, e))?; // a level 0 left piled up
            outcome.merge_seconds = t0.elapsed().as_secs_f64();
        }
    }
    progress.end(outcome.records_applied)?;
    outcome.seconds = (took + t0.elapsed()).as_secs_f64();
    store.give_back().map_err(|e| RestoreError::store(&tp, e))?; // after an error, dropping it gives it back
    Ok(outcome)
}

/// Where a job of [`run_pipeline`] is.
enum Slot<T, P> {
    /// Not taken by anyone yet.
    Waiting(T),
    /// The preparer is taking its first steps.
    Preparing,
    /// Prepared ahead (`None`: the job was not to be prepared ahead; `Err`:
    /// its preparation panicked, with the message).
    Ready(T, Result<Option<P>, String>),
    /// A worker runs it.
    Taken,
}

/// How far [`run_pipeline`] prepares its jobs ahead of its workers: on how
/// many preparer threads, and how many jobs beyond those the workers took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lookahead {
    pub preparers: usize,
    pub jobs: usize,
}

/// A job of at least this many restores per thread is taken to be one of
/// many small stores ([`Lookahead::of`]).
const MANY_RESTORES_PER_THREAD: usize = 8;

impl Lookahead {
    /// No job prepared ahead: each worker prepares its own.
    pub const NONE: Lookahead = Lookahead { preparers: 0, jobs: 0 };

    /// How `restore_many` on `threads` threads prepares `restores` restores
    /// ahead, `buffers` telling whether a prepared restore holds fetched log
    /// (a Kafka cursor primed). The one policy for every caller:
    ///
    /// - Many restores per thread, none holding fetched log (many small
    ///   stores from the segment log): 4 preparers, 8 jobs ahead, whatever
    ///   the cores. Creating a store waits on a dozen of RocksDB's fsyncs,
    ///   so several creations overlap each other and the workers' CPU: 1,024
    ///   stores of ~3,900 records took 4.0-4.6 s instead of 6.3-7.5 s on 2
    ///   threads and 2 cores (the same records in 4 partitions: 0.5-0.7 s
    ///   either way; 8 preparers 16 ahead were no faster). With
    ///   Kafka, a store prepared ahead holds its first responses, so the
    ///   memory of 8 would be outside the budget.
    /// - Otherwise one preparer, one job ahead, only when the threads leave
    ///   a core free. With a restore thread on every core a third busy
    ///   thread beside two bulk restores (which are bound by cache misses)
    ///   slowed them by ~8% (the segment log, 4 partitions of 500k records:
    ///   112 ms -> 122 ms), while one restore thread beside it gained ~16%
    ///   (205 ms -> 171 ms). From Kafka it is the same: 4 partitions of 2M
    ///   records on 2 threads and 2 cores took 2.44 s with a preparer and
    ///   2.08 s without (of 400k records, 0.38 s with and 0.46 s without:
    ///   only small restores gain), and on 1 thread 3.06 s with, 3.30 s
    ///   without.
    pub fn of(threads: usize, restores: usize, buffers: bool) -> Lookahead {
        let threads = threads.max(1);
        if !buffers && restores >= MANY_RESTORES_PER_THREAD * threads {
            Lookahead { preparers: 4, jobs: 8 }
        } else if crate::threads::cores() > threads {
            Lookahead { preparers: 1, jobs: 1 }
        } else {
            Lookahead::NONE
        }
    }

    /// Whether job `i` may be prepared now that `line`'s workers took
    /// `line.next` jobs and `line.read_count` said they read all they read.
    fn allows<T, P>(&self, i: usize, line: &Line<T, P>, workers: usize) -> bool {
        i < line.next + self.jobs && i + 1 < line.read_count + workers + self.jobs
    }
}

/// Where [`run_pipeline`]'s jobs are: the next job to take and the next to
/// prepare, each job's slot, which jobs said they read all they read, and
/// how many did.
struct Line<T, P> {
    next: usize,
    to_prepare: usize,
    slots: Vec<Slot<T, P>>,
    read: Vec<bool>,
    read_count: usize,
}

impl<T, P> Line<T, P> {
    /// Job `i` read all it reads (said once; a job that ends says it too).
    fn read_all(&mut self, i: usize) -> bool {
        let first = !std::mem::replace(&mut self.read[i], true);
        self.read_count += usize::from(first);
        first
    }
}

/// The message of a caught panic.
fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

/// Run `f` on every job on `threads` worker threads (at least one, at most
/// one per job); results come back in job order. A panic in one job becomes
/// that job's `on_panic` result and leaves the others running.
///
/// Preparers (`lookahead`) run beside the workers and take the next jobs'
/// first steps (`prepare`, e.g. [`prepare`]: creating a store, asking the
/// broker for offsets, the first fetch), which wait mostly on the disk and the
/// network. A job is prepared once it is at most `lookahead.jobs` beyond the
/// jobs the workers took, and the jobs before it that hold the workers have
/// read all they read (`f` is given a function to say so, for the job it runs):
/// a restore then spends its last phase writing (a bulk restore's sort and
/// SST files), on its own core, while the next one's first responses arrive
/// on the other, instead of taking the fetch thread's core while it is the
/// one that holds restores back. `prepare` returns `None` for a job that must
/// not be prepared off its worker's thread; the worker then runs it
/// unprepared. A worker whose job is being prepared waits for it; a job the
/// preparer has not reached is run unprepared.
pub fn run_pipeline<T: Send, P: Send, R: Send>(
    jobs: Vec<T>,
    threads: usize,
    lookahead: Lookahead,
    prepare: impl Fn(&T) -> Option<P> + Sync,
    f: impl Fn(T, Option<P>, &dyn Fn()) -> R + Sync,
    on_panic: impl Fn(String) -> R + Sync,
) -> Vec<R> {
    let n = jobs.len();
    let line = Mutex::new(Line {
        next: 0,
        to_prepare: 0,
        slots: jobs.into_iter().map(Slot::Waiting).collect::<Vec<Slot<T, P>>>(),
        read: vec![false; n],
        read_count: 0,
    });
    let changed = Condvar::new();
    let lock = || line.lock().unwrap_or_else(|p| p.into_inner());
    let read_all = |i: usize| {
        if lock().read_all(i) {
            changed.notify_all();
        }
    };
    let results: Vec<Mutex<Option<R>>> = (0..n).map(|_| Mutex::new(None)).collect();
    let workers = threads.clamp(1, n.max(1));
    std::thread::scope(|s| {
        for _ in 0..lookahead.preparers {
            s.spawn(|| loop {
                let mut l = lock();
                while l.to_prepare < n && !lookahead.allows(l.to_prepare, &l, workers) {
                    l = changed.wait(l).unwrap_or_else(|p| p.into_inner());
                }
                let i = l.to_prepare;
                if i >= n {
                    return;
                }
                l.to_prepare += 1;
                let Slot::Waiting(job) = std::mem::replace(&mut l.slots[i], Slot::Preparing) else {
                    l.slots[i] = Slot::Taken; // a worker took it first
                    continue;
                };
                drop(l);
                let p = catch_unwind(AssertUnwindSafe(|| prepare(&job))).map_err(panic_message);
                lock().slots[i] = Slot::Ready(job, p);
                changed.notify_all();
            });
        }
        for _ in 0..workers {
            s.spawn(|| loop {
                let mut l = lock();
                let i = l.next;
                if i >= n {
                    return;
                }
                l.next += 1;
                changed.notify_all(); // the preparer may go on to the next job
                let (job, prepared) = loop {
                    match std::mem::replace(&mut l.slots[i], Slot::Taken) {
                        Slot::Waiting(job) => break (job, Ok(None)),
                        Slot::Ready(job, p) => break (job, p),
                        Slot::Preparing => {
                            l.slots[i] = Slot::Preparing;
                            l = changed.wait(l).unwrap_or_else(|p| p.into_inner());
                        }
                        Slot::Taken => unreachable!("each job is taken once"),
                    }
                };
                drop(l);
                let done = || read_all(i);
                let r = match prepared {
                    Ok(p) => catch_unwind(AssertUnwindSafe(|| f(job, p, &done)))
                        .unwrap_or_else(|p| on_panic(panic_message(p))),
                    Err(msg) => on_panic(msg),
                };
                read_all(i);
                *results[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
            });
        }
    });
    results.into_iter().map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()).expect("every job ran")).collect()
}

/// What one of `restores` restores of a job on `threads` threads may use:
/// one thread (no read-ahead), the pool's threads being the parallelism; or,
/// when the job has fewer restores than threads, its share of them
/// (`threads / restores`, if two or more): read-ahead while it reads, and a
/// bulk restore's sort, merge and SST writing split by key range across that
/// many threads ([`RestoreSpec::bulk_threads`]).
pub fn share_threads(spec: &mut RestoreSpec, threads: usize, restores: usize) {
    let share = threads.max(1) / restores.max(1);
    spec.read_ahead = share >= 2;
    spec.bulk_threads = share.max(1);
}

/// Restore many (store, partition) pairs on `threads` threads, each restore
/// on one thread (no read-ahead), the next restores prepared ahead
/// ([`run_pipeline`], [`Lookahead::of`]), all reading through the log's changelog for one job
/// ([`Changelog::for_job`]). Each pair's result is its own: a failure leaves the
/// other restores running.
///
/// A job with fewer restores than threads would leave threads idle: each
/// restore then gets its share of them ([`share_threads`]), so one huge
/// partition uses every core the job was given.
pub fn restore_many(
    log: &dyn Changelog,
    specs: Vec<(RestoreSpec, Option<Box<dyn Listener>>)>,
    threads: usize,
) -> Vec<Result<RestoreOutcome, RestoreError>> {
    let job = log.for_job();
    let log: &dyn Changelog = match &job {
        Some(j) => &**j,
        None => log,
    };
    log.read_ahead(&specs.iter().map(|(s, _)| job_part(s)).collect::<Vec<_>>());
    let jobs = specs.into_iter().map(|(spec, listener)| OneLog { log, spec, listener }).collect();
    restore_jobs(jobs, threads)
}

/// The partition `spec` restores, for [`Changelog::read_ahead`], with the
/// offset its restore will start from when its store is kept open (and no
/// end offset is asked for: the read goes to the last stable offset).
pub fn job_part(spec: &RestoreSpec) -> JobPart {
    let start = match (&spec.kept_open, spec.end_offset) {
        (Some(kept), None) => kept.start_of(&spec.store_path, &spec.tp()),
        _ => None,
    };
    JobPart { topic: spec.topic.clone(), partition: spec.partition, start }
}

/// One restore of a job [`restore_jobs`] runs: the log it reads, its spec and
/// its listener.
pub trait RestoreJob: Send {
    /// The log and the spec, to prepare the restore.
    fn parts(&self) -> (&dyn Changelog, &RestoreSpec);
    /// The log, the spec and the listener, to share the threads and to run it.
    fn parts_mut(&mut self) -> (&dyn Changelog, &mut RestoreSpec, Option<&mut dyn Listener>);
}

/// A restore of [`restore_many`]: every one reads the same log.
struct OneLog<'a> {
    log: &'a dyn Changelog,
    spec: RestoreSpec,
    listener: Option<Box<dyn Listener>>,
}

impl RestoreJob for OneLog<'_> {
    fn parts(&self) -> (&dyn Changelog, &RestoreSpec) {
        (self.log, &self.spec)
    }
    fn parts_mut(&mut self) -> (&dyn Changelog, &mut RestoreSpec, Option<&mut dyn Listener>) {
        (self.log, &mut self.spec, self.listener.as_mut().map(|b| &mut **b as &mut dyn Listener))
    }
}

/// Run `jobs` on `threads` threads, the one way both `restore_many`s (this
/// module's and the Python binding's, whose restores each have a log of
/// their own) do it: each restore takes its share of the threads
/// ([`share_threads`]) before it is prepared, as the preparation sizes its
/// replay's chunks by it, and the restores are prepared as far ahead as
/// [`Lookahead::of`] allows for their logs ([`run_pipeline`]).
pub fn restore_jobs<J: RestoreJob>(mut jobs: Vec<J>, threads: usize) -> Vec<Result<RestoreOutcome, RestoreError>> {
    let restores = jobs.len();
    for j in &mut jobs {
        share_threads(j.parts_mut().1, threads, restores);
    }
    let buffers = jobs.iter().any(|j| j.parts().0.buffered_bytes() > 0);
    let syncs = defer_syncs(&jobs);
    let deferred: Vec<(usize, PathBuf)> = {
        let stores: HashSet<&Path> = syncs.stores().collect();
        let path = |i: usize| &jobs[i].parts().1.store_path;
        (0..restores).filter(|&i| stores.contains(path(i).as_path())).map(|i| (i, path(i).clone())).collect()
    };
    let mut out = run_pipeline(
        jobs,
        threads,
        Lookahead::of(threads, restores, buffers),
        |j| {
            let (log, spec) = j.parts();
            log.prepares_ahead().then(|| prepare(log, spec))
        },
        |mut j, prepared, read_all| {
            let (log, spec, listener) = j.parts_mut();
            restore_prepared(log, spec, prepared, listener, Some(read_all))
        },
        |msg| Err(RestoreError::new(ErrorKind::Restore, format!("restore panicked: {msg}"))),
    );
    if let Err(e) = syncs.finish() {
        for (i, path) in deferred {
            if out[i].is_ok() {
                out[i] = Err(RestoreError::new(
                    ErrorKind::Restore,
                    format!("restored store {} but could not make it durable: {e}", path.display()),
                ));
            }
        }
    }
    out
}

/// How many stores a job must create before their syncs are deferred to its
/// end ([`deferred`]): a job's two file-system syncs cost about what one new
/// store's dozen syncs do.
pub const DEFER_SYNCS_FROM: usize = 2;

/// Defer the syncs of the stores `jobs` create (that do not exist yet), when
/// they are at least [`DEFER_SYNCS_FROM`]: each new store's RocksDB syncs
/// become one sync of the file system at the job's end.
fn defer_syncs<J: RestoreJob>(jobs: &[J]) -> DeferredSyncs {
    let new: Vec<&Path> = jobs
        .iter()
        .map(|j| j.parts().1)
        .filter(|spec| !Dest::exists(&spec.store_path, spec.format))
        .map(|spec| spec.store_path.as_path())
        .collect();
    DeferredSyncs::begin(if new.len() >= DEFER_SYNCS_FROM { new } else { Vec::new() }, scratch_dir)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::restore::testing::*;
    use crate::source::{Bounds, ChangelogSource};
    use crate::store::Store;

    struct VecLog(HashMap<(String, i32), Vec<Entry>>);

    impl Changelog for VecLog {
        fn bounds(&self, topic: &str, partition: i32) -> Result<Bounds, LogError> {
            let log = self
                .0
                .get(&(topic.to_string(), partition))
                .ok_or_else(|| LogError::other(format!("no partition {topic}-{partition}")))?;
            Ok(Bounds { start: 0, end: log.len() as i64, last_stable: log.len() as i64 })
        }
        fn open(&self, topic: &str, partition: i32, start: i64) -> Result<Box<dyn ChangelogSource>, LogError> {
            let log = self.0.get(&(topic.to_string(), partition)).expect("checked by bounds");
            Ok(Box::new(VecSource::new(log.clone(), start)))
        }
    }

    /// A [`VecLog`] whose sources hold `buffered` bytes of fetched log.
    struct Buffering(VecLog, usize);

    impl Changelog for Buffering {
        fn bounds(&self, topic: &str, partition: i32) -> Result<Bounds, LogError> {
            self.0.bounds(topic, partition)
        }
        fn open(&self, topic: &str, partition: i32, start: i64) -> Result<Box<dyn ChangelogSource>, LogError> {
            self.0.open(topic, partition, start)
        }
        fn buffered_bytes(&self) -> usize {
            self.1
        }
    }

    #[test]
    fn a_replay_shares_what_its_source_leaves_of_the_budget() {
        // 256 MiB less the 64 MiB a source buffers: memtables of 24 MiB, not 32.
        let dir = tempfile::tempdir().unwrap();
        let log = random_log(2_000, 100, 3);
        let mut spec = RestoreSpec::new(dir.path().join("s"), "t", 0);
        spec.mode = Mode::Replay;
        assert_eq!(spec.replay_memory(0).write_buffer_bytes, 32 << 20);
        assert_eq!(spec.replay_memory(64 << 20), ReplayMemory::of(192 << 20, true, spec.chunk_bytes));
        let buffering = Buffering(VecLog(HashMap::from([(("t".to_string(), 0), log.clone())])), 64 << 20);
        restore(&buffering, &spec, None).unwrap();
        let options = std::fs::read_dir(&spec.store_path)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("OPTIONS-"))
            .max()
            .unwrap();
        let text = std::fs::read_to_string(options).unwrap();
        let data = text.split("[CFOptions ").find(|section| section.starts_with("\"default\"]")).unwrap();
        assert!(data.contains(&format!("write_buffer_size={}", 24 << 20)), "the data's memtables: {data:.400}");
        let store = Store::open(&spec.store_path, false).unwrap();
        assert_eq!(dump(&store), model(&log, 2_000).0);
    }

    #[test]
    fn a_job_of_new_stores_defers_their_syncs_to_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let logs: Vec<Vec<Entry>> = (0..6).map(|p| random_log(500, 50, 40 + p)).collect();
        let vl = VecLog(logs.iter().enumerate().map(|(p, l)| (("t".to_string(), p as i32), l.clone())).collect());
        let specs = |mode: Mode| -> Vec<(RestoreSpec, Option<Box<dyn Listener>>)> {
            (0..6)
                .map(|p| {
                    let mut spec = RestoreSpec::new(dir.path().join(format!("0_{p}")).join("s"), "t", p);
                    spec.mode = mode;
                    (spec, None)
                })
                .collect()
        };
        for p in 0..6 {
            std::fs::create_dir_all(dir.path().join(format!("0_{p}"))).unwrap();
        }
        let before = deferred::skipped_syncs();
        for o in restore_many(&vl, specs(Mode::Auto), 2) {
            assert_eq!(o.unwrap().mode, Mode::Bulk);
        }
        // Creating a store and ingesting its table alone sync a dozen times; other tests' jobs only add.
        let skipped = deferred::skipped_syncs() - before;
        assert!(skipped >= 6 * 8, "RocksDB's syncs of 6 new stores skipped: {skipped}");
        for (p, log) in logs.iter().enumerate() {
            let path = dir.path().join(format!("0_{p}")).join("s");
            assert!(!deferred::marker_of(&path).exists(), "the job's end removed the marker");
            assert_eq!(dump(&Store::open(&path, false).unwrap()), model(log, 500).0);
        }
        // The stores exist now: a second job creates none and writes no marker.
        assert!(defer_syncs(
            &specs(Mode::Replay)
                .into_iter()
                .map(|(spec, _)| OneLog { log: &vl, spec, listener: None })
                .collect::<Vec<_>>()
        )
        .is_empty());
        for o in restore_many(&vl, specs(Mode::Replay), 2) {
            assert_eq!(o.unwrap().records_applied, 0);
        }
    }

    #[test]
    fn a_store_left_with_a_marker_is_kept_after_a_process_crash_and_wiped_after_a_machine_crash() {
        let dir = tempfile::tempdir().unwrap();
        let log = random_log(1_000, 100, 5);
        let vl = VecLog(HashMap::from([(("t".to_string(), 0), log.clone())]));
        let mut spec = RestoreSpec::new(dir.path().join("whole"), "t", 0);
        spec.mode = Mode::Replay;
        let whole = restore(&vl, &spec, None).unwrap().records_applied;
        spec.store_path = dir.path().join("s");
        spec.end_offset = Some(600);
        let first = restore(&vl, &spec, None).unwrap().records_applied;
        spec.end_offset = None;
        // This boot's marker: the kernel kept every write; the store resumes from its offset.
        std::fs::write(deferred::marker_of(&spec.store_path), deferred::boot_id().unwrap()).unwrap();
        let o = restore(&vl, &spec, None).unwrap();
        assert_eq!((o.start_offset, o.records_applied), (600, whole - first));
        assert!(!deferred::marker_of(&spec.store_path).exists());
        // An earlier boot's: any write may be lost; the store is wiped and restored from the start.
        std::fs::write(deferred::marker_of(&spec.store_path), "an earlier boot").unwrap();
        let o = restore(&vl, &spec, None).unwrap();
        assert_eq!((o.start_offset, o.records_applied), (0, whole));
        assert!(!deferred::marker_of(&spec.store_path).exists());
        assert_eq!(dump(&Store::open(&spec.store_path, false).unwrap()), model(&log, 1_000).0);
    }

    /// The `.sst` files under `dir`.
    fn sst_files(dir: &Path) -> usize {
        std::fs::read_dir(dir).map_or(0, |d| {
            d.filter(|e| e.as_ref().is_ok_and(|e| e.path().extension().is_some_and(|x| x == "sst"))).count()
        })
    }

    #[test]
    fn a_store_kept_open_between_restores_writes_no_file_until_flushed_and_resumes_from_its_unflushed_offset() {
        let dir = tempfile::tempdir().unwrap();
        let log = random_log(3_000, 300, 11);
        let vl = VecLog(HashMap::from([(("t".to_string(), 0), log.clone())]));
        let path = dir.path().join("s");
        let kept = Arc::new(OpenStores::new(64 << 20));
        for (i, end) in [1_000, 2_000, 3_000].into_iter().enumerate() {
            let mut spec = RestoreSpec::new(path.clone(), "t", 0);
            (spec.mode, spec.end_offset, spec.kept_open) = (Mode::Replay, Some(end), Some(kept.clone()));
            // The path spelt another way is the same open store.
            if i == 1 {
                spec.store_path = dir.path().join(".").join("s");
            }
            let o = restore(&vl, &spec, None).unwrap();
            assert_eq!(o.start_offset, end - 1_000, "each round resumes from the open store's offset");
            assert_eq!(kept.paths().len(), 1, "the store stays open after round {i}");
        }
        assert_eq!(sst_files(&path), 0, "no round flushed: a crash now would find the store empty");
        assert!(kept.flush(&path).unwrap());
        assert!(sst_files(&path) > 0);
        assert!(kept.close(&path).unwrap());
        assert!(!kept.close(&path).unwrap(), "closed once");
        let store = Store::open(&path, false).unwrap();
        let (m, last) = model(&log, 3_000);
        assert_eq!(dump(&store), m);
        assert_eq!(store.offset("t-0").unwrap(), last);
    }

    #[test]
    fn a_segmented_store_kept_open_writes_no_file_and_no_offset_until_flushed() {
        use crate::segments::{KeySchema, SegmentsReadOnly};
        let seg = Segmentation::new(300_000, None).unwrap();
        let log = segmented_log(&random_log(6_000, 400, 5), KeySchema::Window);
        let vl = VecLog(HashMap::from([(("t".to_string(), 0), log.clone())]));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w");
        let kept = Arc::new(OpenStores::new(64 << 20));
        let round = |end: i64| {
            let mut spec = RestoreSpec::new(path.clone(), "t", 0);
            (spec.format, spec.segmentation, spec.mode) = (StoreFormat::Window, Some(seg), Mode::Replay);
            (spec.end_offset, spec.kept_open) = (Some(end), Some(kept.clone()));
            restore(&vl, &spec, None).unwrap()
        };
        let segment_files =
            || -> usize { std::fs::read_dir(&path).unwrap().map(|e| sst_files(&e.unwrap().path())).sum() };
        for end in [2_000, 4_000, 6_000] {
            assert_eq!(round(end).start_offset, end - 2_000, "each round resumes from the offset held in memory");
        }
        assert_eq!(segment_files(), 0, "no round flushed a segment");
        let on_disk = SegmentsReadOnly::open(&path).unwrap();
        assert!(on_disk.segments.len() >= 2);
        assert!(on_disk.offsets().unwrap().is_empty(), "no offset on disk covers data still in memtables");
        drop(on_disk);
        assert!(kept.flush(&path).unwrap());
        let (want, last) = model_segmented(&log, 6_000, StoreFormat::Window, seg);
        assert_eq!(segments_of(&path, seg, "t-0", last), want, "flushed: every live segment, its offset");
        assert_eq!(round(6_000).records_applied, 0, "resumed from the recorded offset: nothing left");
        assert!(kept.close(&path).unwrap());
        assert_eq!(segments_of(&path, seg, "t-0", last), want);
    }

    /// The level-0 files of the data of the store at its path after each batch, read through a
    /// read-only handle beside the restore (which takes no lock; an open that meets a file a
    /// compaction of `offsets` just deleted is tried again).
    struct Level0Seen(PathBuf, Vec<u64>);

    impl Listener for Level0Seen {
        fn on_start(&mut self, _: i64, _: i64) -> Result<(), String> {
            Ok(())
        }
        fn on_batch(&mut self, _: i64, _: u64) -> Result<(), String> {
            let store = (0..100).find_map(|_| Store::open_read_only(&self.0).ok()).ok_or("cannot open")?;
            let files = store.db().property_int_value_cf(store.data_cf(), "rocksdb.num-files-at-level0");
            self.1.push(files.ok().flatten().ok_or("no property")?);
            Ok(())
        }
        fn on_end(&mut self, _: u64) -> Result<(), String> {
            Ok(())
        }
    }

    #[test]
    fn a_long_replay_defers_compactions_to_one_merge_at_its_end() {
        // 64 KiB memtables and batches: ~30 level-0 files, where compactions would start at 16.
        let dir = tempfile::tempdir().unwrap();
        let n = 60_000;
        let log = random_log(n, 30_000, 5);
        let vl = VecLog(HashMap::from([(("t".to_string(), 0), log.clone())]));
        let path = dir.path().join("s");
        let mut spec = RestoreSpec::new(path.clone(), "t", 0);
        (spec.mode, spec.write_buffer_bytes, spec.chunk_bytes) = (Mode::Replay, Some(64 << 10), 64 << 10);
        (spec.defer_compactions_from, spec.progress_interval) = (n as i64, Duration::ZERO);
        let mut seen = Level0Seen(path.clone(), Vec::new());
        let o = restore(&vl, &spec, Some(&mut seen)).unwrap();
        assert!(o.merge_seconds > 0.0 && o.merge_seconds < o.seconds, "{o:?}");
        let files = &seen.1;
        assert!(files.windows(2).all(|w| w[0] <= w[1]), "no compaction during the replay: {files:?}");
        assert!(files.last().is_some_and(|&f| f > 24), "{files:?}");
        let store = Store::open(&path, false).unwrap();
        assert_eq!(store.level0_files(), 0, "merged at the end");
        let (m, last) = model(&log, n as i64);
        assert_eq!(dump(&store), m);
        assert_eq!(store.offset("t-0").unwrap(), last);
    }

    #[test]
    fn which_restores_defer_compactions() {
        let dir = tempfile::tempdir().unwrap();
        let spec = |format: StoreFormat, kept: bool| {
            let mut s = RestoreSpec::new(dir.path().join("s"), "t", 0);
            (s.format, s.defer_compactions_from) = (format, 1_000);
            s.kept_open = kept.then(|| Arc::new(OpenStores::new(1 << 20)));
            s
        };
        let plain = spec(StoreFormat::Plain, false);
        assert!(defers_compactions(&plain, Mode::Replay, 1_000, None));
        assert!(!defers_compactions(&plain, Mode::Replay, 999, None), "a short replay compacts as it goes");
        assert!(!defers_compactions(&plain, Mode::Bulk, 1_000, None), "bulk writes no level 0");
        assert!(!defers_compactions(&spec(StoreFormat::Timestamped, true), Mode::Replay, 1_000, None), "kept open");
        assert!(defers_compactions(&spec(StoreFormat::Timestamped, false), Mode::Replay, 1_000, None));
        assert!(!defers_compactions(&spec(StoreFormat::Versioned, false), Mode::Replay, 1_000, None), "it reads");
        assert!(!defers_compactions(&spec(StoreFormat::Window, false), Mode::Replay, 1_000, None));
        // A store a deferred replay left before its merge: its next replay, however short, merges.
        let piled = dir.path().join("piled");
        store_with_level0_files(&piled, DEFAULT_LEVEL0_STOP_FILES);
        let piled = Dest::Store(Store::open_with(&piled, restore_options_with(64 << 10)).unwrap());
        assert!(defers_compactions(&plain, Mode::Replay, 1, Some(&piled)));
        assert!(defers_compactions(&plain, Mode::Replay, 0, Some(&piled)), "merged with nothing to replay");
        assert!(!defers_compactions(&plain, Mode::Replay, 0, None));
    }

    #[test]
    fn a_store_left_with_level0_piled_up_is_merged_by_its_next_restore_even_with_nothing_to_replay() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        store_with_level0_files(&empty, 40);
        let vl = VecLog(HashMap::from([(("t".to_string(), 0), Vec::new())]));
        let o = restore(&vl, &RestoreSpec::new(empty.clone(), "t", 0), None).unwrap();
        assert_eq!((o.mode, o.records_applied), (Mode::Replay, 0));
        assert!(o.merge_seconds > 0.0);
        let store = Store::open(&empty, false).unwrap();
        assert_eq!((store.level0_files(), dump(&store).len()), (0, 40_000));
        drop(store);
        let path = dir.path().join("s");
        store_with_level0_files(&path, 40);
        let log = random_log(100, 50, 3);
        let vl = VecLog(HashMap::from([(("t".to_string(), 0), log.clone())]));
        let spec = RestoreSpec::new(path.clone(), "t", 0);
        let prepared = prepare(&vl, &spec).unwrap();
        assert!(prepared.compactions_deferred && prepared.mode == Mode::Replay);
        restore_prepared(&vl, &spec, Some(Ok(prepared)), None, None).unwrap();
        let store = Store::open(&path, false).unwrap();
        assert_eq!(store.level0_files(), 0);
        let (m, _) = model(&log, 100);
        let data = dump(&store);
        assert_eq!(data.len(), 40_000 + m.len(), "the 40 files' keys and the log's");
        assert!(m.iter().all(|(k, v)| data.get(k) == Some(v)));
    }

    #[test]
    fn a_store_taken_from_open_stores_goes_back_unflushed_when_its_restore_fails() {
        let dir = tempfile::tempdir().unwrap();
        let log = random_log(1_000, 100, 5);
        let vl = VecLog(HashMap::from([(("t".to_string(), 0), log.clone())]));
        let path = dir.path().join("s");
        let kept = Arc::new(OpenStores::new(64 << 20));
        let mut spec = RestoreSpec::new(path.clone(), "t", 0);
        (spec.mode, spec.end_offset, spec.kept_open) = (Mode::Replay, Some(500), Some(kept.clone()));
        restore(&vl, &spec, None).unwrap();
        spec.end_offset = Some(5_000);
        let e = restore(&vl, &spec, None).unwrap_err();
        assert!(e.message.contains("beyond the last stable offset"), "{}", e.message);
        assert_eq!(kept.paths().len(), 1, "the store went back");
        assert_eq!(sst_files(&path), 0, "still unflushed");
        assert!(kept.close(&path).unwrap());
        let store = Store::open(&path, false).unwrap();
        let (m, last) = model(&log, 500);
        assert_eq!(dump(&store), m, "nothing it held unflushed was dropped with it");
        assert_eq!(store.offset("t-0").unwrap(), last);
    }

    #[test]
    fn a_store_open_as_one_format_is_not_restored_as_another_and_stays_open() {
        let dir = tempfile::tempdir().unwrap();
        let vl = VecLog(HashMap::from([(("t".to_string(), 0), random_log(100, 10, 3))]));
        let kept = Arc::new(OpenStores::new(64 << 20));
        let mut spec = RestoreSpec::new(dir.path().join("s"), "t", 0);
        spec.kept_open = Some(kept.clone());
        restore(&vl, &spec, None).unwrap();
        spec.format = StoreFormat::Timestamped;
        let e = restore(&vl, &spec, None).unwrap_err();
        assert!(e.message.contains("it is open as a plain store"), "{}", e.message);
        assert_eq!(kept.paths().len(), 1);
        kept.close_all().unwrap();
        assert!(kept.paths().is_empty());
    }

    #[test]
    fn a_store_that_comes_back_holding_more_than_flush_bytes_is_flushed() {
        let dir = tempfile::tempdir().unwrap();
        let vl = VecLog(HashMap::from([(("t".to_string(), 0), unique_log(60_000, 100))]));
        let kept = Arc::new(OpenStores::new(1 << 30));
        let mut spec = RestoreSpec::new(dir.path().join("s"), "t", 0);
        (spec.mode, spec.kept_open) = (Mode::Replay, Some(kept.clone()));
        restore(&vl, &spec, None).unwrap();
        assert!(sst_files(&spec.store_path) > 0, "~7 MB applied: flushed as it came back");
        assert!(kept.memtable_bytes() < crate::restore::open_stores::FLUSH_BYTES);
        assert_eq!(kept.paths().len(), 1, "and kept open");
    }

    #[test]
    fn stores_kept_open_share_one_memtable_budget() {
        let dir = tempfile::tempdir().unwrap();
        let budget = 4 << 20;
        let kept = Arc::new(OpenStores::new(budget));
        let logs: HashMap<_, _> = (0..8).map(|p| (("t".to_string(), p), unique_log(20_000, 100))).collect();
        let vl = VecLog(logs);
        for p in 0..8 {
            let mut spec = RestoreSpec::new(dir.path().join(format!("s{p}")), "t", p);
            (spec.mode, spec.kept_open) = (Mode::Replay, Some(kept.clone()));
            restore(&vl, &spec, None).unwrap();
        }
        // 8 stores of ~2.4 MB each: alone each would keep all of it in its memtable.
        assert!(kept.memtable_bytes() <= budget as u64, "{} bytes of memtables", kept.memtable_bytes());
        let flushed = (0..8).filter(|p| sst_files(&dir.path().join(format!("s{p}"))) > 0).count();
        assert!(flushed > 0, "the budget flushed some stores' memtables");
    }

    #[test]
    fn auto_picks_bulk_then_replay_and_resume_equals_one_restore() {
        let dir = tempfile::tempdir().unwrap();
        let log = random_log(6_000, 400, 21);
        let vl = VecLog(HashMap::from([(("t".to_string(), 0), log.clone())]));
        let mut spec = RestoreSpec::new(dir.path().join("s"), "t", 0);
        spec.end_offset = Some(2_500);
        spec.chunk_bytes = 500;
        let a = restore(&vl, &spec, None).unwrap();
        assert_eq!(a.mode, Mode::Bulk);
        spec.end_offset = None;
        let b = restore(&vl, &spec, None).unwrap();
        assert_eq!(b.mode, Mode::Replay);
        assert_eq!(b.start_offset, a.offset.unwrap() + 1);
        assert_eq!(b.end_offset, 6_000);
        let again = restore(&vl, &spec, None).unwrap();
        assert_eq!(again.records_applied, 0);
        let store = Store::open(&spec.store_path, false).unwrap();
        let (m, last) = model(&log, 6_000);
        assert_eq!(dump(&store), m);
        assert_eq!(store.offset("t-0").unwrap(), last);
    }

    #[test]
    fn the_bounds_of_a_segment_log_nobody_wrote_to_during_the_restore_are_handed_on() {
        use crate::log::writer::WriterConfig;
        use crate::log::{partition_offsets, Log, SegmentLogDir};
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("log");
        let log = std::sync::Arc::new(Log::new(&root, WriterConfig { sync: false, ..Default::default() }).unwrap());
        let mut p = log.producer(None).unwrap();
        let mut send = |from: i64, to: i64| {
            for i in from..to {
                p.send("t", 0, Some(format!("k{i}").as_bytes()), Some(b"v"), &[], None).unwrap();
            }
            p.flush().unwrap();
        };
        send(0, 100);
        let dir = SegmentLogDir(root.clone());
        let spec = RestoreSpec::new(d.path().join("a"), "t", 0);
        let o = restore(&dir, &spec, None).unwrap();
        assert_eq!(o.log_bounds, Some(partition_offsets(&root, "t", 0).unwrap()));
        assert_eq!(o.log_bounds.unwrap().end, 100);
        // Written to after the restore asked for the bounds: they are not handed on.
        let spec = RestoreSpec::new(d.path().join("b"), "t", 0);
        let prepared = prepare(&dir, &spec);
        send(100, 110);
        let o = restore_prepared(&dir, &spec, Some(prepared), None, None).unwrap();
        assert_eq!((o.end_offset, o.log_bounds), (100, None));
        // A log that cannot tell hands none on.
        let vl = VecLog(HashMap::from([(("t".to_string(), 0), random_log(50, 10, 3))]));
        let o = restore(&vl, &RestoreSpec::new(d.path().join("c"), "t", 0), None).unwrap();
        assert_eq!(o.log_bounds, None);
    }

    #[test]
    fn a_store_recording_kafka_streams_no_offset_yet_restores_from_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let log = random_log(2_000, 300, 5);
        let vl = VecLog(HashMap::from([(("t".to_string(), 0), log.clone())]));
        let spec = RestoreSpec::new(dir.path().join("s"), "t", 0);
        {
            let store = Store::open(&spec.store_path, true).unwrap();
            let db = store.db();
            db.put_cf(store.offsets_cf(), b"t-0", crate::offsets::encode_i64(OFFSET_UNKNOWN)).unwrap();
        }
        let r = restore(&vl, &spec, None).unwrap();
        assert_eq!((r.start_offset, r.end_offset), (0, 2_000));
        let store = Store::open(&spec.store_path, false).unwrap();
        let (m, last) = model(&log, 2_000);
        assert_eq!(dump(&store), m);
        assert_eq!(store.offset("t-0").unwrap(), last);
    }

    #[test]
    fn one_partition_on_two_threads_is_split_and_restores_what_one_thread_does() {
        let dir = tempfile::tempdir().unwrap();
        let log = random_log(20_000, 3_000, 7);
        let vl = VecLog(HashMap::from([(("t".to_string(), 0), log.clone())]));
        let (m, last) = model(&log, 20_000);
        for budget in [256 << 20, 64 << 10] {
            let mut outcomes = Vec::new();
            for threads in [1, 2] {
                let mut spec = RestoreSpec::new(dir.path().join(format!("s{threads}-{budget}")), "t", 0);
                (spec.mode, spec.memory_budget, spec.chunk_bytes) = (Mode::Bulk, budget, 300);
                let o = restore_many(&vl, vec![(spec.clone(), None)], threads).remove(0).unwrap();
                let store = Store::open(&spec.store_path, false).unwrap();
                assert_eq!(dump(&store), m, "{threads} threads, budget {budget}");
                assert_eq!(store.offset("t-0").unwrap(), last);
                outcomes.push((o.offset, o.records_applied, o.skipped, o.skipped_null_key));
            }
            assert_eq!(outcomes[0], outcomes[1], "budget {budget}");
        }
    }

    #[test]
    fn many_on_two_threads_one_failure_is_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let mut logs = HashMap::new();
        for p in 0..4 {
            logs.insert(("t".to_string(), p), random_log(3_000, 200, p as u64 + 1));
        }
        let vl = VecLog(logs.clone());
        let mut specs: Vec<(RestoreSpec, Option<Box<dyn Listener>>)> =
            (0..4).map(|p| (RestoreSpec::new(dir.path().join(format!("s{p}")), "t", p), None)).collect();
        specs.push((RestoreSpec::new(dir.path().join("missing"), "t", 9), None));
        let out = restore_many(&vl, specs, 2);
        assert_eq!(out.len(), 5);
        for p in 0..4 {
            let o = out[p].as_ref().unwrap();
            let store = Store::open(&dir.path().join(format!("s{p}")), false).unwrap();
            assert_eq!(dump(&store), model(&logs[&("t".to_string(), p as i32)], 3_000).0);
            assert_eq!(store.offset(&format!("t-{p}")).unwrap(), o.offset);
        }
        let e = out[4].as_ref().unwrap_err();
        assert_eq!(e.kind, ErrorKind::Log);
        // The engine names what failed in fields, not only in the message.
        assert_eq!(e.path.as_deref(), Some(dir.path().join("missing").as_path()));
        assert_eq!((e.topic.as_deref(), e.partition), (Some("t"), Some(9)));
        assert!(e.message.contains("t-9"), "{e}");
    }

    #[test]
    fn a_restore_prepared_ahead_replays_in_the_chunks_of_the_threads_restore_many_gave_it() {
        // ~22 MiB of unique keys a partition: a batch per chunk, 8 MiB without read-ahead and 5 with it.
        let log: Vec<Entry> = (0..200_000)
            .map(|i| Entry::Data { key: Some(format!("k{i:08}").into_bytes()), value: Some(vec![b'v'; 100]) })
            .collect();
        let vl = VecLog((0..3).map(|p| (("t".to_string(), p), log.clone())).collect());
        let spec = |dir: &Path, p: i32| {
            let mut s = RestoreSpec::new(dir.join(format!("s{p}")), "t", p);
            s.mode = Mode::Replay;
            s.memory_budget = 40 << 20;
            s.progress_interval = Duration::ZERO;
            s
        };
        let lone = |read_ahead: bool| {
            let dir = tempfile::tempdir().unwrap();
            let mut s = spec(dir.path(), 0);
            s.read_ahead = read_ahead;
            let mut n = Batches::default();
            restore(&vl, &s, Some(&mut n)).unwrap();
            n.count()
        };
        let (one_thread, read_ahead) = (lone(false), lone(true));
        assert_ne!(one_thread, read_ahead, "the budget gives the two ways different chunks");
        // One thread for three restores: each on one thread, without read-ahead, and (on two
        // cores or more) the second and third prepared ahead, with the spec they run with.
        let dir = tempfile::tempdir().unwrap();
        let counts: Vec<Batches> = (0..3).map(|_| Batches::default()).collect();
        let specs = (0..3)
            .map(|p| (spec(dir.path(), p), Some(Box::new(counts[p as usize].clone()) as Box<dyn Listener>)))
            .collect();
        let out = restore_many(&vl, specs, 1);
        assert!(out.iter().all(|o| o.is_ok()), "{:?}", out.iter().map(|o| o.as_ref().err()).collect::<Vec<_>>());
        let got: Vec<usize> = counts.iter().map(Batches::count).collect();
        assert_eq!(
            got,
            vec![one_thread; 3],
            "batches of each restore (one thread alone: {one_thread}, read-ahead: {read_ahead})"
        );
    }

    #[test]
    fn end_beyond_last_stable_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let vl = VecLog(HashMap::from([(("t".to_string(), 0), random_log(100, 10, 1))]));
        let mut spec = RestoreSpec::new(dir.path().join("s"), "t", 0);
        spec.end_offset = Some(101);
        let e = restore(&vl, &spec, None).unwrap_err();
        assert!(e.message.contains("101") && e.message.contains("last stable"), "{e}");
    }

    /// A [`VecLog`] that records, per partition opened, whether its store
    /// existed then, and the end each cursor was primed with.
    struct Watched {
        log: VecLog,
        root: PathBuf,
        opened: Mutex<Vec<(i32, bool)>>,
        primed: std::sync::Arc<Mutex<Vec<(i32, i64)>>>,
    }

    struct Primed {
        inner: VecSource,
        partition: i32,
        primed: std::sync::Arc<Mutex<Vec<(i32, i64)>>>,
    }

    impl ChangelogSource for Primed {
        fn position(&self) -> i64 {
            self.inner.position()
        }
        fn next_chunk(
            &mut self,
            end: i64,
            max_bytes: usize,
            sink: &mut dyn FnMut(crate::source::ChangeRecord<'_>),
        ) -> Result<bool, LogError> {
            self.inner.next_chunk(end, max_bytes, sink)
        }
        fn skipped(&self) -> SkipCounts {
            self.inner.skipped()
        }
        fn bytes_read(&self) -> u64 {
            self.inner.bytes_read()
        }
        fn prime(&mut self, end: i64) {
            self.primed.lock().unwrap().push((self.partition, end));
        }
    }

    impl Changelog for Watched {
        fn bounds(&self, topic: &str, partition: i32) -> Result<Bounds, LogError> {
            self.log.bounds(topic, partition)
        }
        fn open(&self, topic: &str, partition: i32, start: i64) -> Result<Box<dyn ChangelogSource>, LogError> {
            let exists = self.root.join(format!("s{partition}")).join("CURRENT").exists();
            self.opened.lock().unwrap().push((partition, exists));
            let log = self.log.0.get(&(topic.to_string(), partition)).expect("checked by bounds");
            let inner = VecSource::new(log.clone(), start);
            Ok(Box::new(Primed { inner, partition, primed: self.primed.clone() }))
        }
    }

    #[test]
    fn a_new_store_s_cursor_is_primed_before_the_store_is_created_an_existing_one_s_after_reading_its_offset() {
        let dir = tempfile::tempdir().unwrap();
        let logs: HashMap<_, _> =
            (0..3).map(|p| (("t".to_string(), p), random_log(2_000, 150, p as u64 + 7))).collect();
        let w = Watched {
            log: VecLog(logs.clone()),
            root: dir.path().to_path_buf(),
            opened: Mutex::new(Vec::new()),
            primed: Default::default(),
        };
        let specs = |end: Option<i64>| -> Vec<(RestoreSpec, Option<Box<dyn Listener>>)> {
            (0..3)
                .map(|p| {
                    let mut spec = RestoreSpec::new(dir.path().join(format!("s{p}")), "t", p);
                    spec.end_offset = end;
                    (spec, None)
                })
                .collect()
        };
        for o in restore_many(&w, specs(Some(1_200)), 1) {
            assert_eq!((o.unwrap().mode, 1_200), (Mode::Bulk, 1_200));
        }
        let mut opened = std::mem::take(&mut *w.opened.lock().unwrap());
        opened.sort();
        assert_eq!(opened, vec![(0, false), (1, false), (2, false)], "opened before the store existed");
        let mut primed = std::mem::take(&mut *w.primed.lock().unwrap());
        primed.sort();
        assert_eq!(primed, vec![(0, 1_200), (1, 1_200), (2, 1_200)]);
        // Existing stores: opened at the recorded offset + 1, primed to the log's end.
        for o in restore_many(&w, specs(None), 2) {
            let o = o.unwrap();
            assert_eq!((o.mode, o.end_offset), (Mode::Replay, 2_000));
            assert!(o.start_offset > 0 && o.start_offset <= 1_200, "{o:?}");
        }
        assert!(w.opened.lock().unwrap().iter().all(|&(_, existed)| existed));
        assert_eq!(w.primed.lock().unwrap().len(), 3);
        for p in 0..3 {
            let store = Store::open(&dir.path().join(format!("s{p}")), false).unwrap();
            assert_eq!(dump(&store), model(&logs[&("t".to_string(), p)], 2_000).0);
        }
    }

    #[test]
    fn the_pipeline_prepares_the_next_job_while_one_runs_and_keeps_failures_to_their_job() {
        use std::thread::{self, ThreadId};
        let prepared_on: Mutex<Vec<(usize, ThreadId)>> = Mutex::new(Vec::new());
        let read: Mutex<Vec<usize>> = Mutex::new(Vec::new());
        let out = run_pipeline(
            (0..5).collect(),
            1,
            Lookahead { preparers: 1, jobs: 1 },
            |&j: &usize| {
                // One worker: job j is prepared only once the job before it read all it reads
                // (job 3 fails while being prepared and reads nothing: job 4 may follow its failure).
                assert!(j == 0 || j == 4 || read.lock().unwrap().contains(&(j - 1)), "job {j} prepared too early");
                prepared_on.lock().unwrap().push((j, thread::current().id()));
                match j {
                    3 => panic!("preparing three"),
                    4 => None, // not to be prepared ahead
                    _ => Some(j * 100),
                }
            },
            |j, p, read_all| {
                thread::sleep(Duration::from_millis(20));
                read.lock().unwrap().push(j);
                read_all(); // the next job is prepared from here on
                thread::sleep(Duration::from_millis(30)); // time for the preparer to get ahead
                (j, p, thread::current().id())
            },
            |_| (usize::MAX, None, thread::current().id()),
        );
        let worker = out[0].2;
        // Job 0 may have been taken before the preparer reached it; every later one was prepared ahead.
        assert!(out[0].1.is_none() || out[0].1 == Some(0));
        assert_eq!((out[1].0, out[1].1, out[2].0, out[2].1), (1, Some(100), 2, Some(200)));
        assert_eq!(out[3].0, usize::MAX, "a panic while preparing is that job's failure");
        assert_eq!((out[4].0, out[4].1), (4, None));
        let on = prepared_on.lock().unwrap();
        // Job 4 follows a job that failed at once: its worker may take it before the preparer.
        let ahead: Vec<&(usize, ThreadId)> = on.iter().filter(|(j, _)| (1..=3).contains(j)).collect();
        assert_eq!(ahead.len(), 3, "{on:?}");
        assert!(ahead.iter().all(|(_, t)| *t != worker), "prepared on the worker's thread");
    }

    #[test]
    fn pool_reports_a_panic_in_its_own_slot() {
        let r = run_pipeline(
            vec![1, 2, 3],
            2,
            Lookahead::NONE,
            |_| None::<()>,
            |x, _, _| if x == 2 { panic!("two") } else { x * 10 },
            |_| -1,
        );
        assert_eq!(r, vec![10, -1, 30]);
    }

    #[test]
    fn many_small_restores_are_prepared_on_several_threads_at_most_their_lookahead_beyond_the_workers() {
        use std::thread;
        let la = Lookahead { preparers: 4, jobs: 8 };
        let taken = Mutex::new(0usize);
        let (preparing, most) = (Mutex::new(0usize), Mutex::new(0usize));
        let out = run_pipeline(
            (0..40).collect(),
            1,
            la,
            |&j: &usize| {
                // The worker's count lags the pipeline's by the job it is about to start.
                assert!(j < *taken.lock().unwrap() + la.jobs + 1, "job {j} prepared too far ahead");
                let now = {
                    let mut p = preparing.lock().unwrap();
                    *p += 1;
                    *p
                };
                let mut m = most.lock().unwrap();
                *m = (*m).max(now);
                drop(m);
                thread::sleep(Duration::from_millis(20)); // a store's creation, waiting on its fsyncs
                *preparing.lock().unwrap() -= 1;
                Some(j)
            },
            |j, p, read_all| {
                *taken.lock().unwrap() += 1;
                read_all();
                thread::sleep(Duration::from_millis(10)); // the restore, slower than 4 creations side by side
                (j, p)
            },
            |_| (usize::MAX, None),
        );
        assert!(out.iter().enumerate().all(|(i, &(j, p))| j == i && (p.is_none() || p == Some(i))), "{out:?}");
        let prepared = out.iter().filter(|(_, p)| p.is_some()).count();
        assert!(prepared >= 20, "only {prepared} of 40 prepared ahead");
        assert!(*most.lock().unwrap() >= 3, "at most {} preparations at once", most.lock().unwrap());
    }

    #[test]
    fn only_many_restores_per_thread_that_hold_no_fetched_log_are_prepared_on_several_threads() {
        let cores = crate::threads::cores();
        let one = |threads: usize| if cores > threads { Lookahead { preparers: 1, jobs: 1 } } else { Lookahead::NONE };
        assert_eq!(Lookahead::of(2, 1024, false), Lookahead { preparers: 4, jobs: 8 });
        assert_eq!(Lookahead::of(2, 16, false), Lookahead { preparers: 4, jobs: 8 });
        assert_eq!(Lookahead::of(2, 15, false), one(2));
        assert_eq!(Lookahead::of(2, 1024, true), one(2), "Kafka's prepared cursors hold their responses");
        assert_eq!(Lookahead::of(cores, 4, true), Lookahead::NONE);
        assert_eq!(Lookahead::of(cores, 4, false), Lookahead::NONE);
        assert_eq!(Lookahead::of(0, 4, false), one(1));
    }

    /// Each segment of the segmented store at `dir` (segment id -> contents),
    /// checking every one records `offset` for `tp` and is CLOSED.
    fn segments_of(dir: &Path, seg: Segmentation, tp: &str, offset: Option<i64>) -> Segments {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let mut out = Segments::new();
        for (id, path) in crate::segments::SegmentedStore::list(dir, &name, &seg).unwrap() {
            assert_eq!(path.file_name().unwrap().to_string_lossy(), format!("{name}.{}", id * seg.segment_interval_ms));
            let s = Store::open_read_only(&path).unwrap();
            assert_eq!(s.offset(tp).unwrap(), offset, "{}", path.display());
            assert_eq!(s.status().unwrap(), Some(crate::store::STATUS_CLOSED), "{}", path.display());
            out.insert(id, dump(&s));
        }
        out
    }

    #[test]
    fn window_and_session_stores_restore_into_their_live_segments_in_bulk_and_replay_alike() {
        use crate::segments::KeySchema;
        let seg = Segmentation::new(300_000, None).unwrap(); // the DSL's interval: 150 s
        for (format, schema) in [
            (StoreFormat::TimestampedWindow, KeySchema::Window),
            (StoreFormat::Window, KeySchema::Window),
            (StoreFormat::Session, KeySchema::Session),
            (StoreFormat::TimestampedWindowHeaders, KeySchema::Window),
            (StoreFormat::SessionHeaders, KeySchema::Session),
            (StoreFormat::EmitFinalWindow, KeySchema::TimeOrderedWindow),
            (StoreFormat::EmitFinalSlidingWindow, KeySchema::TimeOrderedWindow),
            (StoreFormat::EmitFinalWindowHeaders, KeySchema::TimeOrderedWindow),
            (StoreFormat::EmitFinalSession, KeySchema::TimeOrderedSession),
        ] {
            let log = segmented_log(&random_log(6_000, 400, 5), schema);
            let vl = VecLog(HashMap::from([(("t".to_string(), 0), log.clone())]));
            let (want, last) = model_segmented(&log, 6_000, format, seg);
            assert!(
                want.len() >= 2 && want.len() < 9,
                "{format:?}: some segments live, some expired: {:?}",
                want.keys()
            );
            let dir = tempfile::tempdir().unwrap();
            for (name, mode, chunk, threads, budget) in [
                ("bulk", Mode::Bulk, 500, 1, 256 << 20),
                ("replay", Mode::Replay, 700, 1, 256 << 20),
                ("auto", Mode::Auto, 1 << 20, 1, 256 << 20),
                ("bulk-split", Mode::Bulk, 500, 3, 256 << 20),
                ("bulk-split-spilled", Mode::Bulk, 500, 2, 64 << 10),
            ] {
                let mut spec = RestoreSpec::new(dir.path().join(name), "t", 0);
                (spec.format, spec.segmentation, spec.mode, spec.chunk_bytes) = (format, Some(seg), mode, chunk);
                (spec.bulk_threads, spec.memory_budget) = (threads, budget);
                let o = restore(&vl, &spec, None).unwrap();
                assert_eq!((o.offset, o.records_applied > 0), (last, true), "{format:?} {name}");
                assert_eq!(segments_of(&spec.store_path, seg, "t-0", last), want, "{format:?} {name}");
                assert!(!spec.store_path.join("CURRENT").exists(), "no RocksDB at the store's own level");
            }
            // resumed: bulk to the middle, then replay the rest: the same store
            let mut spec = RestoreSpec::new(dir.path().join("resumed"), "t", 0);
            (spec.format, spec.segmentation, spec.end_offset, spec.chunk_bytes) = (format, Some(seg), Some(2_500), 600);
            assert_eq!(restore(&vl, &spec, None).unwrap().mode, Mode::Bulk);
            spec.end_offset = None;
            assert_eq!(restore(&vl, &spec, None).unwrap().mode, Mode::Replay);
            assert_eq!(segments_of(&spec.store_path, seg, "t-0", last), want, "{format:?} resumed");
            assert_eq!(restore(&vl, &spec, None).unwrap().records_applied, 0, "nothing left");
        }
    }

    #[test]
    fn a_segmented_store_needs_its_retention_and_refuses_keys_of_another_schema() {
        let dir = tempfile::tempdir().unwrap();
        let log = random_log(500, 40, 3); // plain keys of 6 bytes
        let vl = VecLog(HashMap::from([(("t".to_string(), 0), log)]));
        let mut spec = RestoreSpec::new(dir.path().join("w"), "t", 0);
        spec.format = StoreFormat::Session;
        let e = restore(&vl, &spec, None).unwrap_err();
        assert!(e.message.contains("retention"), "{e}");
        spec.segmentation = Some(Segmentation::new(60_000, None).unwrap());
        for mode in [Mode::Bulk, Mode::Replay] {
            spec.mode = mode;
            let e = restore(&vl, &spec, None).unwrap_err();
            assert!(e.message.contains("no session store key") && e.message.contains("t-0"), "{mode:?}: {e}");
            assert_eq!(e.path.as_deref(), Some(spec.store_path.as_path()));
        }
    }
}
