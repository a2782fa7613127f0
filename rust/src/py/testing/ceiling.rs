//! The raw write ceiling of replay, for the benchmark
//! (`_testing.restore_write_ceiling`): the same records, decoded into memory
//! beforehand, written with the same batching and options, so the only cost
//! measured is RocksDB's. Benchmark-only, so it lives here and not in
//! [`crate::restore`].

use std::path::PathBuf;
use std::time::{Duration, Instant};

use pyo3::prelude::*;

use crate::log::SegmentLogDir;
use crate::restore::chunk::ChunkOps;
use crate::restore::replay::DEFAULT_CHUNK_BYTES;
use crate::restore::{restore_options, RestoreError};
use crate::source::{Changelog, ChangelogSource, LogError, RecordChunk};
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

/// Benchmark helper: decode `[log start, end)` of `tp` (a `TopicPartition`)
/// in the segment log at `log_dir` into memory, then write it into a new
/// store at `store_path` exactly as replay batches it. Returns `(seconds
/// spent writing, records)`; decoding is not timed.
#[pyfunction]
#[pyo3(signature = (store_path, log_dir, tp, end_offset=None))]
pub fn restore_write_ceiling(
    py: Python<'_>,
    store_path: PathBuf,
    log_dir: PathBuf,
    tp: &Bound<'_, PyAny>,
    end_offset: Option<i64>,
) -> PyResult<(f64, u64)> {
    let topic: String = tp.getattr("topic")?.extract()?;
    let partition: i32 = tp.getattr("partition")?.extract()?;
    let tpname = format!("{topic}-{partition}");
    let log = SegmentLogDir(log_dir.clone());
    Ok(py.detach(|| {
        let log_err = |e| RestoreError::log(e, format!("reading {tpname} in {}", log_dir.display()));
        let b = log.bounds(&topic, partition).map_err(log_err)?;
        let end = end_offset.unwrap_or(b.last_stable);
        let mut src = log.open(&topic, partition, b.start).map_err(log_err)?;
        let chunks = decode(src.as_mut(), end, DEFAULT_CHUNK_BYTES)
            .map_err(|e| RestoreError::log(e, format!("decoding {tpname}")))?;
        let n = chunks.iter().map(|c| c.len() as u64).sum();
        let store = Store::open_with(&store_path, restore_options()).map_err(|e| RestoreError::store(&tpname, e))?;
        let t = write(&store, &tpname, &chunks)?;
        Ok::<_, RestoreError>((t.as_secs_f64(), n))
    })?)
}
