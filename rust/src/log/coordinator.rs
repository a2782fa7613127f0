//! The root of a segment log: partition writers, producers, and the
//! transaction coordinator's housekeeping over the state file of
//! [`super::txn`].

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use super::producer::{identity, pack, stamp, Producer, TxnProducer};
use super::txn::{load_state, now_ms, StateGuard, Tp, TxnEntry, TxnState, TxnStateFile, STATE_FILE};
use super::writer::{acquire, PartitionWriter, WriterConfig};
use super::{partition_dir, LogError};

/// A segment log rooted at a directory: hands out partition writers and
/// producers, and runs the coordinator's housekeeping.
pub struct Log {
    pub(super) dir: PathBuf,
    cfg: WriterConfig,
    writers: Mutex<HashMap<Tp, Arc<Mutex<PartitionWriter>>>>,
}

impl Log {
    /// A log rooted at `dir` (created when first written).
    pub fn new(dir: &Path, cfg: WriterConfig) -> Result<Self, LogError> {
        if cfg.segment_bytes == 0 || cfg.segment_bytes > i32::MAX as u64 {
            return Err(LogError::other(format!(
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
    pub(super) fn complete(&self, g: &mut StateGuard, id: &str) -> Result<(), LogError> {
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
            return Err(LogError::other("transactional id must not be empty (pass None for a plain producer)"));
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
            None => TxnEntry {
                producer_id: next,
                epoch: 0,
                state: TxnState::Empty,
                started_ms: -1,
                partitions: BTreeSet::new(),
            },
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::txn::{hex, STATE_MAGIC};

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
        let held = crate::log::producer::identities_held();
        assert!(held < 100, "{held} identities held");
        // a live producer's identity is still shared: a second producer of its id fences it
        let _newer = log.producer(Some("kept")).unwrap();
        assert!(kept.begin().is_err(), "the older producer must see it was fenced");
    }
}
