//! The seam between the segment log (which reads changelogs) and the restore
//! engine (which writes stores): a read_committed cursor over one changelog
//! partition that hands out committed data records without any per-record
//! allocation or Python.
//!
//! `log` implements [`ChangelogSource`] for segment files; `replay` and `bulk`
//! consume it. Tests of the restore engine may implement it over a vector.

/// One committed changelog record. A `None` value is a tombstone; a `None`
/// key is skipped (and counted) by the restore engine.
#[derive(Debug, Clone, Copy)]
pub struct ChangeRecord<'a> {
    pub offset: i64,
    /// The record's timestamp (ms; CreateTime, or the batch's LogAppendTime):
    /// a timestamped store keeps it in front of the value.
    pub timestamp: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
}

/// Records a source stepped over instead of yielding.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SkipCounts {
    /// Data records of aborted transactions.
    pub aborted: u64,
    /// Control records (transaction markers).
    pub control: u64,
}

/// Why a source could not go on. Each message names the file, byte position
/// and offset where known.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// Bytes that are not a valid batch before the tail (bad CRC or header).
    #[error("{0}")]
    Corrupt(String),
    /// A batch compressed with a codec this build cannot decode.
    #[error("{0}")]
    UnsupportedCompression(String),
    /// Anything else: I/O errors, a missing partition, an offset out of range.
    #[error("{0}")]
    Other(String),
}

/// A read_committed cursor over one changelog partition.
///
/// Invariants: records are yielded in offset order, only committed data
/// records are yielded, and nothing at or beyond `end` (callers pass an end
/// no greater than the last stable offset) is yielded. `position()` is the
/// next offset to read: it steps over control batches and aborted records, so
/// "complete" is `position() >= end`, never "saw a record at end - 1".
pub trait ChangelogSource: Send {
    /// Next offset to read.
    fn position(&self) -> i64;

    /// Feed the committed records of the next chunk (about `max_bytes` of log)
    /// with offsets `< end` to `sink`, advancing `position()`. Returns
    /// `Ok(false)` once `position() >= end` or the log holds nothing more
    /// below `end`.
    fn next_chunk(
        &mut self,
        end: i64,
        max_bytes: usize,
        sink: &mut dyn FnMut(ChangeRecord<'_>),
    ) -> Result<bool, SourceError>;

    /// What was stepped over so far.
    fn skipped(&self) -> SkipCounts;

    /// Bytes of log read so far.
    fn bytes_read(&self) -> u64;
}
