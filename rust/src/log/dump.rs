//! The batches of a partition as `kafka-dump-log` shows them, with each
//! transactional batch's outcome (committed, aborted, still open), and
//! optionally the records a consumer of the given isolation would get.

use std::path::Path;

use super::reader::{Outcome, TxnResolver};
use super::segment::BatchCursor;
use super::{partition_dir, Isolation, LogError, LogErrorKind};
use crate::codec::{self, BatchHeader};
use crate::source::RecordChunk;

/// How a transactional data batch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchOutcome {
    Committed,
    Aborted,
    Open,
}

impl BatchOutcome {
    pub fn name(self) -> &'static str {
        match self {
            BatchOutcome::Committed => "committed",
            BatchOutcome::Aborted => "aborted",
            BatchOutcome::Open => "open",
        }
    }
}

/// One batch of a partition: where it is, its header, and what it means.
#[derive(Debug, Clone)]
pub struct DumpBatch {
    /// File name of the segment holding it.
    pub segment: String,
    /// Byte position in the segment.
    pub position: u64,
    pub header: BatchHeader,
    pub crc_valid: bool,
    /// `COMMIT`/`ABORT` for a control batch with a valid CRC.
    pub control: Option<String>,
    /// For transactional data batches.
    pub outcome: Option<BatchOutcome>,
    /// The records, when asked for and visible under the isolation.
    pub records: Option<RecordChunk>,
}

/// Every batch of `topic`-`partition` under `log_dir`, in log order; with
/// `records`, the records a consumer of `isolation` gets from each batch
/// (read_committed: none of aborted batches, nothing from the first open
/// transaction on).
pub fn dump_partition(
    log_dir: &Path,
    topic: &str,
    partition: i32,
    records: bool,
    isolation: Isolation,
) -> Result<Vec<DumpBatch>, LogError> {
    let dir = partition_dir(log_dir, topic, partition)?;
    let mut cursor = BatchCursor::open(&dir, 0, 1 << 20, false)?;
    let mut resolver = TxnResolver::new(&dir, 0, 0);
    let mut out = Vec::new();
    let mut scratch = Vec::new();
    let mut open_seen = false;
    while let Some(p) = cursor.peek()? {
        let h = p.header;
        let batch = cursor.batch_bytes();
        let path = cursor.segment_path().to_path_buf();
        let crc_valid = codec::batch_crc(batch) == h.crc;
        let control =
            if h.is_control() && crc_valid { codec::control_type(&h, batch).ok().map(|c| c.name()) } else { None };
        let outcome = if h.is_transactional() && !h.is_control() {
            Some(match resolver.resolve(h.producer_id, h.base_offset)? {
                Outcome::Committed => BatchOutcome::Committed,
                Outcome::Aborted => BatchOutcome::Aborted,
                Outcome::Open => BatchOutcome::Open,
            })
        } else {
            None
        };
        open_seen |= outcome == Some(BatchOutcome::Open);
        let show = records
            && !h.is_control()
            && (isolation == Isolation::ReadUncommitted || (!open_seen && outcome != Some(BatchOutcome::Aborted)));
        let recs = if show && crc_valid {
            let it = codec::batch_records(&h, batch, &mut scratch).map_err(|e| match e {
                codec::CodecError::UnsupportedCompression(c) => LogError::new(
                    LogErrorKind::UnsupportedCompression,
                    format!(
                        "{}: batch at byte {} (base offset {}) uses compression {c}",
                        path.display(),
                        p.position,
                        h.base_offset
                    ),
                )
                .with_path(&path)
                .with_offset(h.base_offset),
                e => LogError::corrupt(&path, p.position, h.base_offset, e),
            })?;
            let mut chunk = RecordChunk::default();
            for r in it {
                let r = r.map_err(|e| LogError::corrupt(&path, p.position, h.base_offset, e))?;
                chunk.push_with_headers((&r).into(), r.headers());
            }
            Some(chunk)
        } else {
            None
        };
        let segment = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        out.push(DumpBatch { segment, position: p.position, header: h, crc_valid, control, outcome, records: recs });
        cursor.advance();
    }
    Ok(out)
}
