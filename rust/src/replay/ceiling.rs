//! The raw write ceiling of replay, for the benchmark: the same records,
//! decoded into memory beforehand, written with the same batching and options,
//! so the only cost measured is RocksDB's.

use std::time::{Duration, Instant};

use super::{ChunkOps, RestoreError};
use crate::source::{ChangelogSource, SourceError};
use crate::store::Store;

/// One decoded record: offset, key, value.
pub type Decoded = (i64, Option<Box<[u8]>>, Option<Box<[u8]>>);

/// Read `[source.position(), end)` into memory, one vector per chunk.
pub fn decode(
    source: &mut dyn ChangelogSource,
    end: i64,
    chunk_bytes: usize,
) -> Result<Vec<Vec<Decoded>>, SourceError> {
    let mut chunks = Vec::new();
    loop {
        let mut chunk = Vec::new();
        let more = source.next_chunk(end, chunk_bytes, &mut |r| {
            chunk.push((r.offset, r.key.map(Box::from), r.value.map(Box::from)));
        })?;
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
pub fn write(store: &Store, tp: &str, chunks: &[Vec<Decoded>]) -> Result<Duration, RestoreError> {
    let t0 = Instant::now();
    let mut ops = ChunkOps::default();
    for chunk in chunks {
        ops.clear();
        for (_, k, v) in chunk {
            if let Some(k) = k {
                ops.push(k, v.as_deref());
            }
        }
        let mut b = ops.to_batch(store);
        if let Some((off, _, _)) = chunk.last() {
            store.put_offset(&mut b, tp, *off);
        }
        store.write(b, false).map_err(|e| RestoreError::store(tp, e))?;
    }
    store.flush().map_err(|e| RestoreError::store(tp, e))?;
    Ok(t0.elapsed())
}
