//! Binding of [`crate::store`]: whole-store calls used by tools (`verify`,
//! `inspect`, the demo), and the store layout's facts (column families,
//! offsets keys and encoding, status values, formats, the corruption prefix)
//! as module constants, so Python keeps no copy of them. The processing path
//! uses rocksdict.

use std::collections::BTreeMap;
use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use rocksdb::{IteratorMode, WriteBatch};

use super::errors::ErrorClass;
use crate::offsets;
use crate::segments::{Segmentation, SegmentedStore, SegmentsReadOnly};
use crate::store::{self, Store, StoreError, StoreFormat};

/// What a tool shows about a store, read without taking its lock.
#[pyclass(module = "statestore._native", name = "StoreInfo", frozen, get_all)]
#[derive(Debug, Clone)]
pub struct StoreInfo {
    /// `"<topic>-<partition>"` -> offset of the last applied record.
    offsets: BTreeMap<String, i64>,
    /// 1 open, 0 closed cleanly, `None` when never written.
    status: Option<i64>,
    /// RocksDB's estimate of the number of keys.
    estimated_keys: u64,
}

/// One segment of a window or session store, read without taking its lock.
#[pyclass(module = "statestore._native", name = "SegmentInfo", frozen, get_all)]
#[derive(Debug, Clone)]
pub struct SegmentInfo {
    /// The segment's start (ms): its directory is `<store>.<start>`.
    start: i64,
    path: PathBuf,
    /// `"<topic>-<partition>"` -> offset, from the segment's `offsets` family.
    offsets: BTreeMap<String, i64>,
    /// 1 open, 0 closed cleanly, `None` when never written.
    status: Option<i64>,
    estimated_keys: u64,
    /// Whether the segment has an `offsets` column family (4.3+; not in the `.checkpoint` layout).
    offsets_family: bool,
}

/// A window or session store (a directory of segments), read without
/// taking a lock or writing anything.
#[pyclass(module = "statestore._native", name = "SegmentedStoreInfo", frozen, get_all)]
#[derive(Debug, Clone)]
pub struct SegmentedStoreInfo {
    /// The segments' own format (`"plain"` or `"timestamped"`); None without segments.
    segment_format: Option<&'static str>,
    /// The store formats those segments fit (`("timestamped-window",)`, or
    /// `("window", "session")`, which the bytes do not tell apart); every
    /// segmented format without segments.
    formats: Vec<&'static str>,
    /// Offsets as Kafka Streams 4.3+ reads them: each from the newest segment recording one.
    offsets: BTreeMap<String, i64>,
    /// The segments, oldest first.
    segments: Vec<SegmentInfo>,
}

#[pymethods]
impl SegmentedStoreInfo {
    fn __repr__(&self) -> String {
        format!(
            "SegmentedStoreInfo(segment_format={:?}, formats={:?}, offsets={:?}, segments={})",
            self.segment_format,
            self.formats,
            self.offsets,
            self.segments.len()
        )
    }
}

/// `(key, expected value, actual value)`; a missing side is `None`.
type PyDifference = (Py<PyBytes>, Option<Py<PyBytes>>, Option<Py<PyBytes>>);

/// The data of two stores compared, in key order.
#[pyclass(module = "statestore._native", name = "StoreComparison", frozen, get_all)]
#[derive(Debug)]
pub struct StoreComparison {
    expected_digest: String,
    actual_digest: String,
    expected_entries: u64,
    actual_entries: u64,
    /// `(key, expected value, actual value)` at the first difference (a
    /// missing side is `None`); `None` when the data is equal.
    first_difference: Option<PyDifference>,
}

/// A whole store read into memory (tools and tests).
#[pyclass(module = "statestore._native", name = "StoreDump", frozen, get_all)]
#[derive(Debug)]
pub struct StoreDump {
    /// The data column family in key order.
    entries: Vec<(Py<PyBytes>, Py<PyBytes>)>,
    /// Offsets, without the status marker.
    offsets: BTreeMap<String, i64>,
    status: Option<i64>,
}

#[pymethods]
impl StoreInfo {
    fn __repr__(&self) -> String {
        format!(
            "StoreInfo(offsets={:?}, status={:?}, estimated_keys={})",
            self.offsets, self.status, self.estimated_keys
        )
    }
}

/// Write `items` (a value of `None` deletes the key) and `offsets`
/// (`"<topic>-<partition>"` -> offset) to the store at `path` in one batch,
/// optionally with a status marker, then flush. Creates the store if needed.
/// Tests use it to damage or prepare stores.
#[pyfunction]
#[pyo3(signature = (path, items, offsets, status=None, format=None))]
pub fn store_write_batch(
    py: Python<'_>,
    path: PathBuf,
    items: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    offsets: BTreeMap<String, i64>,
    status: Option<i64>,
    format: Option<&str>,
) -> PyResult<()> {
    let format = format.map(|f| StoreFormat::parse(f).map_err(|m| ErrorClass::Store.err(m))).transpose()?;
    Ok(py.detach(|| {
        let store = match format {
            Some(f) => Store::open_format(&path, store::store_options(true), f)?,
            None => Store::open(&path, true)?,
        };
        let mut b = WriteBatch::default();
        let cf = store.data_cf();
        for (k, v) in &items {
            match v {
                Some(v) => b.put_cf(cf, k, v),
                None => b.delete_cf(cf, k),
            }
        }
        for (tp, off) in &offsets {
            store.put_offset(&mut b, tp, *off);
        }
        if let Some(s) = status {
            store.put_status(&mut b, s);
        }
        store.write(b, false)?;
        store.flush()
    })?)
}

/// Create an empty store at `path` (its column families, nothing else), in
/// `format` (`"plain"` or `"timestamped"`).
#[pyfunction]
#[pyo3(signature = (path, format="plain"))]
fn store_create(py: Python<'_>, path: PathBuf, format: &str) -> PyResult<()> {
    let format = StoreFormat::parse(format).map_err(|m| ErrorClass::Store.err(m))?;
    Ok(py.detach(|| Store::open_format(&path, store::store_options(true), format).map(drop))?)
}

/// Read a whole store (read-only).
#[pyfunction]
fn store_dump(py: Python<'_>, path: PathBuf) -> PyResult<StoreDump> {
    let (entries, offsets, status) = py.detach(|| {
        let store = Store::open_read_only(&path)?;
        let mut entries = Vec::new();
        for item in store.db().iterator_cf(store.data_cf(), IteratorMode::Start) {
            let (k, v) = item.map_err(|e| StoreError::rocksdb(&path, "reading data", &e))?;
            entries.push((k, v));
        }
        Ok::<_, StoreError>((entries, store.offsets()?, store.status()?))
    })?;
    let entries = entries.iter().map(|(k, v)| (PyBytes::new(py, k).unbind(), PyBytes::new(py, v).unbind())).collect();
    Ok(StoreDump { entries, offsets, status })
}

/// What a tool shows about a store, read without taking its lock. With
/// `check_blocks`, every block is read first with its checksum verified, so a
/// damaged data block is `StoreCorruptedError` here rather than on the first
/// read that reaches it.
#[pyfunction]
#[pyo3(signature = (path, check_blocks=false))]
fn store_info(py: Python<'_>, path: PathBuf, check_blocks: bool) -> PyResult<StoreInfo> {
    Ok(py.detach(|| {
        let store = Store::open_read_only(&path)?;
        if check_blocks {
            store.check_blocks()?;
        }
        let keys = store
            .db()
            .property_int_value_cf(store.data_cf(), "rocksdb.estimate-num-keys")
            .map_err(|e| StoreError::rocksdb(&path, "reading key estimate", &e))?
            .unwrap_or(0);
        Ok::<_, StoreError>(StoreInfo { offsets: store.offsets()?, status: store.status()?, estimated_keys: keys })
    })?)
}

/// What a tool shows about the window or session store at `path` (a
/// directory of segments `<store>.<start>`), read without taking a lock;
/// with `check_blocks` every block of every segment is read first with its
/// checksum verified. A segment of a type statestore does not know raises
/// `StoreError` naming it.
#[pyfunction]
#[pyo3(signature = (path, check_blocks=false))]
fn segmented_info(py: Python<'_>, path: PathBuf, check_blocks: bool) -> PyResult<SegmentedStoreInfo> {
    Ok(py.detach(|| {
        let view = SegmentsReadOnly::open(&path)?;
        let mut segments = Vec::with_capacity(view.segments.len());
        for (start, s) in &view.segments {
            if check_blocks {
                s.check_blocks()?;
            }
            let keys = s
                .db()
                .property_int_value_cf(s.data_cf(), "rocksdb.estimate-num-keys")
                .map_err(|e| StoreError::rocksdb(s.path(), "reading key estimate", &e))?
                .unwrap_or(0);
            segments.push(SegmentInfo {
                start: *start,
                path: s.path().to_path_buf(),
                offsets: s.offsets()?,
                status: s.status()?,
                estimated_keys: keys,
                offsets_family: s.has_offsets_family(),
            });
        }
        let db_format = view.db_format()?;
        let formats = match db_format {
            Some(f) => StoreFormat::segmented_of(f),
            None => StoreFormat::ALL.into_iter().filter(|f| f.key_schema().is_some()).collect(),
        };
        Ok::<_, StoreError>(SegmentedStoreInfo {
            segment_format: db_format.map(StoreFormat::name),
            formats: formats.into_iter().map(StoreFormat::name).collect(),
            offsets: view.offsets()?,
            segments,
        })
    })?)
}

/// The starts of the segments of the store at `path` (a directory of
/// segments), oldest first, checked against a store of `retention_ms` and
/// `segment_interval_ms` (None: the DSL's): a segment that does not start at
/// a multiple of the interval raises `StoreError` naming its directory.
/// Nothing is opened.
#[pyfunction]
#[pyo3(signature = (path, retention_ms, segment_interval_ms=None))]
fn segments_check(path: PathBuf, retention_ms: i64, segment_interval_ms: Option<i64>) -> PyResult<Vec<i64>> {
    let seg = Segmentation::new(retention_ms, segment_interval_ms).map_err(|m| ErrorClass::Store.err(m))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let found = SegmentedStore::list(&path, &name, &seg)?;
    Ok(found.into_iter().map(|(id, _)| id * seg.segment_interval_ms).collect())
}

/// The format of the RocksDB at `path` as found on disk (`"plain"`,
/// `"timestamped"`, `"timestamped-headers"`; a header-aware session
/// segment: `"session-headers"`), None where there is no RocksDB yet. A
/// segmented store's directory, or a store of a type statestore does not
/// know (versioned, emit-final with headers, extra column families), raises
/// `StoreError` naming what it is.
#[pyfunction]
fn store_format(py: Python<'_>, path: PathBuf) -> PyResult<Option<&'static str>> {
    Ok(py.detach(|| Store::detect_format(&path)).map(|f| f.map(StoreFormat::name))?)
}

/// Record `offset` for `tp` (`"<topic>-<partition>"`) in the closed
/// key-value store at `path` of `format` if it holds no data and no offset
/// for `tp` yet (a store restored from a changelog partition without a
/// committed record); a store without status is marked CLOSED. Whether it
/// recorded. A store of another format is refused as `Store.open_format` refuses it.
#[pyfunction]
fn store_record_if_empty(py: Python<'_>, path: PathBuf, format: &str, tp: &str, offset: i64) -> PyResult<bool> {
    let format = StoreFormat::parse(format).map_err(|m| ErrorClass::Store.err(m))?;
    Ok(py.detach(|| {
        let store = Store::open_format(&path, store::store_options(false), format)?;
        if !store.is_data_empty() || store.offset(tp)?.is_some() {
            return Ok::<_, StoreError>(false);
        }
        let mut b = WriteBatch::default();
        store.put_offset(&mut b, tp, offset);
        if store.status()?.is_none() {
            store.put_status(&mut b, offsets::STATUS_CLOSED);
        }
        store.write(b, false)?;
        store.flush()?;
        Ok(true)
    })?)
}

/// An offset (or status value) as the offsets column family stores it:
/// 8 bytes, big-endian, signed.
#[pyfunction]
fn encode_offset(py: Python<'_>, value: i64) -> Bound<'_, PyBytes> {
    PyBytes::new(py, &offsets::encode_i64(value))
}

/// The value of an offsets column family entry; None when `data` is not 8
/// bytes (which a store statestore wrote never holds: corruption).
#[pyfunction]
fn decode_offset(data: &[u8]) -> Option<i64> {
    offsets::decode_i64(data)
}

/// The segment interval (ms) Kafka Streams' DSL gives a window or session
/// store of retention `retention_ms`: `max(retention / 2, 60_000)`.
#[pyfunction]
fn dsl_segment_interval(retention_ms: i64) -> i64 {
    Segmentation::dsl_segment_interval(retention_ms)
}

/// The segment interval (ms) `Stores.persistentVersionedKeyValueStore` gives a
/// versioned store of history retention `history_retention_ms` when none is given.
#[pyfunction]
fn versioned_segment_interval(history_retention_ms: i64) -> i64 {
    crate::versioned::default_segment_interval(history_retention_ms)
}

/// Compare the data of two stores (read-only).
#[pyfunction]
fn store_compare(py: Python<'_>, expected: PathBuf, actual: PathBuf) -> PyResult<StoreComparison> {
    let c = py.detach(|| {
        let e = Store::open_read_only(&expected)?;
        let a = Store::open_read_only(&actual)?;
        store::compare(&e, &a)
    })?;
    let bytes = |b: &[u8]| PyBytes::new(py, b).unbind();
    let first_difference =
        c.first_difference.as_ref().map(|(k, e, a)| (bytes(k), e.as_deref().map(bytes), a.as_deref().map(bytes)));
    Ok(StoreComparison {
        expected_digest: c.expected_digest,
        actual_digest: c.actual_digest,
        expected_entries: c.expected_entries,
        actual_entries: c.actual_entries,
        first_difference,
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<StoreInfo>()?;
    m.add_class::<StoreComparison>()?;
    m.add_class::<StoreDump>()?;
    m.add_function(wrap_pyfunction!(store_info, m)?)?;
    m.add_function(wrap_pyfunction!(store_compare, m)?)?;
    m.add_function(wrap_pyfunction!(store_create, m)?)?;
    m.add_function(wrap_pyfunction!(store_dump, m)?)?;
    m.add_function(wrap_pyfunction!(store_format, m)?)?;
    m.add_class::<SegmentInfo>()?;
    m.add_class::<SegmentedStoreInfo>()?;
    m.add_function(wrap_pyfunction!(segmented_info, m)?)?;
    m.add_function(wrap_pyfunction!(segments_check, m)?)?;
    m.add_function(wrap_pyfunction!(store_record_if_empty, m)?)?;
    m.add_function(wrap_pyfunction!(encode_offset, m)?)?;
    m.add_function(wrap_pyfunction!(decode_offset, m)?)?;
    m.add_function(wrap_pyfunction!(dsl_segment_interval, m)?)?;
    m.add_function(wrap_pyfunction!(versioned_segment_interval, m)?)?;
    // The store layout, so Python keeps no copy of it.
    m.add("OFFSETS_CF", offsets::OFFSETS_CF)?;
    m.add("TIMESTAMPED_CF", store::TIMESTAMPED_CF)?;
    m.add("STATUS_KEY", PyBytes::new(m.py(), offsets::STATUS_KEY))?;
    m.add("POSITION_KEY", PyBytes::new(m.py(), offsets::POSITION_KEY))?;
    m.add("STATUS_OPEN", offsets::STATUS_OPEN)?;
    m.add("STATUS_CLOSED", offsets::STATUS_CLOSED)?;
    m.add("OFFSET_UNKNOWN", offsets::OFFSET_UNKNOWN)?;
    m.add("STORE_FORMATS", PyTuple::new(m.py(), StoreFormat::ALL.map(StoreFormat::name))?)?;
    let segmented: Vec<&str> =
        StoreFormat::ALL.into_iter().filter(|f| f.key_schema().is_some()).map(StoreFormat::name).collect();
    m.add("SEGMENTED_STORE_FORMATS", PyTuple::new(m.py(), segmented)?)?;
    // The formats that take a retention: window and session stores, and versioned stores (their history retention).
    let retained: Vec<&str> = StoreFormat::ALL
        .into_iter()
        .filter(|f| f.key_schema().is_some() || f.is_versioned())
        .map(StoreFormat::name)
        .collect();
    m.add("RETAINED_STORE_FORMATS", PyTuple::new(m.py(), retained)?)?;
    let versioned: Vec<&str> =
        StoreFormat::ALL.into_iter().filter(|f| f.is_versioned()).map(StoreFormat::name).collect();
    m.add("VERSIONED_STORE_FORMATS", PyTuple::new(m.py(), versioned)?)?;
    let headers: Vec<&str> = StoreFormat::ALL.into_iter().filter(|f| f.has_headers()).map(StoreFormat::name).collect();
    m.add("HEADERS_STORE_FORMATS", PyTuple::new(m.py(), headers)?)?;
    m.add("CORRUPTION_PREFIX", store::CORRUPTION_PREFIX)?;
    Ok(())
}
