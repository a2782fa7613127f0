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

pub mod reader;
pub mod segment;
pub mod txn;
pub mod writer;

use std::fmt::Display;
use std::io;
use std::path::{Path, PathBuf};

pub use reader::{CommittedReader, Isolation, PartitionOffsets, PartitionReader};

use crate::source::{ChangelogSource, SourceError};

/// Everything that can go wrong in the log. Each variant maps to one class of
/// `statestore.errors`; every message names the file and, where known, the
/// byte position and offset, and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// Bytes that are not a valid batch before the tail (`CorruptLogError`).
    #[error("{0}")]
    Corrupt(String),
    /// A codec this build cannot decode (`UnsupportedCompressionError`).
    #[error("{0}")]
    UnsupportedCompression(String),
    /// A newer producer took over (`ProducerFencedError`).
    #[error("{0}")]
    Fenced(String),
    /// A transactional call out of order (`TransactionStateError`).
    #[error("{0}")]
    TxnState(String),
    /// The partition is being written by another process (`LockError`).
    #[error("{0}")]
    Lock(String),
    /// Anything else: I/O, bad arguments (`LogError`).
    #[error("{0}")]
    Other(String),
}

impl LogError {
    /// An I/O failure doing `op` to `path`.
    pub fn io(op: &str, path: &Path, e: io::Error) -> Self {
        LogError::Other(format!("{op} {}: {e}", path.display()))
    }

    /// Corrupt bytes in `path` at byte `position`, in the batch with base `offset`.
    pub fn corrupt(path: &Path, position: u64, offset: i64, msg: impl Display) -> Self {
        LogError::Corrupt(format!(
            "corrupt log segment {} at byte {position} (batch base offset {offset}): {msg}; the log cannot be read \
             past this point: restore the partition's files from a good copy, or delete this segment and the ones \
             after it to truncate the log before offset {offset}",
            path.display()
        ))
    }

    /// The name of the `statestore.errors` class this error is raised as.
    pub fn class_name(&self) -> &'static str {
        match self {
            LogError::Corrupt(_) => "CorruptLogError",
            LogError::UnsupportedCompression(_) => "UnsupportedCompressionError",
            LogError::Fenced(_) => "ProducerFencedError",
            LogError::TxnState(_) => "TransactionStateError",
            LogError::Lock(_) => "LockError",
            LogError::Other(_) => "LogError",
        }
    }
}

impl From<LogError> for SourceError {
    fn from(e: LogError) -> Self {
        match e {
            LogError::Corrupt(m) => SourceError::Corrupt(m),
            LogError::UnsupportedCompression(m) => SourceError::UnsupportedCompression(m),
            other => SourceError::Other(other.to_string()),
        }
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
        Err(LogError::Other(format!(
            "invalid topic name {topic:?}: use 1 to 249 of the characters a-z A-Z 0-9 . _ - (as Kafka does)"
        )))
    }
}

/// `<log_dir>/<topic>-<partition>`.
pub fn partition_dir(log_dir: &Path, topic: &str, partition: i32) -> Result<PathBuf, LogError> {
    check_topic(topic)?;
    if partition < 0 {
        return Err(LogError::Other(format!("invalid partition {partition} of topic {topic}: must be >= 0")));
    }
    Ok(log_dir.join(format!("{topic}-{partition}")))
}

fn check_log_dir(log_dir: &Path) -> Result<(), LogError> {
    if log_dir.is_dir() {
        Ok(())
    } else {
        Err(LogError::Other(format!(
            "log directory {} does not exist (or is not a directory); check the path of the changelog",
            log_dir.display()
        )))
    }
}

/// Start, end and last stable offset of a partition. A partition with no
/// files yet is empty: all three are 0. Takes no lock.
pub fn partition_offsets(log_dir: &Path, topic: &str, partition: i32) -> Result<PartitionOffsets, SourceError> {
    check_log_dir(log_dir)?;
    let dir = partition_dir(log_dir, topic, partition)?;
    Ok(reader::offsets_of(&dir)?)
}

/// A read_committed cursor over a partition from `start_offset` (clamped to
/// the start of the log). Takes no lock: writers may append meanwhile.
pub fn open_committed_source(
    log_dir: &Path,
    topic: &str,
    partition: i32,
    start_offset: i64,
) -> Result<Box<dyn ChangelogSource>, SourceError> {
    check_log_dir(log_dir)?;
    let dir = partition_dir(log_dir, topic, partition)?;
    Ok(Box::new(CommittedReader::open(&dir, start_offset)?))
}

#[cfg(test)]
mod tests;
