//! The ceiling of bulk restore's output, for the benchmark
//! (`_testing.sst_write_ceiling`): RocksDB's own `SstFileWriter` writing
//! records already decoded and sorted, on `threads` threads (each its own
//! contiguous key range and files), with the options and file size bulk
//! restore writes its tables with. What it measures is the CPU RocksDB's
//! table builder needs per byte -- the limit of building tables on this
//! machine, beside the disk's bandwidth. Benchmark-only, so it lives here.

use std::path::{Path, PathBuf};
use std::time::Instant;

use pyo3::prelude::*;
use rocksdb::SstFileWriter;

use super::super::errors::ErrorClass;
use crate::log::synthetic::{key_of, value_pool, KEY_BYTES};
use crate::restore::bulk::BulkOptions;
use crate::restore::restore_options;

/// Write `keys[from..to]` (with values from `values`, in turn) into SST files
/// of about `target` bytes in `dir`, named after `part`; returns the bytes written.
fn write_range(
    dir: &Path,
    part: usize,
    keys: &[[u8; KEY_BYTES]],
    values: &[Vec<u8>],
    first: usize,
    target: u64,
) -> Result<u64, rocksdb::Error> {
    let opts = restore_options();
    let (mut written, mut files, mut open) = (0u64, 0usize, None::<SstFileWriter<'_>>);
    for (i, k) in keys.iter().enumerate() {
        let w = match &mut open {
            Some(w) => w,
            None => {
                let w = SstFileWriter::create(&opts);
                w.open(dir.join(format!("ceiling-{part:03}-{files:06}.sst")))?;
                files += 1;
                open.insert(w)
            }
        };
        w.put(k, &values[(first + i) % values.len()])?;
        if w.file_size() >= target {
            let mut w = open.take().expect("open");
            w.finish()?;
            written += w.file_size();
        }
    }
    if let Some(mut w) = open {
        w.finish()?;
        written += w.file_size();
    }
    Ok(written)
}

/// Benchmark helper: write `records` records (`key-%012d` keys, sorted;
/// `value_size`-byte values from the synthetic changelogs' pool) into SST
/// files in `dir` with `threads` threads, each a contiguous key range.
/// Keys and values are made before the clock starts. Returns `(seconds,
/// bytes of SST written)`; the files stay in `dir`.
#[pyfunction]
#[pyo3(signature = (dir, records, value_size=100, threads=1, seed=1))]
pub fn sst_write_ceiling(
    py: Python<'_>,
    dir: PathBuf,
    records: usize,
    value_size: usize,
    threads: usize,
    seed: u64,
) -> PyResult<(f64, u64)> {
    let threads = threads.max(1);
    let target = BulkOptions::new(0).sst_target_bytes;
    let out = py.detach(|| {
        let values = value_pool(value_size, seed);
        let keys: Vec<[u8; KEY_BYTES]> = (0..records as u64)
            .map(|i| {
                let mut k = [0u8; KEY_BYTES];
                key_of(i, &mut k);
                k
            })
            .collect();
        let per = records.div_ceil(threads).max(1);
        let t0 = Instant::now();
        let written: Result<Vec<u64>, rocksdb::Error> = std::thread::scope(|s| {
            let handles: Vec<_> = keys
                .chunks(per)
                .enumerate()
                .map(|(part, range)| {
                    let (dir, values) = (&dir, &values);
                    s.spawn(move || write_range(dir, part, range, values, part * per, target))
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("an SST writer thread panicked")).collect()
        });
        let seconds = t0.elapsed().as_secs_f64();
        written.map(|bytes| (seconds, bytes.iter().sum()))
    });
    out.map_err(|e| ErrorClass::Store.err(format!("writing SST files in {}: {e}", dir.display())))
}
