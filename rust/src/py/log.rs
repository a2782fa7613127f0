//! Binding of [`crate::log`] and [`crate::codec`]: the segment log, its
//! producer and reader for `statestore.log`. Every call that touches files
//! releases the GIL; records cross into Python a chunk at a time.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use super::error;
use crate::codec::{self, Compression, RecordRef};
use crate::log::reader::{Outcome, TxnResolver};
use crate::log::segment::BatchCursor;
use crate::log::txn::{Log, Producer};
use crate::log::writer::WriterConfig;
use crate::log::{partition_dir, Isolation, LogError, PartitionReader};
use crate::source::{ChangeRecord, SourceError};

fn log_err(e: LogError) -> PyErr {
    error(e.class_name(), e.to_string())
}

fn source_err(e: SourceError) -> PyErr {
    match e {
        SourceError::Corrupt(m) => error("CorruptLogError", m),
        SourceError::UnsupportedCompression(m) => error("UnsupportedCompressionError", m),
        SourceError::OutOfRange(m) => error("TaskCorruptedError", m),
        SourceError::Other(m) => error("LogError", m),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn isolation(name: &str) -> PyResult<Isolation> {
    match name {
        "read_committed" => Ok(Isolation::ReadCommitted),
        "read_uncommitted" => Ok(Isolation::ReadUncommitted),
        other => Err(error("LogError", format!("unknown isolation {other:?}: use read_committed or read_uncommitted"))),
    }
}

/// The native half of `statestore.log.SegmentLog`.
#[pyclass(module = "statestore._native", name = "SegmentLogCore", frozen)]
struct SegmentLogCore {
    log: Arc<Log>,
}

#[pymethods]
impl SegmentLogCore {
    #[new]
    #[pyo3(signature = (log_dir, segment_bytes, sync=true, compression="none"))]
    fn new(log_dir: PathBuf, segment_bytes: u64, sync: bool, compression: &str) -> PyResult<Self> {
        let compression = Compression::from_name(compression).ok_or_else(|| {
            error("LogError", format!("unknown compression {compression:?}: use none, gzip, snappy, lz4 or zstd"))
        })?;
        let cfg = WriterConfig { segment_bytes, sync, compression };
        Ok(SegmentLogCore { log: Arc::new(Log::new(&log_dir, cfg).map_err(log_err)?) })
    }

    /// A producer (transactional when `transactional_id` is given).
    #[pyo3(signature = (transactional_id=None))]
    fn producer(&self, py: Python<'_>, transactional_id: Option<String>) -> PyResult<ProducerCore> {
        let log = self.log.clone();
        let p = py.detach(|| log.producer(transactional_id.as_deref())).map_err(log_err)?;
        Ok(ProducerCore { inner: Mutex::new(p) })
    }

    /// Open a partition for writing (lock, torn-tail repair, index); returns its end offset.
    fn recover(&self, py: Python<'_>, topic: &str, partition: i32) -> PyResult<i64> {
        let log = self.log.clone();
        py.detach(|| {
            let w = log.writer(topic, partition)?;
            let w = lock(&w);
            Ok::<_, LogError>(w.next_offset())
        })
        .map_err(log_err)
    }

    fn abort_expired_transactions(&self, py: Python<'_>, timeout_ms: i64) -> PyResult<Vec<String>> {
        let log = self.log.clone();
        py.detach(|| log.abort_expired_transactions(timeout_ms)).map_err(log_err)
    }

    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let log = self.log.clone();
        py.detach(|| log.flush()).map_err(log_err)
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let log = self.log.clone();
        py.detach(|| log.close()).map_err(log_err)
    }

    /// `{transactional_id: (producer_id, epoch, state, started_ms, [(topic, partition)])}`.
    #[allow(clippy::type_complexity)]
    fn transactions(&self, py: Python<'_>) -> PyResult<Vec<(String, i64, i16, String, i64, Vec<(String, i32)>)>> {
        let log = self.log.clone();
        let st = py.detach(|| log.transactions()).map_err(log_err)?;
        Ok(st
            .entries
            .into_iter()
            .map(|(id, e)| {
                let state = format!("{:?}", e.state);
                (id, e.producer_id, e.epoch, state, e.started_ms, e.partitions.into_iter().collect())
            })
            .collect())
    }
}

type Headers = Vec<(String, Option<Vec<u8>>)>;
type Bytes = Option<Vec<u8>>;
type Range = Option<(usize, usize)>;
/// offset, timestamp, key, value, headers start, headers end
type DecodedRecord = (i64, i64, Range, Range, usize, usize);

/// The native half of `statestore.log.Producer`.
#[pyclass(module = "statestore._native", name = "ProducerCore", frozen)]
struct ProducerCore {
    inner: Mutex<Producer>,
}

#[pymethods]
impl ProducerCore {
    #[pyo3(signature = (topic, partition, key, value, headers=None, timestamp=None))]
    #[allow(clippy::too_many_arguments)]
    fn send(
        &self,
        py: Python<'_>,
        topic: &str,
        partition: i32,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: Option<Headers>,
        timestamp: Option<i64>,
    ) -> PyResult<i64> {
        let hs = headers.unwrap_or_default();
        let hrefs: Vec<(&[u8], Option<&[u8]>)> = hs.iter().map(|(k, v)| (k.as_bytes(), v.as_deref())).collect();
        // Small and buffered: the GIL is kept (releasing it would cost more than the work).
        let _ = py;
        lock(&self.inner).send(topic, partition, key, value, &hrefs, timestamp).map_err(log_err)
    }

    /// Send many `(key, value)` pairs to one partition; returns the first offset.
    fn send_many(
        &self,
        py: Python<'_>,
        topic: &str,
        partition: i32,
        records: Vec<(Bytes, Bytes)>,
    ) -> PyResult<i64> {
        py.detach(|| {
            let mut p = lock(&self.inner);
            let mut first = -1;
            for (k, v) in &records {
                let off = p.send(topic, partition, k.as_deref(), v.as_deref(), &[], None)?;
                if first < 0 {
                    first = off;
                }
            }
            Ok(first)
        })
        .map_err(log_err)
    }

    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| lock(&self.inner).flush()).map_err(log_err)
    }
    fn begin(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| lock(&self.inner).begin()).map_err(log_err)
    }
    fn commit(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| lock(&self.inner).commit()).map_err(log_err)
    }
    fn abort(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| lock(&self.inner).abort()).map_err(log_err)
    }
    /// `(producer_id, epoch)`; `(-1, -1)` for a plain producer.
    fn identity(&self) -> (i64, i16) {
        lock(&self.inner).identity()
    }
    fn in_transaction(&self) -> bool {
        lock(&self.inner).in_transaction()
    }
}

/// Records decoded without the GIL, converted to Python afterwards.
#[derive(Default)]
pub(crate) struct Decoded {
    data: Vec<u8>,
    recs: Vec<DecodedRecord>,
    headers: Vec<(String, Option<(usize, usize)>)>,
}

impl Decoded {
    fn put(&mut self, b: Option<&[u8]>) -> Option<(usize, usize)> {
        b.map(|b| {
            let s = self.data.len();
            self.data.extend_from_slice(b);
            (s, self.data.len())
        })
    }

    pub(crate) fn push(&mut self, r: &RecordRef<'_>) {
        let key = self.put(r.key);
        let value = self.put(r.value);
        let hs = self.headers.len();
        for (k, v) in r.headers() {
            let v = self.put(v);
            self.headers.push((String::from_utf8_lossy(k).into_owned(), v));
        }
        self.recs.push((r.offset, r.timestamp, key, value, hs, self.headers.len()));
    }

    pub(crate) fn into_py<'py>(self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let bytes = |r: Option<(usize, usize)>| -> Option<Bound<'py, PyBytes>> { r.map(|(a, b)| PyBytes::new(py, &self.data[a..b])) };
        let out = PyList::empty(py);
        for &(off, ts, k, v, hs, he) in &self.recs {
            let headers = PyTuple::new(
                py,
                self.headers[hs..he].iter().map(|(hk, hv)| (hk.as_str(), bytes(*hv))).collect::<Vec<_>>(),
            )?;
            out.append((off, bytes(k), bytes(v), ts, headers))?;
        }
        Ok(out)
    }
}

/// The native half of `statestore.log.LogReader`.
#[pyclass(module = "statestore._native", name = "LogReaderCore", frozen)]
struct LogReaderCore {
    inner: Mutex<PartitionReader>,
}

#[pymethods]
impl LogReaderCore {
    #[new]
    #[pyo3(signature = (log_dir, topic, partition, start_offset, isolation="read_committed"))]
    fn new(py: Python<'_>, log_dir: PathBuf, topic: &str, partition: i32, start_offset: i64, isolation: &str) -> PyResult<Self> {
        let iso = self::isolation(isolation)?;
        let dir = partition_dir(&log_dir, topic, partition).map_err(log_err)?;
        if !log_dir.is_dir() {
            return Err(error("LogError", format!("log directory {} does not exist", log_dir.display())));
        }
        let r = py.detach(|| PartitionReader::open(&dir, start_offset, iso, 1 << 20)).map_err(log_err)?;
        Ok(LogReaderCore { inner: Mutex::new(r) })
    }

    /// Next offset to read (steps over markers and aborted records).
    #[getter]
    fn position(&self) -> i64 {
        lock(&self.inner).position()
    }

    /// `(aborted, control)` records stepped over so far.
    #[getter]
    fn skipped(&self) -> (u64, u64) {
        let s = lock(&self.inner).skipped();
        (s.aborted, s.control)
    }

    /// Up to `max_records` records (about `max_bytes` of log), below `end`
    /// when given: a list of `(offset, key, value, timestamp, headers)`.
    #[pyo3(signature = (max_records, max_bytes, end=None))]
    fn poll<'py>(&self, py: Python<'py>, max_records: usize, max_bytes: usize, end: Option<i64>) -> PyResult<Bound<'py, PyList>> {
        let decoded = py
            .detach(|| {
                let mut r = lock(&self.inner);
                let mut d = Decoded::default();
                let mut n = 0usize;
                let end = end.unwrap_or(i64::MAX);
                // Markers and aborted batches yield nothing: go on until
                // something is yielded or the log (or `end`) is reached.
                loop {
                    let more = r.read(end, max_bytes, |rec| {
                        d.push(rec);
                        n += 1;
                        n < max_records
                    })?;
                    if !more || n > 0 {
                        break;
                    }
                }
                Ok::<_, LogError>(d)
            })
            .map_err(log_err)?;
        decoded.into_py(py)
    }
}

/// `(start, end, last_stable)` offsets of a partition.
#[pyfunction]
fn log_offsets(py: Python<'_>, log_dir: PathBuf, topic: &str, partition: i32) -> PyResult<(i64, i64, i64)> {
    py.detach(|| crate::log::partition_offsets(&log_dir, topic, partition))
        .map(|o| (o.start, o.end, o.last_stable))
        .map_err(source_err)
}

/// Drain the read_committed source of a partition from `start_offset` to
/// `end` natively: `(records, key+value bytes, position, log bytes read)`.
/// What the restore path does, without a store (tools, benchmarks).
#[pyfunction]
fn log_committed_stats(
    py: Python<'_>,
    log_dir: PathBuf,
    topic: &str,
    partition: i32,
    start_offset: i64,
    end: i64,
) -> PyResult<(u64, u64, i64, u64)> {
    py.detach(|| {
        let mut src = crate::log::open_committed_source(&log_dir, topic, partition, start_offset)?;
        let (mut n, mut bytes) = (0u64, 0u64);
        let mut sink = |r: ChangeRecord<'_>| {
            n += 1;
            bytes += (r.key.map_or(0, <[u8]>::len) + r.value.map_or(0, <[u8]>::len)) as u64;
        };
        while src.next_chunk(end, 8 << 20, &mut sink)? {}
        Ok((n, bytes, src.position(), src.bytes_read()))
    })
    .map_err(source_err)
}

struct DumpBatch {
    segment: String,
    position: u64,
    header: codec::BatchHeader,
    crc_valid: bool,
    control: Option<String>,
    outcome: Option<&'static str>,
    records: Option<Decoded>,
}

/// Batches of a partition as kafka-dump-log shows them; with `records`, the
/// records too (for read_committed only those a read_committed consumer gets).
#[pyfunction]
#[pyo3(signature = (log_dir, topic, partition, records=false, isolation="read_committed"))]
fn log_dump<'py>(
    py: Python<'py>,
    log_dir: PathBuf,
    topic: &str,
    partition: i32,
    records: bool,
    isolation: &str,
) -> PyResult<Bound<'py, PyList>> {
    let iso = self::isolation(isolation)?;
    let dir = partition_dir(&log_dir, topic, partition).map_err(log_err)?;
    let batches = py
        .detach(|| {
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
                let control = if h.is_control() && crc_valid {
                    codec::control_type(&h, batch).ok().map(|c| c.name())
                } else {
                    None
                };
                let outcome = if h.is_transactional() && !h.is_control() {
                    Some(match resolver.resolve(h.producer_id, h.base_offset)? {
                        Outcome::Committed => "committed",
                        Outcome::Aborted => "aborted",
                        Outcome::Open => "open",
                    })
                } else {
                    None
                };
                open_seen |= outcome == Some("open");
                let show = records
                    && !h.is_control()
                    && (iso == Isolation::ReadUncommitted || (!open_seen && outcome != Some("aborted")));
                let recs = if show && crc_valid {
                    let mut d = Decoded::default();
                    let it = codec::batch_records(&h, batch, &mut scratch).map_err(|e| match e {
                        codec::CodecError::UnsupportedCompression(c) => LogError::UnsupportedCompression(format!(
                            "{}: batch at byte {} (base offset {}) uses compression {c}",
                            path.display(),
                            p.position,
                            h.base_offset
                        )),
                        e => LogError::corrupt(&path, p.position, h.base_offset, e),
                    })?;
                    for r in it {
                        d.push(&r.map_err(|e| LogError::corrupt(&path, p.position, h.base_offset, e))?);
                    }
                    Some(d)
                } else {
                    None
                };
                let segment = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                out.push(DumpBatch { segment, position: p.position, header: h, crc_valid, control, outcome, records: recs });
                cursor.advance();
            }
            Ok::<_, LogError>(out)
        })
        .map_err(log_err)?;
    let list = PyList::empty(py);
    for b in batches {
        let d = PyDict::new(py);
        let h = &b.header;
        d.set_item("segment", b.segment)?;
        d.set_item("position", b.position)?;
        d.set_item("base_offset", h.base_offset)?;
        d.set_item("last_offset", h.last_offset())?;
        d.set_item("count", h.records_count)?;
        d.set_item("size", h.total_len())?;
        d.set_item("producer_id", h.producer_id)?;
        d.set_item("producer_epoch", h.producer_epoch)?;
        d.set_item("base_sequence", h.base_sequence)?;
        d.set_item("transactional", h.is_transactional())?;
        d.set_item("control", b.control)?;
        d.set_item("outcome", b.outcome)?;
        d.set_item("compression", codec::codec_name(h.compression_id()))?;
        d.set_item("crc", h.crc)?;
        d.set_item("crc_valid", b.crc_valid)?;
        d.set_item("max_timestamp", h.max_timestamp)?;
        match b.records {
            Some(r) => d.set_item("records", r.into_py(py)?)?,
            None => d.set_item("records", py.None())?,
        }
        list.append(d)?;
    }
    Ok(list)
}

/// Decode one batch given as bytes (tests and tools): `(header dict, records)`.
#[pyfunction]
fn decode_batch<'py>(py: Python<'py>, data: &[u8]) -> PyResult<(Bound<'py, PyDict>, Bound<'py, PyList>)> {
    let corrupt = |e: codec::CodecError| match e {
        codec::CodecError::UnsupportedCompression(c) => error("UnsupportedCompressionError", format!("batch uses compression {c}")),
        e => error("CorruptLogError", format!("not a valid batch: {e}")),
    };
    let h = codec::BatchHeader::parse(data).map_err(corrupt)?;
    if h.total_len() != data.len() {
        return Err(error("CorruptLogError", format!("batch length says {} bytes, {} given", h.total_len(), data.len())));
    }
    codec::verify_crc(&h, data).map_err(corrupt)?;
    let mut scratch = Vec::new();
    let mut d = Decoded::default();
    for r in codec::batch_records(&h, data, &mut scratch).map_err(corrupt)? {
        d.push(&r.map_err(corrupt)?);
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
    Ok((hd, d.into_py(py)?))
}

/// Encode one batch (tests and tools). `records` are `(offset, timestamp,
/// key, value, headers)`; `control` is None, "COMMIT" or "ABORT".
#[pyfunction]
#[pyo3(signature = (base_offset, records, producer_id=-1, producer_epoch=-1, base_sequence=-1, transactional=false, compression="none", control=None))]
#[allow(clippy::too_many_arguments)]
fn encode_batch<'py>(
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
        .ok_or_else(|| error("LogError", format!("unknown compression {compression:?}")))?;
    if let Some(c) = control {
        let commit = match c {
            "COMMIT" => true,
            "ABORT" => false,
            other => return Err(error("LogError", format!("control must be COMMIT or ABORT, not {other:?}"))),
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

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<SegmentLogCore>()?;
    m.add_class::<ProducerCore>()?;
    m.add_class::<LogReaderCore>()?;
    m.add_function(wrap_pyfunction!(log_offsets, m)?)?;
    m.add_function(wrap_pyfunction!(log_committed_stats, m)?)?;
    m.add_function(wrap_pyfunction!(log_dump, m)?)?;
    m.add_function(wrap_pyfunction!(decode_batch, m)?)?;
    m.add_function(wrap_pyfunction!(encode_batch, m)?)?;
    Ok(())
}
