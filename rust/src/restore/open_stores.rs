//! Stores kept open between restores of the same store: the state updater
//! restores a task in rounds, and updates a standby every fraction of a
//! second. Opening a RocksDB writes a MANIFEST and an OPTIONS file and syncs
//! them, and a flush writes a level-0 file for what the round applied, so a
//! round that opened, flushed and closed its store cost ~3 ms of wall time and
//! ~5 ms of CPU a store even for a handful of records (100 standby stores
//! updated four times a second kept both cores busy). Kafka Streams keeps a
//! restoring or standby task's stores open too, and flushes them when it
//! records their offsets.
//!
//! A restore given [`OpenStores`] ([`super::engine::RestoreSpec::kept_open`])
//! takes its store from there if it is open, else opens it; afterwards the
//! store goes back, and a replay leaves its memtables unflushed. Nothing is
//! lost to a crash that was ever vouched for: a key-value store's offset is in
//! the same `WriteBatch` as its data (WAL off, atomic flush), so whatever
//! reached disk is a committed prefix with its own offset; and whoever
//! records offsets elsewhere (a checkpoint file) flushes the store first
//! ([`OpenStores::flush`]). A segmented store's segments are separate
//! databases, so its offset stays in memory until its flush has made every
//! segment durable ([`crate::segments::SegmentedStore::hold`]).
//!
//! The memtables of the stores here share a memory budget: when a store comes
//! back and they hold more, the largest are flushed until they hold half of it.
//! RocksDB's `WriteBufferManager` does not do this, since it flushes only a
//! database being written to, and a standby that receives nothing more keeps
//! its memtable.
//!
//! A store is either here or in one restore ([`Held`]), never both: the
//! caller must not flush or close a store while a restore of it runs. A store
//! taken from here goes back whatever the restore's outcome, so nothing it
//! holds unflushed is dropped with it; the caller flushes or closes it.

use std::collections::HashMap;
use std::fmt;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::Dest;
use crate::offsets::OFFSET_UNKNOWN;
use crate::store::StoreError;

/// Memtable bytes above which a store that comes back is flushed: what a
/// standby holds unflushed, its promotion must flush before the application
/// opens the store, so this bounds that wait (up to a memtable, 32 MiB by
/// default, made a promoted task's restore 0.40-0.56 s instead of 0.18 s in
/// the failover benchmark) at the cost of a level-0 file per this many
/// bytes. Kafka Streams flushes a standby every 10,000 records.
pub const FLUSH_BYTES: u64 = 4 << 20;

/// Stores kept open between restores; see the module documentation.
pub struct OpenStores {
    /// Each store, with the bytes its memtables held when it came back: only
    /// restores write them, so the budget is checked without asking every
    /// store each time one comes back.
    stores: Mutex<HashMap<PathBuf, (Dest, u64)>>,
    /// Stores closed here because a flush failed while no caller of theirs
    /// could hear it (one flushed to make room for another, or kept on a
    /// restore's unwinding), with the error: what they held unflushed is
    /// lost, so their caller's next flush or close fails with it rather than
    /// finding them quietly gone. A restore of one keeps it again and clears it.
    lost: Mutex<HashMap<PathBuf, StoreError>>,
    /// Most bytes the memtables of the stores here hold when one comes back.
    memory_budget: u64,
}

impl OpenStores {
    /// No store open yet; the memtables of the stores kept here share `memory_budget` bytes.
    pub fn new(memory_budget: usize) -> Self {
        Self {
            stores: Mutex::new(HashMap::new()),
            lost: Mutex::new(HashMap::new()),
            memory_budget: memory_budget as u64,
        }
    }

    fn stores(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, (Dest, u64)>> {
        self.stores.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lost(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, StoreError>> {
        self.lost.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The store at `path` was closed after `error`; its caller hears of it at its next flush or close.
    fn record_lost(&self, path: PathBuf, error: StoreError) {
        self.lost().insert(path, error);
    }

    /// The error that closed the store at `key` while no caller could hear it, taken (told once).
    fn take_lost(&self, key: &Path) -> Result<(), StoreError> {
        self.lost().remove(key).map_or(Ok(()), Err)
    }

    /// The key of the store at `path`: one store however its path is spelt.
    fn key(path: &Path) -> PathBuf {
        std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
    }

    /// Take the store open at `path` for a restore of it.
    pub(crate) fn take(&self, path: &Path) -> Option<Dest> {
        self.stores().remove(&Self::key(path)).map(|(store, _)| store)
    }

    /// Keep `store` open for the next restore of it, flushed first if its
    /// memtables hold more than [`FLUSH_BYTES`]. If the memtables here then
    /// hold more than the budget, the largest are flushed until they hold
    /// half of it. A store whose own flush fails is closed (what it held
    /// unflushed is lost with its offset, as in a crash) and the error
    /// returned; another store whose flush fails is closed and recorded as
    /// lost, for its own caller (see [`OpenStores::flush`]).
    pub(crate) fn keep(&self, store: Dest) -> Result<(), StoreError> {
        let key = Self::key(store.path());
        self.lost().remove(&key);
        let mut bytes = store.memtable_bytes();
        if bytes > FLUSH_BYTES {
            store.flush()?;
            bytes = 0;
        }
        let mut stores = self.stores();
        stores.insert(key.clone(), (store, bytes));
        let mut held: u64 = stores.values().map(|(_, b)| b).sum();
        if held <= self.memory_budget {
            return Ok(());
        }
        let mut sizes: Vec<(u64, PathBuf)> = stores.iter().map(|(p, (_, b))| (*b, p.clone())).collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        let mut own = Ok(());
        for (bytes, path) in sizes {
            if held <= self.memory_budget / 2 {
                break;
            }
            let Some((store, held_bytes)) = stores.get_mut(&path) else { continue };
            match store.flush() {
                Ok(()) => *held_bytes = 0,
                Err(e) => {
                    stores.remove(&path);
                    if path == key {
                        own = Err(e);
                    } else {
                        self.record_lost(path, e);
                    }
                }
            }
            held -= bytes;
        }
        own
    }

    /// The offset a restore of `tp` into the store open at `path` will start
    /// from: the one after its recorded offset. `None` when no store is open
    /// there, it records no offset for `tp` (a restore from the log's start)
    /// or the offset cannot be read (the restore will say why).
    pub(crate) fn start_of(&self, path: &Path, tp: &str) -> Option<i64> {
        let stores = self.stores();
        let (store, _) = stores.get(&Self::key(path))?;
        store.offset(tp).ok().flatten().filter(|&o| o != OFFSET_UNKNOWN).map(|o| o + 1)
    }

    /// Flush the store open at `path` (its data and offsets reach disk);
    /// whether one was open. A store this closed after a failed flush that
    /// no caller heard of (see [`OpenStores::keep`]) fails with that error,
    /// once: its offset counted what was lost.
    pub fn flush(&self, path: &Path) -> Result<bool, StoreError> {
        let key = Self::key(path);
        // Under the lock: a restore cannot take the store while it is flushed.
        match self.stores().get_mut(&key) {
            Some((store, bytes)) => store.flush().map(|()| {
                *bytes = 0;
                true
            }),
            None => self.take_lost(&key).map(|()| false),
        }
    }

    /// Flush and close the store open at `path`; whether one was open. A
    /// store whose flush fails is closed all the same (what RocksDB holds
    /// unflushed is lost, with its offset, as in a crash) and the error is
    /// returned; so is the error of one closed earlier, as for [`OpenStores::flush`].
    pub fn close(&self, path: &Path) -> Result<bool, StoreError> {
        let Some(store) = self.take(path) else { return self.take_lost(&Self::key(path)).map(|()| false) };
        store.flush().map(|()| true)
    }

    /// Flush and close every store here; the first error, after closing them
    /// all (a store closed earlier after a failed flush counts as one).
    pub fn close_all(&self) -> Result<(), StoreError> {
        let stores: Vec<Dest> = self.stores().drain().map(|(_, (s, _))| s).collect();
        let mut first = self.lost().drain().next().map_or(Ok(()), |(_, e)| Err(e));
        for store in stores {
            if let Err(e) = store.flush() {
                first = first.and(Err(e));
            }
        }
        first
    }

    /// The paths of the stores open here.
    pub fn paths(&self) -> Vec<PathBuf> {
        let mut paths: Vec<PathBuf> = self.stores().keys().cloned().collect();
        paths.sort();
        paths
    }

    /// Bytes the memtables of these stores hold now.
    pub fn memtable_bytes(&self) -> u64 {
        self.stores().values().map(|(store, _)| store.memtable_bytes()).sum()
    }
}

impl fmt::Debug for OpenStores {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenStores").field("paths", &self.paths()).field("memory_budget", &self.memory_budget).finish()
    }
}

impl Drop for OpenStores {
    fn drop(&mut self) {
        // Closing a RocksDB without flushing it loses its memtables: flush what is still open.
        let _ = self.close_all();
    }
}

/// A restore's store: one it opened and closes, or one taken from (or opened
/// for) [`OpenStores`], which goes back there when this is dropped, after an
/// error or a panic too.
pub struct Held {
    store: Option<Dest>,
    home: Option<Arc<OpenStores>>,
}

impl Held {
    /// The store at `path` from `home` if it is open there, else `None`.
    pub(crate) fn take(home: &Arc<OpenStores>, path: &Path) -> Option<Held> {
        home.take(path).map(|store| Held { store: Some(store), home: Some(home.clone()) })
    }

    /// `store`, to go to `home` (if any) when dropped, else to be closed.
    pub(crate) fn new(store: Dest, home: Option<&Arc<OpenStores>>) -> Held {
        Held { store: Some(store), home: home.cloned() }
    }

    /// Give the store back to its home now, with the error of the flush that
    /// keeping it may take ([`OpenStores::keep`]); closed if it has none.
    pub(crate) fn give_back(mut self) -> Result<(), StoreError> {
        match (self.store.take(), self.home.take()) {
            (Some(store), Some(home)) => home.keep(store),
            _ => Ok(()),
        }
    }
}

impl Deref for Held {
    type Target = Dest;

    fn deref(&self) -> &Dest {
        self.store.as_ref().expect("a held store is there until given back")
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let (Some(store), Some(home)) = (self.store.take(), self.home.take()) {
            // Nobody hears this error now: if keeping it flushed it and the flush failed, the
            // caller's next flush or close of it fails with the error.
            let path = OpenStores::key(store.path());
            if let Err(e) = home.keep(store) {
                home.record_lost(path, e);
            }
        }
    }
}
