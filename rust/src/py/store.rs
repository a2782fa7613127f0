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
use crate::segments::Segmentation;
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
    m.add_function(wrap_pyfunction!(store_record_if_empty, m)?)?;
    m.add_function(wrap_pyfunction!(encode_offset, m)?)?;
    m.add_function(wrap_pyfunction!(decode_offset, m)?)?;
    m.add_function(wrap_pyfunction!(dsl_segment_interval, m)?)?;
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
    let headers: Vec<&str> = StoreFormat::ALL.into_iter().filter(|f| f.has_headers()).map(StoreFormat::name).collect();
    m.add("HEADERS_STORE_FORMATS", PyTuple::new(m.py(), headers)?)?;
    m.add("CORRUPTION_PREFIX", store::CORRUPTION_PREFIX)?;
    Ok(())
}
