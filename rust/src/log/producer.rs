//! Producers of a segment log: plain, or transactional with an id whose
//! epoch fences older producers of the same id (see [`super::txn`]).

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::coordinator::Log;
use super::txn::{load_state, now_ms, StateGuard, Tp, TxnState, TxnStateFile};
use super::writer::PartitionWriter;
use super::{LogError, LogErrorKind};
use crate::codec::BatchMeta;

/// The newest `(producer id, epoch)` of each transactional id known in this
/// process, shared by its producers: a producer fenced by another producer of
/// the same process notices on its very next call without any I/O.
pub(super) type Identity = Arc<AtomicI64>;

pub(super) fn pack(pid: i64, epoch: i16) -> i64 {
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

pub(super) fn identity(dir: &Path, id: &str) -> Identity {
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
pub(super) fn identities_held() -> usize {
    IDS.get().map_or(0, |m| m.lock().unwrap_or_else(|p| p.into_inner()).len())
}

pub(super) type Stamp = Option<(u64, u64, i64, i64)>;

pub(super) fn stamp(path: &Path) -> Stamp {
    fs::metadata(path).ok().map(|m| (m.dev(), m.ino(), m.mtime(), m.mtime_nsec()))
}

pub(super) struct TxnProducer {
    pub(super) id: String,
    pub(super) producer_id: i64,
    pub(super) epoch: i16,
    pub(super) in_txn: bool,
    /// Transactions begun so far; a target is in the open transaction when
    /// its `txn_gen` equals this.
    pub(super) txn_gen: u64,
    pub(super) partitions: BTreeSet<Tp>,
    pub(super) state_path: PathBuf,
    pub(super) latest: Identity,
    pub(super) stamp: Stamp,
    pub(super) fenced_by: Option<i16>,
}

/// A partition this producer writes, with its writer and sequence number.
/// The writer is owned by the [`Log`] (so `close` releases it); a producer
/// only keeps a weak handle and re-opens it through the log when it is gone.
pub(super) struct Target {
    topic: String,
    partition: i32,
    writer: Weak<Mutex<PartitionWriter>>,
    seq: i32,
    txn_gen: u64,
}

/// A producer: plain (no producer id) or transactional.
pub struct Producer {
    pub(super) log: Arc<Log>,
    pub(super) txn: Option<TxnProducer>,
    pub(super) targets: Vec<Target>,
    pub(super) last: usize,
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

    /// `Fenced`, about the transaction state file that records the newer epoch.
    fn fenced_error(t: &TxnProducer, by: i16) -> LogError {
        LogError::new(
            LogErrorKind::Fenced,
            format!(
                "producer of transactional id {:?} (producer id {}, epoch {}) was fenced by a newer producer with \
             epoch {by}; its open transaction was aborted: close this producer and stop using it",
                t.id, t.producer_id, t.epoch
            ),
        )
        .with_path(&t.state_path)
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
        LogError::new(LogErrorKind::TxnState, format!("{what} (transactional id {id})")).with_path(&self.log.dir)
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
                return Err(
                    self.state_error("send() of a transactional producer outside a transaction: call begin() first")
                );
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
