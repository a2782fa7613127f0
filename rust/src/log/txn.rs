//! Producers and the transaction coordinator of a segment log.
//!
//! The coordinator's state is one small file, `<log_dir>/transactions.state`,
//! replaced atomically (write temp, fsync, rename) under an exclusive `flock`
//! of `<log_dir>/transactions.lock`. Per transactional id it holds the
//! producer id, the epoch, the transaction state and the partitions of the
//! open transaction:
//!
//! ```text
//! statestore-transactions 1
//! next-producer-id <n>
//! txn <hex of transactional id> <producer id> <epoch> <state> <started ms> <partition>@<topic>,...|-
//! ```
//!
//! A partition is recorded *before* the first record of the transaction is
//! written to it, and a commit is recorded as `prepare-commit` before its
//! markers are written, so whoever finds the state after a crash knows what
//! to finish: write ABORT markers for `ongoing`/`prepare-abort`, COMMIT
//! markers for `prepare-commit`. A repeated marker is harmless to readers.
//!
//! A new producer with the same transactional id bumps the epoch (fencing the
//! old one, which finds the new epoch on its next call) and finishes the old
//! transaction. `abort_expired_transactions` does the same for transactions
//! open longer than a timeout, as a broker's coordinator does.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use super::writer::{acquire, PartitionWriter, WriterConfig};
use super::{partition_dir, LogError};
use crate::codec::BatchMeta;
use crate::fileio::atomic_write;

const STATE_FILE: &str = "transactions.state";
const STATE_LOCK: &str = "transactions.lock";
const STATE_MAGIC: &str = "statestore-transactions 1";

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// State of a transactional id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnState {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
}

impl TxnState {
    fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "empty",
            TxnState::Ongoing => "ongoing",
            TxnState::PrepareCommit => "prepare-commit",
            TxnState::PrepareAbort => "prepare-abort",
        }
    }
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "empty" => TxnState::Empty,
            "ongoing" => TxnState::Ongoing,
            "prepare-commit" => TxnState::PrepareCommit,
            "prepare-abort" => TxnState::PrepareAbort,
            _ => return None,
        })
    }
}

/// A partition `(topic, partition)`.
pub type Tp = (String, i32);

/// Coordinator record of one transactional id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnEntry {
    pub producer_id: i64,
    pub epoch: i16,
    pub state: TxnState,
    pub started_ms: i64,
    pub partitions: BTreeSet<Tp>,
}

/// The whole coordinator state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TxnStateFile {
    pub next_producer_id: i64,
    pub entries: BTreeMap<String, TxnEntry>,
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<String> {
    // ASCII hex digits only: slicing at byte offsets would otherwise split a
    // multi-byte character and panic (found by the `txn_state` fuzz target).
    if s.len() % 2 != 0 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok()).collect();
    String::from_utf8(bytes?).ok()
}

impl TxnStateFile {
    /// Parse the text of the state file at `path` (named in errors).
    pub fn parse(path: &Path, text: &str) -> Result<Self, LogError> {
        let bad = |line: usize, why: &str| {
            LogError::Other(format!(
                "transaction state file {} is malformed at line {line}: {why}; it is written only by statestore, \
                 so restore it from a backup or delete it (all transactional producers then start over with new ids)",
                path.display()
            ))
        };
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, l)) if l == STATE_MAGIC => {}
            _ => return Err(bad(1, "missing header")),
        }
        let mut st = TxnStateFile::default();
        for (i, line) in lines {
            let n = i + 1;
            let f: Vec<&str> = line.split(' ').collect();
            match f.as_slice() {
                ["next-producer-id", v] => st.next_producer_id = v.parse().map_err(|_| bad(n, "bad producer id"))?,
                ["txn", id, pid, epoch, state, started, parts] => {
                    let id = unhex(id).ok_or_else(|| bad(n, "bad transactional id"))?;
                    let mut partitions = BTreeSet::new();
                    if *parts != "-" {
                        for p in parts.split(',') {
                            let (part, topic) = p.split_once('@').ok_or_else(|| bad(n, "bad partition"))?;
                            partitions.insert((topic.to_string(), part.parse().map_err(|_| bad(n, "bad partition"))?));
                        }
                    }
                    st.entries.insert(
                        id,
                        TxnEntry {
                            producer_id: pid.parse().map_err(|_| bad(n, "bad producer id"))?,
                            epoch: epoch.parse().map_err(|_| bad(n, "bad epoch"))?,
                            state: TxnState::parse(state).ok_or_else(|| bad(n, "bad state"))?,
                            started_ms: started.parse().map_err(|_| bad(n, "bad start time"))?,
                            partitions,
                        },
                    );
                }
                [""] => {}
                _ => return Err(bad(n, "unknown line")),
            }
        }
        Ok(st)
    }

    /// The text of the state file.
    pub fn render(&self) -> String {
        let mut s = format!("{STATE_MAGIC}\nnext-producer-id {}\n", self.next_producer_id);
        for (id, e) in &self.entries {
            let parts = if e.partitions.is_empty() {
                "-".to_string()
            } else {
                e.partitions.iter().map(|(t, p)| format!("{p}@{t}")).collect::<Vec<_>>().join(",")
            };
            s.push_str(&format!(
                "txn {} {} {} {} {} {}\n",
                hex(id),
                e.producer_id,
                e.epoch,
                e.state.name(),
                e.started_ms,
                parts
            ));
        }
        s
    }
}

/// Exclusive hold of the coordinator state (blocking `flock`, short).
struct StateGuard {
    _lock: File,
    path: PathBuf,
    state: TxnStateFile,
}

impl StateGuard {
    fn take(log_dir: &Path) -> Result<Self, LogError> {
        let lock_path = log_dir.join(STATE_LOCK);
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| LogError::io("open lock file", &lock_path, e))?;
        // SAFETY: flock on a descriptor we own; blocks until the holder is done.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(LogError::io("lock", &lock_path, std::io::Error::last_os_error()));
        }
        let path = log_dir.join(STATE_FILE);
        let state = load_state(&path)?;
        Ok(StateGuard { _lock: f, path, state })
    }

    fn save(&self) -> Result<(), LogError> {
        atomic_write(&self.path, self.state.render().as_bytes()).map_err(|e| LogError::Other(e.to_string()))
    }
}

fn load_state(path: &Path) -> Result<TxnStateFile, LogError> {
    match fs::read_to_string(path) {
        Ok(text) => TxnStateFile::parse(path, &text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TxnStateFile::default()),
        Err(e) => Err(LogError::io("read", path, e)),
    }
}

/// A segment log rooted at a directory: hands out partition writers and
/// producers, and runs the coordinator's housekeeping.
pub struct Log {
    dir: PathBuf,
    cfg: WriterConfig,
    writers: Mutex<HashMap<Tp, Arc<Mutex<PartitionWriter>>>>,
}

impl Log {
    /// A log rooted at `dir` (created when first written).
    pub fn new(dir: &Path, cfg: WriterConfig) -> Result<Self, LogError> {
        if cfg.segment_bytes == 0 || cfg.segment_bytes > i32::MAX as u64 {
            return Err(LogError::Other(format!(
                "segment_bytes {} is out of range: use 1 .. {} (positions in the index are 32-bit)",
                cfg.segment_bytes,
                i32::MAX
            )));
        }
        Ok(Log { dir: dir.to_path_buf(), cfg, writers: Mutex::new(HashMap::new()) })
    }

    /// The log directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn ensure_dir(&self) -> Result<(), LogError> {
        fs::create_dir_all(&self.dir).map_err(|e| LogError::io("create directory", &self.dir, e))
    }

    /// The writer of a partition (opened, locked and repaired on first use).
    pub fn writer(&self, topic: &str, partition: i32) -> Result<Arc<Mutex<PartitionWriter>>, LogError> {
        let key = (topic.to_string(), partition);
        let mut ws = self.writers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(w) = ws.get(&key) {
            return Ok(w.clone());
        }
        self.ensure_dir()?;
        let w = acquire(&partition_dir(&self.dir, topic, partition)?, self.cfg)?;
        ws.insert(key, w.clone());
        Ok(w)
    }

    /// Flush every partition this log object writes.
    pub fn flush(&self) -> Result<(), LogError> {
        let ws: Vec<_> = self.writers.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        for w in ws {
            w.lock().unwrap_or_else(|p| p.into_inner()).flush(true)?;
        }
        Ok(())
    }

    /// Flush and let go of every partition writer (their locks are released
    /// once no other object of this process uses them).
    pub fn close(&self) -> Result<(), LogError> {
        let r = self.flush();
        self.writers.lock().unwrap_or_else(|p| p.into_inner()).clear();
        r
    }

    fn write_markers(&self, entry: &TxnEntry, commit: bool) -> Result<(), LogError> {
        let ts = now_ms();
        for (topic, partition) in &entry.partitions {
            let w = self.writer(topic, *partition)?;
            let mut w = w.lock().unwrap_or_else(|p| p.into_inner());
            w.append_marker(entry.producer_id, entry.epoch, commit, ts)?;
        }
        Ok(())
    }

    /// Finish a transaction left in `state` (after the epoch was bumped and saved).
    fn complete(&self, g: &mut StateGuard, id: &str) -> Result<(), LogError> {
        let entry = g.state.entries[id].clone();
        let commit = match entry.state {
            TxnState::Empty => return Ok(()),
            TxnState::PrepareCommit => true,
            TxnState::Ongoing | TxnState::PrepareAbort => false,
        };
        if entry.state == TxnState::Ongoing {
            g.state.entries.get_mut(id).unwrap().state = TxnState::PrepareAbort;
            g.save()?;
        }
        self.write_markers(&entry, commit)?;
        let e = g.state.entries.get_mut(id).unwrap();
        e.state = TxnState::Empty;
        e.partitions.clear();
        e.started_ms = -1;
        g.save()
    }

    /// A producer; with a transactional id, a transactional one that fences
    /// (and finishes the transaction of) any earlier producer with that id.
    pub fn producer(self: &Arc<Self>, transactional_id: Option<&str>) -> Result<Producer, LogError> {
        let Some(id) = transactional_id else {
            return Ok(Producer { log: self.clone(), txn: None, targets: Vec::new(), last: 0 });
        };
        if id.is_empty() {
            return Err(LogError::Other("transactional id must not be empty (pass None for a plain producer)".into()));
        }
        self.ensure_dir()?;
        let mut g = StateGuard::take(&self.dir)?;
        if g.state.entries.get(id).is_some_and(|e| e.epoch >= i16::MAX - 1 && e.state != TxnState::Empty) {
            // Epochs are used up: the next producer gets a new id, so first
            // finish the old transaction under the old one.
            self.complete(&mut g, id)?;
        }
        let next = g.state.next_producer_id;
        let entry = match g.state.entries.get(id) {
            Some(e) if e.epoch < i16::MAX - 1 => TxnEntry { epoch: e.epoch + 1, ..e.clone() },
            Some(e) => TxnEntry { producer_id: next, epoch: 0, ..e.clone() },
            None => TxnEntry { producer_id: next, epoch: 0, state: TxnState::Empty, started_ms: -1, partitions: BTreeSet::new() },
        };
        if entry.producer_id == next {
            g.state.next_producer_id = next + 1;
        }
        let (pid, epoch) = (entry.producer_id, entry.epoch);
        g.state.entries.insert(id.to_string(), entry);
        // Fence first (the saved epoch), then finish what the old producer left open.
        g.save()?;
        let latest = identity(&self.dir, id);
        latest.store(pack(pid, epoch), Ordering::SeqCst);
        self.complete(&mut g, id)?;
        drop(g);
        let state_path = self.dir.join(STATE_FILE);
        let stamp = stamp(&state_path);
        Ok(Producer {
            log: self.clone(),
            txn: Some(TxnProducer {
                id: id.to_string(),
                producer_id: pid,
                epoch,
                in_txn: false,
                txn_gen: 0,
                partitions: BTreeSet::new(),
                state_path,
                latest,
                stamp,
                fenced_by: None,
            }),
            targets: Vec::new(),
            last: 0,
        })
    }

    /// Abort every transaction open longer than `timeout_ms` (bumping its
    /// epoch, so its producer is fenced) and finish any commit or abort that
    /// a crash interrupted. Returns the transactional ids acted on.
    pub fn abort_expired_transactions(&self, timeout_ms: i64) -> Result<Vec<String>, LogError> {
        if !self.dir.join(STATE_FILE).exists() {
            return Ok(Vec::new());
        }
        let mut g = StateGuard::take(&self.dir)?;
        let now = now_ms();
        let ids: Vec<String> = g
            .state
            .entries
            .iter()
            .filter(|(_, e)| match e.state {
                TxnState::Empty => false,
                // saturating: a start time from a damaged file must not wrap around
                TxnState::Ongoing => now.saturating_sub(e.started_ms) > timeout_ms,
                TxnState::PrepareCommit | TxnState::PrepareAbort => true,
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in &ids {
            let e = g.state.entries.get_mut(id).unwrap();
            if e.state == TxnState::Ongoing {
                e.state = TxnState::PrepareAbort;
                if e.epoch < i16::MAX - 1 {
                    e.epoch += 1;
                }
                let packed = pack(e.producer_id, e.epoch);
                g.save()?;
                identity(&self.dir, id).store(packed, Ordering::SeqCst);
            }
            self.complete(&mut g, id)?;
        }
        Ok(ids)
    }

    /// The coordinator state (for tools and tests).
    pub fn transactions(&self) -> Result<TxnStateFile, LogError> {
        load_state(&self.dir.join(STATE_FILE))
    }
}

/// The newest `(producer id, epoch)` of each transactional id known in this
/// process, shared by its producers: a producer fenced by another producer of
/// the same process notices on its very next call without any I/O.
type Identity = Arc<AtomicI64>;

fn pack(pid: i64, epoch: i16) -> i64 {
    (pid << 16) | (epoch as u16 as i64)
}

/// Identities by (log directory, transactional id). The map holds them weakly:
/// an identity lives as long as a producer holds it, and an entry whose
/// producers are all gone is dropped when the next new one is added, so a
/// process that creates producers for ever-new transactional ids (or log
/// directories) does not keep one entry per id for its whole life. Nothing is
/// lost by dropping one: a producer created later reads the newest producer id
/// and epoch from the state file.
static IDS: OnceLock<Mutex<IdentityMap>> = OnceLock::new();

/// (canonical log directory, transactional id) -> the identity its live producers share.
type IdentityMap = HashMap<(PathBuf, String), Weak<AtomicI64>>;

fn identity(dir: &Path, id: &str) -> Identity {
    let key = (fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf()), id.to_string());
    let mut m = IDS.get_or_init(|| Mutex::new(HashMap::new())).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(live) = m.get(&key).and_then(Weak::upgrade) {
        return live;
    }
    m.retain(|_, w| w.strong_count() > 0);
    let fresh = Arc::new(AtomicI64::new(i64::MIN));
    m.insert(key, Arc::downgrade(&fresh));
    fresh
}

/// Entries of the identity map (live or not yet dropped), for tests.
#[cfg(test)]
fn identities_held() -> usize {
    IDS.get().map_or(0, |m| m.lock().unwrap_or_else(|p| p.into_inner()).len())
}

type Stamp = Option<(u64, u64, i64, i64)>;

fn stamp(path: &Path) -> Stamp {
    fs::metadata(path).ok().map(|m| (m.dev(), m.ino(), m.mtime(), m.mtime_nsec()))
}

struct TxnProducer {
    id: String,
    producer_id: i64,
    epoch: i16,
    in_txn: bool,
    /// Transactions begun so far; a target is in the open transaction when
    /// its `txn_gen` equals this.
    txn_gen: u64,
    partitions: BTreeSet<Tp>,
    state_path: PathBuf,
    latest: Identity,
    stamp: Stamp,
    fenced_by: Option<i16>,
}

/// A partition this producer writes, with its writer and sequence number.
/// The writer is owned by the [`Log`] (so `close` releases it); a producer
/// only keeps a weak handle and re-opens it through the log when it is gone.
struct Target {
    topic: String,
    partition: i32,
    writer: Weak<Mutex<PartitionWriter>>,
    seq: i32,
    txn_gen: u64,
}

/// A producer: plain (no producer id) or transactional.
pub struct Producer {
    log: Arc<Log>,
    txn: Option<TxnProducer>,
    targets: Vec<Target>,
    last: usize,
}

impl Producer {
    /// The producer id and epoch (-1, -1 for a plain producer).
    pub fn identity(&self) -> (i64, i16) {
        self.txn.as_ref().map_or((-1, -1), |t| (t.producer_id, t.epoch))
    }

    /// Is a transaction open?
    pub fn in_transaction(&self) -> bool {
        self.txn.as_ref().is_some_and(|t| t.in_txn)
    }

    fn fenced_error(t: &TxnProducer, by: i16) -> LogError {
        LogError::Fenced(format!(
            "producer of transactional id {:?} (producer id {}, epoch {}) was fenced by a newer producer with \
             epoch {by}; its open transaction was aborted: close this producer and stop using it",
            t.id, t.producer_id, t.epoch
        ))
    }

    /// Raise `Fenced` if a newer producer of this id exists in this process
    /// (an atomic load). Cheap enough for every record.
    fn check_fenced_here(&mut self) -> Result<(), LogError> {
        let Some(t) = self.txn.as_mut() else { return Ok(()) };
        if let Some(by) = t.fenced_by {
            return Err(Self::fenced_error(t, by));
        }
        let latest = t.latest.load(Ordering::SeqCst);
        if latest != pack(t.producer_id, t.epoch) {
            let by = latest as u16 as i16;
            t.fenced_by = Some(by);
            t.in_txn = false;
            return Err(Self::fenced_error(t, by));
        }
        Ok(())
    }

    /// Raise `Fenced` if a newer epoch was saved for this id by any process.
    /// Re-reads the state file only when it changed (one `stat` otherwise).
    /// Done on begin, commit, abort, flush and whenever a partition is added
    /// to the transaction or its writer is (re)opened; between those, another
    /// process cannot have aborted this transaction on a partition this
    /// process holds the writer lock of.
    fn check_fenced(&mut self) -> Result<(), LogError> {
        self.check_fenced_here()?;
        let Some(t) = self.txn.as_mut() else { return Ok(()) };
        let now = stamp(&t.state_path);
        if now != t.stamp {
            let st = load_state(&t.state_path)?;
            t.stamp = now;
            Self::check_entry(t, &st)?;
        }
        Ok(())
    }

    /// The index of the target for `topic`/`partition`, opening its writer on first use.
    fn target(&mut self, topic: &str, partition: i32) -> Result<usize, LogError> {
        let hit = |t: &Target| t.partition == partition && t.topic == topic;
        if self.targets.get(self.last).is_some_and(hit) {
            return Ok(self.last);
        }
        let i = match self.targets.iter().position(hit) {
            Some(i) => i,
            None => {
                let writer = Arc::downgrade(&self.log.writer(topic, partition)?);
                self.targets.push(Target { topic: topic.to_string(), partition, writer, seq: 0, txn_gen: 0 });
                self.targets.len() - 1
            }
        };
        self.last = i;
        Ok(i)
    }

    fn check_entry(t: &mut TxnProducer, st: &TxnStateFile) -> Result<(), LogError> {
        match st.entries.get(&t.id) {
            Some(e) if e.producer_id == t.producer_id && e.epoch == t.epoch => Ok(()),
            other => {
                let by = other.map_or(t.epoch, |e| e.epoch);
                t.fenced_by = Some(by);
                t.in_txn = false;
                Err(Self::fenced_error(t, by))
            }
        }
    }

    fn state_error(&self, what: &str) -> LogError {
        let id = self.txn.as_ref().map_or("<none>".to_string(), |t| format!("{:?}", t.id));
        LogError::TxnState(format!("{what} (transactional id {id})"))
    }

    /// Buffer one record for `topic`/`partition`; returns its offset.
    pub fn send(
        &mut self,
        topic: &str,
        partition: i32,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(&[u8], Option<&[u8]>)],
        timestamp: Option<i64>,
    ) -> Result<i64, LogError> {
        let meta = if self.txn.is_some() {
            self.check_fenced_here()?;
            if !self.in_transaction() {
                return Err(self.state_error("send() of a transactional producer outside a transaction: call begin() first"));
            }
            let i = self.target(topic, partition)?;
            let dir = self.log.dir.clone();
            let t = self.txn.as_mut().unwrap();
            let target = &mut self.targets[i];
            if target.txn_gen != t.txn_gen {
                // Record the partition before writing to it, so a crash leaves
                // a state that names every partition holding our records.
                let tp = (topic.to_string(), partition);
                let mut g = StateGuard::take(&dir)?;
                let res = Self::check_entry(t, &g.state);
                t.stamp = stamp(&g.path);
                res?;
                let e = g.state.entries.get_mut(&t.id).unwrap();
                if e.state != TxnState::Ongoing {
                    e.state = TxnState::Ongoing;
                    e.started_ms = now_ms();
                    e.partitions.clear();
                }
                e.partitions.insert(tp.clone());
                g.save()?;
                t.stamp = stamp(&g.path);
                t.partitions.insert(tp);
                target.txn_gen = t.txn_gen;
            }
            let m = BatchMeta {
                producer_id: t.producer_id,
                producer_epoch: t.epoch,
                base_sequence: target.seq,
                transactional: true,
                ..Default::default()
            };
            target.seq = target.seq.wrapping_add(1) & i32::MAX;
            m
        } else {
            BatchMeta::default()
        };
        let i = self.target(topic, partition)?;
        let w = match self.targets[i].writer.upgrade() {
            Some(w) => w,
            None => {
                self.check_fenced()?;
                let w = self.log.writer(topic, partition)?;
                self.targets[i].writer = Arc::downgrade(&w);
                w
            }
        };
        let mut w = w.lock().unwrap_or_else(|p| p.into_inner());
        w.send(meta, timestamp.unwrap_or_else(now_ms), key, value, headers)
    }

    /// Write every buffered record of the partitions this producer's log writes.
    pub fn flush(&mut self) -> Result<(), LogError> {
        self.check_fenced()?;
        self.log.flush()
    }

    /// Start a transaction.
    pub fn begin(&mut self) -> Result<(), LogError> {
        if self.txn.is_none() {
            return Err(self.state_error("begin() needs a transactional producer: pass a transactional_id"));
        }
        self.check_fenced()?;
        if self.in_transaction() {
            return Err(self.state_error("begin() while a transaction is open: commit() or abort() it first"));
        }
        let t = self.txn.as_mut().unwrap();
        t.in_txn = true;
        t.txn_gen += 1;
        t.partitions.clear();
        Ok(())
    }

    fn end(&mut self, commit: bool) -> Result<(), LogError> {
        let what = if commit { "commit()" } else { "abort()" };
        if self.txn.is_none() {
            return Err(self.state_error(&format!("{what} needs a transactional producer: pass a transactional_id")));
        }
        self.check_fenced()?;
        if !self.in_transaction() {
            return Err(self.state_error(&format!("{what} without an open transaction: call begin() first")));
        }
        let dir = self.log.dir.clone();
        let log = self.log.clone();
        let t = self.txn.as_mut().unwrap();
        if t.partitions.is_empty() {
            t.in_txn = false;
            return Ok(());
        }
        if commit {
            // Every record of the transaction must be in the files before the
            // commit is decided: recovery of a `prepare-commit` only writes markers.
            for (topic, partition) in &t.partitions {
                let w = log.writer(topic, *partition)?;
                w.lock().unwrap_or_else(|p| p.into_inner()).flush(true)?;
            }
        }
        let mut g = StateGuard::take(&dir)?;
        let res = Self::check_entry(t, &g.state);
        t.stamp = stamp(&g.path);
        res?;
        let e = g.state.entries.get_mut(&t.id).unwrap();
        e.state = if commit { TxnState::PrepareCommit } else { TxnState::PrepareAbort };
        g.save()?;
        let id = t.id.clone();
        log.complete(&mut g, &id)?;
        t.stamp = stamp(&g.path);
        t.in_txn = false;
        t.partitions.clear();
        Ok(())
    }

    /// Commit the open transaction: COMMIT markers on every partition it touched.
    pub fn commit(&mut self) -> Result<(), LogError> {
        self.end(true)
    }

    /// Abort the open transaction: ABORT markers on every partition it touched.
    pub fn abort(&mut self) -> Result<(), LogError> {
        self.end(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_file_with_a_non_ascii_transactional_id_is_malformed_not_a_panic() {
        // Found by the `txn_state` fuzz target: "aéa" is 4 bytes, and slicing
        // it two bytes at a time split the 'é'.
        let path = Path::new("/x/transactions.state");
        let text = format!("{STATE_MAGIC}\nnext-producer-id 1\ntxn aéa 0 0 empty -1 -\n");
        let e = TxnStateFile::parse(path, &text).unwrap_err();
        assert!(e.to_string().contains("line 3: bad transactional id"), "{e}");
        let ok = format!("{STATE_MAGIC}\nnext-producer-id 1\ntxn {} 0 0 empty -1 -\n", hex("aéa"));
        assert!(TxnStateFile::parse(path, &ok).unwrap().entries.contains_key("aéa"));
    }

    #[test]
    fn an_ongoing_transaction_with_a_start_time_in_the_distant_past_expires() {
        // now - i64::MIN wrapped to a negative age (or panicked with overflow
        // checks), so such a transaction was never aborted.
        let d = tempfile::tempdir().unwrap();
        let text = format!("{STATE_MAGIC}\nnext-producer-id 1\ntxn {} 0 0 ongoing {} 0@t\n", hex("app"), i64::MIN);
        fs::write(d.path().join(STATE_FILE), text).unwrap();
        let log = Log::new(d.path(), WriterConfig { sync: false, ..Default::default() }).unwrap();
        assert_eq!(log.abort_expired_transactions(60_000).unwrap(), vec!["app".to_string()]);
        assert_eq!(log.transactions().unwrap().entries["app"].state, TxnState::Empty);
    }

    #[test]
    fn identities_of_producers_that_are_gone_are_dropped() {
        // Before, every transactional id a process ever used stayed in the map for good.
        let d = tempfile::tempdir().unwrap();
        let log = Arc::new(Log::new(d.path(), WriterConfig { sync: false, ..Default::default() }).unwrap());
        let mut kept = log.producer(Some("kept")).unwrap();
        for i in 0..200 {
            // dropped at the end of each iteration
            let _gone = log.producer(Some(&format!("gone-{i}"))).unwrap();
        }
        // other tests add entries concurrently, but never 200 of them
        assert!(identities_held() < 100, "{} identities held", identities_held());
        // a live producer's identity is still shared: a second producer of its id fences it
        let _newer = log.producer(Some("kept")).unwrap();
        assert!(kept.begin().is_err(), "the older producer must see it was fenced");
    }
}
