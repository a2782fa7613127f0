//! The raw write ceiling of replay, for the benchmark: the same records,
//! decoded into memory beforehand, written with the same batching and options,
//! so the only cost measured is RocksDB's.

use std::time::{Duration, Instant};

use super::{ChunkOps, RestoreError};
use crate::source::{ChangelogSource, LogError, RecordChunk};
use crate::store::Store;

/// Read `[source.position(), end)` into memory, one chunk per chunk of the source.
pub fn decode(source: &mut dyn ChangelogSource, end: i64, chunk_bytes: usize) -> Result<Vec<RecordChunk>, LogError> {
    let mut chunks = Vec::new();
    loop {
        let mut chunk = RecordChunk::default();
        let more = source.next_chunk(end, chunk_bytes, &mut |r| chunk.push(r))?;
        if !chunk.is_empty() {
            chunks.push(chunk);
        }
        if !more {
            return Ok(chunks);
        }
    }
}

/// Write `chunks` as replay would (one batch per chunk, in key order with the
/// last operation per key, with its offset, WAL off, flush at the end) and
/// return how long it took.
pub fn write(store: &Store, tp: &str, chunks: &[RecordChunk]) -> Result<Duration, RestoreError> {
    let t0 = Instant::now();
    let mut ops = ChunkOps::default();
    for chunk in chunks {
        ops.clear();
        for r in chunk.iter() {
            if let Some(k) = r.key {
                ops.push(k, r.value);
            }
        }
        let mut b = ops.to_batch(store);
        if let Some(last) = chunk.records.last() {
            store.put_offset(&mut b, tp, last.offset);
        }
        store.write(b, false).map_err(|e| RestoreError::store(tp, e))?;
    }
    store.flush().map_err(|e| RestoreError::store(tp, e))?;
    Ok(t0.elapsed())
}
