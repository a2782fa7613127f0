//! Binding of [`crate::log`] and [`crate::codec`]: the segment log, its
//! producer and reader for `statestore.changelog.segment_log`. Every call that touches files
//! releases the GIL; records cross into Python a chunk at a time.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use super::errors::ErrorClass;
use crate::codec::{self, Compression, RecordRef};
use crate::log::dump::{dump_partition, DumpBatch};
use crate::log::writer::WriterConfig;
use crate::log::{partition_dir, Isolation, Log, LogError, PartitionReader, Producer};
use crate::source::{ChangeRecord, RecordChunk};

fn log_err(e: LogError) -> PyErr {
    e.into()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn isolation(name: &str) -> PyResult<Isolation> {
    match name {
        "read_committed" => Ok(Isolation::ReadCommitted),
        "read_uncommitted" => Ok(Isolation::ReadUncommitted),
        other => {
            Err(ErrorClass::Log.err(format!("unknown isolation {other:?}: use read_committed or read_uncommitted")))
        }
    }
}

/// The native half of `statestore.changelog.segment_log.SegmentLog`.
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
            ErrorClass::Log.err(format!("unknown compression {compression:?}: use none, gzip, snappy, lz4 or zstd"))
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

    /// The coordinator's record of every transactional id.
    fn transactions(&self, py: Python<'_>) -> PyResult<Vec<TransactionInfo>> {
        let log = self.log.clone();
        let st = py.detach(|| log.transactions()).map_err(log_err)?;
        Ok(st
            .entries
            .into_iter()
            .map(|(id, e)| TransactionInfo {
                transactional_id: id,
                producer_id: e.producer_id,
                epoch: e.epoch,
                state: format!("{:?}", e.state),
                started_ms: e.started_ms,
                partitions: e.partitions.into_iter().collect(),
            })
            .collect())
    }
}

/// What the coordinator of a segment log records about one transactional id.
#[pyclass(module = "statestore._native", name = "TransactionInfo", frozen, get_all)]
#[derive(Debug, Clone)]
pub struct TransactionInfo {
    transactional_id: String,
    producer_id: i64,
    epoch: i16,
    /// `Empty`, `Ongoing`, `PrepareCommit` or `PrepareAbort`.
    state: String,
    /// When the open transaction began (ms since the epoch), -1 when none is open.
    started_ms: i64,
    /// `(topic, partition)` of the open transaction.
    partitions: Vec<(String, i32)>,
}

pub(super) type Headers = Vec<(String, Option<Vec<u8>>)>;
pub(super) type Bytes = Option<Vec<u8>>;

/// The native half of `statestore.changelog.segment_log.Producer`.
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
    fn send_many(&self, py: Python<'_>, topic: &str, partition: i32, records: Vec<(Bytes, Bytes)>) -> PyResult<i64> {
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

/// Append a decoded record, headers included, to `chunk`.
pub(super) fn push_record(chunk: &mut RecordChunk, r: &RecordRef<'_>) {
    chunk.push_with_headers(r.into(), r.headers());
}

/// Records decoded without the GIL, as Python `(offset, key, value,
/// timestamp, headers)` tuples (`statestore.changelog.segment_log.Record` is built from them).
pub(super) fn records_to_py<'py>(py: Python<'py>, chunk: &RecordChunk) -> PyResult<Bound<'py, PyList>> {
    let bytes = |b: Option<&[u8]>| b.map(|b| PyBytes::new(py, b));
    let out = PyList::empty(py);
    for (i, r) in chunk.iter().enumerate() {
        let headers = PyTuple::new(
            py,
            chunk.headers_of(i).map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), bytes(v))).collect::<Vec<_>>(),
        )?;
        out.append((r.offset, bytes(r.key), bytes(r.value), r.timestamp, headers))?;
    }
    Ok(out)
}

/// The native half of `statestore.changelog.segment_log.LogReader`.
#[pyclass(module = "statestore._native", name = "LogReaderCore", frozen)]
struct LogReaderCore {
    inner: Mutex<PartitionReader>,
}

#[pymethods]
impl LogReaderCore {
    #[new]
    #[pyo3(signature = (log_dir, topic, partition, start_offset, isolation="read_committed"))]
    fn new(
        py: Python<'_>,
        log_dir: PathBuf,
        topic: &str,
        partition: i32,
        start_offset: i64,
        isolation: &str,
    ) -> PyResult<Self> {
        let iso = self::isolation(isolation)?;
        let dir = partition_dir(&log_dir, topic, partition).map_err(log_err)?;
        if !log_dir.is_dir() {
            return Err(LogError::other(format!("log directory {} does not exist", log_dir.display()))
                .with_path(&log_dir)
                .into());
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
    fn poll<'py>(
        &self,
        py: Python<'py>,
        max_records: usize,
        max_bytes: usize,
        end: Option<i64>,
    ) -> PyResult<Bound<'py, PyList>> {
        let decoded = py
            .detach(|| {
                let mut r = lock(&self.inner);
                let mut d = RecordChunk::default();
                let mut n = 0usize;
                let end = end.unwrap_or(i64::MAX);
                // Markers and aborted batches yield nothing: go on until
                // something is yielded or the log (or `end`) is reached.
                loop {
                    let more = r.read(end, max_bytes, |rec| {
                        push_record(&mut d, rec);
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
        records_to_py(py, &decoded)
    }
}

/// Start, end and last stable offset of a changelog partition.
#[pyclass(module = "statestore._native", name = "PartitionBounds", frozen, get_all)]
#[derive(Debug, Clone, Copy)]
pub struct PartitionBounds {
    /// First offset in the log.
    start: i64,
    /// Log end offset: the next offset to be written.
    end: i64,
    /// First offset of the oldest open transaction, else `end`.
    last_stable: i64,
}

#[pyfunction]
fn log_offsets(py: Python<'_>, log_dir: PathBuf, topic: &str, partition: i32) -> PyResult<PartitionBounds> {
    Ok(py.detach(|| crate::log::partition_offsets(&log_dir, topic, partition))?.into())
}

impl From<crate::source::Bounds> for PartitionBounds {
    fn from(b: crate::source::Bounds) -> Self {
        PartitionBounds { start: b.start, end: b.end, last_stable: b.last_stable }
    }
}

/// What a read_committed pass over a range of a partition found.
#[pyclass(module = "statestore._native", name = "CommittedStats", frozen, get_all)]
#[derive(Debug, Clone, Copy)]
pub struct CommittedStats {
    /// Committed data records.
    records: u64,
    /// Their key and value bytes.
    bytes: u64,
    /// Where the pass stopped (next offset to read).
    position: i64,
    /// Bytes of log read.
    bytes_read: u64,
}

/// Drain the read_committed source of a partition from `start_offset` to
/// `end` natively, counting what a restore of that range would apply (the
/// lag of a store in records).
#[pyfunction]
fn log_committed_stats(
    py: Python<'_>,
    log_dir: PathBuf,
    topic: &str,
    partition: i32,
    start_offset: i64,
    end: i64,
) -> PyResult<CommittedStats> {
    Ok(py.detach(|| {
        let mut src = crate::log::open_committed_source(&log_dir, topic, partition, start_offset)?;
        let (mut n, mut bytes) = (0u64, 0u64);
        let mut sink = |r: ChangeRecord<'_>| {
            n += 1;
            bytes += (r.key.map_or(0, <[u8]>::len) + r.value.map_or(0, <[u8]>::len)) as u64;
        };
        while src.next_chunk(end, 8 << 20, &mut sink)? {}
        Ok::<_, LogError>(CommittedStats { records: n, bytes, position: src.position(), bytes_read: src.bytes_read() })
    })?)
}

/// One batch of a partition as `kafka-dump-log` shows it.
#[pyclass(module = "statestore._native", name = "LogBatch", frozen, get_all)]
pub struct LogBatch {
    /// File name of the segment.
    segment: String,
    /// Byte position in the segment.
    position: u64,
    base_offset: i64,
    last_offset: i64,
    count: i32,
    /// Bytes of the whole batch.
    size: usize,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    transactional: bool,
    /// `COMMIT`/`ABORT` (or `TYPE_<n>`) for a control batch with a valid CRC.
    control: Option<String>,
    /// `committed`, `aborted` or `open` for a transactional data batch.
    outcome: Option<&'static str>,
    compression: String,
    crc: u32,
    crc_valid: bool,
    max_timestamp: i64,
    /// `(offset, key, value, timestamp, headers)` per record, when asked for
    /// and visible under the isolation; `None` otherwise.
    records: Option<Py<PyList>>,
}

#[pymethods]
impl LogBatch {
    fn __repr__(&self) -> String {
        format!(
            "LogBatch(segment={:?}, position={}, base_offset={}, last_offset={}, count={}, outcome={:?}, control={:?})",
            self.segment, self.position, self.base_offset, self.last_offset, self.count, self.outcome, self.control
        )
    }
}

impl LogBatch {
    fn new(py: Python<'_>, b: DumpBatch) -> PyResult<Self> {
        let h = &b.header;
        let records = match &b.records {
            Some(chunk) => Some(records_to_py(py, chunk)?.unbind()),
            None => None,
        };
        Ok(Self {
            segment: b.segment,
            position: b.position,
            base_offset: h.base_offset,
            last_offset: h.last_offset(),
            count: h.records_count,
            size: h.total_len(),
            producer_id: h.producer_id,
            producer_epoch: h.producer_epoch,
            base_sequence: h.base_sequence,
            transactional: h.is_transactional(),
            control: b.control,
            outcome: b.outcome.map(|o| o.name()),
            compression: codec::codec_name(h.compression_id()),
            crc: h.crc,
            crc_valid: b.crc_valid,
            max_timestamp: h.max_timestamp,
            records,
        })
    }
}

/// Batches of a partition as kafka-dump-log shows them; with `records`, the
/// records too (for read_committed only those a read_committed consumer gets).
#[pyfunction]
#[pyo3(signature = (log_dir, topic, partition, records=false, isolation="read_committed"))]
fn log_dump(
    py: Python<'_>,
    log_dir: PathBuf,
    topic: &str,
    partition: i32,
    records: bool,
    isolation: &str,
) -> PyResult<Vec<LogBatch>> {
    let iso = self::isolation(isolation)?;
    let batches = py.detach(|| dump_partition(&log_dir, topic, partition, records, iso))?;
    batches.into_iter().map(|b| LogBatch::new(py, b)).collect()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<SegmentLogCore>()?;
    m.add_class::<ProducerCore>()?;
    m.add_class::<LogReaderCore>()?;
    m.add_function(wrap_pyfunction!(log_offsets, m)?)?;
    m.add_function(wrap_pyfunction!(log_committed_stats, m)?)?;
    m.add_function(wrap_pyfunction!(log_dump, m)?)?;
    m.add_class::<TransactionInfo>()?;
    m.add_class::<PartitionBounds>()?;
    m.add_class::<CommittedStats>()?;
    m.add_class::<LogBatch>()?;
    Ok(())
}
