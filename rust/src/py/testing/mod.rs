//! `statestore._native._testing`: what tests and benchmarks call and users
//! should not -- one batch encoded or decoded by hand, a store written raw,
//! the write ceiling of replay ([`ceiling`]). Kept out of the production
//! module so its API is what users may rely on.

pub mod ceiling;
pub mod sst_ceiling;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use super::errors::ErrorClass;
use super::kafka::{kafka_err, PyKafkaClient};
use super::log::{push_record, records_to_py, Bytes, Headers};
use crate::codec::{self, Compression};
use crate::kafka::produce;
use crate::log::synthetic;
use crate::source::RecordChunk;

/// Decode one batch given as bytes (tests and tools): `(header dict, records)`.
#[pyfunction]
pub fn decode_batch<'py>(py: Python<'py>, data: &[u8]) -> PyResult<(Bound<'py, PyDict>, Bound<'py, PyList>)> {
    let corrupt = |e: codec::CodecError| match e {
        codec::CodecError::UnsupportedCompression(c) => {
            ErrorClass::UnsupportedCompression.err(format!("batch uses compression {c}"))
        }
        e => ErrorClass::CorruptLog.err(format!("not a valid batch: {e}")),
    };
    let h = codec::BatchHeader::parse(data).map_err(corrupt)?;
    if h.total_len() != data.len() {
        return Err(ErrorClass::CorruptLog.err(format!(
            "batch length says {} bytes, {} given",
            h.total_len(),
            data.len()
        )));
    }
    codec::verify_crc(&h, data).map_err(corrupt)?;
    let mut scratch = Vec::new();
    let mut d = RecordChunk::default();
    for r in codec::batch_records(&h, data, &mut scratch).map_err(corrupt)? {
        push_record(&mut d, &r.map_err(corrupt)?);
    }
    let hd = PyDict::new(py);
    hd.set_item("base_offset", h.base_offset)?;
    hd.set_item("last_offset", h.last_offset())?;
    hd.set_item("count", h.records_count)?;
    hd.set_item("producer_id", h.producer_id)?;
    hd.set_item("producer_epoch", h.producer_epoch)?;
    hd.set_item("base_sequence", h.base_sequence)?;
    hd.set_item("transactional", h.is_transactional())?;
    hd.set_item("is_control", h.is_control())?;
    hd.set_item("compression", codec::codec_name(h.compression_id()))?;
    hd.set_item("crc", h.crc)?;
    hd.set_item("base_timestamp", h.base_timestamp)?;
    hd.set_item("max_timestamp", h.max_timestamp)?;
    let control = if h.is_control() { codec::control_type(&h, data).ok().map(|c| c.name()) } else { None };
    hd.set_item("control", control)?;
    Ok((hd, records_to_py(py, &d)?))
}

/// Encode one batch (tests and tools). `records` are `(offset, timestamp,
/// key, value, headers)`; `control` is None, "COMMIT" or "ABORT".
#[pyfunction]
#[pyo3(
    signature = (base_offset, records, producer_id=-1, producer_epoch=-1, base_sequence=-1, transactional=false, compression="none", control=None),
    // PyO3 shows a negative default as `...`: spelled out so `help()` and stubtest see -1.
    text_signature = "(base_offset, records, producer_id=-1, producer_epoch=-1, base_sequence=-1, transactional=False, compression='none', control=None)"
)]
#[allow(clippy::too_many_arguments)]
pub fn encode_batch<'py>(
    py: Python<'py>,
    base_offset: i64,
    records: Vec<(i64, i64, Bytes, Bytes, Headers)>,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    transactional: bool,
    compression: &str,
    control: Option<&str>,
) -> PyResult<Bound<'py, PyBytes>> {
    let codec = Compression::from_name(compression)
        .ok_or_else(|| ErrorClass::Log.err(format!("unknown compression {compression:?}")))?;
    if let Some(c) = control {
        let commit = match c {
            "COMMIT" => true,
            "ABORT" => false,
            other => return Err(ErrorClass::Log.err(format!("control must be COMMIT or ABORT, not {other:?}"))),
        };
        let ts = records.first().map_or(0, |r| r.1);
        return Ok(PyBytes::new(py, &codec::control_batch(base_offset, producer_id, producer_epoch, commit, ts, 0)));
    }
    let meta = codec::BatchMeta { producer_id, producer_epoch, base_sequence, transactional, ..Default::default() };
    let mut b = codec::BatchBuilder::new(base_offset, meta);
    for (off, ts, k, v, hs) in &records {
        let hrefs: Vec<(&[u8], Option<&[u8]>)> = hs.iter().map(|(k, v)| (k.as_bytes(), v.as_deref())).collect();
        b.append(*off, *ts, k.as_deref(), v.as_deref(), &hrefs);
    }
    Ok(PyBytes::new(py, &b.finish(codec)))
}

/// Benchmark helper: append a synthetic changelog (`log::synthetic`) of
/// `records` records of `value_size`-byte values over `keys` keys to
/// partition `partition` of `topic` in the segment log at `log_dir`, written
/// by the codec without fsync (the caller syncs once). Returns the records written.
#[pyfunction]
#[pyo3(signature = (log_dir, topic, partition, records, keys, value_size=100, seed=1))]
#[allow(clippy::too_many_arguments)] // Python's keyword arguments
pub fn write_synthetic_changelog(
    py: Python<'_>,
    log_dir: std::path::PathBuf,
    topic: &str,
    partition: i32,
    records: u64,
    keys: u64,
    value_size: usize,
    seed: u64,
) -> PyResult<u64> {
    let dir = log_dir.join(format!("{topic}-{partition}"));
    let spec = synthetic::Synthetic { records, keys, value_size, seed };
    Ok(py.detach(|| synthetic::write_partition(&dir, &spec))?)
}

/// Benchmark helper: write a synthetic changelog (`log::synthetic`, the
/// records `write_synthetic_changelog` writes) to partition `partition` of
/// `topic` on the cluster `client` talks to, over Produce (`kafka::produce`:
/// codec-built batches, several requests in flight, no idempotence, no
/// retries). `acks` is 1 or -1. Returns the records written.
#[pyfunction]
#[pyo3(
    signature = (client, topic, partition, records, keys, value_size=100, seed=1, acks=-1),
    text_signature = "(client, topic, partition, records, keys, value_size=100, seed=1, acks=-1)"
)]
#[allow(clippy::too_many_arguments)] // Python's keyword arguments
pub fn produce_synthetic_changelog(
    py: Python<'_>,
    client: PyRef<'_, PyKafkaClient>,
    topic: &str,
    partition: i32,
    records: u64,
    keys: u64,
    value_size: usize,
    seed: u64,
    acks: i16,
) -> PyResult<u64> {
    let spec = synthetic::Synthetic { records, keys, value_size, seed };
    let client = client.client.clone();
    py.detach(|| produce::produce_synthetic(&client, topic, partition, &spec, acks)).map_err(kafka_err)
}

/// Build the `_testing` submodule and make it importable as
/// `statestore._native._testing`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let t = PyModule::new(py, "_testing")?;
    t.add_function(wrap_pyfunction!(decode_batch, &t)?)?;
    t.add_function(wrap_pyfunction!(encode_batch, &t)?)?;
    t.add_function(wrap_pyfunction!(ceiling::restore_write_ceiling, &t)?)?;
    t.add_function(wrap_pyfunction!(sst_ceiling::sst_write_ceiling, &t)?)?;
    t.add_function(wrap_pyfunction!(write_synthetic_changelog, &t)?)?;
    t.add_function(wrap_pyfunction!(produce_synthetic_changelog, &t)?)?;
    t.add_function(wrap_pyfunction!(super::store::store_write_batch, &t)?)?;
    m.add_submodule(&t)?;
    py.import("sys")?.getattr("modules")?.set_item("statestore._native._testing", &t)?;
    Ok(())
}
