//! The embedded changelog: Kafka's segment layout, a transactional producer
//! and read_committed readers.
//!
//! ```text
//! <log_dir>/<topic>-<partition>/<20-digit base offset>.log   RecordBatch v2, concatenated
//!                               <20-digit base offset>.index  sparse offset index
//!                               .writer.lock                  held by the one writer
//! <log_dir>/transactions.state  producer id, epoch and open transaction per transactional id
//! <log_dir>/transactions.lock   serialises updates of the state file
//! ```
//!
//! Readers never lock anything: they read complete batches only and treat an
//! incomplete batch at the end of the last segment as "not written yet".
//! Writers take the partition's `.writer.lock` (one writer process per
//! partition) and repair a torn tail on open.

pub mod coordinator;
pub mod dump;
pub mod page_cache;
pub mod producer;
pub mod reader;
pub mod segment;
pub mod synthetic;
pub mod txn;
pub mod writer;

use std::fmt::Display;
use std::io;
use std::path::{Path, PathBuf};

pub use coordinator::Log;
pub use producer::Producer;
pub use reader::{CommittedReader, Isolation, PartitionReader};

use crate::source::{Bounds, Changelog, ChangelogSource};

/// Which kind of log failure an error is; each maps to one class of
/// `statestore.errors` (see `py::errors`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogErrorKind {
    /// Bytes that are not a valid batch before the tail (`CorruptLogError`).
    Corrupt,
    /// A codec this build cannot decode (`UnsupportedCompressionError`).
    UnsupportedCompression,
    /// A newer producer took over (`ProducerFencedError`).
    Fenced,
    /// A transactional call out of order (`TransactionStateError`).
    TxnState,
    /// The partition is being written by another process (`LockError`).
    Lock,
    /// The requested offset is outside the partition: the reader's state cannot
    /// be trusted (`TaskCorruptedError` when it comes from a restore).
    OutOfRange,
    /// The changelog's cluster gave no answer within the request budget (timeouts,
    /// broken connections, a leader election that outlasted it): nothing is known
    /// to be wrong with the data, and asking later may succeed
    /// (`ChangelogUnavailableError`).
    Unavailable,
    /// Anything else: I/O, bad arguments, a changelog that refuses (`LogError`).
    Other,
}

/// Everything that can go wrong reading or writing a changelog: the segment
/// log, and every other [`Changelog`] source. The message names the file and,
/// where known, the byte position and offset, and says what to do; `path` and
/// `offset` carry the same facts for tools.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct LogError {
    pub kind: LogErrorKind,
    pub message: String,
    /// The file or directory the error is about.
    pub path: Option<PathBuf>,
    /// The changelog offset the error is about.
    pub offset: Option<i64>,
}

impl LogError {
    pub fn new(kind: LogErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into(), path: None, offset: None }
    }

    /// Any failure without a more specific kind.
    pub fn other(message: impl Into<String>) -> Self {
        Self::new(LogErrorKind::Other, message)
    }

    /// The same error, about `path`.
    pub fn with_path(mut self, path: &Path) -> Self {
        self.path = Some(path.to_path_buf());
        self
    }

    /// The same error, about `offset`.
    pub fn with_offset(mut self, offset: i64) -> Self {
        self.offset = Some(offset);
        self
    }

    /// An I/O failure doing `op` to `path`.
    pub fn io(op: &str, path: &Path, e: io::Error) -> Self {
        Self::other(format!("{op} {}: {e}", path.display())).with_path(path)
    }

    /// Corrupt bytes in `path` at byte `position`, in the batch with base `offset`.
    pub fn corrupt(path: &Path, position: u64, offset: i64, msg: impl Display) -> Self {
        Self::new(
            LogErrorKind::Corrupt,
            format!(
                "corrupt log segment {} at byte {position} (batch base offset {offset}): {msg}; the log cannot be \
                 read past this point: restore the partition's files from a good copy, or delete this segment and \
                 the ones after it to truncate the log before offset {offset}",
                path.display()
            ),
        )
        .with_path(path)
        .with_offset(offset)
    }

    /// The same error with `context` put in front of its message.
    pub fn context(mut self, context: impl Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }
}

/// Check a topic name: Kafka's legal characters only (`[a-zA-Z0-9._-]`, at
/// most 249), which also keeps it a single safe path component.
pub fn check_topic(topic: &str) -> Result<(), LogError> {
    let ok = !topic.is_empty()
        && topic.len() <= 249
        && topic != "."
        && topic != ".."
        && topic.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(LogError::other(format!(
            "invalid topic name {topic:?}: use 1 to 249 of the characters a-z A-Z 0-9 . _ - (as Kafka does)"
        )))
    }
}

/// `<log_dir>/<topic>-<partition>`.
pub fn partition_dir(log_dir: &Path, topic: &str, partition: i32) -> Result<PathBuf, LogError> {
    check_topic(topic)?;
    if partition < 0 {
        return Err(LogError::other(format!("invalid partition {partition} of topic {topic}: must be >= 0")));
    }
    Ok(log_dir.join(format!("{topic}-{partition}")))
}

fn check_log_dir(log_dir: &Path) -> Result<(), LogError> {
    if log_dir.is_dir() {
        Ok(())
    } else {
        Err(LogError::other(format!(
            "log directory {} does not exist (or is not a directory); check the path of the changelog",
            log_dir.display()
        )))
    }
}

/// Start, end and last stable offset of a partition. A partition with no
/// files yet is empty: all three are 0. Takes no lock.
pub fn partition_offsets(log_dir: &Path, topic: &str, partition: i32) -> Result<Bounds, LogError> {
    check_log_dir(log_dir)?;
    let dir = partition_dir(log_dir, topic, partition)?;
    reader::offsets_of(&dir)
}

/// A read_committed cursor over a partition from `start_offset` (clamped to
/// the start of the log). Takes no lock: writers may append meanwhile.
pub fn open_committed_source(
    log_dir: &Path,
    topic: &str,
    partition: i32,
    start_offset: i64,
) -> Result<Box<dyn ChangelogSource>, LogError> {
    check_log_dir(log_dir)?;
    let dir = partition_dir(log_dir, topic, partition)?;
    Ok(Box::new(CommittedReader::open(&dir, start_offset)?))
}

/// The segment log in a directory, as a [`Changelog`] of every partition in it.
#[derive(Debug, Clone)]
pub struct SegmentLogDir(pub PathBuf);

impl SegmentLogDir {
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Changelog for SegmentLogDir {
    fn bounds(&self, topic: &str, partition: i32) -> Result<Bounds, LogError> {
        partition_offsets(&self.0, topic, partition)
    }

    fn open(&self, topic: &str, partition: i32, start: i64) -> Result<Box<dyn ChangelogSource>, LogError> {
        open_committed_source(&self.0, topic, partition, start)
    }

    fn stamp(&self, topic: &str, partition: i32) -> Option<u64> {
        segment::stamp(&partition_dir(&self.0, topic, partition).ok()?)
    }
}

#[cfg(test)]
mod tests;
