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

use super::LogError;
use crate::fileio::atomic_write;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

pub(super) const STATE_FILE: &str = "transactions.state";
const STATE_LOCK: &str = "transactions.lock";
pub(super) const STATE_MAGIC: &str = "statestore-transactions 1";

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

pub(super) fn hex(s: &str) -> String {
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
            LogError::other(format!(
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
pub(super) struct StateGuard {
    _lock: File,
    pub(super) path: PathBuf,
    pub(super) state: TxnStateFile,
}

impl StateGuard {
    pub(super) fn take(log_dir: &Path) -> Result<Self, LogError> {
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

    pub(super) fn save(&self) -> Result<(), LogError> {
        atomic_write(&self.path, self.state.render().as_bytes()).map_err(|e| LogError::other(e.to_string()))
    }
}

pub(super) fn load_state(path: &Path) -> Result<TxnStateFile, LogError> {
    match fs::read_to_string(path) {
        Ok(text) => TxnStateFile::parse(path, &text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TxnStateFile::default()),
        Err(e) => Err(LogError::io("read", path, e)),
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
}
